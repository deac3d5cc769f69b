//! Checking a value against a compiled schema: each failure named by the JSON pointer of the
//! failing value, at most [`MAX_ERRORS`] of them, following at most [`MAX_DEPTH`] nested schemas.

use serde_json::{Map, Value};

use super::*;

/// One check of a value.
pub(super) struct Check<'s> {
    pub(super) schema: &'s Schema,
    /// The JSON pointer tokens of the value being checked (escaped).
    pub(super) path: Vec<String>,
    pub(super) errors: Vec<Invalid>,
}

impl Check<'_> {
    pub(super) fn fail(&mut self, message: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(Invalid {
                pointer: self.path.iter().map(|token| format!("/{token}")).collect(),
                message,
            });
        }
    }

    pub(super) fn full(&self) -> bool {
        self.errors.len() >= MAX_ERRORS
    }

    /// Whether `value` passes `node`, without recording why not.
    pub(super) fn passes(
        &self,
        node: &Node,
        value: &Value,
        depth: usize,
    ) -> Result<(), Vec<Invalid>> {
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

    pub(super) fn node(&mut self, node: &Node, value: &Value, depth: usize) {
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

    pub(super) fn rules(&mut self, rules: &Rules, value: &Value, depth: usize) {
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

    pub(super) fn object(&mut self, rules: &Rules, map: &Map<String, Value>, depth: usize) {
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

    pub(super) fn array(&mut self, rules: &Rules, items: &[Value], depth: usize) {
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

    pub(super) fn string(&mut self, rules: &Rules, text: &str) {
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

    pub(super) fn number(&mut self, rules: &Rules, n: &serde_json::Number) {
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
