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
    /// A regular file, which a drain syncs to disk. A device or a pipe
    /// cannot be synced (the call fails with EINVAL) and holds nothing to
    /// make durable.
    synced: bool,
    inner: Mutex<Inner>,
}

struct Inner {
    file: std::io::BufWriter<std::fs::File>,
    seen: HashSet<ResultKey>,
    order: VecDeque<ResultKey>,
    written: u64,
    duplicates: u64,
}

/// Longest line of an existing results file that is read for its key. A
/// result line is a few kilobytes; a longer one is not ours, and is skipped
/// without being held in memory.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Keys of the results already in a file, and what reading it found.
#[derive(Default)]
struct Existing {
    seen: HashSet<ResultKey>,
    order: VecDeque<ResultKey>,
    /// Lines that are not result records (or over [`MAX_LINE_BYTES`]), and the first one's number.
    skipped: u64,
    first_skipped: Option<u64>,
    /// The file ends without a line break: a write cut short.
    torn: bool,
}

impl Existing {
    fn remember(&mut self, key: ResultKey) {
        if self.seen.insert(key.clone()) {
            self.order.push_back(key);
            if self.order.len() > DEDUPE_KEYS {
                if let Some(old) = self.order.pop_front() {
                    self.seen.remove(&old);
                }
            }
        }
    }

    /// Reads the keys of `r` line by line, holding at most one line of
    /// [`MAX_LINE_BYTES`]: any bytes (invalid UTF-8, a file of zeros) are
    /// read in bounded memory.
    fn read(mut r: impl BufRead) -> std::io::Result<Existing> {
        let mut ex = Existing::default();
        let mut line = Vec::new();
        let mut too_long = false;
        let mut number = 0u64;
        loop {
            let buf = r.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            let (chunk, ended) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            if !too_long && line.len() + chunk.len() <= MAX_LINE_BYTES {
                line.extend_from_slice(chunk);
            } else {
                too_long = true;
                line.clear();
            }
            let used = chunk.len() + usize::from(ended);
            r.consume(used);
            // Until a line break ends it, the line read so far is the last
            // one, and cut short if the file ends here.
            ex.torn = !ended;
            if ended {
                number += 1;
                ex.line(&line, too_long, number);
                line.clear();
                too_long = false;
            }
        }
        if ex.torn {
            number += 1;
            ex.line(&line, too_long, number);
        }
        Ok(ex)
    }

    fn line(&mut self, line: &[u8], too_long: bool, number: u64) {
        if line.iter().all(u8::is_ascii_whitespace) && !too_long {
            return;
        }
        match serde_json::from_slice::<ResultRecord>(line) {
            Ok(r) if !too_long => self.remember(r.key),
            _ => {
                self.skipped += 1;
                self.first_skipped.get_or_insert(number);
            }
        }
    }
}

impl JsonlSink {
    /// Opens (creating) `path` for appending and loads the keys already in it.
    pub fn open(path: &Path) -> anyhow::Result<JsonlSink> {
        let shown = path.display();
        let mut existing = Existing::default();
        // Only a regular file holds earlier results: a device or a pipe
        // (/dev/null, /dev/stdout) would be read forever or consumed.
        let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
        if let Some(f) = regular.then(|| std::fs::File::open(path).ok()).flatten() {
            existing = Existing::read(std::io::BufReader::new(f))
                .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: reading the results already in it failed: {e}"))?;
            if let Some(first) = existing.first_skipped {
                tracing::warn!(
                    path = %shown,
                    lines = existing.skipped,
                    first_line = first,
                    "lines of the results file that are not result records were skipped: their keys are not known, so those results may be written again"
                );
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: cannot be opened for appending: {e}"))?;
        if existing.torn {
            // The last write was cut short: the next result starts a line of its own.
            file.write_all(b"\n")
                .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: cannot end its last line: {e}"))?;
        }
        let synced = file.metadata().is_ok_and(|m| m.is_file());
        Ok(JsonlSink {
            path: path.to_path_buf(),
            synced,
            inner: Mutex::new(Inner {
                file: std::io::BufWriter::new(file),
                seen: existing.seen,
                order: existing.order,
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
        let shown = self.path.display();
        i.file
            .flush()
            .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: writing results failed: {e}"))?;
        if self.synced {
            i.file
                .get_ref()
                .sync_data()
                .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: syncing results to disk failed: {e}"))?;
        }
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

    #[test]
    fn an_existing_file_is_read_in_bounded_lines_whatever_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let good = serde_json::to_string(&rec("t1", "a")).unwrap();
        let mut bytes = format!("{good}\n\n").into_bytes();
        bytes.extend_from_slice(b"\xff\xfe not utf-8\n");
        bytes.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        bytes.push(b'\n');
        // The last line was cut short by a crash.
        bytes.extend_from_slice(&good.as_bytes()[..good.len() / 2]);
        std::fs::write(&p, &bytes).unwrap();
        let ex = Existing::read(std::io::BufReader::new(std::fs::File::open(&p).unwrap())).unwrap();
        assert_eq!((ex.seen.len(), ex.skipped, ex.first_skipped, ex.torn), (1, 3, Some(3), true));
        let s = JsonlSink::open(&p).unwrap();
        s.write(&[rec("t1", "a"), rec("t2", "a")]).unwrap();
        assert_eq!(s.counts(), (1, 1), "the key of the readable line is known");
        drop(s);
        // The new result starts a line of its own, after the torn one.
        let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["trace_id"], "t2");
    }

    #[test]
    fn lines_longer_than_the_read_buffer_are_whole_and_not_torn() {
        let good = serde_json::to_string(&rec("t1", "a")).unwrap();
        let text = format!("{good}\n{good}\n");
        // A buffer of 16 bytes: every line spans several reads.
        let ex = Existing::read(std::io::BufReader::with_capacity(16, text.as_bytes())).unwrap();
        assert_eq!((ex.seen.len(), ex.skipped, ex.torn), (1, 0, false));
    }

    #[test]
    fn a_device_is_written_to_without_being_read() {
        let s = JsonlSink::open(Path::new("/dev/null")).unwrap();
        s.write(&[rec("t1", "a")]).unwrap();
        assert_eq!(s.counts(), (1, 0));
        // A drain syncs regular files only: fsync on a device fails.
        s.sync().unwrap();
    }

    #[test]
    fn a_pipe_is_written_to_and_drained() {
        let (reader, writer) = std::io::pipe().unwrap();
        let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&writer)));
        let s = JsonlSink::open(&path).unwrap();
        s.write(&[rec("t1", "a")]).unwrap();
        s.sync().unwrap();
        drop((s, writer));
        let text = std::io::read_to_string(reader).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
