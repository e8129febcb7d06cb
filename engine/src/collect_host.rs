//! The engine behind `attest-engine collect` and `attest-engine worker`:
//! production traces are scored by the same compiled assertions and the
//! same evaluator as `evaluate_batch`, and their results go to the result
//! history keyed by (trace id, rule, assertion id), so a trace delivered
//! twice counts once.
//!
//! History rows of a rule's assertion are stored under `<rule>/<assertion_id>`,
//! which is the name `query_drift` takes for production drift.

use crate::batch::{Effects, Providers, Suite};
use crate::history::{Row, Rows, SpecDigest};
use crate::layers::AssertionType;
use crate::protocol::{ErrorCode, RpcError};
use crate::session::Engine;
use attest_collect::{AssertionOutcome, BoxFuture, EvalError, ResultRecord, RuleError};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The evaluator and the history sink `collect` and `worker` run on.
pub fn backends(engine: Arc<Engine>) -> (Arc<dyn attest_collect::Evaluator>, Option<Arc<dyn attest_collect::HistorySink>>) {
    backends_with(engine, Providers::Required)
}

/// [`backends`] for a process that evaluates here (`Providers::Required`)
/// or only publishes for workers to evaluate (`Providers::Elsewhere`: a
/// collector with `--nats` needs no judge or embedding provider).
pub fn backends_with(
    engine: Arc<Engine>,
    providers: Providers,
) -> (Arc<dyn attest_collect::Evaluator>, Option<Arc<dyn attest_collect::HistorySink>>) {
    let history = HistoryResults::new(engine.clone()).map(|h| Arc::new(h) as Arc<dyn attest_collect::HistorySink>);
    (Arc::new(CollectEvaluator { engine, providers }), history)
}

/// Compiles rules' assertions with the engine's own checks.
pub struct CollectEvaluator {
    engine: Arc<Engine>,
    providers: Providers,
}

struct RuleSuite {
    engine: Arc<Engine>,
    suite: Suite,
    kinds: Vec<AssertionType>,
}

impl attest_collect::Evaluator for CollectEvaluator {
    fn compile(&self, _rule: &str, assertions: &[Value]) -> Result<Arc<dyn attest_collect::Suite>, RuleError> {
        let suite = Suite::compile_with(&self.engine, assertions, self.providers).map_err(rule_error)?;
        let kinds = suite.kinds().collect();
        Ok(Arc::new(RuleSuite {
            engine: self.engine.clone(),
            suite,
            kinds,
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

impl attest_collect::Suite for RuleSuite {
    fn evaluate<'a>(&'a self, trace: &'a Value) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, EvalError>> {
        Box::pin(async move {
            let text = trace.to_string();
            let deadline = Instant::now() + self.engine.config.eval_timeout;
            let run = self.suite.evaluate_with(&self.engine, &text, deadline, Effects::ResultsOnly);
            // A rule whose evaluation may hold its thread (a plugin spinning
            // to its deadline) runs where the runtime hands this worker's
            // role to another thread meanwhile: the receiver, `/metrics` and
            // a worker's NATS acks keep being served.
            let runtime = tokio::runtime::Handle::current();
            let result = if self.suite.may_block() && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
                tokio::task::block_in_place(|| runtime.block_on(run))
            } else {
                run.await
            };
            let result = result.map_err(|e| EvalError {
                message: format!("{} ({}): {}", e.code.code(), e.code.error_type(), e.message),
                retryable: matches!(e.code, ErrorCode::ProviderError | ErrorCode::Timeout),
                trace_refused: e.code == ErrorCode::InvalidTrace,
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
                })
                .collect())
        })
    }

    fn paid_calls(&self) -> u32 {
        self.kinds.iter().filter(|k| k.is_paid()).count() as u32
    }
}

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

impl attest_collect::HistorySink for HistoryResults {
    fn record<'a>(&'a self, results: &'a [ResultRecord]) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let Some(history) = &self.engine.sinks.history else {
                return Ok(());
            };
            let mut by_trace: BTreeMap<(&str, Option<&str>), Vec<Row>> = BTreeMap::new();
            for r in results {
                let name = format!("{}/{}", r.key.rule, r.key.assertion_id);
                let kind = AssertionType::parse(&r.assertion_type).map_or("plugin", AssertionType::name);
                by_trace.entry((&r.key.trace_id, r.agent_id.as_deref())).or_default().push(Row {
                    spec: SpecDigest::submitted(&name),
                    assertion_id: name,
                    assertion_type: kind,
                    status: r.status,
                    score: r.score,
                });
            }
            for ((trace_id, agent_id), rows) in by_trace {
                history.record(Rows {
                    trace_id: trace_id.to_owned(),
                    agent_id: agent_id.map(str::to_owned),
                    rows,
                    keyed: true,
                });
            }
            Ok(())
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
