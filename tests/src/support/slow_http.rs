//! A tiny HTTP server for `http_fetch` in tests: answers every GET after a fixed delay with a body
//! naming the path, so a test can make tool calls that take long enough to spread over workers or
//! to hit a timeout.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A running slow server; stops when dropped.
pub struct SlowHttp {
    pub base_url: String,
    task: tokio::task::JoinHandle<()>,
}

impl SlowHttp {
    pub async fn start(delay: Duration) -> Self {
        Self::start_on(0, delay).await
    }

    /// Like [`start`](Self::start), on a given port (0 for any free one).
    pub async fn start_on(port: u16, delay: Duration) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the port");
        let port = listener.local_addr().expect("bound address").port();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).to_string();
                    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                    tokio::time::sleep(delay).await;
                    let body = format!("slow answer for {path}");
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        Self {
            base_url: format!("http://127.0.0.1:{port}"),
            task,
        }
    }
}

impl Drop for SlowHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}
