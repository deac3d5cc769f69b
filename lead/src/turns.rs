//! Waiting for a session's turn without polling: a lead that frees a session (ends a turn,
//! releases its lease, settles a submission) announces it on `skein.turned.{tenant}.{session}`
//! (core NATS); every lead listens on `skein.turned.>` and wakes the submissions it holds that wait
//! for that session. A wake can be missed (the announcing lead crashed, the connection dropped),
//! so a waiter also looks again after [`FALLBACK_LOOK`], and gives up after a bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use skein_common::bus::{Bus, BusError};
use skein_common::subjects;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a waiter sleeps when no wake comes (a missed one, or a lease that expired).
pub const FALLBACK_LOOK: Duration = Duration::from_secs(1);

/// Per (tenant, session): the signal its waiters share, and how many hold it.
type Waiting = HashMap<(String, String), (Arc<Notify>, usize)>;

/// Waiters by tenant and session: one signal per session, shared by its waiters.
#[derive(Clone, Default)]
pub struct SessionWaits {
    waiting: Arc<Mutex<Waiting>>,
}

/// A waiter's hold on its session's signal; dropping it forgets the signal when it was the last.
pub struct Waiter {
    waits: SessionWaits,
    key: (String, String),
    signal: Arc<Notify>,
}

impl Waiter {
    /// Waits for a wake of the session, or [`FALLBACK_LOOK`] at most.
    pub async fn changed(&self) {
        let _ = tokio::time::timeout(FALLBACK_LOOK, self.signal.notified()).await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Ok(mut waiting) = self.waits.waiting.lock() {
            if let Some((_, holders)) = waiting.get_mut(&self.key) {
                *holders -= 1;
                if *holders == 0 {
                    waiting.remove(&self.key);
                }
            }
        }
    }
}

impl SessionWaits {
    /// Starts listening for wakes until `stop`.
    pub async fn listen(
        bus: &Bus,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<Self, BusError> {
        let mut wakes = bus.subscribe(subjects::TURNED_ALL).await?;
        let waits = SessionWaits::default();
        let listening = waits.clone();
        tracker.spawn(async move {
            loop {
                let wake = tokio::select! {
                    _ = stop.cancelled() => break,
                    wake = wakes.next() => wake,
                };
                let Some(wake) = wake else { break };
                if let Some((tenant, session)) = subjects::parse_turned(&wake.subject) {
                    listening.wake(tenant, session);
                }
            }
        });
        Ok(waits)
    }

    /// Registers interest in the session; wakes that come after this reach the waiter.
    pub fn wait_for(&self, tenant: &str, session: &str) -> Waiter {
        let key = (tenant.to_owned(), session.to_owned());
        let signal = self
            .waiting
            .lock()
            .map(|mut waiting| {
                let entry = waiting
                    .entry(key.clone())
                    .or_insert_with(|| (Arc::new(Notify::new()), 0));
                entry.1 += 1;
                entry.0.clone()
            })
            .unwrap_or_default();
        Waiter {
            waits: self.clone(),
            key,
            signal,
        }
    }

    /// Wakes every waiter of the session (those between two looks are not lost: `Notify` keeps
    /// one permit for the next to wait).
    pub fn wake(&self, tenant: &str, session: &str) {
        let key = (tenant.to_owned(), session.to_owned());
        if let Some((signal, _)) = self.waiting.lock().ok().and_then(|w| w.get(&key).cloned()) {
            signal.notify_waiters();
            signal.notify_one();
        }
    }

    /// Sessions with waiters now.
    pub fn len(&self) -> usize {
        self.waiting.lock().map(|w| w.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Tells every lead that the session may be free for its next turn (best effort).
pub async fn announce(bus: &Bus, tenant: &str, session: &str) {
    if let Err(e) = bus
        .client()
        .publish(subjects::turned(tenant, session), Default::default())
        .await
    {
        tracing::debug!(error = %e, "session change not announced; waiters look again soon");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wake_reaches_every_waiter_of_the_session_and_only_them() {
        let waits = SessionWaits::default();
        let (a, b, other) = (
            waits.wait_for("t", "s"),
            waits.wait_for("t", "s"),
            waits.wait_for("t", "other"),
        );
        assert_eq!(waits.len(), 2);
        let started = tokio::time::Instant::now();
        let woken = async {
            tokio::join!(a.changed(), b.changed());
            started.elapsed()
        };
        let wake = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waits.wake("t", "s");
        };
        let (elapsed, ()) = tokio::join!(woken, wake);
        assert!(
            elapsed < FALLBACK_LOOK,
            "woken at once, not by the fallback: {elapsed:?}"
        );
        // The other session's waiter was not woken: it waits for its fallback look.
        let started = tokio::time::Instant::now();
        other.changed().await;
        assert!(started.elapsed() >= FALLBACK_LOOK);
        drop((a, b, other));
        assert!(waits.is_empty());
    }
}
