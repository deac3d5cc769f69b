//! What the hostile-client tests share: planting Redis values, publishing as a plain NATS
//! client, reading a task's last event and the dead letters of a message.

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use skein_common::protocol::{EventKind, TaskSubmission};

use super::cluster::TestCluster;

/// Plants a Redis value of the test's choosing.
pub async fn plant(cluster: &TestCluster, command: &[&str]) {
    let mut conn = redis::Client::open(cluster.redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let mut cmd = redis::cmd(command[0]);
    for arg in &command[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query_async(&mut conn).await.expect("planted");
}

/// Publishes a submission as a plain NATS client would, with `message_id` (or none).
pub async fn publish_raw(cluster: &TestCluster, task: &TaskSubmission, message_id: Option<&str>) {
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    let mut headers = HeaderMap::new();
    if let Some(id) = message_id {
        headers.insert(NATS_MESSAGE_ID, id);
    }
    jetstream
        .publish_with_headers(
            skein_common::subjects::submit(&task.tenant, &task.session),
            headers,
            serde_json::to_vec(task).expect("encode").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");
}

/// The latest event of one of `acme`'s tasks, with its stream sequence.
pub async fn last_event(cluster: &TestCluster, task_id: &str) -> Option<(u64, EventKind)> {
    last_event_of(cluster, "acme", task_id).await
}

/// The latest event of a task of `tenant`, with its stream sequence.
pub async fn last_event_of(
    cluster: &TestCluster,
    tenant: &str,
    task_id: &str,
) -> Option<(u64, EventKind)> {
    let (seq, event) = cluster
        .client()
        .await
        .bus()
        .last_event(tenant, task_id)
        .await
        .ok()??;
    Some((seq, event.event))
}

/// How many dead letters name `task_id` as their original id.
pub async fn letters_of(
    cluster: &TestCluster,
    task_id: &str,
) -> Vec<skein_common::bus::DeadLetter> {
    let letters = cluster
        .client()
        .await
        .bus()
        .dead_letters()
        .await
        .expect("dead letters");
    letters
        .into_iter()
        .filter(|l| {
            l.original_id
                .as_deref()
                .is_some_and(|id| id.ends_with(task_id))
        })
        .collect()
}
