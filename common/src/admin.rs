//! The small admin HTTP server every Skein process runs next to its real work: `/metrics`
//! (OpenMetrics text from [`Metrics`]), `/healthz` (the process is alive) and `/readyz` (the
//! process is ready for work, as set through [`Readiness`]). Also owns its command-line settings.
//!
//! Invariants:
//! - the server only reads: every route answers `GET` (and `HEAD`), none changes the process;
//! - with a token (`SKEIN_ADMIN_TOKEN`, or the file `SKEIN_ADMIN_TOKEN_FILE` names), `/metrics`
//!   answers only a request with `Authorization: Bearer <token>`, anything else 401 with
//!   `WWW-Authenticate: Bearer`; `/healthz` and `/readyz` stay open for the probes;
//! - the token is kept as its SHA-256 and a presented one compared with it in constant time
//!   ([`MetricsToken`]), so the answer's timing tells nothing of the token.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{secret, ENV_ADMIN_ADDR, ENV_ADMIN_TOKEN};
use crate::metrics::Metrics;

/// Content type of the OpenMetrics text exposition format.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The value of `--admin-addr` that turns the admin server off.
const DISABLED: &str = "off";

/// Where the admin server listens, and what `/metrics` asks of a scraper. The token is never
/// logged: `Debug` redacts it.
#[derive(Clone, clap::Args)]
pub struct AdminConfig {
    /// Address of the admin server (metrics, health, readiness); `off` disables it.
    #[arg(id = "admin_addr", long = "admin-addr", env = ENV_ADMIN_ADDR, default_value = "0.0.0.0:9464")]
    pub addr: String,
    /// Bearer token `/metrics` requires (also from `SKEIN_ADMIN_TOKEN_FILE`); unset: `/metrics`
    /// is open. `/healthz` and `/readyz` stay open either way.
    #[arg(id = "admin_token", long = "admin-token", env = ENV_ADMIN_TOKEN, hide_env_values = true)]
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl AdminConfig {
    /// Checks that the address is `off` or an `IP:port` socket address, and that a token, if
    /// one is set, reads and is not empty.
    pub fn validate(&self) -> Result<(), String> {
        self.token()?;
        if self.is_disabled() {
            return Ok(());
        }
        self.addr
            .trim()
            .parse::<SocketAddr>()
            .map(drop)
            .map_err(|error| {
                format!(
                    "--admin-addr {:?} is neither `{DISABLED}` nor an IP:port address ({error})",
                    self.addr
                )
            })
    }

    /// The address to listen on; `None` when the server is disabled (`off`) or, before
    /// [`AdminConfig::validate`] has passed, when the address does not parse.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        if self.is_disabled() {
            return None;
        }
        self.addr.trim().parse().ok()
    }

    fn is_disabled(&self) -> bool {
        self.addr.trim().eq_ignore_ascii_case(DISABLED)
    }

    /// The token `/metrics` requires: `--admin-token`, or the file `SKEIN_ADMIN_TOKEN_FILE`
    /// names; `None` when neither is set. An empty token is refused, never taken as none.
    pub fn token(&self) -> Result<Option<MetricsToken>, String> {
        match secret(self.token.as_deref(), ENV_ADMIN_TOKEN)? {
            Some(token) if token.trim().is_empty() => Err(format!(
                "{ENV_ADMIN_TOKEN} (the admin token) is empty: set a token, or unset it to leave \
                 /metrics open"
            )),
            token => Ok(token.as_deref().map(MetricsToken::new)),
        }
    }
}

/// The bearer token `/metrics` requires, kept as its SHA-256: a presented token is hashed and
/// the two digests compared in constant time, so neither the token's length nor its bytes show
/// in how long a refusal takes.
#[derive(Clone)]
pub struct MetricsToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken(<redacted>)")
    }
}

impl MetricsToken {
    pub fn new(token: &str) -> Self {
        Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        }
    }

    /// Whether `presented` is the token.
    fn admits(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(self.digest.ct_eq(&digest))
    }
}

/// Why a request for `/metrics` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No bearer token came with it.
    Missing,
    /// A token came, and it is not the one.
    Wrong,
}

/// Whether a request with `authorization` (its `Authorization` header) may read `/metrics`: any
/// when there is no token; else only one whose header is `Bearer <token>` (the scheme in any
/// case).
fn authorize(
    token: Option<&MetricsToken>,
    authorization: Option<&HeaderValue>,
) -> Result<(), Refusal> {
    let Some(token) = token else {
        return Ok(());
    };
    let presented = authorization
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, presented)| presented.trim());
    match presented {
        None => Err(Refusal::Missing),
        Some(presented) if token.admits(presented) => Ok(()),
        Some(_) => Err(Refusal::Wrong),
    }
}

/// Whether the process is ready for work; starts not ready. Cheap to clone: clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
}

impl Readiness {
    /// Marks the process ready (after start-up) or not ready (while draining).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The token is set but cannot be used (its file does not read, it is empty).
    #[error("{0}")]
    Token(String),
}

/// What the request handlers read.
#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    readiness: Readiness,
    token: Option<MetricsToken>,
}

/// Binds `addr` (failing fast with a clear error) and serves the admin routes until `shutdown`
/// is cancelled, `/metrics` only to holders of `token` when there is one; the serving task goes
/// into `tracker`. Returns the bound address, which tells the real port when `addr` has port 0.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
    token: Option<MetricsToken>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    let bind_error = |source| AdminError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let app = router(AdminState {
        metrics,
        readiness,
        token,
    });
    tracker.spawn(async move {
        tracing::info!(addr = %bound, "admin server listening");
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        match served {
            Ok(()) => tracing::debug!(addr = %bound, "admin server stopped"),
            Err(error) => tracing::error!(addr = %bound, %error, "admin server failed"),
        }
    });
    Ok(bound)
}

fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/readyz", get(ready_handler))
        .fallback(not_found_handler)
        .with_state(state)
}

async fn metrics_handler(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    match authorize(state.token.as_ref(), headers.get(header::AUTHORIZATION)) {
        Ok(()) => (
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            state.metrics.render(),
        )
            .into_response(),
        Err(refusal) => {
            // RFC 6750: a request without a token gets the bare challenge, a wrong token its
            // error code.
            let challenge = match refusal {
                Refusal::Missing => "Bearer",
                Refusal::Wrong => "Bearer error=\"invalid_token\"",
            };
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, challenge)],
                "unauthorized",
            )
                .into_response()
        }
    }
}

async fn health_handler() -> &'static str {
    "ok"
}

async fn ready_handler(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn not_found_handler() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "not found")
}

/// Starts the admin server the configuration asks for (none for `off`) as background work of
/// `work`, stopping with it; returns the bound address.
pub async fn serve_configured(
    cfg: &AdminConfig,
    metrics: Metrics,
    readiness: Readiness,
    work: &crate::shutdown::Workload,
) -> Result<Option<SocketAddr>, AdminError> {
    match cfg.socket_addr() {
        Some(addr) => serve(
            addr,
            metrics,
            readiness,
            cfg.token().map_err(AdminError::Token)?,
            &work.background,
            work.background_stop.clone(),
        )
        .await
        .map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config(addr: &str) -> AdminConfig {
        AdminConfig {
            addr: addr.to_owned(),
            token: None,
        }
    }

    #[test]
    fn config_parses_off_and_addresses() {
        assert_eq!(config("off").socket_addr(), None);
        assert_eq!(config("OFF").socket_addr(), None);
        assert!(config("off").validate().is_ok());
        let addr = config("0.0.0.0:9464");
        assert!(addr.validate().is_ok());
        assert_eq!(
            addr.socket_addr(),
            Some(SocketAddr::from(([0, 0, 0, 0], 9464)))
        );
        let v6 = config("[::1]:9000");
        assert!(v6.validate().is_ok());
        assert_eq!(v6.socket_addr().map(|a| a.port()), Some(9000));
    }

    #[test]
    fn config_rejects_garbage() {
        for garbage in [
            "",
            "nonsense",
            "127.0.0.1",
            "127.0.0.1:port",
            "localhost:99999",
        ] {
            let error = config(garbage).validate().expect_err(garbage);
            assert!(error.contains("--admin-addr"), "{error}");
            assert_eq!(config(garbage).socket_addr(), None);
        }
    }

    #[test]
    fn readiness_clones_share_the_flag() {
        let readiness = Readiness::default();
        let clone = readiness.clone();
        assert!(!readiness.is_ready());
        clone.set_ready(true);
        assert!(readiness.is_ready());
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics_until_shutdown() {
        let metrics = Metrics::new();
        let readiness = Readiness::default();
        let tracker = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let addr = serve(
            loopback,
            metrics.clone(),
            readiness.clone(),
            None,
            &tracker,
            shutdown.clone(),
        )
        .await
        .expect("bind an ephemeral port");
        assert_ne!(addr.port(), 0);

        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("build client");
        let get = |path: &str| client.get(format!("http://{addr}{path}")).send();

        let health = get("/healthz").await.expect("GET /healthz");
        assert_eq!(health.status(), reqwest::StatusCode::OK);
        assert_eq!(health.text().await.expect("body"), "ok");

        let not_ready = get("/readyz").await.expect("GET /readyz");
        assert_eq!(not_ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(not_ready.text().await.expect("body"), "not ready");
        readiness.set_ready(true);
        let ready = get("/readyz").await.expect("GET /readyz");
        assert_eq!(ready.status(), reqwest::StatusCode::OK);
        assert_eq!(ready.text().await.expect("body"), "ready");

        metrics.dead_lettered("tool");
        let scraped = get("/metrics").await.expect("GET /metrics");
        assert_eq!(scraped.status(), reqwest::StatusCode::OK);
        let content_type = scraped
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        assert_eq!(content_type.as_deref(), Some(OPENMETRICS_CONTENT_TYPE));
        let body = scraped.text().await.expect("body");
        assert!(
            body.contains("skein_dead_letters_total{kind=\"tool\"} 1\n"),
            "{body}"
        );

        let missing = get("/nope").await.expect("GET /nope");
        assert_eq!(missing.status(), reqwest::StatusCode::NOT_FOUND);

        shutdown.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .expect("the admin server stops on shutdown");
    }

    #[test]
    fn metrics_ask_for_the_bearer_token_when_one_is_set() {
        let token = MetricsToken::new("s3cret-token");
        let header = |value: &str| HeaderValue::from_str(value).expect("a header value");
        type Case<'a> = (
            Option<&'a MetricsToken>,
            Option<HeaderValue>,
            Result<(), Refusal>,
        );
        let cases: [Case; 10] = [
            (None, None, Ok(())),
            (None, Some(header("Bearer anything")), Ok(())),
            (Some(&token), None, Err(Refusal::Missing)),
            (
                Some(&token),
                Some(header("s3cret-token")),
                Err(Refusal::Missing),
            ),
            (
                Some(&token),
                Some(header("Basic s3cret-token")),
                Err(Refusal::Missing),
            ),
            (Some(&token), Some(header("Bearer")), Err(Refusal::Missing)),
            (
                Some(&token),
                Some(header("Bearer s3cret")),
                Err(Refusal::Wrong),
            ),
            (
                Some(&token),
                Some(header("Bearer s3cret-token2")),
                Err(Refusal::Wrong),
            ),
            (Some(&token), Some(header("Bearer s3cret-token")), Ok(())),
            (Some(&token), Some(header("bearer  s3cret-token ")), Ok(())),
        ];
        for (token, authorization, expected) in cases {
            assert_eq!(
                authorize(token, authorization.as_ref()),
                expected,
                "{authorization:?}"
            );
        }
    }

    #[test]
    fn an_empty_token_is_refused_and_a_set_one_never_shown() {
        let empty = AdminConfig {
            token: Some(" ".into()),
            ..config("off")
        };
        let error = empty.validate().expect_err("an empty token");
        assert!(error.contains("SKEIN_ADMIN_TOKEN"), "{error}");
        let set = AdminConfig {
            token: Some("s3cret-token".into()),
            ..config("127.0.0.1:9464")
        };
        assert!(set.validate().is_ok());
        let shown = format!("{set:?} {:?}", set.token());
        assert!(!shown.contains("s3cret-token"), "{shown}");
    }

    #[tokio::test]
    async fn a_configured_token_guards_metrics_and_leaves_the_probes_open() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            admin: AdminConfig,
        }
        let flags = <Flags as clap::Parser>::try_parse_from([
            "skein",
            "--admin-addr",
            "127.0.0.1:0",
            "--admin-token",
            "s3cret-token",
        ])
        .expect("valid flags");
        let metrics = Metrics::new();
        metrics.dead_lettered("tool");
        let work = crate::shutdown::Workload::default();
        let addr = serve_configured(&flags.admin, metrics, Readiness::default(), &work)
            .await
            .expect("serves")
            .expect("an address, not off");
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("build client");
        let get = |path: &str, authorization: Option<&str>| {
            let request = client.get(format!("http://{addr}{path}"));
            match authorization {
                Some(value) => request.header(reqwest::header::AUTHORIZATION, value),
                None => request,
            }
            .send()
        };
        let challenge = |response: &reqwest::Response| {
            response
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };

        let anonymous = get("/metrics", None).await.expect("GET /metrics");
        assert_eq!(anonymous.status(), reqwest::StatusCode::UNAUTHORIZED);
        assert_eq!(challenge(&anonymous).as_deref(), Some("Bearer"));
        assert!(!anonymous.text().await.expect("body").contains("skein_"));

        let wrong = get("/metrics", Some("Bearer not-the-token"))
            .await
            .expect("GET /metrics");
        assert_eq!(wrong.status(), reqwest::StatusCode::UNAUTHORIZED);
        assert_eq!(
            challenge(&wrong).as_deref(),
            Some("Bearer error=\"invalid_token\"")
        );

        let right = get("/metrics", Some("Bearer s3cret-token"))
            .await
            .expect("GET /metrics");
        assert_eq!(right.status(), reqwest::StatusCode::OK);
        let body = right.text().await.expect("body");
        assert!(
            body.contains("skein_dead_letters_total{kind=\"tool\"} 1\n"),
            "{body}"
        );

        let health = get("/healthz", None).await.expect("GET /healthz");
        assert_eq!(health.status(), reqwest::StatusCode::OK);
        let ready = get("/readyz", None).await.expect("GET /readyz");
        assert_eq!(ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);

        work.background_stop.cancel();
        work.background.close();
        tokio::time::timeout(Duration::from_secs(5), work.background.wait())
            .await
            .expect("the admin server stops on shutdown");
    }

    #[tokio::test]
    async fn bind_failure_names_the_address() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an ephemeral port");
        let addr = taken.local_addr().expect("local address");
        let tracker = TaskTracker::new();
        let error = serve(
            addr,
            Metrics::new(),
            Readiness::default(),
            None,
            &tracker,
            CancellationToken::new(),
        )
        .await
        .expect_err("the port is taken");
        assert!(error.to_string().contains(&addr.to_string()), "{error}");
        assert!(tracker.is_empty());
    }
}
