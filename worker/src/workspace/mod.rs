//! Session workspaces as seen by tools that run programs: a local directory holding the session's
//! files for the length of one call ([`CommandWorkspace::check_out`]), and the changes written
//! back afterwards ([`CommandWorkspace::check_in`]).
//!
//! [`VolumeWorkspace`] is the volume mode: the session's files already live in a local (or
//! shared) directory, so checking out hands that directory over and checking in does nothing.

use std::any::Any;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use futures::FutureExt;
use skein_common::protocol::TaskOrigin;

use crate::scope::TaskScope;
use crate::tools::fs::Workspace;
use crate::tools::ToolError;

/// A session's files on local disk for one call.
pub struct CheckedOut {
    /// Where the command runs and finds the session's files.
    pub dir: PathBuf,
    /// What the backend needs to tell afterwards what changed (its snapshot), if anything.
    pub state: Option<Box<dyn Any + Send>>,
}

/// Where commands find a session's files.
pub trait CommandWorkspace: Send + Sync + 'static {
    /// A local directory holding `origin`'s session files. Anything temporary it creates belongs
    /// to `scope`, so it is removed when the call ends, whatever the outcome.
    fn check_out<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        scope: &'a mut TaskScope,
    ) -> BoxFuture<'a, Result<CheckedOut, ToolError>>;

    /// Writes back what changed in `checked_out.dir` since [`check_out`](Self::check_out);
    /// returns a one-line summary for the model (empty when nothing needed writing back).
    fn check_in<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        checked_out: CheckedOut,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
}

/// Workspaces as directories `{root}/{tenant}/{session}` (a local disk or a shared volume).
#[derive(Debug, Clone)]
pub struct VolumeWorkspace {
    root: PathBuf,
}

impl VolumeWorkspace {
    pub fn new(root: impl AsRef<Path>) -> Self {
        Self {
            root: root.as_ref().to_owned(),
        }
    }
}

impl CommandWorkspace for VolumeWorkspace {
    fn check_out<'a>(
        &'a self,
        origin: &'a TaskOrigin,
        _scope: &'a mut TaskScope,
    ) -> BoxFuture<'a, Result<CheckedOut, ToolError>> {
        async move {
            let dir = Workspace::for_session(&self.root, origin)?
                .resolve(".")
                .await?;
            Ok(CheckedOut { dir, state: None })
        }
        .boxed()
    }

    fn check_in<'a>(
        &'a self,
        _origin: &'a TaskOrigin,
        _checked_out: CheckedOut,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        async { Ok(String::new()) }.boxed()
    }
}
