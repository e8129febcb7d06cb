//! `evaluate_batch` (spec §2.2): validate the trace, compile every assertion,
//! evaluate them in request order, and shape results that fit one response line.
//!
//! Two bounded caches make repeated work cheap:
//! - compiled assertions, keyed by type and the spec's exact text, so a
//!   suite sending the same assertions for every trace compiles each once;
//! - results by `request_id` (spec §2.2 idempotency). Reusing a `request_id`
//!   for a different assertion (other type or spec) is a `1002` error rather
//!   than a silently wrong answer.

use crate::config::Config;
use crate::layers::{AssertionType, CompiledAssertion, SpecError, Status};
use crate::protocol::{ErrorCode, RpcError};
use crate::session::Engine;
use crate::text::{clip_in_place, quote};
use crate::trace::parse_trace;
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
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
    compiled: Cache<String, Arc<CompiledAssertion>>,
    by_request_id: Cache<String, Arc<CachedResult>>,
}

struct CachedResult {
    fingerprint: u64,
    result: AssertionResult,
}

impl BatchCaches {
    pub fn new(config: &Config) -> BatchCaches {
        BatchCaches {
            compiled: Cache::new(config.compiled_cache_entries.max(1)),
            by_request_id: Cache::new(config.idempotency_cache_entries.max(1)),
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
    pub request_id: Option<String>,
    /// Set when the result was served from the `request_id` cache.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BatchResult {
    /// The evaluated trace (not serialised; for logs and the CLI).
    #[serde(skip)]
    pub trace_id: String,
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

#[derive(Deserialize)]
struct WireAssertion<'a> {
    #[serde(default)]
    assertion_id: Option<Value>,
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
    #[serde(default)]
    request_id: Option<Value>,
}

/// One assertion of the request, checked and compiled.
struct Planned<'a> {
    id: String,
    request_id: Option<String>,
    kind: AssertionType,
    spec_text: &'a str,
    compiled: Arc<CompiledAssertion>,
}

fn assertion_error(message: String, detail: impl Into<String>, field: String) -> RpcError {
    RpcError::new(ErrorCode::AssertionError, message, detail).with_field(field)
}

/// Evaluates one `evaluate_batch` request. `deadline` bounds the work (3002).
pub fn evaluate(
    engine: &Engine,
    params: Option<&RawValue>,
    deadline: Instant,
) -> Result<BatchResult, RpcError> {
    let started = Instant::now();
    let shape = "Send {\"trace\": {...}, \"assertions\": [{\"assertion_id\": ..., \"type\": ..., \"spec\": {...}}, ...]}.";
    let params: Params<'_> = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .ok_or_else(|| {
            RpcError::invalid_params(
                "evaluate_batch params must be an object with trace and assertions",
                shape,
            )
            .with_field("params")
        })?;
    let trace_raw = params.trace.filter(|t| t.get() != "null").ok_or_else(|| {
        RpcError::new(
            ErrorCode::InvalidTrace,
            "evaluate_batch params missing required field: trace",
            shape,
        )
        .with_field("params.trace")
    })?;
    let parsed = parse_trace(trace_raw, &engine.limits)?;
    for w in &parsed.warnings {
        tracing::warn!(trace_id = %parsed.trace.trace_id, "{w}");
    }
    let trace = parsed.trace;
    let plan = plan(engine, params.assertions)?;

    let mut results = Vec::with_capacity(plan.len());
    let max_chars = engine.config.max_explanation_chars;
    for p in &plan {
        if Instant::now() > deadline {
            return Err(timeout(
                engine.config.eval_timeout,
                results.len(),
                plan.len(),
            ));
        }
        if let Some(rid) = &p.request_id {
            if let Some(hit) = engine.caches.by_request_id.get(rid) {
                if hit.fingerprint != fingerprint(p.kind, p.spec_text) {
                    return Err(RpcError::new(
                        ErrorCode::AssertionError,
                        format!("assertion {}: request_id {} was already used for a different assertion", quote(&p.id), quote(rid)),
                        "A request_id is an idempotency key: resend it only with the same type and spec. Use a fresh request_id for a new assertion.",
                    )
                    .with_assertion(&p.id)
                    .with_field("request_id"));
                }
                results.push(AssertionResult {
                    assertion_id: p.id.clone(),
                    duration_ms: 0,
                    cached: true,
                    ..hit.result.clone()
                });
                continue;
            }
        }
        let t0 = Instant::now();
        let (status, verdict) = p.compiled.evaluate(&trace);
        let mut explanation = verdict.explanation;
        clip_in_place(&mut explanation, max_chars);
        let result = AssertionResult {
            assertion_id: p.id.clone(),
            status,
            score: verdict.score,
            explanation,
            cost: 0.0,
            duration_ms: t0.elapsed().as_millis() as u64,
            request_id: p.request_id.clone(),
            cached: false,
        };
        if let Some(rid) = &p.request_id {
            engine.caches.by_request_id.insert(
                rid.clone(),
                Arc::new(CachedResult {
                    fingerprint: fingerprint(p.kind, p.spec_text),
                    result: result.clone(),
                }),
            );
        }
        results.push(result);
    }
    engine.count_evaluated(results.len() as u64);
    let total_cost = results.iter().map(|r| r.cost).sum();
    Ok(BatchResult {
        trace_id: trace.trace_id,
        results,
        total_cost,
        total_duration_ms: started.elapsed().as_millis() as u64,
    })
}

fn timeout(limit: Duration, done: usize, total: usize) -> RpcError {
    RpcError::new(
        ErrorCode::Timeout,
        format!("evaluation timed out after {}ms", limit.as_millis()),
        format!("{done} of {total} assertions finished before the deadline. Reduce the batch size or trace size, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT)."),
    )
}

fn fingerprint(kind: AssertionType, spec_text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    kind.name().hash(&mut h);
    spec_text.hash(&mut h);
    h.finish()
}

/// Checks every assertion's envelope and compiles its spec, before anything runs.
fn plan<'a>(
    engine: &Engine,
    assertions: Option<&'a RawValue>,
) -> Result<Vec<Planned<'a>>, RpcError> {
    let shape = "Send assertions as a list of {\"assertion_id\": str, \"type\": str, \"spec\": {...}, \"request_id\"?: str}.";
    let raw = assertions.filter(|a| a.get() != "null").ok_or_else(|| {
        assertion_error(
            "evaluate_batch params missing required field: assertions".into(),
            shape,
            "params.assertions".into(),
        )
    })?;
    let items: Vec<&'a RawValue> = serde_json::from_str(raw.get()).map_err(|_| {
        assertion_error(
            "evaluate_batch assertions must be a list".into(),
            shape,
            "params.assertions".into(),
        )
    })?;
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(items.len());
    let mut planned: Vec<Planned<'a>> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("params.assertions[{i}]");
        let w: WireAssertion<'a> = serde_json::from_str(item.get()).map_err(|_| {
            assertion_error(
                format!("assertions[{i}] must be an object"),
                shape,
                at.clone(),
            )
        })?;
        let id = match &w.assertion_id {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                return Err(assertion_error(
                    format!("assertions[{i}] missing required field: assertion_id"),
                    shape,
                    format!("{at}.assertion_id"),
                ))
            }
            Some(_) => {
                return Err(assertion_error(
                    format!("assertions[{i}] assertion_id must be a string"),
                    shape,
                    format!("{at}.assertion_id"),
                ))
            }
        };
        if id.len() > MAX_ASSERTION_ID_BYTES {
            return Err(assertion_error(
                format!(
                    "assertion_id exceeds maximum length: {} > {MAX_ASSERTION_ID_BYTES}",
                    id.len()
                ),
                format!("assertion_id must be at most {MAX_ASSERTION_ID_BYTES} bytes."),
                format!("{at}.assertion_id"),
            ));
        }
        let request_id = match &w.request_id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_ASSERTION_ID_BYTES => Some(s.clone()),
            Some(_) => {
                return Err(assertion_error(
                    format!("assertion {}: request_id must be a non-empty string of at most {MAX_ASSERTION_ID_BYTES} bytes", quote(&id)),
                    "request_id is an optional idempotency key; send a short string or omit it.",
                    format!("{at}.request_id"),
                )
                .with_assertion(&id))
            }
        };
        let kind_name = match &w.kind {
            Some(Value::String(s)) => s.as_str(),
            None | Some(Value::Null) => {
                return Err(assertion_error(
                    format!("assertion {}: missing required field: type", quote(&id)),
                    format!("Set type to one of: {}.", AssertionType::available_names()),
                    format!("{at}.type"),
                )
                .with_assertion(&id))
            }
            Some(_) => {
                return Err(assertion_error(
                    format!("assertion {}: type must be a string", quote(&id)),
                    format!("Set type to one of: {}.", AssertionType::available_names()),
                    format!("{at}.type"),
                )
                .with_assertion(&id))
            }
        };
        let kind = match AssertionType::parse(kind_name) {
            Some(k) if k.is_available() => k,
            Some(k) => {
                return Err(assertion_error(
                    format!(
                        "assertion {}: assertion type '{}' (layer {}) is not available: this engine does not support capability '{}'",
                        quote(&id),
                        k.name(),
                        k.layer(),
                        k.capability()
                    ),
                    format!(
                        "Supported assertion types: {}. Check the capabilities returned by initialize before sending {} assertions.",
                        AssertionType::available_names(),
                        k.name()
                    ),
                    format!("{at}.type"),
                )
                .with_assertion(&id))
            }
            None => {
                return Err(assertion_error(
                    format!("assertion {}: unknown assertion type {}", quote(&id), quote(kind_name)),
                    format!("Supported assertion types: {}.", AssertionType::available_names()),
                    format!("{at}.type"),
                )
                .with_assertion(&id))
            }
        };
        if let Some(first) = seen.insert(id.clone(), i) {
            return Err(assertion_error(
                format!("duplicate assertion_id {} in batch (assertions[{first}] and assertions[{i}])", quote(&id)),
                "assertion_id must be unique within a batch: results are matched to assertions by it.",
                format!("{at}.assertion_id"),
            )
            .with_assertion(&id));
        }
        let spec_text = w.spec.map_or("null", |s| s.get());
        let compiled = compile(engine, kind, spec_text).map_err(|e| {
            RpcError::new(
                ErrorCode::AssertionError,
                format!("assertion {} ({}): {}", quote(&id), kind.name(), e.message),
                e.detail,
            )
            .with_assertion(&id)
            .with_field(format!("{at}.{}", e.field))
        })?;
        planned.push(Planned {
            id,
            request_id,
            kind,
            spec_text,
            compiled,
        });
    }
    Ok(planned)
}

fn compile(
    engine: &Engine,
    kind: AssertionType,
    spec_text: &str,
) -> Result<Arc<CompiledAssertion>, SpecError> {
    let cacheable = spec_text.len() <= MAX_CACHED_SPEC_BYTES;
    let key = if cacheable {
        format!("{}\u{0}{spec_text}", kind.name())
    } else {
        String::new()
    };
    if cacheable {
        if let Some(hit) = engine.caches.compiled.get(&key) {
            return Ok(hit);
        }
    }
    let spec: Value =
        serde_json::from_str(spec_text).expect("spec text was parsed as JSON already");
    let compiled = Arc::new(CompiledAssertion::compile(kind, Some(&spec))?);
    if cacheable {
        engine.caches.compiled.insert(key, compiled.clone());
    }
    Ok(compiled)
}

impl BatchResult {
    /// Shrinks explanations evenly until the serialised result is at most
    /// `max_bytes`. Returns false when even empty explanations do not fit.
    pub fn fit(&mut self, max_bytes: usize) -> bool {
        loop {
            let size = serde_json::to_vec(self)
                .map(|v| v.len())
                .unwrap_or(usize::MAX);
            if size <= max_bytes {
                return true;
            }
            let longest = self
                .results
                .iter()
                .map(|r| r.explanation.chars().count())
                .max()
                .unwrap_or(0);
            if longest == 0 {
                return false;
            }
            // Cut every explanation to a share of what must go, at least a quarter of the longest.
            let excess = size - max_bytes;
            let per = excess.div_ceil(self.results.len().max(1));
            let cap = longest.saturating_sub(per.max(longest / 4).max(1));
            for r in &mut self.results {
                clip_in_place(&mut r.explanation, cap);
                if cap == 0 {
                    r.explanation.clear();
                }
            }
        }
    }
}
