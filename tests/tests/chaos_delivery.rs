//! Chaos, delivery: every turn reaches its client once and in order when the path to it is
//! disturbed. Two leads apply a burst of one session's turns in submission order; a final event the
//! broker refuses is answered from the stored result; a client cut off (through a TCP proxy) while
//! the final event is published reads it from the stream once it is back; a task waiting for a
//! lease another holds hands its slot back and runs once the lease is free.

use std::time::Duration;

use serde_json::json;
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::chaos::{run_all, scenario};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::proxy::TcpProxy;
use skein_tests::support::{eventually, unique};
use skein_tests::support::{FakeOpenAi, FakeReply, NatsServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leads_apply_a_burst_of_turns_of_one_session_in_order() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [ { "answer": "{{input}} after {{previous_input}}" } ] }]),
    );
    let flags = ["--scenario", script.to_str().expect("utf-8 path")];
    cluster.start_nodes(0, &flags).await;
    cluster.start_nodes(0, &flags).await;

    let session = unique("s");
    let client = cluster.client().await;
    let tasks: Vec<_> = (0..12)
        .map(|i| submission("acme", &session, &format!("m{i}")))
        .collect();
    for task in &tasks {
        client.submit(task).await.expect("submitted");
    }
    let results = run_all(&cluster, &tasks).await;
    let stored = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("session loads");
    println!(
        "burst: submitted {} completed {} turns stored {}",
        tasks.len(),
        results
            .iter()
            .filter(|(r, _)| r.status == TurnStatus::Completed)
            .count(),
        stored.state.turns
    );
    assert_eq!(stored.state.turns, 12);
    assert_eq!(stored.state.history.len(), 24);
    for (i, pair) in stored.state.history.chunks(2).enumerate() {
        assert_eq!(
            pair[0].content,
            format!("m{i}"),
            "turn {i} applied in submission order"
        );
        let previous = if i == 0 {
            String::new()
        } else {
            format!("m{}", i - 1)
        };
        assert_eq!(
            pair[1].content,
            format!("m{i} after {previous}"),
            "turn {i} saw the turn before it"
        );
    }
}

/// A lead whose final event never reaches the stream (its publishes on the event subjects are
/// refused by the broker, after the turn has completed and its result is stored): the client
/// still gets the answer, from the stored result through a lookup any lead answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_event_that_is_never_published_is_answered_from_the_stored_result() {
    let nats = NatsServer::start_with_config(
        r#"authorization {
  users = [
    { user: lead, password: lead-pw, permissions: { publish: { deny: ["skein.events.>"] } } }
    { user: client, password: client-pw }
  ]
}"#,
    );
    let cluster = TestCluster::with_nats(nats);
    let model = FakeOpenAi::start(vec![FakeReply::answer("stored, never announced")]).await;
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--nats-user", "lead", "--nats-password", "lead-pw"]);
    cluster.spawn_lead(cluster.lead_config(&flags));
    let client = SkeinClient::connect(&NatsConfig {
        user: Some("client".into()),
        password: Some("client-pw".into()),
        ..NatsConfig::local(cluster.nats.url.clone())
    })
    .await
    .expect("client connects");
    let task = submission("acme", &unique("s"), "hello");
    let mut events = Vec::new();
    let result = client
        .run(&task, Duration::from_secs(8), |e| events.push(e.clone()))
        .await
        .expect("the answer arrives although its final event was never published");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("stored, never announced"));
    // It came from the store: the stream holds nothing of the task.
    let last = client
        .bus()
        .last_event("acme", &task.task_id)
        .await
        .expect("the events stream can be read");
    assert!(last.is_none(), "{last:?}");
    assert!(matches!(
        events.last().map(|e| &e.event),
        Some(EventKind::Final { .. })
    ));
}

/// The client's own connection drops while the turn's final event is published: once it is
/// back, it reads what it missed from the stream instead of waiting on a live subscription that
/// will never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_while_the_final_event_is_published_still_gets_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("published in the gap")]).await;
    let gate = model.hold();
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));
    let proxy = TcpProxy::start(cluster.nats.port()).await;
    let client = SkeinClient::connect(&NatsConfig::local(format!(
        "nats://127.0.0.1:{}",
        proxy.port
    )))
    .await
    .expect("client connects through the proxy");
    let task = submission("acme", &unique("s"), "hello");
    let running = {
        let (client, task) = (client.clone(), task.clone());
        tokio::spawn(async move { client.run(&task, Duration::from_secs(30), |_| {}).await })
    };
    // The turn is at its model call; the client is cut off; the turn ends meanwhile.
    eventually("the model call", Duration::from_secs(20), || async {
        (model.arrived() >= 1).then_some(())
    })
    .await;
    let mut disconnects = client.bus().core_gaps();
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(10), disconnects.changed())
        .await
        .expect("the client notices the cut")
        .expect("the connection lives on");
    gate.add_permits(1);
    let observer = cluster.client().await;
    let task_id = task.task_id.clone();
    eventually(
        "the final event in the stream",
        Duration::from_secs(20),
        || {
            let (observer, task_id) = (observer.clone(), task_id.clone());
            async move {
                let (_, last) = observer.bus().last_event("acme", &task_id).await.ok()??;
                matches!(last.event, EventKind::Final { .. }).then_some(())
            }
        },
    )
    .await;
    proxy.restore();
    let result = running
        .await
        .expect("the client task ends")
        .expect("the answer arrives after the gap");
    assert_eq!(result.answer.as_deref(), Some("published in the gap"));
}

/// Another holder keeps the session's lease (a lead that is alive and busy, here a stranger's
/// token): a task waiting for it does not hold its slot for ever; after twice the lease's time to
/// live it is handed back to the broker. Once the lease is free and announced, the task runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_a_held_lease_hands_its_slot_back_and_runs_once_free() {
    let cluster = TestCluster::start();
    cluster.start_nodes(0, &["--lease-ttl", "1s"]).await;
    let client = cluster.client().await;
    let session = unique("s");
    let lease = skein_common::store::keys::lease("acme", &session);
    let redis = redis::Client::open(cluster.redis.url.as_str()).expect("redis url");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let () = redis::cmd("SET")
        .arg(&lease)
        .arg("a-stranger")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .expect("lease taken");
    let task = submission("acme", &session, "wait for me");
    client.submit(&task).await.expect("submitted");

    let jetstream = async_nats::jetstream::new(client.bus().client().clone());
    eventually(
        "the waiting task to be handed back",
        Duration::from_secs(20),
        || {
            let jetstream = jetstream.clone();
            async move {
                let mut consumer: async_nats::jetstream::consumer::PullConsumer = jetstream
                    .get_stream(skein_common::subjects::SUBMIT_STREAM)
                    .await
                    .ok()?
                    .get_consumer(skein_common::subjects::LEADS_CONSUMER)
                    .await
                    .ok()?;
                let info = consumer.info().await.ok()?;
                (info.num_redelivered > 0).then_some(())
            }
        },
    )
    .await;

    let () = redis::cmd("DEL")
        .arg(&lease)
        .query_async(&mut conn)
        .await
        .expect("lease freed");
    client
        .bus()
        .client()
        .publish(
            skein_common::subjects::turned("acme", &session),
            Default::default(),
        )
        .await
        .expect("announced");
    let result = client
        .run(&task, Duration::from_secs(30), |_| {})
        .await
        .expect("the task runs once the lease is free");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
}

/// A started turn whose every attempt fails on something passing (here its session's lease,
/// taken by another holder while the turn waits for a long call) is given up after exactly
/// `--max-attempts` attempts, by its last attempt: the test takes the lease from each attempt it
/// sees begin and counts them, and the task ends dead-lettered, naming that many attempts and the
/// last one's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_failing_on_every_attempt_is_given_up_after_max_attempts_exactly() {
    const MAX_ATTEMPTS: usize = 3;
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 120_000 } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let max_attempts = MAX_ATTEMPTS.to_string();
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        script.to_str().expect("utf-8 path"),
        "--lease-ttl",
        "1s",
        "--max-attempts",
        &max_attempts,
    ]));
    let client = cluster.client().await;
    let session = unique("s");
    let task = submission("acme", &session, &unique("effect"));
    let lease = skein_common::store::keys::lease("acme", &session);
    let redis = redis::Client::open(cluster.redis.url.as_str()).expect("redis url");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis");

    let running = tokio::spawn({
        let (client, task) = (client.clone(), task.clone());
        async move { client.run(&task, Duration::from_secs(120), |_| {}).await }
    });
    // Each time a lead's token holds the lease (an attempt began), it is taken for a moment: the
    // attempt's next renewal finds it lost and the attempt fails, to be tried again.
    let mut attempts_seen = 0;
    while !running.is_finished() {
        let holder: Option<String> = redis::cmd("GET")
            .arg(&lease)
            .query_async(&mut conn)
            .await
            .expect("redis answers");
        if holder.is_some_and(|holder| holder != "another-holder") {
            attempts_seen += 1;
            let () = redis::cmd("SET")
                .arg(&lease)
                .arg("another-holder")
                .arg("PX")
                .arg(300)
                .query_async(&mut conn)
                .await
                .expect("lease taken");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = running
        .await
        .expect("the client task ends")
        .expect("the task ends");

    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert_eq!(
        failure.kind,
        skein_common::protocol::FailureKind::DeadLettered
    );
    assert!(
        failure
            .message
            .contains(&format!("failed on all {MAX_ATTEMPTS} attempts")),
        "{}",
        failure.message
    );
    // Given up by the attempt that failed last, with its own failure: not by one more delivery
    // that only finds the attempts used up (which knows no failure but "stopped each time").
    assert!(
        failure.message.contains("session lease lost"),
        "the last attempt's own failure: {}",
        failure.message
    );
    assert_eq!(
        attempts_seen, MAX_ATTEMPTS,
        "the turn began exactly --max-attempts times"
    );
}
