//! The Celery peer (`--celery`): `benches/peers/celery_bench.py` in a virtual environment cached
//! under `~/.cache/skein-bench-celery`, a Celery worker and client on the bench's Redis (database 1).

use std::path::PathBuf;

use serde_json::Value;
use skein_tests::support::ChildProcess;

use crate::report::Report;
use crate::Failed;

/// The Celery peer: a worker and a client from `benches/peers/celery_bench.py`, in a cached
/// virtual environment, on the bench's Redis (its own database).
pub(crate) async fn celery_peer(
    redis_url: &str,
    dir: &std::path::Path,
    samples: usize,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/peers/celery_bench.py");
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("skein-bench-celery");
    let python = cache.join("bin/python");
    if !python.exists() {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&cache)
            .status()?;
        let installed = std::process::Command::new(cache.join("bin/pip"))
            .args(["install", "--quiet", "celery[redis]>=5,<6"])
            .status()?;
        if !made.success() || !installed.success() {
            return Err(
                "could not install Celery (python3 -m venv, pip install celery[redis])".into(),
            );
        }
    }
    let url = format!("{}/1", redis_url.trim_end_matches('/'));
    let mut worker = std::process::Command::new(&python);
    worker.arg(&script).args(["worker", &url]);
    let _worker = ChildProcess::spawn(worker, dir.join("celery-worker.log"));
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .args(["client", &url, &samples.to_string(), &calls.to_string()])
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!(
            "the Celery client failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let figures: Value = serde_json::from_slice(&output.stdout)?;
    let figure = |name: &str| figures[name].as_f64().unwrap_or(f64::NAN);
    report.add(
        "peer: Celery task round trip p50",
        figure("round_trip_p50_us"),
        "µs",
    );
    report.add(
        "peer: Celery task round trip p99",
        figure("round_trip_p99_us"),
        "µs",
    );
    report.add(
        "peer: Celery tasks (2 worker processes)",
        figure("throughput_per_s"),
        "tasks/s",
    );
    Ok(())
}
