//! `LiveCatalog`: the tool directory of a process, read from the worker registry. It shares one snapshot among the turns of a process: it reads the worker registry
//! again once its snapshot is [`CATALOG_MAX_AGE`] old (one read for all turns that start
//! meanwhile), so a turn costs no registry read and holds no copy of its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;

use crate::agent::seams::ToolDirectory;
use crate::agent::tools::ToolCatalog;
use crate::protocol::Failure;
use crate::store::{SessionStore, StoreError};

/// How long a catalog snapshot serves new turns before the registry is read again. Short next
/// to the registry's own liveness window (workers announce themselves every few seconds).
pub const CATALOG_MAX_AGE: Duration = Duration::from_millis(250);

/// The catalog of the live workers, shared by the turns of one process.
#[derive(Clone)]
pub struct LiveCatalog {
    store: SessionStore,
    max_age: Duration,
    snapshot: Arc<tokio::sync::Mutex<Option<Snapshot>>>,
}

/// A catalog and when it was read.
type Snapshot = (Instant, Arc<ToolCatalog>);

impl LiveCatalog {
    pub fn new(store: SessionStore, max_age: Duration) -> Self {
        Self {
            store,
            max_age,
            snapshot: Arc::default(),
        }
    }

    /// The current snapshot: the shared one while it is fresh, else one read from the registry
    /// now (turns asking meanwhile wait for that one read).
    pub async fn current(&self) -> Result<Arc<ToolCatalog>, StoreError> {
        let mut snapshot = self.snapshot.lock().await;
        if let Some((taken, catalog)) = snapshot.as_ref() {
            if taken.elapsed() < self.max_age {
                return Ok(catalog.clone());
            }
        }
        let workers = self.store.routable_workers().await?;
        let catalog = Arc::new(ToolCatalog::from_workers(&workers));
        *snapshot = Some((Instant::now(), catalog.clone()));
        Ok(catalog)
    }
}

impl ToolDirectory for LiveCatalog {
    fn current(&self) -> BoxFuture<'_, Result<Arc<ToolCatalog>, Failure>> {
        Box::pin(async move { LiveCatalog::current(self).await.map_err(|e| e.to_failure()) })
    }
}
