//! The worker process: connect, bind the pool's tool and subagent consumers on every work
//! partition (`intakes`), announce, serve them, drain. A worker that runs every subagent type
//! binds the pool's one agent consumer; one that lists types binds one per type, each with its
//! own slots. Consumers are bound before the worker announces itself, so a worker configured
//! unlike its pool (a consumer of every type beside per-type ones, which a work-queue stream
//! refuses) stops before it is routed to; from its heartbeat loop it also serves the partitions
//! made since (every `skein_common::bus::PARTITIONS_LOOK_EVERY`).
//!
//! Shutdown: the root token stops intake (no new pulls) and removes the worker from the registry;
//! running tasks get the grace period to finish, then the abort token stops them — their scopes
//! still close and their messages are handed back to the broker for another worker.

use std::sync::Arc;
use std::time::Duration;

use skein_common::admin::{self, Readiness};
use skein_common::agent::context::ContextLimits;
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::{ModelError, Providers};
use skein_common::agent::runtime::RuntimeSettings;
use skein_common::agent::skills::SkillCatalog;
use skein_common::bus::{Bus, BusError};
use skein_common::dispatch::Dispatcher;
use skein_common::metrics::Metrics;
use skein_common::protocol::{now_ms, WorkerAnnouncement, PROTOCOL_VERSION};
use skein_common::shutdown::Workload;
use skein_common::store::StoreError;
use skein_common::workspace::ObjectWorkspaces;
use skein_common::VERSION;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::execute::WorkerContext;
use crate::intakes::Served;
use crate::lending::LendSlotsLayer;
use crate::scope::ScopeStats;
use crate::tools::{builtin_registry, BuiltinConfig, ToolRegistry};

/// How often the depth of the pool's consumers is reported as metrics.
const QUEUE_DEPTH_EVERY: Duration = Duration::from_secs(5);

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The pool's subagent consumers are not the ones this worker's setting needs.
    #[error(
        "the workers of pool {pool} must run subagents alike: SKEIN_SUBAGENTS=true on every one, \
         or lists of agent types on every one: {source}"
    )]
    PoolMismatch {
        pool: String,
        #[source]
        source: BusError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("model provider: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Admin(#[from] skein_common::admin::AdminError),
    #[error(transparent)]
    Mcp(#[from] crate::mcp::McpError),
}

/// Marks the process not dumpable: its /proc files (environment, memory) become unreadable to
/// other processes of the same user, and they cannot attach to it. Root still can.
fn hide_from_same_user_processes() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(error = %e, "could not hide the worker's /proc files from its commands");
    }
}

/// In object mode with more than one replica, raises the tenants' existing workspace buckets
/// that have fewer (in the background: start-up does not wait for it; refusals are logged).
fn raise_bucket_replicas(cfg: &Config, bus: &Bus, work: &Workload) {
    let replicas = cfg.workspace.store.bucket_replicas(bus.stream_replicas());
    if cfg.workspace.mode != crate::workspace::WorkspaceMode::Object || replicas < 2 {
        return;
    }
    let bus = bus.clone();
    work.background.spawn(async move {
        match ObjectWorkspaces::raise_bucket_replicas(&bus, replicas).await {
            Ok(0) => {}
            Ok(raised) => {
                tracing::info!(raised, replicas, "raised the replicas of workspace buckets")
            }
            Err(e) => tracing::error!(error = %e, "workspace buckets' replicas not checked"),
        }
    });
}

/// Runs a worker until `shutdown` is cancelled, then drains.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), WorkerError> {
    run_with_stats(cfg, shutdown, Arc::default()).await
}

/// [`run`], counting task scopes into `stats` (for operators and tests).
pub async fn run_with_stats(
    cfg: Config,
    shutdown: CancellationToken,
    stats: Arc<ScopeStats>,
) -> Result<(), WorkerError> {
    run_with_tools(cfg, shutdown, stats, |_| {}).await
}

/// [`run_with_stats`], with more tools than the built-in ones: `extra` adds them to the registry
/// (embedders with their own tools, and tests). `SKEIN_TOOLS` selects among the built-in tools
/// only; every tool `extra` adds is provided.
pub async fn run_with_tools(
    cfg: Config,
    shutdown: CancellationToken,
    stats: Arc<ScopeStats>,
    extra: impl FnOnce(&mut ToolRegistry),
) -> Result<(), WorkerError> {
    run_custom(cfg, shutdown, stats, extra, Middleware::new()).await
}

/// [`run_with_tools`], with the embedder's middleware around the model and tool calls of the
/// subagent loops this worker runs (its layers outside the built-ins).
pub async fn run_custom(
    cfg: Config,
    shutdown: CancellationToken,
    stats: Arc<ScopeStats>,
    extra: impl FnOnce(&mut ToolRegistry),
    middleware: Middleware,
) -> Result<(), WorkerError> {
    cfg.validate().map_err(WorkerError::Config)?;
    if cfg.tools().any(|t| t == "shell") || cfg.mcp.mcp_config.is_some() {
        // Commands and MCP servers run as this process's user: without this, one of them could
        // read the worker's environment (its credentials) from /proc/<worker>/environ.
        hide_from_same_user_processes();
    }
    let instance = cfg.process.instance_id("worker");
    // The admin server and the reply listener are background work: they outlive running tasks.
    // Health answers (and readiness says no) while start-up waits for NATS and Redis.
    let work = Workload::default();
    let metrics = Metrics::new();
    let readiness = Readiness::default();
    admin::serve_configured(&cfg.admin, metrics.clone(), readiness.clone(), &work).await?;
    skein_common::telemetry::export_metrics(
        &metrics,
        &work.background,
        work.background_stop.clone(),
    );
    // Boxed: the wait's nested retry futures would otherwise sit inline in this function's
    // future, deepening every caller's type past the compiler's layout limit.
    let connected = Box::pin(skein_common::startup::connect::<WorkerError>(
        &cfg.nats,
        &cfg.redis,
        &format!("skein-worker {instance}"),
        cfg.process.max_payload,
        cfg.process.startup_timeout,
        &shutdown,
    ))
    .await;
    let (bus, store) = match connected {
        Ok(Some(connected)) => connected,
        // Stopped (`None`) or failed while waiting: nothing else has started.
        ended => {
            work.drain(cfg.process.grace).await;
            return ended.map(|_| ());
        }
    };

    let http_policy =
        crate::tools::http::AddressPolicy::new(&cfg.http_allow, cfg.http_allow_private);
    let http = crate::tools::http::client(Duration::from_secs(5), http_policy)
        .map_err(|e| WorkerError::Config(format!("HTTP client: {e}")))?;
    // Session files for the file tools and for commands: the object store or a volume.
    let (workspace_files, workspace_commands) =
        crate::workspace::open(&cfg.workspace, &cfg.workspace_root(), &bus);
    raise_bucket_replicas(&cfg, &bus, &work);
    let builtins = BuiltinConfig {
        workspace: workspace_files.clone(),
        http_allow: cfg.http_allow.clone(),
        http_allow_private: cfg.http_allow_private,
        http_max_bytes: cfg.http_max_bytes,
        http_timeout: Duration::from_secs(15).min(cfg.process.tool_timeout),
        max_read_bytes: 60 * 1024,
        // Probes the sandbox once, and only when `shell` is listed.
        shell: crate::tools::shell::ShellSetup::configured(&cfg, workspace_commands).await,
    };
    let mut registry = builtin_registry(&builtins, http);
    registry.retain(|name| cfg.tools().any(|t| t == name));
    extra(&mut registry);
    // Worker-scoped MCP servers start here, so their tools are in the first announcement.
    let mcp = crate::mcp::McpServers::start(&cfg.mcp, &mut registry).await?;
    if registry.is_empty() && !cfg.subagents.any() {
        // Checked once every tool is known: `SKEIN_TOOLS`, the embedder's and the MCP servers'.
        return Err(WorkerError::Config(
            "a worker must provide at least one tool or run subagents".into(),
        ));
    }

    // A subagent turn waiting for its own subagents lends its slot of its consumer to them
    // (`lending`), so nested calls never wait on slots their callers hold.
    let lending = LendSlotsLayer::new();
    let runtime = if cfg.subagents.any() {
        let dispatcher = Dispatcher::start(
            bus.clone(),
            store.clone(),
            &instance,
            &work.background,
            work.background_stop.clone(),
        )
        .await?;
        let provider = Providers::from_config(&cfg.model)?;
        let settings = RuntimeSettings {
            default_model: cfg.model.model.clone(),
            tool_timeout: cfg.process.tool_timeout,
            subagent_timeout: cfg.subagent_timeout,
            context: ContextLimits {
                default_context_tokens: cfg.model.context_tokens,
                ..ContextLimits::default()
            },
            ..RuntimeSettings::default()
        };
        Some(skein_common::wiring::assemble(
            provider,
            dispatcher,
            SkillCatalog::default(),
            middleware.tool_layer(lending.clone()),
            settings,
            metrics.clone(),
            &cfg.model,
        ))
    } else {
        None
    };

    let has_tools = !registry.specs().is_empty();
    let mut served = Served::new(&cfg, has_tools);
    let bound = match served.bind_every_partition(&bus).await {
        Ok(bound) => bound,
        Err(e) => {
            mcp.close().await;
            work.drain(cfg.process.grace).await;
            return Err(e);
        }
    };

    let announcement = WorkerAnnouncement {
        v: PROTOCOL_VERSION,
        worker_id: instance.clone(),
        pool: cfg.pool.clone(),
        version: VERSION.into(),
        tools: registry.specs(),
        runs_subagents: cfg.subagents.any(),
        agent_types: cfg.subagents.listed(),
        capacity: cfg.concurrency as u32,
        heartbeat_ms: now_ms(),
        heartbeat_every_ms: cfg.heartbeat.as_millis() as u64,
    };
    store.announce_worker(&announcement).await?;

    let cancels = skein_common::cancel::CancelRegistry::default();
    cancels
        .listen(&bus, &work.background, work.background_stop.clone(), None)
        .await?;
    let ctx = Arc::new(WorkerContext {
        metrics: metrics.clone(),
        bus: bus.clone(),
        store: store.clone(),
        registry,
        workspace: workspace_files,
        payloads: skein_common::payloads::PayloadStore::new(&bus),
        runtime,
        stats,
        instance: instance.clone(),
        scratch_dir: cfg.scratch_dir(),
        max_tool_timeout: cfg.process.tool_timeout,
        max_subagent_timeout: cfg.subagent_timeout,
        max_depth: RuntimeSettings::default().max_depth,
        progress_every: cfg.process.progress_every(),
        max_attempts: cfg.process.max_attempts,
        cancels: cancels.clone(),
        lending,
    });
    tracing::info!(worker_id = %instance, pool = %cfg.pool, "worker ready");

    let watched = served.consumers();
    for bound in bound {
        served.serve(bound, &ctx, &shutdown, &work);
    }

    bus.watch_queue_depth(
        metrics.clone(),
        watched,
        QUEUE_DEPTH_EVERY,
        &work.background,
        work.background_stop.clone(),
    );
    readiness.set_ready(true);

    // Heartbeats (and the open-scope gauge) until shutdown.
    let mut beats = tokio::time::interval(cfg.heartbeat);
    let mut announcement = announcement;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = beats.tick() => {
                served.serve_new_partitions(&bus, &ctx, &shutdown, &work).await;
                announcement.heartbeat_ms = now_ms();
                let counts = ctx.stats.snapshot();
                metrics.open_resources("scopes", counts.open_scopes() as i64);
                metrics.open_resources("task_resources", counts.open_resources() as i64);
                if let Err(e) = store.announce_worker(&announcement).await {
                    tracing::warn!(error = %e, "heartbeat not recorded");
                }
            }
        }
    }

    // Drain: stop taking work, leave the registry, let running tasks finish, then abort.
    readiness.set_ready(false);
    served.finished().await;
    if let Err(e) = store.remove_worker(&instance).await {
        tracing::warn!(error = %e, "could not leave the worker registry; the entry will expire");
    }
    work.drain(cfg.process.grace).await;
    mcp.close().await;
    tracing::info!(worker_id = %instance, "worker stopped");
    Ok(())
}
