//! A subagent run that waits for a person. Its child turn stopped at a step whose calls an `ask`
//! rule holds (the step was checkpointed before its calls were decided); the worker stores the
//! run's request — keyed by the task and the run's child session, with the calls that led to it
//! — where `skein approvals` lists it, and holds the task's delivery (progress acks go on, so the
//! broker does not hand it to another worker) until every call is answered, the request expires,
//! the run is stopped or its time is up. The caller then resumes the child turn from its
//! checkpoint, whose approval gate reads the answers. A worker that dies while it waits loses
//! nothing: the redelivered task resumes the child from the same checkpoint, finds the stored
//! request (and any answers), and waits again or goes on. The calling turn waits on the call
//! meanwhile, as on any running subagent.

use std::time::Duration;

use futures::StreamExt;
use skein_common::agent::runtime::Awaiting;
use skein_common::protocol::{now_ms, ApprovalRequest, SubagentTask, TaskOrigin, PROTOCOL_VERSION};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::WorkerContext;

/// How often a waiting run looks at its request when no wake comes (wakes are core NATS: one
/// can be missed).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How a wait for a person ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// Every call is answered, the request expired or is gone: the child turn resumes and
    /// settles its calls from what is stored.
    Settled,
    /// The run was stopped (its cancel request, the task's, or shutdown).
    Stopped,
    /// The run's time ran out while it waited.
    TimedOut,
    /// The request could not be stored: another delivery tries again.
    Trouble,
}

/// Stores the run's request and waits until it is settled (see the module's header).
pub(super) async fn wait_for_answers(
    ctx: &WorkerContext,
    task: &SubagentTask,
    child: &TaskOrigin,
    awaiting: Awaiting,
    stop: &CancellationToken,
    deadline: Instant,
) -> Waited {
    let request = ApprovalRequest {
        v: PROTOCOL_VERSION,
        task_id: child.task_id.clone(),
        tenant: child.tenant.clone(),
        session: child.session.clone(),
        user: child.user.clone(),
        agent: task.agent.name.clone(),
        calls: awaiting.calls,
        run: Some(child.session.clone()),
        lineage: lineage(task),
        requested_at_ms: now_ms(),
        expires_at_ms: awaiting.expires_at_ms,
        answers: Default::default(),
    };
    let stored = match ctx.store.save_approval_request(&request).await {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(error = %e, "the subagent run's approval request not stored");
            return Waited::Trouble;
        }
    };
    tracing::info!(
        calls = stored.calls.len(),
        run = %child.session,
        "subagent run waits for a person"
    );
    let key = stored.key();
    // A lead that records an answer wakes the task; without the wake, the next look finds it.
    let mut wakes = match ctx
        .bus
        .subscribe(&skein_common::subjects::wake(&child.tenant, &child.task_id))
        .await
    {
        Ok(wakes) => Some(wakes),
        Err(e) => {
            tracing::debug!(error = %e, "no wakes for the waiting run; it looks every second");
            None
        }
    };
    let expiry = async {
        match stored.expires_at_ms {
            Some(at) => {
                tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        let woken = async {
            match wakes.as_mut() {
                Some(wakes) => {
                    wakes.next().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return Waited::Stopped,
            _ = tokio::time::sleep_until(deadline) => return Waited::TimedOut,
            _ = &mut expiry => return Waited::Settled,
            _ = look.tick() => {}
            _ = woken => {}
        }
        match ctx.store.approval_request(&child.tenant, &key).await {
            Ok(Some(request)) if request.unanswered().next().is_some() => {}
            Ok(_) => return Waited::Settled,
            Err(e) => tracing::debug!(error = %e, "the run's request not read; looking again"),
        }
    }
}

/// The calls from the task's turn down to this run, outermost first (as its events' source
/// names them).
fn lineage(task: &SubagentTask) -> Vec<String> {
    let source = skein_common::protocol::child_event_source(
        &task.origin.workspace,
        &task.child_session,
        &task.call_id,
    );
    source
        .strip_prefix("subagent:")
        .unwrap_or(&source)
        .split('/')
        .map(str::to_owned)
        .collect()
}
