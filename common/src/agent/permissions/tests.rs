//! Table tests of [`decide`] and of combining policies.

use serde_json::{json, Value};

use super::*;
use crate::protocol::FailureKind;

use PermissionMode::{AcceptEdits, Bypass, Default as DefaultMode, DontAsk, ReadOnly};

const PLAIN: ToolEffects = ToolEffects {
    read_only: false,
    destructive: false,
    edits_workspace: false,
};
const READS: ToolEffects = ToolEffects {
    read_only: true,
    destructive: false,
    edits_workspace: false,
};
const DESTROYS: ToolEffects = ToolEffects {
    read_only: false,
    destructive: true,
    edits_workspace: false,
};
const EDITS: ToolEffects = ToolEffects {
    read_only: false,
    destructive: true,
    edits_workspace: true,
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Allow,
    Ask,
    Deny,
}

fn kind(decision: &Decision) -> Kind {
    match decision {
        Decision::Allow { .. } => Kind::Allow,
        Decision::Ask { .. } => Kind::Ask,
        Decision::Deny { .. } => Kind::Deny,
    }
}

fn strings(rules: &[&str]) -> Vec<String> {
    rules.iter().map(|r| r.to_string()).collect()
}

fn policy(
    mode: Option<PermissionMode>,
    allow: &[&str],
    ask: &[&str],
    deny: &[&str],
) -> PermissionPolicy {
    PermissionPolicy {
        mode,
        allow: strings(allow),
        ask: strings(ask),
        deny: strings(deny),
        approval_timeout_ms: None,
    }
}

struct Case {
    name: &'static str,
    policy: PermissionPolicy,
    tool: &'static str,
    effects: ToolEffects,
    arguments: Value,
    expected: Kind,
    reason: &'static str,
}

fn case(
    name: &'static str,
    policy: PermissionPolicy,
    call: (&'static str, ToolEffects, Value),
    expected: (Kind, &'static str),
) -> Case {
    Case {
        name,
        policy,
        tool: call.0,
        effects: call.1,
        arguments: call.2,
        expected: expected.0,
        reason: expected.1,
    }
}

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let none = |mode| policy(mode, &[], &[], &[]);
    let path = |p: &str| json!({ "path": p });
    let url = |u: &str| json!({ "url": u });
    let command = |c: &str| json!({ "command": c });
    vec![
        // Each mode's default.
        case("absent mode is default: reads run", none(None), ("read_file", READS, path("a")), (Kind::Allow, "mode default: read_file is not destructive")),
        case("absent mode is default: destructive asks", none(None), ("shell", DESTROYS, command("ls")), (Kind::Ask, "mode default: shell is destructive")),
        case("default: destructive asks", none(Some(DefaultMode)), ("write_file", EDITS, path("a")), (Kind::Ask, "mode default: write_file is destructive")),
        case("default: plain runs", none(Some(DefaultMode)), ("http_fetch", PLAIN, url("https://x.org")), (Kind::Allow, "mode default")),
        case("read_only: read-only runs", none(Some(ReadOnly)), ("read_file", READS, path("a")), (Kind::Allow, "mode read_only: read_file is read-only")),
        case("read_only: the rest is denied", none(Some(ReadOnly)), ("http_fetch", PLAIN, url("https://x.org")), (Kind::Deny, "mode read_only: http_fetch is not read-only")),
        case("accept_edits: edits run", none(Some(AcceptEdits)), ("write_file", EDITS, path("a")), (Kind::Allow, "mode accept_edits: write_file edits the workspace")),
        case("accept_edits: other destructive asks", none(Some(AcceptEdits)), ("shell", DESTROYS, command("ls")), (Kind::Ask, "mode accept_edits: shell is destructive")),
        case("accept_edits: plain runs", none(Some(AcceptEdits)), ("http_fetch", PLAIN, url("https://x.org")), (Kind::Allow, "mode accept_edits")),
        case("bypass: everything runs", none(Some(Bypass)), ("shell", DESTROYS, command("rm -rf x")), (Kind::Allow, "mode bypass")),
        case("dont_ask: destructive is denied", none(Some(DontAsk)), ("shell", DESTROYS, command("ls")), (Kind::Deny, "mode dont_ask: shell is destructive")),
        case("dont_ask: plain runs", none(Some(DontAsk)), ("http_fetch", PLAIN, url("https://x.org")), (Kind::Allow, "mode dont_ask")),
        // Precedence: deny > ask > tool check > allow > mode.
        case("deny beats ask", policy(None, &["shell"], &["shell"], &["shell"]), ("shell", DESTROYS, command("ls")), (Kind::Deny, "deny rule shell")),
        case("deny beats bypass", policy(Some(Bypass), &[], &[], &["write_file(secrets/**)"]), ("write_file", EDITS, path("secrets/k")), (Kind::Deny, "deny rule write_file(secrets/**)")),
        case("deny beats the tool check", policy(None, &[], &[], &["spawn_agent"]), ("spawn_agent", PLAIN, json!({"agent": "r"})), (Kind::Deny, "deny rule spawn_agent")),
        case("ask beats the tool check", policy(Some(Bypass), &[], &["load_skill"], &[]), ("load_skill", PLAIN, json!({"name": "notes"})), (Kind::Ask, "ask rule load_skill")),
        case("ask beats allow", policy(None, &["shell"], &["shell(git push*)"], &[]), ("shell", DESTROYS, command("git push origin")), (Kind::Ask, "ask rule shell(git push*)")),
        case("tool check beats allow", policy(None, &["read_file"], &[], &[]), ("read_file", READS, path("../x")), (Kind::Deny, "tool check: path escapes the workspace")),
        case("tool check beats bypass", none(Some(Bypass)), ("read_file", READS, path("/etc/passwd")), (Kind::Deny, "tool check: path escapes the workspace")),
        case("tool check beats the mode", none(Some(ReadOnly)), ("spawn_agent", PLAIN, json!({"agent": "r"})), (Kind::Allow, "tool check: runtime tool")),
        case("allow beats the mode", policy(Some(ReadOnly), &["write_file(notes/**)"], &[], &[]), ("write_file", EDITS, path("notes/a/b.md")), (Kind::Allow, "allow rule write_file(notes/**)")),
        case("an allow miss falls to the mode", policy(Some(ReadOnly), &["write_file(notes/**)"], &[], &[]), ("write_file", EDITS, path("other/x")), (Kind::Deny, "mode read_only")),
        // Globs.
        case("* stays in one segment", policy(None, &["write_file(notes/*)"], &[], &[]), ("write_file", EDITS, path("notes/a/b.md")), (Kind::Ask, "mode default")),
        case("* matches within the segment", policy(None, &["write_file(notes/*)"], &[], &[]), ("write_file", EDITS, path("notes/a.md")), (Kind::Allow, "allow rule write_file(notes/*)")),
        case("tool globs", policy(None, &[], &["mcp__github__*"], &[]), ("mcp__github__create_issue", PLAIN, json!({"title": "t"})), (Kind::Ask, "ask rule mcp__github__*")),
        case("tool globs miss other tools", policy(None, &[], &["mcp__github__*"], &[]), ("mcp__gitlab__create_issue", PLAIN, json!({})), (Kind::Allow, "mode default")),
        case("a whole host", policy(Some(ReadOnly), &["http_fetch(https://api.example.com/**)"], &[], &[]), ("http_fetch", PLAIN, url("https://api.example.com/v1/x")), (Kind::Allow, "allow rule http_fetch(https://api.example.com/**)")),
        case("another host", policy(Some(ReadOnly), &["http_fetch(https://api.example.com/**)"], &[], &[]), ("http_fetch", PLAIN, url("https://api.example.org/v1")), (Kind::Deny, "mode read_only")),
        // dont_ask turns every ask into a denial.
        case("dont_ask: ask rules deny", policy(Some(DontAsk), &[], &["shell"], &[]), ("shell", PLAIN, command("ls")), (Kind::Deny, "mode dont_ask: would ask (ask rule shell)")),
        case("dont_ask: allow rules still allow", policy(Some(DontAsk), &["shell"], &[], &[]), ("shell", DESTROYS, command("ls")), (Kind::Allow, "allow rule shell")),
    ]
}

#[test]
fn decisions_follow_the_table() {
    for c in cases() {
        let compiled = CompiledPolicy::compile(&c.policy).expect(c.name);
        let decision = decide(&compiled, c.tool, c.effects, &c.arguments);
        assert_eq!(kind(&decision), c.expected, "{}: {decision:?}", c.name);
        assert!(
            decision.reason().starts_with(c.reason),
            "{}: reason {:?} does not start with {:?}",
            c.name,
            decision.reason(),
            c.reason
        );
    }
}

#[test]
fn decisions_map_to_verdicts() {
    let reason = String::new;
    assert_eq!(
        Decision::Allow { reason: reason() }.verdict(),
        Verdict::Allowed
    );
    assert_eq!(Decision::Ask { reason: reason() }.verdict(), Verdict::Asked);
    assert_eq!(
        Decision::Deny { reason: reason() }.verdict(),
        Verdict::Denied
    );
}

#[test]
fn compile_names_the_bad_rule() {
    let mut bad = policy(None, &["read_file"], &["shell"], &["write_file(notes/**"]);
    let err = CompiledPolicy::compile(&bad).expect_err("unbalanced");
    assert!(err.to_string().contains("\"write_file(notes/**\""), "{err}");
    bad.deny = strings(&["http_fetch(https://{a,b)"]);
    let err = CompiledPolicy::compile(&bad).expect_err("invalid glob");
    assert!(matches!(err, PermissionError::InvalidGlob { .. }), "{err}");
    let good = PermissionPolicy {
        approval_timeout_ms: Some(1500),
        ..policy(Some(ReadOnly), &["read_file"], &[], &[])
    };
    let compiled = CompiledPolicy::compile(&good).expect("valid");
    assert_eq!(compiled.mode(), ReadOnly);
    assert_eq!(
        compiled.approval_timeout(),
        Some(std::time::Duration::from_millis(1500))
    );
    assert_eq!(
        CompiledPolicy::compile(&PermissionPolicy::default())
            .expect("empty")
            .mode(),
        DefaultMode
    );
}

#[test]
fn session_approvals_match_like_rules() {
    let session = strings(&[
        "write_file(notes/**",
        "shell(git status*)",
        &always_rule("read_file"),
    ]);
    assert_eq!(
        approved_for_session(&session, "shell", &json!({"command": "git status -s"})),
        Some("shell(git status*)".into())
    );
    assert_eq!(
        approved_for_session(&session, "read_file", &json!({"path": "a"})),
        Some("read_file".into())
    );
    assert_eq!(
        approved_for_session(&session, "write_file", &json!({"path": "notes/a"})),
        None
    );
}

#[test]
fn tighten_accepts_only_stricter_policies() {
    let base = PermissionPolicy {
        approval_timeout_ms: Some(60_000),
        ..policy(
            Some(AcceptEdits),
            &["read_file"],
            &["shell"],
            &["write_file(secrets/**)"],
        )
    };
    let overrides = PermissionPolicy {
        approval_timeout_ms: Some(10_000),
        ..policy(Some(ReadOnly), &[], &["http_fetch"], &["shell(rm *)"])
    };
    let tightened = tighten(&base, &overrides).expect("stricter");
    assert_eq!(tightened.mode, Some(ReadOnly));
    assert_eq!(tightened.allow, ["read_file"]);
    assert_eq!(tightened.ask, ["shell", "http_fetch"]);
    assert_eq!(tightened.deny, ["write_file(secrets/**)", "shell(rm *)"]);
    assert_eq!(tightened.approval_timeout_ms, Some(10_000));
    // A longer timeout keeps the shorter one; an absent mode keeps the base's.
    let longer = PermissionPolicy {
        approval_timeout_ms: Some(600_000),
        ..PermissionPolicy::default()
    };
    let kept = tighten(&base, &longer).expect("not looser");
    assert_eq!(kept.approval_timeout_ms, Some(60_000));
    assert_eq!(kept.mode, Some(AcceptEdits));
    // The same mode is not a loosening.
    assert!(tighten(&base, &none_with(AcceptEdits)).is_ok());
}

fn none_with(mode: PermissionMode) -> PermissionPolicy {
    policy(Some(mode), &[], &[], &[])
}

#[test]
fn tighten_refuses_loosening() {
    let base = none_with(DontAsk);
    for looser in [Bypass, AcceptEdits, DefaultMode] {
        let err = tighten(&base, &none_with(looser)).expect_err("looser mode");
        assert_eq!(err.kind, FailureKind::InvalidInput);
        assert!(err.message.contains("dont_ask"), "{}", err.message);
        assert!(err.message.contains(looser.as_str()), "{}", err.message);
    }
    // An absent base mode is `default`.
    let err = tighten(&PermissionPolicy::default(), &none_with(Bypass)).expect_err("looser");
    assert!(
        err.message.contains("from default to bypass"),
        "{}",
        err.message
    );
    let err = tighten(&base, &policy(None, &["shell"], &[], &[])).expect_err("allow");
    assert_eq!(err.kind, FailureKind::InvalidInput);
    assert!(
        err.message.contains("cannot add allow rules"),
        "{}",
        err.message
    );
    let err = tighten(&base, &policy(None, &[], &[], &["shell("])).expect_err("bad rule");
    assert_eq!(err.kind, FailureKind::InvalidInput);
    assert!(err.message.contains("\"shell(\""), "{}", err.message);
}

#[test]
fn restrict_takes_the_stricter_of_both() {
    let child = PermissionPolicy {
        approval_timeout_ms: Some(5_000),
        ..policy(Some(ReadOnly), &["read_file"], &[], &[])
    };
    let limits = PermissionPolicy {
        approval_timeout_ms: Some(9_000),
        ..policy(Some(DontAsk), &["shell"], &[], &["http_fetch"])
    };
    let restricted = restrict(&child, &limits);
    assert_eq!(restricted.mode, Some(ReadOnly));
    assert_eq!(restricted.allow, ["read_file"]);
    assert_eq!(restricted.deny, ["http_fetch"]);
    assert_eq!(restricted.approval_timeout_ms, Some(5_000));
    assert_eq!(
        restrict(&PermissionPolicy::default(), &none_with(AcceptEdits)).mode,
        Some(DefaultMode)
    );
}

#[test]
fn merge_puts_the_folder_first_and_the_agent_on_top() {
    let folder = PermissionPolicy {
        approval_timeout_ms: Some(1_000),
        ..policy(
            Some(DontAsk),
            &["read_file"],
            &["shell"],
            &["write_file(secrets/**)"],
        )
    };
    let agent = policy(Some(AcceptEdits), &["http_fetch"], &[], &["shell(rm *)"]);
    let merged = merge(&folder, &agent);
    assert_eq!(merged.mode, Some(AcceptEdits));
    assert_eq!(merged.allow, ["read_file", "http_fetch"]);
    assert_eq!(merged.ask, ["shell"]);
    assert_eq!(merged.deny, ["write_file(secrets/**)", "shell(rm *)"]);
    assert_eq!(merged.approval_timeout_ms, Some(1_000));
    let plain = merge(&folder, &PermissionPolicy::default());
    assert_eq!(plain.mode, Some(DontAsk));
    let timed = PermissionPolicy {
        approval_timeout_ms: Some(7),
        ..PermissionPolicy::default()
    };
    assert_eq!(merge(&folder, &timed).approval_timeout_ms, Some(7));
}
