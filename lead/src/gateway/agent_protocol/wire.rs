//! How runs travel over HTTP: their parts as numbered SSE (those a client saw left out), where a
//! run and its output are read again (`Content-Location`, `Location`), what a waited-for run
//! left, the cancel a client's leaving makes (`on_disconnect=cancel`), and a query's pairs.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::store::threads::RunRecord;

use super::super::keys::{Principal, Role};
use crate::gateway::Gateway;

/// Where a run is read (`Content-Location`) and where its output is read again (`Location`).
pub(super) fn locate(response: &mut Response, run: &RunRecord, again: &str) {
    let base = format!("/threads/{}/runs/{}", run.thread_id, run.run_id);
    for (name, value) in [
        (header::CONTENT_LOCATION, base.clone()),
        (header::LOCATION, format!("{base}/{again}")),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
}

/// Cancels its run when dropped before the run's stream ended (its client left), for
/// `on_disconnect=cancel`.
pub(super) struct CancelOnDisconnect {
    gateway: Arc<Gateway>,
    tenant: String,
    task_id: String,
    by: String,
    ended: AtomicBool,
}

impl CancelOnDisconnect {
    /// A guard that cancels `task_id` of `principal`'s tenant when dropped before [`Self::ended`].
    pub(super) fn new(gateway: &Arc<Gateway>, principal: &Principal, task_id: &str) -> Self {
        CancelOnDisconnect {
            gateway: gateway.clone(),
            tenant: principal.tenant.clone(),
            task_id: task_id.to_owned(),
            by: principal.name.clone(),
            ended: AtomicBool::new(false),
        }
    }

    /// The run's output reached its end: nothing to cancel when the guard goes.
    pub(super) fn ended(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }
}

impl Drop for CancelOnDisconnect {
    fn drop(&mut self) {
        if self.ended.load(Ordering::Relaxed) {
            return;
        }
        let (client, tenant, task) = (
            self.gateway.client_for_name(&self.by, &[Role::Submit]),
            self.tenant.clone(),
            self.task_id.clone(),
        );
        let reason = format!(
            "the client of {} left its stream (on_disconnect=cancel)",
            self.by
        );
        tokio::spawn(async move {
            if let Err(e) = client.cancel(&tenant, &task, &reason).await {
                tracing::warn!(task, error = %e, "the run whose client left was not cancelled");
            }
        });
    }
}

/// Parts as SSE, each named by its mode and numbered; those up to `resume_after` left out.
pub(super) fn sse(
    parts: impl futures::Stream<Item = Value> + Send + 'static,
    resume_after: Option<u64>,
    guard: Option<CancelOnDisconnect>,
) -> Response {
    let events = parts
        .filter(move |part| {
            let seen =
                resume_after.is_some_and(|after| part["id"].as_u64().is_some_and(|n| n <= after));
            futures::future::ready(!seen)
        })
        .map(move |part| {
            if let Some(guard) = &guard {
                if matches!(part["event"].as_str(), Some("end" | "error")) {
                    guard.ended();
                }
            }
            let mut event = Event::default()
                .event(part["event"].as_str().unwrap_or("message"))
                .data(part["data"].to_string());
            if let Some(n) = part["id"].as_u64() {
                event = event.id(n.to_string());
            }
            Ok::<_, Infallible>(event)
        });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// What a waited-for run left: the thread's values (with `__interrupt__` when it stopped for a
/// person), or `{"__error__": …}`.
pub(super) async fn outcome(parts: impl futures::Stream<Item = Value>) -> Value {
    let mut parts = std::pin::pin!(parts);
    let mut values = json!({});
    let mut failed = None;
    while let Some(part) = parts.next().await {
        match part["event"].as_str() {
            Some("values") => values = part["data"].clone(),
            Some("error") => failed = Some(part["data"].clone()),
            _ => {}
        }
    }
    match failed {
        Some(error) => json!({ "__error__": error }),
        None => values,
    }
}

/// The query's pairs (a name may come more than once: `stream_mode=values&stream_mode=updates`).
pub(super) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

pub(super) fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs
        .iter()
        .any(|(k, v)| k == name && matches!(v.as_str(), "true" | "1" | "True"))
}
