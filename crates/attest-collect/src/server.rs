//! The OTLP/HTTP receiver (`POST /v1/traces`) and `/metrics`, on axum.
//! Answers follow the OTLP/HTTP specification: 200 with an (optionally
//! partial-success) `ExportTraceServiceResponse`, 400 with a `google.rpc.Status`
//! for a payload that cannot be read, 429/503 with `Retry-After` when
//! overloaded (the exporter retries those).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{mpsc, Semaphore};

use crate::assemble::{Assembler, ClosedTrace, Events};
use crate::metrics::Metrics;
use crate::otlp::{self, Encoding};

/// Closed traces on their way to evaluation, with the time they closed.
pub type ReadySender = mpsc::Sender<(ClosedTrace, Instant)>;

pub struct ReceiverState {
    pub assembler: Mutex<Assembler>,
    pub metrics: Arc<Metrics>,
    pub ready: ReadySender,
    pub bearer_token: Option<String>,
    pub max_request_bytes: usize,
    pub inflight: Semaphore,
}

impl ReceiverState {
    /// Routes assembler events: ready traces to the queue, drops to the counters.
    pub fn dispatch(&self, events: Events) {
        for d in events.dropped {
            self.metrics.dropped(d.reason.as_str(), d.spans);
        }
        for t in events.ready {
            let spans = t.spans.len() as u64;
            if self.ready.try_send((t, Instant::now())).is_err() {
                self.metrics.dropped(crate::assemble::DropReason::QueueFull.as_str(), spans);
            }
        }
        self.update_gauges();
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
    let limit = state.max_request_bytes;
    Router::new()
        .route("/v1/traces", post(export))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        // A client that sends its body too slowly gets 408 instead of holding the request open.
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            request_timeout,
        ))
        .with_state(state)
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(move || async move { render(&metrics) }))
}

fn render(metrics: &Metrics) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics.render()).into_response()
}

async fn metrics(State(state): State<Arc<ReceiverState>>) -> Response {
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

async fn export(State(state): State<Arc<ReceiverState>>, headers: HeaderMap, body: Bytes) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(encoding) = Encoding::from_content_type(content_type) else {
        state.metrics.request(415, "unknown");
        let msg = format!(
            "Content-Type '{}' is not an OTLP encoding; valid choices: application/x-protobuf, application/json",
            crate::bounded(content_type, 64)
        );
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, msg).into_response();
    };
    let label = enc_label(encoding);
    if let Some(token) = &state.bearer_token {
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
        if given.strip_prefix("Bearer ") != Some(token.as_str()) {
            state.metrics.request(401, label);
            let body = otlp::error_body(encoding, 16, "missing or wrong bearer token in the Authorization header");
            return reply(StatusCode::UNAUTHORIZED, encoding, body, None);
        }
    }
    let Ok(_permit) = state.inflight.try_acquire() else {
        state.metrics.request(429, label);
        let body = otlp::error_body(encoding, 8, "too many export requests in flight; retry later");
        return reply(StatusCode::TOO_MANY_REQUESTS, encoding, body, Some(1));
    };
    if state.ready.capacity() == 0 {
        state.metrics.request(503, label);
        let body = otlp::error_body(encoding, 14, "evaluation queue is full; retry later");
        return reply(StatusCode::SERVICE_UNAVAILABLE, encoding, body, Some(2));
    }
    let content_encoding = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok());
    let decoded = otlp::decompress(&body, content_encoding, state.max_request_bytes).and_then(|raw| otlp::decode(&raw, encoding));
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            state.metrics.request(400, label);
            state.metrics.dropped(crate::assemble::DropReason::Malformed.as_str(), 0);
            return reply(StatusCode::BAD_REQUEST, encoding, otlp::error_body(encoding, 3, &e.0), None);
        }
    };
    let accepted = decoded.spans.len() as u64;
    state.metrics.spans_received.fetch_add(accepted, Ordering::Relaxed);
    let events = {
        let mut a = state.assembler.lock().unwrap_or_else(|e| e.into_inner());
        a.add(decoded.spans, Instant::now())
    };
    state.dispatch(events);
    state.metrics.request(200, label);
    reply(
        StatusCode::OK,
        encoding,
        otlp::success_body(encoding, decoded.rejected, decoded.reject_reason),
        None,
    )
}
