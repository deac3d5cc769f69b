//! A run's events folded into the stream parts of LangGraph's run stream: `metadata` first (the
//! run id), then per the stream modes asked for `values` (the thread's messages after each step;
//! at the end of a run with a structured answer, also its parsed `output`),
//! `updates` (what each node added: `agent` for the model's message, `tools` for a call's result,
//! `__interrupt__` for a call waiting for a person), `messages` (`messages-tuple`: each piece of
//! the model's text with its metadata) and `custom` (Skein's own events as they are), then
//! `error` when the run failed, and `end` last.
//!
//! A run stops at an interrupt: the calls its task asked a person about and no later event shows
//! answered (`Fold::waiting`, settled by the follower when nothing more comes; at once when a
//! later run resumed it). A run that resumes its task starts after the events the task held when
//! it answered (`after_events`); events before that are folded into the messages but not shown.
//! The parts are numbered, and the same events give the same parts, so a stream read again
//! resumes after the `Last-Event-ID` its client saw.
//!
//! A model attempt that failed after it streamed and was made again (`output_discarded`) leaves
//! nothing in the step's message: the `agent` update and the `values` carry the answering
//! attempt's text only. The `messages` chunks already sent cannot be taken back; they carry the
//! same message id, so the whole message of the next `updates` or `values` part replaces them.

use serde_json::{json, Value};
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};

use super::messages;
use crate::gateway::approvals::{CallRef, LEAD};
use crate::gateway::follow::Fold;

/// The stream modes served.
pub(super) const MODES: [&str; 4] = ["values", "updates", "messages-tuple", "custom"];

/// Which parts a stream carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Modes {
    pub values: bool,
    pub updates: bool,
    pub messages: bool,
    pub custom: bool,
}

impl Modes {
    /// Reads `stream_mode` (a mode or a list; `values` when absent).
    pub fn parse(asked: Option<&Value>) -> Result<Self, String> {
        let names: Vec<&str> = match asked {
            None | Some(Value::Null) => vec!["values"],
            Some(Value::String(mode)) => vec![mode.as_str()],
            Some(Value::Array(modes)) => modes
                .iter()
                .map(|m| m.as_str().ok_or("stream_mode lists mode names"))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("stream_mode is a mode or a list of modes".into()),
        };
        let mut modes = Modes::default();
        for name in names {
            match name {
                "values" => modes.values = true,
                "updates" => modes.updates = true,
                "messages-tuple" => modes.messages = true,
                "custom" => modes.custom = true,
                other => {
                    return Err(format!(
                        "stream_mode {other:?} is not served; served: {}",
                        MODES.join(", ")
                    ))
                }
            }
        }
        Ok(modes)
    }

    /// The modes' names, as a run records them.
    pub fn names(self) -> Vec<String> {
        [
            (self.values, "values"),
            (self.updates, "updates"),
            (self.messages, "messages-tuple"),
            (self.custom, "custom"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| name.to_owned())
        .collect()
    }

    /// The modes a run recorded; a run that recorded none (a background run asked for none)
    /// streams every mode but `custom`.
    pub fn of_run(names: &[String]) -> Self {
        let names: Vec<Value> = names.iter().map(|n| Value::String(n.clone())).collect();
        match Modes::parse(Some(&Value::Array(names))) {
            Ok(modes) if modes != Modes::default() => modes,
            _ => Modes {
                values: true,
                updates: true,
                messages: true,
                custom: false,
            },
        }
    }
}

/// Who a fold is for.
pub(super) struct RunShape {
    pub run_id: String,
    pub thread_id: String,
    pub modes: Modes,
    /// The thread's messages before the run, as shown.
    pub before: Vec<Value>,
    /// The user's input that started the run's task.
    pub input: String,
    /// The task's events before this run.
    pub after_events: u64,
    /// The run ends at its first interrupt (a later run resumed it: what follows is that run's),
    /// rather than when no event shows its calls answered (`settle`, after the follower's pause).
    pub ends_at_interrupt: bool,
}

/// A run's stream being built from its task's events.
pub(super) struct RunFold {
    shape: RunShape,
    next_id: u64,
    /// The thread's messages as the run leaves them so far.
    messages: Vec<Value>,
    /// The model's message of the step under way: its text, calls and whether it was shown.
    text: String,
    calls: Vec<Value>,
    shown: bool,
    /// Calls of the step not yet answered.
    pending: usize,
    /// The task's events seen.
    events: u64,
    /// Calls asked about and not answered yet, as interrupts: where the run ends unless an event
    /// shows them answered.
    asked: Vec<(CallRef, Value)>,
    stopped: bool,
    /// The run's structured answer, parsed (the final result's `output`), once it ended.
    output: Option<Value>,
}

impl RunFold {
    pub fn new(shape: RunShape) -> Self {
        let mut messages = shape.before.clone();
        let id = format!("{}-{}", shape.thread_id, messages.len());
        messages.push(json!({ "type": "human", "content": shape.input, "id": id }));
        RunFold {
            shape,
            next_id: 0,
            messages,
            text: String::new(),
            calls: Vec::new(),
            shown: false,
            pending: 0,
            events: 0,
            asked: Vec::new(),
            stopped: false,
            output: None,
        }
    }

    /// The values the run left when it stopped at an interrupt, or ended: the thread's messages
    /// and, for a structured answer, its parsed `output`.
    fn values(&self) -> Value {
        match &self.output {
            Some(output) => json!({ "messages": self.messages, "output": output }),
            None => json!({ "messages": self.messages }),
        }
    }

    /// True for the task's events before the run began.
    fn skipping(&self) -> bool {
        self.shape.after_events > 0 && self.events <= self.shape.after_events
    }

    /// A part, unless the run has not begun (its task's events before the interrupt it resumes).
    fn part(&mut self, out: &mut Vec<Value>, event: &str, data: Value) {
        if !self.skipping() {
            self.push(out, event, data);
        }
    }

    fn push(&mut self, out: &mut Vec<Value>, event: &str, data: Value) {
        self.next_id += 1;
        out.push(json!({ "event": event, "data": data, "id": self.next_id }));
    }

    fn ai_id(&self) -> String {
        format!("{}-{}", self.shape.thread_id, self.messages.len())
    }

    /// Starts the next step's message once the last one was shown.
    fn next_step(&mut self) {
        if self.shown {
            self.text.clear();
            self.calls.clear();
            self.shown = false;
        }
    }

    /// Shows the step's model message (appended to the messages, an `agent` update).
    fn show_ai(&mut self, out: &mut Vec<Value>, text: Option<&str>) {
        if self.shown {
            return;
        }
        let text = text.unwrap_or(&self.text).to_owned();
        if text.is_empty() && self.calls.is_empty() {
            return;
        }
        let ai = messages::ai(&text, self.ai_id(), &self.calls);
        self.messages.push(ai.clone());
        self.shown = true;
        if self.shape.modes.updates {
            self.part(out, "updates", json!({ "agent": { "messages": [ai] } }));
        }
    }

    fn show_values(&mut self, out: &mut Vec<Value>) {
        if self.shape.modes.values {
            let values = self.values();
            self.part(out, "values", values);
        }
    }

    fn metadata(&self) -> Value {
        json!({ "run_id": self.shape.run_id, "thread_id": self.shape.thread_id, "attempt": 1 })
    }
}

impl Fold for RunFold {
    fn opening(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        let metadata = self.metadata();
        self.push(&mut out, "metadata", metadata);
        self.show_values(&mut out);
        out
    }

    fn event(&mut self, event: &TurnEvent) -> Vec<Value> {
        self.events += 1;
        let asks = matches!(event.event, EventKind::ApprovalRequested { .. });
        if self.shape.ends_at_interrupt && !self.asked.is_empty() && !asks {
            // What follows the interrupt is the run that resumed it.
            return self.settle();
        }
        let mut out = Vec::new();
        if self.shape.modes.custom {
            let data = serde_json::to_value(event).unwrap_or(Value::Null);
            self.part(&mut out, "custom", data);
        }
        let lead = event.source == LEAD;
        // A call it waited on was answered (elsewhere: the console, `skein approve`, A2A): the
        // run goes on past it.
        if let EventKind::ApprovalResolved { call_id, .. }
        | EventKind::ToolStarted { call_id, .. } = &event.event
        {
            self.asked
                .retain(|(asked, _)| !(asked.source == event.source && asked.call_id == *call_id));
        }
        match &event.event {
            EventKind::ModelDelta { text } if lead => {
                self.next_step();
                self.text.push_str(text);
                if self.shape.modes.messages {
                    let chunk =
                        json!({ "type": "AIMessageChunk", "content": text, "id": self.ai_id() });
                    let metadata = json!({
                        "langgraph_node": "agent",
                        "run_id": self.shape.run_id,
                        "thread_id": self.shape.thread_id,
                    });
                    self.part(&mut out, "messages", json!([chunk, metadata]));
                }
            }
            EventKind::OutputDiscarded { .. } if lead => {
                self.next_step();
                self.text.clear();
            }
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } if lead => {
                self.next_step();
                if !self.calls.iter().any(|c| c["id"] == call_id.as_str()) {
                    self.calls
                        .push(messages::tool_call(call_id, tool, arguments));
                }
                self.pending += 1;
            }
            EventKind::ToolFinished {
                call_id,
                tool,
                ok,
                preview,
                ..
            } if lead => {
                self.show_ai(&mut out, None);
                let id = format!("{}-{}", self.shape.thread_id, self.messages.len());
                let message = json!({
                    "type": "tool", "content": preview, "tool_call_id": call_id, "name": tool,
                    "status": if *ok { "success" } else { "error" }, "id": id,
                });
                self.messages.push(message.clone());
                if self.shape.modes.updates {
                    self.part(
                        &mut out,
                        "updates",
                        json!({ "tools": { "messages": [message] } }),
                    );
                }
                self.pending = self.pending.saturating_sub(1);
                if self.pending == 0 {
                    self.show_values(&mut out);
                }
            }
            EventKind::ApprovalRequested {
                call_id,
                tool,
                arguments,
                rule,
                expires_at_ms,
                ..
            } => {
                if lead {
                    self.next_step();
                    if !self.calls.iter().any(|c| c["id"] == call_id.as_str()) {
                        self.calls
                            .push(messages::tool_call(call_id, tool, arguments));
                    }
                }
                if self.skipping() {
                    return out;
                }
                let call = CallRef {
                    source: event.source.clone(),
                    call_id: call_id.clone(),
                };
                let interrupt = messages::interrupt(&call, tool, arguments, rule, *expires_at_ms);
                self.asked.push((call, interrupt));
                return out;
            }
            _ => {}
        }
        out
    }

    fn waiting(&self) -> bool {
        !self.asked.is_empty() && !self.stopped
    }

    /// The run ends at the calls it waits on: the model's message, the interrupts, `end`.
    fn settle(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        self.show_ai(&mut out, None);
        let interrupts: Vec<Value> = std::mem::take(&mut self.asked)
            .into_iter()
            .map(|(_, interrupt)| interrupt)
            .collect();
        if self.shape.modes.updates {
            self.part(&mut out, "updates", json!({ "__interrupt__": interrupts }));
        }
        if self.shape.modes.values {
            let mut values = self.values();
            values["__interrupt__"] = json!(interrupts);
            self.part(&mut out, "values", values);
        }
        self.push(&mut out, "end", Value::Null);
        self.stopped = true;
        out
    }

    fn stopped(&self) -> bool {
        self.stopped
    }

    fn finish(&mut self, result: &FinalResult) -> Vec<Value> {
        let mut out = Vec::new();
        if self.shape.modes.custom {
            let data = json!({ "type": "final", "result": result });
            self.part(&mut out, "custom", data);
        }
        self.next_step();
        let answer = result.answer.as_deref().filter(|a| !a.is_empty());
        if result.status == TurnStatus::Completed || result.status == TurnStatus::BudgetExhausted {
            self.show_ai(&mut out, answer);
            self.output.clone_from(&result.output);
            self.show_values(&mut out);
        } else {
            let (kind, message) = match &result.failure {
                Some(failure) => (format!("{:?}", failure.kind), failure.message.clone()),
                None => (result.status.as_str().to_owned(), String::new()),
            };
            let status = result.status.as_str();
            self.push(
                &mut out,
                "error",
                json!({ "error": kind, "message": message, "status": status }),
            );
        }
        self.push(&mut out, "end", Value::Null);
        out
    }

    fn failure(&mut self, code: &str, message: String) -> Vec<Value> {
        let mut out = Vec::new();
        self.push(
            &mut out,
            "error",
            json!({ "error": code, "message": message }),
        );
        self.push(&mut out, "end", Value::Null);
        out
    }
}

#[cfg(test)]
mod tests {
    use skein_common::protocol::message::Usage;
    use skein_common::protocol::PROTOCOL_VERSION;

    use super::*;

    fn shape(after_events: u64, modes: Modes) -> RunShape {
        RunShape {
            run_id: "r1".into(),
            thread_id: "t1".into(),
            modes,
            before: vec![json!({ "type": "human", "content": "earlier", "id": "t1-0" })],
            input: "deploy it".to_owned(),
            after_events,
            ends_at_interrupt: true,
        }
    }

    fn all() -> Modes {
        Modes {
            values: true,
            updates: true,
            messages: true,
            custom: false,
        }
    }

    fn event(source: &str, kind: EventKind) -> TurnEvent {
        TurnEvent {
            v: PROTOCOL_VERSION,
            task_id: "task".into(),
            source: source.into(),
            seq: 0,
            at_ms: 0,
            event: kind,
        }
    }

    fn asked() -> TurnEvent {
        event(
            LEAD,
            EventKind::ApprovalRequested {
                call_id: "c1".into(),
                tool: "deploy".into(),
                arguments: json!({ "env": "prod" }),
                arguments_ref: None,
                rule: "ask rule deploy".into(),
                expires_at_ms: None,
            },
        )
    }

    fn turn() -> Vec<TurnEvent> {
        vec![
            event(
                LEAD,
                EventKind::ModelDelta {
                    text: "let me ".into(),
                },
            ),
            asked(),
            event(
                LEAD,
                EventKind::ToolStarted {
                    call_id: "c1".into(),
                    tool: "deploy".into(),
                    arguments: json!({ "env": "prod" }),
                    arguments_ref: None,
                    permission: None,
                    rule: String::new(),
                },
            ),
            event(
                LEAD,
                EventKind::ToolFinished {
                    call_id: "c1".into(),
                    tool: "deploy".into(),
                    ok: true,
                    worker_id: "w".into(),
                    preview: "deployed".into(),
                    duration_ms: 5,
                    attempts: 1,
                },
            ),
            event(
                LEAD,
                EventKind::ModelDelta {
                    text: "done".into(),
                },
            ),
        ]
    }

    fn result(status: TurnStatus) -> FinalResult {
        FinalResult {
            v: PROTOCOL_VERSION,
            task_id: "task".into(),
            tenant: "acme".into(),
            session: "t1".into(),
            status,
            answer: Some("done".into()),
            answer_ref: None,
            output: None,
            output_ref: false,
            failure: None,
            iterations: 2,
            limit_reached: false,
            usage: Usage::default(),
            trace_id: None,
            spent: None,
        }
    }

    fn names(parts: &[Value]) -> Vec<&str> {
        parts
            .iter()
            .map(|p| p["event"].as_str().expect("present"))
            .collect()
    }

    #[test]
    fn a_run_stops_at_its_interrupt_and_the_resuming_run_takes_up_after_it() {
        let mut first = RunFold::new(shape(0, all()));
        let mut parts = first.opening();
        for event in turn() {
            if first.stopped() {
                break;
            }
            parts.extend(first.event(&event));
        }
        assert_eq!(
            names(&parts),
            ["metadata", "values", "messages", "updates", "updates", "values", "end"]
        );
        let ids: Vec<u64> = parts
            .iter()
            .map(|p| p["id"].as_u64().expect("present"))
            .collect();
        assert_eq!(ids, (1..=7).collect::<Vec<_>>(), "numbered in order");
        assert_eq!(parts[4]["data"]["__interrupt__"][0]["id"], "c1");
        assert_eq!(
            parts[5]["data"]["__interrupt__"][0]["value"]["tool"],
            "deploy"
        );
        assert_eq!(parts[5]["data"]["messages"][1]["content"], "deploy it");
        assert_eq!(parts[5]["data"]["messages"][2]["tool_calls"][0]["id"], "c1");

        // It answered when the task held two events: the text and the call it asked about.
        let mut resumed = RunFold::new(shape(2, all()));
        let mut parts = resumed.opening();
        for event in turn() {
            parts.extend(resumed.event(&event));
        }
        parts.extend(resumed.finish(&result(TurnStatus::Completed)));
        assert_eq!(
            names(&parts),
            ["metadata", "updates", "updates", "values", "messages", "updates", "values", "end"],
            "nothing before the interrupt is shown again"
        );
        let last = &parts
            .iter()
            .rev()
            .find(|p| p["event"] == "values")
            .expect("values")["data"]["messages"];
        let kinds: Vec<&str> = last
            .as_array()
            .expect("present")
            .iter()
            .map(|m| m["type"].as_str().expect("present"))
            .collect();
        assert_eq!(kinds, ["human", "human", "ai", "tool", "ai"]);
        assert_eq!(last[1]["content"], "deploy it");
        assert_eq!(last[2]["content"], "let me ");
        assert_eq!(last[3]["content"], "deployed");
        assert_eq!(last[4]["content"], "done");
        assert_eq!(last[4]["id"], "t1-4", "numbered as the thread will be");
    }

    #[test]
    fn a_run_whose_calls_were_answered_elsewhere_goes_on_and_one_left_waiting_settles() {
        let events = turn();
        let mut answered = RunFold::new(RunShape {
            ends_at_interrupt: false,
            ..shape(0, all())
        });
        let mut parts = answered.opening();
        parts.extend(answered.event(&events[0]));
        parts.extend(answered.event(&events[1]));
        assert!(answered.waiting(), "asked: it may stop here");
        for event in &events[2..] {
            parts.extend(answered.event(event));
        }
        assert!(!answered.waiting(), "the call ran: it was answered");
        parts.extend(answered.finish(&result(TurnStatus::Completed)));
        assert!(!parts
            .iter()
            .any(|p| p["data"].get("__interrupt__").is_some()));
        assert_eq!(names(&parts).last(), Some(&"end"));

        let mut left = RunFold::new(RunShape {
            ends_at_interrupt: false,
            ..shape(0, all())
        });
        left.opening();
        left.event(&events[0]);
        assert!(
            left.event(&events[1]).is_empty(),
            "nothing shown until it settles"
        );
        let settled = left.settle();
        assert_eq!(names(&settled), ["updates", "updates", "values", "end"]);
        assert_eq!(settled[1]["data"]["__interrupt__"][0]["id"], "c1");
        assert!(left.stopped());
    }

    #[test]
    fn a_discarded_attempts_text_is_left_out_of_the_steps_message() {
        let delta = |text: &str| {
            event(
                LEAD,
                EventKind::ModelDelta {
                    text: text.to_owned(),
                },
            )
        };
        let discarded = event(
            LEAD,
            EventKind::OutputDiscarded {
                failure: skein_common::protocol::Failure::new(
                    skein_common::protocol::FailureKind::ModelFailed,
                    "stream broke",
                ),
            },
        );
        let events = turn();
        let mut fold = RunFold::new(RunShape {
            ends_at_interrupt: false,
            ..shape(0, all())
        });
        let mut parts = fold.opening();
        for event in [delta("let us"), discarded, delta("let me ")]
            .iter()
            .chain(&events[2..])
        {
            parts.extend(fold.event(event));
        }
        parts.extend(fold.finish(&result(TurnStatus::Completed)));
        let agent = parts
            .iter()
            .find_map(|p| p["data"]["agent"]["messages"][0].as_object())
            .expect("the step's message is shown");
        assert_eq!(agent["content"], "let me ");
        let last = &parts
            .iter()
            .rev()
            .find(|p| p["event"] == "values")
            .expect("values")["data"]["messages"];
        assert_eq!(last[2]["content"], "let me ");
        assert_eq!(last[4]["content"], "done");
    }

    #[test]
    fn a_structured_answer_is_in_the_last_values_and_an_invalid_one_is_an_error() {
        let events = turn();
        let mut fold = RunFold::new(RunShape {
            ends_at_interrupt: false,
            ..shape(0, all())
        });
        let mut parts = fold.opening();
        for event in &events {
            parts.extend(fold.event(event));
        }
        let mut structured = result(TurnStatus::Completed);
        structured.answer = Some(r#"{"n": 2}"#.into());
        structured.output = Some(json!({"n": 2}));
        parts.extend(fold.finish(&structured));
        let values: Vec<&Value> = parts
            .iter()
            .filter(|p| p["event"] == "values")
            .map(|p| &p["data"])
            .collect();
        assert!(values[..values.len() - 1]
            .iter()
            .all(|v| v.get("output").is_none()));
        assert_eq!(values.last().map(|v| &v["output"]), Some(&json!({"n": 2})));

        let mut fold = RunFold::new(shape(0, all()));
        let mut parts = fold.opening();
        let mut invalid = result(TurnStatus::InvalidOutput);
        invalid.failure = Some(skein_common::protocol::Failure::new(
            skein_common::protocol::FailureKind::InvalidOutput,
            "/n: expected integer",
        ));
        parts.extend(fold.finish(&invalid));
        assert_eq!(names(&parts), ["metadata", "values", "error", "end"]);
        assert_eq!(parts[2]["data"]["status"], "invalid_output");
        assert_eq!(parts[2]["data"]["message"], "/n: expected integer");
    }

    #[test]
    fn a_failed_run_ends_with_an_error_and_modes_are_checked() {
        let mut fold = RunFold::new(shape(
            0,
            Modes::parse(Some(&json!("updates"))).expect("present"),
        ));
        let mut parts = fold.opening();
        parts.extend(fold.finish(&result(TurnStatus::Cancelled)));
        assert_eq!(names(&parts), ["metadata", "error", "end"]);
        assert_eq!(parts[1]["data"]["status"], "cancelled");
        assert!(Modes::parse(Some(&json!(["values", "debug"])))
            .expect_err("refused")
            .contains("debug"));
        assert_eq!(
            Modes::parse(Some(&json!(["messages-tuple", "custom"]))).expect("present"),
            Modes {
                values: false,
                updates: false,
                messages: true,
                custom: true
            }
        );
    }
}
