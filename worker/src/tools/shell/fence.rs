//! Holds a shell command to its own files with Landlock: read-write beneath the call's checked-out
//! workspace and its scratch directory (HOME and TMPDIR), read-only beneath the system's paths
//! (programs, libraries, `/etc` but its secrets, `/sys`) and the configured extra paths, and
//! nothing else: another session's checkout, the worker's own files and its secrets cannot be
//! read or written.
//!
//! The ruleset is built in the worker for each call and enforced by a thread started for the
//! call, which then starts the command: Landlock restricts that thread and every process it
//! starts, so the isolating programs (`setpriv`, `unshare`) and everything the command starts
//! inherit it, while the worker's other threads stay as they were. A process under Landlock may not
//! mount, so a command fenced this way keeps the system's `/proc` rather than one of its own;
//! Landlock's own rule keeps a fenced process from reading another process's memory, environment
//! or descriptors.
//!
//! Invariants: the handled rights are every file-system right of the newest ABI this code knows,
//! so a right the kernel adds later is denied unless granted here; a kernel without Landlock is
//! found at start ([`available`]) and the tool then says so; a command whose ruleset the kernel
//! does not enforce is not started.

use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, ABI,
};
use tokio::process::{Child, Command};

/// The newest Landlock ABI this code asks for; an older kernel enforces what it knows.
const ABI_ASKED: ABI = ABI::V5;

/// System paths a command may read and run from, where they exist.
const SYSTEM_PATHS: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
];

/// Entries of `/etc` a command may not read: the worker's own settings and secrets, and the
/// system's password hashes and privilege rules.
const SECRET_ETC_ENTRIES: [&str; 8] = [
    "skein",
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssl",
];

/// Entries of `/etc/ssl` a command may read (the trust store, not the private keys).
const SSL_READABLE: [&str; 2] = ["certs", "openssl.cnf"];

/// Devices a command may write (and read); `/dev/random` and `/dev/urandom` are read-only.
const WRITABLE_DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];
const READABLE_DEVICES: [&str; 2] = ["/dev/random", "/dev/urandom"];

/// Whether this kernel enforces Landlock (checked once, when the worker starts).
pub fn available() -> bool {
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(Ruleset::create);
    created.is_ok()
}

/// The paths a fenced command reads (besides its own), as given at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOnlyPaths {
    paths: Vec<PathBuf>,
}

impl ReadOnlyPaths {
    /// The system's paths that exist here, `/etc` without its secrets, and `extra`.
    pub fn system_and(extra: &[PathBuf]) -> Self {
        let mut paths: Vec<PathBuf> = SYSTEM_PATHS.iter().map(PathBuf::from).collect();
        paths.extend(entries_of(Path::new("/etc"), |name| {
            !SECRET_ETC_ENTRIES.contains(&name)
        }));
        paths.extend(SSL_READABLE.iter().map(|e| Path::new("/etc/ssl").join(e)));
        paths.extend(READABLE_DEVICES.iter().map(PathBuf::from));
        paths.extend(extra.iter().cloned());
        paths.retain(|p| p.exists());
        Self { paths }
    }
}

/// The entries of `dir` whose names `keep` accepts.
fn entries_of(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .collect()
}

/// The ruleset of one call: `writable` read-write (the checkout and the scratch directory,
/// `/proc` — where the isolating programs write the namespace's user map — and a few devices),
/// `readable` read-only.
pub fn ruleset(
    writable: &[&Path],
    readable: &ReadOnlyPaths,
) -> Result<RulesetCreated, RulesetError> {
    let all = AccessFs::from_all(ABI_ASKED);
    let read = AccessFs::from_read(ABI_ASKED);
    let mut rw: Vec<PathBuf> = writable.iter().map(|p| p.to_path_buf()).collect();
    rw.push(PathBuf::from("/proc"));
    rw.extend(WRITABLE_DEVICES.iter().map(PathBuf::from));
    Ruleset::default()
        .handle_access(all)?
        .create()?
        .add_rules(path_beneath_rules(&readable.paths, read))?
        .add_rules(path_beneath_rules(&rw, all))
}

/// Keeps the thread that started a fenced command alive: a command started under `setpriv
/// --pdeathsig` is killed when the thread that started it ends, so the thread waits until this
/// is dropped (after the command's group was killed and reaped).
#[derive(Debug)]
pub struct FenceHold {
    _release: std::sync::mpsc::Sender<()>,
}

/// Starts `command` held by `ruleset`: from a thread of its own that enforces the ruleset on
/// itself first (Landlock restricts the calling thread and every process it starts after), so
/// the worker's other threads stay unrestricted and no code runs between fork and exec.
pub async fn spawn(
    mut command: Command,
    ruleset: RulesetCreated,
) -> io::Result<(Child, FenceHold)> {
    let runtime = tokio::runtime::Handle::current();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("shell-fence".into())
        .spawn(move || {
            let spawned = match ruleset.restrict_self() {
                Ok(status) if status.ruleset != RulesetStatus::NotEnforced => {
                    let _entered = runtime.enter();
                    command.spawn()
                }
                Ok(_) => Err(io::Error::other(
                    "the kernel did not enforce the command's file fence",
                )),
                Err(e) => Err(io::Error::other(format!(
                    "the command's file fence could not be enforced: {e}"
                ))),
            };
            let started = spawned.is_ok();
            if started_tx.send(spawned).is_ok() && started {
                // Returns once the hold is dropped.
                let _ = release_rx.recv();
            }
        })?;
    let child = started_rx.await.map_err(|_| {
        io::Error::other("the thread that starts the command ended before starting it")
    })??;
    Ok((
        child,
        FenceHold {
            _release: release_tx,
        },
    ))
}
