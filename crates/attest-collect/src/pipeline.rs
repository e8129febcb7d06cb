//! From a closed trace to stored results: conversion, rule matching,
//! deterministic sampling, per-rule budgets, evaluation, sinks. Shared by the
//! embedded collector and the NATS workers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::assemble::{ClosedTrace, DropReason};
use crate::convert::{self, Converted, MatchContext, PriceTable};
use crate::events::{ConvertedTooLarge, InternalEvent, SpansNested, SpansUnreachable};
use crate::metrics::Metrics;
use crate::rules::{sampled, RuleSet};
use crate::trace_doc::TraceDoc;
use crate::writer::FileWriter;
use crate::{ResultKey, ResultRecord, RuleFailure, SharedSinks};

/// The metrics label for rules this process does not know: their names come
/// off the stream, and every distinct label would be a series kept forever.
pub const UNKNOWN_RULE: &str = "(unknown)";

/// An Attest trace and the rules that selected it: what collectors hand to
/// evaluation (in process, or as a NATS work message).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkItem {
    pub trace: TraceDoc,
    pub rules: Vec<String>,
    /// [`RuleSet::version`] of the rules that selected the trace; absent
    /// from messages of collectors that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_version: Option<String>,
}

impl WorkItem {
    pub fn trace_id(&self) -> &str {
        self.trace.trace_id()
    }
}

/// What evaluating a work item gave: the results, and what failed for good.
#[derive(Debug)]
pub struct Evaluated {
    pub records: Vec<ResultRecord>,
    /// Rules that could not score the trace and will not on another attempt
    /// (their assertions that make no paid call are in `records`). A worker
    /// stores the records, then moves the trace to the dead-letter subject
    /// with this reason, to be replayed once the cause is fixed.
    pub failure: Option<RuleFailure>,
}

pub struct Pipeline {
    pub rules: Arc<RuleSet>,
    pub metrics: Arc<Metrics>,
    pub sinks: SharedSinks,
    pub prices: Arc<PriceTable>,
    /// `--traces-out`: every assembled Attest trace, one per line (the format
    /// `--jsonl` reads back), written by a thread of its own.
    pub trace_archive: Option<FileWriter>,
    /// The evaluator's trace size limit ([`crate::TraceEvaluator::max_trace_bytes`]).
    pub max_trace_bytes: Option<usize>,
}

impl Pipeline {
    /// Converts a closed trace and selects its rules; `None` when it was dropped
    /// (counted) or no rule selected it.
    pub fn prepare(&self, closed: ClosedTrace) -> Option<WorkItem> {
        self.metrics.traces_received.fetch_add(1, Ordering::Relaxed);
        match convert::convert(&closed.trace_id, &closed.spans, &self.prices) {
            Converted::Trace {
                trace,
                context,
                unreachable,
                nested,
            } => {
                self.metrics.traces_assembled.fetch_add(1, Ordering::Relaxed);
                if nested > 0 {
                    SpansNested {
                        trace_id: &closed.trace_id,
                        spans: nested as u64,
                    }
                    .emit(&self.metrics);
                }
                if unreachable > 0 {
                    SpansUnreachable {
                        trace_id: &closed.trace_id,
                        spans: unreachable as u64,
                    }
                    .emit(&self.metrics);
                }
                let trace = TraceDoc::from_value(&trace);
                self.archive(&trace);
                // Within the collector's byte limits, a trace can still
                // convert to more JSON than the evaluator takes (large tool
                // results, say); every rule would fail on it.
                if let Some(limit) = self.max_trace_bytes.filter(|&limit| trace.len() > limit) {
                    ConvertedTooLarge {
                        trace_id: &closed.trace_id,
                        spans: closed.spans.len() as u64,
                        limit,
                    }
                    .emit(&self.metrics);
                    return None;
                }
                self.select(trace, &context)
            }
            Converted::NoRoot => {
                self.metrics.dropped(DropReason::NoRoot.as_str(), closed.spans.len() as u64);
                None
            }
            Converted::UnknownConvention => {
                self.metrics
                    .dropped(DropReason::UnknownConvention.as_str(), closed.spans.len() as u64);
                // Said once, with what to change; every one is counted above.
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    let root = closed.spans.iter().find(|s| s.is_local_root()).map_or("", |s| s.name.as_str());
                    tracing::warn!(
                        root_span = %crate::bounded(root, 128),
                        "a trace with no span of a convention collect reads (GenAI gen_ai.*, OpenInference openinference.span.kind, Traceloop traceloop.span.kind, MLflow mlflow.spanType) was not evaluated; instrument the LLM client or agent framework (docs/continuous.md, Agent frameworks); counted as traces_dropped_total{{reason=\"unknown_convention\"}}, said once"
                    );
                });
                None
            }
        }
    }

    fn archive(&self, trace: &TraceDoc) {
        if let Some(w) = &self.trace_archive {
            let mut line = Vec::with_capacity(trace.len() + 1);
            line.extend_from_slice(trace.text().as_bytes());
            line.push(b'\n');
            // Never waited for: a full queue (a stalled reader or disk)
            // drops the line, counted, rather than holding evaluation.
            if w.try_write(line, 1, false).is_err() {
                w.lost_to_full_queue(1);
            }
        }
    }

    /// Rules that match and sample this trace.
    pub fn select(&self, trace: TraceDoc, ctx: &MatchContext) -> Option<WorkItem> {
        let trace_id = trace.trace_id();
        let mut rules = Vec::new();
        for rule in &self.rules.rules {
            if !rule.matches(ctx) {
                continue;
            }
            if sampled(trace_id, rule.sample_rate) {
                rules.push(rule.name.clone());
            } else {
                self.metrics.rule_event(&rule.name, "not_sampled");
            }
        }
        if rules.is_empty() {
            return None;
        }
        self.metrics.traces_sampled.fetch_add(1, Ordering::Relaxed);
        Some(WorkItem {
            trace,
            rules,
            rules_version: Some(self.rules.version.clone()),
        })
    }

    /// Evaluates every selected rule.
    ///
    /// A retryable failure of any rule fails the whole item, for the caller
    /// to try again (result keys make the retry idempotent), unless this is
    /// the `last_attempt`. A rule that fails for good (on the last attempt,
    /// or refusing the trace itself: an invalid trace, a provider refusing
    /// the request) still gives the results of its assertions that make no
    /// paid call, and its failure is reported in [`Evaluated::failure`].
    /// Other failures and budget refusals are counted and skip that rule.
    pub async fn evaluate(&self, item: &WorkItem, delivery: u64, last_attempt: bool) -> Result<Evaluated, RuleFailure> {
        let trace_id = item.trace_id().to_string();
        let agent_id = item.trace.agent_id().map(str::to_string);
        let mut records = Vec::new();
        let mut failures: Vec<RuleFailure> = Vec::new();
        let mut rules_evaluated = 0u64;
        for rule in self.selected_rules(item) {
            let name = &rule.name;
            let hold = match &rule.budget {
                Some(budget) => match budget.try_reserve(rule.suite.paid_calls(), rule.suite.worst_cost_usd(item.trace.len())) {
                    Some(hold) => Some(hold),
                    None => {
                        self.metrics.rule_event(name, "budget_exhausted");
                        continue;
                    }
                },
                None => None,
            };
            let started = Instant::now();
            // Whether the paid assertions failed: their spending is then
            // unknown, and the reservation stands at its worst case.
            let mut paid_failed = false;
            let outcomes = match rule.suite.evaluate(item.trace.text()).await {
                Ok(o) => o,
                Err(e) if e.retryable && !last_attempt => {
                    self.metrics.rule_event(name, "eval_error_retryable");
                    return Err(e);
                }
                Err(e) => {
                    self.metrics.rule_event(name, "eval_error");
                    tracing::warn!(rule = %name, trace_id = %crate::shown_id(&trace_id), error = %e, "evaluation failed");
                    for sink in self.sinks.iter() {
                        sink.evaluation_failed(&item.trace, name, &e);
                    }
                    if !(e.trace_refused || e.retryable) {
                        continue;
                    }
                    failures.push(RuleFailure {
                        message: format!("rule {name}: {}", e.message),
                        ..e
                    });
                    paid_failed = true;
                    // What does not depend on the failing provider is kept.
                    match rule.suite.evaluate_free(item.trace.text()) {
                        Some(free) => match free.await {
                            Ok(o) => o,
                            Err(e) => {
                                tracing::warn!(rule = %name, trace_id = %crate::shown_id(&trace_id), error = %e, "the rule's free assertions failed too");
                                continue;
                            }
                        },
                        None => continue,
                    }
                }
            };
            self.metrics.observe_latency(started.elapsed());
            rules_evaluated += 1;
            if let Some(hold) = hold.filter(|_| !paid_failed) {
                hold.settle(outcomes.iter().map(|o| o.cost_usd).sum());
            }
            let evaluated_at = crate::now_rfc3339();
            for o in outcomes {
                records.push(ResultRecord {
                    key: ResultKey {
                        trace_id: trace_id.clone(),
                        rule: name.clone(),
                        assertion_id: o.assertion_id,
                    },
                    assertion_type: o.assertion_type,
                    status: o.status,
                    score: o.score,
                    explanation: o.explanation,
                    cost_usd: o.cost_usd,
                    duration_ms: o.duration_ms,
                    agent_id: agent_id.clone(),
                    evaluated_at: evaluated_at.clone(),
                    delivery,
                    span_id: item.trace.span_id(o.trace_node_path.as_deref()).map(str::to_owned),
                });
            }
        }
        // Counted once the item is through: a retryable failure of a later
        // rule returns above, and the retry counts the trace and its rules then.
        if rules_evaluated > 0 {
            self.metrics.traces_evaluated.fetch_add(1, Ordering::Relaxed);
            self.metrics.rule_evaluations.fetch_add(rules_evaluated, Ordering::Relaxed);
        }
        let failure = failures.into_iter().reduce(|mut first, next| {
            first.message = format!("{}; {}", first.message, next.message);
            first
        });
        Ok(Evaluated { records, failure })
    }

    /// The rules of this process an item names, each once, in the item's
    /// order. A work message off the stream may name one rule thousands of
    /// times, or thousands of rules this worker does not have (a collector
    /// with a newer rules file, or a hostile publisher): each known rule runs
    /// once, so the work is bounded by the rules file, not by the message,
    /// and the unknown names are counted once per item as `unknown_rule`.
    fn selected_rules(&self, item: &WorkItem) -> Vec<&crate::rules::Rule> {
        let mut seen = std::collections::HashSet::new();
        let mut selected = Vec::new();
        let mut unknown: Option<&str> = None;
        for name in &item.rules {
            if !seen.insert(name.as_str()) {
                continue;
            }
            match self.rules.get(name) {
                Some(rule) => selected.push(rule),
                None => unknown = unknown.or(Some(name)),
            }
        }
        if let Some(name) = unknown {
            // The name comes off the stream, so it is not made a metrics label.
            tracing::warn!(
                rule = %crate::shown_id(name),
                trace_id = %crate::shown_id(item.trace_id()),
                "a trace names a rule this worker does not have"
            );
            self.metrics.rule_event(UNKNOWN_RULE, "unknown_rule");
        }
        selected
    }

    /// Hands results to every sink, also when one fails (a stalled results
    /// file does not keep them from the history); counts them by rule and
    /// status once every sink stored them (a worker's sink offers them again
    /// after a failure). Errs with the first sink's failure.
    pub async fn store(&self, records: &[ResultRecord], durability: crate::Durability) -> anyhow::Result<()> {
        let mut first = None;
        for sink in self.sinks.iter() {
            if let Err(e) = sink.record(records, durability).await {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        for r in records {
            self.metrics.result(&r.key.rule, r.status);
        }
        Ok(())
    }

    /// Writes out what every sink and `--traces-out` hold, all at once, each
    /// within its own deadline. Errs (after all were flushed) naming every
    /// output that lost something.
    pub async fn flush(&self) -> anyhow::Result<()> {
        let mut flushes: Vec<crate::BoxFuture<'_, anyhow::Result<()>>> = self.sinks.iter().map(|s| s.flush()).collect();
        if let Some(w) = &self.trace_archive {
            flushes.push(Box::pin(w.drain(crate::writer::DRAIN_TIMEOUT)));
        }
        let failures: Vec<String> = futures::future::join_all(flushes)
            .await
            .into_iter()
            .filter_map(|r| r.err().map(|e| format!("{e:#}")))
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", failures.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AssertionOutcome, BoxFuture, CompiledRule, RuleError, Status, TraceEvaluator};

    /// A suite that reports one paid call per evaluation, costing $0.40.
    struct Paid;
    impl CompiledRule for Paid {
        fn evaluate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>> {
            Box::pin(async {
                Ok(vec![AssertionOutcome {
                    assertion_id: "judge".into(),
                    assertion_type: "llm_judge".into(),
                    status: Status::Pass,
                    score: 0.9,
                    explanation: "ok".into(),
                    cost_usd: 0.4,
                    duration_ms: 1,
                    trace_node_path: None,
                }])
            })
        }
        fn paid_calls(&self) -> u32 {
            1
        }
    }
    struct PaidEvaluator;
    impl TraceEvaluator for PaidEvaluator {
        fn compile(&self, _: &str, _: &[serde_json::Value]) -> Result<Arc<dyn CompiledRule>, RuleError> {
            Ok(Arc::new(Paid))
        }
    }

    fn pipeline(budget: &str) -> Pipeline {
        let yaml = format!("rules:\n- name: judged\n  budget: {budget}\n  assertions: [{{type: llm_judge}}]\n");
        Pipeline {
            rules: Arc::new(RuleSet::parse(&yaml, false, &PaidEvaluator).unwrap()),
            metrics: Arc::new(Metrics::default()),
            sinks: Arc::new(vec![]),
            prices: Arc::new(PriceTable::default()),
            trace_archive: None,
            max_trace_bytes: None,
        }
    }

    fn item(i: usize) -> WorkItem {
        WorkItem {
            trace: TraceDoc::from_value(&serde_json::json!({"trace_id": format!("t{i}"), "output": {}})),
            rules: vec!["judged".into()],
            rules_version: None,
        }
    }

    #[tokio::test]
    async fn paid_rules_stop_at_their_budget_and_say_so() {
        let p = pipeline("{judge_calls_per_minute: 2}");
        let mut evaluated = 0;
        for i in 0..5 {
            evaluated += p.evaluate(&item(i), 1, false).await.unwrap().records.len();
        }
        assert_eq!(evaluated, 2, "two calls per minute");
        assert!(p
            .metrics
            .render()
            .contains(r#"attest_collect_rule_events_total{rule="judged",event="budget_exhausted"} 3"#));

        let p = pipeline("{usd_per_day: 1.0}");
        let mut evaluated = 0;
        for i in 0..5 {
            evaluated += p.evaluate(&item(i), 1, false).await.unwrap().records.len();
        }
        assert_eq!(evaluated, 3, "$0.40 each: the third crosses $1, the fourth is refused");
    }

    #[tokio::test]
    async fn a_rule_named_many_times_runs_once_and_unknown_names_count_once() {
        let p = pipeline("{usd_per_day: 100.0}");
        let mut rules = vec!["judged".to_string(); 50_000];
        rules.extend((0..1000).map(|i| format!("nope-{i}")));
        rules.push("judged".into());
        let item = WorkItem {
            trace: TraceDoc::from_value(&serde_json::json!({"trace_id": "t", "output": {}})),
            rules,
            rules_version: None,
        };
        let records = p.evaluate(&item, 1, false).await.unwrap().records;
        assert_eq!(records.len(), 1, "one rule, one assertion: evaluated once");
        assert_eq!(p.metrics.traces_evaluated.load(Ordering::Relaxed), 1);
        assert_eq!(p.metrics.rule_evaluations.load(Ordering::Relaxed), 1);
        assert_eq!(p.metrics.rule_event_count("unknown_rule"), 1, "counted once per item");
    }

    #[test]
    fn a_trace_that_converts_past_the_evaluators_limit_is_dropped_as_too_large() {
        let root = |output: &str| crate::otlp::Span {
            trace_id: "t".into(),
            span_id: "a".into(),
            parent_span_id: None,
            parent_is_remote: false,
            name: "invoke_agent refund-agent".into(),
            start_unix_nanos: 0,
            end_unix_nanos: 1,
            attributes: serde_json::json!({
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "refund-agent",
                "gen_ai.output.messages": format!(r#"[{{"role":"assistant","parts":[{{"type":"text","content":"{output}"}}]}}]"#),
            })
            .as_object()
            .unwrap()
            .clone(),
            events: vec![],
            resource: Arc::new(serde_json::Map::new()),
            scope: "".into(),
            log_event: false,
            is_error: false,
            size_bytes: 1,
        };
        let closed = |output: &str| ClosedTrace {
            trace_id: "t".into(),
            spans: vec![root(output)],
            bytes: 1,
            early: false,
        };
        let mut p = pipeline("{usd_per_day: 1.0}");
        p.max_trace_bytes = Some(2_000);
        assert!(p.prepare(closed("short")).is_some());
        assert!(p.prepare(closed(&"x".repeat(3_000))).is_none());
        let m = p.metrics.render();
        assert!(
            m.contains(r#"attest_collect_traces_dropped_total{reason="trace_too_large"} 1"#),
            "{m}"
        );
    }

    #[tokio::test]
    async fn traces_are_counted_once_however_many_rules_evaluate_them() {
        let yaml = "rules:\n- {name: one, assertions: [{type: llm_judge}]}\n- {name: two, assertions: [{type: llm_judge}]}\n";
        let mut p = pipeline("{usd_per_day: 100.0}");
        p.rules = Arc::new(RuleSet::parse(yaml, false, &PaidEvaluator).unwrap());
        for i in 0..3 {
            let item = WorkItem {
                trace: TraceDoc::from_value(&serde_json::json!({"trace_id": format!("t{i}"), "output": {}})),
                rules: vec!["one".into(), "two".into()],
                rules_version: None,
            };
            assert_eq!(p.evaluate(&item, 1, false).await.unwrap().records.len(), 2);
        }
        assert_eq!(p.metrics.traces_evaluated.load(Ordering::Relaxed), 3);
        assert_eq!(p.metrics.rule_evaluations.load(Ordering::Relaxed), 6);
        let m = p.metrics.render();
        assert!(m.contains("attest_collect_traces_evaluated_total 3\n"), "{m}");
        assert!(m.contains("attest_collect_rule_evaluations_total 6\n"), "{m}");
    }

    #[test]
    fn spans_left_out_of_the_evaluated_trace_are_counted() {
        let tool = |id: &str, parent: &str| crate::otlp::Span {
            trace_id: "t".into(),
            span_id: id.into(),
            parent_span_id: Some(parent.into()),
            parent_is_remote: false,
            name: "execute_tool".into(),
            start_unix_nanos: 0,
            end_unix_nanos: 1,
            attributes: serde_json::json!({"gen_ai.tool.name": "x"}).as_object().unwrap().clone(),
            events: vec![],
            resource: Arc::new(serde_json::Map::new()),
            scope: "".into(),
            log_event: false,
            is_error: false,
            size_bytes: 1,
        };
        let mut root = tool("r", "");
        root.parent_span_id = None;
        let p = pipeline("{usd_per_day: 1.0}");
        let closed = ClosedTrace {
            trace_id: "t".into(),
            spans: vec![root, tool("a", "r"), tool("b", "missing"), tool("c", "b")],
            bytes: 4,
            early: false,
        };
        p.prepare(closed);
        assert_eq!(p.metrics.spans_unreachable.load(Ordering::Relaxed), 2);
        assert!(p.metrics.render().contains("attest_collect_spans_unreachable_total 2\n"));
    }
}
