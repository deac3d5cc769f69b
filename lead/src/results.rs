//! Result lookups: any lead answers `skein.result.{tenant}.{session}.{task_id}` (a core NATS
//! request, one queue group for all leads) with the task's stored final result, so a client that
//! missed the final event — its publish failed, the client's connection dropped, or the event
//! stream no longer holds it — still gets the answer. An answer too large for the reply goes by
//! reference, as in the final event (`payloads`): stored in the tenant's payload bucket (once per
//! task), previewed, with `answer_ref`.

use async_nats::Message;
use futures::StreamExt;
use skein_common::bus::{Bus, BusError};
use skein_common::payloads::{inline_limit, PayloadStore};
use skein_common::protocol::{validate_token, Failure, FailureKind, StoredFinal, PROTOCOL_VERSION};
use skein_common::store::SessionStore;
use skein_common::subjects;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Lookups answered at once by one lead (each is one Redis read).
const LOOKUP_CONCURRENCY: usize = 16;

/// Starts answering lookups until `stop`.
pub async fn serve_lookups(
    bus: &Bus,
    store: SessionStore,
    tracker: &TaskTracker,
    stop: CancellationToken,
) -> Result<(), BusError> {
    let requests = bus
        .queue_subscribe(subjects::RESULT_ALL, subjects::RESULT_QUEUE)
        .await?;
    let bus = bus.clone();
    let payloads = PayloadStore::new(&bus);
    tracker.spawn(async move {
        requests
            .take_until(stop.cancelled_owned())
            .for_each_concurrent(LOOKUP_CONCURRENCY, |request| {
                answer(&bus, &store, &payloads, request)
            })
            .await;
    });
    Ok(())
}

/// Room kept in a lookup answer for its envelope.
const LOOKUP_ROOM: usize = 1024;

async fn answer(bus: &Bus, store: &SessionStore, payloads: &PayloadStore, request: Message) {
    let Some(reply) = request.reply.clone() else {
        return;
    };
    let stored = match look_up(store, &request.subject).await {
        Ok(result) => StoredFinal {
            v: PROTOCOL_VERSION,
            result: match result {
                // An answer over the inline limit goes by reference (cut to fit if it cannot be
                // stored).
                Some(result) => {
                    let limit = inline_limit(bus.max_payload());
                    let message_limit = bus.max_payload().saturating_sub(LOOKUP_ROOM);
                    Some(
                        payloads
                            .final_for_message(result, limit, message_limit)
                            .await,
                    )
                }
                None => None,
            },
            failure: None,
        },
        Err(failure) => StoredFinal {
            v: PROTOCOL_VERSION,
            result: None,
            failure: Some(failure),
        },
    };
    let payload = match bus.encode(&stored) {
        Ok(payload) => payload,
        Err(e) => {
            tracing::warn!(error = %e, "result lookup answer not encoded");
            return;
        }
    };
    if let Err(e) = bus.client().publish(reply, payload).await {
        tracing::warn!(error = %e, "result lookup not answered");
    }
}

async fn look_up(
    store: &SessionStore,
    subject: &str,
) -> Result<Option<skein_common::protocol::FinalResult>, Failure> {
    let (tenant, session, task_id) = subjects::parse_result(subject).ok_or_else(|| {
        Failure::new(
            FailureKind::InvalidInput,
            "a lookup subject is skein.result.<tenant>.<session>.<task_id>",
        )
    })?;
    for (name, token) in [
        ("tenant", tenant),
        ("session", session),
        ("task_id", task_id),
    ] {
        validate_token(name, token)?;
    }
    store
        .final_result(tenant, session, task_id)
        .await
        .map_err(|e| e.to_failure())
}
