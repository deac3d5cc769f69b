//! `Delivery<T>`: one delivered work message, decoded, owned by the handler that runs it until
//! the handler settles it, once, with a [`Disposition`]. A message that does not decode reaches
//! its handler as an [`Undecodable`] delivery (see [`Received`]), which settles the same way.
//!
//! Invariants: nothing but the delivery touches its message; settling consumes the delivery, so
//! a message is settled at most once; a message set aside that the dead-letter stream refused is
//! handed back instead of being dropped, so nothing disappears without its letter. A delivery
//! holds its payload in an allocation of its own, not in the connection's read buffer.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;

use super::{message_id, process_span, Bus, BusError, HEADER_REPLAYED};

/// The delivered message under a [`Delivery`]: what is known of it besides its body, and the
/// work done on its behalf while it is held (progress acks, setting it aside).
pub struct Envelope {
    message: jetstream::Message,
    /// What the broker's reply subject says of this delivery, read once when it arrived.
    facts: DeliveryFacts,
    bus: Bus,
}

/// What a delivery's reply subject (`$JS.ACK.…`) tells, parsed once: every handler asks for its
/// delivery count several times (its span, admission, metrics, the result), and each parse
/// splits the subject and converts a timestamp. Zero means unknown (a count and a sequence are
/// at least 1, a storing time after 1970).
#[derive(Debug, Clone, Copy, Default)]
struct DeliveryFacts {
    delivered: i64,
    stream_sequence: u64,
    stored_ms: u64,
}

impl DeliveryFacts {
    fn of(message: &jetstream::Message) -> Self {
        message.info().map_or_else(
            |_| Self::default(),
            |info| Self {
                delivered: info.delivered,
                stream_sequence: info.stream_sequence,
                stored_ms: u64::try_from(info.published.unix_timestamp_nanos() / 1_000_000)
                    .unwrap_or(0),
            },
        )
    }
}

/// A delivered message whose body decoded as `T`.
pub struct Delivery<T> {
    envelope: Envelope,
    body: T,
}

/// A delivered message that did not decode (too large, or not the expected shape): its body is
/// the reason.
pub type Undecodable = Delivery<BusError>;

/// A message as an intake hands it to its handler: decoded, or not.
pub enum Received<T> {
    Decoded(Delivery<T>),
    Undecodable(Undecodable),
}

impl<T> Received<T> {
    /// What is known of the message besides its body, either way.
    pub fn envelope(&self) -> &Envelope {
        match self {
            Received::Decoded(delivery) => delivery.envelope(),
            Received::Undecodable(undecodable) => undecodable.envelope(),
        }
    }
}

/// How a delivered message is settled: decided once by the code that handled it, applied by
/// [`Delivery::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Done with (its result recorded, or it was set aside): removed from a work queue.
    Ack,
    /// Offered again, after the delay (`None`: at once).
    Retry(Option<Duration>),
    /// Never offered again (it cannot run, and was answered or set aside).
    Reject,
    /// Copied to the dead-letter stream with why and how often it was tried, then never offered
    /// again; offered again after [`SET_ASIDE_RETRY`] if the copy could not be stored.
    SetAside { reason: String, attempts: u64 },
}

/// Delay before a message whose dead letter could not be stored is offered again.
pub const SET_ASIDE_RETRY: Duration = Duration::from_secs(1);

impl Envelope {
    pub(super) fn new(mut message: jetstream::Message, bus: Bus) -> Self {
        own_payload(&mut message.message);
        let facts = DeliveryFacts::of(&message);
        Self {
            message,
            facts,
            bus,
        }
    }

    /// Decodes the body (checked against the payload cap); a message that does not decode keeps
    /// its envelope, to be answered and set aside.
    pub(super) fn decode<T: serde::de::DeserializeOwned>(self) -> Received<T> {
        match self.bus.decode(&self.message.payload) {
            Ok(body) => Received::Decoded(Delivery {
                envelope: self,
                body,
            }),
            Err(error) => Received::Undecodable(Delivery {
                envelope: self,
                body: error,
            }),
        }
    }

    pub fn subject(&self) -> &str {
        &self.message.subject
    }

    /// The `Nats-Msg-Id` it was published with, if any.
    pub fn message_id(&self) -> Option<String> {
        message_id(&self.message)
    }

    /// How often the broker has delivered it (1 for the first delivery; 1 when unknown).
    pub fn delivered(&self) -> i64 {
        match self.facts.delivered {
            0 => 1,
            delivered => delivered,
        }
    }

    /// Its position in its stream (0 when unknown).
    pub fn stream_sequence(&self) -> u64 {
        self.facts.stream_sequence
    }

    /// Where it waits among its session's submissions, when it is one (see
    /// [`super::SubmissionPlace`]).
    pub fn submission_place(&self) -> super::SubmissionPlace {
        let info = self.message.info().ok();
        super::SubmissionPlace {
            partition: info
                .as_ref()
                .and_then(|i| {
                    crate::subjects::parse_partition_stream(
                        crate::subjects::SUBMIT_STREAM,
                        i.stream,
                    )
                })
                .unwrap_or(0),
            sequence: info.as_ref().map_or(0, |i| i.stream_sequence),
            stored_ns: info.map_or(0, |i| i.published.unix_timestamp_nanos()),
        }
    }

    /// True for the first delivery of a message that is not a replayed dead letter: no earlier
    /// delivery of this work can have run. (A message whose delivery count is unknown is not.)
    pub fn is_first(&self) -> bool {
        self.facts.delivered == 1 && !self.is_replayed()
    }

    /// The message as the principals gate checks it: subject, headers, payload, and when the
    /// broker stored it.
    pub fn presented(&self) -> crate::principals::Presented<'_> {
        let stored_at_ms = match self.facts.stored_ms {
            0 => crate::protocol::now_ms(),
            stored_ms => stored_ms,
        };
        crate::principals::Presented {
            subject: &self.message.subject,
            headers: self.message.headers.as_ref(),
            payload: &self.message.payload,
            stored_at_ms,
        }
    }

    /// Who performs `operation` on `tenant`'s task through this message, checked against the
    /// process's principals (see [`crate::principals::Gate::check`]).
    pub fn acting(
        &self,
        tenant: &str,
        operation: crate::principals::Operation,
        claimed: &str,
    ) -> Result<crate::principals::Acting, crate::principals::Refusal> {
        let gate = self.bus.gate();
        let signed = self
            .message
            .headers
            .as_ref()
            .is_some_and(|h| h.get(crate::principals::HEADER_PRINCIPAL).is_some());
        if !signed && !gate.is_required() {
            // The common case off a signing cluster: nothing to look at.
            return Ok(crate::principals::Acting::claimed(claimed, tenant));
        }
        gate.check(
            self.presented(),
            tenant,
            operation,
            claimed,
            self.is_replayed(),
        )
    }

    /// True for a dead letter published again by `skein dlq replay`.
    pub fn is_replayed(&self) -> bool {
        self.message
            .headers
            .as_ref()
            .is_some_and(|h| h.get(HEADER_REPLAYED).is_some())
    }

    /// The consumer span of its handling, a child of the span that published it.
    pub fn span(&self) -> tracing::Span {
        process_span(&self.message, self.delivered(), None)
    }

    /// [`Envelope::span`], continuing `recorded` (the `traceparent` an earlier delivery of the
    /// same work kept) when the sender sent no trace context.
    pub fn span_continuing(&self, recorded: Option<&str>) -> tracing::Span {
        process_span(&self.message, self.delivered(), recorded)
    }

    /// Whether its sender sent a valid trace context with it.
    pub fn carries_trace_context(&self) -> bool {
        crate::telemetry::propagation::carries_context(self.message.headers.as_ref())
    }

    /// Runs `work` while telling the broker every `every` that the message is still being worked
    /// on, so a short ack deadline still catches a dead process quickly while long work survives.
    pub fn with_progress<'a, O: 'a>(
        &'a self,
        every: Duration,
        work: impl Future<Output = O> + 'a,
    ) -> impl Future<Output = O> + 'a {
        // Boxed before any future holds it: an `async fn` would keep the work twice (its
        // argument and its pinned copy), and a turn's is many KiB, held for the whole turn.
        let mut work = Box::pin(work);
        async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    done = &mut work => return done,
                    // Boxed: a progress ack is sent every few seconds, and inline its future
                    // would be most of this one, which every delivery keeps while it is worked on.
                    _ = ticks.tick() => Box::pin(self.progress()).await,
                }
            }
        }
    }

    /// Tells the broker once that the message is still being worked on.
    pub async fn progress(&self) {
        if let Err(e) = self.message.ack_with(jetstream::AckKind::Progress).await {
            tracing::warn!(error = %e, "progress ack failed");
        }
    }

    /// Copies the message to the dead-letter stream; false (logged) when the broker refused the
    /// letter, in which case it must be handed back rather than settled.
    pub async fn set_aside(&self, reason: &str, attempts: u64) -> bool {
        self.bus.set_aside(&self.message, reason, attempts).await
    }

    /// Tells the broker how the message ends, once; the disposition actually applied is returned
    /// (a `SetAside` whose letter was refused becomes a `Retry`).
    ///
    /// A plain function returning an `async move` block: an `async fn` keeps a by-value argument
    /// twice in its future, and this one is awaited on every delivery.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store the envelope twice in its future"
    )]
    pub fn settle(self, disposition: Disposition) -> impl Future<Output = Disposition> + Send {
        async move { self.settle_now(disposition).await }
    }

    async fn settle_now(&self, disposition: Disposition) -> Disposition {
        let applied = match disposition {
            Disposition::SetAside { reason, attempts } => {
                // Boxed: the dead-letter publish is rare, and inline it would double the size of
                // every settling future.
                if Box::pin(self.set_aside(&reason, attempts)).await {
                    Disposition::SetAside { reason, attempts }
                } else {
                    Disposition::Retry(Some(SET_ASIDE_RETRY))
                }
            }
            other => other,
        };
        let kind = match &applied {
            Disposition::Ack => jetstream::AckKind::Ack,
            Disposition::Retry(delay) => jetstream::AckKind::Nak(*delay),
            Disposition::Reject | Disposition::SetAside { .. } => jetstream::AckKind::Term,
        };
        settle(&self.message, kind).await;
        applied
    }
}

impl<T> Delivery<T> {
    /// The decoded body.
    pub fn body(&self) -> &T {
        &self.body
    }

    /// What is known of the message besides its body.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Settles the message, once; returns the disposition actually applied (see
    /// [`Disposition::SetAside`]). The body is dropped first.
    pub fn settle(self, disposition: Disposition) -> impl Future<Output = Disposition> + Send {
        self.envelope.settle(disposition)
    }

    /// The envelope and the body apart (a handler that keeps the body past settling, or holds
    /// the envelope elsewhere).
    pub fn into_parts(self) -> (Envelope, T) {
        (self.envelope, self.body)
    }
}

/// Settles a message, logging (not failing) when the broker cannot be told: the message then
/// comes back after its ack wait, and its handler finds its result recorded.
pub(super) async fn settle(message: &jetstream::Message, kind: jetstream::AckKind) {
    if let Err(e) = message.ack_with(kind).await {
        tracing::warn!(error = %e, ?kind, "acknowledgement not delivered; the broker will redeliver");
    }
}

/// Gives a message's payload an allocation of its own. As read, it is a slice of the connection's
/// read buffer, and would keep that buffer (shared with every message read with it) for as long
/// as the work runs: a burst of long turns held many such buffers at once, each for the sake of
/// a few hundred bytes.
fn own_payload(message: &mut async_nats::Message) {
    message.payload = bytes::Bytes::copy_from_slice(&message.payload);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn a_kept_payload_is_a_copy_not_a_slice_of_what_it_was_read_with() {
        let read = Bytes::from(vec![7u8; 64 * 1024]);
        let mut message = async_nats::Message {
            subject: "skein.submit.acme.s1".into(),
            reply: None,
            payload: read.slice(100..400),
            headers: None,
            status: None,
            description: None,
            length: 300,
        };
        own_payload(&mut message);
        assert_eq!(message.payload, read.slice(100..400));
        let kept = message.payload.as_ptr() as usize;
        let buffer = read.as_ptr() as usize..read.as_ptr() as usize + read.len();
        assert!(
            !buffer.contains(&kept),
            "the payload still points into the read buffer"
        );
    }
}
