//! Every wire decoder, on arbitrary bytes: `serde_json::from_slice` into each protocol message
//! (what `Bus::decode` does after its size cap) and the checks a receiver runs next.
//!
//! Checks: no panic; a decoded message encodes and decodes back to itself; a submission that
//! validates names a submit subject that parses back to its tenant and session; a subagent
//! task's child session id is always a valid token.

#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use skein_common::agent::definition::check_spec;
use skein_common::agent::permissions::{tighten, CompiledPolicy};
use skein_common::agent::skills::SkillCatalog;
use skein_common::protocol::message::Message;
use skein_common::protocol::{
    call_key, child_session_id, validate_token, ApprovalDecision, ApprovalRequest, CancelRequest,
    Failure, FinalResult, PermissionPolicy, StoredFinal, SubagentTask, TaskSubmission, ToolResult,
    ToolSpec, ToolTask, TurnEvent, WorkerAnnouncement,
};
use skein_common::subjects;

/// Decodes `bytes` as `T`; what decodes must survive an encode/decode round trip unchanged.
fn decode<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) -> Option<T> {
    let value: T = serde_json::from_slice(bytes).ok()?;
    let encoded = serde_json::to_vec(&value).expect("a decoded message encodes");
    let again: T = serde_json::from_slice(&encoded).expect("an encoded message decodes");
    assert_eq!(again, value, "round trip changed the message");
    Some(value)
}

fuzz_target!(|bytes: &[u8]| {
    if let Some(submission) = decode::<TaskSubmission>(bytes) {
        let valid = submission.validate(1024 * 1024).is_ok();
        let _ = submission.origin().time_left();
        if valid {
            let subject = subjects::submit(&submission.tenant, &submission.session);
            assert_eq!(
                subjects::parse_submit(&subject),
                Some((submission.tenant.as_str(), submission.session.as_str()))
            );
        }
        if let Some(policy) = submission.overrides.and_then(|o| o.permissions) {
            if let Ok(tightened) = tighten(&PermissionPolicy::default(), &policy) {
                let _ = CompiledPolicy::compile(&tightened);
            }
        }
    }
    if let Some(task) = decode::<ToolTask>(bytes) {
        let _ = task.origin.time_left();
        let _ = call_key(&task.origin.task_id, 0, &task.call_id);
    }
    if let Some(task) = decode::<SubagentTask>(bytes) {
        for nesting_left in [0, 1, 3, u32::MAX] {
            let _ = check_spec(&task.agent, nesting_left);
        }
        let _ = CompiledPolicy::compile(&task.agent.permissions);
        let skills = SkillCatalog::from_skills(task.skills);
        let _ = skills.prompt_section(task.agent.skills.as_deref());
        let child = child_session_id(&task.origin.session, &task.call_id);
        assert!(validate_token("child", &child).is_ok(), "{child:?}");
    }
    if let Some(result) = decode::<ToolResult>(bytes) {
        let _ = result.outcome.observation();
    }
    if let Some(announcement) = decode::<WorkerAnnouncement>(bytes) {
        for now in [0, announcement.heartbeat_ms, u64::MAX] {
            let _ = announcement.is_alive(now);
            let _ = announcement.is_routable(now);
        }
    }
    if let Some(request) = decode::<ApprovalRequest>(bytes) {
        let _ = request.unanswered().count();
    }
    decode::<TurnEvent>(bytes);
    decode::<FinalResult>(bytes);
    decode::<StoredFinal>(bytes);
    decode::<CancelRequest>(bytes);
    decode::<ApprovalDecision>(bytes);
    decode::<Failure>(bytes);
    decode::<ToolSpec>(bytes);
    decode::<Vec<Message>>(bytes);
});
