//! The history file: its SQLite layout, the migrations from earlier layouts,
//! and the writer thread that owns the connection.
//!
//! A test run sends the same few assertions with every trace, and continuous
//! evaluation scores every trace with the same rules, so results are stored
//! a **batch per row**:
//!
//! - `fingerprints` and `assertions` intern the 16-byte fingerprints and the
//!   assertion id strings (each assertion id points at the fingerprint of
//!   its latest result);
//! - `suites` interns a batch's ordered list of (fingerprint, assertion)
//!   members, and `suite_members` indexes it by fingerprint, so the results
//!   of one fingerprint are found through the few suites it belongs to;
//! - `batches` holds one row per batch: its time, suite, trace id, result
//!   count and the packed results ([`RESULT_BYTES`] bytes per member, in
//!   member order: a status byte, then the score as a little-endian `f64`).
//!
//! A batch of eight results is one row and one index entry instead of eight
//! of each, which is what keeps recording every result close to free.

use super::{now_ms, DriftReport, Fingerprint, HistoryConfig, Query, Row, Rows, SpecDigest, Subject};
use attest_trace::Status;
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::collections::HashMap;
use std::path::Path;

/// Current layout of the history file (`PRAGMA user_version`). Version 0 kept
/// a row per result with its fingerprint and assertion id inline; version 2
/// a row per result with both interned.
/// Version 3 had no runs, costs or kept evaluations.
pub(super) const SCHEMA_VERSION: i64 = 4;

/// Bytes of one packed result: a status byte and a little-endian `f64` score.
pub(super) const RESULT_BYTES: usize = 9;

/// The tables of the current layout.
const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS fingerprints (
        id INTEGER PRIMARY KEY,
        fingerprint BLOB NOT NULL UNIQUE,
        agent_id TEXT,
        assertion_type TEXT
    );
    -- Each assertion id with the fingerprint of its latest result.
    CREATE TABLE IF NOT EXISTS assertions (
        id INTEGER PRIMARY KEY,
        assertion_id TEXT NOT NULL UNIQUE,
        fingerprint INTEGER NOT NULL
    );
    -- A batch's members in order: (fingerprint id, assertion id) as two
    -- little-endian i64 each.
    CREATE TABLE IF NOT EXISTS suites (
        id INTEGER PRIMARY KEY,
        members BLOB NOT NULL UNIQUE
    );
    CREATE TABLE IF NOT EXISTS suite_members (
        fingerprint INTEGER NOT NULL,
        suite INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        assertion INTEGER NOT NULL,
        PRIMARY KEY (fingerprint, suite, pos)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS batches (
        id INTEGER PRIMARY KEY,
        recorded_at_ms INTEGER NOT NULL,
        suite INTEGER NOT NULL,
        trace_id TEXT NOT NULL,
        size INTEGER NOT NULL,
        results BLOB NOT NULL,
        -- The run it belongs to (`runs`), if the front door said.
        run INTEGER,
        -- Each member's cost as a little-endian f64, when any cost anything.
        costs BLOB
    );
    CREATE INDEX IF NOT EXISTS batches_by_suite ON batches (suite, id);
    CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY,
        run_key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        label TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL
    );
    -- Non-passing evaluations with what explains them: the members'
    -- details (JSON) and the trace (JSON text), each deflated.
    CREATE TABLE IF NOT EXISTS kept (
        id INTEGER PRIMARY KEY,
        batch INTEGER NOT NULL,
        details BLOB NOT NULL,
        trace BLOB,
        bytes INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS kept_by_batch ON kept (batch);
    -- Keyed results (continuous evaluation) already recorded.
    CREATE TABLE IF NOT EXISTS result_keys (
        trace_id TEXT NOT NULL,
        assertion_id TEXT NOT NULL,
        recorded_at_ms INTEGER NOT NULL,
        PRIMARY KEY (trace_id, assertion_id)
    ) WITHOUT ROWID;";

/// Opens the file, creating or migrating its tables.
pub(super) fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    // Engines started together race to create the file. SQLite answers some
    // of those races (switching a new file to WAL, say) with "database is
    // locked" at once, without waiting on the busy timeout: they are tried
    // again for as long as that timeout would have waited.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open_connection_once(path) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn open_connection_once(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = attest_store::open_shared(path)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(conn);
    }
    // Engines started together may all find a new file. The write lock is
    // taken up front, waiting on the busy timeout: a deferred transaction
    // that read first fails at once ("database is locked") when it tries to
    // write after another engine did. Whoever comes second finds the layout
    // made.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        tx.commit()?;
        return Ok(conn);
    }
    if version == 3 {
        // Version 3 is version 4 without runs, costs and kept evaluations.
        tx.execute_batch("ALTER TABLE batches ADD COLUMN run INTEGER; ALTER TABLE batches ADD COLUMN costs BLOB;")?;
    }
    let has_column = |column: &str| -> rusqlite::Result<bool> {
        tx.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('results') WHERE name = ?1",
            params![column],
            |r| r.get(0),
        )
    };
    // Earlier layouts kept a row per result in `results`; the same rows,
    // oldest first, as (time, fingerprint, agent, assertion id, type,
    // status, score, trace id).
    let legacy = if has_column("assertion")? {
        // Version 2 had `fingerprints` without a type column: renamed out of
        // the way so the current one can be created.
        tx.execute_batch(
            "ALTER TABLE results RENAME TO results_old;
             ALTER TABLE fingerprints RENAME TO fingerprints_old;
             ALTER TABLE assertions RENAME TO assertions_old;
             DROP INDEX IF EXISTS results_by_fingerprint;",
        )?;
        Some(
            "SELECT r.recorded_at_ms, f.fingerprint, f.agent_id, a.assertion_id, r.assertion_type, r.status, r.score, r.trace_id
             FROM results_old r JOIN fingerprints_old f ON f.id = r.fingerprint JOIN assertions_old a ON a.id = r.assertion
             ORDER BY r.id",
        )
    } else if has_column("fingerprint")? {
        tx.execute_batch(
            "ALTER TABLE results RENAME TO results_old;
             DROP INDEX IF EXISTS results_by_fingerprint;
             DROP INDEX IF EXISTS results_by_assertion;",
        )?;
        Some(
            "SELECT recorded_at_ms, fingerprint, agent_id, assertion_id, assertion_type, status, score, trace_id
             FROM results_old ORDER BY id",
        )
    } else {
        None
    };
    tx.execute_batch(TABLES)?;
    if let Some(select) = legacy {
        migrate(&tx, select)?;
        tx.execute_batch("DROP TABLE results_old; DROP TABLE IF EXISTS fingerprints_old; DROP TABLE IF EXISTS assertions_old;")?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(conn)
}

/// Copies a row-per-result history into the current layout, a one-result
/// batch per old row, keeping each row's time and order.
fn migrate(tx: &Transaction, select: &str) -> rusqlite::Result<()> {
    let mut interned = Interned::default();
    let mut old = tx.prepare(select)?;
    let mut rows = old.query([])?;
    let mut latest = HashMap::new();
    while let Some(r) = rows.next()? {
        let fp_bytes: Vec<u8> = r.get(1)?;
        let Ok(fp) = <[u8; 16]>::try_from(fp_bytes.as_slice()) else {
            continue;
        };
        let agent: Option<String> = r.get(2)?;
        let assertion_id: String = r.get(3)?;
        let kind: String = r.get(4)?;
        let status: String = r.get(5)?;
        let fp = insert_fingerprint(tx, &Fingerprint(fp), agent.as_deref(), &kind)?;
        let assertion = intern_assertion(tx, &mut interned, &assertion_id, fp)?;
        latest.insert(assertion, fp);
        let suite = intern_suite(tx, &mut interned, &[(fp, assertion)])?;
        let mut packed = Vec::with_capacity(RESULT_BYTES);
        // Earlier layouts stored statuses as text; anything unknown counts as a failure.
        pack_result(&mut packed, Status::parse(&status).unwrap_or(Status::HardFail), r.get(6)?);
        tx.prepare_cached("INSERT INTO batches (recorded_at_ms, suite, trace_id, size, results) VALUES (?1, ?2, ?3, 1, ?4)")?
            .execute(params![r.get::<_, i64>(0)?, suite, r.get::<_, String>(7)?, packed])?;
    }
    repoint_assertions(tx, latest)
}

fn status_code(status: Status) -> u8 {
    match status {
        Status::Pass => 0,
        Status::SoftFail => 1,
        Status::HardFail => 2,
    }
}

fn status_of(code: u8) -> Status {
    match code {
        0 => Status::Pass,
        1 => Status::SoftFail,
        _ => Status::HardFail,
    }
}

fn pack_result(out: &mut Vec<u8>, status: Status, score: f64) {
    out.push(status_code(status));
    out.extend_from_slice(&score.to_le_bytes());
}

/// The (status, score) of the result at `pos` in a packed batch.
pub(super) fn result_at(results: &[u8], pos: usize) -> Option<(Status, f64)> {
    let start = pos.checked_mul(RESULT_BYTES)?;
    let bytes = results.get(start..start.checked_add(RESULT_BYTES)?)?;
    Some((status_of(bytes[0]), f64::from_le_bytes(bytes[1..].try_into().ok()?)))
}

/// The score of the result at `pos` in a packed batch.
fn score_at(results: &[u8], pos: usize) -> Option<f64> {
    result_at(results, pos).map(|(_, score)| score)
}

/// The cost of the result at `pos`, from a batch's `costs` (absent: nothing
/// in the batch cost anything).
pub(super) fn cost_at(costs: Option<&[u8]>, pos: usize) -> f64 {
    costs
        .and_then(|c| c.get(pos.checked_mul(8)?..pos.checked_mul(8)?.checked_add(8)?))
        .and_then(|b| b.try_into().ok())
        .map_or(0.0, f64::from_le_bytes)
}

/// Gives the calling thread the lowest CPU priority: Linux's `SCHED_IDLE`
/// policy, which runs it only when a core would otherwise idle, and yields
/// at once to request handling. Under a burst the queue absorbs the rows;
/// they are written when the burst is over.
pub(super) fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` outlives the call; pid 0 is the calling thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            tracing::debug!("cannot lower the history writer's priority");
        }
    }
}

/// Bytes of the store's pages in use (free pages, which SQLite reuses
/// rather than returning, not counted): what `max_bytes` bounds.
fn bytes_in_use(conn: &Connection) -> rusqlite::Result<u64> {
    let pages: i64 = conn.query_row(
        "SELECT (SELECT page_count FROM pragma_page_count()) - (SELECT freelist_count FROM pragma_freelist_count())",
        [],
        |r| r.get(0),
    )?;
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(pages.max(0) as u64 * page_size.max(0) as u64)
}

/// Entries each interning map may hold (about 100 bytes each, plus a
/// suite's members).
const MAX_INTERNED: usize = 100_000;
/// Bytes of suite members the interning map may hold.
const MAX_INTERNED_SUITE_BYTES: usize = 16 << 20;
/// Bytes of agent and assertion ids the interning maps may hold as keys.
const MAX_INTERNED_KEY_BYTES: usize = 16 << 20;
/// Batches per multi-row INSERT (7 parameters each; SQLite allows 32,766).
const BATCHES_PER_INSERT: usize = 256;

/// Row ids of fingerprints, assertion ids and suites already in the file,
/// so a batch usually costs one insert. Bounded by entries and bytes:
/// cleared when full (and after pruning, which may delete what they point to).
#[derive(Default)]
struct Interned {
    /// By agent, then spec digest: a fingerprint's hash is computed once.
    fingerprints: HashMap<String, HashMap<SpecDigest, i64>>,
    fingerprint_count: usize,
    assertions: HashMap<String, i64>,
    suites: HashMap<Vec<u8>, i64>,
    suite_bytes: usize,
    /// Bytes of the agent ids and assertion ids held as keys.
    key_bytes: usize,
    last: Option<LastSuite>,
    runs: HashMap<String, i64>,
}

/// The last unkeyed batch's assertions and their suite. A test suite or a
/// rules file sends the same assertions with trace after trace, so the next
/// batch's suite is usually found by comparing a few strings instead of
/// hashing every member.
struct LastSuite {
    agent_id: Option<String>,
    members: Vec<(String, SpecDigest)>,
    suite: i64,
}

impl LastSuite {
    fn of(batch: &Rows, suite: i64) -> LastSuite {
        LastSuite {
            agent_id: batch.agent_id.clone(),
            members: batch.rows.iter().map(|r| (r.assertion_id.clone(), r.spec)).collect(),
            suite,
        }
    }

    /// The suite of `batch` if it sends the same assertions (keyed batches
    /// may skip some, so they never match).
    fn suite_of(&self, batch: &Rows) -> Option<i64> {
        let same = !batch.keyed
            && self.agent_id == batch.agent_id
            && self.members.len() == batch.rows.len()
            && self
                .members
                .iter()
                .zip(&batch.rows)
                .all(|((id, spec), r)| *id == r.assertion_id && *spec == r.spec);
        same.then_some(self.suite)
    }
}

impl Interned {
    fn full(&self) -> bool {
        self.fingerprint_count > MAX_INTERNED
            || self.assertions.len() > MAX_INTERNED
            || self.suites.len() > MAX_INTERNED
            || self.suite_bytes > MAX_INTERNED_SUITE_BYTES
            || self.key_bytes > MAX_INTERNED_KEY_BYTES
            || self.runs.len() > MAX_INTERNED
    }
}

/// One batch ready for the multi-row insert.
struct Ready<'a> {
    recorded_at_ms: i64,
    suite: i64,
    trace_id: &'a str,
    size: i64,
    results: Vec<u8>,
    run: Option<i64>,
    costs: Option<Vec<u8>>,
}

/// The writer thread's state: the connection and what it has interned.
pub(super) struct Writer {
    conn: Connection,
    config: HistoryConfig,
    interned: Interned,
    /// Results in the file, counted at the first pruning and kept up to
    /// date, so retention scans the file only when there is something to cut.
    results: Option<i64>,
    /// Kept evaluations in the file, likewise.
    kept: Option<KeptTotals>,
}

impl Writer {
    pub(super) fn new(conn: Connection, config: HistoryConfig) -> Writer {
        Writer {
            conn,
            config,
            interned: Interned::default(),
            results: None,
            kept: None,
        }
    }
}

impl super::Backend for Writer {
    fn prune(&mut self) {
        Writer::prune(self)
    }

    fn answer(&mut self, q: Query) {
        match q {
            Query::Recent(fp, limit, reply) => {
                let scores = self.latest(fp, limit).map(|hits| hits.into_iter().map(|h| h.score).collect());
                let _ = reply.send(scores.map_err(Into::into));
            }
            Query::Drift(subject, window, reply) => {
                let _ = reply.send(self.drift(subject, window).map_err(Into::into));
            }
        }
    }

    fn write(&mut self, pending: &mut Vec<Rows>) -> Result<u64, String> {
        if pending.is_empty() {
            return Ok(0);
        }
        let at = now_ms();
        if self.interned.full() {
            self.interned = Interned::default();
        }
        let interned = &mut self.interned;
        let keep = KeptBounds::of(&self.config);
        let kept_totals = &mut self.kept;
        let result = (|| -> rusqlite::Result<u64> {
            // Immediate, for the same reason as in `prune`.
            let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut n = 0;
            let mut kept_any = false;
            {
                let mut key =
                    tx.prepare_cached("INSERT OR IGNORE INTO result_keys (trace_id, assertion_id, recorded_at_ms) VALUES (?1, ?2, ?3)")?;
                let mut ready: Vec<Ready> = Vec::with_capacity(BATCHES_PER_INSERT);
                // Each assertion id's latest fingerprint, set once per transaction.
                let mut latest: HashMap<i64, i64> = HashMap::new();
                let mut members = Vec::new();
                // The rows of the batch at hand that are written (keyed rows
                // already recorded are not).
                let mut written: Vec<usize> = Vec::new();
                for batch in pending.iter() {
                    let mut results = Vec::with_capacity(batch.rows.len() * RESULT_BYTES);
                    written.clear();
                    let suite = match interned.last.as_ref().and_then(|last| last.suite_of(batch)) {
                        Some(suite) => {
                            for (i, r) in batch.rows.iter().enumerate() {
                                pack_result(&mut results, r.status, r.score);
                                written.push(i);
                            }
                            suite
                        }
                        None => {
                            if batch.keyed {
                                // It may repoint assertion ids the last suite's batches point.
                                interned.last = None;
                            }
                            members.clear();
                            for (i, r) in batch.rows.iter().enumerate() {
                                if batch.keyed && key.execute(params![batch.trace_id, r.assertion_id, at])? == 0 {
                                    // Already recorded by an earlier delivery of this trace.
                                    continue;
                                }
                                let fp = intern_fingerprint(&tx, interned, r, batch.agent_id.as_deref())?;
                                let assertion = intern_assertion(&tx, interned, &r.assertion_id, fp)?;
                                latest.insert(assertion, fp);
                                members.push((fp, assertion));
                                pack_result(&mut results, r.status, r.score);
                                written.push(i);
                            }
                            if members.is_empty() {
                                continue;
                            }
                            let suite = intern_suite(&tx, interned, &members)?;
                            if !batch.keyed {
                                interned.last = Some(LastSuite::of(batch, suite));
                            }
                            suite
                        }
                    };
                    let costs = written
                        .iter()
                        .any(|&i| batch.rows[i].cost > 0.0)
                        .then(|| written.iter().flat_map(|&i| batch.rows[i].cost.to_le_bytes()).collect());
                    let run = match &batch.run {
                        Some(run) => Some(intern_run(&tx, interned, run, at)?),
                        None => None,
                    };
                    let size = results.len() / RESULT_BYTES;
                    n += size as u64;
                    ready.push(Ready {
                        recorded_at_ms: batch.recorded_at_ms.unwrap_or(at),
                        suite,
                        trace_id: &batch.trace_id,
                        size: size as i64,
                        results,
                        run,
                        costs,
                    });
                    let kept = batch.kept.as_deref().filter(|_| keep.on());
                    if ready.len() == BATCHES_PER_INSERT || kept.is_some() {
                        insert_batches(&tx, &ready)?;
                        ready.clear();
                    }
                    if let Some(kept) = kept {
                        // The batch just inserted, alone or last.
                        let batch_id = tx.last_insert_rowid();
                        let bytes = insert_kept(&tx, batch_id, kept, &written)?;
                        if let Some(t) = kept_totals.as_mut() {
                            t.count += 1;
                            t.bytes += bytes;
                        }
                        kept_any = true;
                    }
                }
                insert_batches(&tx, &ready)?;
                repoint_assertions(&tx, latest)?;
            }
            if kept_any {
                bound_kept(&tx, keep, kept_totals)?;
            }
            tx.commit()?;
            Ok(n)
        })();
        pending.clear();
        match result {
            Ok(n) => {
                if let Some(total) = &mut self.results {
                    *total += n as i64;
                }
                Ok(n)
            }
            Err(e) => {
                // A rolled-back transaction may have taken interned ids with it.
                self.interned = Interned::default();
                self.kept = None;
                tracing::error!(error = %e, "cannot write result history");
                Err(e.to_string())
            }
        }
    }
}

/// The kept evaluations' bounds.
#[derive(Clone, Copy)]
struct KeptBounds {
    count: u64,
    bytes: u64,
}

impl KeptBounds {
    fn of(config: &HistoryConfig) -> KeptBounds {
        KeptBounds {
            count: config.kept_evaluations,
            bytes: config.kept_bytes,
        }
    }

    fn on(self) -> bool {
        self.count > 0 && self.bytes > 0
    }
}

/// What the kept evaluations hold, counted once and kept up to date.
#[derive(Clone, Copy, Default)]
pub(super) struct KeptTotals {
    count: u64,
    bytes: u64,
}

/// A kept trace larger than this, compressed, is left out (its evaluation's
/// details are still kept).
pub const MAX_KEPT_TRACE_BYTES: usize = 4 << 20;

fn deflate(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

/// Inflates what [`deflate`] wrote, never past `max` bytes.
pub(super) fn inflate(bytes: &[u8], max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(bytes).take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Stores the details of the `written` rows of a kept evaluation, and its
/// trace; the compressed bytes it took.
fn insert_kept(tx: &Connection, batch: i64, kept: &super::Kept, written: &[usize]) -> rusqlite::Result<u64> {
    let details: Vec<&super::Detail> = written.iter().filter_map(|&i| kept.details.get(i)).collect();
    let details = deflate(&serde_json::to_vec(&details).unwrap_or_default());
    let trace = kept
        .trace
        .as_deref()
        .map(|t| deflate(t.as_bytes()))
        .filter(|t| t.len() <= MAX_KEPT_TRACE_BYTES);
    let bytes = (details.len() + trace.as_ref().map_or(0, Vec::len)) as u64;
    tx.prepare_cached("INSERT INTO kept (batch, details, trace, bytes) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![batch, details, trace, bytes as i64])?;
    Ok(bytes)
}

/// Drops the oldest kept evaluations past either bound.
fn bound_kept(tx: &Connection, bounds: KeptBounds, totals: &mut Option<KeptTotals>) -> rusqlite::Result<()> {
    let t = match *totals {
        Some(t) => t,
        None => tx.query_row("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM kept", [], |r| {
            Ok(KeptTotals {
                count: r.get::<_, i64>(0)? as u64,
                bytes: r.get::<_, i64>(1)? as u64,
            })
        })?,
    };
    if t.count > bounds.count || t.bytes > bounds.bytes {
        // The newest that fit both bounds stay.
        tx.execute(
            "DELETE FROM kept WHERE id <= (SELECT id FROM
               (SELECT id, COUNT(*) OVER w AS newer, SUM(bytes) OVER w AS newer_bytes FROM kept
                WINDOW w AS (ORDER BY id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
             WHERE newer > ?1 OR newer_bytes > ?2 ORDER BY id DESC LIMIT 1)",
            params![bounds.count as i64, bounds.bytes as i64],
        )?;
        *totals = None;
    } else {
        *totals = Some(t);
    }
    Ok(())
}

impl Writer {
    /// Enforces the age, result-count and byte limits. Results removed for
    /// the byte bound leave part-filled pages behind, so it looks again (a
    /// few times at most) while the store is still over it.
    pub(super) fn prune(&mut self) {
        for _ in 0..4 {
            if !self.prune_once() {
                break;
            }
        }
    }

    /// One pass of [`Writer::prune`]; whether results went for the byte bound.
    fn prune_once(&mut self) -> bool {
        self.interned = Interned::default();
        let cutoff = now_ms() - self.config.max_age.as_millis() as i64;
        let max_rows = i64::try_from(self.config.max_rows).unwrap_or(i64::MAX);
        let known_total = self.results;
        let result = (|| -> rusqlite::Result<(usize, i64, bool)> {
            // The write lock up front, waiting on the busy timeout: a
            // deferred transaction reads first and then fails at once
            // ("database is locked") if another engine sharing the file
            // wrote in between, as engines started together do.
            let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut deleted = 0;
            // Batches are appended in time order: nothing is too old unless
            // the oldest is.
            let oldest: Option<i64> = tx
                .query_row("SELECT recorded_at_ms FROM batches ORDER BY id LIMIT 1", [], |r| r.get(0))
                .optional()?;
            if oldest.is_some_and(|t| t < cutoff) {
                deleted += tx.execute("DELETE FROM batches WHERE recorded_at_ms < ?1", params![cutoff])?;
            }
            deleted += tx.execute("DELETE FROM result_keys WHERE recorded_at_ms < ?1", params![cutoff])?;
            let keys: i64 = tx.query_row("SELECT COUNT(*) FROM result_keys", [], |r| r.get(0))?;
            let total = match known_total {
                Some(total) if deleted == 0 => total,
                _ => tx.query_row("SELECT COALESCE(SUM(size), 0) FROM batches", [], |r| r.get(0))?,
            };
            // The byte bound, as counts: the results and the keys each keep
            // the same share of what they hold, the share that fills nine
            // tenths of the bound (a tenth to spare for what is written
            // before the next look).
            let used = bytes_in_use(&tx)?;
            let over_bytes = used > self.config.max_bytes;
            let share = |count: i64| -> i64 {
                if !over_bytes {
                    return max_rows;
                }
                let fit = (count.max(0) as u128 * self.config.max_bytes as u128 * 9 / 10 / used as u128) as i64;
                max_rows.min(fit)
            };
            if over_bytes {
                tracing::info!(used_bytes = used, max_bytes = self.config.max_bytes, "history over its byte bound");
            }
            // The keys of keyed results are bounded like the results: the
            // newest `max_rows` at most (the oldest go first; keys written
            // together go in no particular order).
            let max_keys = share(keys);
            if keys > max_keys {
                deleted += tx.execute(
                    "DELETE FROM result_keys WHERE (trace_id, assertion_id) IN
                     (SELECT trace_id, assertion_id FROM result_keys ORDER BY recorded_at_ms LIMIT ?1)",
                    params![keys - max_keys],
                )?;
            }
            let max_rows = share(total).max(1);
            let mut cut = 0;
            // Results left after the cut: all of them unless over the limit.
            let mut left = total;
            if total > max_rows {
                // The newest batch that does not fit whole, with the results
                // newer than it.
                let straddling: Option<(i64, i64, i64)> = tx
                    .query_row(
                        "SELECT id, size, kept FROM (SELECT id, size, SUM(size) OVER (ORDER BY id DESC) AS kept FROM batches)
                         WHERE kept > ?1 ORDER BY id DESC LIMIT 1",
                        params![max_rows],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()?;
                if let Some((id, size, kept)) = straddling {
                    let newer = kept - size;
                    // Its newest results still fit: keep those.
                    let fit = max_rows - newer;
                    if fit > 0 {
                        keep_newest_results(&tx, &mut Interned::default(), id, fit as usize)?;
                        cut += 1;
                        deleted += tx.execute("DELETE FROM batches WHERE id < ?1", params![id])?;
                        left = max_rows;
                    } else {
                        deleted += tx.execute("DELETE FROM batches WHERE id <= ?1", params![id])?;
                        left = newer;
                    }
                }
            }
            // Interned ids no batch uses any more go too, so the side tables
            // stay as bounded as the batches.
            if deleted + cut > 0 {
                tx.execute_batch(
                    "DELETE FROM suites WHERE id NOT IN (SELECT suite FROM batches);
                     DELETE FROM suite_members WHERE suite NOT IN (SELECT id FROM suites);
                     DELETE FROM assertions WHERE id NOT IN (SELECT assertion FROM suite_members);
                     DELETE FROM fingerprints WHERE id NOT IN (SELECT fingerprint FROM suite_members);
                     DELETE FROM kept WHERE batch < (SELECT COALESCE(MIN(id), 0) FROM batches)
                        OR NOT EXISTS (SELECT 1 FROM batches);
                     DELETE FROM runs WHERE id NOT IN (SELECT run FROM batches WHERE run IS NOT NULL);",
                )?;
            }
            tx.commit()?;
            Ok((deleted, left, over_bytes))
        })();
        match result {
            Ok((deleted, left, over_bytes)) => {
                self.results = Some(left);
                self.kept = None;
                if deleted > 0 {
                    tracing::info!(deleted_rows = deleted, results_kept = left, "history retention applied");
                }
                over_bytes && deleted > 0
            }
            Err(e) => {
                self.results = None;
                tracing::error!(error = %e, "cannot apply history retention");
                false
            }
        }
    }

    /// The latest `limit` results of `fp`, newest first.
    fn latest(&self, fp: Fingerprint, limit: u64) -> rusqlite::Result<Vec<Hit>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        // Where the fingerprint sits: (suite, position, assertion), by suite.
        let members: Vec<(i64, usize, i64)> = self
            .conn
            .prepare_cached(
                "SELECT m.suite, m.pos, m.assertion FROM suite_members m JOIN fingerprints f ON f.id = m.fingerprint
                 WHERE f.fingerprint = ?1 ORDER BY m.suite, m.pos",
            )?
            .query_map(params![&fp.0[..]], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut batches = self
            .conn
            .prepare_cached("SELECT id, results FROM batches WHERE suite = ?1 ORDER BY id DESC LIMIT ?2")?;
        // Each suite's newest `limit` batches, merged: a fingerprint is in
        // as many suites as there are distinct batches sending it, few in
        // practice.
        let mut hits: Vec<Hit> = Vec::new();
        for group in members.chunk_by(|a, b| a.0 == b.0) {
            let mut rows = batches.query(params![group[0].0, limit as i64])?;
            while let Some(row) = rows.next()? {
                let batch: i64 = row.get(0)?;
                let results = row.get_ref(1)?.as_blob()?;
                for &(_, pos, assertion) in group {
                    if let Some(score) = score_at(results, pos) {
                        hits.push(Hit {
                            batch,
                            pos,
                            score,
                            assertion,
                        });
                    }
                }
            }
            // Newest first; later members of one batch count as newer, as
            // they were recorded after the earlier ones.
            hits.sort_unstable_by_key(|h| std::cmp::Reverse((h.batch, h.pos)));
            hits.truncate(limit);
        }
        Ok(hits)
    }

    fn drift(&self, subject: Subject, window: u64) -> rusqlite::Result<DriftReport> {
        let (assertion_id, fp, hits) = match subject {
            Subject::Fingerprint(fp) => {
                let hits = self.latest(fp, window)?;
                let latest_id: Option<String> = match hits.first() {
                    Some(h) => self
                        .conn
                        .prepare_cached("SELECT assertion_id FROM assertions WHERE id = ?1")?
                        .query_row(params![h.assertion], |r| r.get(0))
                        .optional()?,
                    None => None,
                };
                (latest_id.unwrap_or_default(), Some(fp), hits)
            }
            Subject::AssertionId(id) => {
                let fp: Option<Vec<u8>> = self
                    .conn
                    .prepare_cached(
                        "SELECT f.fingerprint FROM assertions a JOIN fingerprints f ON f.id = a.fingerprint WHERE a.assertion_id = ?1",
                    )?
                    .query_row(params![id], |r| r.get(0))
                    .optional()?;
                let fp = fp.and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok()).map(Fingerprint);
                let hits = match fp {
                    Some(fp) => self.latest(fp, window)?,
                    None => Vec::new(),
                };
                (id, fp, hits)
            }
        };
        let scores: Vec<f64> = hits.iter().map(|h| h.score).collect();
        Ok(DriftReport::from_window(assertion_id, fp, &scores, window))
    }
}

/// One stored result of a fingerprint.
struct Hit {
    batch: i64,
    pos: usize,
    score: f64,
    assertion: i64,
}

/// Rewrites batch `id` to hold only its newest `keep` results (the last
/// members), so retention keeps exactly the newest `max_rows` results.
fn keep_newest_results(tx: &Transaction, interned: &mut Interned, id: i64, keep: usize) -> rusqlite::Result<()> {
    let (members, results, costs): (Vec<u8>, Vec<u8>, Option<Vec<u8>>) = tx.query_row(
        "SELECT s.members, b.results, b.costs FROM batches b JOIN suites s ON s.id = b.suite WHERE b.id = ?1",
        params![id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let members = unpack_members(&members);
    let from = members.len().saturating_sub(keep);
    let suite = intern_suite(tx, interned, &members[from..])?;
    let results = results.get(from * RESULT_BYTES..).unwrap_or_default();
    let costs = costs.map(|c| c.get(from * 8..).unwrap_or_default().to_vec());
    tx.execute(
        "UPDATE batches SET suite = ?2, size = ?3, results = ?4, costs = ?5 WHERE id = ?1",
        params![id, suite, (members.len() - from) as i64, results, costs],
    )?;
    // Its kept details no longer line up with its members.
    tx.execute("DELETE FROM kept WHERE batch = ?1", params![id])?;
    Ok(())
}

fn pack_members(members: &[(i64, i64)]) -> Vec<u8> {
    let mut key = Vec::with_capacity(members.len() * 16);
    for (fp, assertion) in members {
        key.extend_from_slice(&fp.to_le_bytes());
        key.extend_from_slice(&assertion.to_le_bytes());
    }
    key
}

pub(super) fn unpack_members(key: &[u8]) -> Vec<(i64, i64)> {
    key.chunks_exact(16)
        .map(|c| {
            let (fp, assertion) = c.split_at(8);
            (
                i64::from_le_bytes(fp.try_into().unwrap_or_default()),
                i64::from_le_bytes(assertion.try_into().unwrap_or_default()),
            )
        })
        .collect()
}

/// The row id of a batch's list of members, inserting it (and its index
/// entries) the first time it is seen.
fn intern_suite(tx: &Connection, interned: &mut Interned, members: &[(i64, i64)]) -> rusqlite::Result<i64> {
    let key = pack_members(members);
    if let Some(id) = interned.suites.get(&key) {
        return Ok(*id);
    }
    let existing: Option<i64> = tx
        .prepare_cached("SELECT id FROM suites WHERE members = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()?;
    let id = match existing {
        Some(id) => id,
        None => {
            tx.prepare_cached("INSERT INTO suites (members) VALUES (?1)")?
                .execute(params![key])?;
            let id = tx.last_insert_rowid();
            let mut member = tx.prepare_cached("INSERT INTO suite_members (fingerprint, suite, pos, assertion) VALUES (?1, ?2, ?3, ?4)")?;
            for (pos, (fp, assertion)) in members.iter().enumerate() {
                member.execute(params![fp, id, pos as i64, assertion])?;
            }
            id
        }
    };
    interned.suite_bytes += key.len();
    interned.suites.insert(key, id);
    Ok(id)
}

/// The row id of a row's fingerprint, inserting it the first time it is seen.
fn intern_fingerprint(tx: &Connection, interned: &mut Interned, row: &Row, agent_id: Option<&str>) -> rusqlite::Result<i64> {
    // No agent and an empty agent hash alike (see `Fingerprint::new`).
    let agent = agent_id.unwrap_or_default();
    if let Some(id) = interned.fingerprints.get(agent).and_then(|by_spec| by_spec.get(&row.spec)) {
        return Ok(*id);
    }
    let id = insert_fingerprint(tx, &Fingerprint::new(&row.spec, agent_id), agent_id, row.assertion_type)?;
    if !interned.fingerprints.contains_key(agent) {
        interned.key_bytes += agent.len();
    }
    interned.fingerprints.entry(agent.to_owned()).or_default().insert(row.spec, id);
    interned.fingerprint_count += 1;
    Ok(id)
}

fn insert_fingerprint(tx: &Connection, fp: &Fingerprint, agent_id: Option<&str>, kind: &str) -> rusqlite::Result<i64> {
    tx.prepare_cached("INSERT OR IGNORE INTO fingerprints (fingerprint, agent_id, assertion_type) VALUES (?1, ?2, ?3)")?
        .execute(params![&fp.0[..], agent_id, kind])?;
    tx.prepare_cached("SELECT id FROM fingerprints WHERE fingerprint = ?1")?
        .query_row(params![&fp.0[..]], |r| r.get(0))
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
    interned.key_bytes += assertion_id.len();
    Ok(id)
}

/// The row id of a run, inserting it the first time it is seen.
fn intern_run(tx: &Connection, interned: &mut Interned, run: &super::Run, at: i64) -> rusqlite::Result<i64> {
    if let Some(id) = interned.runs.get(&run.key) {
        return Ok(*id);
    }
    tx.prepare_cached("INSERT OR IGNORE INTO runs (run_key, kind, label, started_at_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![run.key, run.kind.name(), run.label, at])?;
    let id = tx
        .prepare_cached("SELECT id FROM runs WHERE run_key = ?1")?
        .query_row(params![run.key], |r| r.get(0))?;
    interned.key_bytes += run.key.len();
    interned.runs.insert(run.key.clone(), id);
    Ok(id)
}

/// Points each assertion id at the fingerprint of its latest result.
fn repoint_assertions(tx: &Connection, latest: HashMap<i64, i64>) -> rusqlite::Result<()> {
    let mut repoint = tx.prepare_cached("UPDATE assertions SET fingerprint = ?2 WHERE id = ?1 AND fingerprint <> ?2")?;
    for (assertion, fp) in latest {
        repoint.execute(params![assertion, fp])?;
    }
    Ok(())
}

/// One multi-row INSERT for up to [`BATCHES_PER_INSERT`] batches.
fn insert_batches(tx: &Connection, ready: &[Ready]) -> rusqlite::Result<()> {
    if ready.is_empty() {
        return Ok(());
    }
    let mut sql = String::from("INSERT INTO batches (recorded_at_ms, suite, trace_id, size, results, run, costs) VALUES ");
    for i in 0..ready.len() {
        sql.push_str(if i == 0 { "(?,?,?,?,?,?,?)" } else { ",(?,?,?,?,?,?,?)" });
    }
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(ready.len() * 7);
    for b in ready {
        values.extend_from_slice(&[&b.recorded_at_ms, &b.suite, &b.trace_id, &b.size, &b.results, &b.run, &b.costs]);
    }
    stmt.execute(values.as_slice())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    fn soon() -> std::time::Instant {
        std::time::Instant::now() + std::time::Duration::from_secs(30)
    }

    #[test]
    fn queued_rows_weigh_their_ids() {
        let row = |id: &str| Row {
            assertion_id: id.into(),
            spec: SpecDigest::of("content", None),
            assertion_type: "content",
            status: attest_trace::Status::Pass,
            score: 1.0,
            cost: 0.0,
        };
        let rows = |trace_id: &str, ids: &[&str]| Rows {
            trace_id: trace_id.into(),
            agent_id: None,
            rows: ids.iter().map(|id| row(id)).collect(),
            keyed: false,
            run: None,
            kept: None,
            recorded_at_ms: None,
        };
        assert_eq!(rows("t", &["a", "b"]).weight(), 2);
        // A 1 KiB trace id counts as ten more rows, so the queue's bound
        // holds in bytes as well as in rows.
        assert_eq!(rows(&"t".repeat(1024), &["a"]).weight(), 11);
        assert_eq!(rows("t", &[&"a".repeat(250), &"b".repeat(250)]).weight(), 7);
    }

    #[test]
    fn engines_opening_a_new_file_together_all_get_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.sqlite3");
        for _ in 0..5 {
            let _ = std::fs::remove_file(&path);
            let opened: Vec<_> = (0..16)
                .map(|_| {
                    let path = path.clone();
                    std::thread::spawn(move || open_connection(&path).map(drop))
                })
                .collect();
            for o in opened {
                o.join().unwrap().expect("every opener waits its turn");
            }
        }
    }

    fn config(dir: &Path) -> HistoryConfig {
        HistoryConfig {
            location: Location::File(dir.join("history.sqlite3")),
            max_rows: 1_000,
            max_age: Duration::from_secs(3600),
            max_bytes: 1 << 30,
            wait_when_behind: false,
            kept_evaluations: crate::DEFAULT_KEPT_EVALUATIONS,
            kept_bytes: crate::DEFAULT_KEPT_BYTES,
        }
    }

    /// A history file in an earlier layout: `tables` run on a fresh file,
    /// then `fill` adds its rows, before the engine opens it.
    fn legacy_file(tables: &str, fill: impl FnOnce(&Connection)) -> (tempfile::TempDir, HistoryConfig) {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let conn = Connection::open(c.location.file().unwrap()).unwrap();
        conn.execute_batch(tables).unwrap();
        fill(&conn);
        (dir, c)
    }

    fn rows(id: &str, spec: SpecDigest, scores: &[f64]) -> Rows {
        Rows {
            keyed: false,
            run: None,
            kept: None,
            trace_id: "t".into(),
            agent_id: None,
            rows: scores
                .iter()
                .map(|&score| Row {
                    assertion_id: id.into(),
                    spec,
                    assertion_type: "content",
                    status: attest_trace::Status::Pass,
                    score,
                    cost: 0.0,
                })
                .collect(),
            recorded_at_ms: None,
        }
    }

    #[test]
    fn rows_persist_and_queries_see_queued_rows() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, None);
        {
            let h = History::open(&config(dir.path())).unwrap();
            h.record(rows("run1", spec, &[0.9, 0.8]));
            assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.8, 0.9]);
        }
        let h = History::open(&config(dir.path())).unwrap();
        h.record(rows("run2", spec, &[0.1]));
        let r = h.drift(Subject::AssertionId("run1".into()), 2, soon()).unwrap();
        assert_eq!(
            (r.count, r.latest_score),
            (2, 0.1),
            "run1 resolves to the fingerprint's latest window"
        );
        let r = h.drift(Subject::Fingerprint(fp), 50, soon()).unwrap();
        assert_eq!((r.count, r.assertion_id.as_str()), (3, "run2"));
        let none = h.drift(Subject::AssertionId("never".into()), 50, soon()).unwrap();
        assert_eq!(none.status, DriftStatus::NoData);
    }

    #[test]
    fn a_file_in_the_layout_before_interning_is_migrated() {
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, Some("bot"));
        let tables = "CREATE TABLE results (id INTEGER PRIMARY KEY, recorded_at_ms INTEGER NOT NULL, assertion_id TEXT NOT NULL,
                fingerprint BLOB NOT NULL, assertion_type TEXT NOT NULL, status TEXT NOT NULL, score REAL NOT NULL,
                trace_id TEXT NOT NULL, agent_id TEXT);
             CREATE INDEX results_by_fingerprint ON results (fingerprint, id);
             CREATE INDEX results_by_assertion ON results (assertion_id, id);";
        let (_dir, c) = legacy_file(tables, |conn| {
            for (i, score) in [0.2, 0.4, 0.6].iter().enumerate() {
                conn.execute(
                    "INSERT INTO results (recorded_at_ms, assertion_id, fingerprint, assertion_type, status, score, trace_id, agent_id)
                     VALUES (?1, ?2, ?3, 'content', 'pass', ?4, 't', 'bot')",
                    params![now_ms(), format!("old{i}"), &fp.0[..], score],
                )
                .unwrap();
            }
        });
        let h = History::open(&c).unwrap();
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.6, 0.4, 0.2]);
        let r = h.drift(Subject::AssertionId("old0".into()), 50, soon()).unwrap();
        assert_eq!((r.count, r.fingerprint.as_deref()), (3, Some(fp.hex().as_str())));
        assert_eq!(h.drift(Subject::Fingerprint(fp), 50, soon()).unwrap().assertion_id, "old2");
        // New rows join the migrated history.
        h.record(batch("t2", vec![row("new", spec, 0.8)]));
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.8, 0.6, 0.4, 0.2]);
    }

    #[test]
    fn interned_ids_point_at_each_assertions_latest_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(&config(dir.path())).unwrap();
        let (a, b) = (SpecDigest::of("content", None), SpecDigest::of("schema", None));
        h.record(rows("same-id", a, &[0.1]));
        h.record(rows("same-id", b, &[0.9]));
        let r = h.drift(Subject::AssertionId("same-id".into()), 50, soon()).unwrap();
        assert_eq!(r.fingerprint, Some(Fingerprint::new(&b, None).hex()), "the id's latest spec wins");
        assert_eq!((r.count, r.latest_score), (1, 0.9));
        // Many batches in one write cross the multi-row insert boundary.
        let many: Vec<f64> = (0..600).map(|i| i as f64 / 1000.0).collect();
        for score in &many {
            h.record(rows("bulk", a, &[*score]));
        }
        let recent = h.recent_scores(Fingerprint::new(&a, None), 5, soon()).unwrap();
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
            assert_eq!(h.recent_scores(fp, 10, soon()).unwrap().len(), 5);
        }
        let h = History::open(&c).unwrap();
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.5, 0.4, 0.3]);
    }

    #[test]
    fn retention_keeps_the_store_within_its_byte_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.max_rows = 1_000_000;
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, None);
        let used = |path: &Path| bytes_in_use(&Connection::open(path).unwrap()).unwrap();
        {
            let h = History::open(&c).unwrap();
            // Long trace ids make each batch take room.
            for t in 0..2_000 {
                h.record(Rows {
                    trace_id: format!("{t}-{}", "x".repeat(400)),
                    ..rows("a", spec, &[0.5])
                });
            }
            h.flush(soon());
        }
        let before = used(c.location.file().unwrap());
        assert!(before > 600 << 10, "the store took {before} bytes");
        c.max_bytes = 256 << 10;
        drop(History::open(&c).unwrap());
        let after = used(c.location.file().unwrap());
        assert!(after <= 256 << 10, "over the bound after retention: {after} bytes");
        let kept = History::open(&c).unwrap().recent_scores(fp, 5_000, soon()).unwrap().len();
        assert!(kept > 100 && kept < 2_000, "the newest results fit, the oldest went: kept {kept}");

        // Keyed results (collect's) leave a key each, with the trace id: the
        // keys are cut by their share too, not only the results.
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.max_rows = 1_000_000;
        {
            let h = History::open(&c).unwrap();
            for t in 0..2_000 {
                let mut keyed = batch(&format!("{t}-{}", "k".repeat(400)), vec![row("a", spec, 0.5)]);
                keyed.keyed = true;
                h.record(keyed);
            }
            h.flush(soon());
        }
        c.max_bytes = 256 << 10;
        drop(History::open(&c).unwrap());
        let after = used(c.location.file().unwrap());
        assert!(after <= 256 << 10, "keyed history over the bound after retention: {after} bytes");
        let conn = Connection::open(c.location.file().unwrap()).unwrap();
        let (results, keys): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT COALESCE(SUM(size), 0) FROM batches), (SELECT COUNT(*) FROM result_keys)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!(
            results > 100 && keys > 100 && keys < 2_000,
            "{results} results and {keys} keys kept"
        );
    }

    #[test]
    fn retention_bounds_the_keys_of_keyed_results_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.max_rows = 3;
        let spec = SpecDigest::of("content", None);
        {
            let h = History::open(&c).unwrap();
            for t in 0..6 {
                let mut keyed = batch(&format!("t{t}"), vec![row("x", spec, 0.5)]);
                keyed.keyed = true;
                h.record(keyed);
                // Each its own write, so each key its own time.
                h.flush(soon());
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        drop(History::open(&c).unwrap());
        let conn = Connection::open(c.location.file().unwrap()).unwrap();
        let keys: Vec<String> = conn
            .prepare("SELECT trace_id FROM result_keys ORDER BY trace_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(keys, ["t3", "t4", "t5"], "the newest keys, as many as the results kept");
    }

    fn row(id: &str, spec: SpecDigest, score: f64) -> Row {
        Row {
            assertion_id: id.into(),
            spec,
            assertion_type: "content",
            status: Status::Pass,
            score,
            cost: 0.0,
        }
    }

    fn batch(trace_id: &str, members: Vec<Row>) -> Rows {
        Rows {
            keyed: false,
            run: None,
            kept: None,
            trace_id: trace_id.into(),
            agent_id: Some("bot".into()),
            rows: members,
            recorded_at_ms: None,
        }
    }

    #[test]
    fn a_fingerprint_in_several_suites_is_read_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(&config(dir.path())).unwrap();
        let (a, b, c) = (
            SpecDigest::of("content", None),
            SpecDigest::of("schema", None),
            SpecDigest::of("trace", None),
        );
        let fp = Fingerprint::new(&a, Some("bot"));
        // `a` alone, `a` after `b`, and `a` twice beside `c`: three suites.
        h.record(batch("t1", vec![row("x", a, 0.1)]));
        h.record(batch("t2", vec![row("y", b, 0.9), row("x", a, 0.2)]));
        h.record(batch("t3", vec![row("x", a, 0.3)]));
        h.record(batch("t4", vec![row("x", a, 0.4), row("z", c, 0.9), row("x2", a, 0.5)]));
        h.record(batch("t5", vec![row("y", b, 0.9), row("x", a, 0.6)]));
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.6, 0.5, 0.4, 0.3, 0.2, 0.1]);
        assert_eq!(h.recent_scores(fp, 3, soon()).unwrap(), vec![0.6, 0.5, 0.4]);
        assert_eq!(h.recent_scores(fp, 0, soon()).unwrap(), Vec::<f64>::new());
        let r = h.drift(Subject::Fingerprint(fp), 50, soon()).unwrap();
        assert_eq!((r.count, r.assertion_id.as_str()), (6, "x"));
        let r = h.drift(Subject::AssertionId("x2".into()), 2, soon()).unwrap();
        assert_eq!((r.count, r.latest_score), (2, 0.6));
        // Three distinct member lists were stored, five batches.
        let conn = Connection::open(config(dir.path()).location.file().unwrap()).unwrap();
        let count = |table: &str| -> i64 { conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0)).unwrap() };
        h.flush(soon());
        assert_eq!((count("suites"), count("batches")), (3, 5));
    }

    #[test]
    fn retention_cuts_the_oldest_batch_it_keeps_to_the_results_that_fit() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.max_rows = 4;
        let (a, b, d) = (
            SpecDigest::of("content", None),
            SpecDigest::of("schema", None),
            SpecDigest::of("trace", None),
        );
        {
            let h = History::open(&c).unwrap();
            h.record(batch("t1", vec![row("a", a, 0.1), row("b", b, 0.1)]));
            h.record(batch("t2", vec![row("a", a, 0.2), row("b", b, 0.2), row("d", d, 0.2)]));
            h.record(batch("t3", vec![row("a", a, 0.3)]));
            h.flush(soon());
        }
        let h = History::open(&c).unwrap();
        // t3 (1) + t2's newest three; t1 is gone.
        assert_eq!(
            h.recent_scores(Fingerprint::new(&a, Some("bot")), 10, soon()).unwrap(),
            vec![0.3, 0.2]
        );
        assert_eq!(h.recent_scores(Fingerprint::new(&b, Some("bot")), 10, soon()).unwrap(), vec![0.2]);
        assert_eq!(h.recent_scores(Fingerprint::new(&d, Some("bot")), 10, soon()).unwrap(), vec![0.2]);
        drop(h);
        c.max_rows = 2;
        let h = History::open(&c).unwrap();
        // t3, and t2 cut to its last member.
        assert_eq!(h.recent_scores(Fingerprint::new(&a, Some("bot")), 10, soon()).unwrap(), vec![0.3]);
        assert_eq!(
            h.recent_scores(Fingerprint::new(&b, Some("bot")), 10, soon()).unwrap(),
            Vec::<f64>::new()
        );
        assert_eq!(h.recent_scores(Fingerprint::new(&d, Some("bot")), 10, soon()).unwrap(), vec![0.2]);
        h.flush(soon());
        let conn = Connection::open(c.location.file().unwrap()).unwrap();
        let kept: i64 = conn.query_row("SELECT SUM(size) FROM batches", [], |r| r.get(0)).unwrap();
        assert_eq!(kept, 2);
        // Interned rows no batch uses are gone too.
        let fingerprints: i64 = conn.query_row("SELECT COUNT(*) FROM fingerprints", [], |r| r.get(0)).unwrap();
        assert_eq!(fingerprints, 2);
    }

    #[test]
    fn a_file_in_the_interned_row_per_result_layout_is_migrated() {
        let spec = SpecDigest::of("content", None);
        let fp = Fingerprint::new(&spec, Some("bot"));
        let tables = "CREATE TABLE fingerprints (id INTEGER PRIMARY KEY, fingerprint BLOB NOT NULL UNIQUE, agent_id TEXT);
             CREATE TABLE assertions (id INTEGER PRIMARY KEY, assertion_id TEXT NOT NULL UNIQUE, fingerprint INTEGER NOT NULL);
             CREATE TABLE results (id INTEGER PRIMARY KEY, recorded_at_ms INTEGER NOT NULL, fingerprint INTEGER NOT NULL,
                assertion INTEGER NOT NULL, assertion_type TEXT NOT NULL, status TEXT NOT NULL, score REAL NOT NULL,
                trace_id TEXT NOT NULL);
             CREATE INDEX results_by_fingerprint ON results (fingerprint, id);
             CREATE TABLE result_keys (trace_id TEXT NOT NULL, assertion_id TEXT NOT NULL, recorded_at_ms INTEGER NOT NULL,
                PRIMARY KEY (trace_id, assertion_id)) WITHOUT ROWID;
             PRAGMA user_version = 2;";
        let (_dir, c) = legacy_file(tables, |conn| {
            conn.execute(
                "INSERT INTO fingerprints (id, fingerprint, agent_id) VALUES (7, ?1, 'bot')",
                params![&fp.0[..]],
            )
            .unwrap();
            conn.execute_batch("INSERT INTO assertions (id, assertion_id, fingerprint) VALUES (3, 'old0', 7), (4, 'old1', 7);")
                .unwrap();
            conn.execute("INSERT INTO result_keys VALUES ('t', 'old0', ?1)", params![now_ms()])
                .unwrap();
            for (i, score) in [0.2, 0.4, 0.6].iter().enumerate() {
                conn.execute(
                    "INSERT INTO results (recorded_at_ms, fingerprint, assertion, assertion_type, status, score, trace_id)
                     VALUES (?1, 7, ?2, 'content', 'soft_fail', ?3, 't')",
                    params![now_ms(), 3 + (i as i64 % 2), score],
                )
                .unwrap();
            }
        });
        let h = History::open(&c).unwrap();
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.6, 0.4, 0.2]);
        assert_eq!(h.drift(Subject::Fingerprint(fp), 50, soon()).unwrap().assertion_id, "old0");
        let r = h.drift(Subject::AssertionId("old1".into()), 50, soon()).unwrap();
        assert_eq!((r.count, r.fingerprint.as_deref()), (3, Some(fp.hex().as_str())));
        h.record(batch("t2", vec![row("new", spec, 0.8)]));
        assert_eq!(h.recent_scores(fp, 10, soon()).unwrap(), vec![0.8, 0.6, 0.4, 0.2]);
        h.flush(soon());
        let conn = Connection::open(c.location.file().unwrap()).unwrap();
        let (status, kind): (i64, String) = conn
            .query_row(
                "SELECT unicode(substr(b.results, 1, 1)), f.assertion_type FROM batches b
                 JOIN suite_members m ON m.suite = b.suite JOIN fingerprints f ON f.id = m.fingerprint ORDER BY b.id LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((status, kind.as_str()), (1, "content"), "status and type survive the migration");
        let keys: i64 = conn.query_row("SELECT COUNT(*) FROM result_keys", [], |r| r.get(0)).unwrap();
        assert_eq!(keys, 1, "result keys are kept");
    }

    #[test]
    fn an_assertion_id_follows_its_latest_fingerprint_across_keyed_and_repeated_batches() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(&config(dir.path())).unwrap();
        let (a, b) = (SpecDigest::of("content", None), SpecDigest::of("schema", None));
        h.record(batch("t1", vec![row("x", a, 0.1)]));
        let mut keyed = batch("t2", vec![row("x", b, 0.2)]);
        keyed.keyed = true;
        h.record(keyed);
        // The same assertions as t1: its suite is reused, and `x` points
        // back at `a`'s fingerprint.
        h.record(batch("t3", vec![row("x", a, 0.3)]));
        let r = h.drift(Subject::AssertionId("x".into()), 50, soon()).unwrap();
        assert_eq!(r.fingerprint, Some(Fingerprint::new(&a, Some("bot")).hex()));
        assert_eq!((r.count, r.latest_score), (2, 0.3));
    }
}
