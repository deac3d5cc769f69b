//! The submissions a lead takes: the leads' consumer (`skein-leads`) bound on every submit
//! partition's stream (`SKEIN_SUBMIT`, `SKEIN_SUBMIT_1`, …).
//!
//! Invariants:
//! - one set of slots serves every partition, so `--concurrency` bounds the lead's turns whatever
//!   the partition count;
//! - every submit partition stream that exists is served: those of this lead's
//!   `SKEIN_PARTITIONS`, and any another process made, found at start and looked for again every
//!   [`PARTITIONS_LOOK_EVERY`]. So a cluster re-partitioned to more streams has its new
//!   partitions served by leads that started before, and one re-partitioned to fewer still has
//!   the tasks waiting in the partitions no longer submitted to run; each partition found is
//!   also where the turn-order look searches a session's older tasks
//!   (`Bus::known_submit_partitions`);
//! - a partition is bound once; those found at start are bound before the lead is ready.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use skein_common::bus::{
    Bus, BusError, ConsumerSettings, Intake, Received, Slots, PARTITIONS_LOOK_EVERY,
};
use skein_common::protocol::TaskSubmission;
use skein_common::subjects;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The leads' consumer bound on the submit partitions found so far, not yet served.
pub(super) struct SubmitIntakes {
    bus: Bus,
    ack_wait: Duration,
    bound: BTreeSet<u32>,
    intakes: Vec<Intake>,
}

impl SubmitIntakes {
    /// Binds (creating if needed) the leads' consumer on every submit partition there is now.
    pub(super) async fn bind(bus: &Bus, ack_wait: Duration) -> Result<Self, BusError> {
        let mut intakes = SubmitIntakes {
            bus: bus.clone(),
            ack_wait,
            bound: BTreeSet::new(),
            intakes: Vec::new(),
        };
        for partition in intakes.unbound().await? {
            let intake = intakes.bind_partition(partition).await?;
            intakes.intakes.push(intake);
        }
        Ok(intakes)
    }

    /// The submit partitions to serve now: this process's setting and every submit partition
    /// stream that exists, less those bound already.
    async fn unbound(&self) -> Result<Vec<u32>, BusError> {
        let existing = self.bus.submit_partitions().await?;
        Ok((0..self.bus.partitions())
            .chain(existing)
            .filter(|k| !self.bound.contains(k))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    async fn bind_partition(&mut self, partition: u32) -> Result<Intake, BusError> {
        let intake = self
            .bus
            .intake(&ConsumerSettings {
                stream: subjects::submit_stream(partition),
                durable: subjects::LEADS_CONSUMER.into(),
                filter: subjects::submit_subjects(partition),
                ack_wait: self.ack_wait,
                max_deliver: -1,
                // Suspended turns stay unacknowledged while they wait for a person, without a
                // slot: they must not use up the server's default of 1,000 outstanding
                // deliveries.
                max_ack_pending: Some(-1),
            })
            .await?;
        self.bound.insert(partition);
        Ok(intake)
    }

    /// Runs every bound partition's submissions through `handler`, with `slots` shared, and
    /// serves the partitions made meanwhile as they are found, until `shutdown`; returns once
    /// every partition's intake has stopped.
    pub(super) async fn serve<F, Fut>(
        mut self,
        slots: Slots,
        shutdown: CancellationToken,
        tracker: TaskTracker,
        handler: F,
    ) where
        F: Fn(Received<TaskSubmission>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let serve = |intake: Intake| {
            tokio::spawn(intake.serve(
                slots.clone(),
                shutdown.clone(),
                tracker.clone(),
                handler.clone(),
            ))
        };
        let mut loops: Vec<_> = std::mem::take(&mut self.intakes)
            .into_iter()
            .map(serve)
            .collect();
        let first_look = tokio::time::Instant::now() + PARTITIONS_LOOK_EVERY;
        let mut looks = tokio::time::interval_at(first_look, PARTITIONS_LOOK_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = looks.tick() => {}
            }
            let unbound = match self.unbound().await {
                Ok(unbound) => unbound,
                Err(e) => {
                    tracing::debug!(error = %e, "submit partitions not listed");
                    continue;
                }
            };
            for partition in unbound {
                // A partition that cannot be bound now is tried again at the next look.
                match self.bind_partition(partition).await {
                    Ok(intake) => {
                        tracing::info!(partition, "serving a new submit partition");
                        loops.push(serve(intake));
                    }
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "submit partition not served yet")
                    }
                }
            }
        }
        for serving in loops {
            let _ = serving.await;
        }
    }
}
