//! Spending budgets kept across the cluster: a layer that reserves each model attempt's worst
//! case on the ledgers it draws from (its task's budget, which its subagents share, and its
//! tenant's budget for the day, both in Redis through `store::budget`) before the attempt
//! starts, tells the server the answer bound it reserved, and settles the ledgers with what the
//! attempt really used after it; and the spending as a metric and as attributes of the `chat`
//! span.
//!
//! The rule that keeps a turn within its budget: an attempt costs its prompt plus its answer.
//! The answer is bounded by the server, which is sent the bound the attempt reserved
//! (`ModelRequest::max_output_tokens`, `max_tokens` on the wire). The prompt is only estimated
//! before the call (a quarter of its bytes), and an estimate can fall short: code, JSON and
//! non-Latin text take more tokens than that. So the prompt is reserved at its bound instead:
//! its bytes plus a little framing per message ([`prompt_bound`]), since no tokenizer
//! makes more tokens of a text than it has bytes. An attempt that answers then takes at most
//! what it reserved, and the ledger's script never grants more than its limit leaves; only what
//! a server's chat template adds beyond the framing counted per message can take a ledger past
//! its limit (and the next attempt is then refused). The price of the guarantee is headroom: an
//! attempt holds up to four times its likely prompt while it runs, and a budget near its end
//! refuses an attempt whose true prompt might still have fitted.
//!
//! Invariants:
//! - the layer sits right around the provider, inside the retry layer and outside the traffic
//!   limits: each attempt reserves on its own, for the model it really asks (a fallback model's
//!   price is that model's), and an attempt waiting for a model slot already holds its worst case
//!   (a refused one never waits for a slot; one that waits longer than the hold's lease stops
//!   counting as held, though what it uses still counts when it settles);
//! - an attempt with a ledger to draw from reserves its prompt's bound plus an answer bound,
//!   priced at its model's price, and is sent with that answer bound: `max_output_tokens`
//!   (`SKEIN_MODEL_MAX_OUTPUT_TOKENS`, or the request's own bound when smaller) when a ledger
//!   holds that much, else the most a refusing ledger leaves room for, if that is at least
//!   [`MIN_OUTPUT_TOKENS`] (or the configured bound when smaller); with less room it is
//!   not made: it fails `budget_exhausted` (not retryable) with a message that says what was
//!   spent, and whatever it reserved on another ledger is given back. An attempt without a
//!   ledger is sent as it came (the provider's default bound);
//! - the task's ledger is reserved first, then the tenant's day (their keys live in different
//!   hash slots, so they are two scripts; a refusal by the second gives back the first). A
//!   smaller attempt starts over on every ledger with a fresh reservation, at most
//!   [`RESERVE_ROUNDS`] times (other attempts may take room between two rounds);
//! - an attempt that answers settles with the usage the model reported (with none reported, with
//!   the estimate of its prompt and answer); an attempt that fails, or whose turn is cancelled,
//!   gives back what it held and counts nothing;
//! - a limit on cost needs the model's price: without one (and without a `*` entry) the attempt is
//!   refused `denied` rather than let through uncounted; spending on a model without a price
//!   counts $0 in the metric (logged once per model);
//! - a store that cannot be reached fails the attempt `unavailable` (retryable) when it has a
//!   ledger to reserve on: a budget is never skipped. A failed settle is logged; the reservation
//!   lapses after its lease.

mod settings;
mod sizing;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tower::{Layer, Service};

pub use settings::{
    estimate_prompt_tokens, estimate_text_tokens, BudgetSettings, Price, Prices, TenantBudgets,
    TenantDaily, ANY_MODEL,
};
pub use sizing::{prompt_bound, MIN_OUTPUT_TOKENS};

use sizing::{smaller_output, Need, Sizing};

use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, ModelCall};
use crate::metrics::Metrics;
use crate::protocol::budget::{nanos_to_usd, Usd};
use crate::protocol::{Failure, FailureKind, TaskOrigin};
use crate::store::budget::{Hold, Ledger, LedgerLimits, LedgerName, LedgerState, Reservation};
use crate::store::SessionStore;

/// The tenant of a call made outside any task.
const NO_TENANT: &str = "-";

/// Most rounds of reservations one attempt makes, each with a smaller answer bound than the last.
pub const RESERVE_ROUNDS: usize = 4;

/// Reserves and settles model attempts on their budgets; see the module's invariants.
#[derive(Clone)]
pub struct ModelBudgetLayer {
    shared: Arc<Shared>,
}

struct Shared {
    store: SessionStore,
    settings: BudgetSettings,
    metrics: Metrics,
    /// Models whose missing price was logged.
    unpriced: Mutex<BTreeSet<String>>,
}

impl ModelBudgetLayer {
    pub fn new(store: SessionStore, settings: BudgetSettings, metrics: Metrics) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                settings,
                metrics,
                unpriced: Mutex::new(BTreeSet::new()),
            }),
        }
    }
}

impl<S> Layer<S> for ModelBudgetLayer {
    type Service = ModelBudget<S>;

    fn layer(&self, inner: S) -> ModelBudget<S> {
        ModelBudget {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`ModelBudgetLayer`].
#[derive(Clone)]
pub struct ModelBudget<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<ModelCall> for ModelBudget<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let mut ready = super::take_ready(&mut self.inner);
        let shared = self.shared.clone();
        Box::pin(async move {
            let model = call.request.model.clone();
            let tenant = call
                .origin
                .as_ref()
                .map_or(NO_TENANT, |origin| origin.tenant.as_str())
                .to_owned();
            let price = shared.settings.prices.get(&model).copied();
            let ledgers = shared.ledgers(call.origin.as_deref())?;
            // What an answer without usage is charged for its prompt. Without a ledger it only
            // serves the spend metric of a server that reports no usage; it is counted all the
            // same, since the request is gone by then.
            let prompt = estimate_prompt_tokens(&call.request);
            let holds = if ledgers.is_empty() {
                None
            } else {
                if price.is_none() && ledgers.iter().any(|l| l.limits.cost_nanos > 0) {
                    return Err(no_price(&model).into());
                }
                let sizing = Sizing {
                    prompt: prompt_bound(&call.request),
                    price,
                };
                let ceiling = call
                    .request
                    .max_output_tokens
                    .map_or(shared.settings.max_output_tokens, |asked| {
                        asked.min(shared.settings.max_output_tokens)
                    });
                // Boxed, as the settling below: inline, they would size the future every model
                // call keeps while it waits for its answer, budget or not.
                let (holds, output) = Box::pin(reserve(
                    &shared.store,
                    ledgers,
                    sizing,
                    ceiling,
                    shared.settings.hold,
                ))
                .await?;
                // The server stops the answer where the reservation ends.
                call.request.max_output_tokens = Some(output);
                Some(holds)
            };
            let result = ready.call(call).await.map_err(Into::into);
            let response = match result {
                Ok(response) => response,
                Err(error) => {
                    if let Some(holds) = holds {
                        Box::pin(holds.settle(0, 0)).await;
                    }
                    return Err(error);
                }
            };
            let (input, output) = used(&response, prompt);
            let reported = response.usage.prompt_tokens > 0 || response.usage.completion_tokens > 0;
            let cost_nanos = match price {
                Some(price) if reported => price.usage_cost_nanos(&response.usage),
                Some(price) => price.cost_nanos(input, output),
                None => {
                    shared.note_unpriced(&model);
                    0
                }
            };
            let tokens = input.saturating_add(output);
            if let Some(holds) = holds {
                Box::pin(holds.settle(tokens, cost_nanos)).await;
            }
            shared.record(&tenant, &model, tokens, cost_nanos);
            Ok(response)
        })
    }
}

/// Reserves an attempt's worst case on every ledger, with an answer bound of `ceiling` or, when
/// a ledger has less room, the most it has (see the module's invariants); returns the holds and
/// the answer bound they were made for.
async fn reserve(
    store: &SessionStore,
    ledgers: Vec<Ledger>,
    sizing: Sizing,
    ceiling: u64,
    lease: std::time::Duration,
) -> Result<(Holds, u64), Failure> {
    let floor = ceiling.min(MIN_OUTPUT_TOKENS);
    let mut output = ceiling;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let hold = sizing.hold(output, lease);
        let (ledger, state) = match Holds::take(store, ledgers.clone(), hold).await? {
            Taken::Held(holds) => return Ok((holds, output)),
            Taken::Refused { ledger, state } => (ledger, state),
        };
        let room = sizing.room(&ledger.limits, &state, output);
        match smaller_output(output, room, floor) {
            Some(smaller) if rounds < RESERVE_ROUNDS => output = smaller,
            _ => return Err(refusal(&ledger, &state, sizing, floor)),
        }
    }
}

impl Shared {
    /// The ledgers a call of `origin` draws from: its subagent run's own budget, its task's
    /// budget, then its tenant's day.
    fn ledgers(&self, origin: Option<&TaskOrigin>) -> Result<Vec<Ledger>, Failure> {
        let Some(origin) = origin else {
            return Ok(Vec::new());
        };
        let mut ledgers = Vec::with_capacity(3);
        // A subagent run's own budget first: it is the tighter one when it refuses.
        if let Some(scope) = &origin.run_budget {
            scope.check()?;
            ledgers.push(Ledger::task(&origin.tenant, scope));
        }
        if let Some(scope) = &origin.budget {
            // It names Redis keys: a forged scope must not reach them.
            scope.check()?;
            ledgers.push(Ledger::task(&origin.tenant, scope));
        }
        let daily = self.settings.tenants.limits(&origin.tenant);
        if !daily.is_off() {
            ledgers.push(Ledger::tenant_today(&origin.tenant, daily));
        }
        Ok(ledgers)
    }

    fn note_unpriced(&self, model: &str) {
        if self.settings.prices.is_empty() {
            return;
        }
        let first = self
            .unpriced
            .lock()
            .map(|mut seen| seen.insert(model.to_owned()))
            .unwrap_or(false);
        if first {
            tracing::warn!(%model, "model has no price; its spending counts as $0");
        }
    }

    /// The spending as a metric and on the current (`chat`) span.
    fn record(&self, tenant: &str, model: &str, tokens: u64, cost_nanos: u64) {
        let cost_usd = nanos_to_usd(cost_nanos);
        self.metrics.model_spend(tenant, model, tokens, cost_usd);
        let span = tracing::Span::current();
        span.record("skein.spent.tokens", tokens);
        span.record("skein.spent.cost_usd", cost_usd);
    }
}

/// The tokens an answer used, prompt and completion: as the model reported them, or estimated
/// when it reported none.
fn used(response: &ModelResponse, prompt_estimate: u64) -> (u64, u64) {
    let usage = response.usage;
    if usage.prompt_tokens > 0 || usage.completion_tokens > 0 {
        return (usage.prompt_tokens, usage.completion_tokens);
    }
    let message = &response.message;
    let calls: u64 = message
        .tool_calls
        .iter()
        .map(|c| estimate_text_tokens(&c.name) + estimate_text_tokens(&c.arguments.to_string()))
        .sum();
    (
        prompt_estimate,
        estimate_text_tokens(&message.content) + calls,
    )
}

/// Why a call with a cost limit cannot be made on an unpriced model.
fn no_price(model: &str) -> Failure {
    Failure::new(
        FailureKind::Denied,
        format!(
            "model {model} has no price (SKEIN_MODEL_PRICES names neither it nor \"{ANY_MODEL}\"), \
             so a cost budget cannot be kept"
        ),
    )
}

/// One attempt's reservations: given back (settled with nothing) in the background if dropped
/// unsettled (its turn was cancelled), or else by the lapse of their lease.
struct Holds {
    store: SessionStore,
    ledgers: Vec<Ledger>,
    hold: Hold,
    settled: bool,
}

/// What reserving on every ledger came to.
enum Taken {
    Held(Holds),
    /// `ledger` refused, as it stood (`state`); nothing is held anywhere.
    Refused {
        ledger: Ledger,
        state: LedgerState,
    },
}

impl Holds {
    /// Reserves `hold` on each ledger in turn; a refusal or a store failure gives back what was
    /// taken.
    async fn take(
        store: &SessionStore,
        ledgers: Vec<Ledger>,
        hold: Hold,
    ) -> Result<Taken, Failure> {
        let mut holds = Holds {
            store: store.clone(),
            ledgers: Vec::with_capacity(ledgers.len()),
            hold,
            settled: false,
        };
        for ledger in ledgers {
            let outcome = match store.reserve_budget(&ledger, &holds.hold).await {
                Ok(Reservation::Held) => {
                    holds.ledgers.push(ledger);
                    continue;
                }
                Ok(Reservation::Refused { ledger: state, .. }) => {
                    Ok(Taken::Refused { ledger, state })
                }
                Err(error) => Err(error.to_failure()),
            };
            holds.settle(0, 0).await;
            return outcome;
        }
        Ok(Taken::Held(holds))
    }

    /// Ends every reservation, counting what the attempt used.
    async fn settle(mut self, tokens: u64, cost_nanos: u64) {
        self.settled = true;
        for ledger in &self.ledgers {
            settle(&self.store, ledger, &self.hold, tokens, cost_nanos).await;
        }
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        if self.settled || self.ledgers.is_empty() {
            return;
        }
        // Dropped mid-call (the turn was cancelled): give back now rather than when the lease
        // lapses. If no runtime is left the lease lapses instead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let ledgers = std::mem::take(&mut self.ledgers);
        let hold = self.hold.clone();
        runtime.spawn(async move {
            for ledger in &ledgers {
                settle(&store, ledger, &hold, 0, 0).await;
            }
        });
    }
}

async fn settle(store: &SessionStore, ledger: &Ledger, hold: &Hold, tokens: u64, cost: u64) {
    if let Err(error) = store.settle_budget(ledger, hold, tokens, cost).await {
        tracing::warn!(%error, ledger = ?ledger.name, "a budget reservation could not be settled; it lapses after its lease");
    }
}

/// The failure of an attempt `ledger` refused (as it stood: `state`) with no room for an answer
/// of `floor` tokens, saying what was spent and what the smallest attempt would have needed.
fn refusal(ledger: &Ledger, state: &LedgerState, sizing: Sizing, floor: u64) -> Failure {
    let need = sizing.need(floor);
    let (over_tokens, over_cost) = Sizing::over(&ledger.limits, state, need);
    let whose = match &ledger.name {
        LedgerName::Task { .. } => "the task's budget".to_owned(),
        LedgerName::TenantDay { tenant, day } => {
            format!("tenant {tenant}'s budget for {day} (UTC)")
        }
    };
    let held = if state.held_tokens > 0 {
        format!(
            " ({} tokens and {} more held by calls in flight)",
            state.held_tokens,
            Usd(nanos_to_usd(state.held_cost_nanos))
        )
    } else {
        String::new()
    };
    let over = match (over_tokens, over_cost) {
        (true, true) => "token and cost limits",
        (true, false) => "token limit",
        (false, true) => "cost limit",
        // Room that calls in flight took between two rounds of reservations.
        (false, false) => "limits",
    };
    let Need { tokens, cost_nanos } = need;
    Failure::new(
        FailureKind::BudgetExhausted,
        format!(
            "{whose} is exhausted: {} spent{held} of {}; the next model call needs room for {} \
             tokens and {} (its prompt and an answer of at least {floor} tokens), which would go \
             over its {over}",
            state.spent(),
            limits(&ledger.limits),
            tokens,
            Usd(nanos_to_usd(cost_nanos)),
        ),
    )
}

/// A ledger's limits for people.
fn limits(limits: &LedgerLimits) -> String {
    let cost = Usd(nanos_to_usd(limits.cost_nanos));
    match (limits.tokens, limits.cost_nanos) {
        (0, _) => cost.to_string(),
        (tokens, 0) => format!("{tokens} tokens"),
        (tokens, _) => format!("{tokens} tokens and {cost}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Budget, BudgetScope};

    fn task_ledger(tokens: Option<u64>, usd: Option<f64>) -> Ledger {
        let scope = BudgetScope {
            task_id: "t1".into(),
            session: "s1".into(),
            limits: Budget {
                max_total_tokens: tokens,
                max_cost_usd: usd,
            },
        };
        Ledger::task("acme", &scope)
    }

    #[test]
    fn a_refusal_says_what_was_spent_and_is_not_retried() {
        let state = LedgerState {
            spent_tokens: 36,
            spent_cost_nanos: 14_000_000_000,
            held_tokens: 0,
            held_cost_nanos: 0,
        };
        // A 60-token prompt and an answer of at least 10 tokens at $1 each: $10.
        let sizing = Sizing {
            prompt: 60,
            price: Some(Price {
                input_per_million: 0.0,
                cache_read_per_million: None,
                cache_write_per_million: None,
                output_per_million: 1_000_000.0,
            }),
        };
        let failure = refusal(&task_ledger(Some(200), Some(20.0)), &state, sizing, 10);
        assert_eq!(failure.kind, FailureKind::BudgetExhausted);
        assert!(!failure.retryable);
        assert_eq!(
            failure.message,
            "the task's budget is exhausted: 36 tokens and $14.00 spent of 200 tokens and $20.00; \
             the next model call needs room for 70 tokens and $10.00 (its prompt and an answer \
             of at least 10 tokens), which would go over its cost limit"
        );
        let day = Ledger {
            name: LedgerName::TenantDay {
                tenant: "acme".into(),
                day: "2030-01-02".into(),
            },
            limits: LedgerLimits {
                tokens: 50,
                cost_nanos: 0,
            },
        };
        let busy = LedgerState {
            held_tokens: 20,
            ..state
        };
        let unpriced = Sizing {
            prompt: 60,
            price: None,
        };
        let failure = refusal(&day, &busy, unpriced, 10);
        assert!(
            failure
                .message
                .starts_with("tenant acme's budget for 2030-01-02 (UTC) is exhausted: 36 tokens"),
            "{}",
            failure.message
        );
        assert!(
            failure
                .message
                .contains("(20 tokens and $0.00 more held by calls in flight) of 50 tokens;"),
            "{}",
            failure.message
        );
        assert!(
            failure.message.ends_with("over its token limit"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn limits_read_as_what_is_set() {
        assert_eq!(limits(&task_ledger(Some(10), None).limits), "10 tokens");
        assert_eq!(limits(&task_ledger(None, Some(0.5)).limits), "$0.50");
        assert_eq!(
            limits(&task_ledger(Some(10), Some(0.5)).limits),
            "10 tokens and $0.50"
        );
    }
}
