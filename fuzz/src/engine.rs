//! One running `attest-engine serve` process, driven over pipes.
//!
//! stdin is written by its own thread, so a stalled engine (back-pressure, a
//! hang) never blocks the fuzzer's clock; stdout is split into lines by
//! another thread, which keeps at most [`KEEP_BYTES`] of a line but counts
//! all of it, so an endless line costs bounded memory; stderr is kept as a
//! short tail for reproducer notes.

use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most of one stdout line kept in memory (longer lines are still measured).
pub const KEEP_BYTES: usize = 16 << 20;
const STDERR_TAIL: usize = 16 << 10;

/// Environment variables the engine reads; cleared so the host's settings
/// cannot change what the fuzzer sees.
const ENGINE_ENV: &[&str] = &[
    "ATTEST_CONFIG",
    "ATTEST_LOG_LEVEL",
    "ATTEST_EVAL_TIMEOUT",
    "ATTEST_MAX_CONCURRENT_REQUESTS",
    "ATTEST_STRICT_STEP_TYPES",
    "ATTEST_PLUGIN_DIR",
    "ATTEST_HISTORY",
    "ATTEST_DRIFT_ALERTS",
    "ATTEST_DRIFT_WEBHOOK_URL",
    "ATTEST_EMBEDDING_PROVIDER",
    "ATTEST_EMBEDDING_BASE_URL",
    "ATTEST_EMBEDDING_API_KEY",
    "ATTEST_EMBEDDING_MODEL",
    "ATTEST_EMBEDDING_MODEL_DIR",
    "ATTEST_JUDGE_PROVIDER",
    "ATTEST_JUDGE_BASE_URL",
    "ATTEST_JUDGE_API_KEY",
    "ATTEST_JUDGE_MODEL",
    "ATTEST_JUDGE_SAMPLES",
    "ATTEST_OPENAI_API_KEY",
    "ATTEST_ANTHROPIC_API_KEY",
    "ATTEST_CACHE_DIR",
];

/// How to start the engine.
#[derive(Debug, Clone)]
pub struct Launch {
    pub binary: PathBuf,
    pub eval_timeout: Duration,
    /// A private directory for the engine's caches and history.
    pub work_dir: PathBuf,
    /// Base URL of an OpenAI-compatible provider for layers 5 and 6, if any.
    pub provider_url: Option<String>,
    pub drain_timeout: Duration,
}

/// Something read from stdout.
#[derive(Debug)]
pub enum Event {
    /// One line: the kept bytes and the full length (without `\n`).
    Line(Vec<u8>, usize),
    /// stdout closed.
    Eof,
}

pub struct Engine {
    child: Child,
    stdin: Option<Sender<Vec<u8>>>,
    events: Receiver<Event>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    pub eof: bool,
}

impl Engine {
    pub fn spawn(launch: &Launch) -> Result<Engine> {
        let config = launch.work_dir.join("engine.toml");
        std::fs::write(
            &config,
            format!(
                "drain_timeout = \"{}ms\"\n[providers]\nattempt_timeout = \"1s\"\n",
                launch.drain_timeout.as_millis()
            ),
        )?;
        let mut cmd = Command::new(&launch.binary);
        for var in ENGINE_ENV {
            cmd.env_remove(var);
        }
        cmd.env("ATTEST_CACHE_DIR", launch.work_dir.join("cache"))
            // Never load a local model from the user's home directory.
            .env("ATTEST_EMBEDDING_MODEL_DIR", launch.work_dir.join("no-model"));
        if let Some(url) = &launch.provider_url {
            cmd.env("ATTEST_EMBEDDING_BASE_URL", url)
                .env("ATTEST_EMBEDDING_API_KEY", "fuzz")
                .env("ATTEST_JUDGE_BASE_URL", url)
                .env("ATTEST_JUDGE_API_KEY", "fuzz");
        }
        cmd.arg("--log-level=warn")
            .arg("--config")
            .arg(&config)
            .arg("--eval-timeout")
            .arg(format!("{}ms", launch.eval_timeout.as_millis()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {}", launch.binary.display()))?;

        let mut stdin = child.stdin.take().expect("piped stdin");
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for chunk in rx {
                // A dead or exiting engine closes the pipe; the fuzzer learns
                // about it from stdout and the exit status instead.
                if stdin.write_all(&chunk).and_then(|()| stdin.flush()).is_err() {
                    break;
                }
            }
        });

        let mut stdout = child.stdout.take().expect("piped stdout");
        let (etx, events) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            let mut line = Vec::new();
            let mut len = 0usize;
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut rest = &buf[..n];
                while let Some(at) = rest.iter().position(|&b| b == b'\n') {
                    keep(&mut line, &rest[..at]);
                    len += at;
                    if etx.send(Event::Line(std::mem::take(&mut line), len)).is_err() {
                        return;
                    }
                    len = 0;
                    rest = &rest[at + 1..];
                }
                keep(&mut line, rest);
                len += rest.len();
            }
            if len > 0 {
                let _ = etx.send(Event::Line(line, len));
            }
            let _ = etx.send(Event::Eof);
        });

        let mut stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let sink = tail.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = sink.lock().expect("stderr tail lock");
                t.extend(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
        });

        Ok(Engine {
            child,
            stdin: Some(tx),
            events,
            stderr: tail,
            eof: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Queues bytes for stdin (never blocks).
    pub fn send(&self, bytes: Vec<u8>) {
        if let Some(tx) = &self.stdin {
            let _ = tx.send(bytes);
        }
    }

    /// Closes stdin once everything queued has been written.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout event, or `None` at `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Option<Event> {
        if self.eof {
            return None;
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(wait) {
            Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                Some(Event::Eof)
            }
            Ok(e) => Some(e),
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// Polls for the process to exit until `limit` has passed.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills this engine (our own child, by its handle) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Peak resident set size in KiB (`VmHWM`), falling back to `VmRSS`.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        peak_rss_kib(&Path::new("/proc").join(self.pid().to_string()).join("status"))
    }

    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().expect("stderr tail lock");
        String::from_utf8_lossy(&t.iter().copied().collect::<Vec<_>>()).into_owned()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

fn keep(line: &mut Vec<u8>, bytes: &[u8]) {
    let room = KEEP_BYTES.saturating_sub(line.len());
    line.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

fn peak_rss_kib(status: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
    };
    field("VmHWM:").or_else(|| field("VmRSS:"))
}
