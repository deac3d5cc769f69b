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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_falls_back_to_its_next_model_when_its_model_fails() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nmodel = \"primary-model\"\nfallback_models = [\"backup-model\", \"last-model\"]\n+++\nYou help.\n",
    )
    .expect("AGENTS.md written");
    let model = FakeOpenAi::start(vec![
        FakeReply::Status(404, r#"{"error": {"message": "model not found"}}"#.into()),
        FakeReply::answer("answered by the backup"),
    ])
    .await;
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--agents-dir", agents.to_str().expect("utf-8 path")]);
    cluster.start_nodes(0, &flags).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("answered by the backup"));
    let asked: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(asked, ["primary-model", "backup-model"]);
}

fn slot<'a>(model: &'a str, tenant: &'a str, holder: &'a str, lease: Duration) -> SlotRequest<'a> {
    SlotRequest {
        model,
        tenant,
        holder,
        limit: 2,
        tokens_per_minute: 0,
        tenant_limit: 0,
        tenant_tokens_per_minute: 0,
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
            .count_model_tokens(&model, "acme", 100)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_goes_to_the_tenant_that_waited_not_the_one_asking_again_at_once() {
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
    // Three tenants, two slots: acme and globex hold one each, initech waits.
    assert_eq!(take("acme", "a1").await, Admission::Admitted);
    assert_eq!(take("globex", "g1").await, Admission::Admitted);
    assert_eq!(take("initech", "i1").await, Admission::SlotsTaken);
    for round in 0..3 {
        // acme's call ends and acme asks again at once: the slot is initech's, who waited.
        store
            .release_model_slot(&model, "acme", if round == 0 { "a1" } else { "a2" })
            .await
            .expect("released");
        assert_eq!(
            take("acme", "a2").await,
            Admission::SlotsTaken,
            "round {round}"
        );
        assert_eq!(
            take("initech", "i1").await,
            Admission::Admitted,
            "round {round}"
        );
        // initech's call ends; acme has waited since: the slot is acme's.
        store
            .release_model_slot(&model, "initech", "i1")
            .await
            .expect("released");
        assert_eq!(
            take("initech", "i1").await,
            Admission::SlotsTaken,
            "round {round}"
        );
        assert_eq!(
            take("acme", "a2").await,
            Admission::Admitted,
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_held_to_its_own_limits_on_a_model_others_still_use() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let model: &'static str = Box::leak(unique("m").into_boxed_str());
    let capped = |tenant: &'static str, holder: &'static str| SlotRequest {
        limit: 4,
        tenant_limit: if tenant == "acme" { 1 } else { 0 },
        tenant_tokens_per_minute: if tenant == "acme" { 100 } else { 0 },
        ..slot(model, tenant, holder, Duration::from_secs(60))
    };
    let take = |request: SlotRequest<'static>| {
        let store = store.clone();
        async move { store.try_take_model_slot(&request).await.expect("redis") }
    };
    assert_eq!(take(capped("acme", "a1")).await, Admission::Admitted);
    assert_eq!(take(capped("acme", "a2")).await, Admission::SlotsTaken);
    // acme is not waiting for the model, only for itself: globex is not held back.
    assert_eq!(take(capped("globex", "g1")).await, Admission::Admitted);
    assert_eq!(take(capped("globex", "g2")).await, Admission::Admitted);
    assert_eq!(take(capped("globex", "g3")).await, Admission::Admitted);
    store
        .release_model_slot(model, "acme", "a1")
        .await
        .expect("released");
    loop {
        let minute = current_minute();
        store
            .count_model_tokens(model, "acme", 100)
            .await
            .expect("counted");
        let acme = take(capped("acme", "a2")).await;
        let globex = take(capped("globex", "g4")).await;
        if current_minute() != minute {
            continue;
        }
        assert_eq!(acme, Admission::TokensSpent, "acme spent its minute");
        assert_eq!(globex, Admission::Admitted, "globex has its own");
        break;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_file_caps_a_tenant_across_two_leads() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("done"); 6]).await;
    let gate = model.hold();
    let limits = cluster.dir.join("limits.toml");
    std::fs::write(&limits, "[tenants.acme]\nmax_concurrency = 1\n").expect("limits written");
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--model-limits", limits.to_str().expect("utf-8 path")]);
    cluster.spawn_lead(cluster.lead_config(&flags));
    cluster.spawn_lead(cluster.lead_config(&flags));

    let tasks: Vec<_> = (0..6)
        .map(|i| submission("acme", &unique("s"), &format!("question {i}")))
        .collect();
    let runs = tokio::spawn(async move {
        let results = run_all(&cluster, &tasks).await;
        (cluster, results)
    });
    eventually("a model call in flight", Duration::from_secs(30), || {
        let arrived = model.arrived();
        async move { (arrived >= 1).then_some(()) }
    })
    .await;
    // Time for the others to get in, were they let: they are not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(model.arrived(), 1);
    gate.add_permits(1000);
    let (_cluster, results) = runs.await.expect("the runs finish");
    for (result, _) in &results {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    }
    assert_eq!(model.arrived(), 6);
    assert_eq!(model.most_in_flight(), 1);
}
