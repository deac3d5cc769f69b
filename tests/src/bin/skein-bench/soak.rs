//! `--soak`: tool tasks of every outcome against two worker processes (see
//! `skein_tests::support::soak`), and a table of what each worker held before and after.
//! The MCP server the task-scoped calls start is this binary re-run as `mcp-fixture`.

use std::sync::Arc;
use std::time::Duration;

use skein_common::bus::Bus;
use skein_common::dispatch::Dispatcher;
use skein_common::store::SessionStore;
use skein_tests::support::soak::{self, Holdings, SoakWorker};
use skein_tests::support::{free_port, unique, ChildProcess};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::nodes::{wait_workers, Nodes};
use crate::Failed;

/// Runs `tasks` soak tasks, `in_flight` at once, and prints the workers' holdings.
pub(crate) async fn soak_run(
    nodes: &Nodes,
    bus: &Bus,
    store: &SessionStore,
    tasks: usize,
    in_flight: usize,
) -> Result<(), Failed> {
    let exe = std::env::current_exe()?;
    let mcp = nodes.dir.join("mcp.json");
    std::fs::write(&mcp, soak::mcp_config(&exe, &["mcp-fixture"]).to_string())?;
    let mut processes = Vec::new();
    let mut workers = Vec::new();
    for n in 1..=2 {
        let admin = format!("127.0.0.1:{}", free_port());
        let scratch = nodes.dir.join(format!("soak-scratch-{n}"));
        std::fs::create_dir_all(&scratch)?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["node", "test-worker"])
            .args(soak::worker_flags(
                &nodes.nats,
                &nodes.redis,
                &format!("soak-worker-{n}"),
                &admin,
                &scratch,
                &mcp,
            ))
            .env("SKEIN_LOG", &nodes.log)
            .env("SKEIN_TEST_EFFECTS", nodes.dir.join("soak-effects.log"));
        let process = ChildProcess::spawn(cmd, nodes.dir.join(format!("soak-worker-{n}.log")));
        workers.push(SoakWorker {
            pid: process.id(),
            admin,
            scratch,
        });
        processes.push(process);
    }
    wait_workers(store, 2).await?;
    let tracker = TaskTracker::new();
    let dispatcher = Arc::new(
        Dispatcher::start(
            bus.clone(),
            store.clone(),
            &unique("soak-lead"),
            &tracker,
            CancellationToken::new(),
        )
        .await?,
    );
    eprintln!("soak: warming up");
    let warm = soak::run(bus, dispatcher.clone(), 20 * soak::KINDS.len(), in_flight).await;
    if !warm.unexpected().is_empty() {
        return Err(format!("warm-up tasks ended wrongly: {:?}", warm.unexpected()).into());
    }
    let before = settle_all(&workers).await;
    eprintln!("soak: {tasks} tasks, {in_flight} in flight");
    let run = soak::run(bus, dispatcher, tasks, in_flight).await;
    let after = settle_all(&workers).await;

    println!(
        "\nsoak: {} tasks in {:.1} s ({:.0} tasks/s), {in_flight} in flight, 2 workers",
        run.total(),
        run.elapsed.as_secs_f64(),
        run.total() as f64 / run.elapsed.as_secs_f64()
    );
    println!("\n| kind | outcomes |\n| --- | --- |");
    for (kind, outcomes) in &run.outcomes {
        println!("| {} | {outcomes:?} |", kind.name());
    }
    println!("\n| worker | figure | before | after |\n| --- | --- | ---: | ---: |");
    for (n, (b, a)) in before.iter().zip(&after).enumerate() {
        let rows: [(&str, f64, f64); 6] = [
            ("open fds", b.open_fds as f64, a.open_fds as f64),
            (
                "child processes",
                b.child_processes as f64,
                a.child_processes as f64,
            ),
            (
                "scratch entries (temp dirs)",
                b.scratch_entries as f64,
                a.scratch_entries as f64,
            ),
            (
                "RSS (MiB)",
                b.rss_kib as f64 / 1024.0,
                a.rss_kib as f64 / 1024.0,
            ),
            ("open scopes (gauge)", b.open_scopes, a.open_scopes),
            (
                "open task resources (gauge)",
                b.open_task_resources,
                a.open_task_resources,
            ),
        ];
        for (figure, b, a) in rows {
            println!("| {} | {figure} | {b:.1} | {a:.1} |", n + 1);
        }
    }
    for mut process in processes {
        process.kill();
    }
    if !run.unexpected().is_empty() {
        return Err(format!("tasks ended wrongly: {:?}", run.unexpected()).into());
    }
    Ok(())
}

/// Each worker's holdings once it is quiet (no children, scratch entries or open scopes), or
/// after 60 s.
async fn settle_all(workers: &[SoakWorker]) -> Vec<Holdings> {
    let mut all = Vec::new();
    for worker in workers {
        let mut now = worker.holdings().await;
        for _ in 0..120 {
            if now.child_processes == 0
                && now.scratch_entries == 0
                && now.open_scopes == 0.0
                && now.open_task_resources == 0.0
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            now = worker.holdings().await;
        }
        all.push(now);
    }
    all
}
