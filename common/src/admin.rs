//! The small admin HTTP server every Skein process runs next to its real work: `/metrics`
//! (OpenMetrics text from [`Metrics`]), `/healthz` (the process is alive) and `/readyz` (the
//! process is ready for work, as set through [`Readiness`]). Also owns its command-line settings.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ENV_ADMIN_ADDR;
use crate::metrics::Metrics;

/// Content type of the OpenMetrics text exposition format.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The value of `--admin-addr` that turns the admin server off.
const DISABLED: &str = "off";

/// Where the admin server listens.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminConfig {
    /// Address of the admin server (metrics, health, readiness); `off` disables it.
    #[arg(id = "admin_addr", long = "admin-addr", env = ENV_ADMIN_ADDR, default_value = "0.0.0.0:9464")]
    pub addr: String,
}

impl AdminConfig {
    /// Checks that the address is `off` or an `IP:port` socket address.
    pub fn validate(&self) -> Result<(), String> {
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
}

/// What the request handlers read.
#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    readiness: Readiness,
}

/// Binds `addr` (failing fast with a clear error) and serves the admin routes until `shutdown`
/// is cancelled; the serving task goes into `tracker`. Returns the bound address, which tells the
/// real port when `addr` has port 0.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
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
    let app = router(AdminState { metrics, readiness });
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

async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        state.metrics.render(),
    )
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
            &tracker,
            CancellationToken::new(),
        )
        .await
        .expect_err("the port is taken");
        assert!(error.to_string().contains(&addr.to_string()), "{error}");
        assert!(tracker.is_empty());
    }
}
