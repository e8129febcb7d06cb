//! `evaluate_batch` (Attest protocol v1 §2.2): validate the trace, compile every assertion,
//! evaluate them in request order, and shape results that fit one response line.
//!
//! Two bounded caches make repeated work cheap:
//! - compiled assertions, keyed by type and the spec's exact text, so a
//!   suite sending the same assertions for every trace compiles each once;
//! - results by `request_id` (Attest protocol v1 §2.2 idempotency). Reusing a `request_id`
//!   for a different assertion (other type or spec) is a `1002` error rather
//!   than a silently wrong answer.

use crate::config::Config;
use crate::errors::{spec_error, trace_error};
use crate::history::{dynamic_status, DriftReport, DriftStatus, Fingerprint, Row, Rows};
use crate::lane::Lane;
use crate::layers::{AssertionType, Check, CompiledAssertion, SpecError, Status, Verdict};
use crate::params::Object;
use crate::plugins::{Outcome, Plugin};
use crate::protocol::{ErrorCode, RpcError};
use crate::providers::ProviderError;
use crate::report::{LoggedBatch, ReportedResult};
use crate::session::Engine;
use crate::text::{clip_in_place, quote};
use crate::trace::parse_trace;
use crate::trace::Trace;
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest accepted `assertion_id`, in bytes.
pub const MAX_ASSERTION_ID_BYTES: usize = 256;
/// Spec texts longer than this are compiled every time instead of cached.
const MAX_CACHED_SPEC_BYTES: usize = 64 * 1024;

pub struct BatchCaches {
    compiled: Cache<SpecKey, Arc<CompiledAssertion>, CompiledWeight>,
    by_request_id: Cache<String, Arc<CachedResult>, ResultWeight>,
}

/// Weighs compiled assertions by their estimated memory, and at least an
/// equal share of the byte budget so the entry bound holds too.
#[derive(Clone)]
struct CompiledWeight {
    floor: u64,
}

impl quick_cache::Weighter<SpecKey, Arc<CompiledAssertion>> for CompiledWeight {
    fn weight(&self, key: &SpecKey, value: &Arc<CompiledAssertion>) -> u64 {
        ((key.text.len() + value.memory_bytes()) as u64).max(self.floor)
    }
}

/// Weighs cached results by the bytes they hold.
#[derive(Clone)]
struct ResultWeight {
    floor: u64,
}

impl quick_cache::Weighter<String, Arc<CachedResult>> for ResultWeight {
    fn weight(&self, key: &String, value: &Arc<CachedResult>) -> u64 {
        let r = &value.result;
        let details = r.details.as_ref().map_or(0, |_| MAX_DETAILS_BYTES);
        let bytes = 160
            + key.len()
            + r.assertion_id.len()
            + r.explanation.len()
            + r.request_id.as_ref().map_or(0, |s| s.len())
            + details
            + r.evidence.len();
        (bytes as u64).max(self.floor)
    }
}

/// Compiled-assertion cache key; looked up with a borrowed [`SpecKeyRef`]
/// so a cache hit allocates nothing.
#[derive(Hash, PartialEq, Eq)]
struct SpecKey {
    kind: AssertionType,
    text: Box<str>,
}

#[derive(Hash)]
struct SpecKeyRef<'a> {
    kind: AssertionType,
    text: &'a str,
}

impl quick_cache::Equivalent<SpecKey> for SpecKeyRef<'_> {
    fn equivalent(&self, key: &SpecKey) -> bool {
        self.kind == key.kind && self.text == &*key.text
    }
}

struct CachedResult {
    fingerprint: u64,
    result: AssertionResult,
}

impl BatchCaches {
    pub fn new(config: &Config) -> BatchCaches {
        let compiled_entries = config.compiled_cache_entries.max(1);
        let results = config.idempotency_cache_entries.max(1);
        BatchCaches {
            compiled: Cache::with_weighter(
                compiled_entries,
                config.compiled_cache_bytes,
                CompiledWeight {
                    floor: config.compiled_cache_bytes / compiled_entries as u64,
                },
            ),
            by_request_id: Cache::with_weighter(
                results,
                config.idempotency_cache_bytes,
                ResultWeight {
                    floor: config.idempotency_cache_bytes / results as u64,
                },
            ),
        }
    }

    /// Forgets every `request_id` (the `eval` command treats each trace as its own run).
    pub fn forget_request_ids(&self) {
        self.by_request_id.clear();
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssertionResult {
    pub assertion_id: String,
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    pub cost: f64,
    pub duration_ms: u64,
    pub request_id: Option<String>,
    /// Set when the result was served from the `request_id` cache.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    /// Structured details from a plugin verdict (at most 4 KiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// Layer number, 1-8. Sent on every result; only a batch that cannot
    /// fit one response line otherwise goes without it (0: left out).
    #[serde(skip_serializing_if = "is_zero")]
    pub layer: u8,
    /// The assertion type (left out only with `layer`).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// `static`, or the dynamic rule and how many samples it used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_source: Option<String>,
    #[serde(flatten)]
    pub evidence: ResultEvidence,
}

/// The evidence fields of a result, each omitted when empty and clipped to
/// its own bound (see [`EVIDENCE_CHARS`]).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct ResultEvidence {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_node_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggested_action: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge_metadata: Option<Box<crate::layers::llm_judge::JudgeMetadata>>,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// Longest `expected`, `actual` and `suggested_action`, in characters.
pub const EVIDENCE_CHARS: usize = 500;
/// Longest `trace_node_path`, in characters.
pub const PATH_CHARS: usize = 300;

impl ResultEvidence {
    fn from_verdict(evidence: Option<Box<crate::layers::Evidence>>) -> ResultEvidence {
        let Some(e) = evidence else { return ResultEvidence::default() };
        let e = *e;
        let bounded = |s: Option<String>, max: usize| s.filter(|s| !s.is_empty()).map(|s| crate::text::clip(&s, max));
        ResultEvidence {
            trace_node_path: bounded(e.path, PATH_CHARS),
            expected: bounded(e.expected, EVIDENCE_CHARS),
            actual: bounded(e.actual, EVIDENCE_CHARS),
            suggested_action: bounded(e.hint, EVIDENCE_CHARS),
            judge_metadata: e.judge.map(|mut j| {
                j.model = crate::text::clip(&j.model, 120);
                j
            }),
        }
    }

    /// Characters held, for cache weights.
    fn len(&self) -> usize {
        [&self.trace_node_path, &self.expected, &self.actual, &self.suggested_action]
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.len()))
            .sum::<usize>()
            + self.judge_metadata.as_ref().map_or(0, |_| 1024)
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BatchResult {
    /// The evaluated trace (not serialised; for logs and the CLI).
    #[serde(skip)]
    pub trace_id: String,
    /// Drift detected by dynamic thresholds, for `drift_alert` notifications.
    #[serde(skip)]
    pub alerts: Vec<crate::history::DriftReport>,
    pub results: Vec<AssertionResult>,
    pub total_cost: f64,
    pub total_duration_ms: u64,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    trace: Option<&'a RawValue>,
    #[serde(borrow, default)]
    assertions: Option<&'a RawValue>,
}

/// The whole params in one pass; used when the request is well-formed.
#[derive(Deserialize)]
struct FastParams<'a> {
    #[serde(borrow, default)]
    trace: Option<&'a RawValue>,
    /// Each an object: an array is not an assertion, even positionally.
    #[serde(borrow, default)]
    assertions: Option<Vec<Object<Envelope<'a>>>>,
}

/// One assertion's envelope, strings borrowed from the request.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    assertion_id: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
    #[serde(borrow, default)]
    request_id: Option<Cow<'a, str>>,
}

/// The same envelope with any member types, to explain a malformed one.
#[derive(Deserialize)]
struct LooseEnvelope<'a> {
    #[serde(default)]
    assertion_id: Option<Value>,
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
    #[serde(default)]
    request_id: Option<Value>,
}

impl<'a> LooseEnvelope<'a> {
    fn parse(i: usize, raw: &'a RawValue) -> Result<Envelope<'a>, RpcError> {
        let at = |f: &str| format!("params.assertions[{i}]{f}");
        let loose: Object<LooseEnvelope<'a>> =
            serde_json::from_str(raw.get()).map_err(|e| match crate::json_errors::unrepresentable(raw.get(), &e, &at("")) {
                Some(u) => assertion_error(u.message, ASSERTIONS_SHAPE, u.field),
                None => assertion_error(format!("assertions[{i}] must be an object"), ASSERTIONS_SHAPE, at("")),
            })?;
        let loose = loose.0;
        let string = |v: Option<Value>, name: &str| match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(Cow::Owned(s))),
            Some(_) => Err(assertion_error(
                format!("assertions[{i}] {name} must be a string"),
                ASSERTIONS_SHAPE,
                at(&format!(".{name}")),
            )),
        };
        Ok(Envelope {
            assertion_id: string(loose.assertion_id, "assertion_id")?,
            kind: string(loose.kind, "type")?,
            spec: loose.spec,
            request_id: string(loose.request_id, "request_id")?,
        })
    }
}

/// One assertion of the request, checked and compiled.
struct Planned<'a> {
    id: String,
    request_id: Option<String>,
    kind: AssertionType,
    spec_text: Cow<'a, str>,
    compiled: Arc<CompiledAssertion>,
}

impl Planned<'_> {
    /// Whether evaluating this assertion may hold its thread: a plugin call
    /// (up to the eval timeout), or a history read for a dynamic threshold.
    fn may_block(&self) -> bool {
        self.kind == AssertionType::Plugin || self.compiled.dynamic
    }

    fn into_owned(self) -> Planned<'static> {
        Planned {
            spec_text: Cow::Owned(self.spec_text.into_owned()),
            ..self
        }
    }
}

fn assertion_error(message: String, detail: impl Into<String>, field: String) -> RpcError {
    RpcError::new(ErrorCode::AssertionError, message, detail).with_field(field)
}

/// How one assertion of the batch stands while the batch is evaluated.
enum Progress {
    /// Answered from the `request_id` cache.
    Cached(AssertionResult),
    /// Waiting for its provider (layers 5 and 6).
    Pending,
    Done(Evaluated),
}

struct Evaluated {
    status: Status,
    verdict: Verdict,
    details: Option<Value>,
    duration_ms: u64,
    cost: f64,
    /// Not run (short-circuit): no history, no dynamic threshold.
    skipped: bool,
    /// `threshold: "dynamic"` has been applied (or did not apply).
    settled: bool,
    /// What the status was judged against (paid and dynamic assertions).
    threshold_source: Option<String>,
}

impl Evaluated {
    /// Applies the assertion's dynamic threshold, once: free layers are
    /// settled before paid ones are planned, so short-circuiting sees the
    /// status the result will carry.
    fn settle(&mut self, engine: &Engine, p: &Planned<'_>, agent_id: Option<&str>, alerts: &mut Vec<DriftReport>) {
        if self.settled {
            return;
        }
        self.settled = true;
        if p.kind.is_paid() && !self.skipped {
            self.threshold_source = Some("static".to_owned());
        }
        // Faults and `forbidden` stay hard: history must not excuse them.
        if p.compiled.dynamic && !self.verdict.always_hard && !self.skipped {
            let fp = Fingerprint::new(&p.compiled.spec_digest, agent_id);
            let (status, why, alert, source) = dynamic(engine, fp, &p.id, self.verdict.score, p.compiled.soft);
            self.status = status;
            self.verdict.explanation.push(' ');
            self.verdict.explanation.push_str(&why);
            alerts.extend(alert);
            self.threshold_source = Some(source);
        }
    }
}

/// Evaluates one `evaluate_batch` request. `deadline` bounds the work (3002).
///
/// Free checks run first, in request order. Paid checks (layers 5 and 6)
/// then run concurrently, unless a layer 1–4 assertion hard-failed and
/// short-circuiting is on. Results keep request order.
///
/// `answer_bytes` is the room the serialised result has (one response
/// line, or a share of one): a batch whose results cannot fit it even
/// with empty explanations is refused before anything is evaluated.
///
/// A plan that calls plugins or reads history runs where it may block
/// (see [`Lane`]); the rest runs where it is called.
pub async fn evaluate(
    engine: &Arc<Engine>,
    params: Option<&RawValue>,
    deadline: Instant,
    answer_bytes: usize,
    lane: &mut Lane,
) -> Result<BatchResult, RpcError> {
    let started = Instant::now();
    let (trace_raw, wire) = read_params(params, engine.limits.max_depth)?;
    let trace_raw = trace_raw.filter(|t| t.get() != "null").ok_or_else(|| {
        RpcError::new(
            ErrorCode::InvalidTrace,
            "evaluate_batch params missing required field: trace",
            PARAMS_SHAPE,
        )
        .with_field("params.trace")
    })?;
    let parsed = parse_trace(trace_raw, &engine.limits).map_err(trace_error)?;
    for w in &parsed.warnings {
        tracing::warn!(trace_id = %parsed.trace.trace_id, "{w}");
    }
    let plan = plan(engine, wire?)?;
    let how = Run {
        deadline,
        answer_bytes,
        started,
        effects: Effects::All,
    };
    if lane.may_block() || !plan.iter().any(Planned::may_block) {
        return run(engine, trace_raw, parsed.trace, &plan, how).await;
    }
    // The move costs a copy of the trace text and of each spec's text; the
    // parsed trace and the compiled assertions go as they are.
    let trace_raw = trace_raw.to_owned();
    let plan: Vec<Planned<'static>> = plan.into_iter().map(Planned::into_owned).collect();
    let (engine, trace) = (engine.clone(), parsed.trace);
    lane.block(async move { run(&engine, &trace_raw, trace, &plan, how).await }).await
}

/// A suite of assertions checked and compiled once, to evaluate against
/// many traces without going through JSON-RPC (the `eval` command, the
/// collector, the ECP runtime).
pub struct Suite {
    plan: Vec<Planned<'static>>,
}

impl Suite {
    /// Checks and compiles `assertions` (the objects of `evaluate_batch`'s
    /// `assertions` list) exactly as `evaluate_batch` does, with the same
    /// errors and field paths.
    pub fn compile(engine: &Engine, assertions: &[Value]) -> Result<Suite, RpcError> {
        let text = serde_json::to_string(assertions).map_err(|e| {
            assertion_error(
                format!("assertions could not be read: {e}"),
                ASSERTIONS_SHAPE,
                "params.assertions".into(),
            )
        })?;
        let items: Vec<&RawValue> = serde_json::from_str(&text).map_err(|e| {
            assertion_error(
                format!("assertions could not be read: {e}"),
                ASSERTIONS_SHAPE,
                "params.assertions".into(),
            )
        })?;
        let wire = items
            .iter()
            .enumerate()
            .map(|(i, item)| LooseEnvelope::parse(i, item))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = plan(engine, wire)?.into_iter().map(Planned::into_owned).collect();
        Ok(Suite { plan })
    }

    pub fn len(&self) -> usize {
        self.plan.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// The assertion types, in order.
    pub fn kinds(&self) -> impl Iterator<Item = AssertionType> + '_ {
        self.plan.iter().map(|p| p.kind)
    }

    /// Validates `trace_text` (Attest protocol v1 §7) and evaluates the
    /// suite on it, with every effect of `evaluate_batch`: history rows,
    /// dynamic thresholds, costs, the session log.
    pub async fn evaluate(&self, engine: &Engine, trace_text: &str, deadline: Instant) -> Result<BatchResult, RpcError> {
        self.evaluate_with(engine, trace_text, deadline, Effects::All).await
    }

    /// [`Suite::evaluate`], choosing which effects it has.
    pub async fn evaluate_with(
        &self,
        engine: &Engine,
        trace_text: &str,
        deadline: Instant,
        effects: Effects,
    ) -> Result<BatchResult, RpcError> {
        let started = Instant::now();
        let trace_raw: &RawValue = serde_json::from_str(trace_text).map_err(|e| {
            RpcError::new(
                ErrorCode::InvalidTrace,
                format!("trace is not valid JSON: {}", crate::text::clip(&e.to_string(), 200)),
                "Send the trace as a JSON object.",
            )
            .with_field("trace")
        })?;
        let parsed = parse_trace(trace_raw, &engine.limits).map_err(trace_error)?;
        for w in &parsed.warnings {
            tracing::warn!(trace_id = %parsed.trace.trace_id, "{w}");
        }
        let how = Run {
            deadline,
            answer_bytes: usize::MAX,
            started,
            effects,
        };
        run(engine, trace_raw, parsed.trace, &self.plan, how).await
    }
}

/// How one evaluation runs: its deadline (3002 past it), the room its
/// answer has, when it started, and what it records.
struct Run {
    deadline: Instant,
    answer_bytes: usize,
    started: Instant,
    effects: Effects,
}

/// What an evaluation records besides its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effects {
    /// History rows, the session log and the evaluated count, as `evaluate_batch` does.
    All,
    /// Results only: the caller records them itself (the collector keys its
    /// history rows by trace and rule, so redeliveries count once).
    ResultsOnly,
}

/// Evaluates a checked plan on a validated trace.
async fn run(engine: &Engine, trace_raw: &RawValue, trace: Trace, plan: &[Planned<'_>], how: Run) -> Result<BatchResult, RpcError> {
    let Run {
        deadline,
        answer_bytes,
        started,
        effects,
    } = how;
    let trace = Arc::new(trace);
    let floor = smallest_answer(plan);
    if floor > answer_bytes {
        return Err(RpcError::new(
            ErrorCode::AssertionError,
            format!(
                "batch too large to answer: {} results need at least {floor} bytes, the response has room for {answer_bytes}",
                plan.len()
            ),
            "SDKs read responses as single lines of at most 64 KiB (shared equally between the members of a JSON-RPC batch). Nothing was evaluated: split the assertions into several evaluate_batch requests, or send this request on its own line.",
        )
        .with_field("params.assertions"));
    }

    // Only hashed when some assertion carries a request_id.
    let trace_digest = plan.iter().any(|p| p.request_id.is_some()).then(|| digest(trace_raw.get()));
    let mut plugin_outcomes = run_plugins(trace_raw.get(), plan);
    let mut guarded = guarded_verdicts(engine, plan, &trace, trace_raw.get().len(), deadline).await?;
    let mut outcomes = Vec::with_capacity(plan.len());
    for (done, p) in plan.iter().enumerate() {
        if Instant::now() > deadline {
            return Err(timeout(engine.config.eval_timeout, done, plan.len()));
        }
        if let Some(hit) = p.request_id.as_deref().and_then(|rid| engine.caches.by_request_id.get(rid)) {
            if hit.fingerprint != fingerprint(p.kind, &p.spec_text, trace_digest) {
                return Err(RpcError::new(
                    ErrorCode::AssertionError,
                    format!(
                        "assertion {}: request_id {} was already used for a different request",
                        quote(&p.id),
                        quote(p.request_id.as_deref().unwrap_or_default())
                    ),
                    "A request_id is an idempotency key: resend it only with the same type, spec and trace. Use a fresh request_id for a new evaluation.",
                )
                .with_assertion(&p.id)
                .with_field("request_id"));
            }
            outcomes.push(Progress::Cached(AssertionResult {
                assertion_id: p.id.clone(),
                duration_ms: 0,
                cached: true,
                ..hit.result.clone()
            }));
            continue;
        }
        if p.kind.is_paid() {
            outcomes.push(Progress::Pending);
            continue;
        }
        let t0 = Instant::now();
        let (status, verdict, details, plugin_ms) = match plugin_outcomes[done].take() {
            Some((outcome, ms)) => {
                let verdict = Verdict {
                    passed: outcome.passed,
                    score: outcome.score,
                    explanation: outcome.explanation,
                    always_hard: outcome.always_hard,
                    evidence: plugin_evidence(outcome.details.as_ref()),
                };
                let (status, verdict) = p.compiled.classify(verdict);
                (status, verdict, bounded_details(outcome.details), ms)
            }
            None => {
                let (status, verdict) = match guarded.as_mut().and_then(|g| g[done].take()) {
                    Some(done) => done,
                    None => p.compiled.evaluate(&trace),
                };
                (status, verdict, None, 0)
            }
        };
        outcomes.push(Progress::Done(Evaluated {
            status,
            verdict,
            details,
            duration_ms: t0.elapsed().as_millis() as u64 + plugin_ms,
            cost: 0.0,
            skipped: false,
            settled: false,
            threshold_source: None,
        }));
    }
    let mut alerts = Vec::new();
    for (p, outcome) in plan.iter().zip(outcomes.iter_mut()) {
        if let Progress::Done(e) = outcome {
            e.settle(engine, p, trace.agent_id.as_deref(), &mut alerts);
        }
    }
    if outcomes.iter().any(|o| matches!(o, Progress::Pending)) {
        run_paid(engine, plan, &trace, &mut outcomes, deadline).await?;
    }

    let max_chars = engine.config.max_explanation_chars;
    let mut results = Vec::with_capacity(plan.len());
    let mut rows = Vec::new();
    for (p, outcome) in plan.iter().zip(outcomes) {
        let e = match outcome {
            Progress::Cached(r) => {
                results.push(r);
                continue;
            }
            Progress::Done(e) => e,
            Progress::Pending => unreachable!("run_paid settles every pending assertion"),
        };
        let mut e = e;
        e.settle(engine, p, trace.agent_id.as_deref(), &mut alerts);
        let (status, threshold_source) = (e.status, e.threshold_source.take());
        let mut explanation = e.verdict.explanation;
        clip_in_place(&mut explanation, max_chars);
        if engine.history.is_some() && !e.skipped && effects == Effects::All {
            rows.push(Row {
                assertion_id: p.id.clone(),
                spec: p.compiled.spec_digest,
                assertion_type: p.kind.name(),
                status,
                score: e.verdict.score,
            });
        }
        let result = AssertionResult {
            assertion_id: p.id.clone(),
            status,
            // Scores are in [0, 1] whatever a plugin or provider returned.
            score: if e.verdict.score.is_nan() {
                0.0
            } else {
                e.verdict.score.clamp(0.0, 1.0)
            },
            explanation,
            cost: e.cost,
            duration_ms: e.duration_ms,
            request_id: p.request_id.clone(),
            cached: false,
            details: e.details,
            layer: p.kind.layer(),
            kind: Some(p.kind.name()),
            threshold_source,
            evidence: ResultEvidence::from_verdict(e.verdict.evidence),
        };
        if let Some(rid) = &p.request_id {
            engine.caches.by_request_id.insert(
                rid.clone(),
                Arc::new(CachedResult {
                    fingerprint: fingerprint(p.kind, &p.spec_text, trace_digest),
                    result: result.clone(),
                }),
            );
        }
        results.push(result);
    }
    if effects == Effects::All {
        engine.count_evaluated(results.len() as u64);
    }
    if let Some(history) = engine.history.as_ref().filter(|_| effects == Effects::All) {
        history.record(Rows {
            keyed: false,
            trace_id: trace.trace_id.clone(),
            agent_id: trace.agent_id.clone(),
            rows,
        });
    }
    if engine.session_log.enabled() && effects == Effects::All {
        engine.session_log.record(LoggedBatch {
            trace_id: trace.trace_id.clone(),
            agent_id: trace.agent_id.clone(),
            results: results
                .iter()
                .zip(plan)
                .map(|(r, p)| ReportedResult {
                    assertion_id: r.assertion_id.clone(),
                    kind: p.kind.name().to_owned(),
                    layer: p.kind.layer(),
                    status: r.status,
                    score: r.score,
                    explanation: r.explanation.clone(),
                    cost: r.cost,
                    duration_ms: r.duration_ms,
                    source: "batch",
                    expected: r.evidence.expected.clone(),
                    actual: r.evidence.actual.clone(),
                    suggested_action: r.evidence.suggested_action.clone(),
                })
                .collect(),
        });
    }
    // Summed from +0.0: an empty f64 sum is -0.0, which would print as such.
    let total_cost = results.iter().fold(0.0, |acc, r| acc + r.cost);
    Ok(BatchResult {
        alerts,
        trace_id: trace.trace_id.clone(),
        results,
        total_cost,
        total_duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// Built-in checks whose regex work on this trace could outlast the
/// deadline are run ahead as guarded work on the regex threads, and schema
/// checks with patterns always run there (see `watchdog`); `None` when no
/// check needs it.
async fn guarded_verdicts(
    engine: &Engine,
    plan: &[Planned<'_>],
    trace: &Arc<Trace>,
    trace_bytes: usize,
    deadline: Instant,
) -> Result<Option<Vec<Option<(Status, Verdict)>>>, RpcError> {
    let weight: u64 = plan.iter().map(|p| p.compiled.scan_weight() as u64).sum();
    let guarded = weight.saturating_mul(trace_bytes as u64) > crate::watchdog::GUARDED_SCAN_COST;
    let jobs: Vec<(usize, Arc<CompiledAssertion>)> = plan
        .iter()
        .enumerate()
        // Schema patterns go to the regex threads only from the blocking pool,
        // whose threads are as many as requests in flight; the async workers
        // are as many as the cores, so their regex caches are bounded already.
        .filter(|(_, p)| {
            if guarded {
                p.compiled.scan_weight() > 0
            } else {
                p.compiled.needs_regex_thread() && crate::lane::on_pool()
            }
        })
        .map(|(i, p)| (i, p.compiled.clone()))
        .collect();
    if jobs.is_empty() {
        return Ok(None);
    }
    let (n, trace) = (plan.len(), trace.clone());
    let work = move || {
        let mut out: Vec<Option<(Status, Verdict)>> = (0..n).map(|_| None).collect();
        for (i, c) in jobs {
            out[i] = Some(c.evaluate(&trace));
        }
        out
    };
    let verdicts = if guarded {
        crate::watchdog::run(deadline, work).await
    } else {
        crate::watchdog::run_short(deadline, work).await
    };
    let verdicts = verdicts.map_err(|_| {
        RpcError::new(
            ErrorCode::Timeout,
            format!("evaluation timed out after {}ms", engine.config.eval_timeout.as_millis()),
            "Regex checks (regex_match, schema pattern) over this trace did not finish before the deadline. Use simpler patterns, target a smaller field than the whole trace, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT).",
        )
    })?;
    Ok(Some(verdicts))
}

/// A lower bound on the serialised result of `plan`: every result with an
/// empty explanation.
fn smallest_answer(plan: &[Planned<'_>]) -> usize {
    // `{"assertion_id":"","status":"hard_fail","score":0.0,"explanation":"","cost":0.0,"duration_ms":0,"request_id":null}`
    // (`fit` drops `layer` and `type` before giving up).
    const EMPTY_RESULT_BYTES: usize = 110;
    const ENVELOPE: usize = r#"{"results":[],"total_cost":0.0,"total_duration_ms":0}"#.len();
    ENVELOPE
        + plan
            .iter()
            .map(|p| EMPTY_RESULT_BYTES + p.id.len() + p.request_id.as_ref().map_or(0, |r| r.len()) + 1)
            .sum::<usize>()
}

/// Settles every pending (paid) assertion: skipped when a layer 1–4
/// assertion hard-failed and short-circuiting is on, refused when the
/// session's budget is spent, else asked of its provider, all concurrently.
async fn run_paid(
    engine: &Engine,
    plan: &[Planned<'_>],
    trace: &Trace,
    outcomes: &mut [Progress],
    deadline: Instant,
) -> Result<(), RpcError> {
    let pending: Vec<usize> = (0..plan.len()).filter(|i| matches!(outcomes[*i], Progress::Pending)).collect();
    let providers = &engine.providers;
    if providers.short_circuit {
        let failed = plan.iter().zip(outcomes.iter()).find(|(p, o)| {
            p.kind.layer() <= 4
                && match o {
                    Progress::Done(e) => e.status == Status::HardFail,
                    Progress::Cached(r) => r.status == Status::HardFail,
                    Progress::Pending => false,
                }
        });
        if let Some((culprit, _)) = failed {
            for i in pending {
                outcomes[i] = Progress::Done(Evaluated {
                    status: Status::HardFail,
                    verdict: Verdict::fail(format!(
                        "Skipped: layer {} assertion {} ({}) hard-failed, so this {} assertion was not sent to its provider (cost 0). Set short_circuit = false under [providers] to always run paid layers.",
                        culprit.kind.layer(),
                        quote(&culprit.id),
                        culprit.kind.name(),
                        plan[i].kind.name()
                    ))
                    .with(
                        crate::layers::Evidence::new(
                            format!("layers 1-4 pass before {} runs", plan[i].kind.name()),
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
                    settled: false,
                    threshold_source: None,
                });
            }
            return Ok(());
        }
    }
    if let Some(budget) = engine.config.budget_usd {
        let spent = engine.cost_spent();
        if spent >= budget {
            let first = &plan[pending[0]];
            return Err(RpcError::new(
                ErrorCode::AssertionError,
                format!(
                    "assertion {} ({}) refused: the session's cost budget of ${} is spent (${:.6} so far)",
                    quote(&first.id),
                    first.kind.name(),
                    crate::text::num(budget),
                    spent
                ),
                "Paid assertions (embedding, llm_judge) are refused once a session's evaluated cost reaches budget_usd. Raise budget_usd in the config file or start a new engine session; layers 1-4, 7 and 8 still run.",
            )
            .with_assertion(&first.id)
            .with_field(format!("params.assertions[{}]", pending[0])));
        }
    }
    let calls = pending.iter().map(|&i| async move {
        let t0 = Instant::now();
        let r = plan[i].compiled.evaluate_paid(trace, providers, deadline.into()).await;
        (i, r, t0.elapsed().as_millis() as u64)
    });
    let answers = tokio::time::timeout_at(deadline.into(), futures_util::future::join_all(calls))
        .await
        .map_err(|_| paid_timeout(engine, pending.len()))?;
    let mut first_error = None;
    for (i, answer, ms) in answers {
        match answer {
            Ok((verdict, cost)) => {
                engine.add_cost(cost);
                let (status, verdict) = plan[i].compiled.classify(verdict);
                outcomes[i] = Progress::Done(Evaluated {
                    status,
                    verdict,
                    details: None,
                    duration_ms: ms,
                    cost,
                    skipped: false,
                    settled: false,
                    threshold_source: None,
                });
            }
            Err(e) if first_error.is_none() => first_error = Some((i, e)),
            Err(_) => {}
        }
    }
    match first_error {
        None => Ok(()),
        Some((_, ProviderError::Timeout)) => Err(paid_timeout(engine, pending.len())),
        Some((i, e)) => Err(provider_error(&plan[i], i, e)),
    }
}

fn paid_timeout(engine: &Engine, paid: usize) -> RpcError {
    RpcError::new(
        ErrorCode::Timeout,
        format!("evaluation timed out after {}ms", engine.config.eval_timeout.as_millis()),
        format!("{paid} LLM-backed assertions (layers 5-6) were still waiting for their provider at the deadline. Reduce the batch size, check the provider's latency, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT)."),
    )
}

fn provider_error(p: &Planned<'_>, index: usize, e: ProviderError) -> RpcError {
    let (message, detail) = match e {
        ProviderError::Failed { message, attempts } => (
            format!("{message}{}", if attempts > 1 { format!(" (after {attempts} attempts)") } else { String::new() }),
            "Wait and retry. The engine retries 429, 5xx, time-outs and connection errors with exponential backoff (up to 3 attempts, honouring Retry-After) before surfacing this error; check the provider's status, URL, model and API key.".to_owned(),
        ),
        ProviderError::Unavailable { message, detail } => (message, detail),
        ProviderError::Timeout => unreachable!("handled by the caller"),
    };
    RpcError::new(
        ErrorCode::ProviderError,
        format!("assertion {} ({}): {message}", quote(&p.id), p.kind.name()),
        detail,
    )
    .with_assertion(&p.id)
    .with_field(format!("params.assertions[{index}]"))
}

/// Judges a score against its history (`threshold: "dynamic"`); a failure
/// judged from history also yields a drift report for `drift_alert`.
fn dynamic(engine: &Engine, fp: Fingerprint, id: &str, score: f64, soft: bool) -> (Status, String, Option<DriftReport>, String) {
    let window = engine.config.dynamic_window as u64;
    let scores = engine.history.as_ref().map(|h| {
        h.recent_scores(fp, window).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot read result history; using the static band");
            Vec::new()
        })
    });
    let (status, why) = dynamic_status(score, scores.as_deref(), engine.config.dynamic_min_samples, soft);
    let alert = match &scores {
        Some(past) if status != Status::Pass && past.len() >= engine.config.dynamic_min_samples => {
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
    let min = engine.config.dynamic_min_samples;
    let source = match &scores {
        Some(past) if past.len() >= min => format!("dynamic: mean - 2 x stddev of {} samples", past.len()),
        Some(past) => format!("dynamic: static band ({} of {min} samples)", past.len()),
        None => "dynamic: static band (history off)".to_owned(),
    };
    (status, why, alert, source)
}

/// A plugin's `details.expected` / `details.actual` (and `path`, `hint`),
/// when it provides them, as result evidence.
fn plugin_evidence(details: Option<&Value>) -> Option<Box<crate::layers::Evidence>> {
    let d = details?.as_object()?;
    let text = |k: &str| {
        d.get(k).filter(|v| !v.is_null()).map(|v| match v {
            Value::String(s) => crate::text::clip(s, EVIDENCE_CHARS),
            other => crate::text::clip(&other.to_string(), EVIDENCE_CHARS),
        })
    };
    let e = crate::layers::Evidence {
        expected: text("expected"),
        actual: text("actual"),
        path: text("path").or_else(|| text("trace_node_path")),
        hint: text("hint").or_else(|| text("suggested_action")),
        judge: None,
    };
    (e.expected.is_some() || e.actual.is_some() || e.path.is_some() || e.hint.is_some()).then(|| Box::new(e))
}

/// Runs every plugin assertion of the batch: one sandboxed call per plugin,
/// with all of that plugin's configs. Returns, by position in `plan`, each
/// plugin assertion's outcome and its share of the call's wall time.
fn run_plugins(trace_text: &str, plan: &[Planned<'_>]) -> Vec<Option<(Outcome, u64)>> {
    let mut out: Vec<Option<(Outcome, u64)>> = plan.iter().map(|_| None).collect();
    let mut by_plugin: Vec<(&Arc<Plugin>, Vec<usize>, Vec<String>)> = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        let Check::Plugin(check) = &p.compiled.check else { continue };
        match by_plugin.iter_mut().find(|(pl, _, _)| Arc::ptr_eq(pl, &check.plugin)) {
            Some((_, at, configs)) => {
                at.push(i);
                configs.push(check.config.clone());
            }
            None => by_plugin.push((&check.plugin, vec![i], vec![check.config.clone()])),
        }
    }
    for (plugin, at, configs) in by_plugin {
        let t0 = Instant::now();
        let outcomes = plugin.evaluate(trace_text, &configs);
        let share = t0.elapsed().as_millis() as u64 / at.len() as u64;
        for (i, outcome) in at.into_iter().zip(outcomes) {
            out[i] = Some((outcome, share));
        }
    }
    out
}

/// Largest plugin `details` kept in a result, serialised.
const MAX_DETAILS_BYTES: usize = 4096;

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

fn timeout(limit: Duration, done: usize, total: usize) -> RpcError {
    RpcError::new(
        ErrorCode::Timeout,
        format!("evaluation timed out after {}ms", limit.as_millis()),
        format!("{done} of {total} assertions finished before the deadline. Reduce the batch size or trace size, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT)."),
    )
}

/// What a `request_id` stands for: the assertion and the trace it ran on.
fn fingerprint(kind: AssertionType, spec_text: &str, trace_digest: Option<u64>) -> u64 {
    let mut h = DefaultHasher::new();
    kind.name().hash(&mut h);
    spec_text.hash(&mut h);
    trace_digest.hash(&mut h);
    h.finish()
}

fn digest(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

const PARAMS_SHAPE: &str = "Send {\"trace\": {...}, \"assertions\": [{\"assertion_id\": ..., \"type\": ..., \"spec\": {...}}, ...]}.";
const ASSERTIONS_SHAPE: &str =
    "Send assertions as a list of {\"assertion_id\": str, \"type\": str, \"spec\": {...}, \"request_id\"?: str}.";

/// The raw trace, and the assertion envelopes or what is wrong with them.
type SplitParams<'a> = (Option<&'a RawValue>, Result<Vec<Envelope<'a>>, RpcError>);

/// Splits the params into the raw trace and the assertion envelopes. The
/// assertions' own problems are returned separately: they are reported only
/// after the trace has been validated.
fn read_params(params: Option<&RawValue>, max_depth: usize) -> Result<SplitParams<'_>, RpcError> {
    // Absent params read as `{}` (the params rule), so they get what `{}` gets.
    let text = params.map_or("{}", |p| p.get());
    // serde would also accept positional (array) params for a struct: refuse them.
    if !text.starts_with('{') {
        return Err(
            RpcError::invalid_params("evaluate_batch params must be an object with trace and assertions", PARAMS_SHAPE)
                .with_field("params"),
        );
    }
    let missing = || {
        assertion_error(
            "evaluate_batch params missing required field: assertions".into(),
            ASSERTIONS_SHAPE,
            "params.assertions".into(),
        )
    };
    if let Ok(fast) = serde_json::from_str::<FastParams<'_>>(text) {
        let wire = fast.assertions.map(|a| a.into_iter().map(|e| e.0).collect());
        return Ok((fast.trace, wire.ok_or_else(missing)));
    }
    // Slow path, only for malformed requests: find exactly what is wrong.
    let p: Params<'_> = serde_json::from_str(text).map_err(|e| unusable_params(text, &e, max_depth))?;
    let wire = (|| {
        let raw = p.assertions.filter(|a| a.get() != "null").ok_or_else(missing)?;
        let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| {
            assertion_error(
                "evaluate_batch assertions must be a list".into(),
                ASSERTIONS_SHAPE,
                "params.assertions".into(),
            )
        })?;
        items.iter().enumerate().map(|(i, item)| LooseEnvelope::parse(i, item)).collect()
    })();
    Ok((p.trace, wire))
}

/// Why params that are a syntactically valid object still cannot be read:
/// a value nothing can represent, inside the trace (1001), the assertions
/// (1002) or elsewhere (-32602).
fn unusable_params(text: &str, e: &serde_json::Error, max_depth: usize) -> RpcError {
    let Some(u) = crate::json_errors::unrepresentable(text, e, "params") else {
        return RpcError::invalid_params("evaluate_batch params must be an object with trace and assertions", PARAMS_SHAPE)
            .with_field("params");
    };
    let plain = crate::json_errors::PLAIN_JSON_HINT;
    if let Some(in_trace) = u.field.strip_prefix("params.").filter(|f| f.starts_with("trace")) {
        // Trace errors name fields from the trace down, as validation does.
        let u = crate::json_errors::Unrepresentable {
            message: u.message.replacen("params.trace", "trace", 1),
            field: in_trace.to_owned(),
        };
        trace_error(crate::trace::validate::unrepresentable_trace(text, u, max_depth))
    } else if u.field.starts_with("params.assertions") {
        assertion_error(u.message, plain, u.field)
    } else {
        RpcError::invalid_params(u.message, plain).with_field(u.field)
    }
}

/// Checks every assertion's envelope and compiles its spec, before anything runs.
fn plan<'a>(engine: &Engine, wire: Vec<Envelope<'a>>) -> Result<Vec<Planned<'a>>, RpcError> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(wire.len());
    let mut planned: Vec<Planned<'a>> = Vec::with_capacity(wire.len());
    for (i, w) in wire.iter().enumerate() {
        // Field paths are only built for errors: this loop is on the hot path.
        let at = |f: &str| format!("params.assertions[{i}].{f}");
        let id = match w.assertion_id.as_deref() {
            Some(s) if !s.is_empty() => s,
            _ => {
                return Err(assertion_error(
                    format!("assertions[{i}] missing required field: assertion_id"),
                    ASSERTIONS_SHAPE,
                    at("assertion_id"),
                ))
            }
        };
        let fail = |message: String, detail: String, field: &str| Err(assertion_error(message, detail, at(field)).with_assertion(id));
        if id.len() > MAX_ASSERTION_ID_BYTES {
            return fail(
                format!("assertion_id exceeds maximum length: {} > {MAX_ASSERTION_ID_BYTES}", id.len()),
                format!("assertion_id must be at most {MAX_ASSERTION_ID_BYTES} bytes."),
                "assertion_id",
            );
        }
        if w.request_id
            .as_deref()
            .is_some_and(|r| r.is_empty() || r.len() > MAX_ASSERTION_ID_BYTES)
        {
            return fail(
                format!(
                    "assertion {}: request_id must be a non-empty string of at most {MAX_ASSERTION_ID_BYTES} bytes",
                    quote(id)
                ),
                "request_id is an optional idempotency key; send a short string or omit it.".into(),
                "request_id",
            );
        }
        let Some(kind_name) = w.kind.as_deref() else {
            return fail(
                format!("assertion {}: missing required field: type", quote(id)),
                format!("Set type to one of: {}.", AssertionType::names()),
                "type",
            );
        };
        let Some(kind) = AssertionType::parse(kind_name) else {
            return fail(
                format!("assertion {}: unknown assertion type {}", quote(id), quote(kind_name)),
                format!("Supported assertion types: {}.", AssertionType::names()),
                "type",
            );
        };
        if let Some(first) = seen.insert(id, i) {
            return fail(
                format!(
                    "duplicate assertion_id {} in batch (assertions[{first}] and assertions[{i}])",
                    quote(id)
                ),
                "assertion_id must be unique within a batch: results are matched to assertions by it.".into(),
                "assertion_id",
            );
        }
        // A paid layer without its provider is a configuration error, found
        // before anything is evaluated (and never worth retrying as is).
        if kind.is_paid() {
            if let Some(ProviderError::Unavailable { message, detail }) = engine.providers.missing_for(kind) {
                return Err(RpcError::new(
                    ErrorCode::ProviderError,
                    format!("assertion {} ({}): {message}", quote(id), kind.name()),
                    detail,
                )
                .not_retryable()
                .with_assertion(id)
                .with_field(format!("params.assertions[{i}]")));
            }
        }
        let spec_text = w.spec.map_or("null", |s| s.get());
        let compiled = compile(engine, kind, spec_text).map_err(|e| spec_error(e, i, id, kind))?;
        planned.push(Planned {
            id: id.to_owned(),
            request_id: w.request_id.as_deref().map(str::to_owned),
            kind,
            spec_text: Cow::Borrowed(spec_text),
            compiled,
        });
    }
    Ok(planned)
}

fn compile(engine: &Engine, kind: AssertionType, spec_text: &str) -> Result<Arc<CompiledAssertion>, SpecError> {
    let cacheable = spec_text.len() <= MAX_CACHED_SPEC_BYTES;
    if cacheable {
        if let Some(hit) = engine.caches.compiled.get(&SpecKeyRef { kind, text: spec_text }) {
            return Ok(hit);
        }
    }
    // The request was read as raw text, which checks only syntax: a number
    // beyond f64, a lone surrogate or very deep nesting surfaces here.
    let spec: Value = serde_json::from_str(spec_text).map_err(|e| match crate::json_errors::unrepresentable(spec_text, &e, "spec") {
        Some(u) => SpecError::new(u.field, u.message, crate::json_errors::PLAIN_JSON_HINT),
        None => SpecError::new(
            "spec",
            format!("spec is not usable JSON: {}", crate::text::clip(&e.to_string(), 200)),
            "Send the spec as a JSON object.",
        ),
    })?;
    let compiled = Arc::new(CompiledAssertion::compile(kind, Some(&spec), &engine.plugins)?);
    if cacheable {
        let key = SpecKey {
            kind,
            text: spec_text.into(),
        };
        engine.caches.compiled.insert(key, compiled.clone());
    }
    Ok(compiled)
}

impl BatchResult {
    /// Shrinks explanations and evidence fields evenly until the serialised
    /// result is at most `max_bytes`; judge metadata goes last. Returns false
    /// when even empty texts do not fit.
    pub fn fit(&mut self, max_bytes: usize) -> bool {
        loop {
            let size = serde_json::to_vec(self).map(|v| v.len()).unwrap_or(usize::MAX);
            if size <= max_bytes {
                return true;
            }
            let longest = self
                .results
                .iter()
                .flat_map(|r| r.texts())
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(0);
            if longest == 0 {
                let mut dropped = false;
                for r in &mut self.results {
                    dropped |= r.evidence.judge_metadata.take().is_some() | r.threshold_source.take().is_some();
                }
                if dropped {
                    continue;
                }
                // Last resort, for batches of many hundreds of results: the
                // SDK reads a missing layer and type as unknown.
                for r in &mut self.results {
                    dropped |= r.kind.take().is_some();
                    r.layer = 0;
                }
                if dropped {
                    continue;
                }
                return false;
            }
            // Cut every text to a share of what must go, at least a quarter of the longest.
            let excess = size - max_bytes;
            let per = excess.div_ceil(self.results.len().max(1) * 5);
            let cap = longest.saturating_sub(per.max(longest / 4).max(1));
            for r in &mut self.results {
                for t in r.texts_mut() {
                    clip_in_place(t, cap);
                    if cap == 0 {
                        t.clear();
                    }
                }
                // Emptied evidence is left out rather than sent empty.
                let ev = &mut r.evidence;
                for f in [&mut ev.trace_node_path, &mut ev.expected, &mut ev.actual, &mut ev.suggested_action] {
                    if f.as_ref().is_some_and(|s| s.is_empty()) {
                        *f = None;
                    }
                }
            }
        }
    }
}

impl AssertionResult {
    /// The free texts of the result, which `fit` may shorten.
    fn texts(&self) -> impl Iterator<Item = &String> {
        let e = &self.evidence;
        std::iter::once(&self.explanation).chain(
            [&e.trace_node_path, &e.expected, &e.actual, &e.suggested_action]
                .into_iter()
                .flatten(),
        )
    }

    fn texts_mut(&mut self) -> impl Iterator<Item = &mut String> {
        let e = &mut self.evidence;
        std::iter::once(&mut self.explanation).chain(
            [&mut e.trace_node_path, &mut e.expected, &mut e.actual, &mut e.suggested_action]
                .into_iter()
                .flatten(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn failed(i: usize, text_len: usize) -> AssertionResult {
        let long = "x".repeat(text_len);
        AssertionResult {
            assertion_id: format!("a{i}"),
            status: Status::HardFail,
            score: 0.0,
            explanation: long.clone(),
            cost: 0.0,
            duration_ms: 0,
            request_id: None,
            cached: false,
            details: None,
            layer: 6,
            kind: Some("llm_judge"),
            threshold_source: Some("static".into()),
            evidence: ResultEvidence {
                trace_node_path: Some("output.message".into()),
                expected: Some(long.clone()),
                actual: Some(long.clone()),
                suggested_action: Some(long),
                judge_metadata: None,
            },
        }
    }

    fn batch(results: Vec<AssertionResult>) -> BatchResult {
        BatchResult {
            trace_id: "t".into(),
            alerts: Vec::new(),
            results,
            total_cost: 0.0,
            total_duration_ms: 0,
        }
    }

    #[test]
    fn fit_shrinks_evidence_with_explanations() {
        let mut b = batch((0..40).map(|i| failed(i, 500)).collect());
        assert!(serde_json::to_vec(&b).unwrap().len() > 64 * 1024);
        assert!(b.fit(16 * 1024));
        assert!(serde_json::to_vec(&b).unwrap().len() <= 16 * 1024);
        // Every result keeps its layer and type; texts were cut evenly.
        assert!(b.results.iter().all(|r| r.layer == 6 && r.kind == Some("llm_judge")));
        let lens: Vec<usize> = b
            .results
            .iter()
            .map(|r| r.evidence.expected.as_ref().map_or(0, |e| e.chars().count()))
            .collect();
        assert!(lens.iter().all(|l| *l == lens[0]), "{lens:?}");
    }

    #[test]
    fn fit_drops_optional_members_before_giving_up() {
        let mut b = batch((0..200).map(|i| failed(i, 10)).collect());
        // Room for the bare results only: evidence, threshold_source, then layer and type go.
        let bare = 200 * 120;
        assert!(b.fit(bare));
        assert!(serde_json::to_vec(&b).unwrap().len() <= bare);
        assert!(b
            .results
            .iter()
            .all(|r| r.evidence == ResultEvidence::default() && r.threshold_source.is_none()));
        assert!(!b.fit(1000));
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
