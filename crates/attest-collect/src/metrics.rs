//! Counters and gauges of the collector and workers, exposed at `/metrics`
//! in the OpenMetrics text format by prometheus-client. Per-rule series are
//! capped here, before the exposition sees them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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
    /// Observations per bucket (not cumulative; the last is past every
    /// bound), their count and their sum.
    latency: Mutex<([u64; LATENCY_BUCKETS.len() + 1], u64, f64)>,
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
        let bucket = LATENCY_BUCKETS.iter().position(|b| secs <= *b).unwrap_or(LATENCY_BUCKETS.len());
        h.0[bucket] += 1;
        h.1 += 1;
        h.2 += secs;
    }

    /// `/metrics`: every counter, gauge and histogram in the OpenMetrics
    /// text format (prometheus-client writes it, escaping label values).
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(self.clone())));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    fn encode(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            (
                "attest_collect_log_events_received",
                "GenAI events received as OTLP log records, joined to their spans.",
                &self.log_events_received,
            ),
            (
                "attest_collect_log_records_ignored",
                "OTLP log records that are no GenAI event or name no span: not stored.",
                &self.log_records_ignored,
            ),
            ("attest_collect_spans_received", "Spans accepted by the OTLP receiver.", &self.spans_received),
            (
                "attest_collect_traces_received",
                "Traces closed by the assembler, or read from --jsonl.",
                &self.traces_received,
            ),
            ("attest_collect_traces_assembled", "Traces converted to Attest traces.", &self.traces_assembled),
            (
                "attest_collect_traces_sampled",
                "Traces selected by at least one rule after sampling.",
                &self.traces_sampled,
            ),
            ("attest_collect_traces_evaluated", "Traces evaluated by at least one rule.", &self.traces_evaluated),
            (
                "attest_collect_rule_evaluations",
                "Rule evaluations completed (one per trace and rule).",
                &self.rule_evaluations,
            ),
            (
                "attest_collect_spans_duplicate",
                "Spans ignored because their trace already held a span with the same id (exporter retries).",
                &self.spans_duplicate,
            ),
            (
                "attest_collect_spans_unreachable",
                "Spans of evaluated traces left out because no chain of parents joins them to the root.",
                &self.spans_unreachable,
            ),
            (
                "attest_collect_spans_nested",
                "Spans under a tool or model call that became no step of their own (named in the trace's metadata.nested_spans).",
                &self.spans_nested,
            ),
            ("attest_collect_traces_published", "Traces published to the NATS work stream.", &self.traces_published),
            (
                "attest_collect_publish_duplicates",
                "Publishes (work or results messages) the server dropped as duplicates of a message id already in the stream.",
                &self.publish_duplicates,
            ),
            (
                "attest_collect_redeliveries",
                "Work messages received again after a failed or unacknowledged attempt.",
                &self.redeliveries,
            ),
            (
                "attest_collect_publish_retries",
                "Work messages offered again after the NATS server refused or did not acknowledge a publish (the trace is kept meanwhile).",
                &self.publish_retries,
            ),
            (
                "attest_collect_rules_mismatch",
                "Work messages a worker gave back because a collector selected them under a rules file other than this worker's.",
                &self.rules_mismatches,
            ),
            (
                "attest_collect_consumer_resets",
                "Durable consumers this process made again because the NATS server came back with their stream reset beneath them (its store was damaged).",
                &self.consumer_resets,
            ),
            ("attest_collect_dead_lettered", "Work messages moved to the dead-letter subject.", &self.dead_lettered),
            (
                "attest_collect_store_failures",
                "Results messages a sink failed to store (each is offered again).",
                &self.store_failures,
            ),
        ] {
            counter(enc, name, help, ld(v))?;
        }
        gauge(
            enc,
            "attest_collect_queue_depth",
            "Traces waiting for evaluation.",
            ld(&self.queue_depth),
        )?;
        let lag = ConstGauge::new(ld(&self.queue_lag_ms) as f64 / 1000.0);
        lag.encode(enc.encode_descriptor(
            "attest_collect_queue_lag_seconds",
            "Wait between a trace closing and its evaluation starting (latest).",
            None,
            lag.metric_type(),
        )?)?;
        gauge(enc, "attest_collect_open_traces", "Traces being assembled.", ld(&self.open_traces))?;
        gauge(
            enc,
            "attest_collect_open_bytes",
            "Approximate bytes held by traces being assembled.",
            ld(&self.open_bytes),
        )?;
        let requests = locked(&self.requests);
        family(
            enc,
            "attest_collect_requests",
            "OTLP/HTTP export requests by response status.",
            requests
                .iter()
                .map(|((code, encoding), v)| ([("code", code.to_string()), ("encoding", (*encoding).to_owned())], *v)),
        )?;
        drop(requests);
        for (name, help, label, map) in [
            (
                "attest_collect_unread",
                "Requests for protocols, paths or signals collect does not read, by kind.",
                "kind",
                &self.unread,
            ),
            (
                "attest_collect_traces_dropped",
                "Traces not evaluated, by reason.",
                "reason",
                &self.dropped,
            ),
            (
                "attest_collect_spans_dropped",
                "Spans not evaluated, by reason.",
                "reason",
                &self.dropped_spans,
            ),
            (
                "attest_collect_results_dropped",
                "Result records not stored (refused by a sink, or not written to --results-jsonl), by reason.",
                "reason",
                &self.results_dropped,
            ),
            (
                "attest_collect_traces_out_dropped",
                "Traces not written to --traces-out, by reason.",
                "reason",
                &self.traces_out_dropped,
            ),
        ] {
            let map = locked(map);
            family(enc, name, help, map.iter().map(|(k, v)| ([(label, *k)], *v)))?;
        }
        for (name, help, label, map) in [
            (
                "attest_collect_results",
                "Assertion results by rule and status.",
                "status",
                &self.results,
            ),
            (
                "attest_collect_rule_events",
                "Per-rule events other than verdicts.",
                "event",
                &self.rule_events,
            ),
        ] {
            let map = locked(map);
            family(
                enc,
                name,
                help,
                map.iter().map(|((rule, tag), v)| ([("rule", rule.as_str()), (label, *tag)], *v)),
            )?;
        }
        let (per_bucket, count, sum) = *locked(&self.latency);
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS.iter().copied().chain([f64::INFINITY]).zip(per_bucket).collect();
        enc.encode_descriptor(
            "attest_collect_evaluation_seconds",
            "Time to evaluate one trace against one rule.",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        if let Some(export) = self.export.get() {
            export.encode(enc)?;
        }
        Ok(())
    }
}

/// The collector's metrics as prometheus-client reads them at each scrape.
struct Exposition(Arc<Metrics>);

impl fmt::Debug for Exposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("attest-collect metrics")
    }
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        self.0.encode(&mut enc)
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A counter `name` (exposed as `name_total`).
pub(crate) fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

pub(crate) fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A labelled counter: one series per label set.
fn family<L: EncodeLabelSet>(enc: &mut DescriptorEncoder, name: &str, help: &str, series: impl Iterator<Item = (L, u64)>) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
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

    #[test]
    fn the_exposition_is_openmetrics_with_every_family() {
        let m = Arc::new(Metrics::default());
        m.spans_received.fetch_add(3, Ordering::Relaxed);
        m.queue_lag_ms.store(1_500, Ordering::Relaxed);
        m.request(200, "protobuf");
        m.dropped("no_root", 2);
        m.result("refund \"fast\"\nlane", crate::Status::HardFail);
        for secs in [0.000_5, 0.003, 3.0, 500.0] {
            m.observe_latency(Duration::from_secs_f64(secs));
        }
        let text = m.render();
        for line in [
            "# TYPE attest_collect_spans_received counter",
            "attest_collect_spans_received_total 3",
            "attest_collect_queue_lag_seconds 1.5",
            "attest_collect_queue_depth 0",
            r#"attest_collect_requests_total{code="200",encoding="protobuf"} 1"#,
            r#"attest_collect_traces_dropped_total{reason="no_root"} 1"#,
            r#"attest_collect_spans_dropped_total{reason="no_root"} 2"#,
            // A rule name is a label value, escaped.
            r#"attest_collect_results_total{rule="refund \"fast\"\nlane",status="hard_fail"} 1"#,
            // Buckets are cumulative; the last observation is past every bound.
            r#"attest_collect_evaluation_seconds_bucket{le="0.001"} 1"#,
            r#"attest_collect_evaluation_seconds_bucket{le="0.005"} 2"#,
            r#"attest_collect_evaluation_seconds_bucket{le="5.0"} 3"#,
            r#"attest_collect_evaluation_seconds_bucket{le="120.0"} 3"#,
            r#"attest_collect_evaluation_seconds_bucket{le="+Inf"} 4"#,
            "attest_collect_evaluation_seconds_count 4",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
        }
        // Every family is declared once, and every sample belongs to one.
        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(families.len(), 32, "{text}");
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(families.iter().any(|f| l.starts_with(f.split(' ').next().unwrap())), "{l}");
        }
    }
}
