//! Distributed mode on NATS JetStream (official `async-nats` client).
//!
//! - Collectors publish each selected trace to the work-queue stream
//!   `<PREFIX>_TRACES` with `Nats-Msg-Id` = trace id, so the server drops a
//!   second publish of the same trace within the duplicate window.
//! - Evaluation workers share one durable pull consumer. A work message is
//!   acknowledged only after its results are durably stored in
//!   `<PREFIX>_RESULTS` (publish ack received); while a slow evaluation runs
//!   the worker sends in-progress acks. After `max_deliver` attempts the next
//!   delivery is moved to `<PREFIX>.dead` (stream `<PREFIX>_DEAD`) instead.
//! - A sink worker reads the results stream with its own durable consumer
//!   and writes to the sinks, which are idempotent on the result key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures::future::join_all;
use futures::{FutureExt as _, StreamExt};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cli::{NatsOptions, WorkerArgs};
use crate::events::{
    AlreadyPublished, ConsumerReset, DeadLettered, InternalEvent, LogThrottle, MalformedResults, Redelivered, ResultsRefused,
    RulesMismatch, StoreFailed,
};
use crate::pipeline::{Pipeline, WorkItem};
use crate::ResultRecord;

/// Subjects and stream names derived from `--nats-prefix`.
#[derive(Debug, Clone)]
pub struct Names {
    pub traces_subject: String,
    pub results_subject: String,
    pub dead_subject: String,
    pub traces_stream: String,
    pub results_stream: String,
    pub dead_stream: String,
    pub workers_consumer: String,
    pub sink_consumer: String,
    /// Stream and subject prefix of the errors of failed attempts at work
    /// messages (see `AttemptLog`).
    pub attempts_stream: String,
    pub attempts_subject: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        let up = prefix.to_ascii_uppercase().replace(['.', '-', ' '], "_");
        Names {
            traces_subject: format!("{prefix}.traces"),
            results_subject: format!("{prefix}.results"),
            dead_subject: format!("{prefix}.dead"),
            traces_stream: format!("{up}_TRACES"),
            results_stream: format!("{up}_RESULTS"),
            dead_stream: format!("{up}_DEAD"),
            workers_consumer: format!("{prefix}-workers").replace('.', "_"),
            sink_consumer: format!("{prefix}-results-sink").replace('.', "_"),
            attempts_stream: format!("{up}_ATTEMPTS"),
            attempts_subject: format!("{prefix}.attempts"),
        }
    }
}

/// Window within which the server drops a re-published message id.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Deadline for a publish to be acknowledged by the server.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// An async-nats error as one message. Its `Display` already ends with its
/// source's text, so chaining the source as well would print it twice.
fn nats(what: impl std::fmt::Display, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

async fn connect(url: &str, opts: &NatsOptions) -> anyhow::Result<jetstream::Context> {
    let server = NatsServer::parse(url)?;
    let shown = &server.shown;
    let mut options = match &opts.nats_creds {
        Some(path) => {
            anyhow::ensure!(
                server.user.is_none(),
                "--nats {shown}: give a user or token in the URL, or --nats-creds, not both"
            );
            async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| anyhow::anyhow!("--nats-creds {}: cannot be read as a NATS credentials file: {e}", path.display()))?
        }
        None => match (&server.user, &server.password) {
            (Some(user), Some(password)) => async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone()),
            (Some(token), None) => async_nats::ConnectOptions::with_token(token.clone()),
            _ => async_nats::ConnectOptions::new(),
        },
    };
    // A connection that died without closing (a half-open TCP connection)
    // is found by unanswered pings: every 10 s rather than the client's
    // default minute, so that a collector stops accepting what it cannot
    // publish within about half a minute.
    options = options.ping_interval(Duration::from_secs(10));
    if let Some(ca) = &opts.nats_tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&opts.nats_tls_cert, &opts.nats_tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
    }
    let client = tokio::time::timeout(Duration::from_secs(10), options.connect(server.addrs))
        .await
        .with_context(|| format!("--nats {shown}: no answer within 10 s"))?
        .map_err(|e| nats(format_args!("--nats {shown}: cannot connect"), e))?;
    Ok(jetstream::new(client))
}

/// `--nats`: one or more comma-separated server URLs, credentials taken out.
struct NatsServer {
    addrs: Vec<async_nats::ServerAddr>,
    /// The URLs as given, without user, password or token: what logs and errors show.
    shown: String,
    user: Option<String>,
    password: Option<String>,
}

impl NatsServer {
    fn parse(given: &str) -> anyhow::Result<NatsServer> {
        let mut server = NatsServer {
            addrs: Vec::new(),
            shown: String::new(),
            user: None,
            password: None,
        };
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        for part in given.split(',').map(str::trim) {
            anyhow::ensure!(
                !part.is_empty(),
                "--nats: the server URL is empty; give nats://HOST:PORT (several separated by commas)"
            );
            // A URL that does not parse is not shown: it may hold a password.
            let addr: async_nats::ServerAddr = part.parse().map_err(|e| {
                anyhow::anyhow!(
                    "--nats: server URL #{} is not a NATS server URL ({e}); give nats://HOST:PORT or tls://HOST:PORT, with credentials percent-encoded (',' '@' ':' '/' '%' in them)",
                    server.addrs.len() + 1
                )
            })?;
            let mut url = addr.into_inner();
            anyhow::ensure!(
                !(url.username().is_empty() && url.password().is_some()),
                "--nats: server URL #{} has a password but no user; give nats://USER:PASSWORD@HOST:PORT, or a token as nats://TOKEN@HOST:PORT",
                server.addrs.len() + 1
            );
            if !url.username().is_empty() {
                let user = Some(decode(url.username()));
                let password = url.password().map(decode);
                anyhow::ensure!(
                    server.user.is_none() || (server.user == user && server.password == password),
                    "--nats: the URLs carry different credentials; give the same user and password (or token) in each, or in one"
                );
                (server.user, server.password) = (user, password);
                let _ = url.set_username("");
                let _ = url.set_password(None);
            }
            if !server.shown.is_empty() {
                server.shown.push(',');
            }
            server.shown.push_str(url.as_str().trim_end_matches('/'));
            server.addrs.push(async_nats::ServerAddr::from_url(url)?);
        }
        Ok(server)
    }
}

/// Creates the three streams if missing (idempotent on every node).
pub async fn ensure_streams(js: &jetstream::Context, names: &Names, opts: &NatsOptions) -> anyhow::Result<()> {
    let specs = [
        (&names.traces_stream, &names.traces_subject, stream::RetentionPolicy::WorkQueue),
        (&names.results_stream, &names.results_subject, stream::RetentionPolicy::Limits),
        (&names.dead_stream, &names.dead_subject, stream::RetentionPolicy::Limits),
    ];
    for (name, subject, retention) in specs {
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            retention,
            storage: stream::StorageType::File,
            num_replicas: opts.nats_replicas,
            duplicate_window: DUPLICATE_WINDOW,
            // Bounded like everything else (`--nats-stream-bytes`): a full
            // work queue refuses new traces, the other streams drop their oldest.
            max_bytes: opts.nats_stream_bytes,
            discard: if retention == stream::RetentionPolicy::WorkQueue {
                stream::DiscardPolicy::New
            } else {
                stream::DiscardPolicy::Old
            },
            ..Default::default()
        };
        // Nodes that start together race to create the stream, and the
        // loser's create can fail (as a subject overlap) while the winner's
        // is being applied. A second look then finds the stream; a real
        // conflict still fails, after the last attempt.
        let mut attempt = 0;
        let stream = loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => break stream,
                Err(e) if out_of_store(&e) => {
                    anyhow::bail!(
                        "creating JetStream stream {name}: the server has less room left in its JetStream store than the {} bytes (--nats-stream-bytes) the stream sets aside{}; give a smaller --nats-stream-bytes (each of the three streams takes it; a stream that already exists keeps its size until it is edited or removed), or give the server more store (jetstream {{ max_file_store }} in its config, or more free disk: by default it may use 75% of the disk that is free when it starts; or a larger JetStream limit for the account)",
                        opts.nats_stream_bytes,
                        existing_sizes(js, names).await
                    )
                }
                Err(_) if attempt < STREAM_CREATE_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    if let Ok(stream) = js.get_stream(name).await {
                        break stream;
                    }
                }
                Err(e) if matches!(e.kind(), jetstream::context::CreateStreamErrorKind::JetStreamUnavailable) => {
                    anyhow::bail!(
                        "creating JetStream stream {name}: the NATS server has no JetStream; start it with -js (nats-server -js), or enable jetstream in its configuration"
                    )
                }
                Err(e) => {
                    // A subject overlap names neither stream: say which one holds the subject.
                    let holder = match js.stream_by_subject(subject.as_str()).await {
                        Ok(other) if &other != name => format!(" (stream {other} already takes {subject})"),
                        _ => String::new(),
                    };
                    return Err(nats(format_args!("creating JetStream stream {name}{holder}"), e));
                }
            }
        };
        // A stream of that name made by someone else (or by another
        // --nats-prefix that maps to the same name: `attest` and `ATTEST`,
        // `a-b` and `a_b`) would take none of this prefix's messages.
        let have = &stream.cached_info().config;
        if !have.subjects.iter().any(|s| s == subject) || have.retention != retention {
            anyhow::bail!(
                "JetStream stream {name} exists with subjects {:?} and {:?} retention, where this --nats-prefix needs subject {subject} and {retention:?} retention; it was made by something else, or for a --nats-prefix that differs only in case or in '-' and '_': use another --nats-prefix, or remove the stream",
                have.subjects,
                have.retention
            );
        }
    }
    Ok(())
}

/// The server refused a stream because its store cannot set aside
/// `max_bytes`: a single server says so with 10047 (or 10023); a cluster
/// finds no peer to place it on, "insufficient storage" (10005).
fn out_of_store(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::ErrorCode;
    let jetstream::context::CreateStreamErrorKind::JetStream(j) = e.kind() else {
        return false;
    };
    match j.error_code() {
        ErrorCode::STORAGE_RESOURCES_EXCEEDED | ErrorCode::INSUFFICIENT_RESOURCES => true,
        ErrorCode::CLUSTER_NO_PEERS => j.to_string().contains("insufficient storage"),
        _ => false,
    }
}

/// "; already set aside: ATTEST_TRACES 1073741824 bytes, …" for the streams
/// that exist: they hold the store a new one is refused for.
async fn existing_sizes(js: &jetstream::Context, names: &Names) -> String {
    let mut held = Vec::new();
    for name in [&names.traces_stream, &names.results_stream, &names.dead_stream] {
        if let Ok(mut stream) = js.get_stream(name).await {
            if let Ok(info) = stream.info().await {
                held.push(format!("{name} {} bytes", info.config.max_bytes));
            }
        }
    }
    if held.is_empty() {
        String::new()
    } else {
        format!(" (already set aside by existing streams: {})", held.join(", "))
    }
}

/// Further attempts at creating a stream another node may be creating.
const STREAM_CREATE_RETRIES: u32 = 4;

/// Longest escaped id put in a header as it is; a longer one is replaced by
/// `%h` and its SHA-256 (hex), which no escaped id can equal (an escaped `%`
/// is always followed by two upper-case hex digits).
const MAX_HEADER_ID_BYTES: usize = 256;

/// A trace id as a NATS header value (`Nats-Msg-Id`, `Attest-Trace-Id`).
/// Raw ids cannot go there: async-nats panics on a value with CR or LF, and
/// other control characters would garble the header block. The encoding is
/// injective ([`crate::escape_id`]), so distinct traces keep distinct message
/// ids, and ordinary ids (hex, `trc_…`) are unchanged.
pub fn header_id(id: &str) -> String {
    let escaped = crate::escape_id(id);
    if escaped.len() <= MAX_HEADER_ID_BYTES {
        return escaped;
    }
    format!("%h{}", hex(&Sha256::digest(id.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Free text (a dead-letter reason) as a header value: control characters
/// escaped (`\n`, `\u{7}`), at most 200 bytes.
fn header_text(s: &str) -> String {
    let escaped: String = s
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect();
    crate::bounded(&escaped, 200)
}

/// `Nats-Msg-Id` of a results message: covers everything the message holds,
/// the trace and each (rule, assertion) key, so only a message with the same
/// results (a redelivery's) is dropped as a duplicate. An id of the trace
/// alone would let any earlier message for that trace (a stray publish, results of
/// other rules) suppress the real results for the whole duplicate window.
pub fn results_msg_id(trace_id: &str, records: &[ResultRecord]) -> String {
    let mut keys: Vec<(&str, &str)> = records.iter().map(|r| (r.key.rule.as_str(), r.key.assertion_id.as_str())).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut h = Sha256::new();
    // Length-prefixed, so no two different key lists hash the same bytes.
    let mut field = |s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    field(trace_id);
    for (rule, assertion) in keys {
        field(rule);
        field(assertion);
    }
    format!("results-{}", hex(&h.finalize()))
}

/// Why a publish failed; `too_large` when the message (headers included)
/// is over the server's `max_payload`, which no retry can fix.
#[derive(Debug)]
pub(crate) struct PublishFailure {
    /// Over the server's max_payload: no retry can succeed.
    pub(crate) too_large: bool,
    error: anyhow::Error,
}

impl std::fmt::Display for PublishFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// Publishes and waits for the stream's ack; `Ok(true)` when the server
/// dropped the message as a duplicate of its `Nats-Msg-Id`.
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
) -> Result<bool, PublishFailure> {
    let sent = tokio::time::timeout(PUBLISH_TIMEOUT, async {
        match js.publish_with_headers(subject.to_string(), headers, payload).await {
            Ok(ack) => ack.await.map_err(|e| (false, nats(format_args!("publish to {subject}"), e))),
            Err(e) => Err((
                e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded,
                nats(format_args!("publish to {subject}"), e),
            )),
        }
    })
    .await;
    match sent {
        Ok(Ok(ack)) => Ok(ack.duplicate),
        Ok(Err((too_large, error))) => Err(PublishFailure { too_large, error }),
        Err(_) => Err(PublishFailure {
            too_large: false,
            error: anyhow::anyhow!("publish to {subject} not acknowledged within 10 s"),
        }),
    }
}

/// How long a failed publish keeps the receiver refusing when no later
/// publish says otherwise.
const REFUSING_FOR: Duration = Duration::from_secs(30);

/// A collector's handle for publishing selected traces.
pub struct Publisher {
    js: jetstream::Context,
    names: Names,
    failures: FailureLog,
    /// Set by [`Publisher::fail_fast_when_down`]: from then on a publish
    /// while the connection is down fails at once.
    fail_fast: std::sync::atomic::AtomicBool,
    /// When the last publish failed, if none has worked since: while the
    /// server refuses or stalls, the receiver answers 503.
    failing_since: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Publisher {
    pub async fn connect(url: &str, opts: &NatsOptions) -> anyhow::Result<Publisher> {
        let js = connect(url, opts).await?;
        let names = Names::new(&opts.nats_prefix);
        ensure_streams(&js, &names, opts).await?;
        Ok(Publisher {
            js,
            names,
            failures: FailureLog::default(),
            fail_fast: std::sync::atomic::AtomicBool::new(false),
            failing_since: std::sync::Mutex::new(None),
        })
    }

    /// From now on, a publish while the connection is down fails at once
    /// instead of waiting for an acknowledgement that cannot come. A live
    /// collector keeps waiting, since the client sends what it holds once it
    /// reconnects. A drain does not: it would wait the publish timeout for
    /// every queued trace (tens of minutes with a full queue). Nor does a
    /// `--jsonl` run, which would wait it for every line left in its file;
    /// such a run fails instead, and can be run again, since the stream's
    /// duplicate window drops what it already published.
    pub fn fail_fast_when_down(&self) {
        self.fail_fast.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the server has refused or stalled the last publish (JetStream
    /// out of resources, an ack that never came) with none working since.
    /// Traces that failed are offered again by their handlers, whose next
    /// attempt clears this; a failure older than [`REFUSING_FOR`] no longer
    /// counts, so the receiver never stays closed on stale news.
    pub fn refusing(&self) -> bool {
        let since = *self.failing_since.lock().unwrap_or_else(|e| e.into_inner());
        since.is_some_and(|t| t.elapsed() < REFUSING_FOR)
    }

    /// Whether a failed publish is not worth trying again: stopping (or a
    /// `--jsonl` run) while the server is unreachable.
    pub fn given_up(&self) -> bool {
        self.fail_fast.load(std::sync::atomic::Ordering::Relaxed) && !self.connected()
    }

    /// Whether the connection to the NATS server is up at the moment.
    pub fn connected(&self) -> bool {
        self.js.client().connection_state() == async_nats::connection::State::Connected
    }

    /// Publishes a selected trace; returns true when the server already had
    /// it (duplicate). A failure is logged here, throttled ([`FailureLog`]);
    /// the caller counts it.
    pub(crate) async fn publish(&self, item: &WorkItem) -> Result<bool, PublishFailure> {
        let payload = serde_json::to_vec(item)
            .inspect_err(|e| tracing::warn!(trace_id = %crate::shown_id(item.trace_id()), error = %e, "encoding a work message failed"))
            .map_err(|e| PublishFailure {
                too_large: true,
                error: e.into(),
            })?;
        let mut headers = async_nats::HeaderMap::new();
        // One work message per trace: the same trace published again within
        // the duplicate window (a second collector, a re-run) is dropped.
        headers.insert("Nats-Msg-Id", header_id(item.trace_id()).as_str());
        let sent = if self.fail_fast.load(std::sync::atomic::Ordering::Relaxed) && !self.connected() {
            Err(PublishFailure {
                too_large: false,
                error: anyhow::anyhow!("not published: the NATS server is unreachable"),
            })
        } else {
            publish(&self.js, &self.names.traces_subject, headers, payload.into()).await
        };
        // A message too large says nothing of the server, which stays as it was.
        match &sent {
            Ok(_) => *self.failing_since.lock().unwrap_or_else(|e| e.into_inner()) = None,
            Err(f) if f.too_large => {}
            Err(_) => *self.failing_since.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now()),
        }
        match sent {
            Ok(duplicate) => {
                if let Some(unshown) = self.failures.recovered() {
                    tracing::warn!(
                        "publishing to NATS works again; {unshown} failed publishes since the last such line were not logged one by one (all are counted in attest_collect_traces_dropped_total{{reason=\"publish_failed\"}})"
                    );
                }
                Ok(duplicate)
            }
            Err(f) => {
                match self.failures.failed() {
                    Some(0) => tracing::warn!(trace_id = %crate::shown_id(item.trace_id()), error = %f, "publishing to NATS failed"),
                    Some(unshown) => tracing::warn!(
                        trace_id = %crate::shown_id(item.trace_id()),
                        error = %f,
                        "publishing to NATS failed, and {unshown} more publishes failed since the last such line (counted in attest_collect_traces_dropped_total{{reason=\"publish_failed\"}})"
                    ),
                    None => {}
                }
                Err(f)
            }
        }
    }
}

/// Throttles the warnings of failed publishes: while the NATS server is
/// full or unreachable every trace fails, and a line per trace would bury
/// everything else on stderr. A failure is logged when no line was written
/// in the last [`FailureLog::EVERY`], with the count of failures not shown
/// since the last line; a publish that works reports that count too, under
/// the same limit. So a run of failures, or of failures and successes
/// mixed (a nearly full stream), writes at most one line per interval, and
/// no failure goes uncounted once publishing works again.
#[derive(Default)]
struct FailureLog {
    state: std::sync::Mutex<FailureState>,
}

#[derive(Default)]
struct FailureState {
    last_line: Option<std::time::Instant>,
    unshown: u64,
}

impl FailureLog {
    const EVERY: Duration = Duration::from_secs(10);

    /// A publish failed: `Some(unshown)` when a line is due now, with the
    /// number of failures since the last line that were not shown.
    fn failed(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.due() {
            Some(std::mem::take(&mut s.unshown))
        } else {
            s.unshown += 1;
            None
        }
    }

    /// A publish succeeded: `Some(unshown)` when failures went unshown and
    /// a line is due now.
    fn recovered(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.unshown > 0 && s.due() {
            Some(std::mem::take(&mut s.unshown))
        } else {
            None
        }
    }
}

impl FailureState {
    /// Whether a line may be written now; if so, it counts as written.
    fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        if self.last_line.is_some_and(|t| now.duration_since(t) < FailureLog::EVERY) {
            return false;
        }
        self.last_line = Some(now);
        true
    }
}

/// Test-only fault injection: exit right after the Nth results publish, before
/// acknowledging the work message (proves results are not counted twice).
const FAULT_ENV: &str = "ATTEST_COLLECT_FAULT_EXIT_AFTER_PUBLISH";

/// How long one pull request waits for work before the worker asks again.
const PULL_EXPIRES: Duration = Duration::from_secs(2);

/// The durable consumer `name` with `config`'s delivery settings. A consumer
/// created earlier (by a worker started with other flags) keeps its own
/// settings, and this worker's would be quietly ignored: it is updated to
/// this worker's `max_deliver` and `ack_wait` (JetStream allows editing
/// both), or, if the server refuses, start-up fails naming both values.
async fn durable_consumer(
    stream: &jetstream::stream::Stream,
    config: consumer::pull::Config,
    what: &str,
) -> anyhow::Result<consumer::PullConsumer> {
    let name = config.durable_name.clone().unwrap_or_default();
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(&name, config.clone())
        .await
        .map_err(|e| nats(format_args!("creating {what} (durable consumer {name})"), e))?;
    let have = consumer.cached_info().config.clone();
    // The server reports "no limit" as -1 whatever was sent (0 or -1).
    let limit = |n: i64| if n <= 0 { -1 } else { n };
    if limit(have.max_deliver) == limit(config.max_deliver) && have.ack_wait == config.ack_wait {
        return Ok(consumer);
    }
    let describe = |max_deliver: i64, ack_wait: Duration| format!("max_deliver {max_deliver}, ack_wait {} s", ack_wait.as_secs());
    let had = describe(have.max_deliver, have.ack_wait);
    let wants = describe(config.max_deliver, config.ack_wait);
    match stream.update_consumer(config).await {
        Ok(c) => {
            tracing::info!(
                consumer = %name,
                "durable consumer {name} had {had}; updated to this worker's {wants} (--max-deliver / --ack-wait)"
            );
            Ok(c)
        }
        Err(e) => anyhow::bail!(
            "durable consumer {name} on the server has {had} but this worker asks for {wants} (--max-deliver / --ack-wait), and the server refused the update: {e}. Start every worker with the same flags, or delete the consumer (nats consumer rm {} {name}) and start again",
            stream.cached_info().config.name
        ),
    }
}

/// How often a worker or sink checks that its durable consumer is in step
/// with its stream.
const CONSUMER_CHECK: Duration = Duration::from_secs(2);

/// Stops a background task when its owner returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Recreates the durable consumer when its stream was reset beneath it.
///
/// A server that lost part of its store (a disk that filled while it wrote,
/// then a restart) can come back with a stream whose sequence numbers start
/// again below what the consumer had delivered: the consumer then sees no
/// new message as pending, and every trace published from then on would sit
/// in the stream unread. Two signs are watched for: the consumer has
/// delivered past the stream's last message, or (on the work-queue stream,
/// which deletes each message once it is acked) the stream holds a message
/// at or below the consumer's ack floor, at two looks in a row (one look
/// can race an ack). Either way the consumer is deleted and made again, so
/// it delivers what the stream holds; results redelivered by it are stored
/// once (keyed writes).
async fn keep_consumer_in_step(
    stream: jetstream::stream::Stream,
    config: consumer::pull::Config,
    work_queue: bool,
    pipeline: Arc<Pipeline>,
) {
    let name = config.durable_name.clone().unwrap_or_default();
    // The stream's first sequence the last time it looked stuck.
    let mut stuck_at: Option<u64> = None;
    let mut tick = tokio::time::interval(CONSUMER_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Ok(info), Ok(have)) = (stream.get_info().await, stream.consumer_info(&name).await) else {
            continue;
        };
        // The consumer is read second: the stream can only have grown.
        let state = &info.state;
        let behind = have.delivered.stream_sequence > state.last_sequence;
        let stuck = work_queue && state.messages > 0 && state.first_sequence <= have.ack_floor.stream_sequence;
        let stuck_twice = stuck && stuck_at == Some(state.first_sequence);
        stuck_at = stuck.then_some(state.first_sequence);
        if !(behind || stuck_twice) {
            continue;
        }
        ConsumerReset {
            consumer: &name,
            stream: &info.config.name,
            consumer_delivered: have.delivered.stream_sequence,
            stream_first: state.first_sequence,
            stream_last: state.last_sequence,
            stream_messages: state.messages,
        }
        .emit(&pipeline.metrics);
        // Another worker may be doing the same: whichever deletes second
        // finds nothing to delete, and creating is idempotent.
        let _ = stream.delete_consumer(&name).await;
        if let Err(e) = stream.get_or_create_consumer::<consumer::pull::Config>(&name, config.clone()).await {
            tracing::error!(consumer = %name, error = %e, "cannot make the durable consumer again; will retry");
        }
        stuck_at = None;
    }
}

/// Evaluation worker loop; returns on SIGTERM after in-flight messages finish.
pub async fn run_evaluate(args: &WorkerArgs, pipeline: Arc<Pipeline>) -> anyhow::Result<()> {
    let js = connect(&args.nats, &args.nats_opts).await?;
    let names = Names::new(&args.nats_opts.nats_prefix);
    ensure_streams(&js, &names, &args.nats_opts).await?;
    // Both are at least 1: the flags are refused otherwise (cli.rs).
    let ack_wait = Duration::from_secs(args.nats_opts.ack_wait_secs);
    let max_deliver = args.nats_opts.max_deliver;
    let stream = js.get_stream(&names.traces_stream).await?;
    let config = consumer::pull::Config {
        durable_name: Some(names.workers_consumer.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        // One delivery more than allowed attempts: that last one only moves the message to the dead-letter subject.
        max_deliver: max_deliver + 1,
        ..Default::default()
    };
    let consumer = durable_consumer(&stream, config.clone(), "the workers' consumer").await?;
    let watch = tokio::spawn(keep_consumer_in_step(stream, config, true, pipeline.clone()));
    let _stop_watching = AbortOnDrop(watch);
    // Before the line that says the worker is up: a SIGTERM sent as soon as
    // it is read (an orchestrator's, a test's) must drain, not kill.
    let signals = crate::cli::Signals::install()?;
    tracing::info!(
        target: attest_log::STARTED,
        stream = %names.traces_stream,
        consumer = %names.workers_consumer,
        rules_version = %pipeline.rules.version,
        "evaluating from {} (consumer {}, rules version {})",
        names.traces_stream,
        names.workers_consumer,
        pipeline.rules.version
    );
    let fault_after: Option<u64> = std::env::var(FAULT_ENV).ok().and_then(|v| v.parse().ok());
    let attempts = Arc::new(AttemptLog::open(&js, &names, &args.nats_opts).await);
    let published = Arc::new(AtomicU64::new(0));
    let mismatch_log = Arc::new(LogThrottle::default());
    // Messages held at once, and evaluations run at once, apart: a message
    // whose results wait for the server's publish acknowledgement, or whose
    // own ack is in flight, holds a place in the window but no evaluation
    // slot, so round trips to the broker overlap with evaluation instead of
    // bounding it.
    let sem = Arc::new(Semaphore::new(args.concurrency.max(WORKER_WINDOW)));
    let evaluating = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = JoinSet::new();
    let shutdown = signals.nth(1);
    tokio::pin!(shutdown);
    'pull: loop {
        // Ask the server for exactly as many messages as there are free
        // places in the window. A message delivered to this worker is held
        // (and progress-acked) at once; none waits in a client-side buffer,
        // where its ack wait would run out and the server would redeliver
        // it, or dead-letter a healthy trace, while nothing failed.
        let first = tokio::select! {
            _ = &mut shutdown => break,
            p = sem.clone().acquire_owned() => p?,
        };
        let mut permits = vec![first];
        while let Ok(p) = sem.clone().try_acquire_owned() {
            permits.push(p);
        }
        if permits.len() < WORKER_WINDOW / 8 {
            // A few places free: let messages in hand finish for a moment, so
            // that one pull asks for many. Each pull is a round trip and a
            // subscription on the server; one per message would cost the
            // broker more than the evaluation costs the worker.
            tokio::time::sleep(PULL_GATHER).await;
            while let Ok(p) = sem.clone().try_acquire_owned() {
                permits.push(p);
            }
        }
        let batch = tokio::select! {
            _ = &mut shutdown => break,
            b = consumer.batch().max_messages(permits.len()).expires(PULL_EXPIRES).messages() => b,
        };
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "pull error: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // The server ends a pull when it expires; a server that restarted
        // meanwhile has forgotten the pull and never ends it, so the worker
        // stops waiting a moment after it would have.
        let pull_over = tokio::time::sleep(PULL_EXPIRES + PULL_GRACE);
        tokio::pin!(pull_over);
        loop {
            let msg = tokio::select! {
                _ = &mut shutdown => break 'pull,
                _ = &mut pull_over => break,
                m = batch.next() => m,
            };
            let Some(msg) = msg else { break };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "pull error: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            };
            // The server sends at most `permits.len()` messages per request.
            let permit = match permits.pop() {
                Some(p) => p,
                None => sem.clone().acquire_owned().await?,
            };
            let ctx = WorkerCtx {
                attempts: attempts.clone(),
                evaluating: evaluating.clone(),
                mismatch_log: mismatch_log.clone(),
                js: js.clone(),
                names: names.clone(),
                pipeline: pipeline.clone(),
                max_deliver,
                fault_after,
                published: published.clone(),
            };
            tasks.spawn(async move {
                let _permit = permit;
                let delivery = Delivery::hold(msg, ack_wait);
                let result = ctx.handle(&delivery).await;
                delivery.stop_progress().await;
                if let Err(e) = result {
                    tracing::warn!("{e:#}");
                }
            });
        }
        drop(permits);
        while tasks.try_join_next().is_some() {}
    }
    // Finished tasks are joined first, so the count is of evaluations still running.
    while tasks.try_join_next().is_some() {}
    tracing::info!(
        in_flight = tasks.len(),
        "draining {} in-flight evaluations (at most {} s; a second signal stops waiting)",
        tasks.len(),
        WORKER_DRAIN_TIMEOUT.as_secs()
    );
    let finished = tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => true,
        _ = tokio::time::sleep(WORKER_DRAIN_TIMEOUT) => false,
        _ = signals.nth(2) => false,
    };
    if !finished {
        // Their messages are not lost: unacknowledged, they go back to the
        // stream when the ack wait runs out and another worker takes them.
        let left = tasks.len();
        tasks.shutdown().await;
        tracing::warn!(
            abandoned = left,
            "{left} evaluations abandoned; their messages will be delivered again after the ack wait"
        );
    }
    // Acks are not waited for: what is still buffered goes out before exit.
    flush(&js).await;
    Ok(())
}

/// Sends what the client still buffers (acks), for at most a few seconds.
async fn flush(js: &jetstream::Context) {
    let _ = tokio::time::timeout(Duration::from_secs(5), js.client().flush()).await;
}

/// Most work messages a worker holds at once (at least `--concurrency`):
/// those being evaluated and those whose results or ack are on their way.
const WORKER_WINDOW: usize = 256;

/// How long past [`PULL_EXPIRES`] a worker waits for the server to end a
/// pull before it gives up on it and pulls again.
const PULL_GRACE: Duration = Duration::from_secs(1);

/// How long a worker with few free places waits for more before it pulls.
const PULL_GATHER: Duration = Duration::from_millis(2);

/// Longest a worker waits at SIGTERM for its evaluations to finish.
const WORKER_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A work message while this worker holds it. Progress acks keep it ours
/// from the moment it arrives until it is settled (acked, NAKed or
/// terminated). They come from a task of their own: an evaluation that
/// holds its thread (a plugin call, say) must not starve them, so long as
/// the runtime has another thread.
///
/// Settling stops that task and waits for it to end before the final ack
/// is sent. Acks go out in the order they are queued on the connection, so
/// no progress ack can follow a NAK: the server would take it as "still
/// working", restart the ack wait and hold back the redelivery.
struct Delivery {
    msg: jetstream::Message,
    progress: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Delivery {
    fn hold(msg: jetstream::Message, ack_wait: Duration) -> Delivery {
        let ticker = {
            let msg = msg.clone();
            tokio::spawn(async move {
                let mut progress = tokio::time::interval(ack_wait / 3);
                progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                progress.tick().await;
                loop {
                    progress.tick().await;
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
            })
        };
        Delivery {
            msg,
            progress: std::sync::Mutex::new(Some(ticker)),
        }
    }

    /// Ends the progress acks; once this returns, none is sent any more.
    async fn stop_progress(&self) {
        let ticker = self.progress.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(ticker) = ticker {
            ticker.abort();
            let _ = ticker.await;
        }
    }

    /// Gives the message back for another delivery a second from now.
    async fn nak(&self) {
        self.nak_after(Duration::from_secs(1)).await;
    }

    /// Gives the message back for another delivery `delay` from now.
    async fn nak_after(&self, delay: Duration) {
        self.stop_progress().await;
        let _ = self.msg.ack_with(AckKind::Nak(Some(delay))).await;
    }

    /// Acknowledges the message and waits for the server to confirm it.
    /// A plain ack, not waited for: its results are in the results stream
    /// already, so an ack the server never gets costs one more evaluation
    /// after the ack wait, whose results the stream's duplicate window and
    /// the sinks' keys absorb. Waiting for the server's confirmation would
    /// cost a reply per trace, for nothing.
    async fn ack(&self) -> Result<(), async_nats::Error> {
        self.stop_progress().await;
        self.msg.ack().await
    }

    /// Tells the server never to deliver the message again, and waits for it to confirm.
    async fn term(&self) -> Result<(), async_nats::Error> {
        self.stop_progress().await;
        self.msg.double_ack_with(AckKind::Term).await
    }
}

/// A message dropped unsettled (a panic on the way) stops its progress acks
/// too, without waiting: the server redelivers it after the ack wait,
/// instead of progress acks holding it for good.
impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(ticker) = self.progress.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            ticker.abort();
        }
    }
}

/// How long a message selected under other rules waits before it is
/// offered again: long enough for a worker with the same rules to take it.
const RULES_MISMATCH_DELAY: Duration = Duration::from_secs(5);

struct WorkerCtx {
    attempts: Arc<AttemptLog>,
    /// Evaluations running at once (`--concurrency`).
    evaluating: Arc<Semaphore>,
    mismatch_log: Arc<LogThrottle>,
    js: jetstream::Context,
    names: Names,
    pipeline: Arc<Pipeline>,
    max_deliver: i64,
    fault_after: Option<u64>,
    published: Arc<AtomicU64>,
}

/// The error of each failed attempt at a work message, for its dead letter:
/// a redelivered message is the same message, so what went wrong before is
/// kept beside it, in the stream `<PREFIX>_ATTEMPTS` (one message per work
/// message, on the subject `<prefix>.attempts.<its sequence>`, replaced at
/// each failure), until the message is done or dead-lettered, or
/// [`ATTEMPT_LOG_AGE`] passes.
struct AttemptLog {
    /// `None` when the stream cannot be had (a server or account without
    /// room for it): dead letters then carry only the last error.
    stream: Option<jetstream::stream::Stream>,
    js: jetstream::Context,
    subject: String,
}

/// How long an attempt's error is kept at most.
const ATTEMPT_LOG_AGE: Duration = Duration::from_secs(24 * 3600);
/// Errors kept per message: the latest ones.
const ATTEMPT_LOG_ENTRIES: usize = 16;

impl AttemptLog {
    async fn open(js: &jetstream::Context, names: &Names, opts: &NatsOptions) -> AttemptLog {
        let subject = names.attempts_subject.clone();
        let stream = js
            .get_or_create_stream(stream::Config {
                name: names.attempts_stream.clone(),
                subjects: vec![format!("{subject}.*")],
                storage: stream::StorageType::File,
                num_replicas: opts.nats_replicas,
                max_messages_per_subject: 1,
                max_age: ATTEMPT_LOG_AGE,
                max_message_size: 8 << 10,
                max_bytes: 64 << 20,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            })
            .await;
        let stream = match stream {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(stream = %names.attempts_stream, error = %e, "no stream for the errors of failed attempts; dead letters will carry only the last error");
                None
            }
        };
        AttemptLog {
            stream,
            js: js.clone(),
            subject,
        }
    }

    fn subject(&self, msg: &jetstream::Message) -> Option<String> {
        msg.info().ok().map(|i| format!("{}.{}", self.subject, i.stream_sequence))
    }

    /// The errors kept for `msg`, oldest first.
    async fn read(&self, msg: &jetstream::Message) -> Vec<String> {
        let (Some(stream), Some(subject)) = (&self.stream, self.subject(msg)) else {
            return Vec::new();
        };
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => serde_json::from_slice(&m.payload).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Adds the error of attempt `delivered` (best effort: a lost entry
    /// costs the dead letter a line, not the trace).
    async fn record(&self, msg: &jetstream::Message, delivered: i64, error: &str) {
        let Some(subject) = self.subject(msg).filter(|_| self.stream.is_some()) else {
            return;
        };
        let mut errors = self.read(msg).await;
        errors.push(format!("attempt {delivered}: {}", header_text(error)));
        let from = errors.len().saturating_sub(ATTEMPT_LOG_ENTRIES);
        let value = serde_json::to_vec(&errors[from..]).unwrap_or_default();
        // Bounded like every publish (PUBLISH_TIMEOUT).
        if let Err(e) = publish(&self.js, &subject, async_nats::HeaderMap::new(), value.into()).await {
            tracing::debug!(error = %e, "cannot keep an attempt's error");
        }
    }

    /// Forgets the errors kept for `msg`.
    async fn forget(&self, msg: &jetstream::Message) {
        let (Some(stream), Some(subject)) = (&self.stream, self.subject(msg)) else {
            return;
        };
        let _ = stream.purge().filter(subject).await;
    }
}

/// Header room kept free when a too-large message is cut to dead-letter it.
const DEAD_LETTER_HEADER_ROOM: usize = 4096;

impl WorkerCtx {
    async fn handle(&self, delivery: &Delivery) -> anyhow::Result<()> {
        let msg = &delivery.msg;
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let metrics = &self.pipeline.metrics;
        let item = serde_json::from_slice::<WorkItem>(&msg.payload);
        if delivered > 1 {
            Redelivered {
                trace_id: item.as_ref().ok().map(WorkItem::trace_id),
                delivery: delivered,
            }
            .emit(metrics);
        }
        let item = match item {
            Ok(i) => i,
            Err(e) => return self.dead_letter(delivery, "", delivered, &format!("not a work item: {e}")).await,
        };
        let trace_id = item.trace_id().to_string();
        let shown = crate::shown_id(&trace_id);
        if let Some(theirs) = item.rules_version.as_deref().filter(|v| *v != self.pipeline.rules.version) {
            // Scored here, the trace would get another verdict than the
            // collector's rules meant, or none for a rule this worker lacks.
            let mismatch = RulesMismatch {
                trace_id: &trace_id,
                theirs,
                ours: &self.pipeline.rules.version,
            };
            let why = mismatch.why();
            if delivered > self.max_deliver {
                mismatch.count(metrics);
                return self
                    .dead_letter(delivery, &trace_id, delivered, &format!("maximum deliveries reached: {why}"))
                    .await;
            }
            mismatch.emit_throttled(metrics, &self.mismatch_log);
            delivery.nak_after(RULES_MISMATCH_DELAY).await;
            return Ok(());
        }
        if delivered > self.max_deliver {
            return self.dead_letter(delivery, &trace_id, delivered, "maximum deliveries reached").await;
        }
        // The evaluation runs as a task of its own, so that a panic in it is
        // a redelivery rather than a lost message. A suite that may hold its
        // thread (a plugin spinning to its deadline) hands its worker role
        // to another thread while it runs (see the engine's rule suites):
        // progress acks and the NATS connection keep being served.
        let pipeline = self.pipeline.clone();
        let slot = self.evaluating.clone().acquire_owned().await?;
        // Aborted with this task when the worker gives up at shutdown, so
        // that an abandoned evaluation makes no more provider calls.
        // The last delivery that evaluates: a failure now is for good, and
        // what succeeded is kept.
        let last_attempt = delivered >= self.max_deliver;
        let evaluation = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            pipeline.evaluate(&item, delivered as u64, last_attempt).await
        }));
        let evaluated = evaluation.await;
        drop(slot);
        let outcome = match evaluated {
            Ok(outcome) => outcome,
            Err(e) => {
                self.attempts.record(msg, delivered, &format!("internal error: {e}")).await;
                delivery.nak().await;
                anyhow::bail!("trace {shown}: the evaluation stopped with an internal error (will be redelivered): {e}");
            }
        };
        let crate::pipeline::Evaluated { records, failure } = match outcome {
            Ok(evaluated) => evaluated,
            Err(e) => {
                self.attempts.record(msg, delivered, &e.message).await;
                delivery.nak().await;
                anyhow::bail!("trace {shown}: retryable evaluation failure (will be redelivered): {e}");
            }
        };
        if records.is_empty() {
            // No rule produced a result (unknown rules, spent budgets,
            // failures that are not the trace's — each counted): there is
            // nothing to store.
            if let Some(e) = failure {
                return self.dead_letter(delivery, &trace_id, delivered, &e.message).await;
            }
            delivery.ack().await.map_err(|e| anyhow::anyhow!("ack of {shown}: {e}"))?;
            self.forget_attempts(delivery, delivered).await;
            return Ok(());
        }
        let payload = serde_json::to_vec(&records)?;
        let size = payload.len();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", results_msg_id(&trace_id, &records).as_str());
        headers.insert("Attest-Trace-Id", header_id(&trace_id).as_str());
        match publish(&self.js, &self.names.results_subject, headers, payload.into()).await {
            Ok(false) => {}
            Ok(true) => {
                // The same results (same trace and keys) were published within
                // the duplicate window: a redelivery after a crash before the ack.
                AlreadyPublished {
                    trace_id: &trace_id,
                    stream: &self.names.results_stream,
                }
                .emit(metrics);
            }
            Err(f) if f.too_large => {
                let max = self.js.client().max_payload();
                tracing::warn!(
                    trace_id = %shown,
                    "results of trace {shown} are {size} bytes, over the server's max_payload of {max} bytes; they cannot be published, so the trace goes to the dead letters"
                );
                let why = format!("results are {size} bytes, over the server's max_payload of {max} bytes");
                return self.dead_letter(delivery, &trace_id, delivered, &why).await;
            }
            Err(f) => anyhow::bail!("trace {shown}: publishing results failed (will be redelivered): {f}"),
        }
        let n = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fault_after == Some(n) {
            tracing::warn!("{FAULT_ENV}={n}: exiting after publishing results of {shown}, before acking");
            attest_log::flush(Duration::from_secs(1));
            std::process::exit(70);
        }
        // What succeeded is stored; what failed for good goes to the dead
        // letters, to be replayed once its cause is fixed.
        if let Some(e) = failure {
            return self.dead_letter(delivery, &trace_id, delivered, &e.message).await;
        }
        delivery.ack().await.map_err(|e| anyhow::anyhow!("ack of {shown}: {e}"))?;
        self.forget_attempts(delivery, delivered).await;
        Ok(())
    }

    /// Drops the errors kept for a message that is done after all.
    async fn forget_attempts(&self, delivery: &Delivery, delivered: i64) {
        if delivered > 1 {
            self.attempts.forget(&delivery.msg).await;
        }
    }

    /// Moves a work message to the dead-letter subject. A message too large
    /// to be republished with the dead-letter headers is cut to fit (the
    /// `Attest-Truncated` header says how much was kept). If it still cannot
    /// be dead-lettered, it is nak'ed for a later attempt, unless this is the
    /// consumer's last delivery or the failure is its size: then it is
    /// dropped and counted as `traces_dropped_total{reason="dead_letter_failed"}`,
    /// since the server would never deliver it again.
    async fn dead_letter(&self, delivery: &Delivery, trace_id: &str, delivered: i64, why: &str) -> anyhow::Result<()> {
        let msg = &delivery.msg;
        let shown = crate::shown_id(trace_id);
        // The work message's place in its stream names the dead letter, so
        // a worker stopped between this publish and the `term` below, whose
        // message another worker then dead-letters again, leaves one dead
        // letter, not two (within the stream's duplicate window).
        let dead_id = msg.info().ok().map(|info| dead_letter_id(info.stream, info.stream_sequence));
        // Earlier attempts' errors, then this one's.
        let mut attempts = self.attempts.read(msg).await;
        attempts.push(format!("attempt {delivered}: {}", header_text(why)));
        let attempts = serde_json::to_string(&attempts).unwrap_or_default();
        let headers = |truncated: Option<usize>| {
            let mut headers = async_nats::HeaderMap::new();
            if let Some(id) = &dead_id {
                headers.insert("Nats-Msg-Id", id.as_str());
            }
            headers.insert("Attest-Dead-Reason", header_text(why).as_str());
            headers.insert("Attest-Deliveries", delivered.to_string().as_str());
            headers.insert("Attest-Attempt-Errors", attempts.as_str());
            if !trace_id.is_empty() {
                headers.insert("Attest-Trace-Id", header_id(trace_id).as_str());
            }
            if let Some(kept) = truncated {
                headers.insert(
                    "Attest-Truncated",
                    format!("kept the first {kept} of {} payload bytes", msg.payload.len()).as_str(),
                );
            }
            headers
        };
        let mut sent = publish(&self.js, &self.names.dead_subject, headers(None), msg.payload.clone()).await;
        if matches!(&sent, Err(f) if f.too_large) {
            let max = self.js.client().max_payload();
            let kept = max.saturating_sub(DEAD_LETTER_HEADER_ROOM).min(msg.payload.len());
            sent = publish(&self.js, &self.names.dead_subject, headers(Some(kept)), msg.payload.slice(..kept)).await;
        }
        match sent {
            Ok(duplicate) => {
                delivery.term().await.map_err(|e| anyhow::anyhow!("term: {e}"))?;
                self.attempts.forget(msg).await;
                DeadLettered {
                    trace_id,
                    subject: &self.names.dead_subject,
                    why: &header_text(why),
                    already: duplicate,
                }
                .emit(&self.pipeline.metrics);
                Ok(())
            }
            Err(f) if f.too_large || delivered > self.max_deliver => {
                self.pipeline.metrics.dropped("dead_letter_failed", 0);
                let _ = delivery.term().await;
                anyhow::bail!(
                    "trace {shown} ({}): could not be moved to {}: {f}; delivery {delivered} was the last, so it is dropped (counted as attest_collect_traces_dropped_total{{reason=\"dead_letter_failed\"}})",
                    header_text(why),
                    self.names.dead_subject
                )
            }
            Err(f) => {
                delivery.nak().await;
                anyhow::bail!(
                    "trace {shown} ({}): could not be moved to {}: {f}; delivery {delivered} of at most {}, it will be delivered again",
                    header_text(why),
                    self.names.dead_subject,
                    self.max_deliver + 1
                )
            }
        }
    }
}

/// `Nats-Msg-Id` of the dead letter of a work message: the work stream's
/// name and the message's sequence in it, which every delivery of that
/// message shares and no other message has.
fn dead_letter_id(stream: &str, sequence: u64) -> String {
    format!("dead:{stream}:{sequence}")
}

/// Longest trace or agent id a sink stores, in bytes: the engine's
/// `attest_core::trace::validate::MAX_ID_BYTES`.
pub const MAX_STORED_ID_BYTES: usize = 1024;

/// Why a result record off the results stream is not stored, if it is not:
/// ids longer than the engine accepts would put unqueryable rows (and
/// 300 KB keys) into the history and the JSONL file.
pub fn record_problem(r: &ResultRecord) -> Option<String> {
    use crate::rules::{MAX_RESULT_NAME_BYTES, MAX_RULE_NAME_BYTES};
    let k = &r.key;
    let agent = r.agent_id.as_deref().unwrap_or("");
    for (field, len, max) in [
        ("trace_id", k.trace_id.len(), MAX_STORED_ID_BYTES),
        ("agent_id", agent.len(), MAX_STORED_ID_BYTES),
        ("rule", k.rule.len(), MAX_RULE_NAME_BYTES),
        ("assertion_id", k.assertion_id.len(), MAX_RESULT_NAME_BYTES),
        (
            "<rule>/<assertion_id>",
            k.rule.len() + 1 + k.assertion_id.len(),
            MAX_RESULT_NAME_BYTES,
        ),
    ] {
        if len > max {
            return Some(format!("{field} is {len} bytes, more than the {max} allowed"));
        }
    }
    None
}

/// Most results messages a sink stores in one write.
const SINK_BATCH: usize = 256;

/// The results of one message off the results stream that may be stored;
/// `None` for a message that is not a result list (counted and logged).
/// Records whose ids the engine would refuse are counted and left out.
fn sink_records(msg: &jetstream::Message, pipeline: &Pipeline) -> Option<Vec<ResultRecord>> {
    let records = match serde_json::from_slice::<Vec<ResultRecord>>(&msg.payload) {
        Ok(r) => r,
        Err(e) => {
            MalformedResults {
                bytes: msg.payload.len(),
                error: &e,
            }
            .emit(&pipeline.metrics);
            return None;
        }
    };
    let total = records.len();
    let mut refused = 0u64;
    let mut first_problem = None;
    let records: Vec<ResultRecord> = records
        .into_iter()
        .filter(|r| match record_problem(r) {
            None => true,
            Some(p) => {
                refused += 1;
                first_problem.get_or_insert((p, r.key.trace_id.clone()));
                false
            }
        })
        .collect();
    if let Some((problem, trace_id)) = first_problem {
        ResultsRefused {
            refused,
            total,
            problem: &problem,
            trace_id: &trace_id,
        }
        .emit(&pipeline.metrics);
    }
    Some(records)
}

/// Results sink loop: results stream → sinks, ack after they are stored.
pub async fn run_sink(args: &WorkerArgs, pipeline: Arc<Pipeline>) -> anyhow::Result<()> {
    let js = connect(&args.nats, &args.nats_opts).await?;
    let names = Names::new(&args.nats_opts.nats_prefix);
    ensure_streams(&js, &names, &args.nats_opts).await?;
    let stream = js.get_stream(&names.results_stream).await?;
    // Each group of sinks reads every result through a consumer of its own.
    let consumer_name = match &args.sink_name {
        Some(group) => format!("{}-{group}", names.sink_consumer),
        None => names.sink_consumer.clone(),
    };
    let config = consumer::pull::Config {
        durable_name: Some(consumer_name.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(args.nats_opts.ack_wait_secs),
        ..Default::default()
    };
    let consumer = durable_consumer(&stream, config.clone(), "the results sink consumer").await?;
    let watch = tokio::spawn(keep_consumer_in_step(stream, config, false, pipeline.clone()));
    let _stop_watching = AbortOnDrop(watch);
    let open = || async {
        consumer
            .stream()
            .max_messages_per_batch(256)
            .messages()
            .await
            .map_err(|e| nats("pulling from the results stream", e))
    };
    let mut messages = open().await?;
    // Before the ready line, as for the evaluating worker.
    let signals = crate::cli::Signals::install()?;
    tracing::info!(
        target: attest_log::STARTED,
        stream = %names.results_stream,
        consumer = %consumer_name,
        "writing results from {} (consumer {consumer_name})",
        names.results_stream
    );
    let shutdown = signals.nth(1);
    tokio::pin!(shutdown);
    let store_failures = LogThrottle::default();
    loop {
        let first = tokio::select! {
            _ = &mut shutdown => break,
            m = messages.next() => m,
        };
        let Some(first) = first else {
            // The pull ended (the consumer was recreated, the connection
            // was lost for good): pull again, unless stopping.
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            match open().await {
                Ok(m) => messages = m,
                Err(e) => tracing::warn!("{e:#}; trying again"),
            }
            continue;
        };
        // What else has arrived is stored with it, in one write per store,
        // and acked after that write: one commit per batch, not per message.
        let mut batch: Vec<jetstream::Message> = first.into_iter().collect();
        while batch.len() < SINK_BATCH {
            match messages.next().now_or_never() {
                Some(Some(Ok(m))) => batch.push(m),
                Some(Some(Err(_))) => continue,
                _ => break,
            }
        }
        let mut records = Vec::new();
        let mut kept = Vec::with_capacity(batch.len());
        // An empty list (or one whose every record was refused) is not an evaluation.
        let mut evaluations = 0;
        for msg in batch {
            match sink_records(&msg, &pipeline) {
                Some(r) => {
                    evaluations += u64::from(!r.is_empty());
                    records.extend(r);
                    kept.push(msg);
                }
                // Not something a worker publishes: terminated so that it
                // is not delivered again.
                None => {
                    let _ = msg.ack_with(AckKind::Term).await;
                }
            }
        }
        if !records.is_empty() {
            if let Err(e) = pipeline.store(&records, crate::Durability::Committed).await {
                // Every attempt is counted; the log says it at most once per
                // interval, as a failing file fails every message.
                StoreFailed { error: &e }.emit_throttled(&pipeline.metrics, &store_failures);
                join_all(kept.iter().map(|m| m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))))).await;
                continue;
            }
            pipeline.metrics.traces_evaluated.fetch_add(evaluations, Ordering::Relaxed);
        }
        // Plain acks: a lost one redelivers results the stores hold already,
        // which their keys make a no-op.
        join_all(kept.iter().map(|m| m.ack())).await;
    }
    flush(&js).await;
    pipeline.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_publishes_write_at_most_one_line_per_interval_and_none_goes_uncounted() {
        let log = FailureLog::default();
        let interval_passes = || {
            let then = std::time::Instant::now()
                .checked_sub(FailureLog::EVERY)
                .expect("a clock that has run for 10 s");
            log.state.lock().unwrap().last_line = Some(then);
        };
        assert_eq!(log.recovered(), None, "nothing failed");
        assert_eq!(log.failed(), Some(0), "the first failure is logged");
        // Failures and successes mixed, as a nearly full stream gives:
        // nothing more within the interval, whichever comes.
        assert_eq!(
            (log.failed(), log.recovered(), log.failed(), log.recovered()),
            (None, None, None, None)
        );
        interval_passes();
        assert_eq!(log.recovered(), Some(2), "a success reports the failures not shown");
        assert_eq!(log.recovered(), None, "once");
        interval_passes();
        assert_eq!(log.recovered(), None, "nothing went unshown");
        assert_eq!(log.failed(), Some(0), "a failure after a quiet interval is logged at once");
        assert_eq!(log.failed(), None);
        interval_passes();
        assert_eq!(log.failed(), Some(1), "and the next line counts the one not shown");
    }

    #[test]
    fn credentials_are_taken_out_of_the_url_and_never_shown() {
        let s = NatsServer::parse("nats://bob:s3cr%25t%2C@10.0.0.1:4222, nats://bob:s3cr%25t%2C@10.0.0.2:4222").unwrap();
        assert_eq!(s.shown, "nats://10.0.0.1:4222,nats://10.0.0.2:4222");
        assert_eq!((s.user.as_deref(), s.password.as_deref()), (Some("bob"), Some("s3cr%t,")));
        assert_eq!(s.addrs.len(), 2);
        let t = NatsServer::parse("tls://t0k3n@nats.example:4443").unwrap();
        assert_eq!(
            (t.shown.as_str(), t.user.as_deref(), t.password),
            ("tls://nats.example:4443", Some("t0k3n"), None)
        );
        for (bad, why) in [
            ("nats://:pw@host:4222", "has a password but no user"),
            ("http://bob:pw@host:4222", "server URL #1 is not a NATS server URL"),
            ("nats://a:1,nats://bob:p,w@h:4222", "server URL #2 is not a NATS server URL"),
            ("nats://a:1,", "the server URL is empty"),
            ("nats://bob:x@a:1,nats://eve:y@b:1", "different credentials"),
        ] {
            let e = NatsServer::parse(bad).err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            for secret in ["pw", "bob", "eve", "p,w"] {
                assert!(!e.contains(&format!("{secret}@")), "{bad}: {e}");
            }
        }
    }

    fn rec(trace: &str, rule: &str, assertion: &str) -> ResultRecord {
        ResultRecord::passing(trace, rule, assertion)
    }

    #[test]
    fn trace_ids_with_line_breaks_become_header_values_without_panicking() {
        for id in ["trc_crlf\r\nX-Evil: 1", "a\nb", "\r", "tab\there", "é", "", "plain-0af3"] {
            let mut headers = async_nats::HeaderMap::new();
            // async-nats panics on a raw '\r' or '\n' in a header value.
            headers.insert("Nats-Msg-Id", header_id(id).as_str());
            headers.insert("Attest-Dead-Reason", header_text(&format!("bad {id}")).as_str());
            let v = header_id(id);
            assert!(v.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{v:?}");
        }
        assert_eq!(header_id("plain-0af3"), "plain-0af3");
        assert_eq!(header_id("trc_crlf\r\nX-Evil: 1"), "trc_crlf%0D%0AX-Evil:%201");
        assert_ne!(header_id("a\r"), header_id("a%0D"));
        // Long ids are replaced by a digest that no short id encodes to.
        let long = header_id(&"x".repeat(300));
        assert!(long.starts_with("%h") && long.len() == 66, "{long}");
        assert_ne!(long, header_id(&"x".repeat(301)));
        assert_eq!(header_id(&"x".repeat(256)), "x".repeat(256));
    }

    #[test]
    fn a_results_message_id_covers_its_keys_not_only_the_trace() {
        let a = [rec("t1", "r", "a"), rec("t1", "r", "b")];
        let b = [rec("t1", "r", "b"), rec("t1", "r", "a")];
        assert_eq!(results_msg_id("t1", &a), results_msg_id("t1", &b), "order does not matter");
        assert_ne!(results_msg_id("t1", &a), results_msg_id("t1", &a[..1]));
        assert_ne!(results_msg_id("t1", &a), results_msg_id("t2", &a));
        assert_ne!(results_msg_id("t1", &[]), "t1", "never the bare trace id");
        // Length prefixes: moving bytes between fields changes the id.
        assert_ne!(
            results_msg_id("t", &[rec("t", "ab", "c")]),
            results_msg_id("t", &[rec("t", "a", "bc")])
        );
    }

    #[test]
    fn records_with_ids_longer_than_the_engine_takes_are_refused() {
        assert_eq!(record_problem(&rec("t", "r", "a")), None);
        let mut r = rec(&"t".repeat(1025), "r", "a");
        assert_eq!(record_problem(&r).unwrap(), "trace_id is 1025 bytes, more than the 1024 allowed");
        r.key.trace_id = "t".repeat(1024);
        assert_eq!(record_problem(&r), None);
        r.agent_id = Some("a".repeat(300_000));
        assert!(record_problem(&r).unwrap().starts_with("agent_id is 300000 bytes"));
        let r = rec("t", &"r".repeat(129), "a");
        assert!(record_problem(&r).unwrap().starts_with("rule is 129 bytes"));
        let r = rec("t", "r", &"a".repeat(257));
        assert!(record_problem(&r).unwrap().starts_with("assertion_id is 257 bytes"));
        let r = rec("t", &"r".repeat(100), &"a".repeat(200));
        assert!(record_problem(&r).unwrap().starts_with("<rule>/<assertion_id> is 301 bytes"));
    }
}
