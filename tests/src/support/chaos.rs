//! What the chaos tests (`tests/tests/chaos_*.rs`) share: a scenario file by path, waiting for a
//! `slow_effect` call to start or finish (read back from the effects file), and running a batch of
//! turns at once. Every wait is bounded: 30 s for an effect, [`TestCluster::run`]'s own limit for a
//! turn.

use std::path::{Path, PathBuf};
use std::time::Duration;

use skein_common::protocol::{FinalResult, TaskSubmission, TurnEvent};

use super::cluster::TestCluster;
use super::eventually;
use super::test_tools::read_effects;

/// Writes a scripted-model scenario whose `assistant` plays `assistant_turns` (see
/// [`TestCluster::scenario`]); returns its path.
pub fn scenario(cluster: &TestCluster, assistant_turns: serde_json::Value) -> PathBuf {
    PathBuf::from(cluster.scenario(assistant_turns))
}

/// Waits until the `slow_effect` call keyed `key` has started (`started`) or finished (not
/// `started`), as recorded in the effects file at `path`.
///
/// # Panics
/// When that has not happened within 30 s.
pub async fn wait_for_effect(path: &Path, key: &str, started: bool) {
    eventually(
        &format!("effect {key} to start"),
        Duration::from_secs(30),
        || async {
            let counts = read_effects(path);
            let count = counts.get(key)?;
            (if started { count.started } else { count.done } > 0).then_some(())
        },
    )
    .await
}

/// Submits every task, then collects every final result (events kept per task).
pub async fn run_all(
    cluster: &TestCluster,
    tasks: &[TaskSubmission],
) -> Vec<(FinalResult, Vec<TurnEvent>)> {
    futures::future::join_all(tasks.iter().map(|task| cluster.run(task))).await
}
