//! Every environment variable Skein reads, as constants shared by clap's `env = ...` and the docs,
//! plus the connection settings common to all processes.

use std::time::Duration;

use clap::Args;

pub const ENV_NATS_URL: &str = "SKEIN_NATS_URL";
pub const ENV_NATS_USER: &str = "SKEIN_NATS_USER";
pub const ENV_NATS_PASSWORD: &str = "SKEIN_NATS_PASSWORD";
pub const ENV_NATS_TOKEN: &str = "SKEIN_NATS_TOKEN";
pub const ENV_NATS_CREDS: &str = "SKEIN_NATS_CREDS";
pub const ENV_NATS_TLS_CA: &str = "SKEIN_NATS_TLS_CA";
pub const ENV_NATS_TLS_CERT: &str = "SKEIN_NATS_TLS_CERT";
pub const ENV_NATS_TLS_KEY: &str = "SKEIN_NATS_TLS_KEY";
pub const ENV_NATS_INBOX_PREFIX: &str = "SKEIN_NATS_INBOX_PREFIX";
pub const ENV_STREAM_REPLICAS: &str = "SKEIN_STREAM_REPLICAS";
pub const ENV_PARTITIONS: &str = "SKEIN_PARTITIONS";
pub const ENV_PRINCIPALS: &str = "SKEIN_PRINCIPALS";
pub const ENV_REQUIRE_SIGNED: &str = "SKEIN_REQUIRE_SIGNED";
pub const ENV_SIGNATURE_WINDOW: &str = "SKEIN_SIGNATURE_WINDOW";
pub const ENV_PRINCIPAL_KEY: &str = "SKEIN_PRINCIPAL_KEY";
pub const ENV_AUDIT_RETENTION: &str = "SKEIN_AUDIT_RETENTION";
pub const ENV_REDIS_URL: &str = "SKEIN_REDIS_URL";
pub const ENV_REDIS_PASSWORD: &str = "SKEIN_REDIS_PASSWORD";
pub const ENV_REDIS_TLS_CA: &str = "SKEIN_REDIS_TLS_CA";
pub const ENV_REDIS_CLUSTER: &str = "SKEIN_REDIS_CLUSTER";
pub const ENV_REDIS_SENTINEL_PASSWORD: &str = "SKEIN_REDIS_SENTINEL_PASSWORD";
pub const ENV_SESSION_TTL: &str = "SKEIN_SESSION_TTL";
pub const ENV_SESSION_MAX_MESSAGES: &str = "SKEIN_SESSION_MAX_MESSAGES";
pub const ENV_SESSION_CHECKPOINTS: &str = "SKEIN_SESSION_CHECKPOINTS";
pub const ENV_CONTEXT_TOKENS: &str = "SKEIN_CONTEXT_TOKENS";
pub const ENV_MODEL_LIMITS: &str = "SKEIN_MODEL_LIMITS";
pub const ENV_PROVIDERS: &str = "SKEIN_PROVIDERS";
pub const ENV_MODEL_THINKING_BUDGET: &str = "SKEIN_MODEL_THINKING_BUDGET";
pub const ENV_LOG: &str = "SKEIN_LOG";
pub const ENV_LOG_FORMAT: &str = "SKEIN_LOG_FORMAT";
pub const ENV_MODEL_PROVIDER: &str = "SKEIN_MODEL_PROVIDER";
pub const ENV_MODEL_BASE_URL: &str = "SKEIN_MODEL_BASE_URL";
pub const ENV_MODEL_API_KEY: &str = "SKEIN_MODEL_API_KEY";
pub const ENV_MODEL: &str = "SKEIN_MODEL";
pub const ENV_MODEL_TIMEOUT: &str = "SKEIN_MODEL_TIMEOUT";
pub const ENV_MODEL_MAX_CONCURRENCY: &str = "SKEIN_MODEL_MAX_CONCURRENCY";
pub const ENV_MODEL_TOKENS_PER_MINUTE: &str = "SKEIN_MODEL_TOKENS_PER_MINUTE";
pub const ENV_MODEL_PRICES: &str = "SKEIN_MODEL_PRICES";
pub const ENV_MODEL_MAX_OUTPUT_TOKENS: &str = "SKEIN_MODEL_MAX_OUTPUT_TOKENS";
pub const ENV_MODEL_MAX_TOKENS_FIELD: &str = "SKEIN_MODEL_MAX_TOKENS_FIELD";
pub const ENV_MODEL_API_VERSION: &str = "SKEIN_MODEL_API_VERSION";
pub const ENV_MODEL_IMAGES: &str = "SKEIN_MODEL_IMAGES";
pub const ENV_MODEL_MAX_IMAGE_BYTES: &str = "SKEIN_MODEL_MAX_IMAGE_BYTES";
pub const ENV_MODEL_MAX_IMAGES: &str = "SKEIN_MODEL_MAX_IMAGES";
pub const ENV_TENANT_DAILY_TOKENS: &str = "SKEIN_TENANT_DAILY_TOKENS";
pub const ENV_TENANT_DAILY_COST_USD: &str = "SKEIN_TENANT_DAILY_COST_USD";
pub const ENV_TENANT_BUDGETS: &str = "SKEIN_TENANT_BUDGETS";
pub const ENV_SCENARIO: &str = "SKEIN_SCENARIO";
pub const ENV_AGENTS_DIR: &str = "SKEIN_AGENTS_DIR";
pub const ENV_INSTANCE_ID: &str = "SKEIN_INSTANCE_ID";
pub const ENV_CONCURRENCY: &str = "SKEIN_CONCURRENCY";
pub const ENV_MAX_PAYLOAD: &str = "SKEIN_MAX_PAYLOAD";
pub const ENV_TOOL_TIMEOUT: &str = "SKEIN_TOOL_TIMEOUT";
pub const ENV_GRACE: &str = "SKEIN_GRACE";
pub const ENV_STARTUP_TIMEOUT: &str = "SKEIN_STARTUP_TIMEOUT";
pub const ENV_ACK_WAIT: &str = "SKEIN_ACK_WAIT";
pub const ENV_MAX_ATTEMPTS: &str = "SKEIN_MAX_ATTEMPTS";
pub const ENV_LEASE_TTL: &str = "SKEIN_LEASE_TTL";
pub const ENV_SUBAGENT_TIMEOUT: &str = "SKEIN_SUBAGENT_TIMEOUT";
pub const ENV_POOL: &str = "SKEIN_POOL";
pub const ENV_TOOLS: &str = "SKEIN_TOOLS";
pub const ENV_SUBAGENTS: &str = "SKEIN_SUBAGENTS";
pub const ENV_WORKSPACE: &str = "SKEIN_WORKSPACE";
pub const ENV_WORKSPACE_ROOT: &str = "SKEIN_WORKSPACE_ROOT";
pub const ENV_WORKSPACE_MAX_FILE_BYTES: &str = "SKEIN_WORKSPACE_MAX_FILE_BYTES";
pub const ENV_WORKSPACE_MAX_SESSION_BYTES: &str = "SKEIN_WORKSPACE_MAX_SESSION_BYTES";
pub const ENV_WORKSPACE_REPLICAS: &str = "SKEIN_WORKSPACE_REPLICAS";
pub const ENV_WORKSPACE_BUCKET_BYTES: &str = "SKEIN_WORKSPACE_BUCKET_BYTES";
pub const ENV_WORKSPACE_VERSIONS: &str = "SKEIN_WORKSPACE_VERSIONS";
pub const ENV_WORKSPACE_CACHE_BYTES: &str = "SKEIN_WORKSPACE_CACHE_BYTES";
pub const ENV_SCRATCH_DIR: &str = "SKEIN_SCRATCH_DIR";
pub const ENV_HTTP_ALLOW: &str = "SKEIN_HTTP_ALLOW";
pub const ENV_HTTP_ALLOW_PRIVATE: &str = "SKEIN_HTTP_ALLOW_PRIVATE";
pub const ENV_HTTP_MAX_BYTES: &str = "SKEIN_HTTP_MAX_BYTES";
pub const ENV_HEARTBEAT: &str = "SKEIN_HEARTBEAT";
pub const ENV_TENANT: &str = "SKEIN_TENANT";
pub const ENV_USER: &str = "SKEIN_USER";
pub const ENV_TRACE_CONTENT: &str = "SKEIN_TRACE_CONTENT";
pub const ENV_K8S_POD: &str = "SKEIN_K8S_POD";
pub const ENV_K8S_NAMESPACE: &str = "SKEIN_K8S_NAMESPACE";
pub const ENV_ADMIN_ADDR: &str = "SKEIN_ADMIN_ADDR";
pub const ENV_ADMIN_TOKEN: &str = "SKEIN_ADMIN_TOKEN";
pub const ENV_JAEGER_UI: &str = "SKEIN_JAEGER_UI";

/// How to reach NATS. Credentials are never logged: `Debug` redacts them.
#[derive(Clone, Args)]
pub struct NatsConfig {
    /// NATS server URL(s), comma separated.
    #[arg(id = "nats_url", long = "nats-url", env = ENV_NATS_URL, default_value = "nats://127.0.0.1:4222")]
    pub url: String,
    /// NATS user (with --nats-password).
    #[arg(id = "nats_user", long = "nats-user", env = ENV_NATS_USER)]
    pub user: Option<String>,
    #[arg(id = "nats_password", long = "nats-password", env = ENV_NATS_PASSWORD, hide_env_values = true)]
    pub password: Option<String>,
    #[arg(id = "nats_token", long = "nats-token", env = ENV_NATS_TOKEN, hide_env_values = true)]
    pub token: Option<String>,
    /// Path of a NATS .creds file.
    #[arg(id = "nats_creds", long = "nats-creds", env = ENV_NATS_CREDS)]
    pub creds: Option<std::path::PathBuf>,
    /// CA certificate (PEM) to trust for the server's TLS certificate; TLS is then required.
    #[arg(id = "nats_tls_ca", long = "nats-tls-ca", env = ENV_NATS_TLS_CA)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --nats-tls-key.
    #[arg(id = "nats_tls_cert", long = "nats-tls-cert", env = ENV_NATS_TLS_CERT, requires = "nats_tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for mutual TLS, with --nats-tls-cert.
    #[arg(id = "nats_tls_key", long = "nats-tls-key", env = ENV_NATS_TLS_KEY, requires = "nats_tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Prefix of this connection's reply subjects (default `_INBOX`); a tenant's user whose
    /// server permissions allow it only its own inbox (`_INBOX_<tenant>.>`) sets it to match.
    #[arg(id = "nats_inbox_prefix", long = "nats-inbox-prefix", env = ENV_NATS_INBOX_PREFIX)]
    pub inbox_prefix: Option<String>,
    /// How long one connection attempt waits for a server to answer (a lead or worker makes
    /// attempts for up to `SKEIN_STARTUP_TIMEOUT`).
    #[arg(id = "nats_connect_timeout", long = "nats-connect-timeout", default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Replicas of every stream Skein creates (1 to 5, at most the NATS cluster's size); an
    /// existing stream with fewer is raised to it.
    #[arg(id = "stream_replicas", long = "stream-replicas", env = ENV_STREAM_REPLICAS, default_value_t = 1)]
    pub stream_replicas: usize,
    /// Partitions: submissions go to one of this many streams (`SKEIN_SUBMIT`, `SKEIN_SUBMIT_1`,
    /// …) and tool and subagent tasks to one of as many (`SKEIN_WORK`, `SKEIN_WORK_1`, …) by a
    /// hash of their session, so the streams' leaders can spread over a NATS cluster. Leads and
    /// workers serve every partition stream that exists, whatever this says.
    #[arg(id = "partitions", long = "partitions", env = ENV_PARTITIONS, default_value_t = 1)]
    pub partitions: u32,
    /// The principals file (TOML): who may act on tasks, with their tenants, roles and public
    /// nkeys (see `principals`). Read by leads and workers to check signed operations.
    #[arg(id = "principals", long = "principals", env = ENV_PRINCIPALS)]
    pub principals: Option<std::path::PathBuf>,
    /// Refuse operations (submit, cancel, pause, resume, steer, approve, deny) that carry no
    /// signature by a listed principal.
    #[arg(id = "require_signed", long = "require-signed", env = ENV_REQUIRE_SIGNED, default_value_t = false, action = clap::ArgAction::Set)]
    pub require_signed: bool,
    /// How far a signature's time may lie from when the broker stored its message.
    #[arg(id = "signature_window", long = "signature-window", env = ENV_SIGNATURE_WINDOW, default_value = "5m", value_parser = humantime::parse_duration)]
    pub signature_window: Duration,
    /// This process's principal key (a user nkey seed, `SU…`; also `SKEIN_PRINCIPAL_KEY_FILE`):
    /// it signs the operations this process publishes.
    #[arg(id = "principal_key", long = "principal-key", env = ENV_PRINCIPAL_KEY, hide_env_values = true)]
    pub principal_key: Option<String>,
    /// How long the audit stream (`SKEIN_AUDIT`) keeps its records.
    #[arg(id = "audit_retention", long = "audit-retention", env = ENV_AUDIT_RETENTION, default_value = "90days", value_parser = humantime::parse_duration)]
    pub audit_retention: Duration,
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &self.url)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("creds", &self.creds)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("stream_replicas", &self.stream_replicas)
            .field("partitions", &self.partitions)
            .field("principals", &self.principals)
            .field("require_signed", &self.require_signed)
            .field(
                "principal_key",
                &self.principal_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl NatsConfig {
    pub fn local(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            user: None,
            password: None,
            token: None,
            creds: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            inbox_prefix: None,
            connect_timeout: Duration::from_secs(5),
            stream_replicas: 1,
            partitions: 1,
            principals: None,
            require_signed: false,
            signature_window: crate::principals::DEFAULT_SIGNATURE_WINDOW,
            principal_key: None,
            audit_retention: DEFAULT_AUDIT_RETENTION,
        }
    }

    /// What this process checks operations against: the principals file, read, and whether a
    /// signature is required (which needs the file).
    pub fn gate(&self) -> Result<crate::principals::Gate, String> {
        use crate::principals::{Gate, PrincipalBook};
        let book = match &self.principals {
            Some(path) => PrincipalBook::load(path)?,
            None if self.require_signed => {
                return Err(format!(
                    "{ENV_REQUIRE_SIGNED} is on but no principals file is given ({ENV_PRINCIPALS})"
                ))
            }
            None => PrincipalBook::default(),
        };
        if self.signature_window.is_zero() {
            return Err(format!("{ENV_SIGNATURE_WINDOW} must be positive"));
        }
        Ok(Gate::new(book, self.require_signed, self.signature_window))
    }

    /// The key this process signs its operations with, if it has one.
    pub fn signer(&self) -> Result<Option<crate::principals::Signer>, String> {
        secret(self.principal_key.as_deref(), ENV_PRINCIPAL_KEY)?
            .map(|seed| {
                crate::principals::Signer::from_seed(&seed)
                    .map_err(|e| format!("{ENV_PRINCIPAL_KEY}: {e}"))
            })
            .transpose()
    }

    /// Checks values clap cannot: every server address of the list, the replicas, the
    /// partitions, and that TLS can use the client certificate.
    pub fn validate(&self) -> Result<(), String> {
        crate::bus::server_addrs(&self.url).map_err(|e| e.to_string())?;
        if let Some(cert) = &self.tls_cert {
            crate::bus::check_client_certificate(cert)?;
        }
        if !(1..=MAX_REPLICAS).contains(&self.stream_replicas) {
            return Err(format!(
                "stream replicas must be 1 to {MAX_REPLICAS}, got {}",
                self.stream_replicas
            ));
        }
        if !(1..=crate::subjects::MAX_PARTITIONS).contains(&self.partitions) {
            return Err(format!(
                "{ENV_PARTITIONS} must be 1 to {}, got {}",
                crate::subjects::MAX_PARTITIONS,
                self.partitions
            ));
        }
        Ok(())
    }

    /// The password: `--nats-password`, or the file `SKEIN_NATS_PASSWORD_FILE` names.
    pub fn password(&self) -> Result<Option<String>, String> {
        secret(self.password.as_deref(), ENV_NATS_PASSWORD)
    }

    /// The token: `--nats-token`, or the file `SKEIN_NATS_TOKEN_FILE` names.
    pub fn token(&self) -> Result<Option<String>, String> {
        secret(self.token.as_deref(), ENV_NATS_TOKEN)
    }
}

/// How long the audit stream keeps its records, by default.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// Most replicas a JetStream stream may have.
pub const MAX_REPLICAS: usize = 5;

/// A secret from its setting, or else from the file named by `{env}_FILE` (as container
/// platforms mount secrets), without its trailing newline. An unreadable file is an error that
/// names the file, never the secret.
pub fn secret(value: Option<&str>, env: &str) -> Result<Option<String>, String> {
    let file_env = format!("{env}_FILE");
    secret_from(value, &file_env, std::env::var_os(&file_env))
}

/// [`secret`], given what `{env}_FILE` holds.
fn secret_from(
    value: Option<&str>,
    file_env: &str,
    file: Option<std::ffi::OsString>,
) -> Result<Option<String>, String> {
    if let Some(value) = value {
        return Ok(Some(value.to_owned()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{file_env}: cannot read {}: {e}", path.to_string_lossy()))?;
    Ok(Some(text.trim_end_matches(['\r', '\n']).to_owned()))
}

/// How to reach Redis. The URL may carry a password (`redis://:pw@host/`); `Debug` redacts it.
#[derive(Clone, Args)]
pub struct RedisConfig {
    /// `redis://` or, over TLS, `rediss://`; may name an ACL user (`rediss://user:pw@host/`).
    /// `redis+sentinel://[user:pw@]host:port[,host:port]/master-name[/db]` follows the primary
    /// that Sentinel names; `redis+cluster://[user:pw@]host:port[,host:port]` speaks to a Redis
    /// Cluster (`rediss+...` over TLS). See `store::connection`.
    #[arg(id = "redis_url", long = "redis-url", env = ENV_REDIS_URL, default_value = "redis://127.0.0.1:6379/", hide_env_values = true)]
    pub url: String,
    /// The URL's hosts are seed nodes of a Redis Cluster (as with `redis+cluster://`).
    #[arg(id = "redis_cluster", long = "redis-cluster", env = ENV_REDIS_CLUSTER, default_value_t = false, action = clap::ArgAction::Set)]
    pub cluster: bool,
    /// Password of the Sentinels (`redis+sentinel://`), when they ask for one (also from
    /// `SKEIN_REDIS_SENTINEL_PASSWORD_FILE`); the URL's credentials are the data nodes'.
    #[arg(id = "redis_sentinel_password", long = "redis-sentinel-password", env = ENV_REDIS_SENTINEL_PASSWORD, hide_env_values = true)]
    pub sentinel_password: Option<String>,
    /// Password, when the URL carries none (also from `SKEIN_REDIS_PASSWORD_FILE`).
    #[arg(id = "redis_password", long = "redis-password", env = ENV_REDIS_PASSWORD, hide_env_values = true)]
    pub password: Option<String>,
    /// CA certificate (PEM) to trust for a `rediss://` server instead of the system's.
    #[arg(id = "redis_tls_ca", long = "redis-tls-ca", env = ENV_REDIS_TLS_CA)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// How long an idle session (its history and state) is kept after its last turn; unset: for
    /// ever.
    #[arg(id = "session_ttl", long = "session-ttl", env = ENV_SESSION_TTL, value_parser = humantime::parse_duration)]
    pub session_ttl: Option<Duration>,
    /// Most messages a session's stored history keeps: past it, the oldest messages a summary
    /// already stands for are dropped (the context never needs them again); 0 keeps every one.
    #[arg(id = "session_max_messages", long = "session-max-messages", env = ENV_SESSION_MAX_MESSAGES, default_value_t = 10_000)]
    pub session_max_messages: u64,
    /// Most ended turns whose records (the points to fork or replay from) a session keeps; 0
    /// keeps none.
    #[arg(id = "session_checkpoints", long = "session-checkpoints", env = ENV_SESSION_CHECKPOINTS, default_value_t = 50)]
    pub session_checkpoints: u64,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("cluster", &self.cluster)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<redacted>"),
            )
            .field("tls_ca", &self.tls_ca)
            .field("session_ttl", &self.session_ttl)
            .field("session_max_messages", &self.session_max_messages)
            .field("session_checkpoints", &self.session_checkpoints)
            .finish()
    }
}

impl RedisConfig {
    pub fn local(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            password: None,
            cluster: false,
            sentinel_password: None,
            tls_ca: None,
            session_ttl: None,
            session_max_messages: 10_000,
            session_checkpoints: 50,
        }
    }

    /// The password: `--redis-password`, or the file `SKEIN_REDIS_PASSWORD_FILE` names.
    pub fn password(&self) -> Result<Option<String>, String> {
        secret(self.password.as_deref(), ENV_REDIS_PASSWORD)
    }

    /// Checks what clap cannot: the URL fits one of the forms `store::topology` reads.
    pub fn validate(&self) -> Result<(), String> {
        crate::store::topology::Topology::parse(&self.url, self.cluster).map(|_| ())
    }

    /// The Sentinels' password: `--redis-sentinel-password`, or the file
    /// `SKEIN_REDIS_SENTINEL_PASSWORD_FILE` names.
    pub fn sentinel_password(&self) -> Result<Option<String>, String> {
        secret(
            self.sentinel_password.as_deref(),
            ENV_REDIS_SENTINEL_PASSWORD,
        )
    }
}

/// The URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}<redacted>{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Which model answers, and how to reach it. The API key is never logged.
#[derive(Clone, Args)]
pub struct ModelConfig {
    /// `scripted` (replays a scenario file, offline), `openai` (any OpenAI-compatible server),
    /// `azure` (Azure OpenAI) or `anthropic` (Anthropic's Messages API).
    #[arg(id = "model_provider", long = "model-provider", env = ENV_MODEL_PROVIDER, default_value = "scripted")]
    pub provider: String,
    /// Base URL of the OpenAI-compatible API, up to and including `/v1`; for `azure`, the
    /// resource's endpoint (`https://<resource>.openai.azure.com`).
    #[arg(id = "model_base_url", long = "model-base-url", env = ENV_MODEL_BASE_URL, default_value = "https://api.openai.com/v1")]
    pub base_url: String,
    /// Azure OpenAI's `api-version` (read by the `azure` provider only).
    #[arg(id = "model_api_version", long = "model-api-version", env = ENV_MODEL_API_VERSION, default_value = crate::agent::model::openai::DEFAULT_AZURE_API_VERSION)]
    pub api_version: String,
    /// The request field that carries a call's answer bound: `max_tokens`,
    /// `max_completion_tokens`, or `auto` (`max_completion_tokens` for OpenAI's own API and Azure
    /// OpenAI, `max_tokens` for any other server).
    #[arg(id = "model_max_tokens_field", long = "model-max-tokens-field", env = ENV_MODEL_MAX_TOKENS_FIELD, default_value = "auto", value_parser = ["auto", "max_tokens", "max_completion_tokens"])]
    pub max_tokens_field: String,
    #[arg(id = "model_api_key", long = "model-api-key", env = ENV_MODEL_API_KEY, hide_env_values = true)]
    pub api_key: Option<String>,
    /// Default model name, used where an agent definition names none.
    #[arg(id = "model_name", long = "model", env = ENV_MODEL, default_value = "gpt-4o-mini")]
    pub model: String,
    /// Longest a model call may take.
    #[arg(id = "model_timeout", long = "model-timeout", env = ENV_MODEL_TIMEOUT, default_value = "120s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Scenario file for the scripted provider; the bundled example when unset.
    #[arg(id = "model_scenario", long = "scenario", env = ENV_SCENARIO)]
    pub scenario: Option<std::path::PathBuf>,
    /// Most calls in flight on each model at once, across every lead and worker sharing the
    /// Redis, shared fairly between tenants; 0 for no limit.
    #[arg(id = "model_max_concurrency", long = "model-max-concurrency", env = ENV_MODEL_MAX_CONCURRENCY, default_value_t = 0)]
    pub max_concurrency: u32,
    /// Most tokens (prompt and completion) each model may use per minute, across every lead and
    /// worker sharing the Redis; 0 for no budget.
    #[arg(id = "model_tokens_per_minute", long = "model-tokens-per-minute", env = ENV_MODEL_TOKENS_PER_MINUTE, default_value_t = 0)]
    pub tokens_per_minute: u64,
    /// Prices of the models, for cost budgets and the spending metric: JSON
    /// `{"model": {"input_per_million": 2.5, "output_per_million": 10}}` (US dollars per million
    /// tokens; optional `cache_read_per_million` and `cache_write_per_million` price prompt-cache
    /// reads and writes; a `"*"` entry prices every other model), inline or as a file path.
    #[arg(id = "model_prices", long = "model-prices", env = ENV_MODEL_PRICES)]
    pub prices: Option<String>,
    /// The most answer tokens a model call under a budget may take: sent to the server as the
    /// call's bound (less when the budget has less room left) and, with its prompt's bound, the
    /// worst case it reserves on its budgets before it starts.
    #[arg(id = "model_max_output_tokens", long = "model-max-output-tokens", env = ENV_MODEL_MAX_OUTPUT_TOKENS, default_value_t = 4096)]
    pub max_output_tokens: u64,
    /// Most model tokens each tenant may use per UTC day, across every lead and worker sharing
    /// the Redis; 0 for no limit.
    #[arg(id = "tenant_daily_tokens", long = "tenant-daily-tokens", env = ENV_TENANT_DAILY_TOKENS, default_value_t = 0)]
    pub tenant_daily_tokens: u64,
    /// Most each tenant's model calls may cost per UTC day, in US dollars (at the model prices);
    /// 0 for no limit.
    #[arg(id = "tenant_daily_cost_usd", long = "tenant-daily-cost-usd", env = ENV_TENANT_DAILY_COST_USD, default_value_t = 0.0)]
    pub tenant_daily_cost_usd: f64,
    /// Daily budgets of particular tenants, over the two defaults above: JSON
    /// `{"tenant": {"daily_tokens": 1000000, "daily_cost_usd": 20}}` (an absent limit is the
    /// default, 0 turns it off), inline or as a file path.
    #[arg(id = "tenant_budgets", long = "tenant-budgets", env = ENV_TENANT_BUDGETS)]
    pub tenant_budgets: Option<String>,
    /// Context size (tokens) of models no agent sets `context_tokens` for and the tokenizer does
    /// not know (OpenAI models' sizes are known); the history is compacted to fit it.
    #[arg(id = "model_context_tokens", long = "context-tokens", env = ENV_CONTEXT_TOKENS, default_value_t = crate::agent::tokens::DEFAULT_CONTEXT_TOKENS, value_parser = clap::value_parser!(u64).range(1024..))]
    pub context_tokens: u64,
    /// TOML file of traffic limits per model (`[models."name"]`) and per tenant
    /// (`[tenants.name]`), each with `max_concurrency` and `tokens_per_minute`.
    #[arg(id = "model_limits", long = "model-limits", env = ENV_MODEL_LIMITS)]
    pub limits_file: Option<std::path::PathBuf>,
    /// TOML or JSON file of named providers (`[providers.NAME]` with `kind`, `base_url`, the
    /// key's `api_key_env` or `api_key_file`, `headers`, `limits`, ...); an agent's model
    /// `NAME:MODEL` is `MODEL` on provider `NAME`. See `agent::model::providers`.
    #[arg(id = "model_providers", long = "providers", env = ENV_PROVIDERS)]
    pub providers_file: Option<std::path::PathBuf>,
    /// Tokens an `anthropic` provider's model may think with before it answers (extended
    /// thinking: at least 1024, under `SKEIN_MODEL_MAX_OUTPUT_TOKENS`); 0 asks for no thinking.
    #[arg(id = "model_thinking_budget", long = "model-thinking-budget", env = ENV_MODEL_THINKING_BUDGET, default_value_t = 0)]
    pub thinking_budget: u64,
    /// Whether the model takes images (`openai`, `azure` and `anthropic`; the scripted model
    /// always does). When false, a model request that shows images fails before it is sent
    /// and the turn fails (`invalid_input`, naming the provider and the model).
    #[arg(id = "model_images", long = "model-images", env = ENV_MODEL_IMAGES, default_value_t = true, action = clap::ArgAction::Set)]
    pub images: bool,
    /// Largest image taken, in bytes: in a submission (refused past it), in a tool's result (the
    /// call fails past it).
    #[arg(id = "model_max_image_bytes", long = "model-max-image-bytes", env = ENV_MODEL_MAX_IMAGE_BYTES, default_value_t = crate::protocol::content::DEFAULT_MAX_IMAGE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_bytes: u64,
    /// Most images in one submission or tool result (refused past it) and in one model request
    /// (the oldest images of the conversation are then shown as a note instead).
    #[arg(id = "model_max_images", long = "model-max-images", env = ENV_MODEL_MAX_IMAGES, default_value_t = crate::protocol::content::DEFAULT_MAX_IMAGES)]
    pub max_images: usize,
}

impl ModelConfig {
    /// Checks values clap cannot: the API key must read and be long enough to mask; the prices,
    /// the tenant budgets and the traffic limits file must read; Azure's endpoint must be a URL
    /// other than OpenAI's, with an `api-version`.
    pub fn validate(&self) -> Result<(), String> {
        self.api_key()?;
        if self.provider == "azure" {
            crate::agent::model::openai::azure_root(&self.base_url, &self.api_version)?;
        }
        if let Some(path) = &self.providers_file {
            let file = crate::agent::model::providers::ProvidersFile::read(path)?;
            for (name, entry) in &file.providers {
                entry
                    .api_key()
                    .map_err(|e| format!("provider {name:?} of {}: {e}", path.display()))?;
            }
        }
        crate::agent::middleware::BudgetSettings::from_config(self).map(|_| ())?;
        crate::agent::middleware::TrafficPolicy::from_config(self).map(|_| ())
    }

    /// The caps images are held to.
    pub fn image_limits(&self) -> crate::protocol::ImageLimits {
        crate::protocol::ImageLimits {
            max_image_bytes: self.max_image_bytes,
            max_images: self.max_images,
        }
    }

    /// The API key: `--model-api-key`, or the file `SKEIN_MODEL_API_KEY_FILE` names. It is
    /// masked in everything the model and the tools return, so a key too short to mask safely
    /// (`redact::MIN_SECRET_BYTES`) is refused, with the setting's name, never its value.
    pub fn api_key(&self) -> Result<Option<String>, String> {
        let key = secret(self.api_key.as_deref(), ENV_MODEL_API_KEY)?;
        if let Some(key) = &key {
            crate::agent::middleware::Redactor::check(key)
                .map_err(|e| format!("{ENV_MODEL_API_KEY} (the model API key): {e}"))?;
        }
        Ok(key)
    }
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_version", &self.api_version)
            .field("max_tokens_field", &self.max_tokens_field)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("scenario", &self.scenario)
            .field("max_concurrency", &self.max_concurrency)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("prices", &self.prices)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("tenant_daily_tokens", &self.tenant_daily_tokens)
            .field("tenant_daily_cost_usd", &self.tenant_daily_cost_usd)
            .field("tenant_budgets", &self.tenant_budgets)
            .field("context_tokens", &self.context_tokens)
            .field("limits_file", &self.limits_file)
            .field("images", &self.images)
            .field("max_image_bytes", &self.max_image_bytes)
            .field("max_images", &self.max_images)
            .finish()
    }
}

/// Settings every long-running process (lead, worker) shares.
#[derive(Debug, Clone, Args)]
pub struct ProcessConfig {
    /// Unique id of this process; random when unset.
    #[arg(long, env = ENV_INSTANCE_ID)]
    pub instance_id: Option<String>,
    /// Cap on message payloads (and on a task's input).
    #[arg(long, env = ENV_MAX_PAYLOAD, default_value_t = crate::bus::DEFAULT_MAX_PAYLOAD)]
    pub max_payload: usize,
    /// Longest one tool call may run.
    #[arg(long, env = ENV_TOOL_TIMEOUT, default_value = "60s", value_parser = humantime::parse_duration)]
    pub tool_timeout: Duration,
    /// Time running work gets to finish on SIGTERM before it is handed back to the broker.
    #[arg(long, env = ENV_GRACE, default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// How long a delivered task may go unacknowledged (progress acks extend it while it runs).
    #[arg(long, env = ENV_ACK_WAIT, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    /// Attempts at a turn or a call (a crashed or failed try counts; a hand-back on shutdown does
    /// not) before it is dead-lettered and ends as a failure.
    #[arg(long, env = ENV_MAX_ATTEMPTS, default_value_t = 5)]
    pub max_attempts: u64,
    /// How long start-up waits for NATS and Redis to answer (retrying with backoff) before the
    /// process gives up; 0 tries once.
    #[arg(long, env = ENV_STARTUP_TIMEOUT, default_value = "3m", value_parser = humantime::parse_duration)]
    pub startup_timeout: Duration,
}

impl ProcessConfig {
    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(id) = &self.instance_id {
            crate::protocol::validate_token("instance id", id).map_err(|f| f.message)?;
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err("ack wait must be at least 1s".into());
        }
        if self.max_attempts < 1 {
            return Err("max attempts must be at least 1".into());
        }
        if self.tool_timeout < Duration::from_millis(1) {
            return Err("tool timeout must be more than 0".into());
        }
        if self.max_payload < 1024 {
            return Err("max payload must be at least 1024 bytes".into());
        }
        Ok(())
    }

    /// The configured instance id, or a fresh `{role}-{random}` one.
    pub fn instance_id(&self, role: &str) -> String {
        self.instance_id
            .clone()
            .unwrap_or_else(|| format!("{role}-{}", uuid::Uuid::new_v4().simple()))
    }

    /// How often a running task tells the broker it is still being worked on.
    pub fn progress_every(&self) -> Duration {
        self.ack_wait / 3
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_come_from_the_setting_or_else_from_their_file() {
        let dir = std::env::temp_dir().join(format!("skein-secret-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("password");
        std::fs::write(&file, "s3cret\n").expect("written");
        let from_file = super::secret_from(None, "X_FILE", Some(file.clone().into()));
        assert_eq!(from_file, Ok(Some("s3cret".to_owned())));
        let setting_wins = super::secret_from(Some("given"), "X_FILE", Some(file.into()));
        assert_eq!(setting_wins, Ok(Some("given".to_owned())));
        assert_eq!(super::secret_from(None, "X_FILE", None), Ok(None));
        let missing = super::secret_from(None, "X_FILE", Some(dir.join("nope").into()))
            .expect_err("an unreadable file is an error");
        assert!(missing.starts_with("X_FILE: cannot read"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    use super::*;

    #[test]
    fn redacts_passwords_in_urls() {
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/"),
            "redis://<redacted>@h:6379/"
        );
        assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
    }

    #[test]
    fn nats_settings_take_a_server_list_and_bounded_replicas() {
        let list = NatsConfig::local("nats://a:4222,nats://b:4222, nats://c:4222");
        assert_eq!(list.validate(), Ok(()));
        let bad = NatsConfig::local("nats://a:4222,nats://b:x").validate();
        assert!(bad.is_err_and(|e| e.contains("nats://b:x")));
        for (replicas, valid) in [(0, false), (1, true), (3, true), (5, true), (6, false)] {
            let cfg = NatsConfig {
                stream_replicas: replicas,
                ..NatsConfig::local("nats://a:4222")
            };
            assert_eq!(cfg.validate().is_ok(), valid, "{replicas} replicas");
        }
        for (partitions, valid) in [(0, false), (1, true), (3, true), (64, true), (65, false)] {
            let cfg = NatsConfig {
                partitions,
                ..NatsConfig::local("nats://a:4222")
            };
            assert_eq!(cfg.validate().is_ok(), valid, "{partitions} partitions");
        }
    }
}
