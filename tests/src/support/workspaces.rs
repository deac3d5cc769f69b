//! Session workspaces in tests: the object store of a test NATS server, and paths and sessions
//! that must be valid.

use skein_common::workspace::{ObjectWorkspaces, SessionRef, WorkspacePath, WorkspaceStoreConfig};

use super::NatsServer;

/// A view of the object-store workspaces of the NATS server at `nats_url`, caching up to `cache`
/// bytes.
pub async fn object_store(
    nats_url: &str,
    cfg: &WorkspaceStoreConfig,
    cache: usize,
) -> ObjectWorkspaces {
    ObjectWorkspaces::new(&super::test_bus(nats_url).await, cfg, cache)
}

/// [`object_store`] with the default caps and a 16 MiB cache.
pub async fn store(nats: &NatsServer) -> ObjectWorkspaces {
    object_store(&nats.url, &WorkspaceStoreConfig::default(), 16 << 20).await
}

/// A workspace path that must be valid.
pub fn path(p: &str) -> WorkspacePath {
    WorkspacePath::parse(p).expect("a valid path")
}

/// A session of valid tokens.
pub fn session(tenant: &str, session: &str) -> SessionRef {
    SessionRef::new(tenant, session).expect("valid tokens")
}
