//! The HTTP listener under the OTLP receiver and the metrics endpoints:
//! accepting connections, bounding them, and shutting them down.
//!
//! `axum::serve` sets no deadline on reading a request's headers and no cap
//! on open connections, so a client that opens sockets and never finishes a
//! request line holds each one forever, until the process runs out of file
//! descriptors and stops accepting exporters at all. Here:
//!
//! - a connection must deliver each request's headers within the header
//!   deadline (the request deadline, `--request-timeout`); an idle
//!   keep-alive connection is closed after the same time;
//! - at most `max_connections` are open at once; further clients wait in the
//!   kernel's accept backlog until one closes;
//! - on shutdown the listener stops accepting, asks every connection to
//!   finish its current request, and waits for them at most the drain
//!   deadline ([`DRAIN_TIMEOUT`], 5 s), or until `force` completes (a second
//!   SIGTERM or Ctrl-C); connections still open then are closed, so that a
//!   client stalled mid-upload cannot hold the process past an
//!   orchestrator's grace period (30 s on Kubernetes).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// How long shutdown waits for requests in progress (uploads, answers)
/// before closing their connections. Short: exporters retry a request whose
/// connection closed, and the drain after it must fit a 30 s grace period.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How the listener bounds its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Deadline for a request's headers, and for an idle connection.
    pub header_timeout: Duration,
    /// How long shutdown waits for requests in progress.
    pub drain_timeout: Duration,
}

/// A connection whose writes must make progress within `limit`: a client
/// that never reads its answer fills its socket buffer, and the write that
/// then waits for it fails after `limit` instead of holding the connection
/// (and its place under `max_connections`) forever.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Set while a write waits; cleared by any progress.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: an error once the wait passes the limit.
    fn check(&mut self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its answer within the request deadline",
            )),
            std::task::Poll::Pending => Ok(()),
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.settle(polled, cx)
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.settle(polled, cx)
    }

    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.settle(polled, cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.settle(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S> WriteDeadline<S> {
    fn settle<T>(
        &mut self,
        polled: std::task::Poll<std::io::Result<T>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<T>> {
        match polled {
            std::task::Poll::Pending => match self.check(cx) {
                Ok(()) => std::task::Poll::Pending,
                Err(e) => std::task::Poll::Ready(Err(e)),
            },
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

/// The worker's metrics endpoint: a scraper or two, never many.
pub const METRICS_ONLY: Limits = Limits {
    max_connections: 64,
    header_timeout: Duration::from_secs(10),
    drain_timeout: DRAIN_TIMEOUT,
};

/// Serves `router` on `listener` until `shutdown` completes, then drains:
/// requests in progress get `limits.drain_timeout` to finish, or until
/// `force` completes, whichever is first. Every connection is closed when
/// this returns, so nothing holds on to the router's state.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    force: impl Future<Output = ()>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
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
        let (stream, peer) = tokio::select! {
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
        let watcher = graceful.watcher();
        let http = http.clone();
        let router = router.clone();
        let metrics = metrics.clone();
        let header_timeout = limits.header_timeout;
        connections.spawn(async move {
            // An OTLP/gRPC exporter sent here opens with HTTP/2's preface,
            // which an HTTP/1.1 server can only drop: it is counted and
            // said, so that the exporter's setting can be fixed.
            if let Some(m) = &metrics {
                let mut first = [0u8; 12];
                match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 && b"PRI * HTTP/2".starts_with(&first[..n.min(12)]) => {
                        m.unread(crate::metrics::Unread::GrpcOnHttpPort);
                        drop(permit);
                        return;
                    }
                    Ok(Ok(n)) if n > 0 => {}
                    // Nothing within the header deadline, or the client left.
                    _ => {
                        drop(permit);
                        return;
                    }
                }
            }
            let io = WriteDeadline::new(stream, header_timeout);
            // Every request of the connection knows its client, for the
            // per-client shares of the receiver's budgets (fair.rs).
            let service = tower_layer::Layer::layer(&axum::Extension(crate::fair::Peer(peer.ip())), router);
            let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
            // A header deadline or a client hanging up ends the connection;
            // neither concerns anyone else.
            let _ = watcher.watch(conn).await;
            drop(permit);
        });
        // Finished connections are reaped as others arrive.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!("connections still open after the {:?} drain deadline; closing them", limits.drain_timeout);
        }
        _ = force => {
            tracing::warn!("second signal: closing the connections still open without waiting");
        }
    }
    // Dropping a connection drops the request it was serving, and with it
    // the handler's hold on the receiver's state (and the evaluation
    // queue's sender, whose closing ends the drain).
    connections.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    type Serving = (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>);

    /// `router` served on a loopback port until the sender is used (or
    /// dropped), with `force` as the second signal.
    async fn serving(router: Router, limits: Limits, force: impl Future<Output = ()> + Send + 'static) -> Serving {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, router, limits, shutdown, force, None));
        (addr, stop, task)
    }

    async fn started(limits: Limits) -> Serving {
        serving(Router::new().route("/", get(|| async { "ok" })), limits, std::future::pending()).await
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
            drain_timeout: DRAIN_TIMEOUT,
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
            drain_timeout: DRAIN_TIMEOUT,
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
            drain_timeout: Duration::from_millis(300),
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

    /// A listener whose one route reads the request body, and a client
    /// that starts an upload and never finishes it.
    async fn stalled_upload(
        limits: Limits,
        force: impl Future<Output = ()> + Send + 'static,
    ) -> (tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>, tokio::net::TcpStream) {
        let router = Router::new().route(
            "/",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let (addr, stop, task) = serving(router, limits, force).await;
        let mut upload = tokio::net::TcpStream::connect(addr).await.unwrap();
        upload
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nstart")
            .await
            .unwrap();
        // Time for the listener to accept the connection and read the
        // headers, which the client cannot observe, also on a loaded machine.
        tokio::time::sleep(Duration::from_secs(1)).await;
        (task, stop, upload)
    }

    #[tokio::test]
    async fn a_stalled_upload_holds_shutdown_no_longer_than_the_drain_deadline() {
        let limits = Limits {
            max_connections: 8,
            // The request deadline is long; shutdown must not wait for it.
            header_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_millis(500),
        };
        let (task, stop, mut upload) = stalled_upload(limits, std::future::pending()).await;
        let t0 = std::time::Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the listener stopped at the drain deadline")
            .unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(400), "{:?}", t0.elapsed());
        // Its connection was closed.
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), upload.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_second_signal_ends_the_drain_at_once() {
        let limits = Limits {
            max_connections: 8,
            header_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(60),
        };
        let (forced, force) = tokio::sync::oneshot::channel::<()>();
        let (task, stop, _upload) = stalled_upload(limits, async {
            let _ = force.await;
        })
        .await;
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!task.is_finished(), "waiting for the upload");
        let t0 = std::time::Instant::now();
        forced.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stopped").unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
