//! `evaluate_batch` (Attest protocol v1 §2.2) around the core's evaluator:
//! read the params, validate the trace, compile every assertion (through a
//! bounded cache keyed by type and the spec's exact text, so a suite sending
//! the same assertions for every trace compiles each once), have the
//! evaluator run them, shape results that fit one response line, and hand
//! the evaluation to the sinks (`sinks.rs`: the `request_id` cache, history,
//! session log, spending).
//!
//! [`Suite`] is the same path without the wire, for `eval`, the collector
//! and the ECP runtime.

use crate::config::Config;
use crate::errors::{eval_error, provider_missing, request_id_reused, suite_error, trace_error, trace_not_json};
use crate::evaluator::{self, EvalError, Evaluator, Outcome};
use crate::lane::Lane;
use crate::layers::{AssertionType, CompiledAssertion, SpecError, Status};
use crate::params::Object;
use crate::protocol::{ErrorCode, RpcError};
use crate::session::Engine;
use crate::sinks::{Evaluation, Fresh};
use crate::text::{clip_in_place, quote};
use crate::trace::parse_trace;
use crate::trace::Trace;
use attest_core::backends::ScoreHistory;
use attest_core::suite::{SuiteError, SuiteReader, ASSERTIONS_SHAPE};
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// Largest plugin `details` kept in a result, serialised.
pub use crate::evaluator::MAX_DETAILS_BYTES;
pub use attest_core::suite::MAX_ASSERTION_ID_BYTES;
/// Spec texts longer than this are compiled every time instead of cached.
const MAX_CACHED_SPEC_BYTES: usize = 64 * 1024;

/// The compiled-assertion cache: a suite sending the same assertions for
/// every trace compiles each once.
pub struct BatchCaches {
    compiled: Cache<SpecKey, Arc<CompiledAssertion>, CompiledWeight>,
    /// Assertions compiled so far (cache misses), for the tests that show a
    /// suite is compiled once.
    pub compiles: std::sync::atomic::AtomicU64,
    /// KiB of compiled checks that requests in flight hold outside the
    /// cache (see [`Reserved`]).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Memory the compiled checks of requests in flight may hold outside the
/// compiled cache: 64 requests of 30 regexes near the size limit would
/// otherwise hold 2 GB at once. Also the most one batch's fresh checks may
/// hold: 512 regexes near the size limit would hold a gigabyte. With the
/// compiled cache's default, 384 MiB of compiled checks at most.
pub const IN_FLIGHT_COMPILED_BYTES: usize = 192 * 1024 * 1024;
const IN_FLIGHT_COMPILED_KIB: u32 = (IN_FLIGHT_COMPILED_BYTES / 1024) as u32;

/// What one request's freshly compiled checks hold of the in-flight
/// budget. Each check compiled outside the cache takes its share as it is
/// compiled; when the budget has no more, the plan stops, and the request
/// waits (until its deadline) for as much as it found it needs, then plans
/// again. A request that needs more than the whole budget is refused.
/// Given back when the request ends.
pub(crate) struct Reserved {
    budget: Arc<tokio::sync::Semaphore>,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    used_kib: u32,
    /// What the last plan found it needs, when the budget ran out.
    wanted_kib: u32,
}

impl Reserved {
    fn new(budget: Arc<tokio::sync::Semaphore>) -> Reserved {
        Reserved {
            budget,
            held: None,
            used_kib: 0,
            wanted_kib: 0,
        }
    }

    fn held_kib(&self) -> u32 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u32)
    }

    /// Counts `bytes` of a freshly compiled check.
    fn take(&mut self, bytes: usize) -> Room {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1);
        let want = self.used_kib.saturating_add(kib);
        if want > IN_FLIGHT_COMPILED_KIB {
            return Room::Never;
        }
        if want > self.held_kib() {
            match self.budget.clone().try_acquire_many_owned(want - self.held_kib()) {
                Ok(p) => match &mut self.held {
                    Some(h) => h.merge(p),
                    None => self.held = Some(p),
                },
                Err(_) => {
                    self.wanted_kib = want;
                    return Room::NotNow;
                }
            }
        }
        self.used_kib = want;
        Room::Taken
    }

    /// Starts a new plan, keeping what is held.
    fn restart(&mut self) {
        self.used_kib = 0;
    }

    /// Waits (until `deadline`) to hold what the last plan needed; false
    /// when the deadline came first.
    async fn wait_for_room(&mut self, deadline: Instant) -> bool {
        let want = self.wanted_kib.min(IN_FLIGHT_COMPILED_KIB);
        // What is held goes back while waiting, so that two requests each
        // holding part of the budget cannot wait on each other.
        let all = want.max(self.held_kib());
        self.held = None;
        match tokio::time::timeout_at(deadline.into(), self.budget.clone().acquire_many_owned(all)).await {
            Ok(Ok(p)) => {
                self.held = Some(p);
                true
            }
            _ => false,
        }
    }
}

/// Whether a freshly compiled check fits the in-flight budget.
enum Room {
    Taken,
    /// Not while other requests hold their share: wait, then plan again.
    NotNow,
    /// Not even with all of it: the batch's checks are too large together.
    Never,
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

impl BatchCaches {
    pub fn new(config: &Config) -> BatchCaches {
        let compiled_entries = config.compiled_cache_entries.max(1);
        BatchCaches {
            compiled: Cache::with_weighter(
                compiled_entries,
                config.compiled_cache_bytes,
                CompiledWeight {
                    floor: config.compiled_cache_bytes / compiled_entries as u64,
                },
            ),
            compiles: std::sync::atomic::AtomicU64::new(0),
            in_flight: Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_COMPILED_KIB as usize)),
        }
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
    /// Echoed when the assertion carried one; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
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
    pub(crate) fn len(&self) -> usize {
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
                // An object that names a member twice is still an object.
                None if e.to_string().starts_with("duplicate field") => {
                    let said = e.to_string();
                    let member = said.split('`').nth(1).unwrap_or("a member");
                    assertion_error(
                        format!("assertions[{i}] has the member {} twice", quote(member)),
                        "Give each member of an assertion once.",
                        at(&format!(".{member}")),
                    )
                }
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

/// The request's assertions, checked and compiled: the core's evaluator,
/// and beside each assertion what its idempotency key covers.
struct Plan<'a> {
    suite: Evaluator,
    keys: Vec<RequestKey<'a>>,
}

/// An assertion's `request_id`, and the spec text it was sent with.
struct RequestKey<'a> {
    request_id: Option<String>,
    spec_text: Cow<'a, str>,
}

impl Plan<'_> {
    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Each assertion with its key, in request order.
    fn iter(&self) -> impl Iterator<Item = (&evaluator::Planned, &RequestKey<'_>)> {
        self.suite.assertions().iter().zip(&self.keys)
    }

    fn into_owned(self) -> Plan<'static> {
        let keys = self
            .keys
            .into_iter()
            .map(|k| RequestKey {
                request_id: k.request_id,
                spec_text: Cow::Owned(k.spec_text.into_owned()),
            })
            .collect();
        Plan { suite: self.suite, keys }
    }
}

fn assertion_error(message: String, detail: impl Into<String>, field: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::AssertionError, message, detail).with_field(field)
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
    let wire = wire?;
    let mut reserved = Reserved::new(engine.caches.in_flight.clone());
    let plan = loop {
        reserved.restart();
        if let Some(plan) = plan(engine, &wire, Providers::Required, Some(&mut reserved))? {
            break plan;
        }
        if !reserved.wait_for_room(deadline).await {
            return Err(RpcError::new(
                ErrorCode::Timeout,
                "the batch's checks could not be compiled before the deadline: the compiled checks of the requests in flight hold the engine's budget for them",
                format!(
                    "Requests in flight may hold {} MiB of freshly compiled checks (large regexes, schemas); send fewer at once, reuse the same specs (compiled checks are cached), or raise --eval-timeout.",
                    IN_FLIGHT_COMPILED_BYTES >> 20
                ),
            ));
        }
    };
    let how = Run {
        deadline,
        answer_bytes,
        started,
        effects: Effects::All,
    };
    if lane.may_block() || !plan.suite.may_block() {
        return run(engine, trace_raw, parsed.trace, &plan, how).await;
    }
    // The move costs a copy of the trace text and of each spec's text; the
    // parsed trace and the compiled assertions go as they are.
    let trace_raw = trace_raw.to_owned();
    let plan = plan.into_owned();
    let (engine, trace) = (engine.clone(), parsed.trace);
    lane.block(async move { run(&engine, &trace_raw, trace, &plan, how).await }).await
}

/// A suite of assertions checked and compiled once, to evaluate against
/// many traces without going through JSON-RPC (the `eval` command, the
/// collector, the ECP runtime).
pub struct Suite {
    plan: Plan<'static>,
}

impl Suite {
    /// Checks and compiles `assertions` (the objects of `evaluate_batch`'s
    /// `assertions` list) exactly as `evaluate_batch` does, with the same
    /// errors and field paths.
    pub fn compile(engine: &Engine, assertions: &[Value]) -> Result<Suite, RpcError> {
        Self::compile_with(engine, assertions, Providers::Required)
    }

    /// [`Suite::compile`], saying where the paid layers' providers must be.
    pub fn compile_with(engine: &Engine, assertions: &[Value], providers: Providers) -> Result<Suite, RpcError> {
        let text = serde_json::to_string(assertions)
            .map_err(|e| assertion_error(format!("assertions could not be read: {e}"), ASSERTIONS_SHAPE, "params.assertions"))?;
        let items: Vec<&RawValue> = serde_json::from_str(&text)
            .map_err(|e| assertion_error(format!("assertions could not be read: {e}"), ASSERTIONS_SHAPE, "params.assertions"))?;
        let wire = items
            .iter()
            .enumerate()
            .map(|(i, item)| LooseEnvelope::parse(i, item))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = plan(engine, &wire, providers, None)?
            .expect("a plan without a budget always completes")
            .into_owned();
        Ok(Suite { plan })
    }

    pub fn len(&self) -> usize {
        self.plan.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plan.len() == 0
    }

    /// The assertion types, in order.
    pub fn kinds(&self) -> impl Iterator<Item = AssertionType> + '_ {
        self.plan.suite.assertions().iter().map(|p| p.kind)
    }

    /// The assertions whose spec holds keys they never read, by position.
    pub fn unread_keys(&self) -> impl Iterator<Item = (usize, AssertionType, &crate::layers::UnreadKeys)> + '_ {
        let assertions = self.plan.suite.assertions().iter().enumerate();
        assertions.filter_map(|(i, p)| p.compiled.unread.as_deref().map(|u| (i, p.kind, u)))
    }

    /// The first spec key one of this suite's assertions never reads, as a
    /// file that configures assertions (a rules file, a manifest) refuses it.
    /// The wire ignores such keys, since specs are forward-compatible; in a
    /// file they are typos that would silently change a verdict
    /// (`case_sensitve: true`).
    pub fn first_unread_key(&self) -> Option<Typo> {
        let (i, kind, unread) = self.unread_keys().next()?;
        let key = crate::text::clip(&unread.keys[0], 64);
        Some(Typo {
            field: format!("assertions[{i}].spec.{key}"),
            message: format!(
                "unknown key `{key}`: this {} assertion never reads it, so it would be ignored",
                kind.name()
            ),
            valid_choices: unread.known.iter().map(|k| k.to_string()).collect(),
        })
    }

    /// Validates `trace_text` (Attest protocol v1 §7) and evaluates the
    /// suite on it, with every effect of `evaluate_batch`: history rows,
    /// dynamic thresholds, costs, the session log.
    pub async fn evaluate(&self, engine: &Engine, trace_text: &str, deadline: Instant) -> Result<BatchResult, RpcError> {
        self.evaluate_with(engine, trace_text, deadline, Effects::All).await
    }

    /// Whether evaluating may hold its thread (plugin calls, history reads).
    pub fn may_block(&self) -> bool {
        self.plan.suite.may_block()
    }

    /// The most the paid assertions can cost on a trace of `trace_bytes`.
    pub fn worst_cost(&self, trace_bytes: usize) -> f64 {
        self.plan.suite.worst_cost(trace_bytes)
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
        let trace_raw: &RawValue = serde_json::from_str(trace_text).map_err(|e| trace_not_json(&e))?;
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

/// Evaluates a checked plan on a validated trace: answers what the
/// `request_id` cache holds, has the core's evaluator run the rest, shapes
/// the results, and has the sinks record them.
async fn run(engine: &Engine, trace_raw: &RawValue, trace: Trace, plan: &Plan<'_>, how: Run) -> Result<BatchResult, RpcError> {
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
    let trace_digest = plan.keys.iter().any(|k| k.request_id.is_some()).then(|| digest(trace_raw.get()));
    // Empty when no assertion carries a request_id (the common case): then
    // nothing is known beforehand.
    let cached = match trace_digest {
        None => Vec::new(),
        Some(_) => engine
            .sinks
            .answered(
                plan.iter()
                    .map(|(p, k)| (p.id.as_str(), k.request_id.as_deref(), p.kind, &*k.spec_text)),
                trace_digest,
            )
            .map_err(request_id_reused)?,
    };
    let known: Vec<Option<Status>> = cached.iter().map(|c| c.as_ref().map(|r| r.status)).collect();
    let mut cached = cached.into_iter();
    let cx = evaluator::Context {
        deadline,
        history: engine.sinks.history.as_ref().map(|h| h as &dyn ScoreHistory),
        dynamic_window: engine.config.dynamic_window as u64,
        dynamic_min_samples: engine.config.dynamic_min_samples,
        short_circuit: engine.providers.short_circuit,
        // The ledger also counts calls whose answers came too late for any result.
        budget: engine
            .config
            .budget_usd
            .map(|b| (b, engine.sinks.cost_spent().max(engine.providers.ledger.spent()))),
    };
    let assertions = plan.suite.assertions();
    // Boxed: the evaluation's state is large, and every future that holds
    // it inline is copied whole when the request's task is spawned.
    let evaluation = Box::pin(plan.suite.evaluate_known(trace_raw.get(), trace.clone(), &known, &cx))
        .await
        .map_err(|e| {
            // What the providers that did answer cost is spent all the same.
            if let EvalError::Provider { cost, .. } | EvalError::PaidTimeout { cost, .. } = &e {
                engine.sinks.add_cost(*cost);
            }
            eval_error(e, |i| (&assertions[i].id, assertions[i].kind), engine.config.eval_timeout)
        })?;

    let max_chars = engine.config.max_explanation_chars;
    let evaluator::Evaluation { outcomes, alerts } = evaluation;
    // Outcomes move into the results; the sinks keep what they read besides.
    let mut fresh: Vec<Option<Fresh>> = Vec::with_capacity(outcomes.len());
    let results: Vec<AssertionResult> = plan
        .iter()
        .zip(outcomes)
        .map(|((p, k), outcome)| match (cached.next().flatten(), outcome) {
            (Some(r), _) => {
                fresh.push(None);
                r
            }
            (None, Some(o)) => {
                fresh.push(Some(Fresh::of(&o)));
                AssertionResult {
                    request_id: k.request_id.clone(),
                    ..AssertionResult::new(p, o, max_chars)
                }
            }
            (None, None) => unreachable!("the evaluator answers every assertion it was given"),
        })
        .collect();
    engine.sinks.record(
        &Evaluation {
            trace: &trace,
            trace_raw: trace_raw.get(),
            assertions: plan.iter().map(|(p, k)| (p, k.request_id.as_deref(), &*k.spec_text)).collect(),
            fresh: &fresh,
            results: &results,
            trace_digest,
            alerts: &alerts,
        },
        effects,
    );
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

/// A lower bound on the serialised result of `plan`: every result with an
/// empty explanation.
fn smallest_answer(plan: &Plan<'_>) -> usize {
    // `{"assertion_id":"","status":"hard_fail","score":0.0,"explanation":"","cost":0.0,"duration_ms":0}`,
    // and `,"request_id":"…"` when one was sent (`fit` drops `layer` and
    // `type` before giving up).
    const EMPTY_RESULT_BYTES: usize = 92;
    const REQUEST_ID_KEY_BYTES: usize = r#","request_id":"""#.len();
    const ENVELOPE: usize = r#"{"results":[],"total_cost":0.0,"total_duration_ms":0}"#.len();
    ENVELOPE
        + plan
            .iter()
            .map(|(p, k)| EMPTY_RESULT_BYTES + p.id.len() + k.request_id.as_ref().map_or(0, |r| REQUEST_ID_KEY_BYTES + r.len()) + 1)
            .sum::<usize>()
}

fn digest(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

const PARAMS_SHAPE: &str = "Send {\"trace\": {...}, \"assertions\": [{\"assertion_id\": ..., \"type\": ..., \"spec\": {...}}, ...]}.";

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
            "params.assertions",
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
                "params.assertions",
            )
        })?;
        items.iter().enumerate().map(|(i, item)| LooseEnvelope::parse(i, item)).collect()
    })();
    Ok((p.trace, wire))
}

/// Why params that are a syntactically valid object still cannot be read:
/// a member sent twice or a value nothing can represent, inside the trace
/// (1001) or anywhere else (1002), the method's codes for its members.
fn unusable_params(text: &str, e: &serde_json::Error, max_depth: usize) -> RpcError {
    let Some(u) = crate::json_errors::unrepresentable(text, e, "params") else {
        // Which of two `trace`s (or `assertions`) was meant cannot be told.
        let message = e.to_string();
        if let Some(name) = message.strip_prefix("duplicate field `").and_then(|m| m.split('`').next()) {
            let (message, detail) = (
                format!("evaluate_batch params hold the member {name} more than once"),
                "Send each member once: {\"trace\": {...}, \"assertions\": [...]}.",
            );
            let field = format!("params.{name}");
            return match name {
                "trace" => RpcError::new(ErrorCode::InvalidTrace, message, detail).with_field(field),
                _ => assertion_error(message, detail, field),
            };
        }
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
    } else {
        assertion_error(u.message, plain, u.field)
    }
}

/// Whether a paid layer's provider must be configured in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Providers {
    /// The suite is evaluated here: a missing provider refuses it.
    Required,
    /// Another process evaluates it (a collector that publishes to workers):
    /// the specs are checked, the providers are that process's concern.
    Elsewhere,
}

/// Checks every assertion's envelope and compiles its spec, before anything runs.
/// The batch's plan; `None` when `reserved` is given and the in-flight
/// budget for compiled checks ran out (see [`Reserved`]).
fn plan<'a>(
    engine: &Engine,
    wire: &[Envelope<'a>],
    providers: Providers,
    mut reserved: Option<&mut Reserved>,
) -> Result<Option<Plan<'a>>, RpcError> {
    let mut reader = SuiteReader::with_capacity(wire.len());
    let mut planned = Vec::with_capacity(wire.len());
    let mut keys = Vec::with_capacity(wire.len());
    let mut no_provider = None;
    for (i, w) in wire.iter().enumerate() {
        let id = reader.id(i, w.assertion_id.as_deref()).map_err(suite_error)?;
        if w.request_id
            .as_deref()
            .is_some_and(|r| r.is_empty() || r.len() > MAX_ASSERTION_ID_BYTES)
        {
            return Err(assertion_error(
                format!(
                    "assertion {}: request_id must be a non-empty string of at most {MAX_ASSERTION_ID_BYTES} bytes",
                    quote(id)
                ),
                "request_id is an optional idempotency key; send a short string or omit it.",
                format!("params.assertions[{i}].request_id"),
            )
            .with_assertion(id));
        }
        let kind = reader.kind(i, id, w.kind.as_deref()).map_err(suite_error)?;
        let spec_text = w.spec.map_or("null", |s| s.get());
        let (compiled, fresh) = compile(engine, kind, spec_text).map_err(|error| {
            suite_error(SuiteError::Spec {
                index: i,
                id: id.to_owned(),
                kind,
                error,
            })
        })?;
        // Compiled checks count against the budget as they are made, so a
        // plan that does not fit stops before it holds more.
        match reserved.as_deref_mut().filter(|_| fresh).map(|r| r.take(compiled.memory_bytes())) {
            None | Some(Room::Taken) => {}
            Some(Room::NotNow) => return Ok(None),
            Some(Room::Never) => {
                return Err(assertion_error(
                    format!(
                        "assertion {}: the batch's checks compile to more than {} MiB together, the most one batch may hold",
                        quote(id),
                        IN_FLIGHT_COMPILED_BYTES >> 20
                    ),
                    "Split the suite into smaller batches, or make its patterns smaller: large counted repetitions (\\w{500}) and big Unicode classes repeated many times make programs of up to 1 MiB each.",
                    format!("params.assertions[{i}]"),
                )
                .with_assertion(id))
            }
        }
        // A paid layer without its provider is a configuration error, found
        // before anything is evaluated (and never worth retrying as is). It
        // is reported only once every spec of the batch compiled: a mistake
        // in a spec is the user's to fix whatever the engine's configuration,
        // wherever it stands in the batch, and would otherwise show only once
        // a provider is added.
        if kind.is_paid() && providers == Providers::Required && no_provider.is_none() {
            if let Some(missing) = engine.providers.missing_for(kind) {
                no_provider = Some(provider_missing(missing, i, id, kind));
            }
        }
        planned.push(evaluator::Planned {
            id: id.to_owned(),
            kind,
            compiled,
        });
        keys.push(RequestKey {
            request_id: w.request_id.as_deref().map(str::to_owned),
            spec_text: Cow::Borrowed(spec_text),
        });
    }
    if let Some(error) = no_provider {
        return Err(error);
    }
    Ok(Some(Plan {
        suite: Evaluator::from_planned(planned),
        keys,
    }))
}

/// The compiled assertion, and whether it was compiled now (not cached).
fn compile(engine: &Engine, kind: AssertionType, spec_text: &str) -> Result<(Arc<CompiledAssertion>, bool), SpecError> {
    let cacheable = spec_text.len() <= MAX_CACHED_SPEC_BYTES;
    if cacheable {
        if let Some(hit) = engine.caches.compiled.get(&SpecKeyRef { kind, text: spec_text }) {
            return Ok((hit, false));
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
    let compiled = Arc::new(CompiledAssertion::compile(kind, Some(&spec), engine)?);
    engine.caches.compiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if cacheable {
        let key = SpecKey {
            kind,
            text: spec_text.into(),
        };
        engine.caches.compiled.insert(key, compiled.clone());
    }
    Ok((compiled, true))
}

/// Appended to an explanation whose plugin details were left out of an answer.
const DETAILS_LEFT_OUT: &str = " [details left out: the answer line is limited to 64 KiB]";

impl BatchResult {
    /// Shrinks the result until it serialises to at most `max_bytes`. Plugin
    /// details go first, largest first. Then explanations and evidence
    /// fields are shrunk evenly: every explanation is cut to the longest
    /// length that fits, found by bisection, so the answer keeps as much of
    /// each reason as the room allows; evidence is cut faster, and goes
    /// first ([`evidence_cap`]). Judge metadata goes next, then layer and
    /// type. Returns false when even empty texts do not fit.
    pub fn fit(&mut self, max_bytes: usize) -> bool {
        let size = |b: &BatchResult| serde_json::to_vec(b).map_or(usize::MAX, |v| v.len());
        let fits = |b: &BatchResult| size(b) <= max_bytes;
        let mut now = size(self);
        if now <= max_bytes {
            return true;
        }
        // Plugin details are extra structure beside the explanation: they
        // go first, largest first, each leaving a note, before any
        // explanation is cut.
        let mut details: Vec<(usize, usize)> = self
            .results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.details.as_ref().map(|d| (serde_json::to_vec(d).map_or(0, |v| v.len()), i)))
            .collect();
        details.sort_unstable_by(|a, b| b.cmp(a));
        for (bytes, i) in details {
            let r = &mut self.results[i];
            r.details = None;
            r.explanation.push_str(DETAILS_LEFT_OUT);
            now = now.saturating_sub(bytes);
            // Measured again only once the estimate says it may fit.
            if now <= max_bytes {
                now = size(self);
                if now <= max_bytes {
                    return true;
                }
            }
        }
        let longest = self
            .results
            .iter()
            .flat_map(|r| r.texts())
            .map(|t| t.chars().count())
            .max()
            .unwrap_or(0);
        // The cap at which nothing is cut, evidence included.
        let uncut = longest * 2 + EXPLANATION_FIRST;
        let clipped = |cap: usize| {
            let mut trial = self.clone();
            trial.clip_texts(cap);
            trial
        };
        if fits(&clipped(0)) {
            // `lo` fits and `hi` does not.
            let (mut lo, mut hi) = (0, uncut);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if fits(&clipped(mid)) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            self.clip_texts(lo);
            return true;
        }
        self.clip_texts(0);
        for r in &mut self.results {
            r.evidence.judge_metadata = None;
            r.threshold_source = None;
        }
        if fits(self) {
            return true;
        }
        // Last resort, for batches of many hundreds of results: the SDK
        // reads a missing layer and type as unknown.
        for r in &mut self.results {
            r.kind = None;
            r.layer = 0;
        }
        fits(self)
    }

    /// Cuts every explanation to `cap` characters and every evidence text
    /// to [`evidence_cap`] of it (with an ellipsis); emptied evidence is left
    /// out rather than sent empty.
    fn clip_texts(&mut self, cap: usize) {
        let clip = |t: &mut String, cap: usize| {
            clip_in_place(t, cap);
            if cap == 0 {
                t.clear();
            }
        };
        for r in &mut self.results {
            clip(&mut r.explanation, cap);
            let ev = &mut r.evidence;
            for f in [&mut ev.trace_node_path, &mut ev.expected, &mut ev.actual, &mut ev.suggested_action] {
                if let Some(t) = f {
                    clip(t, evidence_cap(cap));
                }
                if f.as_ref().is_some_and(|s| s.is_empty()) {
                    *f = None;
                }
            }
        }
    }
}

/// Characters of each evidence text kept beside explanations of `cap`: none
/// until explanations have [`EXPLANATION_FIRST`] characters, then half of
/// what they have beyond that. The explanation says what went wrong; four
/// evidence texts and their keys would otherwise take most of a tight
/// answer's room and leave every reason a few characters long.
fn evidence_cap(cap: usize) -> usize {
    cap.saturating_sub(EXPLANATION_FIRST) / 2
}

/// See [`evidence_cap`].
const EXPLANATION_FIRST: usize = 160;

impl AssertionResult {
    /// The result of an assertion the evaluator answered, its texts bounded.
    fn new(p: &evaluator::Planned, outcome: Outcome, max_chars: usize) -> AssertionResult {
        let mut explanation = outcome.verdict.explanation;
        clip_in_place(&mut explanation, max_chars);
        AssertionResult {
            assertion_id: p.id.clone(),
            status: outcome.status,
            // Scores are in [0, 1] whatever a plugin or provider returned.
            score: if outcome.verdict.score.is_nan() {
                0.0
            } else {
                outcome.verdict.score.clamp(0.0, 1.0)
            },
            explanation,
            cost: outcome.cost,
            duration_ms: outcome.duration_ms,
            request_id: None,
            cached: false,
            details: outcome.details,
            layer: p.kind.layer(),
            kind: Some(p.kind.name()),
            threshold_source: outcome.threshold_source,
            evidence: ResultEvidence::from_verdict(outcome.verdict.evidence),
        }
    }

    /// The free texts of the result, which `fit` may shorten.
    fn texts(&self) -> impl Iterator<Item = &String> {
        let e = &self.evidence;
        std::iter::once(&self.explanation).chain(
            [&e.trace_node_path, &e.expected, &e.actual, &e.suggested_action]
                .into_iter()
                .flatten(),
        )
    }
}

/// A key in a file's assertion that nothing reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Typo {
    /// Where it is, from the assertion list (`assertions[2].spec.chek`).
    pub field: String,
    pub message: String,
    /// The keys that are read there.
    pub valid_choices: Vec<String>,
}

impl std::fmt::Display for Typo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; valid choices: {}", self.message, self.valid_choices.join(", "))
    }
}

/// The members of an assertion object (Attest protocol v1 §4).
pub const ASSERTION_KEYS: [&str; 4] = ["assertion_id", "type", "spec", "request_id"];

/// The first member of one of `assertions` that is not an assertion member
/// (see [`Suite::first_unread_key`] for why files refuse what the wire
/// ignores).
pub fn first_unknown_member(assertions: &[Value]) -> Option<Typo> {
    assertions.iter().enumerate().find_map(|(i, a)| {
        let key = a.as_object()?.keys().find(|k| !ASSERTION_KEYS.contains(&k.as_str()))?;
        let key = crate::text::clip(key, 64);
        Some(Typo {
            field: format!("assertions[{i}].{key}"),
            message: format!("unknown key `{key}` in an assertion"),
            valid_choices: ASSERTION_KEYS.iter().map(|k| k.to_string()).collect(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest batch the protocol allows, 512 distinct checks of every
    /// layer 1–4 kind (regexes with Unicode classes among them), sent twice
    /// as an SDK sends a suite: each is compiled once, and all of them stay
    /// in the default compiled cache.
    #[tokio::test]
    async fn a_512_check_suite_is_compiled_once_within_the_default_cache() {
        let mixed: Vec<Value> = (0..512)
            .map(|i| {
                let spec = match i % 4 {
                    0 => serde_json::json!({"target": "output.message", "check": "regex_match", "value": format!(r"\p{{L}}+ order {i} \d{{{}}}[\w\-]*", i % 9 + 1)}),
                    1 => serde_json::json!({"target": "output.message", "check": "regex_match", "value": format!("refund[ -]?id {i}")}),
                    2 => serde_json::json!({"target": "output.structured", "schema": {"type": "object", "properties": {"id": {"type": "string", "pattern": format!("^RFD-[0-9]{{{}}}$|^X{i}$", i % 7 + 1)}}}}),
                    _ => serde_json::json!({"target": "output.message", "check": "contains", "value": format!("refund {i}")}),
                };
                let kind = if i % 4 == 2 { "schema" } else { "content" };
                serde_json::json!({"assertion_id": format!("a{i}"), "type": kind, "spec": spec})
            })
            .collect();
        compiled_once_within_the_default_cache(&mixed).await;
        // Every one a schema with Unicode-class patterns: each weighs its
        // programs, not a search cache per thread.
        let schemas: Vec<Value> = (0..512)
            .map(|i| {
                let id = serde_json::json!({"type": "string", "pattern": format!(r"^RFD-[0-9]{{{}}}$|^\p{{L}}+ {i}$", i % 7 + 1)});
                let spec = serde_json::json!({"target": "output.structured", "schema": {"type": "object", "properties": {"id": id}}});
                serde_json::json!({"assertion_id": format!("s{i}"), "type": "schema", "spec": spec})
            })
            .collect();
        compiled_once_within_the_default_cache(&schemas).await;
    }

    async fn compiled_once_within_the_default_cache(assertions: &[Value]) {
        let engine = Engine::new(crate::config::Config {
            history: None,
            ..Default::default()
        });
        let trace = r#"{"schema_version": 1, "trace_id": "t", "output": {"message": "Your refund order 123 is done.", "structured": {"id": "RFD-1"}}}"#;
        for _ in 0..2 {
            let suite = Suite::compile(&engine, assertions).unwrap();
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            let result = suite.evaluate(&engine, trace, deadline).await.unwrap();
            assert_eq!(result.results.len(), 512);
        }
        // With room to spare: the cache is sharded, and a shard fuller than
        // the rest would evict before the whole is full.
        let (weight, capacity) = (engine.caches.compiled.weight(), engine.caches.compiled.capacity());
        assert!(weight * 10 <= capacity * 6, "512 checks weigh {weight} bytes of the {capacity}");
        assert_eq!(
            engine.caches.compiles.load(std::sync::atomic::Ordering::Relaxed),
            512,
            "each check compiled once"
        );
    }

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
    fn fit_leaves_plugin_details_out_before_cutting_any_explanation() {
        let with_details = |i: usize, bytes: usize| AssertionResult {
            details: Some(serde_json::json!({"blob": "d".repeat(bytes)})),
            ..failed(i, 40)
        };
        // Sixteen results with 4 KiB of details each, and one with more.
        let mut results: Vec<AssertionResult> = (0..16).map(|i| with_details(i, 4096)).collect();
        results.push(with_details(16, 20_000));
        let mut b = batch(results);
        let explanations: Vec<String> = b.results.iter().map(|r| r.explanation.clone()).collect();
        let max = 64 * 1024 - 1;
        assert!(b.fit(max));
        assert!(serde_json::to_vec(&b).unwrap().len() <= max);
        // The largest went first, and only as many as needed.
        assert!(b.results[16].details.is_none() && b.results[16].explanation.ends_with(DETAILS_LEFT_OUT));
        let kept = b.results.iter().filter(|r| r.details.is_some()).count();
        assert!((1..16).contains(&kept), "{kept} kept");
        for (r, before) in b.results.iter().zip(&explanations) {
            assert!(r.explanation.starts_with(before.as_str()), "no explanation was cut");
            assert_eq!(
                r.details.is_none(),
                r.explanation.ends_with(DETAILS_LEFT_OUT),
                "a note where details went"
            );
        }
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
    fn fit_keeps_as_much_of_every_reason_as_the_room_allows() {
        // Hundreds of failures with long reasons, as a broken agent gives:
        // the answer uses its room, and every result keeps a reason.
        for n in [150, 250, 290] {
            let mut b = batch((0..n).map(|i| failed(i, 2000)).collect());
            let max = 64 * 1024 - 1;
            assert!(b.fit(max));
            let size = serde_json::to_vec(&b).unwrap().len();
            assert!(size <= max, "{n}: {size}");
            // Within one character per text of the limit.
            assert!(size + n * 5 * 4 > max, "{n} results: {size} bytes of {max} used");
            assert!(
                b.results.iter().all(|r| r.explanation.chars().count() > 3),
                "{n}: {:?}",
                b.results[0].explanation
            );
        }
    }
}
