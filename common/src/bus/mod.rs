//! `Bus`: Skein's one NATS transport. It owns the connection, message encoding and size caps,
//! publishing, and the headers every published message carries; its submodules own the streams
//! (`streams`), a task's events in the events partitions (`events`), the durable consumers
//! (`intake`), a delivered message until it is settled (`delivery`), how many of a consumer's
//! messages run at once (`slots`), the dead-letter stream (`dead_letters`), a session's
//! unfinished submissions (`submissions`), and whether TLS can use the client certificate
//! (`tls`).
//!
//! Invariants:
//! - work is pulled only for free capacity: each pull request asks for as many messages as there
//!   are free slots ([`Intake::serve`]), so nothing waits in a client-side buffer while its ack
//!   deadline runs out;
//! - every payload is checked against the configured cap before it is published, and on receipt
//!   before it is decoded;
//! - subjects come from [`crate::subjects`] only;
//! - the submit path is idempotent: a submission's `Nats-Msg-Id` is its task id scoped by its
//!   tenant ([`submission_id`]);
//! - every message carries the W3C trace context of the span that sent it; work (submissions,
//!   tool and subagent tasks) is published under a `publish {subject}` producer span.

use std::future::Future;
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream;
use bytes::Bytes;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

mod dead_letters;
mod delivery;
mod events;
mod intake;
mod operations;
mod slots;
mod streams;
mod submissions;
mod tls;

pub use dead_letters::{
    DeadLetter, HEADER_ATTEMPTS, HEADER_DEAD_REASON, HEADER_ORIGINAL_ID, HEADER_ORIGINAL_SUBJECT,
    HEADER_REPLAYED, HEADER_TRUNCATED, MAX_DEAD_REASON,
};
pub use delivery::{Delivery, Disposition, Envelope, Received, Undecodable, SET_ASIDE_RETRY};
pub use intake::{reconcile, ConsumerSettings, Intake, PULLERS};
pub use slots::{Loan, Slots};
pub use streams::{raise_replicas, StreamLimits, PARTITIONS_LOOK_EVERY, STREAM_LIMITS};
pub use submissions::{QueuedSubmission, SubmissionPlace};
pub use tls::check_client_certificate;

use crate::config::NatsConfig;
use crate::principals::{Gate, Role, Signer};
use crate::protocol::{Failure, FailureKind, TaskSubmission, ToolResult, TurnEvent, TurnEventRef};
use crate::subjects;

/// The servers of a comma-separated list of NATS URLs (`nats://a:4222,nats://b:4222`, as
/// `nats` tools take them); blanks around entries and empty entries are ignored.
pub fn server_addrs(list: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    let servers = list
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry.parse().map_err(|source| BusError::Address {
                address: entry.to_owned(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(BusError::Config("no NATS server URL given".into()));
    }
    Ok(servers)
}

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
    #[error("NATS server address {address:?} is invalid: {source}")]
    Address {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("JetStream stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("JetStream consumer {consumer}: {message}")]
    Consumer { consumer: String, message: String },
    /// A work-queue stream refused a consumer whose filter overlaps others' (nats-server 2.9
    /// allows no two consumers of a work-queue stream with overlapping filters).
    #[error(
        "JetStream consumer {consumer} (filter {filter}) refused: its filter overlaps {}, and a \
         work-queue stream allows no two consumers with overlapping filters ({message})",
        intake::describe_consumers(.others)
    )]
    Overlaps {
        consumer: String,
        filter: String,
        /// The consumers it overlaps, with their filters.
        others: Vec<(String, String)>,
        message: String,
    },
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
    /// Whether trying again later may succeed: the server is not reachable or JetStream not
    /// ready yet (what a start-up waits out), as opposed to settings the server refuses.
    pub fn is_transient(&self) -> bool {
        use async_nats::ConnectErrorKind;
        match self {
            BusError::Connect { source, .. } => matches!(
                source.kind(),
                ConnectErrorKind::Dns
                    | ConnectErrorKind::Io
                    | ConnectErrorKind::TimedOut
                    | ConnectErrorKind::MaxReconnects
            ),
            BusError::Stream { .. }
            | BusError::Consumer { .. }
            | BusError::Publish { .. }
            | BusError::Pull(_) => true,
            _ => false,
        }
    }

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

/// A connection to NATS with JetStream. Clones share one [`BusParts`]: a bus is held by every
/// delivery, dispatcher and event sink in flight, so it is a pointer, cloned by one count.
#[derive(Clone)]
pub struct Bus(std::sync::Arc<BusParts>);

impl std::ops::Deref for Bus {
    type Target = BusParts;

    fn deref(&self) -> &BusParts {
        &self.0
    }
}

/// What a [`Bus`] holds.
#[derive(Clone)]
pub struct BusParts {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    max_payload: usize,
    /// How often core subscriptions may have missed messages: the connection dropped, or a
    /// subscription fell so far behind that the client dropped what it received.
    core_gaps: tokio::sync::watch::Receiver<u64>,
    /// Replicas of the streams this process creates (and raises existing ones to).
    stream_replicas: usize,
    /// Partitions this process creates and publishes submissions, calls and events to
    /// (`SKEIN_PARTITIONS`).
    partitions: u32,
    /// The submit partitions known to exist, shared by the clones: where a session's unfinished
    /// submissions are looked for.
    known_submit_partitions: std::sync::Arc<std::sync::RwLock<Vec<u32>>>,
    /// Whether the submit streams answer direct gets now (see [`Bus::first_in_line`]).
    direct_looks: submissions::DirectLooks,
    /// The events partitions listed last, and when (looked up when a task's events are not
    /// where this process would put them).
    seen_event_partitions: events::SeenEventPartitions,
    /// How long the audit stream keeps its records.
    audit_retention: Duration,
    /// Who may act: what operations this process receives are checked against.
    gate: std::sync::Arc<Gate>,
    /// The key this process signs its operations with, and whom it acts for (a delegate).
    signing: Option<std::sync::Arc<Signing>>,
}

/// How a process signs the operations it publishes.
struct Signing {
    signer: std::sync::Arc<Signer>,
    on_behalf: Option<(String, Vec<Role>)>,
}

impl Bus {
    /// Connects to a server of `cfg.url` (a comma-separated list, tried in random order) that
    /// answers within `cfg.connect_timeout`, and reconnects forever afterwards, to any server of
    /// the list or of the cluster the server tells of.
    pub async fn connect(
        cfg: &NatsConfig,
        name: &str,
        max_payload: usize,
    ) -> Result<Self, BusError> {
        let servers = server_addrs(&cfg.url)?;
        let (gap, core_gaps) = tokio::sync::watch::channel(0u64);
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(cfg.connect_timeout)
            .max_reconnects(None)
            .event_callback(move |event| {
                if matches!(
                    event,
                    async_nats::Event::Disconnected | async_nats::Event::SlowConsumer(_)
                ) {
                    gap.send_modify(|n| *n += 1);
                }
                futures::future::ready(())
            });
        let gate = cfg.gate().map_err(BusError::Config)?;
        let signer = cfg.signer().map_err(BusError::Config)?;
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
            check_client_certificate(cert).map_err(BusError::Config)?;
            options = options
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        if let Some(prefix) = &cfg.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        if let Some(creds) = &cfg.creds {
            options = options
                .credentials_file(creds)
                .await
                .map_err(BusError::Credentials)?;
        }
        let client = options
            .connect(servers)
            .await
            .map_err(|source| BusError::Connect {
                url: cfg.url.clone(),
                source,
            })?;
        let server_cap = client.server_info().max_payload;
        let jetstream = jetstream::new(client.clone());
        let partitions = cfg.partitions.clamp(1, subjects::MAX_PARTITIONS);
        Ok(Self(std::sync::Arc::new(BusParts {
            client,
            jetstream,
            max_payload: max_payload.min(server_cap.max(1)),
            core_gaps,
            stream_replicas: cfg.stream_replicas.max(1),
            partitions,
            known_submit_partitions: std::sync::Arc::new(std::sync::RwLock::new(
                (0..partitions).collect(),
            )),
            direct_looks: submissions::DirectLooks::default(),
            seen_event_partitions: events::SeenEventPartitions::default(),
            audit_retention: cfg.audit_retention,
            gate: std::sync::Arc::new(gate),
            signing: signer.map(|signer| {
                std::sync::Arc::new(Signing {
                    signer: std::sync::Arc::new(signer),
                    on_behalf: None,
                })
            }),
        })))
    }

    /// What operations this process receives are checked against.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The principal this process's key is listed as, if it has a key the principals file lists.
    pub fn own_principal(&self) -> Option<&crate::principals::Principal> {
        let signing = self.signing.as_ref()?;
        self.gate.book().get(&signing.signer.public_key())
    }

    /// Whether this process signs the operations it publishes.
    pub fn signs(&self) -> bool {
        self.signing.is_some()
    }

    /// This connection, signing with `signer` from now on.
    pub fn with_signer(self, signer: Signer) -> Self {
        let mut parts = BusParts::clone(&self);
        parts.signing = Some(std::sync::Arc::new(Signing {
            signer: std::sync::Arc::new(signer),
            on_behalf: None,
        }));
        Self(std::sync::Arc::new(parts))
    }

    /// This connection, with its operations signed as acting for `name` with `roles` (a
    /// delegate, the gateway, acting for a caller it proved). Without a key it is unchanged.
    pub fn acting_for(&self, name: &str, roles: &[Role]) -> Self {
        let Some(signing) = &self.signing else {
            return self.clone();
        };
        let mut parts = BusParts::clone(self);
        parts.signing = Some(std::sync::Arc::new(Signing {
            signer: signing.signer.clone(),
            on_behalf: Some((name.to_owned(), roles.to_vec())),
        }));
        Self(std::sync::Arc::new(parts))
    }

    /// `headers` for an operation's message, signed when this process has a key.
    fn signed_headers(&self, subject: &str, payload: &[u8]) -> HeaderMap {
        let mut headers = outgoing_headers();
        if let Some(signing) = &self.signing {
            let on_behalf = signing
                .on_behalf
                .as_ref()
                .map(|(name, roles)| (name.as_str(), roles.as_slice()));
            signing
                .signer
                .sign(&mut headers, subject, payload, on_behalf);
        }
        headers
    }

    /// Replicas of the streams this process creates (`SKEIN_STREAM_REPLICAS`).
    pub fn stream_replicas(&self) -> usize {
        self.stream_replicas
    }

    /// Changes each time core subscriptions may have missed messages (the connection dropped, or
    /// a subscription fell behind and the client dropped some); what they missed must be read
    /// from a stream.
    pub fn core_gaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.core_gaps.clone()
    }

    /// A core subscription (replies, cancel requests, wakes): messages published while it is
    /// disconnected are missed (see [`Bus::core_gaps`]); payloads are still capped where they
    /// are decoded ([`Bus::decode`]).
    pub async fn subscribe(&self, subject: &str) -> Result<async_nats::Subscriber, BusError> {
        self.client
            .subscribe(subject.to_owned())
            .await
            .map_err(|e| BusError::Consumer {
                consumer: subject.to_owned(),
                message: e.to_string(),
            })
    }

    /// [`Bus::subscribe`] in a queue group: each message reaches one member.
    pub async fn queue_subscribe(
        &self,
        subject: &str,
        group: &str,
    ) -> Result<async_nats::Subscriber, BusError> {
        self.client
            .queue_subscribe(subject.to_owned(), group.to_owned())
            .await
            .map_err(|e| BusError::Consumer {
                consumer: format!("{subject} ({group})"),
                message: e.to_string(),
            })
    }

    /// The underlying client, for core subscriptions.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context, for stores built on streams (the workspace object store).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Serializes `value`, refusing payloads over the cap.
    pub fn encode<T: Serialize>(&self, value: &T) -> Result<Bytes, BusError> {
        use crate::json_out::NotWithin;
        crate::json_out::to_bytes_within(value, self.max_payload).map_err(|e| match e {
            NotWithin::TooLarge { size } => BusError::TooLarge {
                size,
                limit: self.max_payload,
            },
            NotWithin::Json(e) => BusError::Encode(e),
        })
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

    /// Publishes a task submission durably, to its session's submit partition; resubmitting the
    /// same `task_id` is a no-op.
    pub async fn submit(&self, submission: &TaskSubmission) -> Result<Stored, BusError> {
        let payload = self.encode(submission)?;
        let (tenant, session) = (&submission.tenant, &submission.session);
        let subject = subjects::submit_in(self.session_partition(tenant, session), tenant, session);
        let mut headers = self.signed_headers(&subject, &payload);
        let id = submission_id(&submission.tenant, &submission.task_id);
        headers.insert(NATS_MESSAGE_ID, id.as_str());
        self.publish_traced(subject, headers, payload, &submission.task_id)
            .await
    }

    /// A handle on stream `name` without asking the server for its info (one request less); a
    /// failure names the stream.
    pub(crate) async fn stream_no_info(
        &self,
        name: &str,
    ) -> Result<jetstream::stream::Stream<()>, BusError> {
        self.jetstream
            .get_stream_no_info(name)
            .await
            .map_err(|e| stream_error(name, e.to_string()))
    }

    /// Publishes a tool or subagent task durably on `subject`.
    pub async fn publish_work<T: Serialize>(
        &self,
        subject: String,
        task: &T,
        dedup_id: &str,
    ) -> Result<(), BusError> {
        let payload = self.encode(task)?;
        self.publish_encoded_work(subject, payload, dedup_id).await
    }

    /// [`Bus::publish_work`] of a task already encoded (see [`Bus::encode`]).
    pub async fn publish_encoded_work(
        &self,
        subject: String,
        payload: Bytes,
        dedup_id: &str,
    ) -> Result<(), BusError> {
        let mut headers = outgoing_headers();
        headers.insert(NATS_MESSAGE_ID, dedup_id);
        self.publish_traced(subject, headers, payload, dedup_id)
            .await
            .map(|_| ())
    }

    /// Hands a task already encoded to the connection, as [`Bus::publish_encoded_work`] does
    /// without a span of its own, and returns at once: whether the stream stored it is the
    /// returned ack's to say.
    pub fn send_encoded_work(
        &self,
        subject: String,
        payload: Bytes,
        dedup_id: &str,
    ) -> impl Future<Output = Result<PendingAck, BusError>> + Send + '_ {
        let mut headers = outgoing_headers();
        headers.insert(NATS_MESSAGE_ID, dedup_id);
        self.send_durable(subject, headers, payload)
    }

    /// Publishes a turn event to the task's replayable event subject without waiting for the
    /// stream to confirm it: events leave in order, and the confirmation is awaited later
    /// ([`PendingAck::confirmed`]), off the turn's path.
    pub async fn publish_event(
        &self,
        tenant: &str,
        event: &TurnEvent,
    ) -> Result<PendingAck, BusError> {
        self.send_event(self.event_message(tenant, event.borrowed())?)
            .await
    }

    /// A turn event encoded for its subject (too large for a message: `BusError::TooLarge`).
    pub fn event_message(
        &self,
        tenant: &str,
        event: TurnEventRef<'_>,
    ) -> Result<EventMessage, BusError> {
        Ok(EventMessage {
            payload: self.encode(&event)?,
            subject: self.events_subject(tenant, event.task_id),
        })
    }

    /// Sends an encoded turn event as [`Bus::publish_event`] does. Encoding first keeps the
    /// event itself out of the future that waits for the connection to take it.
    pub fn send_event(
        &self,
        message: EventMessage,
    ) -> impl Future<Output = Result<PendingAck, BusError>> + Send + '_ {
        self.send_durable(message.subject, outgoing_headers(), message.payload)
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

    /// Publishes work (a submission, a tool or subagent task) under its own producer span, when
    /// spans are exported; the receiver's `process` span becomes its child.
    async fn publish_traced(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        message_id: &str,
    ) -> Result<Stored, BusError> {
        if crate::telemetry::exporting() {
            // Boxed: inline, the span's path would size the future of every publish.
            return Box::pin(self.publish_under_span(subject, headers, payload, message_id)).await;
        }
        // Nothing would see this hop's span: the current span's ids, which the headers carry
        // from `outgoing_headers`, travel in its place, and the message stays in its trace
        // without a span made and dropped per message.
        //
        // Handing the message to the connection is brief and its future large (about 1 KiB);
        // the wait for the stream's ack is long and small. Only the wait stays inline.
        let pending = Box::pin(self.send_durable(subject, headers, payload)).await?;
        pending.confirmed().await
    }

    /// [`Bus::publish_traced`] under a producer span of its own, for a process that exports.
    async fn publish_under_span(
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

    pub(crate) async fn publish_durable(
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
}

/// The `Nats-Msg-Id` of a submission: its task id scoped by its tenant, so the submit stream's
/// deduplication window never drops one tenant's task for another's that used the same id. A
/// client must make task ids unique within its tenant.
pub fn submission_id(tenant: &str, task_id: &str) -> String {
    format!("{tenant}:{task_id}")
}

/// How a stream took a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored now.
    New,
    /// Dropped as a duplicate of one stored earlier with the same `Nats-Msg-Id`.
    Duplicate,
}

/// A turn event encoded for its subject ([`Bus::event_message`]), ready to send.
#[derive(Debug)]
pub struct EventMessage {
    subject: String,
    payload: Bytes,
}

/// A message sent to a stream whose storage the stream has not confirmed yet. Dropping it leaves
/// the confirmation to the client's background acker (a failure is then only logged there).
pub struct PendingAck {
    subject: String,
    ack: jetstream::context::PublishAckFuture,
}

impl PendingAck {
    /// Waits (bounded) until the stream confirms it stored the message. (A plain function: an
    /// `async fn` would keep the pending ack twice in its future, which waits as long as the
    /// broker takes to answer.)
    pub fn confirmed(self) -> impl Future<Output = Result<Stored, BusError>> + Send {
        let PendingAck { subject, ack } = self;
        async move {
            let publish_error = |message: String| BusError::Publish { subject, message };
            match tokio::time::timeout(PUBLISH_ACK_TIMEOUT, ack).await {
                Ok(Ok(ack)) if ack.duplicate => Ok(Stored::Duplicate),
                Ok(Ok(_)) => Ok(Stored::New),
                Ok(Err(e)) => Err(publish_error(e.to_string())),
                Err(_) => Err(publish_error("no acknowledgement from JetStream".into())),
            }
        }
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
/// published it (trace context from the message headers), so one trace crosses the broker; a
/// message published without one continues `recorded` (the `traceparent` an earlier delivery of
/// the same task kept), or else starts a trace.
pub(super) fn process_span(
    message: &jetstream::Message,
    delivered: i64,
    recorded: Option<&str>,
) -> tracing::Span {
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
    crate::telemetry::propagation::set_parent_or_recorded(
        &span,
        message.headers.as_ref(),
        recorded,
    );
    span
}

/// The Nats-Msg-Id of a received message, if any.
pub(super) fn message_id(message: &async_nats::Message) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_owned())
}

/// A failure reading stream `stream`.
pub(crate) fn stream_error(stream: &str, message: String) -> BusError {
    BusError::Stream {
        stream: stream.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_separated_list_names_every_server() {
        let servers = server_addrs("nats://a:4222, nats://b:4223,,nats://10.0.0.3:4224")
            .expect("a valid list");
        let named: Vec<_> = servers.iter().map(|s| (s.host(), s.port())).collect();
        assert_eq!(named, [("a", 4222), ("b", 4223), ("10.0.0.3", 4224)]);
        let one = server_addrs("nats://127.0.0.1:4222").expect("one server");
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn a_bad_entry_or_an_empty_list_is_refused_with_the_entry_named() {
        let bad = server_addrs("nats://a:4222,nats://b:notaport").expect_err("a bad port");
        assert!(
            matches!(&bad, BusError::Address { address, .. } if address == "nats://b:notaport"),
            "{bad}"
        );
        assert!(!bad.is_transient(), "a bad address is not waited out");
        assert!(matches!(server_addrs(" , "), Err(BusError::Config(_))));
    }
}
