//! The JSONL results sink: one line per assertion result, appended, and
//! idempotent on (trace id, rule, assertion id) — a key already in the file is
//! never written again, also across restarts (the file is the index).

use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{BoxFuture, HistorySink, ResultKey, ResultRecord};

/// Keys remembered for de-duplication; past this the oldest are forgotten
/// (redeliveries happen within minutes, so old keys are not needed).
pub const DEDUPE_KEYS: usize = 1_000_000;

pub struct JsonlSink {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    file: std::io::BufWriter<std::fs::File>,
    seen: HashSet<ResultKey>,
    order: VecDeque<ResultKey>,
    written: u64,
    duplicates: u64,
}

impl JsonlSink {
    /// Opens (creating) `path` for appending and loads the keys already in it.
    pub fn open(path: &Path) -> anyhow::Result<JsonlSink> {
        let mut seen = HashSet::new();
        let mut order = VecDeque::new();
        if let Ok(f) = std::fs::File::open(path) {
            for line in std::io::BufReader::new(f).lines() {
                let line = line?;
                if let Ok(r) = serde_json::from_str::<ResultRecord>(&line) {
                    if seen.insert(r.key.clone()) {
                        order.push_back(r.key);
                        if order.len() > DEDUPE_KEYS {
                            if let Some(old) = order.pop_front() {
                                seen.remove(&old);
                            }
                        }
                    }
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("--results-jsonl {}: cannot be opened for appending: {e}", path.display()))?;
        Ok(JsonlSink {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                file: std::io::BufWriter::new(file),
                seen,
                order,
                written: 0,
                duplicates: 0,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (lines written, duplicates skipped) since opening.
    pub fn counts(&self) -> (u64, u64) {
        let i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (i.written, i.duplicates)
    }

    fn write(&self, results: &[ResultRecord]) -> anyhow::Result<()> {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for r in results {
            if i.seen.contains(&r.key) {
                i.duplicates += 1;
                continue;
            }
            let line = serde_json::to_string(r)?;
            i.file.write_all(line.as_bytes())?;
            i.file.write_all(b"\n")?;
            i.seen.insert(r.key.clone());
            i.order.push_back(r.key.clone());
            if i.order.len() > DEDUPE_KEYS {
                if let Some(old) = i.order.pop_front() {
                    i.seen.remove(&old);
                }
            }
            i.written += 1;
        }
        i.file.flush()?;
        Ok(())
    }

    fn sync(&self) -> anyhow::Result<()> {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        i.file.flush()?;
        i.file.get_ref().sync_data()?;
        Ok(())
    }
}

impl HistorySink for JsonlSink {
    fn record<'a>(&'a self, results: &'a [ResultRecord]) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.write(results) })
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.sync() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(trace: &str, a: &str) -> ResultRecord {
        ResultRecord::passing(trace, "r", a)
    }

    #[test]
    fn same_key_is_written_once_also_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let s = JsonlSink::open(&p).unwrap();
        s.write(&[rec("t1", "a"), rec("t1", "b")]).unwrap();
        s.write(&[rec("t1", "a")]).unwrap();
        assert_eq!(s.counts(), (2, 1));
        drop(s);
        let s = JsonlSink::open(&p).unwrap();
        s.write(&[rec("t1", "b"), rec("t2", "a")]).unwrap();
        assert_eq!(s.counts(), (1, 1));
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 3);
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        for f in [
            "trace_id",
            "rule",
            "assertion_id",
            "type",
            "status",
            "score",
            "explanation",
            "agent_id",
            "evaluated_at",
        ] {
            assert!(first.get(f).is_some(), "missing {f}");
        }
    }
}
