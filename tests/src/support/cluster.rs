//! A Skein cluster for one test: its own nats-server and redis-server, leads and workers run
//! in-process (through their library `run`) or as processes, and a client. Everything stops when
//! the cluster is dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::{FinalResult, TaskSubmission, TurnEvent, PROTOCOL_VERSION};
use skein_common::store::SessionStore;
use skein_worker::scope::ScopeStats;
use tokio_util::sync::CancellationToken;

use super::servers::{NatsServer, RedisServer};
use super::{eventually, unique};

/// Servers plus the processes and tasks of one test's cluster.
pub struct TestCluster {
    pub nats: NatsServer,
    pub redis: RedisServer,
    /// Scratch space of this cluster (workspaces, scratch dirs, logs).
    pub dir: PathBuf,
    shutdown: CancellationToken,
}

impl Default for TestCluster {
    fn default() -> Self {
        Self::start()
    }
}

impl TestCluster {
    /// Starts fresh servers.
    pub fn start() -> Self {
        Self::with_nats(NatsServer::start())
    }

    /// Starts with this NATS server (one started with a configuration, say) and a fresh Redis.
    pub fn with_nats(nats: NatsServer) -> Self {
        Self::with_servers(nats, RedisServer::start())
    }

    /// Starts with these servers (started with TLS or passwords, say).
    pub fn with_servers(nats: NatsServer, redis: RedisServer) -> Self {
        let dir = std::env::temp_dir().join(unique("skein-test"));
        std::fs::create_dir_all(&dir).expect("test dir can be created");
        Self {
            nats,
            redis,
            dir,
            shutdown: CancellationToken::new(),
        }
    }

    /// Lead configuration for this cluster; `extra` are more command-line flags.
    pub fn lead_config(&self, extra: &[&str]) -> skein_lead::Config {
        let mut args = vec![
            "skein-lead".to_string(),
            "--nats-url".into(),
            self.nats.url.clone(),
            "--redis-url".into(),
            self.redis.url.clone(),
            "--instance-id".into(),
            unique("lead"),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        skein_lead::Config::try_parse_from(args).expect("valid lead flags")
    }

    /// Worker configuration for this cluster; `extra` are more command-line flags.
    pub fn worker_config(&self, extra: &[&str]) -> skein_worker::Config {
        let mut args = vec![
            "skein-worker".to_string(),
            "--nats-url".into(),
            self.nats.url.clone(),
            "--redis-url".into(),
            self.redis.url.clone(),
            "--instance-id".into(),
            unique("worker"),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
            "--workspace-root".into(),
            self.dir.join("workspaces").display().to_string(),
            "--scratch-dir".into(),
            self.dir.join("scratch").display().to_string(),
            "--heartbeat".into(),
            "500ms".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        skein_worker::Config::try_parse_from(args).expect("valid worker flags")
    }

    /// Runs a lead in this process until the cluster drops.
    pub fn spawn_lead(&self, cfg: skein_lead::Config) {
        let shutdown = self.shutdown.child_token();
        tokio::spawn(async move {
            if let Err(e) = skein_lead::run(cfg, shutdown).await {
                panic!("lead failed: {e}");
            }
        });
    }

    /// Runs a worker in this process until the cluster drops; returns its scope counters.
    pub fn spawn_worker(&self, cfg: skein_worker::Config) -> Arc<ScopeStats> {
        let stats = Arc::new(ScopeStats::new());
        let shutdown = self.shutdown.child_token();
        let counted = stats.clone();
        tokio::spawn(async move {
            if let Err(e) = skein_worker::run_with_stats(cfg, shutdown, counted).await {
                panic!("worker failed: {e}");
            }
        });
        stats
    }

    /// Runs an in-process worker that also provides the test tools (effects go to
    /// [`effects_file`](Self::effects_file)); returns its scope counters.
    pub fn spawn_test_worker(&self, cfg: skein_worker::Config) -> Arc<ScopeStats> {
        let stats = Arc::new(ScopeStats::new());
        let shutdown = self.shutdown.child_token();
        let counted = stats.clone();
        let effects = self.effects_file();
        tokio::spawn(async move {
            let with_test_tools = |registry: &mut skein_worker::tools::ToolRegistry| {
                super::test_tools::register(registry, effects)
            };
            if let Err(e) =
                skein_worker::run_with_tools(cfg, shutdown, counted, with_test_tools).await
            {
                panic!("worker failed: {e}");
            }
        });
        stats
    }

    /// A token cancelled when the cluster drops: what a test's own in-process nodes stop on.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// The content of a file of `session`'s workspace in the cluster's object store, if it exists.
    pub async fn workspace_file(&self, tenant: &str, session: &str, path: &str) -> Option<String> {
        use super::workspaces;
        let objects = workspaces::object_store(
            &self.nats.url,
            &skein_common::workspace::WorkspaceStoreConfig::default(),
            0,
        )
        .await;
        let path = workspaces::path(path);
        match objects
            .read(&workspaces::session(tenant, session), &path)
            .await
        {
            Ok((content, _)) => Some(String::from_utf8_lossy(&content).into_owned()),
            Err(skein_common::workspace::WorkspaceError::NotFound(_)) => None,
            Err(e) => panic!("reading {path} from the object store: {e}"),
        }
    }

    /// Where the test tools of this cluster's workers record their effects.
    pub fn effects_file(&self) -> PathBuf {
        self.dir.join("effects.log")
    }

    /// How many times the test tools started the effect `key` (see [`effects_file`](Self::effects_file)).
    pub fn effect_starts(&self, key: &str) -> usize {
        super::test_tools::read_effects(&self.effects_file())
            .get(key)
            .map_or(0, |count| count.started)
    }

    /// Writes a scripted-model scenario whose `assistant` plays `turns`; returns its path.
    pub fn scenario(&self, turns: serde_json::Value) -> String {
        let path = self.dir.join(format!("{}.json", unique("scenario")));
        let scenario = serde_json::json!({ "agents": { "assistant": { "turns": turns } } });
        std::fs::write(&path, scenario.to_string()).expect("scenario written");
        path.display().to_string()
    }

    /// Starts `workers` in-process workers with default settings and a lead with `lead_flags`, and
    /// waits until the workers are live.
    pub async fn start_nodes(&self, workers: usize, lead_flags: &[&str]) {
        for _ in 0..workers {
            self.spawn_worker(self.worker_config(&[]));
        }
        self.spawn_lead(self.lead_config(lead_flags));
        if workers > 0 {
            self.wait_for_workers(workers).await;
        }
    }

    /// Command-line flags that point a `skein-node lead|worker` process at this cluster.
    pub fn process_args(&self, role: &str) -> Vec<String> {
        let mut args = vec![
            role.to_string(),
            "--nats-url".into(),
            self.nats.url.clone(),
            "--redis-url".into(),
            self.redis.url.clone(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        if role == "worker" {
            args.extend([
                "--workspace-root".into(),
                self.dir.join("workspaces").display().to_string(),
                "--scratch-dir".into(),
                self.dir.join("scratch").display().to_string(),
                "--heartbeat".into(),
                "500ms".into(),
            ]);
        }
        args
    }

    pub async fn client(&self) -> SkeinClient {
        SkeinClient::connect(&NatsConfig::local(self.nats.url.clone()))
            .await
            .expect("client connects to the test NATS")
    }

    /// A client that creates and publishes to `partitions` partitions (`SKEIN_PARTITIONS`).
    pub async fn partitioned_client(&self, partitions: u32) -> SkeinClient {
        SkeinClient::connect(&NatsConfig {
            partitions,
            ..NatsConfig::local(self.nats.url.clone())
        })
        .await
        .expect("client connects to the test NATS")
    }

    pub async fn store(&self) -> SessionStore {
        SessionStore::connect(&skein_common::config::RedisConfig::local(
            self.redis.url.clone(),
        ))
        .await
        .expect("store connects to the test Redis")
    }

    /// Waits until `n` workers are live in the registry.
    pub async fn wait_for_workers(&self, n: usize) {
        let store = self.store().await;
        eventually(
            &format!("{n} live workers"),
            Duration::from_secs(20),
            || {
                let store = store.clone();
                async move {
                    let live = store.live_workers().await.ok()?;
                    (live.len() >= n).then_some(())
                }
            },
        )
        .await
    }

    /// Submits and waits for the final result, collecting every event.
    pub async fn run(&self, submission: &TaskSubmission) -> (FinalResult, Vec<TurnEvent>) {
        let client = self.client().await;
        let mut events = Vec::new();
        let result = client
            .run(submission, Duration::from_secs(60), |e| {
                events.push(e.clone())
            })
            .await
            .expect("the task reaches a final result");
        (result, events)
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if std::env::var_os("SKEIN_TEST_KEEP").is_some() {
            eprintln!("kept test files in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Lead flags that use an OpenAI-compatible model at `base_url`.
pub fn model_flags(base_url: &str) -> [&str; 4] {
    ["--model-provider", "openai", "--model-base-url", base_url]
}

/// A submission to the `assistant` agent with fresh ids.
pub fn submission(tenant: &str, session: &str, input: &str) -> TaskSubmission {
    TaskSubmission {
        replay_of: None,
        v: PROTOCOL_VERSION,
        task_id: unique("task"),
        tenant: tenant.into(),
        user: "tester".into(),
        session: session.into(),
        agent: "assistant".into(),
        input: input.into(),
        overrides: None,
        deadline_ms: None,
        budget: None,
        multitask: Default::default(),
        output_schema: None,
    }
}
