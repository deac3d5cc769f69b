//! The console's sessions, read with any key of the tenant: the tenant's sessions (turns,
//! messages, last activity, time left before an idle one expires, the turn running in it), one
//! session's history with its summary, where it was forked from and its checkpoints (its recorded
//! turns: the points a fork can start from, `T` or `T.S`), and its workspace's files, listed,
//! read as text or downloaded.
//!
//! Invariants:
//! - every read names the key's tenant: a session or file of another tenant is not found (404),
//!   never refused (403), so a key learns nothing of what other tenants hold;
//! - long texts are cut here, with a note saying so: a message at [`MAX_TEXT_BYTES`], a call's
//!   arguments at [`MAX_ARGUMENTS_BYTES`], the history at its last [`MAX_MESSAGES`] messages;
//! - a file is served as `text/plain; charset=utf-8` only when it is UTF-8; any other file answers
//!   415 and is served only as a download (`?download=1`: `application/octet-stream`,
//!   `Content-Disposition: attachment`); every file answer carries `nosniff` and `no-store`.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use skein_common::protocol::message::Message;
use skein_common::protocol::validate_token;
use skein_common::store::history::TurnRecord;
use skein_common::text::cut;
use skein_common::workspace::{SessionRef, WorkspaceError, WorkspacePath};

use super::super::request::{self, json_response, ApiError};
use super::super::Gateway;
use super::outcome;

/// Longest message text shown, in bytes.
const MAX_TEXT_BYTES: usize = 4000;
/// Longest text of a call's arguments shown, in bytes.
const MAX_ARGUMENTS_BYTES: usize = 300;
/// Most messages shown: the session's last ones.
const MAX_MESSAGES: usize = 200;

pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/console/api/sessions", get(list))
        .route("/console/api/sessions/{session}", get(session))
        .route("/console/api/sessions/{session}/files", get(files))
        .route("/console/api/sessions/{session}/files/{*path}", get(file))
}

fn unreadable(e: impl std::fmt::Display) -> ApiError {
    request::unavailable("the sessions could not be read", e)
}

/// `GET /console/api/sessions`: the tenant's sessions, the latest active first.
async fn list(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let tenant = principal.tenant.as_str();
            let summaries = gateway.store.sessions(tenant).await.map_err(unreadable)?;
            let mut sessions = Vec::with_capacity(summaries.len());
            for summary in summaries {
                let records = gateway
                    .store
                    .turn_records(tenant, &summary.session)
                    .await
                    .map_err(unreadable)?;
                let running = gateway
                    .store
                    .running_turn(tenant, &summary.session)
                    .await
                    .map_err(unreadable)?;
                let last_activity_ms = records.last().map(|r| r.ended_at_ms);
                sessions.push((last_activity_ms, summary, running.map(|(task, _)| task)));
            }
            sessions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.session.cmp(&b.1.session)));
            let shown: Vec<Value> = sessions
                .into_iter()
                .map(|(last_activity_ms, s, running)| {
                    json!({
                        "session": s.session,
                        "turns": s.turns,
                        "messages": s.messages,
                        "last_activity_ms": last_activity_ms,
                        "expires_in_secs": s.expires_in_secs,
                        "running_task": running,
                    })
                })
                .collect();
            Ok(json_response(json!({ "sessions": shown })))
        }
        .await,
    )
}

/// `GET /console/api/sessions/{session}`: its history (the last messages, after its summary),
/// where it was forked from, and its checkpoints.
async fn session(
    State(gateway): State<Arc<Gateway>>,
    Path(session): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            validate_token("session", &session).map_err(|f| request::invalid(f.message))?;
            let tenant = principal.tenant.as_str();
            let loaded = gateway
                .store
                .load(tenant, &session)
                .await
                .map_err(unreadable)?;
            if loaded.version == 0 {
                return Err(request::not_found(format!("no session {session}")));
            }
            let records = gateway
                .store
                .turn_records(tenant, &session)
                .await
                .map_err(unreadable)?;
            let running = gateway
                .store
                .running_turn(tenant, &session)
                .await
                .map_err(unreadable)?;
            let state = loaded.state;
            let left_out = state.history.len().saturating_sub(MAX_MESSAGES);
            let messages: Vec<Value> = state.history[left_out..].iter().map(message_json).collect();
            Ok(json_response(json!({
                "session": session,
                "turns": state.turns,
                "version": loaded.version,
                "summary": state.summary.as_ref().map(|s| {
                    let mut shown = text_json(&s.text);
                    shown["messages"] = s.messages.into();
                    shown
                }),
                "forked_from": state.forked_from.as_ref().map(|f| json!({
                    "session": f.session,
                    "at": f.at.to_string(),
                })),
                "messages": messages,
                "earlier_left_out": left_out,
                "checkpoints": records.iter().map(checkpoint_json).collect::<Vec<_>>(),
                "running_task": running.map(|(task, _)| task),
            })))
        }
        .await,
    )
}

/// A text cut at [`MAX_TEXT_BYTES`]: `{text}`, with `cut` and a `note` when it was.
fn text_json(text: &str) -> Value {
    if text.len() <= MAX_TEXT_BYTES {
        return json!({ "text": text });
    }
    json!({
        "text": cut(text, MAX_TEXT_BYTES),
        "cut": true,
        "note": format!("cut to its first {MAX_TEXT_BYTES} of {} bytes", text.len()),
    })
}

/// A message of the history: role, text, the calls it asked for (name and arguments, cut) or the
/// call it answers.
fn message_json(message: &Message) -> Value {
    let mut shown = text_json(&message.content);
    shown["role"] = serde_json::to_value(message.role).unwrap_or(Value::Null);
    if !message.tool_calls.is_empty() {
        shown["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "name": call.name,
                    "arguments": cut(&call.arguments.to_string(), MAX_ARGUMENTS_BYTES),
                })
            })
            .collect();
    }
    if let Some(call) = &message.tool_call_id {
        shown["tool_call_id"] = call.as_str().into();
    }
    shown
}

/// A recorded turn, with the points a fork can start from in it: after each step that made calls
/// (`T.S`), and after the turn (`T`).
fn checkpoint_json(record: &TurnRecord) -> Value {
    let mut points: Vec<String> = record
        .step_ends
        .iter()
        .filter(|end| end.step < record.steps)
        .map(|end| format!("{}.{}", record.turn, end.step))
        .collect();
    points.push(record.turn.to_string());
    json!({
        "turn": record.turn,
        "task_id": record.task_id,
        "agent": record.agent,
        "model": record.model,
        "status": record.status.as_str(),
        "ended_at_ms": record.ended_at_ms,
        "duration_ms": record.duration_ms,
        "steps": record.steps,
        "calls": record.calls,
        "tokens": record.tokens,
        "messages": record.messages,
        "fork_points": points,
    })
}

/// The session's workspace, `session` checked as a token.
fn workspace_of(tenant: &str, session: &str) -> Result<SessionRef, ApiError> {
    validate_token("session", session).map_err(|f| request::invalid(f.message))?;
    SessionRef::new(tenant, session).map_err(|e| request::invalid(e.to_string()))
}

fn workspace_error(e: WorkspaceError) -> ApiError {
    match e {
        WorkspaceError::NotFound(message) => request::not_found(message),
        WorkspaceError::Denied(message) | WorkspaceError::Invalid(message) => {
            request::invalid(message)
        }
        other => request::unavailable("the workspace could not be read", other.describe()),
    }
}

/// `GET /console/api/sessions/{session}/files`: the workspace's files, by path. A session the
/// store does not know and whose workspace holds nothing is not found.
async fn files(
    State(gateway): State<Arc<Gateway>>,
    Path(session): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let workspace = workspace_of(&principal.tenant, &session)?;
            let listed = gateway
                .workspaces
                .list(&workspace)
                .await
                .map_err(workspace_error)?;
            if listed.is_empty() {
                let loaded = gateway
                    .store
                    .load(&principal.tenant, &session)
                    .await
                    .map_err(unreadable)?;
                if loaded.version == 0 {
                    return Err(request::not_found(format!("no session {session}")));
                }
            }
            let files: Vec<Value> = listed
                .iter()
                .map(|f| json!({ "path": f.path, "size": f.size, "digest": f.digest }))
                .collect();
            Ok(json_response(json!({ "session": session, "files": files })))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct FileQuery {
    /// `1` (or `true`): the bytes as an attachment, whatever they are.
    #[serde(default)]
    download: Option<String>,
}

/// `GET /console/api/sessions/{session}/files/{*path}`: a file's bytes; as text when it is
/// UTF-8, else 415; as an attachment with `?download=1`.
async fn file(
    State(gateway): State<Arc<Gateway>>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let Path((session, path)) = path.map_err(|e| request::invalid(e.body_text()))?;
            let Query(query) = query.map_err(|e| request::invalid(e.body_text()))?;
            let download = match query.download.as_deref() {
                None | Some("0" | "false") => false,
                Some("1" | "true") => true,
                Some(other) => {
                    return Err(request::invalid(format!(
                        "download is 1 or 0, not {other:?}"
                    )))
                }
            };
            let workspace = workspace_of(&principal.tenant, &session)?;
            let path = WorkspacePath::parse(&path).map_err(workspace_error)?;
            if path.is_root() {
                return Err(request::invalid("name a file of the workspace"));
            }
            let (content, _) = gateway
                .workspaces
                .read(&workspace, &path)
                .await
                .map_err(workspace_error)?;
            let mut response = if download {
                let mut response = (
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    content,
                )
                    .into_response();
                if let Ok(disposition) = HeaderValue::from_str(&attachment(&path)) {
                    response
                        .headers_mut()
                        .insert(header::CONTENT_DISPOSITION, disposition);
                }
                response
            } else if std::str::from_utf8(&content).is_ok() {
                (
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    content,
                )
                    .into_response()
            } else {
                return Err(request::error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "invalid_request_error",
                    "not_text",
                    format!("{path} is not UTF-8 text: download it (?download=1)"),
                ));
            };
            let headers = response.headers_mut();
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Ok(response)
        }
        .await,
    )
}

/// `Content-Disposition` of a download of `path`: its last segment as the file name, in ASCII
/// (other characters as `_`) and, exactly, percent-encoded UTF-8 (RFC 6266).
fn attachment(path: &WorkspacePath) -> String {
    let name = path.segments().last().unwrap_or("file");
    let plain: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut encoded = String::with_capacity(name.len() * 3);
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("attachment; filename=\"{plain}\"; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_names_its_file_in_ascii_and_exactly() {
        let path = WorkspacePath::parse("out/r\u{e9}sum\u{e9} \"1\".txt").expect("a path");
        assert_eq!(
            attachment(&path),
            "attachment; filename=\"r_sum_ _1_.txt\"; \
             filename*=UTF-8''r%C3%A9sum%C3%A9%20%221%22.txt"
        );
    }

    #[test]
    fn long_texts_are_cut_with_a_note() {
        let short = text_json("hello");
        assert_eq!(short, json!({ "text": "hello" }));
        let long = text_json(&"x".repeat(MAX_TEXT_BYTES + 10));
        assert_eq!(long["cut"], true);
        assert!(long["text"]
            .as_str()
            .is_some_and(|t| t.len() <= MAX_TEXT_BYTES));
        assert_eq!(
            long["note"],
            format!(
                "cut to its first {MAX_TEXT_BYTES} of {} bytes",
                MAX_TEXT_BYTES + 10
            )
        );
    }
}
