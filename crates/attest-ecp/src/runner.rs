//! Running a manifest: one agent per scenario (scenarios optionally in
//! parallel), protocol negotiation, steps, grading, and the per-call and
//! whole-run time limits. A failing agent never raises: its step gets a failed
//! `execution` check, the rest of the scenario is skipped, and the next
//! scenario starts from a fresh agent.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use serde_json::{json, Map, Value};

use crate::grade::{self, AgentStatus, StepResult, TraceContext, Turn};
use crate::host::{CheckResult, GradingHost};
use crate::manifest::{Manifest, Scenario};
use crate::transport::{Agent, AgentEnv, CallError, ExitReason};
use crate::util::{clip, round3, utc_now, uuid4};

/// Agent step results a run keeps, in estimated bytes: each is held for the
/// report and, until its scenario ends, for the trace graders. A step whose
/// result would pass it fails with `error`, and the rest of its scenario is
/// skipped, so that an agent answering 16 MiB per step over a long manifest
/// cannot exhaust memory.
pub const MAX_KEPT_OUTPUT_BYTES: usize = 512 << 20;
/// What a step costs beyond its result: its record, its checks, its turn,
/// and its share of the reports built at the end.
const STEP_BYTES: usize = 8 << 10;

/// The protocol version this runtime speaks.
pub const PROTOCOL_VERSION: (u64, u64) = (1, 0);
const VERSION_UNSUPPORTED_CODE: i64 = -32001;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    Ok,
    Failed,
    Skipped,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Ok => "ok",
            StepStatus::Failed => "failed",
            StepStatus::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone)]
pub struct StepRecord {
    pub input: String,
    pub output: Option<String>,
    pub evaluation_context: Option<String>,
    pub tool_calls: Vec<Value>,
    pub logs: Option<String>,
    pub checks: Vec<CheckResult>,
    pub status: StepStatus,
    pub exit_reason: ExitReason,
    pub duration_ms: f64,
    pub usage: Option<Map<String, Value>>,
    pub error: Option<String>,
    /// What the agent said (`done` or `paused`); None when it never answered.
    pub agent_status: Option<AgentStatus>,
}

#[derive(Debug, Clone)]
pub struct ScenarioRecord {
    pub name: String,
    pub status: StepStatus,
    pub exit_reason: ExitReason,
    pub steps: Vec<StepRecord>,
    /// The retained tail of the agent's stderr.
    pub stderr: String,
    pub wall_ms: f64,
}

#[derive(Debug, Clone, Default)]
pub struct AgentInfo {
    pub name: Option<String>,
    pub protocol_version: String,
    pub capabilities: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_id: String,
    pub scenarios: Vec<ScenarioRecord>,
    pub exit_reason: ExitReason,
    pub agent: Option<AgentInfo>,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: f64,
    pub rpc_timeout_s: f64,
    pub max_duration_s: Option<f64>,
}

impl RunOutcome {
    /// (passed, total) over every check, execution checks included.
    pub fn tally(&self) -> (usize, usize) {
        let checks = self.scenarios.iter().flat_map(|s| &s.steps).flat_map(|s| &s.checks);
        checks.fold((0, 0), |(p, t), c| (p + usize::from(c.passed), t + 1))
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub rpc_timeout: Duration,
    pub max_duration: Option<Duration>,
    pub jobs: usize,
    /// What each agent process may use.
    pub agent_limits: crate::transport::AgentLimits,
    pub progress: bool,
    /// Progress lines give the reason of passing checks too.
    pub verbose: bool,
    /// Variables to pass beyond the manifest's `pass_env` (`--pass-env`).
    pub pass_env: Vec<String>,
    /// Pass the whole environment (`--inherit-env`).
    pub inherit_env: bool,
}

/// Progress on stderr (stdout may carry the JSON report): a line per
/// event, and on a terminal also a status line kept below them with the
/// scenarios and steps done and the failures so far.
pub struct Progress {
    enabled: bool,
    color: bool,
    tally: Mutex<Tally>,
}

#[derive(Default)]
struct Tally {
    scenarios: (usize, usize),
    steps: (usize, usize),
    failed_steps: usize,
}

impl Tally {
    fn status(&self) -> String {
        let failed = match self.failed_steps {
            0 => "no failures".to_owned(),
            1 => "\x1b[31m1 step failed\x1b[0m".to_owned(),
            n => format!("\x1b[31m{n} steps failed\x1b[0m"),
        };
        format!(
            "scenarios {}/{} · steps {}/{} · {failed}",
            self.scenarios.0, self.scenarios.1, self.steps.0, self.steps.1
        )
    }
}

impl Progress {
    /// Colour only on a terminal, and never when `NO_COLOR` is set to
    /// anything (no-color.org).
    pub fn new(enabled: bool) -> Progress {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Progress::to(enabled, enabled && !no_color && std::io::stderr().is_terminal())
    }

    fn to(enabled: bool, terminal: bool) -> Progress {
        Progress {
            enabled,
            color: terminal,
            tally: Mutex::new(Tally::default()),
        }
    }

    /// What the run holds, for the status line.
    fn plan(&self, scenarios: usize, steps: usize) {
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        t.scenarios.1 = scenarios;
        t.steps.1 = steps;
    }

    pub fn line(&self, text: &str) {
        self.marked(text, None, "");
    }

    /// A line with a verdict mark between `head` and `tail`.
    ///
    /// Lines quote the agent (its answers, its stderr) and the manifest:
    /// escapes they hold must not drive the terminal, and a line break in
    /// them must not start a line of its own (a forged `PASS`). The mark
    /// is the line's own, so only it keeps its colour.
    fn marked(&self, head: &str, passed: Option<bool>, tail: &str) {
        if self.enabled {
            let text = self.compose(head, passed, tail);
            let _ = std::io::stderr().lock().write_all(self.render(&text).as_bytes());
        }
    }

    /// The text of a [`Progress::marked`] line.
    fn compose(&self, head: &str, passed: Option<bool>, tail: &str) -> String {
        let mark = passed.map_or("", |p| self.mark(p));
        format!("{}{mark}{}", crate::util::one_line(head), crate::util::one_line(tail))
    }

    /// `text` as written: on a terminal the status line is cleared first and
    /// drawn again below it.
    fn render(&self, text: &str) -> String {
        if !self.color {
            return format!("{text}\n");
        }
        let status = self.tally.lock().unwrap_or_else(|p| p.into_inner()).status();
        let text = if text.is_empty() { String::new() } else { format!("{text}\n") };
        format!("\r\x1b[2K{text}{status}")
    }

    /// A step ran (and failed, or not).
    fn step_done(&self, failed: bool) {
        {
            let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
            t.steps.0 += 1;
            t.failed_steps += usize::from(failed);
        }
        self.redraw();
    }

    /// A scenario ended; steps it never ran count as done.
    fn scenario_done(&self, record: &ScenarioRecord) {
        {
            let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
            t.scenarios.0 += 1;
            t.steps.0 += record.steps.iter().filter(|s| s.status == StepStatus::Skipped).count();
        }
        self.redraw();
    }

    /// Draws the status line again (on a terminal only).
    fn redraw(&self) {
        if self.enabled && self.color {
            let _ = std::io::stderr().lock().write_all(self.render("").as_bytes());
        }
    }

    /// Leaves the terminal as it was: the status line is cleared.
    fn finish(&self) {
        if self.enabled && self.color {
            let _ = std::io::stderr().lock().write_all(b"\r\x1b[2K");
        }
    }

    fn mark(&self, passed: bool) -> &'static str {
        match (passed, self.color) {
            (true, true) => "\x1b[32mPASS\x1b[0m",
            (false, true) => "\x1b[31mFAIL\x1b[0m",
            (true, false) => "PASS",
            (false, false) => "FAIL",
        }
    }
}

struct Shared<'a> {
    manifest: &'a Manifest,
    host: &'a dyn GradingHost,
    opts: &'a RunOptions,
    run_id: String,
    deadline: Option<Instant>,
    env: AgentEnv,
    agent_info: Mutex<Option<AgentInfo>>,
    /// Set when negotiation fails in a way every scenario would hit.
    abort: Mutex<Option<String>>,
    undeclared_warned: AtomicBool,
    progress: Progress,
    kept: OutputBudget,
}

/// Estimated bytes of step results a run holds, against its limit.
struct OutputBudget {
    kept: AtomicUsize,
    limit: usize,
}

impl OutputBudget {
    fn new(limit: usize) -> OutputBudget {
        OutputBudget {
            kept: AtomicUsize::new(0),
            limit,
        }
    }

    /// Counts `bytes` in, or returns what is held already when they would pass the limit.
    fn take(&self, bytes: usize) -> Result<(), usize> {
        let before = self.kept.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) <= self.limit {
            return Ok(());
        }
        self.kept.fetch_sub(bytes, Ordering::Relaxed);
        Err(before)
    }
}

/// Why a scenario could not start, and whether the whole run must stop.
struct StartFailure {
    error: CallError,
    fatal: bool,
}

pub async fn run(manifest: &Manifest, host: &dyn GradingHost, opts: &RunOptions) -> RunOutcome {
    let started_at = utc_now();
    let start = Instant::now();
    let shared = Shared {
        manifest,
        host,
        opts,
        run_id: uuid4(),
        deadline: opts.max_duration.map(|d| start + d),
        env: AgentEnv {
            set: manifest.env.clone(),
            pass: manifest.pass_env.iter().chain(&opts.pass_env).cloned().collect(),
            inherit: opts.inherit_env,
            limits: opts.agent_limits,
        },
        agent_info: Mutex::new(None),
        abort: Mutex::new(None),
        undeclared_warned: AtomicBool::new(false),
        progress: Progress::new(opts.progress),
        kept: OutputBudget::new(MAX_KEPT_OUTPUT_BYTES),
    };
    // Over HTTP every scenario talks to the same server, so they run one at a time.
    let jobs = if crate::transport::is_http_target(&manifest.target) {
        1
    } else {
        opts.jobs.max(1)
    };
    let total = manifest.scenarios.len();
    shared.progress.plan(total, manifest.step_count());
    let scenarios: Vec<ScenarioRecord> = stream::iter(manifest.scenarios.iter().enumerate())
        .map(|(i, s)| {
            let shared = &shared;
            async move {
                let record = run_scenario(shared, i, total, s).await;
                shared.progress.scenario_done(&record);
                // Every step reaches the host's history, failed and skipped ones included.
                for (si, step) in record.steps.iter().enumerate() {
                    shared.host.record(&record.name, si + 1, &step.checks).await;
                }
                record
            }
        })
        .buffered(jobs)
        .collect()
        .await;
    shared.progress.finish();

    let mut exit_reason = ExitReason::Ok;
    for s in &scenarios {
        if s.exit_reason == ExitReason::MaxDurationExceeded {
            exit_reason = ExitReason::MaxDurationExceeded;
        } else if s.status != StepStatus::Ok && exit_reason == ExitReason::Ok {
            exit_reason = s.exit_reason;
        }
    }
    if shared.abort.lock().unwrap_or_else(|p| p.into_inner()).is_some() && exit_reason != ExitReason::MaxDurationExceeded {
        exit_reason = ExitReason::ProtocolError;
    }
    let agent = shared.agent_info.lock().unwrap_or_else(|p| p.into_inner()).clone();
    RunOutcome {
        run_id: shared.run_id.clone(),
        scenarios,
        exit_reason,
        agent,
        started_at,
        finished_at: utc_now(),
        duration_ms: start.elapsed().as_secs_f64() * 1000.0,
        rpc_timeout_s: opts.rpc_timeout.as_secs_f64(),
        max_duration_s: opts.max_duration.map(|d| d.as_secs_f64()),
    }
}

fn execution_check(message: &str) -> CheckResult {
    CheckResult {
        kind: "execution".into(),
        field: "agent".into(),
        passed: false,
        score: 0.0,
        reasoning: message.to_string(),
        status: None,
    }
}

fn skipped_steps(scenario: &Scenario, from: usize, message: &str) -> Vec<StepRecord> {
    scenario.steps[from..]
        .iter()
        .map(|s| StepRecord {
            input: s.input.clone(),
            output: None,
            evaluation_context: None,
            tool_calls: Vec::new(),
            logs: None,
            checks: vec![execution_check(message)],
            status: StepStatus::Skipped,
            exit_reason: ExitReason::Ok,
            duration_ms: 0.0,
            usage: None,
            error: Some(message.to_string()),
            agent_status: None,
        })
        .collect()
}

fn skipped_scenario(scenario: &Scenario, reason: ExitReason, message: &str, stderr: String) -> ScenarioRecord {
    ScenarioRecord {
        name: scenario.name.clone(),
        status: StepStatus::Failed,
        exit_reason: reason,
        steps: skipped_steps(scenario, 0, message),
        stderr,
        wall_ms: 0.0,
    }
}

impl Shared<'_> {
    fn budget_message(&self) -> String {
        format!(
            "run exceeded --max-duration of {:.1}s",
            self.opts.max_duration.map(|d| d.as_secs_f64()).unwrap_or(0.0)
        )
    }

    /// Counts a step result against [`MAX_KEPT_OUTPUT_BYTES`], or says why it cannot be kept.
    fn keep(&self, result: &Value, where_: &str) -> Result<(), CallError> {
        // A result is held twice during the run (in the scenario's turns and
        // in the step's record), and again in the JSON report built at its
        // end (which is written out without being copied to text). Measured
        // at the end of a run of 1 MB results: 3.3 times the results' size
        // above the runtime's own memory; counted at 4.
        let bytes = STEP_BYTES.saturating_add(estimated_bytes(result).saturating_mul(4));
        self.kept.take(bytes).map_err(|held| {
            CallError::new(
                ExitReason::Error,
                format!(
                    "agent/step result at {where_} not kept: this run already holds {} MiB of agent output and the limit is {} MiB; split the manifest or make the agent answer less",
                    held >> 20,
                    self.kept.limit >> 20
                ),
            )
        })
    }

    fn out_of_budget(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Timeout for the next call, and whether the run budget (not the per-call timeout) sets it.
    fn call_timeout(&self) -> (Duration, bool) {
        match self.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left < self.opts.rpc_timeout {
                    (left, true)
                } else {
                    (self.opts.rpc_timeout, false)
                }
            }
            None => (self.opts.rpc_timeout, false),
        }
    }

    /// Call a method and return its `result`, classifying every failure.
    async fn rpc(&self, agent: &mut Agent, method: &str, params: Value, where_: &str) -> Result<Value, CallError> {
        let (timeout, budget_bound) = self.call_timeout();
        let resp = match agent.call(method, params, timeout).await {
            Ok(r) => r,
            Err(e) if e.reason == ExitReason::Timeout && budget_bound => {
                return Err(CallError::new(
                    ExitReason::MaxDurationExceeded,
                    format!("{} while waiting for {method} at {where_}", self.budget_message()),
                ))
            }
            Err(e) => return Err(CallError::new(e.reason, format!("{method} failed at {where_}: {}", e.message))),
        };
        envelope_result(&resp, method).map_err(|e| CallError::new(e.reason, format!("{method} failed at {where_}: {}", e.message)))
    }
}

/// Check a JSON-RPC response envelope and return its result.
pub(crate) fn envelope_result(resp: &Value, method: &str) -> Result<Value, CallError> {
    let proto = |m: String| Err(CallError::new(ExitReason::ProtocolError, m));
    if resp.get("jsonrpc") != Some(&json!("2.0")) {
        return proto(format!("{method} response must include jsonrpc='2.0'"));
    }
    if resp.get("result").is_some() && resp.get("error").is_some() {
        return proto(format!("{method} response cannot include both result and error"));
    }
    if let Some(err) = resp.get("error") {
        let code = err.get("code").and_then(Value::as_i64);
        let message = err.get("message").and_then(Value::as_str);
        let (Some(code), Some(message)) = (code, message) else {
            return proto(format!(
                "{method} error must be an object with an integer code and a string message, got {}",
                clip(&err.to_string(), 300)
            ));
        };
        if code == VERSION_UNSUPPORTED_CODE {
            return proto(format!("VERSION_UNSUPPORTED ({code}): {}", clip(message, 500)));
        }
        return Err(CallError::new(
            ExitReason::AgentError,
            format!("the agent returned error {code}: {}", clip(message, 2000)),
        ));
    }
    match resp.get("result") {
        Some(r) => Ok(r.clone()),
        None => proto(format!("{method} response must include result")),
    }
}

fn parse_version(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.split_once('.')?;
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok(a) && ok(b) {
        Some((a.parse().ok()?, b.parse().ok()?))
    } else {
        None
    }
}

/// Validate an `agent/initialize` result; returns (name, negotiated version, capabilities).
pub fn check_initialize(result: &Value) -> Result<(String, String, Map<String, Value>), CallError> {
    let proto = |m: String| CallError::new(ExitReason::ProtocolError, m);
    let obj = result
        .as_object()
        .ok_or_else(|| proto("agent/initialize result must be an object".into()))?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| proto("agent/initialize result name must be a non-empty string".into()))?;
    let caps = obj
        .get("capabilities")
        .and_then(Value::as_object)
        .ok_or_else(|| proto("agent/initialize result capabilities must be an object".into()))?;
    for (k, v) in caps {
        if k.is_empty() || !v.is_object() {
            return Err(proto(format!(
                "agent/initialize capability '{k}' must map to an object (use {{}} when there are no options)"
            )));
        }
    }
    let version = match obj.get("protocol_version") {
        // Agents from before negotiation existed: the legacy protocol.
        None => "0.1".to_string(),
        Some(v) => {
            let (major, minor) = v.as_str().and_then(parse_version).ok_or_else(|| {
                proto(format!(
                    "agent/initialize result protocol_version must be a MAJOR.MINOR string, got {v}"
                ))
            })?;
            if major != PROTOCOL_VERSION.0 {
                return Err(proto(format!(
                    "VERSION_UNSUPPORTED ({VERSION_UNSUPPORTED_CODE}): runtime supports protocol {}.{}, but the agent selected {major}.{minor}",
                    PROTOCOL_VERSION.0, PROTOCOL_VERSION.1
                )));
            }
            format!("{major}.{}", minor.min(PROTOCOL_VERSION.1))
        }
    };
    Ok((name.to_string(), version, caps.clone()))
}

pub fn initialize_params() -> Value {
    json!({"protocol_version": format!("{}.{}", PROTOCOL_VERSION.0, PROTOCOL_VERSION.1), "config": {}})
}

async fn start_agent(sh: &Shared<'_>, scenario: &Scenario) -> Result<Agent, (StartFailure, String)> {
    let mut agent = Agent::start(&sh.manifest.target, &sh.env).map_err(|e| (StartFailure { error: e, fatal: false }, String::new()))?;
    let where_ = format!("scenario='{}'", scenario.name);
    let r = async {
        let result = sh.rpc(&mut agent, "agent/initialize", initialize_params(), &where_).await.map_err(|e| {
            let fatal = e.message.contains("VERSION_UNSUPPORTED");
            StartFailure { error: e, fatal }
        })?;
        let (name, version, caps) = check_initialize(&result).map_err(|e| {
            let fatal = e.message.contains("VERSION_UNSUPPORTED");
            StartFailure { error: CallError::new(e.reason, format!("invalid agent/initialize result at {where_}: {}", e.message)), fatal }
        })?;
        let needed = sh.manifest.required_capabilities();
        let missing: Vec<String> = needed.iter().filter(|(k, _)| !caps.contains_key(**k)).map(|(k, why)| format!("{k} (needed by {why})")).collect();
        if !missing.is_empty() {
            let declared: Vec<&String> = caps.keys().collect();
            let declared = if declared.is_empty() { "nothing".to_string() } else { format!("{declared:?}") };
            if sh.manifest.require_capabilities {
                let msg = format!(
                    "agent '{name}' does not declare: {}. It declares {declared}. This manifest sets require_capabilities: true",
                    missing.join("; ")
                );
                return Err(StartFailure { error: CallError::new(ExitReason::ProtocolError, msg), fatal: true });
            }
            if !sh.undeclared_warned.swap(true, Ordering::SeqCst) {
                sh.progress.line(&format!(
                    "warning: agent '{name}' does not declare {}; a failure there may mean it did not report it. Set require_capabilities: true to make this fatal.",
                    missing.join("; ")
                ));
            }
        }
        {
            let mut info = sh.agent_info.lock().unwrap_or_else(|p| p.into_inner());
            if info.is_none() {
                *info = Some(AgentInfo { name: Some(name), protocol_version: version, capabilities: caps.clone() });
            }
        }
        // An HTTP agent outlives the scenario: start each scenario from a clean state.
        if agent.is_http() && caps.contains_key("reset") {
            sh.rpc(&mut agent, "agent/reset", json!({}), &where_).await.map_err(|e| StartFailure { error: e, fatal: false })?;
        }
        Ok(())
    }
    .await;
    match r {
        Ok(()) => Ok(agent),
        Err(f) => {
            agent.stop().await;
            let stderr = agent.stderr();
            Err((f, stderr))
        }
    }
}

async fn run_scenario(sh: &Shared<'_>, index: usize, total: usize, scenario: &Scenario) -> ScenarioRecord {
    let label = format!("[{}/{total}] {}", index + 1, scenario.name);
    if let Some(msg) = sh.abort.lock().unwrap_or_else(|p| p.into_inner()).clone() {
        return skipped_scenario(scenario, ExitReason::ProtocolError, &msg, String::new());
    }
    if sh.out_of_budget() {
        sh.progress.line(&format!("{label}: skipped, {}", sh.budget_message()));
        return skipped_scenario(scenario, ExitReason::MaxDurationExceeded, &sh.budget_message(), String::new());
    }
    let wall = Instant::now();
    sh.progress.line(&format!("{label}: starting {} step(s)", scenario.steps.len()));
    let mut agent = match start_agent(sh, scenario).await {
        Ok(a) => a,
        Err((f, stderr)) => {
            if f.fatal {
                let mut abort = sh.abort.lock().unwrap_or_else(|p| p.into_inner());
                abort.get_or_insert_with(|| f.error.message.clone());
            }
            sh.progress.line(&format!(
                "{label}: could not start ({}): {}",
                f.error.reason.as_str(),
                f.error.message
            ));
            let mut rec = skipped_scenario(scenario, f.error.reason, &f.error.message, stderr);
            rec.wall_ms = wall.elapsed().as_secs_f64() * 1000.0;
            return rec;
        }
    };
    let agent_name = sh
        .agent_info
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|a| a.name.clone());
    let ctx = TraceContext {
        run_id: &sh.run_id,
        agent_name: agent_name.as_deref(),
        scenario_index: index,
    };
    let mut steps = Vec::with_capacity(scenario.steps.len());
    let mut turns: Vec<Turn> = Vec::new();
    let mut exit_reason = ExitReason::Ok;
    for (si, step) in scenario.steps.iter().enumerate() {
        if sh.out_of_budget() {
            exit_reason = ExitReason::MaxDurationExceeded;
            steps.extend(skipped_steps(scenario, si, &sh.budget_message()));
            break;
        }
        let where_ = format!("scenario='{}', step={}", scenario.name, si + 1);
        let t0 = Instant::now();
        let outcome = match sh.rpc(&mut agent, "agent/step", json!({"input": step.input}), &where_).await {
            Ok(result) => sh.keep(&result, &where_).and_then(|()| {
                StepResult::from_wire(&result)
                    .map_err(|e| CallError::new(ExitReason::ProtocolError, format!("invalid agent/step result at {where_}: {e}")))
            }),
            Err(e) => Err(e),
        };
        let duration_ms = t0.elapsed().as_secs_f64() * 1000.0;
        match outcome {
            Ok(result) => {
                turns.push(Turn {
                    input: step.input.clone(),
                    result: result.clone(),
                    duration_ms,
                });
                // Grading counts against the run's budget. A regex match
                // also stops where an agent call would (--timeout); model
                // calls have timeouts of their own.
                let grading = Instant::now() + sh.opts.rpc_timeout;
                let deadline = sh.deadline.map_or(grading, |d| d.min(grading));
                let checks = grade::grade_step(sh.host, step, &turns, &ctx, deadline, sh.deadline).await;
                let passed = checks.iter().filter(|c| c.passed).count();
                sh.progress.marked(
                    &format!("{label}: step {}/{} ", si + 1, scenario.steps.len()),
                    Some(passed == checks.len()),
                    &format!(
                        " {passed}/{} check(s){} ({:.1} ms)",
                        checks.len(),
                        if result.status == AgentStatus::Paused {
                            ", agent paused"
                        } else {
                            ""
                        },
                        duration_ms
                    ),
                );
                for c in checks.iter().filter(|c| !c.passed || sh.opts.verbose) {
                    let tail = format!(" {} on {}: {}", c.kind, c.field, clip(&c.reasoning, 300));
                    sh.progress.marked("    ", Some(c.passed), &tail);
                }
                sh.progress.step_done(passed < checks.len());
                steps.push(StepRecord {
                    input: step.input.clone(),
                    output: result.public_output.clone(),
                    evaluation_context: result.evaluation_context.clone(),
                    tool_calls: result.tool_calls.iter().cloned().map(Value::Object).collect(),
                    logs: result.logs.clone(),
                    checks,
                    status: StepStatus::Ok,
                    exit_reason: ExitReason::Ok,
                    duration_ms,
                    usage: result.usage.clone(),
                    error: None,
                    agent_status: Some(result.status),
                });
                // Grading that ran into the run's budget (a judge that did
                // not answer) ends the run as out of time, as an agent call
                // that ran into it does.
                if sh.out_of_budget() {
                    exit_reason = ExitReason::MaxDurationExceeded;
                    steps.extend(skipped_steps(scenario, si + 1, &sh.budget_message()));
                    break;
                }
            }
            Err(e) => {
                sh.progress.marked(
                    &format!("{label}: step {}/{} ", si + 1, scenario.steps.len()),
                    Some(false),
                    &format!(" ({}): {}", e.reason.as_str(), clip(&e.message, 500)),
                );
                sh.progress.step_done(true);
                steps.push(StepRecord {
                    input: step.input.clone(),
                    output: None,
                    evaluation_context: None,
                    tool_calls: Vec::new(),
                    logs: None,
                    checks: vec![execution_check(&format!("{}: {}", e.reason.as_str(), e.message))],
                    status: StepStatus::Failed,
                    exit_reason: e.reason,
                    duration_ms,
                    usage: None,
                    error: Some(e.message.clone()),
                    agent_status: None,
                });
                exit_reason = e.reason;
                if si + 1 < scenario.steps.len() {
                    steps.extend(skipped_steps(
                        scenario,
                        si + 1,
                        &format!("skipped after step {} failed ({})", si + 1, e.reason.as_str()),
                    ));
                }
                break;
            }
        }
    }
    agent.stop().await;
    ScenarioRecord {
        name: scenario.name.clone(),
        status: if exit_reason == ExitReason::Ok {
            StepStatus::Ok
        } else {
            StepStatus::Failed
        },
        exit_reason,
        steps,
        stderr: agent.stderr(),
        wall_ms: wall.elapsed().as_secs_f64() * 1000.0,
    }
}

/// A JSON value's size in memory, estimated: a value is 32 bytes, plus its
/// text; an object's entries live in B-tree nodes of 11 slots (a key's
/// 24-byte header and a value each) of which even a one-entry object has one.
fn estimated_bytes(v: &Value) -> usize {
    const VALUE: usize = 32;
    const NODE: usize = 11 * (24 + VALUE) + 16;
    match v {
        Value::String(s) => VALUE + s.len(),
        Value::Array(a) => VALUE + a.iter().map(estimated_bytes).sum::<usize>(),
        Value::Object(o) => {
            let nodes = o.len().div_ceil(11).max(1);
            VALUE + nodes * NODE + o.iter().map(|(k, v)| k.len() + estimated_bytes(v) - VALUE).sum::<usize>()
        }
        _ => VALUE,
    }
}

/// Round a duration for the report.
pub fn ms(x: f64) -> f64 {
    round3(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_output_stops_at_its_limit_and_a_refused_result_is_not_counted() {
        let budget = OutputBudget::new(1000);
        assert_eq!(budget.take(600), Ok(()));
        assert_eq!(budget.take(500), Err(600), "past the limit: refused, naming what is held");
        assert_eq!(budget.take(400), Ok(()), "the refused result took nothing");
        assert_eq!(budget.take(1), Err(1000));
        let big = json!({"public_output": "x".repeat(10_000), "tool_calls": [{"name": "t", "arguments": {"q": "y".repeat(5_000)}}]});
        let n = estimated_bytes(&big);
        assert!((16_500..17_500).contains(&n), "{n}");
        // A tool call of one short field is mostly the map that holds it.
        let tiny = estimated_bytes(&json!({"name": "a"}));
        assert!((600..700).contains(&tiny), "{tiny}");
    }

    #[test]
    fn a_terminal_gets_a_status_line_below_the_progress_lines_and_a_pipe_gets_lines_only() {
        // Not enabled: nothing is written to the test's stderr; rendering is the same.
        let live = Progress::to(false, true);
        live.plan(2, 3);
        assert_eq!(
            live.render("S: starting"),
            "\r\x1b[2KS: starting\nscenarios 0/2 · steps 0/3 · no failures"
        );
        live.step_done(true);
        live.step_done(false);
        assert_eq!(live.render(""), "\r\x1b[2Kscenarios 0/2 · steps 2/3 · \x1b[31m1 step failed\x1b[0m");
        let plain = Progress::to(true, false);
        plain.plan(2, 3);
        plain.step_done(true);
        assert_eq!(plain.render("S: step 1/3 FAIL"), "S: step 1/3 FAIL\n");
        // The mark keeps its colour; the agent's text around it is escaped.
        assert_eq!(
            live.compose("S: \x1b[2J step ", Some(true), " said \"x\nPASS\""),
            "S: \\u{1b}[2J step \x1b[32mPASS\x1b[0m said \"x\\u{a}PASS\""
        );
    }

    #[test]
    fn initialize_negotiation() {
        let (n, v, _) = check_initialize(&json!({"name": "A", "capabilities": {}})).unwrap();
        assert_eq!((n.as_str(), v.as_str()), ("A", "0.1"));
        let (_, v, _) = check_initialize(&json!({"name": "A", "capabilities": {}, "protocol_version": "1.7"})).unwrap();
        assert_eq!(v, "1.0");
        let e = check_initialize(&json!({"name": "A", "capabilities": {}, "protocol_version": "2.0"})).unwrap_err();
        assert!(e.message.contains("VERSION_UNSUPPORTED"));
        assert!(check_initialize(&json!({"name": "A", "capabilities": {"reset": true}})).is_err());
        assert!(check_initialize(&json!({"name": "A", "capabilities": {}, "protocol_version": "01.0"})).is_err());
    }

    #[test]
    fn envelope_classification() {
        assert_eq!(
            envelope_result(&json!({"jsonrpc": "2.0", "id": 1, "result": true}), "m").unwrap(),
            json!(true)
        );
        let e = envelope_result(
            &json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "boom"}}),
            "m",
        )
        .unwrap_err();
        assert_eq!(e.reason, ExitReason::AgentError);
        let e = envelope_result(&json!({"id": 1, "result": 1}), "m").unwrap_err();
        assert_eq!(e.reason, ExitReason::ProtocolError);
        let e = envelope_result(&json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "v"}}), "m").unwrap_err();
        assert!(e.message.contains("VERSION_UNSUPPORTED"));
    }
}
