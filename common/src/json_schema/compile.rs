//! Compiling a schema: each keyword read and checked where it stands, `$ref`s resolved against
//! the root's definitions, loops that never descend into the value refused.

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;

/// The `$ref`s a node applies to the value itself (not to its properties or items).
pub(super) fn in_place_refs(node: &Node, found: &mut BTreeSet<String>) {
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
pub(super) fn canonical_ref(reference: &str) -> String {
    let Some(rest) = reference.strip_prefix("#/") else {
        return reference.to_owned();
    };
    match rest.split_once('/') {
        Some((keyword, name)) => format!("#/{keyword}/{}", escape(&unescape(name))),
        None => reference.to_owned(),
    }
}

/// A JSON pointer token: `~` as `~0`, `/` as `~1`.
pub(super) fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

pub(super) fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Where in the schema the compiler is.
pub(super) struct Location(Vec<String>);

impl Location {
    pub(super) fn root() -> Self {
        Location(Vec::new())
    }

    pub(super) fn push(&mut self, token: &str) {
        self.0.push(escape(token));
    }

    pub(super) fn pop(&mut self) {
        self.0.pop();
    }

    pub(super) fn pointer(&self) -> String {
        let mut pointer = "#".to_owned();
        for token in &self.0 {
            pointer.push('/');
            pointer.push_str(token);
        }
        pointer
    }

    pub(super) fn error(&self, message: impl Into<String>) -> SchemaError {
        SchemaError {
            at: self.pointer(),
            message: message.into(),
        }
    }
}

#[derive(Default)]
pub(super) struct Compiler {
    /// Every `$ref` met, with where it stands, checked once the definitions are known.
    pub(super) references: Vec<(String, String)>,
}

impl Compiler {
    pub(super) fn node(
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
    pub(super) fn keyword(
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

    pub(super) fn list(
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
