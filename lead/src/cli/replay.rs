//! `skein replay`: runs a recorded turn again, from its input, in a fork of its session made just
//! before it, with this command's model and agents — to check a prompt, model or tool change
//! against real sessions before shipping it. The source session is never changed.
//!
//! `--cached` answers each tool or subagent call whose name and arguments match a call the
//! recorded turn made from the record (no side effect is repeated) and runs only the calls that
//! differ, on the cluster's workers; `--live` runs every call. The turn runs in this process with
//! its own runtime (the cluster's workers run the calls); it prints what changed: the answer, the
//! calls made, tokens and time. `--session S --all` replays every recorded turn of S and prints a
//! table.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use skein_common::agent::context::ContextLimits;
use skein_common::agent::definition::AgentCatalog;
use skein_common::agent::memory::MemoryEvents;
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::Providers;
use skein_common::agent::replay::RecordedCalls;
use skein_common::agent::runtime::{Runtime, RuntimeSettings, TurnInput, TurnOutput};
use skein_common::bus::Bus;
use skein_common::config::{ModelConfig, RedisConfig, ENV_AGENTS_DIR, ENV_TENANT};
use skein_common::dispatch::Dispatcher;
use skein_common::protocol::message::{Message, Role};
use skein_common::protocol::{now_ms, validate_token, AgentOverrides, TaskOrigin};
use skein_common::store::history::{calls_of, ForkPoint, TurnRecord};
use skein_common::store::SessionStore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::sessions::{copy_files, undo_fork_on_failure, ForkWorkspace};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub redis: RedisConfig,
    #[command(flatten)]
    pub workspace: ForkWorkspace,
    #[command(flatten)]
    pub model: ModelConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// The session the turn belongs to.
    #[arg(long)]
    pub session: String,
    /// The recorded task to replay (see `skein sessions history`); with `--all`, none.
    pub task_id: Option<String>,
    /// Replay every recorded turn of the session.
    #[arg(long, conflicts_with = "task_id")]
    pub all: bool,
    /// The model the replay asks (overrides the agent's).
    #[arg(long = "with-model")]
    pub with_model: Option<String>,
    /// Agent definitions to replay with (AGENTS.md, subagents/, skills/); the bundled example
    /// when unset.
    #[arg(long = "agents", env = ENV_AGENTS_DIR)]
    pub agents: Option<PathBuf>,
    /// Answer calls that match the record from it; run only the calls that differ.
    #[arg(long, conflicts_with = "live", required_unless_present = "live")]
    pub cached: bool,
    /// Run every call again (side effects included).
    #[arg(long)]
    pub live: bool,
}

/// How a replayed turn compares with its record.
struct Compared {
    record: TurnRecord,
    fork: String,
    original_answer: String,
    original_calls: Vec<String>,
    output: TurnOutput,
    calls: Vec<String>,
    served: usize,
    millis: u64,
}

pub async fn replay(args: ReplayArgs) -> ExitCode {
    super::exit_code(run(args).await)
}

async fn run(args: ReplayArgs) -> Result<(), String> {
    let (tenant, session) = (args.tenant.as_str(), args.session.as_str());
    validate_token("tenant", tenant).map_err(|f| f.message)?;
    validate_token("session", session).map_err(|f| f.message)?;
    let store = SessionStore::connect(&args.redis)
        .await
        .map_err(|e| e.to_string())?;
    let records = store
        .turn_records(tenant, session)
        .await
        .map_err(|e| e.to_string())?;
    let chosen: Vec<TurnRecord> = match (&args.task_id, args.all) {
        (_, true) => records,
        (Some(task), false) => {
            let record = records.into_iter().find(|r| &r.task_id == task).ok_or_else(|| {
                format!("session {session} has no record of task {task} (see skein sessions history {session})")
            })?;
            vec![record]
        }
        (None, false) => return Err("name the task to replay, or --all".into()),
    };
    if chosen.is_empty() {
        return Err(format!("session {session} has no recorded turns"));
    }
    let replayer = Replayer::start(&args, store).await?;
    let mut rows = Vec::with_capacity(chosen.len());
    for record in chosen {
        let compared = replayer.replay(&args, record).await?;
        if !args.all {
            print_one(&compared);
        }
        rows.push(compared);
    }
    if args.all {
        print_table(&rows);
    }
    replayer.stop().await;
    Ok(())
}

/// The runtime a replay runs turns with: this command's model and agents, the cluster's workers.
struct Replayer {
    store: SessionStore,
    runtime: Runtime,
    agents: AgentCatalog,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Replayer {
    async fn start(args: &ReplayArgs, store: SessionStore) -> Result<Self, String> {
        let agents = match &args.agents {
            Some(dir) => AgentCatalog::load_dir(dir),
            None => AgentCatalog::bundled(),
        }
        .map_err(|e| e.to_string())?;
        let provider = Providers::from_config(&args.model).map_err(|e| e.to_string())?;
        let instance = format!("replay-{}", uuid::Uuid::new_v4().simple());
        let bus = Bus::connect(
            &args.workspace.nats,
            &instance,
            skein_common::bus::DEFAULT_MAX_PAYLOAD,
        )
        .await
        .map_err(|e| e.to_string())?;
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        let dispatcher = Dispatcher::start(bus, store.clone(), &instance, &tracker, stop.clone())
            .await
            .map_err(|e| e.to_string())?;
        let runtime = skein_common::wiring::assemble(
            provider,
            dispatcher,
            agents.skills().clone(),
            Middleware::default(),
            RuntimeSettings {
                default_model: args.model.model.clone(),
                context: ContextLimits {
                    default_context_tokens: args.model.context_tokens,
                    ..ContextLimits::default()
                },
                ..RuntimeSettings::default()
            },
            skein_common::metrics::Metrics::new(),
            &args.model,
        );
        Ok(Self {
            store,
            runtime,
            agents,
            tracker,
            stop,
        })
    }

    async fn stop(self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Replays one recorded turn in a fork made just before it.
    async fn replay(&self, args: &ReplayArgs, record: TurnRecord) -> Result<Compared, String> {
        let (tenant, session) = (args.tenant.as_str(), args.session.as_str());
        let original = self
            .store
            .turn_messages(tenant, session, record.turn)
            .await
            .map_err(|e| e.to_string())?;
        let (input, input_images) = original
            .messages
            .first()
            .filter(|m| m.role == Role::User)
            .map(|m| (m.content.clone(), m.images.clone()))
            .ok_or_else(|| format!("turn {} has no user input on record", record.turn))?;
        let fork = format!("{session}-replay-{}-{}", record.turn, now_ms() % 1_000_000);
        let point = ForkPoint {
            turn: record.turn - 1,
            step: None,
        };
        let files = args
            .workspace
            .files_instant(&self.store, tenant, session, point)
            .await?;
        let forked = self
            .store
            .fork_session(tenant, session, point, &fork)
            .await
            .map_err(|e| e.to_string())?;
        let copied = copy_files(tenant, session, &fork, &args.workspace, files).await;
        undo_fork_on_failure(&self.store, tenant, &fork, copied).await?;
        let overrides = args.with_model.clone().map(|model| AgentOverrides {
            model: Some(model),
            ..AgentOverrides::default()
        });
        let agent = self
            .agents
            .resolve(&record.agent, overrides.as_ref())
            .map_err(|f| format!("agent {}: {}", record.agent, f.message))?;
        let recorded = RecordedCalls::from_messages(&original.messages);
        let events = Arc::new(MemoryEvents::default());
        let cancel = CancellationToken::new();
        let origin = TaskOrigin {
            task_id: format!("{}-replay-{}", record.task_id, now_ms() % 1_000_000),
            tenant: tenant.to_owned(),
            user: "replay".into(),
            session: fork.clone(),
            workspace: fork.clone(),
            deadline_ms: None,
            budget: None,
            run_budget: None,
        };
        let started = Instant::now();
        let output = self
            .runtime
            .run_turn(TurnInput {
                origin: origin.into(),
                agent: &agent,
                history: &forked.history,
                summary: forked.summary.as_ref(),
                loaded_skills: &forked.skills,
                plan: None,
                skills: None,
                input,
                input_images,
                depth: 0,
                events,
                cancel: &cancel,
                resume: None,
                first_run: true,
                checkpoints: None,
                approvals: None,
                controls: None,
                recorded: args.cached.then_some(&recorded),
            })
            .await
            .map_err(|stop| format!("the replayed turn stopped without ending: {stop:?}"))?;
        let millis = started.elapsed().as_millis() as u64;
        // The fork keeps the replayed turn, to look at with `skein sessions show`.
        let mut state = forked;
        state.history.extend(output.new_messages.iter().cloned());
        state.turns += 1;
        if let Err(e) = self.store.save(tenant, &fork, 1, &state).await {
            eprintln!("skein: the replayed turn was not saved in {fork}: {e}");
        }
        Ok(Compared {
            original_answer: answer_of(&original.messages),
            original_calls: described_calls(&original.messages),
            calls: described_calls(&output.new_messages),
            served: recorded.served(),
            record,
            fork,
            output,
            millis,
        })
    }
}

fn answer_of(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
        .map(|m| m.content.clone())
        .unwrap_or_default()
}

fn described_calls(messages: &[Message]) -> Vec<String> {
    calls_of(messages)
        .map(|c| format!("{}({})", c.name, c.arguments))
        .collect()
}

fn tokens(output: &TurnOutput) -> u64 {
    output
        .usage
        .prompt_tokens
        .saturating_add(output.usage.completion_tokens)
}

fn print_one(c: &Compared) {
    let answer = c.output.answer.clone().unwrap_or_default();
    println!(
        "replayed turn {} (task {}) in session {}",
        c.record.turn, c.record.task_id, c.fork
    );
    println!("status:  {:?} (was {:?})", c.output.status, c.record.status);
    if answer == c.original_answer {
        println!("answer:  unchanged");
    } else {
        println!(
            "answer:  changed\n  was: {}\n  now: {}",
            c.original_answer, answer
        );
    }
    if c.calls == c.original_calls {
        println!("calls:   unchanged ({})", c.calls.len());
    } else {
        println!("calls:   changed");
        for call in &c.original_calls {
            if !c.calls.contains(call) {
                println!("  - {call}");
            }
        }
        for call in &c.calls {
            if !c.original_calls.contains(call) {
                println!("  + {call}");
            }
        }
    }
    println!(
        "served from the record: {} of {} calls",
        c.served,
        c.calls.len()
    );
    println!("tokens:  {} (was {})", tokens(&c.output), c.record.tokens);
    println!(
        "time:    {:.2} s (was {:.2} s)",
        c.millis as f64 / 1000.0,
        c.record.duration_ms as f64 / 1000.0
    );
}

fn print_table(rows: &[Compared]) {
    println!("turn\ttask\tanswer\tcalls\tfrom record\ttokens\twas\ttime s\twas\tfork");
    for c in rows {
        let answer = c.output.answer.clone().unwrap_or_default();
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.2}\t{:.2}\t{}",
            c.record.turn,
            c.record.task_id,
            if answer == c.original_answer {
                "same"
            } else {
                "changed"
            },
            if c.calls == c.original_calls {
                "same".to_owned()
            } else {
                format!("{} → {}", c.original_calls.len(), c.calls.len())
            },
            c.served,
            tokens(&c.output),
            c.record.tokens,
            c.millis as f64 / 1000.0,
            c.record.duration_ms as f64 / 1000.0,
            c.fork
        );
    }
}
