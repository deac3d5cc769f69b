//! The cluster-wide cap on runs of a subagent type (`AgentSpec::max_concurrency`): a subagent
//! task whose type has a cap takes a slot of the type's Redis semaphore (`store::traffic`) once
//! admitted, before its child turn starts; with none free it is handed back to the broker with a
//! short delay (not counted as an attempt), so it waits in the stream, not in a worker's memory
//! or slots.
//!
//! Invariants:
//! - a slot is held from before the child turn starts until its work ends, on every outcome:
//!   released right after the run (success, failure, timeout, cancel, panic caught), in the
//!   background when the task's future is dropped, and by its lease's expiry when the worker
//!   dies ([`SLOT_LEASE`] unrenewed);
//! - a running turn renews its slot every [`RENEW_EVERY`]; a renewal that finds the slot gone
//!   (Redis lost it, or the worker stalled past the lease) is logged and the run goes on: the
//!   cap may then be overrun by one run until this one ends;
//! - the cap counts nested runs of the type too: a type that spawns itself waits on its own
//!   runs, so its cap must leave room for its children.

use std::future::Future;
use std::time::Duration;

use skein_common::store::{SessionStore, StoreError};
use tower::util::rng::{HasherRng, Rng};

use super::WorkerContext;

/// How long a slot is held unless renewed: how long a dead worker keeps its slots.
pub(super) const SLOT_LEASE: Duration = Duration::from_secs(15);
/// How often a running child turn renews its slot's lease.
pub(super) const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Delay before a task that found no free slot is delivered again, on its first wait; it
/// doubles with each delivery, up to [`LONGEST_WAIT`], and is jittered.
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// Longest delay between two looks for a free slot.
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// A slot of a subagent type's cap, held by one run.
pub(super) struct AgentSlot {
    store: SessionStore,
    agent: String,
    holder: String,
    released: bool,
}

/// Takes a slot of `agent`'s cap of `limit` runs: `None` when every slot is taken.
pub(super) async fn take(
    ctx: &WorkerContext,
    agent: &str,
    limit: u32,
) -> Result<Option<AgentSlot>, StoreError> {
    let holder = format!("{}/{}", ctx.instance, uuid::Uuid::new_v4().simple());
    let taken = ctx
        .store
        .try_take_agent_slot(agent, &holder, limit, SLOT_LEASE)
        .await?;
    Ok(taken.then(|| AgentSlot {
        store: ctx.store.clone(),
        agent: agent.to_owned(),
        holder,
        released: false,
    }))
}

/// Runs `work` renewing `slot`'s lease until it ends (just `work` without a slot).
pub(super) async fn holding<F: Future>(slot: Option<&AgentSlot>, work: F) -> F::Output {
    let Some(slot) = slot else {
        return work.await;
    };
    tokio::pin!(work);
    let mut renewals =
        tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
    loop {
        tokio::select! {
            output = &mut work => return output,
            _ = renewals.tick() => slot.renew().await,
        }
    }
}

/// How long a task that found no free slot waits in the stream before it is delivered again:
/// [`FIRST_WAIT`] doubling with each delivery, at most [`LONGEST_WAIT`], half to all of it (so
/// tasks refused together do not come back together).
pub(super) fn wait_delay(delivered: i64) -> Duration {
    let exponent = delivered.saturating_sub(1).clamp(0, 10) as u32;
    let delay = FIRST_WAIT
        .saturating_mul(2u32.pow(exponent))
        .min(LONGEST_WAIT);
    delay.mul_f64(0.5 + HasherRng::default().next_f64() / 2.0)
}

impl AgentSlot {
    async fn renew(&self) {
        match self
            .store
            .renew_agent_slot(&self.agent, &self.holder, SLOT_LEASE)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(agent = %self.agent, "a subagent slot's lease expired while its turn ran")
            }
            Err(error) => {
                tracing::warn!(agent = %self.agent, %error, "a subagent slot's lease could not be renewed")
            }
        }
    }

    /// Frees the slot for the next run of the type.
    pub(super) async fn release(mut self) {
        self.released = true;
        free(&self.store, &self.agent, &self.holder).await;
    }
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped with its task (a panic outside the turn, an abandoned future): free the slot
        // now rather than when its lease expires. If no runtime is left, the lease expires.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let agent = std::mem::take(&mut self.agent);
        let holder = std::mem::take(&mut self.holder);
        runtime.spawn(async move { free(&store, &agent, &holder).await });
    }
}

async fn free(store: &SessionStore, agent: &str, holder: &str) {
    if let Err(error) = store.release_agent_slot(agent, holder).await {
        tracing::warn!(%agent, %error, "a subagent slot could not be freed; its lease will expire");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_with_deliveries_and_stay_bounded() {
        for delivered in 0..40 {
            let delay = wait_delay(delivered);
            assert!(delay >= FIRST_WAIT / 2, "{delivered}: {delay:?}");
            assert!(delay <= LONGEST_WAIT, "{delivered}: {delay:?}");
        }
        assert!(wait_delay(1) <= FIRST_WAIT);
        assert!(wait_delay(30) >= LONGEST_WAIT / 2);
    }
}
