//! The request loop: read a line, hand it to a task, write each response as
//! soon as it is ready.
//!
//! - At most `max_concurrent_requests` lines are in flight; while that many
//!   are, no more input is read (back-pressure instead of a queue). Work
//!   that may block leaves the async workers, taking a share of slots of
//!   its own, once the parsed request shows it is there (see
//!   [`crate::lane`]).
//! - Until `initialize` has succeeded, lines are handled one at a time, so a
//!   client that pipelines `initialize` and its first batch still works.
//! - `shutdown`, end of input, SIGTERM and SIGINT all stop reading and drain
//!   in-flight requests (bounded by the drain timeout) before returning. A
//!   `shutdown` takes effect where it is read: nothing after it in the input
//!   is read. A closed stdout stops reading too.
//! - Every request read with an id gets exactly one response line (one still
//!   running when the drain ends gets `3002` from the drain, see
//!   [`crate::unanswered`]); notifications get none; a JSON array is a
//!   JSON-RPC batch answered by one array line.

use crate::batch;
use crate::errors::trace_error;
use crate::lane::Lane;
use crate::plugin_results::{self, Accepted};
use crate::protocol::{self, error_line, method_list, null_id, parse_request, success_line, ErrorCode, Method, Request, RpcError};
use crate::session::{Admission, Engine, State};
use crate::transport::{sniff_request, spawn_writer, Line, LineReader};
use serde::Serialize;
use serde_json::value::RawValue;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

/// Room for the request envelope around the trace in one input line.
pub const LINE_HEADROOM_BYTES: usize = 1024 * 1024;
/// Lines this large are handled on the blocking pool, so a heavy batch does
/// not stall the other tasks on its worker thread.
const LARGE_LINE_BYTES: usize = 256 * 1024;
/// How much of such a line is read for its id before it is parsed.
const ID_SNIFF_BYTES: usize = 4096;

/// Bytes a success response adds around its id and result:
/// `{"jsonrpc":"2.0","id":` + `,"result":` + `}`.
const ENVELOPE_BYTES: usize = r#"{"jsonrpc":"2.0","id":,"result":}"#.len();

/// Why [`serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Shutdown,
    EndOfInput,
    Signal,
    InputError,
    /// Stdout closed: no answer can reach the client any more, so nothing
    /// more is read (and evaluated for no one).
    OutputClosed,
}

impl Ended {
    /// How logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Shutdown => "shutdown",
            Ended::EndOfInput => "end of input",
            Ended::Signal => "signal",
            Ended::InputError => "stdin could not be read",
            Ended::OutputClosed => "stdout closed",
        }
    }
}

/// Serves JSON-RPC on `input`/`output` until shutdown, end of input or a signal.
pub async fn serve<R, W>(engine: Arc<Engine>, input: R, output: W) -> Ended
where
    R: AsyncRead + Unpin + Send + 'static,
    W: Write + Send + 'static,
{
    let max_line = engine.limits.max_trace_bytes + LINE_HEADROOM_BYTES;
    let mut reader = LineReader::new(input, max_line);
    let (out, writer) = spawn_writer(output);
    let permits = Arc::new(Semaphore::new(engine.config.max_concurrent_requests));
    let memory_kib = (engine.config.max_inflight_bytes / 1024).clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let memory = Arc::new(Semaphore::new(memory_kib));
    let blocking_share = Arc::new(Semaphore::new(crate::plugins::call_share(engine.config.max_concurrent_requests)));
    let tracker = TaskTracker::new();
    let mut signals = Signals::new();
    tracing::info!(
        version = crate::ENGINE_VERSION,
        max_concurrent_requests = engine.config.max_concurrent_requests,
        "engine started"
    );

    // `shutdown` needs no evaluation slot: with every slot taken by long
    // requests it must still be read and start the drain, or the drain
    // limit would not bound the exit.
    let control = Arc::new(Semaphore::new(1));
    let ended = loop {
        // One line is read ahead of the slots: it waits below for a slot
        // (holding its memory share), and input is not read further
        // meanwhile, unless it is `shutdown`.
        let line = tokio::select! {
            l = reader.next() => l,
            _ = engine.draining.cancelled() => break Ended::Shutdown,
            _ = signals.recv() => break Ended::Signal,
            _ = out.closed() => break Ended::OutputClosed,
        };
        let bytes = match line {
            Ok(Some(Line::Complete(bytes))) => bytes,
            Ok(Some(Line::Oversized { prefix, len })) => {
                let reply = oversized_reply(&prefix, len, max_line);
                let _ = out.send(reply).await;
                continue;
            }
            Ok(None) => break Ended::EndOfInput,
            Err(e) => {
                tracing::error!(error = %e, "cannot read stdin");
                break Ended::InputError;
            }
        };
        // Admission by estimated parse memory as well as by count: a line
        // waits here (and input is not read further) until the requests in
        // flight leave room for it. A line larger than the whole budget
        // waits until it can run alone.
        let weight = (parse_memory_estimate(&bytes) / 1024).clamp(1, memory_kib) as u32;
        let memory_permit = tokio::select! {
            p = memory.clone().acquire_many_owned(weight) => p.expect("semaphore is never closed"),
            // A line already read is answered: after a shutdown, with 3003.
            _ = engine.draining.cancelled() => memory.clone().acquire_many_owned(0).await.expect("semaphore is never closed"),
            _ = signals.recv() => break Ended::Signal,
        };
        let shutdown = is_shutdown(&bytes);
        let slots = if shutdown { &control } else { &permits };
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("semaphore is never closed"),
            // A line already read is answered: after a shutdown, with 3003.
            _ = engine.draining.cancelled() => slots.clone().acquire_many_owned(0).await.expect("semaphore is never closed"),
            _ = signals.recv() => break Ended::Signal,
            _ = out.closed() => break Ended::OutputClosed,
        };
        let admission = engine.admit();
        if shutdown {
            engine.begin_shutdown(admission.seq);
        }
        let task = respond(
            engine.clone(),
            bytes,
            out.clone(),
            (permit, memory_permit, blocking_share.clone()),
            admission,
        );
        if engine.state() == State::Uninitialized {
            task.await;
        } else {
            tracker.spawn(task);
        }
        // Input after `shutdown` is not read: every line read so far is
        // answered, and nothing after it runs.
        if matches!(engine.state(), State::Draining | State::Done) {
            break Ended::Shutdown;
        }
    };
    tracing::info!(
        reason = ended.as_str(),
        inflight = tracker.len(),
        "stopping: draining in-flight requests"
    );
    tracker.close();
    // Long checks still running at the end of the drain stop there.
    crate::layers::content::abandon_at(std::time::Instant::now() + engine.config.drain_timeout);
    // `shutdown` itself waits up to the drain timeout before answering; allow it to.
    let grace = engine.config.drain_timeout + std::time::Duration::from_secs(5);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        let abandoned = engine.unanswered.abandon(None, engine.config.drain_timeout);
        tracing::warn!(
            abandoned = tracker.len(),
            answered = abandoned.len(),
            "drain timeout reached; exiting with requests unfinished, each answered 3002"
        );
        for line in abandoned {
            if tokio::time::timeout(std::time::Duration::from_secs(1), out.send(line))
                .await
                .is_err()
            {
                break;
            }
        }
    }
    engine.finish();
    // Abandoned requests still hold senders: close the writer behind what is
    // queued. Neither step may wait long for a client that stopped reading.
    const FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
    let closed = tokio::time::timeout(FLUSH_LIMIT, out.send(crate::transport::CLOSE)).await;
    drop(out);
    let flushed = match closed {
        Ok(_) => tokio::time::timeout(FLUSH_LIMIT, tokio::task::spawn_blocking(move || writer.join()))
            .await
            .is_ok(),
        Err(_) => false,
    };
    if !flushed {
        tracing::warn!("stdout is not being read; exiting with responses unwritten");
    }
    ended
}

/// Memory parsing a request line may take at its peak, in bytes: the line,
/// its copies, and a parsed JSON value per element. Arrays of tiny
/// elements (`[0,0,0,…]`) expand the most, about 100 bytes per element.
pub fn parse_memory_estimate(line: &[u8]) -> usize {
    const PER_ELEMENT: usize = 104;
    2 * line.len() + PER_ELEMENT * memchr::memchr_iter(b',', line).count()
}

/// Handles one line and sends its response, if any.
async fn respond(
    engine: Arc<Engine>,
    line: Vec<u8>,
    out: mpsc::Sender<Vec<u8>>,
    (permit, memory_permit, blocking_share): (OwnedSemaphorePermit, OwnedSemaphorePermit, Arc<Semaphore>),
    admission: Admission,
) {
    let seq = admission.seq;
    // Held until the response is sent: the line's parse memory is in use.
    let _memory = memory_permit;
    let mut lane = Lane::new(permit, blocking_share);
    // A line this large takes long to parse before anything is known about
    // it, so all of it runs on the blocking pool. Smaller lines move there
    // only for the work that needs it (see `lane`). The lane's slot is held
    // until the response is sent.
    let (reply, _lane) = if line.len() > LARGE_LINE_BYTES {
        // Noted before it waits for the pool: a drain that ends meanwhile
        // answers it too. Its id is looked for near the start only (clients
        // write it before the params); one further in is noted once the
        // line is parsed.
        if let (Some(id), _) = sniff_request(&line[..line.len().min(ID_SNIFF_BYTES)]) {
            engine.unanswered.expect_one(seq, &id);
        }
        lane.enter_pool().await;
        let runtime = tokio::runtime::Handle::current();
        let engine = engine.clone();
        let blocking = tokio::task::spawn_blocking(move || {
            let reply = crate::lane::pool_work(|| runtime.block_on(handle_line(&engine, &line, seq, &mut lane)));
            (reply, lane)
        });
        match blocking.await {
            Ok((reply, lane)) => (reply, Some(lane)),
            Err(e) => {
                tracing::error!(error = %e, "request handler on the blocking pool failed");
                (None, None)
            }
        }
    } else {
        (handle_line(&engine, &line, seq, &mut lane).await, Some(lane))
    };
    // Unless the drain gave up on this request and answered for it.
    let answered_by_drain = !engine.unanswered.settle(seq);
    let reply = reply.filter(|_| !answered_by_drain);
    if let Some(reply) = reply {
        if out.send(reply).await.is_err() {
            tracing::warn!("response dropped: stdout writer has stopped");
        }
    }
    // Only now does the request stop counting as in flight.
    drop(admission);
}

/// Whether `line` is a `shutdown` request the handler will carry out (a
/// single one: a JSON-RPC batch holding one begins the shutdown when it
/// runs). It is read as the handler reads it, so a malformed `shutdown`
/// (a wrong `jsonrpc`, params that are not an object) is refused without
/// ending the session. Only lines that mention the word are parsed.
fn is_shutdown(line: &[u8]) -> bool {
    if memchr::memmem::find(line, b"shutdown").is_none() {
        return false;
    }
    let Some(text) = std::str::from_utf8(line).ok().map(request_text) else {
        return false;
    };
    parse_request(text).is_ok_and(|r| r.method == Ok(Method::Shutdown) && crate::params::require_object(Method::Shutdown, r.params).is_ok())
}

/// The response line for one input line (`None`: nothing to answer).
pub async fn handle_line(engine: &Arc<Engine>, line: &[u8], seq: u64, lane: &mut Lane) -> Option<Vec<u8>> {
    let mut notes = Vec::new();
    let reply = answer_line(engine, line, seq, &mut notes, lane).await;
    if notes.is_empty() {
        return reply;
    }
    // Notifications go out just before the response they came from.
    let mut out = notes.join(&b'\n');
    if let Some(reply) = reply {
        out.push(b'\n');
        out.extend_from_slice(&reply);
    }
    Some(out)
}

/// Most members a JSON-RPC batch array may hold; a larger batch is refused
/// before any member runs.
pub const MAX_BATCH_MEMBERS: usize = 128;
/// The smallest response a batch member must have room for: an error with
/// a short message, besides its id.
pub(crate) const MIN_MEMBER_RESPONSE_BYTES: usize = 400;

/// A line's request text: without a leading byte order mark, which may be
/// ignored (RFC 8259 §8.1) and which a client writing UTF-8 "with BOM" puts
/// before its first line, and without JSON's own whitespace around it. Other
/// Unicode spaces (`\x0b`, `\x0c`, U+00A0) are not blank, they are invalid
/// JSON and get `-32700`.
fn request_text(line: &str) -> &str {
    let line = line.strip_prefix('\u{feff}').unwrap_or(line);
    line.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

async fn answer_line(engine: &Arc<Engine>, line: &[u8], seq: u64, notes: &mut Vec<Vec<u8>>, lane: &mut Lane) -> Option<Vec<u8>> {
    let text = match std::str::from_utf8(line) {
        Ok(t) => request_text(t),
        Err(e) => {
            return Some(error_line(
                &null_id(),
                &RpcError::new(
                    ErrorCode::ParseError,
                    "parse error: line is not valid UTF-8",
                    format!("Invalid UTF-8 at byte {}. Encode requests as UTF-8 JSON.", e.valid_up_to()),
                ),
            ))
        }
    };
    if text.is_empty() {
        tracing::debug!("ignoring blank input line");
        return None;
    }
    let limit = engine.config.max_response_bytes;
    // One deadline for a whole JSON-RPC batch: its members run in turn, and
    // together they must not hold the line longer than one request may.
    let deadline = Instant::now() + engine.config.eval_timeout;
    if !text.starts_with('[') {
        let request = parse_request(text);
        if let Ok(Request { id: Some(id), .. }) = &request {
            engine.unanswered.expect_one(seq, id);
        }
        return handle_one(engine, request, seq, notes, limit, deadline, lane).await;
    }
    let items: Vec<&RawValue> = match serde_json::from_str(text) {
        Ok(items) => items,
        Err(e) => {
            return Some(error_line(
                &null_id(),
                &RpcError::new(
                    ErrorCode::ParseError,
                    "parse error: line is not valid JSON",
                    format!(
                        "{}. Send one compact JSON-RPC request per line.",
                        crate::text::clip(&e.to_string(), 200)
                    ),
                ),
            ))
        }
    };
    let refuse = |message: String, detail: String| Some(error_line(&null_id(), &RpcError::new(ErrorCode::InvalidRequest, message, detail)));
    if items.is_empty() {
        return refuse(
            "invalid request: empty batch".into(),
            "A JSON-RPC batch array must hold at least one request.".into(),
        );
    }
    if items.len() > MAX_BATCH_MEMBERS {
        return refuse(
            format!("invalid request: batch too large: {} members > {MAX_BATCH_MEMBERS}", items.len()),
            format!("A JSON-RPC batch may hold at most {MAX_BATCH_MEMBERS} requests; none of this batch was run. Send fewer requests per batch, or one request per line."),
        );
    }
    // Every member's response shares one line: each gets an equal share,
    // and the batch is refused before anything runs if a share cannot
    // hold even a short error under the member's id.
    let share = limit.saturating_sub(2 + items.len()) / items.len();
    let ids: Vec<Option<Box<RawValue>>> = items.iter().map(|raw| sniff_request(raw.get().as_bytes()).0).collect();
    let longest_id = ids.iter().map(|id| id.as_ref().map_or(4, |id| id.get().len())).max().unwrap_or(4);
    if longest_id + MIN_MEMBER_RESPONSE_BYTES > share {
        return refuse(
            format!("invalid request: batch too large: {} responses cannot share one {limit}-byte line", items.len()),
            format!("Each member of this batch would get {share} bytes of the response line, too few for its answer; none of this batch was run. Send fewer requests per batch, or one request per line."),
        );
    }
    engine.unanswered.expect_batch(seq, ids.into_iter().flatten().collect());
    // Batch members run in order; the batch as a whole runs concurrently with other lines.
    let mut replies = Vec::with_capacity(items.len());
    for raw in &items {
        replies.extend(handle_one(engine, parse_request(raw.get()), seq, notes, share, deadline, lane).await);
    }
    if replies.is_empty() {
        return None;
    }
    Some(protocol::batch_line(&replies))
}

/// Answers one request object (as parsed) in at most `budget` bytes.
async fn handle_one(
    engine: &Arc<Engine>,
    request: Result<Request<'_>, protocol::Rejected>,
    seq: u64,
    notes: &mut Vec<Vec<u8>>,
    budget: usize,
    deadline: Instant,
    lane: &mut Lane,
) -> Option<Vec<u8>> {
    let req = match request {
        Ok(r) => r,
        Err(rejected) => return Some(error_line_within(&rejected.id, &rejected.error, budget)),
    };
    let Request { id, method, params } = req;
    let method = match method {
        Ok(m) => m,
        Err(name) => {
            let err = RpcError::new(
                ErrorCode::MethodNotFound,
                format!("method not found: {}", crate::text::clip(&name, 80)),
                format!("Supported methods: {}.", method_list()),
            );
            return match id {
                Some(id) => Some(error_line(id, &err)),
                None => {
                    tracing::warn!(method = %crate::text::clip(&name, 80), "notification for an unknown method ignored");
                    None
                }
            };
        }
    };
    let id_len = id.map_or(4, |i| i.get().len());
    let result_budget = budget.saturating_sub(ENVELOPE_BYTES + id_len);
    let outcome = dispatch(engine, method, params, result_budget, deadline, seq, notes, lane).await;
    let Some(id) = id else {
        if let Err(e) = &outcome {
            tracing::warn!(method = method.name(), error = %e, "notification failed (no response is sent for notifications)");
        }
        return None;
    };
    Some(match outcome {
        Ok(result) if result.get().len() <= result_budget => success_line(id, &result).unwrap_or_else(|e| {
            error_line(
                id,
                &RpcError::new(ErrorCode::EngineError, "failed to serialise the result", e.to_string()),
            )
        }),
        // Every method bounds what it echoes; this is the last line of
        // defence for the response-size guarantee, and for batch members
        // whose share of the line is small.
        Ok(result) => error_line(
            id,
            &RpcError::new(
                ErrorCode::InvalidRequest,
                format!("{} result too large: {} bytes > {result_budget}", method.name(), result.get().len()),
                "The answer does not fit the response line it has (64 KiB, shared equally between the members of a JSON-RPC batch). Send this request on its own line.",
            ),
        ),
        Err(e) => error_line_within(id, &e, budget),
    })
}

/// [`error_line`], shortened to fit `budget` bytes (a batch member's share
/// of the line): the message and detail are clipped further until it fits,
/// keeping the code, the error type and the field named.
fn error_line_within(id: &RawValue, e: &RpcError, budget: usize) -> Vec<u8> {
    let line = error_line(id, e);
    if line.len() <= budget {
        return line;
    }
    let mut short = e.clone();
    for chars in [300, 120, 48] {
        short.message = crate::text::clip(&e.message, chars);
        short.detail = crate::text::clip(&e.detail, chars);
        let line = error_line(id, &short);
        if line.len() <= budget {
            return line;
        }
    }
    error_line(id, &short)
}

fn to_raw<T: Serialize>(value: &T) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(value)
        .map_err(|e| RpcError::new(ErrorCode::EngineError, "failed to serialise the result", e.to_string()))
}

/// Runs one request. Notification lines to send before its response (drift
/// alerts, when enabled) are added to `notes`.
#[allow(clippy::too_many_arguments)]
async fn dispatch(
    engine: &Arc<Engine>,
    method: Method,
    params: Option<&RawValue>,
    budget: usize,
    deadline: Instant,
    seq: u64,
    notes: &mut Vec<Vec<u8>>,
    lane: &mut Lane,
) -> Result<Box<RawValue>, RpcError> {
    if method == Method::Initialize {
        return to_raw(&engine.initialize(params)?);
    }
    if matches!(method, Method::Shutdown | Method::ListPlugins | Method::CacheStats) {
        // They take no params; any object is accepted for forward compatibility.
        crate::params::require_object(method, params)?;
    }
    if method == Method::Shutdown {
        let result = engine.shutdown(seq).await?;
        // Requests the drain gave up on are answered before shutdown is.
        notes.extend(engine.unanswered.abandon(Some(seq), engine.config.drain_timeout));
        tracing::info!(assertions_evaluated = result.assertions_evaluated, "shutdown requested");
        return to_raw(&result);
    }
    engine.require_ready(method, seq)?;
    if matches!(method, Method::EvaluateBatch | Method::GenerateUserMessage) && Instant::now() >= deadline {
        return Err(RpcError::new(
            ErrorCode::Timeout,
            format!("evaluation timed out after {}ms", engine.config.eval_timeout.as_millis()),
            "The JSON-RPC batch this request belongs to used up the evaluation deadline before it could start. Send fewer or lighter requests per batch, or raise --eval-timeout.",
        ));
    }
    match method {
        Method::EvaluateBatch => evaluate_batch(engine, params, budget, deadline, notes, lane).await,
        Method::SubmitPluginResult => submit_plugin_result(engine, params),
        Method::ListPlugins => to_raw(&engine.plugins.listing(budget)),
        Method::ValidateTraceTree => to_raw(&validate_trace_tree(engine, params)?),
        Method::QueryDrift => query_drift(engine, params, deadline, lane).await,
        Method::GenerateUserMessage => to_raw(&crate::simulation::generate(&engine.providers, params, deadline.into()).await?),
        Method::CacheStats => cache_stats(engine).await,
        Method::Initialize | Method::Shutdown => unreachable!("handled above"),
    }
}

/// `evaluate_batch`, its drift alerts queued as notifications, and its
/// answer fitted to one response line.
async fn evaluate_batch(
    engine: &Arc<Engine>,
    params: Option<&RawValue>,
    budget: usize,
    deadline: Instant,
    notes: &mut Vec<Vec<u8>>,
    lane: &mut Lane,
) -> Result<Box<RawValue>, RpcError> {
    // A panic in an evaluator (a bug) becomes a 3001 for this request
    // only; every request still gets exactly one response.
    let run = async {
        use futures_util::FutureExt;
        std::panic::AssertUnwindSafe(batch::evaluate(engine, params, deadline, budget, lane)).catch_unwind().await.unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(RpcError::new(
                ErrorCode::EngineError,
                format!("internal error while evaluating: {}", crate::text::clip(what, 200)),
                "This is an engine bug, not a problem with the request. Other requests are unaffected; please report it with the request that caused it.",
            ))
        })
    };
    let mut result = run.await?;
    // The webhook has them from the sinks; the SDK reads them as notifications.
    if engine.config.drift_alerts {
        notes.extend(result.alerts.drain(..).filter_map(|alert| crate::alerts::notification(&alert)));
    }
    let raw = to_raw(&result)?;
    if raw.get().len() <= budget {
        tracing::debug!(trace_id = %result.trace_id, assertions = result.results.len(), duration_ms = result.total_duration_ms, "evaluation complete");
        return Ok(raw);
    }
    if !result.fit(budget) {
        return Err(RpcError::new(
            ErrorCode::AssertionError,
            format!(
                "batch too large to answer: {} results do not fit in one {}-byte response line",
                result.results.len(),
                engine.config.max_response_bytes
            ),
            "SDKs read responses as single lines of at most 64 KiB. Split the assertions into several evaluate_batch requests.",
        )
        .with_field("params.assertions"));
    }
    tracing::debug!(trace_id = %result.trace_id, assertions = result.results.len(), duration_ms = result.total_duration_ms, "evaluation complete");
    to_raw(&result)
}

fn submit_plugin_result(engine: &Engine, params: Option<&RawValue>) -> Result<Box<RawValue>, RpcError> {
    let record = plugin_results::parse(params)?;
    tracing::debug!(trace_id = %record.trace_id, plugin = %record.plugin_name, "plugin result recorded");
    engine.sinks.record_submitted(record);
    to_raw(&Accepted { accepted: true })
}

async fn query_drift(
    engine: &Arc<Engine>,
    params: Option<&RawValue>,
    deadline: Instant,
    lane: &mut Lane,
) -> Result<Box<RawValue>, RpcError> {
    let (subject, window) = crate::query_drift::parse_query(params)?;
    if engine.sinks.history.is_none() {
        // A backend this engine was not given: configuration, not a fault.
        return Err(crate::errors::history_unavailable());
    }
    // History reads take the store's lock and the disk: off the async workers.
    let engine = engine.clone();
    let report = lane
        .block(async move {
            let history = engine
                .sinks
                .history
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("result history is closed"))?;
            history.drift(subject, window, deadline)
        })
        .await
        .map_err(|e| crate::errors::history_failed(&e))?;
    to_raw(&serde_json::json!({ "report": report }))
}

async fn cache_stats(engine: &Engine) -> Result<Box<RawValue>, RpcError> {
    match &engine.providers.cache {
        Some(cache) => to_raw(&cache.stats().await),
        None => Err(RpcError::new(
            ErrorCode::ProviderError,
            "provider cache not available",
            "The provider cache is off, no embedding or judge provider is configured, or the cache could not be opened (see the engine log). It lives in <cache_dir>/providers.sqlite3; it needs a provider, providers.cache = true and a writable ATTEST_CACHE_DIR.",
        )
        .not_retryable()),
    }
}

/// `validate_trace_tree`: the tree's integrity, depth, agents and aggregates,
/// without assertions. Problems between levels (links, duplicate ids, depth)
/// are reported in `errors`; a level that breaks Attest protocol v1 §7 is a 1001.
fn validate_trace_tree(engine: &Engine, params: Option<&RawValue>) -> Result<crate::trace::tree::TreeSummary, RpcError> {
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        trace: Option<&'a RawValue>,
    }
    let shape = "Send {\"trace\": <trace object>} (spec §3).";
    crate::params::require_object(Method::ValidateTraceTree, params)?;
    let trace = params
        .map(|p| serde_json::from_str::<Params<'_>>(p.get()))
        .transpose()
        .map_err(
            |e| match crate::json_errors::unrepresentable(params.map_or("", |p| p.get()), &e, "params") {
                Some(u) if u.field.starts_with("params.trace") => trace_error(crate::trace::validate::unrepresentable_trace(
                    params.map_or("", |p| p.get()),
                    u,
                    engine.limits.max_depth,
                )),
                Some(u) => RpcError::new(ErrorCode::InvalidTrace, u.message, shape).with_field(u.field),
                None => RpcError::new(ErrorCode::InvalidTrace, "validate_trace_tree params could not be read", shape).with_field("params"),
            },
        )?
        .and_then(|p| p.trace)
        .filter(|t| t.get() != "null")
        .ok_or_else(|| {
            RpcError::new(
                ErrorCode::InvalidTrace,
                "validate_trace_tree params missing required field: trace",
                shape,
            )
            .with_field("params.trace")
        })?;
    let limits = crate::trace::Limits {
        // Depth is reported, not refused; serde_json's recursion limit still bounds it.
        max_depth: usize::MAX,
        ..engine.limits.clone()
    };
    let parsed = crate::trace::validate::parse_trace_levels(trace, &limits).map_err(trace_error)?;
    let mut summary = crate::trace::tree::summary(&parsed.trace);
    if summary.depth > engine.limits.max_depth {
        summary.errors.insert(
            0,
            format!("trace nesting depth {} exceeds maximum {}", summary.depth, engine.limits.max_depth),
        );
        summary.valid = false;
    }
    Ok(summary)
}

/// The answer to a line longer than the limit: 1001 for an evaluation
/// (its trace is what is too big), -32600 otherwise.
fn oversized_reply(prefix: &[u8], len: usize, max_line: usize) -> Vec<u8> {
    let (id, method) = sniff_request(prefix);
    let id = id.unwrap_or_else(null_id);
    tracing::warn!(bytes = len, limit = max_line, "oversized request line skipped");
    let limit_text = format!(
        "A request line may hold at most {max_line} bytes: a trace of at most {} bytes (10 MB) plus {LINE_HEADROOM_BYTES} bytes for the rest of the request.",
        max_line - LINE_HEADROOM_BYTES
    );
    let error = match method.as_deref() {
        Some("evaluate_batch") | None => RpcError::new(
            ErrorCode::InvalidTrace,
            format!("request line exceeds max size: {len} > {max_line} bytes"),
            format!("{limit_text} Reduce trace size by filtering steps or truncating tool results."),
        )
        .with_field("params.trace"),
        Some(_) => RpcError::new(
            ErrorCode::InvalidRequest,
            format!("request line exceeds max size: {len} > {max_line} bytes"),
            limit_text,
        ),
    };
    protocol::error_line(&id, &error)
}

/// SIGTERM and SIGINT as one stream (nothing on platforms without them).
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let term = async {
                match &mut self.term {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match &mut self.int {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = term => tracing::info!("SIGTERM received"),
                _ = int => tracing::info!("SIGINT received"),
            }
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}
