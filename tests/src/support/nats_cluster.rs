//! A JetStream cluster of real `nats-server` processes for one test: each node on free client
//! and route ports, with its own `server_name` (also its placement tag) and store directory, all routed to each other in
//! one uniquely named cluster. Nodes can be killed (SIGKILL) and restarted with their data; the
//! stream leader of any stream can be looked up by server name. Every node stops when the
//! cluster is dropped.

use std::time::Duration;

use async_nats::jetstream;

use super::servers::{free_port, NatsServer};
use super::{eventually, unique};

/// How long [`NatsCluster::wait_ready`] waits for the cluster to elect its JetStream leader.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The nodes of a `nats-server` cluster with JetStream.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
    names: Vec<String>,
}

impl NatsCluster {
    /// Starts `size` nodes (each ready to accept clients; see [`wait_ready`](Self::wait_ready)
    /// for JetStream).
    ///
    /// # Panics
    /// When `nats-server` is not installed or a node does not start.
    pub fn start(size: usize) -> Self {
        let cluster = unique("skein");
        let route_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let routes = route_ports
            .iter()
            .map(|port| format!("nats-route://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(", ");
        let names: Vec<String> = (0..size).map(|i| format!("{cluster}-n{i}")).collect();
        let nodes = names
            .iter()
            .zip(&route_ports)
            .map(|(name, port)| {
                NatsServer::start_with_config(&format!(
                    "server_name: {name}\n\
                     server_tags: [\"{name}\"]\n\
                     cluster {{\n  name: {cluster}\n  listen: 127.0.0.1:{port}\n  routes: [{routes}]\n}}"
                ))
            })
            .collect();
        Self { nodes, names }
    }

    /// Every node's URL, comma separated (as `SKEIN_NATS_URL` takes them).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|node| node.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A handle on the whole cluster by its URL list, owning no process (for a
    /// [`TestCluster`](super::cluster::TestCluster)).
    pub fn handle(&self) -> NatsServer {
        NatsServer::unowned(self.url())
    }

    /// The node called `server_name`.
    ///
    /// # Panics
    /// When no node has that name.
    pub fn index_of(&self, server_name: &str) -> usize {
        self.names
            .iter()
            .position(|name| name == server_name)
            .unwrap_or_else(|| panic!("no node named {server_name:?} in {:?}", self.names))
    }

    /// The `server_name` of node `index`, which is also its only placement tag.
    pub fn name(&self, index: usize) -> &str {
        &self.names[index]
    }

    /// Node `index` (its URL, its log).
    pub fn node(&self, index: usize) -> &NatsServer {
        &self.nodes[index]
    }

    /// Kills node `index` (SIGKILL); its port and data stay for [`restart`](Self::restart).
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].stop();
    }

    /// Starts node `index` again with its data.
    pub fn restart(&mut self, index: usize) {
        self.nodes[index].restart();
    }

    /// Waits until JetStream answers API requests through every node (the cluster has elected
    /// its meta leader and every node knows it).
    ///
    /// # Panics
    /// When that takes longer than 30 s.
    pub async fn wait_ready(&self) {
        for node in &self.nodes {
            let client = async_nats::connect(node.url.as_str())
                .await
                .unwrap_or_else(|e| panic!("connecting to {}: {e}", node.url));
            eventually(
                &format!("JetStream ready through {}", node.url),
                READY_TIMEOUT,
                || {
                    let client = client.clone();
                    async move {
                        let reply = tokio::time::timeout(
                            Duration::from_secs(2),
                            client.request("$JS.API.INFO", "".into()),
                        )
                        .await
                        .ok()?
                        .ok()?;
                        let info: serde_json::Value =
                            serde_json::from_slice(&reply.payload).ok()?;
                        info.get("error").is_none().then_some(())
                    }
                },
            )
            .await;
        }
    }

    /// The index of the node that leads `stream`, asked through any live node; waits (up to
    /// 30 s) for the stream to have a leader.
    ///
    /// # Panics
    /// When no live node names a leader in time.
    pub async fn stream_leader(&self, stream: &str) -> usize {
        let leader = eventually(&format!("a leader of {stream}"), READY_TIMEOUT, || async {
            let info = self.stream_info(stream).await?;
            info.cluster?.leader
        })
        .await;
        self.index_of(&leader)
    }

    /// The info of `stream` through the cluster's URL list, if some node answers.
    pub async fn stream_info(&self, stream: &str) -> Option<jetstream::stream::Info> {
        let servers = skein_common::bus::server_addrs(&self.url()).ok()?;
        let client = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(servers))
            .await
            .ok()?
            .ok()?;
        let context = jetstream::new(client);
        let mut found = context.get_stream(stream).await.ok()?;
        found.info().await.ok().cloned()
    }
}
