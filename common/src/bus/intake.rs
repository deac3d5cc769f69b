//! Durable work-queue consumers: binding and reconciling them (`Bus::intake`, patient with a
//! cluster that does not answer yet), pulling only for free slots (`Intake::serve`), handing each
//! message over as a decoded `Delivery`, and consumer depth (a work or submit consumer's summed
//! over its stream's partitions).

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::context::{ConsumerInfoErrorKind, GetStreamErrorKind};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, consumer};
use async_nats::StatusCode;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use serde::de::DeserializeOwned;

use super::delivery::{Envelope, Received};
use super::{Bus, BusError, Slots, JETSTREAM_READY_WAIT};
use crate::subjects;

/// Why one try of binding a consumer failed.
enum Binding {
    /// A request went unanswered (timed out, no responders): worth another try.
    Unanswered(BusError),
    /// The server refused, or the consumer is not one this process may use.
    Refused(BusError),
}

/// Settings of a durable work-queue consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub stream: String,
    pub durable: String,
    pub filter: String,
    /// How long a delivery may go unacknowledged (progress acks extend it).
    pub ack_wait: Duration,
    /// Deliveries before the server gives up on a message; -1 for no limit (Skein counts attempts
    /// itself, see `SessionStore::begin_turn` and `SessionStore::admit_call`).
    pub max_deliver: i64,
    /// Most deliveries outstanding at once; `None` keeps the server's default (1,000 on 2.9),
    /// `Some(-1)` is no limit. Pulls ask only for free slots, so this bounds only deliveries
    /// held without a slot (suspended turns waiting for approval).
    pub max_ack_pending: Option<i64>,
}

impl Bus {
    /// Binds (creating if needed) a durable pull consumer and returns its intake.
    ///
    /// A consumer that exists already keeps the settings of the process that created it unless
    /// they are reconciled here: its `ack_wait` only grows (a process with a longer one updates
    /// it; one with a shorter one keeps the longer, since its own progress acks come often enough
    /// for either, and says so), and `max_deliver` and `max_ack_pending` are set to this
    /// process's. Every process sends progress acks at a third of its own `ack_wait`, so none
    /// can fall behind the consumer's deadline.
    ///
    /// A cluster may leave a request of the binding unanswered while it settles (just formed,
    /// streams just made, several processes creating the same consumer at once): the binding is
    /// then tried again every 500 ms for up to [`JETSTREAM_READY_WAIT`].
    pub async fn intake(&self, settings: &ConsumerSettings) -> Result<Intake, BusError> {
        let deadline = tokio::time::Instant::now() + JETSTREAM_READY_WAIT;
        loop {
            match self.bind_consumer(settings).await {
                Ok(intake) => return Ok(intake),
                Err(Binding::Unanswered(e)) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(consumer = %settings.durable, error = %e, "consumer not bound yet; retrying");
                    tokio::time::sleep(PULL_RETRY).await;
                }
                Err(Binding::Unanswered(e) | Binding::Refused(e)) => return Err(e),
            }
        }
    }

    /// One try of [`Bus::intake`].
    async fn bind_consumer(&self, settings: &ConsumerSettings) -> Result<Intake, Binding> {
        let consumer_error = |message: String| BusError::Consumer {
            consumer: settings.durable.clone(),
            message,
        };
        let failed = |unanswered: bool, message: String| match unanswered {
            true => Binding::Unanswered(consumer_error(message)),
            false => Binding::Refused(consumer_error(message)),
        };
        let stream = self
            .jetstream
            .get_stream(&settings.stream)
            .await
            .map_err(|e| failed(e.kind() == GetStreamErrorKind::Request, e.to_string()))?;
        let wanted = consumer::pull::Config {
            durable_name: Some(settings.durable.clone()),
            filter_subject: settings.filter.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: settings.max_deliver,
            max_ack_pending: settings.max_ack_pending.unwrap_or_default(),
            ..Default::default()
        };
        let created = stream
            .get_or_create_consumer(&settings.durable, wanted.clone())
            .await;
        let mut consumer = match created {
            Ok(consumer) => consumer,
            Err(e)
                if matches!(
                    e.kind(),
                    ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request
                ) =>
            {
                return Err(failed(true, e.to_string()));
            }
            Err(e) => {
                // Say which consumers stand in the way, when overlap is why it was refused.
                let others = overlapping_consumers(&stream, settings).await;
                if others.is_empty() {
                    return Err(failed(false, e.to_string()));
                }
                return Err(Binding::Refused(BusError::Overlaps {
                    consumer: settings.durable.clone(),
                    filter: settings.filter.clone(),
                    others,
                    message: e.to_string(),
                }));
            }
        };
        let existing = consumer
            .info()
            .await
            .map_err(|e| {
                let unanswered = matches!(
                    e.kind(),
                    ConsumerInfoErrorKind::TimedOut
                        | ConsumerInfoErrorKind::NoResponders
                        | ConsumerInfoErrorKind::Request
                );
                failed(unanswered, e.to_string())
            })?
            .config
            .clone();
        if existing.filter_subject != settings.filter {
            // A consumer of this name made for other work: pulling from it would take that work.
            return Err(failed(
                false,
                format!(
                    "exists with filter {}, not {}",
                    existing.filter_subject, settings.filter
                ),
            ));
        }
        if let Some(reconciled) = reconcile(&existing, &wanted) {
            tracing::warn!(
                consumer = %settings.durable,
                ack_wait = ?(existing.ack_wait, reconciled.ack_wait),
                max_deliver = ?(existing.max_deliver, reconciled.max_deliver),
                max_ack_pending = ?(existing.max_ack_pending, reconciled.max_ack_pending),
                "consumer settings differ from this process's; updating them"
            );
            stream
                .create_consumer(reconciled)
                .await
                .map_err(|e| failed(false, format!("cannot update its settings: {e}")))?;
            consumer = stream
                .get_consumer(&settings.durable)
                .await
                .map_err(|e| failed(true, e.to_string()))?;
        }
        if existing.ack_wait > settings.ack_wait {
            tracing::warn!(
                consumer = %settings.durable,
                consumer_ack_wait = ?existing.ack_wait,
                ack_wait = ?settings.ack_wait,
                "the consumer keeps its longer ack wait: work of a crashed process is redelivered after it"
            );
        }
        Ok(Intake {
            consumer,
            bus: self.clone(),
        })
    }

    /// Pending and unacknowledged messages of a durable consumer.
    pub async fn consumer_depth(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<(u64, u64), BusError> {
        let consumer_error = |message: String| BusError::Consumer {
            consumer: durable.to_owned(),
            message,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(stream)
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        let mut consumer: consumer::PullConsumer = stream
            .get_consumer(durable)
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        let info = consumer
            .info()
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        Ok((info.num_pending, info.num_ack_pending as u64))
    }

    /// Pending and unacknowledged messages of a work consumer, summed over the streams of
    /// `partitions` (see [`Bus::partitioned_depth`]).
    pub async fn work_depth(
        &self,
        durable: &str,
        partitions: &[u32],
    ) -> Result<(u64, u64), BusError> {
        self.partitioned_depth(subjects::WORK_STREAM, durable, partitions)
            .await
    }

    /// Pending and unacknowledged messages of a consumer of the partitioned stream `base`
    /// ([`subjects::WORK_STREAM`], [`subjects::SUBMIT_STREAM`]), summed over the streams of
    /// `partitions` (a partition where the consumer does not exist yet holds none of its work);
    /// an error only when no partition could be read.
    pub async fn partitioned_depth(
        &self,
        base: &str,
        durable: &str,
        partitions: &[u32],
    ) -> Result<(u64, u64), BusError> {
        let (mut total, mut first_error) = (None::<(u64, u64)>, None);
        for &partition in partitions {
            match self
                .consumer_depth(&subjects::partition_stream(base, partition), durable)
                .await
            {
                Ok((pending, ack_pending)) => {
                    let (p, a) = total.unwrap_or_default();
                    total = Some((p + pending, a + ack_pending));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match (total, first_error) {
            (Some(total), _) => Ok(total),
            (None, Some(e)) => Err(e),
            (None, None) => Ok((0, 0)),
        }
    }

    /// Reports the depth of `consumers` (stream, durable) into `metrics` every `every` until
    /// `stop`; a consumer of a partitioned stream ([`subjects::WORK_STREAM`],
    /// [`subjects::SUBMIT_STREAM`]) is summed over its partitions: the work partitions listed
    /// again every [`PARTITIONS_LISTED_EVERY`] ticks, the submit partitions those the process
    /// knows ([`Bus::known_submit_partitions`]).
    pub fn watch_queue_depth(
        &self,
        metrics: crate::metrics::Metrics,
        consumers: Vec<(&'static str, String)>,
        every: Duration,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) {
        let bus = self.clone();
        tracker.spawn(async move {
            let (mut partitions, mut tick) = (std::collections::HashMap::new(), 0u64);
            let mut ticks = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                // The work partitions are listed (every stream's name) on every
                // PARTITIONS_LISTED_EVERY tick only: they change rarely. The submit partitions are
                // those the process knows (a lead's intake looks for new ones): no listing here.
                for (stream, _) in &consumers {
                    let listed = match *stream {
                        subjects::WORK_STREAM if tick % PARTITIONS_LISTED_EVERY == 0 => {
                            bus.work_partitions().await.unwrap_or_else(|_| vec![0])
                        }
                        subjects::SUBMIT_STREAM => bus.known_submit_partitions(),
                        _ => continue,
                    };
                    partitions.insert(*stream, listed);
                }
                tick += 1;
                for (stream, durable) in &consumers {
                    let depth = match partitions.get(stream) {
                        Some(of) => bus.partitioned_depth(stream, durable, of).await,
                        None => bus.consumer_depth(stream, durable).await,
                    };
                    match depth {
                        Ok((pending, ack_pending)) => {
                            metrics.queue_depth(durable, pending, ack_pending)
                        }
                        Err(e) => tracing::debug!(error = %e, "queue depth unknown"),
                    }
                }
            }
        });
    }
}

/// The other consumers of `settings.stream` whose filters overlap `settings.filter` (name,
/// filter); empty when they cannot be listed. At most [`MAX_LISTED_CONSUMERS`] are looked at.
async fn overlapping_consumers(
    stream: &jetstream::stream::Stream,
    settings: &ConsumerSettings,
) -> Vec<(String, String)> {
    stream
        .consumers()
        .take(MAX_LISTED_CONSUMERS)
        .filter_map(|info| async move { info.ok() })
        .filter(|info| {
            let overlaps = info.name != settings.durable
                && subjects::filters_overlap(&info.config.filter_subject, &settings.filter);
            async move { overlaps }
        })
        .map(|info| (info.name, info.config.filter_subject))
        .collect()
        .await
}

/// Most consumers looked at to explain a refused one.
const MAX_LISTED_CONSUMERS: usize = 1000;

/// `consumer a (filter x), consumer b (filter y)`.
pub(super) fn describe_consumers(consumers: &[(String, String)]) -> String {
    consumers
        .iter()
        .map(|(name, filter)| format!("consumer {name} (filter {filter})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The settings an existing consumer must change to, if any: `ack_wait` grows to the wanted
/// one (never shrinks), `max_deliver` and `max_ack_pending` become the wanted ones; the rest of
/// its configuration is kept.
pub fn reconcile(
    existing: &consumer::Config,
    wanted: &consumer::pull::Config,
) -> Option<consumer::Config> {
    // The server reports its default (1,000 on 2.9) for a consumer created without a limit.
    let same_pending = existing.max_ack_pending == wanted.max_ack_pending
        || (wanted.max_ack_pending == 0 && existing.max_ack_pending == DEFAULT_MAX_ACK_PENDING);
    if existing.ack_wait >= wanted.ack_wait
        && existing.max_deliver == wanted.max_deliver
        && same_pending
    {
        return None;
    }
    let mut reconciled = existing.clone();
    reconciled.ack_wait = existing.ack_wait.max(wanted.ack_wait);
    reconciled.max_deliver = wanted.max_deliver;
    if !same_pending {
        reconciled.max_ack_pending = wanted.max_ack_pending;
    }
    Some(reconciled)
}

/// Of the queue-depth report's ticks, one in this many lists the work partitions again.
const PARTITIONS_LISTED_EVERY: u64 = 6;

/// The server's `max_ack_pending` for a consumer created without one.
const DEFAULT_MAX_ACK_PENDING: i64 = 1000;

/// A durable work-queue consumer, pulled only for free slots.
pub struct Intake {
    consumer: consumer::Consumer<consumer::pull::Config>,
    bus: Bus,
}

impl Intake {
    /// Pulls and runs messages until `shutdown`: at most as many run at once as `slots` holds,
    /// and the broker is asked only for as many messages as there are free slots. Each pull
    /// request asks for every slot free when it is made (each message then runs in a slot held
    /// for it), and up to [`PULLERS`] requests are outstanding, so slots freed while one request
    /// waits are offered by the next: intake keeps pace with the broker, yet no message waits in
    /// a client-side buffer while its ack deadline runs out. A pull in flight is never abandoned
    /// (that would strand a delivered message until its ack deadline); shutdown is noticed
    /// between pulls. Each message reaches `handler` decoded as `T`, or as undecodable
    /// ([`Received`]), to be settled by it.
    pub async fn serve<T, F, Fut>(
        self,
        slots: Slots,
        shutdown: CancellationToken,
        tracker: TaskTracker,
        handler: F,
    ) where
        T: DeserializeOwned,
        F: Fn(Received<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let pullers = (0..slots.free().clamp(1, PULLERS))
            .map(|_| self.pull_into_slots(&slots, &shutdown, &tracker, &handler));
        futures::future::join_all(pullers).await;
    }

    async fn pull_into_slots<T, F, Fut>(
        &self,
        slots: &Slots,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
        handler: &F,
    ) where
        T: DeserializeOwned,
        F: Fn(Received<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut puller: Option<Puller> = None;
        'pulls: loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                slot = slots.acquire() => slot,
            };
            let Some(mut held) = first else { break };
            slots.take_more(&mut held, slots.free().min(MAX_PULL_BATCH - 1));
            if shutdown.is_cancelled() {
                break;
            }
            let opened = match puller.take() {
                Some(current) => Ok(current),
                None => Puller::open(&self.bus).await,
            };
            let requested = match opened {
                Ok(current) => current
                    .request(&self.consumer, held.num_permits())
                    .await
                    .map(|()| current),
                Err(e) => Err(e),
            };
            let mut current = match requested {
                Ok(current) => current,
                Err(e) => {
                    // The inbox is dropped with the failure: the next pull opens a new one.
                    tracing::warn!(error = %e, "pull failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(PULL_RETRY) => {}
                    }
                    continue;
                }
            };
            let unanswered_after = tokio::time::Instant::now() + PULL_WAIT + PULL_GRACE;
            // Each message runs in a slot of its own; one taken and not used goes back when the
            // request ends.
            while let Some(slot) = held.split(1) {
                match current.next(unanswered_after).await {
                    Pulled::Message(message) => {
                        // The slot is freed when the work ends (`map` keeps the future stored
                        // once, where an `async` block would hold it twice). Boxed first: a
                        // handler's future is many KiB (a worker's tool task about 10), and on
                        // its way into a task it is moved several times, a box as a pointer.
                        let message = jetstream::Message {
                            message,
                            context: self.bus.jetstream.clone(),
                        };
                        let delivery = Envelope::new(message, self.bus.clone()).decode();
                        let work = Box::pin(handler(delivery));
                        tracker.spawn(work.map(move |()| drop(slot)));
                    }
                    Pulled::Ended => break,
                    Pulled::Failed(e) => {
                        tracing::warn!(error = %e, "pull ended early");
                        break;
                    }
                    Pulled::Unanswered => {
                        // The request may outlive this wait (a server restarted, a connection
                        // moved): what it delivers late must not be taken for the next
                        // request's, so the next goes to a new inbox.
                        tracing::warn!("pull unanswered; pulling on a new inbox");
                        continue 'pulls;
                    }
                }
            }
            puller = Some(current);
            // Slots asked for but not filled before the pull ended go back here (`held` drops).
        }
    }
}

/// A puller's inbox: subscribed once for as long as its requests are answered, so that a pull
/// request costs one publish (not a subscription made and removed around each). One request is
/// outstanding on it at a time, so all it receives answers that request.
struct Puller {
    inbox: async_nats::Subject,
    deliveries: async_nats::Subscriber,
}

/// What a puller's inbox gave.
enum Pulled {
    /// A delivered message.
    Message(async_nats::Message),
    /// The request ended (it expired, or the server had none to give at once).
    Ended,
    /// The server ended the request with an error (a consumer deleted, a leader changed, too
    /// many requests waiting).
    Failed(String),
    /// No word of the request in time, or the connection closed.
    Unanswered,
}

impl Puller {
    async fn open(bus: &Bus) -> Result<Self, BusError> {
        let inbox = async_nats::Subject::from(bus.client.new_inbox());
        let deliveries = bus
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| BusError::Pull(e.to_string()))?;
        Ok(Self { inbox, deliveries })
    }

    /// Asks for at most `count` messages, delivered as they come until `count` have come or
    /// [`PULL_WAIT`] ends.
    async fn request(
        &self,
        consumer: &consumer::Consumer<consumer::pull::Config>,
        count: usize,
    ) -> Result<(), BusError> {
        let request = consumer::pull::BatchConfig {
            batch: count,
            expires: Some(PULL_WAIT),
            ..Default::default()
        };
        consumer
            .request_batch(request, self.inbox.clone())
            .await
            .map_err(|e| BusError::Pull(e.to_string()))
    }

    /// The next thing the inbox receives, or [`Pulled::Unanswered`] at `deadline`.
    async fn next(&mut self, deadline: tokio::time::Instant) -> Pulled {
        loop {
            let received = tokio::time::timeout_at(deadline, self.deliveries.next()).await;
            let Ok(Some(message)) = received else {
                return Pulled::Unanswered;
            };
            let completed = message
                .description
                .as_deref()
                .is_some_and(|d| d.eq_ignore_ascii_case("batch completed"));
            return match message.status {
                None | Some(StatusCode::OK) => Pulled::Message(message),
                Some(StatusCode::IDLE_HEARTBEAT) => continue,
                // A request is read only until its batch is full, so a note that a batch was
                // completed (sent by some servers) is about an earlier request: not this one's end.
                Some(StatusCode::REQUEST_TERMINATED) if completed => continue,
                Some(StatusCode::TIMEOUT | StatusCode::NOT_FOUND) => Pulled::Ended,
                Some(status) => Pulled::Failed(format!(
                    "{status}: {}",
                    message.description.as_deref().unwrap_or("no description")
                )),
            };
        }
    }
}

/// Most pull requests a consumer keeps outstanding at once (each for as many messages as it holds
/// free slots).
pub const PULLERS: usize = 4;
/// Most messages one pull request asks for.
const MAX_PULL_BATCH: usize = 256;

/// How long one pull waits for a message; also bounds how late shutdown is noticed.
const PULL_WAIT: Duration = Duration::from_secs(2);
/// How long past [`PULL_WAIT`] a pull request's end may take to arrive before it is taken as
/// lost.
const PULL_GRACE: Duration = Duration::from_secs(5);
/// Pause after a failed pull (NATS away).
pub(super) const PULL_RETRY: Duration = Duration::from_millis(500);
