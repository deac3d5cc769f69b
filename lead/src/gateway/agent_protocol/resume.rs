//! Answers to a run's interrupts: the thread's run whose task waits for a person, and a
//! `command.resume` value read as answers to the calls it waits on.

use serde_json::{json, Value};
use skein_common::store::threads::RunRecord;

use super::super::approvals::{self, Answer, CallRef, Verdict};
use super::super::request::{self, ApiError};
use crate::gateway::Gateway;

/// The thread's run whose task waits for a person, with the requests it waits on. For the newest
/// run, a request its client was just shown and not stored yet is waited for
/// (`approvals::settled`); older runs are looked at as they stand.
pub(super) async fn interrupted_run(
    gateway: &Gateway,
    tenant: &str,
    runs: &[RunRecord],
) -> Result<Option<(RunRecord, Vec<skein_common::protocol::ApprovalRequest>)>, ApiError> {
    for (n, run) in runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.resumed_by.is_none())
    {
        let waiting = if n == 0 {
            approvals::settled(gateway, tenant, &run.thread_id, &run.task_id).await?
        } else {
            approvals::waiting(gateway, tenant, &run.task_id).await?
        };
        if !waiting.is_empty() {
            return Ok(Some((run.clone(), waiting)));
        }
    }
    Ok(None)
}

/// A resume value as answers to the calls waiting (`calls`): `true`/`false`, `"approve"`/`"deny"`,
/// `{"approve": bool, "reason": …}`, `{"decisions": [{"type": "approve"|"reject", "message": …},
/// …]}` in the calls' order, or an object keyed by interrupt id with one of those each.
pub(super) fn read_resume(resume: &Value, calls: &[CallRef]) -> Result<Answer, ApiError> {
    if let Some(verdict) = verdict_of(resume) {
        return Ok(Answer::All(verdict));
    }
    let bad = || {
        request::invalid(
            "command.resume is true, false, \"approve\", \"deny\", {\"approve\": bool, \"reason\": \
             text}, {\"decisions\": [{\"type\": \"approve\" | \"reject\", \"message\": text}]}, or \
             an object of those by interrupt id",
        )
    };
    let fields = resume.as_object().ok_or_else(bad)?;
    if let Some(decisions) = fields.get("decisions").and_then(Value::as_array) {
        if decisions.len() != calls.len() {
            return Err(request::invalid(format!(
                "command.resume.decisions has {} decisions for {} waiting calls",
                decisions.len(),
                calls.len()
            )));
        }
        let answers = calls
            .iter()
            .zip(decisions)
            .map(|(call, d)| verdict_of(d).map(|v| (call.clone(), v)).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        return Ok(Answer::Calls(answers));
    }
    let answers = fields
        .iter()
        .map(|(id, d)| {
            let call = calls.iter().find(|c| c.id() == *id).ok_or_else(|| {
                let ids: Vec<String> = calls.iter().map(CallRef::id).collect();
                request::invalid(format!(
                    "no call waits as {id:?}; waiting: {}",
                    ids.join(", ")
                ))
            })?;
            verdict_of(d).map(|v| (call.clone(), v)).ok_or_else(bad)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if answers.is_empty() {
        return Err(bad());
    }
    Ok(Answer::Calls(answers))
}

fn verdict_of(value: &Value) -> Option<Verdict> {
    let plain = |approve: bool| Verdict {
        approve,
        reason: String::new(),
    };
    match value {
        Value::Bool(approve) => Some(plain(*approve)),
        Value::String(word) => match word.to_ascii_lowercase().as_str() {
            "approve" | "approved" | "accept" | "yes" => Some(plain(true)),
            "deny" | "denied" | "reject" | "no" => Some(plain(false)),
            _ => None,
        },
        Value::Object(fields) => {
            let approve = match (fields.get("approve"), fields.get("type")) {
                (Some(Value::Bool(approve)), _) => *approve,
                (None, Some(Value::String(kind))) => verdict_of(&json!(kind))?.approve,
                _ => return None,
            };
            let reason = fields
                .get("reason")
                .or_else(|| fields.get("message"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Some(Verdict { approve, reason })
        }
        _ => None,
    }
}
