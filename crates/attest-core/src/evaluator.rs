//! The evaluator: a suite of compiled assertions, run against one parsed
//! trace, giving typed outcomes. No wire and no side effects: it records
//! nothing and spends nothing; the caller's sinks do, from the
//! [`Evaluation`] it returns.
//!
//! Free checks run first, in suite order: plugin checks in one sandboxed call
//! per plugin, regex-heavy checks on the regex threads (see
//! [`crate::watchdog`]), the rest where the evaluator is called. Dynamic
//! thresholds of the free layers are settled next, so short-circuiting sees
//! the status each result will carry. Paid checks (layers 5 and 6) then run
//! concurrently, unless a layer 1–4 assertion hard-failed and
//! short-circuiting is on, or the budget is spent.

use crate::backends::{AssertionPlugin, Backends, PluginAnswer, PluginCall, ProviderError, ScoreHistory};
use crate::drift::{dynamic_status, DriftReport, DriftStatus, Fingerprint};
use crate::layers::{AssertionType, Check, CompiledAssertion, Evidence, Status, Verdict};
use crate::suite::{SuiteError, SuiteReader};
use crate::text::{clip, quote};
use crate::trace::Trace;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// One assertion of a suite.
#[derive(Debug, Clone)]
pub struct Planned {
    pub id: String,
    pub kind: AssertionType,
    pub compiled: Arc<CompiledAssertion>,
}

impl Planned {
    /// Whether evaluating this assertion may hold its thread: a plugin call
    /// (up to the eval timeout), or a history read for a dynamic threshold.
    pub fn may_block(&self) -> bool {
        self.kind == AssertionType::Plugin || self.compiled.dynamic
    }
}

/// What one evaluation may use, besides the suite and the trace.
pub struct Context<'a> {
    /// Past it, the evaluation stops with a timeout.
    pub deadline: Instant,
    /// Earlier scores, for `threshold: "dynamic"` (`None`: history is off).
    pub history: Option<&'a dyn ScoreHistory>,
    /// How many earlier scores a dynamic threshold looks at.
    pub dynamic_window: u64,
    /// Fewer earlier scores than this: the static band applies.
    pub dynamic_min_samples: usize,
    /// Skip paid layers when a layer 1–4 assertion hard-failed.
    pub short_circuit: bool,
    /// The session's budget for paid layers and what it has spent, in USD.
    pub budget: Option<(f64, f64)>,
}

/// How one assertion came out.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: Status,
    pub verdict: Verdict,
    /// A plugin's `details` (bounded).
    pub details: Option<Value>,
    pub duration_ms: u64,
    /// USD, for paid layers.
    pub cost: f64,
    /// Not run (short-circuit): recorded in no history.
    pub skipped: bool,
    /// What the status was judged against (paid and dynamic assertions).
    pub threshold_source: Option<String>,
}

/// Everything one evaluation concluded, for the caller's results and sinks.
#[derive(Debug)]
pub struct Evaluation {
    /// In suite order; `None` for assertions the caller answered itself.
    pub outcomes: Vec<Option<Outcome>>,
    /// Failures of dynamic thresholds judged from history.
    pub alerts: Vec<DriftReport>,
}

impl Evaluation {
    /// What the paid layers cost.
    pub fn cost(&self) -> f64 {
        self.outcomes.iter().flatten().fold(0.0, |acc, o| acc + o.cost)
    }
}

/// Why an evaluation stopped without results.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalError {
    /// The deadline passed with `done` of `total` assertions evaluated.
    Timeout { done: usize, total: usize },
    /// Regex work on the regex threads did not finish before the deadline.
    RegexTimeout,
    /// `pending` paid assertions were still waiting for their provider;
    /// `cost` is what the ones that did answer cost, which is still spent.
    PaidTimeout { pending: usize, cost: f64 },
    /// The budget is spent; `index` is the first paid assertion refused.
    BudgetSpent { index: usize, budget: f64, spent: f64 },
    /// A provider failed for the assertion at `index`; `cost` is what the
    /// paid assertions that did answer cost, which is still spent.
    Provider { index: usize, error: ProviderError, cost: f64 },
}

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvalError::Timeout { done, total } => write!(f, "the deadline passed with {done} of {total} assertions evaluated"),
            EvalError::RegexTimeout => write!(f, "regex or schema checks did not finish before the deadline"),
            EvalError::PaidTimeout { pending, .. } => {
                write!(f, "{pending} paid assertions were still waiting for their provider at the deadline")
            }
            EvalError::BudgetSpent { index, budget, spent } => {
                write!(
                    f,
                    "assertion {index} refused: the budget of ${budget} is spent (${spent:.6} so far)"
                )
            }
            EvalError::Provider { index, error, .. } => write!(f, "assertion {index}: {error}"),
        }
    }
}

impl std::error::Error for EvalError {}

/// Largest plugin `details` kept in an outcome, serialised.
pub const MAX_DETAILS_BYTES: usize = 4096;
/// Longest text of plugin evidence kept.
const EVIDENCE_CHARS: usize = 500;

/// A suite of assertions, compiled once, to evaluate against many traces.
///
/// Compiling checks every spec and builds what each check needs (regex
/// programs, schema validators) once; evaluating only runs them, so one
/// `Evaluator` serves any number of traces, from any number of threads.
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
///
/// use attest_core::backends::{Backends, PaidCheck, PluginCheck};
/// use attest_core::evaluator::{Context, Evaluator, Source};
/// use attest_core::layers::{AssertionType, Spec, SpecError, Status};
/// use attest_core::trace::validate::{parse_trace, Limits};
/// use serde_json::json;
///
/// /// Layers 1-4 and 7 only: no plugin host, no model provider.
/// struct BuiltIn;
///
/// impl Backends for BuiltIn {
///     fn compile_plugin(&self, _: &Spec<'_>) -> Result<PluginCheck, SpecError> {
///         Err(SpecError::new("type", "no plugins here", "evaluate built-in types only"))
///     }
///     fn compile_paid(&self, _: AssertionType, _: &Spec<'_>) -> Result<Box<dyn PaidCheck>, SpecError> {
///         Err(SpecError::new("type", "no providers here", "evaluate built-in types only"))
///     }
/// }
///
/// // Compiled once...
/// let specs = [
///     json!({"target": "output.message", "check": "contains", "value": "refund"}),
///     json!({"check": "required_tools", "tools": ["lookup_order"]}),
/// ];
/// let suite = Evaluator::compile(
///     [
///         Source { id: Some("mentions-refund"), kind: Some("content"), spec: Some(&specs[0]) },
///         Source { id: Some("looked-it-up"), kind: Some("trace"), spec: Some(&specs[1]) },
///     ],
///     &BuiltIn,
/// )
/// .expect("the suite is valid");
///
/// // ...evaluated against each trace.
/// let text = json!({
///     "schema_version": 1,
///     "trace_id": "trc_1",
///     "output": {"message": "Your refund is on its way."},
///     "steps": [{"type": "tool_call", "name": "lookup_order", "args": {}, "result": {}}],
/// })
/// .to_string();
/// let raw = serde_json::value::RawValue::from_string(text.clone()).unwrap();
/// let trace = Arc::new(parse_trace(&raw, &Limits::default()).expect("a valid trace").trace);
/// let cx = Context {
///     deadline: Instant::now() + Duration::from_secs(5),
///     history: None,
///     dynamic_window: 0,
///     dynamic_min_samples: 0,
///     short_circuit: true,
///     budget: None,
/// };
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// let evaluation = runtime.block_on(suite.evaluate(&text, trace, &cx)).expect("within the deadline");
/// let statuses: Vec<Status> = evaluation.outcomes.iter().flatten().map(|o| o.status).collect();
/// assert_eq!(statuses, [Status::Pass, Status::Pass]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Evaluator {
    suite: Vec<Planned>,
}

/// One assertion as a front door received it, before it is checked.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub id: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub spec: Option<&'a Value>,
}

impl Evaluator {
    /// Checks `assertions` as a suite (see [`crate::suite`]) and compiles
    /// each spec; `backends` compile the types the core does not evaluate
    /// itself. The first assertion at fault is the error.
    pub fn compile<'a>(assertions: impl IntoIterator<Item = Source<'a>>, backends: &dyn Backends) -> Result<Evaluator, SuiteError> {
        let mut reader = SuiteReader::default();
        let mut suite = Vec::new();
        for (index, a) in assertions.into_iter().enumerate() {
            let id = reader.id(index, a.id)?;
            let kind = reader.kind(index, id, a.kind)?;
            let compiled = CompiledAssertion::compile(kind, a.spec, backends).map_err(|error| SuiteError::Spec {
                index,
                id: id.to_owned(),
                kind,
                error,
            })?;
            suite.push(Planned {
                id: id.to_owned(),
                kind,
                compiled: Arc::new(compiled),
            });
        }
        Ok(Evaluator { suite })
    }

    /// A suite the caller checked and compiled itself (the engine does, to
    /// share compiled assertions between requests).
    pub fn from_planned(suite: Vec<Planned>) -> Evaluator {
        Evaluator { suite }
    }

    /// The assertions, in suite order.
    pub fn assertions(&self) -> &[Planned] {
        &self.suite
    }

    /// Whether evaluating may hold its thread (see [`Planned::may_block`]).
    pub fn may_block(&self) -> bool {
        self.suite.iter().any(Planned::may_block)
    }

    /// The most the paid assertions can cost on a trace of `trace_bytes`
    /// (see [`PaidCheck::worst_cost`]).
    pub fn worst_cost(&self, trace_bytes: usize) -> f64 {
        self.suite
            .iter()
            .map(|p| match &p.compiled.check {
                Check::Paid(c) => c.worst_cost(trace_bytes),
                _ => 0.0,
            })
            .sum()
    }

    /// Evaluates the suite on `trace` (`trace_json`: its text as received,
    /// which plugins read).
    pub async fn evaluate(&self, trace_json: &str, trace: Arc<Trace>, cx: &Context<'_>) -> Result<Evaluation, EvalError> {
        self.evaluate_known(trace_json, trace, &[], cx).await
    }

    /// [`Evaluator::evaluate`], where `known[i]` is the status of an
    /// assertion the caller has answered already (from its idempotency
    /// cache): it is not evaluated, and counts for short-circuiting.
    pub async fn evaluate_known(
        &self,
        trace_json: &str,
        trace: Arc<Trace>,
        known: &[Option<Status>],
        cx: &Context<'_>,
    ) -> Result<Evaluation, EvalError> {
        evaluate(&self.suite, trace_json, trace, known, cx).await
    }
}

async fn evaluate(
    suite: &[Planned],
    trace_json: &str,
    trace: Arc<Trace>,
    known: &[Option<Status>],
    cx: &Context<'_>,
) -> Result<Evaluation, EvalError> {
    let fresh = |i: usize| known.get(i).is_none_or(Option::is_none);
    let mut plugin_answers = run_plugins(trace_json, suite, &fresh, cx);
    let plugin_cost: f64 = plugin_answers.iter().flatten().map(|(a, _)| a.cost).sum();
    let mut guarded = guarded_verdicts(suite, &trace, trace_json.len(), cx.deadline, &fresh).await?;
    let mut progress: Vec<Progress> = Vec::with_capacity(suite.len());
    for (i, p) in suite.iter().enumerate() {
        if Instant::now() > cx.deadline {
            return Err(EvalError::Timeout {
                done: i,
                total: suite.len(),
            });
        }
        if let Some(status) = known.get(i).copied().flatten() {
            progress.push(Progress::Known(status));
            continue;
        }
        if p.kind.is_paid() {
            progress.push(Progress::Pending);
            continue;
        }
        let t0 = Instant::now();
        let (status, verdict, details, plugin_ms, cost) = match plugin_answers.get_mut(i).and_then(Option::take) {
            Some((answer, ms)) => {
                let cost = answer.cost;
                let verdict = Verdict {
                    passed: answer.passed,
                    score: answer.score,
                    explanation: answer.explanation,
                    always_hard: answer.always_hard,
                    evidence: plugin_evidence(answer.details.as_ref()),
                };
                let (status, verdict) = p.compiled.classify(verdict);
                (status, verdict, bounded_details(answer.details), ms, cost)
            }
            None => {
                let (status, verdict) = match guarded.as_mut().and_then(|g| g[i].take()) {
                    Some(done) => done,
                    None => match crate::layers::content::within_deadline(cx.deadline, || p.compiled.evaluate(&trace)) {
                        Some(done) => done,
                        None => {
                            return Err(EvalError::Timeout {
                                done: i,
                                total: suite.len(),
                            })
                        }
                    },
                };
                (status, verdict, None, 0, 0.0)
            }
        };
        progress.push(Progress::Done(Settling::new(Outcome {
            status,
            verdict,
            details,
            duration_ms: t0.elapsed().as_millis() as u64 + plugin_ms,
            cost,
            skipped: false,
            threshold_source: None,
        })));
    }
    let mut alerts = Vec::new();
    let agent_id = trace.agent_id.as_deref();
    for (p, step) in suite.iter().zip(progress.iter_mut()) {
        if let Progress::Done(s) = step {
            s.settle(cx, p, agent_id, &mut alerts);
        }
    }
    if progress.iter().any(|s| matches!(s, Progress::Pending)) {
        run_paid(suite, &trace, &mut progress, cx, plugin_cost).await?;
    }
    let outcomes = suite
        .iter()
        .zip(progress)
        .map(|(p, step)| match step {
            Progress::Known(_) => None,
            Progress::Done(mut s) => {
                s.settle(cx, p, agent_id, &mut alerts);
                Some(s.outcome)
            }
            Progress::Pending => unreachable!("run_paid settles every pending assertion"),
        })
        .collect();
    Ok(Evaluation { outcomes, alerts })
}

/// How one assertion stands while the suite is evaluated.
enum Progress {
    /// Answered by the caller.
    Known(Status),
    /// Waiting for its provider (layers 5 and 6).
    Pending,
    Done(Settling),
}

impl Progress {
    fn status(&self) -> Option<Status> {
        match self {
            Progress::Known(s) => Some(*s),
            Progress::Done(s) => Some(s.outcome.status),
            Progress::Pending => None,
        }
    }
}

/// An outcome whose dynamic threshold may not be applied yet.
struct Settling {
    outcome: Outcome,
    settled: bool,
}

impl Settling {
    fn new(outcome: Outcome) -> Settling {
        Settling { outcome, settled: false }
    }

    /// Applies the assertion's dynamic threshold, once: free layers are
    /// settled before paid ones are planned, so short-circuiting sees the
    /// status the result will carry.
    fn settle(&mut self, cx: &Context<'_>, p: &Planned, agent_id: Option<&str>, alerts: &mut Vec<DriftReport>) {
        if self.settled {
            return;
        }
        self.settled = true;
        let o = &mut self.outcome;
        if p.kind.is_paid() && !o.skipped {
            o.threshold_source = Some("static".to_owned());
        }
        // Faults and `forbidden` stay hard: history must not excuse them.
        if p.compiled.dynamic && !o.verdict.always_hard && !o.skipped {
            let fp = Fingerprint::new(&p.compiled.spec_digest, agent_id);
            let (status, why, alert, source) = dynamic(cx, fp, &p.id, o.verdict.score, p.compiled.soft);
            o.status = status;
            o.verdict.explanation.push(' ');
            o.verdict.explanation.push_str(&why);
            alerts.extend(alert);
            o.threshold_source = Some(source);
        }
    }
}

/// Judges a score against its history (`threshold: "dynamic"`); a failure
/// judged from history also yields a drift report for `drift_alert`.
fn dynamic(cx: &Context<'_>, fp: Fingerprint, id: &str, score: f64, soft: bool) -> (Status, String, Option<DriftReport>, String) {
    let window = cx.dynamic_window;
    let min = cx.dynamic_min_samples;
    let scores = cx.history.map(|h| {
        h.recent_scores(fp, window, cx.deadline).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot read result history; using the static band");
            Vec::new()
        })
    });
    let (status, why) = dynamic_status(score, scores.as_deref(), min, soft);
    let alert = match &scores {
        Some(past) if status != Status::Pass && past.len() >= min => {
            // The window as it will be once this result is recorded.
            let mut window_scores = Vec::with_capacity(past.len() + 1);
            window_scores.push(score);
            window_scores.extend(past.iter().take((window as usize).saturating_sub(1)).copied());
            let mut report = DriftReport::from_window(id.to_owned(), Some(fp), &window_scores, window);
            report.status = DriftStatus::DriftDetected;
            Some(report)
        }
        _ => None,
    };
    let source = match &scores {
        Some(past) if past.len() >= min => format!("dynamic: mean - 2 x stddev of {} samples", past.len()),
        Some(past) => format!("dynamic: static band ({} of {min} samples)", past.len()),
        None => "dynamic: static band (history off)".to_owned(),
    };
    (status, why, alert, source)
}

/// One plugin, the positions of its checks in the suite, and their configs.
type PluginCalls<'a> = (&'a Arc<dyn AssertionPlugin>, Vec<usize>, Vec<&'a str>);

/// Runs every plugin check the caller did not answer, one sandboxed call per
/// plugin; each answer with its share of the call's time. What plugins'
/// model calls spend comes off the budget the next plugin may use.
fn run_plugins(
    trace_json: &str,
    suite: &[Planned],
    fresh: &(dyn Fn(usize) -> bool + Sync),
    cx: &Context<'_>,
) -> Vec<Option<(PluginAnswer, u64)>> {
    // Left empty (no allocation) for a suite without plugin checks.
    let mut out: Vec<Option<(PluginAnswer, u64)>> = Vec::new();
    let mut by_plugin: Vec<PluginCalls<'_>> = Vec::new();
    for (i, p) in suite.iter().enumerate() {
        let Check::Plugin(check) = &p.compiled.check else { continue };
        if !fresh(i) {
            continue;
        }
        match by_plugin.iter_mut().find(|(pl, _, _)| Arc::ptr_eq(pl, &check.plugin)) {
            Some((_, at, configs)) => {
                at.push(i);
                configs.push(check.config.as_str());
            }
            None => by_plugin.push((&check.plugin, vec![i], vec![check.config.as_str()])),
        }
    }
    if !by_plugin.is_empty() {
        out.resize_with(suite.len(), || None);
    }
    let mut spent = 0.0;
    for (plugin, at, configs) in by_plugin {
        let t0 = Instant::now();
        let call = PluginCall {
            deadline: cx.deadline,
            budget_left: cx.budget.map(|(budget, before)| budget - before - spent),
        };
        let answers = plugin.evaluate(trace_json, &configs, &call);
        spent += answers.iter().map(|a| a.cost).sum::<f64>();
        let share = t0.elapsed().as_millis() as u64 / at.len() as u64;
        for (i, answer) in at.into_iter().zip(answers) {
            out[i] = Some((answer, share));
        }
    }
    out
}

/// A plugin's `details.expected` / `details.actual` (and `path`, `hint`),
/// when it provides them, as evidence.
fn plugin_evidence(details: Option<&Value>) -> Option<Box<Evidence>> {
    let d = details?.as_object()?;
    let text = |k: &str| {
        d.get(k).filter(|v| !v.is_null()).map(|v| match v {
            Value::String(s) => clip(s, EVIDENCE_CHARS),
            other => clip(&other.to_string(), EVIDENCE_CHARS),
        })
    };
    let e = Evidence {
        expected: text("expected"),
        actual: text("actual"),
        path: text("path").or_else(|| text("trace_node_path")),
        hint: text("hint").or_else(|| text("suggested_action")),
        judge: None,
    };
    (e != Evidence::default()).then(|| Box::new(e))
}

/// Plugin details are kept only while small: they travel in the response line.
fn bounded_details(details: Option<Value>) -> Option<Value> {
    let d = details?;
    let len = d.to_string().len();
    if len <= MAX_DETAILS_BYTES {
        Some(d)
    } else {
        Some(serde_json::json!({"omitted": format!("details were {len} bytes; the limit is {MAX_DETAILS_BYTES}")}))
    }
}

/// Built-in checks whose regex work on this trace could outlast the
/// deadline are run ahead as guarded work on the regex threads; schema
/// checks with `patternProperties` (from the blocking pool) and recursive schemas
/// (from anywhere) always run there (see `watchdog`); `None` when no check
/// needs it.
async fn guarded_verdicts(
    suite: &[Planned],
    trace: &Arc<Trace>,
    trace_bytes: usize,
    deadline: Instant,
    fresh: &(dyn Fn(usize) -> bool + Sync),
) -> Result<Option<Vec<Option<(Status, Verdict)>>>, EvalError> {
    let weight: u64 = suite.iter().map(|p| p.compiled.scan_weight() as u64).sum();
    let guarded = weight.saturating_mul(trace_bytes as u64) > crate::watchdog::GUARDED_SCAN_COST;
    let jobs: Vec<(usize, Arc<CompiledAssertion>)> = suite
        .iter()
        .enumerate()
        .filter(|(i, _)| fresh(*i))
        // Schema `patternProperties` go to the regex threads only from the blocking pool,
        // whose threads are as many as requests in flight; the async workers
        // are as many as the cores, so their regex caches are bounded already.
        .filter(|(_, p)| {
            if guarded {
                p.compiled.scan_weight() > 0 || p.compiled.may_run_long()
            } else {
                (p.compiled.needs_regex_thread() && crate::lane::on_pool()) || p.compiled.may_run_long()
            }
        })
        .map(|(i, p)| (i, p.compiled.clone()))
        .collect();
    if jobs.is_empty() {
        return Ok(None);
    }
    let (n, trace) = (suite.len(), trace.clone());
    let work = move || {
        let mut out: Vec<Option<(Status, Verdict)>> = (0..n).map(|_| None).collect();
        for (i, c) in jobs {
            // A long validation stops at the deadline rather than finish
            // for no one (see `schema::Step`).
            out[i] = Some(crate::layers::content::within_deadline(deadline, || c.evaluate(&trace))?);
        }
        Some(out)
    };
    let verdicts = if guarded {
        crate::watchdog::run(deadline, work).await
    } else {
        crate::watchdog::run_short(deadline, work).await
    };
    match verdicts {
        Ok(Some(v)) => Ok(Some(v)),
        _ => Err(EvalError::RegexTimeout),
    }
}

/// Settles every pending (paid) assertion: skipped when a layer 1–4
/// assertion hard-failed and short-circuiting is on, refused when the
/// budget is spent, else asked of its provider, all concurrently.
/// `plugin_cost` is what plugins' model calls spent earlier in this evaluation.
async fn run_paid(
    suite: &[Planned],
    trace: &Trace,
    progress: &mut [Progress],
    cx: &Context<'_>,
    plugin_cost: f64,
) -> Result<(), EvalError> {
    let pending: Vec<usize> = (0..suite.len()).filter(|i| matches!(progress[*i], Progress::Pending)).collect();
    if cx.short_circuit {
        let failed = suite
            .iter()
            .zip(progress.iter())
            .find(|(p, s)| p.kind.layer() <= 4 && s.status() == Some(Status::HardFail));
        if let Some((culprit, _)) = failed {
            for i in pending {
                progress[i] = Progress::Done(Settling::new(skipped(culprit, &suite[i])));
            }
            return Ok(());
        }
    }
    if let Some((budget, spent)) = cx.budget {
        let spent = spent + plugin_cost;
        if spent >= budget {
            return Err(EvalError::BudgetSpent {
                index: pending[0],
                budget,
                spent,
            });
        }
    }
    let deadline = tokio::time::Instant::from_std(cx.deadline);
    // What answered calls cost, kept as they answer: at the deadline the
    // answers still out are dropped, and what the others cost is spent all
    // the same.
    let answered_cost = std::sync::Mutex::new(0.0_f64);
    let answered_cost = &answered_cost;
    let calls = pending.iter().map(|&i| async move {
        let t0 = Instant::now();
        let r = suite[i].compiled.evaluate_paid(trace, deadline).await;
        if let Ok((_, cost)) = &r {
            *answered_cost.lock().unwrap_or_else(|e| e.into_inner()) += cost;
        }
        (i, r, t0.elapsed().as_millis() as u64)
    });
    let spent_so_far = || *answered_cost.lock().unwrap_or_else(|e| e.into_inner());
    let answers = tokio::time::timeout_at(deadline, futures_util::future::join_all(calls))
        .await
        .map_err(|_| EvalError::PaidTimeout {
            pending: pending.len(),
            cost: spent_so_far(),
        })?;
    let mut first_error = None;
    let mut cost_spent = 0.0;
    for (i, answer, ms) in answers {
        match answer {
            Ok((verdict, cost)) => {
                cost_spent += cost;
                let (status, verdict) = suite[i].compiled.classify(verdict);
                progress[i] = Progress::Done(Settling::new(Outcome {
                    status,
                    verdict,
                    details: None,
                    duration_ms: ms,
                    cost,
                    skipped: false,
                    threshold_source: None,
                }));
            }
            Err(e) if first_error.is_none() => first_error = Some((i, e)),
            Err(_) => {}
        }
    }
    match first_error {
        None => Ok(()),
        Some((_, ProviderError::Timeout)) => Err(EvalError::PaidTimeout {
            pending: pending.len(),
            cost: cost_spent,
        }),
        // Refused by the session's ledger before it was sent.
        Some((index, ProviderError::BudgetSpent { budget, spent })) => Err(EvalError::BudgetSpent { index, budget, spent }),
        Some((index, error)) => Err(EvalError::Provider {
            index,
            error,
            cost: cost_spent,
        }),
    }
}

/// A paid assertion not sent to its provider because `culprit` hard-failed.
fn skipped(culprit: &Planned, p: &Planned) -> Outcome {
    Outcome {
        status: Status::HardFail,
        verdict: Verdict::fail(format!(
            "Skipped: layer {} assertion {} ({}) hard-failed, so this {} assertion was not sent to its provider (cost 0). Set short_circuit = false under [providers] to always run paid layers.",
            culprit.kind.layer(),
            quote(&culprit.id),
            culprit.kind.name(),
            p.kind.name()
        ))
        .with(
            Evidence::new(
                format!("layers 1-4 pass before {} runs", p.kind.name()),
                format!("{} ({}) hard-failed", quote(&culprit.id), culprit.kind.name()),
            )
            .hint(format!(
                "Fix the failure of {} first; this assertion is then sent to its provider on the next run.",
                quote(&culprit.id)
            )),
        ),
        details: None,
        duration_ms: 0,
        cost: 0.0,
        skipped: true,
        threshold_source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::{Backends, BoxFuture, PaidCheck, PluginCheck};
    use crate::layers::{Spec, SpecError};
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A plugin that passes when its config says so, counting its calls.
    #[derive(Debug, Default)]
    struct Echo {
        calls: AtomicUsize,
    }

    impl AssertionPlugin for Echo {
        fn id(&self) -> &str {
            "echo"
        }
        fn evaluate(&self, _trace_json: &str, configs: &[&str], call: &PluginCall) -> Vec<PluginAnswer> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            configs
                .iter()
                .map(|c| PluginAnswer {
                    passed: c.contains("true"),
                    always_hard: false,
                    score: 7.0,
                    explanation: format!("echoed with {:?} left", call.budget_left),
                    details: Some(json!({"expected": "a pass", "actual": c})),
                    // A config naming "spend" stands for a plugin whose model calls cost.
                    cost: if c.contains("spend") { 0.25 } else { 0.0 },
                })
                .collect()
        }
    }

    /// A paid check that costs a cent and scores what it was told; told a
    /// negative score its provider fails, told a score over 1 it never
    /// answers.
    #[derive(Debug)]
    struct Fixed(f64);

    impl PaidCheck for Fixed {
        fn evaluate<'a>(
            &'a self,
            _trace: &'a Trace,
            _deadline: tokio::time::Instant,
        ) -> BoxFuture<'a, Result<(Verdict, f64), ProviderError>> {
            let score = self.0;
            Box::pin(async move {
                if score < 0.0 {
                    return Err(ProviderError::failed("provider down", 3));
                }
                if score > 1.0 {
                    std::future::pending::<()>().await;
                }
                Ok((Verdict::from_bool(score >= 0.5, format!("scored {score}")), 0.01))
            })
        }
    }

    struct Fakes {
        plugin: Arc<Echo>,
    }

    impl Backends for Fakes {
        fn compile_plugin(&self, spec: &Spec<'_>) -> Result<PluginCheck, SpecError> {
            Ok(PluginCheck {
                plugin: self.plugin.clone(),
                config: spec.raw("config").map_or("{}".into(), |c| c.to_string()),
            })
        }
        fn compile_paid(&self, _kind: AssertionType, spec: &Spec<'_>) -> Result<Box<dyn PaidCheck>, SpecError> {
            Ok(Box::new(Fixed(spec.raw("score").and_then(Value::as_f64).unwrap_or(1.0))))
        }
    }

    struct Past(Vec<f64>);

    impl ScoreHistory for Past {
        fn recent_scores(&self, _fingerprint: Fingerprint, limit: u64, _deadline: Instant) -> Result<Vec<f64>, String> {
            Ok(self.0.iter().take(limit as usize).copied().collect())
        }
    }

    fn suite(fakes: &Fakes, assertions: &[(&str, Value)]) -> Evaluator {
        let ids: Vec<String> = (0..assertions.len()).map(|i| format!("a{i}")).collect();
        let sources = assertions.iter().zip(&ids).map(|((kind, spec), id)| Source {
            id: Some(id),
            kind: Some(kind),
            spec: Some(spec),
        });
        Evaluator::compile(sources, fakes).unwrap()
    }

    const TRACE: &str = r#"{"schema_version":1,"trace_id":"t","agent_id":"bot","output":{"message":"refund issued"}}"#;

    fn context(history: Option<&dyn ScoreHistory>) -> Context<'_> {
        Context {
            deadline: Instant::now() + Duration::from_secs(10),
            history,
            dynamic_window: 50,
            dynamic_min_samples: 5,
            short_circuit: true,
            budget: None,
        }
    }

    async fn run(suite: &Evaluator, known: &[Option<Status>], cx: &Context<'_>) -> Result<Evaluation, EvalError> {
        let raw = serde_json::value::RawValue::from_string(TRACE.to_owned()).unwrap();
        let trace = Arc::new(parse_trace(&raw, &Limits::default()).unwrap().trace);
        suite.evaluate_known(TRACE, trace, known, cx).await
    }

    fn fakes() -> Fakes {
        Fakes {
            plugin: Arc::new(Echo::default()),
        }
    }

    #[tokio::test]
    async fn every_layer_runs_in_suite_order_with_one_call_per_plugin() {
        let f = fakes();
        let s = suite(
            &f,
            &[
                (
                    "content",
                    json!({"target": "output.message", "check": "contains", "value": "refund"}),
                ),
                ("plugin", json!({"plugin_id": "echo", "config": {"ok": true}})),
                ("llm_judge", json!({"score": 0.9})),
                ("plugin", json!({"plugin_id": "echo", "config": {"ok": false}, "soft": true})),
            ],
        );
        let e = run(&s, &[], &context(None)).await.unwrap();
        let statuses: Vec<Status> = e.outcomes.iter().map(|o| o.as_ref().unwrap().status).collect();
        assert_eq!(statuses, [Status::Pass, Status::Pass, Status::Pass, Status::SoftFail]);
        assert_eq!(f.plugin.calls.load(Ordering::SeqCst), 1);
        let plugin = e.outcomes[1].as_ref().unwrap();
        assert_eq!(plugin.verdict.evidence.as_ref().unwrap().expected.as_deref(), Some("a pass"));
        assert_eq!(e.outcomes[2].as_ref().unwrap().threshold_source.as_deref(), Some("static"));
        assert!((e.cost() - 0.01).abs() < 1e-12);
    }

    #[tokio::test]
    async fn known_assertions_are_not_run_but_count_for_short_circuiting() {
        let f = fakes();
        let s = suite(
            &f,
            &[
                (
                    "content",
                    json!({"target": "output.message", "check": "contains", "value": "refund"}),
                ),
                ("plugin", json!({"plugin_id": "echo", "config": {}})),
                ("embedding", json!({"score": 0.9})),
            ],
        );
        let e = run(&s, &[Some(Status::HardFail), Some(Status::Pass), None], &context(None))
            .await
            .unwrap();
        assert!(e.outcomes[0].is_none() && e.outcomes[1].is_none());
        assert_eq!(f.plugin.calls.load(Ordering::SeqCst), 0, "a known plugin assertion is not re-run");
        let paid = e.outcomes[2].as_ref().unwrap();
        assert!(paid.skipped && paid.cost == 0.0 && paid.status == Status::HardFail);
        assert!(paid
            .verdict
            .explanation
            .starts_with("Skipped: layer 4 assertion 'a0' (content) hard-failed"));
        assert_eq!(paid.threshold_source, None);
    }

    #[tokio::test]
    async fn a_spent_budget_and_a_failing_provider_are_errors_not_verdicts() {
        let f = fakes();
        let s = suite(&f, &[("llm_judge", json!({"score": 0.9})), ("llm_judge", json!({"score": -1.0}))]);
        let mut cx = context(None);
        cx.budget = Some((1.0, 1.0));
        assert_eq!(
            run(&s, &[], &cx).await.unwrap_err(),
            EvalError::BudgetSpent {
                index: 0,
                budget: 1.0,
                spent: 1.0
            }
        );
        cx.budget = Some((1.0, 0.5));
        match run(&s, &[], &cx).await.unwrap_err() {
            EvalError::Provider { index, error, cost } => {
                assert_eq!(index, 1);
                assert_eq!(error, ProviderError::failed("provider down", 3));
                assert!((cost - 0.01).abs() < 1e-12, "the judge that answered still cost");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn what_answered_before_the_deadline_is_spent_though_others_time_out() {
        let f = fakes();
        let s = suite(&f, &[("llm_judge", json!({"score": 0.9})), ("llm_judge", json!({"score": 2.0}))]);
        let mut cx = context(None);
        cx.deadline = Instant::now() + Duration::from_millis(200);
        match run(&s, &[], &cx).await.unwrap_err() {
            EvalError::PaidTimeout { pending, cost } => {
                assert_eq!(pending, 2);
                assert!((cost - 0.01).abs() < 1e-12, "the judge that answered still cost: {cost}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn plugin_model_calls_cost_their_assertion_and_spend_the_budget() {
        let f = fakes();
        let s = suite(
            &f,
            &[
                ("plugin", json!({"plugin_id": "echo", "config": {"ok": true, "spend": 1}})),
                ("llm_judge", json!({"score": 0.9})),
            ],
        );
        let mut cx = context(None);
        cx.budget = Some((1.0, 0.5));
        let e = run(&s, &[], &cx).await.unwrap();
        let plugin = e.outcomes[0].as_ref().unwrap();
        assert_eq!(plugin.cost, 0.25);
        assert!(plugin.verdict.explanation.contains("Some(0.5)"), "the plugin was told what is left");
        assert!((e.cost() - 0.26).abs() < 1e-12);
        // What the plugin spent counts before paid layers are admitted.
        cx.budget = Some((1.0, 0.75));
        assert_eq!(
            run(&s, &[], &cx).await.unwrap_err(),
            EvalError::BudgetSpent {
                index: 1,
                budget: 1.0,
                spent: 1.0
            }
        );
    }

    #[tokio::test]
    async fn dynamic_thresholds_judge_against_history_and_report_drift() {
        let f = fakes();
        let s = suite(
            &f,
            &[(
                "content",
                json!({"target": "output.message", "check": "contains", "value": "nope", "threshold": "dynamic"}),
            )],
        );
        let history = Past(vec![1.0; 10]);
        let e = run(&s, &[], &context(Some(&history))).await.unwrap();
        let o = e.outcomes[0].as_ref().unwrap();
        assert_eq!(o.status, Status::HardFail);
        assert_eq!(o.threshold_source.as_deref(), Some("dynamic: mean - 2 x stddev of 10 samples"));
        assert_eq!(e.alerts.len(), 1);
        assert_eq!(e.alerts[0].status, DriftStatus::DriftDetected);
        // Without history the static band applies and nothing is reported.
        let e = run(&s, &[], &context(None)).await.unwrap();
        assert_eq!(
            e.outcomes[0].as_ref().unwrap().threshold_source.as_deref(),
            Some("dynamic: static band (history off)")
        );
        assert!(e.alerts.is_empty());
    }

    #[test]
    fn a_list_that_is_not_a_suite_names_the_assertion_and_member_at_fault() {
        let f = fakes();
        let good = json!({"target": "output.message", "check": "contains", "value": "refund"});
        let bad = json!({"target": "output.message", "check": "contain", "value": "refund"});
        let source = |id, spec| Source {
            id: Some(id),
            kind: Some("content"),
            spec: Some(spec),
        };
        match Evaluator::compile([source("ok", &good), source("typo", &bad)], &f).unwrap_err() {
            SuiteError::Spec { index, id, kind, error } => {
                assert_eq!((index, id.as_str(), kind), (1, "typo", AssertionType::Content));
                assert_eq!(error.field, "spec.check");
            }
            other => panic!("{other:?}"),
        }
        let e = Evaluator::compile([source("same", &good), source("same", &good)], &f).unwrap_err();
        assert_eq!(
            e,
            SuiteError::DuplicateId {
                index: 1,
                first: 0,
                id: "same".into()
            }
        );
        let suite = Evaluator::compile([source("ok", &good)], &f).unwrap();
        assert_eq!(suite.assertions().len(), 1);
        assert!(!suite.may_block());
    }

    #[tokio::test]
    async fn a_passed_deadline_is_a_timeout() {
        let f = fakes();
        let s = suite(
            &f,
            &[(
                "content",
                json!({"target": "output.message", "check": "contains", "value": "refund"}),
            )],
        );
        let mut cx = context(None);
        cx.deadline = Instant::now() - Duration::from_millis(1);
        assert_eq!(run(&s, &[], &cx).await.unwrap_err(), EvalError::Timeout { done: 0, total: 1 });
    }

    #[test]
    fn plugin_details_map_onto_evidence() {
        let e = plugin_evidence(Some(
            &json!({"expected": "no email addresses", "actual": {"emails": 2}, "path": "output.message", "other": 1}),
        ))
        .unwrap();
        assert_eq!(e.expected.as_deref(), Some("no email addresses"));
        assert_eq!(e.actual.as_deref(), Some("{\"emails\":2}"));
        assert_eq!(e.path.as_deref(), Some("output.message"));
        assert_eq!(e.hint, None);
        assert!(plugin_evidence(Some(&json!({"other": 1}))).is_none());
        assert!(plugin_evidence(Some(&json!("text"))).is_none());
        assert!(plugin_evidence(None).is_none());
        let long = "y".repeat(10_000);
        let e = plugin_evidence(Some(&json!({"actual": long}))).unwrap();
        assert!(e.actual.unwrap().chars().count() <= EVIDENCE_CHARS);
    }
}
