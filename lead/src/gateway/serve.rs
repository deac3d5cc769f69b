//! The gateway's HTTP/1.1 server: each accepted connection served by hyper with a header timeout
//! (a connection that is ready for a request — a new one, or a keep-alive one after its last
//! response — and does not send the request's headers within it is closed, so neither a slow
//! sender nor an idle keep-alive connection holds a socket for ever), `TCP_NODELAY` so streamed
//! events go out as they come, and a shutdown that stops accepting, lets requests in flight end
//! and closes what is still open (streams that would never end) after a grace period.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a shutdown waits for open connections before it closes them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown`.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let connections = tokio_util::task::TaskTracker::new();
    // Asked to finish what they hold; then, after the grace, closed.
    let closing = CancellationToken::new();
    let closed = CancellationToken::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: wait a moment rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "a connection could not be accepted");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let (app, closing, closed) = (app.clone(), closing.clone(), closed.clone());
        connections.spawn(async move {
            tokio::select! {
                () = serve_connection(tcp, peer, app, header_timeout, closing) => {}
                () = closed.cancelled() => {}
            }
        });
    }
    drop(listener);
    connections.close();
    closing.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::info!(
            open = connections.len(),
            "connections still open after the shutdown grace are closed"
        );
        closed.cancel();
        connections.wait().await;
    }
    Ok(())
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    app: Router,
    header_timeout: Duration,
    closing: CancellationToken,
) {
    let service =
        TowerToHyperService::new(app.map_request(|request: Request<hyper::body::Incoming>| {
            request.map(axum::body::Body::new)
        }));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let connection = http.serve_connection(TokioIo::new(tcp), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            return;
        }
        () = closing.cancelled() => connection.as_mut().graceful_shutdown(),
    }
    if let Err(e) = connection.await {
        tracing::debug!(%peer, error = %e, "connection ended");
    }
}
