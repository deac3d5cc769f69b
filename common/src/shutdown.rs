//! Process shutdown: one root `CancellationToken` per process, cancelled by SIGTERM or Ctrl-C.
//! Running work hangs off separate abort tokens, so shutdown first stops intake, lets running work
//! finish within the grace period, and only then aborts it.

use tokio_util::sync::CancellationToken;

/// A token cancelled when the process receives SIGTERM or SIGINT.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; draining");
        cancel.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// The work of a process: running tasks (aborted after the grace period) and background tasks
/// that must outlive them (such as the reply listener of a dispatcher).
pub struct Workload {
    pub running: tokio_util::task::TaskTracker,
    pub abort: CancellationToken,
    pub background: tokio_util::task::TaskTracker,
    pub background_stop: CancellationToken,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            running: tokio_util::task::TaskTracker::new(),
            abort: CancellationToken::new(),
            background: tokio_util::task::TaskTracker::new(),
            background_stop: CancellationToken::new(),
        }
    }
}

impl Workload {
    /// Call after intake has stopped: lets running work finish within `grace`, then aborts it
    /// (aborted work hands its messages back to the broker), then stops background tasks.
    pub async fn drain(self, grace: std::time::Duration) {
        self.running.close();
        if tokio::time::timeout(grace, self.running.wait())
            .await
            .is_err()
        {
            tracing::warn!(?grace, "grace period over; handing running work back");
            self.abort.cancel();
            self.running.wait().await;
        }
        self.abort.cancel();
        self.background_stop.cancel();
        self.background.close();
        self.background.wait().await;
    }
}

/// Runs a server process's `run` until SIGTERM/Ctrl-C, with telemetry installed (traces exported
/// when `telemetry` names an endpoint); maps the outcome to an exit code (64 for bad
/// configuration, 1 for a failure).
pub async fn serve_until_signal<E, F>(
    service: &str,
    instance: &str,
    telemetry: &crate::telemetry::TelemetryConfig,
    validated: Result<(), String>,
    run: impl FnOnce(CancellationToken) -> F,
) -> std::process::ExitCode
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<(), E>>,
{
    if let Err(reason) = validated {
        let _telemetry = crate::telemetry::init_logs(service);
        eprintln!("{service}: {reason}");
        return std::process::ExitCode::from(EXIT_CONFIG);
    }
    let _telemetry = crate::telemetry::init(service, instance, telemetry);
    match run(on_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{service} failed");
            eprintln!("{service}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Exit code for bad configuration (sysexits `EX_USAGE`).
pub const EXIT_CONFIG: u8 = 64;
