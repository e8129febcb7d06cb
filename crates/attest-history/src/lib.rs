//! Result history: every evaluated result and every `submit_plugin_result`,
//! kept for `query_drift` and dynamic thresholds, in one of two stores:
//!
//! - an embedded SQLite file under the cache directory (the default; see
//!   [`store`]), for one machine;
//! - a shared PostgreSQL database (`history = "postgres://…"`; see
//!   [`postgres`]), which every process of a fleet writes and reads.
//!
//! Writes never happen on the request path: a batch's rows go into a bounded
//! queue and one writer thread inserts them in large transactions. The same
//! thread answers queries, after the rows queued before them, so a client
//! that evaluates and then asks for drift sees its own results.
//!
//! Rows are keyed by `assertion_id` and by a stable fingerprint of the
//! assertion (type, canonical spec without `soft`/`threshold`, and the trace's
//! agent id), because SDKs generate a fresh random `assertion_id` every run.
//!
//! Continuous evaluation writes a result per assertion per trace, so the
//! file stores a batch per row (see [`store`]).

mod postgres;
pub use postgres::newest_rows as newest_postgres_rows;
pub mod read;
mod store;

pub use attest_core::drift::{dynamic_status, mean_stddev, DriftReport, DriftStatus, Fingerprint, SpecDigest, BAND_PASS, BAND_SOFT};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Rows waiting for the writer before new ones are dropped (and counted):
/// room for a burst of 100,000 batches of 8 while the low-priority writer
/// waits for idle CPU. Counted in units of about [`ROW_BYTES`], so that
/// long ids weigh what they hold (see [`Rows::weight`]): about 80 MB at most.
const MAX_QUEUED_ROWS: usize = 800_000;
/// What one queued row holds, in bytes, besides its ids.
const ROW_BYTES: usize = 100;
/// Rows waiting that wake the writer before its next look.
const HIGH_WATERMARK: usize = 200_000;
/// How often the writer looks at the queue when nothing wakes it sooner.
const IDLE_FLUSH: Duration = Duration::from_millis(100);

/// Where the history lives.
#[derive(Clone, PartialEq)]
pub enum Location {
    /// An SQLite file, shared by the engines of one machine.
    File(PathBuf),
    /// A PostgreSQL connection string (`postgres://user:password@host/db`
    /// or `host=… dbname=…`), shared by a fleet.
    Postgres(String),
}

impl Location {
    /// Whether `value` names a PostgreSQL database rather than a file.
    pub fn is_postgres_url(value: &str) -> bool {
        value.starts_with("postgres://") || value.starts_with("postgresql://")
    }

    /// The SQLite file, if that is where the history lives.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            Location::File(path) => Some(path),
            Location::Postgres(_) => None,
        }
    }
}

/// Shown in logs and errors: the file, or the database URL without its
/// password.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::File(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => f.write_str(&postgres::without_password(url)),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// Where and how long history is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryConfig {
    pub location: Location,
    pub max_rows: u64,
    pub max_age: Duration,
    /// Bytes the store's pages in use may take; past it the oldest results
    /// go, as past `max_rows`.
    pub max_bytes: u64,
    /// Wait for the writer when it is behind, rather than drop rows: for
    /// one-shot commands (`eval`), whose results are all there is to record.
    /// A server keeps it off, so no request waits for the disk.
    pub wait_when_behind: bool,
    /// Non-passing evaluations whose explanations and trace are kept (0:
    /// none); past it the oldest go first.
    pub kept_evaluations: u64,
    /// Compressed bytes those may take; past it the oldest go first.
    pub kept_bytes: u64,
}

/// Copies the history file `from` into the new file `to`, reading `from`
/// read-only: a consistent snapshot even while an engine writes to it (the
/// viewer adds results files to such a copy, never to the history itself).
pub fn copy_file_store(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    use rusqlite::{Connection, OpenFlags};
    let conn = Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy()])?;
    Ok(())
}

/// The engine's name for an assertion type read back from a file or
/// another store (rows keep `'static` names): one of the core's types, or
/// `ecp` (what the ECP runtime records its checks as); a type it does not
/// know counts as a plugin's.
pub fn assertion_type_name(kind: &str) -> &'static str {
    use attest_core::layers::AssertionType;
    match AssertionType::parse(kind) {
        Some(t) => t.name(),
        None if kind == "ecp" => "ecp",
        None => AssertionType::Plugin.name(),
    }
}

/// Non-passing evaluations kept with their trace, by default.
pub const DEFAULT_KEPT_EVALUATIONS: u64 = 10_000;
/// Compressed bytes they may take, by default.
pub const DEFAULT_KEPT_BYTES: u64 = 256 << 20;

/// How long a waiting [`History::record`] waits for the writer before it
/// drops the rows after all.
const MAX_WAIT_BEHIND: Duration = Duration::from_secs(30);

/// One result to remember.
#[derive(Debug, Clone)]
pub struct Row {
    pub assertion_id: String,
    /// The writer mixes in the batch's agent to get the row's [`Fingerprint`]:
    /// hashing happens off the hot path.
    pub spec: SpecDigest,
    pub assertion_type: &'static str,
    pub status: attest_trace::Status,
    pub score: f64,
    /// USD spent on it (paid layers); 0 for the free ones.
    pub cost: f64,
}

/// The run a batch belongs to: a test session, an `eval` command, a
/// collector or worker process, or an ECP run. The viewer lists runs and
/// compares two.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Unique among runs (the writer interns it).
    pub key: String,
    pub kind: RunKind,
    /// What a person recognises it by: the SDK and its version, the
    /// command's files, the manifest.
    pub label: String,
}

/// Which front door a run came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Session,
    Eval,
    Collect,
    Ecp,
}

impl RunKind {
    pub fn name(self) -> &'static str {
        match self {
            RunKind::Session => "session",
            RunKind::Eval => "eval",
            RunKind::Collect => "collect",
            RunKind::Ecp => "ecp",
        }
    }
}

/// What a non-passing evaluation keeps beyond its statuses and scores, so
/// that a person can see why: each result's explanation and evidence, and
/// the trace it judged. Stored compressed and bounded
/// ([`HistoryConfig::kept_evaluations`], [`HistoryConfig::kept_bytes`]).
#[derive(Debug, Clone, Default)]
pub struct Kept {
    /// The trace as it was sent (JSON text), when the front door has it.
    pub trace: Option<String>,
    /// One per row, in row order.
    pub details: Vec<Detail>,
}

/// One result's explanation and evidence, as answered.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Detail {
    pub explanation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_node_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The judge's audit trail (model, rubric version, samples, variance,
    /// bias probes), for `llm_judge` results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<serde_json::Value>,
}

impl Kept {
    /// Bytes it holds before compression.
    fn bytes(&self) -> usize {
        self.trace.as_ref().map_or(0, String::len)
            + self
                .details
                .iter()
                .map(|d| {
                    d.explanation.len()
                        + [&d.trace_node_path, &d.expected, &d.actual, &d.hint]
                            .iter()
                            .map(|s| s.as_ref().map_or(0, String::len))
                            .sum::<usize>()
                        + d.judge.as_ref().map_or(0, |_| 512)
                })
                .sum::<usize>()
    }
}

/// The rows of one batch (or one submission), sharing trace and agent.
#[derive(Debug, Clone)]
pub struct Rows {
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub rows: Vec<Row>,
    /// Each row is written at most once per (trace id, assertion id), even
    /// across restarts: production traces may be delivered and scored more
    /// than once, and must count once. Test runs legitimately re-run traces,
    /// so their rows are not keyed.
    pub keyed: bool,
    pub run: Option<Arc<Run>>,
    /// Set by front doors for an evaluation with a non-passing result.
    pub kept: Option<Box<Kept>>,
    /// When the results were produced (Unix ms), for results recorded after
    /// the fact (reports and results files the viewer reads); `None` is now.
    pub recorded_at_ms: Option<i64>,
}

impl Rows {
    /// What these rows count for in the queue: one unit per row, plus one
    /// per [`ROW_BYTES`] of the ids and kept text they carry.
    fn weight(&self) -> usize {
        let ids = self.trace_id.len()
            + self.agent_id.as_ref().map_or(0, String::len)
            + self.rows.iter().map(|r| r.assertion_id.len()).sum::<usize>()
            + self.kept.as_ref().map_or(0, |k| k.bytes());
        self.rows.len() + ids / ROW_BYTES
    }
}

/// What `query_drift` asks about.
#[derive(Debug, Clone)]
pub enum Subject {
    /// The assertion's fingerprint, as reported by `query_drift`.
    Fingerprint(Fingerprint),
    /// An assertion id: resolved to the fingerprint of its latest result,
    /// so ids an SDK generated afresh on each run still find their history.
    AssertionId(String),
}

/// A question for the writer thread, answered after every row queued before it.
enum Query {
    /// Most recent scores of a fingerprint, newest first.
    Recent(Fingerprint, u64, SyncSender<anyhow::Result<Vec<f64>>>),
    Drift(Subject, u64, SyncSender<anyhow::Result<DriftReport>>),
}

enum Msg {
    Rows(Rows),
    Query(Query),
    /// Rows to write now, with the answer whether their transaction committed.
    Commit(Vec<Rows>, SyncSender<Result<(), String>>),
    /// The engine is done: write what is queued and stop.
    Close,
}

/// Handle to the history store; cheap to share.
///
/// Requests hand rows over on a lock-free channel and never wake the writer
/// thread for them. The writer looks every [`IDLE_FLUSH`] (sooner when
/// [`HIGH_WATERMARK`] rows are waiting, for a query, or at shutdown) and
/// writes what is queued. It runs at `SCHED_IDLE`, so during a burst it
/// writes only on a core that would otherwise idle: a request pays for a
/// channel push, never for a disk write, a lock or a thread wake-up, and
/// the rows are durable soon after the burst instead of long after it.
pub struct History {
    tx: Sender<Msg>,
    writer: std::thread::Thread,
    shared: Arc<Shared>,
    dropped: AtomicU64,
    /// Whether a full queue is waited on ([`HistoryConfig::wait_when_behind`]);
    /// cleared once a wait runs out, so a writer that cannot keep up costs
    /// one wait, not one per batch.
    waits: std::sync::atomic::AtomicBool,
    pub location: Location,
}

/// What the writer reads to decide whether to write now.
#[derive(Default)]
struct Shared {
    /// Rows sent and not yet taken by the writer.
    queued_rows: AtomicUsize,
    /// Queries (and the shutdown) waiting: write at once.
    urgent: AtomicUsize,
}

impl History {
    /// Opens (or creates) the store and starts its writer thread.
    ///
    /// A PostgreSQL store is connected to and migrated here, within
    /// [`postgres::CONNECT_TIMEOUT`]: a database that cannot be reached is
    /// an error now, not a stream of failed writes later.
    pub fn open(config: &HistoryConfig) -> anyhow::Result<History> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        // A server's writer runs only on CPU nothing else wants; a one-shot
        // command, which waits for it, needs it to run.
        let idle = !config.wait_when_behind;
        let spawn = std::thread::Builder::new().name("attest-history".into());
        let mut writer: Box<dyn Backend + Send> = match &config.location {
            Location::File(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                Box::new(store::Writer::new(store::open_connection(path)?, config.clone()))
            }
            Location::Postgres(url) => Box::new(postgres::Writer::connect(url, config.clone())?),
        };
        writer.prune();
        let handle = spawn.spawn(move || {
            if idle {
                store::lower_thread_priority();
            }
            run_writer(writer, &rx, &state)
        })?;
        Ok(History {
            tx,
            writer: handle.thread().clone(),
            shared,
            dropped: AtomicU64::new(0),
            waits: std::sync::atomic::AtomicBool::new(config.wait_when_behind),
            location: config.location.clone(),
        })
    }

    /// Queues rows for writing. Past [`MAX_QUEUED_ROWS`] waiting rows, new
    /// ones are dropped (and logged); with
    /// [`HistoryConfig::wait_when_behind`], only after waiting up to
    /// [`MAX_WAIT_BEHIND`] for the writer to catch up (once: after a wait
    /// runs out, rows are dropped at once). Otherwise it never blocks.
    pub fn record(&self, rows: Rows) {
        if rows.rows.is_empty() {
            return;
        }
        let n = rows.weight();
        let mut was = self.shared.queued_rows.fetch_add(n, Ordering::AcqRel);
        if was + n > MAX_QUEUED_ROWS && self.waits.load(Ordering::Relaxed) {
            let give_up = Instant::now() + MAX_WAIT_BEHIND;
            while was + n > MAX_QUEUED_ROWS && Instant::now() < give_up {
                self.shared.queued_rows.fetch_sub(n, Ordering::AcqRel);
                self.writer.unpark();
                std::thread::sleep(Duration::from_millis(2));
                was = self.shared.queued_rows.fetch_add(n, Ordering::AcqRel);
            }
            if was + n > MAX_QUEUED_ROWS {
                self.waits.store(false, Ordering::Relaxed);
            }
        }
        if was + n > MAX_QUEUED_ROWS {
            self.shared.queued_rows.fetch_sub(n, Ordering::AcqRel);
            let lost = rows.rows.len() as u64;
            let before = self.dropped.fetch_add(lost, Ordering::Relaxed);
            if before == 0 || (before + lost) / 10_000 > before / 10_000 {
                tracing::warn!(dropped_rows = before + lost, "history writer is behind; results were not recorded");
            }
            return;
        }
        if self.tx.send(Msg::Rows(rows)).is_err() {
            tracing::error!("history writer has stopped; results were not recorded");
            return;
        }
        if was < HIGH_WATERMARK && was + n >= HIGH_WATERMARK {
            self.writer.unpark();
        }
    }

    /// Writes `rows` now and returns once their transaction has committed
    /// (blocking, until `deadline`): for callers that acknowledge what they
    /// store, such as a sink that acks a message only after its results are
    /// durable. Never dropped for a full queue; an error says it was not
    /// committed.
    pub fn record_committed(&self, rows: Vec<Rows>, deadline: Instant) -> anyhow::Result<()> {
        if rows.iter().all(|r| r.rows.is_empty()) {
            return Ok(());
        }
        let (reply, answer) = sync_channel(1);
        self.shared.urgent.fetch_add(1, Ordering::AcqRel);
        self.tx
            .send(Msg::Commit(rows, reply))
            .map_err(|_| anyhow::anyhow!("history writer has stopped"))?;
        self.writer.unpark();
        match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result.map_err(|e| anyhow::anyhow!("the result history did not commit: {e}")),
            Err(RecvTimeoutError::Timeout) => Err(anyhow::Error::new(Unanswered)),
            Err(RecvTimeoutError::Disconnected) => Err(anyhow::anyhow!("history writer has stopped")),
        }
    }

    /// Asks the writer, which answers after writing every row queued before
    /// the question; gives up at `deadline` (the writer then answers no one).
    fn ask<T>(&self, deadline: Instant, query: impl FnOnce(SyncSender<anyhow::Result<T>>) -> Query) -> anyhow::Result<T> {
        let (reply, answer) = sync_channel(1);
        self.shared.urgent.fetch_add(1, Ordering::AcqRel);
        self.tx
            .send(Msg::Query(query(reply)))
            .map_err(|_| anyhow::anyhow!("history writer has stopped"))?;
        self.writer.unpark();
        match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => Err(anyhow::Error::new(Unanswered)),
            Err(RecvTimeoutError::Disconnected) => Err(anyhow::anyhow!("history writer has stopped")),
        }
    }

    /// The latest `limit` scores of `fp`, newest first (blocking, until `deadline`).
    pub fn recent_scores(&self, fp: Fingerprint, limit: u64, deadline: Instant) -> anyhow::Result<Vec<f64>> {
        self.ask(deadline, |reply| Query::Recent(fp, limit, reply))
    }

    /// Drift statistics over the latest `window` results (blocking, until `deadline`).
    pub fn drift(&self, subject: Subject, window: u64, deadline: Instant) -> anyhow::Result<DriftReport> {
        self.ask(deadline, |reply| Query::Drift(subject, window, reply))
    }

    /// Waits until every row queued so far is written, or until `deadline`
    /// (at shutdown).
    pub fn flush(&self, deadline: Instant) {
        if let Err(e) = self.recent_scores(Fingerprint([0; 16]), 0, deadline) {
            tracing::error!(error = %e, "cannot flush result history");
        }
    }

    pub fn dropped_rows(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Rows waiting for the writer, in queue units (about a row each).
    pub fn queued_rows(&self) -> usize {
        self.shared.queued_rows.load(Ordering::Acquire)
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.shared.urgent.fetch_add(1, Ordering::AcqRel);
        let _ = self.tx.send(Msg::Close);
        self.writer.unpark();
    }
}

/// What a store does for the writer thread, which owns it.
trait Backend {
    /// Writes `pending` in one transaction (emptying it); the results it
    /// wrote, or why it did not commit.
    fn write(&mut self, pending: &mut Vec<Rows>) -> Result<u64, String>;
    /// Answers a question; everything queued before it is written.
    fn answer(&mut self, query: Query);
    /// Enforces the age, result-count and byte limits.
    fn prune(&mut self);
}

/// Retention is enforced after this many results written (and at start-up).
const PRUNE_EVERY_ROWS: u64 = 50_000;

/// The writer thread: looks at the queue every [`IDLE_FLUSH`] (sooner when
/// woken) and writes what it finds, answering questions and commits in
/// queue order.
fn run_writer(mut store: Box<dyn Backend + Send>, rx: &Receiver<Msg>, shared: &Shared) {
    // Whether the last look stopped at a full write with rows still queued.
    let mut more = false;
    let mut since_prune = 0u64;
    // Writes, and applies retention when it is due.
    let mut write = |store: &mut Box<dyn Backend + Send>, rows: &mut Vec<Rows>| -> Result<(), String> {
        let n = store.write(rows)?;
        since_prune += n;
        if since_prune >= PRUNE_EVERY_ROWS {
            store.prune();
            since_prune = 0;
        }
        Ok(())
    };
    loop {
        if !more {
            std::thread::park_timeout(IDLE_FLUSH);
            if shared.queued_rows.load(Ordering::Acquire) == 0 && shared.urgent.load(Ordering::Acquire) == 0 {
                continue;
            }
        }
        more = false;
        let mut rows = Vec::new();
        // Rows taken off the queue no longer count in it, so a writer that
        // took all it found while producers kept up would hold without
        // bound: it writes at most this much at a time.
        let mut taken = 0;
        let mut closed = false;
        loop {
            if taken >= HIGH_WATERMARK {
                more = true;
                break;
            }
            match rx.try_recv() {
                Ok(Msg::Rows(r)) => {
                    let weight = r.weight();
                    shared.queued_rows.fetch_sub(weight, Ordering::AcqRel);
                    taken += weight;
                    rows.push(r);
                }
                // Questions are answered after the rows queued before them.
                Ok(Msg::Query(q)) => {
                    shared.urgent.fetch_sub(1, Ordering::AcqRel);
                    let _ = write(&mut store, &mut rows);
                    store.answer(q);
                }
                // Written with what is queued, in one transaction, and
                // answered with whether it committed.
                Ok(Msg::Commit(batch, reply)) => {
                    shared.urgent.fetch_sub(1, Ordering::AcqRel);
                    rows.extend(batch);
                    let _ = reply.send(write(&mut store, &mut rows));
                }
                Ok(Msg::Close) | Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        let _ = write(&mut store, &mut rows);
        if closed {
            return;
        }
    }
}

/// The history did not answer before the caller's deadline: the writer was
/// still writing rows queued before the question.
#[derive(Debug)]
pub struct Unanswered;

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the result history did not answer before the deadline (it was still writing queued results)")
    }
}

impl std::error::Error for Unanswered {}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Dynamic thresholds read earlier scores through the core's trait.
impl attest_core::backends::ScoreHistory for History {
    fn recent_scores(&self, fingerprint: Fingerprint, limit: u64, deadline: Instant) -> Result<Vec<f64>, String> {
        History::recent_scores(self, fingerprint, limit, deadline).map_err(|e| e.to_string())
    }
}
