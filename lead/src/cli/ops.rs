//! Operator commands: `skein cancel` (stop a task everywhere), `skein dlq` (inspect, replay and
//! purge dead letters) and `skein trace` (the trace of a task, and its Jaeger link).
//!
//! `skein dlq` is scoped by who runs it (see `principal`): a tenant principal lists and shows
//! only its tenant's letters (by the rule of `DeadLetter::tenant`; any other letter is "no dead
//! letter N" to it), and needs the `operate` role to replay, remove or purge, a purge removing
//! only its tenant's letters, one by one. Each replay, removal and purge is recorded in the audit
//! trail (`dlq_replay`, `dlq_remove`, `dlq_purge`) under the letter's tenant, or `*` for a
//! letter of no tenant and for a purge of the whole stream.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::Value;
use skein_common::bus::{Bus, DeadLetter};
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig, ENV_JAEGER_UI, ENV_TENANT};
use skein_common::principals::{Role, EVERY_TENANT};
use skein_common::store::SessionStore;

use super::principal::Caller;

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Why, for the record.
    #[arg(long, default_value = "cancelled from the command line")]
    pub reason: String,
    /// Stop only this subagent run of the task (the call that started it: `subagent:<call>` in
    /// its events, or `skein runs tree`) and the runs under it; its caller observes `stopped`.
    #[arg(long)]
    pub call: Option<String>,
    /// The task to stop.
    pub task_id: String,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Base URL of the Jaeger UI.
    #[arg(long, env = ENV_JAEGER_UI, default_value = "http://localhost:16686")]
    pub jaeger_ui: String,
    /// Longest to wait for the task's first events.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// The task whose trace to show.
    pub task_id: String,
}

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[command(subcommand)]
    pub action: DlqAction,
}

#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// One line per dead letter: number, original subject, attempts, tenant (`-`: none),
    /// reason.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A dead letter in full, with its message.
    Show { seq: u64 },
    /// Runs a dead letter's task or call again (its attempts and recorded outcome are forgotten).
    Replay { seq: u64 },
    /// Removes one dead letter without replaying it.
    Remove { seq: u64 },
    /// Removes every dead letter (a tenant principal: every letter of its tenant).
    Purge,
}

pub async fn cancel(args: CancelArgs) -> ExitCode {
    let result = async {
        let client = SkeinClient::connect(&args.nats).await?;
        client
            .cancel_run(
                &args.tenant,
                &args.task_id,
                args.call.as_deref(),
                &args.reason,
            )
            .await
    };
    match result.await {
        Ok(()) => {
            let run = args
                .call
                .as_ref()
                .map(|call| format!("run {call} of "))
                .unwrap_or_default();
            eprintln!(
                "cancel requested for {run}task {} of tenant {}",
                args.task_id, args.tenant
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}

pub async fn trace(args: TraceArgs) -> ExitCode {
    match find_trace(&args).await {
        Ok(trace_id) => {
            println!("{trace_id}");
            println!("{}/trace/{trace_id}", args.jaeger_ui.trim_end_matches('/'));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The trace id the lead reported for the task (in `turn_started`, or in the final result).
async fn find_trace(args: &TraceArgs) -> Result<String, String> {
    use futures::StreamExt;
    use skein_common::protocol::EventKind;
    let client = SkeinClient::connect(&args.nats)
        .await
        .map_err(|e| e.to_string())?;
    let events = client
        .watch(&args.tenant, &args.task_id)
        .await
        .map_err(|e| e.to_string())?;
    let search = async {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event.map_err(|e| e.to_string())?.event {
                EventKind::TurnStarted {
                    trace_id: Some(id), ..
                } => return Ok(id),
                EventKind::Final { result } => {
                    return result.trace_id.ok_or_else(|| {
                        "the task ran on a lead without telemetry, so it has no trace".to_owned()
                    })
                }
                _ => {}
            }
        }
        Err("the task's events ended without a trace id".to_owned())
    };
    tokio::time::timeout(args.timeout, search)
        .await
        .map_err(|_| {
            format!(
                "no trace for task {} of tenant {} within {:?} (unknown task, or not started yet)",
                args.task_id, args.tenant, args.timeout
            )
        })?
}

pub async fn dlq(args: DlqArgs) -> ExitCode {
    super::exit_code(run_dlq(args).await)
}

async fn run_dlq(args: DlqArgs) -> Result<(), String> {
    let client = SkeinClient::connect(&args.nats)
        .await
        .map_err(|e| e.to_string())?;
    let bus = client.bus();
    let caller = Caller::of(bus)?;
    match args.action {
        DlqAction::List { json } => {
            let letters = bus.dead_letters().await.map_err(|e| e.to_string())?;
            let shown: Vec<Letter> = letters
                .into_iter()
                .map(Letter::new)
                .filter(|letter| caller.sees(letter.tenant()))
                .collect();
            if shown.is_empty() && !json {
                match caller.tenant() {
                    Some(tenant) => println!("no dead letters of tenant {tenant}"),
                    None => println!("no dead letters"),
                }
            }
            for letter in shown {
                if json {
                    println!("{}", letter.to_json());
                } else {
                    println!(
                        "{}\t{}\t{} attempts\t{}\t{}",
                        letter.letter.seq,
                        letter.letter.original_subject,
                        letter.letter.attempts,
                        letter.tenant().unwrap_or("-"),
                        letter.letter.reason
                    );
                }
            }
        }
        DlqAction::Show { seq } => {
            let letter = find(bus, &caller, seq).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&letter.to_json()).map_err(|e| e.to_string())?
            );
        }
        DlqAction::Replay { seq } => {
            caller.check_role(Role::Operate, "replay dead letters")?;
            let letter = find(bus, &caller, seq).await?;
            let store = SessionStore::connect(&args.redis)
                .await
                .map_err(|e| e.to_string())?;
            let dead = &letter.letter;
            store
                .forget_dead_work(&dead.original_subject, &dead.payload)
                .await
                .map_err(|e| format!("dead letter {}: {e}", dead.seq))?;
            bus.replay_dead_letter(dead)
                .await
                .map_err(|e| e.to_string())?;
            audit(bus, &caller, &letter, "dlq_replay").await;
            eprintln!("replayed dead letter {seq} to {}", dead.original_subject);
        }
        DlqAction::Remove { seq } => {
            caller.check_role(Role::Operate, "remove dead letters")?;
            let letter = find(bus, &caller, seq).await?;
            if !bus
                .remove_dead_letter(seq)
                .await
                .map_err(|e| e.to_string())?
            {
                return Err(format!("no dead letter {seq}"));
            }
            audit(bus, &caller, &letter, "dlq_remove").await;
            eprintln!("removed dead letter {seq}");
        }
        DlqAction::Purge => {
            caller.check_role(Role::Operate, "purge dead letters")?;
            match caller.tenant() {
                None => {
                    let purged = bus.purge_dead_letters().await.map_err(|e| e.to_string())?;
                    let record = caller
                        .record(EVERY_TENANT, "dlq_purge", "")
                        .with_target(format!("{purged} letters"));
                    bus.audit(&record, &uuid::Uuid::new_v4().simple().to_string())
                        .await;
                    eprintln!("purged {purged} dead letters");
                }
                Some(tenant) => {
                    let purged = purge_tenant(bus, &caller).await?;
                    eprintln!("purged {purged} dead letters of tenant {tenant}");
                }
            }
        }
    }
    Ok(())
}

/// Removes, one by one, every letter `caller` sees (its tenant's), each recorded; how many.
async fn purge_tenant(bus: &Bus, caller: &Caller) -> Result<u64, String> {
    let letters = bus.dead_letters().await.map_err(|e| e.to_string())?;
    let mut purged = 0;
    for letter in letters.into_iter().map(Letter::new) {
        if !caller.sees(letter.tenant()) {
            continue;
        }
        // A letter removed meanwhile (by a replay, say) is not counted.
        if bus
            .remove_dead_letter(letter.letter.seq)
            .await
            .map_err(|e| format!("{e} (after purging {purged} letters)"))?
        {
            audit(bus, caller, &letter, "dlq_purge").await;
            purged += 1;
        }
    }
    Ok(purged)
}

/// Records `action` on `letter` by `caller`: under the letter's tenant (`*` when it has none),
/// with its number as the target, once per letter and action.
async fn audit(bus: &Bus, caller: &Caller, letter: &Letter, action: &str) {
    let record = caller
        .record(
            letter.tenant().unwrap_or(EVERY_TENANT),
            action,
            letter.task_id().unwrap_or_default(),
        )
        .with_target(letter.letter.seq.to_string());
    bus.audit(&record, &format!("dlq-{}", letter.letter.seq))
        .await;
}

/// The letter at `seq` if `caller` sees it; "no dead letter" otherwise, whether there is none or
/// it belongs to a tenant the caller does not see.
async fn find(bus: &Bus, caller: &Caller, seq: u64) -> Result<Letter, String> {
    bus.dead_letter_at(seq)
        .await
        .map_err(|e| e.to_string())?
        .map(Letter::new)
        .filter(|letter| caller.sees(letter.tenant()))
        .ok_or_else(|| format!("no dead letter {seq}"))
}

/// A dead letter with its body read as JSON, if it is.
struct Letter {
    letter: DeadLetter,
    body: Option<Value>,
}

impl Letter {
    fn new(letter: DeadLetter) -> Self {
        let body = letter.body();
        Self { letter, body }
    }

    fn tenant(&self) -> Option<&str> {
        self.letter.tenant(self.body.as_ref())
    }

    fn task_id(&self) -> Option<&str> {
        self.letter.task_id(self.body.as_ref())
    }

    fn to_json(&self) -> Value {
        let letter = &self.letter;
        let message = self.body.clone().unwrap_or_else(|| {
            Value::String(String::from_utf8_lossy(&letter.payload).into_owned())
        });
        serde_json::json!({
            "seq": letter.seq,
            "original_subject": letter.original_subject,
            "original_id": letter.original_id,
            "kind": letter.kind(),
            "tenant": self.tenant(),
            "task_id": self.task_id(),
            "reason": letter.reason,
            "attempts": letter.attempts,
            "message": message,
        })
    }
}
