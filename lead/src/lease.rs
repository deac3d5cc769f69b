//! Keeping a session lease while a turn runs: renewed every third of its time to live; lost when
//! another lead holds it, and presumed lost when no renewal has succeeded for a whole time to
//! live (Redis away or too slow), since by then it may have expired and been taken. Either way
//! the turn stops before it writes anything more.

use std::future::Future;
use std::time::Duration;

use skein_common::protocol::{Failure, FailureKind};
use tokio::time::Instant;

/// Renews through `renew` (true: still held; false: held by another; an error: unknown) until
/// the lease is lost or presumed lost; returns why. Never returns while the lease is held.
pub async fn keep_renewed<F, Fut, E>(ttl: Duration, mut renew: F) -> Failure
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, E>>,
    E: std::fmt::Display,
{
    let every = ttl / 3;
    let mut held_until = Instant::now() + ttl;
    loop {
        tokio::time::sleep(every).await;
        // A renewal that hangs counts as a failed one.
        let asked = Instant::now();
        // Boxed: a renewal runs every third of the lease's time to live, and inline its future
        // would be held by the turn for as long as the turn runs.
        match tokio::time::timeout(every, Box::pin(renew())).await {
            Ok(Ok(true)) => held_until = asked + ttl,
            Ok(Ok(false)) => {
                return Failure::new(
                    FailureKind::Unavailable,
                    "session lease lost to another lead",
                )
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "lease renewal failed; retrying"),
            Err(_) => tracing::warn!(?every, "lease renewal timed out; retrying"),
        }
        // Past the last renewal's time to live the lease may be gone (and taken).
        if Instant::now() + every >= held_until {
            return Failure::new(
                FailureKind::Unavailable,
                format!("session lease not renewed for {ttl:?}: presumed lost"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failing_renewals_presume_the_lease_lost_before_it_can_expire() {
        let started = Instant::now();
        let tries = Arc::new(AtomicUsize::new(0));
        let failure = keep_renewed(Duration::from_secs(3), || {
            tries.fetch_add(1, Ordering::SeqCst);
            async { Err::<bool, _>("redis away") }
        })
        .await;
        assert!(failure.message.contains("presumed lost"), "{failure:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(tries.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_held_by_another_is_lost_at_once() {
        let failure =
            keep_renewed(Duration::from_secs(3), || async { Ok::<_, String>(false) }).await;
        assert!(failure.message.contains("another lead"), "{failure:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_that_succeed_keep_it_and_one_failure_is_tolerated() {
        let tries = Arc::new(AtomicUsize::new(0));
        let keeping = keep_renewed(Duration::from_secs(3), || {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    3 => Err("a blip".to_owned()),
                    _ => Ok(true),
                }
            }
        });
        let held = tokio::time::timeout(Duration::from_secs(30), keeping).await;
        assert!(held.is_err(), "still held after 30 s: {held:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_counts_as_failed() {
        let failure = keep_renewed(Duration::from_secs(3), || {
            std::future::pending::<Result<bool, String>>()
        })
        .await;
        assert!(failure.message.contains("presumed lost"), "{failure:?}");
    }
}
