//! `skein plan <session>`: the plan a session's agent keeps, as a checklist — the plan of the turn
//! running in it now (from its latest checkpoint) when there is one, else the session's stored
//! plan — with `--json` for the plan as stored.

use std::process::ExitCode;

use clap::Args;
use skein_common::agent::plan::checklist;
use skein_common::config::{RedisConfig, ENV_TENANT};
use skein_common::protocol::validate_token;
use skein_common::store::SessionStore;

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Print the plan as JSON (steps with their outcomes and workers).
    #[arg(long)]
    pub json: bool,
    pub session: String,
}

pub async fn plan(args: PlanArgs) -> ExitCode {
    super::exit_code(run(args).await)
}

async fn run(args: PlanArgs) -> Result<(), String> {
    let (tenant, session) = (args.tenant.as_str(), args.session.as_str());
    validate_token("tenant", tenant).map_err(|f| f.message)?;
    validate_token("session", session).map_err(|f| f.message)?;
    let store = SessionStore::connect(&args.redis)
        .await
        .map_err(|e| e.to_string())?;
    let running = store
        .running_turn(tenant, session)
        .await
        .map_err(|e| e.to_string())?;
    let (plan, whose) = match running {
        Some((task, Some(checkpoint))) if checkpoint.plan.is_some() => {
            (checkpoint.plan, format!("running task {task}"))
        }
        _ => {
            let loaded = store
                .load(tenant, session)
                .await
                .map_err(|e| e.to_string())?;
            (loaded.state.plan, format!("session {session}"))
        }
    };
    let Some(plan) = plan else {
        return Err(format!("session {session} of tenant {tenant} has no plan"));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&plan).map_err(|e| e.to_string())?
        );
    } else {
        println!("plan of {whose}:");
        print!("{}", checklist(&plan));
    }
    Ok(())
}
