//! The console's dead letters: the messages of the key's tenant set aside in the dead-letter
//! stream (refused, or failed on every attempt), listed and shown with any key of the tenant,
//! replayed or removed with the `operate` role, as `skein dlq` does for the whole cluster.
//!
//! The stream is cluster-wide; a key sees only the letters of its own tenant, by the rule
//! `skein_common::bus::DeadLetter::tenant` states (the one `skein dlq` scopes by too): a letter
//! that belongs to no tenant is seen by no gateway key and stays for the operator's `skein dlq`.
//! A replay is published as acting for the key's principal (signed by the gateway's own key, when
//! it has one), so the lead records who replayed it.
//!
//! A letter of another tenant is not found (404), never refused (403), so a key learns nothing of
//! what other tenants hold. A replay does what `skein dlq replay` does: it forgets the outcome
//! the work left behind and the attempts counted for it (so it runs again rather than answering
//! with its old failure), publishes the message again on its original subject and removes the
//! letter. A letter holding only the head of its message (it did not fit the broker's limit)
//! cannot be replayed (409), nor can one whose body is not the work its subject names.
//!
//! Listing reads every letter of the stream (one stream read each) to keep the tenant's: its cost
//! grows with the cluster's letters, which operators are expected to keep few.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use skein_common::bus::DeadLetter;
use skein_common::store::ForgetError;
use skein_common::text::cut;

use super::super::keys::{Principal, Role};
use super::super::request::{self, json_response, ApiError};
use super::super::Gateway;
use super::outcome;

/// Longest preview of a body that is not JSON, in bytes.
const MAX_PREVIEW_BYTES: usize = 16 * 1024;

pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/console/api/dead-letters", get(list))
        .route("/console/api/dead-letters/{seq}", get(show).delete(remove))
        .route("/console/api/dead-letters/{seq}/replay", post(replay))
}

fn unreadable(e: impl std::fmt::Display) -> ApiError {
    request::unavailable("the dead letters could not be read", e)
}

/// A letter with its body read as JSON, if it is.
struct Letter {
    letter: DeadLetter,
    body: Option<Value>,
}

impl Letter {
    fn new(letter: DeadLetter) -> Self {
        let body = letter.body();
        Self { letter, body }
    }

    /// The tenant the letter belongs to (see [`DeadLetter::tenant`]), if any.
    fn tenant(&self) -> Option<&str> {
        self.letter.tenant(self.body.as_ref())
    }

    /// What the original message was: `submit`, `tool`, `agent`, … (see [`DeadLetter::kind`]).
    fn kind(&self) -> &str {
        self.letter.kind()
    }

    /// The task the body names, if it names one (see [`DeadLetter::task_id`]).
    fn task_id(&self) -> Option<&str> {
        self.letter.task_id(self.body.as_ref())
    }

    fn summary(&self) -> Value {
        let letter = &self.letter;
        json!({
            "seq": letter.seq,
            "original_subject": letter.original_subject,
            "original_id": letter.original_id,
            "kind": self.kind(),
            "reason": letter.reason,
            "attempts": letter.attempts,
            "size": letter.truncated_from.unwrap_or(letter.payload.len() as u64),
            "truncated": letter.truncated_from.is_some(),
            "task_id": self.task_id(),
        })
    }
}

/// The letter at `seq` if it belongs to `principal`'s tenant; 404 otherwise.
async fn letter_of(
    gateway: &Gateway,
    principal: &Principal,
    seq: &str,
) -> Result<Letter, ApiError> {
    let number: u64 = seq.parse().map_err(|_| {
        request::invalid(format!("a dead letter is named by its number, not {seq:?}"))
    })?;
    let found = gateway
        .client
        .bus()
        .dead_letter_at(number)
        .await
        .map_err(unreadable)?
        .map(Letter::new)
        .filter(|letter| letter.tenant() == Some(principal.tenant.as_str()));
    found.ok_or_else(|| request::not_found(format!("no dead letter {number}")))
}

/// `GET /console/api/dead-letters`: the tenant's dead letters, oldest first, and whether the key
/// may replay or remove them.
async fn list(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let letters = gateway
                .client
                .bus()
                .dead_letters()
                .await
                .map_err(unreadable)?;
            let shown: Vec<Value> = letters
                .into_iter()
                .map(Letter::new)
                .filter(|letter| letter.tenant() == Some(principal.tenant.as_str()))
                .map(|letter| letter.summary())
                .collect();
            Ok(json_response(json!({
                "letters": shown,
                "may_operate": principal.may(Role::Operate),
            })))
        }
        .await,
    )
}

/// `GET /console/api/dead-letters/{seq}`: one letter with its body, as JSON when it is, else as
/// text (cut at [`MAX_PREVIEW_BYTES`]).
async fn show(
    State(gateway): State<Arc<Gateway>>,
    Path(seq): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let letter = letter_of(&gateway, &principal, &seq).await?;
            let mut shown = letter.summary();
            match &letter.body {
                Some(body) => shown["payload"] = body.clone(),
                None => {
                    let text = String::from_utf8_lossy(&letter.letter.payload);
                    shown["preview"] = cut(&text, MAX_PREVIEW_BYTES).into();
                    shown["preview_cut"] = (text.len() > MAX_PREVIEW_BYTES).into();
                }
            }
            Ok(json_response(shown))
        }
        .await,
    )
}

/// `POST /console/api/dead-letters/{seq}/replay`: runs the letter's work again (see the module
/// documentation) and removes the letter.
async fn replay(
    State(gateway): State<Arc<Gateway>>,
    Path(seq): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit(&gateway, &headers, Role::Operate).await?;
            let letter = letter_of(&gateway, &principal, &seq).await?;
            if let Some(size) = letter.letter.truncated_from {
                return Err(conflict(format!(
                    "dead letter {} holds only the head of a {size}-byte message (it did not fit \
                     the broker's limit) and cannot be replayed",
                    letter.letter.seq
                )));
            }
            gateway
                .store
                .forget_dead_work(&letter.letter.original_subject, &letter.letter.payload)
                .await
                .map_err(|e| match e {
                    ForgetError::Undecodable(_) => {
                        conflict(format!("dead letter {}: {e}", letter.letter.seq))
                    }
                    ForgetError::Store(e) => {
                        request::unavailable("the letter's outcome could not be forgotten", e)
                    }
                })?;
            gateway
                .client_for(&principal)
                .bus()
                .replay_dead_letter(&letter.letter)
                .await
                .map_err(|e| request::unavailable("the dead letter could not be replayed", e))?;
            tracing::info!(
                seq = letter.letter.seq,
                subject = %letter.letter.original_subject,
                principal = %principal.name,
                tenant = %principal.tenant,
                "dead letter replayed from the console"
            );
            let task_id = letter.task_id().unwrap_or_default();
            gateway
                .audit(
                    &principal,
                    "dlq_replay",
                    task_id,
                    &letter.letter.seq.to_string(),
                )
                .await;
            Ok(json_response(json!({
                "replayed": letter.letter.seq,
                "original_subject": letter.letter.original_subject,
                "task_id": letter.task_id(),
            })))
        }
        .await,
    )
}

/// `DELETE /console/api/dead-letters/{seq}`: removes the letter without replaying it.
async fn remove(
    State(gateway): State<Arc<Gateway>>,
    Path(seq): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit(&gateway, &headers, Role::Operate).await?;
            let letter = letter_of(&gateway, &principal, &seq).await?;
            let seq = letter.letter.seq;
            let removed = gateway
                .client
                .bus()
                .remove_dead_letter(seq)
                .await
                .map_err(|e| request::unavailable("the dead letter could not be removed", e))?;
            if !removed {
                return Err(request::not_found(format!("no dead letter {seq}")));
            }
            tracing::info!(seq, principal = %principal.name, tenant = %principal.tenant, "dead letter removed from the console");
            let task_id = letter.task_id().unwrap_or_default();
            gateway
                .audit(&principal, "dlq_remove", task_id, &seq.to_string())
                .await;
            Ok(json_response(json!({ "removed": seq })))
        }
        .await,
    )
}

fn conflict(message: String) -> ApiError {
    request::error(
        StatusCode::CONFLICT,
        "invalid_request_error",
        "conflict",
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(subject: &str, body: &str) -> Letter {
        Letter::new(DeadLetter {
            seq: 1,
            original_subject: subject.to_owned(),
            original_id: None,
            reason: String::new(),
            attempts: 1,
            truncated_from: None,
            payload: body.as_bytes().to_vec().into(),
        })
    }

    /// The rule itself is tested with `DeadLetter::tenant`; the console reads it through.
    #[test]
    fn the_console_attributes_letters_by_the_rule_of_the_stream() {
        let cases = [
            ("skein.submit.acme.s1", "{ not json", Some("acme")),
            ("skein.submit.acme.s1", r#"{"tenant":"globex"}"#, None),
            (
                "skein.agent.default.helper",
                r#"{"origin":{"tenant":"globex"}}"#,
                Some("globex"),
            ),
            ("skein.tool.default.read_file", "garbage", None),
        ];
        for (subject, body, tenant) in cases {
            assert_eq!(letter(subject, body).tenant(), tenant, "{subject} {body}");
        }
    }

    #[test]
    fn a_letter_names_its_task_from_a_submission_or_a_work_message() {
        let submission = letter("skein.submit.acme.s1", r#"{"task_id":"t1"}"#);
        assert_eq!(submission.task_id(), Some("t1"));
        let work = letter("skein.tool.p.x", r#"{"origin":{"task_id":"t2"}}"#);
        assert_eq!(work.task_id(), Some("t2"));
        assert_eq!(letter("skein.tool.p.x", "garbage").task_id(), None);
        assert_eq!(work.kind(), "tool");
    }
}
