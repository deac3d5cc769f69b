//! Logging set-up shared by every binary: `tracing` with an env filter (`SKEIN_LOG`, default
//! `info`), JSON lines (`SKEIN_LOG_FORMAT=json`, the default when stderr is not a terminal) or a
//! human format in a terminal. Logs go to stderr so stdout stays for program output.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{ENV_LOG, ENV_LOG_FORMAT};

/// Flushes telemetry when dropped (kept by `main` for the life of the process).
#[must_use = "telemetry is flushed when the guard drops"]
pub struct TelemetryGuard(());

/// Installs the global subscriber; a second call is a no-op.
pub fn init(service: &str) -> TelemetryGuard {
    let filter = EnvFilter::try_from_env(ENV_LOG).unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match std::env::var(ENV_LOG_FORMAT) {
        Ok(format) => format == "json",
        Err(_) => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.compact().try_init()
    };
    if installed.is_ok() {
        tracing::debug!(service, "telemetry initialised");
    }
    TelemetryGuard(())
}
