//! The OTLP/gRPC receiver (`--otlp-grpc`, default 127.0.0.1:4317): the
//! default protocol of `opentelemetry-instrument`, of `phoenix.otel.register()`
//! and of the OpenTelemetry Collector's exporters, the `loadbalancing` one
//! that routes traces to collectors included.
//!
//! tonic serves HTTP/2 and the gRPC framing (and gzip); the messages stay
//! bytes until the same decoder as OTLP/HTTP's reads them
//! ([`ReceiverState::ingest`]), so both receivers take the same payloads,
//! with the same bounds, admission rules and metrics. Refusals carry gRPC's
//! own codes: `RESOURCE_EXHAUSTED` and `UNAVAILABLE` with a `RetryInfo`
//! (exporters retry those after the delay), `INVALID_ARGUMENT`,
//! `UNAUTHENTICATED`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};

use crate::otlp::{self, Encoding};
use crate::server::{kib, ReceiverState, Refusal};

const TRACE_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const LOGS_EXPORT: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
/// The label of gRPC requests in `attest_collect_requests_total`.
const LABEL: &str = "grpc";

type BoxFuture<T> = futures::future::BoxFuture<'static, T>;

/// Messages as they came, for the shared decoder.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct Raw;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Which OTLP service a request is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Signal {
    Traces,
    Logs,
}

/// One OTLP service (traces or logs) over the receiver's shared state.
#[derive(Clone)]
pub struct OtlpService<const LOGS: bool> {
    state: Arc<ReceiverState>,
}

pub type TraceService = OtlpService<false>;
pub type LogsService = OtlpService<true>;

impl<const LOGS: bool> OtlpService<LOGS> {
    pub fn new(state: Arc<ReceiverState>) -> Self {
        OtlpService { state }
    }
}

impl NamedService for OtlpService<false> {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl NamedService for OtlpService<true> {
    const NAME: &'static str = "opentelemetry.proto.collector.logs.v1.LogsService";
}

impl<const LOGS: bool, B> tonic::codegen::Service<http::Request<B>> for OtlpService<LOGS>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let signal = match req.uri().path() {
            TRACE_EXPORT if !LOGS => Signal::Traces,
            LOGS_EXPORT if LOGS => Signal::Logs,
            other => {
                let status = Status::unimplemented(format!(
                    "{} is not served here; the OTLP methods are {TRACE_EXPORT} and {LOGS_EXPORT}",
                    crate::bounded(other, 128)
                ));
                return Box::pin(async move { Ok(status.into_http()) });
            }
        };
        let state = self.state.clone();
        let peer = req
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
            .map(|addr| addr.ip());
        Box::pin(async move {
            // A client over its share of the requests in flight leaves the
            // rest to others, as over HTTP (fair.rs); its bytes are known
            // only once tonic has read the message.
            let _share = match peer {
                Some(ip) => match state
                    .fairness
                    .admit(ip, 0, state.inflight.available_permits(), state.inflight_kib.available_permits())
                {
                    Ok(hold) => Some(hold),
                    Err(why) => {
                        state.metrics.request(http_equivalent(Code::ResourceExhausted), LABEL);
                        return Ok(retry(Code::ResourceExhausted, why, 1).into_http());
                    }
                },
                None => None,
            };
            // Taken before the message is read, as for HTTP: a call waiting
            // for its upload holds its place like any other.
            let Ok(_permit) = state.inflight.try_acquire() else {
                state.metrics.request(http_equivalent(Code::ResourceExhausted), LABEL);
                return Ok(retry(Code::ResourceExhausted, "too many export requests in flight; retry later", 1).into_http());
            };
            let max = state.max_request_bytes;
            let mut grpc = Grpc::new(RawCodec)
                .apply_compression_config(gzip(), EnabledCompressionEncodings::default())
                .apply_max_message_size_config(Some(max), Some(max));
            Ok(grpc
                .unary(
                    Export {
                        state: state.clone(),
                        signal,
                    },
                    req,
                )
                .await)
        })
    }
}

/// The OTLP metrics service, which `collect` does not read: its calls are
/// refused with `UNIMPLEMENTED` and advice, and counted, so that a metrics
/// exporter left on (`opentelemetry-instrument` turns one on by default) is
/// seen rather than silently failing.
#[derive(Clone)]
pub struct MetricsRefusal {
    state: Arc<ReceiverState>,
}

impl NamedService for MetricsRefusal {
    const NAME: &'static str = "opentelemetry.proto.collector.metrics.v1.MetricsService";
}

impl<B> tonic::codegen::Service<http::Request<B>> for MetricsRefusal {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<B>) -> Self::Future {
        let what = crate::metrics::Unread::OtlpMetrics;
        self.state.metrics.unread(what);
        self.state.metrics.request(http_equivalent(Code::Unimplemented), LABEL);
        let status = Status::unimplemented(what.advice());
        Box::pin(async move { Ok(status.into_http()) })
    }
}

fn gzip() -> EnabledCompressionEncodings {
    let mut e = EnabledCompressionEncodings::default();
    e.enable(CompressionEncoding::Gzip);
    e
}

struct Export {
    state: Arc<ReceiverState>,
    signal: Signal,
}

impl UnaryService<Bytes> for Export {
    type Response = Bytes;
    type Future = BoxFuture<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let state = self.state.clone();
        let signal = self.signal;
        Box::pin(async move {
            let (code, answer) = match export(&state, signal, request).await {
                Ok(body) => (200, Ok(Response::new(body))),
                Err(status) => (http_equivalent(status.code()), Err(status)),
            };
            state.metrics.request(code, LABEL);
            answer
        })
    }
}

async fn export(state: &ReceiverState, signal: Signal, request: Request<Bytes>) -> Result<Bytes, Status> {
    if !state.authorized(request.metadata().get("authorization").and_then(|v| v.to_str().ok())) {
        return Err(Status::unauthenticated(
            "missing or wrong bearer token in the authorization metadata",
        ));
    }
    let body = request.into_inner();
    // tonic has read the message whole (at most --max-request-bytes): it
    // holds its share of the in-flight budget while it is decoded.
    let Ok(_reserved) = state.inflight_kib.try_acquire_many(kib(body.len())) else {
        return Err(retry(
            Code::ResourceExhausted,
            "too many export request bytes in flight; retry later",
            1,
        ));
    };
    if let Some(why) = state.unavailable_reason() {
        return Err(retry(Code::Unavailable, why, 2));
    }
    let taken = match signal {
        Signal::Traces => state.ingest(body, None, Encoding::Protobuf).await,
        Signal::Logs => state.ingest_logs(body, None, Encoding::Protobuf).await,
    };
    match taken {
        Ok((rejected, reason)) => Ok(match signal {
            Signal::Traces => Bytes::from(otlp::success_body(Encoding::Protobuf, rejected, reason)),
            Signal::Logs => Bytes::from(crate::logs::success_body(Encoding::Protobuf, rejected, reason)),
        }),
        Err(Refusal::Overloaded(why)) => Err(retry(Code::ResourceExhausted, why, 1)),
        Err(Refusal::Invalid(why)) => Err(Status::invalid_argument(why)),
    }
}

/// The status code OTLP/HTTP would answer with, for the one request metric.
fn http_equivalent(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::InvalidArgument => 400,
        Code::Unauthenticated => 401,
        Code::ResourceExhausted => 429,
        Code::Unavailable => 503,
        Code::Unimplemented => 404,
        _ => 500,
    }
}

/// `google.rpc.Status` with details, as gRPC carries it in `grpc-status-details-bin`.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusDetails {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types_any::Any>,
}

mod prost_types_any {
    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }
}

/// `google.rpc.RetryInfo`: how long the exporter waits before it sends again.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// A refusal the exporter retries, after `seconds` (OTLP/gRPC: `RetryInfo`).
fn retry(code: Code, message: &str, seconds: i64) -> Status {
    let info = RetryInfo {
        retry_delay: Some(ProtoDuration { seconds, nanos: 0 }),
    };
    let details = StatusDetails {
        code: code as i32,
        message: message.to_owned(),
        details: vec![prost_types_any::Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: info.encode_to_vec(),
        }],
    };
    Status::with_details(code, message, Bytes::from(details.encode_to_vec()))
}

/// How the gRPC server bounds its clients.
pub struct Limits {
    /// Deadline for one export, from its headers to its answer.
    pub request_timeout: Duration,
    /// Export calls one connection may have in progress.
    pub streams_per_connection: u32,
}

/// Serves OTLP/gRPC on `listener` until `shutdown` completes; calls in
/// progress then get `drain` to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ReceiverState>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = started_tx.send(());
    };
    let server = tonic::transport::Server::builder()
        .timeout(limits.request_timeout)
        .max_concurrent_streams(limits.streams_per_connection)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        // Export messages are tens to hundreds of KiB: HTTP/2's default
        // 64 KiB windows would make each wait for window updates.
        .http2_adaptive_window(Some(true))
        .add_service(TraceService::new(state.clone()))
        .add_service(LogsService::new(state.clone()))
        .add_service(MetricsRefusal { state })
        // Without TCP_NODELAY, small answers wait out the peer's delayed ACK
        // (some 40 ms each), which throttled gRPC ingest to a fifth of HTTP's.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        );
    // tonic waits for every call in progress after shutdown; a client
    // stalled mid-upload must not hold the process past the drain deadline.
    tokio::select! {
        r = server => {
            if let Err(e) = r {
                tracing::warn!("the OTLP/gRPC server stopped: {e}");
            }
        }
        _ = async {
            if started_rx.await.is_ok() {
                tokio::time::sleep(drain).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!("OTLP/gRPC calls still in progress {drain:?} after shutdown began were cut off");
        }
    }
}
