//! A real OpenTelemetry pipeline into the collector: the `openai` Python client
//! instrumented by OpenInference or by the OpenTelemetry GenAI instrumentation,
//! exported with the OTLP/HTTP protobuf exporter, talking to a fake
//! OpenAI-compatible server on loopback. Checks the assembled Attest traces and
//! the verdicts. Needs the venv named by COLLECT_TEST_VENV (scripts/test makes it);
//! runs `attest-engine collect` when ATTEST_ENGINE_BIN names the engine.

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use support::{read_jsonl, Collector, Evaluator, RULES};

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
    let grpc_ok = support::metric(&metrics, "attest_collect_requests_total{code=\"200\",encoding=\"grpc\"}");
    assert_eq!(grpc_ok > 0.0, transport == Transport::Grpc, "{metrics}");
    if capture == Capture::Events {
        // Two model calls per run, one operation-details event each.
        assert_eq!(
            support::metric(&metrics, "attest_collect_log_events_received_total"),
            6.0,
            "{metrics}"
        );
    }
    assert_eq!(support::metric(&metrics, "attest_collect_spans_received_total"), 12.0, "{metrics}");
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
        support::metric(&metrics, "attest_collect_requests_total{code=\"200\",encoding=\"grpc\"}") >= 1.0,
        "{metrics}"
    );
    assert!(
        support::metric(&metrics, "attest_collect_unread_total{kind=\"otlp_metrics\"}") >= 1.0,
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
