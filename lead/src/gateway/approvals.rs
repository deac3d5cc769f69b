//! Calls that wait for a person, as the gateway's protocols show and answer them: the requests a
//! task waits on (its own turn's and its subagent runs'), and a caller's answer published as
//! `ApprovalDecision`s on `skein.approval.>` with the caller's proven principal as `by` — the same
//! path `skein approve` takes, so the lead records the first answer and resumes the turn.

use axum::http::StatusCode;
use skein_common::protocol::{ApprovalDecision, ApprovalRequest, PROTOCOL_VERSION};

use super::keys::{Principal, Role};
use super::request::{self, error, ApiError};
use super::Gateway;

/// One answer: approve or refuse, and why (shown to the model when refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub approve: bool,
    pub reason: String,
}

/// One waiting call, by the source of the events of the run that asked (`lead` for the task's own
/// turn, `subagent:<calls>` for a subagent run's: call ids are unique only within a run) and its
/// call id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CallRef {
    pub source: String,
    pub call_id: String,
}

/// The source of the task's own turn's events.
pub(crate) const LEAD: &str = "lead";

impl CallRef {
    /// How a protocol names the call: its id for the task's own turn, `source/id` in a subagent
    /// run.
    pub fn id(&self) -> String {
        if self.source == LEAD {
            self.call_id.clone()
        } else {
            format!("{}/{}", self.source, self.call_id)
        }
    }
}

/// The source of the events of the run a request is of.
pub(crate) fn source_of(request: &ApprovalRequest) -> String {
    if request.lineage.is_empty() {
        LEAD.to_owned()
    } else {
        format!("subagent:{}", request.lineage.join("/"))
    }
}

/// The unanswered calls of `requests`.
pub(crate) fn unanswered(requests: &[ApprovalRequest]) -> Vec<CallRef> {
    requests
        .iter()
        .flat_map(|request| {
            let source = source_of(request);
            request.unanswered().map(move |call| CallRef {
                source: source.clone(),
                call_id: call.call_id.clone(),
            })
        })
        .collect()
}

/// What a caller answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Every call that waits.
    All(Verdict),
    /// Named calls.
    Calls(Vec<(CallRef, Verdict)>),
}

impl Answer {
    /// 400 unless the answer settles every call of `waiting` (each named once): a run that goes
    /// on from an answer must not be left waiting on a call nobody answered.
    /// The calls are named in the message as `name` gives them.
    pub(crate) fn check_complete(
        &self,
        waiting: &[CallRef],
        name: impl Fn(&CallRef) -> String,
    ) -> Result<(), ApiError> {
        let Answer::Calls(calls) = self else {
            return Ok(());
        };
        let named: std::collections::BTreeSet<&CallRef> = calls.iter().map(|(c, _)| c).collect();
        let wanted: std::collections::BTreeSet<&CallRef> = waiting.iter().collect();
        if named.len() == calls.len() && named == wanted {
            return Ok(());
        }
        let ids: Vec<String> = waiting.iter().map(name).collect();
        Err(request::invalid(format!(
            "answer every waiting call once (or all of them with one verdict); waiting: {}",
            ids.join(", ")
        )))
    }
}

/// The requests task `task_id` of `tenant` waits on, its own turn's first, each with the answers
/// recorded so far; empty when it waits on nobody.
pub(crate) async fn waiting(
    gateway: &Gateway,
    tenant: &str,
    task_id: &str,
) -> Result<Vec<ApprovalRequest>, ApiError> {
    let unreadable = |e| request::unavailable("approval requests could not be read", e);
    let listed = gateway
        .store
        .approval_requests(tenant)
        .await
        .map_err(unreadable)?;
    let mut requests = Vec::new();
    for listed in listed.iter().filter(|r| r.task_id == task_id) {
        if let Some(full) = gateway
            .store
            .approval_request(tenant, &listed.key())
            .await
            .map_err(unreadable)?
        {
            requests.push(full);
        }
    }
    requests.sort_by_key(|r| r.run.is_some());
    Ok(requests)
}

/// How long a caller who saw a call ask for approval waits for its request to be stored: the
/// lead announces the calls as the turn suspends and stores the request as it lets the turn go.
const REQUEST_SETTLES: std::time::Duration = std::time::Duration::from_secs(10);

/// [`waiting`], looked at again while the task has not ended and stored no request yet, for up
/// to [`REQUEST_SETTLES`]: what a caller answering a call it was just shown finds.
pub(crate) async fn settled(
    gateway: &Gateway,
    tenant: &str,
    session: &str,
    task_id: &str,
) -> Result<Vec<ApprovalRequest>, ApiError> {
    let settles = tokio::time::Instant::now() + REQUEST_SETTLES;
    loop {
        let requests = waiting(gateway, tenant, task_id).await?;
        let ended = gateway
            .store
            .final_result(tenant, session, task_id)
            .await
            .map_err(|e| request::unavailable("the task could not be read", e))?
            .is_some();
        if !requests.is_empty() || ended || tokio::time::Instant::now() >= settles {
            return Ok(requests);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Publishes `principal`'s `answer` to the calls task `task_id` waits on; returns how many calls
/// it answers. 403 without the `approve` role, 409 when the task waits on nobody (or not on a
/// named call).
pub(crate) async fn answer(
    gateway: &Gateway,
    principal: &Principal,
    task_id: &str,
    answer: &Answer,
) -> Result<usize, ApiError> {
    if !principal.may(Role::Approve) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            format!(
                "principal {} may not answer calls waiting for approval in tenant {}",
                principal.name, principal.tenant
            ),
        ));
    }
    let requests = waiting(gateway, &principal.tenant, task_id).await?;
    let mut decisions = Vec::new();
    for request in &requests {
        let unanswered: Vec<&str> = request.unanswered().map(|c| c.call_id.as_str()).collect();
        match answer {
            Answer::All(verdict) if !unanswered.is_empty() => decisions.push((
                decision(principal, request, None, verdict),
                unanswered.len(),
            )),
            Answer::All(_) => {}
            Answer::Calls(calls) => {
                let source = source_of(request);
                for (call, verdict) in calls {
                    if call.source == source && unanswered.contains(&call.call_id.as_str()) {
                        let decision = decision(principal, request, Some(&call.call_id), verdict);
                        decisions.push((decision, 1));
                    }
                }
            }
        }
    }
    if let Answer::Calls(calls) = answer {
        let known: usize = decisions.iter().map(|(_, n)| n).sum();
        if known < calls.len() {
            let waiting: Vec<String> = unanswered(&requests).iter().map(CallRef::id).collect();
            return Err(not_waiting(format!(
                "task {task_id} does not wait on every call named; it waits on: {}",
                if waiting.is_empty() {
                    "none".to_owned()
                } else {
                    waiting.join(", ")
                }
            )));
        }
    }
    if decisions.is_empty() {
        return Err(not_waiting(format!(
            "task {task_id} waits on no call for approval"
        )));
    }
    let mut answered = 0;
    for (decision, calls) in decisions {
        gateway
            .client_for(principal)
            .bus()
            .publish_decision(&decision)
            .await
            .map_err(|e| request::unavailable("the answer could not be sent", e))?;
        answered += calls;
    }
    Ok(answered)
}

fn decision(
    principal: &Principal,
    request: &ApprovalRequest,
    call_id: Option<&str>,
    verdict: &Verdict,
) -> ApprovalDecision {
    ApprovalDecision {
        v: PROTOCOL_VERSION,
        tenant: principal.tenant.clone(),
        task_id: request.task_id.clone(),
        call_id: call_id.map(str::to_owned),
        run: request.run.clone(),
        approve: verdict.approve,
        always: false,
        always_rule: None,
        reason: verdict.reason.clone(),
        by: principal.name.clone(),
    }
}

fn not_waiting(message: String) -> ApiError {
    error(
        StatusCode::CONFLICT,
        "invalid_request_error",
        "not_waiting",
        message,
    )
}
