//! Going back in a session, with real NATS, Redis, a lead and a worker (the model scripted): a
//! session keeps a record of each ended turn; `skein sessions fork` makes a new session from a
//! turn or a step of it (with the workspace's files as they were then, from the versions the
//! workspace keeps) and never changes the source; `skein replay
//! --cached` runs a recorded turn again without repeating a side effect, runs only the calls that
//! differ, and says what changed; `--live` runs every call; `--all` replays the whole session.

use serde_json::json;
use skein_common::protocol::message::Role;
use skein_common::protocol::TurnStatus;
use skein_common::store::history::ForkPoint;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::unique;

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

fn started(cluster: &TestCluster, key: &str) -> usize {
    read_effects(&cluster.effects_file())
        .get(key)
        .map_or(0, |c| c.started)
}

/// Runs `skein` against the cluster; returns success and output.
fn skein(cluster: &TestCluster, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(NODE);
    if args[0] == "sessions" {
        // `skein sessions` takes its Redis settings before the action.
        command
            .args(["sessions", "--redis-url", &cluster.redis.url])
            .args(&args[1..]);
        if args[1] == "fork" {
            command.args(["--nats-url", &cluster.nats.url]);
        }
    } else {
        command
            .args(args)
            .args(["--redis-url", &cluster.redis.url])
            .args(["--nats-url", &cluster.nats.url]);
    }
    let output = command
        .args(["--tenant", "acme"])
        .output()
        .expect("skein runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Two turns: the first writes a note and runs two effects (three steps), the second answers.
fn two_turns(cluster: &TestCluster) -> String {
    cluster.scenario(json!([
        { "steps": [
            { "tool_calls": [ { "name": "write_file", "arguments": { "path": "notes.txt", "content": "kept" } } ] },
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "effect-{{turn}}", "ms": 10 } } ] },
            { "answer": "one: {{observations}}" }
        ] },
        { "steps": [ { "answer": "two after {{previous_input}}" } ] }
    ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forks_at_a_turn_or_a_step_and_the_source_stays_as_it_was() {
    let cluster = TestCluster::start();
    let script = two_turns(&cluster);
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script]));
    let session = unique("s");
    for input in ["first", "second"] {
        let (result, _) = cluster.run(&submission("acme", &session, input)).await;
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    }
    let store = cluster.store().await;
    let records = store.turn_records("acme", &session).await.expect("records");
    assert_eq!(records.len(), 2);
    assert_eq!(
        (
            records[0].turn,
            records[0].steps,
            records[0].calls,
            records[0].messages
        ),
        (1, 3, 2, 6),
        "{:?}",
        records[0]
    );
    assert_eq!((records[1].turn, records[1].messages), (2, 2));
    let (ok, text) = skein(&cluster, &["sessions", "history", &session]);
    assert!(ok, "{text}");
    assert!(
        text.contains("turn 1\t") && text.contains("3 steps\t2 calls"),
        "{text}"
    );
    assert!(text.contains("turn 2\t"), "{text}");

    let source = store.load("acme", &session).await.expect("source");
    // After turn 1: its six messages, the workspace's files copied.
    let whole = unique("f");
    let (ok, text) = skein(
        &cluster,
        &["sessions", "fork", &session, "--at", "1", "--to", &whole],
    );
    assert!(ok, "{text}");
    assert!(text.contains("copied 1 workspace files"), "{text}");
    let forked = store.load("acme", &whole).await.expect("fork");
    assert_eq!(forked.state.history, source.state.history[..6].to_vec());
    assert_eq!(forked.state.turns, 1);
    let from = forked.state.forked_from.expect("forked_from");
    assert_eq!(
        (from.session.as_str(), from.at),
        (
            session.as_str(),
            ForkPoint {
                turn: 1,
                step: None
            }
        )
    );
    assert_eq!(
        cluster
            .workspace_file("acme", &whole, "notes.txt")
            .await
            .as_deref(),
        Some("kept")
    );
    // After step 1 of turn 1: the input, the first response and its result.
    let step = unique("f");
    let (ok, text) = skein(
        &cluster,
        &[
            "sessions",
            "fork",
            &session,
            "--at",
            "1.1",
            "--to",
            &step,
            "--no-files",
        ],
    );
    assert!(ok, "{text}");
    let forked = store.load("acme", &step).await.expect("fork");
    let roles: Vec<Role> = forked.state.history.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool]);
    assert_eq!(forked.state.history, source.state.history[..3].to_vec());

    // The source is as it was; bad fork points and existing targets are refused.
    let after = store.load("acme", &session).await.expect("source");
    assert_eq!(
        (after.version, after.state.history),
        (source.version, source.state.history)
    );
    let (ok, text) = skein(
        &cluster,
        &["sessions", "fork", &session, "--at", "5", "--no-files"],
    );
    assert!(!ok && text.contains("recorded turns: 1, 2"), "{text}");
    let (ok, text) = skein(
        &cluster,
        &[
            "sessions",
            "fork",
            &session,
            "--at",
            "1",
            "--to",
            &whole,
            "--no-files",
        ],
    );
    assert!(!ok && text.contains("exists already"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_gets_the_workspaces_files_as_they_were_at_its_point() {
    let cluster = TestCluster::start();
    let write = |path: &str, content: &str| json!({ "tool_calls": [ { "name": "write_file", "arguments": { "path": path, "content": content } } ] });
    let script = cluster.scenario(json!([
        { "steps": [
            write("notes.txt", "v1"),
            write("notes.txt", "v2"),
            write("other.txt", "o"),
            { "answer": "one" }
        ] },
        { "steps": [
            write("notes.txt", "v3"),
            write("new.txt", "n"),
            { "answer": "two" }
        ] }
    ]));
    // One earlier version kept per file: notes.txt's v1 is dropped when v3 replaces v2.
    cluster.spawn_test_worker(cluster.worker_config(&["--workspace-versions", "1"]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script]));
    let session = unique("s");
    for input in ["first", "second"] {
        let (result, _) = cluster.run(&submission("acme", &session, input)).await;
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    }
    let records = cluster
        .store()
        .await
        .turn_records("acme", &session)
        .await
        .expect("records");
    let steps: Vec<u32> = records[0].step_ends.iter().map(|end| end.step).collect();
    assert_eq!(steps, [1, 2, 3], "{:?}", records[0]);

    let cluster_ref = &cluster;
    let files = |fork: String| async move {
        let mut found = Vec::new();
        for path in ["notes.txt", "other.txt", "new.txt"] {
            found.push(cluster_ref.workspace_file("acme", &fork, path).await);
        }
        found
    };
    let fork = |at: &str, extra: &[&str]| {
        let to = unique("f");
        let mut args = vec!["sessions", "fork", &session, "--at", at, "--to", &to];
        args.extend_from_slice(extra);
        let (ok, text) = skein(&cluster, &args);
        (ok, text, to)
    };
    let some = |text: &str| Some(text.to_owned());

    // The end of turn 1, and of turn 2: each as it was.
    let (ok, text, to) = fork("1", &[]);
    assert!(
        ok && text.contains("copied 2 workspace files as they were at"),
        "{text}"
    );
    assert_eq!(files(to.clone()).await, [some("v2"), some("o"), None]);
    // A fork of that fork at a point it took from the source: the source's files of then
    // (the fork's own were written when it was made).
    let first_fork = to;
    let to = unique("f");
    let (ok, text) = skein(
        &cluster,
        &["sessions", "fork", &first_fork, "--at", "1", "--to", &to],
    );
    assert!(
        ok && text.contains("copied 2 workspace files as they were at")
            && text.contains(&format!("(from {session})")),
        "{text}"
    );
    assert_eq!(files(to).await, [some("v2"), some("o"), None]);
    let (ok, text, to) = fork("2", &[]);
    assert!(ok && text.contains("copied 3 workspace files"), "{text}");
    assert_eq!(files(to).await, [some("v3"), some("o"), some("n")]);
    // Step 2 of turn 1: notes.txt's second version, other.txt not written yet.
    let (ok, text, to) = fork("1.2", &[]);
    assert!(ok, "{text}");
    assert_eq!(files(to).await, [some("v2"), None, None]);
    // Step 1 of turn 2: the new notes, written at that step.
    let (ok, text, to) = fork("2.1", &[]);
    assert!(ok, "{text}");
    assert_eq!(files(to).await, [some("v3"), some("o"), None]);
    // Before the first turn: nothing.
    let (ok, text, to) = fork("0", &[]);
    assert!(ok && text.contains("copied 0 workspace files"), "{text}");
    assert_eq!(files(to).await, [None, None, None]);

    // Step 1 of turn 1 held notes.txt's first version, no longer kept: refused, naming the
    // file, and the fork is not kept; as they are now, it goes through.
    let (ok, text, to) = fork("1.1", &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("keeps no version from then of notes.txt") && text.contains("--files-now"),
        "{text}"
    );
    let gone = cluster.store().await.load("acme", &to).await.expect("load");
    assert_eq!(gone.version, 0, "the refused fork is not kept");
    let (ok, text, to) = fork("1.1", &["--files-now"]);
    assert!(ok && text.contains("as they are now"), "{text}");
    assert_eq!(files(to).await, [some("v3"), some("o"), some("n")]);

    // The source's files are as the second turn left them.
    assert_eq!(
        files(session.clone()).await,
        [some("v3"), some("o"), some("n")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_replay_repeats_no_side_effect_and_runs_only_the_calls_that_differ() {
    let cluster = TestCluster::start();
    let script = two_turns(&cluster);
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script]));
    let session = unique("s");
    let first = submission("acme", &session, "first");
    cluster.run(&first).await;
    cluster.run(&submission("acme", &session, "second")).await;
    assert_eq!(started(&cluster, "effect-1"), 1);

    // Same model, from the record: nothing runs again and nothing changed.
    let replay = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            &first.task_id,
            "--session",
            &session,
            "--no-files",
        ];
        args.extend_from_slice(extra);
        skein(&cluster, &args)
    };
    let (ok, text) = replay(&["--cached", "--scenario", &script]);
    assert!(ok, "{text}");
    assert!(text.contains("answer:  unchanged"), "{text}");
    assert!(text.contains("calls:   unchanged (2)"), "{text}");
    assert!(
        text.contains("served from the record: 2 of 2 calls"),
        "{text}"
    );
    assert_eq!(started(&cluster, "effect-1"), 1, "no side effect repeated");

    // A changed model: the call that differs runs, the matching one comes from the record.
    let changed = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "write_file", "arguments": { "path": "notes.txt", "content": "kept" } } ] },
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "changed", "ms": 10 } } ] },
        { "answer": "one: {{observations}}" }
    ] }]));
    let (ok, text) = replay(&["--cached", "--scenario", &changed]);
    assert!(ok, "{text}");
    assert!(text.contains("calls:   changed"), "{text}");
    assert!(
        text.contains("- slow_effect") && text.contains("+ slow_effect"),
        "{text}"
    );
    assert!(
        text.contains("served from the record: 1 of 2 calls"),
        "{text}"
    );
    assert!(text.contains("answer:  changed"), "{text}");
    assert_eq!(started(&cluster, "changed"), 1, "the new call ran");
    assert_eq!(started(&cluster, "effect-1"), 1);

    // Live: every call runs again.
    let (ok, text) = replay(&["--live", "--scenario", &script]);
    assert!(ok, "{text}");
    assert!(
        text.contains("served from the record: 0 of 2 calls"),
        "{text}"
    );
    assert_eq!(
        started(&cluster, "effect-1"),
        2,
        "live runs the effect again"
    );

    // The whole session, as a table.
    let (ok, text) = skein(
        &cluster,
        &[
            "replay",
            "--session",
            &session,
            "--all",
            "--cached",
            "--no-files",
            "--scenario",
            &script,
        ],
    );
    assert!(ok, "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().all(|r| r.contains("\tsame\tsame\t")), "{text}");
    let (ok, text) = skein(&cluster, &["replay", "--session", &session, "--cached"]);
    assert!(!ok && text.contains("name the task"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_from_the_plan_its_point_had() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\nplanning = true\n+++\nPlan.\n",
    )
    .expect("AGENTS.md written");
    let plan = |step: &str| {
        json!({ "tool_calls": [ { "name": "update_plan", "arguments": {
        "explanation": step, "plan": [ { "step": step, "status": "pending" } ] } } ] })
    };
    let script = cluster.scenario(json!([
        { "steps": [ plan("draft"), { "answer": "planned" } ] },
        { "steps": [ plan("revise"), { "answer": "replanned" } ] }
    ]));
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let agents = agents.display().to_string();
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script, "--agents-dir", &agents]));
    let session = unique("s");
    for input in ["first", "second"] {
        let (result, _) = cluster.run(&submission("acme", &session, input)).await;
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    }
    let store = cluster.store().await;
    let step_of = |state: &skein_common::store::SessionState| {
        state
            .plan
            .as_ref()
            .map(|p| p.plan.iter().map(|s| s.step.clone()).collect::<Vec<_>>())
    };
    let source = store.load("acme", &session).await.expect("source");
    assert_eq!(step_of(&source.state), Some(vec!["revise".to_owned()]));
    // After turn 1, within turn 2 (its plan not yet revised as the turn found it), after turn 2.
    for (at, expected) in [("1", "draft"), ("2.1", "draft"), ("2", "revise")] {
        let fork = unique("f");
        let (ok, text) = skein(
            &cluster,
            &["sessions", "fork", &session, "--at", at, "--to", &fork],
        );
        assert!(ok, "{text}");
        let forked = store.load("acme", &fork).await.expect("fork");
        assert_eq!(
            step_of(&forked.state),
            Some(vec![expected.to_owned()]),
            "fork at {at}"
        );
    }
    let (ok, text) = skein(
        &cluster,
        &[
            "sessions",
            "fork",
            &session,
            "--at",
            "0",
            "--to",
            &unique("f"),
        ],
    );
    assert!(ok, "{text}");
}
