//! `skein workspace`: list, fetch, seed and remove the files of a session's workspace in the NATS
//! object store (the workers' default `object` mode), with the same path rules and caps as the file
//! tools.
//!
//! - `skein workspace ls <session>`: one line per file, its size in bytes and its path;
//! - `skein workspace get <session> <path> [--out FILE]`: the file's bytes on stdout, or in FILE;
//! - `skein workspace put <session> <path> [FILE|-]`: stores FILE (stdin when `-` or absent),
//!   replacing the file whole; the cap is checked before anything is sent;
//! - `skein workspace rm <session> [PATH...]`: removes the files named (their earlier versions
//!   stay for forks), or with no path the whole workspace, earlier versions included.
//!
//! Who runs them is checked (see `principal`): a tenant principal reaches only its own tenant's
//! workspaces, and removing files takes the `operate` role; each removal is recorded in the audit
//! trail (`workspace_remove`, the session and the paths as its target).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use skein_common::bus::Bus;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, ENV_TENANT};
use skein_common::principals::Role;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{
    human_size, ObjectWorkspaces, SessionRef, WorkspacePath, WorkspaceStoreConfig,
};
use tokio::io::AsyncReadExt;

use super::principal::Caller;

/// The command line does not re-read files, so it keeps no content cache.
const NO_CACHE: usize = 0;

#[derive(Debug, Args)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    pub action: WorkspaceAction,
}

#[derive(Debug, Subcommand)]
pub enum WorkspaceAction {
    /// List a session's files: size in bytes, then path, one per line.
    Ls {
        #[command(flatten)]
        target: Target,
        /// The session whose files to list.
        session: String,
    },
    /// Print a file of a session's workspace (or write it to --out).
    Get {
        #[command(flatten)]
        target: Target,
        /// The session.
        session: String,
        /// Path of the file, relative to the workspace.
        path: String,
        /// Write the file here instead of to standard output.
        #[arg(long, short = 'o')]
        out: Option<PathBuf>,
    },
    /// Store a file in a session's workspace, replacing any file of that path.
    Put {
        #[command(flatten)]
        target: Target,
        /// The session.
        session: String,
        /// Path of the file, relative to the workspace.
        path: String,
        /// What to store: a local file, or `-` (the default) for standard input.
        file: Option<PathBuf>,
    },
    /// Remove files of a session's workspace, or with no path all of them (and the earlier
    /// versions kept for forks), even while a turn runs in the session.
    Rm {
        #[command(flatten)]
        target: Target,
        /// The session.
        session: String,
        /// Paths of the files to remove, relative to the workspace; none: every file.
        paths: Vec<String>,
    },
}

/// Where the workspace is: the NATS connection, the tenant, the caps.
#[derive(Debug, Args)]
pub struct Target {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    #[command(flatten)]
    pub store: WorkspaceStoreConfig,
}

pub async fn workspace(args: WorkspaceArgs) -> ExitCode {
    super::exit_code(run(args.action).await)
}

async fn run(action: WorkspaceAction) -> Result<(), String> {
    match action {
        WorkspaceAction::Ls { target, session } => {
            let (objects, session) = open(&target, &session).await?.files();
            let files = objects.list(&session).await.map_err(|e| e.describe())?;
            if files.is_empty() {
                eprintln!("no files in session {}", session.session());
            }
            let mut out = String::new();
            for file in files {
                out.push_str(&format!("{:>12}  {}\n", file.size, file.path));
            }
            print_bytes(out.as_bytes(), None).await
        }
        WorkspaceAction::Get {
            target,
            session,
            path,
            out,
        } => {
            let path = WorkspacePath::parse(&path).map_err(|e| e.to_string())?;
            let (objects, session) = open(&target, &session).await?.files();
            let (content, _) = objects
                .read(&session, &path)
                .await
                .map_err(|e| e.describe())?;
            print_bytes(&content, out.as_deref()).await
        }
        WorkspaceAction::Put {
            target,
            session,
            path,
            file,
        } => {
            let path = WorkspacePath::parse(&path).map_err(|e| e.to_string())?;
            target.store.validate()?;
            let cap = target.store.max_file_bytes;
            let content = read_source(file.as_deref(), cap).await?;
            let limits = target.store.limits();
            limits
                .check_file(&path, content.len() as u64)
                .map_err(|e| e.to_string())?;
            let (objects, session) = open(&target, &session).await?.files();
            let size = content.len();
            objects
                .write(&session, &path, content.into(), Expect::Any)
                .await
                .map_err(|e| e.describe())?;
            eprintln!(
                "stored {path} ({}) in session {} of tenant {}",
                human_size(size as u64),
                session.session(),
                session.tenant()
            );
            Ok(())
        }
        WorkspaceAction::Rm {
            target,
            session,
            paths,
        } => {
            let opened = open(&target, &session).await?;
            opened
                .caller
                .check_role(Role::Operate, "remove workspace files")?;
            remove(&opened.objects, &opened.session, &paths).await?;
            let target = match paths.is_empty() {
                true => session,
                false => format!("{session}: {}", paths.join(", ")),
            };
            let record = opened
                .caller
                .record(opened.session.tenant(), "workspace_remove", "")
                .with_target(target);
            opened
                .bus
                .audit(&record, &uuid::Uuid::new_v4().simple().to_string())
                .await;
            Ok(())
        }
    }
}

/// Removes the files `paths` names from `session`, or its whole workspace when there are none.
async fn remove(
    objects: &ObjectWorkspaces,
    session: &SessionRef,
    paths: &[String],
) -> Result<(), String> {
    let name = session.session();
    if paths.is_empty() {
        let files = objects
            .remove_session(session)
            .await
            .map_err(|e| e.describe())?;
        match files {
            0 => eprintln!("no files in session {name}"),
            n => eprintln!("removed the workspace of session {name} ({n} files)"),
        }
        return Ok(());
    }
    let paths = paths
        .iter()
        .map(|p| WorkspacePath::parse(p).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut missing = Vec::new();
    for path in &paths {
        let removed = objects
            .remove(session, path, Expect::Any)
            .await
            .map_err(|e| e.describe())?;
        match removed {
            true => eprintln!("removed {path} from session {name}"),
            false => missing.push(path.to_string()),
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: no such file in session {name}",
            missing.join(", ")
        ))
    }
}

/// A session's workspace, opened by whoever runs the command.
struct Opened {
    objects: ObjectWorkspaces,
    session: SessionRef,
    bus: Bus,
    caller: Caller,
}

impl Opened {
    fn files(self) -> (ObjectWorkspaces, SessionRef) {
        (self.objects, self.session)
    }
}

/// Opens `session`'s workspace of the target's tenant, refused to a principal of another tenant.
async fn open(target: &Target, session: &str) -> Result<Opened, String> {
    target.store.validate()?;
    let session = SessionRef::new(&target.tenant, session).map_err(|e| e.to_string())?;
    let client = SkeinClient::connect(&target.nats)
        .await
        .map_err(|e| e.to_string())?;
    let caller = Caller::of(client.bus())?;
    caller.check_tenant(session.tenant(), "reach the workspaces")?;
    let bus = client.bus().clone();
    let objects = ObjectWorkspaces::new(&bus, &target.store, NO_CACHE);
    Ok(Opened {
        objects,
        session,
        bus,
        caller,
    })
}

/// The bytes of `file` (standard input for `-` or none), refused past `cap` bytes without
/// reading further.
async fn read_source(file: Option<&std::path::Path>, cap: u64) -> Result<Vec<u8>, String> {
    let mut content = Vec::new();
    let limit = cap.saturating_add(1);
    let read = match file {
        Some(path) if path.as_os_str() != "-" => {
            let opened = tokio::fs::File::open(path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            opened.take(limit).read_to_end(&mut content).await
        }
        _ => {
            // Standard input is read on a blocking thread (tokio's own needs its `io-std`).
            let read = tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut content = Vec::new();
                std::io::stdin()
                    .take(limit)
                    .read_to_end(&mut content)
                    .map(|_| content)
            })
            .await
            .map_err(|e| format!("cannot read standard input: {e}"))?;
            read.map(|stdin| {
                content = stdin;
                content.len()
            })
        }
    };
    read.map_err(|e| format!("cannot read the input: {e}"))?;
    if content.len() as u64 > cap {
        return Err(format!(
            "the input is larger than {} ({cap} bytes), the per-file cap of a workspace",
            human_size(cap)
        ));
    }
    Ok(content)
}

/// Writes `bytes` to `out`, or to standard output.
async fn print_bytes(bytes: &[u8], out: Option<&std::path::Path>) -> Result<(), String> {
    match out {
        Some(path) => tokio::fs::write(path, bytes)
            .await
            .map_err(|e| format!("cannot write {}: {e}", path.display())),
        None => {
            let bytes = bytes.to_vec();
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&bytes)?;
                stdout.flush()
            })
            .await
            .map_err(|e| format!("cannot write to standard output: {e}"))?
            .map_err(|e| format!("cannot write to standard output: {e}"))
        }
    }
}
