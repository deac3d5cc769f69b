//! Surviving a node loss, and starting in any order. A three-node `nats-server` cluster carries
//! Skein's streams with three replicas (`SKEIN_STREAM_REPLICAS=3`); leads and workers, real
//! processes, reach it through a list of URLs (`SKEIN_NATS_URL=nats://a,nats://b,nats://c`).
//! Checked: killing (SIGKILL) the node that leads the work stream in the middle of a burst of
//! turns loses none and duplicates no final result; streams and workspace buckets created with
//! fewer replicas are raised, and a raise the servers refuse is reported; a lead and a worker
//! started before NATS and Redis wait for them (healthy, not ready) and answer once they are up;
//! a process told to stop while it waits exits cleanly, and one whose wait runs out fails naming
//! what it waited for.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use skein_common::bus::{Bus, ConsumerSettings, DEFAULT_MAX_PAYLOAD};
use skein_common::config::{NatsConfig, ENV_NATS_URL, ENV_STARTUP_TIMEOUT, ENV_STREAM_REPLICAS};
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_common::subjects;
use skein_common::workspace::objects::{bucket_name, Expect};
use skein_common::workspace::{ObjectWorkspaces, WorkspaceStoreConfig};
use skein_tests::support::chaos::{run_all, scenario};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::nats_cluster::NatsCluster;
use skein_tests::support::test_tools::{read_effects, EFFECTS_FILE_ENV};
use skein_tests::support::workspaces::{path, session};
use skein_tests::support::{eventually, free_port, unique, ChildProcess, NatsServer, RedisServer};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// Every stream Skein creates.
const STREAMS: [&str; 6] = [
    subjects::SUBMIT_STREAM,
    subjects::WORK_STREAM,
    subjects::EVENTS_STREAM,
    subjects::DLQ_STREAM,
    subjects::CANCEL_STREAM,
    subjects::APPROVALS_STREAM,
];

/// `skein-node <role>` pointed at `cluster`'s Redis and at the NATS servers `nats_url` names
/// through `SKEIN_NATS_URL` (not a flag), with three stream replicas.
fn node_process(
    cluster: &TestCluster,
    nats_url: &str,
    role: &str,
    extra: &[&str],
    log: &str,
) -> ChildProcess {
    let mut args = cluster.process_args(if role == "lead" { "lead" } else { "worker" });
    let at = args
        .iter()
        .position(|arg| arg == "--nats-url")
        .expect("the process flags name the NATS URL");
    args.drain(at..at + 2);
    args[0] = role.into();
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(args)
        .args(extra)
        .env(ENV_NATS_URL, nats_url)
        .env(ENV_STREAM_REPLICAS, "3")
        .env(EFFECTS_FILE_ENV, cluster.effects_file());
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

/// A bus on `url` (a list is fine) that creates streams with `replicas` replicas.
async fn bus(url: &str, replicas: usize) -> Bus {
    let cfg = NatsConfig {
        stream_replicas: replicas,
        ..NatsConfig::local(url)
    };
    Bus::connect(&cfg, "test", DEFAULT_MAX_PAYLOAD)
        .await
        .expect("connects to the test NATS")
}

/// The `Final` events of a task in the event stream, read by direct gets (any replica answers
/// them, so a lost node does not stand in the way, as it can for a new consumer until the
/// servers see it gone).
async fn final_events(bus: &Bus, tenant: &str, task_id: &str) -> Vec<FinalResult> {
    let subject = subjects::events_in(0, tenant, task_id);
    let last_error = std::sync::Mutex::new(String::new());
    let (subject, last_error) = (&subject, &last_error);
    let waited_for = format!("the stored events of {task_id} (each error is logged)");
    eventually(&waited_for, Duration::from_secs(60), || async move {
        match stored_finals(bus, subject).await {
            Ok(finals) => Some(finals),
            Err(error) => {
                let mut last = last_error.lock().expect("not poisoned");
                if *last != error {
                    eprintln!("reading the events of {task_id}: {error}");
                    *last = error;
                }
                None
            }
        }
    })
    .await
}

/// Every `Final` event stored on `subject`, in order. How many events the subject holds comes
/// from the stream's leader; a replica that has not caught up yet (it reads fewer) is an error,
/// so the caller reads again.
async fn stored_finals(bus: &Bus, subject: &str) -> Result<Vec<FinalResult>, String> {
    use async_nats::jetstream::stream::DirectGetErrorKind;
    use futures::TryStreamExt;
    let stream = bus
        .jetstream()
        .get_stream_no_info(subjects::EVENTS_STREAM)
        .await
        .map_err(|e| e.to_string())?;
    let counts: Vec<(String, usize)> = stream
        .info_with_subjects(subject)
        .await
        .map_err(|e| e.to_string())?
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let stored: usize = counts.iter().map(|(_, n)| n).sum();
    let mut finals = Vec::new();
    let (mut next, mut read) = (1, 0);
    loop {
        let message = match stream
            .direct_get_next_for_subject(subject, Some(next))
            .await
        {
            Ok(message) => message,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound && read >= stored => {
                return Ok(finals)
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                return Err(format!(
                    "a replica had {read} of the {stored} stored events"
                ))
            }
            Err(e) => return Err(e.to_string()),
        };
        read += 1;
        next = message.sequence + 1;
        let event: TurnEvent = bus.decode(&message.payload).map_err(|e| e.to_string())?;
        if let EventKind::Final { result } = event.event {
            finals.push(result);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_nats_node_that_leads_the_work_stream_loses_no_turn() {
    let mut nats = NatsCluster::start(3);
    nats.wait_ready().await;
    let nats_url = nats.url();
    let cluster = TestCluster::with_servers(nats.handle(), RedisServer::start());
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 1500 } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    let script = script.to_str().expect("utf-8 path");
    let flags = ["--ack-wait", "5s", "--concurrency", "4"];
    let _workers = [
        node_process(&cluster, &nats_url, "test-worker", &flags, "worker-a.log"),
        node_process(&cluster, &nats_url, "test-worker", &flags, "worker-b.log"),
    ];
    let _lead = node_process(
        &cluster,
        &nats_url,
        "lead",
        &["--scenario", script],
        "lead.log",
    );
    cluster.wait_for_workers(2).await;

    for stream in STREAMS {
        let info = nats
            .stream_info(stream)
            .await
            .unwrap_or_else(|| panic!("{stream} exists"));
        // The servers holding it: the leader and the peers it lists (while a leader is being
        // elected the servers may list all three as peers).
        let members: std::collections::BTreeSet<&str> = info
            .cluster
            .iter()
            .flat_map(|c| {
                c.leader
                    .as_deref()
                    .into_iter()
                    .chain(c.replicas.iter().map(|r| r.name.as_str()))
            })
            .collect();
        assert_eq!(
            (info.config.num_replicas, members.len()),
            (3, 3),
            "{stream} has three replicas on three servers: {:?}",
            info.cluster
        );
    }

    let tasks: Vec<_> = (0..12)
        .map(|i| submission("acme", &unique("s"), &format!("job{i}")))
        .collect();
    let started = std::time::Instant::now();
    let running = run_all(&cluster, &tasks);
    let killer = async {
        // Mid-burst: calls are running, more are queued.
        eventually("a call to start", Duration::from_secs(60), || async {
            let started = read_effects(&cluster.effects_file())
                .values()
                .any(|c| c.started > 0);
            started.then_some(())
        })
        .await;
        let leader = nats.stream_leader(subjects::WORK_STREAM).await;
        let mut led = Vec::new();
        for stream in STREAMS {
            let leads = nats
                .stream_info(stream)
                .await
                .and_then(|info| info.cluster?.leader)
                .is_some_and(|name| name == nats.name(leader));
            if leads {
                led.push(stream);
            }
        }
        let done_before = read_effects(&cluster.effects_file())
            .values()
            .filter(|c| c.done > 0)
            .count();
        let killed = nats.name(leader).to_owned();
        nats.kill(leader);
        (killed, led, done_before, started.elapsed())
    };
    let (results, (killed, led, done_before, killed_at)) = tokio::join!(running, killer);
    let ended_at = started.elapsed();
    let new_leader = nats.stream_leader(subjects::WORK_STREAM).await;

    let effects = read_effects(&cluster.effects_file());
    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    let rerun = effects.values().filter(|c| c.started > 1).count();
    let client = cluster.client().await;
    let mut finals_per_task = HashMap::new();
    for task in &tasks {
        let finals = final_events(client.bus(), &task.tenant, &task.task_id).await;
        finals_per_task.insert(task.task_id.clone(), finals);
    }
    let republished = finals_per_task.values().filter(|f| f.len() > 1).count();
    // A final event the lead could not publish while the events stream had no leader is not in
    // the stream: clients read the stored result instead.
    let unannounced = finals_per_task.values().filter(|f| f.is_empty()).count();
    println!(
        "killed NATS node {killed} (leader of {led:?}) {killed_at:?} into the burst, after \
         {done_before} of {} calls had finished; {} took over {}; every turn ended {ended_at:?} \
         into the burst; submitted {} completed {} lost {}; calls run more than once \
         {rerun}; tasks whose final event is in the stream more than once {republished}, not \
         at all {unannounced}",
        tasks.len(),
        nats.name(new_leader),
        subjects::WORK_STREAM,
        tasks.len(),
        completed,
        tasks.len() - completed,
    );
    assert_ne!(
        nats.name(new_leader),
        killed,
        "another node leads the work stream"
    );
    let store = cluster.store().await;
    for (task, (result, _)) in tasks.iter().zip(&results) {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let expected = format!("effect {} done", task.input.text());
        assert_eq!(
            result.answer.as_deref(),
            Some(expected.as_str()),
            "each turn got its own result, its call's result once"
        );
        let stored = store
            .final_result(&task.tenant, &task.session, &task.task_id)
            .await
            .expect("Redis answers")
            .expect("the final result is stored");
        assert_eq!(&stored, result, "one final result, stored and delivered");
        let finals = &finals_per_task[&task.task_id];
        assert!(
            finals.iter().all(|f| f == result),
            "{}: every final event carries the one final result: {finals:?}",
            task.task_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_buckets_with_fewer_replicas_are_raised() {
    let nats = NatsCluster::start(3);
    nats.wait_ready().await;
    let url = nats.url();
    // Created by a process with one replica (a CLI, an older pod)...
    let single = bus(&url, 1).await;
    single.ensure_streams().await.expect("streams created");
    let workspaces = ObjectWorkspaces::new(&single, &WorkspaceStoreConfig::default(), 0);
    let s = session("acme", &unique("s"));
    workspaces
        .write(
            &s,
            &path("notes.txt"),
            Bytes::from_static(b"kept"),
            Expect::Any,
        )
        .await
        .expect("a file written");
    let consumer = ConsumerSettings {
        stream: subjects::WORK_STREAM.into(),
        durable: subjects::tool_consumer("default"),
        filter: subjects::tool_filter(0, "default"),
        ack_wait: Duration::from_secs(30),
        max_deliver: -1,
        max_ack_pending: None,
    };
    drop(
        single
            .intake(&consumer)
            .await
            .expect("a consumer of the work stream"),
    );
    let bucket_stream = format!("OBJ_{}", bucket_name("acme"));
    for stream in STREAMS.iter().copied().chain([bucket_stream.as_str()]) {
        let info = nats.stream_info(stream).await.expect("the stream exists");
        assert_eq!(info.config.num_replicas, 1, "{stream} starts with one");
    }

    // ... then one with three, and again one with one.
    let triple = bus(&url, 3).await;
    triple.ensure_streams().await.expect("streams raised");
    let raised = ObjectWorkspaces::raise_bucket_replicas(&triple, 3)
        .await
        .expect("buckets listed");
    assert_eq!(raised, 1, "the tenant's bucket was raised");
    single
        .ensure_streams()
        .await
        .expect("streams checked again");
    for stream in STREAMS.iter().copied().chain([bucket_stream.as_str()]) {
        let info = eventually(
            &format!("{stream} with two peers"),
            Duration::from_secs(30),
            || async {
                let info = nats.stream_info(stream).await?;
                (info.cluster.as_ref()?.replicas.len() == 2).then_some(info)
            },
        )
        .await;
        assert_eq!(
            info.config.num_replicas, 3,
            "{stream} raised, never lowered"
        );
    }
    // The stream's consumers follow it.
    let peers = eventually(
        "the consumer with two peers",
        Duration::from_secs(30),
        || async {
            let stream = triple
                .jetstream()
                .get_stream(subjects::WORK_STREAM)
                .await
                .ok()?;
            let mut found: async_nats::jetstream::consumer::PullConsumer =
                stream.get_consumer(&consumer.durable).await.ok()?;
            let info = found.info().await.ok()?;
            let peers = info.cluster.as_ref()?.replicas.len();
            (peers == 2).then_some(peers)
        },
    )
    .await;
    assert_eq!(peers, 2);
    let reread = ObjectWorkspaces::new(&triple, &WorkspaceStoreConfig::default(), 0);
    let (content, _) = reread
        .read(&s, &path("notes.txt"))
        .await
        .expect("the file is still there");
    assert_eq!(&content[..], b"kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_the_servers_refuse_is_reported_and_the_stream_keeps_serving() {
    // Two servers: three replicas cannot be placed.
    let nats = NatsCluster::start(2);
    nats.wait_ready().await;
    let url = nats.url();
    bus(&url, 1)
        .await
        .ensure_streams()
        .await
        .expect("streams created");
    let triple = bus(&url, 3).await;
    let current = nats
        .stream_info(subjects::WORK_STREAM)
        .await
        .expect("the work stream answers")
        .config;
    let refused = skein_common::bus::raise_replicas(triple.jetstream(), &current, 3)
        .await
        .expect_err("three replicas need three servers");
    let said = refused.to_string();
    assert!(
        said.contains(subjects::WORK_STREAM) && said.contains("from 1 to 3"),
        "the report names the stream and both counts: {said}"
    );
    // Start-up goes on: the streams serve with the replicas they have.
    triple
        .ensure_streams()
        .await
        .expect("a refused raise does not fail start-up");
    let info = nats
        .stream_info(subjects::WORK_STREAM)
        .await
        .expect("the work stream answers");
    assert_eq!(info.config.num_replicas, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_and_a_worker_started_before_nats_and_redis_converge() {
    let (nats_port, redis_port) = (free_port(), free_port());
    let nats_url = format!("nats://127.0.0.1:{nats_port}");
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let dir = std::env::temp_dir().join(unique("skein-test-cold"));
    std::fs::create_dir_all(&dir).expect("test dir");
    let scenario = dir.join("scenario.json");
    let turns = json!([{ "steps": [
        { "tool_calls": [ { "name": "noop", "arguments": {} } ] },
        { "answer": "noop said {{observations}}" }
    ] }]);
    std::fs::write(
        &scenario,
        json!({ "agents": { "assistant": { "turns": turns } } }).to_string(),
    )
    .expect("scenario written");
    let (lead_admin, worker_admin) = (free_port(), free_port());
    let common = |role: &str, admin: u16| {
        vec![
            role.to_string(),
            "--nats-url".into(),
            nats_url.clone(),
            "--redis-url".into(),
            redis_url.clone(),
            "--admin-addr".into(),
            format!("127.0.0.1:{admin}"),
        ]
    };
    let mut lead_args = common("lead", lead_admin);
    lead_args.extend(["--scenario".into(), scenario.display().to_string()]);
    let mut worker_args = common("test-worker", worker_admin);
    worker_args.extend([
        "--workspace-root".into(),
        dir.join("workspaces").display().to_string(),
        "--scratch-dir".into(),
        dir.join("scratch").display().to_string(),
        "--heartbeat".into(),
        "500ms".into(),
    ]);
    let spawn = |args: Vec<String>, log: &str| {
        let mut cmd = std::process::Command::new(NODE);
        cmd.args(args)
            .env(EFFECTS_FILE_ENV, dir.join("effects.log"))
            .env(ENV_STARTUP_TIMEOUT, "5m");
        ChildProcess::spawn(cmd, dir.join(log))
    };
    let mut lead = spawn(lead_args, "lead.log");
    let mut worker = spawn(worker_args, "worker.log");

    // While nothing answers: alive, not ready, saying what they wait for.
    let http = reqwest::Client::new();
    let status = |port: u16, path: &'static str| {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}{path}"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        }
    };
    for (port, process) in [(lead_admin, &lead), (worker_admin, &worker)] {
        eventually("the admin server", Duration::from_secs(30), || async {
            (status(port, "/healthz").await == Some(200)).then_some(())
        })
        .await;
        assert_eq!(status(port, "/readyz").await, Some(503), "not ready yet");
        eventually("a logged wait", Duration::from_secs(30), || async {
            let log = process.log();
            (log.contains("waiting for a dependency") && log.contains(&nats_url)).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(lead.is_running() && worker.is_running(), "still waiting");
    assert_eq!(status(lead_admin, "/readyz").await, Some(503));

    let _nats = NatsServer::start_on_port(nats_port);
    let _redis = RedisServer::start_on_port(redis_port);
    for port in [lead_admin, worker_admin] {
        eventually("ready", Duration::from_secs(60), || async {
            (status(port, "/readyz").await == Some(200)).then_some(())
        })
        .await;
    }
    let client = skein_common::client::SkeinClient::connect(&NatsConfig::local(nats_url.clone()))
        .await
        .expect("client connects");
    let task = submission("acme", &unique("s"), "hello");
    let result = client
        .run(&task, Duration::from_secs(60), |_| {})
        .await
        .expect("a final result");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("noop said ok"));
    for process in [&mut lead, &mut worker] {
        process.sigterm();
        let exit = process.wait_exit(Duration::from_secs(60)).await;
        assert!(
            exit.is_some_and(|s| s.success()),
            "{exit:?}: {}",
            process.log()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_start_up_wait_exits_cleanly() {
    let nats_url = format!("nats://127.0.0.1:{}", free_port());
    let dir = std::env::temp_dir().join(unique("skein-test-wait"));
    std::fs::create_dir_all(&dir).expect("test dir");
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(["lead", "--admin-addr", "off"])
        .env(ENV_NATS_URL, &nats_url)
        .env(
            "SKEIN_REDIS_URL",
            format!("redis://127.0.0.1:{}", free_port()),
        )
        .env(ENV_STARTUP_TIMEOUT, "5m");
    let mut lead = ChildProcess::spawn(cmd, dir.join("lead.log"));
    eventually("a logged wait", Duration::from_secs(30), || async {
        let log = lead.log();
        (log.contains("waiting for a dependency") && log.contains(&nats_url)).then_some(())
    })
    .await;
    lead.sigterm();
    let exit = lead.wait_exit(Duration::from_secs(30)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}: {}",
        lead.log()
    );
    assert!(
        lead.log().contains("stopped while waiting"),
        "{}",
        lead.log()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_wait_that_runs_out_fails_naming_what_it_waited_for() {
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("skein-test-wait"));
    std::fs::create_dir_all(&dir).expect("test dir");
    let redis = RedisServer::start();
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(["worker", "--admin-addr", "off"])
        .env(
            ENV_NATS_URL,
            format!("nats://127.0.0.1:{port},nats://127.0.0.1:{port}"),
        )
        .env("SKEIN_REDIS_URL", &redis.url)
        .env("SKEIN_SCRATCH_DIR", dir.join("scratch"))
        .env(ENV_STARTUP_TIMEOUT, "2s");
    let mut worker = ChildProcess::spawn(cmd, dir.join("worker.log"));
    let exit = worker.wait_exit(Duration::from_secs(60)).await;
    let log = worker.log();
    assert_eq!(exit.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("gave up waiting"), "{log}");
    assert!(
        log.contains(&format!(
            "cannot connect to NATS at nats://127.0.0.1:{port}"
        )),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
