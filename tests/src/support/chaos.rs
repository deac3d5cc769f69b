//! What the chaos tests (`tests/tests/chaos_*.rs`) share: a scenario file by path, waiting for a
//! `slow_effect` call to start or finish (read back from the effects file) or for a task's call
//! results to be recorded (read from Redis), and running a batch of turns at once. Every wait is bounded: 30 s for an effect, [`TestCluster::run`]'s own limit for a
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

/// Waits until at least `count` call results of `task` are recorded in its session's results.
///
/// # Panics
/// When that has not happened within 30 s, or Redis cannot be reached.
pub async fn wait_for_recorded_results(cluster: &TestCluster, task: &TaskSubmission, count: u64) {
    let redis = redis::Client::open(cluster.redis.url.as_str()).expect("redis url");
    let conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let results = skein_common::store::keys::results(&task.tenant, &task.session, &task.task_id);
    eventually(
        &format!("{count} call result(s) of {} recorded", task.task_id),
        Duration::from_secs(30),
        || {
            let (mut conn, results) = (conn.clone(), results.clone());
            async move {
                let recorded: u64 = redis::cmd("HLEN")
                    .arg(&results)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                (recorded >= count).then_some(())
            }
        },
    )
    .await;
}
