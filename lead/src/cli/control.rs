//! `skein pause <task>`, `skein resume <task>`, `skein steer <task> "text"`: a `RunControl`
//! published durably for any lead to record. The task's session comes from `--session`, or from
//! its events (`turn_started` or `final` name it).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, ENV_TENANT};
use skein_common::protocol::{ControlAction, EventKind, RunControl, PROTOCOL_VERSION};

use super::approvals::{decider, ENV_LOGIN_USER, PUBLISH_TIMEOUT};

/// Longest wait for the task's first event when its session is not given.
const SESSION_LOOKUP: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// The task's session; found from the task's events when unset.
    #[arg(long)]
    pub session: Option<String>,
    /// Who asks, for the audit trail; `$USER` when unset.
    #[arg(long)]
    pub by: Option<String>,
    /// The task to control.
    pub task_id: String,
}

#[derive(Debug, Args)]
pub struct SteerArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    /// The message that joins the turn before its next model call.
    pub text: String,
}

pub async fn control(args: ControlArgs, action: ControlAction, text: String) -> ExitCode {
    match publish(&args, action, text).await {
        Ok(session) => {
            let done = match action {
                ControlAction::Pause => "pause requested: the turn parks at its next step",
                ControlAction::Resume => "resume requested",
                ControlAction::Steer => "steer message sent: it joins before the next model call",
            };
            eprintln!(
                "{done} (task {} of session {session}, tenant {})",
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

async fn publish(
    args: &ControlArgs,
    action: ControlAction,
    text: String,
) -> Result<String, String> {
    let client = SkeinClient::connect(&args.nats)
        .await
        .map_err(|e| e.to_string())?;
    let session = match &args.session {
        Some(session) => session.clone(),
        None => session_of(&client, &args.tenant, &args.task_id).await?,
    };
    let control = RunControl {
        v: PROTOCOL_VERSION,
        tenant: args.tenant.clone(),
        session: session.clone(),
        task_id: args.task_id.clone(),
        action,
        text,
        by: decider(
            args.by.as_deref(),
            std::env::var(ENV_LOGIN_USER).ok().as_deref(),
        ),
    };
    control.validate().map_err(|f| f.message)?;
    tokio::time::timeout(PUBLISH_TIMEOUT, client.bus().publish_control(&control))
        .await
        .map_err(|_| format!("the control was not published within {PUBLISH_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(session)
}

/// The session a task runs in, from its first event that names it.
async fn session_of(client: &SkeinClient, tenant: &str, task_id: &str) -> Result<String, String> {
    let events = client
        .watch(tenant, task_id)
        .await
        .map_err(|e| e.to_string())?;
    let search = async {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event.map_err(|e| e.to_string())?.event {
                EventKind::TurnStarted { session, .. } => return Ok(session),
                EventKind::Final { result } => return Ok(result.session),
                _ => {}
            }
        }
        Err(format!("the events of task {task_id} name no session"))
    };
    tokio::time::timeout(SESSION_LOOKUP, search)
        .await
        .map_err(|_| {
            format!(
                "task {task_id} of tenant {tenant} has not started yet (or is unknown); name its \
                 session with --session"
            )
        })?
}
