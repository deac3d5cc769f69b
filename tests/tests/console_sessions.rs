//! The console's sessions against a real cluster whose agent writes a workspace file: the
//! session is listed for its tenant's key; it shows its history (a long input cut with a note)
//! and its checkpoint with the points a fork can start from; its file is listed, read as text and
//! downloaded with the right headers and bytes, and a binary file is served only as a download;
//! another tenant's key finds none of it (404), a path that leaves the workspace is refused
//! (400), an unknown session is not found (404). In a real headless Chromium the same session
//! is reached from the list, its file viewed with the keyboard and downloaded through a blob
//! URL the page's policy allows, with no script error.

// The browser-driving tests are long async functions whose future types nest deeply.
#![recursion_limit = "256"]

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_common::protocol::TurnStatus;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::WorkspaceStoreConfig;
use skein_tests::support::browser::Browser;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::gateway::{gateway_before, KEY, OTHER_TENANT_KEY};
use skein_tests::support::{unique, workspaces};

/// What the agent writes in its session's workspace.
const NOTES: &str = "step one\nstep two\n";

/// WebDriver's Enter key.
const ENTER: &str = "\u{E007}";

/// A cluster whose agent writes [`NOTES`] to `notes/plan.txt`, then answers; its gateway's base
/// URL, and a session of `acme` in which a turn with a long input ran.
async fn session_with_a_file(cluster: &TestCluster) -> (String, String, String) {
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "write_file", "arguments": { "path": "notes/plan.txt", "content": NOTES } } ] },
        { "answer": "wrote: {{observations}}" }
    ] }]));
    let addr = gateway_before(cluster, &script, &[]).await;
    let session = unique("s");
    let input = format!("write the plan {}", "x".repeat(5000));
    let task = submission("acme", &session, &input);
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    (format!("http://{addr}"), session, task.task_id)
}

async fn get(http: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    http.get(url).bearer_auth(key).send().await.expect("sent")
}

async fn json_of(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("JSON")
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_history_checkpoints_and_files_are_read_by_its_tenant_only() {
    let cluster = TestCluster::start();
    let (base, session, task_id) = session_with_a_file(&cluster).await;
    let http = reqwest::Client::new();
    let api = format!("{base}/console/api/sessions");

    // Listed for its tenant, with its turn, its messages and when it was last active.
    let listed = json_of(get(&http, &api, KEY).await).await;
    let row = listed["sessions"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["session"] == session.as_str()))
        .unwrap_or_else(|| panic!("the session is listed: {listed}"));
    assert_eq!(row["turns"], 1, "{row}");
    assert_eq!(row["messages"], 4, "input, call, result, answer: {row}");
    assert!(
        row["last_activity_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{row}"
    );
    assert_eq!(row["running_task"], Value::Null, "{row}");
    let theirs = json_of(get(&http, &api, OTHER_TENANT_KEY).await).await;
    assert_eq!(theirs["sessions"], json!([]), "another tenant lists none");

    // Its history: the long input cut with a note, the call, its result, the answer.
    let shown = json_of(get(&http, &format!("{api}/{session}"), KEY).await).await;
    let messages = shown["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{shown}");
    assert_eq!(messages[0]["cut"], true, "{}", messages[0]);
    let text = messages[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("write the plan xxx") && text.len() <= 4000,
        "{text}"
    );
    assert_eq!(
        messages[0]["note"],
        format!(
            "cut to its first 4000 of {} bytes",
            "write the plan ".len() + 5000
        )
    );
    assert_eq!(
        messages[1]["tool_calls"][0]["name"], "write_file",
        "{shown}"
    );
    assert!(
        messages[1]["tool_calls"][0]["arguments"]
            .as_str()
            .is_some_and(|a| a.contains("notes/plan.txt")),
        "{shown}"
    );
    assert_eq!(messages[3]["cut"], Value::Null, "a short text is whole");
    assert!(
        messages[3]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("wrote: ")),
        "{shown}"
    );
    assert_eq!(shown["summary"], Value::Null);
    assert_eq!(shown["forked_from"], Value::Null);
    // Its checkpoint: the turn, and the points a fork can start from.
    let checkpoints = shown["checkpoints"].as_array().expect("checkpoints");
    assert_eq!(checkpoints.len(), 1, "{shown}");
    let turn = &checkpoints[0];
    assert_eq!(turn["turn"], 1);
    assert_eq!(turn["task_id"], task_id.as_str());
    assert_eq!(turn["status"], "completed");
    assert_eq!(
        (turn["steps"].as_u64(), turn["calls"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(turn["fork_points"], json!(["1.1", "1"]), "{turn}");

    // Its file: listed, read as text, downloaded.
    let files = json_of(get(&http, &format!("{api}/{session}/files"), KEY).await).await;
    assert_eq!(files["files"].as_array().map(Vec::len), Some(1), "{files}");
    assert_eq!(files["files"][0]["path"], "notes/plan.txt");
    assert_eq!(files["files"][0]["size"], NOTES.len());
    let file = format!("{api}/{session}/files/notes/plan.txt");
    let read = get(&http, &file, KEY).await;
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(header(&read, "content-type"), "text/plain; charset=utf-8");
    assert_eq!(header(&read, "x-content-type-options"), "nosniff");
    assert_eq!(header(&read, "content-disposition"), "");
    assert_eq!(read.text().await.expect("text"), NOTES);
    let downloaded = get(&http, &format!("{file}?download=1"), KEY).await;
    assert_eq!(downloaded.status(), StatusCode::OK);
    assert_eq!(
        header(&downloaded, "content-type"),
        "application/octet-stream"
    );
    assert_eq!(header(&downloaded, "x-content-type-options"), "nosniff");
    assert!(
        header(&downloaded, "content-disposition").starts_with("attachment; filename=\"plan.txt\""),
        "{:?}",
        downloaded.headers()
    );
    assert_eq!(
        downloaded.bytes().await.expect("bytes").as_ref(),
        NOTES.as_bytes()
    );

    // A file that is not text is served only as a download.
    let objects =
        workspaces::object_store(&cluster.nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let binary = [0xff_u8, 0xfe, 0x00, 0x01];
    objects
        .write(
            &workspaces::session("acme", &session),
            &workspaces::path("bin/blob.dat"),
            binary.to_vec().into(),
            Expect::Any,
        )
        .await
        .expect("written");
    let blob = format!("{api}/{session}/files/bin/blob.dat");
    let refused = get(&http, &blob, KEY).await;
    assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let blob = get(&http, &format!("{blob}?download=1"), KEY).await;
    assert_eq!(blob.status(), StatusCode::OK);
    assert_eq!(blob.bytes().await.expect("bytes").as_ref(), binary);

    // Another tenant's key finds none of it.
    for url in [
        format!("{api}/{session}"),
        format!("{api}/{session}/files"),
        file.clone(),
        format!("{file}?download=1"),
    ] {
        let status = get(&http, &url, OTHER_TENANT_KEY).await.status();
        assert_eq!(status, StatusCode::NOT_FOUND, "{url}");
    }
    // A path that leaves the workspace, or is absolute, is refused; so is a bad session name.
    for bad in ["..%2Fsecret", "notes/..%2F..%2Fsecret", "%2Fetc%2Fpasswd"] {
        let status = get(&http, &format!("{api}/{session}/files/{bad}"), KEY)
            .await
            .status();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let status = get(&http, &format!("{api}/not.a.session"), KEY)
        .await
        .status();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // What is not there is not found; nothing is read without a key.
    let unknown = unique("none");
    for url in [
        format!("{api}/{unknown}"),
        format!("{api}/{unknown}/files"),
        format!("{api}/{session}/files/notes/missing.txt"),
    ] {
        let status = get(&http, &url, KEY).await.status();
        assert_eq!(status, StatusCode::NOT_FOUND, "{url}");
    }
    let status = http.get(&file).send().await.expect("sent").status();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_session_and_views_and_downloads_its_file() {
    let cluster = TestCluster::start();
    let (base, session, task_id) = session_with_a_file(&cluster).await;
    let browser = Browser::start(&cluster.dir).await;

    browser
        .sign_in(&format!("{base}/console#sessions"), KEY)
        .await;
    let link = browser
        .wait_for(&format!("#sessions-rows tr[data-session='{session}'] a"))
        .await;
    browser.click(&link).await;

    // Its history, its checkpoint, its file.
    let input = browser
        .wait_for("#session-messages li[data-role='user']")
        .await;
    let text = browser.text(&input).await;
    assert!(
        text.contains("cut to its first 4000"),
        "the cut is said: {text}"
    );
    let current = browser.wait_for("#nav-sessions[aria-current='page']").await;
    assert_eq!(browser.text(&current).await, "Sessions");
    let turn = browser
        .wait_for("#session-checkpoints tr[data-turn='1']")
        .await;
    let text = browser.text(&turn).await;
    assert!(
        text.contains(&task_id) && text.contains("completed") && text.contains("1.1, 1"),
        "{text}"
    );
    let row = "#session-files tr[data-path='notes/plan.txt']";
    browser.wait_for(row).await;

    // Viewed with the keyboard: focus on its button, Enter.
    browser
        .execute(
            "document.querySelector(arguments[0] + ' button.view').focus();",
            json!([row]),
        )
        .await;
    let focused = browser
        .execute(
            "return document.activeElement.getAttribute('aria-label');",
            json!([]),
        )
        .await;
    assert_eq!(focused, "View notes/plan.txt");
    browser.press(ENTER).await;
    let shown = browser.wait_for("#session-file:not([hidden]) pre").await;
    assert_eq!(browser.property(&shown, "textContent").await, NOTES);
    browser.screenshot_for_docs("session").await;

    // Downloaded: the bytes, fetched with the key, handed to the browser as a blob URL with the
    // file's name; the page's policy lets the download through.
    browser
        .execute(
            "window.blobs = []; window.saved = [];
             const create = URL.createObjectURL;
             URL.createObjectURL = (blob) => { window.blobs.push(blob); return create.call(URL, blob); };
             const click = HTMLAnchorElement.prototype.click;
             HTMLAnchorElement.prototype.click = function () {
               window.saved.push({ href: this.href, name: this.download });
               return click.call(this);
             };",
            json!([]),
        )
        .await;
    let download = browser.wait_for(&format!("{row} button.download")).await;
    browser.click(&download).await;
    let status = browser.wait_for("#status").await;
    let started = tokio::time::Instant::now();
    while browser.text(&status).await != "Downloaded notes/plan.txt." {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the download never ended: {}",
            browser.text(&status).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let saved = browser.execute("return window.saved;", json!([])).await;
    assert_eq!(saved[0]["name"], "plan.txt", "{saved}");
    assert!(
        saved[0]["href"]
            .as_str()
            .is_some_and(|h| h.starts_with("blob:")),
        "{saved}"
    );
    let bytes = browser
        .execute("return window.blobs[0].text();", json!([]))
        .await;
    assert_eq!(bytes, NOTES);

    browser.assert_clean().await;
}
