//! Spending budgets against real NATS and Redis, with the fake OpenAI-compatible server as the
//! model: a task's token and cost budgets stop its turn before the call that would go over (and
//! that call never reaches the model), a subagent draws from its parent's budget and is held to
//! its own, a tenant's daily
//! budget holds across leads, a failed model call gives back what it reserved, and spending is a
//! metric and an attribute of the `chat` span.
//!
//! Most cases price only output tokens, at $1 each, with a worst case of a few output tokens: a
//! call's worst cost is then exact whatever its prompt, and every fake answer (7 completion
//! tokens) costs $7.

use std::time::Duration;

use serde_json::json;
use skein_common::protocol::{Budget, BudgetScope, FailureKind, Spent, TurnStatus};
use skein_common::store::budget::{Hold, Ledger, LedgerLimits, LedgerName, Reservation};
use skein_common::store::SessionStore;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::otlp::OtlpReceiver;
use skein_tests::support::{eventually, free_port, unique, ChildProcess, FakeOpenAi, FakeReply};
use tokio_util::sync::CancellationToken;

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// $1 per output token, input free, for every model.
const OUTPUT_AT_A_DOLLAR: &str =
    r#"{"*": {"input_per_million": 0, "output_per_million": 1000000}}"#;
/// What each fake answer costs at [`OUTPUT_AT_A_DOLLAR`]: its 7 completion tokens.
const ANSWER_COST: f64 = 7.0;
/// Tokens of each fake answer, prompt and completion.
const ANSWER_TOKENS: u64 = 18;

/// Model flags for the fake server, priced at [`OUTPUT_AT_A_DOLLAR`], with `max_output` as each
/// call's worst-case answer.
fn priced(model: &FakeOpenAi, max_output: &str) -> Vec<String> {
    let mut flags: Vec<String> = model_flags(&model.base_url)
        .iter()
        .map(|s| s.to_string())
        .collect();
    flags.extend(
        [
            "--model-prices",
            OUTPUT_AT_A_DOLLAR,
            "--model-max-output-tokens",
            max_output,
        ]
        .map(str::to_owned),
    );
    flags
}

fn refs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

fn budget(tokens: Option<u64>, usd: Option<f64>) -> Option<Budget> {
    Some(Budget {
        max_total_tokens: tokens,
        max_cost_usd: usd,
    })
}

/// The ledger of `task_id` of `session` (the limits do not matter for reading it).
fn task_ledger(tenant: &str, session: &str, task_id: &str) -> Ledger {
    let scope = BudgetScope {
        task_id: task_id.into(),
        session: session.into(),
        limits: Budget::default(),
    };
    Ledger::task(tenant, &scope)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_stops_the_turn_before_the_call_that_would_exceed_it() {
    let cluster = TestCluster::start();
    // The first answer asks for a call with 40 KB of arguments: the second request carries them,
    // so its worst case (over 10,000 tokens) cannot fit the budget the first one fits.
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("no_such_tool", json!({ "text": "x".repeat(40_000) })),
        FakeReply::answer("never sent"),
    ])
    .await;
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--model-max-output-tokens", "100"]);
    cluster.start_nodes(0, &flags).await;

    let session = unique("s");
    let mut task = submission("acme", &session, "look it up");
    task.budget = budget(Some(5_000), None);
    let (result, _) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::BudgetExhausted, "{result:?}");
    assert_eq!(model.arrived(), 1, "the call over budget reached the model");
    assert_eq!(result.iterations, 1);
    assert_eq!(
        result.spent,
        Some(Spent {
            tokens: ANSWER_TOKENS,
            cost_usd: 0.0
        })
    );
    let failure = result.failure.as_ref().expect("a budget failure");
    assert_eq!(failure.kind, FailureKind::BudgetExhausted);
    let answer = result
        .answer
        .as_deref()
        .expect("an answer saying what was spent");
    assert!(
        answer.contains(&format!(
            "{ANSWER_TOKENS} tokens and $0.00 spent of 5000 tokens"
        )),
        "{answer}"
    );

    // The turn's work is kept: the session holds its messages, the answer last.
    let store = cluster.store().await;
    let loaded = store.load("acme", &session).await.expect("session loads");
    let history = &loaded.state.history;
    assert_eq!(history.len(), 4, "{history:?}");
    assert_eq!(history[3].content, answer);
    // Nothing stays held once the turn ended.
    let ledger = store
        .budget_ledger(&task_ledger("acme", &session, &task.task_id))
        .await
        .expect("ledger reads");
    assert_eq!(ledger.held_tokens, 0);
    assert_eq!(ledger.spent_tokens, ANSWER_TOKENS);
}

/// Runs a task with a cost budget of `max_cost_usd` whose model first asks for a tool, then
/// answers; returns its result and how many requests reached the model.
async fn tool_then_answer_under(max_cost_usd: f64) -> (skein_common::protocol::FinalResult, usize) {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("no_such_tool", json!({})),
        FakeReply::answer("done"),
    ])
    .await;
    let flags = priced(&model, "10");
    cluster.start_nodes(0, &refs(&flags)).await;

    let mut task = submission("acme", &unique("s"), "go");
    task.budget = budget(None, Some(max_cost_usd));
    let (result, _) = cluster.run(&task).await;
    (result, model.arrived())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_budget_at_the_configured_prices_stops_the_call_that_would_exceed_it() {
    // Each call may cost up to $10 (10 output tokens) and costs $7. The second call needs
    // $7 spent + $10: over a $16 budget, within a $17 one.
    let (stopped, arrived) = tool_then_answer_under(16.0).await;
    assert_eq!(stopped.status, TurnStatus::BudgetExhausted, "{stopped:?}");
    assert_eq!(arrived, 1);
    assert_eq!(
        stopped.spent,
        Some(Spent {
            tokens: ANSWER_TOKENS,
            cost_usd: ANSWER_COST
        })
    );
    let answer = stopped.answer.as_deref().unwrap_or_default();
    assert!(answer.contains("$7.00 spent of $16.00"), "{answer}");
    assert!(answer.contains("over its cost limit"), "{answer}");

    let (completed, arrived) = tool_then_answer_under(17.0).await;
    assert_eq!(completed.status, TurnStatus::Completed, "{completed:?}");
    assert_eq!(completed.answer.as_deref(), Some("done"));
    assert_eq!(arrived, 2);
    assert_eq!(
        completed.spent,
        Some(Spent {
            tokens: 2 * ANSWER_TOKENS,
            cost_usd: 2.0 * ANSWER_COST
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_draws_from_its_parents_budget() {
    let cluster = TestCluster::start();
    // The lead's first call spawns the researcher (on the worker), whose call answers; the
    // lead's second call would then need $14 spent + $10, over $20. Had the child not drawn from
    // the parent's budget, $7 + $10 would fit and the turn would complete.
    let model = FakeOpenAi::start(vec![
        FakeReply::tool(
            "spawn_agent",
            json!({ "agent": "researcher", "task": "find it" }),
        ),
        FakeReply::answer("found it"),
        FakeReply::answer("never sent"),
    ])
    .await;
    let flags = priced(&model, "10");
    cluster.spawn_worker(cluster.worker_config(&refs(&flags)));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&refs(&flags)));

    let mut task = submission("acme", &unique("s"), "research this");
    task.budget = budget(None, Some(20.0));
    let (result, events) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::BudgetExhausted, "{result:?}");
    assert_eq!(model.arrived(), 2);
    let child_answered = events.iter().any(|e| {
        matches!(&e.event, skein_common::protocol::EventKind::ToolFinished { tool, ok: true, .. } if tool == "spawn_agent")
    });
    assert!(child_answered, "the subagent ran: {events:?}");
    assert_eq!(
        result.spent,
        Some(Spent {
            tokens: 2 * ANSWER_TOKENS,
            cost_usd: 2.0 * ANSWER_COST
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_is_held_to_its_own_budget_and_its_caller_goes_on() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\nsubagents = [\"researcher\"]\n+++\nDelegate.\n",
    )
    .expect("written");
    // A call's worst case is $10: the researcher's first call fits its own $10, its second
    // (after $7 spent) does not. The task itself has no budget.
    std::fs::write(
        agents.join("subagents/researcher.md"),
        "+++\nname = \"researcher\"\ndescription = \"finds\"\n[budget]\nmax_cost_usd = 10\n+++\nFind.\n",
    )
    .expect("written");
    let model = FakeOpenAi::start(vec![
        FakeReply::tool(
            "spawn_agent",
            json!({ "agent": "researcher", "task": "find it" }),
        ),
        FakeReply::tool("list_files", json!({ "path": "." })),
        FakeReply::answer("done without it"),
    ])
    .await;
    let flags = priced(&model, "10");
    cluster.spawn_worker(cluster.worker_config(&refs(&flags)));
    cluster.wait_for_workers(1).await;
    let mut lead_flags = refs(&flags);
    let agents = agents.display().to_string();
    lead_flags.extend(["--agents-dir", &agents]);
    cluster.spawn_lead(cluster.lead_config(&lead_flags));

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "research this"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("done without it"));
    assert_eq!(
        model.arrived(),
        3,
        "the subagent's second call never reached the model"
    );
    let refused = events.iter().find_map(|e| match &e.event {
        skein_common::protocol::EventKind::ToolFinished {
            tool,
            ok: false,
            preview,
            ..
        } if tool == "spawn_agent" => Some(preview.clone()),
        _ => None,
    });
    let refused = refused.expect("the subagent's call failed");
    assert!(refused.contains("budget_exhausted"), "{refused}");
}

/// Runs a lead until `stop` is cancelled; returns its task.
fn lead(
    cluster: &TestCluster,
    flags: &[String],
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut flags = refs(flags);
    flags.extend(["--grace", "1s"]);
    let cfg = cluster.lead_config(&flags);
    tokio::spawn(async move {
        if let Err(e) = skein_lead::run(cfg, stop).await {
            panic!("lead failed: {e}");
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_daily_budget_holds_across_leads() {
    let cluster = TestCluster::start();
    let model =
        FakeOpenAi::start(vec![FakeReply::answer("first"), FakeReply::answer("other")]).await;
    // A call may cost up to $7; acme may spend $10 a day: one call fits, a second does not.
    let mut flags = priced(&model, "7");
    flags.extend(["--tenant-daily-cost-usd".into(), "10".into()]);
    let tenant = unique("acme");

    // The first lead spends $7 of the tenant's day, then stops.
    let first_stop = cluster.shutdown_token();
    let first = lead(&cluster, &flags, first_stop.clone());
    let (result, _) = cluster.run(&submission(&tenant, &unique("s"), "one")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    first_stop.cancel();
    first.await.expect("the first lead stops");

    // Another lead knows nothing of it but the shared ledger: the tenant's next task stops.
    let _second = lead(&cluster, &flags, cluster.shutdown_token());
    let (result, _) = cluster.run(&submission(&tenant, &unique("s"), "two")).await;
    assert_eq!(result.status, TurnStatus::BudgetExhausted, "{result:?}");
    let answer = result.answer.as_deref().unwrap_or_default();
    assert!(
        answer.contains(&format!("tenant {tenant}'s budget for")),
        "{answer}"
    );
    assert!(answer.contains("$7.00 spent of $10.00"), "{answer}");
    assert_eq!(model.arrived(), 1);

    // Another tenant's day is its own.
    let (result, _) = cluster
        .run(&submission(&unique("globex"), &unique("s"), "three"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(model.arrived(), 2);
    let store = cluster.store().await;
    let day = store
        .budget_ledger(&Ledger::tenant_today(&tenant, LedgerLimits::default()))
        .await
        .expect("ledger reads");
    assert_eq!(day.spent_cost_nanos, 7_000_000_000);
    assert_eq!(day.held_tokens, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_model_call_gives_back_its_reservation() {
    let cluster = TestCluster::start();
    // One attempt the server fails for good; in the next task, one it fails for a while (tried
    // again) before it answers.
    let model = FakeOpenAi::start(vec![
        FakeReply::Status(400, r#"{"error":{"message":"bad request"}}"#.into()),
        FakeReply::Status(500, r#"{"error":{"message":"try again"}}"#.into()),
        FakeReply::answer("fine"),
    ])
    .await;
    let mut flags = priced(&model, "10");
    flags.extend(["--tenant-daily-tokens".into(), "1000000".into()]);
    cluster.start_nodes(0, &refs(&flags)).await;
    let store = cluster.store().await;
    let tenant = unique("acme");
    let held = |store: SessionStore, ledger: Ledger| async move {
        store.budget_ledger(&ledger).await.expect("ledger reads")
    };

    let session = unique("s");
    let mut failing = submission(&tenant, &session, "go");
    failing.budget = budget(Some(1_000_000), Some(100.0));
    let (result, _) = cluster.run(&failing).await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    assert_eq!(
        result.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::ModelFailed)
    );
    assert_eq!(result.spent, Some(Spent::default()));
    let ledger = held(
        store.clone(),
        task_ledger(&tenant, &session, &failing.task_id),
    )
    .await;
    assert_eq!((ledger.held_tokens, ledger.held_cost_nanos), (0, 0));
    let day = held(
        store.clone(),
        Ledger::tenant_today(&tenant, LedgerLimits::default()),
    )
    .await;
    assert_eq!((day.held_tokens, day.spent_tokens), (0, 0));

    let mut retried = submission(&tenant, &session, "again");
    retried.budget = budget(Some(1_000_000), Some(100.0));
    let (result, _) = cluster.run(&retried).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(model.arrived(), 3);
    // Only the attempt that answered counts.
    assert_eq!(
        result.spent,
        Some(Spent {
            tokens: ANSWER_TOKENS,
            cost_usd: ANSWER_COST
        })
    );
    let day = held(
        store,
        Ledger::tenant_today(&tenant, LedgerLimits::default()),
    )
    .await;
    assert_eq!((day.held_tokens, day.spent_tokens), (0, ANSWER_TOKENS));
}

fn hold(id: &str, tokens: u64, lease: Duration) -> Hold {
    Hold {
        id: id.into(),
        tokens,
        cost_nanos: 0,
        lease,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_counts_what_is_held_and_gives_back_what_lapses() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let ledger = Ledger {
        name: LedgerName::TenantDay {
            tenant: unique("acme"),
            day: "2030-01-02".into(),
        },
        limits: LedgerLimits {
            tokens: 100,
            cost_nanos: 0,
        },
    };
    let long = Duration::from_secs(60);

    // What is held counts: a second call cannot take what the first holds.
    let first = hold("a", 60, long);
    assert_eq!(
        store.reserve_budget(&ledger, &first).await.expect("redis"),
        Reservation::Held
    );
    let second = hold("b", 60, long);
    let refused = store.reserve_budget(&ledger, &second).await.expect("redis");
    assert!(
        matches!(refused, Reservation::Refused { over_tokens: true, over_cost: false, ledger } if ledger.held_tokens == 60),
        "{refused:?}"
    );
    // Settled for less than its worst case, the first gives back the rest.
    let spent = store
        .settle_budget(&ledger, &first, 30, 0)
        .await
        .expect("redis");
    assert_eq!(spent.tokens, 30);
    assert_eq!(
        store.reserve_budget(&ledger, &second).await.expect("redis"),
        Reservation::Held
    );
    // Given back unused, the second leaves only the first's use.
    store
        .settle_budget(&ledger, &second, 0, 0)
        .await
        .expect("redis");
    let state = store.budget_ledger(&ledger).await.expect("redis");
    assert_eq!((state.spent_tokens, state.held_tokens), (30, 0));

    // A holder that never settles: its hold lapses and the next reservation gets it back.
    let short = hold("gone", 70, Duration::from_millis(300));
    assert_eq!(
        store.reserve_budget(&ledger, &short).await.expect("redis"),
        Reservation::Held
    );
    let next = hold("next", 70, long);
    assert!(matches!(
        store.reserve_budget(&ledger, &next).await.expect("redis"),
        Reservation::Refused { .. }
    ));
    eventually(
        "the lapsed hold is given back",
        Duration::from_secs(20),
        || {
            let (store, ledger, next) = (store.clone(), ledger.clone(), next.clone());
            async move {
                let answer = store.reserve_budget(&ledger, &next).await.ok()?;
                (answer == Reservation::Held).then_some(())
            }
        },
    )
    .await;
    let state = store.budget_ledger(&ledger).await.expect("redis");
    assert_eq!((state.spent_tokens, state.held_tokens), (30, 70));
}

/// A reservation whose script runs twice (a request retried after its reply was lost) is held
/// once, so settling it gives back all it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_made_twice_is_held_once() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let ledger = Ledger {
        name: LedgerName::TenantDay {
            tenant: unique("acme"),
            day: "2030-01-02".into(),
        },
        limits: LedgerLimits {
            tokens: 100,
            cost_nanos: 0,
        },
    };
    let once = hold("retried", 60, Duration::from_secs(60));
    for _ in 0..2 {
        assert_eq!(
            store.reserve_budget(&ledger, &once).await.expect("redis"),
            Reservation::Held
        );
    }
    let state = store.budget_ledger(&ledger).await.expect("redis");
    assert_eq!(state.held_tokens, 60);
    store
        .settle_budget(&ledger, &once, 10, 0)
        .await
        .expect("redis");
    let state = store.budget_ledger(&ledger).await.expect("redis");
    assert_eq!((state.spent_tokens, state.held_tokens), (10, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spending_is_a_metric_and_an_attribute_of_the_chat_span() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let model = FakeOpenAi::start(vec![FakeReply::answer("priced")]).await;
    let admin = format!("127.0.0.1:{}", free_port());
    let mut args = cluster.process_args("lead");
    let at = args
        .iter()
        .position(|a| a == "--admin-addr")
        .expect("process args name an admin address");
    args[at + 1] = admin.clone();
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(args)
        .args(priced(&model, "10"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let _lead = ChildProcess::spawn(cmd, cluster.dir.join("lead.log"));

    let tenant = unique("acme");
    let (result, _) = cluster
        .run(&submission(&tenant, &unique("s"), "what does it cost"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let trace_id = result.trace_id.clone().expect("the result names its trace");

    let chat = eventually("the chat span", Duration::from_secs(30), || {
        let spans = receiver.spans();
        let trace_id = trace_id.clone();
        async move {
            spans
                .into_iter()
                .find(|s| s.trace_id == trace_id && s.name.starts_with("chat "))
        }
    })
    .await;
    assert_eq!(
        chat.attributes
            .get("skein.spent.tokens")
            .map(String::as_str),
        Some("18"),
        "{:?}",
        chat.attributes
    );
    assert_eq!(
        chat.attributes
            .get("skein.spent.cost_usd")
            .map(String::as_str),
        Some("7"),
        "{:?}",
        chat.attributes
    );

    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let value = |name: &str| -> f64 {
        let series = format!("{name}{{tenant=\"{tenant}\",model=\"gpt-4o-mini\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {series:?} in:\n{metrics}"))
    };
    assert_eq!(value("skein_model_spend_tokens_total"), 18.0);
    assert_eq!(value("skein_model_spend_usd_total"), ANSWER_COST);
}
