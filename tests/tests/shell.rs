//! The `shell` tool through the whole path: a real worker listing it runs the model's command in
//! the session's workspace (where `write_file` and `read_file` see the same files), nothing the
//! command started outlives the call, and a worker that does not list it never offers it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::{EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};

/// An agents folder whose `assistant` may run every tool unasked (`shell` is destructive, so
/// the bundled agent would wait for approval).
fn unguarded_agents(cluster: &TestCluster) -> PathBuf {
    let dir = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&dir).expect("agents dir");
    std::fs::write(
        dir.join("AGENTS.md"),
        "+++\ntools = [\"*\"]\n[permissions]\nmode = \"bypass\"\n+++\nYou run commands.\n",
    )
    .expect("AGENTS.md written");
    dir
}

/// The text of every tool message the model was sent in `request`, in order.
fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The tool names offered to the model in `request`.
fn offered_tools(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn finished(events: &[TurnEvent]) -> Vec<(String, bool)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished { tool, ok, .. } => Some((tool.clone(), *ok)),
            _ => None,
        })
        .collect()
}

/// Live (not zombie) processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let path = e.path();
            let cmdline = std::fs::read(path.join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            (cmdline.contains(marker) && state != 'Z').then_some(cmdline)
        })
        .collect()
}

fn session_dir(cluster: &TestCluster, tenant: &str, session: &str) -> PathBuf {
    cluster.dir.join("workspaces").join(tenant).join(session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_runs_in_the_object_store_workspace_and_leaves_nothing_running() {
    shell_shares_the_workspace_with_the_file_tools("object").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_runs_in_the_volume_workspace_and_leaves_nothing_running() {
    let (cluster, session) = shell_shares_the_workspace_with_the_file_tools("volume").await;
    assert_eq!(
        std::fs::read_to_string(session_dir(&cluster, "acme", &session).join("out.txt"))
            .expect("the file is in the session's directory"),
        "from shell\n"
    );
}

/// One turn on a worker with `--workspace mode`: `write_file`, then `shell` (reads that file,
/// writes another, leaves a background `sleep` behind), then `read_file` of the shell's file.
/// Returns the cluster and the session.
async fn shell_shares_the_workspace_with_the_file_tools(mode: &str) -> (TestCluster, String) {
    let cluster = TestCluster::start();
    let marker = unique("skein-sleeper");
    // Starts a background `sleep 1000` named after the marker and waits until it runs.
    let command = format!(
        "cat in.txt; echo from shell > out.txt; \
         (exec -a {marker} sleep 1000) & \
         until tr '\\0' ' ' < /proc/$!/cmdline 2>/dev/null | grep -q {marker}; do sleep 0.05; done; \
         echo sleeper up"
    );
    let model = FakeOpenAi::start(vec![
        FakeReply::tool(
            "write_file",
            json!({ "path": "in.txt", "content": "from write_file\n" }),
        ),
        FakeReply::tool("shell", json!({ "command": command, "timeout_s": 30 })),
        FakeReply::tool("read_file", json!({ "path": "out.txt" })),
        FakeReply::answer("done"),
    ])
    .await;
    cluster.spawn_worker(cluster.worker_config(&[
        "--tools",
        "shell,read_file,write_file",
        "--workspace",
        mode,
    ]));
    let agents = unguarded_agents(&cluster);
    let mut lead_flags = model_flags(&model.base_url).to_vec();
    lead_flags.extend(["--agents-dir", agents.to_str().expect("utf-8 path")]);
    cluster.spawn_lead(cluster.lead_config(&lead_flags));
    cluster.wait_for_workers(1).await;

    let session = unique("s");
    let (result, events) = cluster
        .run(&submission("acme", &session, "run something"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{mode}: {result:?}");
    assert_eq!(result.answer.as_deref(), Some("done"));
    let tools = finished(&events);
    assert_eq!(
        tools,
        [
            ("write_file".to_owned(), true),
            ("shell".to_owned(), true),
            ("read_file".to_owned(), true)
        ],
        "{mode}"
    );

    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    let offered = offered_tools(&requests[0]);
    assert!(offered.contains(&"shell".to_owned()), "{offered:?}");
    // The shell saw the file write_file wrote, in its current directory.
    let results = tool_results(&requests[2]);
    let shell_output = results.last().expect("the shell result");
    assert!(
        shell_output.starts_with("exit status: 0\n--- stdout ---\nfrom write_file\nsleeper up"),
        "{mode}: {shell_output}"
    );
    // read_file saw the file the shell wrote.
    let results = tool_results(&requests[3]);
    let read = results.last().expect("the read result");
    assert!(read.contains("from shell"), "{mode}: {read}");

    // The background sleep did not survive the call.
    eventually(
        "the command's processes are gone",
        Duration::from_secs(10),
        || {
            let alive = processes_with(&marker);
            async move { alive.is_empty().then_some(()) }
        },
    )
    .await;
    (cluster, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_does_not_list_shell_does_not_offer_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("nothing to run")]).await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let offered = offered_tools(&model.requests()[0]);
    assert!(
        offered.contains(&"read_file".to_owned()),
        "the worker's tools are offered: {offered:?}"
    );
    assert!(!offered.contains(&"shell".to_owned()), "{offered:?}");
    let workers = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("the registry reads");
    assert!(workers
        .iter()
        .all(|w| w.tools.iter().all(|t| t.name != "shell")));
}
