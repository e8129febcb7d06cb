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
//! Continuous evaluation writes a result per assertion per trace, so the
//! file stores a batch per row (see [`store`]).

mod store;

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
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
    pub status: attest_trace::Status,
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
pub fn dynamic_status(score: f64, history: Option<&[f64]>, min_samples: usize, soft: bool) -> (attest_trace::Status, String) {
    use attest_trace::Status;
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
        let conn = store::open_connection(&config.path)?;
        let (tx, rx) = channel();
        let shared = Arc::new(Shared::default());
        let mut writer = store::Writer::new(conn, config.clone());
        writer.prune();
        let state = shared.clone();
        let handle = std::thread::Builder::new().name("attest-history".into()).spawn(move || {
            store::lower_thread_priority();
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

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        use attest_trace::Status;
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
}
