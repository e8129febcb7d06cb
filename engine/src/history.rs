//! Result history: every evaluated result and every `submit_plugin_result`,
//! kept in SQLite under the cache directory, for `query_drift` and dynamic
//! thresholds.
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
//! Continuous evaluation writes a row per assertion per trace, so a row is
//! kept narrow: fingerprints and assertion ids are interned in their own
//! tables (a result row holds two integers for them), the only index on
//! results is (fingerprint, id), and rows go in as multi-row inserts.

use rusqlite::{params, Connection};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Rows waiting for the writer before new ones are dropped (and counted):
/// room for a burst of 100,000 batches of 8 while the low-priority writer
/// waits for idle CPU (about 100 bytes a row).
const MAX_QUEUED_ROWS: usize = 800_000;
/// Rows waiting that wake the writer before its next look.
const HIGH_WATERMARK: usize = 200_000;
/// How often the writer looks at the queue when nothing wakes it sooner.
const IDLE_FLUSH: Duration = Duration::from_millis(100);
/// Retention is enforced after this many rows written (and at start-up).
const PRUNE_EVERY_ROWS: u64 = 50_000;

/// Where and how long history is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryConfig {
    pub path: PathBuf,
    pub max_rows: u64,
    pub max_age: Duration,
}

/// An assertion's type and canonical spec, hashed once when it is compiled.
/// `soft` and `threshold` change how a score is judged, not the score, so
/// changing them keeps the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecDigest([u8; 32]);

impl SpecDigest {
    pub fn of(kind: &str, spec: Option<&serde_json::Value>) -> SpecDigest {
        let mut canonical = String::new();
        match spec {
            Some(serde_json::Value::Object(map)) => {
                let trimmed: serde_json::Map<String, serde_json::Value> = map
                    .iter()
                    .filter(|(k, _)| *k != "soft" && *k != "threshold")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                canonical_value(&serde_json::Value::Object(trimmed), &mut canonical);
            }
            Some(v) => canonical_value(v, &mut canonical),
            None => {}
        }
        let mut h = Sha256::new();
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(canonical.as_bytes());
        SpecDigest(h.finalize().into())
    }

    /// Results an SDK submitted for a plugin it ran itself (no agent).
    pub fn submitted(plugin_name: &str) -> SpecDigest {
        SpecDigest::of("plugin_result", Some(&serde_json::Value::String(plugin_name.to_owned())))
    }
}

/// A stable identity for an assertion across runs: its spec digest and the
/// trace's agent id. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    pub fn new(spec: &SpecDigest, agent_id: Option<&str>) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(spec.0);
        h.update(agent_id.unwrap_or_default().as_bytes());
        let digest = h.finalize();
        let mut out = [0; 16];
        out.copy_from_slice(&digest[..16]);
        Fingerprint(out)
    }

    /// The fingerprint of an assertion's type and spec, for a trace's agent.
    pub fn of(kind: &str, spec: Option<&serde_json::Value>, agent_id: Option<&str>) -> Fingerprint {
        Fingerprint::new(&SpecDigest::of(kind, spec), agent_id)
    }

    /// Identity of results an SDK submitted for a plugin it ran itself.
    pub fn submitted(plugin_name: &str) -> Fingerprint {
        Fingerprint::new(&SpecDigest::submitted(plugin_name), None)
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn parse(hex: &str) -> Option<Fingerprint> {
        // from_str_radix alone would accept a leading '+' in each pair.
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Fingerprint(out))
    }
}

/// JSON with object keys sorted at every level.
fn canonical_value(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                canonical_value(&map[k.as_str()], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_value(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// One result to remember.
#[derive(Debug, Clone)]
pub struct Row {
    pub assertion_id: String,
    /// The writer mixes in the batch's agent to get the row's [`Fingerprint`]:
    /// hashing happens off the hot path.
    pub spec: SpecDigest,
    pub assertion_type: &'static str,
    pub status: &'static str,
    pub score: f64,
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

/// `query_drift`'s `report`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftReport {
    pub assertion_id: String,
    pub fingerprint: Option<String>,
    pub mean: f64,
    pub stddev: f64,
    pub count: u64,
    pub latest_score: f64,
    pub deviation: f64,
    pub status: DriftStatus,
    pub window_size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftStatus {
    Ok,
    DriftDetected,
    NoData,
}

/// Population mean and standard deviation.
pub fn mean_stddev(scores: &[f64]) -> (f64, f64) {
    if scores.is_empty() {
        return (0.0, 0.0);
    }
    let n = scores.len() as f64;
    let mean = scores.iter().sum::<f64>() / n;
    let var = scores.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

impl DriftReport {
    /// Statistics over `scores`, most recent first. Drift: the latest score is
    /// more than one standard deviation below the window's mean.
    pub fn from_window(assertion_id: String, fingerprint: Option<Fingerprint>, scores: &[f64], window_size: u64) -> DriftReport {
        let (mean, stddev) = mean_stddev(scores);
        let latest = scores.first().copied().unwrap_or(0.0);
        let status = if scores.is_empty() {
            DriftStatus::NoData
        } else if stddev > 0.0 && latest < mean - stddev {
            DriftStatus::DriftDetected
        } else {
            DriftStatus::Ok
        };
        DriftReport {
            assertion_id,
            fingerprint: fingerprint.map(|f| f.hex()),
            mean,
            stddev,
            count: scores.len() as u64,
            latest_score: latest,
            deviation: if scores.is_empty() { 0.0 } else { latest - mean },
            status,
            window_size,
        }
    }
}

/// Scores at or above this pass the static band of a dynamic threshold.
pub const BAND_PASS: f64 = 0.8;
/// Scores at or above this (and below [`BAND_PASS`]) soft-fail it.
pub const BAND_SOFT: f64 = 0.5;

/// Judges `score` for an assertion with `threshold: "dynamic"`.
/// `history`: its earlier scores, newest first (`None`: history is off).
/// Returns the status and a sentence saying which rule applied.
pub fn dynamic_status(score: f64, history: Option<&[f64]>, min_samples: usize, soft: bool) -> (crate::layers::Status, String) {
    use crate::layers::Status;
    match history {
        Some(scores) if scores.len() >= min_samples => {
            let (mean, stddev) = mean_stddev(scores);
            let floor = mean - 2.0 * stddev;
            let status = if score >= floor {
                Status::Pass
            } else if soft {
                Status::SoftFail
            } else {
                Status::HardFail
            };
            let why = format!(
                "Dynamic threshold from history: score {score:.4} vs mean {mean:.4} - 2 x stddev {stddev:.4} = {floor:.4} over the last {} scores: {}.",
                scores.len(),
                status.as_str()
            );
            (status, why)
        }
        _ => {
            let status = if score >= BAND_PASS {
                Status::Pass
            } else if score >= BAND_SOFT {
                Status::SoftFail
            } else {
                Status::HardFail
            };
            let reason = match history {
                Some(scores) => format!("{} of the {min_samples} earlier scores needed are in history", scores.len()),
                None => "result history is off".to_owned(),
            };
            let why = format!(
                "Dynamic threshold, static band ({reason}): score {score:.4}; >= {BAND_PASS} passes, >= {BAND_SOFT} soft-fails, lower hard-fails: {}.",
                status.as_str()
            );
            (status, why)
        }
    }
}

/// Largest `window_size` `query_drift` accepts.
pub const MAX_WINDOW: u64 = 10_000;
const DEFAULT_WINDOW: u64 = 50;
const QUERY_SHAPE: &str =
    "Send {\"assertion_id\": str} or {\"fingerprint\": str (32 hex digits, from an earlier report)}, with an optional \"window_size\": 1-10000 (default 50).";

/// Reads `query_drift` params into what to look up and the window size.
pub fn parse_query(params: Option<&serde_json::value::RawValue>) -> Result<(Subject, u64), crate::protocol::RpcError> {
    use crate::protocol::{ErrorCode, RpcError};
    use serde_json::Value;
    let bad = |field: &str, message: String| {
        let path = if field.is_empty() {
            "params".to_owned()
        } else {
            format!("params.{field}")
        };
        RpcError::new(ErrorCode::AssertionError, message, QUERY_SHAPE).with_field(path)
    };
    let map = crate::params::object(crate::protocol::Method::QueryDrift, params)?;
    let window = match map.get("window_size") {
        None | Some(Value::Null) => DEFAULT_WINDOW,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_WINDOW).contains(&n) => n,
            // The SDK documents 0 as "the default".
            Some(0) => DEFAULT_WINDOW,
            _ => {
                return Err(bad(
                    "window_size",
                    format!(
                        "query_drift window_size must be a whole number from 1 to {MAX_WINDOW}, got {}",
                        crate::layers::spec::type_name(v)
                    ),
                ))
            }
        },
    };
    let text = |key: &str| match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() > crate::batch::MAX_ASSERTION_ID_BYTES => Err(bad(
            key,
            format!(
                "query_drift {key} exceeds maximum length: {} > {} bytes",
                s.len(),
                crate::batch::MAX_ASSERTION_ID_BYTES
            ),
        )),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(bad(key, format!("query_drift {key} must be a non-empty string"))),
    };
    match (text("fingerprint")?, text("assertion_id")?) {
        (Some(f), _) => match Fingerprint::parse(&f) {
            Some(fp) => Ok((Subject::Fingerprint(fp), window)),
            None => Err(bad(
                "fingerprint",
                format!("query_drift fingerprint {} is not 32 hex digits", crate::text::quote(&f)),
            )),
        },
        (None, Some(id)) => Ok((Subject::AssertionId(id), window)),
        (None, None) => Err(bad(
            "assertion_id",
            "query_drift missing required field: assertion_id (or fingerprint)".into(),
        )),
    }
}

/// A question for the writer thread, answered after every row queued before it.
enum Query {
    /// Most recent scores of a fingerprint, newest first.
    Recent(Fingerprint, u64, SyncSender<rusqlite::Result<Vec<f64>>>),
    Drift(Subject, u64, SyncSender<rusqlite::Result<DriftReport>>),
}

enum Msg {
    Rows(Rows),
    Query(Query),
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
    pub path: PathBuf,
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
    pub fn open(config: &HistoryConfig) -> anyhow::Result<History> {
        if let Some(dir) = config.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let conn = open_connection(&config.path)?;
        let (tx, rx) = channel();
        let shared = Arc::new(Shared::default());
        let mut writer = Writer {
            conn,
            config: config.clone(),
            written_since_prune: 0,
            interned: Interned::default(),
        };
        writer.prune();
        let state = shared.clone();
        let handle = std::thread::Builder::new().name("attest-history".into()).spawn(move || {
            lower_thread_priority();
            writer.run(&rx, &state)
        })?;
        Ok(History {
            tx,
            writer: handle.thread().clone(),
            shared,
            dropped: AtomicU64::new(0),
            path: config.path.clone(),
        })
    }

    /// Queues rows for writing; never blocks. Past [`MAX_QUEUED_ROWS`]
    /// waiting rows, new ones are dropped (and logged).
    pub fn record(&self, rows: Rows) {
        let n = rows.rows.len();
        if n == 0 {
            return;
        }
        let was = self.shared.queued_rows.fetch_add(n, Ordering::AcqRel);
        if was + n > MAX_QUEUED_ROWS {
            self.shared.queued_rows.fetch_sub(n, Ordering::AcqRel);
            let before = self.dropped.fetch_add(n as u64, Ordering::Relaxed);
            if before == 0 || (before + n as u64) / 10_000 > before / 10_000 {
                tracing::warn!(
                    dropped_rows = before + n as u64,
                    "history writer is behind; results were not recorded"
                );
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

    fn ask<T>(&self, query: impl FnOnce(SyncSender<rusqlite::Result<T>>) -> Query) -> anyhow::Result<T> {
        let (reply, answer) = sync_channel(1);
        self.shared.urgent.fetch_add(1, Ordering::AcqRel);
        self.tx
            .send(Msg::Query(query(reply)))
            .map_err(|_| anyhow::anyhow!("history writer has stopped"))?;
        self.writer.unpark();
        Ok(answer.recv().map_err(|_| anyhow::anyhow!("history writer has stopped"))??)
    }

    /// The latest `limit` scores of `fp`, newest first (blocking).
    pub fn recent_scores(&self, fp: Fingerprint, limit: u64) -> anyhow::Result<Vec<f64>> {
        self.ask(|reply| Query::Recent(fp, limit, reply))
    }

    /// Drift statistics over the latest `window` results (blocking).
    pub fn drift(&self, subject: Subject, window: u64) -> anyhow::Result<DriftReport> {
        self.ask(|reply| Query::Drift(subject, window, reply))
    }

    /// Waits until every row queued so far is written (at shutdown).
    pub fn flush(&self) {
        if let Err(e) = self.recent_scores(Fingerprint([0; 16]), 0) {
            tracing::error!(error = %e, "cannot flush result history");
        }
    }

    pub fn dropped_rows(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.shared.urgent.fetch_add(1, Ordering::AcqRel);
        let _ = self.tx.send(Msg::Close);
        self.writer.unpark();
    }
}

/// Current layout of the history file (`PRAGMA user_version`). Version 0
/// (before interning) kept the fingerprint and assertion id in every row.
const SCHEMA_VERSION: i64 = 2;

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = crate::store::open_shared(path)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(conn);
    }
    let tx = conn.transaction()?;
    let old_layout: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('results') WHERE name = 'fingerprint'",
        [],
        |r| r.get(0),
    )?;
    if old_layout {
        tx.execute_batch("ALTER TABLE results RENAME TO results_v0; DROP INDEX IF EXISTS results_by_fingerprint; DROP INDEX IF EXISTS results_by_assertion;")?;
    }
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS fingerprints (
            id INTEGER PRIMARY KEY,
            fingerprint BLOB NOT NULL UNIQUE,
            agent_id TEXT
        );
        -- Each assertion id with the fingerprint of its latest result.
        CREATE TABLE IF NOT EXISTS assertions (
            id INTEGER PRIMARY KEY,
            assertion_id TEXT NOT NULL UNIQUE,
            fingerprint INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS results (
            id INTEGER PRIMARY KEY,
            recorded_at_ms INTEGER NOT NULL,
            fingerprint INTEGER NOT NULL,
            assertion INTEGER NOT NULL,
            assertion_type TEXT NOT NULL,
            status TEXT NOT NULL,
            score REAL NOT NULL,
            trace_id TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS results_by_fingerprint ON results (fingerprint, id);
        CREATE TABLE IF NOT EXISTS result_keys (
            trace_id TEXT NOT NULL,
            assertion_id TEXT NOT NULL,
            recorded_at_ms INTEGER NOT NULL,
            PRIMARY KEY (trace_id, assertion_id)
        ) WITHOUT ROWID;",
    )?;
    if old_layout {
        tx.execute_batch(
            "INSERT OR IGNORE INTO fingerprints (fingerprint, agent_id) SELECT fingerprint, agent_id FROM results_v0 ORDER BY id;
             INSERT OR REPLACE INTO assertions (assertion_id, fingerprint)
                 SELECT r.assertion_id, f.id FROM results_v0 r JOIN fingerprints f ON f.fingerprint = r.fingerprint ORDER BY r.id;
             INSERT INTO results (id, recorded_at_ms, fingerprint, assertion, assertion_type, status, score, trace_id)
                 SELECT r.id, r.recorded_at_ms, f.id, a.id, r.assertion_type, r.status, r.score, r.trace_id
                 FROM results_v0 r JOIN fingerprints f ON f.fingerprint = r.fingerprint
                 JOIN assertions a ON a.assertion_id = r.assertion_id;
             DROP TABLE results_v0;",
        )?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(conn)
}

/// Gives the calling thread the lowest CPU priority: Linux's `SCHED_IDLE`
/// policy, which runs it only when a core would otherwise idle, and yields
/// at once to request handling. Under a burst the queue absorbs the rows;
/// they are written when the burst is over.
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` outlives the call; pid 0 is the calling thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            tracing::debug!("cannot lower the history writer's priority");
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

struct Writer {
    conn: Connection,
    config: HistoryConfig,
    written_since_prune: u64,
    interned: Interned,
}

/// Row ids of fingerprints and assertion ids already in the file, so a
/// result row costs one insert. Bounded: cleared when either map is full
/// (and after pruning, which may delete what they point to).
#[derive(Default)]
struct Interned {
    /// By agent, then spec digest: a fingerprint's hash is computed once.
    fingerprints: HashMap<String, HashMap<SpecDigest, i64>>,
    fingerprint_count: usize,
    assertions: HashMap<String, i64>,
}

/// Entries each interning map may hold (about 100 bytes each).
const MAX_INTERNED: usize = 100_000;
/// Rows per multi-row INSERT: SQLite allows 32,766 parameters, 7 per row.
const ROWS_PER_INSERT: usize = 256;

impl Writer {
    fn run(mut self, rx: &Receiver<Msg>, shared: &Shared) {
        loop {
            std::thread::park_timeout(IDLE_FLUSH);
            if shared.queued_rows.load(Ordering::Acquire) == 0 && shared.urgent.load(Ordering::Acquire) == 0 {
                continue;
            }
            let mut rows = Vec::new();
            let mut closed = false;
            loop {
                match rx.try_recv() {
                    Ok(Msg::Rows(r)) => {
                        shared.queued_rows.fetch_sub(r.rows.len(), Ordering::AcqRel);
                        rows.push(r);
                    }
                    // Queries are answered after the rows queued before them.
                    Ok(Msg::Query(q)) => {
                        shared.urgent.fetch_sub(1, Ordering::AcqRel);
                        self.write(&mut rows);
                        self.answer(q);
                    }
                    Ok(Msg::Close) | Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            self.write(&mut rows);
            if closed {
                return;
            }
        }
    }

    fn answer(&self, q: Query) {
        match q {
            Query::Recent(fp, limit, reply) => {
                let _ = reply.send(self.recent(fp, limit));
            }
            Query::Drift(subject, window, reply) => {
                let _ = reply.send(self.drift(subject, window));
            }
        }
    }

    fn write(&mut self, pending: &mut Vec<Rows>) {
        if pending.is_empty() {
            return;
        }
        let at = now_ms();
        if self.interned.fingerprint_count > MAX_INTERNED || self.interned.assertions.len() > MAX_INTERNED {
            self.interned = Interned::default();
        }
        let interned = &mut self.interned;
        let result = (|| -> rusqlite::Result<u64> {
            let tx = self.conn.transaction()?;
            let mut n = 0;
            {
                let mut key =
                    tx.prepare_cached("INSERT OR IGNORE INTO result_keys (trace_id, assertion_id, recorded_at_ms) VALUES (?1, ?2, ?3)")?;
                // (fingerprint, assertion, row): what the multi-row insert takes.
                let mut ready: Vec<(i64, i64, &Row, &str)> = Vec::with_capacity(ROWS_PER_INSERT);
                // Each assertion id's latest fingerprint, set once per transaction.
                let mut latest: HashMap<i64, i64> = HashMap::new();
                for batch in pending.iter() {
                    for r in &batch.rows {
                        if batch.keyed && key.execute(params![batch.trace_id, r.assertion_id, at])? == 0 {
                            // Already recorded by an earlier delivery of this trace.
                            continue;
                        }
                        let fp = intern_fingerprint(&tx, interned, &r.spec, batch.agent_id.as_deref())?;
                        let assertion = intern_assertion(&tx, interned, &r.assertion_id, fp)?;
                        latest.insert(assertion, fp);
                        ready.push((fp, assertion, r, &batch.trace_id));
                        if ready.len() == ROWS_PER_INSERT {
                            insert_rows(&tx, at, &ready)?;
                            n += ready.len() as u64;
                            ready.clear();
                        }
                    }
                }
                insert_rows(&tx, at, &ready)?;
                n += ready.len() as u64;
                let mut repoint = tx.prepare_cached("UPDATE assertions SET fingerprint = ?2 WHERE id = ?1 AND fingerprint <> ?2")?;
                for (assertion, fp) in latest {
                    repoint.execute(params![assertion, fp])?;
                }
            }
            tx.commit()?;
            Ok(n)
        })();
        pending.clear();
        match result {
            Ok(n) => {
                self.written_since_prune += n;
                if self.written_since_prune >= PRUNE_EVERY_ROWS {
                    self.prune();
                    self.written_since_prune = 0;
                }
            }
            Err(e) => {
                // A rolled-back transaction may have taken interned ids with it.
                self.interned = Interned::default();
                tracing::error!(error = %e, "cannot write result history")
            }
        }
    }

    /// Enforces the age and row-count limits.
    fn prune(&mut self) {
        self.interned = Interned::default();
        let cutoff = now_ms() - self.config.max_age.as_millis() as i64;
        let result = self
            .conn
            .execute("DELETE FROM results WHERE recorded_at_ms < ?1", params![cutoff])
            .and_then(|a| {
                self.conn
                    .execute("DELETE FROM result_keys WHERE recorded_at_ms < ?1", params![cutoff])
                    .map(|_| a)
            })
            .and_then(|a| {
                let b = self.conn.execute(
                    "DELETE FROM results WHERE id <= (SELECT id FROM results ORDER BY id DESC LIMIT 1 OFFSET ?1)",
                    params![self.config.max_rows as i64],
                )?;
                // Interned ids no result row uses any more go too, so the
                // side tables stay as bounded as the results.
                if a + b > 0 {
                    self.conn.execute_batch(
                        "DELETE FROM assertions WHERE id NOT IN (SELECT assertion FROM results);
                         DELETE FROM fingerprints WHERE id NOT IN (SELECT fingerprint FROM results);",
                    )?;
                }
                Ok(a + b)
            });
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "history retention applied"),
            Err(e) => tracing::error!(error = %e, "cannot apply history retention"),
        }
    }

    fn recent(&self, fp: Fingerprint, limit: u64) -> rusqlite::Result<Vec<f64>> {
        let mut q = self.conn.prepare_cached(
            "SELECT r.score FROM results r JOIN fingerprints f ON r.fingerprint = f.id
                 WHERE f.fingerprint = ?1 ORDER BY r.id DESC LIMIT ?2",
        )?;
        let rows = q.query_map(params![&fp.0[..], limit as i64], |r| r.get::<_, f64>(0))?;
        rows.collect()
    }

    fn drift(&self, subject: Subject, window: u64) -> rusqlite::Result<DriftReport> {
        let (assertion_id, fp) = match subject {
            Subject::Fingerprint(fp) => {
                let latest_id: Option<String> = self
                    .conn
                    .prepare_cached(
                        "SELECT a.assertion_id FROM results r JOIN fingerprints f ON r.fingerprint = f.id
                         JOIN assertions a ON a.id = r.assertion WHERE f.fingerprint = ?1 ORDER BY r.id DESC LIMIT 1",
                    )?
                    .query_row(params![&fp.0[..]], |r| r.get(0))
                    .map(Some)
                    .or_else(none_if_no_rows)?;
                (latest_id.unwrap_or_default(), Some(fp))
            }
            Subject::AssertionId(id) => {
                let fp: Option<Vec<u8>> = self
                    .conn
                    .prepare_cached(
                        "SELECT f.fingerprint FROM assertions a JOIN fingerprints f ON f.id = a.fingerprint WHERE a.assertion_id = ?1",
                    )?
                    .query_row(params![id], |r| r.get(0))
                    .map(Some)
                    .or_else(none_if_no_rows)?;
                let fp = fp.and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok()).map(Fingerprint);
                (id, fp)
            }
        };
        let scores = match fp {
            Some(fp) => self.recent(fp, window)?,
            None => Vec::new(),
        };
        Ok(DriftReport::from_window(assertion_id, fp, &scores, window))
    }
}

/// The row id of a fingerprint, inserting it the first time it is seen.
fn intern_fingerprint(tx: &Connection, interned: &mut Interned, spec: &SpecDigest, agent_id: Option<&str>) -> rusqlite::Result<i64> {
    // No agent and an empty agent hash alike (see `Fingerprint::new`).
    let agent = agent_id.unwrap_or_default();
    if let Some(id) = interned.fingerprints.get(agent).and_then(|by_spec| by_spec.get(spec)) {
        return Ok(*id);
    }
    let fp = Fingerprint::new(spec, agent_id);
    tx.prepare_cached("INSERT OR IGNORE INTO fingerprints (fingerprint, agent_id) VALUES (?1, ?2)")?
        .execute(params![&fp.0[..], agent_id])?;
    let id = tx
        .prepare_cached("SELECT id FROM fingerprints WHERE fingerprint = ?1")?
        .query_row(params![&fp.0[..]], |r| r.get(0))?;
    interned.fingerprints.entry(agent.to_owned()).or_default().insert(*spec, id);
    interned.fingerprint_count += 1;
    Ok(id)
}

/// The row id of an assertion id, inserting it (pointing at `fp`) the first
/// time it is seen.
fn intern_assertion(tx: &Connection, interned: &mut Interned, assertion_id: &str, fp: i64) -> rusqlite::Result<i64> {
    if let Some(id) = interned.assertions.get(assertion_id) {
        return Ok(*id);
    }
    tx.prepare_cached("INSERT OR IGNORE INTO assertions (assertion_id, fingerprint) VALUES (?1, ?2)")?
        .execute(params![assertion_id, fp])?;
    let id = tx
        .prepare_cached("SELECT id FROM assertions WHERE assertion_id = ?1")?
        .query_row(params![assertion_id], |r| r.get(0))?;
    interned.assertions.insert(assertion_id.to_owned(), id);
    Ok(id)
}

/// One multi-row INSERT for up to [`ROWS_PER_INSERT`] rows.
fn insert_rows(tx: &Connection, at: i64, rows: &[(i64, i64, &Row, &str)]) -> rusqlite::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let sql = insert_sql(rows.len());
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(rows.len() * 7);
    for (fp, assertion, r, trace_id) in rows {
        values.extend_from_slice(&[&at, fp, assertion, &r.assertion_type, &r.status, &r.score, trace_id]);
    }
    stmt.execute(values.as_slice())?;
    Ok(())
}

/// `INSERT ... VALUES (?,?,?,?,?,?,?),(...)` for `n` rows.
fn insert_sql(n: usize) -> String {
    let mut sql =
        String::from("INSERT INTO results (recorded_at_ms, fingerprint, assertion, assertion_type, status, score, trace_id) VALUES ");
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str("(?,?,?,?,?,?,?)");
    }
    sql
}

fn none_if_no_rows<T>(e: rusqlite::Error) -> rusqlite::Result<Option<T>> {
    match e {
        rusqlite::Error::QueryReturnedNoRows => Ok(None),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(dir: &Path) -> HistoryConfig {
        HistoryConfig {
            path: dir.join("history.sqlite3"),
            max_rows: 1_000,
            max_age: Duration::from_secs(3600),
        }
    }

    fn rows(id: &str, spec: SpecDigest, scores: &[f64]) -> Rows {
        Rows {
            keyed: false,
            trace_id: "t".into(),
            agent_id: None,
            rows: scores
                .iter()
                .map(|&score| Row {
                    assertion_id: id.into(),
                    spec,
                    assertion_type: "content",
                    status: "pass",
                    score,
                })
                .collect(),
        }
    }

    #[test]
    fn fingerprints_ignore_key_order_soft_and_threshold_but_not_agent_or_values() {
        let a = Fingerprint::of(
            "content",
            Some(&json!({"check": "contains", "value": "x", "soft": true})),
            Some("bot"),
        );
        let b = Fingerprint::of(
            "content",
            Some(&json!({"soft": false, "threshold": 0.5, "value": "x", "check": "contains"})),
            Some("bot"),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            Fingerprint::of("content", Some(&json!({"check": "contains", "value": "y"})), Some("bot"))
        );
        assert_ne!(
            a,
            Fingerprint::of("content", Some(&json!({"check": "contains", "value": "x"})), Some("other"))
        );
        assert_ne!(
            a,
            Fingerprint::of("schema", Some(&json!({"check": "contains", "value": "x"})), Some("bot"))
        );
        assert_eq!(Fingerprint::parse(&a.hex()), Some(a));
        assert_eq!(Fingerprint::parse("zz"), None);
    }

    #[test]
    fn dynamic_threshold_uses_the_static_band_until_enough_history() {
        use crate::layers::Status;
        let few = [0.9; 9];
        assert_eq!(dynamic_status(0.85, Some(&few), 10, false).0, Status::Pass);
        assert_eq!(dynamic_status(0.6, Some(&few), 10, false).0, Status::SoftFail);
        let (s, why) = dynamic_status(0.3, Some(&few), 10, false);
        assert_eq!(s, Status::HardFail);
        assert!(why.contains("static band (9 of the 10 earlier scores needed"), "{why}");
        assert!(dynamic_status(0.9, None, 10, false).1.contains("history is off"));
        // Ten scores: mean 0.5, population stddev 0.1 -> floor 0.3.
        let ten = [0.4, 0.6, 0.4, 0.6, 0.4, 0.6, 0.4, 0.6, 0.4, 0.6];
        let (s, why) = dynamic_status(0.31, Some(&ten), 10, false);
        assert_eq!(s, Status::Pass, "0.31 is below the static band but within 2 sigma: {why}");
        assert!(why.contains("= 0.3000 over the last 10 scores"), "{why}");
        assert_eq!(dynamic_status(0.29, Some(&ten), 10, false).0, Status::HardFail);
        assert_eq!(dynamic_status(0.29, Some(&ten), 10, true).0, Status::SoftFail);
    }

    #[test]
    fn drift_statistics_are_over_the_window_newest_first() {
        // Newest first: 0.2 then 0.9 0.9 0.9; mean 0.725, population σ ≈ 0.3031.
        let r = DriftReport::from_window("a".into(), None, &[0.2, 0.9, 0.9, 0.9], 4);
        assert!((r.mean - 0.725).abs() < 1e-12);
        assert!((r.stddev - 0.303_108_891_324_553_7).abs() < 1e-12, "{}", r.stddev);
        assert_eq!((r.count, r.latest_score, r.status), (4, 0.2, DriftStatus::DriftDetected));
        assert!((r.deviation + 0.525).abs() < 1e-12);
        assert_eq!(DriftReport::from_window("a".into(), None, &[1.0, 1.0], 4).status, DriftStatus::Ok);
        assert_eq!(DriftReport::from_window("a".into(), None, &[], 4).status, DriftStatus::NoData);
    }

    #[test]
    fn rows_persist_and_queries_see_queued_rows() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, None);
        {
            let h = History::open(&config(dir.path())).unwrap();
            h.record(rows("run1", spec, &[0.9, 0.8]));
            assert_eq!(h.recent_scores(fp, 10).unwrap(), vec![0.8, 0.9]);
        }
        let h = History::open(&config(dir.path())).unwrap();
        h.record(rows("run2", spec, &[0.1]));
        let r = h.drift(Subject::AssertionId("run1".into()), 2).unwrap();
        assert_eq!(
            (r.count, r.latest_score),
            (2, 0.1),
            "run1 resolves to the fingerprint's latest window"
        );
        let r = h.drift(Subject::Fingerprint(fp), 50).unwrap();
        assert_eq!((r.count, r.assertion_id.as_str()), (3, "run2"));
        let none = h.drift(Subject::AssertionId("never".into()), 50).unwrap();
        assert_eq!(none.status, DriftStatus::NoData);
    }

    #[test]
    fn a_file_in_the_layout_before_interning_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, Some("bot"));
        {
            let conn = Connection::open(&c.path).unwrap();
            conn.execute_batch(
                "CREATE TABLE results (id INTEGER PRIMARY KEY, recorded_at_ms INTEGER NOT NULL, assertion_id TEXT NOT NULL,
                    fingerprint BLOB NOT NULL, assertion_type TEXT NOT NULL, status TEXT NOT NULL, score REAL NOT NULL,
                    trace_id TEXT NOT NULL, agent_id TEXT);
                 CREATE INDEX results_by_fingerprint ON results (fingerprint, id);
                 CREATE INDEX results_by_assertion ON results (assertion_id, id);",
            )
            .unwrap();
            for (i, score) in [0.2, 0.4, 0.6].iter().enumerate() {
                conn.execute(
                    "INSERT INTO results (recorded_at_ms, assertion_id, fingerprint, assertion_type, status, score, trace_id, agent_id)
                     VALUES (?1, ?2, ?3, 'content', 'pass', ?4, 't', 'bot')",
                    params![now_ms(), format!("old{i}"), &fp.0[..], score],
                )
                .unwrap();
            }
        }
        let h = History::open(&c).unwrap();
        assert_eq!(h.recent_scores(fp, 10).unwrap(), vec![0.6, 0.4, 0.2]);
        let r = h.drift(Subject::AssertionId("old0".into()), 50).unwrap();
        assert_eq!((r.count, r.fingerprint.as_deref()), (3, Some(fp.hex().as_str())));
        assert_eq!(h.drift(Subject::Fingerprint(fp), 50).unwrap().assertion_id, "old2");
        // New rows join the migrated history.
        h.record(Rows {
            keyed: false,
            trace_id: "t2".into(),
            agent_id: Some("bot".into()),
            rows: vec![Row {
                assertion_id: "new".into(),
                spec,
                assertion_type: "content",
                status: "pass",
                score: 0.8,
            }],
        });
        assert_eq!(h.recent_scores(fp, 10).unwrap(), vec![0.8, 0.6, 0.4, 0.2]);
    }

    #[test]
    fn interned_ids_point_at_each_assertions_latest_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(&config(dir.path())).unwrap();
        let (a, b) = (SpecDigest::of("content", None), SpecDigest::of("schema", None));
        h.record(rows("same-id", a, &[0.1]));
        h.record(rows("same-id", b, &[0.9]));
        let r = h.drift(Subject::AssertionId("same-id".into()), 50).unwrap();
        assert_eq!(r.fingerprint, Some(Fingerprint::new(&b, None).hex()), "the id's latest spec wins");
        assert_eq!((r.count, r.latest_score), (1, 0.9));
        // Many rows in one write cross the multi-row insert boundary.
        let many: Vec<f64> = (0..(ROWS_PER_INSERT * 2 + 3)).map(|i| i as f64 / 1000.0).collect();
        h.record(rows("bulk", a, &many));
        let recent = h.recent_scores(Fingerprint::new(&a, None), 5).unwrap();
        assert_eq!(recent, many.iter().rev().take(5).copied().collect::<Vec<_>>());
    }

    #[test]
    fn retention_keeps_the_newest_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.max_rows = 3;
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, None);
        {
            let h = History::open(&c).unwrap();
            h.record(rows("a", spec, &[0.1, 0.2, 0.3, 0.4, 0.5]));
            assert_eq!(h.recent_scores(fp, 10).unwrap().len(), 5);
        }
        let h = History::open(&c).unwrap();
        assert_eq!(h.recent_scores(fp, 10).unwrap(), vec![0.5, 0.4, 0.3]);
    }
}
