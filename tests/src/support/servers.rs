//! Real `nats-server` (with JetStream) and `redis-server` processes for integration tests, each on
//! a free 127.0.0.1 port with its own temporary data directory and log file, plus the fault
//! controls later tests need (`stop`, `restart` on the same port and data). Setting
//! `SKEIN_TEST_NATS_URL` / `SKEIN_TEST_REDIS_URL` makes `start` hand out an external server
//! instead, which the handle does not own.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{read_log, unique, ChildProcess};

/// How long `start` and `restart` wait for a server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each connect/read/write of a readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// Environment variable naming an external NATS server to use instead of spawning one.
pub const NATS_URL_ENV: &str = "SKEIN_TEST_NATS_URL";
/// Environment variable naming an external Redis server to use instead of spawning one.
pub const REDIS_URL_ENV: &str = "SKEIN_TEST_REDIS_URL";

/// A port on 127.0.0.1 that was free a moment ago and that nothing else will be handed soon:
/// it lies below the kernel's ephemeral range (`ip_local_port_range`), so no outgoing connection
/// and no bind to port 0 takes it while a test holds it unbound (a server being restarted on it,
/// an upstream that is down on purpose), and this process never hands it out twice.
///
/// # Panics
/// When no port can be bound at all.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock, PoisonError};
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut handed_out = HANDED_OUT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let low = ephemeral_range_start().clamp(FIRST_TEST_PORT + 1, u16::MAX);
    let span = u32::from(low - FIRST_TEST_PORT);
    let seed = uuid::Uuid::new_v4().as_u128();
    for i in 0..512u32 {
        let offset = ((seed >> (i % 96)) as u32).wrapping_add(i.wrapping_mul(7919)) % span;
        let port = FIRST_TEST_PORT + offset as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    // Every candidate taken: a port from the ephemeral range will do.
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1 can be bound");
    listener
        .local_addr()
        .expect("a bound listener has a local address")
        .port()
}

/// Lowest port [`free_port`] hands out.
const FIRST_TEST_PORT: u16 = 10_000;

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

// ---------------------------------------------------------------------------------------------
// NATS

/// A `nats-server -js` on a free port (or an external server, see the module header).
#[derive(Debug)]
pub struct NatsServer {
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    owned: Option<OwnedServer>,
}

impl NatsServer {
    /// Starts a fresh JetStream-enabled server and waits (up to 10 s) until it sends its `INFO`
    /// line; or, when `SKEIN_TEST_NATS_URL` is set, returns a handle on that server.
    ///
    /// # Panics
    /// When `nats-server` is not installed or does not become ready in time.
    pub fn start() -> Self {
        if let Some(url) = external_url(NATS_URL_ENV) {
            return Self { url, owned: None };
        }
        Self::start_on_port(free_port())
    }

    /// Starts a fresh JetStream-enabled server on `port` (one chosen before, with [`free_port`],
    /// for processes started before the server) and waits until it is ready.
    ///
    /// # Panics
    /// When `nats-server` is not installed or does not become ready in time.
    pub fn start_on_port(port: u16) -> Self {
        let program = find_binary("nats-server")
            .unwrap_or_else(|| panic!("nats-server not found: apt-get install nats-server"));
        let dir = make_temp_dir("nats");
        let store = dir.join("jetstream");
        let args: Vec<OsString> = vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string().into(),
            "-js".into(),
            "-sd".into(),
            store.into_os_string(),
        ];
        let mut owned = OwnedServer::new(ServerKind::Nats, program, args, port, dir);
        owned.launch();
        Self {
            url: format!("nats://127.0.0.1:{port}"),
            owned: Some(owned),
        }
    }

    /// Starts a fresh JetStream-enabled server from a configuration file holding `config` (for
    /// users and their permissions, say) besides the port and store this function sets.
    ///
    /// # Panics
    /// When `nats-server` is not installed or does not become ready in time.
    pub fn start_with_config(config: &str) -> Self {
        let program = find_binary("nats-server")
            .unwrap_or_else(|| panic!("nats-server not found: apt-get install nats-server"));
        let port = free_port();
        let dir = make_temp_dir("nats");
        let store = dir.join("jetstream");
        let file = dir.join("nats.conf");
        let text = format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?} }}\n{config}\n",
            store.display().to_string()
        );
        std::fs::write(&file, text).expect("nats configuration written");
        let args: Vec<OsString> = vec!["-c".into(), file.into_os_string()];
        let mut owned = OwnedServer::new(ServerKind::Nats, program, args, port, dir);
        owned.launch();
        Self {
            url: format!("nats://127.0.0.1:{port}"),
            owned: Some(owned),
        }
    }

    /// A handle on servers this handle does not own (the nodes of a
    /// [`NatsCluster`](super::nats_cluster::NatsCluster), say); `url` may list several.
    pub fn unowned(url: String) -> Self {
        Self { url, owned: None }
    }

    /// Kills the server (SIGKILL) and waits for it to exit; the port and data stay reserved for
    /// [`restart`](Self::restart). Does nothing if it is already stopped.
    ///
    /// # Panics
    /// For an external server.
    /// The server's process id, when this handle owns a running server.
    pub fn pid(&self) -> Option<u32> {
        self.owned.as_ref()?.process.as_ref().map(ChildProcess::id)
    }

    pub fn stop(&mut self) {
        owned_mut(&mut self.owned, NATS_URL_ENV).stop();
    }

    /// Starts the server again on the same port with the same JetStream store (stopping it first
    /// if it still runs) and waits until it is ready.
    ///
    /// # Panics
    /// For an external server, or when the server does not become ready in time.
    pub fn restart(&mut self) {
        let owned = owned_mut(&mut self.owned, NATS_URL_ENV);
        owned.stop();
        owned.launch();
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        port_of(&self.owned, &self.url)
    }

    /// Whether this handle owns the server process (false for `SKEIN_TEST_NATS_URL`).
    pub fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// The server's log so far (empty for an external server); for assertion messages.
    pub fn log(&self) -> String {
        self.owned
            .as_ref()
            .map(OwnedServer::log)
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// A `redis-server` with an append-only file (data survives a restart) on a free port (or an external server, see the module
/// header).
#[derive(Debug)]
pub struct RedisServer {
    /// `redis://127.0.0.1:PORT`.
    pub url: String,
    owned: Option<OwnedServer>,
}

impl RedisServer {
    /// Starts a fresh server and waits (up to 10 s) until it answers `PING` with `+PONG`; or,
    /// when `SKEIN_TEST_REDIS_URL` is set, returns a handle on that server.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not become ready in time.
    pub fn start() -> Self {
        if let Some(url) = external_url(REDIS_URL_ENV) {
            return Self { url, owned: None };
        }
        Self::start_with_args(&[])
    }

    /// Starts a fresh server on `port` (one chosen before, with [`free_port`], for processes
    /// started before the server) and waits until it is ready.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not become ready in time.
    pub fn start_on_port(port: u16) -> Self {
        Self::spawn(port, &[])
    }

    /// Starts a fresh server with more `redis-server` arguments (TLS ports, `--requirepass`),
    /// always spawned, never external. The plain port (`url`) still answers the readiness probe.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not become ready in time.
    pub fn start_with_args(extra: &[String]) -> Self {
        Self::spawn(free_port(), extra)
    }

    fn spawn(port: u16, extra: &[String]) -> Self {
        let program = find_binary("redis-server")
            .unwrap_or_else(|| panic!("redis-server not found: apt-get install redis-server"));
        let dir = make_temp_dir("redis");
        let args: Vec<OsString> = vec![
            "--port".into(),
            port.to_string().into(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            "".into(),
            // Kept across restarts like a production Redis (fault tests restart it).
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "everysec".into(),
            "--daemonize".into(),
            "no".into(),
            "--dir".into(),
            dir.clone().into_os_string(),
        ];
        let args = args
            .into_iter()
            .chain(extra.iter().map(OsString::from))
            .collect();
        let mut owned = OwnedServer::new(ServerKind::Redis, program, args, port, dir);
        owned.launch();
        Self {
            url: format!("redis://127.0.0.1:{port}"),
            owned: Some(owned),
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Does nothing if it is already
    /// stopped.
    ///
    /// # Panics
    /// For an external server.
    /// The server's process id, when this handle owns a running server.
    pub fn pid(&self) -> Option<u32> {
        self.owned.as_ref()?.process.as_ref().map(ChildProcess::id)
    }

    pub fn stop(&mut self) {
        owned_mut(&mut self.owned, REDIS_URL_ENV).stop();
    }

    /// Starts the server again on the same port and directory (stopping it first if it still
    /// runs) and waits until it is ready. Data survives through the append-only file (up to the
    /// last second of writes, as with `appendfsync everysec`).
    ///
    /// # Panics
    /// For an external server, or when the server does not become ready in time.
    pub fn restart(&mut self) {
        let owned = owned_mut(&mut self.owned, REDIS_URL_ENV);
        owned.stop();
        owned.launch();
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        port_of(&self.owned, &self.url)
    }

    /// Whether this handle owns the server process (false for `SKEIN_TEST_REDIS_URL`).
    pub fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// The server's log so far (empty for an external server); for assertion messages.
    pub fn log(&self) -> String {
        self.owned
            .as_ref()
            .map(OwnedServer::log)
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Shared machinery

#[derive(Debug, Clone, Copy)]
enum ServerKind {
    Nats,
    Redis,
}

impl ServerKind {
    fn name(self) -> &'static str {
        match self {
            ServerKind::Nats => "nats-server",
            ServerKind::Redis => "redis-server",
        }
    }

    /// One readiness probe: connects and checks the server's greeting (NATS `INFO`) or its
    /// answer to `PING` (Redis `+PONG`).
    fn probe(self, port: u16) -> bool {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let Ok(stream) = TcpStream::connect_timeout(&address, PROBE_TIMEOUT) else {
            return false;
        };
        if stream.set_read_timeout(Some(PROBE_TIMEOUT)).is_err()
            || stream.set_write_timeout(Some(PROBE_TIMEOUT)).is_err()
        {
            return false;
        }
        match self {
            ServerKind::Nats => first_line(&stream).is_some_and(|line| line.starts_with("INFO ")),
            ServerKind::Redis => {
                let mut writer = &stream;
                if writer.write_all(b"PING\r\n").is_err() {
                    return false;
                }
                // A server that wants a password is up too.
                first_line(&stream)
                    .is_some_and(|line| line.trim_end() == "+PONG" || line.starts_with("-NOAUTH"))
            }
        }
    }
}

/// Reads one line (bounded by the socket's read timeout and 64 KiB).
fn first_line(stream: &TcpStream) -> Option<String> {
    let mut reader = BufReader::new(stream.take(64 * 1024));
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

/// A server process this handle owns, with what it needs to be started again identically.
#[derive(Debug)]
struct OwnedServer {
    kind: ServerKind,
    program: PathBuf,
    args: Vec<OsString>,
    port: u16,
    dir: PathBuf,
    log_path: PathBuf,
    process: Option<ChildProcess>,
}

impl OwnedServer {
    fn new(
        kind: ServerKind,
        program: PathBuf,
        args: Vec<OsString>,
        port: u16,
        dir: PathBuf,
    ) -> Self {
        let log_path = dir.join(format!("{}.log", kind.name()));
        Self {
            kind,
            program,
            args,
            port,
            dir,
            log_path,
            process: None,
        }
    }

    /// Spawns the process and waits until it is ready.
    fn launch(&mut self) {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).current_dir(&self.dir);
        let mut process = ChildProcess::spawn(cmd, &self.log_path);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.kind.probe(self.port) {
                break;
            }
            if !process.is_running() {
                panic!(
                    "{} exited before accepting connections on port {}; log:\n{}",
                    self.kind.name(),
                    self.port,
                    process.log()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} did not accept connections on port {} within {READY_TIMEOUT:?}; log:\n{}",
                    self.kind.name(),
                    self.port,
                    process.log()
                );
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
        self.process = Some(process);
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    fn log(&self) -> String {
        read_log(&self.log_path)
    }
}

impl Drop for OwnedServer {
    fn drop(&mut self) {
        self.stop();
        // Best effort: a leftover temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn owned_mut<'a>(owned: &'a mut Option<OwnedServer>, env: &str) -> &'a mut OwnedServer {
    owned.as_mut().unwrap_or_else(|| {
        panic!("this server comes from {env} and is not owned by the test: it cannot be stopped or restarted (unset {env} to run fault tests)")
    })
}

fn port_of(owned: &Option<OwnedServer>, url: &str) -> u16 {
    if let Some(owned) = owned {
        return owned.port;
    }
    url.rsplit(':')
        .next()
        .and_then(|tail| tail.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("cannot read a port from the external server URL {url:?}"))
}

fn external_url(env: &str) -> Option<String> {
    std::env::var(env)
        .ok()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
}

/// Looks `name` up on `PATH`, then in `/usr/sbin` and `/usr/bin`.
pub(crate) fn find_binary(name: &str) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

pub(crate) fn make_temp_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(&format!("skein-test-{kind}")));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|error| panic!("cannot create temp dir {}: {error}", dir.display()));
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn nats_round_trip(url: &str) {
        let client = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url))
            .await
            .expect("connecting to NATS finishes within 5 s")
            .expect("NATS accepts the connection");
        tokio::time::timeout(Duration::from_secs(5), client.flush())
            .await
            .expect("a NATS flush finishes within 5 s")
            .expect("NATS answers the flush");
    }

    async fn redis_ping(url: &str) {
        let client = redis::Client::open(url).expect("the Redis URL is valid");
        let mut connection = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .expect("connecting to Redis finishes within 5 s")
        .expect("Redis accepts the connection");
        let pong: String = tokio::time::timeout(
            Duration::from_secs(5),
            redis::cmd("PING").query_async(&mut connection),
        )
        .await
        .expect("PING finishes within 5 s")
        .expect("Redis answers PING");
        assert_eq!(pong, "PONG");
    }

    #[tokio::test]
    async fn nats_is_reachable_and_restart_keeps_port_and_jetstream_data() {
        let mut nats = NatsServer::start();
        nats_round_trip(&nats.url).await;
        if !nats.is_owned() {
            return;
        }
        let stream_name = unique("support_check").replace('-', "_");
        {
            let client = async_nats::connect(&nats.url)
                .await
                .expect("NATS accepts the connection");
            let js = async_nats::jetstream::new(client);
            tokio::time::timeout(
                Duration::from_secs(5),
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: stream_name.clone(),
                    subjects: vec![format!("{stream_name}.>")],
                    ..Default::default()
                }),
            )
            .await
            .expect("creating a stream finishes within 5 s")
            .expect("JetStream is enabled");
        }
        let url = nats.url.clone();
        let port = nats.port();
        nats.restart();
        assert_eq!(nats.url, url);
        assert_eq!(nats.port(), port);
        nats_round_trip(&nats.url).await;
        let client = async_nats::connect(&nats.url)
            .await
            .expect("NATS accepts the connection after the restart");
        let js = async_nats::jetstream::new(client);
        tokio::time::timeout(Duration::from_secs(5), js.get_stream(&stream_name))
            .await
            .expect("looking the stream up finishes within 5 s")
            .unwrap_or_else(|error| {
                panic!(
                    "the stream survives the restart: {error}; log:\n{}",
                    nats.log()
                )
            });
    }

    #[tokio::test]
    async fn redis_is_reachable_and_restart_keeps_port() {
        let mut redis_server = RedisServer::start();
        redis_ping(&redis_server.url).await;
        if !redis_server.is_owned() {
            return;
        }
        let url = redis_server.url.clone();
        redis_server.stop();
        let address = SocketAddr::from(([127, 0, 0, 1], redis_server.port()));
        assert!(
            TcpStream::connect_timeout(&address, PROBE_TIMEOUT).is_err(),
            "a stopped server refuses connections"
        );
        redis_server.restart();
        assert_eq!(redis_server.url, url);
        redis_ping(&redis_server.url).await;
    }

    #[test]
    fn free_ports_are_nonzero() {
        assert_ne!(free_port(), 0);
    }
}
