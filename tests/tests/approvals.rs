//! Approval that survives any crash, with real NATS, Redis, lead and worker processes: a call an
//! `ask` rule holds suspends its turn; `skein approve` / `skein deny` (or an unanswered request's
//! expiry, or a cancel) settles it; the approved call runs exactly once, also when the lead that
//! suspended the turn was killed meanwhile.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use skein_common::protocol::{
    ApprovalRequest, EventKind, FailureKind, TaskSubmission, TurnEvent, TurnStatus,
};
use skein_tests::support::chaos::wait_for_recorded_results;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_openai::{FakeOpenAi, FakeReply};
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// An agents folder whose `assistant` must ask before `slow_effect` runs.
fn guarded_agents(cluster: &TestCluster, extra_permissions: &str) -> PathBuf {
    let dir = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&dir).expect("agents dir");
    std::fs::write(
        dir.join("AGENTS.md"),
        format!(
            "+++\n[permissions]\nask = [\"slow_effect\"]\n{extra_permissions}\n+++\nYou are careful.\n"
        ),
    )
    .expect("AGENTS.md written");
    dir
}

fn test_worker(cluster: &TestCluster) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    let mut args = cluster.process_args("worker");
    args[0] = "test-worker".into();
    cmd.args(args)
        .env("SKEIN_TEST_EFFECTS", cluster.effects_file());
    ChildProcess::spawn(
        cmd,
        cluster.dir.join(unique("worker")).with_extension("log"),
    )
}

fn lead_process(cluster: &TestCluster, flags: &[&str]) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(cluster.process_args("lead")).args(flags);
    ChildProcess::spawn(cmd, cluster.dir.join(unique("lead")).with_extension("log"))
}

/// Runs the `skein` command against the cluster; returns its exit success and output.
/// (`skein approvals` reads Redis only; `approve` and `deny` also publish on NATS.)
fn skein(cluster: &TestCluster, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(NODE);
    command.args(args).args(["--redis-url", &cluster.redis.url]);
    if args[0] != "approvals" {
        command.args(["--nats-url", &cluster.nats.url]);
    }
    let output = command.output().expect("skein runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Waits until the task's turn is suspended; returns its request.
async fn wait_for_request(cluster: &TestCluster, task: &TaskSubmission) -> ApprovalRequest {
    let store = cluster.store().await;
    eventually("an approval request", Duration::from_secs(30), || {
        let store = store.clone();
        let (tenant, task_id) = (task.tenant.clone(), task.task_id.clone());
        async move {
            store
                .approval_request(&tenant, &task_id)
                .await
                .ok()
                .flatten()
        }
    })
    .await
}

/// A worker with the test tools and an in-process lead whose `assistant` asks before
/// `slow_effect`: its script calls `slow_effect` (effect `key`) once, then answers with what it
/// observed.
async fn guarded_cluster(
    cluster: &TestCluster,
    key: &str,
    extra_permissions: &str,
) -> ChildProcess {
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": key, "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let agents = guarded_agents(cluster, extra_permissions);
    let worker = test_worker(cluster);
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        agents.to_str().expect("utf-8 path"),
    ]));
    worker
}

fn events_of(events: &[TurnEvent], name: &str) -> usize {
    events
        .iter()
        .filter(|e| {
            serde_json::to_value(&e.event)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_owned))
                == Some(name.to_owned())
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_runs_once_after_the_suspending_lead_is_killed() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "deploy", "ms": 50 } } ] },
        { "answer": "deployed after approval" }
    ] }]));
    let agents = guarded_agents(&cluster, "");
    let agents = agents.to_str().expect("utf-8 path");
    let flags = [
        "--scenario",
        &script,
        "--agents-dir",
        agents,
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
    ];
    let _worker = test_worker(&cluster);
    cluster.wait_for_workers(1).await;
    let mut first = lead_process(&cluster, &flags);

    let task = submission("acme", &unique("s"), "deploy it");
    let running = cluster.run(&task);
    let approving = async {
        let request = wait_for_request(&cluster, &task).await;
        assert_eq!(request.calls.len(), 1, "{request:?}");
        assert_eq!(request.calls[0].tool, "slow_effect");
        assert!(
            request.calls[0].rule.contains("ask rule slow_effect"),
            "{request:?}"
        );

        // The lead that suspended the turn dies; another lead takes over.
        first.kill();
        let second = lead_process(&cluster, &flags);
        let (listed, text) = skein(&cluster, &["approvals", "--tenant", "acme", "--json"]);
        assert!(listed, "{text}");
        assert!(
            text.contains(&task.task_id),
            "the CLI lists the request: {text}"
        );
        assert_eq!(
            cluster.effect_starts("deploy"),
            0,
            "nothing ran before approval"
        );

        let (approved, text) = skein(
            &cluster,
            &["approve", &task.task_id, "--tenant", "acme", "--by", "ann"],
        );
        assert!(approved, "{text}");
        assert!(
            text.contains("recorded as ann"),
            "the CLI waits to see the answer recorded: {text}"
        );
        second
    };
    let ((result, events), _second) = tokio::join!(running, approving);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("deployed after approval"));
    assert_eq!(
        cluster.effect_starts("deploy"),
        1,
        "the approved call ran exactly once"
    );
    assert_eq!(events_of(&events, "approval_requested"), 1, "asked once");
    assert!(events.iter().any(|e| matches!(
        &e.event,
        EventKind::ApprovalResolved {
            verdict: skein_common::protocol::Verdict::Approved,
            ..
        }
    )));
    assert_eq!(result.iterations, 2, "the model was not asked again");
    let store = cluster.store().await;
    assert_eq!(
        store
            .approval_request("acme", &task.task_id)
            .await
            .expect("store"),
        None,
        "the request is cleared when the turn ends"
    );
}

/// An approved call that ran while its lead was stopping: the lead hands the turn back before the
/// call ends (shutdown does not count as an attempt, so the turn's next start is again its first
/// attempt, resumed from its checkpoint), the call ends and its result is recorded, and the lead
/// that resumes the turn answers the call from that record instead of running it again. The work
/// stream's duplicate window is shortened and the resume waits past it: within the window the
/// broker would drop a second publication of the call by its message id, which would hide a lead
/// that published it again as a first dispatch (one a worker runs without looking for a record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_that_ran_while_its_lead_stopped_is_not_run_again_on_resume() {
    const DUPLICATE_WINDOW: Duration = Duration::from_secs(1);
    let cluster = TestCluster::start();
    let key = unique("deploy");
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": key, "ms": 3000 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let agents = guarded_agents(&cluster, "");
    let agents = agents.to_str().expect("utf-8 path");
    let flags = [
        "--scenario",
        &script,
        "--agents-dir",
        agents,
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
        "--grace",
        "1s",
    ];
    let _worker = test_worker(&cluster);
    cluster.wait_for_workers(1).await;
    let mut first = lead_process(&cluster, &flags);
    let client = cluster.client().await;
    let jetstream = async_nats::jetstream::new(client.bus().client().clone());
    let mut work = jetstream
        .get_stream(skein_common::subjects::WORK_STREAM)
        .await
        .expect("the work stream");
    let mut config = work.info().await.expect("its configuration").config.clone();
    config.duplicate_window = DUPLICATE_WINDOW;
    jetstream
        .update_stream(config)
        .await
        .expect("a shorter duplicate window");

    let task = submission("acme", &unique("s"), "deploy it");
    let running = cluster.run(&task);
    let stopping = async {
        wait_for_request(&cluster, &task).await;
        let (approved, text) = skein(
            &cluster,
            &["approve", &task.task_id, "--tenant", "acme", "--by", "ann"],
        );
        assert!(approved, "{text}");
        // The approved call runs; the lead is told to stop and hands the turn back before it ends.
        eventually(
            "the approved call to start",
            Duration::from_secs(30),
            || async { (cluster.effect_starts(&key) > 0).then_some(()) },
        )
        .await;
        first.sigterm();
        let exit = first.wait_exit(Duration::from_secs(30)).await;
        assert!(
            exit.is_some_and(|s| s.success()),
            "the lead stopped: {exit:?}"
        );
        // The call ends on its worker and its result is recorded; only then does a lead resume.
        wait_for_recorded_results(&cluster, &task, 1).await;
        // Past the duplicate window: the broker would now take another publication of the call.
        tokio::time::sleep(DUPLICATE_WINDOW * 2).await;
        lead_process(&cluster, &flags)
    };
    let ((result, events), _second) = tokio::join!(running, stopping);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert!(
        result
            .answer
            .as_deref()
            .is_some_and(|answer| answer.contains(&format!("effect {key} done"))),
        "{result:?}"
    );
    assert_eq!(
        cluster.effect_starts(&key),
        1,
        "the approved call ran exactly once"
    );
    // One trace: the client sent no trace context, and each start (asked, resumed after the
    // approval, resumed after the stop) continues the trace its first delivery kept.
    let traces: Vec<Option<String>> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::TurnStarted { trace_id, .. } => Some(trace_id.clone()),
            _ => None,
        })
        .collect();
    assert!(
        traces.len() >= 3,
        "asked, resumed after approval, resumed after the stop: {traces:?}"
    );
    assert!(traces[0].is_some(), "{traces:?}");
    assert!(
        traces.iter().all(|trace| *trace == traces[0]),
        "every start in one trace: {traces:?}"
    );
    assert_eq!(
        result.trace_id, traces[0],
        "the result names the same trace"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_reaches_the_model_with_the_reason() {
    // Through the real OpenAI-compatible provider, against the fake model server.
    let cluster = TestCluster::start();
    let model: FakeOpenAi = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({"key": "drop", "ms": 10})),
        FakeReply::answer("understood"),
    ])
    .await;
    let agents = guarded_agents(&cluster, "");
    let _worker = test_worker(&cluster);
    cluster.wait_for_workers(1).await;
    let base_url = model.base_url.clone();
    let mut flags = model_flags(&base_url).to_vec();
    flags.extend(["--agents-dir", agents.to_str().expect("utf-8 path")]);
    cluster.spawn_lead(cluster.lead_config(&flags));

    let task = submission("acme", &unique("s"), "drop the table");
    let running = cluster.run(&task);
    let denying = async {
        wait_for_request(&cluster, &task).await;
        let (denied, text) = skein(
            &cluster,
            &[
                "deny",
                &task.task_id,
                "--tenant",
                "acme",
                "--reason",
                "not on a Friday",
            ],
        );
        assert!(denied, "{text}");
        // A second answer changes nothing: the first one stands.
        let (again, text) = skein(&cluster, &["approve", &task.task_id, "--tenant", "acme"]);
        assert!(!again, "an answered call cannot be answered again: {text}");
    };
    let ((result, events), ()) = tokio::join!(running, denying);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("understood"));
    // The model saw the denial, with the reason, as the call's observation.
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let observed = requests[1]["messages"].to_string();
    assert!(observed.contains("denied by"), "{observed}");
    assert!(observed.contains("not on a Friday"), "{observed}");
    assert_eq!(
        cluster.effect_starts("drop"),
        0,
        "the denied call never ran"
    );
    assert!(events.iter().any(|e| matches!(
        &e.event,
        EventKind::ApprovalResolved {
            verdict: skein_common::protocol::Verdict::Refused,
            ..
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_expires_into_a_denial() {
    let cluster = TestCluster::start();
    let _worker = guarded_cluster(&cluster, "late", "approval_timeout = \"1500ms\"").await;
    let task = submission("acme", &unique("s"), "do it later");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(answer.contains("nobody answered"), "{answer}");
    assert_eq!(cluster.effect_starts("late"), 0);
    assert!(events.iter().any(|e| matches!(
        &e.event,
        EventKind::ApprovalRequested {
            expires_at_ms: Some(_),
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(
        &e.event,
        EventKind::ApprovalResolved {
            verdict: skein_common::protocol::Verdict::Expired,
            ..
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_waiting_turn() {
    let cluster = TestCluster::start();
    let _worker = guarded_cluster(&cluster, "never", "").await;
    let task = submission("acme", &unique("s"), "wait for me");
    let running = cluster.run(&task);
    let cancelling = async {
        wait_for_request(&cluster, &task).await;
        let client = cluster.client().await;
        client
            .cancel("acme", &task.task_id, "changed my mind")
            .await
            .expect("cancel published");
    };
    let ((result, _), ()) = tokio::join!(running, cancelling);
    assert_eq!(result.status, TurnStatus::Cancelled, "{result:?}");
    assert_eq!(result.failure.map(|f| f.kind), Some(FailureKind::Cancelled));
    assert_eq!(cluster.effect_starts("never"), 0);
    let store = cluster.store().await;
    assert_eq!(
        store
            .approval_request("acme", &task.task_id)
            .await
            .expect("store"),
        None,
        "a cancelled turn's request is cleared"
    );
    let (listed, text) = skein(&cluster, &["approvals", "--tenant", "acme"]);
    assert!(listed, "{text}");
    assert!(!text.contains(&task.task_id), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_a_waiting_turn() {
    let cluster = TestCluster::start();
    let _worker = guarded_cluster(&cluster, "too-late", "").await;
    let mut task = submission("acme", &unique("s"), "before the deadline");
    task.deadline_ms = Some(skein_common::protocol::now_ms() + 2_000);
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    assert_eq!(result.failure.map(|f| f.kind), Some(FailureKind::TimedOut));
    assert_eq!(events_of(&events, "approval_requested"), 1);
    assert_eq!(cluster.effect_starts("too-late"), 0);
    let store = cluster.store().await;
    assert_eq!(
        store
            .approval_request("acme", &task.task_id)
            .await
            .expect("store"),
        None,
        "a timed-out turn's request is cleared"
    );
}

/// An agents folder whose `assistant` hands its task to `deployer`, which must ask before
/// `slow_effect` (effect `ship`) runs; returns the scenario and the agents folder.
fn delegating_agents(cluster: &TestCluster) -> (String, String) {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nsubagents = [\"deployer\"]\n+++\nDelegate.\n",
    )
    .expect("AGENTS.md written");
    std::fs::write(
        agents.join("subagents/deployer.md"),
        "+++\nname = \"deployer\"\ndescription = \"deploys\"\n[permissions]\nask = [\"slow_effect\"]\n+++\nDeploy.\n",
    )
    .expect("deployer written");
    let spawn = json!({ "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "deployer", "task": "ship" } } ] });
    let scenario = cluster.dir.join(format!("{}.json", unique("deployer")));
    std::fs::write(
        &scenario,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [ spawn, { "answer": "lead saw: {{observations}}" } ] } ] },
            "deployer": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "ship", "ms": 10 } } ] },
                { "answer": "shipped: {{observations}}" }
            ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario written");
    (scenario.display().to_string(), agents.display().to_string())
}

/// A test-worker process running the scenario's subagents.
fn subagent_worker(cluster: &TestCluster, scenario: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    let mut args = cluster.process_args("worker");
    args[0] = "test-worker".into();
    cmd.args(args)
        .args(["--scenario", scenario, "--ack-wait", "2s"])
        .env("SKEIN_TEST_EFFECTS", cluster.effects_file());
    ChildProcess::spawn(
        cmd,
        cluster.dir.join(unique("worker")).with_extension("log"),
    )
}

/// Waits until a subagent run of the tenant waits for a person; returns its request.
async fn wait_for_run_request(store: &skein_common::store::SessionStore) -> ApprovalRequest {
    eventually("a subagent run's request", Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            let requests = store.approval_requests("acme").await.ok()?;
            requests.into_iter().find(|r| r.run.is_some())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_waits_for_a_person_and_an_answer_resumes_it_after_its_worker_was_killed() {
    let cluster = TestCluster::start();
    let (scenario, agents) = delegating_agents(&cluster);
    let mut first = subagent_worker(&cluster, &scenario);
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));

    let task = submission("acme", &unique("s"), "ship it");
    let running = cluster.run(&task);
    let store = cluster.store().await;
    let approving = async {
        let request = wait_for_run_request(&store).await;
        // The run that waits, with the calls that led to it; the task's own turn waits on it.
        assert_eq!(request.task_id, task.task_id);
        assert_eq!(request.agent, "deployer");
        assert_eq!(request.lineage, ["call_t1_s1_0"], "{request:?}");
        assert_eq!(request.calls.len(), 1, "{request:?}");
        assert_eq!(request.calls[0].tool, "slow_effect");
        let run = request.run.clone().expect("a run");
        assert_eq!(request.session, run);
        assert!(store
            .approval_request("acme", &task.task_id)
            .await
            .expect("read")
            .is_none());
        let (listed, text) = skein(&cluster, &["approvals", "--tenant", "acme"]);
        assert!(listed, "{text}");
        assert!(
            text.contains("subagent run call_t1_s1_0") && text.contains(&format!("--run {run}")),
            "the CLI shows the run's lineage: {text}"
        );

        // The worker holding the waiting run dies; the answer comes while no worker runs.
        first.kill();
        let (approved, text) = skein(
            &cluster,
            &["approve", &task.task_id, "--tenant", "acme", "--by", "ops"],
        );
        assert!(approved, "{text}");
        assert_eq!(cluster.effect_starts("ship"), 0, "nothing ran before");
        subagent_worker(&cluster, &scenario)
    };
    let ((result, events), second) = tokio::join!(running, approving);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(answer.contains("shipped"), "{answer}");
    assert!(
        second
            .log()
            .contains("resuming the child turn from its checkpoint"),
        "the second worker resumed the waiting run"
    );
    assert_eq!(
        cluster.effect_starts("ship"),
        1,
        "the approved call ran once"
    );
    let child_asked: Vec<&TurnEvent> = events
        .iter()
        .filter(|e| matches!(e.event, EventKind::ApprovalRequested { .. }))
        .collect();
    assert_eq!(
        child_asked.len(),
        1,
        "asked once, also after the worker died"
    );
    assert_eq!(child_asked[0].source, "subagent:call_t1_s1_0");
    assert!(events.iter().any(|e| e.source == "subagent:call_t1_s1_0"
        && matches!(
            &e.event,
            EventKind::ApprovalResolved {
                verdict: skein_common::protocol::Verdict::Approved,
                by,
                ..
            } if by == "ops"
        )));
    eventually("the run's request cleared", Duration::from_secs(10), || {
        let store = store.clone();
        async move {
            store
                .approval_requests("acme")
                .await
                .ok()
                .filter(|r| r.is_empty())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_waiting_for_a_person_hears_a_denial_at_once_and_goes_on() {
    let cluster = TestCluster::start();
    let (scenario, agents) = delegating_agents(&cluster);
    let _worker = subagent_worker(&cluster, &scenario);
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));

    let task = submission("acme", &unique("s"), "ship it");
    let running = cluster.run(&task);
    let store = cluster.store().await;
    let denying = async {
        let request = wait_for_run_request(&store).await;
        let call = request.calls[0].call_id.clone();
        let run = request.run.clone().expect("a run");
        let (denied, text) = skein(
            &cluster,
            &[
                "deny",
                &task.task_id,
                "--tenant",
                "acme",
                "--call",
                &call,
                "--run",
                &run,
                "--reason",
                "not on a friday",
            ],
        );
        assert!(denied, "{text}");
    };
    let ((result, events), ()) = tokio::join!(running, denying);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("shipped") && answer.contains("not on a friday"),
        "the run observed the denial and went on: {answer}"
    );
    assert_eq!(
        cluster.effect_starts("ship"),
        0,
        "the denied call never ran"
    );
    assert!(events.iter().any(|e| e.source == "subagent:call_t1_s1_0"
        && matches!(
            &e.event,
            EventKind::ApprovalResolved {
                verdict: skein_common::protocol::Verdict::Refused,
                ..
            }
        )));
}
