//! The console's dead letters against a real cluster: submissions set aside because state they
//! need could not be read (a stored result planted corrupt), one per tenant; a message too large
//! for its letter, kept cut; and a tool task no one can decode, which names no tenant. A key sees
//! only its tenant's letters (another tenant's answers 404, the tenantless one none); a key
//! without the `operate` role reads them but is refused a replay or removal (403); a cut letter
//! is not replayed (409); a replay runs the task to its end and the letter goes; a removal
//! removes. In a real headless Chromium an operator expands a letter, replays one with the
//! keyboard (the row goes, the task ends completed) and removes another by pressing twice, with
//! no script error.

// The browser-driving tests are long async functions whose future types nest deeply.
#![recursion_limit = "256"]

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_common::protocol::{FailureKind, TurnStatus};
use skein_common::store::keys;
use skein_tests::support::browser::Browser;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::gateway::{start_gateway, KEY, OPERATOR_KEY, OTHER_TENANT_OPERATOR_KEY};
use skein_tests::support::hostile::{letters_of, plant};
use skein_tests::support::{eventually, unique};

/// WebDriver's Enter key.
const ENTER: &str = "\u{E007}";

/// A submission of `tenant` set aside because its stored result was planted corrupt: its task id,
/// session and letter's number.
async fn set_aside(cluster: &TestCluster, tenant: &str, input: &str) -> (String, String, u64) {
    let session = unique("s");
    let task = submission(tenant, &session, input);
    let result_key = keys::final_result(tenant, &session, &task.task_id);
    plant(cluster, &["SET", &result_key, "{not json"]).await;
    let (result, _) = cluster.run(&task).await;
    assert_eq!(
        result.failure.map(|f| f.kind),
        Some(FailureKind::DeadLettered)
    );
    let letters = letters_of(cluster, &task.task_id).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    (task.task_id, session, letters[0].seq)
}

/// Letters of every kind (see the module documentation).
struct Letters {
    /// `acme`'s set-aside submission: task, session, letter.
    acme: (String, String, u64),
    globex: (String, String, u64),
    /// `acme`'s submission too large for its letter.
    cut: u64,
    /// The undecodable tool task.
    tenantless: u64,
}

/// A cluster whose agent answers `replayed: <input>`, with [`Letters`]; the base URL of
/// gateway in front of it.
async fn cluster_with_letters(cluster: &TestCluster) -> (String, Letters) {
    let script = cluster.scenario(json!([{ "steps": [ { "answer": "replayed: {{input}}" } ] }]));
    cluster.start_nodes(1, &["--scenario", &script]).await;
    let base = format!("http://{}", start_gateway(cluster, &[]).await);
    let acme = set_aside(cluster, "acme", "try again").await;
    let globex = set_aside(cluster, "globex", "theirs").await;

    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let limit = client.server_info().max_payload;
    let jetstream = async_nats::jetstream::new(client);
    let mut huge = b"{\"v\":1,\"input\":\"".to_vec();
    huge.resize(limit - 256, b'x');
    let probe = unique("huge");
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, probe.as_str());
    jetstream
        .publish_with_headers("skein.submit.acme.raw", headers, huge.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    jetstream
        .publish("skein.tool.default.read_file", "garbage".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let bus = cluster.client().await.bus().clone();
    let (cut, tenantless) = eventually("both letters", Duration::from_secs(30), || async {
        let letters = bus.dead_letters().await.ok()?;
        let cut = letters
            .iter()
            .find(|l| l.original_id.as_deref() == Some(probe.as_str()))?;
        let tenantless = letters
            .iter()
            .find(|l| l.original_subject == "skein.tool.default.read_file")?;
        Some((cut.seq, tenantless.seq))
    })
    .await;
    let letters = Letters {
        acme,
        globex,
        cut,
        tenantless,
    };
    (base, letters)
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    key: &str,
) -> (StatusCode, Value) {
    let response = http
        .request(method, url)
        .bearer_auth(key)
        .send()
        .await
        .expect("sent");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The numbers of the letters a list answer holds.
fn numbers(listed: &Value) -> Vec<u64> {
    listed["letters"]
        .as_array()
        .map(|all| all.iter().filter_map(|l| l["seq"].as_u64()).collect())
        .unwrap_or_default()
}

/// Waits until the task's stored result is `completed`; its answer.
async fn completed(cluster: &TestCluster, tenant: &str, session: &str, task_id: &str) -> String {
    let store = cluster.store().await;
    eventually(
        "the replayed task's end",
        Duration::from_secs(30),
        || async {
            let ended = store.final_result(tenant, session, task_id).await.ok()??;
            (ended.status == TurnStatus::Completed).then_some(ended.answer.unwrap_or_default())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_dead_letters_are_its_own_and_an_operator_replays_and_removes_them() {
    use reqwest::Method;
    let cluster = TestCluster::start();
    let (base, letters) = cluster_with_letters(&cluster).await;
    let http = reqwest::Client::new();
    let api = format!("{base}/console/api/dead-letters");
    let (task, session, seq) = letters.acme.clone();

    // Each key lists its tenant's letters only; the tenantless one is nobody's.
    let (status, listed) = call(&http, Method::GET, &api, KEY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(numbers(&listed), [seq, letters.cut], "{listed}");
    assert_eq!(listed["may_operate"], false);
    let row = &listed["letters"][0];
    assert_eq!(row["task_id"], task.as_str(), "{row}");
    assert_eq!(row["kind"], "submit");
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["truncated"], false);
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cannot be read")),
        "{row}"
    );
    assert_eq!(listed["letters"][1]["truncated"], true, "{listed}");
    let (_, theirs) = call(&http, Method::GET, &api, OTHER_TENANT_OPERATOR_KEY).await;
    assert_eq!(numbers(&theirs), [letters.globex.2], "{theirs}");
    assert_eq!(theirs["may_operate"], true);

    // One letter with its body; another tenant's, and the tenantless one, are not found.
    let letter = format!("{api}/{seq}");
    let (status, shown) = call(&http, Method::GET, &letter, KEY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["payload"]["task_id"], task.as_str(), "{shown}");
    assert_eq!(shown["payload"]["input"], "try again");
    let (_, cut) = call(&http, Method::GET, &format!("{api}/{}", letters.cut), KEY).await;
    assert_eq!(cut["payload"], Value::Null, "a cut body is no JSON");
    assert_eq!(cut["preview_cut"], true, "{cut}");
    assert!(cut["preview"]
        .as_str()
        .is_some_and(|p| p.starts_with("{\"v\":1,\"input\":\"xxx")));
    for method in [Method::GET, Method::DELETE] {
        let (status, _) = call(&http, method.clone(), &letter, OTHER_TENANT_OPERATOR_KEY).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} by another tenant");
        let nobodys = format!("{api}/{}", letters.tenantless);
        let (status, _) = call(&http, method.clone(), &nobodys, OPERATOR_KEY).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{method} of the tenantless letter"
        );
    }
    let replay = format!("{letter}/replay");
    let (status, _) = call(&http, Method::POST, &replay, OTHER_TENANT_OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "replay by another tenant");

    // Without `operate` a key is refused; a cut letter is not replayed; a bad number is refused.
    for (method, url) in [(Method::POST, &replay), (Method::DELETE, &letter)] {
        let (status, _) = call(&http, method.clone(), url, KEY).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {url}");
    }
    let cut_replay = format!("{api}/{}/replay", letters.cut);
    let (status, refused) = call(&http, Method::POST, &cut_replay, OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let (status, _) = call(&http, Method::GET, &format!("{api}/first"), KEY).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A replay runs the task to its end, and its letter goes.
    let (status, replayed) = call(&http, Method::POST, &replay, OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed["task_id"], task.as_str());
    let answer = completed(&cluster, "acme", &session, &task).await;
    assert_eq!(answer, "replayed: try again");
    let (status, _) = call(&http, Method::GET, &letter, OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the replayed letter is gone");
    let (_, listed) = call(&http, Method::GET, &api, OPERATOR_KEY).await;
    assert_eq!(numbers(&listed), [letters.cut], "{listed}");

    // A removal removes, once.
    let theirs = format!("{api}/{}", letters.globex.2);
    let (status, removed) = call(&http, Method::DELETE, &theirs, OTHER_TENANT_OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["removed"], letters.globex.2);
    let (status, _) = call(&http, Method::DELETE, &theirs, OTHER_TENANT_OPERATOR_KEY).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listed) = call(&http, Method::GET, &api, OTHER_TENANT_OPERATOR_KEY).await;
    assert_eq!(numbers(&listed), Vec::<u64>::new(), "{listed}");
    // Both are in the audit trail, under the keys' principals, proven by the gateway.
    let client = cluster.client().await;
    let records = client
        .bus()
        .audit_records(&Default::default(), 100)
        .await
        .expect("audit readable");
    let done: Vec<(&str, &str, &str, &str)> = records
        .iter()
        .filter(|r| r.action.starts_with("dlq_"))
        .map(|r| {
            (
                r.action.as_str(),
                r.tenant.as_str(),
                r.principal.as_str(),
                r.proof.as_str(),
            )
        })
        .collect();
    assert_eq!(
        done,
        [
            ("dlq_replay", "acme", "olga", "delegated:gateway"),
            ("dlq_remove", "globex", "gina", "delegated:gateway"),
        ],
        "{records:?}"
    );
    let left = client
        .bus()
        .dead_letter_at(letters.tenantless)
        .await
        .expect("readable");
    assert!(
        left.is_some(),
        "the tenantless letter stays for the command line"
    );
}

/// Focuses the element `css` selects; its accessible name.
async fn focus(browser: &Browser, css: &str) -> Value {
    browser.wait_for(css).await;
    browser
        .execute(
            "const e = document.querySelector(arguments[0]); e.focus(); return e.getAttribute('aria-label');",
            json!([css]),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_replays_a_dead_letter_in_the_console_and_its_task_ends() {
    let cluster = TestCluster::start();
    let (base, letters) = cluster_with_letters(&cluster).await;
    let (task, session, seq) = letters.acme.clone();
    let browser = Browser::start(&cluster.dir).await;
    let console = format!("{base}/console#dead-letters");
    let row = format!("#dead-letters-rows tr[data-seq='{seq}']");

    // A key without `operate` sees the letters, their actions disabled, and why.
    browser.sign_in(&console, KEY).await;
    let replay = browser.wait_for(&format!("{row} button.replay")).await;
    assert_eq!(browser.property(&replay, "disabled").await, json!(true));
    let title = browser.property(&replay, "title").await;
    assert!(
        title.as_str().is_some_and(|t| t.contains("operate")),
        "{title}"
    );
    browser
        .wait_for("#dead-letters-operate:not([hidden])")
        .await;
    browser.click(&browser.wait_for("#sign-out").await).await;

    // An operator (its view drawn anew: the actions it may take enabled): its tenant's letters
    // only; the cut one cannot be replayed.
    browser.sign_in(&console, OPERATOR_KEY).await;
    browser
        .wait_for(&format!("{row} button.replay:not([disabled])"))
        .await;
    let shown = browser
        .execute(
            "return [...document.querySelectorAll('#dead-letters-rows tr[data-seq]')].map(r => Number(r.dataset.seq));",
            json!([]),
        )
        .await;
    assert_eq!(shown, json!([seq, letters.cut]));
    let cut = format!("#dead-letters-rows tr[data-seq='{}']", letters.cut);
    let replay_cut = browser.wait_for(&format!("{cut} button.replay")).await;
    assert_eq!(browser.property(&replay_cut, "disabled").await, json!(true));

    // Its body, expanded in place.
    browser
        .click(&browser.wait_for(&format!("{row} button.show")).await)
        .await;
    let body = browser
        .wait_for(&format!("#dead-letters-rows tr[data-body='{seq}'] pre"))
        .await;
    assert!(browser.text(&body).await.contains(&task));
    let show = browser.wait_for(&format!("{row} button.show")).await;
    assert_eq!(browser.property(&show, "ariaExpanded").await, "true");
    browser.screenshot_for_docs("dead-letters").await;

    // Replayed with the keyboard: the row goes, the task ends completed.
    let focused = focus(&browser, &format!("{row} button.replay")).await;
    assert_eq!(focused, format!("Replay letter {seq} (task {task})"));
    browser.press(ENTER).await;
    browser.wait_gone(&row).await;
    let status = browser.text(&browser.wait_for("#status").await).await;
    assert!(
        status.starts_with(&format!("Replayed letter {seq}")),
        "{status}"
    );
    assert_eq!(
        completed(&cluster, "acme", &session, &task).await,
        "replayed: try again"
    );

    // Removed by pressing twice (with the keyboard: the replayed run's events redraw the view,
    // and the focus stays on its action).
    let focused = focus(&browser, &format!("{cut} button.remove")).await;
    assert_eq!(focused, format!("Remove letter {}", letters.cut));
    browser.press(ENTER).await;
    browser
        .wait_for(&format!(
            "{cut} button.remove[aria-label^='Confirm removal']"
        ))
        .await;
    let focused = browser
        .execute(
            "return document.activeElement.getAttribute('aria-label');",
            json!([]),
        )
        .await;
    assert_eq!(
        focused,
        format!("Confirm removal of letter {}", letters.cut)
    );
    browser.press(ENTER).await;
    browser.wait_gone(&cut).await;
    browser.wait_for("#dead-letters-empty:not([hidden])").await;
    let left = cluster
        .client()
        .await
        .bus()
        .dead_letter_at(letters.cut)
        .await
        .expect("readable");
    assert!(left.is_none(), "the removed letter is gone");

    browser.assert_clean().await;
}
