//! Start-up waits: a lead or a worker that starts before NATS or Redis answers (a cluster booting
//! in any order, a broker restarting) waits for them with exponential backoff instead of exiting,
//! so it converges as soon as they are up, without a crash loop's growing restart delays.
//!
//! Invariants:
//! - only transient failures are waited out (nothing answers yet, JetStream has no leader yet);
//!   what a server refuses for good (a bad address, wrong credentials) ends the wait at once;
//! - every retry is logged with what is awaited, the attempt, the error and the delay before the
//!   next one: at info level while the wait is young, at warn once it has lasted [`WARN_AFTER`];
//! - the wait is bounded: at the deadline (`SKEIN_STARTUP_TIMEOUT` after start) it ends with the
//!   last error, said at error level; a shutdown signal ends it at once with `None`;
//! - nothing here marks the process ready: its readiness stays false until the caller has
//!   finished starting.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bus::{Bus, BusError};
use crate::config::{redact_url, NatsConfig, RedisConfig};
use crate::store::{SessionStore, StoreError};

/// Delay before the first retry.
const FIRST_DELAY: Duration = Duration::from_millis(200);
/// Longest delay between two tries.
const MAX_DELAY: Duration = Duration::from_secs(5);
/// How long a wait logs its retries at info level before it logs them at warn level.
pub const WARN_AFTER: Duration = Duration::from_secs(30);

/// Tries `attempt` until it succeeds, fails for good (`transient` says no), `deadline` passes,
/// or `shutdown` fires (`Ok(None)`). `awaited` names what is waited for in the logs.
pub async fn wait_for<T, E, F, Fut>(
    awaited: &str,
    deadline: Instant,
    shutdown: &CancellationToken,
    transient: fn(&E) -> bool,
    attempt: F,
) -> Result<Option<T>, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let started = Instant::now();
    let mut attempts = 0u32;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(FIRST_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    let retried = attempt
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| transient(e) && Instant::now() < deadline)
        // The last pause ends at the deadline, for one last try there.
        .adjust(|_, delay| delay.map(|d| d.min(deadline.saturating_duration_since(Instant::now()))))
        .notify(|e, delay| {
            attempts += 1;
            let waited = started.elapsed();
            if waited < WARN_AFTER {
                tracing::info!(awaiting = awaited, attempt = attempts, ?waited, retry_in = ?delay, error = %e, "waiting for a dependency to answer");
            } else {
                tracing::warn!(awaiting = awaited, attempt = attempts, ?waited, retry_in = ?delay, error = %e, "still waiting for a dependency to answer");
            }
        });
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {
            tracing::info!(awaiting = awaited, "stopped while waiting at start-up");
            Ok(None)
        }
        result = retried => match result {
            Ok(value) => {
                if attempts > 0 {
                    tracing::info!(awaiting = awaited, waited = ?started.elapsed(), "dependency answered");
                }
                Ok(Some(value))
            }
            Err(e) => {
                if transient(&e) {
                    tracing::error!(awaiting = awaited, waited = ?started.elapsed(), error = %e, "gave up waiting at start-up (SKEIN_STARTUP_TIMEOUT)");
                }
                Err(e)
            }
        },
    }
}

/// What a lead or a worker needs before anything else: NATS with Skein's streams in place, and
/// Redis. Waits for both at once, until `timeout` has passed; `None` if `shutdown` fired first.
pub async fn connect<E>(
    nats: &NatsConfig,
    redis: &RedisConfig,
    name: &str,
    max_payload: usize,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<Option<(Bus, SessionStore)>, E>
where
    E: From<BusError> + From<StoreError>,
{
    let deadline = Instant::now() + timeout;
    let nats_awaited = format!("NATS at {}", nats.url);
    let bus = async {
        wait_for(
            &nats_awaited,
            deadline,
            shutdown,
            BusError::is_transient,
            || async {
                let bus = Bus::connect(nats, name, max_payload).await?;
                bus.ensure_streams().await?;
                Ok(bus)
            },
        )
        .await
        .map_err(E::from)
    };
    let redis_awaited = format!("Redis at {}", redact_url(&redis.url));
    let store = async {
        wait_for(&redis_awaited, deadline, shutdown, store_transient, || {
            SessionStore::connect(redis)
        })
        .await
        .map_err(E::from)
    };
    match tokio::try_join!(bus, store)? {
        (Some(bus), Some(store)) => Ok(Some((bus, store))),
        _ => Ok(None),
    }
}

/// Whether a Redis failure may pass: nothing answers yet, or the server is loading its data or
/// electing a primary; refused credentials and bad settings are not waited out.
fn store_transient(error: &StoreError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    let StoreError::Unavailable(e) = error else {
        return false;
    };
    matches!(
        e.kind(),
        ErrorKind::Io
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::NoValidReplicasFoundBySentinel
            | ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
            )
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Failed {
        transient: bool,
    }

    impl std::fmt::Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed (transient: {})", self.transient)
        }
    }

    fn is_transient(e: &Failed) -> bool {
        e.transient
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let tries = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        let got = wait_for(
            "thing",
            deadline,
            &CancellationToken::new(),
            is_transient,
            || async {
                let n = tries.fetch_add(1, Ordering::SeqCst) + 1;
                if n < 4 {
                    Err(Failed { transient: true })
                } else {
                    Ok(n)
                }
            },
        )
        .await
        .expect("succeeds on the fourth try");
        assert_eq!(got, Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_failure_is_returned_at_once() {
        let tries = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        let got: Result<Option<()>, _> = wait_for(
            "thing",
            deadline,
            &CancellationToken::new(),
            is_transient,
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err(Failed { transient: false })
            },
        )
        .await;
        assert!(matches!(got, Err(Failed { transient: false })));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_at_the_deadline_with_the_last_error() {
        let tries = AtomicU32::new(0);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(20);
        let got: Result<Option<()>, _> = wait_for(
            "thing",
            deadline,
            &CancellationToken::new(),
            is_transient,
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err(Failed { transient: true })
            },
        )
        .await;
        assert!(matches!(got, Err(Failed { transient: true })));
        assert!(tries.load(Ordering::SeqCst) > 3, "retried with backoff");
        assert!(Instant::now() >= deadline, "waited until the deadline");
        assert!(
            Instant::now() <= deadline + Duration::from_millis(1),
            "and not past it: {:?}",
            Instant::now() - deadline
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_timeout_tries_once() {
        let tries = AtomicU32::new(0);
        let got: Result<Option<()>, _> = wait_for(
            "thing",
            Instant::now(),
            &CancellationToken::new(),
            is_transient,
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err(Failed { transient: true })
            },
        )
        .await;
        assert!(got.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_wait_without_an_error() {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.cancel();
        });
        let deadline = Instant::now() + Duration::from_secs(600);
        let got: Result<Option<()>, _> =
            wait_for("thing", deadline, &shutdown, is_transient, || async {
                Err(Failed { transient: true })
            })
            .await;
        assert!(matches!(got, Ok(None)));
        assert!(Instant::now() < deadline);
    }
}
