//! Redis deployments that survive the loss of a node, for the high-availability tests: a primary
//! with one replica watched by three Sentinels ([`SentinelGroup`]), and a Redis Cluster of three
//! primaries ([`RedisCluster`]). Every process is a real `redis-server` on a free 127.0.0.1 port,
//! always spawned (never `SKEIN_TEST_REDIS_URL`), and killed when its handle drops. Every wait is
//! bounded (20 s). A cluster node can be put behind a [`ReplyCutter`], which loses the answers to
//! requests the node still runs.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::servers::{find_binary, free_port, make_temp_dir, RedisServer};
use super::{eventually, ChildProcess};

/// The name the Sentinels know the primary by.
pub const SENTINEL_MASTER: &str = "skein";

/// Longest wait for a deployment to settle (replication up, Sentinels aware of each other, a
/// failover done, cluster slots agreed).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Slots of a Redis Cluster.
const CLUSTER_SLOTS: u16 = 16384;

/// A primary, its replica and three Sentinels watching them (quorum 2, a primary is down after
/// 1 s of silence).
pub struct SentinelGroup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<(u16, ChildProcess)>,
    dir: PathBuf,
}

impl SentinelGroup {
    /// Starts the primary, the replica and the Sentinels, and waits until the replica is in sync
    /// and every Sentinel knows the replica and the two other Sentinels (so a failover can be
    /// agreed on).
    ///
    /// # Panics
    /// When `redis-server` is missing or the group does not settle within 20 s.
    pub async fn start() -> Self {
        let primary = RedisServer::start_with_args(&[]);
        let replica = RedisServer::start_with_args(&[
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port().to_string(),
        ]);
        let program = find_binary("redis-server")
            .unwrap_or_else(|| panic!("redis-server not found: apt-get install redis-server"));
        let dir = make_temp_dir("sentinels");
        let sentinels = (0..3)
            .map(|i| {
                let port = free_port();
                let conf = dir.join(format!("sentinel-{i}.conf"));
                let text = format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                    dir = dir.display(),
                    primary = primary.port(),
                );
                std::fs::write(&conf, text).expect("sentinel configuration written");
                let mut cmd = Command::new(&program);
                cmd.arg(&conf).arg("--sentinel").current_dir(&dir);
                let process = ChildProcess::spawn(cmd, dir.join(format!("sentinel-{i}.log")));
                (port, process)
            })
            .collect();
        let group = Self {
            primary,
            replica,
            sentinels,
            dir,
        };
        group.wait_until_watched().await;
        group
    }

    /// `redis+sentinel://` naming the three Sentinels and the primary's name.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    async fn wait_until_watched(&self) {
        let replica = self.replica.url.clone();
        eventually(
            "the replica in sync with the primary",
            SETTLE_TIMEOUT,
            || {
                let replica = replica.clone();
                async move {
                    let info: String = query(&replica, redis::cmd("INFO").arg("replication"))
                        .await
                        .ok()?;
                    info.contains("master_link_status:up").then_some(())
                }
            },
        )
        .await;
        for (port, _) in &self.sentinels {
            let url = format!("redis://127.0.0.1:{port}");
            eventually(
                &format!("the Sentinel on {port} to see the replica and the other Sentinels"),
                SETTLE_TIMEOUT,
                || {
                    let url = url.clone();
                    async move {
                        let fields: Vec<String> = query(
                            &url,
                            redis::cmd("SENTINEL").arg("MASTER").arg(SENTINEL_MASTER),
                        )
                        .await
                        .ok()?;
                        let field = |name: &str| {
                            fields
                                .iter()
                                .position(|f| f == name)
                                .and_then(|i| fields.get(i + 1))
                                .cloned()
                        };
                        (field("num-slaves").as_deref() == Some("1")
                            && field("num-other-sentinels").as_deref() == Some("2"))
                        .then_some(())
                    }
                },
            )
            .await;
        }
    }

    /// The port of the primary the Sentinels name now, once every Sentinel agrees on it.
    pub async fn agreed_primary_port(&self) -> Option<u16> {
        let mut agreed = None;
        for (port, _) in &self.sentinels {
            let url = format!("redis://127.0.0.1:{port}");
            let (_, primary): (String, u16) = query(
                &url,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(SENTINEL_MASTER),
            )
            .await
            .ok()?;
            if agreed.is_some_and(|p| p != primary) {
                return None;
            }
            agreed = Some(primary);
        }
        agreed
    }

    /// Waits until every Sentinel names the replica as the primary.
    ///
    /// # Panics
    /// When that has not happened within 20 s.
    pub async fn wait_for_failover(&self) {
        let replica = self.replica.port();
        eventually(
            "the Sentinels to promote the replica",
            SETTLE_TIMEOUT,
            || async move { (self.agreed_primary_port().await == Some(replica)).then_some(()) },
        )
        .await;
    }

    /// The Sentinels' logs, for assertion messages.
    pub fn log(&self) -> String {
        self.sentinels
            .iter()
            .map(|(port, process)| format!("--- sentinel {port}\n{}", process.log()))
            .collect()
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (_, process) in &mut self.sentinels {
            process.kill();
        }
        // Best effort: a leftover temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three primaries, each serving a third of the slots.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled nodes, gives each a third of the slots, introduces them to
    /// each other and waits until every node reports the cluster up.
    ///
    /// # Panics
    /// When `redis-server` is missing or the cluster does not come up within 20 s.
    pub async fn start() -> Self {
        let bus_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let nodes: Vec<RedisServer> = bus_ports
            .iter()
            .map(|bus_port| {
                RedisServer::start_with_args(&[
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-node-timeout".into(),
                    "5000".into(),
                    // The bus port would be the client port + 10000, which nothing reserves.
                    "--cluster-port".into(),
                    bus_port.to_string(),
                ])
            })
            .collect();
        let share = CLUSTER_SLOTS / nodes.len() as u16;
        for (i, node) in nodes.iter().enumerate() {
            let first = share * i as u16;
            let last = if i + 1 == nodes.len() {
                CLUSTER_SLOTS - 1
            } else {
                first + share - 1
            };
            let () = query(
                &node.url,
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            )
            .await
            .expect("slots assigned");
        }
        for (other, bus_port) in nodes.iter().zip(&bus_ports).skip(1) {
            let () = query(
                &nodes[0].url,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(other.port())
                    .arg(bus_port),
            )
            .await
            .expect("nodes introduced");
        }
        let cluster = Self { nodes };
        for node in &cluster.nodes {
            let url = node.url.clone();
            eventually(
                "every node to report the cluster up",
                SETTLE_TIMEOUT,
                || {
                    let url = url.clone();
                    async move {
                        let info: String =
                            query(&url, redis::cmd("CLUSTER").arg("INFO")).await.ok()?;
                        (info.contains("cluster_state:ok")
                            && info.contains("cluster_known_nodes:3"))
                        .then_some(())
                    }
                },
            )
            .await;
        }
        cluster
    }

    /// `redis+cluster://` naming every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The index of the node that serves `key`'s slot.
    ///
    /// # Panics
    /// When the cluster cannot be asked.
    pub async fn node_of(&self, key: &str) -> usize {
        let slot: u16 = query(
            &self.nodes[0].url,
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .await
        .expect("CLUSTER KEYSLOT answers");
        let share = CLUSTER_SLOTS / self.nodes.len() as u16;
        usize::from(slot / share).min(self.nodes.len() - 1)
    }

    /// Puts node `index` behind `cutter` for the cluster's clients: the node announces the
    /// cutter's port, and every node names that port for the node's slots before this returns.
    /// Clients connected afterwards reach the node through the cutter.
    ///
    /// # Panics
    /// When the nodes do not agree on the new port within 20 s.
    pub async fn announce_through(&self, index: usize, cutter: &ReplyCutter) {
        let () = query(
            &self.nodes[index].url,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(cutter.port),
        )
        .await
        .expect("the announced port set");
        let first_slot = CLUSTER_SLOTS / self.nodes.len() as u16 * index as u16;
        for node in &self.nodes {
            let url = node.url.clone();
            eventually(
                "every node to name the announced port",
                SETTLE_TIMEOUT,
                || {
                    let url = url.clone();
                    async move {
                        // [first slot, last slot, [host, port, id, ...], replicas...]
                        let ranges: Vec<Vec<redis::Value>> =
                            query(&url, redis::cmd("CLUSTER").arg("SLOTS")).await.ok()?;
                        ranges
                            .into_iter()
                            .any(|range| {
                                let mut range = range.into_iter();
                                let first = range.next().map(redis::from_redis_value::<u16>);
                                let primary = range.nth(1).map(|primary| {
                                    redis::from_redis_value::<Vec<redis::Value>>(primary)
                                });
                                let port = primary.and_then(|node| {
                                    let node = node.ok()?;
                                    redis::from_redis_value::<u16>(node.get(1)?.clone()).ok()
                                });
                                matches!(first, Some(Ok(slot)) if slot == first_slot)
                                    && port == Some(cutter.port)
                            })
                            .then_some(())
                    }
                },
            )
            .await;
        }
    }

    /// The keys matching `pattern` that node `index` holds itself.
    ///
    /// # Panics
    /// When the node cannot be asked.
    pub async fn keys_on(&self, index: usize, pattern: &str) -> Vec<String> {
        query(&self.nodes[index].url, redis::cmd("KEYS").arg(pattern))
            .await
            .expect("KEYS answers")
    }
}

/// A TCP proxy in front of a node that can lose the answers to requests the node is still
/// running: [`cut_replies`](Self::cut_replies) closes the client side of every open connection and
/// keeps the node's side open, so the node runs what it was sent while its client sees the
/// connection drop. New connections are forwarded as before. Stops when dropped.
pub struct ReplyCutter {
    /// The port the proxy listens on (127.0.0.1).
    pub port: u16,
    cut: watch::Sender<u64>,
    task: JoinHandle<()>,
}

/// The node's sides of connections whose client side was closed, kept open.
type Kept = Arc<Mutex<Vec<TcpStream>>>;

impl ReplyCutter {
    /// Listens on a free port and forwards each connection to `127.0.0.1:target`.
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1 can be bound for the proxy");
        let port = listener.local_addr().expect("a bound listener").port();
        let (cut, _) = watch::channel(0u64);
        let cuts = cut.clone();
        let kept = Kept::default();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(node) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                tokio::spawn(forward(client, node, cuts.subscribe(), Arc::clone(&kept)));
            }
        });
        Self { port, cut, task }
    }

    /// Closes the client side of every connection open now; the node's side stays open.
    pub fn cut_replies(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for ReplyCutter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    mut client: TcpStream,
    mut node: TcpStream,
    mut cut: watch::Receiver<u64>,
    kept: Kept,
) {
    let severed = {
        let (mut from_client, mut to_client) = client.split();
        let (mut from_node, mut to_node) = node.split();
        tokio::select! {
            _ = cut.changed() => true,
            _ = tokio::io::copy(&mut from_client, &mut to_node) => false,
            _ = tokio::io::copy(&mut from_node, &mut to_client) => false,
        }
    };
    drop(client);
    if severed {
        kept.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(node);
    }
}

/// One command on a fresh connection to the node at `url`, bounded by 5 s.
async fn query<T: redis::FromRedisValue>(url: &str, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
    let work = async {
        let client = redis::Client::open(url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        cmd.query_async(&mut connection).await
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no answer within 5 s",
            )))
        })
}
