//! A JSON Schema validator for the subset that structured-output APIs take (OpenAI's
//! `response_format: json_schema`, Anthropic's tool `input_schema`): what a structured answer
//! (`OutputSchema`) is checked against.
//!
//! A schema is compiled once ([`Schema::compile`]), which checks it whole: a keyword this
//! validator does not know is refused there, with where it stands, so nothing a schema asks is
//! silently left unchecked. Then [`Schema::validate`] checks values, naming each failing value by
//! its JSON pointer.
//!
//! Validation keywords: `type` (a name or a list of names: `null`, `boolean`, `integer`,
//! `number`, `string`, `array`, `object`; an integer is a number without a fraction, `1.0`
//! included), `enum`, `const` (numbers compared by value), `properties`, `required`,
//! `additionalProperties` (`false` or a schema; it covers the properties `properties` does not
//! name), `minProperties`, `maxProperties`, `items` (one schema for every item; the tuple forms are
//! refused), `minItems`, `maxItems`, `uniqueItems`, `minLength`, `maxLength` (in characters),
//! `pattern` (the `regex` crate's syntax, matched anywhere in the string unless anchored; a
//! pattern it cannot compile, such as one with look-around, is refused), `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum` (numbers, as in drafts 6 and later), `multipleOf`,
//! `anyOf`, `oneOf`, `allOf`, `not`, and `$ref` to the root (`#`) or to an entry of the root's
//! `$defs` or `definitions` (`#/$defs/name`; `~0` and `~1` escapes read). Keywords beside a `$ref`
//! apply too (as in draft 2020-12). `true` and `false` are the schemas that pass and fail
//! everything.
//!
//! Annotations, ignored: `title`, `description`, `default`, `examples`, `$schema`, `$id`,
//! `$comment`, `format`, `deprecated`, `readOnly`, `writeOnly`, and keys starting `x-`.
//! `$defs` and `definitions` are read at the root only.
//!
//! Bounds: a `$ref` loop that never descends into the value (`{"$ref": "#"}`) is refused when
//! compiling; checking a value follows at most [`MAX_DEPTH`] nested schemas, and reports at most
//! [`MAX_ERRORS`] failures.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

/// The deepest nesting of schemas a check follows (and a schema may have).
pub const MAX_DEPTH: usize = 128;
/// The most failures one check reports.
pub const MAX_ERRORS: usize = 20;
/// The most bytes of compiled program one `pattern` may take.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Keywords read without effect.
const ANNOTATIONS: [&str; 11] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "format",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// A compiled schema.
#[derive(Debug, Clone)]
pub struct Schema {
    root: Node,
    /// Targets of `$ref`, by the reference's text (`#/$defs/name`).
    defs: BTreeMap<String, Node>,
}

/// Why a schema cannot be used: where in it (a JSON pointer into the schema, `#` for its root)
/// and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub at: String,
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {}: {}", self.at, self.message)
    }
}

impl std::error::Error for SchemaError {}

/// One way a value fails its schema: the JSON pointer of the failing value (empty for the
/// whole value) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub pointer: String,
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pointer.is_empty() {
            write!(f, "(root): {}", self.message)
        } else {
            write!(f, "{}: {}", self.pointer, self.message)
        }
    }
}

/// The failures of one check, as one line each.
pub fn describe(errors: &[Invalid]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[derive(Debug, Clone)]
enum Node {
    /// `true` or `{}`.
    Any,
    /// `false`.
    Nothing,
    Rules(Box<Rules>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "null" => Kind::Null,
            "boolean" => Kind::Boolean,
            "integer" => Kind::Integer,
            "number" => Kind::Number,
            "string" => Kind::String,
            "array" => Kind::Array,
            "object" => Kind::Object,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Boolean => "boolean",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::String => "string",
            Kind::Array => "array",
            Kind::Object => "object",
        }
    }

    /// The kind of `value`: `Integer` for a number without a fraction.
    fn of(value: &Value) -> Kind {
        match value {
            Value::Null => Kind::Null,
            Value::Bool(_) => Kind::Boolean,
            Value::Number(n) if is_integer(n) => Kind::Integer,
            Value::Number(_) => Kind::Number,
            Value::String(_) => Kind::String,
            Value::Array(_) => Kind::Array,
            Value::Object(_) => Kind::Object,
        }
    }

    /// Whether a value of kind `self` is of the named type `kind`.
    fn is(self, kind: Kind) -> bool {
        self == kind || (self == Kind::Integer && kind == Kind::Number)
    }
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64()
        || n.is_u64()
        || n.as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

#[derive(Debug, Clone, Default)]
struct Rules {
    types: Option<Vec<Kind>>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    properties: Vec<(String, Node)>,
    required: Vec<String>,
    additional: Option<Node>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    items: Option<Node>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    unique_items: bool,
    min_length: Option<u64>,
    max_length: Option<u64>,
    pattern: Option<(String, regex::Regex)>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
    multiple_of: Option<f64>,
    any_of: Vec<Node>,
    one_of: Vec<Node>,
    all_of: Vec<Node>,
    not: Option<Node>,
    reference: Option<String>,
}

impl Schema {
    /// Compiles `schema`, refusing what this validator cannot check (see the module header).
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let mut compiler = Compiler::default();
        let root = compiler.node(schema, &mut Location::root(), 0)?;
        let mut defs = BTreeMap::new();
        if let Value::Object(map) = schema {
            for keyword in ["$defs", "definitions"] {
                let Some(entries) = map.get(keyword) else {
                    continue;
                };
                let mut at = Location::root();
                at.push(keyword);
                let Value::Object(entries) = entries else {
                    return Err(at.error(format!("{keyword} must be an object of schemas")));
                };
                for (name, entry) in entries {
                    at.push(name);
                    let node = compiler.node(entry, &mut at, 1)?;
                    at.pop();
                    defs.insert(format!("#/{keyword}/{}", escape(name)), node);
                }
            }
        }
        for (reference, at) in &compiler.references {
            if reference != "#" && !defs.contains_key(&canonical_ref(reference)) {
                return Err(SchemaError {
                    at: at.clone(),
                    message: format!(
                        "$ref {reference:?} names no entry of the root's $defs or definitions"
                    ),
                });
            }
        }
        let schema = Schema { root, defs };
        schema.refuse_ref_loops()?;
        Ok(schema)
    }

    /// Checks `value`; `Err` lists its failures (at most [`MAX_ERRORS`]).
    pub fn validate(&self, value: &Value) -> Result<(), Vec<Invalid>> {
        let mut check = Check {
            schema: self,
            path: Vec::new(),
            errors: Vec::new(),
        };
        check.node(&self.root, value, 0);
        if check.errors.is_empty() {
            Ok(())
        } else {
            Err(check.errors)
        }
    }

    fn target(&self, reference: &str) -> Option<&Node> {
        if reference == "#" {
            Some(&self.root)
        } else {
            self.defs.get(&canonical_ref(reference))
        }
    }

    /// Refuses a `$ref` that leads back to itself without descending into the value (through
    /// `$ref`, `anyOf`, `oneOf`, `allOf` or `not` only): checking any value would never end.
    fn refuse_ref_loops(&self) -> Result<(), SchemaError> {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let targets = std::iter::once(("#".to_owned(), &self.root))
            .chain(self.defs.iter().map(|(name, node)| (name.clone(), node)));
        for (name, node) in targets {
            let mut found = BTreeSet::new();
            in_place_refs(node, &mut found);
            edges.insert(name, found.iter().map(|r| canonical_ref(r)).collect());
        }
        // Depth-first, marking what is on the current path.
        fn visit(
            name: &str,
            edges: &BTreeMap<String, BTreeSet<String>>,
            on_path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Result<(), String> {
            if done.contains(name) {
                return Ok(());
            }
            if on_path.iter().any(|n| n == name) {
                return Err(name.to_owned());
            }
            on_path.push(name.to_owned());
            for next in edges.get(name).into_iter().flatten() {
                visit(next, edges, on_path, done)?;
            }
            on_path.pop();
            done.insert(name.to_owned());
            Ok(())
        }
        let mut done = BTreeSet::new();
        for name in edges.keys() {
            visit(name, &edges, &mut Vec::new(), &mut done).map_err(|looped| SchemaError {
                at: looped.clone(),
                message: "$ref leads back here without descending into the value (a schema \
                          that refers to itself must do so inside properties or items)"
                    .to_owned(),
            })?;
        }
        Ok(())
    }
}

mod check;
mod compile;

use check::Check;
use compile::{canonical_ref, escape, in_place_refs, Compiler, Location};

#[cfg(test)]
mod tests;
