//! Shared harness for the integration tests: spawns the real `attest-engine`
//! binary with piped stdio and talks NDJSON to it.
//!
//! stdout is read by a dedicated thread that forwards every line over a
//! channel, so a test waiting for a response fails after a timeout instead of
//! blocking forever when the engine hangs or stays silent.

#![allow(dead_code)]

pub mod fake_provider;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_attest-engine");
/// The engine's version (the tests belong to the same package).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// How long a test waits for one response line before failing.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// SDK readers fail on response lines longer than this (excluding `\n`).
pub const MAX_RESPONSE_LINE: usize = 65_536;
/// Attest protocol v1 §7 limits.
pub const MAX_TRACE_BYTES: usize = 10_485_760;
pub const MAX_STEPS: usize = 10_000;
pub const MAX_OUTPUT_CHARS: usize = 500_000;
pub const MAX_STEP_RESULT_BYTES: usize = 1_048_576;
/// Longest accepted request line: the trace limit plus 1 MiB of envelope.
pub const MAX_LINE_BYTES: usize = MAX_TRACE_BYTES + 1024 * 1024;

/// Environment variables the engine reads; cleared so the host cannot change results.
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
    "ATTEST_JUDGE_PROVIDER",
    "ATTEST_JUDGE_BASE_URL",
    "ATTEST_JUDGE_API_KEY",
    "ATTEST_JUDGE_MODEL",
    "ATTEST_JUDGE_SAMPLES",
    "ATTEST_OPENAI_API_KEY",
    "ATTEST_ANTHROPIC_API_KEY",
];

/// A cache directory (and so a result history) private to this test process,
/// so that tests never read or write the user's `~/.attest/cache`.
pub fn private_cache_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("creating a temporary cache directory"))
        .path()
        .to_owned()
}

/// What to do with the engine's stderr.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stderr {
    /// Read continuously into a buffer (see [`Engine::stderr_text`]).
    Drain,
    /// Keep the pipe open but never read it (a stalled log consumer).
    Stall,
}

/// A running engine process.
pub struct Engine {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Vec<u8>>,
    stdout_thread: Option<JoinHandle<()>>,
    stderr_buf: Arc<Mutex<Vec<u8>>>,
    /// Held, unread, in [`Stderr::Stall`] mode.
    _stalled_stderr: Option<ChildStderr>,
}

/// A `Command` for the binary with the engine's environment variables cleared.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    for var in ENGINE_ENV {
        cmd.env_remove(var);
    }
    cmd.env("ATTEST_CACHE_DIR", private_cache_dir());
    // Never pick up a local embedding model from the user's home directory.
    cmd.env("ATTEST_EMBEDDING_MODEL_DIR", private_cache_dir().join("no-model"));
    cmd
}

/// Runs the binary to completion with `args` and no stdin.
pub fn run(args: &[&str]) -> Output {
    command().args(args).stdin(Stdio::null()).output().expect("running attest-engine")
}

impl Engine {
    /// `attest-engine --log-level=warn` serving on stdio.
    pub fn spawn() -> Engine {
        Engine::spawn_with(&["--log-level=warn"], Stderr::Drain)
    }

    pub fn spawn_args(args: &[&str]) -> Engine {
        Engine::spawn_with(args, Stderr::Drain)
    }

    pub fn spawn_with(args: &[&str], stderr: Stderr) -> Engine {
        Engine::spawn_env(args, stderr, &[])
    }

    /// Like [`Engine::spawn_with`], with extra environment variables.
    pub fn spawn_env(args: &[&str], stderr: Stderr, env: &[(&str, &str)]) -> Engine {
        let mut cmd = command();
        cmd.args(args).envs(env.iter().copied());
        Self::start(cmd, stderr)
    }

    /// Spawns `cmd` with its stdio piped: stdout read line by line on a
    /// thread of its own, stderr drained or left to fill.
    fn start(mut cmd: Command, stderr: Stderr) -> Engine {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning attest-engine");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        let stdout_thread = std::thread::spawn(move || {
            let mut reader = BufReader::with_capacity(1 << 20, stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stderr_buf = Arc::new(Mutex::new(Vec::new()));
        let mut stalled = None;
        let pipe = child.stderr.take().expect("piped stderr");
        match stderr {
            Stderr::Drain => {
                let buf = stderr_buf.clone();
                std::thread::spawn(move || {
                    let mut pipe = pipe;
                    let mut chunk = [0u8; 8192];
                    loop {
                        match pipe.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
            Stderr::Stall => stalled = Some(pipe),
        }
        Engine {
            stdin: child.stdin.take(),
            child,
            lines,
            stdout_thread: Some(stdout_thread),
            stderr_buf,
            _stalled_stderr: stalled,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `bytes` as-is (no newline added).
    pub fn write_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        stdin.write_all(bytes).expect("writing to the engine's stdin");
        stdin.flush().expect("flushing the engine's stdin");
    }

    /// Writes one line (a `\n` is appended).
    pub fn send_line(&mut self, line: &str) {
        self.send_bytes(line.as_bytes());
    }

    /// Writes one line of raw bytes (a `\n` is appended).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        stdin.write_all(bytes).expect("writing to the engine's stdin");
        stdin.write_all(b"\n").expect("writing to the engine's stdin");
        stdin.flush().expect("flushing the engine's stdin");
    }

    /// Writes one JSON value as a compact line.
    pub fn send(&mut self, msg: &Value) {
        self.send_line(&serde_json::to_string(msg).unwrap());
    }

    /// Closes stdin (end of input for the engine).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// The next response line as raw bytes; panics after `timeout`.
    pub fn recv_bytes_within(&self, timeout: Duration) -> Vec<u8> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!(
                "no response line from the engine within {timeout:?}; stderr:\n{}",
                self.stderr_text()
            ),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "the engine closed stdout while a response was expected; stderr:\n{}",
                self.stderr_text()
            ),
        }
    }

    pub fn recv_bytes(&self) -> Vec<u8> {
        self.recv_bytes_within(TIMEOUT)
    }

    /// The next response line as text.
    pub fn recv_line(&self) -> String {
        String::from_utf8(self.recv_bytes()).expect("response lines are UTF-8")
    }

    /// The next response line, parsed.
    pub fn recv(&self) -> Value {
        let line = self.recv_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("response is not JSON ({e}): {line}"))
    }

    /// Sends `msg` and returns the next response line, parsed.
    pub fn request(&mut self, msg: &Value) -> Value {
        self.send(msg);
        self.recv()
    }

    /// Sends a successful `initialize` and returns its result.
    pub fn initialize(&mut self) -> Value {
        let resp = self.request(&initialize_request(json!("init"), init_params()));
        assert_eq!(resp["id"], json!("init"), "{resp}");
        assert!(resp.get("error").is_none(), "initialize failed: {resp}");
        resp["result"].clone()
    }

    /// Waits until stdout is closed; returns every line received until then.
    pub fn lines_until_eof(&self) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + TIMEOUT;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => out.push(line),
                Err(RecvTimeoutError::Disconnected) => return out,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "stdout still open after {TIMEOUT:?} ({} lines received); stderr:\n{}",
                    out.len(),
                    self.stderr_text()
                ),
            }
        }
    }

    /// Like [`Engine::lines_until_eof`], parsed as JSON.
    pub fn values_until_eof(&self) -> Vec<Value> {
        self.lines_until_eof()
            .into_iter()
            .map(|l| serde_json::from_slice(&l).unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&l))))
            .collect()
    }

    /// Lines already received, without waiting.
    pub fn drain_ready(&self) -> Vec<Vec<u8>> {
        self.lines.try_iter().collect()
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the engine") {
                if let Some(t) = self.stdout_thread.take() {
                    let _ = t.join();
                }
                return status;
            }
            if Instant::now() >= deadline {
                panic!("the engine did not exit within {TIMEOUT:?}; stderr:\n{}", self.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends a signal with the `kill` command.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Whether `needle` shows up on stderr within [`TIMEOUT`]. Log lines are
    /// written by the engine's logger thread, so a line may arrive after the
    /// response that followed the event.
    pub fn stderr_shows(&self, needle: &str) -> bool {
        self.stderr_until(|text| text.contains(needle))
    }

    /// Waits until `needle` is on `lines` lines of stderr (or more), up to
    /// the usual deadline. Stderr is drained by a thread of its own, so a
    /// line the engine wrote before answering may arrive after the answer.
    pub fn stderr_shows_lines(&self, needle: &str, lines: usize) -> bool {
        self.stderr_until(|text| text.lines().filter(|l| l.contains(needle)).count() >= lines)
    }

    /// Polls stderr until `done` holds for it, up to [`TIMEOUT`].
    fn stderr_until(&self, done: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + TIMEOUT;
        while !done(&self.stderr_text()) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Everything the engine wrote to stderr so far ([`Stderr::Drain`] only).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr_buf.lock().unwrap()).into_owned()
    }

    /// A field of `/proc/<pid>/status` in kB (e.g. `VmHWM`).
    pub fn proc_status_kb(&self, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("reading /proc/<pid>/status");
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap_or_else(|| panic!("{key} not in /proc/<pid>/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stdin.take();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- requests

/// Attest protocol v1 §2.1 initialize params.
pub fn init_params() -> Value {
    json!({
        "sdk_name": "attest-rust-tests",
        "sdk_version": "0.1.0",
        "protocol_version": 1,
        "required_capabilities": ["layers_1_4"],
        "preferred_encoding": "json"
    })
}

pub fn initialize_request(id: Value, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params})
}

pub fn rpc(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

pub fn shutdown_request(id: Value) -> Value {
    rpc(id, "shutdown", json!({}))
}

/// An `evaluate_batch` request.
pub fn evaluate_request(id: Value, trace: Value, assertions: Value) -> Value {
    rpc(id, "evaluate_batch", json!({"trace": trace, "assertions": assertions}))
}

/// An `evaluate_batch` request line whose trace is given as raw JSON text,
/// so the trace's exact wire size is known (`trace_text.len()`).
pub fn evaluate_line_raw(id: &str, trace_text: &str, assertions: &Value) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"evaluate_batch\",\"params\":{{\"trace\":{trace_text},\"assertions\":{}}}}}",
        json!(id),
        assertions
    )
}

/// A `submit_plugin_result` request (Attest protocol v1 §2.4 example).
pub fn plugin_request(id: Value) -> Value {
    rpc(
        id,
        "submit_plugin_result",
        json!({
            "trace_id": "trc_abc123",
            "plugin_name": "my_custom_safety_checker",
            "assertion_id": "plugin_assert_001",
            "result": {
                "status": "pass",
                "score": 0.88,
                "explanation": "Custom safety classifier returned score 0.88; above threshold 0.75.",
                "metadata": {"classifier_version": "2.1.0", "categories_checked": ["hate_speech", "violence", "pii"]}
            }
        }),
    )
}

// ---------------------------------------------------------------- fixtures

/// The refund trace of Attest protocol v1 §2.2.
pub fn refund_trace() -> Value {
    json!({
        "schema_version": 1,
        "trace_id": "trc_abc123",
        "agent_id": "customer-service-agent",
        "input": {"user_message": "I want a refund for order ORD-123", "context": {}},
        "steps": [
            {
                "type": "llm_call",
                "name": "reasoning",
                "args": {"model": "gpt-4.1", "prompt": "You are a customer service agent. User: I want a refund for order ORD-123"},
                "result": {"completion": "I need to look up the order to verify eligibility."},
                "metadata": {"duration_ms": 1200, "cost_usd": 0.003}
            },
            {
                "type": "tool_call",
                "name": "lookup_order",
                "args": {"order_id": "ORD-123"},
                "result": {"status": "delivered", "amount": 89.99, "eligible_for_refund": true},
                "metadata": {"duration_ms": 45}
            },
            {
                "type": "tool_call",
                "name": "process_refund",
                "args": {"order_id": "ORD-123", "amount": 89.99},
                "result": {"refund_id": "RFD-001", "estimated_days": 3},
                "metadata": {"duration_ms": 120}
            }
        ],
        "output": {
            "message": "Your refund of $89.99 has been processed. You'll see it in 3 business days. Refund ID: RFD-001.",
            "structured": {"refund_id": "RFD-001", "confidence": 0.95}
        },
        "metadata": {
            "total_tokens": 1350,
            "cost_usd": 0.0067,
            "latency_ms": 4200,
            "model": "gpt-4.1",
            "timestamp": "2026-02-18T10:30:00Z"
        },
        "parent_trace_id": null
    })
}

/// The five layer 1-4 assertions of Attest protocol v1 §2.2 (all pass on [`refund_trace`]),
/// without request ids.
pub fn refund_assertions() -> Value {
    json!([
        {
            "assertion_id": "assert_001",
            "type": "schema",
            "spec": {
                "target": "steps[?name=='lookup_order'].result",
                "schema": {
                    "$schema": "https://json-schema.org/draft/2020-12",
                    "type": "object",
                    "required": ["status", "amount"],
                    "properties": {"status": {"type": "string"}, "amount": {"type": "number", "minimum": 0}}
                }
            }
        },
        {
            "assertion_id": "assert_002",
            "type": "constraint",
            "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 0.01}
        },
        {
            "assertion_id": "assert_003",
            "type": "trace",
            "spec": {"check": "contains_in_order", "tools": ["lookup_order", "process_refund"]}
        },
        {
            "assertion_id": "assert_004",
            "type": "content",
            "spec": {"target": "output.message", "check": "contains", "value": "refund"}
        },
        {
            "assertion_id": "assert_005",
            "type": "content",
            "spec": {"target": "output.message", "check": "not_contains", "value": "cannot process", "soft": true}
        }
    ])
}

/// [`refund_assertions`] with the spec's `request_id`s (`req_idempotency_key_00N`).
pub fn refund_assertions_with_request_ids() -> Value {
    let mut list = refund_assertions();
    for (i, a) in list.as_array_mut().unwrap().iter_mut().enumerate() {
        a["request_id"] = json!(format!("req_idempotency_key_{:03}", i + 1));
    }
    list
}

/// A minimal valid trace.
pub fn minimal_trace() -> Value {
    json!({"schema_version": 1, "trace_id": "trc_min", "output": {"message": "hello"}, "steps": []})
}

/// A content assertion on `output.message`.
pub fn content(id: &str, check: &str, value: &str) -> Value {
    json!({"assertion_id": id, "type": "content", "spec": {"target": "output.message", "check": check, "value": value}})
}

// ---------------------------------------------------------------- checks

/// The `error` object of `resp`, after checking its code, `data.error_type`
/// and `data.retryable` (3002 is retryable; 2001 unless nothing is configured).
pub fn expect_error(resp: &Value, code: i64) -> Value {
    let err = resp
        .get("error")
        .unwrap_or_else(|| panic!("expected error {code}, got: {resp}"))
        .clone();
    assert_eq!(err["code"], json!(code), "{resp}");
    assert!(resp.get("result").is_none(), "an error response has no result: {resp}");
    assert_eq!(resp["jsonrpc"], json!("2.0"), "{resp}");
    let error_type = match code {
        -32700 => "PARSE_ERROR",
        -32600 => "INVALID_REQUEST",
        -32601 => "METHOD_NOT_FOUND",
        -32602 => "INVALID_PARAMS",
        -32603 => "INTERNAL_ERROR",
        1001 => "INVALID_TRACE",
        1002 => "ASSERTION_ERROR",
        2001 => "PROVIDER_ERROR",
        3001 => "ENGINE_ERROR",
        3002 => "TIMEOUT",
        3003 => "SESSION_ERROR",
        other => panic!("unexpected code {other}"),
    };
    assert_eq!(err["data"]["error_type"], json!(error_type), "{resp}");
    // SDKs print `message` alone: what to do (the detail) follows what went
    // wrong in it. Checked here, then taken off for the callers' checks of
    // what went wrong.
    let mut err = err;
    let message = err["message"].as_str().unwrap_or("").to_owned();
    let detail = err["data"]["detail"].as_str().unwrap_or("").trim().to_owned();
    if let Some(what) = message.strip_suffix(&format!(" — {detail}")) {
        err["message"] = json!(what);
    } else {
        // Clipped at its bound, or the message said it already.
        assert!(
            detail.is_empty() || message.contains(&detail) || message.chars().count() >= 1000,
            "the fix is not in the message: {resp}"
        );
    }
    // 2001 is retryable unless the backend is not configured at all.
    if code != 2001 {
        assert_eq!(err["data"]["retryable"], json!(code == 3002), "{resp}");
    }
    let detail = err["data"]["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("data.detail must be a string: {resp}"));
    assert!(!detail.trim().is_empty(), "data.detail must not be empty: {resp}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "message must be a non-empty string: {resp}"
    );
    err
}

/// The `result` of a success response.
pub fn expect_result(resp: &Value) -> Value {
    assert!(resp.get("error").is_none(), "expected a result, got: {resp}");
    assert_eq!(resp["jsonrpc"], json!("2.0"), "{resp}");
    resp.get("result").unwrap_or_else(|| panic!("no result in: {resp}")).clone()
}

/// `results[*].status` of an evaluate_batch result.
pub fn statuses(result: &Value) -> Vec<String> {
    result["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results array: {result}"))
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------- heavy work

/// A valid trace of roughly `bytes` bytes: tool steps with ~0.9 MB results
/// (arrays of row objects) and a ~450k-character output message. Parsing and
/// checking it takes a noticeable while, so requests carrying it stay in flight.
pub fn heavy_trace(bytes: usize) -> Value {
    let rows_per_step = 14_000;
    let step_bytes = 1_000_000;
    let n_steps = (bytes.saturating_sub(450_000) / step_bytes).max(1);
    let steps: Vec<Value> = (0..n_steps)
        .map(|s| {
            let rows: Vec<Value> = (0..rows_per_step)
                .map(|i| json!({"id": i, "sku": format!("SKU-{s}-{i:06}"), "qty": i % 7, "price": 9.99, "tags": ["a", "b"]}))
                .collect();
            json!({"type": "tool_call", "name": format!("fetch_{s}"), "args": {"page": s}, "result": {"rows": rows}})
        })
        .collect();
    let message: String = "lorem ipsum dolor sit amet consectetur ".repeat(11_500);
    json!({
        "schema_version": 1,
        "trace_id": "trc_heavy",
        "steps": steps,
        "output": {"message": message, "structured": {"ok": true}},
        "metadata": {"cost_usd": 0.5, "total_tokens": 100000, "timestamp": "2026-02-18T10:30:00Z"}
    })
}

/// Schema and regex assertions that walk the whole of a [`heavy_trace`].
pub fn heavy_assertions(n_steps: usize) -> Value {
    let row_schema = json!({
        "type": "object",
        "required": ["rows"],
        "properties": {"rows": {"type": "array", "items": {
            "type": "object",
            "required": ["id", "sku", "qty", "price"],
            "properties": {
                "id": {"type": "integer", "minimum": 0},
                "sku": {"type": "string", "pattern": "^SKU-[0-9]+-[0-9]{6}$"},
                "qty": {"type": "integer", "maximum": 6},
                "price": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}}
            }
        }}}
    });
    let mut list: Vec<Value> = (0..n_steps)
        .map(|s| json!({"assertion_id": format!("rows_{s}"), "type": "schema", "spec": {"target": format!("steps[?name=='fetch_{s}'].result"), "schema": row_schema}}))
        .collect();
    list.push(json!({"assertion_id": "re_miss", "type": "content", "spec": {"target": "output.message", "check": "regex_match", "value": "[0-9]{4}-never"}}));
    list.push(json!({"assertion_id": "re_rows", "type": "content", "spec": {"target": "steps[?name=='fetch_0'].result", "check": "regex_match", "value": "\"sku\":\"SKU-0-0139[0-9]{2}\""}}));
    list.push(json!({"assertion_id": "kw", "type": "content", "spec": {"target": "output.message", "check": "keyword_all", "values": ["lorem", "amet", "absent-word"]}}));
    Value::Array(list)
}

/// Number of steps [`heavy_trace`] builds for `bytes`.
pub fn heavy_steps(bytes: usize) -> usize {
    (bytes.saturating_sub(450_000) / 1_000_000).max(1)
}

// ---------------------------------------------------------------- custom commands

impl Engine {
    /// Like [`Engine::spawn_with`], for a prepared [`command`] (extra
    /// arguments, environment variables set or removed for the child only).
    /// Stdio is piped here; stderr is drained.
    pub fn spawn_command(cmd: Command) -> Engine {
        Self::start(cmd, Stderr::Drain)
    }
}
