//! The persistent provider cache: embedding vectors and judge verdicts in
//! SQLite (`<cache_dir>/providers.sqlite3`).
//!
//! - Keys are SHA-256 digests of everything that changes the answer; the
//!   layers build them with [`key`].
//! - WAL mode and a busy timeout let concurrent requests and several engine
//!   processes share the file.
//! - Size is bounded per table, in rows (`cache_max_entries`) and in stored
//!   bytes (`cache_max_mib`): past either bound, the least recently used rows
//!   are evicted, down to nine tenths of it.
//! - Calls run on the blocking pool, so a locked file never stalls the
//!   async workers. A statement that finds the file locked by another
//!   process for longer than [`CACHE_LOCK_WAIT`] opens a back-off window
//!   ([`LOCKED_BACKOFF`]) in which every call is a miss or a skipped write
//!   without touching the file: a burst of lookups behind a lock costs one
//!   wait, not one each.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type Key = [u8; 32];

/// A digest of `parts`, each length-prefixed so that no two different
/// lists of parts can collide by concatenation.
pub fn key(parts: &[&str]) -> Key {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().into()
}

pub use attest_calibration::JudgeAgreement;

#[derive(Debug, Clone, PartialEq)]
pub struct CachedVerdict {
    pub score: f64,
    pub explanation: String,
    /// Every sample's score, in the order they were drawn (one for `samples: 1`).
    pub samples: Vec<f64>,
}

#[derive(Clone, Copy)]
enum Table {
    Embeddings,
    Verdicts,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Embeddings => "embeddings",
            Table::Verdicts => "verdicts",
        }
    }

    /// A row's stored bytes, as SQL: its values plus the key and about as
    /// much again of SQLite's own bookkeeping.
    fn row_bytes(self) -> &'static str {
        match self {
            Table::Embeddings => "(length(vector) + length(model) + 64)",
            Table::Verdicts => "(length(explanation) + coalesce(length(samples), 0) + 72)",
        }
    }

    /// The table's rows and stored bytes.
    fn size(self, c: &Connection) -> rusqlite::Result<(u64, u64)> {
        let (name, size) = (self.name(), self.row_bytes());
        c.query_row(&format!("SELECT COUNT(*), COALESCE(SUM({size}), 0) FROM {name}"), [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    }
}

/// How large each table may grow.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_entries: u64,
    pub max_bytes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

pub struct ProviderCache {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
    bounds: Bounds,
    embeddings: Counters,
    verdicts: Counters,
    writes: AtomicU64,
    evicted: Arc<AtomicU64>,
    locked: Arc<LockedWindow>,
}

/// When the file was last found locked by another process, and how many
/// calls were skipped because of it.
struct LockedWindow {
    opened: Instant,
    /// Milliseconds after `opened` until which calls skip the file; 0 when
    /// it was never found locked.
    until_ms: AtomicU64,
    skipped: AtomicU64,
}

impl LockedWindow {
    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// True (and the call counted as skipped) while the back-off runs.
    fn skip(&self) -> bool {
        let skip = self.now_ms() < self.until_ms.load(Ordering::Relaxed);
        if skip {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        skip
    }

    /// Opens the back-off window if `e` says the file is locked; true if it did.
    fn note(&self, e: &rusqlite::Error) -> bool {
        let locked = is_locked(e);
        if locked {
            let until = self.now_ms() + LOCKED_BACKOFF.as_millis() as u64;
            self.until_ms.fetch_max(until, Ordering::Relaxed);
        }
        locked
    }
}

/// Whether `e` says another connection holds the file locked.
fn is_locked(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Marks the row `key` as just used, for eviction order, with `update`
/// (`UPDATE <table> SET used_ms = ?2 WHERE key = ?1`). A lookup that found
/// its row stays a hit when the file is locked for writing: the mark is
/// best-effort.
fn touch(c: &Connection, locked: &LockedWindow, update: &str, key: &Key) {
    if let Err(e) = c.execute(update, params![&key[..], now_ms()]) {
        if !locked.note(&e) {
            tracing::warn!(error = %e, update, "provider cache: could not mark a row as used");
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TableStats {
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Debug, Serialize)]
pub struct CacheStats {
    pub path: String,
    pub max_entries_per_table: u64,
    pub max_bytes_per_table: u64,
    pub evicted: u64,
    /// Calls that skipped the file because another process held it locked
    /// (each a miss or a skipped write).
    pub skipped_while_locked: u64,
    pub embeddings: TableStats,
    pub verdicts: TableStats,
}

/// Most persisted judge calibrations kept (newest first).
const MAX_CALIBRATIONS: i64 = 1000;

/// How long a cache statement waits for another process's lock.
const CACHE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// How long the cache is skipped after a statement found the file locked.
const LOCKED_BACKOFF: Duration = Duration::from_secs(1);

/// Evictions are checked once per this many writes.
const EVICT_EVERY: u64 = 64;

impl ProviderCache {
    pub fn open(path: &Path, bounds: Bounds) -> anyhow::Result<ProviderCache> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A cache is worth a short wait at most: a lookup that waits on
        // another process's lock for longer is a miss (and a write is
        // skipped), never a request held toward its deadline.
        let conn = attest_store::open_shared_waiting(path, CACHE_LOCK_WAIT)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS embeddings (
                key BLOB PRIMARY KEY, model TEXT NOT NULL, vector BLOB NOT NULL,
                created_ms INTEGER NOT NULL, used_ms INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS embeddings_used ON embeddings(used_ms);
             CREATE TABLE IF NOT EXISTS verdicts (
                key BLOB PRIMARY KEY, score REAL NOT NULL, explanation TEXT NOT NULL,
                created_ms INTEGER NOT NULL, used_ms INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS verdicts_used ON verdicts(used_ms);
             CREATE TABLE IF NOT EXISTS calibrations (
                rubric TEXT NOT NULL, rubric_version TEXT NOT NULL, prompt_hash TEXT NOT NULL,
                agreement TEXT NOT NULL, created_ms INTEGER NOT NULL,
                PRIMARY KEY (rubric, rubric_version, prompt_hash));",
        )?;
        // Caches written before sample scores were kept gain the column; their
        // rows read back with the verdict's score as the only sample.
        let has_samples = conn
            .prepare("SELECT 1 FROM pragma_table_info('verdicts') WHERE name = 'samples'")?
            .exists([])?;
        if !has_samples {
            conn.execute_batch("ALTER TABLE verdicts ADD COLUMN samples TEXT")?;
        }
        Ok(ProviderCache {
            path: path.to_owned(),
            conn: Arc::new(Mutex::new(conn)),
            bounds: Bounds {
                max_entries: bounds.max_entries.max(1),
                max_bytes: bounds.max_bytes.max(1),
            },
            embeddings: Counters::default(),
            verdicts: Counters::default(),
            writes: AtomicU64::new(0),
            evicted: Arc::new(AtomicU64::new(0)),
            locked: Arc::new(LockedWindow {
                opened: Instant::now(),
                until_ms: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
            }),
        })
    }

    /// Runs `f` on the connection, off the async workers. Cache faults are
    /// logged and treated as misses: a cache never fails an evaluation.
    /// While the file is known to be locked, `f` is not run at all.
    async fn with<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Option<T> {
        if self.locked.skip() {
            return None;
        }
        let (conn, locked) = (self.conn.clone(), self.locked.clone());
        let run = tokio::task::spawn_blocking(move || {
            let guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            // Calls queued behind the one that found the lock see its window.
            if locked.skip() {
                return None;
            }
            Some(f(&guard).inspect_err(|e| {
                if locked.note(e) {
                    tracing::warn!(
                        error = %e,
                        operation = what,
                        "provider cache: the file is locked by another process; skipping the cache for {} s",
                        LOCKED_BACKOFF.as_secs()
                    );
                }
            }))
        });
        match run.await {
            Ok(None) => None,
            Ok(Some(Ok(v))) => Some(v),
            Ok(Some(Err(e))) => {
                // A locked file was logged once, when its window opened.
                if !is_locked(&e) {
                    tracing::warn!(error = %e, operation = what, "provider cache unavailable for this call");
                }
                None
            }
            Err(e) => {
                tracing::error!(error = %e, operation = what, "provider cache task failed");
                None
            }
        }
    }

    fn count(&self, table: Table, hit: bool) {
        let c = match table {
            Table::Embeddings => &self.embeddings,
            Table::Verdicts => &self.verdicts,
        };
        if hit {
            c.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            c.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub async fn embedding(&self, key: Key) -> Option<Vec<f32>> {
        let locked = self.locked.clone();
        let found = self
            .with("read embedding", move |c| {
                let v: Option<Vec<u8>> = c
                    .query_row("SELECT vector FROM embeddings WHERE key = ?1", [&key[..]], |r| r.get(0))
                    .optional()?;
                if v.is_some() {
                    touch(c, &locked, "UPDATE embeddings SET used_ms = ?2 WHERE key = ?1", &key);
                }
                Ok(v)
            })
            .await
            .flatten()
            .map(|bytes| {
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            });
        self.count(Table::Embeddings, found.is_some());
        found
    }

    pub async fn put_embedding(&self, key: Key, model: String, vector: &[f32]) {
        let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
        self.with("write embedding", move |c| {
            let now = now_ms();
            c.execute(
                "INSERT OR REPLACE INTO embeddings (key, model, vector, created_ms, used_ms) VALUES (?1, ?2, ?3, ?4, ?4)",
                params![&key[..], model, bytes, now],
            )
        })
        .await;
        self.after_write(Table::Embeddings).await;
    }

    pub async fn verdict(&self, key: Key) -> Option<CachedVerdict> {
        let locked = self.locked.clone();
        let found = self
            .with("read verdict", move |c| {
                let v = c
                    .query_row("SELECT score, explanation, samples FROM verdicts WHERE key = ?1", [&key[..]], |r| {
                        let score: f64 = r.get(0)?;
                        let samples: Option<String> = r.get(2)?;
                        Ok(CachedVerdict {
                            score,
                            explanation: r.get(1)?,
                            samples: samples
                                .and_then(|s| serde_json::from_str::<Vec<f64>>(&s).ok())
                                .filter(|s| !s.is_empty())
                                .unwrap_or_else(|| vec![score]),
                        })
                    })
                    .optional()?;
                if v.is_some() {
                    touch(c, &locked, "UPDATE verdicts SET used_ms = ?2 WHERE key = ?1", &key);
                }
                Ok(v)
            })
            .await
            .flatten();
        self.count(Table::Verdicts, found.is_some());
        found
    }

    /// The persisted calibration of a judge configuration, if any.
    pub async fn calibration(&self, rubric: &str, version: &str, prompt_hash: &str) -> Option<JudgeAgreement> {
        let key = (rubric.to_owned(), version.to_owned(), prompt_hash.to_owned());
        self.with("read calibration", move |c| {
            c.query_row(
                "SELECT agreement FROM calibrations WHERE rubric = ?1 AND rubric_version = ?2 AND prompt_hash = ?3",
                params![key.0, key.1, key.2],
                |r| r.get::<_, String>(0),
            )
            .optional()
        })
        .await
        .flatten()
        .and_then(|text| serde_json::from_str(&text).ok())
    }

    /// Stores a calibration, replacing the one under the same key; keeps
    /// the newest [`MAX_CALIBRATIONS`] rows.
    pub async fn put_calibration(&self, rubric: &str, version: &str, prompt_hash: &str, agreement: &JudgeAgreement) -> bool {
        let row = (
            rubric.to_owned(),
            version.to_owned(),
            prompt_hash.to_owned(),
            serde_json::to_string(agreement).unwrap_or_default(),
        );
        self.with("write calibration", move |c| {
            c.execute(
                "INSERT OR REPLACE INTO calibrations (rubric, rubric_version, prompt_hash, agreement, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![row.0, row.1, row.2, row.3, now_ms()],
            )?;
            c.execute(
                "DELETE FROM calibrations WHERE rowid NOT IN (SELECT rowid FROM calibrations ORDER BY created_ms DESC LIMIT ?1)",
                [MAX_CALIBRATIONS],
            )
        })
        .await
        .is_some()
    }

    pub async fn put_verdict(&self, key: Key, v: CachedVerdict) {
        self.with("write verdict", move |c| {
            let now = now_ms();
            c.execute(
                "INSERT OR REPLACE INTO verdicts (key, score, explanation, created_ms, used_ms, samples) VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
                params![
                    &key[..],
                    v.score,
                    v.explanation,
                    now,
                    serde_json::to_string(&v.samples).unwrap_or_default()
                ],
            )
        })
        .await;
        self.after_write(Table::Verdicts).await;
    }

    /// Every [`EVICT_EVERY`] writes, trims the table back under its bounds,
    /// removing the least recently used rows down to nine tenths of the
    /// bound passed, so that trimming is rare.
    async fn after_write(&self, table: Table) {
        if self.writes.fetch_add(1, Ordering::Relaxed) % EVICT_EVERY != EVICT_EVERY - 1 {
            return;
        }
        let Bounds { max_entries, max_bytes } = self.bounds;
        let evicted = self.evicted.clone();
        let (name, size) = (table.name(), table.row_bytes());
        self.with("evict", move |c| {
            let (n, bytes) = table.size(c)?;
            let mut gone = 0;
            if n > max_entries {
                let drop = (n - max_entries).max(max_entries / 10);
                gone += c.execute(
                    &format!("DELETE FROM {name} WHERE key IN (SELECT key FROM {name} ORDER BY used_ms ASC LIMIT ?1)"),
                    [drop],
                )?;
            }
            if bytes > max_bytes {
                // The oldest rows whose sizes, added up in order, reach what
                // must go; rows the count bound removed above just no longer match.
                let free = bytes - (max_bytes - max_bytes / 10);
                gone += c.execute(
                    &format!(
                        "DELETE FROM {name} WHERE key IN (SELECT key FROM (SELECT key, {size} AS size, \
                         SUM({size}) OVER (ORDER BY used_ms ASC, key ASC) AS upto FROM {name}) WHERE upto - size < ?1)"
                    ),
                    [free],
                )?;
            }
            evicted.fetch_add(gone as u64, Ordering::Relaxed);
            Ok(())
        })
        .await;
    }

    pub async fn stats(&self) -> CacheStats {
        let counts = self
            .with("count entries", |c| Ok((Table::Embeddings.size(c)?, Table::Verdicts.size(c)?)))
            .await
            .unwrap_or(((0, 0), (0, 0)));
        let table = |c: &Counters, (entries, bytes)| TableStats {
            entries,
            bytes,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
        };
        CacheStats {
            path: self.path.display().to_string(),
            max_entries_per_table: self.bounds.max_entries,
            max_bytes_per_table: self.bounds.max_bytes,
            evicted: self.evicted.load(Ordering::Relaxed),
            skipped_while_locked: self.locked.skipped.load(Ordering::Relaxed),
            embeddings: table(&self.embeddings, counts.0),
            verdicts: table(&self.verdicts, counts.1),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_do_not_collide_by_concatenation() {
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
        assert_eq!(key(&["a", "b"]), key(&["a", "b"]));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_locked_by_another_process_costs_one_wait_then_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sqlite3");
        let bounds = Bounds {
            max_entries: 100,
            max_bytes: 1 << 20,
        };
        let cache = ProviderCache::open(&path, bounds).unwrap();
        cache.put_embedding(key(&["x"]), "m".into(), &[0.5]).await;
        // Another process takes the write lock and keeps it.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        // The first write waits out the lock and opens the window; a hit
        // stays a hit (reads are not blocked, the used mark is best-effort).
        cache.put_embedding(key(&["y"]), "m".into(), &[1.0]).await;
        let skipped = cache.locked.skipped.load(Ordering::Relaxed);
        assert_eq!(skipped, 0, "the first call waits, it is not skipped");
        for _ in 0..20 {
            cache.put_embedding(key(&["z"]), "m".into(), &[1.0]).await;
        }
        assert_eq!(
            cache.locked.skipped.load(Ordering::Relaxed),
            20,
            "calls in the window skip the file"
        );
        assert_eq!(cache.embedding(key(&["y"])).await, None, "skipped lookups are misses");
        assert_eq!(
            cache.stats().await.skipped_while_locked,
            22,
            "the lookup and the stats' count skipped too"
        );
        // Once the lock is gone and the window has passed, the cache is used again.
        other.execute_batch("COMMIT").unwrap();
        cache.locked.until_ms.store(0, Ordering::Relaxed);
        assert_eq!(cache.embedding(key(&["x"])).await, Some(vec![0.5]));
        cache.put_embedding(key(&["y"]), "m".into(), &[1.0]).await;
        assert_eq!(cache.embedding(key(&["y"])).await, Some(vec![1.0]));
        // A hit while another process holds the write lock is still a hit.
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert_eq!(cache.embedding(key(&["x"])).await, Some(vec![0.5]));
        other.execute_batch("COMMIT").unwrap();
    }

    #[tokio::test]
    async fn round_trips_and_evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let bounds = Bounds {
            max_entries: 10,
            max_bytes: 1 << 20,
        };
        let cache = ProviderCache::open(&dir.path().join("p.sqlite3"), bounds).unwrap();
        assert_eq!(cache.embedding(key(&["x"])).await, None);
        cache.put_embedding(key(&["x"]), "m".into(), &[0.5, -1.0]).await;
        assert_eq!(cache.embedding(key(&["x"])).await, Some(vec![0.5, -1.0]));
        let v = CachedVerdict {
            score: 0.75,
            explanation: "fine".into(),
            samples: vec![0.75, 0.5, 1.0],
        };
        cache.put_verdict(key(&["v"]), v.clone()).await;
        assert_eq!(cache.verdict(key(&["v"])).await, Some(v));
        for i in 0..(EVICT_EVERY * 2) {
            cache.put_embedding(key(&[&i.to_string()]), "m".into(), &[1.0]).await;
        }
        let s = cache.stats().await;
        assert!(s.embeddings.entries <= 10 + EVICT_EVERY, "{s:?}");
        assert!(s.evicted > 0);
        assert_eq!((s.embeddings.hits, s.embeddings.misses), (1, 1));
        // A second handle on the same file (another process) sees the rows.
        let other = ProviderCache::open(&dir.path().join("p.sqlite3"), bounds).unwrap();
        assert!(other.verdict(key(&["v"])).await.is_some());
    }

    #[tokio::test]
    async fn stored_bytes_are_bounded_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        // Room for about 20 vectors of 1,024 floats (4 KiB each).
        let bounds = Bounds {
            max_entries: 100_000,
            max_bytes: 20 * 4160,
        };
        let cache = ProviderCache::open(&dir.path().join("p.sqlite3"), bounds).unwrap();
        let vector = vec![0.25f32; 1024];
        for i in 0..EVICT_EVERY * 2 {
            cache.put_embedding(key(&[&i.to_string()]), "m".into(), &vector).await;
            // Distinct use times, so "least recently used" has one answer.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let s = cache.stats().await;
        assert!(s.embeddings.bytes <= bounds.max_bytes, "{s:?}");
        assert!(s.embeddings.entries >= 15, "trimmed far below the bound: {s:?}");
        assert_eq!(s.max_bytes_per_table, bounds.max_bytes);
        // The newest survive; the oldest went first.
        assert!(cache.embedding(key(&[&(EVICT_EVERY * 2 - 1).to_string()])).await.is_some());
        assert!(cache.embedding(key(&["0"])).await.is_none());
    }
}
