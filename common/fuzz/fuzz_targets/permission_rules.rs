//! Permission rules (`agent::permissions`, `rules.rs`): `Rule::parse` on arbitrary text, and a
//! rule that parsed matched against an arbitrary call.
//!
//! Input: UTF-8 text, lines `rule`, `tool`, `argument` (missing lines are empty); the argument is
//! the call's arguments when it is JSON, otherwise the `path` of `{"path": argument}`. The first
//! byte also picks the permission mode.
//!
//! Checks: no panic; a parsed rule keeps its text; a rule used as a `deny` rule denies every call
//! it matches, in every mode; `always_rule(tool)` parses and matches `tool`, for any tool name
//! without surrounding whitespace.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use skein_common::agent::permissions::{
    always_rule, approved_for_session, decide, tool_check, CompiledPolicy, Decision, Rule,
};
use skein_common::protocol::{PermissionMode, PermissionPolicy, ToolEffects};

const MODES: [PermissionMode; 5] = [
    PermissionMode::Bypass,
    PermissionMode::AcceptEdits,
    PermissionMode::Default,
    PermissionMode::DontAsk,
    PermissionMode::ReadOnly,
];

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let mut lines = text.splitn(3, '\n');
    let (rule_text, tool, argument) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    let arguments: Value =
        serde_json::from_str(argument).unwrap_or_else(|_| json!({ "path": argument }));
    let _ = tool_check(tool, &arguments);

    if let Ok(rule) = Rule::parse(rule_text) {
        assert_eq!(rule.text(), rule_text);
        let matches = rule.matches(tool, &arguments);
        let mode = MODES[usize::from(bytes.first().copied().unwrap_or(0)) % MODES.len()];
        let policy = CompiledPolicy::compile(&PermissionPolicy {
            mode: Some(mode),
            deny: vec![rule_text.to_owned()],
            ..PermissionPolicy::default()
        })
        .expect("a rule that parsed compiles");
        let decision = decide(&policy, tool, ToolEffects::default(), &arguments);
        if matches {
            assert!(matches!(decision, Decision::Deny { .. }), "{decision:?}");
        }
        let approved = approved_for_session(&[rule_text.to_owned()], tool, &arguments);
        assert_eq!(approved.is_some(), matches);
    }

    if !tool.is_empty() && tool.trim() == tool {
        let always = always_rule(tool);
        let rule = Rule::parse(&always).unwrap_or_else(|e| panic!("{always:?}: {e}"));
        assert!(rule.matches(tool, &arguments), "{always:?} misses {tool:?}");
    }
});
