//! Evaluation results as OpenTelemetry events (`--export-otlp`): each result
//! becomes a `gen_ai.evaluation.result` log record (GenAI semantic
//! conventions) carrying the evaluated trace's trace id and the span it is
//! about, so a backend that joins logs to traces shows the scores next to
//! the trace.
//!
//! Never on the evaluation path: [`OtlpExport::send`] puts events in a
//! bounded queue ([`QUEUE_EVENTS`]) and returns; a thread of its own sends
//! them in batches, over OTLP/HTTP (protobuf) or OTLP/gRPC, retrying with
//! backoff. A slow or absent backend loses events only past the queue's
//! bound or after the last retry, and each loss is counted.

use crate::{BoxFuture, Durability, ResultRecord, ResultStore, Status};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Events waiting to be sent; past it new ones are dropped and counted.
pub const QUEUE_EVENTS: usize = 10_000;
/// Events per export request.
pub const BATCH_EVENTS: usize = 512;
/// How long a batch waits to fill before it goes.
const LINGER: Duration = Duration::from_millis(500);
/// Tries per batch before its events count as lost.
pub const ATTEMPTS: u32 = 5;
/// The first retry's wait; each later one doubles it.
const BACKOFF: Duration = Duration::from_millis(250);
/// One export request's deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a drain waits for queued events to be sent.
pub const FLUSH_WAIT: Duration = Duration::from_secs(10);
/// Longest explanation sent, in bytes.
const MAX_EXPLANATION: usize = 4096;

/// The wire an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies, to `<endpoint>/v1/logs` (or the URL's own path).
    Http,
    /// OTLP/gRPC (`LogsService/Export`).
    Grpc,
}

/// `--export-otlp` and its protocol, shared by every front door that has them.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Export to OpenTelemetry")]
pub struct ExportArgs {
    /// Send every result as a `gen_ai.evaluation.result` OpenTelemetry event to this OTLP endpoint
    /// (http://host:4318 for OTLP/HTTP, http://host:4317 with --export-otlp-protocol grpc).
    #[arg(long = "export-otlp", value_name = "URL")]
    pub endpoint: Option<String>,
    /// The endpoint's protocol.
    #[arg(long = "export-otlp-protocol", value_enum, default_value = "http", requires = "endpoint")]
    pub protocol: Protocol,
}

/// One result, as exported.
#[derive(Debug, Clone)]
pub struct Event {
    /// The evaluated trace's id.
    pub trace_id: String,
    /// The span the result is about (the step's, else the agent's), hex.
    pub span_id: Option<String>,
    /// The rule or suite and the assertion id.
    pub name: String,
    pub score: Option<f64>,
    pub status: Option<Status>,
    pub explanation: String,
    /// Set when the evaluation itself failed (no verdict).
    pub error_type: Option<String>,
}

impl Event {
    pub fn of(r: &ResultRecord) -> Event {
        Event {
            trace_id: r.key.trace_id.clone(),
            span_id: r.span_id.clone(),
            name: format!("{}/{}", r.key.rule, r.key.assertion_id),
            score: Some(r.score),
            status: Some(r.status),
            explanation: r.explanation.clone(),
            error_type: None,
        }
    }
}

/// What happened to the events, for `/metrics` and the tests.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub queued: AtomicU64,
    pub sent: AtomicU64,
    /// Refused at once: the queue was full.
    pub dropped: AtomicU64,
    /// Lost after [`ATTEMPTS`] tries, or refused by the backend.
    pub failed: AtomicU64,
    pub retries: AtomicU64,
    pub requests: AtomicU64,
}

impl ExportStats {
    /// Events that were sent or given up on.
    fn settled(&self) -> u64 {
        self.sent.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }

    /// Events queued and neither sent nor given up on yet.
    fn waiting(&self) -> u64 {
        self.queued.load(Ordering::Relaxed).saturating_sub(self.settled())
    }

    /// Events not sent: dropped with the queue full, given up on, or still
    /// queued.
    fn lost(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed) + self.waiting()
    }

    /// One line for a person: what was sent and what was lost, and why.
    pub fn summary(&self) -> String {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (sent, failed, dropped) = (ld(&self.sent), ld(&self.failed), ld(&self.dropped));
        let waiting = self.waiting();
        format!(
            "{sent} evaluation events sent, {} lost ({dropped} dropped with the queue full, {failed} refused or unanswered after retries, {waiting} still queued at exit)",
            self.lost()
        )
    }

    /// Logs [`ExportStats::summary`]: a warning when any event was lost,
    /// so that it is said at `--log-level warn` too.
    pub fn log_summary(&self) {
        if self.lost() > 0 {
            tracing::warn!("--export-otlp: {}", self.summary());
        } else {
            tracing::info!("--export-otlp: {}", self.summary());
        }
    }

    /// Prometheus exposition lines.
    /// The exporter's counters, in the collector's `/metrics`.
    pub(crate) fn encode(&self, enc: &mut prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            (
                "attest_export_events_sent",
                "Evaluation events the OTLP backend accepted.",
                &self.sent,
            ),
            (
                "attest_export_events_dropped",
                "Evaluation events dropped because the export queue was full.",
                &self.dropped,
            ),
            (
                "attest_export_events_failed",
                "Evaluation events lost after every retry, or refused by the backend.",
                &self.failed,
            ),
            ("attest_export_retries", "Export requests tried again.", &self.retries),
            ("attest_export_requests", "Export requests sent.", &self.requests),
        ] {
            crate::metrics::counter(enc, name, help, ld(v))?;
        }
        crate::metrics::gauge(
            enc,
            "attest_export_queue_events",
            "Evaluation events waiting to be sent.",
            self.waiting(),
        )
    }
}

struct Queue {
    events: std::collections::VecDeque<Event>,
    closed: bool,
}

/// The exporter; cheap to share.
pub struct OtlpExport {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    pub stats: Arc<ExportStats>,
    /// Signalled when events settle (sent or lost), for [`OtlpExport::flush`].
    settled: Arc<(Mutex<()>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    endpoint: String,
}

impl OtlpExport {
    /// Starts the sending thread. `front_door` names the process in the
    /// events' resource (`collect`, `worker`, `eval`, `ecp`).
    pub fn start(endpoint: &str, protocol: Protocol, front_door: &str) -> anyhow::Result<OtlpExport> {
        let url = reqwest::Url::parse(endpoint).map_err(|e| {
            anyhow::anyhow!("--export-otlp {endpoint}: not a URL ({e}); give http://host:4318 (OTLP/HTTP) or http://host:4317 with --export-otlp-protocol grpc")
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!("--export-otlp {endpoint}: the scheme must be http or https");
        }
        let transport = match protocol {
            Protocol::Http => {
                let path = if url.path() == "/" || url.path().is_empty() {
                    url.join("/v1/logs")?
                } else {
                    url.clone()
                };
                Transport::Http {
                    client: reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build()?,
                    url: path,
                }
            }
            Protocol::Grpc => Transport::Grpc {
                endpoint: endpoint.to_owned(),
            },
        };
        let queue = Arc::new((
            Mutex::new(Queue {
                events: std::collections::VecDeque::new(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let stats = Arc::new(ExportStats::default());
        let settled = Arc::new((Mutex::new(()), Condvar::new()));
        let resource = Resource {
            attributes: vec![kv("service.name", "attest-engine"), kv("attest.front_door", front_door)],
            ..Default::default()
        };
        let sender = Sender {
            queue: queue.clone(),
            stats: stats.clone(),
            settled: settled.clone(),
            transport,
            resource,
        };
        let thread = std::thread::Builder::new()
            .name("attest-export".into())
            .spawn(move || sender.run())?;
        Ok(OtlpExport {
            queue,
            stats,
            settled,
            thread: Mutex::new(Some(thread)),
            endpoint: url.to_string(),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Queues an event; never waits. A full queue drops it (counted).
    pub fn send(&self, event: Event) {
        let (lock, wake) = &*self.queue;
        let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
        if q.events.len() >= QUEUE_EVENTS {
            let before = self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_multiple_of(10_000) {
                tracing::warn!(endpoint = %self.endpoint, dropped = before + 1, "the OTLP export queue is full: evaluation events are dropped");
            }
            return;
        }
        q.events.push_back(event);
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if q.events.len() >= BATCH_EVENTS {
            wake.notify_one();
        }
    }

    /// Waits until every event queued so far is sent or lost, or until
    /// `deadline`; whether everything settled.
    pub fn flush(&self, deadline: Instant) -> bool {
        let target = self.stats.queued.load(Ordering::Relaxed);
        self.queue.1.notify_one();
        let (lock, cv) = &*self.settled;
        let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.stats.settled() < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // Nudged again in case the sender was lingering for a full batch.
            self.queue.1.notify_one();
            guard = cv
                .wait_timeout(guard, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// For a one-shot command at its end: sends what is queued (for
    /// [`FLUSH_WAIT`] at most) and stops the thread; the summary when
    /// anything was not sent, for the command to say.
    pub fn finish(&self) -> Option<String> {
        self.close(Instant::now() + FLUSH_WAIT);
        let s = &self.stats;
        (s.lost() > 0).then(|| format!("--export-otlp {}: {}", self.endpoint, s.summary()))
    }

    /// Sends what is queued (until `deadline`) and stops the thread.
    pub fn close(&self, deadline: Instant) {
        self.flush(deadline);
        {
            let (lock, wake) = &*self.queue;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            wake.notify_all();
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // The thread ends within one request's deadline of the close.
            let _ = t.join();
        }
    }
}

impl Drop for OtlpExport {
    fn drop(&mut self) {
        let (lock, wake) = &*self.queue;
        lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        wake.notify_all();
    }
}

/// The sink of a collector or a worker's sink group.
impl ResultStore for OtlpExport {
    fn record<'a>(&'a self, results: &'a [ResultRecord], _: Durability) -> BoxFuture<'a, anyhow::Result<()>> {
        // Best effort by design: a sink never waits on the backend, and
        // what it cannot send is counted, not offered again.
        for r in results {
            self.send(Event::of(r));
        }
        Box::pin(async { Ok(()) })
    }

    fn evaluation_failed(&self, trace: &crate::trace_doc::TraceDoc, rule: &str, error: &crate::RuleFailure) {
        self.send(Event {
            trace_id: trace.trace_id().to_owned(),
            span_id: trace.span_id(None).map(str::to_owned),
            name: rule.to_owned(),
            score: None,
            status: None,
            explanation: error.message.clone(),
            error_type: Some(error.error_type.clone().unwrap_or_else(|| "EVALUATION_ERROR".into())),
        });
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            // Polled rather than waited on: a runtime thread never blocks.
            let target = self.stats.queued.load(Ordering::Relaxed);
            let deadline = tokio::time::Instant::now() + FLUSH_WAIT;
            while self.stats.settled() < target && tokio::time::Instant::now() < deadline {
                self.queue.1.notify_one();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        })
    }
}

enum Transport {
    Http { client: reqwest::Client, url: reqwest::Url },
    Grpc { endpoint: String },
}

struct Sender {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    stats: Arc<ExportStats>,
    settled: Arc<(Mutex<()>, Condvar)>,
    transport: Transport,
    resource: Resource,
}

/// How one request went.
enum Sent {
    /// Accepted; the backend rejected this many of them.
    Accepted(u64),
    /// Worth trying again (no answer, 429, 502-504, gRPC unavailable).
    Retry(String),
    /// Refused for good.
    Refused(String),
}

impl Sender {
    fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the OTLP exporter");
                return;
            }
        };
        let mut grpc = None;
        // After a batch used every try, the backend is taken to be down:
        // later batches get one try each until one goes through, so an
        // absent backend cannot hold the queue for minutes.
        let mut down = false;
        loop {
            let batch = {
                let (lock, wake) = &*self.queue;
                let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
                if q.events.is_empty() && !q.closed {
                    q = wake.wait_timeout(q, LINGER).unwrap_or_else(|e| e.into_inner()).0;
                }
                if q.events.len() < BATCH_EVENTS && !q.closed && !q.events.is_empty() {
                    // A partial batch waits a little for company.
                    q = wake.wait_timeout(q, LINGER).unwrap_or_else(|e| e.into_inner()).0;
                }
                if q.events.is_empty() && q.closed {
                    return;
                }
                let n = q.events.len().min(BATCH_EVENTS);
                q.events.drain(..n).collect::<Vec<Event>>()
            };
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            let request = self.request(batch);
            let mut outcome = Sent::Retry(String::new());
            let attempts = if down { 1 } else { ATTEMPTS };
            for attempt in 0..attempts {
                if attempt > 0 {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(BACKOFF * 2u32.pow(attempt - 1));
                }
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                outcome = runtime.block_on(self.send(&request, &mut grpc));
                if !matches!(outcome, Sent::Retry(_)) {
                    break;
                }
            }
            down = matches!(outcome, Sent::Retry(_));
            match outcome {
                Sent::Accepted(rejected) => {
                    self.stats.sent.fetch_add(n - rejected.min(n), Ordering::Relaxed);
                    self.stats.failed.fetch_add(rejected.min(n), Ordering::Relaxed);
                }
                Sent::Retry(why) | Sent::Refused(why) => {
                    tracing::warn!(events = n, error = %why, "evaluation events were not exported");
                    self.stats.failed.fetch_add(n, Ordering::Relaxed);
                }
            }
            let (_, cv) = &*self.settled;
            cv.notify_all();
        }
    }

    fn request(&self, events: Vec<Event>) -> ExportLogsServiceRequest {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let log_records = events.into_iter().map(|e| record(e, now)).collect();
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(self.resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "attest-engine".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    log_records,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    async fn send(
        &self,
        request: &ExportLogsServiceRequest,
        grpc: &mut Option<
            opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient<tonic::transport::Channel>,
        >,
    ) -> Sent {
        match &self.transport {
            Transport::Http { client, url } => {
                let sent = client
                    .post(url.clone())
                    .header("content-type", "application/x-protobuf")
                    .body(request.encode_to_vec())
                    .send()
                    .await;
                let response = match sent {
                    Ok(r) => r,
                    Err(e) => return Sent::Retry(format!("{e}")),
                };
                let status = response.status();
                let body = response.bytes().await.unwrap_or_default();
                if status.is_success() {
                    let rejected = ExportLogsServiceResponse::decode(body.as_ref())
                        .ok()
                        .and_then(|r| r.partial_success)
                        .map_or(0, |p| p.rejected_log_records.max(0) as u64);
                    Sent::Accepted(rejected)
                } else if matches!(status.as_u16(), 429 | 502 | 503 | 504) {
                    Sent::Retry(format!("HTTP {status}"))
                } else {
                    Sent::Refused(format!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])))
                }
            }
            Transport::Grpc { endpoint } => {
                use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
                if grpc.is_none() {
                    let channel = match tonic::transport::Endpoint::from_shared(endpoint.clone()) {
                        Ok(e) => e.connect_timeout(Duration::from_secs(5)).timeout(REQUEST_TIMEOUT).connect_lazy(),
                        Err(e) => return Sent::Refused(format!("{e}")),
                    };
                    *grpc = Some(LogsServiceClient::new(channel));
                }
                let Some(client) = grpc.as_mut() else {
                    return Sent::Retry("no channel".into());
                };
                match client.export(request.clone()).await {
                    Ok(r) => Sent::Accepted(r.into_inner().partial_success.map_or(0, |p| p.rejected_log_records.max(0) as u64)),
                    Err(s) => match s.code() {
                        tonic::Code::Unavailable
                        | tonic::Code::ResourceExhausted
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Aborted
                        | tonic::Code::Cancelled => Sent::Retry(format!("gRPC {}: {}", s.code(), s.message())),
                        _ => Sent::Refused(format!("gRPC {}: {}", s.code(), s.message())),
                    },
                }
            }
        }
    }
}

fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn kv_f64(key: &str, value: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::DoubleValue(value)),
        }),
        ..Default::default()
    }
}

/// `hex` as bytes when it is exactly `len` bytes of hex (an OpenTelemetry id).
fn id_bytes(hex: &str, len: usize) -> Vec<u8> {
    if hex.len() != len * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Vec::new();
    }
    (0..len)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The log record of one event.
fn record(e: Event, now: u64) -> LogRecord {
    let mut attributes = vec![kv("gen_ai.evaluation.name", e.name)];
    if let Some(score) = e.score {
        attributes.push(kv_f64("gen_ai.evaluation.score.value", score));
    }
    if let Some(status) = e.status {
        attributes.push(kv("gen_ai.evaluation.score.label", status.as_str()));
    }
    if !e.explanation.is_empty() {
        attributes.push(kv("gen_ai.evaluation.explanation", clip(&e.explanation, MAX_EXPLANATION)));
    }
    let failed = e.error_type.is_some() || e.status.is_some_and(|s| s != Status::Pass);
    if let Some(t) = e.error_type {
        attributes.push(kv("error.type", t));
    }
    // The trace id as the engine knows it, whatever its form (a test
    // trace's id is no OpenTelemetry id).
    attributes.push(kv("attest.trace_id", clip(&e.trace_id, 256)));
    // A sub-trace of an assembled trace is `<trace id>:<span id>`.
    let otel_trace = e.trace_id.split(':').next().unwrap_or_default();
    LogRecord {
        time_unix_nano: now,
        observed_time_unix_nano: now,
        severity_number: if failed {
            SeverityNumber::Warn as i32
        } else {
            SeverityNumber::Info as i32
        },
        severity_text: String::new(),
        body: None,
        attributes,
        dropped_attributes_count: 0,
        flags: 0,
        trace_id: id_bytes(otel_trace, 16),
        span_id: e.span_id.as_deref().map(|s| id_bytes(s, 8)).unwrap_or_default(),
        event_name: "gen_ai.evaluation.result".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bytes_only_when_they_are_opentelemetry_ids() {
        assert_eq!(id_bytes("0af7651916cd43dd8448eb211c80319c", 16).len(), 16);
        assert!(id_bytes("trc_abc123", 16).is_empty());
        assert_eq!(
            id_bytes("b7ad6b7169203331", 8),
            vec![0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]
        );
    }

    #[test]
    fn a_record_carries_the_semantic_conventions() {
        let r = record(
            Event {
                trace_id: "0af7651916cd43dd8448eb211c80319c:b7ad6b7169203331".into(),
                span_id: Some("b7ad6b7169203331".into()),
                name: "refund/ordered".into(),
                score: Some(0.0),
                status: Some(Status::HardFail),
                explanation: "x".repeat(10_000),
                error_type: None,
            },
            1,
        );
        assert_eq!(r.event_name, "gen_ai.evaluation.result");
        assert_eq!(r.trace_id.len(), 16);
        assert_eq!(r.span_id.len(), 8);
        let get = |k: &str| {
            r.attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            get("gen_ai.evaluation.name"),
            Some(any_value::Value::StringValue("refund/ordered".into()))
        );
        assert_eq!(
            get("gen_ai.evaluation.score.label"),
            Some(any_value::Value::StringValue("hard_fail".into()))
        );
        assert_eq!(get("gen_ai.evaluation.score.value"), Some(any_value::Value::DoubleValue(0.0)));
        match get("gen_ai.evaluation.explanation") {
            Some(any_value::Value::StringValue(s)) => assert_eq!(s.len(), MAX_EXPLANATION),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_absent_backend_loses_events_only_within_the_bounds_and_counts_them() {
        // Nothing listens on port 9 of loopback: every try is refused at once.
        let export = OtlpExport::start("http://127.0.0.1:9", Protocol::Http, "test").unwrap();
        // The queue, the batch in flight (retrying), and 50 more.
        let total = QUEUE_EVENTS + BATCH_EVENTS + 50;
        for i in 0..total {
            export.send(Event {
                trace_id: format!("t{i}"),
                span_id: None,
                name: "r/a".into(),
                score: Some(1.0),
                status: Some(Status::Pass),
                explanation: String::new(),
                error_type: None,
            });
        }
        assert!(export.stats.dropped.load(Ordering::Relaxed) >= 50);
        export.close(Instant::now() + Duration::from_secs(120));
        let s = &export.stats;
        let (queued, failed, dropped) = (
            s.queued.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
            s.dropped.load(Ordering::Relaxed),
        );
        assert_eq!(queued + dropped, total as u64);
        assert_eq!(failed, queued, "every queued event is counted as lost");
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let _ = metrics.export.set(export.stats.clone());
        assert!(metrics.render().contains(&format!("attest_export_events_failed_total {failed}\n")));
    }
}
