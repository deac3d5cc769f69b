//! The `skein` command: submit tasks and watch them, cancel, pause, resume or steer them, answer
//! the calls that wait for approval, list live workers, print a session's plan, manage dead
//! letters, list, fork, replay and remove sessions, list, fetch, seed and remove session
//! workspaces, read the audit trail, make principal keys, run a local cluster, or run a lead, a
//! worker or the HTTP gateway in the foreground. The commands that act on what tenants own are
//! scoped by who runs them (`principal`).
//! Also what the server binaries share: [`block_on`], [`run_lead`], [`run_gateway`] (with
//! [`GatewayCommand`], the `skein-gateway` command line), [`run_worker`].

mod approvals;
mod audit;
mod control;
mod dev;
mod keys;
mod ops;
mod pickup;
mod plan;
mod principal;
mod replay;
mod runs;
mod sessions;
mod submit;
mod workspace;

use std::future::Future;
use std::process::ExitCode;

use skein_common::protocol::ControlAction;

use clap::{Parser, Subcommand};
use skein_common::shutdown::serve_until_signal;

/// Skein: a distributed cluster for LLM agents.
#[derive(Debug, Parser)]
#[command(name = "skein", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a task, stream its events and print the answer.
    Submit(Box<submit::SubmitArgs>),
    /// List live workers and the tools they provide.
    Workers(submit::WorkersArgs),
    /// Stop a running task: its turn ends as cancelled and its calls stop on the workers.
    Cancel(Box<ops::CancelArgs>),
    /// Pause a running task: it dispatches nothing new and parks at its next step until resumed.
    Pause(Box<control::ControlArgs>),
    /// Resume a paused task on any lead.
    Resume(Box<control::ControlArgs>),
    /// Add a user message to a running task, before its next model call.
    Steer(Box<control::SteerArgs>),
    /// List the tenant's turns and subagent runs that wait for approval, and their calls.
    Approvals(Box<approvals::ApprovalsArgs>),
    /// Approve a waiting call (or every waiting call) of a task or of one of its subagent runs.
    Approve(Box<approvals::ApproveArgs>),
    /// Refuse a waiting call (or every waiting call) of a task or subagent run; the model is told why.
    Deny(Box<approvals::DenyArgs>),
    /// Inspect, replay or purge dead letters (a tenant principal: its tenant's only).
    Dlq(Box<ops::DlqArgs>),
    /// List the audit trail: who did what to which task, and what became of it.
    Audit(Box<audit::AuditArgs>),
    /// Make a principal's key pair: the seed for SKEIN_PRINCIPAL_KEY, and its principals entry.
    Keys(keys::KeysArgs),
    /// Print a task's trace id and its Jaeger link.
    Trace(Box<ops::TraceArgs>),
    /// List, fetch, seed or remove the files of a session's workspace (NATS object store).
    Workspace(Box<workspace::WorkspaceArgs>),
    /// List a tenant's sessions, show one, remove one, list its turns or fork it.
    Sessions(Box<sessions::SessionsArgs>),
    /// Run a recorded turn again in a fork of its session (`--cached`: matching calls from the
    /// record; `--live`: every call) and print what changed.
    Replay(Box<replay::ReplayArgs>),
    /// A task's runs: its turn and every subagent run under it, as a tree.
    Runs(Box<runs::RunsArgs>),
    /// Print the plan a session's agent keeps, with each step's status and worker.
    Plan(Box<plan::PlanArgs>),
    /// Run a local cluster (NATS, Redis, a lead, two workers) and answer the example task.
    Dev(Box<dev::DevArgs>),
    /// Run a lead in the foreground.
    Lead(Box<crate::Config>),
    /// Run the HTTP gateway in the foreground (OpenAI-compatible chat completions).
    Gateway(Box<crate::gateway::GatewayConfig>),
    /// Run a worker in the foreground.
    Worker(Box<skein_worker::Config>),
}

/// The `skein-gateway` command line: the settings of `skein gateway`.
#[derive(Debug, Parser)]
#[command(
    name = "skein-gateway",
    version,
    about = "Skein's HTTP gateway (OpenAI-compatible), until SIGTERM or Ctrl-C."
)]
pub struct GatewayCommand {
    #[command(flatten)]
    pub gateway: crate::gateway::GatewayConfig,
}

/// The exit code of a command that ran to `result`: success, or its error on stderr.
fn exit_code(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    main_from(std::env::args())
}

/// Parses `args` (the program name first) and runs the command.
pub fn main_from(args: impl IntoIterator<Item = String>) -> ExitCode {
    let cli = Cli::parse_from(args);
    block_on("skein", async move {
        match cli.command {
            Command::Submit(args) => submit::submit(*args).await,
            Command::Workers(args) => submit::workers(args).await,
            Command::Cancel(args) => ops::cancel(*args).await,
            Command::Pause(args) => {
                control::control(*args, ControlAction::Pause, String::new()).await
            }
            Command::Resume(args) => {
                control::control(*args, ControlAction::Resume, String::new()).await
            }
            Command::Steer(args) => {
                let control::SteerArgs { control, text } = *args;
                control::control(control, ControlAction::Steer, text).await
            }
            Command::Approvals(args) => approvals::list(*args).await,
            Command::Approve(args) => approvals::approve(*args).await,
            Command::Deny(args) => approvals::deny(*args).await,
            Command::Dlq(args) => ops::dlq(*args).await,
            Command::Audit(args) => audit::audit(*args).await,
            Command::Keys(args) => keys::keys(args).await,
            Command::Trace(args) => ops::trace(*args).await,
            Command::Workspace(args) => workspace::workspace(*args).await,
            Command::Sessions(args) => sessions::sessions(*args).await,
            Command::Plan(args) => plan::plan(*args).await,
            Command::Runs(args) => runs::runs(*args).await,
            Command::Replay(args) => replay::replay(*args).await,
            Command::Dev(args) => dev::dev(*args).await,
            Command::Lead(cfg) => run_lead(*cfg).await,
            Command::Gateway(cfg) => run_gateway(*cfg).await,
            Command::Worker(cfg) => run_worker(*cfg).await,
        }
    })
}

/// Runs `serve` to its end on a multi-threaded runtime: the body of every `main` in this crate.
/// `program` names the binary in the message when the runtime cannot start.
pub fn block_on(program: &str, serve: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(serve),
        Err(e) => {
            eprintln!("{program}: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a lead until SIGTERM/Ctrl-C (the `skein-lead` binary and `skein lead`).
pub async fn run_lead(mut cfg: crate::Config) -> ExitCode {
    // One id for the process: its telemetry and its work carry the same.
    let instance = cfg.process.instance_id("lead");
    cfg.process.instance_id = Some(instance.clone());
    let validated = cfg.validate();
    let telemetry = cfg.telemetry.clone();
    serve_until_signal("skein-lead", &instance, &telemetry, validated, |shutdown| {
        crate::run(cfg, shutdown)
    })
    .await
}

/// Runs the gateway until SIGTERM/Ctrl-C (the `skein-gateway` binary and `skein gateway`): it
/// stops accepting connections and ends once the requests it holds are answered.
pub async fn run_gateway(cfg: crate::gateway::GatewayConfig) -> ExitCode {
    let instance = format!("gateway-{}", uuid::Uuid::new_v4().simple());
    let telemetry = cfg.telemetry.clone();
    serve_until_signal("skein-gateway", &instance, &telemetry, Ok(()), |shutdown| {
        crate::gateway::run(cfg, shutdown, None)
    })
    .await
}

/// Runs a worker until SIGTERM/Ctrl-C (the `skein-worker` binary and `skein worker`).
pub async fn run_worker(cfg: skein_worker::Config) -> ExitCode {
    run_worker_with(cfg, |_| {}).await
}

/// [`run_worker`] with more tools than the built-in ones (see `skein_worker::run_with_tools`).
pub async fn run_worker_with(
    cfg: skein_worker::Config,
    extra: impl FnOnce(&mut skein_worker::tools::ToolRegistry) + Send + 'static,
) -> ExitCode {
    skein_worker::WorkerBuilder::new()
        .config(cfg)
        .tools_from(extra)
        .serve()
        .await
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_is_well_formed() {
        super::Cli::command().debug_assert();
        crate::Config::command().debug_assert();
        super::GatewayCommand::command().debug_assert();
        skein_worker::Config::command().debug_assert();
    }
}
