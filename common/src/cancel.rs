//! `CancelRegistry`: the running work of this process by task, so a cancel request
//! (`skein.cancel.{tenant}.{task_id}`) reaches it. Leads register turns, workers register calls;
//! a listener cancels every registered token of the named task.
//!
//! Invariant: a registration lives exactly as long as its guard, so the registry only holds work
//! that is running.
//!
//! A lead also keeps what it heard *complete* since a known point
//! ([`CancelRegistry::cover_submissions`]): the submit streams' last sequences, read while its
//! subscription was in place and nothing had been missed. A submission stored after that point
//! can have no cancel request this lead did not hear, so its turn's start asks the registry
//! instead of `SKEIN_CANCEL` ([`CancelRegistry::heard_since`]). A gap (the connection dropped,
//! the subscription fell behind, a request forgotten for room) ends the coverage until it is
//! read again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{Bus, BusError, SubmissionPlace};
use crate::principals::{Acting, Operation, Refusal};
use crate::subjects;

/// Told of every cancel request heard and of its principal's check (a lead records it).
pub type CancelAudit =
    Arc<dyn Fn(&async_nats::Message, &Result<Acting, Refusal>) + Send + Sync + 'static>;

type Registered = HashMap<(String, String), Vec<(u64, CancellationToken)>>;

/// How long this process remembers a cancel request it heard.
const REMEMBERED: Duration = Duration::from_secs(600);
/// Most cancel requests remembered at once (anyone may publish them); past it the oldest is
/// forgotten first. Forgetting is safe: work also looks the request up in `SKEIN_CANCEL` before
/// it starts (`Bus::cancel_requested`).
pub const MAX_REMEMBERED: usize = 100_000;

/// How long after its subscription is (again) in place the registry waits before it counts
/// what it hears as complete: the servers of a cluster learn of a new subscription a moment
/// after the one it was made on.
const COVERAGE_SETTLE: Duration = Duration::from_secs(1);
/// How often a coverage is read again when nothing ended it; well inside [`REMEMBERED`], since a
/// request heard after the coverage's start is only sure to be remembered that long.
const COVERAGE_RENEW_EVERY: Duration = Duration::from_secs(60);

/// Running work of this process, by (tenant, task id), and the cancel requests it heard lately.
#[derive(Clone, Default)]
pub struct CancelRegistry {
    inner: Arc<Mutex<Registered>>,
    next: Arc<AtomicU64>,
    heard: Arc<Mutex<Heard>>,
    /// Whether the listener runs (a coverage is read only while it does).
    listening: Arc<AtomicBool>,
    coverage: Arc<Mutex<Option<Coverage>>>,
}

/// Cancel requests heard lately, oldest first: remembering one and forgetting the expired ones
/// costs amortized O(1), and at most [`MAX_REMEMBERED`] are kept.
#[derive(Default)]
struct Heard {
    at: HashMap<(String, String), Instant>,
    order: VecDeque<(Instant, (String, String))>,
    /// How many were forgotten before they expired, for room.
    crowded_out: u64,
}

/// Since when every cancel request published was heard: the submit partitions' last sequences
/// then, read while the subscription was in place. Stands while the bus's gap count and the
/// requests crowded out are as they were, for [`REMEMBERED`] from its start.
struct Coverage {
    started: Instant,
    gaps: u64,
    crowded_out: u64,
    gaps_now: tokio::sync::watch::Receiver<u64>,
    /// Each covered submit partition's last sequence at the start.
    stream_ends: Vec<(u32, u64)>,
}

impl Heard {
    fn insert(&mut self, key: (String, String), now: Instant, capacity: usize) {
        while let Some((at, _)) = self.order.front() {
            let expired = now.duration_since(*at) >= REMEMBERED;
            if !expired && self.order.len() < capacity {
                break;
            }
            if !expired {
                self.crowded_out += 1;
            }
            if let Some((at, old)) = self.order.pop_front() {
                // A key heard again later has a newer entry; only its latest one forgets it.
                if self.at.get(&old) == Some(&at) {
                    self.at.remove(&old);
                }
            }
        }
        self.at.insert(key.clone(), now);
        self.order.push_back((now, key));
    }

    fn contains(&self, key: &(String, String), now: Instant) -> bool {
        self.at
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < REMEMBERED)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.len()
    }
}

/// Removes its registration when dropped.
pub struct Registration {
    registry: CancelRegistry,
    key: (String, String),
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.registry.inner.lock() {
            if let Some(tokens) = inner.get_mut(&self.key) {
                tokens.retain(|(id, _)| *id != self.id);
                if tokens.is_empty() {
                    inner.remove(&self.key);
                }
            }
        }
    }
}

impl CancelRegistry {
    /// Registers `token` as work of the task until the returned guard drops.
    pub fn register(&self, tenant: &str, task_id: &str, token: CancellationToken) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (tenant.to_owned(), task_id.to_owned());
        if let Ok(mut inner) = self.inner.lock() {
            inner.entry(key.clone()).or_default().push((id, token));
        }
        Registration {
            registry: self.clone(),
            key,
            id,
        }
    }

    /// Cancels the task's running work here; returns how many pieces were cancelled.
    pub fn cancel(&self, tenant: &str, task_id: &str) -> usize {
        let tokens = self
            .inner
            .lock()
            .map(|inner| {
                inner
                    .get(&(tenant.to_owned(), task_id.to_owned()))
                    .cloned()
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for (_, token) in &tokens {
            token.cancel();
        }
        tokens.len()
    }

    /// Whether this process heard a cancel request for the task in the last ten minutes (work
    /// that arrives after its task was cancelled is not started; see `Bus::cancel_requested` for
    /// requests published before the process listened).
    pub fn heard(&self, tenant: &str, task_id: &str) -> bool {
        self.heard
            .lock()
            .map(|heard| heard.contains(&(tenant.to_owned(), task_id.to_owned()), Instant::now()))
            .unwrap_or(false)
    }

    /// Whether a cancel request for the task was heard, when every request published since its
    /// submission was stored at `place` is known to have been heard (a coverage holds the place);
    /// `None` when that is not known and `SKEIN_CANCEL` must be asked.
    pub fn heard_since(&self, tenant: &str, task_id: &str, place: SubmissionPlace) -> Option<bool> {
        let coverage = self.coverage.lock().ok()?;
        let coverage = coverage.as_ref()?;
        let holds = coverage.started.elapsed() < REMEMBERED
            && *coverage.gaps_now.borrow() == coverage.gaps
            && coverage
                .stream_ends
                .iter()
                .any(|&(partition, end)| partition == place.partition && place.sequence > end);
        if !holds {
            return None;
        }
        let heard = self.heard.lock().ok()?;
        (heard.crowded_out == coverage.crowded_out)
            .then(|| heard.contains(&(tenant.to_owned(), task_id.to_owned()), Instant::now()))
    }

    /// Keeps a coverage of what this registry hears (see the module's header) until `stop`: read
    /// at the start and after every gap, and renewed every [`COVERAGE_RENEW_EVERY`]. Call after
    /// [`CancelRegistry::listen`].
    pub fn cover_submissions(&self, bus: &Bus, tracker: &TaskTracker, stop: CancellationToken) {
        let (registry, bus) = (self.clone(), bus.clone());
        tracker.spawn(async move {
            let mut gaps = bus.core_gaps();
            let mut next_read = Duration::ZERO;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    changed = gaps.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        registry.set_coverage(None);
                        next_read = Duration::ZERO;
                        continue;
                    }
                    () = tokio::time::sleep(next_read) => {}
                }
                let read = tokio::select! {
                    _ = stop.cancelled() => break,
                    read = registry.read_coverage(&bus, &mut gaps) => read,
                };
                next_read = match read {
                    Ok(()) => COVERAGE_RENEW_EVERY,
                    Err(e) => {
                        tracing::debug!(error = %e, "cancel coverage not read; turns ask the stream");
                        COVERAGE_SETTLE
                    }
                };
            }
            registry.set_coverage(None);
        });
    }

    /// Reads a coverage: the gap counts first; then the subscription confirmed by a round trip,
    /// [`COVERAGE_SETTLE`] for the rest of a cluster to learn of it, and the submit streams' ends.
    /// A gap meanwhile leaves it standing for nothing.
    async fn read_coverage(
        &self,
        bus: &Bus,
        gaps: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<(), BusError> {
        if !self.listening.load(Ordering::SeqCst) {
            return Err(BusError::Consumer {
                consumer: subjects::CANCEL_ALL.to_owned(),
                message: "the cancel listener is not running".to_owned(),
            });
        }
        let seen_gaps = *gaps.borrow_and_update();
        let crowded_out = self
            .heard
            .lock()
            .map(|heard| heard.crowded_out)
            .unwrap_or(0);
        bus.client().flush().await.map_err(|e| BusError::Consumer {
            consumer: subjects::CANCEL_ALL.to_owned(),
            message: e.to_string(),
        })?;
        tokio::time::sleep(COVERAGE_SETTLE).await;
        let started = Instant::now();
        let stream_ends = bus.submit_stream_ends().await?;
        if let Ok(mut slot) = self.coverage.lock() {
            // Under the lock: a listener that stopped meanwhile clears it after this.
            if self.listening.load(Ordering::SeqCst) {
                *slot = Some(Coverage {
                    started,
                    gaps: seen_gaps,
                    crowded_out,
                    gaps_now: gaps.clone(),
                    stream_ends,
                });
            }
        }
        Ok(())
    }

    fn set_coverage(&self, coverage: Option<Coverage>) {
        if let Ok(mut slot) = self.coverage.lock() {
            *slot = coverage;
        }
    }

    fn remember(&self, tenant: &str, task_id: &str) {
        if let Ok(mut heard) = self.heard.lock() {
            let key = (tenant.to_owned(), task_id.to_owned());
            heard.insert(key, Instant::now(), MAX_REMEMBERED);
        }
    }

    /// Listens for cancel requests until `stop`, cancelling matching work once the request's
    /// principal is checked (see `principals`); `audit` is told of each request and its check.
    pub async fn listen(
        &self,
        bus: &Bus,
        tracker: &TaskTracker,
        stop: CancellationToken,
        audit: Option<CancelAudit>,
    ) -> Result<(), BusError> {
        let mut requests = bus.subscribe(subjects::CANCEL_ALL).await?;
        let registry = self.clone();
        let bus = bus.clone();
        self.listening.store(true, Ordering::SeqCst);
        tracker.spawn(async move {
            loop {
                let request = tokio::select! {
                    _ = stop.cancelled() => break,
                    request = requests.next() => request,
                };
                let Some(request) = request else { break };
                let Some(tenant) = subjects::parse_cancel(&request.subject)
                    .map(|(tenant, _)| tenant)
                    .or_else(|| subjects::parse_cancel_call(&request.subject).map(|(t, _, _)| t))
                else {
                    continue;
                };
                let presented = crate::principals::Presented {
                    subject: &request.subject,
                    headers: request.headers.as_ref(),
                    payload: &request.payload,
                    stored_at_ms: crate::protocol::now_ms(),
                };
                let checked =
                    bus.gate()
                        .check(presented, tenant, Operation::Cancel, "", false);
                if let Some(audit) = &audit {
                    audit(&request, &checked);
                }
                if let Err(refusal) = checked {
                    tracing::warn!(subject = %request.subject, reason = %refusal, "cancel request refused");
                    continue;
                }
                if let Some((tenant, task_id)) = subjects::parse_cancel(&request.subject) {
                    registry.remember(tenant, task_id);
                    let stopped = registry.cancel(tenant, task_id);
                    tracing::info!(tenant, task_id, stopped, "cancel request");
                } else if let Some((tenant, task_id, call)) =
                    subjects::parse_cancel_call(&request.subject)
                {
                    // One run and the runs under it; the task is not cancelled, so not remembered.
                    let stopped = registry.cancel(tenant, &subjects::run_cancel_key(task_id, call));
                    tracing::info!(tenant, task_id, call, stopped, "cancel request for one run");
                }
            }
            // Nothing is heard from here on: no coverage stands.
            registry.listening.store(false, Ordering::SeqCst);
            registry.set_coverage(None);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> (String, String) {
        ("t".to_owned(), format!("task-{n}"))
    }

    #[test]
    fn heard_requests_are_bounded_and_forget_the_oldest_first() {
        let mut heard = Heard::default();
        let now = Instant::now();
        for n in 0..10 {
            heard.insert(key(n), now, 4);
        }
        assert_eq!(heard.len(), 4);
        assert!(!heard.contains(&key(5), now));
        assert!((6..10).all(|n| heard.contains(&key(n), now)));
        assert_eq!(
            heard.crowded_out, 6,
            "forgotten for room, before they expired"
        );
        // Expired ones go at the next insert, whatever the room; they were not crowded out.
        let later = now + REMEMBERED;
        heard.insert(key(99), later, 4);
        assert_eq!(heard.len(), 1);
        assert!(heard.contains(&key(99), later));
        assert_eq!(heard.crowded_out, 6);
    }

    #[test]
    fn a_coverage_answers_only_for_later_places_and_only_until_a_gap_or_a_request_crowded_out() {
        let registry = CancelRegistry::default();
        let (gap, gaps_now) = tokio::sync::watch::channel(3u64);
        let cover = |started: Instant| {
            registry.set_coverage(Some(Coverage {
                started,
                gaps: 3,
                crowded_out: 0,
                gaps_now: gaps_now.clone(),
                stream_ends: vec![(0, 10), (2, 5)],
            }));
        };
        let at = |partition, sequence| SubmissionPlace {
            partition,
            sequence,
            stored_ns: 0,
        };
        assert_eq!(
            registry.heard_since("t", "a", at(0, 11)),
            None,
            "no coverage yet"
        );
        cover(Instant::now());
        assert_eq!(registry.heard_since("t", "a", at(0, 11)), Some(false));
        assert_eq!(registry.heard_since("t", "a", at(2, 6)), Some(false));
        assert_eq!(
            registry.heard_since("t", "a", at(0, 10)),
            None,
            "stored before it"
        );
        assert_eq!(
            registry.heard_since("t", "a", at(1, 99)),
            None,
            "a partition not read"
        );
        registry.remember("t", "a");
        assert_eq!(registry.heard_since("t", "a", at(0, 11)), Some(true));

        registry.heard.lock().expect("heard").crowded_out += 1;
        assert_eq!(
            registry.heard_since("t", "a", at(0, 11)),
            None,
            "one forgotten for room"
        );
        registry.heard.lock().expect("heard").crowded_out = 0;
        assert_eq!(registry.heard_since("t", "a", at(0, 11)), Some(true));
        gap.send_replace(4);
        assert_eq!(registry.heard_since("t", "a", at(0, 11)), None, "a gap");
        gap.send_replace(3);
        if let Some(long_ago) = Instant::now().checked_sub(REMEMBERED) {
            cover(long_ago);
            assert_eq!(
                registry.heard_since("t", "a", at(0, 11)),
                None,
                "older than what is remembered"
            );
        }
    }

    #[test]
    fn a_request_heard_again_is_remembered_from_its_latest_hearing() {
        let mut heard = Heard::default();
        let now = Instant::now();
        let again = now + Duration::from_secs(300);
        heard.insert(key(1), now, 3);
        heard.insert(key(1), again, 3);
        heard.insert(key(2), again, 3);
        // Full: the first hearing of key 1 is dropped, but its later one keeps it remembered.
        heard.insert(key(3), again, 3);
        assert_eq!(heard.len(), 3);
        assert!(heard.contains(&key(1), again));
        // Remembered for ten minutes from the latest hearing, not the first.
        assert!(heard.contains(&key(1), now + REMEMBERED));
        assert!(!heard.contains(&key(1), again + REMEMBERED));
    }

    #[test]
    fn cancels_only_registered_work_of_the_task() {
        let registry = CancelRegistry::default();
        let (a, b, other) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let _ga = registry.register("t", "task1", a.clone());
        let gb = registry.register("t", "task1", b.clone());
        let _go = registry.register("t", "task2", other.clone());
        drop(gb);
        assert_eq!(registry.cancel("t", "task1"), 1);
        assert!(a.is_cancelled() && !b.is_cancelled() && !other.is_cancelled());
        assert_eq!(registry.cancel("t", "nothing"), 0);
    }
}
