//! Model traffic under control across the cluster: a layer that takes a slot of the model's
//! Redis semaphore (`store::traffic`) before each model attempt, renews its lease while the
//! attempt runs and frees it after, and counts the tokens the attempt used against the model's
//! and the tenant's budgets per minute. Which limits apply to a call is the
//! [`TrafficPolicy`](super::traffic_policy::TrafficPolicy)'s say.
//!
//! Invariants:
//! - the layer sits right around the provider, inside the retry layer: each attempt takes its own
//!   slot, and a call waiting out a backoff or a `Retry-After` holds none;
//! - at most `max_concurrency` attempts hold a slot of one model at once across every process
//!   sharing the Redis (a dead process's slots free themselves when their leases expire), and at
//!   most the tenant's own `max_concurrency` of them are one tenant's; when the model is at its
//!   limit a tenant over its fair share waits first, and freed slots go to the tenant holding
//!   fewest, then to the one waiting longest (see `store::traffic`);
//! - a call waits for a slot by asking again after short jittered pauses, never past its task's
//!   deadline (it then fails `timed_out`, not retryable); a turn that is cancelled while waiting
//!   or running drops the call, and the slot is freed in the background (or expires);
//! - a store that cannot be reached fails the attempt `unavailable` (retryable): the limit is
//!   never skipped.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::TryFutureExt;
use tower::util::rng::{HasherRng, Rng};
use tower::{Layer, Service};

use super::traffic_policy::TrafficPolicy;
use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, ModelCall};
use crate::protocol::{now_ms, Failure, FailureKind};
use crate::store::traffic::{Admission, SlotRequest};
use crate::store::SessionStore;

/// How long a slot is held unless renewed: how long a dead process keeps its slots.
pub const SLOT_LEASE: Duration = Duration::from_secs(15);
/// How often a running attempt renews its slot's lease.
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long a refused call keeps its tenant noted as waiting unless it asks again; longer than
/// the longest pause between asks.
const WAITING_NOTE: Duration = Duration::from_secs(2);
/// The first pause before asking for a slot again; pauses double up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(250);
/// The tenant of a call made outside any task.
const NO_TENANT: &str = "-";

/// The limits every model gets (`SKEIN_MODEL_MAX_CONCURRENCY`, `SKEIN_MODEL_TOKENS_PER_MINUTE`);
/// 0 turns a limit off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficLimits {
    pub max_concurrency: u32,
    pub tokens_per_minute: u64,
}

impl TrafficLimits {
    pub fn from_config(model: &crate::config::ModelConfig) -> Self {
        Self {
            max_concurrency: model.max_concurrency,
            tokens_per_minute: model.tokens_per_minute,
        }
    }

    /// Whether neither limit is set.
    pub fn is_off(&self) -> bool {
        self.max_concurrency == 0 && self.tokens_per_minute == 0
    }
}

/// Puts model attempts under the cluster's traffic limits; see the module's invariants.
#[derive(Clone)]
pub struct ModelTrafficLayer {
    store: SessionStore,
    policy: Arc<TrafficPolicy>,
}

impl ModelTrafficLayer {
    /// `None` when every limit is off.
    pub fn new(store: SessionStore, policy: TrafficPolicy) -> Option<Self> {
        (!policy.is_off()).then(|| Self {
            store,
            policy: Arc::new(policy),
        })
    }
}

impl<S> Layer<S> for ModelTrafficLayer {
    type Service = ModelTraffic<S>;

    fn layer(&self, inner: S) -> ModelTraffic<S> {
        ModelTraffic {
            inner,
            store: self.store.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// The service of [`ModelTrafficLayer`].
#[derive(Clone)]
pub struct ModelTraffic<S> {
    inner: S,
    store: SessionStore,
    policy: Arc<TrafficPolicy>,
}

impl<S> Service<ModelCall> for ModelTraffic<S>
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

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let mut ready = super::take_ready(&mut self.inner);
        let (store, policy) = (self.store.clone(), self.policy.clone());
        Box::pin(async move {
            let model = call.request.model.clone();
            let tenant = call
                .origin
                .as_ref()
                .map_or(NO_TENANT, |origin| origin.tenant.as_str())
                .to_owned();
            let limits = policy.for_call(&model, &tenant);
            if limits.model.is_off() && limits.tenant.is_off() {
                return ready.call(call).await.map_err(Into::into);
            }
            let deadline_ms = call.origin.as_ref().and_then(|origin| origin.deadline_ms);
            let holder = uuid::Uuid::new_v4().simple().to_string();
            let slot = SlotRequest {
                model: &model,
                tenant: &tenant,
                holder: &holder,
                limit: limits.model.max_concurrency,
                tokens_per_minute: limits.model.tokens_per_minute,
                tenant_limit: limits.tenant.max_concurrency,
                tenant_tokens_per_minute: limits.tenant.tokens_per_minute,
                lease: SLOT_LEASE,
                waiting_note: WAITING_NOTE,
            };
            // The slot's steps are boxed: inline, they would size the future every model call
            // keeps while it waits for its answer.
            Box::pin(wait_for_slot(&store, &slot, deadline_ms)).await?;
            let slots = limits.model.max_concurrency > 0 || limits.tenant.max_concurrency > 0;
            let held = slots.then(|| HeldSlot {
                store: store.clone(),
                model: model.clone(),
                tenant: tenant.clone(),
                holder: holder.clone(),
                released: false,
            });
            let attempt = ready.call(call).map_err(Into::<BoxError>::into);
            let result = match &held {
                Some(slot) => Box::pin(slot.renew_while(attempt)).await,
                None => attempt.await,
            };
            if let Some(slot) = held {
                Box::pin(slot.release()).await;
            }
            let response = result?;
            if limits.model.tokens_per_minute > 0 || limits.tenant.tokens_per_minute > 0 {
                let used = response
                    .usage
                    .prompt_tokens
                    .saturating_add(response.usage.completion_tokens);
                if let Err(error) = Box::pin(store.count_model_tokens(&model, &tenant, used)).await
                {
                    tracing::warn!(%model, %error, "model tokens could not be counted");
                }
            }
            Ok(response)
        })
    }
}

/// Asks for a slot until one is given, pausing between asks; fails at the task's deadline or when
/// the store cannot be reached.
async fn wait_for_slot(
    store: &SessionStore,
    slot: &SlotRequest<'_>,
    deadline_ms: Option<u64>,
) -> Result<(), Failure> {
    let mut rng = HasherRng::default();
    let mut pause = FIRST_PAUSE;
    let mut waited = false;
    loop {
        let admission = store
            .try_take_model_slot(slot)
            .await
            .map_err(|error| error.to_failure())?;
        let next = match admission {
            Admission::Admitted => {
                if waited {
                    tracing::debug!(model = %slot.model, tenant = %slot.tenant, "model slot taken");
                }
                return Ok(());
            }
            Admission::SlotsTaken => {
                let next = pause;
                pause = (pause * 2).min(LONGEST_PAUSE);
                next
            }
            Admission::TokensSpent => until_next_minute(),
        };
        if !waited {
            tracing::debug!(model = %slot.model, tenant = %slot.tenant, ?admission, "waiting for a model slot");
            waited = true;
        }
        // Half to all of the pause, so callers refused together do not ask again together.
        let next = next.mul_f64(0.5 + rng.next_f64() / 2.0);
        if let Some(deadline) = deadline_ms {
            let now = now_ms();
            let next_ms = u64::try_from(next.as_millis()).unwrap_or(u64::MAX);
            if now.saturating_add(next_ms) >= deadline {
                let mut failure = Failure::new(
                    FailureKind::TimedOut,
                    format!(
                        "model {} had no free slot before the task's deadline",
                        slot.model
                    ),
                );
                failure.retryable = false;
                return Err(failure);
            }
        }
        tokio::time::sleep(next).await;
    }
}

/// The time left in the current minute (of the Unix epoch), at least a short pause.
fn until_next_minute() -> Duration {
    let into_minute = now_ms() % 60_000;
    Duration::from_millis(60_000 - into_minute).max(FIRST_PAUSE)
}

/// A slot this process holds; freed by [`HeldSlot::release`], or in the background when dropped
/// unreleased (a cancelled turn), or by its lease's expiry.
struct HeldSlot {
    store: SessionStore,
    model: String,
    tenant: String,
    holder: String,
    released: bool,
}

impl HeldSlot {
    /// Runs `attempt`, renewing the lease until it ends.
    async fn renew_while<F: std::future::Future>(&self, attempt: F) -> F::Output {
        tokio::pin!(attempt);
        let mut renewals =
            tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
        loop {
            tokio::select! {
                output = &mut attempt => return output,
                _ = renewals.tick() => self.renew().await,
            }
        }
    }

    async fn renew(&self) {
        match self
            .store
            .renew_model_slot(&self.model, &self.tenant, &self.holder, SLOT_LEASE)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(model = %self.model, "a model slot's lease expired while its call ran")
            }
            Err(error) => {
                tracing::warn!(model = %self.model, %error, "a model slot's lease could not be renewed")
            }
        }
    }

    async fn release(mut self) {
        self.released = true;
        free(&self.store, &self.model, &self.tenant, &self.holder).await;
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped mid-call (the turn was cancelled): free the slot now rather than when its
        // lease expires. One bounded command; if no runtime is left the lease expires instead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let model = std::mem::take(&mut self.model);
        let tenant = std::mem::take(&mut self.tenant);
        let holder = std::mem::take(&mut self.holder);
        runtime.spawn(async move { free(&store, &model, &tenant, &holder).await });
    }
}

async fn free(store: &SessionStore, model: &str, tenant: &str, holder: &str) {
    if let Err(error) = store.release_model_slot(model, tenant, holder).await {
        tracing::warn!(%model, %error, "a model slot could not be freed; its lease will expire");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_of_zero_turn_the_layer_off() {
        assert!(TrafficLimits::default().is_off());
        assert!(!TrafficLimits {
            max_concurrency: 4,
            tokens_per_minute: 0
        }
        .is_off());
        assert!(!TrafficLimits {
            max_concurrency: 0,
            tokens_per_minute: 1000
        }
        .is_off());
    }

    #[test]
    fn the_pause_for_tokens_ends_within_a_minute() {
        let pause = until_next_minute();
        assert!(pause >= FIRST_PAUSE && pause <= Duration::from_secs(60));
    }
}
