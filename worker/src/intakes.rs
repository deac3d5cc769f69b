//! The consumers a worker serves: its pool's tool consumer and its agent consumers (one for every
//! subagent type, or one per listed type), bound on every work partition's stream (`SKEIN_WORK`,
//! `SKEIN_WORK_1`, …).
//!
//! Invariants:
//! - one set of slots serves a consumer on every partition, so `SKEIN_CONCURRENCY` bounds the
//!   worker's tool tasks (and each agent consumer's tasks) whatever the partition count;
//! - every partition stream that exists is served: those of this worker's `SKEIN_PARTITIONS`, and
//!   any another process made, found at start and looked for again every
//!   [`PARTITIONS_LOOK_EVERY`] from the heartbeat loop ([`Served::serve_new_partitions`]). So a
//!   cluster re-partitioned to more streams has its new partitions served by workers that
//!   started before, and one re-partitioned to fewer still has the tasks waiting in the
//!   partitions no longer dispatched to done: no task waits in a stream no worker reads;
//! - a partition is bound once; the consumers of the partitions found at start are bound before
//!   the worker announces itself, so a worker configured unlike its pool stops before it is
//!   routed to.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use skein_common::bus::{Bus, BusError, ConsumerSettings, Intake, Slots, PARTITIONS_LOOK_EVERY};
use skein_common::shutdown::Workload;
use skein_common::subjects;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SubagentTypes};
use crate::execute::{self, AgentIntake, WorkerContext};
use crate::run::WorkerError;

/// The consumers of one partition, bound and not yet served.
pub(crate) struct Bound {
    partition: u32,
    tools: Option<Intake>,
    /// In the order of [`Served::agents`].
    agents: Vec<Intake>,
}

/// What a worker serves and the slots its consumers share across partitions.
pub(crate) struct Served {
    pool: String,
    ack_wait: Duration,
    /// The tool consumer's slots, when the worker provides a tool.
    tools: Option<Slots>,
    /// The agent consumers: every type (`agent` none), or one per listed type.
    agents: Vec<AgentIntake>,
    /// Partitions bound so far.
    partitions: BTreeSet<u32>,
    /// When the partition streams were last looked for.
    looked: tokio::time::Instant,
    loops: Vec<JoinHandle<()>>,
}

impl Served {
    pub(crate) fn new(cfg: &Config, has_tools: bool) -> Self {
        let agents = match &cfg.subagents {
            SubagentTypes::None => Vec::new(),
            SubagentTypes::All => vec![None],
            SubagentTypes::Only(types) => types.iter().cloned().map(Some).collect(),
        };
        Self {
            pool: cfg.pool.clone(),
            ack_wait: cfg.process.ack_wait,
            tools: has_tools.then(|| Slots::new(cfg.concurrency)),
            // Each agent consumer has its own slots: one consumer's tasks never wait for another's.
            agents: agents
                .into_iter()
                .map(|agent| AgentIntake {
                    slots: Slots::new(cfg.concurrency),
                    agent,
                })
                .collect(),
            partitions: BTreeSet::new(),
            looked: tokio::time::Instant::now(),
            loops: Vec::new(),
        }
    }

    /// The partitions to serve now: this process's setting and every partition stream that
    /// exists, less those bound already.
    async fn unbound_partitions(&self, bus: &Bus) -> Result<Vec<u32>, BusError> {
        let existing = bus.work_partitions().await?;
        Ok((0..bus.partitions())
            .chain(existing)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|k| !self.partitions.contains(k))
            .collect())
    }

    /// Binds the worker's consumers on every partition there is now (at start, before the
    /// worker announces itself).
    pub(crate) async fn bind_every_partition(&self, bus: &Bus) -> Result<Vec<Bound>, WorkerError> {
        let mut bound = Vec::new();
        for partition in self.unbound_partitions(bus).await? {
            bound.push(self.bind(bus, partition).await?);
        }
        Ok(bound)
    }

    /// Binds (creating if needed) this worker's consumers on `partition`'s stream.
    async fn bind(&self, bus: &Bus, partition: u32) -> Result<Bound, WorkerError> {
        let stream = subjects::work_stream(partition);
        let settings = |durable: String, filter: String| ConsumerSettings {
            stream: stream.clone(),
            durable,
            filter,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            max_ack_pending: None,
        };
        let pool = &self.pool;
        let tools = match self.tools {
            Some(_) => {
                let tools = settings(
                    subjects::tool_consumer(pool),
                    subjects::tool_filter(partition, pool),
                );
                Some(bus.intake(&tools).await?)
            }
            None => None,
        };
        let mut agents = Vec::with_capacity(self.agents.len());
        for of in &self.agents {
            let filter = match &of.agent {
                None => subjects::agent_filter(partition, pool),
                Some(agent) => subjects::agent_type_filter(partition, pool, agent),
            };
            let wanted = settings(self.agent_consumer(of), filter);
            let intake = bus.intake(&wanted).await.map_err(|e| match e {
                overlap @ BusError::Overlaps { .. } => WorkerError::PoolMismatch {
                    pool: self.pool.clone(),
                    source: overlap,
                },
                other => WorkerError::Bus(other),
            })?;
            agents.push(intake);
        }
        Ok(Bound {
            partition,
            tools,
            agents,
        })
    }

    /// The durable name of an agent consumer: the pool's for every type, or its type's.
    fn agent_consumer(&self, of: &AgentIntake) -> String {
        match &of.agent {
            None => subjects::agent_consumer(&self.pool),
            Some(agent) => subjects::agent_type_consumer(&self.pool, agent),
        }
    }

    /// The durable names, for the queue-depth report (summed over the partitions).
    pub(crate) fn consumers(&self) -> Vec<(&'static str, String)> {
        let tools = self
            .tools
            .iter()
            .map(|_| subjects::tool_consumer(&self.pool));
        let agents = self.agents.iter().map(|of| self.agent_consumer(of));
        tools
            .chain(agents)
            .map(|durable| (subjects::WORK_STREAM, durable))
            .collect()
    }

    /// Serves a partition's bound consumers until `shutdown`, with the shared slots.
    pub(crate) fn serve(
        &mut self,
        bound: Bound,
        ctx: &Arc<WorkerContext>,
        shutdown: &CancellationToken,
        work: &Workload,
    ) {
        self.partitions.insert(bound.partition);
        if let (Some(intake), Some(slots)) = (bound.tools, &self.tools) {
            let (ctx, abort) = (ctx.clone(), work.abort.clone());
            let serving = intake.serve(
                slots.clone(),
                shutdown.clone(),
                work.running.clone(),
                move |received| execute::tool(ctx.clone(), received, abort.child_token()),
            );
            self.loops.push(tokio::spawn(serving));
        }
        for (intake, of) in bound.agents.into_iter().zip(&self.agents) {
            let (ctx, abort, of) = (ctx.clone(), work.abort.clone(), of.clone());
            let serving = intake.serve(
                of.slots.clone(),
                shutdown.clone(),
                work.running.clone(),
                move |received| {
                    execute::subagent(ctx.clone(), received, of.clone(), abort.child_token())
                },
            );
            self.loops.push(tokio::spawn(serving));
        }
    }

    /// Binds and serves the partition streams made since the last look (a cluster
    /// re-partitioned while this worker runs), at most every [`PARTITIONS_LOOK_EVERY`]. A
    /// partition that cannot be bound now is tried again at the next look.
    pub(crate) async fn serve_new_partitions(
        &mut self,
        bus: &Bus,
        ctx: &Arc<WorkerContext>,
        shutdown: &CancellationToken,
        work: &Workload,
    ) {
        if self.looked.elapsed() < PARTITIONS_LOOK_EVERY {
            return;
        }
        self.looked = tokio::time::Instant::now();
        let unbound = match self.unbound_partitions(bus).await {
            Ok(unbound) => unbound,
            Err(e) => {
                tracing::debug!(error = %e, "work partitions not listed");
                return;
            }
        };
        for partition in unbound {
            match self.bind(bus, partition).await {
                Ok(bound) => {
                    tracing::info!(partition, "serving a new work partition");
                    self.serve(bound, ctx, shutdown, work);
                }
                Err(e) => {
                    tracing::warn!(partition, error = %e, "work partition not served yet")
                }
            }
        }
    }

    /// Waits for every intake loop to end (after `shutdown`).
    pub(crate) async fn finished(self) {
        for serving in self.loops {
            let _ = serving.await;
        }
    }
}
