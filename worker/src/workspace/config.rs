//! The worker's workspace settings: where session files live (`SKEIN_WORKSPACE`), their caps, and
//! the content cache of the object mode.

use clap::{Args, ValueEnum};
use skein_common::config::{ENV_WORKSPACE, ENV_WORKSPACE_CACHE_BYTES};
use skein_common::workspace::{parse_size, WorkspaceStoreConfig};

/// Where session workspaces live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceMode {
    /// The NATS object store: one bucket per tenant, seen by every worker of every node.
    Object,
    /// Directories `<workspace root>/<tenant>/<session>`: the workers of a pool must share the
    /// root (one machine, or a shared volume).
    Volume,
}

/// Workspace settings of a worker.
#[derive(Debug, Clone, Args)]
pub struct WorkspaceConfig {
    /// Where session workspaces live: `object` (the NATS object store) or `volume` (directories
    /// under the workspace root).
    #[arg(long = "workspace", env = ENV_WORKSPACE, value_enum, default_value_t = WorkspaceMode::Object)]
    pub mode: WorkspaceMode,
    #[command(flatten)]
    pub store: WorkspaceStoreConfig,
    /// Memory for workspace file contents already fetched (object mode; bytes, or with a KiB,
    /// MiB or GiB suffix; 0 turns the cache off).
    #[arg(long = "workspace-cache", env = ENV_WORKSPACE_CACHE_BYTES, default_value = "64MiB", value_parser = parse_size)]
    pub cache_bytes: u64,
}

impl WorkspaceConfig {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        self.store.validate()?;
        usize::try_from(self.cache_bytes)
            .map(|_| ())
            .map_err(|_| format!("workspace cache of {} bytes is too large", self.cache_bytes))
    }
}
