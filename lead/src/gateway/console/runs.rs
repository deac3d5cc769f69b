//! The console's runs: the tenant's tasks the events stream holds (`Bus::tenant_tasks`), each
//! with its agent, session and start (its first event) and its status (its stored final result,
//! else `waiting` while a call of it waits for a person, else `running`), newest first, filtered
//! and paged by the server; and one run's events from its first, live to its end, as SSE whose
//! ids number them, so a page that reconnects with `Last-Event-ID` goes on where it was.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use skein_common::protocol::{validate_token, EventKind};

use super::super::approvals;
use super::super::request::{self, json_response, ApiError};
use super::super::Gateway;
use super::outcome;

/// Most runs a page asks for.
const MAX_PAGE: usize = 200;

#[derive(Debug, Deserialize)]
pub(super) struct RunsQuery {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    session: Option<String>,
    /// Only runs started before this instant (milliseconds since the Unix epoch): the next page.
    #[serde(default)]
    before: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /console/api/runs`: the tenant's runs, newest first.
pub(super) async fn list(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let Query(query) = query.map_err(|e| request::invalid(e.body_text()))?;
            let limit = query.limit.unwrap_or(50).clamp(1, MAX_PAGE);
            let tenant = principal.tenant.as_str();
            let unreadable = |e| request::unavailable("the runs could not be read", e);
            let tasks = gateway
                .client
                .bus()
                .tenant_tasks(tenant)
                .await
                .map_err(unreadable)?;
            let mut runs = Vec::with_capacity(tasks.len());
            for (task_id, events) in tasks {
                let Some((_, first)) = gateway
                    .client
                    .bus()
                    .first_event(tenant, &task_id)
                    .await
                    .map_err(unreadable)?
                else {
                    continue;
                };
                let (agent, session) = match &first.event {
                    EventKind::TurnStarted { agent, session, .. } => {
                        (agent.clone(), session.clone())
                    }
                    _ => (String::new(), String::new()),
                };
                if query.agent.as_ref().is_some_and(|a| *a != agent)
                    || query.session.as_ref().is_some_and(|s| *s != session)
                    || query.before.is_some_and(|before| first.at_ms >= before)
                {
                    continue;
                }
                runs.push((task_id, agent, session, first.at_ms, events));
            }
            runs.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| b.0.cmp(&a.0)));
            let mut shown = Vec::new();
            for (task_id, agent, session, started_at_ms, events) in runs {
                if shown.len() == limit {
                    break;
                }
                let status = status_of(&gateway, tenant, &session, &task_id).await?;
                if query.status.as_ref().is_some_and(|s| s != status) {
                    continue;
                }
                shown.push(json!({
                    "task_id": task_id, "agent": agent, "session": session,
                    "started_at_ms": started_at_ms, "events": events, "status": status,
                }));
            }
            Ok(json_response(json!({ "runs": shown })))
        }
        .await,
    )
}

/// How a run stands: its final status, `waiting` for a person, or `running`.
pub(super) async fn status_of(
    gateway: &Gateway,
    tenant: &str,
    session: &str,
    task_id: &str,
) -> Result<&'static str, ApiError> {
    if validate_token("session", session).is_ok() {
        if let Some(ended) = gateway
            .store
            .final_result(tenant, session, task_id)
            .await
            .map_err(|e| request::unavailable("the runs could not be read", e))?
        {
            return Ok(ended.status.as_str());
        }
    }
    if !approvals::waiting(gateway, tenant, task_id)
        .await?
        .is_empty()
    {
        return Ok("waiting");
    }
    Ok("running")
}

/// `GET /console/api/runs/{task_id}/events`: the run's events from its first, live to its end,
/// numbered; those up to `Last-Event-ID` left out.
pub(super) async fn events(
    State(gateway): State<Arc<Gateway>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            validate_token("task_id", &task_id).map_err(|f| request::invalid(f.message))?;
            let seen: u64 = headers
                .get("last-event-id")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let events = gateway
                .client
                .watch(&principal.tenant, &task_id)
                .await
                .map_err(|e| request::unavailable("the run's events could not be read", e))?;
            let numbered = events
                .zip(futures::stream::iter(1u64..))
                .filter(move |(_, n)| futures::future::ready(*n > seen))
                .map(|(event, n)| {
                    let data = match event {
                        Ok(event) => serde_json::to_value(&event).unwrap_or(Value::Null),
                        Err(e) => json!({ "error": e.to_string() }),
                    };
                    Ok::<_, Infallible>(Event::default().id(n.to_string()).data(data.to_string()))
                });
            Ok(Sse::new(numbered)
                .keep_alive(KeepAlive::default())
                .into_response())
        }
        .await,
    )
}
