//! A task's events folded into a response of OpenAI's Responses API: the stream events a client
//! sees (`response.created` … `response.completed`, each with its `sequence_number`) and the
//! output items the response ends with.
//!
//! The fold is a function of the task's events in their stream order, so a response read again
//! later (`GET /v1/responses/{id}`, or its stream resumed with `starting_after`) gets the same
//! items with the same sequence numbers as the client that watched it live.
//!
//! Items: the lead's model text becomes `message` items (one per stretch of text between tool
//! calls), and every tool or subagent call the lead's turn made a `skein_tool_call` item — a type
//! of Skein's own, never `function_call`, which a client would try to run itself. Subagents'
//! own events stay inside their calls.
//!
//! A model attempt that failed after it streamed text and was made again (`output_discarded`)
//! leaves its message item `incomplete` with its text emptied (`response.output_item.done` says
//! so); the text of the attempt that answers goes into a new message item. A stream cannot take
//! back the `response.output_text.delta`s already sent: a client that assembles text from them
//! drops the text of an item that ends `incomplete` and empty, as the final response does.

use serde_json::{json, Value};
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_common::store::responses::ResponseRecord;

use crate::gateway::approvals::{CallRef, LEAD};

/// A response being built from its task's events.
pub(crate) struct ResponseFold {
    record: ResponseRecord,
    next_sequence: u64,
    output: Vec<Value>,
    /// The message item taking the model's text, by its index in `output`.
    open_message: Option<usize>,
    status: &'static str,
    /// The task's events seen.
    events: u64,
    /// The calls asked about at the stop the response ends at (tool, arguments).
    asked: Vec<(CallRef, String, Value)>,
    /// The response ended at calls waiting for approval.
    stopped: bool,
}

impl ResponseFold {
    pub fn new(record: ResponseRecord) -> Self {
        Self {
            record,
            next_sequence: 0,
            output: Vec::new(),
            open_message: None,
            status: "queued",
            events: 0,
            asked: Vec::new(),
            stopped: false,
        }
    }

    /// The response as it stands.
    pub fn response(&self, result: Option<&FinalResult>) -> Value {
        let record = &self.record;
        let (status, error, incomplete) = match result {
            None => (self.status, Value::Null, Value::Null),
            Some(result) => ended(result),
        };
        json!({
            "id": record.id,
            "object": "response",
            "created_at": record.created_at,
            "status": status,
            "background": record.background,
            "model": record.agent,
            "instructions": record.instructions,
            "previous_response_id": record.previous_response_id,
            "metadata": record.metadata,
            "output": self.output,
            "usage": result.map(usage),
            "error": error,
            "incomplete_details": incomplete,
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "text": { "format": { "type": "text" } },
            "store": true,
            "temperature": null,
            "top_p": null,
        })
    }

    /// `response.created` and `response.in_progress`: how every stream of a response starts.
    pub fn opening(&mut self) -> Vec<Value> {
        let created = self.emit(
            "response.created",
            json!({ "response": self.response(None) }),
        );
        self.status = "in_progress";
        let in_progress = self.emit(
            "response.in_progress",
            json!({ "response": self.response(None) }),
        );
        vec![created, in_progress]
    }

    /// The stream events `event` makes (none for most kinds and for subagents' events, nor for
    /// the task's events before those this response goes on from). Calls asked about gather until
    /// another event comes (or none, `settle`): the response ends at them.
    pub fn event(&mut self, event: &TurnEvent) -> Vec<Value> {
        self.events += 1;
        if self.events <= self.record.after_events {
            return Vec::new();
        }
        if let EventKind::ApprovalRequested {
            call_id,
            tool,
            arguments,
            ..
        } = &event.event
        {
            let call = CallRef {
                source: event.source.clone(),
                call_id: call_id.clone(),
            };
            self.asked.push((call, tool.clone(), arguments.clone()));
            return Vec::new();
        }
        if !self.asked.is_empty() {
            return self.settle();
        }
        if event.source != LEAD {
            return Vec::new();
        }
        match &event.event {
            EventKind::ModelDelta { text } if !text.is_empty() => {
                let mut events = Vec::new();
                let index = match self.open_message {
                    Some(index) => index,
                    None => self.open_message_item(&mut events),
                };
                if let Some(part) = self.output[index]["content"][0]["text"].as_str() {
                    self.output[index]["content"][0]["text"] = json!(format!("{part}{text}"));
                }
                let item_id = self.output[index]["id"].clone();
                events.push(self.emit(
                    "response.output_text.delta",
                    json!({ "item_id": item_id, "output_index": index, "content_index": 0, "delta": text, "logprobs": [] }),
                ));
                events
            }
            EventKind::OutputDiscarded { .. } => self.discard_message(),
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } => {
                let mut events = self.close_message(None);
                let item = json!({
                    "type": "skein_tool_call",
                    "id": format!("stc_{call_id}"),
                    "call_id": call_id,
                    "name": tool,
                    "arguments": arguments.to_string(),
                    "status": "in_progress",
                });
                self.output.push(item.clone());
                let index = self.output.len() - 1;
                events.push(self.emit(
                    "response.output_item.added",
                    json!({ "output_index": index, "item": item }),
                ));
                events
            }
            EventKind::ToolFinished {
                call_id,
                ok,
                worker_id,
                preview,
                ..
            } => {
                let Some(index) = self
                    .output
                    .iter()
                    .rposition(|item| item["call_id"].as_str() == Some(call_id.as_str()))
                else {
                    return Vec::new();
                };
                let item = &mut self.output[index];
                item["status"] = json!(if *ok { "completed" } else { "failed" });
                item["output"] = json!(preview);
                item["worker_id"] = json!(worker_id);
                let item = item.clone();
                vec![self.emit(
                    "response.output_item.done",
                    json!({ "output_index": index, "item": item }),
                )]
            }
            _ => Vec::new(),
        }
    }

    /// The events that end the response: the open message closed with the answer's text (or
    /// one added for an answer no text was streamed for), then `response.completed`, `.failed`
    /// or `.incomplete`.
    pub fn finish(&mut self, result: &FinalResult) -> Vec<Value> {
        let answer = result.answer.as_deref().filter(|a| !a.is_empty());
        let mut events = Vec::new();
        if let Some(answer) = answer {
            if self.open_message.is_none() {
                let ends_with_answer = self.output.last().is_some_and(|item| {
                    item["type"] == "message" && item["content"][0]["text"] == answer
                });
                if !ends_with_answer {
                    self.open_message_item(&mut events);
                }
            }
        }
        events.extend(self.close_message(answer));
        let (status, _, _) = ended(result);
        let kind = match status {
            "completed" => "response.completed",
            "incomplete" => "response.incomplete",
            _ => "response.failed",
        };
        let response = self.response(Some(result));
        events.push(self.emit(kind, json!({ "response": response })));
        events
    }

    /// The response ends at the calls waiting for a person, as OpenAI's responses do at MCP calls
    /// that need approval: an `mcp_approval_request` item each (its id answers it, in an
    /// `mcp_approval_response` input item of a response that continues this one), then
    /// `response.completed`.
    pub fn settle(&mut self) -> Vec<Value> {
        let mut events = self.close_message(None);
        for (call, tool, arguments) in std::mem::take(&mut self.asked) {
            let item = json!({
                "type": "mcp_approval_request",
                "id": super::approvals::request_id_of(&call),
                "server_label": "skein",
                "name": tool,
                "arguments": arguments.to_string(),
            });
            self.output.push(item.clone());
            let index = self.output.len() - 1;
            events.push(self.emit(
                "response.output_item.added",
                json!({ "output_index": index, "item": item }),
            ));
            events.push(self.emit(
                "response.output_item.done",
                json!({ "output_index": index, "item": item }),
            ));
        }
        self.status = "completed";
        let response = self.response(None);
        events.push(self.emit("response.completed", json!({ "response": response })));
        self.stopped = true;
        events
    }

    /// Opens a message item for the model's text; returns its index.
    fn open_message_item(&mut self, events: &mut Vec<Value>) -> usize {
        let index = self.output.len();
        let item = json!({
            "type": "message",
            "id": format!("msg_{}_{index}", self.record.id),
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        });
        self.output.push(item.clone());
        self.open_message = Some(index);
        events.push(self.emit(
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        ));
        let part = json!({ "type": "output_text", "text": "", "annotations": [] });
        self.output[index]["content"] = json!([part.clone()]);
        let item_id = self.output[index]["id"].clone();
        events.push(self.emit(
            "response.content_part.added",
            json!({ "item_id": item_id, "output_index": index, "content_index": 0, "part": part }),
        ));
        index
    }

    /// Ends the open message as `incomplete` and empty: its text was a discarded attempt's.
    fn discard_message(&mut self) -> Vec<Value> {
        let Some(index) = self.open_message else {
            return Vec::new();
        };
        let mut events = self.close_message(Some(""));
        self.output[index]["status"] = json!("incomplete");
        if let Some(done) = events.last_mut() {
            done["item"]["status"] = json!("incomplete");
        }
        events
    }

    /// Closes the open message, with `text` as its whole text when given.
    fn close_message(&mut self, text: Option<&str>) -> Vec<Value> {
        let Some(index) = self.open_message.take() else {
            return Vec::new();
        };
        if let Some(text) = text {
            self.output[index]["content"][0]["text"] = json!(text);
        }
        self.output[index]["status"] = json!("completed");
        let item = self.output[index].clone();
        let item_id = item["id"].clone();
        let part = item["content"][0].clone();
        vec![
            self.emit(
                "response.output_text.done",
                json!({ "item_id": item_id, "output_index": index, "content_index": 0, "text": part["text"], "logprobs": [] }),
            ),
            self.emit(
                "response.content_part.done",
                json!({ "item_id": item_id, "output_index": index, "content_index": 0, "part": part }),
            ),
            self.emit(
                "response.output_item.done",
                json!({ "output_index": index, "item": item }),
            ),
        ]
    }

    fn emit(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.next_sequence);
        self.next_sequence += 1;
        body
    }
}

impl crate::gateway::follow::Fold for ResponseFold {
    fn opening(&mut self) -> Vec<Value> {
        ResponseFold::opening(self)
    }

    fn event(&mut self, event: &TurnEvent) -> Vec<Value> {
        ResponseFold::event(self, event)
    }

    fn stopped(&self) -> bool {
        self.stopped
    }

    fn waiting(&self) -> bool {
        !self.asked.is_empty() && !self.stopped
    }

    fn settle(&mut self) -> Vec<Value> {
        ResponseFold::settle(self)
    }

    fn finish(&mut self, result: &FinalResult) -> Vec<Value> {
        ResponseFold::finish(self, result)
    }

    /// An `error` stream event (the response's run goes on, or could not start).
    fn failure(&mut self, code: &str, message: String) -> Vec<Value> {
        vec![json!({ "type": "error", "code": code, "message": message, "param": null })]
    }
}

/// A finished run's status, error and incomplete details in the Responses API's terms.
fn ended(result: &FinalResult) -> (&'static str, Value, Value) {
    let failure = || {
        let (code, message) = match &result.failure {
            Some(failure) => (failure.kind.as_str().to_owned(), failure.message.clone()),
            None => (
                result.status.as_str().to_owned(),
                format!("the run ended {}", result.status.as_str()),
            ),
        };
        json!({ "code": code, "message": message })
    };
    match result.status {
        TurnStatus::Completed if result.limit_reached => (
            "incomplete",
            Value::Null,
            json!({ "reason": "max_output_tokens" }),
        ),
        TurnStatus::Completed => ("completed", Value::Null, Value::Null),
        TurnStatus::BudgetExhausted => (
            "incomplete",
            Value::Null,
            json!({ "reason": "max_output_tokens" }),
        ),
        TurnStatus::Cancelled => ("cancelled", failure(), Value::Null),
        _ => ("failed", failure(), Value::Null),
    }
}

fn usage(result: &FinalResult) -> Value {
    let (input, output) = (result.usage.prompt_tokens, result.usage.completion_tokens);
    json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": input.saturating_add(output),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_common::protocol::message::Usage;

    fn record() -> ResponseRecord {
        ResponseRecord {
            id: "resp_1".into(),
            session: "s".into(),
            agent: "assistant".into(),
            created_at: 1,
            previous_response_id: None,
            instructions: None,
            metadata: Default::default(),
            background: false,
            task_id: None,
            after_events: 0,
        }
    }

    fn event(source: &str, kind: EventKind) -> TurnEvent {
        TurnEvent {
            v: 1,
            task_id: "resp_1".into(),
            source: source.into(),
            seq: 0,
            at_ms: 0,
            event: kind,
        }
    }

    fn result(answer: &str) -> FinalResult {
        serde_json::from_value(json!({
            "v": 1, "task_id": "resp_1", "tenant": "t", "session": "s", "status": "completed",
            "answer": answer, "iterations": 2, "limit_reached": false,
            "usage": Usage { prompt_tokens: 10, completion_tokens: 5, ..Usage::default() },
        }))
        .expect("a final result")
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?"))
            .collect()
    }

    #[test]
    fn a_turns_text_and_calls_become_numbered_events_and_items() {
        let mut fold = ResponseFold::new(record());
        let mut events = fold.opening();
        let delta = |text: &str| {
            event(
                LEAD,
                EventKind::ModelDelta {
                    text: text.to_owned(),
                },
            )
        };
        events.extend(fold.event(&delta("Let me ")));
        events.extend(fold.event(&delta("look.")));
        events.extend(fold.event(&event(
            LEAD,
            EventKind::ToolStarted {
                call_id: "c1".into(),
                tool: "read_file".into(),
                arguments: json!({ "path": "a" }),
                arguments_ref: None,
                permission: None,
                rule: String::new(),
            },
        )));
        // A subagent's text stays inside its call.
        events.extend(fold.event(&event(
            "subagent:c1",
            EventKind::ModelDelta { text: "x".into() },
        )));
        events.extend(fold.event(&event(
            LEAD,
            EventKind::ToolFinished {
                call_id: "c1".into(),
                tool: "read_file".into(),
                ok: true,
                worker_id: "w1".into(),
                preview: "contents".into(),
                duration_ms: 5,
                attempts: 1,
            },
        )));
        events.extend(fold.event(&delta("Done.")));
        events.extend(fold.finish(&result("Done.")));
        assert_eq!(
            types(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        let done = &events[events.len() - 1]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["usage"]["total_tokens"], 15);
        let output = done["output"].as_array().expect("output");
        assert_eq!(output.len(), 3);
        assert_eq!(output[0]["content"][0]["text"], "Let me look.");
        assert_eq!(
            (output[1]["type"].as_str(), output[1]["status"].as_str()),
            (Some("skein_tool_call"), Some("completed"))
        );
        assert_eq!(output[1]["arguments"], r#"{"path":"a"}"#);
        assert_eq!(output[2]["content"][0]["text"], "Done.");
    }

    #[test]
    fn a_response_stops_at_a_call_waiting_for_approval_and_the_answering_one_goes_on_after_it() {
        let asked = event(
            "lead",
            EventKind::ApprovalRequested {
                call_id: "c1".into(),
                tool: "deploy".into(),
                arguments: json!({ "env": "prod" }),
                arguments_ref: None,
                rule: "ask rule deploy".into(),
                expires_at_ms: None,
            },
        );
        let events = [
            event(
                "lead",
                EventKind::ModelDelta {
                    text: "checking".into(),
                },
            ),
            asked,
            event(
                "lead",
                EventKind::ModelDelta {
                    text: "deployed".into(),
                },
            ),
        ];
        let mut first = ResponseFold::new(record());
        let mut out = first.opening();
        for e in &events {
            if crate::gateway::follow::Fold::stopped(&first) {
                break;
            }
            out.extend(first.event(e));
        }
        let last = out.last().expect("events");
        assert_eq!(last["type"], "response.completed");
        let output = &last["response"]["output"];
        assert_eq!(output[0]["content"][0]["text"], "checking");
        assert_eq!(output[1]["type"], "mcp_approval_request");
        assert_eq!(output[1]["id"], "mcpr_c1");
        assert_eq!(output[1]["arguments"], r#"{"env":"prod"}"#);

        // It answered when the task held two events: the text and the call it asked about.
        let mut answering = record();
        answering.after_events = 2;
        let mut second = ResponseFold::new(answering);
        second.opening();
        let mut texts = Vec::new();
        for e in &events {
            for out in second.event(e) {
                if out["type"] == "response.output_text.delta" {
                    texts.push(out["delta"].clone());
                }
            }
        }
        assert_eq!(
            texts,
            [json!("deployed")],
            "only what came after the answered call"
        );
        assert!(!crate::gateway::follow::Fold::stopped(&second));
    }

    #[test]
    fn a_discarded_attempts_text_ends_its_item_incomplete_and_empty() {
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
        let mut fold = ResponseFold::new(record());
        let mut events = fold.opening();
        events.extend(fold.event(&delta("The answer is")));
        let at_discard = events.len();
        events.extend(fold.event(&discarded));
        events.extend(fold.event(&delta("42.")));
        events.extend(fold.finish(&result("42.")));

        let dropped = &events[at_discard..at_discard + 3];
        assert_eq!(
            types(dropped),
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done"
            ]
        );
        assert_eq!(dropped[0]["text"], "");
        assert_eq!(dropped[2]["item"]["status"], "incomplete");
        assert_eq!(dropped[2]["item"]["content"][0]["text"], "");
        let done = &events[events.len() - 1]["response"];
        let output = done["output"].as_array().expect("output");
        assert_eq!(output.len(), 2);
        assert_eq!(
            (
                output[0]["status"].as_str(),
                output[0]["content"][0]["text"].as_str()
            ),
            (Some("incomplete"), Some(""))
        );
        assert_eq!(
            (
                output[1]["status"].as_str(),
                output[1]["content"][0]["text"].as_str()
            ),
            (Some("completed"), Some("42."))
        );
    }

    #[test]
    fn an_answer_with_no_streamed_text_still_ends_in_a_message() {
        let mut fold = ResponseFold::new(record());
        let mut events = fold.opening();
        events.extend(fold.finish(&result("the answer")));
        let done = &events[events.len() - 1]["response"];
        assert_eq!(done["output"][0]["content"][0]["text"], "the answer");
        assert_eq!(done["output"][0]["status"], "completed");
        let mut failed = result("");
        failed.status = TurnStatus::Failed;
        let mut fold = ResponseFold::new(record());
        let events = fold.finish(&failed);
        assert_eq!(types(&events), ["response.failed"]);
        assert_eq!(events[0]["response"]["status"], "failed");
        assert_eq!(events[0]["response"]["error"]["code"], "failed");
    }
}
