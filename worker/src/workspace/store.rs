//! `WorkspaceStore`: the session files the file tools read and write, whatever holds them — the
//! NATS object store ([`ObjectFiles`](super::object::ObjectFiles)) or a directory per session
//! ([`VolumeFiles`](super::volume::VolumeFiles)).
//!
//! Contract every implementation keeps:
//! - paths are [`WorkspacePath`]s (already checked and normalized); a session is the task's
//!   tenant and `workspace`, both re-validated as tokens;
//! - a file is read and written whole; a write is all-or-nothing (a reader sees the old content or
//!   the new one) and refused whole when it would break a cap ([`Limits`]);
//! - a write given an `expected` [`Revision`] happens only if the file is still at that revision,
//!   else [`WorkspaceError::Conflict`];
//! - errors are [`WorkspaceError`]s, which become [`ToolError`]s of the same condition.

use bytes::Bytes;
use futures::future::BoxFuture;
use skein_common::protocol::TaskOrigin;
use skein_common::workspace::{Limits, SessionRef, WorkspaceError, WorkspacePath};

use crate::tools::ToolError;

/// Which version of a file a read saw, as the store that read it tells versions apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision(pub(crate) String);

/// A whole file and its revision.
#[derive(Debug, Clone)]
pub struct FileContent {
    pub bytes: Bytes,
    pub revision: Revision,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// One file of a session, anywhere below the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Normal form of its path.
    pub path: String,
    pub size: u64,
}

/// Where the file tools find a session's files. See the module documentation.
pub trait WorkspaceStore: Send + Sync + std::fmt::Debug + 'static {
    /// The caps this store enforces.
    fn limits(&self) -> Limits;

    /// A file's whole content.
    fn read<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<FileContent, WorkspaceError>>;

    /// Replaces (or creates) a file whole; with `expected`, only if it is still at that revision.
    fn write<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
        content: Bytes,
        expected: Option<&'a Revision>,
    ) -> BoxFuture<'a, Result<(), WorkspaceError>>;

    /// The entries of directory `dir`, sorted by name.
    fn list_dir<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        dir: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<Vec<DirEntry>, WorkspaceError>>;

    /// Every file of the session, sorted by path.
    fn files<'a>(
        &'a self,
        origin: &'a TaskOrigin,
    ) -> BoxFuture<'a, Result<Vec<FileEntry>, WorkspaceError>>;
}

/// The session a task's files belong to: its tenant and its `workspace` (the user's session, also
/// for subagent calls).
pub fn session_of(origin: &TaskOrigin) -> Result<SessionRef, WorkspaceError> {
    SessionRef::new(&origin.tenant, &origin.workspace)
}

/// The directory entries below `dir` in a sorted list of every file: names of files directly in
/// it, and of the directories on the way to deeper ones (once each, ending in `/` when shown).
pub fn entries_below(files: &[FileEntry], dir: &WorkspacePath) -> Vec<DirEntry> {
    let mut entries = std::collections::BTreeSet::new();
    for file in files.iter().filter(|f| dir.contains(&f.path)) {
        let rest = if dir.is_root() {
            file.path.as_str()
        } else {
            &file.path[dir.as_str().len() + 1..]
        };
        let entry = match rest.split_once('/') {
            Some((name, _)) => DirEntry {
                name: name.to_owned(),
                is_dir: true,
            },
            None => DirEntry {
                name: rest.to_owned(),
                is_dir: false,
            },
        };
        entries.insert(entry);
    }
    entries.into_iter().collect()
}

impl From<WorkspaceError> for ToolError {
    fn from(error: WorkspaceError) -> Self {
        match error {
            WorkspaceError::Denied(m) => ToolError::Denied(m),
            WorkspaceError::NotFound(m) => ToolError::NotFound(m),
            WorkspaceError::Invalid(m) => ToolError::InvalidArguments(m),
            WorkspaceError::TooLarge(m) => ToolError::TooLarge(m),
            WorkspaceError::Conflict(m) => ToolError::Failed(m),
            other => ToolError::Unavailable(other.describe()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_entries_come_from_the_file_list() {
        let files: Vec<FileEntry> = ["a.txt", "notes/b.txt", "notes/deep/c.txt", "notes2"]
            .into_iter()
            .map(|path| FileEntry {
                path: path.into(),
                size: 1,
            })
            .collect();
        let dir = |p: &str| WorkspacePath::parse(p).expect("valid");
        let names = |entries: Vec<DirEntry>| -> Vec<(String, bool)> {
            entries.into_iter().map(|e| (e.name, e.is_dir)).collect()
        };
        assert_eq!(
            names(entries_below(&files, &dir("."))),
            [
                ("a.txt".to_owned(), false),
                ("notes".to_owned(), true),
                ("notes2".to_owned(), false)
            ]
        );
        assert_eq!(
            names(entries_below(&files, &dir("notes"))),
            [("b.txt".to_owned(), false), ("deep".to_owned(), true)]
        );
        assert!(entries_below(&files, &dir("missing")).is_empty());
    }
}
