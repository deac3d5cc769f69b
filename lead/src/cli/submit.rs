//! `skein submit` and `skein workers`: a task in, its events out; the live worker list.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig, ENV_TENANT, ENV_USER};
use skein_common::protocol::content::ImageUrl;
use skein_common::protocol::{
    Budget, EventKind, FinalResult, InputPart, MultitaskPolicy, OutputSchema, SubmissionInput,
    TaskSubmission, TurnEvent, TurnStatus, PROTOCOL_VERSION,
};
use skein_common::store::SessionStore;

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    #[arg(long, env = ENV_USER, default_value = "cli")]
    pub user: String,
    /// Session to continue; a new one when unset.
    #[arg(long)]
    pub session: Option<String>,
    #[arg(long, default_value = "assistant")]
    pub agent: String,
    /// Task id (resubmitting one is deduplicated); random when unset.
    #[arg(long)]
    pub task_id: Option<String>,
    /// Print events and the final result as JSON lines (for scripts).
    #[arg(long)]
    pub json: bool,
    /// Deadline of the task, from now: it is not started after it and is stopped when it passes.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,
    /// Most model tokens the task (its subagents included) may use; held to the agent's budget.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Most the task's model calls may cost, in US dollars; held to the agent's budget.
    #[arg(long)]
    pub max_cost_usd: Option<f64>,
    /// What the task does when an older task of its session is still unfinished: `enqueue`
    /// (wait for it), `reject` (end at once as rejected), `interrupt` (stop it at its next step,
    /// keeping its work) or `rollback` (cancel it).
    #[arg(long, default_value_t = MultitaskPolicy::Enqueue, value_name = "enqueue|reject|interrupt|rollback")]
    pub multitask: MultitaskPolicy,
    /// A JSON Schema file the answer must match (a structured answer; its root an object schema):
    /// the parsed answer is printed as JSON, and an answer that does not match it, also after
    /// one repair, ends the task `invalid_output`.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<std::path::PathBuf>,
    /// Longest to wait for the final result.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// After this long without the task starting, say why it waits (no lead running, or the work
    /// ahead of it); `0s` says nothing.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub notice_after: Duration,
    /// An image the message shows, after its text (repeatable): an `https://` or `data:` URL,
    /// or a PNG, JPEG, GIF or WebP file, stored in the tenant's payload bucket and sent by
    /// reference.
    #[arg(long = "image", value_name = "URL|FILE")]
    pub images: Vec<String>,
    /// The user's message; `-` reads it from standard input (for inputs too large for an
    /// argument).
    pub input: String,
}

/// `submission`'s text followed by `images` as content parts: URLs as they are, files stored by
/// reference for the submission's task.
async fn with_images(
    client: &SkeinClient,
    submission: &TaskSubmission,
    images: &[String],
) -> Result<SubmissionInput, String> {
    let mut parts = vec![InputPart::Text {
        text: submission.input.text(),
    }];
    for image in images {
        if ["https://", "http://", "data:"]
            .iter()
            .any(|scheme| image.starts_with(scheme))
        {
            parts.push(InputPart::ImageUrl {
                image_url: ImageUrl {
                    url: image.clone(),
                    detail: None,
                },
            });
            continue;
        }
        let extension = std::path::Path::new(image)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let media_type = match extension.as_deref() {
            Some("png") => "image/png",
            Some("jpg" | "jpeg") => "image/jpeg",
            Some("gif") => "image/gif",
            Some("webp") => "image/webp",
            _ => {
                return Err(format!(
                    "{image}: an image file is .png, .jpg, .gif or .webp"
                ))
            }
        };
        let bytes = std::fs::read(image).map_err(|e| format!("{image}: {e}"))?;
        let payload = client
            .store_payload(
                &submission.tenant,
                &submission.session,
                &submission.task_id,
                bytes.into(),
            )
            .await
            .map_err(|e| format!("{image} could not be stored: {e}"))?;
        parts.push(InputPart::Image {
            payload,
            media_type: media_type.to_owned(),
        });
    }
    let input = SubmissionInput::Parts(parts);
    input.images().map_err(|failure| failure.message)?;
    Ok(input)
}

#[derive(Debug, Args)]
pub struct WorkersArgs {
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long)]
    pub json: bool,
}

pub async fn submit(args: SubmitArgs) -> ExitCode {
    let input = if args.input == "-" {
        let mut input = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
            eprintln!("skein: cannot read the input from standard input: {e}");
            return ExitCode::FAILURE;
        }
        input
    } else {
        args.input
    };
    let output_schema = match args.schema.as_deref().map(read_schema).transpose() {
        Ok(schema) => schema,
        Err(message) => {
            eprintln!("skein: {message}");
            return ExitCode::FAILURE;
        }
    };
    let mut submission = TaskSubmission {
        replay_of: None,
        v: PROTOCOL_VERSION,
        task_id: args
            .task_id
            .unwrap_or_else(|| format!("task-{}", uuid::Uuid::new_v4().simple())),
        tenant: args.tenant,
        user: args.user,
        session: args
            .session
            .unwrap_or_else(|| format!("session-{}", uuid::Uuid::new_v4().simple())),
        agent: args.agent,
        input: input.into(),
        overrides: None,
        deadline_ms: args
            .deadline
            .map(|d| skein_common::protocol::now_ms() + d.as_millis() as u64),
        budget: Some(Budget {
            max_total_tokens: args.max_tokens,
            max_cost_usd: args.max_cost_usd,
        })
        .filter(|budget| !budget.is_empty()),
        multitask: args.multitask,
        output_schema: output_schema.map(Box::new),
    };
    // Every id is checked before anything connects or builds a subject from it; the input's
    // size is checked against the broker's payload cap once connected.
    if let Err(failure) = submission.validate(usize::MAX) {
        eprintln!("skein: {}", failure.message);
        return ExitCode::FAILURE;
    }
    let client = match SkeinClient::connect(&args.nats).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("skein: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !args.images.is_empty() {
        match with_images(&client, &submission, &args.images).await {
            Ok(input) => submission.input = input,
            Err(reason) => {
                eprintln!("skein: {reason}");
                return ExitCode::FAILURE;
            }
        }
    }
    run_and_render(
        &client,
        &submission,
        args.timeout,
        args.notice_after,
        args.json,
    )
    .await
}

/// Submits, renders events as they come, prints the answer; the exit code says how it ended.
/// A task not started after `notice_after` gets a line saying why it waits (`pickup`).
pub async fn run_and_render(
    client: &SkeinClient,
    submission: &TaskSubmission,
    timeout: Duration,
    notice_after: Duration,
    json: bool,
) -> ExitCode {
    if !json {
        eprintln!(
            "task {} · session {} · agent {}",
            submission.task_id, submission.session, submission.agent
        );
    }
    let mut progress = Progress::new(&submission.tenant);
    let watching = client.run(submission, timeout, |event| {
        if json {
            if let Ok(line) = serde_json::to_string(event) {
                println!("{line}");
            }
        } else {
            progress.show(event);
        }
    });
    let result = super::pickup::noticing(client, submission, notice_after, watching).await;
    match result {
        Ok(result) => {
            if !json {
                print_result(&result);
            }
            match result.status {
                TurnStatus::Completed => ExitCode::SUCCESS,
                TurnStatus::Failed
                | TurnStatus::Cancelled
                | TurnStatus::BudgetExhausted
                | TurnStatus::Rejected
                | TurnStatus::InvalidOutput => ExitCode::FAILURE,
            }
        }
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The output schema in `path`: a JSON Schema file, checked as a submission's is.
fn read_schema(path: &std::path::Path) -> Result<OutputSchema, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the schema {}: {e}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the schema {} is not JSON: {e}", path.display()))?;
    let schema = OutputSchema::new(schema);
    schema
        .compile()
        .map_err(|e| format!("the schema {} cannot be used: {e}", path.display()))?;
    Ok(schema)
}

fn print_result(result: &FinalResult) {
    if result.status == TurnStatus::InvalidOutput {
        let why = result
            .failure
            .as_ref()
            .map_or_else(|| "no reason given".to_owned(), |f| f.message.clone());
        eprintln!("invalid output · {why}");
        if let Some(answer) = &result.answer {
            eprintln!("the last answer: {answer}");
        }
        return;
    }
    match (&result.answer, &result.failure) {
        (Some(answer), _) => {
            // A structured answer prints as its parsed JSON, pretty.
            match result
                .output
                .as_ref()
                .and_then(|output| serde_json::to_string_pretty(output).ok())
            {
                Some(output) => println!("{output}"),
                None => println!("{answer}"),
            }
            // Set only when the whole answer could not be fetched: say where it is.
            if let Some(reference) = &result.answer_ref {
                eprintln!(
                    "answer shortened · the whole ({} bytes) is object {} of bucket {} \
                     (nats object get {} {})",
                    reference.size,
                    reference.name,
                    reference.bucket,
                    reference.bucket,
                    reference.name
                );
            }
            let note = if result.limit_reached {
                " · step limit reached"
            } else {
                ""
            };
            let spent = result
                .spent
                .map(|spent| format!(" · spent {spent}"))
                .unwrap_or_default();
            let done = if result.status == TurnStatus::BudgetExhausted {
                "budget exhausted"
            } else {
                "done"
            };
            eprintln!(
                "{done} · {} model calls · {} prompt + {} completion tokens{spent}{note}",
                result.iterations, result.usage.prompt_tokens, result.usage.completion_tokens
            );
        }
        (None, Some(failure)) => eprintln!("failed · {failure}"),
        (None, None) => eprintln!("failed without a reason"),
    }
}

/// Human rendering of a turn's events on stderr, with a spinner while the model streams its
/// answer and its reasoning as it streams (dimmed on a terminal).
struct Progress {
    ticks: usize,
    /// The source whose reasoning is being written (its line is still open).
    reasoning_from: Option<String>,
    /// What `skein approve` / `skein deny` need besides the task id to reach this task's tenant.
    tenant_flag: String,
}

impl Progress {
    const SPINNER: [char; 4] = ['|', '/', '-', '\\'];

    fn new(tenant: &str) -> Self {
        Self {
            ticks: 0,
            reasoning_from: None,
            tenant_flag: if tenant == "default" {
                String::new()
            } else {
                format!(" --tenant {tenant}")
            },
        }
    }

    /// Writes a piece of reasoning: a `reasoning:` line per source, dimmed on a terminal.
    fn reason(&mut self, source: &str, who: &str, text: &str) {
        let mut err = std::io::stderr();
        let terminal = err.is_terminal();
        if self.reasoning_from.as_deref() != Some(source) {
            self.end_reasoning();
            let _ = write!(err, "\r{who}reasoning: ");
            self.reasoning_from = Some(source.to_owned());
        }
        let _ = if terminal {
            write!(err, "\x1b[2m{text}\x1b[0m")
        } else {
            write!(err, "{text}")
        };
        let _ = err.flush();
    }

    /// Closes the line of reasoning being written, if any.
    fn end_reasoning(&mut self) {
        if self.reasoning_from.take().is_some() {
            let _ = writeln!(std::io::stderr());
        }
    }

    fn show(&mut self, event: &TurnEvent) {
        let who = if event.source == "lead" {
            String::new()
        } else {
            format!("[{}] ", event.source)
        };
        if let EventKind::ReasoningDelta { text } = &event.event {
            self.reason(&event.source, &who, text);
            return;
        }
        self.end_reasoning();
        let mut err = std::io::stderr();
        match &event.event {
            EventKind::TurnStarted {
                instance, trace_id, ..
            } => match trace_id {
                Some(trace_id) => {
                    let _ = writeln!(err, "{who}started on {instance} · trace {trace_id}");
                }
                None => {
                    let _ = writeln!(err, "{who}started on {instance}");
                }
            },
            EventKind::ReasoningDelta { .. } => {}
            EventKind::Compacted {
                messages,
                tokens_before,
                tokens_after,
                ..
            } => {
                let _ = writeln!(
                    err,
                    "\r{who}compacted {messages} earlier messages into a summary \
                     ({tokens_before} → {tokens_after} tokens)"
                );
            }
            EventKind::ModelDelta { .. } => {
                if !std::io::stderr().is_terminal() {
                    return;
                }
                self.ticks += 1;
                let _ = write!(err, "\r{who}thinking {}", Self::SPINNER[self.ticks % 4]);
                let _ = err.flush();
            }
            EventKind::OutputDiscarded { failure } => {
                let _ = writeln!(
                    err,
                    "\r{who}↺ the model's output broke off ({}); asking again",
                    failure.message
                );
            }
            EventKind::ToolStarted {
                tool, arguments, ..
            } => {
                // One line: long arguments (or a preview of huge ones) are shortened.
                let arguments =
                    super::approvals::compact(arguments, 4 * super::approvals::ARGUMENTS_WIDTH);
                let _ = writeln!(err, "\r{who}→ {tool} {arguments}");
            }
            EventKind::ToolFinished {
                tool,
                ok,
                worker_id,
                preview,
                ..
            } => {
                let mark = if *ok { "✓" } else { "✗" };
                let first = preview.lines().next().unwrap_or_default();
                // The runtime's own tools (plans, skills) run on no worker.
                let on = if worker_id.is_empty() {
                    String::new()
                } else {
                    format!(" on {worker_id}")
                };
                let _ = writeln!(err, "\r{who}{mark} {tool}{on}: {first}");
            }
            EventKind::ApprovalRequested {
                call_id,
                tool,
                arguments,
                rule,
                expires_at_ms,
                ..
            } => {
                let arguments =
                    super::approvals::compact(arguments, super::approvals::ARGUMENTS_WIDTH);
                let expiry = expires_at_ms
                    .map(|at| {
                        let left = at.saturating_sub(skein_common::protocol::now_ms()) / 1000;
                        format!(
                            " · denied if unanswered in {}",
                            humantime::format_duration(Duration::from_secs(left))
                        )
                    })
                    .unwrap_or_default();
                let (task, tenant) = (&event.task_id, &self.tenant_flag);
                let _ = writeln!(
                    err,
                    "\r{who}⏸ {tool} wants approval ({rule}): {arguments}{expiry}\n  \
                     approve: skein approve {task} --call {call_id}{tenant}   \
                     deny: skein deny {task} --call {call_id}{tenant}"
                );
            }
            EventKind::ApprovalResolved {
                tool,
                verdict,
                rule,
                by,
                reason,
                ..
            } => {
                let mark = if verdict.runs() { "✓" } else { "✗" };
                let by = if by.is_empty() {
                    String::new()
                } else {
                    format!(" by {by}")
                };
                let reason = if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                };
                let _ = writeln!(
                    err,
                    "\r{who}{mark} {tool} {}{by} ({rule}){reason}",
                    verdict.as_str()
                );
            }
            EventKind::Paused { .. } => {
                let task = &event.task_id;
                let tenant = &self.tenant_flag;
                let _ = writeln!(err, "\r{who}⏸ paused; resume: skein resume {task}{tenant}");
            }
            EventKind::Resumed {} => {
                let _ = writeln!(err, "\r{who}▶ resumed");
            }
            EventKind::Steered { text } => {
                let first = text.lines().next().unwrap_or_default();
                let _ = writeln!(err, "\r{who}↪ steered: {first}");
            }
            EventKind::PlanUpdated { plan } => {
                let _ = writeln!(err, "\r{who}plan:");
                for line in skein_common::agent::plan::checklist(plan).lines() {
                    let _ = writeln!(err, "{who}  {line}");
                }
            }
            EventKind::PlanStepStarted { step_id, agent, .. } => {
                let _ = writeln!(err, "\r{who}▶ step {step_id} ({agent})");
            }
            EventKind::PlanStepFinished {
                step_id,
                ok,
                worker_id,
                duration_ms,
            } => {
                let mark = if *ok { "✓" } else { "✗" };
                let _ = writeln!(
                    err,
                    "\r{who}{mark} step {step_id} on {worker_id} ({:.1} s)",
                    *duration_ms as f64 / 1000.0
                );
            }
            EventKind::RunEnded { status, usage } => {
                let tokens = usage.prompt_tokens.saturating_add(usage.completion_tokens);
                let _ = writeln!(err, "\r{who}run {} ({tokens} tokens)", status.as_str());
            }
            EventKind::Warning { failure } => {
                let _ = writeln!(err, "\r{who}warning: {failure}");
            }
            EventKind::Final { .. } => {
                let _ = writeln!(err, "\r");
            }
        }
    }
}

pub async fn workers(args: WorkersArgs) -> ExitCode {
    let store = match SessionStore::connect(&args.redis).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("skein: {e}");
            return ExitCode::FAILURE;
        }
    };
    match store.live_workers().await {
        Ok(workers) if args.json => {
            for worker in workers {
                if let Ok(line) = serde_json::to_string(&worker) {
                    println!("{line}");
                }
            }
            ExitCode::SUCCESS
        }
        Ok(workers) => {
            if workers.is_empty() {
                println!("no live workers");
            }
            for w in workers {
                let tools: Vec<_> = w.tools.iter().map(|t| t.name.as_str()).collect();
                let subagents = match (&w.agent_types, w.runs_subagents) {
                    (_, false) => String::new(),
                    (None, true) => " +subagents".to_owned(),
                    (Some(types), true) => format!(" +subagents({})", types.join(",")),
                };
                println!(
                    "{}  pool={} capacity={} v{}  {}{subagents}",
                    w.worker_id,
                    w.pool,
                    w.capacity,
                    w.version,
                    tools.join(",")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}
