//! A real OpenTelemetry pipeline into the collector: the `openai` Python client
//! instrumented by OpenInference or by the OpenTelemetry GenAI instrumentation,
//! exported with the OTLP/HTTP protobuf exporter, talking to a fake
//! OpenAI-compatible server on loopback. Checks the assembled Attest traces and
//! the verdicts. Needs the venv named by COLLECT_TEST_VENV (scripts/test makes it);
//! runs `attest-engine collect` when ATTEST_ENGINE_BIN names the engine.

use std::path::PathBuf;
use std::process::Command;

use crate::support::{read_jsonl, Collector, Evaluator, RULES};
use serde_json::Value;

fn venv_python() -> Option<PathBuf> {
    match std::env::var("COLLECT_TEST_VENV") {
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v).join("bin/python")),
        _ => attest_test_support::missing(
            "COLLECT_TEST_VENV is not set, so the OpenTelemetry pipeline tests did not run",
            "scripts/test makes the venv (target/collect-venv) and sets it",
        ),
    }
}

/// How the instrumented agent exports.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Http,
    Grpc,
}

/// Where the GenAI instrumentation puts message content.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// Span attributes (`span_only`).
    Spans,
    /// OTLP log events only (`event_only`), joined to their spans by the collector.
    Events,
}

async fn run_convention(convention: &str) {
    run(convention, Transport::Http, Capture::Spans).await;
}

async fn run(convention: &str, transport: Transport, capture: Capture) {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let traces = dir.path().join("traces.jsonl");
    // The product: `attest-engine collect`, scoring with the engine's own layers.
    let mut collector = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "300",
            "--results-jsonl",
            results.to_str().unwrap(),
            "--traces-out",
            traces.to_str().unwrap(),
            "--otlp-grpc",
            "127.0.0.1:0",
        ],
        &[],
    );
    let endpoint = match transport {
        Transport::Http => collector.url.clone(),
        Transport::Grpc => collector.grpc_addr(),
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/agent.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([convention, &endpoint, "3"])
        .env("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        .env(
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
            if capture == Capture::Events { "EVENT_ONLY" } else { "SPAN_ONLY" },
        )
        .env("AGENT_OTLP_PROTOCOL", if transport == Transport::Grpc { "grpc" } else { "http" })
        .env("AGENT_LOG_EVENTS", if capture == Capture::Events { "1" } else { "0" })
        .output()
        .expect("run the instrumented agent");
    assert!(out.status.success(), "agent failed: {}", String::from_utf8_lossy(&out.stderr));

    collector.wait_metric("attest_collect_traces_evaluated_total", 3.0, 30).await;
    let metrics = collector.metrics().await;
    let grpc_ok = crate::support::metric(&metrics, "attest_collect_requests_total{code=\"200\",encoding=\"grpc\"}");
    assert_eq!(grpc_ok > 0.0, transport == Transport::Grpc, "{metrics}");
    if capture == Capture::Events {
        // Two model calls per run, one operation-details event each.
        assert_eq!(
            crate::support::metric(&metrics, "attest_collect_log_events_received_total"),
            6.0,
            "{metrics}"
        );
    }
    assert_eq!(
        crate::support::metric(&metrics, "attest_collect_spans_received_total"),
        12.0,
        "{metrics}"
    );
    let (code, stderr) = collector.proc.terminate();
    assert_eq!(code, 0, "{stderr}");

    let traces = read_jsonl(&traces);
    assert_eq!(traces.len(), 3);
    for t in &traces {
        assert_eq!(t["agent_id"], "refund-agent", "{t:#}");
        let steps = t["steps"].as_array().unwrap();
        let kinds: Vec<_> = steps.iter().map(|s| s["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["llm_call", "tool_call", "llm_call"], "{t:#}");
        assert_eq!(steps[0]["args"]["model"], "gpt-4o-mini");
        let asked = &steps[0]["args"]["messages"][0];
        assert_eq!(asked["role"], "user", "{t:#}");
        assert!(asked["content"].as_str().unwrap().starts_with("Where is my order ORD-7?"), "{t:#}");
        assert_eq!(steps[0]["result"]["tool_calls"][0]["name"], "lookup_order", "{t:#}");
        assert_eq!(steps[1]["name"], "lookup_order");
        assert_eq!(steps[1]["args"]["order_id"], "ORD-7");
        assert_eq!(steps[1]["result"]["status"], "delivered");
        assert_eq!(steps[2]["result"]["completion"], "Your order ORD-7 was delivered; refund sent.");
        assert!(
            t["input"]["user_message"].as_str().unwrap().starts_with("Where is my order ORD-7?"),
            "{t:#}"
        );
        assert_eq!(t["output"]["message"], "Your order ORD-7 was delivered; refund sent.");
        assert_eq!(t["metadata"]["total_tokens"], 104, "two calls of 40 + 12 tokens");
        assert_eq!(t["metadata"]["service_name"], "refund-service");
    }

    let results = read_jsonl(&results);
    assert_eq!(results.len(), 9, "3 traces x 3 assertions");
    for r in &results {
        let expected = if r["assertion_id"] == "escalates" { "hard_fail" } else { "pass" };
        assert_eq!(r["status"], expected, "{r}");
        assert_eq!(r["rule"], "refund-tools");
        assert_eq!(r["agent_id"], "refund-agent");
        assert!(traces.iter().any(|t| t["trace_id"] == r["trace_id"]));
    }
}

#[tokio::test]
async fn genai_conventions_from_the_opentelemetry_openai_instrumentation() {
    run_convention("genai").await;
}

#[tokio::test]
async fn openinference_conventions_from_the_openinference_openai_instrumentation() {
    run_convention("openinference").await;
}

#[tokio::test]
async fn otlp_grpc_from_the_python_grpc_exporters() {
    run("genai", Transport::Grpc, Capture::Spans).await;
    run("openinference", Transport::Grpc, Capture::Spans).await;
}

#[tokio::test]
async fn genai_messages_sent_as_log_events_over_http_are_joined_to_their_spans() {
    run("genai", Transport::Http, Capture::Events).await;
}

#[tokio::test]
async fn genai_messages_sent_as_log_events_over_grpc_are_joined_to_their_spans() {
    run("genai", Transport::Grpc, Capture::Events).await;
}

/// `opentelemetry-instrument` with its defaults (OTLP/gRPC; traces, metrics
/// and logs exporters on), only the endpoint pointed at the collector: the
/// GenAI instrumentation's model calls arrive, one trace each, with their
/// messages from span attributes and log events alike, and the metrics the
/// launcher also sends are refused, counted and explained.
#[tokio::test]
async fn zero_code_instrumentation_with_its_default_grpc_settings() {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces.jsonl");
    let mut collector = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "300",
            "--traces-out",
            traces.to_str().unwrap(),
            "--otlp-grpc",
            "127.0.0.1:0",
        ],
        &[],
    );
    let grpc = collector.grpc_addr();
    let launcher = python.with_file_name("opentelemetry-instrument");
    let out = Command::new(&launcher)
        .arg(&python)
        .arg("zero_code.py")
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{grpc}"))
        .env("OTEL_SERVICE_NAME", "zero-code-app")
        .env("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        .env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_AND_EVENT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_METRICS_EXPORTER")
        .env_remove("OTEL_LOGS_EXPORTER")
        .output()
        .expect("run opentelemetry-instrument");
    assert!(out.status.success(), "the app failed: {}", String::from_utf8_lossy(&out.stderr));
    collector.wait_metric("attest_collect_traces_assembled_total", 2.0, 30).await;
    let metrics = collector.metrics().await;
    assert!(
        crate::support::metric(&metrics, "attest_collect_requests_total{code=\"200\",encoding=\"grpc\"}") >= 1.0,
        "{metrics}"
    );
    assert!(
        crate::support::metric(&metrics, "attest_collect_unread_total{kind=\"otlp_metrics\"}") >= 1.0,
        "{metrics}"
    );
    let (code, stderr) = collector.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("OTLP metrics are not read by collect"), "{stderr}");
    let traces = read_jsonl(&traces);
    assert_eq!(traces.len(), 2, "one trace per model call: {traces:#?}");
    for t in &traces {
        assert_eq!(t["metadata"]["service_name"], "zero-code-app");
        let step = &t["steps"][0];
        assert_eq!(step["type"], "llm_call", "{t:#}");
        assert_eq!(
            step["args"]["messages"][0]["content"], "Please refund order ORD-7. [run zero]",
            "{t:#}"
        );
        assert_eq!(t["metadata"]["total_tokens"], 52, "{t:#}");
    }
    let answers: Vec<&Value> = traces.iter().map(|t| &t["steps"][0]["result"]["completion"]).collect();
    assert!(answers.contains(&&Value::from("Your refund is processed.")), "{answers:?}");
}

/// gRPC refusals carry gRPC's own codes, as an exporter reads them
/// (`grpcio`, raw messages): a message that is no OTLP request is
/// `INVALID_ARGUMENT`, a missing bearer token `UNAUTHENTICATED`; gzip is
/// accepted. Each is counted with the HTTP status it stands for.
#[tokio::test]
async fn grpc_refusals_use_grpc_codes() {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut collector = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        RULES,
        &["--otlp-grpc", "127.0.0.1:0", "--bearer-token-env", "GRPC_TEST_TOKEN"],
        &[("GRPC_TEST_TOKEN", "s3cret")],
    );
    let addr = collector.grpc_addr();
    let script = r#"
import sys, grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
addr = sys.argv[1]
ch = grpc.insecure_channel(addr)
export = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export", request_serializer=lambda b: b, response_deserializer=lambda b: b)
auth = [("authorization", "Bearer s3cret")]
def code(body, metadata, **kw):
    try:
        export(body, metadata=metadata, timeout=10, **kw)
        return "OK"
    except grpc.RpcError as e:
        return e.code().name
def trace(i):
    s = Span(trace_id=bytes([i + 1]) * 16, span_id=bytes([i + 1]) * 8, name="invoke_agent a", start_time_unix_nano=1, end_time_unix_nano=2)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[s])])]).SerializeToString()
print(code(trace(0), []))
print(code(b"\xff\xff\xff", auth))
print(code(trace(1), auth, compression=grpc.Compression.Gzip))
"#;
    let out = Command::new(&python).arg("-c").arg(script).arg(&addr).output().expect("run grpcio");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(lines[0], "UNAUTHENTICATED", "{lines:?}");
    assert_eq!(lines[1], "INVALID_ARGUMENT", "{lines:?}");
    assert_eq!(lines[2], "OK", "gzip: {lines:?}");
    let metrics = collector.metrics().await;
    assert!(
        crate::support::metric(&metrics, "attest_collect_requests_total{code=\"401\",encoding=\"grpc\"}") >= 1.0,
        "{metrics}"
    );
    assert!(
        crate::support::metric(&metrics, "attest_collect_requests_total{code=\"400\",encoding=\"grpc\"}") >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        crate::support::metric(&metrics, "attest_collect_spans_received_total"),
        1.0,
        "the gzip one: {metrics}"
    );
}
