//! Slot lending for nested subagents: a subagent turn running on this worker that waits for its
//! own subagent calls gives its agent slot up while it waits, so the children (served by the
//! same consumer, or by another type's) can always run. Without it, as many parents as there
//! are slots would hold every slot while their children wait behind them, until the subagent
//! timeout.
//!
//! A worker that runs a list of agent types has one consumer, with its own slots, per type: a
//! turn lends a slot of the consumer its own task came from, which it registers while it runs
//! ([`LendSlotsLayer::lender`]). Every waiting turn so frees the slot it holds, whatever the
//! type of the children and wherever they run, so no slot is held by a turn that only waits.
//!
//! One loan per waiting turn, whatever its fan-out: the first subagent call of a turn in flight
//! lends the turn's slot, the last one to end repays it (waiting for a free slot first, so the
//! turn goes on only within capacity). Tool calls run on another consumer and lend nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use skein_common::agent::seams::{BoxError, CallTarget, ToolCallRequest};
use skein_common::bus::{Loan, Slots};
use skein_common::protocol::{TaskOrigin, ToolResult};
use tower::{Layer, Service};

/// Lends the calling turn's slot while its subagent calls are in flight.
#[derive(Clone, Default)]
pub struct LendSlotsLayer {
    lending: Arc<Lending>,
}

impl LendSlotsLayer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the slots the subagent turn of `origin` holds one of (its consumer's), for as
    /// long as the returned guard lives: its subagent calls lend a slot of these.
    pub fn lender(&self, origin: &TaskOrigin, slots: Slots) -> Lender {
        let turn = turn_key(origin);
        lock(&self.lending.lenders).insert(turn.clone(), slots);
        Lender {
            lending: self.lending.clone(),
            turn,
        }
    }
}

/// A subagent turn registered as a lender ([`LendSlotsLayer::lender`]); unregistered on drop.
#[must_use = "the turn lends only while its guard lives"]
pub struct Lender {
    lending: Arc<Lending>,
    turn: String,
}

impl Drop for Lender {
    fn drop(&mut self) {
        lock(&self.lending.lenders).remove(&self.turn);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S> Layer<S> for LendSlotsLayer {
    type Service = LendSlots<S>;

    fn layer(&self, inner: S) -> LendSlots<S> {
        LendSlots {
            inner,
            lending: self.lending.clone(),
        }
    }
}

/// The service of [`LendSlotsLayer`].
#[derive(Clone)]
pub struct LendSlots<S> {
    inner: S,
    lending: Arc<Lending>,
}

/// The subagent turns running here with the slots they hold one of, and the turns waiting on
/// subagent calls: how many calls each has in flight, and its loan.
#[derive(Default)]
struct Lending {
    lenders: Mutex<HashMap<String, Slots>>,
    waiting: Mutex<HashMap<String, (usize, Option<Loan>)>>,
}

impl Lending {
    /// One more call of the turn in flight; the first lends its slot (a turn that holds none,
    /// not being registered, lends nothing).
    fn begin(&self, turn: &str) {
        let slots = lock(&self.lenders).get(turn).cloned();
        let mut waiting = lock(&self.waiting);
        let (calls, loan) = waiting.entry(turn.to_owned()).or_default();
        *calls += 1;
        if loan.is_none() {
            *loan = slots.map(|slots| slots.lend());
        }
    }

    /// One call of the turn ended; the loan of its last, if this was it.
    fn end(&self, turn: &str) -> Option<Loan> {
        let mut waiting = lock(&self.waiting);
        let (calls, _) = waiting.get_mut(turn)?;
        *calls = calls.saturating_sub(1);
        if *calls > 0 {
            return None;
        }
        waiting.remove(turn).and_then(|(_, loan)| loan)
    }
}

/// Ends a call on every path, the call's future dropped included (its loan then repays in the
/// background).
struct InFlight {
    lending: Arc<Lending>,
    turn: Option<String>,
}

impl InFlight {
    async fn ended(mut self) {
        if let Some(loan) = self.turn.take().and_then(|turn| self.lending.end(&turn)) {
            loan.repay().await;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(turn) = self.turn.take() {
            drop(self.lending.end(&turn));
        }
    }
}

fn turn_key(origin: &TaskOrigin) -> String {
    format!("{}/{}/{}", origin.tenant, origin.session, origin.task_id)
}

impl<S> Service<ToolCallRequest> for LendSlots<S>
where
    S: Service<ToolCallRequest, Response = ToolResult>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ToolResult;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ToolResult, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: ToolCallRequest) -> Self::Future {
        let in_flight = matches!(request.target, CallTarget::Subagent { .. }).then(|| {
            let turn = turn_key(&request.origin);
            self.lending.begin(&turn);
            InFlight {
                lending: self.lending.clone(),
                turn: Some(turn),
            }
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await.map_err(Into::into);
            if let Some(in_flight) = in_flight {
                in_flight.ended().await;
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(session: &str) -> TaskOrigin {
        TaskOrigin {
            task_id: "task".into(),
            tenant: "acme".into(),
            user: "u".into(),
            session: session.into(),
            workspace: "w".into(),
            deadline_ms: None,
            budget: None,
            run_budget: None,
        }
    }

    #[test]
    fn a_turn_lends_one_slot_however_many_calls_it_waits_for() {
        let slots = Slots::new(1);
        let layer = LendSlotsLayer::new();
        let (_t, _u) = (
            layer.lender(&origin("t"), slots.clone()),
            layer.lender(&origin("u"), slots.clone()),
        );
        let (t, u) = (turn_key(&origin("t")), turn_key(&origin("u")));
        let (t, u) = (t.as_str(), u.as_str());
        let lending = &layer.lending;
        lending.begin(t);
        lending.begin(t);
        lending.begin(u);
        assert_eq!(slots.free(), 3, "one slot lent by each waiting turn");
        assert_eq!(lending.waiting.lock().expect("not poisoned").len(), 2);
        assert!(lending.end(t).is_none(), "a call of t is still in flight");
        let loan = lending.end(t).expect("the last call of t repays");
        drop(loan);
        let loan = lending.end(u).expect("u's only call repays");
        drop(loan);
        assert_eq!(slots.free(), 1, "every loan repaid");
        assert!(lending.waiting.lock().expect("not poisoned").is_empty());
        assert!(lending.end(t).is_none(), "an unknown turn has no loan");
    }

    #[test]
    fn a_turn_lends_a_slot_of_its_own_consumer_and_only_while_registered() {
        let (researchers, writers) = (Slots::new(1), Slots::new(1));
        let layer = LendSlotsLayer::new();
        let lending = &layer.lending;
        let writer = layer.lender(&origin("w"), writers.clone());
        let w = turn_key(&origin("w"));
        lending.begin(&w);
        assert_eq!(
            (researchers.free(), writers.free()),
            (1, 2),
            "the writer's own consumer gets the slot"
        );
        drop(lending.end(&w));
        assert_eq!(writers.free(), 1);
        drop(writer);
        lending.begin(&w);
        assert_eq!(writers.free(), 1, "an unregistered turn lends nothing");
        assert!(lending.end(&w).is_none());
    }
}
