//! [`ScriptedModel`]: a model provider that replays a scenario file, so the cluster runs offline
//! and tests are deterministic. This file owns the scenario format, its validation, and the rule
//! that turns a conversation into the next scripted answer.
//!
//! The provider is stateless: the next answer is derived only from the request's conversation, so
//! any worker process can serve any step of any session.
//!
//! # Scenario format
//!
//! ```json
//! {
//!   "description": "optional text",
//!   "agents": {
//!     "assistant": { "turns": [ { "steps": [
//!         { "tool_calls": [ { "name": "write_file", "arguments": { "path": "notes.txt", "content": "hi" } } ] },
//!         { "answer": "Saved. Observations: {{observations}}" }
//!     ] } ] },
//!     "*": { "turns": [ { "steps": [ { "answer": "I am {{agent}} and you said: {{input}}" } ] } ] }
//!   }
//! }
//! ```
//!
//! - `agents` maps an agent name to its script; `"*"` serves every agent without its own.
//! - A script is a list of `turns`; turn *n* answers the *n*-th user message. Later user messages
//!   replay the last turn.
//! - A turn is a list of `steps`; step *k* answers after *k-1* assistant messages since the last
//!   user message (that is, after each round of tool results). Past the end, the last step repeats.
//! - A step has exactly one of `tool_calls` (a non-empty list of `{name, arguments}`; `arguments`
//!   defaults to `{}` and is not checked, so a scenario can script invalid calls), `answer`
//!   (text) or `output` (any JSON value: a structured answer, answered as its JSON text; the
//!   runtime checks it against the agent's output schema). The last step of every turn is an
//!   answer or an output.
//! - A repair request (the user message the runtime sends when an answer does not match the
//!   agent's output schema, see `agent::structured`) starts no new turn: the step after the
//!   answer that failed answers it, as after a round of tool results.
//! - When the runtime asks without offering tools (a final summary), a tool-call step is replaced
//!   by the turn's last answer.
//! - Templates, in answers and in the string values of tool-call arguments and outputs: `{{input}}` (the last
//!   user message), `{{previous_input}}` (the user message before it, or empty),
//!   `{{observations}}` (the tool results since the last user message, one per line), `{{turn}}`
//!   (1-based turn number), `{{agent}}` (the asking agent) and `{{images}}` (how many images the
//!   request's messages show). Unknown placeholders stay as they are; substituted text is not
//!   expanded again.
//! - Images: the scripted model takes them (inline, by URL or still by reference: it reads
//!   none) and only counts them, for `{{images}}`; a scenario asserts what it was shown through
//!   the answer.
//! - Tool-call ids are `call_t{turn}_s{step}_{i}` (1-based turn and step, 0-based position).
//! - Unknown keys are rejected, so a misspelt key fails at load time rather than silently.
//!
//! Token usage is a rough word count (prompt: words of all messages; completion: words of the
//! answer or of the calls), not a tokenizer's.

use std::collections::BTreeMap;
use std::path::Path;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use super::{ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse};
use crate::agent::structured::is_repair_request;
use crate::protocol::message::{Message, Role, ToolCall, Usage};

/// The script name that serves every agent without a script of its own.
pub const ANY_AGENT: &str = "*";

/// A provider replaying a validated scenario.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    description: Option<String>,
    scripts: BTreeMap<String, Script>,
}

#[derive(Debug, Clone)]
struct Script {
    turns: Vec<Turn>,
}

/// A validated turn: at least one step, the last an answer.
#[derive(Debug, Clone)]
struct Turn {
    steps: Vec<Step>,
}

#[derive(Debug, Clone)]
enum Step {
    ToolCalls(Vec<ScriptedCall>),
    Answer(String),
    /// A structured answer: the value, answered as its JSON text.
    Output(Value),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

// The scenario as written, before validation.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    description: Option<String>,
    agents: BTreeMap<String, ScriptFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    turns: Vec<TurnFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnFile {
    steps: Vec<StepFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepFile {
    #[serde(default)]
    tool_calls: Option<Vec<ScriptedCall>>,
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    output: Option<Value>,
}

impl ScriptedModel {
    /// Loads and validates a scenario from its JSON text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let file: ScenarioFile = serde_json::from_str(text)
            .map_err(|error| ModelError::Scenario(format!("invalid scenario JSON: {error}")))?;
        if file.agents.is_empty() {
            return Err(ModelError::Scenario(
                "the scenario has no agents".to_owned(),
            ));
        }
        let scripts = file
            .agents
            .into_iter()
            .map(|(agent, script)| Ok((agent.clone(), validate_script(&agent, script)?)))
            .collect::<Result<_, ModelError>>()?;
        Ok(Self {
            description: file.description.filter(|text| !text.trim().is_empty()),
            scripts,
        })
    }

    /// Loads and validates a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            ModelError::Scenario(format!("cannot read {}: {error}", path.display()))
        })?;
        Self::from_json(&text).map_err(|error| match error {
            ModelError::Scenario(message) => {
                ModelError::Scenario(format!("{}: {message}", path.display()))
            }
            other => other,
        })
    }

    /// `scripted`, followed by the scenario's description if it has one.
    pub fn label(&self) -> String {
        match &self.description {
            Some(description) => format!("scripted: {description}"),
            None => "scripted".to_owned(),
        }
    }

    /// The scripted answer to `request`.
    fn respond(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let script = self
            .scripts
            .get(&request.agent)
            .or_else(|| self.scripts.get(ANY_AGENT))
            .ok_or_else(|| {
                ModelError::Scenario(format!(
                    "no script for agent {:?} and no {ANY_AGENT:?} script",
                    request.agent
                ))
            })?;
        let conversation = Conversation::read(&request.messages);
        let turn_index = conversation
            .user_messages
            .saturating_sub(1)
            .min(script.turns.len() - 1);
        let turn = &script.turns[turn_index];
        let step_index = conversation
            .assistant_messages_since_user
            .min(turn.steps.len() - 1);
        let vars = TemplateVars {
            input: conversation.input.to_owned(),
            previous_input: conversation.previous_input.to_owned(),
            observations: conversation.observations.join("\n"),
            turn: (turn_index + 1).to_string(),
            agent: request.agent.clone(),
            images: request
                .messages
                .iter()
                .map(|message| message.images.len())
                .sum::<usize>()
                .to_string(),
        };
        tracing::debug!(
            agent = %request.agent,
            turn = turn_index + 1,
            step = step_index + 1,
            "scripted step"
        );
        let prompt_tokens = request
            .messages
            .iter()
            .map(|message| word_count(&message.content))
            .sum();
        let (message, finish_reason, completion_tokens) = match &turn.steps[step_index] {
            Step::ToolCalls(calls) if !request.tools.is_empty() => {
                let tool_calls: Vec<ToolCall> = calls
                    .iter()
                    .enumerate()
                    .map(|(position, call)| ToolCall {
                        id: format!("call_t{}_s{}_{position}", turn_index + 1, step_index + 1),
                        name: call.name.clone(),
                        arguments: render_strings(&call.arguments, &vars),
                    })
                    .collect();
                let words = tool_calls
                    .iter()
                    .map(|call| word_count(&call.name) + word_count(&call.arguments.to_string()))
                    .sum();
                let message = Message {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls,
                    tool_call_id: None,
                    reasoning: None,
                    reasoning_signature: None,
                    images: Vec::new(),
                };
                (message, "tool_calls", words)
            }
            Step::ToolCalls(_) => {
                // Asked without tools (a final summary): give the turn's own answer.
                let answer = turn
                    .final_answer()
                    .map_or_else(String::new, |step| step.text(&vars));
                let words = word_count(&answer);
                (Message::assistant(answer), "stop", words)
            }
            step => {
                let answer = step.text(&vars);
                let words = word_count(&answer);
                (Message::assistant(answer), "stop", words)
            }
        };
        Ok(ModelResponse {
            message,
            finish_reason: Some(finish_reason.to_owned()),
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                ..Usage::default()
            },
        })
    }
}

impl ModelClient for ScriptedModel {
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        self.respond(&request)
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<BoxStream<'static, Result<ModelChunk, ModelError>>, ModelError> {
        let response = self.respond(&request)?;
        let mut chunks: Vec<Result<ModelChunk, ModelError>> = response
            .message
            .content
            .split_inclusive(char::is_whitespace)
            .map(|word| Ok(ModelChunk::Delta(word.to_owned())))
            .collect();
        chunks.push(Ok(ModelChunk::Done(response)));
        Ok(futures::stream::iter(chunks).boxed())
    }
}

impl Turn {
    /// The turn's last step: validation makes it an answer or an output.
    fn final_answer(&self) -> Option<&Step> {
        self.steps
            .last()
            .filter(|step| !matches!(step, Step::ToolCalls(_)))
    }
}

impl Step {
    /// The text an answer or output step answers with (empty for calls).
    fn text(&self, vars: &TemplateVars) -> String {
        match self {
            Step::Answer(template) => render(template, vars),
            Step::Output(value) => render_strings(value, vars).to_string(),
            Step::ToolCalls(_) => String::new(),
        }
    }
}

fn validate_script(agent: &str, script: ScriptFile) -> Result<Script, ModelError> {
    if script.turns.is_empty() {
        return Err(ModelError::Scenario(format!(
            "agent {agent:?} has no turns"
        )));
    }
    let turns = script
        .turns
        .into_iter()
        .enumerate()
        .map(|(turn_index, turn)| validate_turn(agent, turn_index + 1, turn))
        .collect::<Result<_, _>>()?;
    Ok(Script { turns })
}

fn validate_turn(agent: &str, turn_number: usize, turn: TurnFile) -> Result<Turn, ModelError> {
    let at = |step: usize| format!("agent {agent:?}, turn {turn_number}, step {step}");
    if turn.steps.is_empty() {
        return Err(ModelError::Scenario(format!(
            "agent {agent:?}, turn {turn_number} has no steps"
        )));
    }
    let mut steps = Vec::with_capacity(turn.steps.len());
    for (step_index, step) in turn.steps.into_iter().enumerate() {
        let step_number = step_index + 1;
        let step = match (step.tool_calls, step.answer, step.output) {
            (Some(calls), None, None) => {
                if calls.is_empty() {
                    return Err(ModelError::Scenario(format!(
                        "{}: tool_calls is empty",
                        at(step_number)
                    )));
                }
                if calls.iter().any(|call| call.name.trim().is_empty()) {
                    return Err(ModelError::Scenario(format!(
                        "{}: a tool call has no name",
                        at(step_number)
                    )));
                }
                Step::ToolCalls(calls)
            }
            (None, Some(answer), None) => Step::Answer(answer),
            (None, None, Some(output)) => Step::Output(output),
            _ => {
                return Err(ModelError::Scenario(format!(
                    "{}: a step needs exactly one of tool_calls, answer or output",
                    at(step_number)
                )))
            }
        };
        steps.push(step);
    }
    if matches!(steps.last(), Some(Step::ToolCalls(_)) | None) {
        return Err(ModelError::Scenario(format!(
            "{}: the last step of a turn must be an answer or an output",
            at(steps.len())
        )));
    }
    Ok(Turn { steps })
}

/// What the scripted model reads from a conversation.
struct Conversation<'a> {
    user_messages: usize,
    assistant_messages_since_user: usize,
    input: &'a str,
    previous_input: &'a str,
    observations: Vec<&'a str>,
}

impl<'a> Conversation<'a> {
    fn read(messages: &'a [Message]) -> Self {
        let user_positions: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, message)| message.role == Role::User && !is_repair_request(message))
            .map(|(position, _)| position)
            .collect();
        let content_at = |position: Option<&usize>| {
            position.map_or("", |&position| messages[position].content.as_str())
        };
        let since_last_user = match user_positions.last() {
            Some(&position) => &messages[position + 1..],
            None => messages,
        };
        let previous_user = user_positions
            .len()
            .checked_sub(2)
            .map(|i| &user_positions[i]);
        Self {
            user_messages: user_positions.len(),
            assistant_messages_since_user: since_last_user
                .iter()
                .filter(|message| message.role == Role::Assistant)
                .count(),
            input: content_at(user_positions.last()),
            previous_input: content_at(previous_user),
            observations: since_last_user
                .iter()
                .filter(|message| message.role == Role::Tool)
                .map(|message| message.content.as_str())
                .collect(),
        }
    }
}

struct TemplateVars {
    input: String,
    previous_input: String,
    observations: String,
    turn: String,
    agent: String,
    images: String,
}

impl TemplateVars {
    fn lookup(&self, name: &str) -> Option<&str> {
        match name {
            "input" => Some(&self.input),
            "previous_input" => Some(&self.previous_input),
            "observations" => Some(&self.observations),
            "turn" => Some(&self.turn),
            "agent" => Some(&self.agent),
            "images" => Some(&self.images),
            _ => None,
        }
    }
}

/// Replaces `{{name}}` placeholders in one pass; unknown ones are kept.
fn render(template: &str, vars: &TemplateVars) -> String {
    let mut rendered = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        rendered.push_str(&rest[..open]);
        let after_open = &rest[open + 2..];
        let Some(close) = after_open.find("}}") else {
            rendered.push_str(&rest[open..]);
            return rendered;
        };
        let placeholder = &rest[open..open + 2 + close + 2];
        match vars.lookup(after_open[..close].trim()) {
            Some(value) => rendered.push_str(value),
            None => rendered.push_str(placeholder),
        }
        rest = &after_open[close + 2..];
    }
    rendered.push_str(rest);
    rendered
}

/// Renders the templates in every string of a JSON value.
fn render_strings(value: &Value, vars: &TemplateVars) -> Value {
    match value {
        Value::String(text) => Value::String(render(text, vars)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| render_strings(v, vars)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, v)| (key.clone(), render_strings(v, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToolSpec;
    use serde_json::json;

    const SCENARIO: &str = r#"{
      "description": "notes demo",
      "agents": {
        "assistant": { "turns": [
          { "steps": [
            { "tool_calls": [
              { "name": "write_file", "arguments": { "path": "notes.txt", "content": "{{input}}" } },
              { "name": "list_files" } ] },
            { "answer": "Saved. Observations: {{observations}}" } ] },
          { "steps": [ { "answer": "Turn {{turn}}: {{input}} after {{previous_input}}" } ] }
        ] },
        "*": { "turns": [ { "steps": [ { "answer": "I am {{agent}} and you said: {{input}}" } ] } ] }
      }
    }"#;

    fn model() -> ScriptedModel {
        ScriptedModel::from_json(SCENARIO).expect("valid scenario")
    }

    fn tool() -> ToolSpec {
        ToolSpec {
            name: "write_file".to_owned(),
            description: String::new(),
            parameters: json!({"type": "object"}),
            concurrency_safe: true,
            effects: Default::default(),
        }
    }

    fn ask(agent: &str, messages: Vec<Message>, with_tools: bool) -> ModelRequest {
        ModelRequest {
            model: "scripted".to_owned(),
            agent: agent.to_owned(),
            messages: std::sync::Arc::new(messages),
            tools: if with_tools { vec![tool()] } else { Vec::new() }.into(),
            max_output_tokens: None,
            output_schema: None,
        }
    }

    fn calls_message(response: &ModelResponse) -> Message {
        response.message.clone()
    }

    fn scenario_error(text: &str) -> String {
        match ScriptedModel::from_json(text) {
            Err(ModelError::Scenario(message)) => message,
            other => panic!("expected a scenario error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn selects_script_by_agent_and_falls_back_to_star() {
        let model = model();
        let own = model
            .complete(ask("assistant", vec![Message::user("hi")], true))
            .await
            .expect("answers");
        assert_eq!(own.finish_reason.as_deref(), Some("tool_calls"));

        let fallback = model
            .complete(ask(
                "researcher",
                vec![Message::system("sys"), Message::user("hey")],
                true,
            ))
            .await
            .expect("answers");
        assert_eq!(
            fallback.message.content,
            "I am researcher and you said: hey"
        );
        assert_eq!(fallback.finish_reason.as_deref(), Some("stop"));
    }

    #[tokio::test]
    async fn missing_script_is_a_scenario_error() {
        let model = ScriptedModel::from_json(
            r#"{"agents": {"a": {"turns": [{"steps": [{"answer": "x"}]}]}}}"#,
        )
        .expect("valid");
        let error = model
            .complete(ask("b", vec![Message::user("hi")], false))
            .await;
        assert!(matches!(error, Err(ModelError::Scenario(m)) if m.contains("no script for agent")));
    }

    #[tokio::test]
    async fn walks_turns_and_steps_across_two_turns() {
        let model = model();
        let mut history = vec![Message::system("sys"), Message::user("remember milk")];

        let first = model
            .complete(ask("assistant", history.clone(), true))
            .await
            .expect("step 1");
        let calls = &first.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_t1_s1_0");
        assert_eq!(calls[1].id, "call_t1_s1_1");
        assert_eq!(
            calls[0].arguments,
            json!({"path": "notes.txt", "content": "remember milk"})
        );
        assert_eq!(calls[1].arguments, json!({}));

        history.push(calls_message(&first));
        history.push(Message::tool_result("call_t1_s1_0", "wrote 13 bytes"));
        history.push(Message::tool_result("call_t1_s1_1", "notes.txt"));
        let second = model
            .complete(ask("assistant", history.clone(), true))
            .await
            .expect("step 2");
        assert_eq!(
            second.message.content,
            "Saved. Observations: wrote 13 bytes\nnotes.txt"
        );
        assert!(second.message.tool_calls.is_empty());

        history.push(second.message.clone());
        history.push(Message::user("and eggs"));
        let third = model
            .complete(ask("assistant", history.clone(), true))
            .await
            .expect("turn 2");
        assert_eq!(
            third.message.content,
            "Turn 2: and eggs after remember milk"
        );

        // A third user message replays the last turn.
        history.push(third.message.clone());
        history.push(Message::user("and bread"));
        let fourth = model
            .complete(ask("assistant", history, true))
            .await
            .expect("turn 3");
        assert_eq!(fourth.message.content, "Turn 2: and bread after and eggs");
    }

    #[tokio::test]
    async fn answers_without_tools_when_none_are_offered() {
        let response = model()
            .complete(ask("assistant", vec![Message::user("hi")], false))
            .await
            .expect("answers");
        assert!(response.message.tool_calls.is_empty());
        assert_eq!(response.message.content, "Saved. Observations: ");
        assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    }

    #[tokio::test]
    async fn streams_words_then_done() {
        let stream = model()
            .stream(ask("other", vec![Message::user("a b")], false))
            .await
            .expect("streams");
        let items: Vec<_> = stream.collect().await;
        let mut text = String::new();
        for item in &items[..items.len() - 1] {
            match item {
                Ok(ModelChunk::Delta(piece)) => text.push_str(piece),
                other => panic!("expected a delta, got {other:?}"),
            }
        }
        assert!(items.len() > 3);
        let Some(Ok(ModelChunk::Done(response))) = items.last() else {
            panic!("expected Done");
        };
        assert_eq!(text, response.message.content);
        assert_eq!(response.usage.prompt_tokens, 2);
        assert_eq!(response.usage.completion_tokens, 8);
    }

    #[tokio::test]
    async fn counts_the_images_it_is_shown_by_any_source_without_reading_them() {
        use crate::protocol::{ImagePart, PayloadRef};
        let model = ScriptedModel::from_json(
            r#"{"agents": {"*": {"turns": [{"steps": [{"answer": "saw {{images}}"}]}]}}}"#,
        )
        .expect("valid");
        let stored = ImagePart::Payload {
            media_type: "image/png".into(),
            payload: PayloadRef {
                bucket: "skein-payloads-acme".into(),
                name: "s/t/x".into(),
                size: 9,
                digest: "SHA-256=x".into(),
            },
        };
        let url = ImagePart::Url {
            url: "https://example.com/a.png".into(),
        };
        let messages = vec![
            Message::user("look").with_images(vec![url, stored.clone()]),
            Message::tool_result("c1", "shot").with_images(vec![stored]),
        ];
        let answer = model
            .complete(ask("a", messages, false))
            .await
            .expect("answers");
        assert_eq!(answer.message.content, "saw 3");
    }

    #[tokio::test]
    async fn outputs_answer_their_json_and_a_repair_request_is_the_next_step() {
        let model = ScriptedModel::from_json(
            r#"{"agents": {"*": {"turns": [
                {"steps": [{"output": {"city": 7}}, {"output": {"city": "{{input}}", "n": [1, true]}}]},
                {"steps": [{"answer": "turn {{turn}}"}]}
            ]}}}"#,
        )
        .expect("valid");
        let mut history = vec![Message::user("Oslo")];
        let first = model
            .complete(ask("geo", history.clone(), false))
            .await
            .expect("answers");
        assert_eq!(first.message.content, r#"{"city":7}"#);
        history.push(first.message);
        let schema = crate::protocol::OutputSchema::new(json!({"type": "object"}));
        history.push(crate::agent::structured::repair_request(
            &schema,
            "/city: expected string",
        ));
        let repaired = model
            .complete(ask("geo", history.clone(), false))
            .await
            .expect("answers");
        assert_eq!(
            serde_json::from_str::<Value>(&repaired.message.content).expect("JSON"),
            json!({"city": "Oslo", "n": [1, true]}),
            "the repair request is not a user's input either"
        );
        history.push(repaired.message);
        history.push(Message::user("next"));
        let next = model
            .complete(ask("geo", history, false))
            .await
            .expect("answers");
        assert_eq!(next.message.content, "turn 2", "the repair started no turn");
    }

    #[test]
    fn renders_templates_in_one_pass() {
        let vars = TemplateVars {
            input: "{{agent}}".to_owned(),
            previous_input: String::new(),
            observations: "o1\no2".to_owned(),
            turn: "3".to_owned(),
            agent: "bot".to_owned(),
            images: "0".to_owned(),
        };
        assert_eq!(
            render(
                "{{input}}|{{ turn }}|{{observations}}|{{unknown}}|{{agent",
                &vars
            ),
            "{{agent}}|3|o1\no2|{{unknown}}|{{agent"
        );
        assert_eq!(render("[{{previous_input}}]", &vars), "[]");
    }

    #[test]
    fn label_includes_the_description() {
        assert_eq!(model().label(), "scripted: notes demo");
        let bare = ScriptedModel::from_json(
            r#"{"agents": {"*": {"turns": [{"steps": [{"answer": ""}]}]}}}"#,
        )
        .expect("valid");
        assert_eq!(bare.label(), "scripted");
    }

    #[test]
    fn rejects_bad_scenarios() {
        assert!(scenario_error("{").contains("invalid scenario JSON"));
        assert!(scenario_error(r#"{"agents": {}}"#).contains("no agents"));
        assert!(scenario_error(r#"{"agents": {"a": {"turns": []}}}"#).contains("no turns"));
        assert!(
            scenario_error(r#"{"agents": {"a": {"turns": [{"steps": []}]}}}"#)
                .contains("turn 1 has no steps")
        );
        let both = r#"{"agents": {"a": {"turns": [{"steps": [
            {"answer": "x", "tool_calls": [{"name": "t"}]}]}]}}}"#;
        assert!(scenario_error(both).contains("step 1: a step needs exactly one"));
        let answer_and_output = r#"{"agents": {"a": {"turns": [{"steps": [
            {"answer": "x", "output": {}}]}]}}}"#;
        assert!(scenario_error(answer_and_output)
            .contains("exactly one of tool_calls, answer or output"));
        let neither = r#"{"agents": {"a": {"turns": [{"steps": [{}]}]}}}"#;
        assert!(scenario_error(neither).contains("exactly one"));
        let empty_calls = r#"{"agents": {"a": {"turns": [{"steps": [
            {"tool_calls": []}, {"answer": "x"}]}]}}}"#;
        assert!(scenario_error(empty_calls).contains("tool_calls is empty"));
        let ends_with_calls = r#"{"agents": {"a": {"turns": [
            {"steps": [{"answer": "x"}]},
            {"steps": [{"tool_calls": [{"name": "t"}]}]}]}}}"#;
        assert!(scenario_error(ends_with_calls).contains("turn 2, step 1: the last step"));
        let typo = r#"{"agents": {"a": {"turns": [{"steps": [{"answr": "x"}]}]}}}"#;
        assert!(scenario_error(typo).contains("unknown field"));
    }

    #[test]
    fn bundled_scenario_is_valid() {
        let bundled = ScriptedModel::from_json(super::super::BUNDLED_SCENARIO);
        assert!(bundled.is_ok(), "bundled scenario: {bundled:?}");
    }

    #[test]
    fn from_file_names_the_file_in_errors() {
        let missing = Path::new("/nonexistent/skein-scenario.json");
        let Err(ModelError::Scenario(message)) = ScriptedModel::from_file(missing) else {
            panic!("expected a scenario error");
        };
        assert!(message.contains("skein-scenario.json"));
    }
}
