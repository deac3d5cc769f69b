//! `Dispatcher`: turns tool calls and subagent calls into durable tasks on worker pools and waits
//! for their results.
//!
//! Invariants:
//! - a call whose result is already recorded (by call key, `task_id:step:call_id`) is not run
//!   again: a turn that may have run before looks it up before dispatching, and workers look
//!   before running any delivery that could follow an earlier one; the recorded result is
//!   returned, so a resumed turn does not re-run finished calls;
//! - each dispatch gets its own reply subject (`skein.reply.{instance}.{n}`), so concurrent turns
//!   never receive each other's results, whatever call ids their models chose; a result nobody
//!   waits for (a late duplicate) is dropped, so the model never sees two results for one call;
//! - every wait is bounded: a call that returns nothing within its timeout (plus slack) ends as a
//!   `timed_out` failure; meanwhile the recorded results are looked at every second, so a result
//!   whose reply went elsewhere (the call was first dispatched by a lead that died) still arrives;
//! - a call is stored before it can time out quietly: its task is handed to the connection and
//!   the stream's ack is awaited beside the reply (a worker may answer first); a task the stream
//!   did not confirm is sent again, with the same `Nats-Msg-Id`, until it is stored or the call's
//!   time runs out, and then the call fails with why;
//! - no task outgrows a broker message for its arguments or its input: over the inline limit
//!   (`payloads::inline_limit`, 256 KiB on a 1 MiB bus) they are stored in the tenant's payload
//!   bucket and the task carries a reference (`arguments_ref`, `input_ref`) the worker reads
//!   before it runs the call.

pub mod catalog;

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::agent::seams::{CallTarget, ToolCallRequest};
use catalog::LiveCatalog;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{Bus, BusError, PendingAck};
use crate::payloads::{inline_limit, PayloadStore};
use crate::protocol::{
    call_key, AgentSpec, CallOutcome, Failure, FailureKind, SubagentTask, TaskOrigin, ToolResult,
    ToolTask, PROTOCOL_VERSION,
};
use crate::store::{ResultSlot, SessionStore};
use crate::subjects;

pub use crate::agent::tools::ToolCatalog;

/// Time allowed on top of a call's own timeout for queueing and transport.
const DISPATCH_SLACK: Duration = Duration::from_secs(30);
/// How often a waiting call looks for its result among the recorded ones.
const RECORD_POLL: Duration = Duration::from_secs(1);

/// Calls waiting for their result, by dispatch number: the call id a result must carry, and where
/// it goes.
type Pending = Arc<Mutex<HashMap<u64, (String, oneshot::Sender<ToolResult>)>>>;

/// Sends calls to worker pools and collects results for one process. A clone shares its parts
/// (one reference count), so that each call's future keeps a pointer rather than a copy of the
/// bus and the store.
#[derive(Clone)]
pub struct Dispatcher {
    parts: Arc<DispatcherParts>,
}

/// What the clones of a dispatcher share.
pub struct DispatcherParts {
    bus: Bus,
    store: SessionStore,
    /// Which pools provide which tools (routing).
    catalog: LiveCatalog,
    instance: Arc<str>,
    next_dispatch: Arc<AtomicU64>,
    pending: Pending,
    /// Where arguments and inputs too large to travel inline are stored.
    payloads: PayloadStore,
}

impl std::ops::Deref for Dispatcher {
    type Target = DispatcherParts;

    fn deref(&self) -> &DispatcherParts {
        &self.parts
    }
}

/// Removes a dispatch's waiter when dropped.
struct Waiter {
    pending: Pending,
    n: u64,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&self.n);
        }
    }
}

/// A call published and waiting for its result. It keeps what the wait needs (the reply, where
/// the result is recorded, the call's id and time left), not the task it sent: a call waits far
/// longer than it takes to send.
struct Awaiting {
    reply: oneshot::Receiver<ToolResult>,
    /// Keeps the call's route to its reply for as long as it waits (dropped with it).
    _waiter: Waiter,
    slot: ResultSlot,
    /// Boxed as a `str`: 8 bytes less in every waiting call's future.
    call_id: Box<str>,
    limit: Duration,
    /// The task as handed to the connection, until the stream confirms it stored it (see
    /// [`Dispatcher::publish_first`]); `None` once it did.
    unconfirmed: Option<Box<Unconfirmed>>,
}

/// A task handed to the connection whose storage the stream has not confirmed yet, and what
/// sending it again takes.
struct Unconfirmed {
    ack: PendingAck,
    subject: String,
    payload: Bytes,
    dedup_id: String,
}

/// What a call that was handed over unconfirmed heard first.
enum FirstHeard {
    /// Its reply (`None`: the route to it is gone, as when the process stops).
    Reply(Option<ToolResult>),
    /// The stream stored the task: the call waits for its result.
    Stored,
    /// The task could not be stored within the call's time.
    NotStored(Failure),
}

/// One dispatch in flight: its number (reply subject), whose it is and its result key.
struct Dispatch<'a> {
    n: u64,
    origin: &'a TaskOrigin,
    call_key: &'a str,
    call_id: &'a str,
}

/// The child agent a subagent call runs.
#[derive(Debug, Clone)]
pub struct Child {
    pub agent: AgentSpec,
    pub input: String,
    /// Nesting depth of the child (1 for a direct child of the user's agent).
    pub depth: u32,
    /// The skills it may load.
    pub skills: Vec<crate::protocol::SkillDocument>,
}

/// Where and how long a call may run.
#[derive(Debug, Clone)]
pub struct CallRoute<'a> {
    pub pool: &'a str,
    pub timeout: Duration,
    /// An earlier run of the turn may have dispatched this call. The dispatcher then looks for
    /// a recorded result before dispatching, and the task tells workers to look before running
    /// even its first delivery; otherwise both skip the store round trip (a first delivery of a
    /// first dispatch cannot have a result yet; redeliveries are always looked up).
    pub may_have_run: bool,
}

/// First pause before a task that could not be published is published again, and the longest.
const FIRST_PUBLISH_RETRY: Duration = Duration::from_millis(100);
const LONGEST_PUBLISH_RETRY: Duration = Duration::from_secs(2);

impl Dispatcher {
    /// Subscribes to this process's reply subject and starts routing results to waiting calls.
    pub async fn start(
        bus: Bus,
        store: SessionStore,
        instance: &str,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Self, BusError> {
        let filter = subjects::reply_filter(instance);
        let mut replies = bus.subscribe(&filter).await?;
        let pending: Pending = Arc::default();
        let routes = pending.clone();
        let decoder = bus.clone();
        tracker.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    message = replies.next() => message,
                };
                let Some(message) = message else { break };
                let result: ToolResult = match decoder.decode(&message.payload) {
                    Ok(result) => result,
                    Err(e) => {
                        tracing::warn!(error = %e, "undecodable call result dropped");
                        continue;
                    }
                };
                // A result reaches its call only if it names the call: anyone who can publish on
                // the reply subject could otherwise answer for a worker.
                let waiter = subjects::reply_number(&message.subject).and_then(|n| {
                    let mut pending = routes.lock().ok()?;
                    match pending.get(&n) {
                        Some((call_id, _)) if *call_id == result.call_id => pending.remove(&n),
                        Some(_) => {
                            tracing::warn!(call_id = %crate::text::cut(&result.call_id, 64), "a result for another call dropped");
                            None
                        }
                        None => None,
                    }
                });
                match waiter {
                    Some((_, tx)) => {
                        let _ = tx.send(result);
                    }
                    None => tracing::debug!(call_id = %crate::text::cut(&result.call_id, 64), "duplicate, late or foreign result dropped"),
                }
            }
        });
        let parts = DispatcherParts {
            payloads: PayloadStore::new(&bus),
            bus,
            catalog: LiveCatalog::new(store.clone(), catalog::CATALOG_MAX_AGE),
            store,
            instance: instance.into(),
            next_dispatch: Arc::default(),
            pending,
        };
        Ok(Self {
            parts: Arc::new(parts),
        })
    }

    /// The live workers' tool directory this dispatcher routes by (shared with the runtime, so a
    /// turn's tool list and its routing come from one registry read).
    pub fn catalog(&self) -> &LiveCatalog {
        &self.catalog
    }

    /// The store this dispatcher records calls in (shared with the model traffic limits).
    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    /// Where values that travel by reference are stored (shared with the image layer).
    pub fn payloads(&self) -> &PayloadStore {
        &self.payloads
    }

    /// Routes and publishes a call of the runtime; its result at once if it never needs a wait.
    /// Boxed, owning the request: once the task is out, the call's future keeps only what its
    /// wait needs. A plain function taking the request apart before its future starts: an
    /// `async fn` would keep the request's room in its future beside the parts.
    fn send(self, request: ToolCallRequest) -> BoxFuture<'static, Result<Awaiting, ToolResult>> {
        let ToolCallRequest {
            origin,
            step,
            mut call,
            target,
            timeout,
            may_have_run,
        } = request;
        Box::pin(async move {
            let catalog = match self.catalog.current().await {
                Ok(catalog) => catalog,
                Err(e) => return Err(failed(&call.id, e.to_failure())),
            };
            let route = |pool| CallRoute {
                pool,
                timeout,
                may_have_run,
            };
            match target {
                CallTarget::Tool => {
                    let Some(pool) = catalog.pool_for_tool(&call.name) else {
                        let failure = Failure::new(
                            FailureKind::Unavailable,
                            format!("no live worker provides {:?}", call.name),
                        );
                        return Err(failed(&call.id, failure));
                    };
                    let arguments = std::mem::take(&mut call.arguments);
                    self.send_tool(&origin, step, &call.id, &call.name, arguments, route(pool))
                        .await
                }
                CallTarget::Subagent {
                    agent,
                    task,
                    depth,
                    skills,
                } => {
                    let Some(pool) = catalog.pool_for_subagent(&agent.name) else {
                        let failure = Failure::new(
                            FailureKind::Unavailable,
                            format!("no live worker runs subagent {:?}", agent.name),
                        );
                        return Err(failed(&call.id, failure));
                    };
                    let child = Child {
                        agent: AgentSpec::clone(agent.as_ref()),
                        input: task,
                        depth,
                        skills,
                    };
                    // Boxed: a subagent's dispatch is larger than a tool's.
                    Box::pin(self.send_subagent(&origin, step, &call.id, child, route(pool))).await
                }
            }
        })
    }

    /// A call's result: `sending` publishes it (boxed, so that what it sent is freed once it is
    /// out), then the call waits for its result, unless sending already answered it.
    async fn sent_then_waited(
        &self,
        sending: BoxFuture<'_, Result<Awaiting, ToolResult>>,
    ) -> ToolResult {
        let awaiting = match sending.await {
            Ok(awaiting) => awaiting,
            Err(done) => return done,
        };
        self.wait(awaiting).await
    }

    /// Waits for a published call's result; a `timed_out` failure past its time. A plain
    /// function: an `async fn` would keep `awaiting` twice in its future, which every waiting
    /// call keeps.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store the awaited call twice in its future"
    )]
    fn wait(
        &self,
        mut awaiting: Awaiting,
    ) -> impl std::future::Future<Output = ToolResult> + Send + '_ {
        async move {
            // A block keeps only the fields it uses: the waiter is named so that it is kept, and
            // the call stays registered for its reply until the wait ends.
            let _registered = &awaiting._waiter;
            if let Some(unconfirmed) = awaiting.unconfirmed {
                // Boxed: the wait for the stream's ack ends long before the wait for the
                // result, and inline it would grow every waiting call's future by its size.
                let first =
                    self.stored_or_replied(&mut awaiting.reply, unconfirmed, &mut awaiting.limit);
                match Box::pin(first).await {
                    FirstHeard::Reply(Some(result)) => return result,
                    // A closed route ends the wait below as it would have there.
                    FirstHeard::Reply(None) | FirstHeard::Stored => {}
                    FirstHeard::NotStored(failure) => return failed(&awaiting.call_id, failure),
                }
            }
            let limit = awaiting.limit;
            match self
                .wait_for_result(awaiting.reply, &awaiting.slot, limit)
                .await
            {
                Some(result) => result,
                None => failed(
                    &awaiting.call_id,
                    Failure::new(FailureKind::TimedOut, format!("no result within {limit:?}")),
                ),
            }
        }
    }

    /// Waits for the stream to confirm a task handed over unconfirmed, or for the call's reply,
    /// whichever comes first (a worker may answer before the broker's ack arrives). A task the
    /// stream did not confirm is sent again with the same `Nats-Msg-Id`, patiently, within the
    /// call's own time: a stored copy counts once. The time it took comes out of `limit`.
    async fn stored_or_replied(
        &self,
        reply: &mut oneshot::Receiver<ToolResult>,
        unconfirmed: Box<Unconfirmed>,
        limit: &mut Duration,
    ) -> FirstHeard {
        let Unconfirmed {
            ack,
            subject,
            payload,
            dedup_id,
        } = *unconfirmed;
        let started = tokio::time::Instant::now();
        let first = tokio::select! {
            biased;
            result = reply => Some(FirstHeard::Reply(result.ok())),
            stored = ack.confirmed() => match stored {
                Ok(_) => Some(FirstHeard::Stored),
                Err(e) => {
                    tracing::warn!(error = %e, "task not confirmed by the stream; sending it again");
                    None
                }
            },
        };
        let heard = match first {
            Some(heard) => heard,
            None => {
                let timeout = limit
                    .saturating_sub(DISPATCH_SLACK)
                    .saturating_sub(started.elapsed());
                // Boxed: a rare path, which inline would grow this box, held by every call
                // until its ack comes.
                match Box::pin(self.publish_patiently(subject, payload, &dedup_id, timeout)).await {
                    Ok(()) => FirstHeard::Stored,
                    Err(failure) => FirstHeard::NotStored(failure),
                }
            }
        };
        *limit = limit.saturating_sub(started.elapsed());
        heard
    }

    /// Runs one tool call (of turn step `step`) on a worker of `route.pool`.
    pub async fn call_tool(
        &self,
        origin: &Arc<TaskOrigin>,
        step: u32,
        call_id: &str,
        tool: &str,
        arguments: serde_json::Value,
        route: CallRoute<'_>,
    ) -> ToolResult {
        // Boxed, as in `send`: the task is dropped once it is out.
        self.sent_then_waited(Box::pin(
            self.send_tool(origin, step, call_id, tool, arguments, route),
        ))
        .await
    }

    /// Publishes one tool call; see `call_tool`.
    async fn send_tool(
        &self,
        origin: &Arc<TaskOrigin>,
        step: u32,
        call_id: &str,
        tool: &str,
        arguments: serde_json::Value,
        route: CallRoute<'_>,
    ) -> Result<Awaiting, ToolResult> {
        let Some(timeout) = within_deadline(origin, route.timeout) else {
            return Err(failed(call_id, deadline_passed()));
        };
        let limit = inline_limit(self.bus.max_payload());
        let (arguments, arguments_ref) = match self
            .payloads
            .arguments_for_task(origin, arguments, limit)
            .await
        {
            Ok(carried) => carried,
            Err(failure) => return Err(failed(call_id, failure)),
        };
        let (n, reply_to) = self.reply_route();
        // Encoded at once, and the task dropped: its publish waits for the stream, and needs only
        // the encoded bytes (another try sends them again).
        let (payload, call_key) = {
            let task = ToolTask {
                v: PROTOCOL_VERSION,
                origin: origin.clone(),
                call_id: call_id.to_owned(),
                call_key: call_key(&origin.task_id, step, call_id),
                tool: tool.to_owned(),
                arguments,
                arguments_ref,
                reply_to,
                timeout_ms: timeout.as_millis() as u64,
                first_dispatch: !route.may_have_run,
            };
            match self.bus.encode(&task) {
                Ok(payload) => (payload, task.call_key),
                Err(e) => return Err(failed(call_id, e.to_failure())),
            }
        };
        let partition = self.bus.session_partition(&origin.tenant, &origin.session);
        let subject = subjects::tool_task(partition, route.pool, tool);
        let call = Dispatch {
            n,
            origin,
            call_key: &call_key,
            call_id,
        };
        self.send_task(call, subject, payload, timeout, route.may_have_run)
            .await
    }

    /// Runs a child agent on a worker of `route.pool`; its answer is the call's output.
    pub async fn call_subagent(
        &self,
        origin: &Arc<TaskOrigin>,
        step: u32,
        call_id: &str,
        child: Child,
        route: CallRoute<'_>,
    ) -> ToolResult {
        // Boxed, as in `send`: the task is dropped once it is out.
        self.sent_then_waited(Box::pin(
            self.send_subagent(origin, step, call_id, child, route),
        ))
        .await
    }

    /// Publishes one subagent call; see `call_subagent`.
    async fn send_subagent(
        &self,
        origin: &Arc<TaskOrigin>,
        step: u32,
        call_id: &str,
        child: Child,
        route: CallRoute<'_>,
    ) -> Result<Awaiting, ToolResult> {
        let Child {
            agent,
            input,
            depth,
            skills,
        } = child;
        let Some(timeout) = within_deadline(origin, route.timeout) else {
            return Err(failed(call_id, deadline_passed()));
        };
        let limit = inline_limit(self.bus.max_payload());
        let (input, input_ref) = match self.payloads.text_for_task(origin, input, limit).await {
            Ok(carried) => carried,
            Err(failure) => return Err(failed(call_id, failure)),
        };
        let (n, reply_to) = self.reply_route();
        let partition = self.bus.session_partition(&origin.tenant, &origin.session);
        // Encoded at once, and the task dropped, as in `send_tool`.
        let (payload, call_key, subject) = {
            let task = SubagentTask {
                v: PROTOCOL_VERSION,
                origin: origin.clone(),
                call_id: call_id.to_owned(),
                call_key: call_key(&origin.task_id, step, call_id),
                child_session: crate::protocol::child_session_id(&origin.session, call_id),
                agent,
                input,
                input_ref,
                reply_to,
                timeout_ms: timeout.as_millis() as u64,
                depth,
                first_dispatch: !route.may_have_run,
                skills,
            };
            let subject = subjects::agent_task(partition, route.pool, &task.agent.name);
            match self.bus.encode(&task) {
                Ok(payload) => (payload, task.call_key, subject),
                Err(e) => return Err(failed(call_id, e.to_failure())),
            }
        };
        let call = Dispatch {
            n,
            origin,
            call_key: &call_key,
            call_id,
        };
        self.send_task(call, subject, payload, timeout, route.may_have_run)
            .await
    }

    /// A fresh dispatch number and its reply subject.
    fn reply_route(&self) -> (u64, String) {
        let n = self.next_dispatch.fetch_add(1, Ordering::Relaxed);
        (n, subjects::reply(&self.instance, n))
    }

    /// Publishes a task, trying again while the broker is out of reach (a restart, a lost ack)
    /// for as long as the call may take: the task's `Nats-Msg-Id` makes a publish that was stored
    /// but not acknowledged count once. A failure that another try cannot cure (too large, not
    /// encodable) is returned at once.
    async fn publish_patiently(
        &self,
        subject: String,
        payload: Bytes,
        dedup_id: &str,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let started = tokio::time::Instant::now();
        let mut pause = FIRST_PUBLISH_RETRY;
        loop {
            let publish = self
                .bus
                .publish_encoded_work(subject.clone(), payload.clone(), dedup_id);
            let failure = match publish.await {
                Ok(()) => return Ok(()),
                Err(e) => e.to_failure(),
            };
            if failure.kind != FailureKind::Unavailable || started.elapsed() + pause >= timeout {
                return Err(failure);
            }
            tracing::warn!(%failure, ?pause, "task not published; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_PUBLISH_RETRY);
        }
    }

    /// Publishes a task and registers its call for the reply; the recorded result instead, when
    /// an earlier run may have finished the call.
    async fn send_task(
        &self,
        call: Dispatch<'_>,
        subject: String,
        payload: Bytes,
        timeout: Duration,
        may_have_run: bool,
    ) -> Result<Awaiting, ToolResult> {
        let Dispatch {
            n,
            origin,
            call_key,
            call_id,
        } = call;
        let slot = ResultSlot::new(&origin.tenant, &origin.session, call_key);
        if may_have_run {
            match self.store.recorded_result_in(&slot).await {
                Ok(Some(result)) => return Err(result),
                Ok(None) => {}
                Err(e) => return Err(failed(call_id, e.to_failure())),
            }
        }
        let (tx, reply) = oneshot::channel();
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(n, (call_id.to_owned(), tx));
        }
        // The waiter goes away however this call ends, also when the turn drops it (cancelled).
        let waiter = Waiter {
            pending: self.pending.clone(),
            n,
        };
        let dedup_id = format!("{}:{}:{call_key}", origin.tenant, origin.session);
        let publishing = tokio::time::Instant::now();
        let unconfirmed = match self
            .publish_first(subject, payload, dedup_id, timeout)
            .await
        {
            Ok(unconfirmed) => unconfirmed,
            Err(failure) => return Err(failed(call_id, failure)),
        };
        // Time spent publishing comes out of the call's time.
        let limit = timeout.saturating_sub(publishing.elapsed()) + DISPATCH_SLACK;
        Ok(Awaiting {
            reply,
            _waiter: waiter,
            slot,
            call_id: call_id.into(),
            limit,
            unconfirmed,
        })
    }

    /// A task's first publish. Without exported spans it is only handed to the connection, and
    /// the stream's confirmation is left to the call's wait ([`Dispatcher::stored_or_replied`]):
    /// the sending future is large, and under a burst about half the calls in flight wait for
    /// the broker's ack. With them, the publish's own span covers its confirmation, as every
    /// publish's does. A connection that does not take the task is tried again patiently.
    async fn publish_first(
        &self,
        subject: String,
        payload: Bytes,
        dedup_id: String,
        timeout: Duration,
    ) -> Result<Option<Box<Unconfirmed>>, Failure> {
        if !crate::telemetry::exporting() {
            // Boxed, as every publish's hand-over: brief, and its future about 1 KiB.
            let handed = Box::pin(self.bus.send_encoded_work(
                subject.clone(),
                payload.clone(),
                &dedup_id,
            ))
            .await;
            match handed {
                Ok(ack) => {
                    return Ok(Some(Box::new(Unconfirmed {
                        ack,
                        subject,
                        payload,
                        dedup_id,
                    })))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "task not handed to the connection; trying again")
                }
            }
        }
        // Boxed: with spans exported it is every call's publish, without them a rare retry;
        // inline it would be most of the sending future, which every call keeps until its task
        // is handed over (under a burst, while the connection's queue is full).
        Box::pin(self.publish_patiently(subject, payload, &dedup_id, timeout))
            .await
            .map(|()| None)
    }

    /// Waits for the reply, and looks at the recorded results now and then: the reply may go to
    /// another process (the call was first dispatched by a lead that died, and this publish was a
    /// duplicate the broker dropped) or be lost while NATS reconnects.
    async fn wait_for_result(
        &self,
        mut reply: oneshot::Receiver<ToolResult>,
        slot: &ResultSlot,
        limit: Duration,
    ) -> Option<ToolResult> {
        // One timer serves the looks and the deadline (a call keeps it for as long as it waits).
        let deadline = tokio::time::Instant::now() + limit;
        let mut next_look = tokio::time::Instant::now() + RECORD_POLL;
        let timer = tokio::time::sleep_until(next_look.min(deadline));
        tokio::pin!(timer);
        loop {
            // The look at the records is out of the `select!`: inside it, the select's own state
            // would be kept beside the look's in every waiting call's future.
            tokio::select! {
                result = &mut reply => return result.ok(),
                () = &mut timer => {}
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            if let Ok(Some(result)) = self.store.recorded_result_in(slot).await {
                return Some(result);
            }
            next_look = tokio::time::Instant::now() + RECORD_POLL;
            timer.as_mut().reset(next_look.min(deadline));
        }
        self.store.recorded_result_in(slot).await.ok().flatten()
    }
}

/// The call's time limit cut to the task's deadline; `None` once the deadline has passed.
fn within_deadline(origin: &TaskOrigin, timeout: Duration) -> Option<Duration> {
    match origin.time_left() {
        None => Some(timeout),
        Some(left) if left.is_zero() => None,
        Some(left) => Some(timeout.min(left)),
    }
}

fn deadline_passed() -> Failure {
    Failure::new(
        FailureKind::TimedOut,
        "the task's deadline has passed; the call was not started",
    )
}

/// The NATS dispatcher is the cluster's tool service: a call's failure is its result's outcome,
/// never a service error.
impl tower::Service<ToolCallRequest> for Dispatcher {
    type Response = ToolResult;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<ToolResult, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ToolCallRequest) -> Self::Future {
        let sending = self.clone().send(request);
        let dispatcher = self.clone();
        // Inline rather than through `sent_then_waited`, whose extra layer would add 40 bytes to
        // every waiting call's future; the sent call is taken out of its `Result` before the
        // wait, which a `match` would keep beside it.
        Box::pin(async move {
            let awaiting = match sending.await {
                Ok(awaiting) => awaiting,
                Err(done) => return Ok(done),
            };
            Ok(dispatcher.wait(awaiting).await)
        })
    }
}

/// A result for a call that never produced one.
pub fn failed(call_id: &str, failure: Failure) -> ToolResult {
    ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call_id.to_owned(),
        outcome: CallOutcome::Failed { failure },
        worker_id: String::new(),
        duration_ms: 0,
        attempts: 0,
    }
}
