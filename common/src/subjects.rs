//! Every NATS subject, stream and consumer name Skein uses, built here and nowhere else.
//!
//! | subject | carried by | payload |
//! | --- | --- | --- |
//! | `skein.submit.{tenant}.{session}` | stream `SKEIN_SUBMIT` (work queue), consumer `skein-leads` | `TaskSubmission` |
//! | `skein.submit~{k}.{tenant}.{session}` | stream `SKEIN_SUBMIT_{k}`: submit partition `k` ≥ 1, with the same consumer | `TaskSubmission` |
//! | `skein.tool.{pool}.{tool}` | stream `SKEIN_WORK` (work queue), consumer `skein-tools-{pool}` | `ToolTask` |
//! | `skein.agent.{pool}.{agent}` | stream `SKEIN_WORK`, consumer `skein-agents-{pool}` (every type) or `skein-agents-{pool}~{agent}` (one per type the pool's workers list) | `SubagentTask` |
//! | `skein.tool~{k}.{pool}.{tool}`, `skein.agent~{k}.{pool}.{agent}` | stream `SKEIN_WORK_{k}`: work partition `k` ≥ 1, with the same consumers as `SKEIN_WORK` | `ToolTask`, `SubagentTask` |
//! | `skein.reply.{instance}.{n}` | core NATS | `ToolResult` of dispatch `n` |
//! | `skein.events.{tenant}.{task_id}` | stream `SKEIN_EVENTS` (limits, replayable) | `TurnEvent` |
//! | `skein.events.{tenant}.{task_id}.~{k}` | stream `SKEIN_EVENTS_{k}`: events partition `k` ≥ 1 | `TurnEvent` |
//! | `skein.cancel.{tenant}.{task_id}` | stream `SKEIN_CANCEL` (limits, 1 day) and core subscribers | `CancelRequest` |
//! | `skein.approval.{tenant}.{task_id}` | stream `SKEIN_APPROVALS` (work queue), consumer `skein-leads-approvals` | `ApprovalDecision` |
//! | `skein.control.{tenant}.{task_id}` | stream `SKEIN_APPROVALS` (work queue), consumer `skein-leads-control` | `RunControl` (pause, resume, steer) |
//! | `skein.wake.{tenant}.{task_id}` | core NATS | empty: a suspended turn's answer, or a control of the task, is recorded |
//! | `skein.turned.{tenant}.{session}` | core NATS | empty: the session may be free for its next turn (a lease released, a submission settled) |
//! | `skein.result.{tenant}.{session}.{task_id}` | core NATS request, queue group `skein-leads` | empty; the reply is a `StoredFinal` |
//! | `skein.dlq.{submit,tool,agent,other}` | stream `SKEIN_DLQ` (limits, 14 days) | the original payload, with why and how often it was tried in headers |
//!
//! Invariants: every token interpolated here has passed `protocol::validate_token` (or is a
//! process-chosen id of the same alphabet), so no subject gains a wildcard or an extra level. Each
//! pool binds one tool consumer and either one agent consumer for every type or one per listed
//! type, with non-overlapping filters, as a work-queue stream on nats-server 2.9 requires. A
//! per-type consumer's name joins pool and agent with `~`, which no token contains, so no two
//! (pool, agent) pairs, and no pool's every-type consumer, share a name.
//!
//! Partitions: a session's partition is a hash of its tenant and session
//! ([`session_partition`]), the same in every process and every version; its submissions and its
//! tasks' calls go there. Partition 0 is the `SKEIN_SUBMIT` and `SKEIN_WORK` streams with their
//! subjects as they always were; partition `k` ≥ 1 is the streams `SKEIN_SUBMIT_{k}` and
//! `SKEIN_WORK_{k}`, whose subjects mark their kind `submit~{k}`, `tool~{k}` or `agent~{k}`, so no
//! two partitions' subjects overlap and a subject's kind ([`kind`]) stays its second token without
//! the mark.
//!
//! Events are split by a hash of tenant and *task* ([`events_partition`]), since everyone who
//! reads them names a task and not always its session. Partition `k` ≥ 1 adds a last token `~{k}`
//! instead of marking the kind, so `skein.events.{tenant}.>` still covers a tenant's events in
//! every partition (a tenant's permission to watch is one subject); partition 0 (`SKEIN_EVENTS`)
//! holds only four-token subjects (`skein.events.*.*`), so no two partitions overlap.

pub const SUBMIT_STREAM: &str = "SKEIN_SUBMIT";
pub const WORK_STREAM: &str = "SKEIN_WORK";
pub const EVENTS_STREAM: &str = "SKEIN_EVENTS";
pub const DLQ_STREAM: &str = "SKEIN_DLQ";
pub const CANCEL_STREAM: &str = "SKEIN_CANCEL";
pub const AUDIT_STREAM: &str = "SKEIN_AUDIT";
pub const LEADS_CONSUMER: &str = "skein-leads";
pub const APPROVALS_STREAM: &str = "SKEIN_APPROVALS";
pub const APPROVALS_CONSUMER: &str = "skein-leads-approvals";
pub const APPROVALS_ALL: &str = "skein.approval.>";
pub const WAKE_ALL: &str = "skein.wake.>";
pub const CONTROL_CONSUMER: &str = "skein-leads-control";
pub const CONTROL_ALL: &str = "skein.control.>";
/// All announcements that a session may be free for its next turn.
pub const TURNED_ALL: &str = "skein.turned.>";
/// All lookups of stored final results.
pub const RESULT_ALL: &str = "skein.result.>";
/// The queue group of the leads answering result lookups.
pub const RESULT_QUEUE: &str = "skein-leads";

/// All subjects of the submit stream.
pub const SUBMIT_ALL: &str = "skein.submit.>";
/// All subjects of the work stream.
pub const WORK_ALL: [&str; 2] = ["skein.tool.>", "skein.agent.>"];
/// Every task event of every partition (the events stream's one subject before it was split).
pub const EVENTS_ALL: &str = "skein.events.>";
/// All cancel requests.
pub const CANCEL_ALL: &str = "skein.cancel.>";
/// All subjects of the dead-letter stream.
pub const DLQ_ALL: &str = "skein.dlq.>";

/// Where the tasks of one session are submitted, in submit partition 0 (`SKEIN_SUBMIT`; see
/// [`submit_in`]). One subject per session lets a lead find the session's oldest unfinished task
/// in the work-queue stream, which keeps turns in order.
pub fn submit(tenant: &str, session: &str) -> String {
    submit_in(0, tenant, session)
}

/// Where the tasks of one session are submitted in submit partition `partition`:
/// `skein.submit.{tenant}.{session}` in partition 0, `skein.submit~{k}.{tenant}.{session}` in
/// partition `k` ≥ 1 (stream [`submit_stream`]).
pub fn submit_in(partition: u32, tenant: &str, session: &str) -> String {
    let kind = partition_kind("submit", partition);
    crate::text::joined(&["skein.", &kind, ".", tenant, ".", session])
}

/// The tenant and session named by a submit subject of any partition, if it is one.
pub fn parse_submit(subject: &str) -> Option<(&str, &str)> {
    parse_submit_in(subject).map(|(_, tenant, session)| (tenant, session))
}

/// The partition, tenant and session named by a submit subject, if it is one (the inverse of
/// [`submit_in`]).
pub fn parse_submit_in(subject: &str) -> Option<(u32, &str, &str)> {
    let rest = subject.strip_prefix("skein.submit")?;
    let (partition, rest) = match rest.strip_prefix('.') {
        Some(rest) => (0, rest),
        None => {
            let (mark, rest) = rest.strip_prefix('~')?.split_once('.')?;
            let k: u32 = mark.parse().ok()?;
            (k >= 1 && k.to_string() == mark).then_some((k, rest))?
        }
    };
    let (tenant, session) = rest.split_once('.')?;
    (!tenant.is_empty() && !session.is_empty() && !session.contains('.'))
        .then_some((partition, tenant, session))
}

/// The submit stream of partition `partition`: `SKEIN_SUBMIT`, then `SKEIN_SUBMIT_1`, ….
pub fn submit_stream(partition: u32) -> String {
    partition_stream(SUBMIT_STREAM, partition)
}

/// The subjects of partition `partition`'s submit stream.
pub fn submit_subjects(partition: u32) -> String {
    format!("skein.{}.>", partition_kind("submit", partition))
}

/// Most work partitions (`SKEIN_PARTITIONS`).
pub const MAX_PARTITIONS: u32 = 64;

/// The partition of a session's submissions and of its tasks' calls, of `partitions` (FNV-1a
/// over `tenant.session`: the same in every process and version, spread evenly).
pub fn session_partition(tenant: &str, session: &str, partitions: u32) -> u32 {
    if partitions <= 1 {
        return 0;
    }
    let bytes = tenant
        .bytes()
        .chain(std::iter::once(b'.'))
        .chain(session.bytes());
    let hash = bytes.fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    hash % partitions
}

/// The stream of partition `partition` of the partitioned stream `base` ([`WORK_STREAM`],
/// [`SUBMIT_STREAM`]): `base` itself, then `{base}_1`, `{base}_2`, ….
pub fn partition_stream(base: &str, partition: u32) -> String {
    match partition {
        0 => base.to_owned(),
        k => format!("{base}_{k}"),
    }
}

/// The partition of `base` a stream's name stands for, if it names one.
pub fn parse_partition_stream(base: &str, name: &str) -> Option<u32> {
    if name == base {
        return Some(0);
    }
    let k: u32 = name.strip_prefix(base)?.strip_prefix('_')?.parse().ok()?;
    (k >= 1 && partition_stream(base, k) == name).then_some(k)
}

/// The work stream of partition `partition`: `SKEIN_WORK`, then `SKEIN_WORK_1`, `SKEIN_WORK_2`, ….
pub fn work_stream(partition: u32) -> String {
    partition_stream(WORK_STREAM, partition)
}

/// The partition a work stream's name stands for, if it names one.
pub fn parse_work_stream(name: &str) -> Option<u32> {
    parse_partition_stream(WORK_STREAM, name)
}

/// The subjects of partition `partition`'s work stream.
pub fn work_subjects(partition: u32) -> Vec<String> {
    ["tool", "agent"]
        .iter()
        .map(|kind| format!("skein.{}.>", partition_kind(kind, partition)))
        .collect()
}

/// The second token of a partitioned subject (work, submissions): the kind, marked with the
/// partition from 1 on.
fn partition_kind(kind: &str, partition: u32) -> std::borrow::Cow<'_, str> {
    match partition {
        0 => kind.into(),
        k => format!("{kind}~{k}").into(),
    }
}

/// What a subject carries: its second token (`submit`, `tool`, `agent`, `events`, …), without
/// a work partition's mark.
pub fn kind(subject: &str) -> &str {
    let second = subject.split('.').nth(1).unwrap_or_default();
    second.split_once('~').map_or(second, |(kind, _)| kind)
}

/// Where a call of `tool` is sent for workers of `pool`, in work partition `partition`.
pub fn tool_task(partition: u32, pool: &str, tool: &str) -> String {
    let kind = partition_kind("tool", partition);
    crate::text::joined(&["skein.", &kind, ".", pool, ".", tool])
}

/// Filter of the consumer shared by the workers of `pool` for tool tasks, on partition
/// `partition`'s stream.
pub fn tool_filter(partition: u32, pool: &str) -> String {
    format!("skein.{}.{pool}.>", partition_kind("tool", partition))
}

/// Durable consumer of `pool`'s tool tasks.
pub fn tool_consumer(pool: &str) -> String {
    format!("skein-tools-{pool}")
}

/// Where a subagent task for `agent` is sent for workers of `pool`, in work partition
/// `partition`.
pub fn agent_task(partition: u32, pool: &str, agent: &str) -> String {
    format!(
        "skein.{}.{pool}.{agent}",
        partition_kind("agent", partition)
    )
}

/// Filter of the consumer shared by the workers of `pool` for subagent tasks, on partition
/// `partition`'s stream.
pub fn agent_filter(partition: u32, pool: &str) -> String {
    format!("skein.{}.{pool}.>", partition_kind("agent", partition))
}

/// Durable consumer of `pool`'s subagent tasks.
pub fn agent_consumer(pool: &str) -> String {
    format!("skein-agents-{pool}")
}

/// Filter of the consumer shared by the workers of `pool` that run subagents of type `agent`
/// only (a list of types, not every type), on partition `partition`'s stream.
pub fn agent_type_filter(partition: u32, pool: &str, agent: &str) -> String {
    agent_task(partition, pool, agent)
}

/// Durable consumer of `pool`'s subagent tasks of type `agent` (see [`agent_type_filter`]).
pub fn agent_type_consumer(pool: &str, agent: &str) -> String {
    format!("skein-agents-{pool}~{agent}")
}

/// Whether some subject matches both filters (`*` one token, `>` one or more at the end): two
/// consumers of a work-queue stream with overlapping filters are refused by the server.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('.'), b.split('.'));
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            _ => return false,
        }
    }
}

/// Prefix of every reply subject.
pub const REPLY_PREFIX: &str = "skein.reply.";

/// Where the result of dispatch number `n` of process `instance` arrives.
pub fn reply(instance: &str, n: u64) -> String {
    crate::text::joined_with_number(&[REPLY_PREFIX, instance, "."], 3, n)
}

/// All reply subjects of process `instance`.
pub fn reply_filter(instance: &str) -> String {
    format!("{REPLY_PREFIX}{instance}.*")
}

/// The dispatch number a reply subject names.
pub fn reply_number(subject: &str) -> Option<u64> {
    subject.rsplit('.').next()?.parse().ok()
}

/// Where a message that could not be handled is kept, by the kind of its original subject
/// (`submit`, `tool`, `agent`, or `other`).
pub fn dead_letter(original_subject: &str) -> String {
    let kind = match kind(original_subject) {
        kind @ ("submit" | "tool" | "agent") => kind,
        _ => "other",
    };
    format!("skein.dlq.{kind}")
}

/// Where a request to cancel a task is published (kept in `SKEIN_CANCEL`, so work that starts
/// later still sees it).
pub fn cancel(tenant: &str, task_id: &str) -> String {
    crate::text::joined(&["skein.cancel.", tenant, ".", task_id])
}

/// Where a cancel request for one subagent run of a task (and the runs under it) is published.
pub fn cancel_call(tenant: &str, task_id: &str, call_id: &str) -> String {
    format!("skein.cancel.{tenant}.{task_id}.{call_id}")
}

/// The tenant, task and call a cancel request for one subagent run names.
pub fn parse_cancel_call(subject: &str) -> Option<(&str, &str, &str)> {
    let rest = subject.strip_prefix("skein.cancel.")?;
    let mut parts = rest.split('.');
    let (tenant, task, call) = (parts.next()?, parts.next()?, parts.next()?);
    let plain = parts.next().is_none() && ![tenant, task, call].iter().any(|p| p.is_empty());
    plain.then_some((tenant, task, call))
}

/// The key under which the work of one subagent run (and of the runs under it) is registered
/// for cancelling, beside its task's.
pub fn run_cancel_key(task_id: &str, call_id: &str) -> String {
    format!("{task_id}.{call_id}")
}

/// The tenant and task a cancel subject names.
pub fn parse_cancel(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("skein.cancel.")?;
    let (tenant, task) = rest.split_once('.')?;
    (!tenant.is_empty() && !task.is_empty() && !task.contains('.')).then_some((tenant, task))
}

/// Where a pause, resume or steer of a task is published.
pub fn control(tenant: &str, task_id: &str) -> String {
    format!("skein.control.{tenant}.{task_id}")
}

pub fn parse_control(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("skein.control.")?;
    let (tenant, task) = rest.split_once('.')?;
    (!tenant.is_empty() && !task.is_empty() && !task.contains('.')).then_some((tenant, task))
}

/// Where an answer to a task's approval requests is published.
pub fn approval(tenant: &str, task_id: &str) -> String {
    format!("skein.approval.{tenant}.{task_id}")
}

pub fn parse_approval(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("skein.approval.")?;
    let (tenant, task) = rest.split_once('.')?;
    (!tenant.is_empty() && !task.is_empty() && !task.contains('.')).then_some((tenant, task))
}

/// Tells the lead holding a suspended turn that its answer is recorded.
pub fn wake(tenant: &str, task_id: &str) -> String {
    format!("skein.wake.{tenant}.{task_id}")
}

pub fn parse_wake(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("skein.wake.")?;
    let (tenant, task) = rest.split_once('.')?;
    (!tenant.is_empty() && !task.is_empty() && !task.contains('.')).then_some((tenant, task))
}

/// Where a client asks any lead for a task's stored final result.
pub fn result(tenant: &str, session: &str, task_id: &str) -> String {
    format!("skein.result.{tenant}.{session}.{task_id}")
}

/// The tenant, session and task id of a result lookup.
pub fn parse_result(subject: &str) -> Option<(&str, &str, &str)> {
    let rest = subject.strip_prefix("skein.result.")?;
    let (tenant, rest) = rest.split_once('.')?;
    let (session, task) = rest.split_once('.')?;
    let tokens = [tenant, session, task];
    (tokens.iter().all(|t| !t.is_empty()) && !task.contains('.')).then_some((tenant, session, task))
}

/// Where a lead announces that a session may be free for its next turn.
pub fn turned(tenant: &str, session: &str) -> String {
    crate::text::joined(&["skein.turned.", tenant, ".", session])
}

pub fn parse_turned(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("skein.turned.")?;
    let (tenant, session) = rest.split_once('.')?;
    (!tenant.is_empty() && !session.is_empty() && !session.contains('.'))
        .then_some((tenant, session))
}

/// The events of one task in events partition `partition` (see [`events_partition`]):
/// `skein.events.{tenant}.{task_id}` in partition 0, with a last token `~{k}` in partition `k`.
pub fn events_in(partition: u32, tenant: &str, task_id: &str) -> String {
    match partition {
        0 => crate::text::joined(&["skein.events.", tenant, ".", task_id]),
        k => crate::text::joined_with_number(
            &["skein.events.", tenant, ".", task_id, ".~"],
            5,
            u64::from(k),
        ),
    }
}

/// The partition, tenant and task id of an event subject, if it is one (the inverse of
/// [`events_in`]).
pub fn parse_events(subject: &str) -> Option<(u32, &str, &str)> {
    let rest = subject.strip_prefix("skein.events.")?;
    let (tenant, rest) = rest.split_once('.')?;
    let (task, partition) = match rest.split_once('.') {
        None => (rest, 0),
        Some((task, mark)) => {
            let digits = mark.strip_prefix('~')?;
            let k: u32 = digits.parse().ok()?;
            (k >= 1 && k.to_string() == digits).then_some((task, k))?
        }
    };
    (!tenant.is_empty() && !task.is_empty()).then_some((partition, tenant, task))
}

/// The events partition of a task, of `partitions`: the same hash as [`session_partition`],
/// over tenant and task id.
pub fn events_partition(tenant: &str, task_id: &str, partitions: u32) -> u32 {
    session_partition(tenant, task_id, partitions)
}

/// The events stream of partition `partition`: `SKEIN_EVENTS`, then `SKEIN_EVENTS_1`, ….
pub fn events_stream(partition: u32) -> String {
    partition_stream(EVENTS_STREAM, partition)
}

/// The subjects of partition `partition`'s events stream.
pub fn events_subjects(partition: u32) -> String {
    match partition {
        0 => "skein.events.*.*".to_owned(),
        k => format!("skein.events.*.*.~{k}"),
    }
}

/// Every task's events of a tenant, in every partition (a subscription's filter).
pub fn tenant_events(tenant: &str) -> String {
    format!("skein.events.{tenant}.>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lookups_round_trip_and_refuse_extra_levels() {
        assert_eq!(parse_result(&result("t", "s", "k")), Some(("t", "s", "k")));
        for bad in [
            "skein.result.t.s",
            "skein.result.t.s.k.x",
            "skein.result..s.k",
        ] {
            assert_eq!(parse_result(bad), None, "{bad}");
        }
    }

    #[test]
    fn pool_filters_do_not_overlap() {
        let tool = tool_filter(0, "default");
        let agent = agent_filter(0, "default");
        assert_ne!(tool, agent);
        assert!(tool_task(0, "default", "read_file").starts_with(tool.trim_end_matches('>')));
        assert!(agent_task(0, "default", "researcher").starts_with(agent.trim_end_matches('>')));
        assert!(!tool_task(0, "default", "x").starts_with(agent.trim_end_matches('>')));
    }

    #[test]
    fn per_type_agent_consumers_split_the_pool_and_never_share_a_name() {
        let researcher = agent_type_filter(0, "default", "researcher");
        let writer = agent_type_filter(0, "default", "writer");
        assert_eq!(researcher, agent_task(0, "default", "researcher"));
        assert!(!filters_overlap(&researcher, &writer));
        assert!(!filters_overlap(&researcher, &tool_filter(0, "default")));
        assert!(!filters_overlap(&researcher, &agent_filter(0, "other")));
        // The every-type consumer of the same pool overlaps: a pool is one or the other.
        assert!(filters_overlap(&researcher, &agent_filter(0, "default")));
        assert!(filters_overlap(&agent_filter(0, "default"), &researcher));
        assert_ne!(
            agent_type_consumer("a-b", "c"),
            agent_type_consumer("a", "b-c")
        );
        assert_ne!(
            agent_type_consumer("web", "researcher"),
            agent_consumer("web-researcher")
        );
    }

    #[test]
    fn filters_overlap_as_the_server_matches_them() {
        for (a, b) in [
            ("a.b", "a.b"),
            ("a.*", "a.b"),
            ("a.>", "a.b.c"),
            ("*.b", "a.*"),
            ("a.>", "*.*"),
        ] {
            assert!(filters_overlap(a, b), "{a} {b}");
            assert!(filters_overlap(b, a), "{b} {a}");
        }
        for (a, b) in [
            ("a.b", "a.c"),
            ("a.>", "a"),
            ("a.*", "a.b.c"),
            ("a.b", "a.b.c"),
        ] {
            assert!(!filters_overlap(a, b), "{a} {b}");
            assert!(!filters_overlap(b, a), "{b} {a}");
        }
    }

    #[test]
    fn approval_and_wake_subjects_name_tenant_and_task() {
        assert_eq!(
            parse_approval(&approval("acme", "t1")),
            Some(("acme", "t1"))
        );
        assert_eq!(parse_wake(&wake("acme", "t1")), Some(("acme", "t1")));
        assert_eq!(parse_approval("skein.approval.acme.t1.x"), None);
        assert_eq!(parse_wake("skein.wake.acme"), None);
    }

    #[test]
    fn cancel_subjects_name_tenant_and_task() {
        assert_eq!(parse_cancel(&cancel("acme", "t1")), Some(("acme", "t1")));
        assert_eq!(parse_cancel("skein.cancel.acme"), None);
    }

    #[test]
    fn dead_letters_are_filed_by_kind() {
        assert_eq!(dead_letter(&submit("a", "s")), "skein.dlq.submit");
        assert_eq!(
            dead_letter(&tool_task(0, "p", "read_file")),
            "skein.dlq.tool"
        );
        assert_eq!(dead_letter(&agent_task(0, "p", "r")), "skein.dlq.agent");
        assert_eq!(dead_letter("weird"), "skein.dlq.other");
        assert_eq!(dead_letter(&tool_task(3, "p", "x")), "skein.dlq.tool");
        assert_eq!(dead_letter(&agent_task(2, "p", "r")), "skein.dlq.agent");
        assert_eq!(dead_letter("skein.other~1.x"), "skein.dlq.other");
    }

    #[test]
    fn partition_zero_keeps_the_subjects_of_one_work_stream() {
        assert_eq!(work_stream(0), WORK_STREAM);
        assert_eq!(work_subjects(0), WORK_ALL);
        assert_eq!(tool_task(0, "p", "x"), "skein.tool.p.x");
        assert_eq!(agent_filter(0, "p"), "skein.agent.p.>");
        assert_eq!(session_partition("acme", "s1", 1), 0);
    }

    #[test]
    fn partitions_have_streams_and_subjects_of_their_own() {
        for k in 0..MAX_PARTITIONS {
            assert_eq!(parse_work_stream(&work_stream(k)), Some(k));
            // Every subject of a partition is in its stream's subjects and in no other's.
            let task = tool_task(k, "pool", "read_file");
            let subagent = agent_task(k, "pool", "researcher");
            for other in 0..MAX_PARTITIONS {
                let covers = |subject: &str| {
                    work_subjects(other)
                        .iter()
                        .any(|filter| filters_overlap(filter, subject))
                };
                assert_eq!(covers(&task), k == other, "{task} in {other}");
                assert_eq!(covers(&subagent), k == other, "{subagent} in {other}");
                assert!(!filters_overlap(
                    &work_subjects(k)[0],
                    &work_subjects(other)[1]
                ));
            }
            assert!(filters_overlap(&tool_filter(k, "pool"), &task));
            assert!(!filters_overlap(&tool_filter(k, "other"), &task));
            assert_eq!(kind(&task), "tool");
            assert_eq!(kind(&subagent), "agent");
        }
        for name in [
            "SKEIN_WORK_0",
            "SKEIN_WORK_01",
            "SKEIN_WORK_x",
            "SKEIN_WORKS",
            "SKEIN_SUBMIT",
        ] {
            assert_eq!(parse_work_stream(name), None, "{name}");
        }
    }

    #[test]
    fn sessions_spread_over_the_partitions_and_keep_theirs() {
        let mut counts = [0u32; 3];
        for i in 0..3000 {
            let session = format!("session-{i}");
            let k = session_partition("acme", &session, 3);
            assert_eq!(k, session_partition("acme", &session, 3));
            counts[k as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
        // The same bytes in every process and version (FNV-1a of "a.b").
        assert_eq!(session_partition("a", "b", 1 << 31), 0x108b_f50c);
    }

    #[test]
    fn reply_subjects_carry_their_dispatch_number() {
        assert_eq!(reply_number(&reply("lead-1", 42)), Some(42));
        assert!(reply("lead-1", 7).starts_with(reply_filter("lead-1").trim_end_matches('*')));
        assert_eq!(reply_number("skein.reply.lead-1.x"), None);
    }

    #[test]
    fn submit_partitions_have_streams_and_subjects_of_their_own() {
        assert_eq!(submit_stream(0), SUBMIT_STREAM);
        assert_eq!(submit_subjects(0), SUBMIT_ALL);
        assert_eq!(submit_in(0, "acme", "s1"), submit("acme", "s1"));
        for k in 0..MAX_PARTITIONS {
            let subject = submit_in(k, "acme", "s1");
            assert_eq!(parse_submit(&subject), Some(("acme", "s1")), "{subject}");
            assert_eq!(parse_submit_in(&subject), Some((k, "acme", "s1")));
            assert_eq!(kind(&subject), "submit");
            assert_eq!(dead_letter(&subject), "skein.dlq.submit");
            assert_eq!(
                parse_partition_stream(SUBMIT_STREAM, &submit_stream(k)),
                Some(k)
            );
            assert_eq!(parse_work_stream(&submit_stream(k)), None);
            for other in 0..MAX_PARTITIONS {
                assert_eq!(
                    filters_overlap(&submit_subjects(other), &subject),
                    k == other,
                    "{subject} in {other}"
                );
            }
        }
        for subject in [
            "skein.submit~0.acme.s1",
            "skein.submit~01.acme.s1",
            "skein.submit~x.acme.s1",
            "skein.submit~.acme.s1",
            "skein.submit~1",
            "skein.submits.acme.s1",
        ] {
            assert_eq!(parse_submit(subject), None, "{subject}");
        }
    }

    #[test]
    fn events_partitions_have_streams_and_subjects_of_their_own() {
        assert_eq!(events_stream(0), EVENTS_STREAM);
        assert_eq!(events_in(0, "acme", "t1"), "skein.events.acme.t1");
        assert_eq!(events_partition("acme", "t1", 1), 0);
        for k in 0..MAX_PARTITIONS {
            let subject = events_in(k, "acme", "t1");
            assert_eq!(parse_events(&subject), Some((k, "acme", "t1")), "{subject}");
            assert_eq!(kind(&subject), "events");
            assert_eq!(
                parse_partition_stream(EVENTS_STREAM, &events_stream(k)),
                Some(k)
            );
            // A tenant's one filter covers its events in every partition, and no other tenant's.
            assert!(filters_overlap(&tenant_events("acme"), &subject));
            assert!(!filters_overlap(&tenant_events("globex"), &subject));
            for other in 0..MAX_PARTITIONS {
                assert_eq!(
                    filters_overlap(&events_subjects(other), &subject),
                    k == other,
                    "{subject} in {other}"
                );
                assert_eq!(
                    filters_overlap(&events_subjects(other), &events_subjects(k)),
                    k == other
                );
            }
        }
        for subject in [
            "skein.events.acme.t1.~0",
            "skein.events.acme.t1.~01",
            "skein.events.acme.t1.1",
            "skein.events.acme.t1.~1.x",
            "skein.events.acme.t1.~",
            "skein.events.acme",
            "skein.events..t1",
        ] {
            assert_eq!(parse_events(subject), None, "{subject}");
        }
    }

    #[test]
    fn tenant_is_read_back_from_submit_subjects() {
        assert_eq!(parse_submit(&submit("acme", "s1")), Some(("acme", "s1")));
        assert_eq!(parse_submit("skein.submit.a"), None);
        assert_eq!(parse_submit("skein.submit.a.b.c"), None);
        assert_eq!(parse_submit("skein.other.a.b"), None);
    }
}
