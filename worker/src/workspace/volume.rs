//! The volume mode: a session's files in the directory `{root}/{tenant}/{session}` (a local disk,
//! or a volume every worker of the pool mounts). [`Workspace`] resolves paths inside it;
//! [`VolumeFiles`] is the file tools' [`WorkspaceStore`] over it.
//!
//! Invariants:
//! - every path goes through [`Workspace::resolve`] before any file operation: it must be a
//!   [`WorkspacePath`], and the deepest part of it that exists must canonicalize to a place
//!   inside the canonical workspace directory; a target that is itself a symbolic link is
//!   refused. Every refusal is [`WorkspaceError::Denied`];
//! - tenant and session are re-validated as tokens, so two sessions (or tenants) never share a
//!   directory, and the workspace directory is created on first use;
//! - a write goes to a temporary file beside its target, then is renamed over it: readers see
//!   the old content or the new one;
//! - messages name paths as the model gave them, never the host's absolute paths.
//!
//! Limits: the check and the use are two steps. The file tools never create symbolic links, so a
//! link can only appear between them if something else running in the same workspace makes one.
//! A conditional write compares the file's digest just before its rename; two writers racing
//! inside that window are not told apart (the object mode has a real compare-and-set).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use skein_common::protocol::{validate_token, TaskOrigin};
use skein_common::workspace::path::clean_relative;
use skein_common::workspace::{digest, human_size, Limits, WorkspaceError, WorkspacePath};

use super::store::{DirEntry, FileContent, FileEntry, Revision, WorkspaceStore};

/// One session's workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    /// The workspace of `origin`'s session under `root` (not created yet).
    pub fn for_session(root: &Path, origin: &TaskOrigin) -> Result<Self, WorkspaceError> {
        validate_token("tenant", &origin.tenant).map_err(|f| WorkspaceError::Denied(f.message))?;
        validate_token("workspace", &origin.workspace)
            .map_err(|f| WorkspaceError::Denied(f.message))?;
        Ok(Self {
            dir: root.join(&origin.tenant).join(&origin.workspace),
        })
    }

    /// The workspace directory (not canonicalized).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Maps `relative` to a path inside the workspace, creating the workspace directory if
    /// needed. `"."` is the workspace itself. See the module invariants for what is refused.
    pub async fn resolve(&self, relative: &str) -> Result<PathBuf, WorkspaceError> {
        let cleaned = clean_relative(relative)?;
        self.resolve_clean(relative, &cleaned).await
    }

    /// [`resolve`](Self::resolve) of a path already in normal form.
    async fn resolve_clean(
        &self,
        relative: &str,
        cleaned: &str,
    ) -> Result<PathBuf, WorkspaceError> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| io_failure("could not create the workspace", e))?;
        let root = tokio::fs::canonicalize(&self.dir)
            .await
            .map_err(|e| io_failure("could not resolve the workspace", e))?;
        if cleaned.is_empty() {
            return Ok(root);
        }
        let target = root.join(cleaned);
        if let Ok(meta) = tokio::fs::symlink_metadata(&target).await {
            if meta.file_type().is_symlink() {
                return Err(escapes(relative, "it is a symbolic link"));
            }
        }
        // The deepest existing ancestor decides: below it, only plain directories can be created.
        for ancestor in target.ancestors() {
            match tokio::fs::symlink_metadata(ancestor).await {
                Ok(_) => {
                    let real = tokio::fs::canonicalize(ancestor)
                        .await
                        .map_err(|_| escapes(relative, "it goes through a broken link"))?;
                    if !real.starts_with(&root) {
                        return Err(escapes(relative, "it leads outside through a link"));
                    }
                    return Ok(target);
                }
                Err(e) if is_missing(&e) => continue,
                Err(e) => return Err(io_error(relative, e)),
            }
        }
        // `root` is an ancestor of `target` and exists, so the loop always returns.
        Err(escapes(relative, "no part of it exists"))
    }
}

/// Session files as directories under one root. See the module documentation.
#[derive(Debug, Clone)]
pub struct VolumeFiles {
    root: PathBuf,
    limits: Limits,
}

impl VolumeFiles {
    pub fn new(root: impl AsRef<Path>, limits: Limits) -> Self {
        Self {
            root: root.as_ref().to_owned(),
            limits,
        }
    }

    async fn read_file(
        &self,
        origin: &TaskOrigin,
        path: &WorkspacePath,
    ) -> Result<FileContent, WorkspaceError> {
        let relative = path.to_string();
        let target = Workspace::for_session(&self.root, origin)?
            .resolve_clean(&relative, path.as_str())
            .await?;
        let meta = tokio::fs::metadata(&target)
            .await
            .map_err(|e| io_error(&relative, e))?;
        if meta.is_dir() {
            return Err(WorkspaceError::Invalid(format!(
                "{relative} is a directory; use list_files"
            )));
        }
        if meta.len() > self.limits.max_file_bytes {
            return Err(WorkspaceError::TooLarge(format!(
                "{relative} is {} ({} bytes), over the {} per-file cap: it cannot be read here",
                human_size(meta.len()),
                meta.len(),
                human_size(self.limits.max_file_bytes)
            )));
        }
        let bytes = tokio::fs::read(&target)
            .await
            .map_err(|e| io_error(&relative, e))?;
        let revision = Revision(digest(&bytes));
        Ok(FileContent {
            bytes: bytes.into(),
            revision,
        })
    }

    async fn write_file(
        &self,
        origin: &TaskOrigin,
        path: &WorkspacePath,
        content: Bytes,
        expected: Option<&Revision>,
    ) -> Result<(), WorkspaceError> {
        let relative = path.to_string();
        if path.is_root() {
            return Err(WorkspaceError::Invalid(
                "the workspace itself is a directory: give a file path".into(),
            ));
        }
        self.limits.check_file(path, content.len() as u64)?;
        let workspace = Workspace::for_session(&self.root, origin)?;
        let target = workspace.resolve_clean(&relative, path.as_str()).await?;
        let current = tokio::fs::symlink_metadata(&target).await.ok();
        if current.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(WorkspaceError::Invalid(format!(
                "{relative} is a directory"
            )));
        }
        let root = tokio::fs::canonicalize(workspace.dir())
            .await
            .map_err(|e| io_failure("could not resolve the workspace", e))?;
        let others: u64 = walk(root)
            .await?
            .iter()
            .filter(|f| f.path != path.as_str())
            .map(|f| f.size)
            .sum();
        self.limits.check_session(others + content.len() as u64)?;
        let parent = target
            .parent()
            .ok_or_else(|| WorkspaceError::Invalid(format!("{relative} has no directory")))?;
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| io_error(&relative, e))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = parent.join(format!(".{name}.{}.partial", uuid::Uuid::new_v4().simple()));
        let written = async {
            tokio::fs::write(&temporary, &content)
                .await
                .map_err(|e| io_error(&relative, e))?;
            if let Some(expected) = expected {
                let now = match tokio::fs::read(&target).await {
                    Ok(bytes) => Some(digest(&bytes)),
                    Err(e) if is_missing(&e) => None,
                    Err(e) => return Err(io_error(&relative, e)),
                };
                if now.as_deref() != Some(expected.0.as_str()) {
                    return Err(WorkspaceError::Conflict(format!(
                        "{relative} changed while this operation ran; nothing was written: read \
                         it again"
                    )));
                }
            }
            tokio::fs::rename(&temporary, &target)
                .await
                .map_err(|e| io_error(&relative, e))
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&temporary).await;
        }
        written
    }

    async fn list(
        &self,
        origin: &TaskOrigin,
        dir: &WorkspacePath,
    ) -> Result<Vec<DirEntry>, WorkspaceError> {
        let relative = dir.to_string();
        let target = Workspace::for_session(&self.root, origin)?
            .resolve_clean(&relative, dir.as_str())
            .await?;
        let meta = tokio::fs::metadata(&target)
            .await
            .map_err(|e| io_error(&relative, e))?;
        if !meta.is_dir() {
            return Err(WorkspaceError::Invalid(format!(
                "{relative} is a file; use read_file"
            )));
        }
        let mut reader = tokio::fs::read_dir(&target)
            .await
            .map_err(|e| io_error(&relative, e))?;
        let mut entries = Vec::new();
        while let Some(entry) = reader
            .next_entry()
            .await
            .map_err(|e| io_error(&relative, e))?
        {
            // `file_type` does not follow links: a link to a directory is listed as a plain name.
            let is_dir = entry.file_type().await.is_ok_and(|t| t.is_dir());
            entries.push(DirEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                is_dir,
            });
        }
        entries.sort();
        Ok(entries)
    }
}

impl WorkspaceStore for VolumeFiles {
    fn limits(&self) -> Limits {
        self.limits
    }

    fn read<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<FileContent, WorkspaceError>> {
        self.read_file(origin, path).boxed()
    }

    fn write<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
        content: Bytes,
        expected: Option<&'a Revision>,
    ) -> BoxFuture<'a, Result<(), WorkspaceError>> {
        self.write_file(origin, path, content, expected).boxed()
    }

    fn list_dir<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        dir: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<Vec<DirEntry>, WorkspaceError>> {
        self.list(origin, dir).boxed()
    }

    fn files<'a>(
        &'a self,
        origin: &'a TaskOrigin,
    ) -> BoxFuture<'a, Result<Vec<FileEntry>, WorkspaceError>> {
        async move {
            let dir = Workspace::for_session(&self.root, origin)?
                .resolve_clean(".", "")
                .await?;
            walk(dir).await
        }
        .boxed()
    }
}

/// Every regular file below `dir` (links are not followed), sorted by path; names that are not
/// workspace paths (control characters, not UTF-8) are left out.
async fn walk(dir: PathBuf) -> Result<Vec<FileEntry>, WorkspaceError> {
    tokio::task::spawn_blocking(move || {
        let mut files = Vec::new();
        let mut pending = vec![(dir, String::new())];
        while let Some((path, prefix)) = pending.pop() {
            let entries = std::fs::read_dir(&path).map_err(|e| io_error(&prefix, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&prefix, e))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let relative = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                if clean_relative(&relative).ok().as_deref() != Some(relative.as_str()) {
                    continue;
                }
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    pending.push((entry.path(), relative));
                } else if kind.is_file() {
                    let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    files.push(FileEntry {
                        path: relative,
                        size,
                    });
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    })
    .await
    .map_err(|e| WorkspaceError::unavailable("listing the workspace stopped", e))?
}

fn escapes(relative: &str, why: &str) -> WorkspaceError {
    WorkspaceError::Denied(format!(
        "path escapes the workspace: {relative:?} ({why}); use a path relative to the workspace"
    ))
}

fn is_missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

fn io_failure(what: &str, e: std::io::Error) -> WorkspaceError {
    WorkspaceError::unavailable(what.to_owned(), e)
}

fn io_error(relative: &str, e: std::io::Error) -> WorkspaceError {
    let shown = if relative.is_empty() { "." } else { relative };
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            WorkspaceError::NotFound(format!("{shown}: no such file or directory"))
        }
        std::io::ErrorKind::NotADirectory => WorkspaceError::Invalid(format!(
            "{shown}: a file is in the way of a directory on this path"
        )),
        std::io::ErrorKind::PermissionDenied => {
            WorkspaceError::Denied(format!("{shown}: permission denied"))
        }
        _ => WorkspaceError::unavailable(format!("{shown}: input/output failed"), e),
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::tools::test_support::{origin, TestDir};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any path text: refused, or resolved to a path inside the workspace.
        #[test]
        fn the_path_resolver_never_panics_or_leaves_the_workspace(
            relative in prop_oneof![
                ".{0,40}",
                "(\\.\\.?/|/|[a-z]{1,3}/|\\\\|%2e|\u{0}){0,6}[a-z.]{0,8}",
            ]
        ) {
            let dir = TestDir::new();
            let workspace = Workspace::for_session(dir.path(), &origin("acme", "s1"))
                .expect("a valid workspace");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            if let Ok(path) = runtime.block_on(workspace.resolve(&relative)) {
                let root = std::fs::canonicalize(workspace.dir()).expect("the workspace exists");
                prop_assert!(path.starts_with(&root), "{path:?} outside {root:?}");
            }
        }
    }
}
