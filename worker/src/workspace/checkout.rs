//! `ObjectCheckout`: the object mode's [`CommandWorkspace`]. A command runs on local files, so
//! checking out copies the session's files from the object store into a directory of the call's
//! scratch space, and checking in writes back what the command changed.
//!
//! Invariants:
//! - the directory lies in the call's [`TaskScope`] scratch directory, so it is removed on every
//!   outcome of the call; a session over its cap is not checked out;
//! - check-out remembers what it copied (path, metadata sequence, digest); check-in compares
//!   contents by digest, writes new and changed files and removes deleted ones, each write
//!   conditional on the version check-out saw: a file changed in the store meanwhile keeps that
//!   newer version, and the summary says so;
//! - nothing is written back when a file is over the per-file cap or the files together over the
//!   session cap: the call fails with the reason;
//! - a symbolic link is stored as a copy of its target when that is a file inside the directory;
//!   a link leading outside (or nowhere, or to a directory), and anything that is not a regular
//!   file, is not stored, and the summary names it. Links are never followed out of the
//!   directory, so no file outside it is ever read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use skein_common::protocol::TaskOrigin;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::path::clean_relative;
use skein_common::workspace::{
    digest, human_size, Limits, ObjectWorkspaces, SessionRef, WorkspaceError, WorkspacePath,
};

use super::store::session_of;
use super::{CheckedOut, CommandWorkspace};
use crate::scope::TaskScope;
use crate::tools::ToolError;

/// Files copied to or from the store at once.
const PARALLEL_TRANSFERS: usize = 4;

/// Most names listed in one part of a check-in summary.
const NAMES_SHOWN: usize = 5;

/// Most entries (files and directories) a check-in reads back: a command that makes more gets
/// nothing written back, rather than a scan, a write and later listings without bound.
const MAX_CHECKIN_ENTRIES: usize = 10_000;

/// Checks object-store workspaces out for commands. See the module documentation.
#[derive(Debug, Clone)]
pub struct ObjectCheckout {
    objects: Arc<ObjectWorkspaces>,
}

impl ObjectCheckout {
    pub fn new(objects: Arc<ObjectWorkspaces>) -> Self {
        Self { objects }
    }
}

/// What check-out copied: the version of every file, by path.
struct Snapshot {
    session: SessionRef,
    files: BTreeMap<String, Seen>,
}

struct Seen {
    seq: u64,
    digest: String,
}

/// A file found in the directory at check-in.
struct Found {
    digest: String,
    size: u64,
    /// Where its content is read from (the link's target for a link to a file inside).
    source: PathBuf,
}

/// What the directory holds at check-in.
#[derive(Default)]
struct Scan {
    files: BTreeMap<String, Found>,
    /// Entries not stored, with why.
    refused: Vec<String>,
    /// Files over the per-file cap.
    too_large: Vec<String>,
}

enum Change {
    Write(String, Expect),
    Remove(String, Expect),
}

enum Outcome {
    Written,
    Removed,
    /// Changed in the store since check-out: the store's version is kept.
    Kept(String),
    Failed(String),
}

impl CommandWorkspace for ObjectCheckout {
    fn check_out<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        scope: &'a mut TaskScope,
    ) -> BoxFuture<'a, Result<CheckedOut, ToolError>> {
        async move {
            let session = session_of(origin)?;
            let listed = self.objects.list(&session).await?;
            let total = listed.iter().map(|f| f.size).sum();
            self.objects.limits().check_session(total)?;
            let scratch = scope
                .scratch_dir()
                .await
                .map_err(|e| ToolError::Failed(format!("cannot check out the workspace: {e}")))?;
            let dir = fresh_dir(&scratch).await?;

            let objects = &self.objects;
            let session_ref = &session;
            let mut copies = futures::stream::iter(listed)
                .map(|file| async move {
                    let path = WorkspacePath::parse(&file.path)?;
                    match objects.read(session_ref, &path).await {
                        Ok((content, version)) => Ok(Some((file.path, content, version))),
                        // Removed since the listing.
                        Err(WorkspaceError::NotFound(_)) => Ok(None),
                        Err(other) => Err(other),
                    }
                })
                .buffer_unordered(PARALLEL_TRANSFERS);
            let mut files = BTreeMap::new();
            while let Some(copy) = copies.next().await {
                let Some((path, content, version)) = copy? else {
                    continue;
                };
                let target = dir.join(&path);
                if let Some(parent) = target.parent() {
                    tokio::fs::create_dir_all(parent)
                        .await
                        .map_err(|e| local_failure(&path, e))?;
                }
                tokio::fs::write(&target, &content)
                    .await
                    .map_err(|e| local_failure(&path, e))?;
                files.insert(
                    path,
                    Seen {
                        seq: version.seq,
                        digest: version.digest.unwrap_or_else(|| digest(&content)),
                    },
                );
            }
            drop(copies);
            Ok(CheckedOut {
                dir,
                state: Some(Box::new(Snapshot { session, files })),
            })
        }
        .boxed()
    }

    fn check_in<'a>(
        &'a self,
        _origin: &'a TaskOrigin,
        checked_out: CheckedOut,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        async move {
            let snapshot = checked_out
                .state
                .and_then(|state| state.downcast::<Snapshot>().ok())
                .ok_or_else(|| {
                    ToolError::Failed(
                        "this directory was not checked out from the object store".into(),
                    )
                })?;
            let limits = self.objects.limits();
            let dir = checked_out.dir.clone();
            let scan = tokio::task::spawn_blocking(move || scan(&dir, limits))
                .await
                .map_err(|e| ToolError::Failed(format!("reading back the workspace stopped: {e}")))?
                .map_err(|e| {
                    ToolError::Failed(format!("cannot read back the workspace directory: {e}"))
                })?;
            if !scan.too_large.is_empty() {
                return Err(ToolError::TooLarge(format!(
                    "workspace not updated: {} over the {} per-file cap",
                    names(&scan.too_large),
                    human_size(limits.max_file_bytes)
                )));
            }
            let total = scan.files.values().map(|f| f.size).sum();
            if let Err(e) = limits.check_session(total) {
                return Err(ToolError::TooLarge(format!("workspace not updated: {e}")));
            }

            let mut changes = Vec::new();
            for (path, found) in &scan.files {
                match snapshot.files.get(path) {
                    Some(seen) if seen.digest == found.digest => {}
                    Some(seen) => changes.push(Change::Write(path.clone(), Expect::Seq(seen.seq))),
                    None => changes.push(Change::Write(path.clone(), Expect::Absent)),
                }
            }
            for (path, seen) in &snapshot.files {
                if !scan.files.contains_key(path) {
                    changes.push(Change::Remove(path.clone(), Expect::Seq(seen.seq)));
                }
            }

            let outcomes: Vec<Outcome> = futures::stream::iter(changes)
                .map(|change| self.apply(&snapshot.session, &scan, change))
                .buffer_unordered(PARALLEL_TRANSFERS)
                .collect()
                .await;
            summarize(&outcomes, &scan.refused)
        }
        .boxed()
    }
}

impl ObjectCheckout {
    async fn apply(&self, session: &SessionRef, scan: &Scan, change: Change) -> Outcome {
        let (path, result) = match change {
            Change::Write(path, expect) => {
                let result = async {
                    let found = scan.files.get(&path).ok_or_else(|| {
                        WorkspaceError::NotFound(format!("{path}: no such file or directory"))
                    })?;
                    let content = tokio::fs::read(&found.source).await.map_err(|e| {
                        WorkspaceError::unavailable(format!("cannot read back {path}"), e)
                    })?;
                    let target = WorkspacePath::parse(&path)?;
                    self.objects
                        .write_prechecked(session, &target, content.into(), expect)
                        .await
                        .map(|_| Outcome::Written)
                }
                .await;
                (path, result)
            }
            Change::Remove(path, expect) => {
                let result = async {
                    let target = WorkspacePath::parse(&path)?;
                    self.objects
                        .remove(session, &target, expect)
                        .await
                        .map(|_| Outcome::Removed)
                }
                .await;
                (path, result)
            }
        };
        match result {
            Ok(outcome) => outcome,
            Err(WorkspaceError::Conflict(_)) => Outcome::Kept(path),
            Err(other) => Outcome::Failed(format!("{path}: {}", other.describe())),
        }
    }
}

/// The one-line summary of a check-in; empty when nothing changed and nothing was refused.
fn summarize(outcomes: &[Outcome], refused: &[String]) -> Result<String, ToolError> {
    let (mut written, mut removed) = (0, 0);
    let (mut kept, mut failed) = (Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            Outcome::Written => written += 1,
            Outcome::Removed => removed += 1,
            Outcome::Kept(path) => kept.push(path.clone()),
            Outcome::Failed(why) => failed.push(why.clone()),
        }
    }
    if written == 0 && removed == 0 && kept.is_empty() && failed.is_empty() && refused.is_empty() {
        return Ok(String::new());
    }
    let mut summary = format!("workspace: {written} written, {removed} removed");
    if !kept.is_empty() {
        summary.push_str(&format!(
            "; kept the newer version of {} (changed in the workspace during the command)",
            names(&kept)
        ));
    }
    if !refused.is_empty() {
        summary.push_str(&format!("; not stored: {}", names(refused)));
    }
    if failed.is_empty() {
        Ok(summary)
    } else {
        Err(ToolError::Unavailable(format!(
            "{summary}; failed: {}",
            names(&failed)
        )))
    }
}

/// The first few of `items`, and how many more.
fn names(items: &[String]) -> String {
    let mut text = items
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > NAMES_SHOWN {
        text.push_str(&format!(" and {} more", items.len() - NAMES_SHOWN));
    }
    text
}

/// A new, empty directory for the files under the scratch directory.
async fn fresh_dir(scratch: &Path) -> Result<PathBuf, ToolError> {
    let mut dir = scratch.join("workspace");
    let mut n = 1;
    while tokio::fs::symlink_metadata(&dir).await.is_ok() {
        n += 1;
        dir = scratch.join(format!("workspace-{n}"));
    }
    tokio::fs::create_dir(&dir)
        .await
        .map_err(|e| ToolError::Failed(format!("cannot create the workspace directory: {e}")))?;
    Ok(dir)
}

fn local_failure(path: &str, e: std::io::Error) -> ToolError {
    ToolError::Failed(format!("cannot check out {path}: {e}"))
}

/// Walks the checked-out directory without following links out of it. See the module
/// invariants for links and special files.
fn scan(dir: &Path, limits: Limits) -> std::io::Result<Scan> {
    let root = std::fs::canonicalize(dir)?;
    let mut scan = Scan::default();
    let mut pending = vec![(root.clone(), String::new())];
    let mut seen = 0usize;
    while let Some((path, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&path)? {
            let entry = entry?;
            seen += 1;
            if seen > MAX_CHECKIN_ENTRIES {
                return Err(std::io::Error::other(format!(
                    "more than {MAX_CHECKIN_ENTRIES} files and directories; nothing written back"
                )));
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let kind = entry.file_type()?;
            let allowed = clean_relative(&relative).ok().as_deref() == Some(relative.as_str())
                && entry.file_name().to_str().is_some();
            if !allowed {
                scan.refused
                    .push(format!("{relative:?} (not a valid workspace name)"));
                continue;
            }
            if kind.is_dir() {
                pending.push((entry.path(), relative));
                continue;
            }
            let source = if kind.is_file() {
                entry.path()
            } else if kind.is_symlink() {
                match std::fs::canonicalize(entry.path()) {
                    Ok(real) if real.starts_with(&root) && real.is_file() => real,
                    Ok(real) if real.starts_with(&root) => {
                        scan.refused
                            .push(format!("{relative} (a link to a directory)"));
                        continue;
                    }
                    Ok(_) => {
                        scan.refused
                            .push(format!("{relative} (a link leading outside the workspace)"));
                        continue;
                    }
                    Err(_) => {
                        scan.refused.push(format!("{relative} (a broken link)"));
                        continue;
                    }
                }
            } else {
                scan.refused
                    .push(format!("{relative} (not a regular file)"));
                continue;
            };
            let size = std::fs::metadata(&source)?.len();
            if size > limits.max_file_bytes {
                scan.too_large
                    .push(format!("{relative} ({})", human_size(size)));
                continue;
            }
            let content = std::fs::read(&source)?;
            scan.files.insert(
                relative,
                Found {
                    digest: digest(&content),
                    size: content.len() as u64,
                    source,
                },
            );
        }
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_file_bytes: 8,
            max_session_bytes: 64,
        }
    }

    #[test]
    fn a_directory_with_too_many_entries_is_not_read_back() {
        let dir = crate::tools::test_support::TestDir::new();
        let inside = dir.path().join("ws");
        std::fs::create_dir_all(inside.join("many")).expect("dirs");
        for i in 0..MAX_CHECKIN_ENTRIES {
            std::fs::write(inside.join("many").join(i.to_string()), "").expect("file");
        }
        match scan(&inside, limits()) {
            Err(error) => assert!(
                error.to_string().contains("nothing written back"),
                "{error}"
            ),
            Ok(scan) => panic!("read back {} files", scan.files.len()),
        }
        std::fs::remove_file(inside.join("many").join("0")).expect("one fewer");
        assert_eq!(
            scan(&inside, limits()).expect("scans").files.len(),
            MAX_CHECKIN_ENTRIES - 1
        );
    }

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_directory_are_never_read() {
        let dir = crate::tools::test_support::TestDir::new();
        let inside = dir.path().join("ws");
        std::fs::create_dir_all(inside.join("sub")).expect("dirs");
        std::fs::write(dir.path().join("secret"), "secret").expect("outside file");
        std::fs::write(inside.join("a.txt"), "a").expect("file");
        std::fs::write(inside.join("big"), "123456789").expect("file");
        std::os::unix::fs::symlink(dir.path().join("secret"), inside.join("out")).expect("link");
        std::os::unix::fs::symlink(inside.join("a.txt"), inside.join("copy")).expect("link");
        std::os::unix::fs::symlink(inside.join("sub"), inside.join("subdir")).expect("link");
        std::os::unix::fs::symlink(inside.join("nowhere"), inside.join("broken")).expect("link");

        let scan = scan(&inside, limits()).expect("scans");
        let stored: Vec<&str> = scan.files.keys().map(String::as_str).collect();
        assert_eq!(stored, ["a.txt", "copy"]);
        assert_eq!(scan.files["copy"].digest, digest(b"a"));
        let refused = scan.refused.join("; ");
        for expected in [
            "out (a link leading outside the workspace)",
            "subdir (a link to a directory)",
            "broken (a broken link)",
        ] {
            assert!(refused.contains(expected), "{refused}");
        }
        assert_eq!(scan.too_large, ["big (9 B)"]);
    }

    #[test]
    fn summaries_count_what_changed() {
        assert_eq!(summarize(&[], &[]), Ok(String::new()));
        let outcomes = [
            Outcome::Written,
            Outcome::Written,
            Outcome::Removed,
            Outcome::Kept("notes.md".into()),
        ];
        assert_eq!(
            summarize(
                &outcomes,
                &["out (a link leading outside the workspace)".into()]
            ),
            Ok(
                "workspace: 2 written, 1 removed; kept the newer version of notes.md (changed \
                in the workspace during the command); not stored: out (a link leading outside \
                the workspace)"
                    .into()
            )
        );
        let failed = summarize(&[Outcome::Written, Outcome::Failed("x: down".into())], &[]);
        assert!(
            matches!(&failed, Err(ToolError::Unavailable(m)) if m.contains("1 written") && m.contains("failed: x: down")),
            "{failed:?}"
        );
        let many: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
        assert_eq!(names(&many), "f0, f1, f2, f3, f4 and 2 more");
    }
}
