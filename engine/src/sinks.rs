//! Where evaluations leave their marks. The evaluator has no side effects;
//! after each `evaluate_batch` (and each suite evaluation of the other front
//! doors) the sinks get everything through one [`Sinks::record`]:
//!
//! - the `request_id` cache (Attest protocol v1 §2.2 idempotency), which
//!   also answers repeated requests before anything is evaluated
//!   ([`Sinks::answered`]);
//! - the result history (rows for `query_drift` and dynamic thresholds);
//! - the session log behind the session reports;
//! - the drift webhook;
//! - the session's counters: assertions evaluated and money spent.
//!
//! Results SDKs submit themselves (`submit_plugin_result`) go through
//! [`Sinks::record_submitted`].

use crate::alerts::Webhook;
use crate::batch::{AssertionResult, Effects, MAX_DETAILS_BYTES};
use crate::config::Config;
use crate::evaluator::{Outcome, Planned};
use crate::history::{Detail, DriftReport, History, Kept, Row, Rows, Run, RunKind, SpecDigest};
use crate::layers::AssertionType;
use crate::layers::Status;
use crate::plugin_results::{PluginResult, PluginResults};
use crate::report::{LoggedBatch, ReportedResult, SessionLog};
use crate::text::quote;
use crate::trace::Trace;
use attest_collect::trace_doc::TraceDoc;
use quick_cache::sync::Cache;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A run with a key no other run has: the time, the process and a count.
fn new_run(kind: RunKind, label: String) -> Arc<Run> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Arc::new(Run {
        key: format!(
            "{}-{at}-{}-{}",
            kind.name(),
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        ),
        kind,
        label,
    })
}

/// What the history keeps of a result that explains it.
fn detail_of(r: &AssertionResult) -> Detail {
    Detail {
        explanation: r.explanation.clone(),
        trace_node_path: r.evidence.trace_node_path.clone(),
        expected: r.evidence.expected.clone(),
        actual: r.evidence.actual.clone(),
        hint: r.evidence.suggested_action.clone(),
        judge: r.evidence.judge_metadata.as_ref().and_then(|j| serde_json::to_value(j).ok()),
    }
}

/// One evaluated batch, as the sinks see it.
pub struct Evaluation<'a> {
    pub trace: &'a Trace,
    /// The trace as it was sent, kept in the history when a result fails.
    pub trace_raw: &'a str,
    /// Each assertion, with its `request_id` and spec text.
    pub assertions: Vec<(&'a Planned, Option<&'a str>, &'a str)>,
    /// What the evaluator concluded (`None`: answered from the `request_id` cache).
    pub fresh: &'a [Option<Fresh>],
    /// The results as they are answered, in the same order.
    pub results: &'a [AssertionResult],
    /// Hash of the trace text, when some assertion carries a `request_id`.
    pub trace_digest: Option<u64>,
    /// Drift detected by dynamic thresholds.
    pub alerts: &'a [DriftReport],
}

/// What the sinks read of an outcome the evaluator concluded, besides its
/// result: the outcome itself moves into the result.
#[derive(Debug, Clone, Copy)]
pub struct Fresh {
    /// USD spent on it.
    pub cost: f64,
    /// Not run (short-circuit): recorded in no history.
    pub skipped: bool,
    /// The score as the check gave it, before results clamp it.
    pub score: f64,
}

impl Fresh {
    pub fn of(o: &Outcome) -> Fresh {
        Fresh {
            cost: o.cost,
            skipped: o.skipped,
            score: o.verdict.score,
        }
    }
}

/// A `request_id` sent again for a different assertion or trace.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestIdReused {
    pub assertion_id: String,
    /// Its position in the batch.
    pub position: usize,
    pub request_id: String,
    /// Where it was used before: an earlier assertion of the same batch
    /// (its position), or an earlier request.
    pub earlier_in_batch: Option<usize>,
}

impl std::fmt::Display for RequestIdReused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (id, rid) = (quote(&self.assertion_id), quote(&self.request_id));
        match self.earlier_in_batch {
            Some(i) => write!(
                f,
                "assertion {id}: request_id {rid} is also the request_id of assertions[{i}] in this batch, which is a different assertion"
            ),
            None => write!(f, "assertion {id}: request_id {rid} was already used for a different request"),
        }
    }
}

impl std::error::Error for RequestIdReused {}

pub struct Sinks {
    by_request_id: Cache<String, Arc<CachedResult>, ResultWeight>,
    /// Result history (`None`: switched off or could not be opened).
    pub history: Option<History>,
    /// Results kept for the session reports (only when reports are configured).
    pub session_log: SessionLog,
    /// Results SDKs submitted (`submit_plugin_result`), for the reports.
    pub plugin_results: PluginResults,
    /// Where drift alerts are posted, if configured.
    webhook: Option<Webhook>,
    evaluated: AtomicU64,
    /// What paid assertions have cost this session, in USD (f64 bits).
    cost: AtomicU64,
    /// The run the history files this engine's results under.
    run: std::sync::RwLock<Arc<Run>>,
    /// `--export-otlp`: every result as an OpenTelemetry event.
    export: std::sync::OnceLock<Arc<attest_collect::export::OtlpExport>>,
}

struct CachedResult {
    /// What the `request_id` stands for: the assertion and the trace it ran on.
    fingerprint: u64,
    result: AssertionResult,
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

impl Sinks {
    pub fn new(config: &Config, history: Option<History>, webhook: Option<Webhook>) -> Sinks {
        let results = config.idempotency_cache_entries.max(1);
        Sinks {
            by_request_id: Cache::with_weighter(
                results,
                config.idempotency_cache_bytes,
                ResultWeight {
                    floor: config.idempotency_cache_bytes / results as u64,
                },
            ),
            history,
            session_log: SessionLog::new(!config.reports.is_empty(), config.session_log_bytes),
            plugin_results: PluginResults::new(config.max_plugin_results, config.plugin_results_bytes),
            webhook,
            evaluated: AtomicU64::new(0),
            cost: AtomicU64::new(0),
            run: std::sync::RwLock::new(new_run(RunKind::Session, "attest-engine session".into())),
            export: std::sync::OnceLock::new(),
        }
    }

    /// Sends every result recorded from now on to `export` too.
    pub fn export_to(&self, export: Arc<attest_collect::export::OtlpExport>) {
        let _ = self.export.set(export);
    }

    /// The exporter, when results are exported.
    pub fn export(&self) -> Option<&Arc<attest_collect::export::OtlpExport>> {
        self.export.get()
    }

    /// An evaluation of `trace_text` that ended in `error` before any
    /// verdict: one event per assertion of `assertion_ids` for the
    /// exporter, with `error.type` and no score, so a backend shows the
    /// failure beside the trace. Nothing happens without an exporter.
    pub fn evaluation_failed(&self, trace_text: &str, assertion_ids: impl Iterator<Item = String>, error: &crate::protocol::RpcError) {
        let Some(export) = self.export.get() else {
            return;
        };
        let trace = serde_json::from_str(trace_text).map(TraceDoc::from_raw).ok();
        for name in assertion_ids {
            export.send(attest_collect::export::Event {
                trace_id: trace.as_ref().map_or("", TraceDoc::trace_id).to_owned(),
                span_id: trace.as_ref().and_then(|t| t.span_id(None)).map(str::to_owned),
                name,
                score: None,
                status: None,
                explanation: error.message.clone(),
                error_type: Some(error.code.error_type().to_owned()),
            });
        }
    }

    /// Files the results recorded from now on under a new run.
    pub fn start_run(&self, kind: RunKind, label: String) {
        *self.run.write().unwrap_or_else(|e| e.into_inner()) = new_run(kind, label);
    }

    /// Names the current run (a session, once the SDK said who it is).
    pub fn label_run(&self, label: String) {
        let mut run = self.run.write().unwrap_or_else(|e| e.into_inner());
        *run = Arc::new(Run { label, ..(**run).clone() });
    }

    /// The run results are filed under now.
    pub fn run(&self) -> Arc<Run> {
        self.run.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The results the `request_id` cache already holds, by position; a
    /// `request_id` reused for another assertion or trace is refused.
    pub fn answered<'a>(
        &self,
        assertions: impl Iterator<Item = (&'a str, Option<&'a str>, AssertionType, &'a str)>,
        trace_digest: Option<u64>,
    ) -> Result<Vec<Option<AssertionResult>>, RequestIdReused> {
        // A key stands for one assertion within a batch too: otherwise the
        // same batch, retried, would be refused against itself.
        let mut in_batch: HashMap<&str, (usize, u64)> = HashMap::new();
        assertions
            .enumerate()
            .map(|(i, (id, request_id, kind, spec_text))| {
                let Some(rid) = request_id else { return Ok(None) };
                let print = fingerprint(kind, spec_text, trace_digest);
                let reused = |earlier_in_batch| RequestIdReused {
                    assertion_id: id.to_owned(),
                    position: i,
                    request_id: rid.to_owned(),
                    earlier_in_batch,
                };
                match in_batch.entry(rid) {
                    Entry::Occupied(e) if e.get().1 != print => return Err(reused(Some(e.get().0))),
                    Entry::Occupied(_) => {}
                    Entry::Vacant(e) => {
                        e.insert((i, print));
                    }
                }
                let Some(hit) = self.by_request_id.get(rid) else {
                    return Ok(None);
                };
                if hit.fingerprint != print {
                    return Err(reused(None));
                }
                Ok(Some(AssertionResult {
                    assertion_id: id.to_owned(),
                    duration_ms: 0,
                    cached: true,
                    ..hit.result.clone()
                }))
            })
            .collect()
    }

    /// Records one evaluation. Money spent and `request_id`s are always
    /// recorded; history rows, the session log and the evaluated count only
    /// with [`Effects::All`] (callers with their own records pass
    /// [`Effects::ResultsOnly`]).
    pub fn record(&self, e: &Evaluation<'_>, effects: Effects) {
        let fresh = || {
            e.assertions
                .iter()
                .zip(e.fresh)
                .zip(e.results)
                .filter_map(|((a, o), r)| Some((a, o.as_ref()?, r)))
        };
        self.add_cost(fresh().fold(0.0, |acc, (_, o, _)| acc + o.cost));
        for ((planned, request_id, spec_text), _, result) in fresh() {
            if let Some(rid) = request_id {
                self.by_request_id.insert(
                    (*rid).to_owned(),
                    Arc::new(CachedResult {
                        fingerprint: fingerprint(planned.kind, spec_text, e.trace_digest),
                        result: result.clone(),
                    }),
                );
            }
        }
        if effects != Effects::All {
            return;
        }
        self.evaluated.fetch_add(e.results.len() as u64, Ordering::Relaxed);
        if let Some(export) = self.export.get() {
            // Read only when some result points into the trace.
            let parsed = e
                .results
                .iter()
                .any(|r| r.evidence.trace_node_path.is_some())
                .then(|| serde_json::from_str(e.trace_raw).map(TraceDoc::from_raw).ok())
                .flatten();
            for (_, _, r) in fresh() {
                export.send(attest_collect::export::Event {
                    trace_id: e.trace.trace_id.clone(),
                    span_id: parsed
                        .as_ref()
                        .and_then(|t| t.span_id(r.evidence.trace_node_path.as_deref()))
                        .map(str::to_owned),
                    name: r.assertion_id.clone(),
                    score: Some(r.score),
                    status: Some(r.status),
                    explanation: r.explanation.clone(),
                    error_type: None,
                });
            }
        }
        if let Some(webhook) = &self.webhook {
            for alert in e.alerts {
                webhook.send(alert.clone());
            }
        }
        if let Some(history) = &self.history {
            let recorded = || fresh().filter(|(_, o, _)| !o.skipped);
            // A failing evaluation keeps what explains it, for people to look at.
            let kept = recorded().any(|(_, _, r)| r.status != Status::Pass).then(|| {
                Box::new(Kept {
                    trace: Some(e.trace_raw.to_owned()),
                    details: recorded().map(|(_, _, r)| detail_of(r)).collect(),
                })
            });
            history.record(Rows {
                keyed: false,
                trace_id: e.trace.trace_id.clone(),
                agent_id: e.trace.agent_id.clone(),
                rows: recorded()
                    .map(|((planned, _, _), o, result)| Row {
                        assertion_id: planned.id.clone(),
                        spec: planned.compiled.spec_digest,
                        assertion_type: planned.kind.name(),
                        status: result.status,
                        score: o.score,
                        cost: o.cost,
                    })
                    .collect(),
                run: Some(self.run()),
                kept,
                recorded_at_ms: None,
            });
        }
        if self.session_log.enabled() {
            self.session_log.record(LoggedBatch {
                trace_id: e.trace.trace_id.clone(),
                agent_id: e.trace.agent_id.clone(),
                results: e
                    .results
                    .iter()
                    .zip(&e.assertions)
                    .map(|(r, (planned, _, _))| ReportedResult {
                        assertion_id: r.assertion_id.clone(),
                        kind: planned.kind.name().to_owned(),
                        layer: planned.kind.layer(),
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
    }

    /// Records a result an SDK computed itself (`submit_plugin_result`):
    /// for the reports, the history and the evaluated count.
    pub fn record_submitted(&self, record: PluginResult) {
        if let Some(history) = &self.history {
            history.record(Rows {
                keyed: false,
                trace_id: record.trace_id.clone(),
                agent_id: None,
                rows: vec![Row {
                    assertion_id: record.assertion_id.clone(),
                    spec: SpecDigest::submitted(&record.plugin_name),
                    assertion_type: "plugin",
                    status: record.status,
                    score: record.score,
                    cost: 0.0,
                }],
                run: Some(self.run()),
                kept: (record.status != Status::Pass).then(|| {
                    Box::new(Kept {
                        trace: None,
                        details: vec![Detail {
                            explanation: record.explanation.clone(),
                            ..Detail::default()
                        }],
                    })
                }),
                recorded_at_ms: None,
            });
        }
        self.plugin_results.record(record);
        self.evaluated.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits, until `deadline` at most, for drift alerts still posting to
    /// the webhook (a one-shot command, before its runtime ends).
    pub async fn settle_alerts(&self, deadline: std::time::Instant) {
        if let Some(webhook) = &self.webhook {
            webhook.settle(deadline).await;
        }
    }

    /// Forgets every `request_id` (the `eval` command treats each trace as its own run).
    pub fn forget_request_ids(&self) {
        self.by_request_id.clear();
    }

    pub fn evaluated(&self) -> u64 {
        self.evaluated.load(Ordering::Relaxed)
    }

    /// Adds to the session's spending.
    pub fn add_cost(&self, usd: f64) {
        if usd > 0.0 {
            let _ = self.cost.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                Some((f64::from_bits(bits) + usd).to_bits())
            });
        }
    }

    /// What paid assertions have cost this session, in USD.
    pub fn cost_spent(&self) -> f64 {
        f64::from_bits(self.cost.load(Ordering::Acquire))
    }
}

/// What a `request_id` stands for: the assertion and the trace it ran on.
fn fingerprint(kind: AssertionType, spec_text: &str, trace_digest: Option<u64>) -> u64 {
    let mut h = DefaultHasher::new();
    kind.name().hash(&mut h);
    spec_text.hash(&mut h);
    trace_digest.hash(&mut h);
    h.finish()
}
