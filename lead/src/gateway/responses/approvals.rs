//! Calls waiting for a person in the Responses API, as OpenAI's responses show MCP calls that need
//! approval: a response stops at an `mcp_approval_request` item (`fold`), and a response whose
//! input is `mcp_approval_response` items (`approval_request_id`, `approve`, `reason`) with the
//! asking response as `previous_response_id` answers them as its key's principal (who needs the
//! `approve` role) and goes on with the same task, from after the calls it answered.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{
    checked_metadata, followed, record_of, response_of, sse, CreateRequest, Input, ResponseFold,
};
use crate::gateway::approvals::{self, Answer, CallRef, Verdict};
use crate::gateway::follow::{last_of, Source};
use crate::gateway::keys::Principal;
use crate::gateway::request::{self, error, invalid, json_response, ApiError};
use crate::gateway::Gateway;
use skein_common::store::responses::ResponseRecord;

/// The prefix of an approval request's id before its call's id.
const REQUEST_ID_PREFIX: &str = "mcpr_";

/// The answers of a request whose input is `mcp_approval_response` items (by the id of the
/// request each answers); `None` for any other request. Mixed with other items: 400.
pub(super) fn answers_in(
    request: &CreateRequest,
) -> Result<Option<Vec<(String, Verdict)>>, ApiError> {
    let Input::Items(items) = &request.input else {
        return Ok(None);
    };
    let is_answer = |kind: &Option<String>| kind.as_deref() == Some("mcp_approval_response");
    if !items.iter().any(|item| is_answer(&item.kind)) {
        return Ok(None);
    }
    let mut answers = Vec::with_capacity(items.len());
    for item in items {
        if !is_answer(&item.kind) {
            return Err(invalid(
                "send mcp_approval_response items alone: they answer the calls the previous \
                 response asked about, and the run goes on from there",
            ));
        }
        let (Some(id), Some(approve)) = (&item.approval_request_id, item.approve) else {
            return Err(invalid(
                "an mcp_approval_response needs approval_request_id and approve",
            ));
        };
        let reason = item.reason.clone().unwrap_or_default();
        answers.push((id.clone(), Verdict { approve, reason }));
    }
    Ok(Some(answers))
}

/// Answers the calls the previous response stopped at and follows its task on, as a new response.
pub(super) async fn resume(
    gateway: Arc<Gateway>,
    principal: Principal,
    headers: &HeaderMap,
    request: CreateRequest,
    answers: Vec<(String, Verdict)>,
) -> Result<Response, ApiError> {
    request::check_agent(&gateway, &request.model)?;
    let metadata = checked_metadata(request.metadata)?;
    let previous_id = request.previous_response_id.as_deref().ok_or_else(|| {
        invalid("an mcp_approval_response answers a response: send its id as previous_response_id")
    })?;
    let previous = record_of(&gateway, &principal, previous_id).await?;
    if previous.agent != request.model {
        return Err(invalid(format!(
            "response {previous_id} ran {}; its calls are answered with that model",
            previous.agent
        )));
    }
    let tenant = principal.tenant.as_str();
    let task = previous.task().to_owned();
    let waiting = approvals::settled(&gateway, tenant, &previous.session, &task).await?;
    let answer = answer_of(&approvals::unanswered(&waiting), answers)?;
    // The new response starts after what the task holds now (it waits: nothing comes until it
    // is answered).
    let after_events = gateway
        .client
        .bus()
        .event_count(tenant, &task)
        .await
        .map_err(|e| request::unavailable("the task's events could not be counted", e))?;
    approvals::answer(&gateway, &principal, &task, &answer).await?;
    let record = ResponseRecord {
        id: format!("resp_{}", request::request_id(&principal, headers)?),
        session: previous.session.clone(),
        agent: previous.agent.clone(),
        created_at: skein_common::protocol::now_ms() / 1000,
        previous_response_id: Some(previous_id.to_owned()),
        instructions: request.instructions,
        metadata,
        background: request.background,
        task_id: Some(task),
        after_events,
    };
    let record = gateway
        .store
        .put_response(tenant, &record)
        .await
        .map_err(|e| request::unavailable("the response could not be recorded", e))?;
    if record.background && !request.stream {
        return Ok(json_response(ResponseFold::new(record).response(None)));
    }
    let source = Source::Stored(None);
    if request.stream {
        return Ok(sse(gateway, principal.tenant, record, source, None));
    }
    let last = last_of(followed(gateway, principal.tenant, record.clone(), source)).await;
    Ok(json_response(response_of(last, record)))
}

/// The answer to the calls waiting (`calls`): one item per call, by its approval request's id,
/// every waiting call answered once — the response showed them all, and the task goes on only once
/// each is answered.
fn answer_of(calls: &[CallRef], answers: Vec<(String, Verdict)>) -> Result<Answer, ApiError> {
    if calls.is_empty() {
        return Err(error(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "not_waiting",
            "no call of the previous response waits for approval",
        ));
    }
    let mut named = Vec::with_capacity(answers.len());
    for (id, verdict) in answers {
        let call = calls
            .iter()
            .find(|c| request_id_of(c) == id)
            .ok_or_else(|| {
                let ids: Vec<String> = calls.iter().map(request_id_of).collect();
                invalid(format!(
                    "no call waits for approval as {id:?}; waiting: {}",
                    ids.join(", ")
                ))
            })?;
        named.push((call.clone(), verdict));
    }
    let answer = Answer::Calls(named);
    answer.check_complete(calls, request_id_of)?;
    Ok(answer)
}

/// The id of the `mcp_approval_request` item of a waiting call.
pub(super) fn request_id_of(call: &CallRef) -> String {
    format!("{REQUEST_ID_PREFIX}{}", call.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(approve: bool) -> Verdict {
        Verdict {
            approve,
            reason: String::new(),
        }
    }

    fn call(source: &str, call_id: &str) -> CallRef {
        CallRef {
            source: source.into(),
            call_id: call_id.into(),
        }
    }

    #[test]
    fn every_waiting_call_is_answered_by_its_own_request_id() {
        let calls = vec![call("lead", "c1"), call("subagent:s1", "c1")];
        let both = vec![
            ("mcpr_c1".into(), verdict(true)),
            ("mcpr_subagent:s1/c1".into(), verdict(false)),
        ];
        assert_eq!(
            answer_of(&calls, both).ok(),
            Some(Answer::Calls(vec![
                (call("lead", "c1"), verdict(true)),
                (call("subagent:s1", "c1"), verdict(false))
            ])),
            "the same call id in two runs is two calls"
        );
        let one = answer_of(&calls, vec![("mcpr_c1".into(), verdict(true))]);
        assert!(
            one.is_err_and(|e| e.message().contains("mcpr_subagent:s1/c1")),
            "one answer does not approve a call it does not name"
        );
        let unknown = answer_of(&calls, vec![("mcpr_c9".into(), verdict(true))]);
        assert!(unknown.is_err_and(|e| e.message().contains("mcpr_c1, mcpr_subagent:s1/c1")));
        let none = answer_of(&[], vec![("mcpr_c1".into(), verdict(true))]);
        assert!(none.is_err_and(|e| e.message().contains("no call")));
        let twice = vec![
            ("mcpr_c1".into(), verdict(true)),
            ("mcpr_c1".into(), verdict(false)),
        ];
        assert!(
            answer_of(&calls, twice).is_err(),
            "the subagent's call left unanswered"
        );
    }
}
