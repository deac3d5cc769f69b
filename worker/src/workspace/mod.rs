//! Session workspaces as seen by tools that run programs: a local directory holding the session's
//! files for the length of one call ([`CommandWorkspace::check_out`]), and the changes written
//! back afterwards ([`CommandWorkspace::check_in`]).
//!
//! [`VolumeWorkspace`] is the volume mode: the session's files already live in a local (or
//! shared) directory, so checking out hands that directory over and checking in does nothing.
//! [`ObjectCheckout`] is the object mode: the files are copied from the NATS object store into a
//! directory of the call's scratch space, and what the command changed is written back.
//!
//! Beside it, the file tools' side: [`WorkspaceStore`] (read, write and list whole files) with
//! [`ObjectFiles`] and [`VolumeFiles`], the settings ([`WorkspaceConfig`]), and [`open`], which
//! picks both sides for the configured mode.
//!
//! Layout: `store` (the `WorkspaceStore` contract), `object` (object mode, files), `checkout`
//! (object mode, commands), `volume` (volume mode, files and the path resolver), `config`.

pub mod checkout;
pub mod config;
pub mod object;
pub mod store;
pub mod volume;

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use skein_common::bus::Bus;
use skein_common::protocol::TaskOrigin;
use skein_common::workspace::ObjectWorkspaces;

use crate::scope::TaskScope;
use crate::tools::ToolError;

pub use checkout::ObjectCheckout;
pub use config::{WorkspaceConfig, WorkspaceMode};
pub use object::ObjectFiles;
pub use store::{DirEntry, FileContent, FileEntry, Revision, WorkspaceStore};
pub use volume::{VolumeFiles, Workspace};

/// The workspace of the configured mode, for the file tools and for commands: in object mode
/// both share one [`ObjectWorkspaces`] (and its content cache) over `bus`; in volume mode both
/// use directories under `root`.
pub fn open(
    cfg: &WorkspaceConfig,
    root: &Path,
    bus: &Bus,
) -> (Arc<dyn WorkspaceStore>, Arc<dyn CommandWorkspace>) {
    match cfg.mode {
        WorkspaceMode::Object => {
            let cache_bytes = usize::try_from(cfg.cache_bytes).unwrap_or(usize::MAX);
            let objects = Arc::new(ObjectWorkspaces::new(bus, &cfg.store, cache_bytes));
            (
                Arc::new(ObjectFiles::new(objects.clone())),
                Arc::new(ObjectCheckout::new(objects)),
            )
        }
        WorkspaceMode::Volume => (
            Arc::new(VolumeFiles::new(root, cfg.store.limits())),
            Arc::new(VolumeWorkspace::new(root)),
        ),
    }
}

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
