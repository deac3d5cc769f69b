//! `Bus`: Skein's one NATS transport. It owns the connection, the JetStream streams and consumers,
//! message encoding and size caps, and the headers every published message carries.
//!
//! Invariants:
//! - work is pulled only for free capacity: each pull request asks for as many messages as there
//!   are free slots ([`Intake::serve`]), so nothing waits in a client-side buffer while its ack
//!   deadline runs out;
//! - every payload is checked against the configured cap before it is published, and on receipt
//!   before it is decoded;
//! - subjects come from [`crate::subjects`] only;
//! - the submit path is idempotent: a submission's `task_id` is its `Nats-Msg-Id`;
//! - every message carries the W3C trace context of the span that sent it; work (submissions,
//!   tool and subagent tasks) is published under a `publish {subject}` producer span.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::NatsConfig;
use crate::protocol::{Failure, FailureKind, TaskSubmission, ToolResult, TurnEvent};
use crate::subjects;

/// Default cap on one message's payload (NATS' own default `max_payload` is 1 MiB).
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// How long start-up waits for JetStream to answer.
const JETSTREAM_READY_WAIT: Duration = Duration::from_secs(15);

/// How long a JetStream publish may wait for its acknowledgement.
const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a bus operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("cannot read NATS credentials file: {0}")]
    Credentials(#[source] std::io::Error),
    #[error("NATS settings: {0}")]
    Config(String),
    #[error("JetStream stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("JetStream consumer {consumer}: {message}")]
    Consumer { consumer: String, message: String },
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    #[error("pulling work failed: {0}")]
    Pull(String),
    #[error("payload of {size} bytes exceeds the {limit}-byte cap")]
    TooLarge { size: usize, limit: usize },
    #[error("cannot encode message: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot decode message: {0}")]
    Decode(#[source] serde_json::Error),
}

impl BusError {
    /// The failure reported across the wire.
    pub fn to_failure(&self) -> Failure {
        match self {
            BusError::TooLarge { .. } => Failure::new(FailureKind::TooLarge, self.to_string()),
            BusError::Decode(_) => Failure::new(FailureKind::InvalidInput, self.to_string()),
            BusError::Encode(_) => Failure::new(FailureKind::Internal, self.to_string()),
            _ => Failure::new(FailureKind::Unavailable, self.to_string()),
        }
    }
}

/// Settings of a durable work-queue consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub stream: &'static str,
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

/// A connection to NATS with JetStream.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    max_payload: usize,
    /// How often the connection has dropped (core subscriptions miss what is published then).
    disconnects: tokio::sync::watch::Receiver<u64>,
}

impl Bus {
    /// Connects, retrying for `cfg.connect_timeout`, and reconnecting forever afterwards.
    pub async fn connect(
        cfg: &NatsConfig,
        name: &str,
        max_payload: usize,
    ) -> Result<Self, BusError> {
        let (disconnected, disconnects) = tokio::sync::watch::channel(0u64);
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(cfg.connect_timeout)
            .max_reconnects(None)
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Disconnected) {
                    disconnected.send_modify(|n| *n += 1);
                }
                futures::future::ready(())
            });
        let password = cfg.password().map_err(BusError::Config)?;
        if let (Some(user), Some(password)) = (&cfg.user, password) {
            options = options.user_and_password(user.clone(), password);
        }
        if let Some(token) = cfg.token().map_err(BusError::Config)? {
            options = options.token(token);
        }
        if let Some(ca) = &cfg.tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) {
            options = options
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        if let Some(creds) = &cfg.creds {
            options = options
                .credentials_file(creds)
                .await
                .map_err(BusError::Credentials)?;
        }
        let client =
            options
                .connect(cfg.url.as_str())
                .await
                .map_err(|source| BusError::Connect {
                    url: cfg.url.clone(),
                    source,
                })?;
        let server_cap = client.server_info().max_payload;
        let jetstream = jetstream::new(client.clone());
        Ok(Self {
            client,
            jetstream,
            max_payload: max_payload.min(server_cap.max(1)),
            disconnects,
        })
    }

    /// Changes each time the connection drops; what core subscriptions missed meanwhile must be
    /// read from a stream.
    pub fn disconnects(&self) -> tokio::sync::watch::Receiver<u64> {
        self.disconnects.clone()
    }

    /// The underlying client, for core subscriptions.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Creates Skein's streams if they do not exist, and gives streams created before their
    /// limits (see [`STREAM_LIMITS`]) those limits (idempotent; safe from every process).
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        let queue = |name: &str, subjects: Vec<String>| stream::Config {
            name: name.into(),
            subjects,
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(120),
            // Full: a new message is refused (its publisher gets the error), none is dropped.
            discard: stream::DiscardPolicy::New,
            max_messages: STREAM_LIMITS.queue_messages,
            max_bytes: STREAM_LIMITS.queue_bytes,
            max_age: STREAM_LIMITS.queue_age,
            ..Default::default()
        };
        let streams = [
            queue(subjects::SUBMIT_STREAM, vec![subjects::SUBMIT_ALL.into()]),
            queue(
                subjects::WORK_STREAM,
                subjects::WORK_ALL.iter().map(|s| s.to_string()).collect(),
            ),
            stream::Config {
                name: subjects::CANCEL_STREAM.into(),
                subjects: vec![subjects::CANCEL_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(24 * 3600),
                max_messages_per_subject: 1,
                ..Default::default()
            },
            stream::Config {
                name: subjects::APPROVALS_STREAM.into(),
                subjects: vec![subjects::APPROVALS_ALL.into()],
                retention: stream::RetentionPolicy::WorkQueue,
                max_age: Duration::from_secs(14 * 24 * 3600),
                ..Default::default()
            },
            stream::Config {
                name: subjects::DLQ_STREAM.into(),
                subjects: vec![subjects::DLQ_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(14 * 24 * 3600),
                max_bytes: STREAM_LIMITS.dlq_bytes,
                ..Default::default()
            },
            stream::Config {
                name: subjects::EVENTS_STREAM.into(),
                subjects: vec![subjects::EVENTS_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(24 * 3600),
                max_bytes: STREAM_LIMITS.events_bytes,
                ..Default::default()
            },
        ];
        // A server that just started (or restarted) may take a moment before JetStream answers.
        let deadline = tokio::time::Instant::now() + JETSTREAM_READY_WAIT;
        for config in streams {
            loop {
                match self.jetstream.get_or_create_stream(config.clone()).await {
                    Ok(mut existing) => {
                        let current = existing.info().await.map(|i| i.config.clone());
                        if let Ok(current) = current {
                            self.bound_stream(&current, &config).await?;
                        }
                        break;
                    }
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(stream = %config.name, error = %e, "JetStream not ready; retrying");
                        tokio::time::sleep(PULL_RETRY).await;
                    }
                    Err(e) => {
                        return Err(BusError::Stream {
                            stream: config.name.clone(),
                            message: e.to_string(),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Gives a stream created before Skein bounded it the limits it should have; other settings
    /// are kept.
    async fn bound_stream(
        &self,
        current: &stream::Config,
        wanted: &stream::Config,
    ) -> Result<(), BusError> {
        // The server reports "no limit" as -1 where a config says 0.
        let unlimited = |v: i64| if v <= 0 { -1 } else { v };
        let limits = |c: &stream::Config| {
            (
                unlimited(c.max_messages),
                unlimited(c.max_bytes),
                c.max_age,
                c.discard,
            )
        };
        if limits(current) == limits(wanted) {
            return Ok(());
        }
        tracing::warn!(stream = %current.name, "stream limits differ from this build's; updating them");
        let mut bounded = current.clone();
        bounded.max_messages = wanted.max_messages;
        bounded.max_bytes = wanted.max_bytes;
        bounded.max_age = wanted.max_age;
        bounded.discard = wanted.discard;
        self.jetstream
            .update_stream(bounded)
            .await
            .map(|_| ())
            .map_err(|e| BusError::Stream {
                stream: current.name.clone(),
                message: format!("cannot set its limits: {e}"),
            })
    }

    /// Serializes `value`, refusing payloads over the cap.
    pub fn encode<T: Serialize>(&self, value: &T) -> Result<Bytes, BusError> {
        let bytes = serde_json::to_vec(value).map_err(BusError::Encode)?;
        if bytes.len() > self.max_payload {
            return Err(BusError::TooLarge {
                size: bytes.len(),
                limit: self.max_payload,
            });
        }
        Ok(Bytes::from(bytes))
    }

    /// Deserializes a received payload, refusing payloads over the cap.
    pub fn decode<T: DeserializeOwned>(&self, payload: &[u8]) -> Result<T, BusError> {
        if payload.len() > self.max_payload {
            return Err(BusError::TooLarge {
                size: payload.len(),
                limit: self.max_payload,
            });
        }
        serde_json::from_slice(payload).map_err(BusError::Decode)
    }

    /// Publishes a task submission durably; resubmitting the same `task_id` is a no-op.
    pub async fn submit(&self, submission: &TaskSubmission) -> Result<Stored, BusError> {
        let mut headers = outgoing_headers();
        headers.insert(NATS_MESSAGE_ID, submission.task_id.as_str());
        let payload = self.encode(submission)?;
        let subject = subjects::submit(&submission.tenant, &submission.session);
        self.publish_traced(subject, headers, payload, &submission.task_id)
            .await
    }

    /// The stream sequence of a session's oldest unfinished submission (finished ones are removed
    /// from the work-queue stream), if any.
    pub async fn oldest_submission(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<u64>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let stream_error = |message: String| BusError::Stream {
            stream: subjects::SUBMIT_STREAM.into(),
            message,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(subjects::SUBMIT_STREAM)
            .await
            .map_err(|e| stream_error(e.to_string()))?;
        match stream
            .get_first_raw_message_by_subject(subjects::submit(tenant, session), 1)
            .await
        {
            Ok(message) => Ok(Some(message.sequence)),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(stream_error(e.to_string())),
        }
    }

    /// Asks every process to stop a task; kept so that work starting later sees it too.
    pub async fn request_cancel(
        &self,
        request: &crate::protocol::CancelRequest,
    ) -> Result<(), BusError> {
        let payload = self.encode(request)?;
        self.publish_durable(
            subjects::cancel(&request.tenant, &request.task_id),
            outgoing_headers(),
            payload,
        )
        .await
    }

    /// Publishes an answer to a task's approval requests (durably: any lead records it, also one
    /// started after the publish).
    pub async fn publish_decision(
        &self,
        decision: &crate::protocol::ApprovalDecision,
    ) -> Result<(), BusError> {
        let payload = self.encode(decision)?;
        self.publish_durable(
            subjects::approval(&decision.tenant, &decision.task_id),
            outgoing_headers(),
            payload,
        )
        .await
    }

    /// Whether a cancel request for the task was published.
    pub async fn cancel_requested(&self, tenant: &str, task_id: &str) -> Result<bool, BusError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let stream_error = |message: String| BusError::Stream {
            stream: subjects::CANCEL_STREAM.into(),
            message,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(subjects::CANCEL_STREAM)
            .await
            .map_err(|e| stream_error(e.to_string()))?;
        match stream
            .get_last_raw_message_by_subject(&subjects::cancel(tenant, task_id))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(stream_error(e.to_string())),
        }
    }

    /// Publishes a tool or subagent task durably on `subject`.
    pub async fn publish_work<T: Serialize>(
        &self,
        subject: String,
        task: &T,
        dedup_id: &str,
    ) -> Result<(), BusError> {
        let mut headers = outgoing_headers();
        headers.insert(NATS_MESSAGE_ID, dedup_id);
        let payload = self.encode(task)?;
        self.publish_traced(subject, headers, payload, dedup_id)
            .await
            .map(|_| ())
    }

    /// Publishes a turn event to the task's replayable event subject without waiting for the
    /// stream to confirm it: events leave in order, and the confirmation is awaited later
    /// ([`PendingAck::confirmed`]), off the turn's path.
    pub async fn publish_event(
        &self,
        tenant: &str,
        event: &TurnEvent,
    ) -> Result<PendingAck, BusError> {
        let payload = self.encode(event)?;
        self.send_durable(
            subjects::events(tenant, &event.task_id),
            outgoing_headers(),
            payload,
        )
        .await
    }

    /// Publishes a call's result to the dispatcher waiting for it (core NATS, no ack).
    pub async fn publish_reply(&self, subject: &str, result: &ToolResult) -> Result<(), BusError> {
        let payload = self.encode(result)?;
        self.client
            .publish_with_headers(subject.to_owned(), outgoing_headers(), payload)
            .await
            .map_err(|e| BusError::Publish {
                subject: subject.to_owned(),
                message: e.to_string(),
            })
    }

    /// Publishes work (a submission, a tool or subagent task) under its own producer span; the
    /// receiver's `process` span becomes its child.
    async fn publish_traced(
        &self,
        subject: String,
        mut headers: HeaderMap,
        payload: Bytes,
        message_id: &str,
    ) -> Result<Stored, BusError> {
        let span = tracing::info_span!(
            "publish",
            "otel.name" = format!("publish {subject}"),
            "otel.kind" = "producer",
            "messaging.system" = "nats",
            "messaging.operation.type" = "send",
            "messaging.destination.name" = %subject,
            "messaging.message.id" = message_id,
            "messaging.message.body.size" = payload.len(),
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let published = async {
            crate::telemetry::propagation::inject_current(&mut headers);
            self.send_durable(subject, headers, payload)
                .await?
                .confirmed()
                .await
        }
        .instrument(span.clone())
        .await;
        if published.is_err() {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", "publish_failed");
        }
        published
    }

    async fn publish_durable(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), BusError> {
        self.send_durable(subject, headers, payload)
            .await?
            .confirmed()
            .await
            .map(|_| ())
    }

    /// Sends a message to its stream; the returned ack says whether the stream stored it.
    async fn send_durable(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<PendingAck, BusError> {
        match self
            .jetstream
            .publish_with_headers(subject.clone(), headers, payload)
            .await
        {
            Ok(ack) => Ok(PendingAck { subject, ack }),
            Err(e) => Err(BusError::Publish {
                subject,
                message: e.to_string(),
            }),
        }
    }

    /// Binds (creating if needed) a durable pull consumer and returns its intake.
    ///
    /// A consumer that exists already keeps the settings of the process that created it unless
    /// they are reconciled here: its `ack_wait` only grows (a process with a longer one updates
    /// it; one with a shorter one keeps the longer, since its own progress acks come often enough
    /// for either, and says so), and `max_deliver` and `max_ack_pending` are set to this
    /// process's. Every process sends progress acks at a third of its own `ack_wait`, so none
    /// can fall behind the consumer's deadline.
    pub async fn intake(&self, settings: &ConsumerSettings) -> Result<Intake, BusError> {
        let consumer_error = |message: String| BusError::Consumer {
            consumer: settings.durable.clone(),
            message,
        };
        let stream = self
            .jetstream
            .get_stream(settings.stream)
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        let wanted = consumer::pull::Config {
            durable_name: Some(settings.durable.clone()),
            filter_subject: settings.filter.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: settings.max_deliver,
            max_ack_pending: settings.max_ack_pending.unwrap_or_default(),
            ..Default::default()
        };
        let mut consumer = stream
            .get_or_create_consumer(&settings.durable, wanted.clone())
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        let existing = consumer
            .info()
            .await
            .map_err(|e| consumer_error(e.to_string()))?
            .config
            .clone();
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
                .map_err(|e| consumer_error(format!("cannot update its settings: {e}")))?;
            consumer = stream
                .get_consumer(&settings.durable)
                .await
                .map_err(|e| consumer_error(e.to_string()))?;
        }
        if existing.ack_wait > settings.ack_wait {
            tracing::warn!(
                consumer = %settings.durable,
                consumer_ack_wait = ?existing.ack_wait,
                ack_wait = ?settings.ack_wait,
                "the consumer keeps its longer ack wait: work of a crashed process is redelivered after it"
            );
        }
        Ok(Intake { consumer })
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

    /// Reports the depth of `consumers` (stream, durable) into `metrics` every `every` until `stop`.
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
            let mut ticks = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                for (stream, durable) in &consumers {
                    match bus.consumer_depth(stream, durable).await {
                        Ok((pending, ack_pending)) => {
                            metrics.queue_depth(durable, pending, ack_pending)
                        }
                        Err(e) => tracing::debug!(error = %e, "queue depth unknown"),
                    }
                }
            }
        });
    }

    /// The latest event on one subject of the events stream, with its stream sequence.
    pub async fn last_event(&self, subject: &str) -> Result<Option<(u64, TurnEvent)>, BusError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let lookup_error = |message: String| BusError::Consumer {
            consumer: format!("last({subject})"),
            message,
        };
        let stream = self
            .jetstream
            .get_stream(subjects::EVENTS_STREAM)
            .await
            .map_err(|e| lookup_error(e.to_string()))?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(Some((message.sequence, self.decode(&message.payload)?))),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(lookup_error(e.to_string())),
        }
    }

    /// A replaying, ordered view of one subject of the events stream, from its first message.
    pub async fn replay(&self, subject: String) -> Result<consumer::pull::Ordered, BusError> {
        let consumer_error = |message: String| BusError::Consumer {
            consumer: format!("ordered({subject})"),
            message,
        };
        let stream = self
            .jetstream
            .get_stream(subjects::EVENTS_STREAM)
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| consumer_error(e.to_string()))?;
        consumer
            .messages()
            .await
            .map_err(|e| consumer_error(e.to_string()))
    }
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

/// The server's `max_ack_pending` for a consumer created without one.
const DEFAULT_MAX_ACK_PENDING: i64 = 1000;

/// The bounds of Skein's streams.
pub struct StreamLimits {
    /// Submissions or work waiting at once, per stream (work queues refuse more).
    pub queue_messages: i64,
    pub queue_bytes: i64,
    /// Longest a submission or a task waits before the stream drops it.
    pub queue_age: Duration,
    /// Events kept at most (the oldest go first; events also go after 24 hours).
    pub events_bytes: i64,
    /// Dead letters kept at most (the oldest go first; they also go after 14 days).
    pub dlq_bytes: i64,
}

/// What every Skein stream is bounded by (docs/ARCHITECTURE.md, "Bounds").
pub const STREAM_LIMITS: StreamLimits = StreamLimits {
    queue_messages: 1_000_000,
    queue_bytes: 1 << 30,
    queue_age: Duration::from_secs(7 * 24 * 3600),
    events_bytes: 4 << 30,
    dlq_bytes: 1 << 30,
};

/// How a stream took a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored now.
    New,
    /// Dropped as a duplicate of one stored earlier with the same `Nats-Msg-Id`.
    Duplicate,
}

/// A message sent to a stream whose storage the stream has not confirmed yet. Dropping it leaves
/// the confirmation to the client's background acker (a failure is then only logged there).
pub struct PendingAck {
    subject: String,
    ack: jetstream::context::PublishAckFuture,
}

impl PendingAck {
    /// Waits (bounded) until the stream confirms it stored the message.
    pub async fn confirmed(self) -> Result<Stored, BusError> {
        let publish_error = |message: String| BusError::Publish {
            subject: self.subject.clone(),
            message,
        };
        match tokio::time::timeout(PUBLISH_ACK_TIMEOUT, self.ack).await {
            Ok(Ok(ack)) if ack.duplicate => Ok(Stored::Duplicate),
            Ok(Ok(_)) => Ok(Stored::New),
            Ok(Err(e)) => Err(publish_error(e.to_string())),
            Err(_) => Err(publish_error("no acknowledgement from JetStream".into())),
        }
    }
}

/// A durable work-queue consumer, pulled only for free slots.
pub struct Intake {
    consumer: consumer::Consumer<consumer::pull::Config>,
}

impl Intake {
    /// One pull request for at most `count` messages, delivered as they come until `count` have
    /// come or `wait` ends.
    async fn pull(&self, count: usize, wait: Duration) -> Result<consumer::pull::Batch, BusError> {
        self.consumer
            .batch()
            .max_messages(count)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| BusError::Pull(e.to_string()))
    }

    /// Pulls and runs messages until `shutdown`: at most `capacity` run at once, and the broker
    /// is asked only for as many messages as there are free slots. Each pull request asks for
    /// every slot free when it is made (each message then runs in a slot held for it), and up to
    /// [`PULLERS`] requests are outstanding, so slots freed while one request waits are offered
    /// by the next: intake keeps pace with the broker, yet no message waits in a client-side
    /// buffer while its ack deadline runs out. A pull in flight is never abandoned (that would
    /// strand a delivered message until its ack deadline); shutdown is noticed between pulls.
    pub async fn serve<F, Fut>(
        self,
        capacity: usize,
        shutdown: CancellationToken,
        tracker: TaskTracker,
        handler: F,
    ) where
        F: Fn(jetstream::Message) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let capacity = capacity.max(1);
        let slots = Arc::new(Semaphore::new(capacity));
        let pullers = (0..capacity.min(PULLERS))
            .map(|_| self.pull_into_slots(&slots, &shutdown, &tracker, &handler));
        futures::future::join_all(pullers).await;
    }

    async fn pull_into_slots<F, Fut>(
        &self,
        slots: &Arc<Semaphore>,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
        handler: &F,
    ) where
        F: Fn(jetstream::Message) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                slot = slots.clone().acquire_owned() => slot,
            };
            let Ok(mut held) = first else { break };
            let more = slots.available_permits().min(MAX_PULL_BATCH - 1);
            if more > 0 {
                if let Ok(extra) = slots.clone().try_acquire_many_owned(more as u32) {
                    held.merge(extra);
                }
            }
            if shutdown.is_cancelled() {
                break;
            }
            let mut batch = match self.pull(held.num_permits(), PULL_WAIT).await {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "pull failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(PULL_RETRY) => {}
                    }
                    continue;
                }
            };
            while let Some(delivered) = batch.next().await {
                match delivered {
                    Ok(message) => {
                        // The broker sends at most as many messages as were asked for.
                        let Some(slot) = held.split(1) else {
                            tracing::error!("more messages than asked for; handing one back");
                            settle(&message, jetstream::AckKind::Nak(None)).await;
                            continue;
                        };
                        // The slot is freed when the work ends (`map` keeps the future stored
                        // once, where an `async` block would hold it twice).
                        tracker.spawn(handler(message).map(move |()| drop(slot)));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "pull ended early");
                        break;
                    }
                }
            }
            // Slots asked for but not filled before the pull ended go back here (`held` drops).
        }
    }
}

/// Runs `work` while telling the broker every `every` that `message` is still being worked on, so
/// a short ack deadline still catches a dead process quickly while long work survives.
pub async fn with_progress<T>(
    message: &jetstream::Message,
    every: Duration,
    work: impl Future<Output = T>,
) -> T {
    futures::pin_mut!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticks.tick() => {
                if let Err(e) = message.ack_with(jetstream::AckKind::Progress).await {
                    tracing::warn!(error = %e, "progress ack failed");
                }
            }
        }
    }
}

/// True for the first delivery of a message that is not a replayed dead letter: no earlier
/// delivery of this work can have run. (A message whose delivery count is unknown is not.)
pub fn first_delivery(message: &jetstream::Message) -> bool {
    let delivered_once = message.info().map(|i| i.delivered == 1).unwrap_or(false);
    delivered_once && !replayed(message)
}

/// True for a dead letter published again by `skein dlq replay`.
pub fn replayed(message: &jetstream::Message) -> bool {
    message
        .headers
        .as_ref()
        .is_some_and(|h| h.get(HEADER_REPLAYED).is_some())
}

/// Settles a message, logging (not failing) when the broker cannot be told.
pub async fn settle(message: &jetstream::Message, kind: jetstream::AckKind) {
    if let Err(e) = message.ack_with(kind).await {
        tracing::warn!(error = %e, ?kind, "acknowledgement not delivered; the broker will redeliver");
    }
}

/// Most pull requests a consumer keeps outstanding at once (each for as many messages as it holds
/// free slots).
pub const PULLERS: usize = 4;
/// Most messages one pull request asks for.
const MAX_PULL_BATCH: usize = 256;

/// How long one pull waits for a message; also bounds how late shutdown is noticed.
const PULL_WAIT: Duration = Duration::from_secs(2);
/// Pause after a failed pull (NATS away).
const PULL_RETRY: Duration = Duration::from_millis(500);

/// Header of a dead letter: the subject the message was first published on.
pub const HEADER_ORIGINAL_SUBJECT: &str = "Skein-Original-Subject";
/// Header of a dead letter: why it was set aside.
pub const HEADER_DEAD_REASON: &str = "Skein-Dead-Reason";
/// Header of a dead letter: how often it was tried.
pub const HEADER_ATTEMPTS: &str = "Skein-Attempts";
/// Header of a dead letter: the original message's `Nats-Msg-Id`, if it had one.
pub const HEADER_ORIGINAL_ID: &str = "Skein-Original-Id";
/// Header of a replayed dead letter: the letter's sequence in the dead-letter stream.
pub const HEADER_REPLAYED: &str = "Skein-Replayed";

/// A message set aside in the dead-letter stream.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Position in the dead-letter stream; names the letter for show, replay and removal.
    pub seq: u64,
    pub original_subject: String,
    pub original_id: Option<String>,
    pub reason: String,
    pub attempts: u64,
    pub payload: Bytes,
}

impl DeadLetter {
    fn from_stream(message: async_nats::jetstream::message::StreamMessage) -> Self {
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        Self {
            seq: message.sequence,
            original_subject: header(HEADER_ORIGINAL_SUBJECT)
                .unwrap_or_else(|| message.subject.to_string()),
            original_id: header(HEADER_ORIGINAL_ID),
            reason: header(HEADER_DEAD_REASON).unwrap_or_default(),
            attempts: header(HEADER_ATTEMPTS)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
            payload: message.payload,
        }
    }
}

impl Bus {
    /// Sets a delivered work message aside in the dead-letter stream, with why and how often it
    /// was tried. Setting the same delivery aside twice (a retry after a failure to settle it)
    /// stores one letter: the letter's id is the message's stream position.
    pub async fn dead_letter_message(
        &self,
        message: &jetstream::Message,
        reason: &str,
        attempts: u64,
    ) -> Result<(), BusError> {
        let position = message
            .info()
            .map(|info| format!("dead-{}-{}", info.stream, info.stream_sequence))
            .ok();
        let id = message_id(message);
        self.dead_letter(
            &message.subject,
            id.as_deref(),
            position.as_deref(),
            message.payload.clone(),
            reason,
            attempts,
        )
        .await
    }

    /// Sets a message aside in the dead-letter stream, with why and how often it was tried;
    /// `dedup_id` (if any) keeps a repeated call from storing a second letter.
    pub async fn dead_letter(
        &self,
        original_subject: &str,
        original_id: Option<&str>,
        dedup_id: Option<&str>,
        payload: Bytes,
        reason: &str,
        attempts: u64,
    ) -> Result<(), BusError> {
        let mut headers = outgoing_headers();
        if let Some(dedup_id) = dedup_id {
            headers.insert(NATS_MESSAGE_ID, dedup_id);
        }
        headers.insert(HEADER_ORIGINAL_SUBJECT, original_subject);
        headers.insert(
            HEADER_DEAD_REASON,
            reason.replace(['\r', '\n'], " ").as_str(),
        );
        headers.insert(HEADER_ATTEMPTS, attempts.to_string().as_str());
        if let Some(id) = original_id {
            headers.insert(HEADER_ORIGINAL_ID, id);
        }
        tracing::warn!(
            subject = original_subject,
            reason,
            attempts,
            "message dead-lettered"
        );
        self.publish_durable(subjects::dead_letter(original_subject), headers, payload)
            .await
    }

    /// Every dead letter, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BusError> {
        let mut stream = self.dlq_stream().await?;
        let state = stream
            .info()
            .await
            .map_err(|e| dlq_error(e.to_string()))?
            .state
            .clone();
        let mut letters = Vec::new();
        if state.messages == 0 {
            return Ok(letters);
        }
        for seq in state.first_sequence..=state.last_sequence {
            if let Some(letter) = self.dead_letter_at(seq).await? {
                letters.push(letter);
            }
        }
        Ok(letters)
    }

    /// The dead letter at `seq`, if there is one.
    pub async fn dead_letter_at(&self, seq: u64) -> Result<Option<DeadLetter>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let stream = self.dlq_stream().await?;
        match stream.get_raw_message(seq).await {
            Ok(message) => Ok(Some(DeadLetter::from_stream(message))),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(dlq_error(e.to_string())),
        }
    }

    /// Publishes a dead letter's message again on its original subject, then removes the letter.
    pub async fn replay_dead_letter(&self, letter: &DeadLetter) -> Result<(), BusError> {
        let mut headers = outgoing_headers();
        let id = format!(
            "{}-replay-{}",
            letter.original_id.as_deref().unwrap_or("dlq"),
            letter.seq
        );
        headers.insert(NATS_MESSAGE_ID, id.as_str());
        headers.insert(HEADER_REPLAYED, letter.seq.to_string().as_str());
        self.publish_durable(
            letter.original_subject.clone(),
            headers,
            letter.payload.clone(),
        )
        .await?;
        self.remove_dead_letter(letter.seq).await.map(|_| ())
    }

    /// Removes one dead letter; false if there was none at `seq`.
    pub async fn remove_dead_letter(&self, seq: u64) -> Result<bool, BusError> {
        let stream = self.dlq_stream().await?;
        use async_nats::jetstream::stream::DeleteMessageErrorKind;
        use async_nats::jetstream::ErrorCode;
        match stream.delete_message(seq).await {
            Ok(deleted) => Ok(deleted),
            Err(e) if matches!(e.kind(), DeleteMessageErrorKind::JetStream(j) if j.error_code() == ErrorCode::NO_MESSAGE_FOUND) => {
                Ok(false)
            }
            Err(e) => Err(dlq_error(e.to_string())),
        }
    }

    /// Removes every dead letter; returns how many there were.
    pub async fn purge_dead_letters(&self) -> Result<u64, BusError> {
        let stream = self.dlq_stream().await?;
        let purged = stream.purge().await.map_err(|e| dlq_error(e.to_string()))?;
        Ok(purged.purged)
    }

    async fn dlq_stream(&self) -> Result<stream::Stream, BusError> {
        self.jetstream
            .get_stream(subjects::DLQ_STREAM)
            .await
            .map_err(|e| dlq_error(e.to_string()))
    }
}

fn dlq_error(message: String) -> BusError {
    BusError::Stream {
        stream: subjects::DLQ_STREAM.into(),
        message,
    }
}

/// Headers every message Skein publishes carries: the W3C trace context of the current span, so
/// the receiver's work joins the sender's trace.
pub fn outgoing_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    crate::telemetry::propagation::inject_current(&mut headers);
    headers
}

/// The consumer span of a delivered work message: `process {subject}`, a child of the span that
/// published it (trace context from the message headers), so one trace crosses the broker.
pub fn process_span(message: &jetstream::Message) -> tracing::Span {
    let delivered = message.info().map(|info| info.delivered).unwrap_or(1);
    let span = tracing::info_span!(
        "process",
        "otel.name" = format!("process {}", message.subject),
        "otel.kind" = "consumer",
        "messaging.system" = "nats",
        "messaging.operation.type" = "process",
        "messaging.destination.name" = %message.subject,
        "messaging.message.id" = message_id(message).unwrap_or_default(),
        "messaging.message.body.size" = message.payload.len(),
        "skein.delivery" = delivered,
        "skein.kind" = tracing::field::Empty,
        "skein.task_id" = tracing::field::Empty,
        "gen_ai.conversation.id" = tracing::field::Empty,
    );
    crate::telemetry::propagation::set_parent(&span, message.headers.as_ref());
    span
}

/// The Nats-Msg-Id of a received message, if any.
pub fn message_id(message: &async_nats::Message) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_owned())
}
