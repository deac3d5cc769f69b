//! `skein gateway`: Skein over HTTP for clients that speak LangGraph's Agent Protocol, the OpenAI
//! API or A2A. Stateless: a request becomes NATS and Redis operations (a session seeded in Redis,
//! a task submitted on `skein.submit.>`, its events read from `SKEIN_EVENTS`), so any number of
//! gateways can serve behind a load balancer and any one can answer any request.
//!
//! Served: the Agent Protocol (assistants, threads, runs; [`agent_protocol`]), `GET /v1/models`
//! (the agents), `POST /v1/chat/completions` (streamed as SSE or not), the Responses API (`POST
//! /v1/responses`, `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`; [`responses`]),
//! A2A 1.0 and 0.3 (the agent card, `POST /a2a`; [`a2a`]), the web console (`/console`;
//! [`console`]), `GET /openapi.json` ([`openapi`]), `GET /healthz`, over the server of [`serve`]. Every keyed request is rate-limited per key
//! ([`request`]) and answered to the origins CORS allows ([`cors`]). Every request but the
//! health check, the card, the document and the console's page carries a key (`Authorization: Bearer` or
//! `x-api-key`, [`keys`]) whose tenant it acts for; errors come in each protocol's shape with the
//! matching status.

mod a2a;
mod agent_protocol;
mod approvals;
mod console;
mod cors;
mod follow;
pub mod keys;
mod openai;
mod openapi;
mod request;
mod responses;
mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use skein_common::agent::definition::AgentCatalog;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::store::SessionStore;
use skein_common::workspace::{ObjectWorkspaces, SessionRef, WorkspaceStoreConfig};
use tokio_util::sync::CancellationToken;

/// Where the gateway listens.
pub const ENV_GATEWAY_ADDR: &str = "SKEIN_GATEWAY_ADDR";
/// The keys file (TOML; see [`keys`]).
pub const ENV_GATEWAY_KEYS: &str = "SKEIN_GATEWAY_KEYS";
/// Requests a key may make a minute, across every gateway (0: no limit).
pub const ENV_GATEWAY_REQUESTS_PER_MINUTE: &str = "SKEIN_GATEWAY_REQUESTS_PER_MINUTE";
/// How long a connection may take to send a request's headers (and an idle keep-alive
/// connection is kept).
pub const ENV_GATEWAY_HEADER_TIMEOUT: &str = "SKEIN_GATEWAY_HEADER_TIMEOUT";
/// Jaeger's UI (`https://jaeger.example.com`): the console links each run to its trace there.
pub const ENV_GATEWAY_JAEGER_URL: &str = "SKEIN_JAEGER_URL";
/// Origins browsers may call the gateway from (comma-separated).
pub const ENV_GATEWAY_CORS_ORIGINS: &str = "SKEIN_GATEWAY_CORS_ORIGINS";

#[derive(Debug, Clone, Args)]
pub struct GatewayConfig {
    #[command(flatten)]
    pub nats: NatsConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[command(flatten)]
    pub telemetry: skein_common::telemetry::TelemetryConfig,
    /// The workspaces a copied thread's files are copied in.
    #[command(flatten)]
    pub workspace: WorkspaceStoreConfig,
    /// Address to listen on.
    #[arg(long = "gateway-addr", env = ENV_GATEWAY_ADDR, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// The keys file: SHA-256 of each key with its tenant, principal and roles.
    #[arg(long = "gateway-keys", env = ENV_GATEWAY_KEYS)]
    pub keys: PathBuf,
    /// The agents folder the leads run (its agents are the models); the bundled example when
    /// unset.
    #[arg(long, env = skein_common::config::ENV_AGENTS_DIR)]
    pub agents_dir: Option<PathBuf>,
    /// Largest request body.
    #[arg(long = "gateway-max-body", default_value_t = 4 * 1024 * 1024)]
    pub max_body: usize,
    /// Longest a request waits for its run to end (a run that goes on longer keeps running).
    #[arg(long = "gateway-run-timeout", default_value = "300s", value_parser = humantime::parse_duration)]
    pub run_timeout: Duration,
    /// Requests a key may make a minute, counted in Redis across every gateway (a key's own
    /// `requests_per_minute` in the keys file wins); 0: no limit.
    #[arg(long = "gateway-requests-per-minute", env = ENV_GATEWAY_REQUESTS_PER_MINUTE, default_value_t = 600)]
    pub requests_per_minute: u32,
    /// Longest a connection may take to send a request's headers, counted from when it is ready
    /// for a request: a new connection's first, or a keep-alive connection's next (so it is also
    /// how long an idle keep-alive connection is kept: above the 60 s idle timeout of most load
    /// balancers, so they close first).
    #[arg(long = "gateway-header-timeout", env = ENV_GATEWAY_HEADER_TIMEOUT, default_value = "75s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// Origins (`https://console.example.com`) browsers may call the gateway from; none: no
    /// cross-origin calls.
    #[arg(long = "gateway-cors-origins", env = ENV_GATEWAY_CORS_ORIGINS, value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Jaeger's UI, for the console's links from a run to its trace; none: no links.
    #[arg(long = "jaeger-url", env = ENV_GATEWAY_JAEGER_URL)]
    pub jaeger_url: Option<String>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    Keys(String),
    #[error("agents: {0}")]
    Agents(String),
    #[error("cannot reach NATS: {0}")]
    Nats(String),
    #[error("workspace settings: {0}")]
    Workspace(String),
    #[error("cannot reach Redis: {0}")]
    Redis(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Gateway {
    /// The client that publishes operations for `principal`: signed by the gateway's own key
    /// (`SKEIN_PRINCIPAL_KEY`, a principal with the `delegate` role) as acting for the caller its
    /// key proved, so the lead records the caller, never the gateway.
    pub(crate) fn client_for(&self, principal: &keys::Principal) -> SkeinClient {
        self.client.acting_for(&principal.name, &principal.roles)
    }

    /// Records an operation the gateway carried out for `principal` in the audit trail (the
    /// gateway proved the caller by its key: proof `delegated:<the gateway's principal>`).
    pub(crate) async fn audit(
        &self,
        principal: &keys::Principal,
        action: &str,
        task_id: &str,
        target: &str,
    ) {
        use skein_common::principals::{Acting, Principal, Proof};
        let bus = self.client.bus();
        let by = bus
            .own_principal()
            .map_or_else(|| "gateway".to_owned(), |p| p.name.clone());
        let acting = Acting {
            principal: Principal {
                name: principal.name.clone(),
                tenant: principal.tenant.clone(),
                roles: principal.roles.clone(),
            },
            proof: Proof::Delegated { by },
            nonce: None,
        };
        let record =
            skein_common::audit::AuditRecord::done(&acting, &principal.tenant, action, task_id)
                .with_target(target);
        bus.audit(&record, &uuid::Uuid::new_v4().simple().to_string())
            .await;
    }

    /// [`Gateway::client_for`] a caller known by name, acting with `roles`.
    pub(crate) fn client_for_name(&self, name: &str, roles: &[keys::Role]) -> SkeinClient {
        self.client.acting_for(name, roles)
    }
}

/// What every request handler shares.
pub(crate) struct Gateway {
    pub client: SkeinClient,
    pub store: SessionStore,
    pub keys: keys::Keys,
    pub agents: AgentCatalog,
    pub run_timeout: Duration,
    pub requests_per_minute: u32,
    pub workspaces: ObjectWorkspaces,
    /// Jaeger's UI, where a run's trace is shown.
    pub jaeger_url: Option<String>,
}

impl Gateway {
    /// Copies the workspace files of session `from` into session `to`, as they are now.
    pub(crate) async fn copy_files(
        &self,
        tenant: &str,
        from: &str,
        to: &str,
    ) -> Result<usize, String> {
        let from = SessionRef::new(tenant, from).map_err(|e| e.to_string())?;
        let to = SessionRef::new(tenant, to).map_err(|e| e.to_string())?;
        self.workspaces
            .copy_session(&from, &to)
            .await
            .map_err(|e| e.describe())
    }
}

impl Gateway {
    /// Removes the workspace files of a session whose state was removed; a failure is logged
    /// (with `SKEIN_SESSION_TTL` set, the leads' sweep removes them later).
    pub(crate) async fn remove_files(&self, tenant: &str, session: &str) {
        let removed = match SessionRef::new(tenant, session) {
            Ok(session) => self
                .workspaces
                .remove_session(&session)
                .await
                .map_err(|e| e.describe()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = removed {
            tracing::warn!(tenant, session, error = %e, "a removed session's files were not removed");
        }
    }
}

/// Connects, binds and serves until `shutdown`; `bound` hears the address once it listens.
pub async fn run(
    cfg: GatewayConfig,
    shutdown: CancellationToken,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), GatewayError> {
    let keys = keys::Keys::load(&cfg.keys).map_err(GatewayError::Keys)?;
    if keys.is_empty() {
        tracing::warn!(file = %cfg.keys.display(), "the keys file lists no key: every request is refused");
    }
    let agents = match &cfg.agents_dir {
        Some(dir) => AgentCatalog::load_dir(dir),
        None => AgentCatalog::bundled(),
    }
    .map_err(|e| GatewayError::Agents(e.to_string()))?;
    let client = SkeinClient::connect(&cfg.nats)
        .await
        .map_err(|e| GatewayError::Nats(e.to_string()))?;
    let store = SessionStore::connect(&cfg.redis)
        .await
        .map_err(|e| GatewayError::Redis(e.to_string()))?;
    cfg.workspace.validate().map_err(GatewayError::Workspace)?;
    // Files are copied once each: no content cache.
    let workspaces = ObjectWorkspaces::new(client.bus(), &cfg.workspace, 0);
    let gateway = Arc::new(Gateway {
        workspaces,
        client,
        store,
        keys,
        agents,
        run_timeout: cfg.run_timeout,
        requests_per_minute: cfg.requests_per_minute,
        jaeger_url: cfg.jaeger_url.clone().filter(|url| !url.trim().is_empty()),
    });
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: cfg.addr,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| GatewayError::Bind {
        addr: cfg.addr,
        source,
    })?;
    tracing::info!(addr = %local, "gateway listening");
    if let Some(bound) = bound {
        let _ = bound.send(local);
    }
    let app = router(gateway, cfg.max_body, cors::Cors::new(&cfg.cors_origins));
    serve::serve(listener, app, cfg.header_timeout, shutdown)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: local,
            source,
        })
}

fn router(gateway: Arc<Gateway>, max_body: usize, cors: cors::Cors) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/openapi.json",
            get(|| async { request::json_response(openapi::document()) }),
        )
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::read))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/.well-known/agent-card.json", get(a2a::card))
        .route("/.well-known/agent.json", get(a2a::card))
        .route("/a2a", post(a2a::rpc))
        .merge(agent_protocol::routes())
        .merge(console::routes())
        .fallback(openai::not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(cors),
            cors::cors,
        ))
        .with_state(gateway)
}
