//! The marker of a call's run in progress: taken at admission (or, for a first dispatch's first
//! delivery, which skips the store, half a progress interval into the run: no copy can be
//! delivered sooner), renewed while the run goes on at the cadence of its progress acks, deleted when its result is recorded (`store::record_result`) or
//! when the run is handed back. A redelivered copy of the call that finds the marker held waits
//! for the run's result (`admission`) instead of applying its effects a second time beside it.
//!
//! Invariants:
//! - the owner is unique to one run (worker instance, a nonce drawn once per process and the
//!   run's number in it), so a worker's own redelivered copy waits too;
//! - the marker lives [`MARKER_TTL_PROGRESS_INTERVALS`] progress intervals without renewal:
//!   less than the ack wait (three intervals), so the marker of a run whose worker died has
//!   expired by the time the broker redelivers its task, and the copy runs at once;
//! - a marker that cannot be written never stops a run: the copy that finds none runs, and the
//!   result recorded first wins, as before markers.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use skein_common::store::RunMarker;

use super::{CallRef, WorkerContext};

/// Progress intervals a marker lives without renewal (see the module invariants).
const MARKER_TTL_PROGRESS_INTERVALS: u32 = 2;

/// One run of a call and whether its marker is already taken.
#[derive(Debug)]
pub(super) struct RunOwner {
    pub(super) owner: String,
    /// Taken by admission (true), or still to take beside the run (false).
    pub(super) claimed: bool,
}

/// Drawn once per process: an instance id may be given again to a restarted process, whose runs
/// must not pass for the earlier process's.
static PROCESS_NONCE: LazyLock<String> =
    LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
/// Numbers this process's runs (with the nonce, unique to one run without a random draw each).
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

impl RunOwner {
    pub(super) fn new(ctx: &WorkerContext) -> Self {
        Self {
            owner: run_owner(&ctx.instance),
            claimed: false,
        }
    }

    pub(super) fn marker<'a>(&'a self, ctx: &WorkerContext) -> RunMarker<'a> {
        RunMarker {
            owner: &self.owner,
            ttl: marker_ttl(ctx.progress_every),
        }
    }

    /// Runs `work` holding the marker (see [`renew`](Self::renew)) until `work` ends.
    pub(super) async fn hold<O>(
        &self,
        ctx: &WorkerContext,
        call: CallRef<'_>,
        work: impl Future<Output = O>,
    ) -> O {
        // Concurrent with the work, so taking the marker adds no round trip before it starts.
        tokio::select! {
            done = work => done,
            never = self.renew(ctx, call) => match never {},
        }
    }

    /// Renews the marker at once when admission took it (admission may have been a while ago),
    /// or takes it half an interval in; then renews it every progress interval, for ever.
    async fn renew(&self, ctx: &WorkerContext, call: CallRef<'_>) -> Infallible {
        let origin = call.origin;
        let marker = self.marker(ctx);
        // A run that admission did not mark (a first dispatch's first delivery) takes its marker
        // half a progress interval in: no copy of it can be delivered before the ack wait (three
        // intervals, pushed on by progress acks), and the many calls that end sooner never touch
        // Redis for it.
        let now = tokio::time::Instant::now();
        let first = if self.claimed {
            now
        } else {
            now + ctx.progress_every / 2
        };
        let mut ticks = tokio::time::interval_at(first, ctx.progress_every);
        loop {
            ticks.tick().await;
            match ctx
                .store
                .claim_call(&origin.tenant, &origin.session, call.call_key, marker)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!("another run of this call holds its marker; both are running")
                }
                Err(e) => tracing::debug!(error = %e, "run marker not renewed"),
            }
        }
    }

    /// Drops the marker of a run that is handed back, so the next delivery need not wait for it
    /// to expire.
    pub(super) async fn release(&self, ctx: &WorkerContext, call: CallRef<'_>) {
        let origin = call.origin;
        if let Err(e) = ctx
            .store
            .release_call(&origin.tenant, &origin.session, call.call_key, &self.owner)
            .await
        {
            tracing::debug!(error = %e, "run marker not released; it expires");
        }
    }
}

fn marker_ttl(progress_every: Duration) -> Duration {
    progress_every * MARKER_TTL_PROGRESS_INTERVALS
}

/// A name for the next run of this process, unique to it.
fn run_owner(instance: &str) -> String {
    let run = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
    format!("{instance}/{}-{run}", *PROCESS_NONCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_of_a_process_has_its_own_owner_under_the_instance_and_process() {
        let (first, second) = (run_owner("worker-a"), run_owner("worker-a"));
        assert_ne!(first, second);
        let process = format!("worker-a/{}-", *PROCESS_NONCE);
        assert!(first.starts_with(&process), "{first}");
        assert!(second.starts_with(&process), "{second}");
        // The nonce is a random draw, so another process with the same instance id differs.
        assert_eq!(PROCESS_NONCE.len(), 32);
    }
}
