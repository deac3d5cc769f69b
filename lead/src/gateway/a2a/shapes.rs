//! What A2A's JSON-RPC messages look like, in both versions the gateway speaks. Every value is
//! built once, in 1.0's shape (protobuf JSON: camelCase, `TASK_STATE_…` and `ROLE_…` enum names,
//! a stream's events wrapped as `{"task": …}`, `{"statusUpdate": …}`, `{"artifactUpdate": …}`);
//! [`reply`] turns it into what a request of either version answers. A 0.3 request (`message/send`
//! …) gets 0.3's shapes: objects told apart by `kind` (`task`, `message`, `status-update`,
//! `artifact-update`), states lowercase (`input-required`), roles `user`/`agent`, parts
//! `{"kind": "text", "text": …}`, results bare, and `final: true` on a stream's last status update.
//!
//! A message is read in either version's shape (text parts only), whatever the method's version.

use serde_json::{json, Value};
use skein_common::protocol::{FinalResult, PendingCall, TurnStatus};
use skein_common::store::responses::ResponseRecord;

use super::RpcError;

/// The protocol version a request named its method in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    /// A2A 1.0 (`SendMessage`, `GetTask`, …).
    V1,
    /// A2A 0.3 (`message/send`, `tasks/get`, …).
    V03,
}

/// What a reply carries, which decides how it is wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// A task answering a message, or opening a stream (1.0 wraps it as `{"task": …}`).
    SentTask,
    /// A task read or cancelled (bare in both versions).
    Task,
    /// A stream's status update; `last` ends the stream.
    Status { last: bool },
    /// A stream's artifact update.
    Artifact,
}

/// A task's state, as 1.0 names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Canceled,
    Failed,
    Rejected,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Submitted => "TASK_STATE_SUBMITTED",
            State::Working => "TASK_STATE_WORKING",
            State::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            State::Completed => "TASK_STATE_COMPLETED",
            State::Canceled => "TASK_STATE_CANCELED",
            State::Failed => "TASK_STATE_FAILED",
            State::Rejected => "TASK_STATE_REJECTED",
        }
    }

    fn of(result: &FinalResult) -> State {
        match result.status {
            TurnStatus::Completed | TurnStatus::BudgetExhausted => State::Completed,
            TurnStatus::Cancelled => State::Canceled,
            TurnStatus::Rejected => State::Rejected,
            _ => State::Failed,
        }
    }
}

/// A task's status: its state, with the agent's message when it has one.
pub(super) fn status(state: State, message: Option<Value>) -> Value {
    let mut status = json!({ "state": state.name(), "timestamp": now() });
    if let Some(message) = message {
        status["message"] = message;
    }
    status
}

/// A task with `status`, its answer as the `answer` artifact when it has one.
pub(super) fn task(record: &ResponseRecord, status: Value, answer: Option<&str>) -> Value {
    let mut task = json!({
        "id": record.id,
        "contextId": record.session,
        "status": status,
        "metadata": { "skill": record.agent },
    });
    if let Some(answer) = answer {
        task["artifacts"] = json!([answer_artifact(record, answer)]);
    }
    task
}

/// A task in `state`, without a message.
pub(super) fn plain_task(record: &ResponseRecord, state: State) -> Value {
    task(record, status(state, None), None)
}

/// The status a run's end gives its task: its state, the answer (or why it failed) as the
/// agent's message.
pub(super) fn ended_status(record: &ResponseRecord, result: &FinalResult) -> Value {
    let state = State::of(result);
    match (&result.answer, &result.failure) {
        (Some(answer), _) if !answer.is_empty() => {
            status(state, Some(agent_message(record, "agent", answer)))
        }
        (_, Some(failure)) => status(
            state,
            Some(agent_message(record, "agent", &failure.message)),
        ),
        _ => status(state, None),
    }
}

/// The task a run's end leaves.
pub(super) fn ended_task(record: &ResponseRecord, result: &FinalResult) -> Value {
    let answer = result.answer.as_deref().filter(|a| !a.is_empty());
    task(record, ended_status(record, result), answer)
}

/// The status of a task whose `calls` wait for a person: `TASK_STATE_INPUT_REQUIRED`, with a
/// message naming each call (tool, arguments, the rule that asked) and how to answer; the calls
/// are also in its metadata (`approvals`), for programs.
pub(super) fn input_required(record: &ResponseRecord, calls: &[PendingCall]) -> Value {
    let mut text = String::from("Waiting for your approval before running:\n");
    for call in calls {
        text.push_str(&format!(
            "- {} {} ({})\n",
            call.tool, call.arguments, call.rule
        ));
    }
    text.push_str(
        "Answer \"approve\" or \"deny\" (a reason may follow) in a message with this task's id.",
    );
    let first = calls.first().map_or("", |c| c.call_id.as_str());
    let mut message = agent_message(record, &format!("asks-{first}"), &text);
    message["metadata"] = json!({ "approvals": calls.iter().map(|c| json!({
        "callId": c.call_id, "tool": c.tool, "arguments": c.arguments, "rule": c.rule,
    })).collect::<Vec<_>>() });
    status(State::InputRequired, Some(message))
}

/// A message of the agent in the task (`{task}-{suffix}` its id).
pub(super) fn agent_message(record: &ResponseRecord, suffix: &str, text: &str) -> Value {
    json!({
        "messageId": format!("{}-{suffix}", record.id),
        "contextId": record.session,
        "taskId": record.id,
        "role": "ROLE_AGENT",
        "parts": [ { "text": text } ],
    })
}

fn answer_artifact(record: &ResponseRecord, text: &str) -> Value {
    json!({ "artifactId": format!("{}-answer", record.id), "name": "answer", "parts": [ { "text": text } ] })
}

/// A stream's status update of the task.
pub(super) fn status_update(record: &ResponseRecord, status: Value) -> Value {
    json!({ "taskId": record.id, "contextId": record.session, "status": status })
}

/// A stream's piece of the answer artifact (`append`: after an earlier piece).
pub(super) fn answer_update(record: &ResponseRecord, text: &str, append: bool) -> Value {
    json!({
        "taskId": record.id,
        "contextId": record.session,
        "artifact": answer_artifact(record, text),
        "append": append,
        "lastChunk": false,
    })
}

/// `value` (built in 1.0's shape, as `what`) as a request in `dialect` is answered with.
pub(super) fn reply(dialect: Dialect, what: Reply, value: Value) -> Value {
    match (dialect, what) {
        (Dialect::V1, Reply::SentTask) => json!({ "task": value }),
        (Dialect::V1, Reply::Task) => value,
        (Dialect::V1, Reply::Status { .. }) => json!({ "statusUpdate": value }),
        (Dialect::V1, Reply::Artifact) => json!({ "artifactUpdate": value }),
        (Dialect::V03, Reply::SentTask | Reply::Task) => {
            let mut task = value;
            task["kind"] = json!("task");
            convert(&mut task, "status", status_v03);
            if let Some(artifacts) = task.get_mut("artifacts").and_then(Value::as_array_mut) {
                artifacts.iter_mut().for_each(artifact_v03);
            }
            if let Some(history) = task.get_mut("history").and_then(Value::as_array_mut) {
                history.iter_mut().for_each(message_v03);
            }
            task
        }
        (Dialect::V03, Reply::Status { last }) => {
            let mut update = value;
            update["kind"] = json!("status-update");
            update["final"] = json!(last);
            convert(&mut update, "status", status_v03);
            update
        }
        (Dialect::V03, Reply::Artifact) => {
            let mut update = value;
            update["kind"] = json!("artifact-update");
            convert(&mut update, "artifact", artifact_v03);
            update
        }
    }
}

fn convert(value: &mut Value, key: &str, f: fn(&mut Value)) {
    if let Some(inner) = value.get_mut(key) {
        f(inner);
    }
}

fn status_v03(status: &mut Value) {
    if let Some(state) = status.get("state").and_then(Value::as_str) {
        // `TASK_STATE_INPUT_REQUIRED` is `input-required`.
        let state = state
            .strip_prefix("TASK_STATE_")
            .unwrap_or(state)
            .to_ascii_lowercase()
            .replace('_', "-");
        status["state"] = json!(state);
    }
    convert(status, "message", message_v03);
}

fn message_v03(message: &mut Value) {
    message["kind"] = json!("message");
    let role = match message.get("role").and_then(Value::as_str) {
        Some("ROLE_USER") => "user",
        _ => "agent",
    };
    message["role"] = json!(role);
    convert(message, "parts", parts_v03);
}

fn artifact_v03(artifact: &mut Value) {
    convert(artifact, "parts", parts_v03);
}

fn parts_v03(parts: &mut Value) {
    for part in parts.as_array_mut().into_iter().flatten() {
        if part.get("text").is_some() {
            part["kind"] = json!("text");
        }
    }
}

/// A message a client sent, read from either version's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Incoming {
    pub text: String,
    /// The task it continues (an answer to a task that waits).
    pub task_id: Option<String>,
    pub context_id: Option<String>,
    /// The agent its `metadata.skill` (or the request's) names.
    pub skill: Option<String>,
    /// `configuration.returnImmediately` (1.0) or `configuration.blocking: false` (0.3).
    pub return_immediately: bool,
}

/// Reads `params.message`: a user's (`ROLE_USER` or `user`) message of text parts (`{"text"}`,
/// with or without `"kind": "text"`).
pub(super) fn incoming(params: &Value) -> Result<Incoming, RpcError> {
    let message = params
        .get("message")
        .ok_or_else(|| RpcError::invalid("params.message is missing"))?;
    if !matches!(
        message.get("role").and_then(Value::as_str),
        Some("ROLE_USER" | "user")
    ) {
        return Err(RpcError::invalid(
            "the message's role must be ROLE_USER (0.3: user)",
        ));
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .filter(|parts| !parts.is_empty())
        .ok_or_else(|| RpcError::invalid("the message has no parts"))?;
    let mut text = String::new();
    for part in parts {
        let kind = part.get("kind").and_then(Value::as_str).unwrap_or("text");
        match part.get("text").and_then(Value::as_str) {
            Some(piece) if kind == "text" => text.push_str(piece),
            _ => return Err(RpcError::invalid("only text parts are accepted")),
        }
    }
    let string = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    let configuration = params.get("configuration");
    Ok(Incoming {
        text,
        task_id: string(message.get("taskId")),
        context_id: string(message.get("contextId")),
        skill: string(
            message
                .pointer("/metadata/skill")
                .or_else(|| params.pointer("/metadata/skill")),
        ),
        return_immediately: configuration
            .and_then(|c| c.get("returnImmediately"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
            || configuration
                .and_then(|c| c.get("blocking"))
                .and_then(Value::as_bool)
                == Some(false),
    })
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ResponseRecord {
        ResponseRecord {
            id: "a2a-1".into(),
            session: "ctx".into(),
            agent: "assistant".into(),
            created_at: 0,
            previous_response_id: None,
            instructions: None,
            metadata: Default::default(),
            background: false,
            task_id: None,
            after_events: 0,
        }
    }

    fn call() -> PendingCall {
        PendingCall {
            call_id: "c1".into(),
            tool: "slow_effect".into(),
            arguments: json!({ "key": "k" }),
            rule: "ask rule slow_effect".into(),
        }
    }

    #[test]
    fn a_sent_task_is_wrapped_in_1_0_and_bare_with_its_kind_in_0_3() {
        let task = task(&record(), status(State::Completed, None), Some("hi"));
        let v1 = reply(Dialect::V1, Reply::SentTask, task.clone());
        assert_eq!(v1["task"]["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(
            v1["task"]["artifacts"][0]["parts"][0],
            json!({ "text": "hi" })
        );

        let v03 = reply(Dialect::V03, Reply::SentTask, task);
        assert_eq!(v03["kind"], "task");
        assert_eq!(v03["id"], "a2a-1");
        assert_eq!(v03["status"]["state"], "completed");
        assert_eq!(
            v03["artifacts"][0]["parts"][0],
            json!({ "kind": "text", "text": "hi" })
        );
    }

    #[test]
    fn a_waiting_task_names_its_calls_and_reads_input_required_in_0_3() {
        let status = input_required(&record(), &[call()]);
        assert_eq!(status["state"], "TASK_STATE_INPUT_REQUIRED");
        let text = status["message"]["parts"][0]["text"]
            .as_str()
            .expect("text");
        assert!(
            text.contains("slow_effect {\"key\":\"k\"} (ask rule slow_effect)"),
            "{text}"
        );
        assert!(text.contains("\"approve\" or \"deny\""), "{text}");
        assert_eq!(
            status["message"]["metadata"]["approvals"][0]["callId"],
            "c1"
        );

        let update = status_update(&record(), status);
        let v03 = reply(Dialect::V03, Reply::Status { last: true }, update);
        assert_eq!(v03["kind"], "status-update");
        assert_eq!(v03["final"], true);
        assert_eq!(v03["status"]["state"], "input-required");
        assert_eq!(v03["status"]["message"]["role"], "agent");
        assert_eq!(v03["status"]["message"]["kind"], "message");
        assert_eq!(v03["status"]["message"]["parts"][0]["kind"], "text");
    }

    #[test]
    fn stream_events_carry_their_kind_in_0_3_and_their_wrapper_in_1_0() {
        let update = answer_update(&record(), "piece", true);
        assert_eq!(
            reply(Dialect::V1, Reply::Artifact, update.clone())["artifactUpdate"]["append"],
            true
        );
        let v03 = reply(Dialect::V03, Reply::Artifact, update);
        assert_eq!(v03["kind"], "artifact-update");
        assert_eq!(v03["artifact"]["parts"][0]["kind"], "text");
        let working = status_update(&record(), status(State::Working, None));
        let v03 = reply(Dialect::V03, Reply::Status { last: false }, working.clone());
        assert_eq!(
            (v03["final"].clone(), v03["status"]["state"].clone()),
            (json!(false), json!("working"))
        );
        assert!(
            reply(Dialect::V1, Reply::Status { last: true }, working)["statusUpdate"]
                .get("final")
                .is_none()
        );
    }

    #[test]
    fn a_message_is_read_in_either_shape() {
        let v1 = json!({ "message": {
            "messageId": "m", "role": "ROLE_USER", "parts": [ { "text": "hi" } ],
            "taskId": "a2a-1", "contextId": "ctx",
        }, "configuration": { "returnImmediately": true } });
        let read = incoming(&v1).expect("1.0 message");
        assert_eq!(read.text, "hi");
        assert_eq!(read.task_id.as_deref(), Some("a2a-1"));
        assert!(read.return_immediately);

        let v03 = json!({ "message": {
            "kind": "message", "messageId": "m", "role": "user",
            "parts": [ { "kind": "text", "text": "hi " }, { "kind": "text", "text": "there" } ],
            "metadata": { "skill": "assistant" },
        }, "configuration": { "blocking": false } });
        let read = incoming(&v03).expect("0.3 message");
        assert_eq!(read.text, "hi there");
        assert_eq!(read.skill.as_deref(), Some("assistant"));
        assert!(read.return_immediately);
        let blocking = json!({ "message": { "role": "user", "parts": [ { "kind": "text", "text": "x" } ] },
            "configuration": { "blocking": true } });
        assert!(!incoming(&blocking).expect("read").return_immediately);

        for refused in [
            json!({ "message": { "role": "ROLE_AGENT", "parts": [ { "text": "x" } ] } }),
            json!({ "message": { "role": "user", "parts": [] } }),
            json!({ "message": { "role": "user", "parts": [ { "kind": "data", "data": {} } ] } }),
            json!({ "message": { "role": "user", "parts": [ { "kind": "file", "text": "x" } ] } }),
        ] {
            assert!(incoming(&refused).is_err(), "{refused}");
        }
    }
}
