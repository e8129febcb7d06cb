//! The OTLP/HTTP receiver (`POST /v1/traces`) and `/metrics`, on axum.
//! Answers follow the OTLP/HTTP specification: 200 with an (optionally
//! partial-success) `ExportTraceServiceResponse`, 400 with a `google.rpc.Status`
//! for a payload that cannot be read, 429/503 with `Retry-After` when
//! overloaded (the exporter retries those).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::assemble::{Assembler, ClosedTrace, Events};
use crate::metrics::Metrics;
use crate::otlp::{self, Encoding};

/// A closed trace on its way to evaluation: the time it closed, and its
/// share of the queue's byte budget, held until its evaluation ends.
pub type Ready = (ClosedTrace, Instant, OwnedSemaphorePermit);
pub type ReadySender = mpsc::Sender<Ready>;

/// A place in the evaluation queue: a slot, and the trace's share of the
/// byte budget.
pub type Place<'a> = (mpsc::Permit<'a, Ready>, OwnedSemaphorePermit);

pub struct ReceiverState {
    pub assembler: Mutex<Assembler>,
    pub metrics: Arc<Metrics>,
    pub ready: ReadySender,
    /// KiB of closed traces queued or being evaluated (`--max-queued-bytes`).
    pub queued_kib: Arc<Semaphore>,
    pub bearer_token: Option<String>,
    pub max_request_bytes: usize,
    /// Export requests handled at once, counted from before their body is
    /// read.
    pub inflight: Semaphore,
    /// Bytes of request bodies being read or decoded at once, in KiB: a
    /// request reserves its `Content-Length` before its body is read, and one
    /// sent without (chunked, as the JavaScript exporters send) reserves as
    /// its body arrives, so slow uploads cannot hold unbounded memory.
    pub inflight_kib: Semaphore,
    /// Each client's share of `inflight` and `inflight_kib` (fair.rs).
    pub fairness: crate::fair::Fairness,
    /// Requests being inflated and decoded at once: one per core, on the
    /// blocking pool, so that decoding a large request never stalls the
    /// async workers that answer other requests and `/metrics`.
    pub decoding: Arc<Semaphore>,
    /// How long an export waits for room in a full evaluation queue before
    /// its spans that did not fit are rejected (reported as a partial
    /// success).
    pub queue_wait: std::time::Duration,
    /// With `--nats`: where traces go. While its connection is down, exports
    /// are answered 503 so that exporters keep them and send them again.
    pub publisher: Option<Arc<crate::distributed::Publisher>>,
}

/// Bytes as permits of a KiB budget (`inflight_kib`, `queued_kib`),
/// rounded up and at least 1.
pub fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX)
}

/// A budget of `bytes`, counted in KiB permits (see [`kib`]).
pub fn kib_budget(bytes: usize) -> Semaphore {
    Semaphore::new((kib(bytes) as usize).min(Semaphore::MAX_PERMITS))
}

impl ReceiverState {
    /// Closes the settled traces the evaluation queue has room for, and
    /// counts orphans dropped. A trace's place in the queue (a slot and its
    /// bytes) is taken before the trace leaves the assembler, so a settled
    /// trace is never dropped for a queue that export requests filled in
    /// the meantime: it stays open until a later poll finds room.
    pub fn close_settled(&self, now: Instant) {
        let events = {
            let mut a = self.assembler.lock().unwrap_or_else(|e| e.into_inner());
            a.poll(now, |bytes| self.place(bytes))
        };
        self.send_placed(events.dropped, events.placed);
        self.update_gauges();
    }

    /// A place in the evaluation queue for a trace of `bytes`, if there is
    /// one now.
    pub fn place(&self, bytes: usize) -> Option<Place<'_>> {
        let slot = self.ready.try_reserve().ok()?;
        let share = self.queued_kib.clone().try_acquire_many_owned(kib(bytes)).ok()?;
        Some((slot, share))
    }

    fn send_placed(&self, dropped: Vec<crate::assemble::Dropped>, placed: Vec<(ClosedTrace, Place<'_>)>) {
        for d in dropped {
            d.count(&self.metrics);
        }
        for (t, (slot, share)) in placed {
            slot.send((t, Instant::now(), share));
        }
    }

    /// A place for a trace of `bytes`, waiting for one to free up.
    async fn place_waiting(&self, bytes: usize) -> Option<Place<'_>> {
        let share = self.queued_kib.clone().acquire_many_owned(kib(bytes)).await.ok()?;
        let slot = self.ready.reserve().await.ok()?;
        Some((slot, share))
    }

    /// Adds an export's spans to the open traces and queues what that
    /// closes, waiting until `until` for room in the evaluation queue: for
    /// the export's own traces closed early, and for the earlier traces its
    /// spans would push out. Returns the export's spans that got no room in
    /// time (counted as `queue_full`), and its spans dropped for a bound or
    /// for coming after their trace closed; its answer reports both.
    pub async fn accept(&self, spans: Vec<crate::otlp::Span>, until: tokio::time::Instant) -> Accepted {
        let mut pending = spans;
        // A place taken ahead for the trace that blocked the last attempt.
        let mut spare: Option<Place<'_>> = None;
        let mut rejected = 0;
        let mut dropped = 0;
        let mut dropped_reason = None;
        loop {
            let mut events = {
                let mut a = self.assembler.lock().unwrap_or_else(|e| e.into_inner());
                a.add(std::mem::take(&mut pending), Instant::now(), |bytes| match spare.take() {
                    Some(p) if p.1.num_permits() >= kib(bytes) as usize => Some(p),
                    _ => self.place(bytes),
                })
            };
            drop(spare.take());
            self.metrics.spans_duplicate.fetch_add(events.duplicates, Ordering::Relaxed);
            dropped += events.rejected;
            dropped_reason = dropped_reason.or(events.rejected_reason);
            pending = std::mem::take(&mut events.refused);
            rejected += self.dispatch(events, until).await;
            if pending.is_empty() {
                break;
            }
            let blocking = self.assembler.lock().unwrap_or_else(|e| e.into_inner()).oldest_bytes();
            let Some(bytes) = blocking else { continue };
            match tokio::time::timeout_at(until, self.place_waiting(bytes)).await {
                Ok(Some(place)) if tokio::time::Instant::now() < until => spare = Some(place),
                _ => {
                    let n = pending.len() as u64;
                    self.metrics.dropped_spans(crate::assemble::DropReason::QueueFull.as_str(), n);
                    rejected += n;
                    break;
                }
            }
        }
        self.update_gauges();
        Accepted {
            queue_full: rejected,
            dropped,
            dropped_reason,
        }
    }

    /// Queues closed traces: placed ones at once, the export's own waiting
    /// until `until`. Returns the spans of those that did not fit in time.
    async fn dispatch(&self, events: Events<Place<'_>>, until: tokio::time::Instant) -> u64 {
        self.send_placed(events.dropped, events.placed);
        let mut rejected = 0;
        for t in events.ready {
            let spans = t.spans.len() as u64;
            let sent = tokio::time::timeout_at(until, async {
                let permit = self.queued_kib.clone().acquire_many_owned(kib(t.bytes)).await.map_err(|_| ())?;
                self.ready.send((t, Instant::now(), permit)).await.map_err(|_| ())
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                self.metrics.dropped(crate::assemble::DropReason::QueueFull.as_str(), spans);
                rejected += spans;
            }
        }
        rejected
    }

    pub fn update_gauges(&self) {
        let a = self.assembler.lock().unwrap_or_else(|e| e.into_inner());
        self.metrics.open_traces.store(a.open_traces() as u64, Ordering::Relaxed);
        self.metrics.open_bytes.store(a.open_bytes() as u64, Ordering::Relaxed);
        drop(a);
        let depth = self.ready.max_capacity() - self.ready.capacity();
        self.metrics.queue_depth.store(depth as u64, Ordering::Relaxed);
    }
}

pub fn router(state: Arc<ReceiverState>, request_timeout: std::time::Duration) -> Router {
    let metrics = state.metrics.clone();
    Router::new()
        .route("/v1/traces", post(export_traces))
        .route("/v1/logs", post(export_logs))
        .route("/metrics", get(metrics_page))
        // A client that sends its body too slowly gets 408 instead of holding the request open.
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            request_timeout,
        ))
        // The timeout answers without the handler, which counts every other answer.
        .layer(axum::middleware::map_response(move |r: Response| {
            let metrics = metrics.clone();
            async move {
                if r.status() == StatusCode::REQUEST_TIMEOUT {
                    metrics.request(408, "unknown");
                }
                r
            }
        }))
        .layer(axum::middleware::from_fn(status_bodies))
        .layer(axum::Extension(state.metrics.clone()))
        .with_state(state)
}

/// Gives the answers the handler does not write — 404 (no such path), 405
/// (wrong method) and the request deadline's 408 — the `google.rpc.Status`
/// body OTLP/HTTP prescribes for every error, in the request's encoding
/// (JSON when its `Content-Type` is not an OTLP one).
async fn status_bodies(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let encoding = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(Encoding::from_content_type)
        .unwrap_or(Encoding::Json);
    let path = request.uri().path().to_owned();
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let metrics = request.extensions().get::<Arc<Metrics>>().cloned();
    let response = next.run(request).await;
    if response.status() == StatusCode::NOT_FOUND {
        if let Some(m) = &metrics {
            m.request(404, "unknown");
            m.unread(if grpc || path.starts_with("/opentelemetry.proto.") {
                crate::metrics::Unread::GrpcOnHttpPort
            } else if path == "/v1/metrics" {
                crate::metrics::Unread::OtlpMetrics
            } else {
                crate::metrics::Unread::UnknownPath
            });
        }
    }
    // gRPC codes: NOT_FOUND, UNIMPLEMENTED, DEADLINE_EXCEEDED.
    let (code, message) = match response.status() {
        StatusCode::NOT_FOUND => (
            5,
            "no such path: OTLP/HTTP traces are POSTed to /v1/traces, GenAI log events to /v1/logs (OTLP metrics are not read; OTLP/gRPC goes to the --otlp-grpc port), metrics are at GET /metrics",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (12, "method not allowed: POST OTLP/HTTP traces to /v1/traces and log events to /v1/logs; GET /metrics"),
        StatusCode::REQUEST_TIMEOUT => (
            4,
            "the request was not read and answered within --request-timeout; send smaller batches or retry",
        ),
        _ => return response,
    };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(encoding.content_type()));
    Response::from_parts(parts, Body::from(otlp::error_body(encoding, code, message)))
}

/// The token of an `Authorization: Bearer <token>` header. The scheme is
/// case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER`) and may be
/// followed by several spaces.
pub(crate) fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start_matches(' '))
}

/// A request's `Authorization` header, as text.
fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(move || async move { render(&metrics) }))
}

fn render(metrics: &Arc<Metrics>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        metrics.render(),
    )
        .into_response()
}

/// `/metrics` beside the receiver: behind the same token as the exports
/// when one is set, since the counters name rules, agents' traffic and
/// failures.
async fn metrics_page(State(state): State<Arc<ReceiverState>>, headers: HeaderMap) -> Response {
    if !state.authorized(authorization(&headers)) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token in the Authorization header (the receiver's token guards /metrics too)\n",
        )
            .into_response();
    }
    state.update_gauges();
    render(&state.metrics)
}

fn reply(status: StatusCode, encoding: Encoding, body: Vec<u8>, retry_after: Option<u64>) -> Response {
    let mut r = (status, [(header::CONTENT_TYPE, encoding.content_type())], body).into_response();
    if let Some(secs) = retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    r
}

fn enc_label(e: Encoding) -> &'static str {
    match e {
        Encoding::Protobuf => "protobuf",
        Encoding::Json => "json",
    }
}

async fn export_traces(
    State(state): State<Arc<ReceiverState>>,
    peer: Option<axum::Extension<crate::fair::Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    export(state, peer.map(|p| p.0), headers, body, Signal::Traces).await
}

async fn export_logs(
    State(state): State<Arc<ReceiverState>>,
    peer: Option<axum::Extension<crate::fair::Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    export(state, peer.map(|p| p.0), headers, body, Signal::Logs).await
}

/// Which OTLP signal an export request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Logs,
}

async fn export(state: Arc<ReceiverState>, peer: Option<crate::fair::Peer>, headers: HeaderMap, body: Body, signal: Signal) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(encoding) = Encoding::from_content_type(content_type) else {
        state.metrics.request(415, "unknown");
        let msg = format!(
            "Content-Type '{}' is not an OTLP encoding; valid choices: application/x-protobuf, application/json",
            crate::bounded(content_type, 64)
        );
        // OTLP/HTTP: every error body is a Status; for a content type it does
        // not know, the receiver picks the encoding, here JSON.
        return reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Encoding::Json,
            otlp::error_body(Encoding::Json, 3, &msg),
            None,
        );
    };
    let label = enc_label(encoding);
    if !state.authorized(authorization(&headers)) {
        state.metrics.request(401, label);
        let body = otlp::error_body(encoding, 16, "missing or wrong bearer token in the Authorization header");
        return reply(StatusCode::UNAUTHORIZED, encoding, body, None);
    }
    let limit = state.max_request_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(&state, encoding, label);
    }
    let first = declared
        .map_or(UNSIZED_FIRST_BYTES, |n| (n as usize).min(UNSIZED_FIRST_BYTES))
        .min(limit);
    // A client over its share leaves the rest of the budget to others.
    let _share = match peer {
        Some(crate::fair::Peer(ip)) => {
            match state.fairness.admit(
                ip,
                kib(first) as usize,
                state.inflight.available_permits(),
                state.inflight_kib.available_permits(),
            ) {
                Ok(hold) => Some(hold),
                Err(why) => {
                    discard(body, limit);
                    return overloaded(&state, encoding, label, why);
                }
            }
        }
        None => None,
    };
    // Both limits are taken before the body is read: a request waiting for
    // its upload holds its share of memory like any other.
    let Ok(permit) = state.inflight.try_acquire() else {
        discard(body, limit);
        return overloaded(&state, encoding, label, "too many export requests in flight; retry later");
    };
    // What a request holds across its waits is its body as it arrives: a
    // declared length is no promise, and uploads that declare 32 MiB and
    // send nothing must not take the budget from those that send. A
    // compressed body is inflated only while it is decoded, which does not
    // wait (docs/continuous.md).
    let Ok(mut reserved) = state.inflight_kib.try_acquire_many(kib(first)) else {
        drop(permit);
        discard(body, limit);
        return overloaded(&state, encoding, label, "too many export request bytes in flight; retry later");
    };
    if let Some(why) = state.unavailable_reason() {
        drop((reserved, permit));
        discard(body, limit);
        return unavailable(&state, encoding, label, why);
    }
    let body = match read_body(&state.inflight_kib, body, limit, &mut reserved).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return too_large(&state, encoding, label),
        Err(BodyError::Overloaded { rest, read }) => {
            drop((reserved, permit));
            discard(rest, limit - read);
            return overloaded(&state, encoding, label, "too many export request bytes in flight; retry later");
        }
        Err(BodyError::TooSlow) => {
            drop((reserved, permit));
            state.metrics.request(408, label);
            let msg = format!(
                "the request body arrived more slowly than {} KiB/s after its first {} s; its share of the receiver's budget is given to others: send it again faster, or in smaller batches",
                MIN_UPLOAD_BYTES_PER_SEC / 1024,
                MIN_UPLOAD_GRACE.as_secs()
            );
            return reply(StatusCode::REQUEST_TIMEOUT, encoding, otlp::error_body(encoding, 4, &msg), None);
        }
        Err(BodyError::Failed(e)) => {
            state.metrics.request(400, label);
            let msg = format!("the request body could not be read: {}", crate::bounded(&e, 200));
            return reply(StatusCode::BAD_REQUEST, encoding, otlp::error_body(encoding, 3, &msg), None);
        }
    };
    let content_encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let taken = match signal {
        Signal::Traces => state.ingest(body, content_encoding, encoding).await,
        Signal::Logs => state.ingest_logs(body, content_encoding, encoding).await,
    };
    match taken {
        Ok((rejected, reason)) => {
            state.metrics.request(200, label);
            let body = match signal {
                Signal::Traces => otlp::success_body(encoding, rejected, reason),
                Signal::Logs => crate::logs::success_body(encoding, rejected, reason),
            };
            reply(StatusCode::OK, encoding, body, None)
        }
        Err(Refusal::Overloaded(why)) => overloaded(&state, encoding, label, why),
        Err(Refusal::Invalid(why)) => {
            state.metrics.request(400, label);
            reply(StatusCode::BAD_REQUEST, encoding, otlp::error_body(encoding, 3, &why), None)
        }
    }
}

/// Why an export whose body was read was not taken, whatever carried it.
pub enum Refusal {
    /// The receiver is shutting down; the exporter retries.
    Overloaded(&'static str),
    /// The payload cannot be read (answered 400 / `INVALID_ARGUMENT`).
    Invalid(String),
}

impl ReceiverState {
    /// Whether a request with this `authorization` (header or gRPC
    /// metadata) may be served: any, when no token is set.
    pub fn authorized(&self, authorization: Option<&str>) -> bool {
        self.bearer_token
            .as_deref()
            .is_none_or(|token| bearer_token(authorization.unwrap_or("")) == Some(token))
    }

    /// Why no trace can be taken now, whoever sends it: the workers' NATS
    /// server is unreachable, or the evaluation queue is full. Exporters
    /// keep the batch and retry (503 / `UNAVAILABLE`).
    pub fn unavailable_reason(&self) -> Option<&'static str> {
        if self.publisher.as_ref().is_some_and(|p| !p.connected()) {
            return Some("the NATS server is unreachable, so traces cannot be handed to the workers; retry later");
        }
        if self.publisher.as_ref().is_some_and(|p| p.refusing()) {
            return Some("the NATS server is not taking traces (JetStream refused or did not acknowledge a publish), so they cannot be handed to the workers; retry later");
        }
        if self.ready.capacity() == 0 || self.queued_kib.available_permits() == 0 {
            return Some("evaluation queue is full; retry later");
        }
        None
    }

    /// Inflates a body and decodes it with `decode` on the blocking pool,
    /// one request per core at a time, so that decoding a large request never
    /// stalls the async workers that answer other requests and `/metrics`.
    async fn decode<T: Send + 'static>(
        &self,
        body: bytes::Bytes,
        content_encoding: Option<String>,
        decode: impl FnOnce(&[u8], usize) -> Result<T, otlp::BadPayload> + Send + 'static,
    ) -> Result<Result<T, otlp::BadPayload>, Refusal> {
        let Ok(_decoding) = self.decoding.clone().acquire_owned().await else {
            return Err(Refusal::Overloaded("the receiver is shutting down; retry later"));
        };
        let max_bytes = self.max_request_bytes;
        Ok(tokio::task::spawn_blocking(move || {
            otlp::decompress(&body, content_encoding.as_deref(), max_bytes).and_then(|raw| decode(&raw, max_bytes))
        })
        .await
        .unwrap_or_else(|e| Err(otlp::BadPayload(format!("decoding the request failed: {e}")))))
    }

    /// Like [`ReceiverState::ingest`], for a log request: its GenAI events
    /// go to the assembler beside the spans they name.
    pub async fn ingest_logs(
        &self,
        body: bytes::Bytes,
        content_encoding: Option<String>,
        encoding: Encoding,
    ) -> Result<(u64, Option<String>), Refusal> {
        let decoded = self
            .decode(body, content_encoding, move |raw, max| crate::logs::decode(raw, encoding, max))
            .await?
            .map_err(|e| Refusal::Invalid(e.0))?;
        self.metrics.log_records_ignored.fetch_add(decoded.ignored, Ordering::Relaxed);
        self.metrics
            .log_events_received
            .fetch_add(decoded.events.len() as u64, Ordering::Relaxed);
        let queue_full = self
            .accept(decoded.events, tokio::time::Instant::now() + self.queue_wait)
            .await
            .queue_full;
        Ok(match queue_full {
            0 => (0, None),
            n => (
                n,
                Some(format!(
                    "{n} GenAI events were not kept: the evaluation queue stayed full; send them again later"
                )),
            ),
        })
    }

    /// Inflates and decodes an export's body off the async workers, and
    /// hands its spans to the assembler. The answer: how many spans were
    /// rejected, and why (an OTLP partial success).
    pub async fn ingest(
        &self,
        body: bytes::Bytes,
        content_encoding: Option<String>,
        encoding: Encoding,
    ) -> Result<(u64, Option<String>), Refusal> {
        let decoded = self
            .decode(body, content_encoding, move |raw, max| otlp::decode(raw, encoding, max))
            .await?;
        let decoded = match decoded {
            Ok(d) => d,
            Err(e) => {
                self.metrics.dropped(crate::assemble::DropReason::Malformed.as_str(), 0);
                return Err(Refusal::Invalid(e.0));
            }
        };
        if decoded.rejected > 0 {
            self.metrics.dropped_spans("invalid_id", decoded.rejected);
        }
        let accepted = decoded.spans.len() as u64;
        self.metrics.spans_received.fetch_add(accepted, Ordering::Relaxed);
        let accepted = self.accept(decoded.spans, tokio::time::Instant::now() + self.queue_wait).await;
        let mut reasons: Vec<String> = decoded.reject_reason.into_iter().collect();
        if let Some(reason) = accepted.dropped_reason.filter(|_| accepted.dropped > 0) {
            reasons.push(format!("{} spans were dropped: {}", accepted.dropped, dropped_why(reason)));
        }
        if accepted.queue_full > 0 {
            reasons.push(format!(
                "{} spans were not evaluated: the evaluation queue (--queue-capacity, --max-queued-bytes) stayed full; send them again later or raise --queue-capacity, --max-queued-bytes or --concurrency",
                accepted.queue_full
            ));
        }
        let rejected = decoded.rejected + accepted.dropped + accepted.queue_full;
        Ok((rejected, (!reasons.is_empty()).then(|| reasons.join("; "))))
    }
}

/// What [`ReceiverState::accept`] did with an export's spans.
pub struct Accepted {
    /// Spans that got no room in the evaluation queue in time.
    pub queue_full: u64,
    /// Spans dropped by the assembler, and the first reason.
    pub dropped: u64,
    pub dropped_reason: Option<crate::assemble::DropReason>,
}

/// Why spans were dropped, for an exporter's partial-success message.
fn dropped_why(reason: crate::assemble::DropReason) -> &'static str {
    use crate::assemble::DropReason;
    match reason {
        DropReason::TooManySpans => "their trace has more spans than --max-trace-spans allows",
        DropReason::TraceTooLarge => "their trace is larger than --max-trace-bytes allows",
        DropReason::LateSpan => "their trace was already evaluated or dropped (they came after --settle; raise it if the spans of one trace arrive that far apart)",
        _ => "their trace was dropped",
    }
}

/// What a request without `Content-Length` reserves before its first byte.
const UNSIZED_FIRST_BYTES: usize = 64 * 1024;

/// Why a request body was not read whole.
enum BodyError {
    /// Over `--max-request-bytes`.
    TooLarge,
    /// Its bytes did not fit in what the in-flight budget had left; `rest`
    /// is what was not read of it, after `read` bytes.
    Overloaded { rest: Body, read: usize },
    /// The connection failed while it was read.
    Failed(String),
    /// It arrived more slowly than the minimum upload rate.
    TooSlow,
}

/// Reads a request body of at most `limit` bytes. Bytes beyond what
/// `reserved` holds (a body without `Content-Length`) are reserved from
/// `budget` as they arrive, doubling the reservation each time, so a chunked
/// upload takes the budget a few times rather than per chunk; when the
/// budget has no room to double, just what the body needs. Once the body is
/// whole, what it did not use is given back: it holds what it is, not what
/// it might have been, while it is decoded and queued.
async fn read_body<'a>(
    budget: &'a Semaphore,
    mut body: Body,
    limit: usize,
    reserved: &mut tokio::sync::SemaphorePermit<'a>,
) -> Result<bytes::Bytes, BodyError> {
    use http_body_util::BodyExt;
    let mut buf = bytes::BytesMut::with_capacity((reserved.num_permits() * 1024).min(limit));
    let started = tokio::time::Instant::now();
    loop {
        // A body must keep arriving at [`MIN_UPLOAD_BYTES_PER_SEC`] once its
        // grace has passed: a client trickling bytes holds the budget for
        // seconds, not for the whole request deadline.
        let due = MIN_UPLOAD_GRACE + Duration::from_secs_f64(buf.len() as f64 / MIN_UPLOAD_BYTES_PER_SEC as f64);
        let Ok(frame) = tokio::time::timeout_at(started + due, body.frame()).await else {
            return Err(BodyError::TooSlow);
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| BodyError::Failed(e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(BodyError::TooLarge);
        }
        let have = reserved.num_permits() as u32;
        if kib(len) > have {
            let want = kib(len).max(have.saturating_mul(2)).min(kib(limit));
            let more = budget
                .try_acquire_many(want - have)
                .or_else(|_| budget.try_acquire_many(kib(len) - have));
            let Ok(more) = more else {
                return Err(BodyError::Overloaded { rest: body, read: len });
            };
            reserved.merge(more);
            // The buffer grows with the reservation, not past it.
            buf.reserve((reserved.num_permits() * 1024).min(limit).saturating_sub(buf.len()));
        }
        buf.extend_from_slice(&data);
    }
    let unused = reserved.num_permits().saturating_sub(kib(buf.len()) as usize);
    drop(reserved.split(unused));
    Ok(buf.freeze())
}

/// How long a body may take before it must arrive at the minimum rate.
const MIN_UPLOAD_GRACE: Duration = Duration::from_secs(2);
/// The slowest upload kept once its grace has passed, in bytes per second.
const MIN_UPLOAD_BYTES_PER_SEC: u64 = 64 * 1024;

/// Longest a refused request's body is read for, to be thrown away.
const DISCARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads what is left of a refused request's body, at most `limit` bytes
/// and for at most [`DISCARD_TIMEOUT`], and throws it away, holding none of
/// the in-flight budget. The refusal is answered at once; the connection
/// stays open while the body is read. An exporter learns to retry later
/// only if it reads the 429 or 503: a connection closed on an upload still
/// being sent is reset, and the exporter sees a broken pipe instead (the
/// OpenTelemetry JavaScript exporter then drops the batch). A body over the
/// limit is left to that reset: it could never have been accepted.
fn discard(mut body: Body, limit: usize) {
    use http_body_util::BodyExt;
    tokio::spawn(tokio::time::timeout(DISCARD_TIMEOUT, async move {
        let mut read = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > limit {
                break;
            }
        }
    }));
}

fn too_large(state: &ReceiverState, encoding: Encoding, label: &'static str) -> Response {
    state.metrics.request(413, label);
    let msg = format!(
        "the request body is over the {}-byte limit (--max-request-bytes); send smaller batches",
        state.max_request_bytes
    );
    reply(StatusCode::PAYLOAD_TOO_LARGE, encoding, otlp::error_body(encoding, 3, &msg), None)
}

fn overloaded(state: &ReceiverState, encoding: Encoding, label: &'static str, why: &str) -> Response {
    state.metrics.request(429, label);
    reply(StatusCode::TOO_MANY_REQUESTS, encoding, otlp::error_body(encoding, 8, why), Some(1))
}

/// 503: the collector cannot take traces now, whoever sends them (its queue
/// is full, or the workers' NATS server is unreachable). OTLP's
/// `UNAVAILABLE` status, so exporters keep the batch and retry.
fn unavailable(state: &ReceiverState, encoding: Encoding, label: &'static str, why: &str) -> Response {
    state.metrics.request(503, label);
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        encoding,
        otlp::error_body(encoding, 14, why),
        Some(2),
    )
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, read_body, BodyError};
    use axum::body::Body;
    use tokio::sync::Semaphore;

    #[tokio::test]
    async fn a_body_reserves_what_it_needs_when_doubling_does_not_fit_and_gives_back_the_rest() {
        // 100 KiB of budget, 64 KiB reserved up front (a chunked upload).
        let budget = Semaphore::new(100);
        let mut reserved = budget.try_acquire_many(64).unwrap();
        // 70 KiB: doubling to 128 does not fit, the 6 KiB more it needs does.
        let body = read_body(&budget, Body::from(vec![b'x'; 70 * 1024]), 1 << 20, &mut reserved).await;
        assert_eq!(body.ok().map(|b| b.len()), Some(70 * 1024));
        assert_eq!((reserved.num_permits(), budget.available_permits()), (70, 30));
        drop(reserved);
        // A small body gives back what it did not use of its first 64 KiB.
        let mut reserved = budget.try_acquire_many(64).unwrap();
        read_body(&budget, Body::from(vec![b'x'; 1000]), 1 << 20, &mut reserved)
            .await
            .ok()
            .unwrap();
        assert_eq!((reserved.num_permits(), budget.available_permits()), (1, 99));
        // Past what the budget has left: 429, not a partial read.
        let _held = budget.try_acquire_many(90).unwrap();
        let refused = read_body(&budget, Body::from(vec![b'x'; 20 * 1024]), 1 << 20, &mut reserved).await;
        assert!(matches!(refused, Err(BodyError::Overloaded { read: 20480, .. })));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR   s3cret",
            " Bearer s3cret ",
        ] {
            assert_eq!(bearer_token(header), Some("s3cret"), "{header:?}");
        }
        for header in ["", "Bearer", "Basic s3cret", "Bearers3cret", "Token s3cret"] {
            assert_ne!(bearer_token(header), Some("s3cret"), "{header:?}");
        }
    }
}
