//! Counters and gauges of the collector and workers, rendered in the
//! Prometheus text exposition format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the evaluation latency histogram.
const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];

#[derive(Default)]
pub struct Metrics {
    /// `--export-otlp`'s counts, when it is on.
    pub export: std::sync::OnceLock<std::sync::Arc<crate::export::ExportStats>>,
    pub spans_received: AtomicU64,
    /// GenAI events received as OTLP log records, joined to their spans.
    pub log_events_received: AtomicU64,
    /// Log records that are no GenAI event or name no span: not stored.
    pub log_records_ignored: AtomicU64,
    pub traces_received: AtomicU64,
    pub traces_assembled: AtomicU64,
    pub traces_sampled: AtomicU64,
    /// Traces at least one rule evaluated (one per trace, however many rules).
    pub traces_evaluated: AtomicU64,
    /// Rule evaluations completed (one per trace and rule).
    pub rule_evaluations: AtomicU64,
    /// Spans not added to their trace because it held a span with the same
    /// id already (exporter retries: OTLP delivery is at least once).
    pub spans_duplicate: AtomicU64,
    /// Spans of evaluated traces that are not under the root (their parent
    /// never arrived), left out of the Attest trace.
    pub spans_unreachable: AtomicU64,
    /// Spans under a tool or model call that became no step of their own,
    /// named in the trace's `metadata.nested_spans`.
    pub spans_nested: AtomicU64,
    pub traces_published: AtomicU64,
    /// Publishes the server dropped as duplicates (same trace id within the duplicate window).
    pub publish_duplicates: AtomicU64,
    pub queue_depth: AtomicU64,
    /// Milliseconds between a trace closing and its evaluation starting (last seen).
    pub queue_lag_ms: AtomicU64,
    pub open_traces: AtomicU64,
    pub open_bytes: AtomicU64,
    pub redeliveries: AtomicU64,
    /// Publishes of a work message tried again after the server refused or
    /// stalled on one.
    pub publish_retries: AtomicU64,
    /// Work messages refused because they were selected under other rules.
    pub rules_mismatches: AtomicU64,
    /// Durable consumers made again because their stream was reset beneath them.
    pub consumer_resets: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Results messages a worker's sink failed to store and will be offered again.
    pub store_failures: AtomicU64,
    requests: Mutex<BTreeMap<(u16, &'static str), u64>>,
    /// Requests for what `collect` does not read, by kind (see [`Unread`]).
    unread: Mutex<BTreeMap<&'static str, u64>>,
    dropped: Mutex<BTreeMap<&'static str, u64>>,
    dropped_spans: Mutex<BTreeMap<&'static str, u64>>,
    results_dropped: Mutex<BTreeMap<&'static str, u64>>,
    traces_out_dropped: Mutex<BTreeMap<&'static str, u64>>,
    results: Mutex<BTreeMap<(String, &'static str), u64>>,
    rule_events: Mutex<BTreeMap<(String, &'static str), u64>>,
    latency: Mutex<([u64; LATENCY_BUCKETS.len()], u64, f64)>,
}

/// What a request asked of `collect` that it does not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// An OTLP/gRPC client on the OTLP/HTTP port (HTTP/2 prior knowledge,
    /// or a gRPC method path).
    GrpcOnHttpPort,
    /// `/v1/metrics`: an OTLP metrics exporter.
    OtlpMetrics,
    /// Any other path.
    UnknownPath,
}

impl Unread {
    pub fn label(self) -> &'static str {
        match self {
            Unread::GrpcOnHttpPort => "grpc_on_http_port",
            Unread::OtlpMetrics => "otlp_metrics",
            Unread::UnknownPath => "unknown_path",
        }
    }

    pub fn advice(self) -> &'static str {
        match self {
            Unread::GrpcOnHttpPort => "this looks like OTLP/gRPC on the OTLP/HTTP port; send gRPC to --otlp-grpc (default 127.0.0.1:4317) or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
            Unread::OtlpMetrics => "OTLP metrics are not read by collect (only traces and GenAI log events): set OTEL_METRICS_EXPORTER=none, or point the metrics exporter elsewhere",
            Unread::UnknownPath => "a request for a path collect does not serve: OTLP/HTTP traces go to POST /v1/traces, GenAI log events to POST /v1/logs, metrics are at GET /metrics",
        }
    }
}

fn bump<K: Ord>(map: &Mutex<BTreeMap<K, u64>>, key: K, n: u64) {
    *map.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_insert(0) += n;
}

/// Most series of a per-rule counter. A sink counts results of whatever
/// rules the stream carries; past this, new rules count under
/// [`OTHER_RULES`], so `/metrics` stays bounded whoever publishes.
const MAX_RULE_SERIES: usize = 4096;
/// The label of rules past the 4,096 series a counter keeps per rule.
pub const OTHER_RULES: &str = "(other)";
/// Longest rule label, in characters.
const MAX_RULE_LABEL_CHARS: usize = 200;

fn bump_rule(map: &Mutex<BTreeMap<(String, &'static str), u64>>, rule: &str, tag: &'static str) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let rule: String = rule.chars().take(MAX_RULE_LABEL_CHARS).collect();
    let key = if map.len() < MAX_RULE_SERIES || map.contains_key(&(rule.clone(), tag)) {
        (rule, tag)
    } else {
        (OTHER_RULES.to_owned(), tag)
    };
    *map.entry(key).or_insert(0) += 1;
}

impl Metrics {
    pub fn request(&self, status: u16, encoding: &'static str) {
        bump(&self.requests, (status, encoding), 1);
    }

    /// Counts a request `collect` does not read, and says once per kind
    /// what to change.
    pub fn unread(&self, what: Unread) {
        let first = {
            let mut map = self.unread.lock().unwrap_or_else(|e| e.into_inner());
            let n = map.entry(what.label()).or_insert(0);
            *n += 1;
            *n == 1
        };
        if first {
            tracing::warn!(
                kind = what.label(),
                "{} (counted in attest_collect_unread_total; said once)",
                what.advice()
            );
        }
    }

    pub fn dropped(&self, reason: &'static str, spans: u64) {
        bump(&self.dropped, reason, 1);
        self.dropped_spans(reason, spans);
    }

    /// Spans dropped outside any trace's own drop: spans refused for their
    /// ids, spans of a trace already dropped for its size.
    pub fn dropped_spans(&self, reason: &'static str, spans: u64) {
        bump(&self.dropped_spans, reason, spans);
    }

    /// Result records a sink refused (one count per record), by reason.
    pub fn results_dropped(&self, reason: &'static str, n: u64) {
        bump(&self.results_dropped, reason, n);
    }

    /// Traces not written to `--traces-out`, by reason.
    pub fn traces_out_dropped(&self, reason: &'static str, n: u64) {
        bump(&self.traces_out_dropped, reason, n);
    }

    pub fn results_dropped_count(&self, reason: &str) -> u64 {
        self.results_dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    pub fn result(&self, rule: &str, status: crate::Status) {
        bump_rule(&self.results, rule, status.as_str());
    }

    /// Per-rule events that are not verdicts: `budget_exhausted`, `eval_error`, `not_sampled`.
    pub fn rule_event(&self, rule: &str, event: &'static str) {
        bump_rule(&self.rule_events, rule, event);
    }

    /// How many times `event` happened, over every rule.
    pub fn rule_event_count(&self, event: &str) -> u64 {
        self.rule_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((_, e), _)| *e == event)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn dropped_count(&self, reason: &str) -> u64 {
        self.dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    pub fn observe_latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let mut h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *b {
                h.0[i] += 1;
            }
        }
        h.1 += 1;
        h.2 += secs;
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "attest_collect_log_events_received_total",
            "GenAI events received as OTLP log records, joined to their spans.",
            ld(&self.log_events_received),
        );
        counter(
            &mut out,
            "attest_collect_log_records_ignored_total",
            "OTLP log records that are no GenAI event or name no span: not stored.",
            ld(&self.log_records_ignored),
        );
        counter(
            &mut out,
            "attest_collect_spans_received_total",
            "Spans accepted by the OTLP receiver.",
            ld(&self.spans_received),
        );
        counter(
            &mut out,
            "attest_collect_traces_received_total",
            "Traces closed by the assembler, or read from --jsonl.",
            ld(&self.traces_received),
        );
        counter(
            &mut out,
            "attest_collect_traces_assembled_total",
            "Traces converted to Attest traces.",
            ld(&self.traces_assembled),
        );
        counter(
            &mut out,
            "attest_collect_traces_sampled_total",
            "Traces selected by at least one rule after sampling.",
            ld(&self.traces_sampled),
        );
        counter(
            &mut out,
            "attest_collect_traces_evaluated_total",
            "Traces evaluated by at least one rule.",
            ld(&self.traces_evaluated),
        );
        counter(
            &mut out,
            "attest_collect_rule_evaluations_total",
            "Rule evaluations completed (one per trace and rule).",
            ld(&self.rule_evaluations),
        );
        counter(
            &mut out,
            "attest_collect_spans_duplicate_total",
            "Spans ignored because their trace already held a span with the same id (exporter retries).",
            ld(&self.spans_duplicate),
        );
        counter(
            &mut out,
            "attest_collect_spans_unreachable_total",
            "Spans of evaluated traces left out because no chain of parents joins them to the root.",
            ld(&self.spans_unreachable),
        );
        counter(
            &mut out,
            "attest_collect_spans_nested_total",
            "Spans under a tool or model call that became no step of their own (named in the trace's metadata.nested_spans).",
            ld(&self.spans_nested),
        );
        counter(
            &mut out,
            "attest_collect_traces_published_total",
            "Traces published to the NATS work stream.",
            ld(&self.traces_published),
        );
        counter(
            &mut out,
            "attest_collect_publish_duplicates_total",
            "Publishes (work or results messages) the server dropped as duplicates of a message id already in the stream.",
            ld(&self.publish_duplicates),
        );
        counter(
            &mut out,
            "attest_collect_redeliveries_total",
            "Work messages received again after a failed or unacknowledged attempt.",
            ld(&self.redeliveries),
        );
        counter(
            &mut out,
            "attest_collect_publish_retries_total",
            "Work messages offered again after the NATS server refused or did not acknowledge a publish (the trace is kept meanwhile).",
            ld(&self.publish_retries),
        );
        counter(
            &mut out,
            "attest_collect_rules_mismatch_total",
            "Work messages a worker gave back because a collector selected them under a rules file other than this worker's.",
            ld(&self.rules_mismatches),
        );
        counter(
            &mut out,
            "attest_collect_consumer_resets_total",
            "Durable consumers this process made again because the NATS server came back with their stream reset beneath them (its store was damaged).",
            ld(&self.consumer_resets),
        );
        counter(
            &mut out,
            "attest_collect_dead_lettered_total",
            "Work messages moved to the dead-letter subject.",
            ld(&self.dead_lettered),
        );
        counter(
            &mut out,
            "attest_collect_store_failures_total",
            "Results messages a sink failed to store (each is offered again).",
            ld(&self.store_failures),
        );
        gauge(
            &mut out,
            "attest_collect_queue_depth",
            "Traces waiting for evaluation.",
            ld(&self.queue_depth) as f64,
        );
        gauge(
            &mut out,
            "attest_collect_queue_lag_seconds",
            "Wait between a trace closing and its evaluation starting (latest).",
            ld(&self.queue_lag_ms) as f64 / 1000.0,
        );
        gauge(
            &mut out,
            "attest_collect_open_traces",
            "Traces being assembled.",
            ld(&self.open_traces) as f64,
        );
        gauge(
            &mut out,
            "attest_collect_open_bytes",
            "Approximate bytes held by traces being assembled.",
            ld(&self.open_bytes) as f64,
        );
        let _ = writeln!(out, "# HELP attest_collect_requests_total OTLP/HTTP export requests by response status.\n# TYPE attest_collect_requests_total counter");
        for ((status, enc), v) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_requests_total{{code=\"{status}\",encoding=\"{enc}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP attest_collect_unread_total Requests for protocols, paths or signals collect does not read, by kind.\n# TYPE attest_collect_unread_total counter");
        for (what, v) in self.unread.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_unread_total{{kind=\"{what}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP attest_collect_traces_dropped_total Traces not evaluated, by reason.\n# TYPE attest_collect_traces_dropped_total counter");
        for (reason, v) in self.dropped.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_traces_dropped_total{{reason=\"{reason}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP attest_collect_spans_dropped_total Spans not evaluated, by reason.\n# TYPE attest_collect_spans_dropped_total counter"
        );
        for (reason, v) in self.dropped_spans.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_spans_dropped_total{{reason=\"{reason}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP attest_collect_results_dropped_total Result records not stored (refused by a sink, or not written to --results-jsonl), by reason.\n# TYPE attest_collect_results_dropped_total counter"
        );
        for (reason, v) in self.results_dropped.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_results_dropped_total{{reason=\"{reason}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP attest_collect_traces_out_dropped_total Traces not written to --traces-out, by reason.\n# TYPE attest_collect_traces_out_dropped_total counter"
        );
        for (reason, v) in self.traces_out_dropped.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "attest_collect_traces_out_dropped_total{{reason=\"{reason}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP attest_collect_results_total Assertion results by rule and status.\n# TYPE attest_collect_results_total counter"
        );
        for ((rule, status), v) in self.results.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "attest_collect_results_total{{rule=\"{}\",status=\"{status}\"}} {v}",
                label(rule)
            );
        }
        let _ = writeln!(
            out,
            "# HELP attest_collect_rule_events_total Per-rule events other than verdicts.\n# TYPE attest_collect_rule_events_total counter"
        );
        for ((rule, event), v) in self.rule_events.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "attest_collect_rule_events_total{{rule=\"{}\",event=\"{event}\"}} {v}",
                label(rule)
            );
        }
        let h = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP attest_collect_evaluation_seconds Time to evaluate one trace against one rule.\n# TYPE attest_collect_evaluation_seconds histogram");
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "attest_collect_evaluation_seconds_bucket{{le=\"{b}\"}} {}", h.0[i]);
        }
        let _ = writeln!(out, "attest_collect_evaluation_seconds_bucket{{le=\"+Inf\"}} {}", h.1);
        let _ = writeln!(
            out,
            "attest_collect_evaluation_seconds_sum {}\nattest_collect_evaluation_seconds_count {}",
            h.2, h.1
        );
        if let Some(export) = self.export.get() {
            out.push_str(&export.render());
        }
        out
    }
}

/// Escapes a label value (rule names come from the rules file).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_rule_series_are_bounded() {
        let m = Metrics::default();
        for i in 0..MAX_RULE_SERIES + 100 {
            m.result(&format!("rule-{i}"), crate::Status::Pass);
        }
        // A rule already counted keeps its own series.
        m.result("rule-0", crate::Status::Pass);
        m.rule_event(&"x".repeat(10_000), "unknown_rule");
        let results = m.results.lock().unwrap();
        assert_eq!(results.len(), MAX_RULE_SERIES + 1);
        assert_eq!(results[&(OTHER_RULES.to_owned(), "pass")], 100);
        assert_eq!(results[&("rule-0".to_owned(), "pass")], 2);
        let events = m.rule_events.lock().unwrap();
        assert!(events.keys().all(|(rule, _)| rule.chars().count() <= MAX_RULE_LABEL_CHARS));
    }
}
