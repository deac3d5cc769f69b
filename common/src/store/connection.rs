//! The store's connection to Redis, one type whatever the deployment: a single node (a
//! `ConnectionManager` that reconnects), the primary that Sentinels name (followed across a
//! failover), or a Redis Cluster (the `redis` crate's cluster client, which follows `MOVED`
//! and `ASK` and keeps the slot map). The rest of the store sees a cloneable
//! `redis::aio::ConnectionLike` and does not know which.
//!
//! Invariants:
//! - every request is bounded: connect and response timeouts on every node, and a bound on each
//!   Sentinel lookup; an unreachable Redis is an error, never a hang;
//! - a request that failed is sent again only when it cannot have been applied: the primary
//!   refused it as a replica (`READONLY`) or the connection to it could not be made; on a Redis
//!   Cluster also when a node refused it unrun (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`, ...), the
//!   cluster client itself resending nothing. Any other failure (a connection that dropped while
//!   the request was out, a timeout) is returned (the caller's attempt accounting decides what
//!   happens next), after the connection has moved on to the primary the Sentinels name now;
//! - the Sentinels are asked once for all requests that saw the same connection fail, and not
//!   again within [`LOOKUP_PAUSE`] of a lookup that found no primary;
//! - on a Redis Cluster every multi-key step (script, transaction, pipeline) names keys of one
//!   hash slot (see `keys`), and [`RedisConnection::scan`] visits every primary.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};

use super::topology::{SentinelTarget, Topology};
use super::StoreError;
use crate::config::RedisConfig;

/// Longest wait for a connection to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for a node's answer.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest one try of a cluster request may take; past this long since its first try, a request
/// is not sent again.
const CLUSTER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries at reconnecting to one node before the error is returned.
const RETRIES: usize = 3;
/// Tries at a cluster request that the nodes refused unrun (see [`refused_in_cluster`]).
const CLUSTER_TRIES: u32 = 4;
/// Pause before a cluster request is sent again, doubled at each try (the client rebuilds its
/// slot map meanwhile).
const CLUSTER_RESEND_PAUSE: Duration = Duration::from_millis(100);
/// Longest a Sentinel lookup of the primary may take (every Sentinel asked, the primary checked).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// After a lookup that found no primary (a failover under way), requests fail without asking the
/// Sentinels again for this long.
const LOOKUP_PAUSE: Duration = Duration::from_millis(250);

/// A connection to the store's Redis, whatever its topology; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) enum RedisConnection {
    Single(ConnectionManager),
    Sentinel(FollowedPrimary),
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Connects as the settings say; fails clearly if Redis cannot be reached within a few
    /// seconds.
    pub(crate) async fn open(cfg: &RedisConfig) -> Result<Self, StoreError> {
        let password = cfg.password().map_err(StoreError::Config)?;
        let certificates = certificates(cfg)?;
        match Topology::parse(&cfg.url, cfg.cluster).map_err(StoreError::Config)? {
            Topology::Single(url) => {
                let mut info = url.as_str().into_connection_info()?;
                if let Some(password) = password {
                    if info.redis_settings().password().is_none() {
                        let settings = info.redis_settings().clone().set_password(password);
                        info = info.set_redis_settings(settings);
                    }
                }
                let client = match certificates {
                    Some(certificates) => redis::Client::build_with_tls(info, certificates)?,
                    None => redis::Client::open(info)?,
                };
                let connection =
                    ConnectionManager::new_with_config(client, manager_config()).await?;
                Ok(RedisConnection::Single(connection))
            }
            Topology::Sentinel(target) => {
                let sentinel_password = cfg.sentinel_password().map_err(StoreError::Config)?;
                let client = sentinel_client(&target, password, sentinel_password, certificates)?;
                Ok(RedisConnection::Sentinel(
                    FollowedPrimary::open(client).await?,
                ))
            }
            Topology::Cluster(nodes) => {
                let password = unless_in_url(&nodes, password)?;
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .overall_response_timeout(Some(CLUSTER_REQUEST_TIMEOUT))
                    // The client would send a request again after its connection dropped, when
                    // the node may have applied it: `cluster_command` resends what was refused.
                    .retries(0);
                if let Some(password) = password {
                    builder = builder.password(password);
                }
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                let connection = builder.build()?.get_async_connection().await?;
                Ok(RedisConnection::Cluster(connection))
            }
        }
    }

    /// Every key matching `pattern`, asked for `count` at a time with `SCAN` (Redis is never
    /// blocked); on a Redis Cluster, from every primary.
    pub(crate) async fn scan(&self, pattern: &str, count: usize) -> RedisResult<Vec<String>> {
        let mut found = Vec::new();
        match self {
            RedisConnection::Cluster(cluster) => {
                let mut cluster = cluster.clone();
                for (host, port) in cluster_primaries(&mut cluster).await? {
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let mut cursor = 0;
                    loop {
                        let reply = cluster
                            .route_command(scan_step(cursor, pattern, count), node.clone())
                            .await?;
                        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
                        found.extend(keys);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
            single => {
                let mut conn = single.clone();
                let mut cursor = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = scan_step(cursor, pattern, count)
                        .query_async(&mut conn)
                        .await?;
                    found.extend(keys);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
        Ok(found)
    }
}

fn scan_step(cursor: u64, pattern: &str, count: usize) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count);
    cmd
}

/// The address of every primary of the cluster, from `CLUSTER SLOTS`.
async fn cluster_primaries(cluster: &mut ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let reply: Vec<Vec<Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(cluster)
        .await?;
    let mut primaries = Vec::new();
    for range in reply {
        // [first slot, last slot, [host, port, id, ...], replicas...]
        let Some(primary) = range.into_iter().nth(2) else {
            return Err(unexpected("a CLUSTER SLOTS range without its primary"));
        };
        let mut node = redis::from_redis_value::<Vec<Value>>(primary)?.into_iter();
        let (Some(host), Some(port)) = (node.next(), node.next()) else {
            return Err(unexpected("a CLUSTER SLOTS primary without host and port"));
        };
        let address = (
            redis::from_redis_value::<String>(host)?,
            redis::from_redis_value::<u16>(port)?,
        );
        if !primaries.contains(&address) {
            primaries.push(address);
        }
    }
    Ok(primaries)
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, what))
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(connection) => connection.req_packed_command(cmd),
            RedisConnection::Cluster(connection) => Box::pin(cluster_command(connection, cmd)),
            RedisConnection::Sentinel(primary) => Box::pin(primary.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            RedisConnection::Cluster(connection) => {
                Box::pin(cluster_commands(connection, pipeline, offset, count))
            }
            RedisConnection::Sentinel(primary) => {
                Box::pin(primary.commands(pipeline, offset, count))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(connection) => connection.get_db(),
            RedisConnection::Cluster(connection) => connection.get_db(),
            RedisConnection::Sentinel(primary) => primary.current().1.get_db(),
        }
    }
}

/// A request to a Redis Cluster, sent again (after a growing pause, within
/// [`CLUSTER_REQUEST_TIMEOUT`]) while the nodes refuse it unrun.
async fn cluster_command(connection: &mut ClusterConnection, cmd: &Cmd) -> RedisResult<Value> {
    let started = Instant::now();
    let mut tries = 1;
    loop {
        match connection.req_packed_command(cmd).await {
            Err(error) if resend_in_cluster(&error, 1, tries, started) => {
                tokio::time::sleep(CLUSTER_RESEND_PAUSE * 2u32.pow(tries - 1)).await;
                tries += 1;
            }
            answered => return answered,
        }
    }
}

/// [`cluster_command`] for a pipeline (a transaction or not). A transaction refused with
/// `MOVED` goes to the node named next: the client neither follows nor learns from a redirection
/// inside a transaction's answer.
async fn cluster_commands(
    connection: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let started = Instant::now();
    let mut tries = 1;
    let mut moved = None;
    loop {
        let answered = match moved.take() {
            Some((host, port)) => {
                let node = SingleNodeRoutingInfo::ByAddress { host, port };
                connection
                    .route_pipeline(pipeline.clone(), offset, count, node)
                    .await
            }
            None => {
                connection
                    .req_packed_commands(pipeline, offset, count)
                    .await
            }
        };
        match answered {
            Err(error) if resend_in_cluster(&error, count, tries, started) => {
                moved = moved_to(&error);
                if moved.is_none() {
                    tokio::time::sleep(CLUSTER_RESEND_PAUSE * 2u32.pow(tries - 1)).await;
                }
                tries += 1;
            }
            answered => return answered,
        }
    }
}

/// The node a `MOVED` in `error` names (`<slot> <host>:<port>`).
fn moved_to(error: &RedisError) -> Option<(String, u16)> {
    let address = |detail: &str| {
        let address = detail.split_ascii_whitespace().nth(1)?;
        let (host, port) = address.rsplit_once(':')?;
        Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
    };
    if error.kind() == ErrorKind::Server(ServerErrorKind::Moved) {
        return address(error.detail()?);
    }
    let errors = error.clone().into_server_errors()?;
    errors.iter().find_map(|(_, error)| {
        (error.kind() == Some(ServerErrorKind::Moved))
            .then(|| address(error.details()?))
            .flatten()
    })
}

fn resend_in_cluster(error: &RedisError, commands: usize, tries: u32, started: Instant) -> bool {
    tries < CLUSTER_TRIES
        && started.elapsed() < CLUSTER_REQUEST_TIMEOUT
        && refused_in_cluster(error, commands)
}

/// Whether a Redis Cluster surely did not apply the request of `commands` commands that failed
/// with `error`: no connection to its node was made, or the node refused it without running it
/// (its slot is served elsewhere, or not at all yet; the node is a replica now or still loading).
/// A transaction counts when every error in it is such a refusal (it was aborted); other
/// pipelines when every command got one. A pipeline's keys share one slot (see `keys`), so one
/// refusal of the slot's node stands for all of them.
fn refused_in_cluster(error: &RedisError, commands: usize) -> bool {
    let refusal = |kind: Option<ServerErrorKind>| {
        matches!(
            kind,
            Some(
                ServerErrorKind::Moved
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::ReadOnly
            )
        )
    };
    if error.is_connection_refusal() || error.kind() == ErrorKind::ClusterConnectionNotFound {
        return true;
    }
    let aborted = error.kind() == ErrorKind::Server(ServerErrorKind::ExecAbort);
    match error.clone().into_server_errors() {
        Some(errors) => {
            !errors.is_empty()
                && (aborted || errors.len() >= commands)
                && errors.iter().all(|(_, error)| refusal(error.kind()))
        }
        None => matches!(error.kind(), ErrorKind::Server(kind) if refusal(Some(kind))),
    }
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(RETRIES)
}

/// The password setting, unless the nodes' URLs carry a password (which then stands, as for one
/// node; the cluster client would let the setting override it).
fn unless_in_url(nodes: &[String], password: Option<String>) -> Result<Option<String>, StoreError> {
    let Some(first) = nodes.first() else {
        return Ok(password);
    };
    let in_url = first.as_str().into_connection_info()?;
    Ok(password.filter(|_| in_url.redis_settings().password().is_none()))
}

/// The CA to trust for `rediss://` nodes, when one is configured.
fn certificates(cfg: &RedisConfig) -> Result<Option<TlsCertificates>, StoreError> {
    let Some(ca) = &cfg.tls_ca else {
        return Ok(None);
    };
    let root_cert = std::fs::read(ca).map_err(|e| {
        StoreError::Config(format!("cannot read the CA file {}: {e}", ca.display()))
    })?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    }))
}

/// A Sentinel client for the target's primary: TLS to Sentinels and data nodes alike when the
/// URL says `rediss+sentinel`, the data nodes' credentials from the URL (or the password
/// setting), the Sentinels' password from its own setting.
fn sentinel_client(
    target: &SentinelTarget,
    password: Option<String>,
    sentinel_password: Option<String>,
    certificates: Option<TlsCertificates>,
) -> Result<SentinelClient, StoreError> {
    let sentinels = target
        .sentinels
        .iter()
        .map(|(host, port)| match target.tls {
            true => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            false => ConnectionAddr::Tcp(host.clone(), *port),
        });
    let mut builder =
        SentinelClientBuilder::new(sentinels, &target.master, SentinelServerType::Master)?
            .set_client_to_redis_db(target.db);
    // The data nodes' credentials: the URL's (percent-decoded by the redis crate's URL parser),
    // else the password setting.
    let mut password = password;
    if let Some(userinfo) = &target.userinfo {
        let (host, port) = &target.sentinels[0];
        let url = format!(
            "redis://{userinfo}@{}:{port}/",
            super::topology::bracketed(host)
        );
        let info = url.as_str().into_connection_info()?;
        if let Some(user) = info.redis_settings().username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(from_url) = info.redis_settings().password() {
            password = Some(from_url.to_owned());
        }
    }
    if let Some(password) = password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(password) = sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if target.tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates);
        }
    }
    Ok(builder.build()?)
}

/// The primary that Sentinels name, followed across a failover: requests go to a connection
/// manager on the primary found last; a failure that says the primary may have moved (the
/// connection broke or could not be made, a timeout, `READONLY` from a demoted primary) makes
/// the Sentinels be asked again, and later requests go to the primary they name.
#[derive(Clone)]
pub(crate) struct FollowedPrimary(Arc<Followed>);

struct Followed {
    /// Held while the Sentinels are asked, so one lookup serves every request that saw the same
    /// connection fail (an async lock: the lookup awaits the network).
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// Never held across an await.
    current: Mutex<Current>,
}

#[derive(Clone)]
struct Current {
    /// Counts the primaries followed, so a lookup is not repeated for a connection already
    /// replaced.
    generation: u64,
    connection: ConnectionManager,
    /// When a lookup last found no primary.
    failed_lookup: Option<Instant>,
}

impl FollowedPrimary {
    async fn open(mut sentinels: SentinelClient) -> Result<Self, StoreError> {
        let connection = lookup(&mut sentinels).await?;
        Ok(Self(Arc::new(Followed {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: Mutex::new(Current {
                generation: 0,
                connection,
                failed_lookup: None,
            }),
        })))
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let current = self
            .0
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (current.generation, current.connection.clone())
    }

    async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (generation, mut connection) = self.current();
        let result = connection.send_packed_command(cmd).await;
        if let Err(error) = &result {
            if let Some(mut primary) = self.follow(generation, error).await {
                return primary.send_packed_command(cmd).await;
            }
        }
        result
    }

    async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (generation, mut connection) = self.current();
        let result = connection
            .send_packed_commands(pipeline, offset, count)
            .await;
        if let Err(error) = &result {
            if let Some(mut primary) = self.follow(generation, error).await {
                return primary.send_packed_commands(pipeline, offset, count).await;
            }
        }
        result
    }

    /// After `error` on the connection of `generation`: if the primary may have moved, makes sure
    /// the Sentinels were asked since, and returns the connection to the primary now followed when
    /// the failed request can be sent again (it cannot have been applied).
    async fn follow(&self, generation: u64, error: &RedisError) -> Option<ConnectionManager> {
        if !primary_may_have_moved(error) {
            return None;
        }
        let again = never_applied(error);
        let mut sentinels = self.0.sentinels.lock().await;
        {
            let current = self
                .0
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if current.generation != generation {
                // Another request already followed the primary.
                return again.then(|| current.connection.clone());
            }
            if current
                .failed_lookup
                .is_some_and(|at| at.elapsed() < LOOKUP_PAUSE)
            {
                return None;
            }
        }
        let found = lookup(&mut sentinels).await;
        let mut current = self
            .0
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match found {
            Ok(connection) => {
                tracing::info!(error = %error, "following the primary the Sentinels name now");
                *current = Current {
                    generation: generation + 1,
                    connection,
                    failed_lookup: None,
                };
                again.then(|| current.connection.clone())
            }
            Err(lookup_error) => {
                tracing::warn!(error = %lookup_error, "the Sentinels name no reachable primary yet");
                current.failed_lookup = Some(Instant::now());
                None
            }
        }
    }
}

/// Asks the Sentinels for the primary and connects to it, within [`LOOKUP_TIMEOUT`].
async fn lookup(sentinels: &mut SentinelClient) -> Result<ConnectionManager, StoreError> {
    let found = async {
        let client = sentinels.async_get_client().await?;
        ConnectionManager::new_with_config(client, manager_config()).await
    };
    match tokio::time::timeout(LOOKUP_TIMEOUT, found).await {
        Ok(found) => Ok(found?),
        Err(_) => Err(StoreError::Unavailable(RedisError::from((
            ErrorKind::Io,
            "the Sentinels did not name a reachable primary in time",
        )))),
    }
}

/// Whether the failure may mean the primary is elsewhere now.
fn primary_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_unrecoverable_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || is_read_only(error)
}

/// Whether the request surely was not applied: a replica refused it, or no connection was made.
fn never_applied(error: &RedisError) -> bool {
    is_read_only(error) || error.is_connection_refusal()
}

/// `READONLY`, alone or inside a failed transaction or pipeline: the node is a replica now.
fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || error.code() == Some("READONLY")
        || error
            .clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, error)| error.code() == "READONLY"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_refusal_is_a_move_that_can_be_sent_again() {
        let refused = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(primary_may_have_moved(&refused));
        assert!(never_applied(&refused));
    }

    #[test]
    fn a_broken_connection_is_a_move_but_the_request_is_not_sent_again() {
        let broken = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(primary_may_have_moved(&broken));
        assert!(!never_applied(&broken));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(never_applied(&refused));
    }

    #[test]
    fn a_cluster_request_is_sent_again_only_when_a_node_refused_it_unrun() {
        let moved = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Moved),
            "MOVED",
            "3999 127.0.0.1:7001".to_owned(),
        ));
        assert!(refused_in_cluster(&moved, 1));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(refused_in_cluster(&refused, 1));
        // Out on a connection that dropped, or unanswered in time: it may have been applied.
        for maybe_applied in [
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::TimedOut,
        ] {
            let error = RedisError::from(std::io::Error::from(maybe_applied));
            assert!(!refused_in_cluster(&error, 1), "{maybe_applied:?}");
        }
        // Moved in the middle of a slot's migration: the node may have run other commands.
        let ask = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "ASK",
            "3999 127.0.0.1:7001".to_owned(),
        ));
        assert!(!refused_in_cluster(&ask, 1));
        assert_eq!(moved_to(&moved), Some(("127.0.0.1".into(), 7001)));
        assert_eq!(moved_to(&ask), None);
        assert_eq!(moved_to(&refused), None);
    }

    #[test]
    fn a_cluster_urls_password_stands_over_the_setting() {
        let set = || Some("from-setting".to_owned());
        let with = ["redis://u:from%20url@a:7000/".to_owned()];
        assert_eq!(unless_in_url(&with, set()).ok(), Some(None));
        let without = ["redis://a:7000/".to_owned()];
        assert_eq!(unless_in_url(&without, set()).ok(), Some(set()));
    }

    #[test]
    fn an_answer_from_the_primary_is_no_move() {
        let wrong_type = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        assert!(!primary_may_have_moved(&wrong_type));
    }
}
