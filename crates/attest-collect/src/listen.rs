//! The HTTP listener under the OTLP receiver and the metrics endpoints:
//! accepting connections, bounding them, and shutting them down.
//!
//! `axum::serve` sets no deadline on reading a request's headers and no cap
//! on open connections, so a client that opens sockets and never finishes a
//! request line holds each one forever, until the process runs out of file
//! descriptors and stops accepting exporters at all. Here:
//!
//! - a connection must deliver each request's headers within the header
//!   deadline (the request deadline, `--request-timeout-secs`); an idle
//!   keep-alive connection is closed after the same time;
//! - at most `max_connections` are open at once; further clients wait in the
//!   kernel's accept backlog until one closes;
//! - on shutdown the listener stops accepting, asks every connection to
//!   finish its current request, and waits for them at most one header
//!   deadline more.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How the listener bounds its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Deadline for a request's headers, and for an idle connection.
    pub header_timeout: Duration,
}

/// The worker's metrics endpoint: a scraper or two, never many.
pub const METRICS_ONLY: Limits = Limits {
    max_connections: 64,
    header_timeout: Duration::from_secs(10),
};

/// Serves `router` on `listener` until `shutdown` completes, then drains.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, shutdown: impl Future<Output = ()>) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = open.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was
                    // accepted: retrying at once would spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A header deadline or a client hanging up ends the connection;
            // neither concerns anyone else.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.header_timeout, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after the drain deadline; closing them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn started(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new().route("/", get(|| async { "ok" }));
        let task = tokio::spawn(serve(listener, router, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop, task)
    }

    async fn get_ok(addr: std::net::SocketAddr) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .expect("an answer")
            .unwrap();
        out
    }

    #[tokio::test]
    async fn headers_not_finished_in_time_close_the_connection() {
        let limits = Limits {
            max_connections: 8,
            header_timeout: Duration::from_millis(200),
        };
        let (addr, stop, task) = started(limits).await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf))
            .await
            .expect("the server closed the connection within the deadline")
            .unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(get_ok(addr).await.ends_with("ok"));
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_one_to_close() {
        let limits = Limits {
            max_connections: 2,
            header_timeout: Duration::from_millis(500),
        };
        let (addr, stop, task) = started(limits).await;
        // Two clients that never send anything hold both places.
        let idle: Vec<_> = [
            tokio::net::TcpStream::connect(addr).await.unwrap(),
            tokio::net::TcpStream::connect(addr).await.unwrap(),
        ]
        .into();
        let t0 = std::time::Instant::now();
        // The third is served once the header deadline has closed one of them.
        assert!(get_ok(addr).await.ends_with("ok"));
        assert!(t0.elapsed() >= Duration::from_millis(300), "served before a place was free");
        drop(idle);
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_does_not_wait_for_idle_clients_past_the_deadline() {
        let limits = Limits {
            max_connections: 8,
            header_timeout: Duration::from_millis(300),
        };
        let (addr, stop, task) = started(limits).await;
        let _idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the listener stopped")
            .unwrap();
    }
}
