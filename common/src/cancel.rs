//! `CancelRegistry`: the running work of this process by task, so a cancel request
//! (`skein.cancel.{tenant}.{task_id}`) reaches it. Leads register turns, workers register calls;
//! a listener cancels every registered token of the named task.
//!
//! Invariant: a registration lives exactly as long as its guard, so the registry only holds work
//! that is running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{Bus, BusError};
use crate::subjects;

type Registered = HashMap<(String, String), Vec<(u64, CancellationToken)>>;

/// How long this process remembers a cancel request it heard.
const REMEMBERED: Duration = Duration::from_secs(600);

/// Running work of this process, by (tenant, task id), and the cancel requests it heard lately.
#[derive(Clone, Default)]
pub struct CancelRegistry {
    inner: Arc<Mutex<Registered>>,
    next: Arc<AtomicU64>,
    heard: Arc<Mutex<HashMap<(String, String), Instant>>>,
}

/// Removes its registration when dropped.
pub struct Registration {
    registry: CancelRegistry,
    key: (String, String),
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.registry.inner.lock() {
            if let Some(tokens) = inner.get_mut(&self.key) {
                tokens.retain(|(id, _)| *id != self.id);
                if tokens.is_empty() {
                    inner.remove(&self.key);
                }
            }
        }
    }
}

impl CancelRegistry {
    /// Registers `token` as work of the task until the returned guard drops.
    pub fn register(&self, tenant: &str, task_id: &str, token: CancellationToken) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (tenant.to_owned(), task_id.to_owned());
        if let Ok(mut inner) = self.inner.lock() {
            inner.entry(key.clone()).or_default().push((id, token));
        }
        Registration {
            registry: self.clone(),
            key,
            id,
        }
    }

    /// Cancels the task's running work here; returns how many pieces were cancelled.
    pub fn cancel(&self, tenant: &str, task_id: &str) -> usize {
        let tokens = self
            .inner
            .lock()
            .map(|inner| {
                inner
                    .get(&(tenant.to_owned(), task_id.to_owned()))
                    .cloned()
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for (_, token) in &tokens {
            token.cancel();
        }
        tokens.len()
    }

    /// Whether this process heard a cancel request for the task in the last ten minutes (work
    /// that arrives after its task was cancelled is not started; see `Bus::cancel_requested` for
    /// requests published before the process listened).
    pub fn heard(&self, tenant: &str, task_id: &str) -> bool {
        self.heard
            .lock()
            .map(|heard| heard.contains_key(&(tenant.to_owned(), task_id.to_owned())))
            .unwrap_or(false)
    }

    fn remember(&self, tenant: &str, task_id: &str) {
        if let Ok(mut heard) = self.heard.lock() {
            let now = Instant::now();
            heard.retain(|_, at| now.duration_since(*at) < REMEMBERED);
            heard.insert((tenant.to_owned(), task_id.to_owned()), now);
        }
    }

    /// Listens for cancel requests until `stop`, cancelling matching work.
    pub async fn listen(
        &self,
        bus: &Bus,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<(), BusError> {
        let mut requests = bus
            .client()
            .subscribe(subjects::CANCEL_ALL)
            .await
            .map_err(|e| BusError::Consumer {
                consumer: subjects::CANCEL_ALL.into(),
                message: e.to_string(),
            })?;
        let registry = self.clone();
        tracker.spawn(async move {
            loop {
                let request = tokio::select! {
                    _ = stop.cancelled() => break,
                    request = requests.next() => request,
                };
                let Some(request) = request else { break };
                if let Some((tenant, task_id)) = subjects::parse_cancel(&request.subject) {
                    registry.remember(tenant, task_id);
                    let stopped = registry.cancel(tenant, task_id);
                    tracing::info!(tenant, task_id, stopped, "cancel request");
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancels_only_registered_work_of_the_task() {
        let registry = CancelRegistry::default();
        let (a, b, other) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let _ga = registry.register("t", "task1", a.clone());
        let gb = registry.register("t", "task1", b.clone());
        let _go = registry.register("t", "task2", other.clone());
        drop(gb);
        assert_eq!(registry.cancel("t", "task1"), 1);
        assert!(a.is_cancelled() && !b.is_cancelled() && !other.is_cancelled());
        assert_eq!(registry.cancel("t", "nothing"), 0);
    }
}
