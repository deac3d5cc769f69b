//! Structured answers: the JSON Schema a turn's final answer must match ([`OutputSchema`]), as an
//! agent definition declares it (`output_schema`) or a submission asks for it (its own wins).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Failure, FailureKind};
use crate::json_schema::Schema;

/// The name a schema goes by when none is given.
pub const DEFAULT_OUTPUT_SCHEMA_NAME: &str = "answer";

/// Longest schema name: what OpenAI's `response_format` takes.
pub const MAX_OUTPUT_SCHEMA_NAME: usize = 64;

/// Largest schema, as JSON: it travels with every model call of the turn.
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 64 * 1024;

/// The JSON Schema a turn's final answer must match. The schema is sent the way each model
/// provider understands (OpenAI-compatible servers: `response_format: json_schema`; Anthropic: a
/// `final_answer` tool the model must call), parsed as JSON and checked against the schema; an
/// answer that does not match gets one repair attempt, then the turn ends `invalid_output`. The
/// final result carries the parsed answer as `output`, beside its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSchema {
    /// The schema's name, shown to the model: 1 to 64 of `A-Z a-z 0-9 _ -`; `answer` when
    /// absent.
    #[serde(default = "default_name")]
    pub name: String,
    /// What the answer is, for the model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The JSON Schema. Its root is an object schema (`"type": "object"`), as the providers'
    /// structured outputs require; the keywords it may use are those of Skein's validator
    /// (`type`, `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
    /// `anyOf`, `oneOf`, `allOf`, `not`, `$ref` to `#/$defs/…`, bounds on numbers, strings,
    /// arrays and objects, `pattern`; annotations such as `description` or `format` are
    /// ignored). Any other keyword is refused rather than left unchecked.
    pub schema: Value,
    /// Whether an OpenAI-compatible server is asked to hold the model to the schema exactly
    /// (`strict`). Absent: asked when the schema keeps to what strict mode accepts (every object
    /// closed with `additionalProperties: false` and all its properties required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

fn default_name() -> String {
    DEFAULT_OUTPUT_SCHEMA_NAME.to_owned()
}

impl OutputSchema {
    /// `schema`, named `answer`.
    pub fn new(schema: Value) -> Self {
        Self {
            name: default_name(),
            description: String::new(),
            schema,
            strict: None,
        }
    }

    /// Checks the schema and compiles it: a valid name, at most [`MAX_OUTPUT_SCHEMA_BYTES`] of
    /// JSON, an object at the root, and only keywords the validator checks. The message says
    /// what is wrong and where.
    pub fn compile(&self) -> Result<Schema, String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_OUTPUT_SCHEMA_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(format!(
                "the name must be 1-{MAX_OUTPUT_SCHEMA_NAME} characters of A-Z a-z 0-9 _ - \
                 (got {:?})",
                crate::text::cut(&self.name, 2 * MAX_OUTPUT_SCHEMA_NAME)
            ));
        }
        let size = crate::text::json_len(&self.schema);
        if size > MAX_OUTPUT_SCHEMA_BYTES {
            return Err(format!(
                "the schema is {size} bytes of JSON; the limit is {MAX_OUTPUT_SCHEMA_BYTES}"
            ));
        }
        if self.schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(
                "the schema's root must be an object schema (\"type\": \"object\"): model \
                 providers take structured answers as JSON objects"
                    .to_owned(),
            );
        }
        Schema::compile(&self.schema).map_err(|e| e.to_string())
    }

    /// [`Self::compile`] as a failure (`invalid_input`) naming the field it came from.
    pub fn check(&self, field: &str) -> Result<Schema, Failure> {
        self.compile().map_err(|message| {
            Failure::new(FailureKind::InvalidInput, format!("{field}: {message}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_schema_needs_a_name_an_object_root_and_known_keywords() {
        let good = OutputSchema::new(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }));
        assert!(good.compile().is_ok());
        let decoded: OutputSchema =
            serde_json::from_value(json!({"schema": good.schema})).expect("decodes");
        assert_eq!(decoded.name, "answer");
        assert_eq!(
            serde_json::to_value(&decoded).expect("encodes"),
            json!({"name": "answer", "schema": good.schema}),
            "an unset strictness and description are left out"
        );
        for (bad, needle) in [
            (
                OutputSchema {
                    name: "a b".into(),
                    ..good.clone()
                },
                "the name must be",
            ),
            (
                OutputSchema::new(json!({"type": "array"})),
                "root must be an object",
            ),
            (
                OutputSchema::new(json!({"properties": {}})),
                "root must be an object",
            ),
            (
                OutputSchema::new(json!({"type": "object", "if": {}})),
                "unsupported keyword \"if\"",
            ),
            (
                OutputSchema::new(json!({"type": "object", "description": "x".repeat(70_000)})),
                "the limit is",
            ),
        ] {
            let message = bad.compile().expect_err(needle);
            assert!(message.contains(needle), "{message}");
        }
        let failure = OutputSchema::new(json!({"type": "object", "if": {}}))
            .check("output_schema")
            .expect_err("refused");
        assert_eq!(failure.kind, FailureKind::InvalidInput);
        assert!(
            failure.message.starts_with("output_schema: at #/if"),
            "{failure}"
        );
    }
}
