//! The persistent provider cache: embedding vectors and judge verdicts in
//! SQLite (`<cache_dir>/providers.sqlite3`).
//!
//! - Keys are SHA-256 digests of everything that changes the answer; the
//!   layers build them with [`key`].
//! - WAL mode and a busy timeout let concurrent requests and several engine
//!   processes share the file.
//! - Size is bounded per table (`cache_max_entries`): past the bound, the
//!   least recently used tenth is evicted.
//! - Calls run on the blocking pool, so a locked file never stalls the
//!   async workers.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

pub struct ProviderCache {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
    max_entries: u64,
    embeddings: Counters,
    verdicts: Counters,
    writes: AtomicU64,
    evicted: Arc<AtomicU64>,
}

#[derive(Debug, Serialize)]
pub struct TableStats {
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Debug, Serialize)]
pub struct CacheStats {
    pub path: String,
    pub max_entries_per_table: u64,
    pub evicted: u64,
    pub embeddings: TableStats,
    pub verdicts: TableStats,
}

/// Most persisted judge calibrations kept (newest first).
const MAX_CALIBRATIONS: i64 = 1000;

/// Evictions are checked once per this many writes.
const EVICT_EVERY: u64 = 64;

impl ProviderCache {
    pub fn open(path: &Path, max_entries: u64) -> anyhow::Result<ProviderCache> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let conn = attest_store::open_shared(path)?;
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
            max_entries: max_entries.max(1),
            embeddings: Counters::default(),
            verdicts: Counters::default(),
            writes: AtomicU64::new(0),
            evicted: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Runs `f` on the connection, off the async workers. Cache faults are
    /// logged and treated as misses: a cache never fails an evaluation.
    async fn with<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Option<T> {
        let conn = self.conn.clone();
        let run = tokio::task::spawn_blocking(move || {
            let guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&guard)
        });
        match run.await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, operation = what, "provider cache unavailable for this call");
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
        let found = self
            .with("read embedding", move |c| {
                let v: Option<Vec<u8>> = c
                    .query_row("SELECT vector FROM embeddings WHERE key = ?1", [&key[..]], |r| r.get(0))
                    .optional()?;
                if v.is_some() {
                    c.execute("UPDATE embeddings SET used_ms = ?2 WHERE key = ?1", params![&key[..], now_ms()])?;
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
                    c.execute("UPDATE verdicts SET used_ms = ?2 WHERE key = ?1", params![&key[..], now_ms()])?;
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

    /// Every [`EVICT_EVERY`] writes, trims each table back under its bound,
    /// removing the least recently used rows (a tenth of the bound at least,
    /// so trimming is rare).
    async fn after_write(&self, table: Table) {
        if self.writes.fetch_add(1, Ordering::Relaxed) % EVICT_EVERY != EVICT_EVERY - 1 {
            return;
        }
        let max = self.max_entries;
        let evicted = self.evicted.clone();
        let name = table.name();
        self.with("evict", move |c| {
            let n: u64 = c.query_row(&format!("SELECT COUNT(*) FROM {name}"), [], |r| r.get(0))?;
            if n > max {
                let drop = (n - max).max(max / 10);
                let gone = c.execute(
                    &format!("DELETE FROM {name} WHERE key IN (SELECT key FROM {name} ORDER BY used_ms ASC LIMIT ?1)"),
                    [drop],
                )?;
                evicted.fetch_add(gone as u64, Ordering::Relaxed);
            }
            Ok(())
        })
        .await;
    }

    pub async fn stats(&self) -> CacheStats {
        let counts = self
            .with("count entries", |c| {
                let n = |t: &str| c.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get::<_, u64>(0));
                Ok((n("embeddings")?, n("verdicts")?))
            })
            .await
            .unwrap_or((0, 0));
        let table = |c: &Counters, entries| TableStats {
            entries,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
        };
        CacheStats {
            path: self.path.display().to_string(),
            max_entries_per_table: self.max_entries,
            evicted: self.evicted.load(Ordering::Relaxed),
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

    #[tokio::test]
    async fn round_trips_and_evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ProviderCache::open(&dir.path().join("p.sqlite3"), 10).unwrap();
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
        let other = ProviderCache::open(&dir.path().join("p.sqlite3"), 10).unwrap();
        assert!(other.verdict(key(&["v"])).await.is_some());
    }
}
