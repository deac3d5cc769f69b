//! Following a run for a protocol's stream: the run's events, live from a submission this request
//! makes (`SkeinClient::run`) or read from the events stream for a run submitted before
//! (`SkeinClient::watch`), turned by the protocol's [`Fold`] into what its clients read, in
//! batches (what one task event makes goes out together).
//!
//! Invariants: the same events give the same output, so a stream read again from its start gives
//! the same numbered events and a client resumes by skipping what it saw; a follower whose client
//! went away stops and leaves the run running; a run that does not end within the gateway's run
//! timeout, or cannot be submitted or followed, ends the output with the fold's failure.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use skein_common::protocol::{EventKind, FinalResult, TaskSubmission, TurnEvent};

use super::Gateway;

/// What a protocol makes of a run's events.
pub(crate) trait Fold: Send + 'static {
    /// What goes out before the first event.
    fn opening(&mut self) -> Vec<Value>;
    /// What one event makes.
    fn event(&mut self, event: &TurnEvent) -> Vec<Value>;
    /// True once the output is complete before the run's end (the run stopped to wait).
    fn stopped(&self) -> bool {
        false
    }
    /// True while the output ends here unless another event comes within [`SETTLE`] (the run
    /// asked a person and may have stopped to wait).
    fn waiting(&self) -> bool {
        false
    }
    /// The last output when no event came within [`SETTLE`] while [`Fold::waiting`].
    fn settle(&mut self) -> Vec<Value> {
        Vec::new()
    }
    /// What the run's end makes (the last output).
    fn finish(&mut self, result: &FinalResult) -> Vec<Value>;
    /// The last output of a run that could not be followed (`code` `unavailable`, with why) or
    /// did not end in time (`run_not_finished`).
    fn failure(&mut self, code: &str, message: String) -> Vec<Value>;
}

/// The run a follower reads.
pub(crate) struct Followed {
    pub tenant: String,
    pub session: String,
    pub task_id: String,
}

/// Where a run's events come from.
pub(crate) enum Source {
    /// A run this request submits and follows live (listening before it submits, the stream
    /// after a gap, the stored result at the end), with a write that runs beside it and must be
    /// done before the output goes on (the protocol's record of the run).
    Submit(
        Box<TaskSubmission>,
        Option<tokio::task::JoinHandle<Result<(), String>>>,
    ),
    /// A run submitted before, read from the events stream from its first event; with a result,
    /// a run known to be over (whose final event the stream may no longer hold).
    Stored(Option<Box<FinalResult>>),
}

/// What the fold hears from the run it follows.
enum Heard {
    Event(Box<TurnEvent>),
    /// The run could not be submitted or followed.
    Failed(String),
}

/// How long a fold that is [`Fold::waiting`] waits for another event before it settles: a turn
/// that asked a person stops there, and one whose calls were answered goes on within it.
pub(crate) const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a run known to be over may go without an event before what the stream held is taken
/// as all there is (its events aged out of the stream).
const ENDED_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The fold's output for the run, ending with the run's end, the fold's stop, or its failure.
pub(crate) fn followed<F: Fold>(
    gateway: Arc<Gateway>,
    run: Followed,
    source: Source,
    mut fold: F,
) -> impl futures::Stream<Item = Value> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Vec<Value>>(16);
    tokio::spawn(async move {
        let mut out = fold.opening();
        let (events, mut heard) = tokio::sync::mpsc::unbounded_channel::<Heard>();
        let mut recording = None;
        let mut running = None;
        let (ended, idle) = match source {
            Source::Submit(submission, writing) => {
                recording = writing;
                let runner = gateway.clone();
                // Stops, and lets go of its subscription, once the output is complete; runs on
                // when the client leaves (the run goes on; its submission may not be made yet).
                running = Some(AbortOnDrop(Some(tokio::spawn(async move {
                    let timeout = runner.run_timeout;
                    let passed = events.clone();
                    let run = runner.client.run(&submission, timeout, move |event| {
                        let _ = passed.send(Heard::Event(Box::new(event.clone())));
                    });
                    if let Err(e) = run.await {
                        let _ = events.send(Heard::Failed(e.to_string()));
                    }
                }))));
                (None, None)
            }
            Source::Stored(ended) => {
                read_stored(gateway.clone(), &run, events);
                let idle = ended.is_some().then_some(ENDED_IDLE);
                (ended, idle)
            }
        };
        let deadline = tokio::time::Instant::now() + gateway.run_timeout;
        if let Some(recording) = recording {
            // A run not recorded cannot be read again or continued; it goes on regardless.
            match recording.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(task = %run.task_id, error = %e, "the run was not recorded")
                }
                Err(e) => {
                    tracing::warn!(task = %run.task_id, error = %e, "the run was not recorded")
                }
            }
        }
        let mut failure = None;
        let client_left = |running: Option<AbortOnDrop>| {
            if let Some(running) = running {
                running.let_go();
            }
        };
        let finished = loop {
            if !out.is_empty() && sender.send(std::mem::take(&mut out)).await.is_err() {
                return client_left(running);
            }
            if fold.stopped() {
                return;
            }
            let mut until = match idle {
                Some(idle) => deadline.min(tokio::time::Instant::now() + idle),
                None => deadline,
            };
            if fold.waiting() {
                until = until.min(tokio::time::Instant::now() + SETTLE);
            }
            let next = tokio::select! {
                next = tokio::time::timeout_at(until, heard.recv()) => next,
                // The client went away: the run goes on without a follower.
                () = sender.closed() => return client_left(running),
            };
            match next {
                Ok(Some(Heard::Event(event))) => match event.event {
                    EventKind::Final { result } => {
                        match gateway.client.whole_answer(result).await {
                            Ok(result) => out = fold.finish(&result),
                            Err(e) => failure = Some(e.to_string()),
                        }
                        break failure.is_none();
                    }
                    _ => out = fold.event(&event),
                },
                Ok(Some(Heard::Failed(why))) => {
                    failure = Some(why);
                    break false;
                }
                Err(_) if fold.waiting() => {
                    let _ = sender.send(fold.settle()).await;
                    return;
                }
                Ok(None) | Err(_) => break false,
            }
        };
        if !finished {
            let result = match ended {
                Some(result) => Some(*result),
                None => gateway
                    .client
                    .stored_final(&run.tenant, &run.session, &run.task_id)
                    .await
                    .ok()
                    .flatten(),
            };
            out = match (result, failure) {
                (Some(result), _) => fold.finish(&result),
                (None, Some(why)) => fold.failure(
                    "unavailable",
                    format!("run {} could not be run or followed: {why}", run.task_id),
                ),
                (None, None) => fold.failure(
                    "run_not_finished",
                    format!("run {} did not end in time; it keeps running", run.task_id),
                ),
            };
        }
        let _ = sender.send(out).await;
        drop(running);
    });
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|batch| (batch, receiver))
    })
    .flat_map(futures::stream::iter)
}

/// A task that stops when its handle is dropped, unless let go.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    /// Lets the task run on (its submission may not be made yet).
    fn let_go(mut self) {
        self.0.take();
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Reads the run's events from the events stream into `events` until its final event, or until
/// nobody listens.
fn read_stored(
    gateway: Arc<Gateway>,
    run: &Followed,
    events: tokio::sync::mpsc::UnboundedSender<Heard>,
) {
    let (tenant, id) = (run.tenant.clone(), run.task_id.clone());
    tokio::spawn(async move {
        let mut stream = match gateway.client.watch(&tenant, &id).await {
            Ok(stream) => stream,
            Err(e) => {
                let _ = events.send(Heard::Failed(e.to_string()));
                return;
            }
        };
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                // Nobody folds any more: stop reading.
                () = events.closed() => return,
            };
            let Some(Ok(event)) = event else { return };
            let last = matches!(event.event, EventKind::Final { .. });
            if events.send(Heard::Event(Box::new(event))).is_err() || last {
                return;
            }
        }
    });
}

/// The last of a stream's outputs.
pub(crate) async fn last_of(outputs: impl futures::Stream<Item = Value>) -> Option<Value> {
    outputs
        .fold(None, |_, output| async move { Some(output) })
        .await
}
