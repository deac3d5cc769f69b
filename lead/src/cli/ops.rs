//! Operator commands: `skein cancel` (stop a task everywhere), `skein dlq` (inspect, replay and
//! purge dead letters) and `skein trace` (the trace of a task, and its Jaeger link).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use skein_common::bus::DeadLetter;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig, ENV_JAEGER_UI, ENV_TENANT};
use skein_common::store::SessionStore;

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
    /// One line per dead letter: number, original subject, attempts, reason.
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
    /// Removes every dead letter.
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
    match args.action {
        DlqAction::List { json } => {
            let letters = bus.dead_letters().await.map_err(|e| e.to_string())?;
            if letters.is_empty() && !json {
                println!("no dead letters");
            }
            for letter in letters {
                if json {
                    println!("{}", letter_json(&letter));
                } else {
                    println!(
                        "{}\t{}\t{} attempts\t{}",
                        letter.seq, letter.original_subject, letter.attempts, letter.reason
                    );
                }
            }
        }
        DlqAction::Show { seq } => {
            let letter = find(bus, seq).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&letter_json(&letter)).map_err(|e| e.to_string())?
            );
        }
        DlqAction::Replay { seq } => {
            let letter = find(bus, seq).await?;
            let store = SessionStore::connect(&args.redis)
                .await
                .map_err(|e| e.to_string())?;
            store
                .forget_dead_work(&letter.original_subject, &letter.payload)
                .await
                .map_err(|e| format!("dead letter {}: {e}", letter.seq))?;
            bus.replay_dead_letter(&letter)
                .await
                .map_err(|e| e.to_string())?;
            eprintln!("replayed dead letter {seq} to {}", letter.original_subject);
        }
        DlqAction::Remove { seq } => {
            if !bus
                .remove_dead_letter(seq)
                .await
                .map_err(|e| e.to_string())?
            {
                return Err(format!("no dead letter {seq}"));
            }
            eprintln!("removed dead letter {seq}");
        }
        DlqAction::Purge => {
            let purged = bus.purge_dead_letters().await.map_err(|e| e.to_string())?;
            eprintln!("purged {purged} dead letters");
        }
    }
    Ok(())
}

async fn find(bus: &skein_common::bus::Bus, seq: u64) -> Result<DeadLetter, String> {
    bus.dead_letter_at(seq)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no dead letter {seq}"))
}

fn letter_json(letter: &DeadLetter) -> serde_json::Value {
    let message =
        serde_json::from_slice::<serde_json::Value>(&letter.payload).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&letter.payload).into_owned())
        });
    serde_json::json!({
        "seq": letter.seq,
        "original_subject": letter.original_subject,
        "original_id": letter.original_id,
        "reason": letter.reason,
        "attempts": letter.attempts,
        "message": message,
    })
}
