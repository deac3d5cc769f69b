//! `ObjectFiles`: the file tools' [`WorkspaceStore`] over the NATS object store
//! ([`ObjectWorkspaces`]): every worker of every node sees the same files, no shared volume
//! needed.
//!
//! Directories are implicit (the prefixes of file paths): a directory exists while a file lies
//! below it, and an empty one cannot exist. A revision is the sequence of the file's metadata
//! message, so a conditional write is the store's compare-and-set.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use skein_common::protocol::TaskOrigin;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{Limits, ObjectWorkspaces, WorkspaceError, WorkspacePath};

use super::store::{
    entries_below, session_of, DirEntry, FileContent, FileEntry, Revision, WorkspaceStore,
};

/// Session files in the object store. See the module documentation.
#[derive(Debug, Clone)]
pub struct ObjectFiles {
    objects: Arc<ObjectWorkspaces>,
}

impl ObjectFiles {
    pub fn new(objects: Arc<ObjectWorkspaces>) -> Self {
        Self { objects }
    }

    async fn files_of(&self, origin: &TaskOrigin) -> Result<Vec<FileEntry>, WorkspaceError> {
        let files = self.objects.list(&session_of(origin)?).await?;
        Ok(files
            .into_iter()
            .map(|f| FileEntry {
                path: f.path,
                size: f.size,
            })
            .collect())
    }
}

impl WorkspaceStore for ObjectFiles {
    fn limits(&self) -> Limits {
        self.objects.limits()
    }

    fn read<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<FileContent, WorkspaceError>> {
        async move {
            if path.is_root() {
                return Err(is_a_directory(path));
            }
            let session = session_of(origin)?;
            match self.objects.read(&session, path).await {
                Ok((bytes, version)) => Ok(FileContent {
                    bytes,
                    revision: Revision(version.seq.to_string()),
                }),
                Err(WorkspaceError::NotFound(message)) => {
                    let files = self.objects.list(&session).await?;
                    if files.iter().any(|f| path.contains(&f.path)) {
                        Err(is_a_directory(path))
                    } else {
                        Err(WorkspaceError::NotFound(message))
                    }
                }
                Err(other) => Err(other),
            }
        }
        .boxed()
    }

    fn write<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        path: &'a WorkspacePath,
        content: Bytes,
        expected: Option<&'a Revision>,
    ) -> BoxFuture<'a, Result<(), WorkspaceError>> {
        async move {
            let session = session_of(origin)?;
            let expect = match expected {
                None => Expect::Any,
                Some(revision) => match revision.0.parse() {
                    Ok(seq) => Expect::Seq(seq),
                    Err(_) => {
                        return Err(WorkspaceError::Conflict(format!(
                            "{path}: the revision {:?} is not one this store gave",
                            revision.0
                        )))
                    }
                },
            };
            self.objects
                .write(&session, path, content, expect)
                .await
                .map(|_| ())
        }
        .boxed()
    }

    fn list_dir<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        dir: &'a WorkspacePath,
    ) -> BoxFuture<'a, Result<Vec<DirEntry>, WorkspaceError>> {
        async move {
            let files = self.files_of(origin).await?;
            if files.iter().any(|f| f.path == dir.as_str()) {
                return Err(WorkspaceError::Invalid(format!(
                    "{dir} is a file; use read_file"
                )));
            }
            let entries = entries_below(&files, dir);
            if entries.is_empty() && !dir.is_root() {
                return Err(WorkspaceError::NotFound(format!(
                    "{dir}: no such file or directory"
                )));
            }
            Ok(entries)
        }
        .boxed()
    }

    fn files<'a>(
        &'a self,
        origin: &'a TaskOrigin,
    ) -> BoxFuture<'a, Result<Vec<FileEntry>, WorkspaceError>> {
        self.files_of(origin).boxed()
    }
}

fn is_a_directory(path: &WorkspacePath) -> WorkspaceError {
    WorkspaceError::Invalid(format!("{path} is a directory; use list_files"))
}
