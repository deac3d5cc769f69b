//! The subject parsers (`parse_submit_in`, `parse_events`, `parse_cancel`, `parse_approval`, `parse_wake`,
//! `parse_turned`, `parse_result`, `reply_number`, `dead_letter`) on arbitrary text.
//!
//! Checks: no panic; every parsed token is non-empty and free of `.`; the subject's builder
//! rebuilds a parsed subject exactly; a dead letter is filed under one of its four kinds.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skein_common::subjects;

fn token_ok(token: &str) -> bool {
    !token.is_empty() && !token.contains('.')
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(subject) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Some((partition, tenant, session)) = subjects::parse_submit_in(subject) {
        assert!(
            token_ok(tenant) && token_ok(session),
            "{subject:?} -> {tenant:?}, {session:?}"
        );
        assert_eq!(subjects::submit_in(partition, tenant, session), subject);
    }
    if let Some((partition, tenant, task)) = subjects::parse_events(subject) {
        assert!(
            token_ok(tenant) && token_ok(task),
            "{subject:?} -> {tenant:?}, {task:?}"
        );
        assert_eq!(subjects::events_in(partition, tenant, task), subject);
    }
    let pairs: [(_, fn(&str, &str) -> String); 4] = [
        (subjects::parse_cancel(subject), subjects::cancel),
        (subjects::parse_approval(subject), subjects::approval),
        (subjects::parse_wake(subject), subjects::wake),
        (subjects::parse_turned(subject), subjects::turned),
    ];
    for (parsed, build) in pairs {
        if let Some((a, b)) = parsed {
            assert!(token_ok(a) && token_ok(b), "{subject:?} -> {a:?}, {b:?}");
            assert_eq!(build(a, b), subject);
        }
    }
    if let Some((tenant, session, task)) = subjects::parse_result(subject) {
        assert!(
            token_ok(tenant) && token_ok(session) && token_ok(task),
            "{subject:?} -> {tenant:?}, {session:?}, {task:?}"
        );
        assert_eq!(subjects::result(tenant, session, task), subject);
    }
    let _ = subjects::reply_number(subject);
    let dead = subjects::dead_letter(subject);
    assert!(
        ["submit", "tool", "agent", "other"]
            .map(|kind| format!("skein.dlq.{kind}"))
            .contains(&dead),
        "{dead:?}"
    );
});
