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

use serde_json::{Map, Value};

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

/// The `$ref`s a node applies to the value itself (not to its properties or items).
fn in_place_refs(node: &Node, found: &mut BTreeSet<String>) {
    let Node::Rules(rules) = node else {
        return;
    };
    if let Some(reference) = &rules.reference {
        found.insert(reference.clone());
    }
    for child in rules
        .any_of
        .iter()
        .chain(&rules.one_of)
        .chain(&rules.all_of)
        .chain(&rules.not)
    {
        in_place_refs(child, found);
    }
}

/// `#/$defs/name` as the definitions are keyed: one form for every spelling of the same entry.
fn canonical_ref(reference: &str) -> String {
    let Some(rest) = reference.strip_prefix("#/") else {
        return reference.to_owned();
    };
    match rest.split_once('/') {
        Some((keyword, name)) => format!("#/{keyword}/{}", escape(&unescape(name))),
        None => reference.to_owned(),
    }
}

/// A JSON pointer token: `~` as `~0`, `/` as `~1`.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Where in the schema the compiler is.
struct Location(Vec<String>);

impl Location {
    fn root() -> Self {
        Location(Vec::new())
    }

    fn push(&mut self, token: &str) {
        self.0.push(escape(token));
    }

    fn pop(&mut self) {
        self.0.pop();
    }

    fn pointer(&self) -> String {
        let mut pointer = "#".to_owned();
        for token in &self.0 {
            pointer.push('/');
            pointer.push_str(token);
        }
        pointer
    }

    fn error(&self, message: impl Into<String>) -> SchemaError {
        SchemaError {
            at: self.pointer(),
            message: message.into(),
        }
    }
}

#[derive(Default)]
struct Compiler {
    /// Every `$ref` met, with where it stands, checked once the definitions are known.
    references: Vec<(String, String)>,
}

impl Compiler {
    fn node(
        &mut self,
        schema: &Value,
        at: &mut Location,
        depth: usize,
    ) -> Result<Node, SchemaError> {
        if depth > MAX_DEPTH {
            return Err(at.error(format!("schemas nest deeper than {MAX_DEPTH} levels")));
        }
        let map = match schema {
            Value::Bool(true) => return Ok(Node::Any),
            Value::Bool(false) => return Ok(Node::Nothing),
            Value::Object(map) => map,
            other => {
                return Err(at.error(format!(
                    "a schema is an object or a boolean, not {}",
                    Kind::of(other).name()
                )))
            }
        };
        let mut rules = Rules::default();
        let mut checks = false;
        for (keyword, value) in map {
            at.push(keyword);
            checks |= self.keyword(&mut rules, keyword, value, at, depth)?;
            at.pop();
        }
        if !rules.required.is_empty() {
            // Duplicates are allowed by the specification; one check each is enough.
            let mut seen = BTreeSet::new();
            rules.required.retain(|name| seen.insert(name.clone()));
        }
        Ok(if checks {
            Node::Rules(Box::new(rules))
        } else {
            Node::Any
        })
    }

    /// Reads one keyword into `rules`; true when it checks something.
    fn keyword(
        &mut self,
        rules: &mut Rules,
        keyword: &str,
        value: &Value,
        at: &mut Location,
        depth: usize,
    ) -> Result<bool, SchemaError> {
        match keyword {
            "type" => rules.types = Some(types(value, at)?),
            "enum" => match value {
                Value::Array(values) if !values.is_empty() => {
                    rules.enumeration = Some(values.clone())
                }
                _ => return Err(at.error("enum must be a non-empty array")),
            },
            "const" => rules.constant = Some(value.clone()),
            "properties" => {
                let Value::Object(properties) = value else {
                    return Err(at.error("properties must be an object of schemas"));
                };
                for (name, property) in properties {
                    at.push(name);
                    let node = self.node(property, at, depth + 1)?;
                    at.pop();
                    rules.properties.push((name.clone(), node));
                }
            }
            "required" => {
                let names = value.as_array().and_then(|names| {
                    names
                        .iter()
                        .map(|name| name.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                });
                rules.required =
                    names.ok_or_else(|| at.error("required must be an array of strings"))?;
            }
            "additionalProperties" => rules.additional = Some(self.node(value, at, depth + 1)?),
            "minProperties" => rules.min_properties = Some(count(value, at)?),
            "maxProperties" => rules.max_properties = Some(count(value, at)?),
            "items" => {
                if value.is_array() {
                    return Err(at.error(
                        "items must be one schema for every item (the tuple form, an array of \
                         schemas, is not supported)",
                    ));
                }
                rules.items = Some(self.node(value, at, depth + 1)?);
            }
            "minItems" => rules.min_items = Some(count(value, at)?),
            "maxItems" => rules.max_items = Some(count(value, at)?),
            "uniqueItems" => {
                rules.unique_items = value
                    .as_bool()
                    .ok_or_else(|| at.error("uniqueItems must be a boolean"))?;
            }
            "minLength" => rules.min_length = Some(count(value, at)?),
            "maxLength" => rules.max_length = Some(count(value, at)?),
            "pattern" => {
                let text = value
                    .as_str()
                    .ok_or_else(|| at.error("pattern must be a string"))?;
                let regex = regex::RegexBuilder::new(text)
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .build()
                    .map_err(|e| at.error(format!("pattern {text:?} does not compile: {e}")))?;
                rules.pattern = Some((text.to_owned(), regex));
            }
            "minimum" => rules.minimum = Some(number(value, at)?),
            "maximum" => rules.maximum = Some(number(value, at)?),
            "exclusiveMinimum" => rules.exclusive_minimum = Some(number(value, at)?),
            "exclusiveMaximum" => rules.exclusive_maximum = Some(number(value, at)?),
            "multipleOf" => {
                let divisor = number(value, at)?;
                if divisor <= 0.0 {
                    return Err(at.error("multipleOf must be greater than 0"));
                }
                rules.multiple_of = Some(divisor);
            }
            "anyOf" => rules.any_of = self.list(value, at, depth)?,
            "oneOf" => rules.one_of = self.list(value, at, depth)?,
            "allOf" => rules.all_of = self.list(value, at, depth)?,
            "not" => rules.not = Some(self.node(value, at, depth + 1)?),
            "$ref" => {
                let reference = value
                    .as_str()
                    .ok_or_else(|| at.error("$ref must be a string"))?;
                let well_formed = reference == "#"
                    || ["#/$defs/", "#/definitions/"].iter().any(|prefix| {
                        reference
                            .strip_prefix(prefix)
                            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
                    });
                if !well_formed {
                    return Err(at.error(format!(
                        "$ref {reference:?} is not supported: refer to \"#\" or to \
                         \"#/$defs/<name>\" (or \"#/definitions/<name>\")"
                    )));
                }
                self.references.push((reference.to_owned(), at.pointer()));
                rules.reference = Some(reference.to_owned());
            }
            "$defs" | "definitions" => {
                if at.0.len() > 1 {
                    return Err(at.error(format!("{keyword} is read at the schema's root only")));
                }
                // Compiled by `Schema::compile`.
                return Ok(false);
            }
            annotation if ANNOTATIONS.contains(&annotation) || annotation.starts_with("x-") => {
                return Ok(false)
            }
            unknown => {
                return Err(at.error(format!(
                    "unsupported keyword {unknown:?}: structured answers are checked with type, \
                     enum, const, properties, required, additionalProperties, minProperties, \
                     maxProperties, items, minItems, maxItems, uniqueItems, minLength, \
                     maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum, \
                     multipleOf, anyOf, oneOf, allOf, not and $ref"
                )));
            }
        }
        Ok(true)
    }

    fn list(
        &mut self,
        value: &Value,
        at: &mut Location,
        depth: usize,
    ) -> Result<Vec<Node>, SchemaError> {
        let Value::Array(schemas) = value else {
            return Err(at.error("must be a non-empty array of schemas"));
        };
        if schemas.is_empty() {
            return Err(at.error("must be a non-empty array of schemas"));
        }
        let mut nodes = Vec::with_capacity(schemas.len());
        for (position, schema) in schemas.iter().enumerate() {
            at.push(&position.to_string());
            nodes.push(self.node(schema, at, depth + 1)?);
            at.pop();
        }
        Ok(nodes)
    }
}

fn types(value: &Value, at: &Location) -> Result<Vec<Kind>, SchemaError> {
    let names: Vec<&Value> = match value {
        Value::String(_) => vec![value],
        Value::Array(names) if !names.is_empty() => names.iter().collect(),
        _ => return Err(at.error("type must be a type name or a non-empty array of them")),
    };
    let mut kinds = Vec::with_capacity(names.len());
    for name in names {
        let kind = name.as_str().and_then(Kind::parse).ok_or_else(|| {
            at.error(format!(
                "{name} is not a type (null, boolean, integer, number, string, array, object)"
            ))
        })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

fn count(value: &Value, at: &Location) -> Result<u64, SchemaError> {
    match value {
        Value::Number(n) if is_integer(n) && n.as_f64().is_some_and(|f| f >= 0.0) => Ok(n
            .as_u64()
            .unwrap_or_else(|| n.as_f64().unwrap_or(0.0) as u64)),
        _ => Err(at.error("must be a non-negative integer")),
    }
}

fn number(value: &Value, at: &Location) -> Result<f64, SchemaError> {
    value.as_f64().ok_or_else(|| at.error("must be a number"))
}

/// One check of a value.
struct Check<'s> {
    schema: &'s Schema,
    /// The JSON pointer tokens of the value being checked (escaped).
    path: Vec<String>,
    errors: Vec<Invalid>,
}

impl Check<'_> {
    fn fail(&mut self, message: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(Invalid {
                pointer: self.path.iter().map(|token| format!("/{token}")).collect(),
                message,
            });
        }
    }

    fn full(&self) -> bool {
        self.errors.len() >= MAX_ERRORS
    }

    /// Whether `value` passes `node`, without recording why not.
    fn passes(&self, node: &Node, value: &Value, depth: usize) -> Result<(), Vec<Invalid>> {
        let mut trial = Check {
            schema: self.schema,
            path: self.path.clone(),
            errors: Vec::new(),
        };
        trial.node(node, value, depth);
        if trial.errors.is_empty() {
            Ok(())
        } else {
            Err(trial.errors)
        }
    }

    fn node(&mut self, node: &Node, value: &Value, depth: usize) {
        if self.full() {
            return;
        }
        if depth > MAX_DEPTH {
            self.fail(format!(
                "nests deeper than the {MAX_DEPTH} levels of schema a check follows"
            ));
            return;
        }
        match node {
            Node::Any => {}
            Node::Nothing => self.fail("no value is allowed here".to_owned()),
            Node::Rules(rules) => self.rules(rules, value, depth),
        }
    }

    fn rules(&mut self, rules: &Rules, value: &Value, depth: usize) {
        let kind = Kind::of(value);
        if let Some(types) = &rules.types {
            if !types.iter().any(|&t| kind.is(t)) {
                let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
                self.fail(format!(
                    "expected {}, got {}",
                    names.join(" or "),
                    describe_value(value)
                ));
                // The other keywords would only repeat that the value is of another kind.
                return;
            }
        }
        if let Some(values) = &rules.enumeration {
            if !values.iter().any(|allowed| equal(allowed, value)) {
                let allowed: Vec<String> = values.iter().map(|v| short(v, 40)).collect();
                self.fail(format!(
                    "{} is not one of {}",
                    short(value, 60),
                    allowed.join(", ")
                ));
            }
        }
        if let Some(constant) = &rules.constant {
            if !equal(constant, value) {
                self.fail(format!(
                    "must be {}, not {}",
                    short(constant, 60),
                    short(value, 60)
                ));
            }
        }
        match value {
            Value::Object(map) => self.object(rules, map, depth),
            Value::Array(items) => self.array(rules, items, depth),
            Value::String(text) => self.string(rules, text),
            Value::Number(n) => self.number(rules, n),
            Value::Null | Value::Bool(_) => {}
        }
        for sub in &rules.all_of {
            self.node(sub, value, depth + 1);
        }
        if !rules.any_of.is_empty() {
            let tried: Vec<Result<(), Vec<Invalid>>> = rules
                .any_of
                .iter()
                .map(|sub| self.passes(sub, value, depth + 1))
                .collect();
            if tried.iter().all(Result::is_err) {
                let reasons = first_reasons(&tried);
                self.fail(format!(
                    "matches none of the {} anyOf alternatives ({reasons})",
                    tried.len()
                ));
            }
        }
        if !rules.one_of.is_empty() {
            let tried: Vec<Result<(), Vec<Invalid>>> = rules
                .one_of
                .iter()
                .map(|sub| self.passes(sub, value, depth + 1))
                .collect();
            let matched: Vec<usize> = tried
                .iter()
                .enumerate()
                .filter(|(_, result)| result.is_ok())
                .map(|(position, _)| position + 1)
                .collect();
            match matched.len() {
                1 => {}
                0 => {
                    let reasons = first_reasons(&tried);
                    self.fail(format!(
                        "matches none of the {} oneOf alternatives ({reasons})",
                        tried.len()
                    ));
                }
                _ => {
                    let which: Vec<String> = matched.iter().map(ToString::to_string).collect();
                    self.fail(format!(
                        "matches oneOf alternatives {}: it must match exactly one",
                        which.join(" and ")
                    ));
                }
            }
        }
        if let Some(not) = &rules.not {
            if self.passes(not, value, depth + 1).is_ok() {
                self.fail("matches the schema under \"not\"".to_owned());
            }
        }
        if let Some(reference) = &rules.reference {
            match self.schema.target(reference) {
                Some(target) => self.node(target, value, depth + 1),
                // Compilation resolved every reference.
                None => self.fail(format!("$ref {reference:?} names nothing")),
            }
        }
    }

    fn object(&mut self, rules: &Rules, map: &Map<String, Value>, depth: usize) {
        for name in &rules.required {
            if !map.contains_key(name) {
                self.fail(format!("the required property {name:?} is missing"));
            }
        }
        let size = map.len() as u64;
        if rules.min_properties.is_some_and(|min| size < min) {
            self.fail(format!(
                "has {size} properties; at least {} are required",
                rules.min_properties.unwrap_or_default()
            ));
        }
        if rules.max_properties.is_some_and(|max| size > max) {
            self.fail(format!(
                "has {size} properties; at most {} are allowed",
                rules.max_properties.unwrap_or_default()
            ));
        }
        for (name, value) in map {
            let declared = rules
                .properties
                .iter()
                .find(|(declared, _)| declared == name)
                .map(|(_, node)| node);
            let node = match (declared, &rules.additional) {
                (Some(node), _) => node,
                (None, Some(Node::Nothing)) => {
                    self.fail(format!("the property {name:?} is not allowed"));
                    continue;
                }
                (None, Some(node)) => node,
                (None, None) => continue,
            };
            self.path.push(escape(name));
            self.node(node, value, depth + 1);
            self.path.pop();
        }
    }

    fn array(&mut self, rules: &Rules, items: &[Value], depth: usize) {
        let size = items.len() as u64;
        if rules.min_items.is_some_and(|min| size < min) {
            self.fail(format!(
                "has {size} items; at least {} are required",
                rules.min_items.unwrap_or_default()
            ));
        }
        if rules.max_items.is_some_and(|max| size > max) {
            self.fail(format!(
                "has {size} items; at most {} are allowed",
                rules.max_items.unwrap_or_default()
            ));
        }
        if rules.unique_items {
            'outer: for (i, a) in items.iter().enumerate() {
                for (j, b) in items.iter().enumerate().skip(i + 1) {
                    if equal(a, b) {
                        self.fail(format!("items {i} and {j} are equal; items must be unique"));
                        break 'outer;
                    }
                }
            }
        }
        if let Some(node) = &rules.items {
            for (position, item) in items.iter().enumerate() {
                if self.full() {
                    return;
                }
                self.path.push(position.to_string());
                self.node(node, item, depth + 1);
                self.path.pop();
            }
        }
    }

    fn string(&mut self, rules: &Rules, text: &str) {
        if rules.min_length.is_some() || rules.max_length.is_some() {
            let length = text.chars().count() as u64;
            if let Some(min) = rules.min_length.filter(|&min| length < min) {
                self.fail(format!(
                    "is {length} characters long; at least {min} are required"
                ));
            }
            if let Some(max) = rules.max_length.filter(|&max| length > max) {
                self.fail(format!(
                    "is {length} characters long; at most {max} are allowed"
                ));
            }
        }
        if let Some((source, regex)) = &rules.pattern {
            if !regex.is_match(text) {
                self.fail(format!(
                    "{} does not match the pattern {source:?}",
                    short(&Value::String(text.to_owned()), 60)
                ));
            }
        }
    }

    fn number(&mut self, rules: &Rules, n: &serde_json::Number) {
        let Some(x) = n.as_f64() else {
            return;
        };
        if let Some(min) = rules.minimum.filter(|&min| x < min) {
            self.fail(format!("{n} is less than the minimum {min}"));
        }
        if let Some(max) = rules.maximum.filter(|&max| x > max) {
            self.fail(format!("{n} is greater than the maximum {max}"));
        }
        if let Some(min) = rules.exclusive_minimum.filter(|&min| x <= min) {
            self.fail(format!(
                "{n} is not greater than the exclusive minimum {min}"
            ));
        }
        if let Some(max) = rules.exclusive_maximum.filter(|&max| x >= max) {
            self.fail(format!("{n} is not less than the exclusive maximum {max}"));
        }
        if let Some(divisor) = rules.multiple_of {
            let quotient = x / divisor;
            let off = (quotient - quotient.round()).abs();
            if !quotient.is_finite() || off > 1e-9 * quotient.abs().max(1.0) {
                self.fail(format!("{n} is not a multiple of {divisor}"));
            }
        }
    }
}

/// The first failure of each alternative, numbered from 1.
fn first_reasons(tried: &[Result<(), Vec<Invalid>>]) -> String {
    tried
        .iter()
        .enumerate()
        .filter_map(|(position, result)| {
            let first = result.as_ref().err()?.first()?;
            Some(format!("{}: {first}", position + 1))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// JSON equality, numbers compared by value (`1` equals `1.0`).
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, a)| y.get(key).is_some_and(|b| equal(a, b)))
        }
        _ => a == b,
    }
}

/// A value's kind and, for short scalars, the value itself (`string "abc"`, `number 5`).
fn describe_value(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Array(_) | Value::Object(_) => Kind::of(value).name().to_owned(),
        Value::Number(_) => format!("number {}", short(value, 40)),
        _ => format!("{} {}", Kind::of(value).name(), short(value, 40)),
    }
}

/// `value`'s JSON, cut to about `max` characters.
fn short(value: &Value, max: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= max {
        text
    } else {
        let head: String = text.chars().take(max).collect();
        format!("{head}…")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn compile(schema: Value) -> Schema {
        Schema::compile(&schema).unwrap_or_else(|e| panic!("{schema} compiles: {e}"))
    }

    fn refused(schema: Value) -> SchemaError {
        match Schema::compile(&schema) {
            Ok(_) => panic!("{schema} should be refused"),
            Err(e) => e,
        }
    }

    fn failures(schema: &Schema, value: Value) -> Vec<String> {
        match schema.validate(&value) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn types_single_listed_and_integers_without_a_fraction() {
        let schema = compile(json!({"type": "integer"}));
        assert!(schema.validate(&json!(3)).is_ok());
        assert!(schema.validate(&json!(3.0)).is_ok(), "1.0 is an integer");
        assert_eq!(
            failures(&schema, json!(3.5)),
            ["(root): expected integer, got number 3.5"]
        );
        let number = compile(json!({"type": "number"}));
        assert!(number.validate(&json!(3)).is_ok(), "an integer is a number");
        let nullable = compile(json!({"type": ["string", "null"]}));
        assert!(nullable.validate(&json!(null)).is_ok());
        assert!(nullable.validate(&json!("x")).is_ok());
        assert_eq!(
            failures(&nullable, json!(true)),
            ["(root): expected string or null, got boolean true"]
        );
        for (kind, value) in [
            ("boolean", json!(false)),
            ("array", json!([])),
            ("object", json!({})),
            ("null", json!(null)),
        ] {
            assert!(
                compile(json!({"type": kind})).validate(&value).is_ok(),
                "{kind}"
            );
        }
    }

    #[test]
    fn objects_name_the_pointer_of_each_failing_value() {
        let schema = compile(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "a/b": {"type": "integer"},
            },
            "required": ["name", "age"],
            "additionalProperties": false,
        }));
        assert!(
            schema
                .validate(&json!({"name": "Ada", "tags": ["x"], "age": null}))
                .is_err(),
            "age is not declared, and additional properties are refused"
        );
        let mut errors = failures(
            &schema,
            json!({"name": "A", "tags": ["ok", 7], "a/b": "x", "extra": 1}),
        );
        errors.sort();
        assert_eq!(
            errors,
            [
                "(root): the property \"extra\" is not allowed",
                "(root): the required property \"age\" is missing",
                "/a~1b: expected integer, got string \"x\"",
                "/name: is 1 characters long; at least 2 are required",
                "/tags/1: expected string, got number 7",
            ]
        );
    }

    #[test]
    fn additional_properties_may_be_a_schema() {
        let schema = compile(json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "additionalProperties": {"type": "number"},
        }));
        assert!(schema.validate(&json!({"id": 1, "x": 2.5})).is_ok());
        assert_eq!(
            failures(&schema, json!({"id": 1, "x": "no"})),
            ["/x: expected number, got string \"no\""]
        );
        let counted = compile(json!({"minProperties": 1, "maxProperties": 2}));
        assert!(counted.validate(&json!({"a": 1})).is_ok());
        assert_eq!(failures(&counted, json!({})).len(), 1);
        assert_eq!(failures(&counted, json!({"a": 1, "b": 2, "c": 3})).len(), 1);
    }

    #[test]
    fn enum_and_const_compare_numbers_by_value() {
        let schema = compile(json!({"enum": ["red", 1, null, {"a": [1]}]}));
        for ok in [json!("red"), json!(1.0), json!(null), json!({"a": [1.0]})] {
            assert!(schema.validate(&ok).is_ok(), "{ok}");
        }
        assert_eq!(
            failures(&schema, json!("blue")),
            ["(root): \"blue\" is not one of \"red\", 1, null, {\"a\":[1]}"]
        );
        let constant = compile(json!({"const": 2}));
        assert!(constant.validate(&json!(2.0)).is_ok());
        assert_eq!(failures(&constant, json!(3)), ["(root): must be 2, not 3"]);
    }

    #[test]
    fn numbers_strings_and_arrays_are_bounded() {
        let schema = compile(json!({
            "minimum": 1, "maximum": 10, "exclusiveMaximum": 10, "multipleOf": 0.5
        }));
        assert!(schema.validate(&json!(9.5)).is_ok());
        assert!(schema.validate(&json!(1)).is_ok());
        assert_eq!(failures(&schema, json!(0)).len(), 1);
        assert_eq!(failures(&schema, json!(10)).len(), 1);
        assert_eq!(
            failures(&schema, json!(2.25)),
            ["(root): 2.25 is not a multiple of 0.5"]
        );
        let exclusive = compile(json!({"exclusiveMinimum": 0}));
        assert_eq!(
            failures(&exclusive, json!(0)),
            ["(root): 0 is not greater than the exclusive minimum 0"]
        );
        let text = compile(json!({"maxLength": 3, "pattern": "^[a-z]+$"}));
        assert!(text.validate(&json!("abc")).is_ok());
        let length = compile(json!({"maxLength": 3}));
        assert!(
            length.validate(&json!("äöü")).is_ok(),
            "characters, not bytes"
        );
        assert_eq!(
            failures(&text, json!("abcd1")),
            [
                "(root): is 5 characters long; at most 3 are allowed",
                "(root): \"abcd1\" does not match the pattern \"^[a-z]+$\""
            ]
        );
        let unanchored = compile(json!({"pattern": "b+"}));
        assert!(unanchored.validate(&json!("abba")).is_ok());
        let list = compile(json!({"minItems": 1, "maxItems": 2, "uniqueItems": true}));
        assert!(list.validate(&json!([1, 2])).is_ok());
        assert_eq!(failures(&list, json!([])).len(), 1);
        assert_eq!(failures(&list, json!([1, 2, 3])).len(), 1);
        assert_eq!(
            failures(&list, json!([1, 1.0])),
            ["(root): items 0 and 1 are equal; items must be unique"]
        );
    }

    #[test]
    fn combinators_say_which_alternatives_failed() {
        let any =
            compile(json!({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 5}]}));
        assert!(any.validate(&json!("x")).is_ok());
        assert!(any.validate(&json!(7)).is_ok());
        assert_eq!(
            failures(&any, json!(2)),
            [
                "(root): matches none of the 2 anyOf alternatives (1: (root): expected string, \
              got number 2; 2: (root): 2 is less than the minimum 5)"
            ]
        );
        let one = compile(json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}));
        assert!(one.validate(&json!(2.5)).is_ok());
        assert_eq!(
            failures(&one, json!(2)),
            ["(root): matches oneOf alternatives 1 and 2: it must match exactly one"]
        );
        let all = compile(json!({"allOf": [{"minimum": 1}, {"maximum": 3}]}));
        assert!(all.validate(&json!(2)).is_ok());
        assert_eq!(failures(&all, json!(4)).len(), 1);
        let not = compile(json!({"not": {"type": "null"}}));
        assert!(not.validate(&json!(0)).is_ok());
        assert_eq!(
            failures(&not, json!(null)),
            ["(root): matches the schema under \"not\""]
        );
        assert!(compile(json!(true)).validate(&json!(1)).is_ok());
        assert_eq!(
            failures(&compile(json!(false)), json!(1)),
            ["(root): no value is allowed here"]
        );
    }

    #[test]
    fn references_reach_the_root_and_its_definitions() {
        let tree = compile(json!({
            "$defs": {"node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }},
            "$ref": "#/$defs/node",
        }));
        assert!(tree
            .validate(&json!({"value": 1, "children": [{"value": 2, "children": []}]}))
            .is_ok());
        assert_eq!(
            failures(&tree, json!({"value": 1, "children": [{"value": "two"}]})),
            ["/children/0/value: expected integer, got string \"two\""]
        );
        let old = compile(json!({
            "definitions": {"a/b": {"type": "string"}},
            "properties": {"x": {"$ref": "#/definitions/a~1b"}},
        }));
        assert_eq!(
            failures(&old, json!({"x": 1})),
            ["/x: expected string, got number 1"]
        );
        let recursive = compile(json!({
            "type": "object",
            "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        }));
        assert!(recursive
            .validate(&json!({"next": {"next": {"next": null}}}))
            .is_ok());
    }

    #[test]
    fn what_cannot_be_checked_is_refused_with_where_it_stands() {
        let unknown = refused(json!({
            "type": "object",
            "properties": {"when": {"type": "string", "if": {"const": 1}}},
        }));
        assert_eq!(unknown.at, "#/properties/when/if");
        assert!(
            unknown.message.contains("unsupported keyword \"if\""),
            "{unknown}"
        );
        for (schema, needle) in [
            (json!({"type": "text"}), "is not a type"),
            (json!({"items": [{"type": "string"}]}), "tuple form"),
            (json!({"pattern": "(?=x)"}), "does not compile"),
            (json!({"$ref": "#/$defs/missing"}), "names no entry"),
            (
                json!({"$ref": "http://example.com/s.json"}),
                "is not supported",
            ),
            (json!({"required": "name"}), "array of strings"),
            (json!({"minLength": -1}), "non-negative integer"),
            (json!({"multipleOf": 0}), "greater than 0"),
            (json!({"anyOf": []}), "non-empty array"),
            (json!({"enum": []}), "non-empty array"),
            (
                json!({"properties": {"x": {"$defs": {}}}}),
                "at the schema's root only",
            ),
            (json!({"$ref": "#"}), "leads back here"),
            (
                json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}}),
                "leads back here",
            ),
            (json!("string"), "an object or a boolean"),
            (json!({"patternProperties": {}}), "unsupported keyword"),
        ] {
            let error = refused(schema.clone());
            assert!(error.to_string().contains(needle), "{schema}: {error}");
        }
    }

    #[test]
    fn annotations_are_ignored() {
        let schema = compile(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "urn:answer",
            "title": "Answer",
            "description": "d",
            "type": "object",
            "properties": {"at": {"type": "string", "format": "date-time", "default": "x",
                                   "examples": ["y"], "deprecated": true, "x-ui": "hidden"}},
        }));
        assert!(schema.validate(&json!({"at": "not a date"})).is_ok());
    }

    #[test]
    fn reports_are_bounded() {
        let schema = compile(json!({"type": "array", "items": {"type": "string"}}));
        let many: Vec<Value> = (0..100).map(|n| json!(n)).collect();
        assert_eq!(
            schema.validate(&Value::Array(many)).map_err(|e| e.len()),
            Err(MAX_ERRORS)
        );
        let deep = compile(json!({"type": "object", "additionalProperties": {"$ref": "#"}}));
        let mut value = json!({});
        for _ in 0..(MAX_DEPTH + 5) {
            value = json!({ "a": value });
        }
        let errors = failures(&deep, value);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("nests deeper"), "{errors:?}");
    }
}
