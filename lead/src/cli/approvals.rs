//! `skein approvals`, `skein approve` and `skein deny`: the turns of a tenant that wait for a
//! person, and the answers that resume them.
//!
//! Invariants:
//! - the list and the checks read the stored requests (Redis); an answer is only ever published
//!   as an `ApprovalDecision` on `skein.approval.{tenant}.{task_id}`, and a lead records it (the
//!   first answer per call wins) and resumes the turn once no call of it waits any more;
//! - an answer is published only after the stored request showed the task waiting on the calls
//!   it answers, so a typo or a late answer fails here with a one-line reason instead of being
//!   dropped by a lead (a request that changes between the check and the publish is still decided
//!   by the lead's first-answer-wins record);
//! - every network step is bounded: Redis by the store's response timeout, NATS by the bus's
//!   connect and ack timeouts, and the whole publish by [`PUBLISH_TIMEOUT`].

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use skein_common::audit::{AuditFilter, Verdict};
use skein_common::client::{ClientError, SkeinClient};
use skein_common::config::{NatsConfig, RedisConfig, ENV_TENANT};
use skein_common::protocol::{
    approval_key, now_ms, validate_token, ApprovalDecision, ApprovalRequest, Failure, PendingCall,
    PROTOCOL_VERSION,
};
use skein_common::store::{SessionStore, StoreError};

/// Longest a decision's connect and publish may take together.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `skein approve` and `skein deny` wait to see a lead record or refuse the answer.
pub const RECORD_WAIT: Duration = Duration::from_secs(10);
/// How often they look meanwhile.
const RECORD_POLL: Duration = Duration::from_millis(200);
/// Longest shown form of a call's arguments, in characters.
pub const ARGUMENTS_WIDTH: usize = 120;
/// Who decided, when neither `--by` nor `$USER` says.
const DEFAULT_DECIDER: &str = "cli";
/// The operating system's login name, the default of `--by`.
pub(super) const ENV_LOGIN_USER: &str = "USER";

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Only the principal settings are used (who lists; nothing is read from NATS).
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Print the requests as one JSON array (with the answers given so far).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Answer this call only; every waiting call of the task when unset.
    #[arg(long = "call", value_name = "CALL_ID")]
    pub call_id: Option<String>,
    /// Also allow the session's later calls like this one (the same tool with the same primary
    /// argument: path, URL, command…) without asking again.
    #[arg(long)]
    pub always: bool,
    /// With --always: allow the later calls this rule matches instead (`tool(glob)`, such as
    /// `shell(git *)`); it must match the approved call.
    #[arg(long, value_name = "RULE")]
    pub always_rule: Option<String>,
    /// Who decides, for the audit trail; `$USER` when unset.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// The subagent run answered, by its child session (`skein approvals` shows it); needed
    /// only when several runs of the task wait on calls with the same id.
    #[arg(long, value_name = "CHILD_SESSION")]
    pub run: Option<String>,
    /// The task whose turn waits.
    pub task_id: String,
}

#[derive(Debug, Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[arg(long, env = ENV_TENANT, default_value = "default")]
    pub tenant: String,
    /// Refuse this call only; every waiting call of the task when unset.
    #[arg(long = "call", value_name = "CALL_ID")]
    pub call_id: Option<String>,
    /// Why, shown to the model as the call's answer.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Who decides, for the audit trail; `$USER` when unset.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// The subagent run answered, by its child session (`skein approvals` shows it); needed
    /// only when several runs of the task wait on calls with the same id.
    #[arg(long, value_name = "CHILD_SESSION")]
    pub run: Option<String>,
    /// The task whose turn waits.
    pub task_id: String,
}

/// Why listing or answering approvals failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    #[error("{0}")]
    Invalid(Failure),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot encode the approval requests: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("no approval pending for task {task_id} of tenant {tenant}")]
    NoRequest { tenant: String, task_id: String },
    #[error("several runs of task {task_id} wait ({runs}); say which with --run")]
    SeveralRuns { task_id: String, runs: String },
    #[error("task {task_id} does not wait on call {call_id}; waiting calls: {waiting}")]
    UnknownCall {
        task_id: String,
        call_id: String,
        waiting: String,
    },
    #[error("call {call_id} ({tool}) of task {task_id} was already {verdict} by {by}")]
    AlreadyAnswered {
        task_id: String,
        call_id: String,
        tool: String,
        verdict: &'static str,
        by: String,
    },
    #[error("every call of task {task_id} was already answered; its turn resumes on a lead")]
    NothingWaiting { task_id: String },
    #[error("the decision was not published within {0:?}")]
    TimedOut(Duration),
    #[error("{0}")]
    NotAllowed(String),
    #[error("a lead refused the answer to task {task_id}: {reason}")]
    Refused { task_id: String, reason: String },
}

/// What a decision says, before it is addressed to a task.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    approve: bool,
    always: bool,
    always_rule: Option<String>,
    reason: String,
}

/// The request and the answer, as `skein approve` and `skein deny` share them.
struct Answering {
    nats: NatsConfig,
    redis: RedisConfig,
    tenant: String,
    task_id: String,
    call_id: Option<String>,
    run: Option<String>,
    by: Option<String>,
    answer: Answer,
}

pub async fn list(args: ApprovalsArgs) -> ExitCode {
    match list_requests(&args).await {
        Ok(requests) => {
            if requests.is_empty() {
                eprintln!("no approvals pending for tenant {}", args.tenant);
            }
            if args.json {
                match serde_json::to_string_pretty(&requests) {
                    Ok(json) => println!("{json}"),
                    Err(e) => return fail(&ApprovalError::Encode(e)),
                }
            } else if !requests.is_empty() {
                let now = now_ms();
                for request in &requests {
                    print!("{}", describe(request, now));
                }
                eprintln!(
                    "answer with: skein approve <task_id> [--call <call_id>] [--always], \
                     or skein deny <task_id> [--call <call_id>] [--reason <text>]"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

pub async fn approve(args: ApproveArgs) -> ExitCode {
    let answering = Answering {
        nats: args.nats,
        redis: args.redis,
        tenant: args.tenant,
        task_id: args.task_id,
        call_id: args.call_id,
        run: args.run,
        by: args.by,
        answer: Answer {
            approve: true,
            always: args.always || args.always_rule.is_some(),
            always_rule: args.always_rule,
            reason: String::new(),
        },
    };
    finish(answering.run().await)
}

pub async fn deny(args: DenyArgs) -> ExitCode {
    let answering = Answering {
        nats: args.nats,
        redis: args.redis,
        tenant: args.tenant,
        task_id: args.task_id,
        call_id: args.call_id,
        run: args.run,
        by: args.by,
        answer: Answer {
            approve: false,
            always: false,
            always_rule: None,
            reason: args.reason.unwrap_or_default(),
        },
    };
    finish(answering.run().await)
}

fn finish(outcome: Result<String, ApprovalError>) -> ExitCode {
    match outcome {
        Ok(done) => {
            eprintln!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &ApprovalError) -> ExitCode {
    eprintln!("skein: {e}");
    ExitCode::FAILURE
}

/// The tenant's requests, oldest first, each with the answers given so far; a request whose
/// turn resumed while they were read is left out.
async fn list_requests(args: &ApprovalsArgs) -> Result<Vec<ApprovalRequest>, ApprovalError> {
    validate_token("tenant", &args.tenant).map_err(ApprovalError::Invalid)?;
    super::principal::Caller::of_settings(&args.nats)
        .and_then(|caller| caller.check_tenant(&args.tenant, "list the approvals"))
        .map_err(ApprovalError::NotAllowed)?;
    let store = SessionStore::connect(&args.redis).await?;
    let listed = store.approval_requests(&args.tenant).await?;
    let mut requests = Vec::with_capacity(listed.len());
    for request in listed {
        if let Some(full) = store.approval_request(&args.tenant, &request.key()).await? {
            requests.push(full);
        }
    }
    Ok(requests)
}

impl Answering {
    /// Checks the stored request, publishes the decision, and says what it did.
    async fn run(self) -> Result<String, ApprovalError> {
        validate_token("tenant", &self.tenant).map_err(ApprovalError::Invalid)?;
        validate_token("task_id", &self.task_id).map_err(ApprovalError::Invalid)?;
        if let Some(run) = &self.run {
            validate_token("run", run).map_err(ApprovalError::Invalid)?;
        }
        let store = SessionStore::connect(&self.redis).await?;
        let request = self.addressed(&store).await?;
        let answered = targets(&request, self.call_id.as_deref())?;
        let decision = ApprovalDecision {
            v: PROTOCOL_VERSION,
            tenant: self.tenant.clone(),
            task_id: self.task_id.clone(),
            call_id: self.call_id.clone(),
            run: request.run.clone(),
            approve: self.answer.approve,
            always: self.answer.always,
            always_rule: self.answer.always_rule.clone(),
            reason: self.answer.reason.clone(),
            by: decider(
                self.by.as_deref(),
                std::env::var(ENV_LOGIN_USER).ok().as_deref(),
            ),
        };
        let published_at_ms = now_ms();
        let publish = async {
            let client = SkeinClient::connect(&self.nats).await?;
            client
                .bus()
                .publish_decision(&decision)
                .await
                .map_err(ClientError::from)?;
            Ok::<_, ClientError>(client)
        };
        let client = tokio::time::timeout(PUBLISH_TIMEOUT, publish)
            .await
            .map_err(|_| ApprovalError::TimedOut(PUBLISH_TIMEOUT))??;
        let key = approval_key(&self.task_id, request.run.as_deref());
        let recorded = self
            .recorded(&store, &client, &key, &answered, published_at_ms)
            .await?;
        let still_waiting = request.unanswered().count() - answered.len();
        let mut line = confirmation(
            &self.answer,
            &self.task_id,
            &answered,
            self.call_id.is_some(),
            still_waiting,
            request.run.is_some(),
        );
        match recorded {
            Some(note) => {
                line.push('\n');
                line.push_str(&note);
            }
            None => line.push_str(&format!(
                "\nsent; no lead has recorded it within {RECORD_WAIT:?} (it is kept until one does)"
            )),
        }
        Ok(line)
    }

    /// Waits until a lead records the answer (a note naming whom it was recorded for) or refuses
    /// it (its audit record says why), for at most [`RECORD_WAIT`]; `None` when neither happened.
    async fn recorded(
        &self,
        store: &SessionStore,
        client: &SkeinClient,
        key: &str,
        answered: &[&PendingCall],
        since_ms: u64,
    ) -> Result<Option<String>, ApprovalError> {
        // A refusal of this answer: by this CLI's principal when it signs as one.
        let refusals = AuditFilter {
            tenant: Some(self.tenant.clone()),
            task_id: Some(self.task_id.clone()),
            principal: client.bus().own_principal().map(|p| p.name.clone()),
            since_ms: Some(since_ms.saturating_sub(1000)),
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + RECORD_WAIT;
        while tokio::time::Instant::now() < deadline {
            match store.approval_request(&self.tenant, key).await? {
                Some(request) => {
                    let by = answered
                        .iter()
                        .map(|call| request.answers.get(&call.call_id).map(|a| a.by.clone()))
                        .collect::<Option<Vec<_>>>();
                    if let Some(by) = by.and_then(|by| by.into_iter().next()) {
                        return Ok(Some(format!("recorded as {by}")));
                    }
                }
                // Answered, and the turn went on to its end.
                None => return Ok(Some("recorded; the turn has moved on".into())),
            }
            if let Ok(records) = client.bus().audit_records(&refusals, 100).await {
                let refused = records.into_iter().find(|r| {
                    r.verdict == Verdict::Refused && matches!(r.action.as_str(), "approve" | "deny")
                });
                if let Some(refused) = refused {
                    return Err(ApprovalError::Refused {
                        task_id: self.task_id.clone(),
                        reason: refused.reason,
                    });
                }
            }
            tokio::time::sleep(RECORD_POLL).await;
        }
        Ok(None)
    }

    /// The request the decision answers: the run `--run` names; else the task's own turn's when
    /// it waits on the call (or on any, without `--call`); else the one subagent run of the task
    /// that does.
    async fn addressed(&self, store: &SessionStore) -> Result<ApprovalRequest, ApprovalError> {
        let (tenant, task_id) = (self.tenant.as_str(), self.task_id.as_str());
        let missing = || ApprovalError::NoRequest {
            tenant: tenant.to_owned(),
            task_id: task_id.to_owned(),
        };
        if let Some(run) = &self.run {
            let key = approval_key(task_id, Some(run));
            return store
                .approval_request(tenant, &key)
                .await?
                .ok_or_else(missing);
        }
        let waits_on = |request: &ApprovalRequest| {
            self.call_id
                .as_ref()
                .is_none_or(|id| request.calls.iter().any(|c| c.call_id == *id))
        };
        let own = store.approval_request(tenant, task_id).await?;
        if let Some(own) = own.as_ref().filter(|own| waits_on(own)) {
            return Ok(own.clone());
        }
        let runs: Vec<ApprovalRequest> = store
            .approval_requests(tenant)
            .await?
            .into_iter()
            .filter(|r| r.task_id == task_id && r.run.is_some() && waits_on(r))
            .collect();
        match runs.as_slice() {
            [] => own.ok_or_else(missing),
            [run] => store
                .approval_request(tenant, &run.key())
                .await?
                .ok_or_else(missing),
            several => Err(ApprovalError::SeveralRuns {
                task_id: task_id.to_owned(),
                runs: several
                    .iter()
                    .filter_map(|r| r.run.as_deref())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

/// The calls a decision for `call_id` (or for every waiting call) answers, or why it answers
/// none.
fn targets<'a>(
    request: &'a ApprovalRequest,
    call_id: Option<&str>,
) -> Result<Vec<&'a PendingCall>, ApprovalError> {
    let Some(call_id) = call_id else {
        let waiting: Vec<_> = request.unanswered().collect();
        if waiting.is_empty() {
            return Err(ApprovalError::NothingWaiting {
                task_id: request.task_id.clone(),
            });
        }
        return Ok(waiting);
    };
    let Some(call) = request.calls.iter().find(|c| c.call_id == call_id) else {
        let waiting: Vec<_> = request.unanswered().map(|c| c.call_id.as_str()).collect();
        return Err(ApprovalError::UnknownCall {
            task_id: request.task_id.clone(),
            call_id: call_id.to_owned(),
            waiting: if waiting.is_empty() {
                "none".to_owned()
            } else {
                waiting.join(", ")
            },
        });
    };
    if let Some(answer) = request.answers.get(call_id) {
        return Err(ApprovalError::AlreadyAnswered {
            task_id: request.task_id.clone(),
            call_id: call_id.to_owned(),
            tool: call.tool.clone(),
            verdict: if answer.approve { "approved" } else { "denied" },
            by: if answer.by.is_empty() {
                "someone".to_owned()
            } else {
                answer.by.clone()
            },
        });
    }
    Ok(vec![call])
}

/// Who decided: `--by`, else the login name, else [`DEFAULT_DECIDER`] (blank counts as unset).
pub(super) fn decider(by: Option<&str>, login: Option<&str>) -> String {
    [by, login]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|name| !name.is_empty())
        .unwrap_or(DEFAULT_DECIDER)
        .to_owned()
}

/// The line `skein approve` / `skein deny` prints once the decision is published.
fn confirmation(
    answer: &Answer,
    task_id: &str,
    answered: &[&PendingCall],
    one_call: bool,
    still_waiting: usize,
    of_subagent: bool,
) -> String {
    let verb = if answer.approve { "approved" } else { "denied" };
    let mut line = match answered {
        [call] if one_call => format!(
            "{verb} call {} ({}) of task {task_id}",
            call.call_id, call.tool
        ),
        [call] => format!(
            "{verb} the waiting call {} ({}) of task {task_id}",
            call.call_id, call.tool
        ),
        calls => format!(
            "{verb} all {} waiting calls of task {task_id} ({})",
            calls.len(),
            calls
                .iter()
                .map(|c| format!("{} {}", c.call_id, c.tool))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if answer.always {
        line.push_str(", and for the rest of the session");
    }
    if still_waiting == 0 && of_subagent {
        line.push_str("; the subagent run goes on on its worker");
    } else if still_waiting == 0 {
        line.push_str("; the turn resumes on a lead");
    } else {
        let others = if still_waiting == 1 {
            "the other waiting call is".to_owned()
        } else {
            format!("the other {still_waiting} waiting calls are")
        };
        let _ = write!(line, "; the turn resumes once {others} answered");
    }
    line
}

/// A request as `skein approvals` lists it: a line for the task, then one per call.
pub fn describe(request: &ApprovalRequest, now_ms: u64) -> String {
    let mut out = format!(
        "{}  session {} · agent {}",
        request.task_id, request.session, request.agent
    );
    if let Some(run) = &request.run {
        // A subagent run: the calls that led to it from the task's turn, and how to name it.
        let _ = write!(
            out,
            " · subagent run {} (--run {run})",
            request.lineage.join(" → ")
        );
    }
    if !request.user.is_empty() {
        let _ = write!(out, " · user {}", request.user);
    }
    let _ = write!(
        out,
        " · requested {} ago",
        age(now_ms.saturating_sub(request.requested_at_ms))
    );
    match request.expires_at_ms {
        Some(at) if at > now_ms => {
            let _ = write!(out, " · expires in {}", age(at - now_ms));
        }
        Some(at) => {
            let _ = write!(out, " · expired {} ago", age(now_ms - at));
        }
        None => {}
    }
    out.push('\n');
    for call in &request.calls {
        let _ = write!(
            out,
            "  {}  {}  ({})  {}",
            call.call_id,
            call.tool,
            call.rule,
            compact(&call.arguments, ARGUMENTS_WIDTH)
        );
        if let Some(answer) = request.answers.get(&call.call_id) {
            let verdict = if answer.approve { "approved" } else { "denied" };
            let _ = write!(out, "  [{verdict}");
            if !answer.by.is_empty() {
                let _ = write!(out, " by {}", answer.by);
            }
            out.push(']');
        }
        out.push('\n');
    }
    out
}

/// A JSON value on one line, cut to `width` characters (an ellipsis marks the cut).
pub fn compact(value: &serde_json::Value, width: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= width {
        return text;
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A duration in milliseconds, in its two largest units (`45s`, `3m12s`, `2h05m`, `3d04h`).
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::Parser;
    use serde_json::json;
    use skein_common::protocol::ApprovalAnswer;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("skein").chain(args.iter().copied()))
            .map(|cli| cli.command)
    }

    fn call(id: &str, tool: &str, arguments: serde_json::Value) -> PendingCall {
        PendingCall {
            call_id: id.into(),
            tool: tool.into(),
            arguments,
            rule: format!("ask rule {tool}"),
        }
    }

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            v: PROTOCOL_VERSION,
            task_id: "t1".into(),
            tenant: "acme".into(),
            session: "s1".into(),
            user: "bob".into(),
            agent: "assistant".into(),
            calls: vec![
                call(
                    "c1",
                    "write_file",
                    json!({"path": "a.txt", "content": "hi"}),
                ),
                call("c2", "shell", json!({"cmd": "rm -r build"})),
            ],
            run: None,
            lineage: Vec::new(),
            requested_at_ms: 1_000_000,
            expires_at_ms: Some(1_000_000 + 3_600_000),
            answers: BTreeMap::new(),
        }
    }

    fn answered(mut request: ApprovalRequest, call_id: &str, approve: bool) -> ApprovalRequest {
        request.answers.insert(
            call_id.into(),
            ApprovalAnswer {
                approve,
                reason: String::new(),
                by: "alice".into(),
                at_ms: 1_000_500,
            },
        );
        request
    }

    #[test]
    fn approvals_parses_tenant_and_json() {
        let Ok(Command::Approvals(args)) = parse(&["approvals", "--tenant", "acme", "--json"])
        else {
            panic!("`skein approvals --tenant acme --json` did not parse");
        };
        assert_eq!(args.tenant, "acme");
        assert!(args.json);
        let Ok(Command::Approvals(args)) = parse(&["approvals"]) else {
            panic!("`skein approvals` did not parse");
        };
        assert!(!args.json);
        assert!(
            parse(&["approvals", "t1"]).is_err(),
            "approvals takes no task id"
        );
    }

    #[test]
    fn approve_parses_call_always_and_by() {
        let Ok(Command::Approve(args)) = parse(&[
            "approve", "t1", "--call", "c1", "--always", "--tenant", "acme", "--by", "alice",
        ]) else {
            panic!("`skein approve` with every flag did not parse");
        };
        assert_eq!(args.task_id, "t1");
        assert_eq!(args.call_id.as_deref(), Some("c1"));
        assert!(args.always);
        assert_eq!(args.tenant, "acme");
        assert_eq!(args.by.as_deref(), Some("alice"));

        let Ok(Command::Approve(args)) = parse(&["approve", "t1"]) else {
            panic!("`skein approve t1` did not parse");
        };
        assert_eq!(args.call_id, None);
        assert!(!args.always);
        assert_eq!(args.by, None);
        assert!(parse(&["approve"]).is_err(), "the task id is required");
        assert!(
            parse(&["approve", "t1", "--reason", "x"]).is_err(),
            "approve takes no reason"
        );
    }

    #[test]
    fn deny_parses_call_reason_and_by() {
        let Ok(Command::Deny(args)) = parse(&[
            "deny",
            "t1",
            "--call",
            "c2",
            "--reason",
            "not in prod",
            "--by",
            "alice",
        ]) else {
            panic!("`skein deny` with every flag did not parse");
        };
        assert_eq!(args.task_id, "t1");
        assert_eq!(args.call_id.as_deref(), Some("c2"));
        assert_eq!(args.reason.as_deref(), Some("not in prod"));
        assert_eq!(args.by.as_deref(), Some("alice"));
        assert!(parse(&["deny"]).is_err(), "the task id is required");
        assert!(
            parse(&["deny", "t1", "--always"]).is_err(),
            "deny has no --always"
        );
    }

    #[test]
    fn describe_lists_the_task_and_each_call() {
        let now = 1_000_000 + 192_000;
        let text = describe(&answered(request(), "c2", false), now);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            "t1  session s1 · agent assistant · user bob · requested 3m12s ago · expires in 56m48s"
        );
        assert_eq!(
            lines[1],
            r#"  c1  write_file  (ask rule write_file)  {"content":"hi","path":"a.txt"}"#
        );
        assert_eq!(
            lines[2],
            r#"  c2  shell  (ask rule shell)  {"cmd":"rm -r build"}  [denied by alice]"#
        );
    }

    #[test]
    fn describe_says_when_a_request_expired_or_never_does() {
        let mut request = request();
        let text = describe(&request, 1_000_000 + 3_600_000 + 5_000);
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.ends_with(" · expired 5s ago")),
            "{text}"
        );
        request.expires_at_ms = None;
        let text = describe(&request, 1_000_000 + 2 * 86_400_000 + 3 * 3_600_000);
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.ends_with(" · requested 2d03h ago")),
            "{text}"
        );
    }

    #[test]
    fn long_arguments_are_cut_to_the_width() {
        let long = json!({"content": "x".repeat(500)});
        let shown = compact(&long, ARGUMENTS_WIDTH);
        assert_eq!(shown.chars().count(), ARGUMENTS_WIDTH);
        assert!(shown.starts_with(r#"{"content":"xxx"#) && shown.ends_with('…'));
        let short = json!({"path": "é.txt"});
        assert_eq!(compact(&short, ARGUMENTS_WIDTH), r#"{"path":"é.txt"}"#);
        // The cut counts characters, so it never splits one.
        assert_eq!(compact(&short, 11), r#"{"path":"é…"#);
    }

    #[test]
    fn targets_of_a_decision() {
        let all = targets(&request(), None).map(|calls| calls.len());
        assert!(matches!(all, Ok(2)));
        let one = answered(request(), "c1", true);
        let rest = targets(&one, None).map(|calls| calls[0].call_id.clone());
        assert_eq!(rest.ok().as_deref(), Some("c2"));
        assert!(matches!(
            targets(&one, Some("c1")),
            Err(ApprovalError::AlreadyAnswered { verdict: "approved", ref by, .. }) if by == "alice"
        ));
        let unknown = targets(&one, Some("c9"));
        assert!(
            matches!(&unknown, Err(ApprovalError::UnknownCall { waiting, .. }) if waiting == "c2"),
            "{unknown:?}"
        );
        let both = answered(one, "c2", false);
        assert!(matches!(
            targets(&both, None),
            Err(ApprovalError::NothingWaiting { .. })
        ));
    }

    #[test]
    fn confirmation_names_the_calls_and_what_happens_next() {
        let request = request();
        let approve = Answer {
            approve: true,
            always: false,
            always_rule: None,
            reason: String::new(),
        };
        let first = [&request.calls[0]];
        assert_eq!(
            confirmation(&approve, "t1", &first, true, 1, false),
            "approved call c1 (write_file) of task t1; \
             the turn resumes once the other waiting call is answered"
        );
        let both = [&request.calls[0], &request.calls[1]];
        assert_eq!(
            confirmation(&approve, "t1", &both, false, 0, false),
            "approved all 2 waiting calls of task t1 (c1 write_file, c2 shell); \
             the turn resumes on a lead"
        );
        let deny = Answer {
            approve: false,
            always: false,
            always_rule: None,
            reason: "no".into(),
        };
        assert_eq!(
            confirmation(&deny, "t1", &[&request.calls[1]], true, 0, false),
            "denied call c2 (shell) of task t1; the turn resumes on a lead"
        );
        assert_eq!(
            confirmation(&deny, "t1", &[&request.calls[1]], true, 0, true),
            "denied call c2 (shell) of task t1; the subagent run goes on on its worker"
        );
    }

    #[test]
    fn decider_prefers_the_flag_then_the_login() {
        assert_eq!(decider(Some("alice"), Some("bob")), "alice");
        assert_eq!(decider(None, Some("bob")), "bob");
        assert_eq!(decider(Some("  "), None), "cli");
        assert_eq!(decider(None, None), "cli");
    }
}
