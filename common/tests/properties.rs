//! Properties of everything that reads outside input, run on many generated inputs: the wire
//! decoders and their checks, the subject parsers and the permission rules never panic on any
//! input, and what they accept keeps its invariants (a parsed subject token never holds a `.`, a
//! deny rule wins in every mode).

use proptest::prelude::*;
use serde_json::{json, Value};
use skein_common::agent::permissions::{decide, CompiledPolicy, Decision};
use skein_common::protocol::{
    ApprovalDecision, CancelRequest, FinalResult, PermissionMode, PermissionPolicy, StoredFinal,
    SubagentTask, TaskSubmission, ToolEffects, ToolResult, ToolTask, TurnEvent,
};
use skein_common::subjects;

/// Bytes that are often almost JSON: arbitrary bytes, or a valid submission with one field
/// replaced by an arbitrary value.
fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just("v"),
        Just("task_id"),
        Just("tenant"),
        Just("session"),
        Just("agent"),
        Just("input"),
        Just("deadline_ms"),
        Just("overrides"),
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        ".{0,40}".prop_map(|s| json!(s)),
        Just(json!(null)),
        Just(json!({"max_iterations": 0, "tools": ["*"]})),
        Just(json!([1, 2, 3])),
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        (field, value).prop_map(|(field, value)| {
            let mut submission = json!({
                "v": 1, "task_id": "t", "tenant": "acme", "user": "u",
                "session": "s", "agent": "assistant", "input": "hi"
            });
            submission[field] = value;
            submission.to_string().into_bytes()
        }),
    ]
}

fn decode_all(bytes: &[u8]) {
    if let Ok(submission) = serde_json::from_slice::<TaskSubmission>(bytes) {
        let _ = submission.validate(1024 * 1024);
        let _ = submission.origin().time_left();
    }
    let _ = serde_json::from_slice::<ToolTask>(bytes);
    let _ = serde_json::from_slice::<SubagentTask>(bytes);
    if let Ok(result) = serde_json::from_slice::<ToolResult>(bytes) {
        let _ = result.outcome.observation();
    }
    let _ = serde_json::from_slice::<TurnEvent>(bytes);
    let _ = serde_json::from_slice::<FinalResult>(bytes);
    let _ = serde_json::from_slice::<CancelRequest>(bytes);
    let _ = serde_json::from_slice::<ApprovalDecision>(bytes);
    let _ = serde_json::from_slice::<StoredFinal>(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn wire_decoders_and_their_checks_never_panic(bytes in wire_bytes()) {
        decode_all(&bytes);
    }

    #[test]
    fn subject_parsers_never_panic_and_never_yield_a_token_with_a_dot(subject in "[a-z.>*]{0,12}(skein\\.(submit|submit~[0-9]{1,2}|cancel|approval|wake|result|reply)\\.)?[a-zA-Z0-9._>* -]{0,40}") {
        for (a, b) in [subjects::parse_submit(&subject), subjects::parse_cancel(&subject),
                       subjects::parse_approval(&subject), subjects::parse_wake(&subject)]
            .into_iter()
            .flatten()
        {
            prop_assert!(!a.is_empty() && !b.is_empty() && !b.contains('.'));
        }
        if let Some((tenant, session, task)) = subjects::parse_result(&subject) {
            prop_assert!(!tenant.is_empty() && !session.is_empty() && !task.contains('.'));
        }
        let _ = subjects::reply_number(&subject);
        let _ = subjects::dead_letter(&subject);
        prop_assert!(!subjects::kind(&subject).contains(['.', '~']));
        if let Some(k) = subjects::parse_work_stream(&subject) {
            prop_assert_eq!(subjects::work_stream(k), subject.clone());
        }
        if let Some((k, tenant, session)) = subjects::parse_submit_in(&subject) {
            prop_assert_eq!(subjects::submit_in(k, tenant, session), subject.clone());
        }
        if let Some((k, tenant, task)) = subjects::parse_events(&subject) {
            prop_assert!(!tenant.contains('.') && !task.contains('.'));
            prop_assert_eq!(subjects::events_in(k, tenant, task), subject.clone());
        }
    }

    #[test]
    fn subjects_built_from_valid_tokens_parse_back(
        tenant in "[A-Za-z0-9_-]{1,20}",
        session in "[A-Za-z0-9_-]{1,20}",
        task in "[A-Za-z0-9_-]{1,20}",
    ) {
        let result = subjects::result(&tenant, &session, &task);
        prop_assert_eq!(
            subjects::parse_result(&result),
            Some((tenant.as_str(), session.as_str(), task.as_str()))
        );
        let cancel = subjects::cancel(&tenant, &task);
        prop_assert_eq!(
            subjects::parse_cancel(&cancel),
            Some((tenant.as_str(), task.as_str()))
        );
    }

    #[test]
    fn permission_rules_never_panic_and_a_deny_rule_wins_in_every_mode(
        rule in "[a-z_*]{1,12}(\\([^)]{0,20}\\))?",
        junk in ".{0,30}",
        argument in ".{0,30}",
        mode in prop_oneof![
            Just(PermissionMode::Default),
            Just(PermissionMode::ReadOnly),
            Just(PermissionMode::AcceptEdits),
            Just(PermissionMode::Bypass),
            Just(PermissionMode::DontAsk),
        ],
    ) {
        // Arbitrary text as a rule is refused or compiled, never a panic.
        let _ = CompiledPolicy::compile(&PermissionPolicy {
            allow: vec![junk.clone()],
            ..PermissionPolicy::default()
        });
        let tool = rule.split('(').next().unwrap_or_default().replace('*', "x");
        let policy = PermissionPolicy {
            mode: Some(mode),
            deny: vec![format!("{tool}")],
            allow: vec![rule.clone()],
            ask: vec![junk],
            ..PermissionPolicy::default()
        };
        if let Ok(policy) = CompiledPolicy::compile(&policy) {
            let arguments: Value = json!({ "path": argument, "url": argument, "command": argument });
            let decision = decide(&policy, &tool, ToolEffects::default(), &arguments);
            prop_assert!(matches!(decision, Decision::Deny { .. }), "{decision:?}");
        }
    }
}
