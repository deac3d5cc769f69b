//! `skein sessions ls|show|rm|history|fork`: what sessions a tenant has, one session's history,
//! removing one with its workspace's files (refused while a turn runs in it), the records of its
//! ended turns, and forking a new session from one of them (history, summary, skills, and the
//! workspace's files as they were at that point).
//!
//! A removal is an operation of whoever runs it (see `principal`): a tenant principal removes
//! only its own tenant's sessions and needs the `operate` role; each removal is recorded in the
//! audit trail (`session_remove`, the session as its target).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig, ENV_TENANT};
use skein_common::principals::Role;
use skein_common::protocol::validate_token;
use skein_common::store::history::ForkPoint;
use skein_common::store::SessionStore;
use skein_common::workspace::{ObjectWorkspaces, SessionRef, WorkspaceStoreConfig};

use super::principal::Caller;

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
    /// Remove a session whole: history, state, results, checkpoints and its workspace's files.
    Rm {
        session: String,
        /// Where the workspaces are (the session's files are removed first).
        #[command(flatten)]
        workspace: Box<SessionFiles>,
    },
    /// List the session's ended turns: turn, task, time, model, steps, calls, tokens, status.
    History {
        session: String,
        /// One JSON record per line.
        #[arg(long)]
        json: bool,
    },
    /// Make a new session whose history is this one's up to a turn (or a step of it); the
    /// source does not change.
    Fork {
        session: String,
        /// Where the fork starts: after turn T, or after step S of turn T (`T.S`).
        #[arg(long)]
        at: String,
        /// The new session's name; `<session>-fork-<at>-<n>` when unset.
        #[arg(long)]
        to: Option<String>,
        /// Where the workspaces are (the new session gets a copy of the source's files).
        #[command(flatten)]
        workspace: Box<ForkWorkspace>,
    },
}

/// The workspace store a removal removes the session's files from (and the connection that
/// says who removes it, and records the removal).
#[derive(Debug, Args)]
pub struct SessionFiles {
    #[command(flatten)]
    pub nats: NatsConfig,
    /// Leave the workspace's files (remove only what Redis keeps).
    #[arg(long)]
    pub keep_files: bool,
}

/// The workspace store a fork copies files in.
#[derive(Debug, Args)]
pub struct ForkWorkspace {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub store: WorkspaceStoreConfig,
    /// Do not copy the workspace's files.
    #[arg(long)]
    pub no_files: bool,
    /// Copy the workspace's files as they are now, not as they were at the fork's point (for a
    /// point older than the versions the workspace keeps).
    #[arg(long, conflicts_with = "no_files")]
    pub files_now: bool,
}

impl ForkWorkspace {
    /// The instant whose files a fork of `session` at `at` copies: `None` for none, or as now.
    pub async fn files_instant(
        &self,
        store: &SessionStore,
        tenant: &str,
        session: &str,
        at: ForkPoint,
    ) -> Result<FilesAsOf, String> {
        if self.no_files {
            return Ok(FilesAsOf::None);
        }
        if self.files_now {
            return Ok(FilesAsOf::Now);
        }
        store
            .fork_instant(tenant, session, at)
            .await
            .map(|(from, at_ms)| FilesAsOf::Then { from, at_ms })
            .map_err(|e| {
                format!(
                    "{e}: fork with --files-now to copy the files as they are now, or --no-files"
                )
            })
    }
}

/// Which of the workspace's files a fork copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilesAsOf {
    None,
    Now,
    /// As session `from` held them at `at_ms` (milliseconds since the Unix epoch): the session
    /// forked, or the one it was forked from when the point lies in what it took from it.
    Then {
        from: String,
        at_ms: u64,
    },
}

pub async fn sessions(args: SessionsArgs) -> ExitCode {
    super::exit_code(run(args).await)
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
        SessionsAction::History { session, json } => {
            validate_token("session", &session).map_err(|f| f.message)?;
            let records = store
                .turn_records(tenant, &session)
                .await
                .map_err(|e| e.to_string())?;
            if records.is_empty() {
                return Err(format!(
                    "session {session} of tenant {tenant} has no recorded turns"
                ));
            }
            for r in records {
                if json {
                    println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                    continue;
                }
                let at = humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.ended_at_ms),
                );
                println!(
                    "turn {}	{}	{at}	{}	{} steps	{} calls	{} tokens	{:.1} s	{}",
                    r.turn,
                    r.task_id,
                    if r.model.is_empty() { "-" } else { &r.model },
                    r.steps,
                    r.calls,
                    r.tokens,
                    r.duration_ms as f64 / 1000.0,
                    serde_json::to_value(r.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        SessionsAction::Fork {
            session,
            at,
            to,
            workspace,
        } => {
            validate_token("session", &session).map_err(|f| f.message)?;
            let at = ForkPoint::parse(&at)?;
            let to = match to {
                Some(to) => to,
                None => format!(
                    "{session}-fork-{}-{}",
                    at.to_string().replace('.', "-"),
                    skein_common::protocol::now_ms() % 100_000
                ),
            };
            validate_token("new session", &to).map_err(|f| f.message)?;
            let files = workspace
                .files_instant(&store, tenant, &session, at)
                .await?;
            let forked = store
                .fork_session(tenant, &session, at, &to)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "forked {session} at {at} into {to}: {} turns, {} messages{}",
                forked.turns,
                forked.history.len(),
                if forked.summary.is_some() {
                    " after its summary"
                } else {
                    ""
                }
            );
            let copied = copy_files(tenant, &session, &to, &workspace, files).await;
            undo_fork_on_failure(&store, tenant, &to, copied).await
        }
        SessionsAction::Rm { session, workspace } => {
            validate_token("session", &session).map_err(|f| f.message)?;
            let client = SkeinClient::connect(&workspace.nats)
                .await
                .map_err(|e| e.to_string())?;
            let caller = Caller::of(client.bus())?;
            caller.check_tenant(tenant, "remove the sessions")?;
            caller.check_role(Role::Operate, "remove sessions")?;
            // Found, never created: their replicas are left as they are.
            let objects = match workspace.keep_files {
                true => None,
                false => Some(ObjectWorkspaces::finder(client.bus())),
            };
            let Some(hold) = store
                .hold_for_removal(tenant, &session)
                .await
                .map_err(|e| e.to_string())?
            else {
                return Err(format!(
                    "a turn is running in session {session}; cancel it or try again when it ends"
                ));
            };
            // The files first: if they cannot be removed, the session stays whole to try again.
            let files = match &objects {
                Some(objects) => remove_files(objects, tenant, &session).await,
                None => Ok(0),
            };
            let (keys, files) = match files {
                Ok(files) => (hold.remove().await.map_err(|e| e.to_string())?, files),
                Err(why) => {
                    if let Err(e) = hold.release().await {
                        tracing::warn!(error = %e, session, "the session's lease was not released; it lapses within a minute");
                    }
                    return Err(format!(
                        "{why}\nthe session's state was kept: run the removal again"
                    ));
                }
            };
            if keys == 0 && files == 0 {
                return Err(format!("no session {session} for tenant {tenant}"));
            }
            let record = caller
                .record(tenant, "session_remove", "")
                .with_target(session.as_str());
            client
                .bus()
                .audit(&record, &uuid::Uuid::new_v4().simple().to_string())
                .await;
            println!("removed session {session} ({keys} keys, {files} files)");
            Ok(())
        }
    }
}

/// Removes every file of `session`'s workspace; how many it held.
async fn remove_files(
    objects: &ObjectWorkspaces,
    tenant: &str,
    session: &str,
) -> Result<usize, String> {
    let session = SessionRef::new(tenant, session).map_err(|e| e.to_string())?;
    objects
        .remove_session(&session)
        .await
        .map_err(|e| format!("cannot remove the session's files: {}", e.describe()))
}

/// Keeps a fork whose files were copied (saying what was copied); removes it, so the same name
/// can be used again, when they could not be.
pub(super) async fn undo_fork_on_failure(
    store: &SessionStore,
    tenant: &str,
    fork: &str,
    copied: Result<Option<(usize, FilesAsOf)>, String>,
) -> Result<(), String> {
    match copied {
        Ok(None) => Ok(()),
        Ok(Some((count, FilesAsOf::Then { from, at_ms }))) => {
            println!(
                "copied {count} workspace files as they were at {} (from {from})",
                humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms)
                )
            );
            Ok(())
        }
        Ok(Some((count, _))) => {
            println!("copied {count} workspace files as they are now");
            Ok(())
        }
        Err(why) => {
            if let Err(e) = store.remove_session(tenant, fork).await {
                tracing::warn!(error = %e, fork, "the fork whose files could not be copied was not removed");
            }
            Err(format!(
                "{why}\nthe fork {fork} was not kept: fork with --files-now to copy the files as \
                 they are now, or --no-files"
            ))
        }
    }
}

/// Copies the workspace files of `from` into `to` as `files` says; how many, and as of when.
pub(super) async fn copy_files(
    tenant: &str,
    from: &str,
    to: &str,
    workspace: &ForkWorkspace,
    files: FilesAsOf,
) -> Result<Option<(usize, FilesAsOf)>, String> {
    if files == FilesAsOf::None {
        return Ok(None);
    }
    workspace.store.validate()?;
    let client = SkeinClient::connect(&workspace.nats)
        .await
        .map_err(|e| e.to_string())?;
    // The command line reads each file once: no content cache.
    let objects = ObjectWorkspaces::new(client.bus(), &workspace.store, 0);
    let from = SessionRef::new(tenant, from).map_err(|e| e.to_string())?;
    let to = SessionRef::new(tenant, to).map_err(|e| e.to_string())?;
    let copied = match &files {
        FilesAsOf::Then { from, at_ms } => {
            let from = SessionRef::new(tenant, from).map_err(|e| e.to_string())?;
            objects.copy_session_as_of(&from, &to, *at_ms).await
        }
        _ => objects.copy_session(&from, &to).await,
    };
    copied
        .map(|count| Some((count, files)))
        .map_err(|e| e.describe())
}
