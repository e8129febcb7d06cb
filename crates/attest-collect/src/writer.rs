//! Appending lines to an output file (`--results-jsonl`, `--traces-out`)
//! without ever blocking the async runtime. The file may be a pipe whose
//! reader stopped, or a hung disk: a `write(2)` on it can block forever, and
//! a runtime thread blocked there (or on a lock held across it) would stop
//! exports, `/metrics` and signal handling with it. So one OS thread per
//! file does the writing, fed by a queue bounded in entries and bytes
//! ([`QUEUE_ENTRIES`], [`QUEUE_BYTES`]). When the queue is full the lines
//! are dropped and counted, never waited for; at shutdown, what is queued
//! gets at most [`DRAIN_TIMEOUT`] to be written, and the rest is counted as
//! lost.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{InternalEvent, LogThrottle, LostCause, OutputLost};
use crate::metrics::Metrics;

/// Writes queued per output file (a write is one trace's results, or one trace).
pub const QUEUE_ENTRIES: usize = 4096;
/// Bytes queued per output file. One entry larger than this is still taken
/// when the queue is empty, so that no trace is refused for its size alone.
pub const QUEUE_BYTES: usize = 64 << 20;
/// Longest a drain waits for the queued lines to be written and synced.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Which file a writer feeds: it decides the counter its losses go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// `--results-jsonl`: lost lines count in `attest_collect_results_dropped_total{reason}`.
    Results,
    /// `--traces-out`: lost traces count in `attest_collect_traces_out_dropped_total{reason}`.
    Traces,
}

impl Output {
    pub fn flag(self) -> &'static str {
        match self {
            Output::Results => "--results-jsonl",
            Output::Traces => "--traces-out",
        }
    }

    pub(crate) fn what(self) -> &'static str {
        match self {
            Output::Results => "result lines",
            Output::Traces => "traces",
        }
    }

    pub(crate) fn count(self, metrics: &Metrics, reason: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        match self {
            Output::Results => metrics.results_dropped(reason, n),
            Output::Traces => metrics.traces_out_dropped(reason, n),
        }
    }
}

/// Why a write was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue holds [`QUEUE_ENTRIES`] writes or [`QUEUE_BYTES`] already:
    /// the file takes lines slower than they come.
    Full,
    /// The writing thread is gone (it cannot be, short of a bug).
    Closed,
}

/// What the writing thread reports back for a write that asked for it.
pub type Written = tokio::sync::oneshot::Receiver<Result<(), String>>;

struct Entry {
    bytes: Vec<u8>,
    lines: u64,
    done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

struct Shared {
    output: Output,
    shown: String,
    metrics: Arc<Metrics>,
    /// Bytes and lines queued or being written.
    queued_bytes: AtomicUsize,
    queued_lines: AtomicU64,
    /// Writes queued, and writes done (written or failed), in order.
    sent: AtomicU64,
    done: tokio::sync::watch::Sender<u64>,
    /// Bumped whenever room is made: an entry taken off the queue, or written.
    room: tokio::sync::watch::Sender<u64>,
    /// Lines refused or lost, over the file's life, for the summary line.
    lost: AtomicU64,
    log: LogThrottle,
    /// Buffers written and emptied, for the next writes to fill: built on
    /// one thread and freed on this one, each new buffer was fresh pages
    /// the kernel had to clear. At most [`SPARE_BUFFERS`] of at most
    /// [`SPARE_BUFFER_BYTES`] each are kept.
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Emptied buffers kept for reuse, and the largest kept.
const SPARE_BUFFERS: usize = 4;
const SPARE_BUFFER_BYTES: usize = 4 << 20;

impl Shared {
    /// Counts lines lost (`counted`: unless their writer retries them),
    /// for the summary and the metrics, and says so (throttled).
    fn lose(&self, lines: u64, cause: LostCause<'_>, counted: bool) {
        if lines == 0 {
            return;
        }
        if counted {
            self.lost.fetch_add(lines, Ordering::Relaxed);
        }
        OutputLost {
            output: self.output,
            file: &self.shown,
            lines,
            cause,
            counted,
        }
        .emit_throttled(&self.metrics, &self.log);
    }
}

/// An output file written by a thread of its own (see the module's doc).
pub struct FileWriter {
    tx: SyncSender<Entry>,
    shared: Arc<Shared>,
    /// The file again, to sync it at a drain; `None` for a device or a pipe,
    /// which cannot be synced and holds nothing to make durable.
    sync: Option<std::fs::File>,
}

impl FileWriter {
    /// Starts the writing thread for `file`, already opened for appending.
    pub fn start(output: Output, path: &Path, file: std::fs::File, metrics: Arc<Metrics>) -> std::io::Result<FileWriter> {
        FileWriter::with_limits(output, path, file, metrics, QUEUE_ENTRIES)
    }

    fn with_limits(output: Output, path: &Path, file: std::fs::File, metrics: Arc<Metrics>, entries: usize) -> std::io::Result<FileWriter> {
        let sync = if file.metadata().is_ok_and(|m| m.is_file()) {
            Some(file.try_clone()?)
        } else {
            None
        };
        let (tx, rx) = mpsc::sync_channel::<Entry>(entries);
        let shared = Arc::new(Shared {
            output,
            shown: path.display().to_string(),
            metrics,
            queued_bytes: AtomicUsize::new(0),
            queued_lines: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            done: tokio::sync::watch::channel(0).0,
            room: tokio::sync::watch::channel(0).0,
            lost: AtomicU64::new(0),
            log: LogThrottle::default(),
            spare: Mutex::new(Vec::with_capacity(SPARE_BUFFERS)),
        });
        let thread_shared = shared.clone();
        // Never joined: at exit the process does not wait for a write that
        // may never return (the drain below has its own deadline).
        std::thread::Builder::new()
            .name(
                match output {
                    Output::Results => "results-writer",
                    Output::Traces => "traces-writer",
                }
                .into(),
            )
            .spawn(move || write_loop(file, rx, &thread_shared))?;
        Ok(FileWriter { tx, shared, sync })
    }

    /// Queues `bytes` (`lines` whole lines) for writing, or refuses them at
    /// once when the queue is full. Refused lines are not counted here: the
    /// caller knows whether they are lost or will be offered again.
    /// An empty buffer to fill with lines for [`FileWriter::try_write`]: one
    /// an earlier write emptied, when there is one.
    pub fn buffer(&self) -> Vec<u8> {
        self.shared
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }

    pub fn try_write(&self, bytes: Vec<u8>, lines: u64, confirm: bool) -> Result<Option<Written>, Refused> {
        let len = bytes.len();
        let before = self.shared.queued_bytes.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before + len > QUEUE_BYTES {
            self.shared.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            return Err(Refused::Full);
        }
        let (done, written) = if confirm {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.shared.queued_lines.fetch_add(lines, Ordering::AcqRel);
        // Counted as sent before the thread can finish it, so that the
        // count of writes done never passes the count sent.
        self.shared.sent.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(Entry { bytes, lines, done }) {
            Ok(()) => Ok(written),
            Err(e) => {
                self.shared.sent.fetch_sub(1, Ordering::AcqRel);
                self.shared.queued_lines.fetch_sub(lines, Ordering::AcqRel);
                self.shared.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                Err(match e {
                    TrySendError::Full(_) => Refused::Full,
                    TrySendError::Disconnected(_) => Refused::Closed,
                })
            }
        }
    }

    /// [`FileWriter::try_write`], waiting up to `wait` for room when the
    /// queue is full (a `--jsonl` run, which reads its input no faster than
    /// the file takes results, rather than dropping them).
    pub async fn write_waiting(&self, bytes: Vec<u8>, lines: u64, confirm: bool, wait: Duration) -> Result<Option<Written>, Refused> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut room = self.shared.room.subscribe();
        loop {
            // Marked seen first: room made between the attempt and the wait
            // below wakes the wait.
            room.borrow_and_update();
            match self.try_write(bytes.clone(), lines, confirm) {
                Err(Refused::Full) => {}
                other => return other,
            }
            match tokio::time::timeout_at(deadline, room.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Refused::Closed),
                Err(_) => return Err(Refused::Full),
            }
        }
    }

    /// Counts lines that were refused and will not be offered again, and
    /// says so on stderr (throttled).
    pub fn lost_to_full_queue(&self, lines: u64) {
        self.shared.lose(
            lines,
            LostCause::QueueFull {
                entries: QUEUE_ENTRIES,
                bytes: QUEUE_BYTES,
            },
            true,
        );
    }

    /// Lines refused or lost so far (queue full, write failed, not written by a drain's deadline).
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for everything queued so far to be written,
    /// then syncs a regular file to disk (within the same deadline). What is
    /// still queued at the deadline is counted as lost (`shutdown`). Errs
    /// when anything was lost over the file's life, naming how much.
    pub async fn drain(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let target = self.shared.sent.load(Ordering::Acquire);
        let mut done = self.shared.done.subscribe();
        let written = tokio::time::timeout_at(deadline, done.wait_for(|&n| n >= target))
            .await
            .map(|r| r.is_ok());
        let shown = &self.shared.shown;
        let flag = self.shared.output.flag();
        if written.is_err() {
            let pending = self.shared.queued_lines.load(Ordering::Acquire);
            self.shared.lose(pending, LostCause::Stalled(timeout), true);
        } else if let Some(file) = &self.sync {
            // On a thread of its own: a sync on a hung disk may not return.
            let file = file.try_clone()?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new().name("attest-collect-sync".into()).spawn(move || {
                let _ = tx.send(file.sync_data());
            })?;
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => anyhow::bail!("{flag} {shown}: syncing to disk failed: {e}"),
                Ok(Err(_)) | Err(_) => anyhow::bail!("{flag} {shown}: syncing to disk did not finish within {timeout:?}"),
            }
        }
        match self.lost() {
            0 => Ok(()),
            n => anyhow::bail!(
                "{flag} {shown}: {n} {} were not written (the write queue was full, a write failed, or the drain's deadline passed; see attest_collect_{}_dropped_total)",
                self.shared.output.what(),
                match self.shared.output {
                    Output::Results => "results",
                    Output::Traces => "traces_out",
                }
            ),
        }
    }
}

fn write_loop(mut file: std::fs::File, rx: mpsc::Receiver<Entry>, shared: &Shared) {
    // One write per entry: an entry is whole lines, so a failure loses
    // those lines and no other, and no line is split across entries.
    // A regular file's length before each write: a write that fails part
    // way (a full disk) is cut back to it, so the next line never lands on
    // the end of a torn one. Pipes have no length and nothing to cut.
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    while let Ok(entry) = rx.recv() {
        shared.room.send_modify(|n| *n += 1);
        let before = regular.then(|| file.metadata().map(|m| m.len()).ok()).flatten();
        let mut result = file.write_all(&entry.bytes).map_err(|e| e.to_string());
        if let (Err(e), Some(len)) = (&mut result, before) {
            if let Err(cut) = file.set_len(len) {
                e.push_str(&format!("; cutting the file back to its last whole line failed too: {cut}"));
            }
        }
        shared.queued_bytes.fetch_sub(entry.bytes.len(), Ordering::AcqRel);
        shared.queued_lines.fetch_sub(entry.lines, Ordering::AcqRel);
        // A write asked to confirm is retried by its caller, which counts
        // it; others, and those whose caller stopped waiting, are lost here.
        let caller_counts = entry.done.is_some_and(|done| done.send(result.clone()).is_ok());
        if let Err(e) = &result {
            shared.lose(entry.lines, LostCause::WriteFailed(e), !caller_counts);
        }
        let mut bytes = entry.bytes;
        if bytes.capacity() <= SPARE_BUFFER_BYTES {
            bytes.clear();
            let mut spare = shared.spare.lock().unwrap_or_else(|e| e.into_inner());
            if spare.len() < SPARE_BUFFERS {
                spare.push(bytes);
            }
        }
        shared.done.send_modify(|n| *n += 1);
        shared.room.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn pipe_writer(entries: usize) -> (std::io::PipeReader, FileWriter, Arc<Metrics>) {
        let (reader, writer) = std::io::pipe().unwrap();
        let metrics = Arc::new(Metrics::default());
        let file = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
        let w = FileWriter::with_limits(Output::Traces, Path::new("pipe"), file, metrics.clone(), entries).unwrap();
        (reader, w, metrics)
    }

    #[tokio::test]
    async fn a_stalled_reader_fills_the_queue_which_refuses_at_once_and_drains_by_its_deadline() {
        // Nobody reads: the pipe's buffer (64 KiB) fills, the thread blocks
        // in write(2), then the queue fills.
        let (reader, w, metrics) = pipe_writer(4);
        let line = vec![b'x'; 100 << 10];
        let started = Instant::now();
        let mut refused = 0;
        for _ in 0..20 {
            match w.try_write(line.clone(), 1, false) {
                Ok(_) => {}
                Err(Refused::Full) => {
                    refused += 1;
                    w.lost_to_full_queue(1);
                }
                Err(Refused::Closed) => panic!("closed"),
            }
        }
        assert!(started.elapsed() < Duration::from_secs(1), "never waits");
        assert!(refused >= 14, "{refused}");
        let e = w.drain(Duration::from_millis(300)).await.unwrap_err().to_string();
        assert!(e.contains("--traces-out pipe") && e.contains("were not written"), "{e}");
        let m = metrics.render();
        assert!(
            m.contains(&format!(
                "attest_collect_traces_out_dropped_total{{reason=\"queue_full\"}} {refused}"
            )),
            "{m}"
        );
        assert!(m.contains("attest_collect_traces_out_dropped_total{reason=\"shutdown\"}"), "{m}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(reader);
    }

    #[tokio::test]
    async fn lines_reach_a_reading_pipe_in_order_and_a_drain_waits_for_them() {
        let (reader, w, metrics) = pipe_writer(QUEUE_ENTRIES);
        let read = std::thread::spawn(move || std::io::read_to_string(reader).unwrap());
        for i in 0..1000 {
            w.try_write(format!("{i}\n").into_bytes(), 1, false).unwrap();
        }
        let confirmed = w.try_write(b"last\n".to_vec(), 1, true).unwrap().unwrap();
        assert_eq!(confirmed.await.unwrap(), Ok(()));
        w.drain(Duration::from_secs(5)).await.unwrap();
        drop(w);
        let text = read.join().unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!((lines.len(), lines[0], lines[999], lines[1000]), (1001, "0", "999", "last"));
        assert!(!metrics.render().contains("traces_out_dropped_total{"));
    }

    #[tokio::test]
    async fn a_write_may_wait_for_room_up_to_its_deadline() {
        let (reader, w, _) = pipe_writer(1);
        let line = vec![b'x'; 100 << 10];
        // Fills the pipe's buffer and blocks the thread, then fills the queue.
        w.try_write(line.clone(), 1, false).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        while w.try_write(line.clone(), 1, false).is_ok() {
            assert!(started.elapsed() < Duration::from_secs(5));
        }
        let r = w.write_waiting(line.clone(), 1, false, Duration::from_millis(200)).await;
        assert_eq!(r.unwrap_err(), Refused::Full, "no room within the wait");
        // A reader comes: room is made, and the waiting write is queued.
        let read = std::thread::spawn(move || std::io::read_to_string(reader).unwrap().len());
        w.write_waiting(line, 1, false, Duration::from_secs(10)).await.unwrap();
        w.drain(Duration::from_secs(10)).await.unwrap();
        drop(w);
        let n = read.join().unwrap();
        assert!(n >= 3 * (100 << 10), "{n}");
    }

    /// A full disk: a 64 KiB tmpfs (needs root; skipped, and said, elsewhere).
    #[tokio::test]
    async fn a_write_cut_short_by_a_full_disk_leaves_only_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a small tmpfs here (not root)");
            return;
        }
        let path = dir.path().join("results.jsonl");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let w = FileWriter::start(Output::Results, &path, file, Arc::new(Metrics::default())).unwrap();
        // Lines of 10,000 bytes, two to an entry, until the disk is full.
        let mut line = vec![b'x'; 9_999];
        line.push(b'\n');
        let entry = [line.clone(), line].concat();
        let mut failed = 0;
        for _ in 0..8 {
            let done = w.try_write(entry.clone(), 2, true).unwrap().unwrap();
            failed += usize::from(done.await.unwrap().is_err());
        }
        let text = std::fs::read(&path).unwrap();
        let _ = std::process::Command::new("umount").arg(dir.path()).status();
        assert!(failed > 0, "the disk never filled");
        assert_eq!(text.len() % 20_000, 0, "{} bytes: a torn entry was left", text.len());
        assert!(text.is_empty() || text.ends_with(b"\n"));
    }

    #[tokio::test]
    async fn a_failing_write_is_counted_and_reported_to_who_asked() {
        let metrics = Arc::new(Metrics::default());
        let full = std::fs::OpenOptions::new().append(true).open("/dev/full").unwrap();
        let w = FileWriter::start(Output::Results, Path::new("/dev/full"), full, metrics.clone()).unwrap();
        w.try_write(b"a\nb\n".to_vec(), 2, false).unwrap();
        let confirmed = w.try_write(b"c\n".to_vec(), 1, true).unwrap().unwrap();
        assert!(confirmed.await.unwrap().is_err());
        let e = w.drain(Duration::from_secs(5)).await.unwrap_err().to_string();
        assert!(e.contains("2 result lines were not written"), "{e}");
        assert_eq!(
            metrics.results_dropped_count("write_failed"),
            2,
            "the confirmed write is its caller's to count"
        );
    }
}
