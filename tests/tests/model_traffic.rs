//! Model traffic under control: the limit on model calls in flight holds across two leads sharing
//! one Redis, a model server that asks callers to wait (429 with `Retry-After`) costs a turn only
//! time, and the shared semaphore shares a full model fairly between tenants and frees the slots
//! of a holder that stopped renewing.

use std::time::Duration;

use skein_common::protocol::TurnStatus;
use skein_common::store::traffic::{current_minute, Admission, SlotRequest};
use skein_tests::support::chaos::run_all;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leads_never_have_more_model_calls_in_flight_than_the_limit() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("done"); 20]).await;
    // Every request is held until the test lets it through: the held ones are all in flight.
    let gate = model.hold();
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--model-max-concurrency", "4"]);
    cluster.spawn_lead(cluster.lead_config(&flags));
    cluster.spawn_lead(cluster.lead_config(&flags));

    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let tenant = if i % 2 == 0 { "acme" } else { "globex" };
            submission(tenant, &unique("s"), &format!("question {i}"))
        })
        .collect();
    let runs = tokio::spawn(async move {
        let results = run_all(&cluster, &tasks).await;
        (cluster, results)
    });

    // The limit is reached: four requests are held at the server at once...
    eventually(
        "four model calls in flight",
        Duration::from_secs(30),
        || {
            let arrived = model.arrived();
            async move { (arrived >= 4).then_some(()) }
        },
    )
    .await;
    // ...and while they are, no fifth one gets through; then everything is let through.
    gate.add_permits(1000);
    let (_cluster, results) = runs.await.expect("the runs finish");

    assert_eq!(results.len(), 20);
    for (result, _) in &results {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        assert_eq!(result.answer.as_deref(), Some("done"));
    }
    assert_eq!(model.arrived(), 20);
    assert_eq!(model.most_in_flight(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_server_that_asks_to_wait_costs_a_turn_only_time() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("worth the wait")]).await;
    model.refuse(3, 1);
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello"))
        .await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("worth the wait"));
    assert_eq!(model.refused(), 3);
    assert_eq!(model.arrived(), 4);
}

fn slot<'a>(model: &'a str, tenant: &'a str, holder: &'a str, lease: Duration) -> SlotRequest<'a> {
    SlotRequest {
        model,
        tenant,
        holder,
        limit: 2,
        tokens_per_minute: 0,
        lease,
        waiting_note: Duration::from_secs(30),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_model_goes_to_the_waiting_tenant_before_the_one_over_its_share() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let model = unique("m");
    let lease = Duration::from_secs(60);
    let take = |tenant: &'static str, holder: &'static str| {
        let (store, model) = (store.clone(), model.clone());
        async move {
            store
                .try_take_model_slot(&slot(&model, tenant, holder, lease))
                .await
                .expect("redis answers")
        }
    };

    // acme fills the model (limit 2); globex has to wait.
    assert_eq!(take("acme", "a1").await, Admission::Admitted);
    assert_eq!(take("acme", "a2").await, Admission::Admitted);
    assert_eq!(take("acme", "a3").await, Admission::SlotsTaken);
    assert_eq!(take("globex", "g1").await, Admission::SlotsTaken);

    // A slot frees: acme holds its fair share (1 of 2) while globex waits, so globex gets it.
    store
        .release_model_slot(&model, "acme", "a1")
        .await
        .expect("released");
    assert_eq!(take("acme", "a3").await, Admission::SlotsTaken);
    assert_eq!(take("globex", "g1").await, Admission::Admitted);
    assert_eq!(take("acme", "a3").await, Admission::SlotsTaken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_of_a_holder_that_stopped_renewing_frees_itself() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let model = unique("m");
    let short = Duration::from_millis(300);
    let full = SlotRequest {
        limit: 1,
        ..slot(&model, "acme", "gone", short)
    };
    assert_eq!(
        store.try_take_model_slot(&full).await.expect("redis"),
        Admission::Admitted
    );
    let next = SlotRequest {
        limit: 1,
        ..slot(&model, "acme", "next", Duration::from_secs(60))
    };
    assert_eq!(
        store.try_take_model_slot(&next).await.expect("redis"),
        Admission::SlotsTaken
    );

    // Nobody releases the first slot: its lease runs out and the next caller gets it.
    eventually(
        "the dead holder's slot is free",
        Duration::from_secs(20),
        || {
            let (store, next) = (store.clone(), next.clone());
            async move {
                let admission = store.try_take_model_slot(&next).await.ok()?;
                (admission == Admission::Admitted).then_some(())
            }
        },
    )
    .await;
    assert!(!store
        .renew_model_slot(&model, "acme", "gone", short)
        .await
        .expect("redis"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_is_admitted_once_the_minutes_tokens_are_spent() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    loop {
        let model = unique("m");
        let budget = SlotRequest {
            limit: 0,
            tokens_per_minute: 100,
            ..slot(&model, "acme", "h1", Duration::from_secs(60))
        };
        let minute = current_minute();
        let before = store.try_take_model_slot(&budget).await.expect("redis");
        store
            .count_model_tokens(&model, 100)
            .await
            .expect("counted");
        let after = store.try_take_model_slot(&budget).await.expect("redis");
        if current_minute() != minute {
            continue; // The minute turned between the asks: its count started again.
        }
        assert_eq!(before, Admission::Admitted);
        assert_eq!(after, Admission::TokensSpent);
        break;
    }
}
