//! The JSONL results sink: one line per assertion result, appended, and
//! idempotent on (trace id, rule, assertion id) — a key already in the file is
//! never written again, also across restarts (the file is the index). The
//! lines are written by a thread of their own ([`crate::writer`]).

use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::writer::{FileWriter, Output, Refused};
use crate::{BoxFuture, ResultKey, ResultRecord, ResultStore};

/// Keys remembered for de-duplication; past this the oldest are forgotten
/// (redeliveries happen within minutes, so old keys are not needed).
pub const DEDUPE_KEYS: usize = 1_000_000;

pub struct JsonlSink {
    path: PathBuf,
    /// Writes the lines on a thread of its own (see [`crate::writer`]): a
    /// stalled pipe or disk never blocks the runtime.
    writer: FileWriter,
    wait: Wait,
    inner: Mutex<Inner>,
}

/// What [`ResultStore::record`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Nothing: the lines are queued, or dropped and counted when the queue
    /// is full. The OTLP collector, which has no one to offer them again
    /// and must not hold evaluation on a stalled file.
    Queued,
    /// Room in the queue, up to this long, then as `Queued`. A `--jsonl`
    /// run, which can slow down to the file's pace.
    Room(Duration),
    /// The lines written, up to this long; a failure or a full queue is
    /// returned, not counted, for the caller to offer them again. A
    /// worker's sink, which acks a message only once it is stored.
    Written(Duration),
}

struct Inner {
    keys: RecentKeys,
    written: u64,
    duplicates: u64,
}

/// The keys of the last [`DEDUPE_KEYS`] results written, oldest first out,
/// each held as a 128-bit hash of its three ids: 16 bytes a key instead of
/// three strings twice over (a false match needs about 2^64 keys).
#[derive(Default)]
struct RecentKeys {
    seen: HashSet<KeyHash>,
    order: VecDeque<KeyHash>,
}

/// A [`ResultKey`]'s three ids, hashed together, each ended by a 0 byte
/// (which no id holds) so that no two keys run into one another.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct KeyHash(u128);

impl KeyHash {
    fn of(key: &ResultKey) -> KeyHash {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for id in [&key.trace_id, &key.rule, &key.assertion_id] {
            h.update(id.as_bytes());
            h.update(&[0]);
        }
        KeyHash(h.digest128())
    }
}

impl RecentKeys {
    /// Remembers `key`; false when it was remembered already.
    fn remember(&mut self, key: &ResultKey) -> bool {
        let k = KeyHash::of(key);
        if !self.seen.insert(k) {
            return false;
        }
        self.order.push_back(k);
        if self.order.len() > DEDUPE_KEYS {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }

    /// Forgets keys whose lines were not written, so that they are written
    /// when offered again.
    fn forget(&mut self, keys: &[&ResultKey]) {
        for k in keys.iter().map(|k| KeyHash::of(k)) {
            if self.seen.remove(&k) {
                if let Some(i) = self.order.iter().rposition(|o| *o == k) {
                    self.order.remove(i);
                }
            }
        }
    }
}

/// Longest line of an existing results file that is read for its key. A
/// result line is a few kilobytes; a longer one is not ours, and is skipped
/// without being held in memory.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Keys of the results already in a file, and what reading it found.
#[derive(Default)]
struct Existing {
    keys: RecentKeys,
    /// Lines that are not result records (or over [`MAX_LINE_BYTES`]), and the first one's number.
    skipped: u64,
    first_skipped: Option<u64>,
    /// The file ends without a line break: a write cut short.
    torn: bool,
}

impl Existing {
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
            Ok(r) if !too_long => {
                self.keys.remember(&r.key);
            }
            _ => {
                self.skipped += 1;
                self.first_skipped.get_or_insert(number);
            }
        }
    }
}

impl JsonlSink {
    /// Opens (creating) `path` for appending and loads the keys already in
    /// it. `wait` says what [`ResultStore::record`] waits for.
    pub fn open(path: &Path, metrics: Arc<Metrics>, wait: Wait) -> anyhow::Result<JsonlSink> {
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
            // The last write was cut short: the next result starts a line
            // of its own. A regular file, so this write does not block.
            file.write_all(b"\n")
                .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: cannot end its last line: {e}"))?;
        }
        let writer = FileWriter::start(Output::Results, path, file, metrics)
            .map_err(|e| anyhow::anyhow!("--results-jsonl {shown}: cannot start its writer: {e}"))?;
        Ok(JsonlSink {
            path: path.to_path_buf(),
            writer,
            wait,
            inner: Mutex::new(Inner {
                keys: existing.keys,
                written: 0,
                duplicates: 0,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (lines handed to the writer, duplicates skipped) since opening.
    pub fn counts(&self) -> (u64, u64) {
        let i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (i.written, i.duplicates)
    }

    /// Lines refused or lost so far.
    pub fn lost(&self) -> u64 {
        self.writer.lost()
    }

    async fn write(&self, results: &[ResultRecord]) -> anyhow::Result<()> {
        let shown = self.path.display();
        let mut bytes = self.writer.buffer();
        let mut keys: Vec<&ResultKey> = Vec::with_capacity(results.len());
        {
            let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            // Remembered before the write is done, so that a copy offered
            // meanwhile (or later in this batch) is a duplicate, and
            // forgotten if the write is not done.
            for r in results {
                if !i.keys.remember(&r.key) {
                    i.duplicates += 1;
                    continue;
                }
                if let Err(e) = serde_json::to_writer(&mut bytes, r) {
                    keys.push(&r.key);
                    i.keys.forget(&keys);
                    return Err(e.into());
                }
                bytes.push(b'\n');
                keys.push(&r.key);
            }
            if keys.is_empty() {
                return Ok(());
            }
            i.written += keys.len() as u64;
        }
        let lines = keys.len() as u64;
        let forget = |why: String| {
            let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            i.keys.forget(&keys);
            i.written -= lines;
            anyhow::anyhow!("--results-jsonl {shown}: {why}")
        };
        let confirm = matches!(self.wait, Wait::Written(_));
        let queued = match self.wait {
            Wait::Room(wait) => self.writer.write_waiting(bytes, lines, false, wait).await,
            _ => self.writer.try_write(bytes, lines, confirm),
        };
        let written = match queued {
            Ok(written) => written,
            Err(refused) => {
                let e = forget(match refused {
                    Refused::Full => format!("the write queue is full; {lines} result lines not written"),
                    Refused::Closed => format!("the writer has stopped; {lines} result lines not written"),
                });
                if !confirm {
                    // Nobody offers them again: lost, counted and said.
                    self.writer.lost_to_full_queue(lines);
                }
                return Err(e);
            }
        };
        let (Some(written), Wait::Written(wait)) = (written, self.wait) else {
            return Ok(());
        };
        match tokio::time::timeout(wait, written).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(forget(format!("writing {lines} result lines failed: {e}"))),
            Ok(Err(_)) => Err(forget("the writer has stopped".into())),
            // Still queued, and perhaps never written: the keys are
            // forgotten, so that a copy offered again is written (twice,
            // if this one is written after all, rather than acked unwritten).
            Err(_) => Err(forget(format!("{lines} result lines not written within {wait:?}"))),
        }
    }
}

impl ResultStore for JsonlSink {
    /// How long it waits is the sink's own [`Wait`], chosen with the
    /// process's role, whatever `durability` the caller names.
    fn record<'a>(&'a self, results: &'a [ResultRecord], _durability: crate::Durability) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.write(results))
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.writer.drain(crate::writer::DRAIN_TIMEOUT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(trace: &str, a: &str) -> ResultRecord {
        ResultRecord::passing(trace, "r", a)
    }

    fn open(p: &Path) -> JsonlSink {
        JsonlSink::open(p, Arc::new(Metrics::default()), Wait::Queued).unwrap()
    }

    /// Queues the results and waits for them to be written.
    async fn write(s: &JsonlSink, results: &[ResultRecord]) {
        s.record(results, crate::Durability::Committed).await.unwrap();
        s.flush().await.unwrap();
    }

    #[tokio::test]
    async fn same_key_is_written_once_also_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let s = open(&p);
        write(&s, &[rec("t1", "a"), rec("t1", "b"), rec("t1", "b")]).await;
        write(&s, &[rec("t1", "a")]).await;
        assert_eq!(s.counts(), (2, 2));
        drop(s);
        let s = open(&p);
        write(&s, &[rec("t1", "b"), rec("t2", "a")]).await;
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

    #[tokio::test]
    async fn an_existing_file_is_read_in_bounded_lines_whatever_it_holds() {
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
        assert_eq!((ex.keys.seen.len(), ex.skipped, ex.first_skipped, ex.torn), (1, 3, Some(3), true));
        let s = open(&p);
        write(&s, &[rec("t1", "a"), rec("t2", "a")]).await;
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
        assert_eq!((ex.keys.seen.len(), ex.skipped, ex.torn), (1, 0, false));
    }

    #[tokio::test]
    async fn a_device_is_written_to_without_being_read() {
        let s = open(Path::new("/dev/null"));
        write(&s, &[rec("t1", "a")]).await;
        assert_eq!(s.counts(), (1, 0));
    }

    #[tokio::test]
    async fn a_pipe_is_written_to_and_drained() {
        let (reader, writer) = std::io::pipe().unwrap();
        let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&writer)));
        let s = open(&path);
        write(&s, &[rec("t1", "a")]).await;
        drop((s, writer));
        let text = std::io::read_to_string(reader).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[tokio::test]
    async fn a_write_that_fails_is_not_remembered_and_is_written_when_offered_again() {
        let metrics = Arc::new(Metrics::default());
        let s = JsonlSink::open(Path::new("/dev/full"), metrics.clone(), Wait::Written(Duration::from_secs(5))).unwrap();
        let e = s
            .record(&[rec("t1", "a")], crate::Durability::Committed)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("--results-jsonl /dev/full: writing 1 result lines failed"), "{e}");
        assert_eq!(s.counts(), (0, 0), "forgotten: a retry writes it");
        let e = s
            .record(&[rec("t1", "a")], crate::Durability::Committed)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("failed"), "{e}");
    }
}
