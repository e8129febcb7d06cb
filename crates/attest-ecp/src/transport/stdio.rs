//! An agent the runtime spawns and talks to over stdin and stdout, one
//! JSON-RPC message a line, in a process group of its own (on Linux under
//! the [`super::guard`]).

use super::*;
#[cfg(unix)]
use rustix::process::Signal;

/// How long a stopping agent gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How many calls left unanswered a stdio agent remembers, to pass over
/// their late answers.
const MAX_ABANDONED: usize = 64;

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
pub(super) fn shell_line(target: &str) -> String {
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
            let parent = std::process::id();
            let limits = env.limits;
            guard::check_support();
            guard::hide_memory();
            // SAFETY: between fork and exec only async-signal-safe calls run
            // (prctl, capget, capset, getrlimit, setrlimit, getpid, getppid, fork,
            // close_range, close, open, read, dup2, sigprocmask, sigwaitinfo, waitpid,
            // kill, nanosleep, signal, _exit: direct system calls through rustix,
            // or libc's for the few rustix keeps unstable); nothing allocates.
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
                self.kill_group(Signal::KILL);
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

    fn kill_group(&self, sig: Signal) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid.filter(|_| !self.reaped).and_then(rustix::process::Pid::from_raw) {
            // The group leader is not reaped, so the id is still ours.
            let _ = rustix::process::kill_process_group(pgid, sig);
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
        self.kill_group(Signal::TERM);
        if tokio::time::timeout(STOP_GRACE, self.child.wait()).await.is_err() {
            // The guard ends the group and every other descendant, then
            // itself; killed with the group, it could not.
            self.end_all();
            let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        }
        // The leader is gone (or is made to go); anything left in the group goes too.
        self.kill_group(Signal::KILL);
        let _ = self.child.kill().await;
        self.reaped = true;
    }

    /// Ends the agent, its group and everything else it started: on Linux
    /// through its guard, which reaches descendants that left the group.
    fn end_all(&self) {
        #[cfg(target_os = "linux")]
        if let Some(guard) = self.pgid.filter(|_| !self.reaped).and_then(rustix::process::Pid::from_raw) {
            // The guard is not reaped, so the id is still ours.
            let _ = rustix::process::kill_process(guard, guard::RUNTIME_DIED);
            return;
        }
        self.kill_group(Signal::KILL);
    }
}

impl Drop for StdioAgent {
    fn drop(&mut self) {
        self.end_all();
    }
}

/// What to do when an agent's Python could not import the ECP SDK (its
/// traceback ends in `No module named 'ecp'`): the most common first-run
/// failure, whose traceback alone does not say which package to install.
pub(super) fn missing_sdk_hint(stderr: &str) -> &'static str {
    if stderr.contains("No module named 'ecp'") || stderr.contains("No module named 'ecp.") {
        "; the agent's Python has no ECP SDK: install it into the interpreter the manifest's command runs (`python3 -m pip install ecp-sdk`), or point the command at a virtualenv that has it"
    } else {
        ""
    }
}
