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
    let any = compile(json!({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 5}]}));
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
