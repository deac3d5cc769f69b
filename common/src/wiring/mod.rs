//! The runtime's seams implemented over the cluster's NATS and Redis, and the one place a
//! process assembles its runtime.
//!
//! - [`events`]: `BusEvents`, the event sink over the task's JetStream event subject.
//! - [`checkpoints`]: `LeaseCheckpoints`, the checkpoint sink over Redis, fenced by the lease.
//! - [`approvals`]: `StoredApprovals`, the approval gate over the answers stored in Redis.
//! - [`assemble`]: a cluster runtime from configuration: the model provider, the NATS dispatcher as
//!   tool service, the live worker registry as tool directory, the embedder's middleware, and
//!   around the provider the spending budgets, the model traffic limits shared through Redis, and
//!   innermost the image layer.
//! - [`images`]: `ImageLayer`, which reads the images a request shows by payload reference and
//!   holds the request to the image count cap.

pub mod approvals;
pub mod checkpoints;
pub mod events;
pub mod images;

use std::sync::Arc;

use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use crate::agent::middleware::{
    BudgetSettings, Middleware, ModelBudgetLayer, ModelTrafficLayer, TrafficLimits, TrafficPolicy,
};
use crate::agent::model::providers::provider_secrets;
use crate::agent::model::Providers;
use crate::agent::runtime::{Runtime, RuntimeSettings};
use crate::agent::seams::ProviderService;
use crate::agent::skills::SkillCatalog;
use crate::dispatch::Dispatcher;

/// A runtime whose tools run on the cluster's workers (through `dispatcher`) and whose model is
/// `provider` (or, by a model's name, one of its named providers), wrapped in `middleware` (its
/// layers outside the built-ins). The providers' API keys are secrets the redaction layer masks;
/// `settings` learn the providers' kinds, for telemetry.
pub fn assemble(
    provider: Providers,
    dispatcher: Dispatcher,
    skills: SkillCatalog,
    middleware: Middleware,
    mut settings: RuntimeSettings,
    metrics: crate::metrics::Metrics,
    model: &crate::config::ModelConfig,
) -> Runtime {
    settings.provider = provider.default_label().to_owned();
    settings.named_providers = Arc::new(provider.labels());
    // The key as the provider uses it (from its file too); a key that cannot be read failed the
    // provider already.
    let middleware = middleware
        .with_secrets(
            model
                .api_key()
                .ok()
                .flatten()
                .into_iter()
                .chain(provider_secrets(model)),
        )
        .expect("`ModelConfig::api_key` refuses a key too short to mask");
    let directory = Arc::new(dispatcher.catalog().clone());
    let store = dispatcher.store().clone();
    let model_config = model;
    let images = images::ImageLayer::new(dispatcher.payloads().clone(), model.image_limits());
    let tools = BoxCloneSyncService::new(dispatcher.map_err(Into::into));
    // Stored images are read last, just before the provider: no call holds their bytes while it
    // waits for a traffic slot or a budget.
    let provider = images.layer(ProviderService::new(provider));
    // Checked by the process's configuration already, like the budget settings below.
    let limits = TrafficPolicy::from_config(model).unwrap_or_else(|error| {
        tracing::error!(%error, "model limits file unreadable; only the default limits apply");
        TrafficPolicy {
            defaults: TrafficLimits::from_config(model),
            ..TrafficPolicy::default()
        }
    });
    // Checked by the process's configuration already; read again here, and should the files have
    // changed since, said loudly.
    let budgets = BudgetSettings::from_config(model).unwrap_or_else(|error| {
        tracing::error!(%error, "budget settings unreadable; model prices and tenant budgets are off");
        BudgetSettings::default()
    });
    let budgets = ModelBudgetLayer::new(store.clone(), budgets, metrics.clone());
    let model = match ModelTrafficLayer::new(store, limits) {
        Some(traffic) => BoxCloneSyncService::new(budgets.layer(traffic.layer(provider))),
        None => BoxCloneSyncService::new(budgets.layer(provider)),
    };
    let settings = RuntimeSettings {
        images: model_config.image_limits(),
        ..settings
    };
    Runtime::new(model, tools, directory, skills, middleware, settings).with_metrics(metrics)
}
