//! Reading the history file for people: what `attest-engine view` shows.
//!
//! The file is opened read-only and never written. The overview is one
//! pass over the batches (a batch per row keeps a pass short: a million
//! results in eight-member batches are 125,000 rows); the caller keeps the
//! [`Snapshot`] and asks [`Reader::changed`] before making another. Every
//! other page reads a bounded slice: an assertion's newest results, one
//! kept evaluation, two runs.

use super::store::{cost_at, inflate, result_at};
use super::{Detail, DriftReport, DriftStatus, Fingerprint};
use attest_trace::Status;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;

/// Days of pass rate kept per assertion for the overview's small chart.
pub const OVERVIEW_DAYS: usize = 60;
/// Results an assertion's page reads, newest first.
pub const ASSERTION_POINTS: usize = 2_000;
/// Recent failures an assertion's page lists.
pub const ASSERTION_FAILURES: usize = 20;
/// Largest kept trace inflated for a page, in bytes.
pub const MAX_TRACE_BYTES: u64 = 16 << 20;

pub struct Reader {
    conn: Connection,
    data_version: Option<i64>,
}

/// One assertion (a fingerprint: the same check on the same agent) over the
/// whole history.
#[derive(Debug, Clone, Serialize)]
pub struct AssertionSummary {
    /// Row id of the fingerprint: the assertion's address in the viewer.
    pub id: i64,
    pub fingerprint: String,
    /// The assertion id of its latest result (`rule/assertion` for rules).
    pub name: String,
    pub kind: String,
    pub agent: Option<String>,
    pub total: u64,
    pub pass: u64,
    pub soft: u64,
    pub fail: u64,
    pub cost: f64,
    pub latest_status: Status,
    pub latest_score: f64,
    pub latest_ms: i64,
    /// (day since the epoch, passed, results), oldest first, at most
    /// [`OVERVIEW_DAYS`] days.
    pub days: Vec<(i64, u64, u64)>,
    /// Over the newest `window` scores, as `query_drift` reports it.
    pub drift: DriftStatus,
}

impl AssertionSummary {
    pub fn drifting(&self) -> bool {
        self.drift == DriftStatus::DriftDetected
    }

    pub fn pass_rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.pass as f64 / self.total as f64
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub id: i64,
    pub key: String,
    pub kind: String,
    pub label: String,
    pub started_ms: i64,
    pub last_ms: i64,
    pub pass: u64,
    pub soft: u64,
    pub fail: u64,
    pub cost: f64,
}

/// The whole history, summed.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Snapshot {
    pub assertions: Vec<AssertionSummary>,
    /// Newest first.
    pub runs: Vec<RunSummary>,
    pub results: u64,
    pub batches: u64,
    pub kept: u64,
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
}

/// One stored result of an assertion.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub batch: i64,
    pub at_ms: i64,
    pub status: Status,
    pub score: f64,
    pub run: Option<i64>,
    pub trace_id: String,
}

/// A kept evaluation, as an assertion's page lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// The kept evaluation's id: its address in the viewer.
    pub kept: i64,
    pub at_ms: i64,
    pub trace_id: String,
    pub status: Status,
    pub score: f64,
    pub detail: Detail,
}

/// An assertion's page.
#[derive(Debug, Clone, Serialize)]
pub struct AssertionPage {
    pub summary: Option<AssertionSummary>,
    /// Newest first, at most [`ASSERTION_POINTS`].
    pub points: Vec<Point>,
    pub failures: Vec<Failure>,
    pub drift: DriftReport,
}

/// One member of a kept evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    pub assertion: i64,
    pub name: String,
    pub kind: String,
    pub status: Status,
    pub score: f64,
    pub cost: f64,
    pub detail: Option<Detail>,
}

/// A kept evaluation: every result on one trace, and the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub kept: i64,
    pub batch: i64,
    pub at_ms: i64,
    pub trace_id: String,
    pub run: Option<i64>,
    pub members: Vec<Member>,
    /// The trace's JSON text, when it was kept.
    pub trace: Option<String>,
}

/// How one assertion did in one run.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct InRun {
    pub results: u64,
    pub non_passing: u64,
    pub score_sum: f64,
    pub latest_status: Option<Status>,
    /// The newest kept evaluation of a non-passing result, if any.
    pub kept: Option<i64>,
}

impl InRun {
    pub fn mean(&self) -> f64 {
        if self.results == 0 {
            0.0
        } else {
            self.score_sum / self.results as f64
        }
    }
}

/// Two runs side by side, per assertion.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// (assertion id, in run a, in run b).
    pub rows: Vec<(i64, Option<InRun>, Option<InRun>)>,
}

#[derive(Clone)]
struct FingerprintRow {
    hex: String,
    agent: Option<String>,
    kind: String,
}

/// A kept evaluation's details, as [`super::store`] wrote them (empty if
/// they cannot be read).
fn details_of(deflated: &[u8]) -> Vec<Detail> {
    inflate(deflated, MAX_TRACE_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

const DAY_MS: i64 = 86_400_000;

impl Reader {
    /// Opens the history file read-only.
    pub fn open(path: &Path) -> anyhow::Result<Reader> {
        if !path.is_file() {
            anyhow::bail!(
                "{} is not a history file: pass --history with the file the engine writes (history_path in attest.toml, default ~/.attest/cache/history.sqlite3)",
                path.display()
            );
        }
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version != super::store::SCHEMA_VERSION {
            anyhow::bail!(
                "{} is in history layout {version}, and this viewer reads layout {}: run any attest-engine command with this history once (it upgrades the file), then open it again",
                path.display(),
                super::store::SCHEMA_VERSION
            );
        }
        Ok(Reader { conn, data_version: None })
    }

    /// Whether another process committed to the file since the last call
    /// (always true the first time).
    pub fn changed(&mut self) -> anyhow::Result<bool> {
        let now: i64 = self.conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        Ok(self.data_version.replace(now) != Some(now))
    }

    fn fingerprints(&self) -> rusqlite::Result<HashMap<i64, FingerprintRow>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, fingerprint, agent_id, COALESCE(assertion_type, '') FROM fingerprints")?;
        let rows = stmt.query_map([], |r| {
            let fp: Vec<u8> = r.get(1)?;
            Ok((
                r.get::<_, i64>(0)?,
                FingerprintRow {
                    hex: <[u8; 16]>::try_from(fp.as_slice())
                        .map(|f| Fingerprint(f).hex())
                        .unwrap_or_default(),
                    agent: r.get(2)?,
                    kind: r.get(3)?,
                },
            ))
        })?;
        rows.collect()
    }

    fn names(&self) -> rusqlite::Result<HashMap<i64, String>> {
        let mut stmt = self.conn.prepare("SELECT id, assertion_id FROM assertions")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    }

    fn suites(&self) -> rusqlite::Result<HashMap<i64, Vec<(i64, i64)>>> {
        let mut stmt = self.conn.prepare("SELECT id, members FROM suites")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, super::store::unpack_members(&r.get::<_, Vec<u8>>(1)?))))?;
        rows.collect()
    }

    fn name_of(&self, assertion: i64) -> rusqlite::Result<String> {
        Ok(self
            .conn
            .prepare_cached("SELECT assertion_id FROM assertions WHERE id = ?1")?
            .query_row(params![assertion], |r| r.get(0))
            .optional()?
            .unwrap_or_default())
    }

    /// The assertion type of a fingerprint.
    fn kind_of(&self, fp: i64) -> rusqlite::Result<String> {
        Ok(self
            .conn
            .prepare_cached("SELECT COALESCE(assertion_type, '') FROM fingerprints WHERE id = ?1")?
            .query_row(params![fp], |r| r.get(0))
            .optional()?
            .unwrap_or_default())
    }

    /// A run's kind and label.
    pub fn run(&self, id: i64) -> anyhow::Result<Option<(String, String)>> {
        Ok(self
            .conn
            .prepare_cached("SELECT kind, label FROM runs WHERE id = ?1")?
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// Sums the whole history; `window` scores per assertion decide its drift.
    pub fn snapshot(&self, window: usize) -> anyhow::Result<Snapshot> {
        let tx = self.conn.unchecked_transaction()?;
        let fingerprints = self.fingerprints()?;
        let names = self.names()?;
        let suites = self.suites()?;
        struct Acc {
            s: AssertionSummary,
            days: BTreeMap<i64, (u64, u64)>,
            recent: VecDeque<f64>,
            latest_batch: i64,
        }
        let mut acc: HashMap<i64, Acc> = HashMap::new();
        let mut runs: HashMap<i64, RunSummary> = HashMap::new();
        {
            let mut stmt = self.conn.prepare("SELECT id, run_key, kind, label, started_at_ms FROM runs")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let id: i64 = r.get(0)?;
                let started: i64 = r.get(4)?;
                runs.insert(
                    id,
                    RunSummary {
                        id,
                        key: r.get(1)?,
                        kind: r.get(2)?,
                        label: r.get(3)?,
                        started_ms: started,
                        last_ms: started,
                        pass: 0,
                        soft: 0,
                        fail: 0,
                        cost: 0.0,
                    },
                );
            }
        }
        let mut snap = Snapshot::default();
        let mut stmt = self
            .conn
            .prepare("SELECT id, recorded_at_ms, suite, run, results, costs FROM batches ORDER BY id")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let batch: i64 = r.get(0)?;
            let at: i64 = r.get(1)?;
            let Some(members) = suites.get(&r.get::<_, i64>(2)?) else {
                continue;
            };
            let run: Option<i64> = r.get(3)?;
            let results = r.get_ref(4)?.as_blob()?;
            let costs = r.get_ref(5)?.as_blob_or_null()?;
            snap.batches += 1;
            snap.first_ms.get_or_insert(at);
            snap.last_ms = Some(at);
            let mut run = run.and_then(|id| runs.get_mut(&id));
            for (pos, &(fp, assertion)) in members.iter().enumerate() {
                let Some((status, score)) = result_at(results, pos) else { break };
                let cost = cost_at(costs, pos);
                snap.results += 1;
                let a = acc.entry(fp).or_insert_with(|| {
                    let f = fingerprints.get(&fp);
                    Acc {
                        s: AssertionSummary {
                            id: fp,
                            fingerprint: f.map(|f| f.hex.clone()).unwrap_or_default(),
                            name: String::new(),
                            kind: f.map(|f| f.kind.clone()).unwrap_or_default(),
                            agent: f.and_then(|f| f.agent.clone()),
                            total: 0,
                            pass: 0,
                            soft: 0,
                            fail: 0,
                            cost: 0.0,
                            latest_status: status,
                            latest_score: score,
                            latest_ms: at,
                            days: Vec::new(),
                            drift: DriftStatus::NoData,
                        },
                        days: BTreeMap::new(),
                        recent: VecDeque::with_capacity(window.min(1024)),
                        latest_batch: -1,
                    }
                });
                a.s.total += 1;
                a.s.cost += cost;
                match status {
                    Status::Pass => a.s.pass += 1,
                    Status::SoftFail => a.s.soft += 1,
                    Status::HardFail => a.s.fail += 1,
                }
                if batch >= a.latest_batch {
                    a.latest_batch = batch;
                    a.s.latest_status = status;
                    a.s.latest_score = score;
                    a.s.latest_ms = at;
                    if let Some(name) = names.get(&assertion) {
                        if *name != a.s.name {
                            a.s.name.clone_from(name);
                        }
                    }
                }
                let day = a.days.entry(at.div_euclid(DAY_MS)).or_default();
                day.0 += u64::from(status == Status::Pass);
                day.1 += 1;
                if a.days.len() > OVERVIEW_DAYS {
                    a.days.pop_first();
                }
                if window > 0 {
                    if a.recent.len() == window {
                        a.recent.pop_front();
                    }
                    a.recent.push_back(score);
                }
                if let Some(run) = run.as_deref_mut() {
                    run.last_ms = run.last_ms.max(at);
                    run.cost += cost;
                    match status {
                        Status::Pass => run.pass += 1,
                        Status::SoftFail => run.soft += 1,
                        Status::HardFail => run.fail += 1,
                    }
                }
            }
        }
        drop(rows);
        drop(stmt);
        snap.kept = self.conn.query_row("SELECT COUNT(*) FROM kept", [], |r| r.get::<_, i64>(0))? as u64;
        tx.finish()?;
        snap.assertions = acc
            .into_values()
            .map(|mut a| {
                let newest_first: Vec<f64> = a.recent.iter().rev().copied().collect();
                a.s.drift = DriftReport::from_window(String::new(), None, &newest_first, window as u64).status;
                a.s.days = a.days.into_iter().map(|(d, (p, t))| (d, p, t)).collect();
                a.s
            })
            .collect();
        snap.assertions.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        snap.runs = runs.into_values().collect();
        snap.runs.sort_by(|a, b| b.started_ms.cmp(&a.started_ms).then(b.id.cmp(&a.id)));
        Ok(snap)
    }

    /// Where an assertion sits: (suite, position), by suite.
    fn placements(&self, fp: i64) -> rusqlite::Result<Vec<(i64, usize)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT suite, pos FROM suite_members WHERE fingerprint = ?1 ORDER BY suite, pos")?;
        let rows = stmt.query_map(params![fp], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize)))?;
        rows.collect()
    }

    /// An assertion's newest results, its recent failures with their
    /// explanations, and its drift over the newest `window` scores.
    pub fn assertion(&self, fp: i64, summary: Option<AssertionSummary>, window: usize) -> anyhow::Result<AssertionPage> {
        let tx = self.conn.unchecked_transaction()?;
        let placements = self.placements(fp)?;
        let mut points: Vec<Point> = Vec::new();
        {
            let mut batches = self.conn.prepare_cached(
                "SELECT id, recorded_at_ms, run, results, trace_id FROM batches WHERE suite = ?1 ORDER BY id DESC LIMIT ?2",
            )?;
            for group in placements.chunk_by(|a, b| a.0 == b.0) {
                let mut rows = batches.query(params![group[0].0, ASSERTION_POINTS as i64])?;
                while let Some(r) = rows.next()? {
                    let results = r.get_ref(3)?.as_blob()?;
                    for &(_, pos) in group {
                        if let Some((status, score)) = result_at(results, pos) {
                            points.push(Point {
                                batch: r.get(0)?,
                                at_ms: r.get(1)?,
                                run: r.get(2)?,
                                status,
                                score,
                                trace_id: r.get(4)?,
                            });
                        }
                    }
                }
                points.sort_unstable_by_key(|p| std::cmp::Reverse(p.batch));
                points.truncate(ASSERTION_POINTS);
            }
        }
        // Kept evaluations in which this assertion did not pass, newest first.
        let mut failures = Vec::new();
        {
            let positions: HashMap<i64, Vec<usize>> = placements.iter().fold(HashMap::new(), |mut m, &(s, p)| {
                m.entry(s).or_default().push(p);
                m
            });
            let mut stmt = self.conn.prepare_cached(
                // From the kept evaluations, newest first (CROSS JOIN keeps
                // SQLite from walking the assertion's every batch instead).
                "SELECT k.id, b.recorded_at_ms, b.trace_id, b.suite, b.results, k.details FROM kept k CROSS JOIN batches b ON b.id = k.batch
                 WHERE b.suite IN (SELECT suite FROM suite_members WHERE fingerprint = ?1) ORDER BY k.id DESC LIMIT 500",
            )?;
            let mut rows = stmt.query(params![fp])?;
            while let Some(r) = rows.next()? {
                if failures.len() >= ASSERTION_FAILURES {
                    break;
                }
                let results = r.get_ref(4)?.as_blob()?;
                let details = details_of(r.get_ref(5)?.as_blob()?);
                for &pos in positions.get(&r.get::<_, i64>(3)?).into_iter().flatten() {
                    if let Some((status, score)) = result_at(results, pos).filter(|(s, _)| *s != Status::Pass) {
                        failures.push(Failure {
                            kept: r.get(0)?,
                            at_ms: r.get(1)?,
                            trace_id: r.get(2)?,
                            status,
                            score,
                            detail: details.get(pos).cloned().unwrap_or_default(),
                        });
                    }
                }
            }
        }
        tx.finish()?;
        let newest: Vec<f64> = points.iter().take(window).map(|p| p.score).collect();
        let name = summary.as_ref().map(|s| s.name.clone()).unwrap_or_default();
        let drift = DriftReport::from_window(name, None, &newest, window as u64);
        Ok(AssertionPage {
            summary,
            points,
            failures,
            drift,
        })
    }

    /// A kept evaluation, with its trace inflated up to [`MAX_TRACE_BYTES`].
    pub fn evaluation(&self, kept: i64) -> anyhow::Result<Option<Evaluation>> {
        let tx = self.conn.unchecked_transaction()?;
        let row = self
            .conn
            .query_row(
                "SELECT k.batch, b.recorded_at_ms, b.trace_id, b.run, b.results, b.costs, s.members, k.details, k.trace
                 FROM kept k JOIN batches b ON b.id = k.batch JOIN suites s ON s.id = b.suite WHERE k.id = ?1",
                params![kept],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, Option<i64>>(3)?,
                        r.get::<_, Vec<u8>>(4)?,
                        r.get::<_, Option<Vec<u8>>>(5)?,
                        r.get::<_, Vec<u8>>(6)?,
                        r.get::<_, Vec<u8>>(7)?,
                        r.get::<_, Option<Vec<u8>>>(8)?,
                    ))
                },
            )
            .optional()?;
        let Some((batch, at_ms, trace_id, run, results, costs, members, details, trace)) = row else {
            return Ok(None);
        };
        let details = details_of(&details);
        let mut out = Vec::new();
        for (pos, (fp, assertion)) in super::store::unpack_members(&members).into_iter().enumerate() {
            let Some((status, score)) = result_at(&results, pos) else { break };
            out.push(Member {
                assertion: fp,
                name: self.name_of(assertion)?,
                kind: self.kind_of(fp)?,
                status,
                score,
                cost: cost_at(costs.as_deref(), pos),
                detail: details.get(pos).cloned(),
            });
        }
        let trace = trace
            .and_then(|t| inflate(&t, MAX_TRACE_BYTES).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        tx.finish()?;
        Ok(Some(Evaluation {
            kept,
            batch,
            at_ms,
            trace_id,
            run,
            members: out,
            trace,
        }))
    }

    /// Every assertion's results in runs `a` and `b`.
    pub fn compare(&self, a: i64, b: i64) -> anyhow::Result<Comparison> {
        let tx = self.conn.unchecked_transaction()?;
        let suites = self.suites()?;
        // Kept evaluations are bounded (10,000 by default): looked up in
        // memory rather than once per batch.
        let kept_of: HashMap<i64, i64> = {
            let mut stmt = self.conn.prepare("SELECT batch, MAX(id) FROM kept GROUP BY batch")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut by: BTreeMap<i64, (Option<InRun>, Option<InRun>)> = BTreeMap::new();
        let mut stmt = self
            .conn
            .prepare("SELECT b.id, b.run, b.suite, b.results FROM batches b WHERE b.run IN (?1, ?2) ORDER BY b.id")?;
        let mut rows = stmt.query(params![a, b])?;
        while let Some(r) = rows.next()? {
            let kept = kept_of.get(&r.get::<_, i64>(0)?).copied();
            let run: i64 = r.get(1)?;
            let Some(members) = suites.get(&r.get::<_, i64>(2)?) else {
                continue;
            };
            let results = r.get_ref(3)?.as_blob()?;
            for (pos, &(fp, _)) in members.iter().enumerate() {
                let Some((status, score)) = result_at(results, pos) else { break };
                let sides = by.entry(fp).or_default();
                let side = if run == a { &mut sides.0 } else { &mut sides.1 };
                let s = side.get_or_insert_with(InRun::default);
                s.results += 1;
                s.score_sum += score;
                s.latest_status = Some(status);
                if status != Status::Pass {
                    s.non_passing += 1;
                    if kept.is_some() {
                        s.kept = kept;
                    }
                }
            }
        }
        drop(rows);
        drop(stmt);
        tx.finish()?;
        Ok(Comparison {
            rows: by.into_iter().map(|(fp, (x, y))| (fp, x, y)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    fn history(dir: &Path, kept: u64) -> History {
        History::open(&HistoryConfig {
            location: Location::File(dir.join("h.sqlite3")),
            max_rows: 1_000_000,
            max_age: Duration::from_secs(3600),
            max_bytes: 1 << 30,
            wait_when_behind: true,
            kept_evaluations: kept,
            kept_bytes: DEFAULT_KEPT_BYTES,
        })
        .unwrap()
    }

    fn batch(run: &Arc<Run>, trace: &str, scores: &[(&str, f64)]) -> Rows {
        let rows: Vec<Row> = scores
            .iter()
            .map(|&(id, score)| Row {
                assertion_id: id.into(),
                spec: SpecDigest::submitted(id),
                assertion_type: "content",
                status: if score >= 0.5 { Status::Pass } else { Status::HardFail },
                score,
                cost: 0.25,
            })
            .collect();
        let failing = rows.iter().any(|r| r.status != Status::Pass);
        Rows {
            trace_id: trace.into(),
            agent_id: Some("bot".into()),
            keyed: false,
            run: Some(run.clone()),
            kept: failing.then(|| {
                Box::new(Kept {
                    trace: Some(format!(r#"{{"trace_id":"{trace}","output":{{"message":"<script>x</script>"}}}}"#)),
                    details: rows
                        .iter()
                        .map(|r| Detail {
                            explanation: format!("{} scored {}", r.assertion_id, r.score),
                            hint: Some("do better".into()),
                            ..Detail::default()
                        })
                        .collect(),
                })
            }),
            rows,
            recorded_at_ms: None,
        }
    }

    fn run(key: &str) -> Arc<Run> {
        Arc::new(Run {
            key: key.into(),
            kind: RunKind::Session,
            label: format!("label {key}"),
        })
    }

    #[test]
    fn the_reader_sees_runs_kept_evaluations_and_comparisons_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let h = history(dir.path(), 3);
        let (a, b) = (run("a"), run("b"));
        h.record(batch(&a, "t1", &[("tone", 1.0), ("refund", 1.0)]));
        h.record(batch(&a, "t2", &[("tone", 1.0), ("refund", 0.0)]));
        h.record(batch(&b, "t3", &[("tone", 0.0), ("refund", 1.0)]));
        h.record(batch(&b, "t4", &[("tone", 0.2), ("refund", 1.0)]));
        h.record(batch(&b, "t5", &[("tone", 0.1), ("refund", 1.0)]));
        h.flush(Instant::now() + Duration::from_secs(10));

        let mut r = Reader::open(&dir.path().join("h.sqlite3")).unwrap();
        assert!(r.changed().unwrap());
        assert!(!r.changed().unwrap());
        let snap = r.snapshot(50).unwrap();
        assert_eq!((snap.results, snap.batches), (10, 5));
        // Four evaluations failed and three are kept: the oldest went.
        assert_eq!(snap.kept, 3);
        let tone = snap.assertions.iter().find(|s| s.name == "tone").unwrap();
        assert_eq!((tone.total, tone.pass, tone.fail), (5, 2, 3));
        assert!((tone.cost - 1.25).abs() < 1e-9);
        assert_eq!(tone.latest_status, Status::HardFail);
        assert_eq!(tone.days.iter().map(|d| d.2).sum::<u64>(), 5);
        assert_eq!(snap.runs.len(), 2);
        let run_b = snap.runs.iter().find(|r| r.key == "b").unwrap();
        assert_eq!((run_b.pass, run_b.fail, run_b.label.as_str()), (3, 3, "label b"));

        let page = r.assertion(tone.id, Some(tone.clone()), 50).unwrap();
        assert_eq!(page.points.len(), 5);
        assert_eq!(page.points[0].trace_id, "t5");
        assert_eq!(page.failures.len(), 3);
        assert_eq!(page.failures[0].detail.explanation, "tone scored 0.1");

        let e = r.evaluation(page.failures[0].kept).unwrap().unwrap();
        assert_eq!(e.trace_id, "t5");
        assert_eq!(e.members.len(), 2);
        assert_eq!(e.members[1].detail.as_ref().unwrap().hint.as_deref(), Some("do better"));
        assert!(e.trace.unwrap().contains("<script>x</script>"));

        let run_a = snap.runs.iter().find(|r| r.key == "a").unwrap();
        let cmp = r.compare(run_a.id, run_b.id).unwrap();
        let (_, in_a, in_b) = cmp.rows.iter().find(|(fp, _, _)| *fp == tone.id).unwrap();
        assert_eq!(in_a.unwrap().non_passing, 0);
        assert_eq!(in_b.unwrap().non_passing, 3);
        assert!(in_b.unwrap().kept.is_some());
        assert!(r.changed().is_ok());
    }

    #[test]
    fn kept_evaluations_can_be_switched_off() {
        let dir = tempfile::tempdir().unwrap();
        let h = history(dir.path(), 0);
        h.record(batch(&run("a"), "t1", &[("tone", 0.0)]));
        h.flush(Instant::now() + Duration::from_secs(10));
        let r = Reader::open(&dir.path().join("h.sqlite3")).unwrap();
        let snap = r.snapshot(50).unwrap();
        assert_eq!((snap.results, snap.kept), (1, 0));
    }
}
