//! Structured answers in the runtime: an agent whose spec carries an output schema has its final
//! answer parsed as JSON and checked against the schema ([`Structured::check`]). An answer that
//! fails gets one repair attempt: the model is asked again, in a user message that says what was
//! wrong ([`repair_request`]), a model call like any other (it counts as an iteration and draws
//! from the budget). A turn whose answer still fails ends `invalid_output`.
//!
//! The answer's text may be wrapped in a Markdown code fence (models without native structured
//! output like them); the fence is taken off, and the answer is the JSON inside it.

use std::sync::Arc;

use serde_json::Value;

use crate::json_schema::{describe, Schema};
use crate::protocol::message::{Message, Role};
use crate::protocol::{AgentSpec, Failure, FailureKind, OutputSchema};

/// How a repair request starts: it tells a repair request apart from a user's message (the
/// scripted model does not count it as a new turn).
pub const REPAIR_NOTE: &str =
    "[skein: structured answer] Your last answer does not match the required output schema";

/// Longest schema quoted in a repair request; a longer one is named, not quoted.
const MAX_QUOTED_SCHEMA: usize = 8 * 1024;

/// An output schema, shared with every model call of a turn, and compiled.
#[derive(Debug, Clone)]
pub struct Structured {
    pub schema: Arc<OutputSchema>,
    compiled: Schema,
}

/// A structured answer that passed: its JSON text and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub text: String,
    pub value: Value,
}

impl Structured {
    /// The output schema of `agent`, compiled; `None` when it has none. A schema that does not
    /// compile (checked when it was loaded or admitted, so only a forged spec) is a failure.
    pub fn of(agent: &AgentSpec) -> Result<Option<Self>, Failure> {
        agent.output_schema.as_ref().map(Self::new).transpose()
    }

    /// `schema`, compiled (a failure, `invalid_input`, when it cannot be).
    pub fn new(schema: &OutputSchema) -> Result<Self, Failure> {
        let compiled = schema.check("output_schema")?;
        Ok(Self {
            schema: Arc::new(schema.clone()),
            compiled,
        })
    }

    /// Parses `answer` as JSON and checks it; `Err` says what is wrong, each failing value named
    /// by its JSON pointer.
    pub fn check(&self, answer: &str) -> Result<Checked, String> {
        let text = strip_fence(answer.trim());
        if text.is_empty() {
            return Err("the answer is empty, not JSON".to_owned());
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("the answer is not JSON ({e})"))?;
        self.compiled
            .validate(&value)
            .map_err(|errors| describe(&errors))?;
        Ok(Checked {
            text: text.to_owned(),
            value,
        })
    }

    /// The user message asking the model to answer again, after an answer that failed with
    /// `problems`.
    pub fn repair_request(&self, problems: &str) -> Message {
        repair_request(&self.schema, problems)
    }

    /// The failure of a turn whose answer still fails after its repair attempt.
    pub fn failure(&self, problems: &str) -> Failure {
        Failure::new(
            FailureKind::InvalidOutput,
            format!(
                "the answer does not match the output schema {:?}, also after one repair \
                 attempt: {problems}",
                self.schema.name
            ),
        )
    }
}

/// See [`Structured::repair_request`].
pub fn repair_request(schema: &OutputSchema, problems: &str) -> Message {
    let quoted = serde_json::to_string(&schema.schema)
        .ok()
        .filter(|json| json.len() <= MAX_QUOTED_SCHEMA);
    let schema_text = match quoted {
        Some(json) => format!(" It must match this JSON Schema:\n{json}"),
        None => String::new(),
    };
    Message::user(format!(
        "{REPAIR_NOTE} {:?}: {problems}\nGive your final answer again, as a single JSON value \
         and nothing else.{schema_text}",
        schema.name
    ))
}

/// Whether `message` is a repair request the runtime sent (see [`REPAIR_NOTE`]).
pub fn is_repair_request(message: &Message) -> bool {
    message.role == Role::User && message.content.starts_with(REPAIR_NOTE)
}

/// `text` without a Markdown code fence around it (```` ```json … ``` ````), if it has one.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return text;
    };
    // The info string (`json`) runs to the end of the first line.
    match body.split_once('\n') {
        Some((info, inner)) if !info.contains(['{', '[']) => inner.trim(),
        _ => body.trim(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn structured() -> Structured {
        Structured::new(&OutputSchema::new(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        })))
        .expect("compiles")
    }

    #[test]
    fn answers_are_parsed_fences_taken_off_and_checked() {
        let check = structured();
        for text in [
            r#"{"city": "Oslo"}"#,
            "  {\"city\": \"Oslo\"}\n",
            "```json\n{\"city\": \"Oslo\"}\n```",
            "```\n{\"city\": \"Oslo\"}```",
        ] {
            let checked = check
                .check(text)
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(checked.value, json!({"city": "Oslo"}));
            assert_eq!(
                serde_json::from_str::<Value>(&checked.text).expect("JSON"),
                checked.value
            );
        }
        assert_eq!(
            check.check("").expect_err("empty"),
            "the answer is empty, not JSON"
        );
        assert!(check
            .check("The city is Oslo.")
            .expect_err("prose")
            .starts_with("the answer is not JSON"));
        assert_eq!(
            check.check(r#"{"city": 7}"#).expect_err("wrong type"),
            "/city: expected string, got number 7"
        );
    }

    #[test]
    fn a_repair_request_says_what_was_wrong_and_is_recognised() {
        let check = structured();
        let message = check.repair_request("/city: expected string, got number 7");
        assert_eq!(message.role, Role::User);
        assert!(is_repair_request(&message));
        assert!(
            message
                .content
                .contains("\"answer\": /city: expected string"),
            "{}",
            message.content
        );
        assert!(
            message.content.contains(r#""required":["city"]"#),
            "{}",
            message.content
        );
        assert!(!is_repair_request(&Message::user("hello")));
        let failure = check.failure("(root): the answer is not JSON");
        assert_eq!(failure.kind, FailureKind::InvalidOutput);
        assert!(failure.message.contains("after one repair attempt"));
    }
}
