//! `skein runs tree <task_id>`: the task's runs — its turn on the lead and every subagent run under
//! it, nested as they called each other — with the process that ran each, its status, its time
//! and the turn's tokens; `--json` for the tree itself. Read from the task's events, so it shows a
//! running task as far as it got.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use futures::StreamExt;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, ENV_TENANT};
use skein_common::protocol::{validate_token, EventKind};

/// How long the event stream may stay quiet before the tree is printed as it stands.
const QUIET: Duration = Duration::from_millis(500);

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub action: RunsAction,
}

#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// Print a task's runs as a tree.
    Tree {
        #[command(flatten)]
        nats: NatsConfig,
        #[arg(long, env = ENV_TENANT, default_value = "default")]
        tenant: String,
        /// The tree as JSON.
        #[arg(long)]
        json: bool,
        task_id: String,
    },
}

pub async fn runs(args: RunsArgs) -> ExitCode {
    super::exit_code(run(args.action).await)
}

async fn run(action: RunsAction) -> Result<(), String> {
    let RunsAction::Tree {
        nats,
        tenant,
        json,
        task_id,
    } = action;
    validate_token("tenant", &tenant).map_err(|f| f.message)?;
    validate_token("task_id", &task_id).map_err(|f| f.message)?;
    let client = SkeinClient::connect(&nats)
        .await
        .map_err(|e| e.to_string())?;
    let events = client
        .watch(&tenant, &task_id)
        .await
        .map_err(|e| e.to_string())?;
    futures::pin_mut!(events);
    let mut seen = Vec::new();
    // Everything stored so far: until the lead's final event, or a quiet stream.
    while let Ok(Some(event)) = tokio::time::timeout(QUIET, events.next()).await {
        let event = event.map_err(|e| e.to_string())?;
        let last = event.source == "lead" && matches!(event.event, EventKind::Final { .. });
        seen.push(event);
        if last {
            break;
        }
    }
    let Some(tree) = skein_common::runs::tree(&seen) else {
        return Err(format!(
            "task {task_id} of tenant {tenant} has no events (unknown, not started, or older than the events stream keeps)"
        ));
    };
    if json {
        println!(
            "{}",
            serde_json::to_string(&tree).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", skein_common::runs::render(&tree));
    }
    Ok(())
}
