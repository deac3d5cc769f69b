//! Every Redis key Skein uses, built here and nowhere else.
//!
//! All keys of one session share the hash tag `{tenant:session}`, so multi-key scripts stay valid
//! on Redis Cluster. Tokens are validated (`protocol::validate_token`) before they get here, so a
//! key cannot contain another key's tag.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `skein:{t:s}:session` | hash `version`, `state` | the session (turns, skills; sessions saved before history lists hold their history here too), versioned for compare-and-set |
//! | `skein:{t:s}:history` | list of `Message` JSON | the session's history, appended to by each turn (a turn writes only its new messages) |
//! | `skein:{t:s}:lease` | string | the token of the lead running the session's turn, always with an expiry (one found without is given the lease's time to live: see `store::lease`) |
//! | `skein:{t:s}:results:{task}` | hash `task_id:step:call_id` → `ToolResult` | the task's call results, first write wins (expire 7 days after the task's last call, so an active session does not keep them forever) |
//! | `skein:{t:s}:attempts:{task}` | hash work key → count | attempts at the task's turn (`turn:{task}`) or calls (their call keys), expiring as the results |
//! | `skein:{t:s}:running:{call_key}` | string | the owner (`worker/nonce-n`: a nonce drawn once per process, and the run's number) of a call's run in progress, renewed while it runs and expiring soon after its worker stops renewing; deleted when the result is recorded |
//! | `skein:{t:s}:checkpoints:{task}` | hash lease token → `TurnCheckpoint`, `""` → the token whose checkpoint counts | checkpoints of an unfinished turn, one per lead that ran it: each lead writes only its own field, and the turn-start script names the new holder, carrying the checkpoint it resumes from over to that holder's field (expires 24 h after the turn's start, refreshed by the holder's writes at most hourly) |
//! | `skein:{t:s}:turn:{task}` | string | a turn's checkpoint as earlier versions wrote it; read (and dropped) by the turn-start script when the hash above names no holder |
//! | `skein:{t:s}:call:{call_key}` | string | checkpoint of a subagent call's unfinished child turn, in the child session (`TurnCheckpoint`, expires) |
//! | `skein:{t:s}:trace:{task}` | string | the W3C `traceparent` of the first delivery of a task submitted without trace context, which its later deliveries continue (written by the turn-start script, expiring as the attempts) |
//! | `skein:{t:s}:epoch:{work}` | counter | deliveries of a task's turn (`work` = task id) or of a subagent call (its call key) that emitted events, so event sequence numbers grow across deliveries (expires) |
//! | `skein:{t:s}:final:{task}` | string | a task's `FinalResult` (expires) |
//! | `skein:{t:s}:control:{task}` | hash | what was asked of `task`: `paused`, `was_paused`, `interrupt` (the later task of the session that interrupted it), `steered` (count); read by the turn-start script (expires 7 days after its last change) |
//! | `skein:{t:s}:turns` | list | records of the session's ended turns (turn, task, time, model, steps, calls, tokens, messages), at most `SKEIN_SESSION_CHECKPOINTS` |
//! | `skein:{t:s}:steer:{task}` | list | the messages `task` was steered with, in order |
//! | `skein:{t:s}:approved` | set of rules | rules approved for the rest of the session (`--always`) |
//! | `skein:requests:{t}:{key}:{window}` | counter | requests of one gateway key (the head of its hash) in one minute since the Unix epoch, for the rate limit (expires) |
//! | `skein:responses:{t}:{id}` | string | a run started through the gateway's Responses API: its session, agent, metadata (`ResponseRecord`; expires as sessions do) |
//! | `skein:{t:s}:thread` | string | a session as a thread of the gateway's Agent Protocol: when it was made and changed, its metadata (`ThreadRecord`; expires as sessions do) |
//! | `skein:{t:s}:runs` | hash run_id → `RunRecord` | the thread's runs: which task each follows, its assistant, metadata, multitask strategy (expires as sessions do) |
//! | `skein:threads:{t}` | sorted set thread id → creation (ms) | the tenant's threads, for search (an id whose record expired is dropped when met) |
//! | `skein:approvals:{t}` | hash task_id → `ApprovalRequest` | the tenant's suspended turns (see `approvals`) |
//! | `skein:answers:{t}:{task}` | hash call_id → `ApprovalAnswer` | answers to a suspended turn's calls |
//! | `skein:nonce:{t}:{key}:{nonce}` | string | a signature nonce of principal key `key` seen in an operation on tenant `t`'s tasks, so its replay is refused (expires after twice the signature window) |
//! | `skein:workers` | hash worker_id → `WorkerAnnouncement` | the live worker registry |
//! | `skein:workspace-sweep` | string | the lead that claimed the latest sweep of expired sessions' workspaces (expires after the sweep interval, so one lead sweeps per interval) |
//! | `skein:model:{m}:slots` | sorted set `tenant\|holder` → lease expiry (ms) | the model calls in flight on model `m`, across every process (see `store::traffic`); a holder that stops renewing is dropped once its lease expires |
//! | `skein:model:{m}:waiting` | sorted set tenant → expiry (ms) | tenants with a call waiting for a slot of model `m`, refreshed while they wait |
//! | `skein:model:{m}:tokens:{minute}` | counter | tokens used on model `m` in one minute since the Unix epoch (expires) |
//! | `skein:model:{m}:waiting_since` | hash tenant → ms | when each waiting tenant started waiting (a freed slot goes to the one waiting longest among those holding fewest) |
//! | `skein:model:{m}:tokens:{minute}:{t}` | counter | tokens tenant `t` used on model `m` in one minute (expires) |
//! | `skein:agent:{a}:slots` | sorted set holder → lease expiry (ms) | the runs of subagent type `a` in progress across the cluster, for its `max_concurrency` (see `store::traffic`); a holder that stops renewing is dropped once its lease expires |
//! | `skein:{t:s}:budget:{task}` | hash `tokens`, `cost`, `held_tokens`, `held_cost` | what user task `task` of session `s` (its subagents included) spent on models and holds for calls in flight; cost in nano-dollars (see `store::budget`; expires 7 days after its last change) |
//! | `skein:{t:s}:budget:{task}:held` | sorted set `id\|tokens\|cost` → lapse (ms) | the task's reservations of calls in flight |
//! | `skein:budget:{t}:{day}` | hash, as a task's | what tenant `t` spent on models on a UTC day (`YYYY-MM-DD`) and holds for calls in flight (expires after 2 days) |
//! | `skein:budget:{t}:{day}:held` | sorted set, as a task's | the tenant's reservations of that day |

/// `skein:{tenant:session}` followed by `rest`, built at its exact length.
fn in_session(tenant: &str, session: &str, rest: &[&str]) -> String {
    let len = "skein:{:}".len()
        + tenant.len()
        + session.len()
        + rest.iter().map(|part| part.len()).sum::<usize>();
    let mut key = String::with_capacity(len);
    for part in ["skein:{", tenant, ":", session, "}"] {
        key.push_str(part);
    }
    for part in rest {
        key.push_str(part);
    }
    key
}

pub fn session(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":session"])
}

/// The session's history, one message per element.
pub fn history(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":history"])
}

/// A signature nonce seen from principal key `key` (see `store::nonces`).
pub fn nonce(tenant: &str, key: &str, nonce: &str) -> String {
    format!("skein:nonce:{{{tenant}}}:{key}:{nonce}")
}

/// The requests of gateway key `key_id` in minute `window` since the Unix epoch.
pub fn requests(tenant: &str, key_id: &str, window: u64) -> String {
    format!("skein:requests:{{{tenant}}}:{key_id}:{window}")
}

/// A response of the gateway's Responses API.
pub fn response(tenant: &str, id: &str) -> String {
    format!("skein:responses:{{{tenant}}}:{id}")
}

/// A session's thread record (the gateway's Agent Protocol).
pub fn thread(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":thread"])
}

/// A thread's runs.
pub fn thread_runs(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":runs"])
}

/// The tenant's threads by creation time.
pub fn threads(tenant: &str) -> String {
    format!("skein:threads:{{{tenant}}}")
}

pub fn lease(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":lease"])
}

/// The task a work key belongs to: a turn's attempts field `turn:{task}`, or a call key
/// `{task}:{step}:{call}`.
fn task_of(work: &str) -> &str {
    match work.strip_prefix("turn:") {
        Some(task) => task,
        None => work.split(':').next().unwrap_or(work),
    }
}

/// The call results of the task that `work` (a call key) belongs to.
pub fn results(tenant: &str, session: &str, work: &str) -> String {
    in_session(tenant, session, &[":results:", task_of(work)])
}

/// The attempt counts of the task that `work` (a call key or a turn's field) belongs to.
pub fn attempts(tenant: &str, session: &str, work: &str) -> String {
    in_session(tenant, session, &[":attempts:", task_of(work)])
}

/// The marker of a call's run in progress (see `SessionStore::claim_call`).
pub fn running_call(tenant: &str, session: &str, call_key: &str) -> String {
    in_session(tenant, session, &[":running:", call_key])
}

/// A turn's checkpoints, one field per lead that ran it (see `SessionStore::save_checkpoint`).
pub fn checkpoint(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":checkpoints:", task_id])
}

/// A turn's checkpoint as a single string, as earlier versions wrote it.
pub fn legacy_checkpoint(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":turn:", task_id])
}

/// The checkpoint of a subagent call's child turn, in the child session, by the call's key.
pub fn call_checkpoint(tenant: &str, child_session: &str, call_key: &str) -> String {
    in_session(tenant, child_session, &[":call:", call_key])
}

/// The outcome of a subagent call's child turn, in the child session, written with the child
/// session's save: a redelivered task finds it and records it instead of running the turn again.
pub fn call_outcome(tenant: &str, child_session: &str, call_key: &str) -> String {
    in_session(tenant, child_session, &[":outcome:", call_key])
}

/// The `traceparent` a task's later deliveries continue (a task submitted without one).
pub fn task_trace(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":trace:", task_id])
}

/// The delivery counter of a piece of work (a task's turn, or a subagent call by its key): each
/// delivery that emits events takes the next number, which leads its events' sequence numbers.
pub fn event_epoch(tenant: &str, session: &str, work: &str) -> String {
    in_session(tenant, session, &[":epoch:", work])
}

pub fn final_result(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":final:", task_id])
}

/// What was asked of a task: pause, interrupt, steer count (see `store::control`).
pub fn control(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":control:", task_id])
}

/// Records of the session's ended turns, oldest first (`store::history`).
pub fn turn_records(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":turns"])
}

/// The messages a task was steered with, in order.
pub fn steer(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":steer:", task_id])
}

pub fn approved_rules(tenant: &str, session: &str) -> String {
    in_session(tenant, session, &[":approved"])
}

/// The tenant's approval requests; shares the hash tag `{tenant}` with [`answers`].
pub fn approvals(tenant: &str) -> String {
    format!("skein:approvals:{{{tenant}}}")
}

/// The answers to the approval request under `key` (`protocol::approval_key`).
pub fn answers(tenant: &str, key: &str) -> String {
    format!("skein:answers:{{{tenant}}}:{key}")
}

pub const WORKERS: &str = "skein:workers";

/// The claim of the latest sweep of expired sessions' workspaces.
pub const WORKSPACE_SWEEP: &str = "skein:workspace-sweep";

/// The hash tag of a model's traffic keys; braces in a model name (which would move the tag) are
/// replaced, so every key of one model stays in one cluster slot.
fn model_tag(model: &str) -> String {
    let model: String = model
        .chars()
        .map(|c| if matches!(c, '{' | '}') { '_' } else { c })
        .collect();
    format!("skein:model:{{{model}}}")
}

/// The model calls in flight on `model`, by holder.
pub fn model_slots(model: &str) -> String {
    format!("{}:slots", model_tag(model))
}

/// The tenants waiting for a slot of `model`.
pub fn model_waiting(model: &str) -> String {
    format!("{}:waiting", model_tag(model))
}

/// When each tenant waiting for a slot of `model` started waiting (Redis time, ms).
pub fn model_waiting_since(model: &str) -> String {
    format!("{}:waiting_since", model_tag(model))
}

/// The tokens `tenant` used on `model` in `minute` (minutes since the Unix epoch).
pub fn model_tenant_tokens(model: &str, tenant: &str, minute: u64) -> String {
    format!("{}:tokens:{minute}:{tenant}", model_tag(model))
}

/// The tokens used on `model` in `minute` (minutes since the Unix epoch).
pub fn model_tokens(model: &str, minute: u64) -> String {
    format!("{}:tokens:{minute}", model_tag(model))
}

/// The runs of subagent type `agent` in progress, by holder (a validated token: no braces).
pub fn agent_slots(agent: &str) -> String {
    format!("skein:agent:{{{agent}}}:slots")
}

/// The spending ledger of user task `task_id` (its subagents draw from it too), with its session.
pub fn budget(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":budget:", task_id])
}

/// The reservations of calls in flight on [`budget`]'s ledger.
pub fn budget_held(tenant: &str, session: &str, task_id: &str) -> String {
    in_session(tenant, session, &[":budget:", task_id, ":held"])
}

/// The spending ledger of `tenant` for one UTC `day` (`YYYY-MM-DD`); tagged `{tenant}`.
pub fn tenant_budget(tenant: &str, day: &str) -> String {
    format!("skein:budget:{{{tenant}}}:{day}")
}

/// The reservations of calls in flight on [`tenant_budget`]'s ledger.
pub fn tenant_budget_held(tenant: &str, day: &str) -> String {
    format!("{}:held", tenant_budget(tenant, day))
}

/// The field of the attempts hash that counts attempts at task `task_id`'s turn.
pub fn turn_attempts_field(task_id: &str) -> String {
    crate::text::joined(&["turn:", task_id])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tasks_calls_and_turn_share_its_results_and_attempts_keys() {
        let turn = super::turn_attempts_field("t1");
        assert_eq!(
            super::attempts("acme", "s1", &turn),
            super::attempts("acme", "s1", "t1:3:call_9")
        );
        assert_ne!(
            super::attempts("acme", "s1", "t1:0:c"),
            super::attempts("acme", "s1", "t2:0:c")
        );
        assert_eq!(
            super::results("acme", "s1", "t1:0:c"),
            "skein:{acme:s1}:results:t1"
        );
    }

    #[test]
    fn a_models_traffic_keys_share_one_hash_tag() {
        for key in [
            super::model_slots("gpt-4o"),
            super::model_waiting("gpt-4o"),
            super::model_tokens("gpt-4o", 7),
        ] {
            assert!(key.starts_with("skein:model:{gpt-4o}:"), "{key}");
        }
        assert_eq!(super::model_slots("a{b}"), "skein:model:{a_b_}:slots");
    }

    /// The keys each multi-key step (script, transaction, pipeline) names together: on a Redis
    /// Cluster they must hash to one slot, or the step fails with `CROSSSLOT`.
    #[test]
    fn every_multi_key_step_names_keys_of_one_cluster_slot() {
        use redis::cluster_routing::Slot;
        let (t, s, task, call) = ("acme", "s1", "t1", "t1:2:call_7");
        let turn = super::turn_attempts_field(task);
        let steps: Vec<(&str, Vec<String>)> = vec![
            ("save", vec![super::session(t, s), super::history(t, s)]),
            (
                "begin turn",
                vec![
                    super::final_result(t, s, task),
                    super::lease(t, s),
                    super::attempts(t, s, &turn),
                    super::session(t, s),
                    super::checkpoint(t, s, task),
                    super::history(t, s),
                    super::control(t, s, task),
                    super::task_trace(t, s, task),
                    super::legacy_checkpoint(t, s, task),
                ],
            ),
            (
                "complete turn",
                vec![
                    super::session(t, s),
                    super::lease(t, s),
                    super::final_result(t, s, task),
                    super::checkpoint(t, s, task),
                    super::history(t, s),
                    super::turn_records(t, s),
                ],
            ),
            (
                "control",
                vec![super::control(t, s, task), super::steer(t, s, task)],
            ),
            (
                "fork",
                vec![
                    super::session(t, s),
                    super::history(t, s),
                    super::turn_records(t, s),
                ],
            ),
            (
                "checkpoint",
                vec![super::checkpoint(t, s, task), super::lease(t, s)],
            ),
            (
                "admit call",
                vec![
                    super::results(t, s, call),
                    super::attempts(t, s, call),
                    super::running_call(t, s, call),
                ],
            ),
            (
                "forget turn",
                vec![
                    super::final_result(t, s, task),
                    super::attempts(t, s, &turn),
                    super::control(t, s, task),
                    super::steer(t, s, task),
                    super::task_trace(t, s, task),
                ],
            ),
            (
                "approvals",
                vec![super::approvals(t), super::answers(t, task)],
            ),
            (
                "task budget",
                vec![super::budget(t, s, task), super::budget_held(t, s, task)],
            ),
            (
                "tenant budget",
                vec![
                    super::tenant_budget(t, "2025-01-31"),
                    super::tenant_budget_held(t, "2025-01-31"),
                ],
            ),
            (
                "model slot",
                vec![
                    super::model_slots("gpt-4o"),
                    super::model_waiting("gpt-4o"),
                    super::model_tokens("gpt-4o", 7),
                ],
            ),
        ];
        for (step, keys) in steps {
            let first = Slot::for_key(&keys[0]);
            for key in &keys {
                assert_eq!(Slot::for_key(key), first, "{step}: {key} vs {}", keys[0]);
            }
        }
        // Different sessions spread over the slots.
        assert_ne!(
            Slot::for_key(super::session(t, "s1")),
            Slot::for_key(super::session(t, "s2"))
        );
    }

    #[test]
    fn session_keys_share_one_hash_tag() {
        let tag = "{acme:s1}";
        for key in [
            super::session("acme", "s1"),
            super::lease("acme", "s1"),
            super::results("acme", "s1", "t1:0:c1"),
            super::attempts("acme", "s1", "turn:t1"),
            super::checkpoint("acme", "s1", "t1"),
            super::final_result("acme", "s1", "t1"),
            super::task_trace("acme", "s1", "t1"),
        ] {
            assert!(key.contains(tag), "{key}");
            assert_eq!(key.matches('{').count(), 1, "{key}");
        }
    }
}
