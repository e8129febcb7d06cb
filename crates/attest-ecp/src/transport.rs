//! Talking JSON-RPC 2.0 to an agent, over stdio (the runtime spawns the
//! target command) or Streamable HTTP (the target is an `http(s)://` URL).
//!
//! Spawned agents are untrusted: they get a sanitized environment (an
//! allowlist plus what the manifest passes), their own process group, and on
//! Linux `PR_SET_PDEATHSIG` so they die with the runtime even when it is
//! SIGKILLed. Dropping an [`Agent`] kills the whole group. Stdout carries
//! protocol only: a line that is not JSON fails the call at once as a protocol
//! violation naming the line. Stderr is kept, bounded, for the report.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use crate::util::clip;
use attest_trace::text::error_chain;

/// Longest stdout line (one JSON-RPC message) accepted from an agent.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Largest HTTP response body accepted from an agent.
pub const MAX_HTTP_BODY: usize = 16 * 1024 * 1024;
/// How much of an agent's stderr is kept (the most recent bytes).
pub const STDERR_KEEP_BYTES: usize = 64 * 1024;
/// How long a stopping agent gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Environment variables a spawned agent inherits from the runtime; anything
/// else must be named in the manifest (`env:` or `pass_env:`), with
/// `--pass-env`, or with `--inherit-env`.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM",
];

/// The model providers' credentials and settings that agent frameworks
/// (the OpenAI and Anthropic SDKs, LangChain, PydanticAI, CrewAI, LiteLLM)
/// read from the environment by default, and the proxy and CA settings
/// their HTTP clients read: passed to every agent, so that a manifest
/// written for the reference runtime, which passes the whole environment,
/// runs unchanged. Names, or globs with `*`.
pub const ENV_PROVIDER_DEFAULTS: &[&str] = &[
    "OPENAI_*",
    "AZURE_OPENAI_*",
    "ANTHROPIC_*",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "COHERE_API_KEY",
    "CO_API_KEY",
    "TOGETHER_API_KEY",
    "FIREWORKS_API_KEY",
    "DEEPSEEK_API_KEY",
    "XAI_API_KEY",
    "OPENROUTER_API_KEY",
    "OLLAMA_HOST",
    "HF_TOKEN",
    "HUGGINGFACEHUB_API_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
];

/// Whether `name` matches `pattern`, a name or a glob whose `*` stands for
/// any run of characters.
pub fn env_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

impl AgentEnv {
    /// Whether the runtime's variable `name` goes to the agent.
    pub fn passes(&self, name: &str) -> bool {
        self.inherit
            || ENV_ALLOWLIST.contains(&name)
            || ENV_PROVIDER_DEFAULTS.iter().any(|p| env_matches(p, name))
            || self.pass.iter().any(|p| env_matches(p, name))
    }

    /// The runtime's variables that look like credentials or settings an
    /// agent may need (`*_API_KEY`, `*_TOKEN`, `*_BASE_URL`, …) and that
    /// were withheld from it: named when an agent fails.
    pub fn withheld(&self) -> Vec<String> {
        const LIKELY: [&str; 8] = [
            "*_API_KEY",
            "*_KEY",
            "*_TOKEN",
            "*_SECRET*",
            "*_BASE_URL",
            "*_URL",
            "*_ENDPOINT",
            "*_HOST",
        ];
        let mut names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| !self.passes(k) && !self.set.contains_key(k) && LIKELY.iter().any(|p| env_matches(p, k)))
            .collect();
        names.sort();
        names.truncate(10);
        names
    }
}

/// Whether `name` can name an environment variable: the environment is a
/// list of `NAME=value` C strings, so a name that is empty or holds `=` or a
/// NUL byte cannot be set (or would set another variable than the one
/// written). The message says what a valid name is.
pub fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        Err(
            "not a valid environment variable name: a name must not be empty and must not hold '=' or a NUL byte (e.g. OPENAI_API_KEY)"
                .into(),
        )
    } else {
        Ok(())
    }
}

/// How many calls left unanswered a stdio agent remembers, to pass over
/// their late answers.
const MAX_ABANDONED: usize = 64;

/// Why a run, scenario or step ended; the audit record's `exit_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    Ok,
    Timeout,
    TransportError,
    ProtocolError,
    AgentError,
    MaxDurationExceeded,
    Error,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Ok => "ok",
            ExitReason::Timeout => "timeout",
            ExitReason::TransportError => "transport_error",
            ExitReason::ProtocolError => "protocol_error",
            ExitReason::AgentError => "agent_error",
            ExitReason::MaxDurationExceeded => "max_duration_exceeded",
            ExitReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub reason: ExitReason,
    pub message: String,
}

impl CallError {
    pub fn new(reason: ExitReason, message: impl Into<String>) -> Self {
        CallError {
            reason,
            message: message.into(),
        }
    }
}

/// What a spawned agent's environment is built from, and the limits it runs under.
#[derive(Debug, Clone, Default)]
pub struct AgentEnv {
    pub set: BTreeMap<String, String>,
    /// Names or globs of the runtime's variables to pass (`pass_env:`, `--pass-env`).
    pub pass: Vec<String>,
    /// Pass the runtime's whole environment (`--inherit-env`).
    pub inherit: bool,
    pub limits: AgentLimits,
}

/// Resource limits for each process of a spawned agent (Linux), set
/// before it starts and inherited by everything it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Bytes of data segment and private writable mappings, which is what
    /// allocating takes (`RLIMIT_DATA`: address space only reserved, as
    /// V8 and Go reserve it, does not count). `None`: no limit.
    pub memory_bytes: Option<u64>,
    /// Seconds of CPU (`RLIMIT_CPU`: SIGXCPU at the limit, SIGKILL a second
    /// later). `None`: none beyond the call and run timeouts.
    pub cpu_secs: Option<u64>,
}

impl AgentLimits {
    /// The default memory limit per agent process, in MiB.
    pub const DEFAULT_MEMORY_MIB: u64 = 4096;
}

impl Default for AgentLimits {
    fn default() -> AgentLimits {
        AgentLimits {
            memory_bytes: Some(AgentLimits::DEFAULT_MEMORY_MIB << 20),
            cpu_secs: None,
        }
    }
}

/// True when the target names a Streamable HTTP endpoint rather than a command.
pub fn is_http_target(target: &str) -> bool {
    let t = target.trim();
    let lower = t.get(..8).unwrap_or(t).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return false;
    }
    match reqwest::Url::parse(t) {
        Ok(u) => matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()),
        Err(_) => false,
    }
}

pub enum Agent {
    Stdio(Box<StdioAgent>),
    Http(HttpAgent),
}

impl Agent {
    pub fn start(target: &str, env: &AgentEnv) -> Result<Agent, CallError> {
        if is_http_target(target) {
            Ok(Agent::Http(HttpAgent::new(target.trim())?))
        } else {
            Ok(Agent::Stdio(Box::new(StdioAgent::spawn(target, env)?)))
        }
    }

    /// Send one request and return its validated-as-JSON response object.
    pub async fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
        match self {
            Agent::Stdio(a) => a.call(method, params, timeout).await,
            Agent::Http(a) => a.call(method, params, timeout).await,
        }
    }

    /// The retained tail of the agent's stderr ("" over HTTP).
    pub fn stderr(&self) -> String {
        match self {
            Agent::Stdio(a) => a.stderr_tail(),
            Agent::Http(_) => String::new(),
        }
    }

    pub async fn stop(&mut self) {
        if let Agent::Stdio(a) = self {
            a.stop().await;
        }
    }

    pub fn is_http(&self) -> bool {
        matches!(self, Agent::Http(_))
    }
}

enum LineEvent {
    Line(String),
    TooLong,
    Eof,
    Failed(String),
}

#[derive(Default)]
struct StderrTail {
    buf: Vec<u8>,
    dropped: usize,
}

pub struct StdioAgent {
    child: Child,
    pgid: Option<i32>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<LineEvent>,
    stderr: Arc<Mutex<StderrTail>>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    next_id: i64,
    /// Ids of calls that failed before their answer was read.
    abandoned: BTreeSet<i64>,
    reaped: bool,
    /// Likely credentials and settings the agent was started without, to
    /// name if it fails.
    withheld: Vec<String>,
    /// Lines on stdout that were not JSON (library warnings, prints), passed
    /// over as the reference runtime does; and the first few, to show.
    stray_lines: u64,
    stray_first: Vec<String>,
}

/// Non-JSON stdout lines passed over within one call before the call
/// fails: an agent printing without end cannot hold a call to its deadline
/// while the runtime reads.
const MAX_STRAY_LINES_PER_CALL: usize = 10_000;

/// Words a target may start with that name no program: shell builtins and
/// reserved words. `exec` before one would look for a program of that name.
const SHELL_WORDS: [&str; 42] = [
    "exec", "command", "builtin", "eval", ".", ":", "source", "set", "export", "readonly", "unset", "cd", "trap", "ulimit", "umask",
    "shift", "wait", "alias", "unalias", "read", "type", "hash", "getopts", "times", "jobs", "fg", "bg", "exit", "return", "break",
    "continue", "let", "local", "declare", "typeset", "if", "while", "until", "for", "case", "select", "time",
];

/// The shell command line: a simple command that runs a program is `exec`ed
/// so the agent itself (not an intermediate shell) is the process that
/// carries the death signal. Anything else, leading variable assignments
/// (`MODE=test python3 agent.py`) and builtins included, runs as the shell
/// reads it.
fn shell_line(target: &str) -> String {
    let simple = target.chars().all(|c| c.is_alphanumeric() || " \t-_./=:,+@%'\"".contains(c));
    let first = target.split_whitespace().next().unwrap_or_default();
    let runs_a_program = !first.contains('=') && !SHELL_WORDS.contains(&first);
    if simple && runs_a_program {
        format!("exec {target}")
    } else {
        target.to_string()
    }
}

impl StdioAgent {
    pub fn spawn(target: &str, env: &AgentEnv) -> Result<StdioAgent, CallError> {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(shell_line(target));
        cmd.env_clear();
        for (k, v) in std::env::vars_os() {
            if k.to_str().is_some_and(|name| env.passes(name)) {
                cmd.env(k, v);
            }
        }
        for (k, v) in &env.set {
            cmd.env(k, v);
        }
        // On Linux, dropping the agent asks its guard to end everything
        // (`end_all`); a SIGKILL for the guard would stop it half-way.
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(!cfg!(target_os = "linux"));
        #[cfg(unix)]
        cmd.process_group(0);
        #[cfg(target_os = "linux")]
        {
            let parent = std::process::id() as libc::pid_t;
            let limits = env.limits;
            guard::check_support();
            guard::hide_memory();
            // SAFETY: between fork and exec only async-signal-safe calls run
            // (prctl, capget, capset, getrlimit, setrlimit, getpid, getppid, fork,
            // close_range, close, open, read, dup2, sigprocmask, sigwaitinfo, waitpid,
            // kill, nanosleep, signal, _exit); nothing allocates.
            unsafe {
                cmd.pre_exec(move || guard::split(parent, limits));
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CallError::new(ExitReason::TransportError, format!("could not start agent `{target}`: {e}")))?;
        let pgid = child.id().map(|p| p as i32);
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
        // Small: lines wait here only between calls, and each may be up to MAX_LINE_BYTES.
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut framed = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE_BYTES));
            loop {
                let ev = match framed.next().await {
                    Some(Ok(l)) => LineEvent::Line(l),
                    Some(Err(LinesCodecError::MaxLineLengthExceeded)) => LineEvent::TooLong,
                    Some(Err(LinesCodecError::Io(e))) => LineEvent::Failed(e.to_string()),
                    None => LineEvent::Eof,
                };
                let last = !matches!(ev, LineEvent::Line(_));
                if tx.send(ev).await.is_err() || last {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(StderrTail::default()));
        let sink = stderr.clone();
        let stderr_task = tokio::spawn(async move {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = stderr_pipe.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let mut t = sink.lock().unwrap_or_else(|p| p.into_inner());
                t.buf.extend_from_slice(&chunk[..n]);
                if t.buf.len() > STDERR_KEEP_BYTES {
                    let cut = t.buf.len() - STDERR_KEEP_BYTES;
                    t.buf.drain(..cut);
                    t.dropped += cut;
                }
            }
        });
        Ok(StdioAgent {
            stdin: child.stdin.take(),
            child,
            pgid,
            lines: rx,
            stderr,
            stderr_task: Some(stderr_task),
            next_id: 0,
            abandoned: BTreeSet::new(),
            reaped: false,
            withheld: env.withheld(),
            stray_lines: 0,
            stray_first: Vec::new(),
        })
    }

    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&t.buf).into_owned();
        let text = if t.dropped > 0 {
            format!("[{} earlier bytes dropped]\n{text}", t.dropped)
        } else {
            text
        };
        if self.stray_lines == 0 {
            return text;
        }
        format!(
            "[the agent wrote {} line(s) on stdout that are not JSON-RPC; they were passed over (stdout is for protocol messages: log to stderr). The first: {}]\n{text}",
            self.stray_lines,
            self.stray_first.join(" | ")
        )
    }

    fn stderr_note(&self) -> String {
        let tail = self.stderr_tail();
        let tail = tail.trim();
        if tail.is_empty() {
            String::new()
        } else {
            // The end of stderr is where a traceback's cause is.
            let start = tail.len().saturating_sub(2000);
            let start = (start..tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(0);
            format!("; stderr: {}", &tail[start..])
        }
    }

    async fn exit_note(&mut self) -> String {
        match tokio::time::timeout(Duration::from_millis(500), self.child.wait()).await {
            Ok(Ok(status)) => {
                // The agent is gone; helpers it started in its group go too.
                // This is at once after the wait, so the group id is still
                // the agent's (an id is not reused while its group lives).
                self.kill_group(libc::SIGKILL);
                self.reaped = true;
                // What the agent wrote to stderr before it exited may still be
                // in the pipe: read it now, so that the error can show it.
                self.drain_stderr(Duration::from_millis(500)).await;
                let withheld = if self.withheld.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; it was started without {} from the runtime's environment: if it needs them, pass them with --pass-env NAME, pass_env: in the manifest, or --inherit-env",
                        self.withheld.join(", ")
                    )
                };
                format!(" (agent exited: {status}{withheld}{})", missing_sdk_hint(&self.stderr_tail()))
            }
            _ => String::new(),
        }
    }

    pub async fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
        self.next_id += 1;
        let id = self.next_id;
        let mut answered = false;
        let answer = self.exchange(id, method, params, timeout, &mut answered).await;
        if answer.is_err() && !answered {
            // Its answer, if it ever comes, must not be taken for a later
            // call's. Only the newest few are remembered: an agent that
            // leaves many calls unanswered fails them all on timeouts anyway.
            self.abandoned.insert(id);
            while self.abandoned.len() > MAX_ABANDONED {
                self.abandoned.pop_first();
            }
        }
        answer
    }

    /// Sends request `id` and reads lines up to its answer. `answered` is
    /// set once a response was read that may have been meant for this call,
    /// right or wrong: after that no late answer is due. An answer carrying
    /// an earlier call's id (a duplicate, or one past the remembered few)
    /// fails the call but is no answer to it, so its own may still follow.
    async fn exchange(&mut self, id: i64, method: &str, params: Value, timeout: Duration, answered: &mut bool) -> Result<Value, CallError> {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut line = serde_json::to_vec(&request).map_err(|e| CallError::new(ExitReason::Error, e.to_string()))?;
        line.push(b'\n');
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(CallError::new(ExitReason::TransportError, "agent stdin is closed"));
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let write = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        };
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let exit = self.exit_note().await;
                return Err(CallError::new(
                    ExitReason::TransportError,
                    format!("agent crashed or closed its stdin: {e}{exit}{}", self.stderr_note()),
                ));
            }
            Err(_) => return Err(self.timed_out(method, timeout)),
        }
        let mut stray_in_call = 0usize;
        loop {
            let ev = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => LineEvent::Eof,
                Err(_) => return Err(self.timed_out(method, timeout)),
            };
            match ev {
                LineEvent::Line(l) => {
                    let trimmed = l.trim();
                    if trimmed.is_empty() {
                        continue;
                    }
                    let parsed: Value = match agent_json(trimmed) {
                        Ok(v) => v,
                        // A library's warning or a stray print: passed over, as
                        // the reference runtime does, counted and shown in the
                        // report beside the agent's stderr.
                        Err(AgentJsonError::Json(e)) if (e.is_syntax() || e.is_eof()) && stray_in_call < MAX_STRAY_LINES_PER_CALL => {
                            stray_in_call += 1;
                            self.stray_lines += 1;
                            if self.stray_first.len() < 3 {
                                self.stray_first.push(format!("{:?}", clip(trimmed, 200)));
                            }
                            continue;
                        }
                        Err(AgentJsonError::Json(e)) if e.is_syntax() || e.is_eof() => {
                            return Err(CallError::new(
                                ExitReason::ProtocolError,
                                format!(
                                    "protocol violation: the agent wrote {MAX_STRAY_LINES_PER_CALL} lines on stdout that are not JSON-RPC within one call, the last ({e}): {:?} (stdout carries protocol messages only; log to stderr)",
                                    clip(trimmed, 300)
                                ),
                            ))
                        }
                        Err(e) => {
                            return Err(CallError::new(
                                ExitReason::ProtocolError,
                                format!("the agent's JSON-RPC line cannot be read: {e}: {:?}", clip(trimmed, 300)),
                            ))
                        }
                    };
                    let Some(obj) = parsed.as_object() else {
                        // JSON that cannot be a JSON-RPC message (`42`,
                        // `[1, 2]`) is passed over, as the reference runtime
                        // passes it over: such a line is not an answer, and the
                        // answer may still follow. The call's deadline bounds
                        // how long lines are read.
                        continue;
                    };
                    if obj.contains_key("method") && !obj.contains_key("id") {
                        // A notification from the agent: nothing in ECP needs
                        // an answer. (The reference runtime fails the call with
                        // an id mismatch here; see docs/ecp.md.)
                        continue;
                    }
                    if let Some(earlier) = obj.get("id").and_then(Value::as_i64) {
                        // The late answer to a call that already failed (the
                        // agent answered after a timeout, or after a stray line
                        // that ended the call): not this call's answer, which
                        // may still follow. `conformance` goes on to its reset
                        // check after a failed step, and would otherwise read
                        // the step's answer there.
                        if earlier != id && self.abandoned.remove(&earlier) {
                            continue;
                        }
                    }
                    let earlier_call = obj.get("id").and_then(Value::as_i64).is_some_and(|e| (1..id).contains(&e));
                    *answered = !earlier_call;
                    if obj.get("id") != Some(&json!(id)) {
                        return Err(CallError::new(
                            ExitReason::ProtocolError,
                            format!("JSON-RPC response id mismatch: expected {id}, got {}", clip_json(obj.get("id"))),
                        ));
                    }
                    return Ok(parsed);
                }
                LineEvent::TooLong => {
                    return Err(CallError::new(
                        ExitReason::ProtocolError,
                        format!("protocol violation: the agent wrote a stdout line longer than {MAX_LINE_BYTES} bytes"),
                    ))
                }
                LineEvent::Failed(e) => {
                    return Err(CallError::new(
                        ExitReason::TransportError,
                        format!("reading the agent's stdout failed: {e}"),
                    ))
                }
                LineEvent::Eof => {
                    let exit = self.exit_note().await;
                    return Err(CallError::new(
                        ExitReason::TransportError,
                        format!(
                            "agent crashed or closed its stdout before answering {method}{exit}{}",
                            self.stderr_note()
                        ),
                    ));
                }
            }
        }
    }

    fn timed_out(&self, method: &str, timeout: Duration) -> CallError {
        CallError::new(
            ExitReason::Timeout,
            format!(
                "agent did not answer {method} within {:.1}s{}",
                timeout.as_secs_f64(),
                self.stderr_note()
            ),
        )
    }

    fn kill_group(&self, sig: i32) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid {
            if !self.reaped && pgid > 0 {
                // SAFETY: plain syscall; the group leader is not reaped, so the id is still ours.
                unsafe {
                    libc::kill(-pgid, sig);
                }
            }
        }
    }

    /// Close stdin, ask the group to stop, then kill it after a grace period;
    /// then collect what is left of its stderr.
    pub async fn stop(&mut self) {
        self.stdin = None;
        self.terminate().await;
        self.drain_stderr(Duration::from_secs(1)).await;
    }

    /// Waits for the stderr pipe to close, and so for everything written to
    /// it to be in the tail. The pipe closes when the group is gone; a
    /// descendant that escaped the group could hold it open, so the wait is
    /// bounded.
    async fn drain_stderr(&mut self, within: Duration) {
        if let Some(task) = self.stderr_task.as_mut() {
            if tokio::time::timeout(within, task).await.is_ok() {
                self.stderr_task = None;
            }
        }
    }

    async fn terminate(&mut self) {
        if self.reaped {
            return;
        }
        self.kill_group(libc::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, self.child.wait()).await.is_err() {
            // The guard ends the group and every other descendant, then
            // itself; killed with the group, it could not.
            self.end_all();
            let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        }
        // The leader is gone (or is made to go); anything left in the group goes too.
        self.kill_group(libc::SIGKILL);
        let _ = self.child.kill().await;
        self.reaped = true;
    }

    /// Ends the agent, its group and everything else it started: on Linux
    /// through its guard, which reaches descendants that left the group.
    fn end_all(&self) {
        #[cfg(target_os = "linux")]
        if let Some(guard) = self.pgid.filter(|&g| g > 0 && !self.reaped) {
            // SAFETY: plain syscall; the guard is not reaped, so the id is still ours.
            unsafe {
                libc::kill(guard, guard::RUNTIME_DIED);
            }
            return;
        }
        self.kill_group(libc::SIGKILL);
    }
}

/// An agent's JSON text as a value. Python's `json` module, which agents
/// built on `ecp-sdk` write with, escapes a lone UTF-16 surrogate (`\ud800`)
/// where text holds one; such escapes are read as U+FFFD instead of refusing
/// the whole answer. Nesting deeper than 128 levels is refused, with a
/// message that says so.
pub fn agent_json(text: &str) -> Result<Value, AgentJsonError> {
    // An answer may parse into some 50 times its size when it is all tiny
    // objects (1.3 million tool calls in a 16 MiB line, say): count them first.
    let max = (text.len() / MIN_BYTES_PER_CONTAINER).max(MIN_CONTAINERS) as u64;
    if attest_io::json_containers(text.as_bytes(), max).is_err() {
        return Err(AgentJsonError::TooManyContainers(max));
    }
    parse_agent_json(text).map_err(AgentJsonError::Json)
}

/// Why an agent's JSON text was not read.
#[derive(Debug)]
pub enum AgentJsonError {
    Json(serde_json::Error),
    TooManyContainers(u64),
}

impl std::fmt::Display for AgentJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentJsonError::Json(e) => write!(f, "{e}"),
            AgentJsonError::TooManyContainers(max) => write!(
                f,
                "it holds more than {max} JSON objects and arrays (one per {MIN_BYTES_PER_CONTAINER} bytes of text at most); answer with fewer, larger items"
            ),
        }
    }
}

/// Answers average at least this many bytes of text per object or array.
const MIN_BYTES_PER_CONTAINER: usize = 16;
/// However short an answer, this many objects and arrays are allowed.
const MIN_CONTAINERS: usize = 4096;

/// An agent's JSON, read as Python's `json` module (which `ecp-sdk` uses)
/// writes it: a lone surrogate escape becomes U+FFFD, and the non-finite
/// numbers `NaN`, `Infinity` and `-Infinity`, which JSON has no spelling
/// for, become `null`.
fn parse_agent_json(text: &str) -> serde_json::Result<Value> {
    match serde_json::from_str(text) {
        Err(e) if e.is_syntax() => {
            let surrogates = replace_lone_surrogates(text);
            let non_finite = replace_non_finite(surrogates.as_deref().unwrap_or(text));
            match non_finite.or(surrogates) {
                Some(fixed) => serde_json::from_str(&fixed),
                None => Err(e),
            }
        }
        other => other,
    }
}

/// `text` with each `NaN`, `Infinity` and `-Infinity` outside strings
/// replaced by `null`; `None` when it has none.
fn replace_non_finite(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied, mut in_string) = (0, 0, false);
    while i < b.len() {
        match b[i] {
            b'\\' if in_string => i += 2,
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'N' | b'I' | b'-' if !in_string => {
                let word = ["NaN", "Infinity", "-Infinity"].into_iter().find(|w| text[i..].starts_with(w));
                // A whole token: not the start of a longer word.
                let whole = word.filter(|w| !b.get(i + w.len()).is_some_and(|c| c.is_ascii_alphanumeric()));
                match whole {
                    Some(w) => {
                        out.push_str(&text[copied..i]);
                        out.push_str("null");
                        i += w.len();
                        copied = i;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// `text` with each `\uXXXX` escape of a lone surrogate replaced by
/// `\ufffd`; `None` when it has none.
fn replace_lone_surrogates(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let unit = |i: usize| -> Option<u16> {
        (b.get(i) == Some(&b'\\') && b.get(i + 1) == Some(&b'u'))
            .then(|| text.get(i + 2..i + 6).and_then(|h| u16::from_str_radix(h, 16).ok()))
            .flatten()
    };
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        match unit(i) {
            Some(0xD800..=0xDBFF) if matches!(unit(i + 6), Some(0xDC00..=0xDFFF)) => i += 12,
            Some(0xD800..=0xDFFF) => {
                out.push_str(&text[copied..i]);
                out.push_str("\\ufffd");
                i += 6;
                copied = i;
            }
            Some(_) => i += 6,
            // Any other escape is two characters: `\\` must not make the
            // next backslash look like the start of an escape.
            None => i += 2,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

fn clip_json(v: Option<&Value>) -> String {
    v.map(|v| clip(&v.to_string(), 100)).unwrap_or_else(|| "no id".into())
}

impl Drop for StdioAgent {
    fn drop(&mut self) {
        self.end_all();
    }
}

pub struct HttpAgent {
    endpoint: String,
    client: reqwest::Client,
    next_id: i64,
}

impl HttpAgent {
    pub fn new(endpoint: &str) -> Result<HttpAgent, CallError> {
        // Redirects are not followed: the reference runtime reports a 3xx as a
        // transport error, and following one would re-send the agent's
        // requests (a 307 re-POSTs) to another endpoint than the manifest
        // names.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CallError::new(ExitReason::TransportError, format!("HTTP client setup failed: {e}")))?;
        Ok(HttpAgent {
            endpoint: endpoint.to_string(),
            client,
            next_id: 0,
        })
    }

    pub async fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
        self.next_id += 1;
        let id = self.next_id;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let timed_out = || {
            CallError::new(
                ExitReason::Timeout,
                format!("agent did not answer {method} within {:.1}s", timeout.as_secs_f64()),
            )
        };
        let exchange = async {
            let mut resp = self
                .client
                .post(&self.endpoint)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .map_err(|e| {
                    if e.is_timeout() {
                        timed_out()
                    } else {
                        CallError::new(
                            ExitReason::TransportError,
                            format!("HTTP request to {} failed: {}", self.endpoint, error_chain(&e)),
                        )
                    }
                })?;
            let status = resp.status();
            if status.is_redirection() {
                let location = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                return Err(CallError::new(
                    ExitReason::TransportError,
                    format!(
                        "HTTP {status} from {}: {}; redirects are not followed, so give the agent's own endpoint as the target",
                        self.endpoint,
                        match location {
                            Some(l) => format!("it redirects to {:?}", clip(&l, 500)),
                            None => "a redirect without a Location".into(),
                        }
                    ),
                ));
            }
            let content_type = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let stream = content_type.contains("text/event-stream");
            let (mut raw, mut events, mut received) = (Vec::new(), SseEvents::default(), 0usize);
            while let Some(chunk) = resp.chunk().await.map_err(|e| {
                CallError::new(
                    ExitReason::TransportError,
                    format!("reading the HTTP response failed: {}", error_chain(&e)),
                )
            })? {
                received += chunk.len();
                if received > MAX_HTTP_BODY {
                    return Err(CallError::new(
                        ExitReason::ProtocolError,
                        format!("HTTP response exceeds {MAX_HTTP_BODY} bytes"),
                    ));
                }
                if stream && status.is_success() {
                    // Each event is read once, as it completes: a stream
                    // of progress events costs time in proportion to its
                    // length. A server may keep the stream open after the
                    // response event.
                    if let Some(v) = events.push(&chunk) {
                        return Ok((status, v));
                    }
                } else {
                    raw.extend_from_slice(&chunk);
                }
            }
            if stream && status.is_success() {
                return events
                    .finish()
                    .map(|v| (status, v))
                    .ok_or_else(|| CallError::new(ExitReason::ProtocolError, "SSE stream ended without a JSON-RPC response"));
            }
            let text = String::from_utf8_lossy(&raw).into_owned();
            if !status.is_success() {
                return Err(CallError::new(
                    ExitReason::TransportError,
                    format!("HTTP {status} from {}: {}", self.endpoint, clip(&text, 500)),
                ));
            }
            if text.trim().is_empty() {
                return Err(CallError::new(
                    ExitReason::ProtocolError,
                    format!("empty HTTP response to {method} (status {status})"),
                ));
            }
            let v: Value = agent_json(&text).map_err(|e| {
                CallError::new(
                    ExitReason::ProtocolError,
                    format!("HTTP response is not valid JSON ({e}): {}", clip(&text, 300)),
                )
            })?;
            Ok((status, v))
        };
        let (status, v) = match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(timed_out()),
        };
        if !status.is_success() {
            return Err(CallError::new(
                ExitReason::TransportError,
                format!("HTTP {status} from {}", self.endpoint),
            ));
        }
        let Some(obj) = v.as_object() else {
            return Err(CallError::new(ExitReason::ProtocolError, "HTTP response must be a JSON-RPC object"));
        };
        if obj.get("id") != Some(&json!(id)) {
            return Err(CallError::new(
                ExitReason::ProtocolError,
                format!("JSON-RPC response id mismatch: expected {id}, got {}", clip_json(obj.get("id"))),
            ));
        }
        Ok(v)
    }
}

/// A server-sent event stream read as it arrives, for its first event whose
/// data is a JSON-RPC response. Only the event being received is kept.
#[derive(Default)]
struct SseEvents {
    /// The text after the last complete event, its line ends made `\n`:
    /// a line may end in CRLF, LF or a lone CR.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no event boundary.
    scanned: usize,
    /// The last byte taken was a CR, so an LF that follows ends no line.
    after_cr: bool,
}

impl SseEvents {
    /// Takes the next part of the stream: the response, once an event
    /// completed by a blank line holds one.
    fn push(&mut self, chunk: &[u8]) -> Option<Value> {
        for &b in chunk {
            match b {
                b'\r' => self.pending.push(b'\n'),
                b'\n' if self.after_cr => {}
                _ => self.pending.push(b),
            }
            self.after_cr = b == b'\r';
        }
        // Events start at `start`; boundaries are looked for from `from`.
        let (mut start, mut from, mut found) = (0, self.scanned, None);
        while let Some(i) = memchr::memmem::find(&self.pending[from..], b"\n\n") {
            let end = from + i;
            found = sse_response(&self.pending[start..end]);
            (start, from) = (end + 2, end + 2);
            if found.is_some() {
                break;
            }
        }
        self.pending.drain(..start);
        // The last byte may begin a boundary the next chunk completes.
        self.scanned = self.pending.len().saturating_sub(1);
        found
    }

    /// The stream ended: its last event needs no blank line after it.
    fn finish(self) -> Option<Value> {
        sse_response(&self.pending)
    }
}

/// The JSON-RPC response one event's data holds, if it holds one.
fn sse_response(event: &[u8]) -> Option<Value> {
    let event = String::from_utf8_lossy(event);
    let data: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    serde_json::from_str::<Value>(&data.join("\n"))
        .ok()
        .filter(|v| v.get("result").is_some() || v.get("error").is_some())
}

/// The agent's guard, on Linux: the process the runtime spawns forks the
/// agent and stays behind as its guard, so that nothing the agent started
/// outlives the runtime, even when the runtime is killed with SIGKILL.
///
/// The kernel's parent-death signal reaches one process only: the one that
/// asked for it. A compound target (`cd x && python3 agent.py`) keeps a shell
/// between the runtime and the agent, and agents start processes of their
/// own. The guard leads the agent's process group and is a child subreaper,
/// so every descendant stays its descendant; when the runtime dies, the
/// guard's parent-death signal makes it kill the whole group. Otherwise it
/// only waits, and leaves with the agent's own exit status, so the runtime
/// sees the agent's exit as before.
#[cfg(target_os = "linux")]
mod guard {
    use libc::{c_int, pid_t};

    /// Signal the guard gets when the runtime dies, or when the runtime
    /// stops an agent that does not stop by itself.
    pub const RUNTIME_DIED: c_int = libc::SIGUSR1;
    /// `CAP_SYS_PTRACE`, `CAP_SYS_ADMIN` and `CAP_PERFMON`
    /// (linux/capability.h).
    const MEMORY_READING_CAPABILITIES: [libc::c_ulong; 3] = [19, 21, 38];

    /// Takes `caps` out of this process's inheritable set (`capget` and
    /// `capset`, version 3). Async-signal-safe.
    unsafe fn clear_inheritable(caps: &[libc::c_ulong]) {
        // SAFETY: both syscalls read and write only `header` and `data`, which
        // live on this stack frame and have the layout the kernel expects
        // (version 3: two `Data`).
        unsafe {
            #[repr(C)]
            struct Header {
                version: u32,
                pid: c_int,
            }
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let mut header = Header {
                version: 0x2008_0522,
                pid: 0,
            };
            let mut data = [Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            if libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) != 0 {
                return;
            }
            for &cap in caps {
                data[(cap / 32) as usize].inheritable &= !(1u32 << (cap % 32));
            }
            libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr());
        }
    }

    /// The calling thread's children, as the kernel lists them
    /// (`CONFIG_PROC_CHILDREN`). The guard is single-threaded, so for it
    /// these are the process's children.
    const CHILDREN: &std::ffi::CStr = c"/proc/thread-self/children";

    /// Says once, on stderr, when the kernel cannot list a process's
    /// children ([`CHILDREN`]): the guard then cannot find what left the
    /// agent's process group.
    pub fn check_support() {
        static CHECKED: std::sync::Once = std::sync::Once::new();
        CHECKED.call_once(|| {
            if !std::path::Path::new(CHILDREN.to_str().expect("the path is ASCII")).exists() {
                eprintln!(
                    "attest-ecp: this kernel does not list a process's children (/proc/<pid>/task/<tid>/children): processes an agent starts outside its process group may outlive it"
                );
            }
        });
    }

    /// Makes the runtime's memory, and that of every guard it forks, closed
    /// to its agents. The guard is a fork of the runtime that never execs,
    /// so both hold the runtime's whole environment (its API keys among
    /// it), which an agent of the same user could otherwise read from
    /// `/proc/<pid>/environ` or `/proc/<pid>/mem`, whatever environment it
    /// was given itself. A process that is not dumpable opens those files
    /// only to processes with `CAP_SYS_PTRACE` (or `CAP_SYS_ADMIN`,
    /// `CAP_PERFMON`). It also writes no core dump.
    pub fn hide_memory() {
        // SAFETY: prctl with these arguments only sets a flag of this process.
        unsafe {
            libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0);
        }
    }

    /// Runs in the spawned process before exec: returns in the agent (which
    /// then execs the target), never returns in the guard.
    ///
    /// # Safety
    ///
    /// Call only between `fork` and `exec` (a `pre_exec` hook), where only
    /// async-signal-safe functions may run: `runtime` is the pid of the
    /// process that spawned this one.
    pub unsafe fn split(runtime: pid_t, limits: super::AgentLimits) -> std::io::Result<()> {
        // SAFETY: the caller's contract (# Safety above): only async-signal-safe
        // calls follow, which allocate nothing and take no lock.
        unsafe {
            let guard = libc::getpid();
            let agent = libc::fork();
            if agent < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if agent == 0 {
                // The agent dies with its guard.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 || libc::getppid() != guard {
                    libc::_exit(1);
                }
                // An agent run as root would otherwise read the runtime's and the
                // guard's memory despite `hide_memory`: each of these
                // capabilities opens a process that is not dumpable. Out of its
                // bounding set, the agent cannot get them back when it execs.
                // Refused (and harmless) for an agent that is not root.
                for cap in MEMORY_READING_CAPABILITIES {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                }
                // An exec as root also grants what the ambient and inheritable
                // sets hold.
                libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
                clear_inheritable(&MEMORY_READING_CAPABILITIES);
                // No core dump either: a crashing agent would write its whole memory.
                lower_limit(libc::RLIMIT_CORE, Some(0), 0);
                lower_limit(libc::RLIMIT_DATA, limits.memory_bytes, 0);
                // The hard limit a second later: SIGXCPU first, which an agent may report.
                lower_limit(libc::RLIMIT_CPU, limits.cpu_secs, 1);
                return Ok(());
            }
            watch(runtime, agent)
        }
    }

    unsafe fn watch(runtime: pid_t, agent: pid_t) -> ! {
        // SAFETY: runs in the guard, single-threaded after `fork`; every call is
        // a raw syscall on descriptors, signal sets and status words it owns.
        unsafe {
            // Keep no copy of the agent's pipes, nor of the pipe the spawning
            // side reads until exec has happened: the runtime must see each of
            // them close when the agent closes it.
            if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) != 0 {
                for fd in 3..65_536 {
                    libc::close(fd);
                }
            }
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                if null > 2 {
                    libc::close(null);
                }
            }
            let mut waited: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut waited);
            // SIGTERM and SIGINT reach the whole group when the runtime stops the
            // agent: the agent handles them; the guard waits for it to exit.
            for sig in [libc::SIGCHLD, RUNTIME_DIED, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut waited, sig);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
            if libc::prctl(libc::PR_SET_PDEATHSIG, RUNTIME_DIED as libc::c_ulong, 0, 0, 0) != 0 || libc::getppid() != runtime {
                end_group();
            }
            loop {
                // Reap everything that has exited (orphans reparent to the guard).
                loop {
                    let mut status: c_int = 0;
                    let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == agent {
                        leave_as(status);
                    }
                }
                if libc::sigwaitinfo(&waited, std::ptr::null_mut()) == RUNTIME_DIED {
                    end_group();
                }
            }
        }
    }

    /// The runtime is gone, or asks for everything to end: the agent's
    /// whole process group goes, and every other descendant.
    unsafe fn end_group() -> ! {
        // SAFETY: signals and exits only; called in the single-threaded guard.
        unsafe {
            end_descendants();
            // Whatever joined the group without being a descendant, and the guard.
            libc::kill(0, libc::SIGKILL);
            libc::_exit(137)
        }
    }

    /// Longest the guard spends ending descendants, in rounds of 1 ms.
    const END_ROUNDS: u32 = 1_000;

    /// Kills every descendant of the guard, whatever process group or
    /// session it moved to (`setpgid`, `setsid`): each is the guard's child,
    /// or becomes one when its parent dies, since the guard is their
    /// subreaper. So killing the children in rounds, and reaping them,
    /// reaches them all. Async-signal-safe: it reads `/proc` into a buffer
    /// on the stack and allocates nothing.
    unsafe fn end_descendants() {
        // SAFETY: reads `/proc` into a buffer on this stack frame, and kills and
        // reaps children of the single-threaded guard: async-signal-safe.
        unsafe {
            for _ in 0..END_ROUNDS {
                let fd = libc::open(CHILDREN.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return;
                }
                let (mut any, mut current, mut digits) = (false, 0 as pid_t, false);
                let mut buf = [0u8; 1024];
                loop {
                    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    if n <= 0 {
                        break;
                    }
                    for &b in &buf[..n as usize] {
                        if b.is_ascii_digit() {
                            current = current.saturating_mul(10).saturating_add((b - b'0') as pid_t);
                            digits = true;
                        } else if digits {
                            kill_child(current);
                            (any, current, digits) = (true, 0, false);
                        }
                    }
                }
                if digits {
                    kill_child(current);
                    any = true;
                }
                libc::close(fd);
                let mut status: c_int = 0;
                while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
                if !any {
                    return;
                }
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 1_000_000,
                };
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
        }
    }

    /// Kills a child of the guard, and its group too when it leads one:
    /// members whose parent is still alive are not children yet.
    unsafe fn kill_child(pid: pid_t) {
        // SAFETY: `kill` takes no pointers; a pid that is gone is refused.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    }

    /// Lowers a resource limit to `value` (the hard one to `value + hard_extra`),
    /// never above what it already is. Async-signal-safe.
    unsafe fn lower_limit(resource: libc::__rlimit_resource_t, value: Option<u64>, hard_extra: u64) {
        // SAFETY: `getrlimit` and `setrlimit` read and write a local `rlimit`.
        unsafe {
            let Some(value) = value else { return };
            let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(resource, &mut now) != 0 {
                return;
            }
            let hard = (value.saturating_add(hard_extra) as libc::rlim_t).min(now.rlim_max);
            let soft = (value as libc::rlim_t).min(hard);
            libc::setrlimit(
                resource,
                &libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                },
            );
        }
    }

    /// Exits the way the agent did: with its code, or by its signal. What
    /// the agent left running goes first.
    unsafe fn leave_as(status: c_int) -> ! {
        // SAFETY: signals and exits the single-threaded guard; the signal set
        // is a local, zeroed then initialised by `sigemptyset`.
        unsafe {
            end_descendants();
            if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                libc::signal(sig, libc::SIG_DFL);
                let mut only: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut only);
                libc::sigaddset(&mut only, sig);
                libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
                libc::kill(libc::getpid(), sig);
                libc::_exit(128 + sig);
            }
            libc::_exit(libc::WEXITSTATUS(status))
        }
    }
}

/// What to do when an agent's Python could not import the ECP SDK (its
/// traceback ends in `No module named 'ecp'`): the most common first-run
/// failure, whose traceback alone does not say which package to install.
fn missing_sdk_hint(stderr: &str) -> &'static str {
    if stderr.contains("No module named 'ecp'") || stderr.contains("No module named 'ecp.") {
        "; the agent's Python has no ECP SDK: install it into the interpreter the manifest's command runs (`python3 -m pip install ecp-sdk`), or point the command at a virtualenv that has it"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_ecp_sdk_is_named_with_its_package() {
        let tb = "Traceback (most recent call last):\n  File \"agent.py\", line 3, in <module>\n    from ecp import agent\nModuleNotFoundError: No module named 'ecp'\n";
        assert!(super::missing_sdk_hint(tb).contains("pip install ecp-sdk"));
        assert!(super::missing_sdk_hint("ModuleNotFoundError: No module named 'ecp.server'").contains("ecp-sdk"));
        assert_eq!(super::missing_sdk_hint("ModuleNotFoundError: No module named 'ecpx'"), "");
        assert_eq!(super::missing_sdk_hint("ValueError: boom"), "");
    }

    use super::*;

    #[test]
    fn lone_surrogates_read_as_replacement_characters_and_pairs_stay() {
        let v = agent_json(r#"{"a": "x\ud800y", "b": "\ud83d\ude00", "c": "\\ud800", "d": "\udc00"}"#).unwrap();
        assert_eq!(v["a"], "x\u{FFFD}y");
        assert_eq!(v["b"], "\u{1F600}");
        assert_eq!(v["c"], "\\ud800", "an escaped backslash is text");
        assert_eq!(v["d"], "\u{FFFD}");
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let e = agent_json(&deep).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
        assert!(agent_json("{\"a\": \"\\u12").is_err());
        // A line of tiny objects, far more than its size allows.
        let many = format!("[{}]", vec!["{}"; 100_000].join(","));
        let e = agent_json(&many).unwrap_err().to_string();
        assert!(e.contains("more than 18750 JSON objects and arrays"), "{e}");
    }

    #[test]
    fn python_non_finite_numbers_read_as_null() {
        let v = agent_json(r#"{"a": NaN, "b": [Infinity, -Infinity, 1], "c": "NaN \" Infinity", "d": "x\ud800", "e": -1}"#).unwrap();
        assert_eq!(v["a"], Value::Null);
        assert_eq!(v["b"], serde_json::json!([null, null, 1]));
        assert_eq!(v["c"], "NaN \" Infinity", "text inside strings stays");
        assert_eq!(v["d"], "x\u{FFFD}", "with a lone surrogate in the same line");
        assert_eq!(v["e"], -1);
        assert!(agent_json(r#"{"a": NaNa}"#).is_err(), "only whole tokens");
        assert!(agent_json(r#"{"a": nan}"#).is_err(), "only Python's spelling");
    }

    #[test]
    fn http_targets_are_urls_with_a_host() {
        assert!(is_http_target("http://127.0.0.1:8765/ecp"));
        assert!(is_http_target("https://agent.example/ecp"));
        assert!(!is_http_target("python agent.py"));
        assert!(!is_http_target("http:/nohost"));
    }

    #[test]
    fn sse_events_are_parsed() {
        let raw = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"note\"}\r\n\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":1,\"result\":true}\r\n\r\n";
        let mut events = SseEvents::default();
        assert!(events.push(raw.as_bytes()).is_some_and(|v| v["result"] == true));
        // Split anywhere, a CRLF and a boundary included, it reads the same.
        for cut in 1..raw.len() {
            let mut events = SseEvents::default();
            let first = events.push(&raw.as_bytes()[..cut]);
            let v = first
                .or_else(|| events.push(&raw.as_bytes()[cut..]))
                .unwrap_or_else(|| panic!("cut at {cut}"));
            assert_eq!(v["id"], 1, "cut at {cut}");
        }
        // Lines may end in a lone CR too.
        let mut cr = SseEvents::default();
        assert!(cr.push(b"data: {\"id\":2,\r").is_none());
        assert_eq!(cr.push(b"data: \"result\":3}\r\r").unwrap()["result"], 3);
        // An event without the blank line after it counts only at the end.
        let mut open = SseEvents::default();
        assert!(open.push(b"data: {\"id\":1,\"result\":1}").is_none());
        assert_eq!(open.finish().unwrap()["result"], 1);
        // A long stream of progress events keeps only the event in progress.
        let mut long = SseEvents::default();
        for _ in 0..10_000 {
            assert!(long.push(b"data: {\"jsonrpc\":\"2.0\",\"method\":\"progress\"}\n\n").is_none());
        }
        assert!(long.pending.is_empty());
    }

    /// A stdio agent (Python's standard library only) that answers every
    /// call with its id, after writing the stray stdout `params.mode` asks for.
    fn scripted_agent(dir: &std::path::Path) -> StdioAgent {
        let script = dir.join("agent.py");
        std::fs::write(
            &script,
            r#"import json, sys
for line in sys.stdin:
    req = json.loads(line)
    mode = req["params"].get("mode")
    if mode == "json_not_object":
        print("42"); print("[1, 2]"); print("null")
    if mode == "text":
        print("starting up...")
    if mode == "slow":
        import time; time.sleep(1)
    answer_id = req["id"] - 1 if mode == "lag" else req["id"]
    answer = json.dumps({"jsonrpc": "2.0", "id": answer_id, "result": {"answered": req["id"]}})
    print(answer, flush=True)
    if mode == "twice":
        print(answer, flush=True)
"#,
        )
        .unwrap();
        StdioAgent::spawn(&format!("python3 {}", script.display()), &AgentEnv::default()).unwrap()
    }

    #[tokio::test]
    async fn stdout_json_that_is_not_an_object_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        let answer = agent.call("agent/step", json!({"mode": "json_not_object"}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 1, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn stray_stdout_text_is_passed_over_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let answer = agent
            .call("agent/step", json!({"mode": "text"}), Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(answer["result"]["answered"], 1, "{answer}");
        let tail = agent.stderr_tail();
        assert!(
            tail.contains("1 line(s) on stdout that are not JSON-RPC") && tail.contains("starting up..."),
            "{tail}"
        );
        agent.stop().await;
    }

    #[tokio::test]
    async fn the_late_answer_of_a_failed_call_is_not_taken_for_the_next_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        // A call given up at its timeout; the agent's answer to it follows.
        let e = agent
            .call("agent/step", json!({"mode": "slow"}), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(e.reason, ExitReason::Timeout, "{e}");
        let answer = agent.call("agent/reset", json!({}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 2, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn a_duplicate_answer_fails_one_call_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        agent.call("agent/step", json!({"mode": "twice"}), t).await.unwrap();
        // The second copy of call 1's answer comes first: call 2 fails ...
        let e = agent.call("agent/step", json!({}), t).await.unwrap_err();
        assert!(e.message.contains("expected 2, got 1"), "{e}");
        // ... and its own answer, which follows, is passed over by call 3.
        let answer = agent.call("agent/step", json!({}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 3, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn an_agent_answering_with_the_wrong_id_fails_each_call_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        // Each call's answer carries the previous call's id. The first is a
        // mismatch; so is the second, at once, instead of being passed over
        // as a late answer and waiting out its deadline.
        let t = Duration::from_secs(20);
        for (want, got) in [(1, 0), (2, 1)] {
            let e = agent.call("agent/step", json!({"mode": "lag"}), t).await.unwrap_err();
            assert!(e.message.contains(&format!("expected {want}, got {got}")), "{e}");
        }
        agent.stop().await;
    }

    #[tokio::test]
    async fn http_redirects_are_transport_errors_naming_the_location() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/ecp"))
            .respond_with(ResponseTemplate::new(307).insert_header("Location", "/elsewhere"))
            .mount(&server)
            .await;
        // Were the redirect followed, the call would pass here.
        Mock::given(method("POST"))
            .and(path("/elsewhere"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"jsonrpc": "2.0", "id": 1, "result": true})))
            .mount(&server)
            .await;
        let mut agent = HttpAgent::new(&format!("{}/ecp", server.uri())).unwrap();
        let e = agent.call("agent/reset", json!({}), Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(e.reason, ExitReason::TransportError, "{e}");
        assert!(e.message.contains("307") && e.message.contains("\"/elsewhere\""), "{e}");
    }

    #[tokio::test]
    async fn http_connection_errors_name_their_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut agent = HttpAgent::new(&format!("http://127.0.0.1:{port}/ecp")).unwrap();
        let e = agent.call("agent/reset", json!({}), Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(e.reason, ExitReason::TransportError, "{e}");
        assert!(e.message.to_lowercase().contains("connection refused"), "{e}");
    }

    #[test]
    fn environment_variable_names_are_checked() {
        assert!(check_env_name("OPENAI_API_KEY").is_ok());
        for bad in ["", "A=B", "A\0B"] {
            assert!(check_env_name(bad).unwrap_err().contains("must not be empty"), "{bad:?}");
        }
    }

    #[test]
    fn simple_commands_are_execed() {
        assert_eq!(shell_line("python3 agent.py --x=1"), "exec python3 agent.py --x=1");
        assert_eq!(shell_line("cd a && python3 b.py"), "cd a && python3 b.py");
        for as_written in [
            "MODE=test python3 agent.py",
            "exec python3 agent.py",
            "command python3 agent.py",
            "exit 3",
            "cd a",
        ] {
            assert_eq!(shell_line(as_written), as_written);
        }
    }
}
