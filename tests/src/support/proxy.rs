//! A TCP proxy in front of a server, which a test can cut (every open connection dropped, new
//! ones refused) and restore — a network partition between one client and the server, while
//! everyone else stays connected.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; it stops when dropped.
pub struct TcpProxy {
    /// The port the proxy listens on (127.0.0.1).
    pub port: u16,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<JoinSet<()>>>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free port and forwards each connection to `127.0.0.1:target`.
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1 can be bound for the proxy");
        let port = listener
            .local_addr()
            .expect("a bound listener has a local address")
            .port();
        let open = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let task = tokio::spawn(accept_loop(
            listener,
            target,
            Arc::clone(&open),
            Arc::clone(&connections),
        ));
        Self {
            port,
            open,
            connections,
            task,
        }
    }

    /// Drops every open connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: u16,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<JoinSet<()>>>,
) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        if !open.load(Ordering::SeqCst) {
            continue; // dropped: the connection is refused
        }
        let mut set = connections.lock().unwrap_or_else(PoisonError::into_inner);
        while set.try_join_next().is_some() {}
        set.spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}
