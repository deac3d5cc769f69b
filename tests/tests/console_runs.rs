//! A run in the console, in a real headless Chromium (WebDriver) against a real cluster: a person
//! starts a run from the runs view and sees it appear; its view shows the plan as a graph of
//! steps, every model and tool call with the worker that ran it, how long it took and how often
//! it was delivered, the tree of runs and the tokens; a fork made there is a new session; a
//! replay made there runs the turn again with its tool call answered from the record (the
//! effect is not repeated). On a run that waits for a person, every action is reached with the
//! keyboard, a steer and a pause are taken, and a cancel ends it. The run API refuses keys
//! without the role an action takes, unknown actions and runs, and bad bodies.

// The browser-driving tests are long async functions whose future types nest deeply.
#![recursion_limit = "256"]

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_tests::support::browser::Browser;
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{
    error_of, gateway_with_lead, guarded_gateway, start_gateway, OPERATOR_KEY, OTHER_TENANT_KEY,
    READ_ONLY_KEY, SUBMIT_AND_APPROVE_KEY,
};
use skein_tests::support::otlp::OtlpReceiver;
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique, ChildProcess};

/// WebDriver's Tab key.
const TAB: &str = "\u{E004}";

/// What the focused element is called: its id, else its accessible name, else its text.
async fn focused(browser: &Browser) -> String {
    browser
        .execute(
            "const e = document.activeElement; return e.id || e.getAttribute('aria-label') || e.textContent;",
            json!([]),
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Presses Tab from the top of the page `times` times; what each press reached.
async fn tab_through(browser: &Browser, times: usize) -> Vec<String> {
    browser.execute("document.body.focus();", json!([])).await;
    let mut reached = Vec::new();
    for _ in 0..times {
        browser.press(TAB).await;
        reached.push(focused(browser).await);
    }
    reached
}

/// A gateway over a lead whose planning `assistant` writes a two-step plan (the second after the
/// first), calls `slow_effect` keyed by the run's input, and answers.
async fn planning_console(cluster: &TestCluster) -> String {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\nplanning = true\n+++\nPlan, then act.\n",
    )
    .expect("AGENTS.md written");
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "update_plan", "arguments": { "explanation": "look, then act", "plan": [
            { "id": "look", "step": "Look around", "status": "completed" },
            { "id": "act", "step": "Make the change", "status": "in_progress", "after": ["look"] }
        ] } } ] },
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
        { "answer": "done: {{observations}}" }
    ] }]));
    let agents = agents.to_str().expect("utf-8 path");
    let addr = gateway_with_lead(
        cluster,
        &["--scenario", &script, "--agents-dir", agents],
        &["--agents-dir", agents],
    )
    .await;
    format!("http://{addr}")
}

/// Starts a run of `assistant` with `input` through the console's API as `key`'s principal; its
/// task id and the answer (with its session).
async fn start_run(base: &str, key: &str, input: &str) -> (String, Value) {
    let started: Value = reqwest::Client::new()
        .post(format!("{base}/console/api/runs"))
        .bearer_auth(key)
        .json(&json!({ "agent": "assistant", "input": input }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("a run");
    let task = started["task_id"].as_str().expect("a task id").to_owned();
    (task, started)
}

/// The calls table's row for `tool`: (worker, took, attempts, outcome).
async fn call_row(browser: &Browser, tool: &str) -> (String, String, String, String) {
    browser
        .wait_for_text("#run-call-rows tr[data-kind='tool']", tool)
        .await;
    let cells = browser
        .execute(
            "return [...document.querySelectorAll(\"#run-call-rows tr[data-kind='tool']\")]
               .filter(r => r.textContent.includes(arguments[0]))
               .map(r => [...r.children].map(c => c.textContent))[0];",
            json!([tool]),
        )
        .await;
    let cell = |i: usize| cells[i].as_str().unwrap_or_default().to_owned();
    (cell(2), cell(3), cell(4), cell(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_in_the_console_shows_its_plan_and_calls_and_replays_without_repeating_its_effect(
) {
    let cluster = TestCluster::start();
    let base = planning_console(&cluster).await;
    let browser = Browser::start(&cluster.dir).await;
    browser
        .sign_in(&format!("{base}/console#runs"), OPERATOR_KEY)
        .await;

    // Started from the runs view; it appears in the list by itself.
    browser
        .click(&browser.wait_for("#new-run summary").await)
        .await;
    browser.wait_for("#new-run-agent option").await;
    let input = browser.wait_for("#new-run-input").await;
    browser.type_into(&input, "console-change").await;
    browser
        .click(&browser.wait_for("#new-run-start").await)
        .await;
    let (_, said) = browser.wait_for_text("#status", "Started run").await;
    let task = said
        .trim_start_matches("Started run ")
        .split_whitespace()
        .next()
        .expect("the run's id")
        .to_owned();
    let link = browser
        .wait_for(&format!("#runs-rows tr[data-task='{task}'] a"))
        .await;

    // Its view: the plan as a graph, the calls with their workers, the runs and the tokens.
    browser.click(&link).await;
    let (_, ended) = browser
        .wait_for_text("#run-events li[data-kind='final']", "completed")
        .await;
    assert!(ended.contains("effect console-change done"), "{ended}");
    let columns = browser.find_all("#run-plan-graph .plan-column").await;
    assert_eq!(columns.len(), 2, "the second step stands after the first");
    let (_, act) = browser
        .wait_for_text(
            "#run-plan-graph .plan-column:last-child .step",
            "Make the change",
        )
        .await;
    assert!(act.contains("after look"), "{act}");
    let (worker, took, attempts, outcome) = call_row(&browser, "slow_effect").await;
    assert!(
        !worker.is_empty() && worker != "record",
        "the worker that ran it: {worker:?}"
    );
    assert!(took.ends_with("ms") || took.ends_with(" s"), "{took:?}");
    assert_eq!(attempts, "1", "delivered once");
    assert_eq!(outcome, "ok");
    assert!(
        !browser
            .find_all("#run-call-rows tr[data-kind='model']")
            .await
            .is_empty(),
        "the model's calls are rows too"
    );
    browser.wait_for("#run-tree li[data-source='lead']").await;
    let (_, facts) = browser.wait_for_text("#run-facts", "Turn in session").await;
    assert!(facts.contains("Tokens"), "{facts}");
    assert!(
        facts.contains("Turn in session\n1 (3 steps, 2 calls)"),
        "{facts}"
    );
    browser.screenshot_for_docs("run").await;

    // An ended run offers fork and replay, reached with the keyboard; not cancel.
    browser.wait_for("#run-replay:not([disabled])").await;
    assert_eq!(
        browser
            .property(&browser.wait_for("#run-cancel").await, "disabled")
            .await,
        json!(true)
    );
    let reached = tab_through(&browser, 30).await;
    for action in ["run-fork-at", "run-fork", "run-replay"] {
        assert!(
            reached.iter().any(|r| r == action),
            "{action} is not reached by Tab: {reached:?}"
        );
    }

    // A fork after the turn is a new session with the turn's history.
    let at = browser.wait_for("#run-fork-at").await;
    browser.type_into(&at, "1").await;
    browser.click(&browser.wait_for("#run-fork").await).await;
    let (_, forked) = browser.wait_for_text("#status", "Forked at 1").await;
    let fork = forked
        .split("into session ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the fork's session")
        .to_owned();
    let session = cluster
        .store()
        .await
        .load("acme", &fork)
        .await
        .expect("the fork loads");
    assert_eq!(
        session.state.history.first().map(|m| m.content.clone()),
        Some("console-change".to_owned()),
        "the fork holds the turn"
    );

    // A replay runs the turn again in its own session; its call is answered from the record.
    browser.click(&browser.wait_for("#run-replay").await).await;
    browser.wait_for_text("#run-title", "Run replay-").await;
    let (_, ended) = browser
        .wait_for_text("#run-events li[data-kind='final']", "completed")
        .await;
    assert!(ended.contains("effect console-change done"), "{ended}");
    let (worker, ..) = call_row(&browser, "slow_effect").await;
    assert_eq!(worker, "record", "answered from the record");
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("console-change")
            .map(|c| c.started),
        Some(1),
        "the effect ran once, not again on replay"
    );
    browser.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_is_steered_paused_and_cancelled_from_its_view_by_keyboard_reachable_actions()
{
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let base = format!("http://{}", guarded_gateway(&cluster, &script).await);
    let (task, started) = start_run(&base, SUBMIT_AND_APPROVE_KEY, "guarded-change").await;

    let browser = Browser::start(&cluster.dir).await;
    browser
        .sign_in(&format!("{base}/console#run/{task}"), OPERATOR_KEY)
        .await;
    browser
        .wait_for_text("#run-waiting-calls li", "slow_effect")
        .await;
    browser.wait_for("#run-cancel:not([disabled])").await;
    let reached = tab_through(&browser, 30).await;
    for action in [
        "run-cancel",
        "run-pause",
        "run-resume",
        "run-steer-text",
        "run-steer",
        "Reason for slow_effect",
        "Approve slow_effect in this run",
        "Deny slow_effect in this run",
    ] {
        assert!(
            reached.iter().any(|r| r == action),
            "{action} is not reached by Tab: {reached:?}"
        );
    }

    let steer = browser.wait_for("#run-steer-text").await;
    browser.type_into(&steer, "mind the weekend freeze").await;
    browser.click(&browser.wait_for("#run-steer").await).await;
    browser.wait_for_text("#status", "Steer message sent").await;
    browser.click(&browser.wait_for("#run-pause").await).await;
    browser.wait_for_text("#status", "Pause requested").await;
    // A lead records both from the durable control stream.
    let session = started["session"].as_str().expect("a session").to_owned();
    let store = cluster.store().await;
    let asked = tokio::time::Instant::now();
    loop {
        let (controls, steers) = store
            .controls("acme", &session, &task, 0)
            .await
            .expect("the run's controls");
        if controls.paused && steers.iter().any(|s| s == "mind the weekend freeze") {
            break;
        }
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(30),
            "the pause and the steer were not recorded: {controls:?} {steers:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    browser.click(&browser.wait_for("#run-cancel").await).await;
    browser
        .wait_for_text("#run-events li[data-kind='final']", "cancelled")
        .await;
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("guarded-change")
            .map(|c| c.started),
        None,
        "the waiting call never ran"
    );
    browser.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_api_takes_each_action_only_from_a_key_with_its_role() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let base = format!("http://{}", guarded_gateway(&cluster, &script).await);
    let http = reqwest::Client::new();
    let post = |path: String, key: &'static str, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };

    // Starting takes `submit`; an unknown agent is named.
    let refused = post(
        "/console/api/runs".into(),
        READ_ONLY_KEY,
        json!({ "agent": "assistant", "input": "x" }),
    )
    .await
    .expect("sent");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let (status, body) = error_of(
        post(
            "/console/api/runs".into(),
            OPERATOR_KEY,
            json!({ "agent": "nobody", "input": "x" }),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = error_of(
        post(
            "/console/api/runs".into(),
            OPERATOR_KEY,
            json!({ "agent": "assistant" }),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.to_string().contains("input"), "{body}");

    let (task, started) = start_run(&base, SUBMIT_AND_APPROVE_KEY, "api-change").await;
    // The run shows once its turn started (it waits for a person then).
    let asked = tokio::time::Instant::now();
    let run = loop {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(30),
            "the run never waited"
        );
        let read = http
            .get(format!("{base}/console/api/runs/{task}"))
            .bearer_auth(SUBMIT_AND_APPROVE_KEY)
            .send()
            .await
            .expect("sent");
        if read.status() == StatusCode::OK {
            let run: Value = read.json().await.expect("a run");
            if run["status"] == "waiting" {
                break run;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(run["agent"], "assistant");
    assert_eq!(run["session"], started["session"]);
    assert_eq!(run["tree"]["source"], "lead");
    assert_eq!(
        run["may"],
        json!({ "submit": true, "approve": true, "operate": false })
    );

    // The list, filtered and paged by the server.
    let started_at = run["started_at_ms"].as_u64().expect("a start");
    let session = started["session"].as_str().expect("a session").to_owned();
    let listed = |query: String| {
        let http = http.clone();
        let url = format!("{base}/console/api/runs?{query}");
        async move {
            let answer = http
                .get(url)
                .bearer_auth(READ_ONLY_KEY)
                .send()
                .await
                .expect("sent");
            assert_eq!(answer.status(), StatusCode::OK, "{query}");
            let runs: Value = answer.json().await.expect("runs");
            runs["runs"]
                .as_array()
                .expect("a list")
                .iter()
                .map(|r| r["task_id"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        }
    };
    for (query, shown) in [
        ("status=waiting".to_owned(), true),
        ("status=completed".to_owned(), false),
        ("agent=assistant".to_owned(), true),
        ("agent=nobody".to_owned(), false),
        (format!("session={session}"), true),
        ("session=another".to_owned(), false),
        (format!("before={started_at}"), false),
        (format!("before={}", started_at + 1), true),
    ] {
        assert_eq!(
            listed(query.clone()).await.contains(&task),
            shown,
            "{query}"
        );
    }
    assert_eq!(listed("limit=1".into()).await.len(), 1);
    let bad = http
        .get(format!("{base}/console/api/runs?limit=many"))
        .bearer_auth(READ_ONLY_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    // Cancel, pause and resume take `operate`; steer, fork and replay take `submit`.
    for action in ["cancel", "pause", "resume"] {
        let refused = post(
            format!("/console/api/runs/{task}/{action}"),
            SUBMIT_AND_APPROVE_KEY,
            json!({}),
        )
        .await
        .expect("sent");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{action}");
    }
    let refused = post(
        format!("/console/api/runs/{task}/steer"),
        READ_ONLY_KEY,
        json!({ "text": "x" }),
    )
    .await
    .expect("sent");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // A fork or replay of a run that has not ended has nothing recorded yet.
    for action in ["fork", "replay"] {
        let (status, body) = error_of(
            post(
                format!("/console/api/runs/{task}/{action}"),
                SUBMIT_AND_APPROVE_KEY,
                json!({}),
            )
            .await
            .expect("sent"),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{action}: {body}");
    }
    // Unknown actions and runs, other tenants, and bad bodies.
    let (status, _) = error_of(
        post(
            format!("/console/api/runs/{task}/explode"),
            OPERATOR_KEY,
            json!({}),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = error_of(
        post(
            "/console/api/runs/no-such-run/cancel".into(),
            OPERATOR_KEY,
            json!({}),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let other = http
        .get(format!("{base}/console/api/runs/{task}"))
        .bearer_auth(OTHER_TENANT_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        other.status(),
        StatusCode::NOT_FOUND,
        "another tenant's run"
    );
    let (status, body) = error_of(
        post(
            format!("/console/api/runs/{task}/steer"),
            OPERATOR_KEY,
            json!({ "text": "  " }),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an empty steer: {body}");
    let (status, _) = error_of(
        post(
            format!("/console/api/runs/{task}/fork"),
            OPERATOR_KEY,
            json!({ "at": "one" }),
        )
        .await
        .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a fork point that is none");
    let malformed = http
        .post(format!("{base}/console/api/runs/{task}/cancel"))
        .bearer_auth(OPERATOR_KEY)
        .body("{not json")
        .send()
        .await
        .expect("sent");
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);

    // The operator's cancel ends it.
    let cancelled = post(
        format!("/console/api/runs/{task}/cancel"),
        OPERATOR_KEY,
        json!({ "reason": "not today" }),
    )
    .await
    .expect("sent");
    assert_eq!(cancelled.status(), StatusCode::OK);
    let asked = tokio::time::Instant::now();
    let ended = loop {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(30),
            "the cancelled run never ended"
        );
        let run: Value = http
            .get(format!("{base}/console/api/runs/{task}"))
            .bearer_auth(OPERATOR_KEY)
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("a run");
        if run["status"] != "waiting" && run["status"] != "running" {
            break run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["final"]["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_run_links_to_its_trace_in_jaeger() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let script = cluster.scenario(json!([{ "steps": [ { "answer": "traced" } ] }]));
    let mut lead = std::process::Command::new(env!("CARGO_BIN_EXE_skein-node"));
    lead.args(cluster.process_args("lead"))
        .args(["--scenario", &script])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint);
    let _lead = ChildProcess::spawn(lead, cluster.dir.join("traced-lead.log"));
    let jaeger = "http://jaeger.example:16686/";
    let base = format!(
        "http://{}",
        start_gateway(&cluster, &["--jaeger-url", jaeger]).await
    );
    let http = reqwest::Client::new();
    let (task, _) = start_run(&base, OPERATOR_KEY, "trace me").await;
    let run = eventually("the traced run ended", Duration::from_secs(30), || async {
        let run: Value = http
            .get(format!("{base}/console/api/runs/{task}"))
            .bearer_auth(OPERATOR_KEY)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (run["status"] == "completed").then_some(run)
    })
    .await;
    let trace_id = run["trace_id"].as_str().expect("the turn's trace id");
    assert!(
        trace_id.len() == 32 && trace_id.chars().all(|c| c.is_ascii_hexdigit()),
        "{trace_id}"
    );
    assert_eq!(
        run["trace_url"],
        format!("http://jaeger.example:16686/trace/{trace_id}")
    );
}
