//! The engine behind `attest-engine collect` and `attest-engine worker`:
//! production traces are scored by the same compiled assertions and the
//! same evaluator as `evaluate_batch`, and their results go to the result
//! history keyed by (trace id, rule, assertion id), so a trace delivered
//! twice counts once.
//!
//! History rows of a rule's assertion are stored under `<rule>/<assertion_id>`,
//! which is the name `query_drift` takes for production drift.

use crate::batch::{Effects, Providers, Suite};
use crate::history::{Detail, Kept, Row, Rows, SpecDigest};
use crate::layers::{AssertionType, Status};
use crate::protocol::{ErrorCode, RpcError};
use crate::session::Engine;
use attest_collect::{AssertionOutcome, BoxFuture, Durability, ResultRecord, RuleError, RuleFailure};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The evaluator and the history sink `collect` and `worker` run on.
pub fn backends(
    engine: Arc<Engine>,
) -> (
    Arc<dyn attest_collect::TraceEvaluator>,
    Option<Arc<dyn attest_collect::ResultStore>>,
) {
    backends_with(engine, Providers::Required)
}

/// [`backends`] for a process that evaluates here (`Providers::Required`)
/// or only publishes for workers to evaluate (`Providers::Elsewhere`: a
/// collector with `--nats` needs no judge or embedding provider).
pub fn backends_with(
    engine: Arc<Engine>,
    providers: Providers,
) -> (
    Arc<dyn attest_collect::TraceEvaluator>,
    Option<Arc<dyn attest_collect::ResultStore>>,
) {
    let history = HistoryResults::new(engine.clone()).map(|h| Arc::new(h) as Arc<dyn attest_collect::ResultStore>);
    (Arc::new(CollectEvaluator { engine, providers }), history)
}

/// Compiles rules' assertions with the engine's own checks.
pub struct CollectEvaluator {
    engine: Arc<Engine>,
    providers: Providers,
}

struct RuleSuite {
    engine: Arc<Engine>,
    all: Assertions,
    /// The assertions that make no paid call, when the rule has both kinds:
    /// what is kept of a trace whose judge or embedding calls keep failing.
    free: Option<Assertions>,
}

/// A compiled list of assertions and each one's type.
struct Assertions {
    suite: Suite,
    kinds: Vec<AssertionType>,
}

impl Assertions {
    fn compile(engine: &Engine, assertions: &[Value], providers: Providers) -> Result<Assertions, RpcError> {
        let suite = Suite::compile_with(engine, assertions, providers)?;
        let kinds = suite.kinds().collect();
        Ok(Assertions { suite, kinds })
    }

    async fn evaluate(&self, engine: &Engine, trace: &str) -> Result<Vec<AssertionOutcome>, RuleFailure> {
        let deadline = Instant::now() + engine.config.eval_timeout;
        let run = self.suite.evaluate_with(engine, trace, deadline, Effects::ResultsOnly);
        // A rule whose evaluation may hold its thread (a plugin spinning to
        // its deadline) runs where the runtime hands this worker's role to
        // another thread meanwhile: the receiver, `/metrics` and a worker's
        // NATS acks keep being served.
        let runtime = tokio::runtime::Handle::current();
        let result = if self.suite.may_block() && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(|| runtime.block_on(run))
        } else {
            run.await
        };
        let result = result.map_err(|e| RuleFailure {
            message: format!("{} ({}): {}", e.code.code(), e.code.error_type(), e.message),
            // A provider that refused the request itself (a 4xx) is no
            // reason to deliver the trace again.
            retryable: matches!(e.code, ErrorCode::ProviderError | ErrorCode::Timeout) && e.retryable != Some(false),
            trace_refused: e.code == ErrorCode::InvalidTrace || (e.code == ErrorCode::ProviderError && e.retryable == Some(false)),
            error_type: Some(e.code.error_type().to_owned()),
        })?;
        Ok(result
            .results
            .into_iter()
            .zip(&self.kinds)
            .map(|(r, kind)| AssertionOutcome {
                assertion_id: r.assertion_id,
                assertion_type: kind.name().to_owned(),
                status: r.status,
                score: r.score,
                explanation: r.explanation,
                cost_usd: r.cost,
                duration_ms: r.duration_ms,
                trace_node_path: r.evidence.trace_node_path,
            })
            .collect())
    }
}

impl attest_collect::TraceEvaluator for CollectEvaluator {
    fn compile(&self, _rule: &str, assertions: &[Value]) -> Result<Arc<dyn attest_collect::CompiledRule>, RuleError> {
        let typo = |t: crate::batch::Typo| RuleError {
            field: t.field,
            message: t.message,
            valid_choices: t.valid_choices,
        };
        if let Some(t) = crate::batch::first_unknown_member(assertions) {
            return Err(typo(t));
        }
        let all = Assertions::compile(&self.engine, assertions, self.providers).map_err(rule_error)?;
        if let Some(t) = all.suite.first_unread_key() {
            return Err(typo(t));
        }
        let free: Vec<Value> = assertions
            .iter()
            .zip(&all.kinds)
            .filter(|(_, kind)| !kind.is_paid())
            .map(|(a, _)| a.clone())
            .collect();
        let free = if free.is_empty() || free.len() == assertions.len() {
            None
        } else {
            Some(Assertions::compile(&self.engine, &free, self.providers).map_err(rule_error)?)
        };
        Ok(Arc::new(RuleSuite {
            engine: self.engine.clone(),
            all,
            free,
        }))
    }

    fn max_trace_bytes(&self) -> Option<usize> {
        Some(self.engine.limits.max_trace_bytes)
    }
}

/// A spec problem, named as a path inside the rule (`assertions[2].spec.check`).
fn rule_error(e: RpcError) -> RuleError {
    let field = e
        .field
        .as_deref()
        .map(|f| f.strip_prefix("params.").unwrap_or(f).to_owned())
        .unwrap_or_else(|| "assertions".to_owned());
    RuleError {
        field,
        message: format!("{}. {}", e.message, e.detail),
        valid_choices: Vec::new(),
    }
}

impl attest_collect::CompiledRule for RuleSuite {
    fn evaluate<'a>(&'a self, trace: &'a str) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>> {
        Box::pin(self.all.evaluate(&self.engine, trace))
    }

    fn evaluate_free<'a>(&'a self, trace: &'a str) -> Option<BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>>> {
        let free = self.free.as_ref()?;
        Some(Box::pin(free.evaluate(&self.engine, trace)))
    }

    fn paid_calls(&self) -> u32 {
        self.all.kinds.iter().filter(|k| k.is_paid()).count() as u32
    }

    fn worst_cost_usd(&self, trace_bytes: usize) -> f64 {
        self.all.suite.worst_cost(trace_bytes)
    }
}

/// Longest a sink waits for the history to commit a batch before it gives
/// the batch's messages back for redelivery.
const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Writes production results into the result history, once per key.
pub struct HistoryResults {
    engine: Arc<Engine>,
}

impl HistoryResults {
    /// `None` when the engine has no result history.
    pub fn new(engine: Arc<Engine>) -> Option<HistoryResults> {
        engine.sinks.history.is_some().then_some(HistoryResults { engine })
    }
}

impl attest_collect::ResultStore for HistoryResults {
    fn record<'a>(&'a self, results: &'a [ResultRecord], durability: Durability) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let Some(history) = &self.engine.sinks.history else {
                return Ok(());
            };
            let mut by_trace: BTreeMap<(&str, Option<&str>), Vec<&ResultRecord>> = BTreeMap::new();
            for r in results {
                by_trace.entry((&r.key.trace_id, r.agent_id.as_deref())).or_default().push(r);
            }
            let run = Some(self.engine.sinks.run());
            let batch: Vec<Rows> = by_trace
                .into_iter()
                .map(|((trace_id, agent_id), records)| {
                    // A failing trace keeps its explanations; the trace itself
                    // is in `--traces-out`, which the viewer also reads.
                    let kept = records.iter().any(|r| r.status != Status::Pass).then(|| {
                        Box::new(Kept {
                            trace: None,
                            details: records
                                .iter()
                                .map(|r| Detail {
                                    explanation: r.explanation.clone(),
                                    ..Detail::default()
                                })
                                .collect(),
                        })
                    });
                    Rows {
                        trace_id: trace_id.to_owned(),
                        agent_id: agent_id.map(str::to_owned),
                        rows: records
                            .iter()
                            .map(|r| {
                                let name = format!("{}/{}", r.key.rule, r.key.assertion_id);
                                Row {
                                    spec: SpecDigest::submitted(&name),
                                    assertion_id: name,
                                    assertion_type: AssertionType::parse(&r.assertion_type).map_or("plugin", AssertionType::name),
                                    status: r.status,
                                    score: r.score,
                                    cost: r.cost_usd,
                                }
                            })
                            .collect(),
                        keyed: true,
                        run: run.clone(),
                        kept,
                        recorded_at_ms: None,
                    }
                })
                .collect();
            if durability == Durability::Queued {
                for rows in batch {
                    history.record(rows);
                }
                return Ok(());
            }
            // Committed before this returns: a sink acks its messages only
            // after every store has what they carried.
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || match &engine.sinks.history {
                Some(h) => h.record_committed(batch, std::time::Instant::now() + COMMIT_TIMEOUT),
                None => Ok(()),
            })
            .await?
        })
    }

    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || {
                if let Some(h) = &engine.sinks.history {
                    h.flush(std::time::Instant::now() + engine.config.drain_timeout);
                }
            })
            .await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attest_collect::TraceEvaluator as _;
    use serde_json::json;

    fn evaluator() -> CollectEvaluator {
        let config = crate::config::Config {
            history: None,
            ..Default::default()
        };
        CollectEvaluator {
            engine: Arc::new(Engine::new(config)),
            providers: Providers::Elsewhere,
        }
    }

    /// Every spec the Python SDK (attest-ai 0.9.0) can send, with each
    /// optional key given: a rules file may hold any of them, so none may
    /// be refused as unread.
    #[test]
    fn every_key_the_sdk_sends_is_read() {
        let specs = [
            ("schema", json!({"target": "output.structured", "schema": {"type": "object"}})),
            (
                "constraint",
                json!({"field": "metadata.cost_usd", "operator": "lte", "value": 1, "soft": true}),
            ),
            (
                "constraint",
                json!({"field": "metadata.total_tokens", "operator": "between", "min": 1, "max": 9, "soft": false}),
            ),
            ("trace", json!({"check": "contains_in_order", "tools": ["a", "b"], "soft": false})),
            ("trace", json!({"check": "exact_order", "tools": ["a"], "soft": false})),
            (
                "trace",
                json!({"check": "loop_detection", "tool": "a", "max_repetitions": 1, "soft": false}),
            ),
            ("trace", json!({"check": "no_duplicates", "soft": false})),
            ("trace", json!({"check": "required_tools", "tools": ["a"], "soft": false})),
            ("trace", json!({"check": "forbidden_tools", "tools": ["a"], "soft": false})),
            (
                "content",
                json!({"target": "output.message", "check": "contains", "value": "v", "case_sensitive": true, "soft": false}),
            ),
            (
                "content",
                json!({"target": "output.message", "check": "not_contains", "value": "v", "case_sensitive": false, "soft": false}),
            ),
            (
                "content",
                json!({"target": "output.message", "check": "regex_match", "value": "v+", "soft": false}),
            ),
            (
                "content",
                json!({"target": "output.message", "check": "keyword_all", "values": ["a"], "case_sensitive": true, "soft": false}),
            ),
            (
                "content",
                json!({"target": "output.message", "check": "keyword_any", "values": ["a"], "case_sensitive": true, "soft": false}),
            ),
            (
                "content",
                json!({"target": "output.message", "check": "forbidden", "values": ["a"]}),
            ),
            (
                "embedding",
                json!({"target": "output.message", "reference": "r", "threshold": 0.8, "model": "m", "soft": false}),
            ),
            (
                "embedding",
                json!({"target": "output.message", "reference": "r", "threshold": "dynamic", "model": null, "soft": false}),
            ),
            (
                "llm_judge",
                json!({"target": "output.message", "criteria": "c", "rubric": "default", "threshold": 0.8, "model": "m", "soft": false}),
            ),
            // Every documented judge key at once: a prompt beside a rubric
            // (the prompt wins, the rubric is still a known key), samples.
            (
                "llm_judge",
                json!({"target": "output.message", "prompt": "Rate {{output}}", "rubric": "default", "samples": 3, "threshold": 0.5, "model": "m", "soft": true}),
            ),
            ("llm_judge", json!({"prompt": "Rate {{output}}", "repeat": 2})),
            ("trace_tree", json!({"check": "agent_called", "agent_id": "a", "soft": false})),
            ("trace_tree", json!({"check": "delegation_depth", "max_depth": 2, "soft": false})),
            (
                "trace_tree",
                json!({"check": "agent_output_contains", "agent_id": "a", "value": "v", "case_sensitive": true, "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "cross_agent_data_flow", "from_agent": "a", "to_agent": "b", "field": "f", "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "follows_transitions", "transitions": [["a", "b"]], "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "aggregate_cost", "operator": "lte", "value": 1, "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "aggregate_tokens", "operator": "lte", "value": 1, "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "aggregate_latency", "operator": "lte", "value": 1, "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "agent_ordered_before", "agent_a": "a", "agent_b": "b", "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "agents_overlap", "agent_a": "a", "agent_b": "b", "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "agent_wall_time_under", "agent_id": "a", "max_ms": 5, "soft": false}),
            ),
            (
                "trace_tree",
                json!({"check": "ordered_agents", "groups": [["a"], ["b"]], "soft": false}),
            ),
            ("trace_tree", json!({"check": "all_tools_called", "tools": ["a"], "soft": false})),
        ];
        let e = evaluator();
        for (kind, spec) in specs {
            let a = json!({"assertion_id": "a", "type": kind, "spec": spec});
            if let Err(err) = e.compile("r", std::slice::from_ref(&a)) {
                panic!("{a}: {}: {}", err.field, err.message);
            }
        }
    }

    #[test]
    fn keys_an_assertion_never_reads_are_refused() {
        let e = evaluator();
        let refused = |a: serde_json::Value| match e.compile("r", &[a]) {
            Ok(_) => panic!("accepted"),
            Err(err) => err,
        };
        let err = refused(json!({"assertion_id": "a", "type": "content",
            "spec": {"target": "output.message", "check": "contains", "value": "v", "case_sensitve": true}}));
        assert_eq!(err.field, "assertions[0].spec.case_sensitve");
        assert!(err.message.contains("this content assertion never reads it"), "{}", err.message);
        assert!(err.valid_choices.iter().any(|c| c == "case_sensitive"), "{:?}", err.valid_choices);
        // A key another check of the same type reads is still unread by this one.
        let err = refused(json!({"assertion_id": "a", "type": "trace", "spec": {"check": "no_duplicates", "tools": ["a"]}}));
        assert_eq!(err.field, "assertions[0].spec.tools");
        let err = refused(json!({"assertion_id": "a", "type": "trace", "spec": {"check": "no_duplicates"}, "sepc": {}}));
        assert_eq!(err.field, "assertions[0].sepc");
        // A number as threshold means something to the paid layers only;
        // "dynamic" to every type.
        let err = refused(json!({"assertion_id": "a", "type": "content",
            "spec": {"target": "output.message", "check": "contains", "value": "v", "threshold": 0.9}}));
        assert_eq!(err.field, "assertions[0].spec.threshold");
        let dynamic = json!({"assertion_id": "a", "type": "content",
            "spec": {"target": "output.message", "check": "contains", "value": "v", "threshold": "dynamic"}});
        assert!(e.compile("r", &[dynamic]).is_ok());
        // `null` means "not given" (the SDK sends `"model": null`).
        let ok = json!({"assertion_id": "a", "type": "trace", "spec": {"check": "no_duplicates", "whatever": null}});
        assert!(e.compile("r", &[ok]).is_ok());
    }
}
