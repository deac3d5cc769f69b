//! The web console in a real headless Chromium (WebDriver) against a real cluster whose agent asks
//! a person before its tool: a key signs in; a run that waits shows up in the approvals view by
//! itself (the live feed, no polling); approving it in place lets the run finish and the row
//! goes; the workers view lists the live worker; the runs list shows it ended and a new run
//! appears by itself; a run's view shows its events to its end, with who answered; a key without the `approve` role sees the calls
//! but cannot answer them; no script error, no request outside the gateway, and every action is
//! reached with the keyboard.

// The browser-driving tests are long async functions whose future types nest deeply.
#![recursion_limit = "256"]

use serde_json::{json, Value};
use skein_tests::support::browser::Browser;
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{
    guarded_gateway, KEY, OTHER_TENANT_KEY, SUBMIT_AND_APPROVE_KEY,
};
use skein_tests::support::test_tools::read_effects;

/// WebDriver's Tab key.
const TAB: &str = "\u{E004}";

/// A cluster whose agent asks a person before each `slow_effect` (keyed by the run's input), its
/// gateway's base URL, and a browser.
async fn guarded_console(cluster: &TestCluster) -> (String, Browser) {
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let addr = guarded_gateway(cluster, &script).await;
    (format!("http://{addr}"), Browser::start(&cluster.dir).await)
}

/// Starts a run of the agent on a new thread over the Agent Protocol; its thread and run ids.
async fn start_run(http: &reqwest::Client, base: &str, input: &str) -> (String, String) {
    let thread: Value = http
        .post(format!("{base}/threads"))
        .header("x-api-key", SUBMIT_AND_APPROVE_KEY)
        .json(&json!({}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("a thread");
    let thread = thread["thread_id"]
        .as_str()
        .expect("a thread id")
        .to_owned();
    let run: Value = http
        .post(format!("{base}/threads/{thread}/runs"))
        .header("x-api-key", SUBMIT_AND_APPROVE_KEY)
        .json(&json!({ "assistant_id": "assistant", "input": { "messages": [ { "role": "user", "content": input } ] } }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("a run");
    (thread, run["run_id"].as_str().expect("a run id").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_answers_a_waiting_call_in_the_console_and_the_run_finishes() {
    let cluster = TestCluster::start();
    let (base, browser) = guarded_console(&cluster).await;
    let console = format!("{base}/console#approvals");
    let http = reqwest::Client::new();

    browser.sign_in(&console, SUBMIT_AND_APPROVE_KEY).await;
    browser.wait_for("#approvals-empty:not([hidden])").await;
    let who = browser.text(&browser.wait_for("#who").await).await;
    assert_eq!(who, "dave · acme", "the key's proven principal");

    // A run that waits appears without the page being reloaded.
    let (thread, run) = start_run(&http, &base, "deploy-console").await;
    let row = browser.wait_for("#approvals-rows tr").await;
    let text = browser.text(&row).await;
    assert!(text.contains("slow_effect"), "{text}");
    assert!(
        text.contains("deploy-console"),
        "the arguments are shown: {text}"
    );
    assert!(
        text.contains("ask rule slow_effect"),
        "the rule that asked: {text}"
    );
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("deploy-console")
            .map(|c| c.started),
        None
    );

    // Every action is reached with the keyboard, in order.
    browser.execute("document.body.focus();", json!([])).await;
    let mut reached = Vec::new();
    for _ in 0..20 {
        browser.press(TAB).await;
        let focused = browser
            .execute(
                "const e = document.activeElement; return e.id || e.getAttribute('aria-label') || e.textContent;",
                json!([]),
            )
            .await;
        reached.push(focused.as_str().unwrap_or_default().to_owned());
    }
    for action in [
        "nav-approvals",
        "nav-workers",
        "sign-out",
        "Reason for slow_effect in task",
        "Approve slow_effect in task",
        "Deny slow_effect in task",
    ] {
        assert!(
            reached.iter().any(|r| r.starts_with(action)),
            "{action} is not reached by Tab: {reached:?}"
        );
    }

    browser.screenshot_for_docs("approvals").await;
    let reason = browser.wait_for("#approvals-rows input.reason").await;
    browser.type_into(&reason, "looks right").await;
    let approve = browser.wait_for("#approvals-rows button.approve").await;
    browser.click(&approve).await;
    browser.wait_gone("#approvals-rows tr").await;
    let status = browser.text(&browser.wait_for("#status").await).await;
    assert!(status.starts_with("Approved slow_effect"), "{status}");

    let joined: Value = http
        .get(format!("{base}/threads/{thread}/runs/{run}/join"))
        .header("x-api-key", SUBMIT_AND_APPROVE_KEY)
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("values");
    let last = joined["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(last, "observed: effect deploy-console done");
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("deploy-console")
            .map(|c| c.started),
        Some(1),
        "approved in the console, run once"
    );

    // The workers view lists the live worker and its tools.
    let workers = browser.wait_for("#nav-workers").await;
    browser.click(&workers).await;
    let worker = browser.wait_for("#workers-rows tr").await;
    let text = browser.text(&worker).await;
    assert!(text.contains("slow_effect"), "{text}");
    // Its pool's tool consumer, with nothing waiting in it now the run has ended.
    let (_, queue) = browser
        .wait_for_text("#backlog-rows tr", "skein-tools-default")
        .await;
    assert!(queue.ends_with("0\t0") || queue.ends_with("0 0"), "{queue}");
    browser.screenshot_for_docs("workers").await;

    // The runs list shows the run ended; a new run appears by itself, waiting.
    browser.click(&browser.wait_for("#nav-runs").await).await;
    let ended = browser
        .wait_for(&format!("#runs-rows tr[data-task='{run}']"))
        .await;
    let text = browser.text(&ended).await;
    assert!(text.contains("completed"), "{text}");
    assert!(text.contains(&thread), "its session: {text}");
    let (_, waiting) = start_run(&http, &base, "deploy-later").await;
    let row = browser
        .wait_for(&format!("#runs-rows tr[data-task='{waiting}']"))
        .await;
    let started = tokio::time::Instant::now();
    while !browser.text(&row).await.contains("waiting") {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the new run never showed as waiting"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    browser.screenshot_for_docs("runs").await;

    // A run's view: its events, from the turn's start to its end.
    let link = browser
        .wait_for(&format!("#runs-rows tr[data-task='{run}'] a"))
        .await;
    browser.click(&link).await;
    let last = browser.wait_for("#run-events li[data-kind='final']").await;
    assert_eq!(
        browser
            .text(&last)
            .await
            .split_once("completed: ")
            .map(|(_, a)| a.to_owned()),
        Some("observed: effect deploy-console done".to_owned())
    );
    let kinds: Vec<String> = {
        let mut kinds = Vec::new();
        for item in browser.find_all("#run-events li").await {
            kinds.push(
                browser.property(&item, "dataset").await["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
        kinds
    };
    for kind in [
        "turn_started",
        "approval_requested",
        "approval_resolved",
        "tool_started",
        "tool_finished",
        "final",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }
    let resolved = browser
        .wait_for("#run-events li[data-kind='approval_resolved']")
        .await;
    let text = browser.text(&resolved).await;
    assert!(
        text.contains("by dave") && text.contains("looks right"),
        "who answered and why: {text}"
    );

    // No script error, and nothing was asked of anyone but the gateway.
    browser.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_may_not_approve_sees_the_calls_but_cannot_answer_and_a_wrong_key_is_refused() {
    let cluster = TestCluster::start();
    let (base, browser) = guarded_console(&cluster).await;
    let console = format!("{base}/console#approvals");
    let http = reqwest::Client::new();

    browser.goto(&console).await;
    let field = browser.wait_for("#key").await;
    browser.type_into(&field, "sk-not-a-key").await;
    browser
        .click(&browser.wait_for("#sign-in-button").await)
        .await;
    let refused = browser.wait_for("#sign-in-error").await;
    let started = tokio::time::Instant::now();
    while browser.text(&refused).await.is_empty()
        && started.elapsed() < std::time::Duration::from_secs(30)
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(browser.text(&refused).await, "That key is not known.");

    // KEY may start runs but not answer calls: it sees the waiting call, its buttons disabled.
    // The run's id is its task's.
    let (_, task) = start_run(&http, &base, "deploy-readonly").await;
    browser.sign_in(&console, KEY).await;
    browser.wait_for("#approvals-rows tr").await;
    let approve = browser.wait_for("#approvals-rows button.approve").await;
    assert_eq!(
        browser.property(&approve, "disabled").await,
        json!(true),
        "a key without the approve role cannot answer"
    );
    let deny = browser.wait_for("#approvals-rows button.deny").await;
    assert_eq!(browser.property(&deny, "disabled").await, json!(true));

    // A reason half written and the focus stay when the live feed redraws the list.
    let reason = browser.wait_for("#approvals-rows input.reason").await;
    browser.type_into(&reason, "half a tho").await;
    start_run(&http, &base, "deploy-meanwhile").await;
    browser
        .wait_for_text("#approvals-rows tr:nth-child(2)", "slow_effect")
        .await;
    let kept = browser
        .execute(
            "const field = document.querySelector(`#approvals-rows tr[data-task='${arguments[0]}'] input.reason`);
             return [field.value, document.activeElement === field];",
            json!([task]),
        )
        .await;
    assert_eq!(
        kept,
        json!(["half a tho", true]),
        "the reason and the focus stay"
    );

    // Nor can it answer by asking the API directly; nor can another tenant's key (which has only
    // `submit`, and whose tenant has no such task).
    let answer = format!("{base}/console/api/approvals/{task}/answer");
    let status = http
        .post(&answer)
        .header("Authorization", format!("Bearer {KEY}"))
        .json(&json!({ "approve": true }))
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(
        status,
        reqwest::StatusCode::FORBIDDEN,
        "a key without the approve role cannot answer"
    );
    let status = http
        .post(&answer)
        .header("Authorization", format!("Bearer {OTHER_TENANT_KEY}"))
        .json(&json!({ "approve": true }))
        .send()
        .await
        .expect("sent")
        .status();
    assert!(
        matches!(
            status,
            reqwest::StatusCode::FORBIDDEN | reqwest::StatusCode::CONFLICT
        ),
        "another tenant's key cannot answer: {status}"
    );
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("deploy-readonly")
            .map(|c| c.started),
        None,
        "the call did not run"
    );
    let listed: Value = http
        .get(format!("{base}/console/api/approvals"))
        .header("Authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("the waiting calls");
    assert!(
        listed["calls"]
            .as_array()
            .is_some_and(|calls| calls.iter().any(|c| c["task_id"] == task.as_str())),
        "the call still waits: {listed}"
    );
}
