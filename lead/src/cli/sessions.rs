//! `skein sessions ls|show|rm`: what sessions a tenant has, one session's history, and removing
//! one (refused while a turn runs in it).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use skein_common::config::{RedisConfig, ENV_TENANT};
use skein_common::protocol::validate_token;
use skein_common::store::{Removal, SessionStore};

/// Characters of a message shown by `show`.
const PREVIEW_CHARS: usize = 120;

#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default", global = true)]
    pub tenant: String,
    #[command(subcommand)]
    pub action: SessionsAction,
}

#[derive(Debug, Subcommand)]
pub enum SessionsAction {
    /// List the tenant's sessions: turns, messages, and the time left before an idle one expires.
    Ls,
    /// Print a session's turns and its last messages.
    Show {
        session: String,
        /// How many of the last messages to print.
        #[arg(long, default_value_t = 10)]
        last: usize,
    },
    /// Remove a session whole: history, state, results and checkpoints.
    Rm { session: String },
}

pub async fn sessions(args: SessionsArgs) -> ExitCode {
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skein: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: SessionsArgs) -> Result<(), String> {
    validate_token("tenant", &args.tenant).map_err(|f| f.message)?;
    let store = SessionStore::connect(&args.redis)
        .await
        .map_err(|e| e.to_string())?;
    let tenant = args.tenant.as_str();
    match args.action {
        SessionsAction::Ls => {
            let sessions = store.sessions(tenant).await.map_err(|e| e.to_string())?;
            if sessions.is_empty() {
                eprintln!("no sessions for tenant {tenant}");
            }
            for s in sessions {
                let expires = s
                    .expires_in_secs
                    .map_or("kept".to_owned(), |secs| format!("expires in {secs}s"));
                println!(
                    "{}\t{} turns\t{} messages\t{expires}",
                    s.session, s.turns, s.messages
                );
            }
            Ok(())
        }
        SessionsAction::Show { session, last } => {
            validate_token("session", &session).map_err(|f| f.message)?;
            let loaded = store
                .load(tenant, &session)
                .await
                .map_err(|e| e.to_string())?;
            if loaded.version == 0 {
                return Err(format!("no session {session} for tenant {tenant}"));
            }
            let history = &loaded.state.history;
            println!(
                "session {session}: {} turns, {} messages in context, version {}",
                loaded.state.turns,
                history.len(),
                loaded.version
            );
            if let Some(summary) = &loaded.state.summary {
                println!(
                    "summary of {} earlier messages:\n{}",
                    summary.messages, summary.text
                );
            }
            for message in &history[history.len().saturating_sub(last)..] {
                let text: String = message.content.chars().take(PREVIEW_CHARS).collect();
                let more = if text.len() < message.content.len() {
                    "…"
                } else {
                    ""
                };
                println!("{:?}: {}{more}", message.role, text.replace('\n', " "));
            }
            Ok(())
        }
        SessionsAction::Rm { session } => {
            validate_token("session", &session).map_err(|f| f.message)?;
            match store
                .remove_session(tenant, &session)
                .await
                .map_err(|e| e.to_string())?
            {
                Removal::Removed(0) => Err(format!("no session {session} for tenant {tenant}")),
                Removal::Removed(n) => {
                    println!("removed session {session} ({n} keys)");
                    Ok(())
                }
                Removal::Busy => Err(format!(
                    "a turn is running in session {session}; cancel it or try again when it ends"
                )),
            }
        }
    }
}
