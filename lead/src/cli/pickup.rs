//! Why a submitted task has not started. `skein submit` waits for its task's events; a task no
//! lead takes would otherwise be a silent wait until the timeout. When the task has no event yet
//! after a while ([`NOTICE_AFTER`] by default, `--notice-after`), one line on stderr says why it
//! waits, as far as the broker can tell:
//! - no lead answers the result lookups every lead serves (`skein.result.>`): none runs, or none
//!   reaches this NATS;
//! - older tasks of its session are unfinished (a session runs one turn at a time);
//! - the leads' backlog: tasks not yet delivered, and delivered ones not yet finished.
//!
//! Waiting goes on afterwards: a lead that starts later takes the task. Everything here only
//! looks (a request, reads of the stream and of the leads' consumer); a look that fails or is not
//! allowed says less, and never stops the wait.

use std::future::Future;
use std::time::Duration;

use skein_common::bus::{QueuedSubmission, SubmissionPlace};
use skein_common::client::SkeinClient;
use skein_common::protocol::TaskSubmission;
use skein_common::subjects;

/// How long a task may go without starting before `skein submit` says why it waits.
pub const NOTICE_AFTER: Duration = Duration::from_secs(5);

/// Bound on each look.
const LOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// Most unfinished tasks of the session read to count those ahead of this one.
const MAX_AHEAD: usize = 1000;

/// Runs `waiting` (the wait for the task's result); if the task has not started after `after`
/// (zero: never), prints once on stderr why it waits, and goes on waiting.
pub async fn noticing<T>(
    client: &SkeinClient,
    submission: &TaskSubmission,
    after: Duration,
    waiting: impl Future<Output = T>,
) -> T {
    tokio::pin!(waiting);
    if after.is_zero() {
        return waiting.await;
    }
    let notice = async {
        tokio::time::sleep(after).await;
        if let Some(line) = why_waiting(client, submission, after).await {
            eprintln!("{line}");
        }
    };
    tokio::select! {
        biased;
        outcome = &mut waiting => return outcome,
        () = notice => {}
    }
    waiting.await
}

/// Whether any lead answers on this NATS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leads {
    /// Nobody listens for result lookups.
    None,
    /// A lead answered.
    Some,
    /// The look failed or timed out.
    Unknown,
}

/// The line that says why the task waits; `None` once it has started (it has events).
async fn why_waiting(
    client: &SkeinClient,
    submission: &TaskSubmission,
    waited: Duration,
) -> Option<String> {
    let bus = client.bus();
    let (tenant, session, task_id) = (
        submission.tenant.as_str(),
        submission.session.as_str(),
        submission.task_id.as_str(),
    );
    if let Ok(Ok(Some(_))) =
        tokio::time::timeout(LOOK_TIMEOUT, bus.last_event(tenant, task_id)).await
    {
        return None;
    }
    // Every submit partition there is (a cluster may have more than this process's setting).
    let partitions = match tokio::time::timeout(LOOK_TIMEOUT, bus.submit_partitions()).await {
        Ok(Ok(partitions)) => partitions,
        _ => bus.known_submit_partitions(),
    };
    let (leads, queued, backlog) = tokio::join!(
        leads(client, submission),
        tokio::time::timeout(
            LOOK_TIMEOUT,
            bus.unfinished_submissions(tenant, session, SubmissionPlace::END, MAX_AHEAD),
        ),
        tokio::time::timeout(
            LOOK_TIMEOUT,
            bus.partitioned_depth(
                subjects::SUBMIT_STREAM,
                subjects::LEADS_CONSUMER,
                &partitions
            ),
        ),
    );
    let ahead = match queued {
        Ok(Ok(queued)) => ahead_of(&queued, task_id),
        _ => None,
    };
    let backlog = match backlog {
        Ok(Ok(depth)) => Some(depth),
        _ => None,
    };
    let why = match (leads, ahead.as_deref()) {
        (Leads::None, _) => format!(
            "no live lead (nothing answers on {}: no skein-lead runs against this NATS, or none \
             reaches it); the task waits in {} until one starts",
            subjects::RESULT_ALL,
            subjects::SUBMIT_STREAM
        ),
        (_, Some(ahead @ [oldest, ..])) => format!(
            "{} earlier task(s) of session {session} are unfinished (the oldest, {}, holds the \
             session: a session runs one turn at a time)",
            ahead.len(),
            oldest.task_id.as_deref().unwrap_or("unnamed"),
        ),
        (leads, _) => {
            let lead = match leads {
                Leads::Some => "a lead is running but has not taken it yet",
                _ => "no lead answered in time (whether one runs is unknown)",
            };
            match backlog {
                Some((pending, in_flight)) => format!(
                    "{lead}; the leads' backlog: {pending} task(s) not yet delivered, \
                     {in_flight} delivered and unfinished (a lead runs at most its \
                     --concurrency turns at once)"
                ),
                None => lead.to_owned(),
            }
        }
    };
    let waited = humantime::format_duration(waited);
    Some(format!(
        "skein: task {task_id} has not started after {waited}: {why}; still waiting"
    ))
}

/// Asks for the task's stored result, which every lead answers: "no responders" means no lead
/// listens.
async fn leads(client: &SkeinClient, submission: &TaskSubmission) -> Leads {
    let subject = subjects::result(&submission.tenant, &submission.session, &submission.task_id);
    let request = client.bus().client().request(subject, Default::default());
    match tokio::time::timeout(LOOK_TIMEOUT, request).await {
        Ok(Ok(_)) => Leads::Some,
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => Leads::None,
        Ok(Err(_)) | Err(_) => Leads::Unknown,
    }
}

/// The session's unfinished tasks ahead of `task_id`; `None` when the task is not among them
/// (not read, or gone meanwhile).
fn ahead_of(queued: &[QueuedSubmission], task_id: &str) -> Option<Vec<QueuedSubmission>> {
    let at = queued
        .iter()
        .position(|q| q.task_id.as_deref() == Some(task_id))?;
    Some(queued[..at].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(ids: &[&str]) -> Vec<QueuedSubmission> {
        ids.iter()
            .enumerate()
            .map(|(n, id)| QueuedSubmission {
                place: SubmissionPlace {
                    partition: 0,
                    sequence: n as u64 + 1,
                    stored_ns: 0,
                },
                task_id: Some((*id).to_owned()),
            })
            .collect()
    }

    #[test]
    fn the_tasks_ahead_are_those_before_it_in_the_queue() {
        let queue = queued(&["a", "b", "me", "c"]);
        let ahead = ahead_of(&queue, "me").expect("in the queue");
        let ids: Vec<_> = ahead.iter().filter_map(|q| q.task_id.as_deref()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(ahead_of(&queue, "a").map(|a| a.len()), Some(0));
        assert_eq!(ahead_of(&queue, "gone"), None);
    }
}
