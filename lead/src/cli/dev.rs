//! `skein dev`: a local cluster in one command. Uses NATS and Redis where they answer (the
//! configured URLs, by default the standard local ports), otherwise starts `nats-server` and
//! `redis-server` as child processes on free ports; then starts a lead and two workers as separate
//! processes, answers the example task with them, and shuts everything down in order. With
//! `--serve` it also starts an HTTP gateway with a key of its own, prints its URL and key, and
//! keeps everything up until Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use skein_common::client::SkeinClient;
use skein_common::config::{
    NatsConfig, ENV_ADMIN_ADDR, ENV_INSTANCE_ID, ENV_MODEL_PROVIDER, ENV_NATS_URL, ENV_REDIS_URL,
    ENV_SCRATCH_DIR, ENV_WORKSPACE_ROOT,
};
use skein_common::protocol::{TaskSubmission, PROTOCOL_VERSION};
use skein_common::store::SessionStore;
use tokio::process::{Child, Command};

/// The example task the local cluster answers.
pub const EXAMPLE_INPUT: &str =
    "Keep a note about how Skein works and tell me what the workspace holds.";

#[derive(Debug, Args)]
pub struct DevArgs {
    /// NATS to use; started locally when it does not answer.
    #[arg(long, env = ENV_NATS_URL, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Redis to use; started locally when it does not answer.
    #[arg(long, env = ENV_REDIS_URL, default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// Always start private nats-server and redis-server processes.
    #[arg(long)]
    pub fresh: bool,
    /// The task to answer.
    #[arg(long, default_value = EXAMPLE_INPUT)]
    pub input: String,
    /// Keep the cluster running after the answer, until Ctrl-C.
    #[arg(long)]
    pub serve: bool,
    /// Longest to wait for the answer.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Processes the dev cluster started, stopped in reverse order.
struct Cluster {
    dir: PathBuf,
    processes: Vec<(String, Child)>,
    /// Keep the directory (logs) after stopping, for a failed run.
    keep_logs: bool,
}

impl Cluster {
    async fn stop(mut self) {
        while let Some((name, mut child)) = self.processes.pop() {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status()
                    .await;
            }
            match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
                Ok(_) => eprintln!("  stopped {name}"),
                Err(_) => {
                    let _ = child.kill().await;
                    eprintln!("  killed {name} (did not stop in time)");
                }
            }
        }
        if !self.keep_logs {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub async fn dev(args: DevArgs) -> ExitCode {
    let dir = std::env::temp_dir().join(format!("skein-dev-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("skein dev: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let mut cluster = Cluster {
        dir: dir.clone(),
        processes: Vec::new(),
        keep_logs: false,
    };
    let code = match start_and_answer(&args, &mut cluster).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("skein dev: {e}");
            eprintln!("  logs kept in {}", dir.display());
            cluster.keep_logs = true;
            ExitCode::FAILURE
        }
    };
    eprintln!("shutting down the local cluster");
    cluster.stop().await;
    code
}

async fn start_and_answer(args: &DevArgs, cluster: &mut Cluster) -> Result<ExitCode, String> {
    let nats_url = match (args.fresh, answers(&args.nats_url, 4222).await) {
        (false, true) => {
            eprintln!("using NATS at {}", args.nats_url);
            args.nats_url.clone()
        }
        _ => {
            let port = free_port()?;
            let store = cluster.dir.join("jetstream");
            let mut cmd = Command::new(find_binary("nats-server", "nats-server")?);
            cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(&store);
            spawn(cluster, "nats-server", cmd)?;
            let url = format!("nats://127.0.0.1:{port}");
            wait_for_port(port, "nats-server").await?;
            eprintln!("started nats-server with JetStream at {url}");
            url
        }
    };
    let redis_url = match (args.fresh, answers(&args.redis_url, 6379).await) {
        (false, true) => {
            eprintln!(
                "using Redis at {}",
                skein_common::config::redact_url(&args.redis_url)
            );
            args.redis_url.clone()
        }
        _ => {
            let port = free_port()?;
            let mut cmd = Command::new(find_binary("redis-server", "redis-server")?);
            cmd.args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&cluster.dir);
            spawn(cluster, "redis-server", cmd)?;
            wait_for_port(port, "redis-server").await?;
            let url = format!("redis://127.0.0.1:{port}/");
            eprintln!("started redis-server at {url}");
            url
        }
    };

    let exe = std::env::current_exe().map_err(|e| format!("cannot find the skein binary: {e}"))?;
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let workspace = cluster.dir.join("workspaces");
    for i in 1..=2 {
        let mut cmd = Command::new(&exe);
        cmd.arg("worker")
            .env(ENV_ADMIN_ADDR, "127.0.0.1:0")
            .env(ENV_NATS_URL, &nats_url)
            .env(ENV_REDIS_URL, &redis_url)
            .env(ENV_INSTANCE_ID, format!("dev-worker-{i}-{run_id}"))
            .env(ENV_WORKSPACE_ROOT, &workspace)
            .env(ENV_SCRATCH_DIR, cluster.dir.join("scratch"));
        spawn(cluster, &format!("worker {i}"), cmd)?;
    }
    let mut cmd = Command::new(&exe);
    cmd.arg("lead")
        .env(ENV_ADMIN_ADDR, "127.0.0.1:0")
        .env(ENV_NATS_URL, &nats_url)
        .env(ENV_REDIS_URL, &redis_url)
        .env(ENV_INSTANCE_ID, format!("dev-lead-{run_id}"));
    spawn(cluster, "lead", cmd)?;
    let provider = std::env::var(ENV_MODEL_PROVIDER).unwrap_or_else(|_| "scripted".into());
    eprintln!(
        "started a lead and two workers (model provider: {provider}); logs in {}",
        cluster.dir.display()
    );

    let store = SessionStore::connect(&skein_common::config::RedisConfig::local(redis_url.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    loop {
        let workers = store.live_workers().await.map_err(|e| e.to_string())?;
        let ours = workers
            .iter()
            .filter(|w| w.worker_id.ends_with(run_id))
            .count();
        if ours >= 2 {
            eprintln!("2 workers ready after {:?}", started.elapsed());
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err("workers did not announce themselves within 30s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let client = SkeinClient::connect(&NatsConfig::local(nats_url.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let submission = TaskSubmission {
        replay_of: None,
        v: PROTOCOL_VERSION,
        task_id: format!("dev-{run_id}"),
        tenant: "dev".into(),
        user: "you".into(),
        session: format!("dev-session-{run_id}"),
        agent: "assistant".into(),
        input: args.input.clone().into(),
        overrides: None,
        deadline_ms: None,
        budget: None,
        multitask: Default::default(),
        output_schema: None,
    };
    let began = Instant::now();
    let code = super::submit::run_and_render(
        &client,
        &submission,
        args.timeout,
        super::pickup::NOTICE_AFTER,
        false,
    )
    .await;
    eprintln!("answered in {:?}", began.elapsed());
    if args.serve {
        let (url, key) = start_gateway(cluster, &exe, &nats_url, &redis_url).await?;
        eprintln!("cluster running: NATS {nats_url} · Redis {redis_url}; Ctrl-C to stop");
        eprintln!("gateway at {url}/v1 · key {key} (tenant dev)");
        eprintln!(
            "  curl {url}/v1/responses -H 'Authorization: Bearer {key}' \\\n    -d '{{\"model\": \"assistant\", \"input\": \"hello\"}}'"
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    Ok(code)
}

/// Starts `skein gateway` on a free loopback port (or `SKEIN_GATEWAY_ADDR`) with a key made for
/// this run (its hash in a keys file in the run's directory) and waits until it answers; returns
/// its URL and the key.
async fn start_gateway(
    cluster: &mut Cluster,
    exe: &Path,
    nats_url: &str,
    redis_url: &str,
) -> Result<(String, String), String> {
    use crate::gateway::{keys::key_hash, ENV_GATEWAY_ADDR, ENV_GATEWAY_KEYS};
    let key = format!("sk-dev-{}", uuid::Uuid::new_v4().simple());
    let keys = cluster.dir.join("gateway-keys.toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"dev\"\nprincipal = \"you\"\nroles = [\"submit\", \"approve\", \"operate\"]\n",
            key_hash(&key)
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", keys.display()))?;
    let addr = match std::env::var(ENV_GATEWAY_ADDR) {
        Ok(addr) => addr,
        Err(_) => format!("127.0.0.1:{}", free_port()?),
    };
    let port: u16 = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{ENV_GATEWAY_ADDR}={addr} is not HOST:PORT"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("gateway")
        .env(ENV_GATEWAY_ADDR, &addr)
        .env(ENV_GATEWAY_KEYS, &keys)
        .env(ENV_NATS_URL, nats_url)
        .env(ENV_REDIS_URL, redis_url);
    spawn(cluster, "gateway", cmd)?;
    wait_for_port(port, "the gateway").await?;
    Ok((format!("http://127.0.0.1:{port}"), key))
}

/// Whether a server answers at `url` (TCP connect within a short time).
async fn answers(url: &str, default_port: u16) -> bool {
    let Some(addr) = host_port(url, default_port) else {
        return false;
    };
    matches!(
        tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr)
        )
        .await,
        Ok(Ok(_))
    )
}

fn host_port(url: &str, default_port: u16) -> Option<String> {
    let rest = url.split("://").nth(1)?;
    let rest = rest.rsplit('@').next()?;
    let authority = rest.split('/').next()?.split(',').next()?;
    if authority.is_empty() {
        return None;
    }
    Some(if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:{default_port}")
    })
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn find_binary(name: &str, package: &str) -> Result<PathBuf, String> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} is not installed and nothing answers at its URL; install it (Debian/Ubuntu: apt-get install {package}) or point skein at a running server"))
}

fn spawn(cluster: &mut Cluster, name: &str, mut cmd: Command) -> Result<(), String> {
    let log = log_file(&cluster.dir, name)?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    cluster.processes.push((name.to_owned(), child));
    Ok(())
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, String> {
    let path = dir.join(format!("{}.log", name.replace(' ', "-")));
    std::fs::File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

async fn wait_for_port(port: u16, name: &str) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "{name} did not start listening on port {port} within 10s"
    ))
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn host_port_reads_urls() {
        assert_eq!(
            host_port("nats://127.0.0.1:4222", 1).as_deref(),
            Some("127.0.0.1:4222")
        );
        assert_eq!(host_port("redis://:pw@h/", 6379).as_deref(), Some("h:6379"));
        assert_eq!(host_port("nats://a:1,b:2", 1).as_deref(), Some("a:1"));
        assert_eq!(host_port("nonsense", 1), None);
    }
}
