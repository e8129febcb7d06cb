//! Bad and extreme input to the collector: each case gets a clear answer or a
//! counted outcome, and the collector keeps serving and drains cleanly.

use std::io::Write;
use std::time::Duration;

use crate::support::otlp::{agent_trace, kv, request, span};
use crate::support::{metric, read_jsonl, Collector, Proc, RULES};
use prost::Message;

async fn post(url: &str, content_type: &str, encoding: Option<&str>, body: Vec<u8>) -> reqwest::Response {
    let mut headers = vec![("content-type", content_type)];
    headers.extend(encoding.map(|e| ("content-encoding", e)));
    crate::support::post(url, "/v1/traces", &headers, body).await
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn malformed_payloads_get_otlp_answers_and_good_ones_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--settle-ms", "200", "--results-jsonl", results.to_str().unwrap()],
    );

    let r = post(&c.url, "text/plain", None, b"hello".to_vec()).await;
    assert_eq!(r.status(), 415);
    assert!(r.text().await.unwrap().contains("application/x-protobuf, application/json"));

    let r = post(&c.url, "application/x-protobuf", None, vec![0xff, 0xff, 0xff, 0x01]).await;
    assert_eq!(r.status(), 400);
    let status = opentelemetry_proto_status(&r.bytes().await.unwrap());
    assert!(status.contains("not an OTLP ExportTraceServiceRequest protobuf"), "{status}");

    let r = post(&c.url, "application/json", None, b"{\"resourceSpans\": 7}".to_vec()).await;
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("OTLP/JSON"), "{body}");

    let r = post(&c.url, "application/json", Some("br"), b"{}".to_vec()).await;
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("valid choices: gzip, identity"),
        "{body}"
    );

    let r = post(&c.url, "application/x-protobuf", Some("gzip"), b"not gzip at all".to_vec()).await;
    assert_eq!(r.status(), 400);

    // A good trace, OTLP/JSON and gzip-compressed, with one span whose trace id is bad.
    let mut req = request(agent_trace(7, 1, "lookup_order"));
    let mut bad = span(7, 50, Some(0), "broken", vec![]);
    bad.trace_id = vec![1, 2, 3];
    req.resource_spans[0].scope_spans[0].spans.push(bad);
    let json = serde_json::to_vec(&req).unwrap();
    let r = post(&c.url, "application/json", Some("gzip"), gzip(&json)).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["partialSuccess"]["rejectedSpans"], serde_json::json!(1), "{body}");
    assert!(body["partialSuccess"]["errorMessage"].as_str().unwrap().contains("trace id"));

    // OTLP/JSON ids that are not hex reject their span only; the rest of
    // the request is kept.
    let mut req = request(agent_trace(8, 1, "lookup_order"));
    req.resource_spans[0].scope_spans[0].spans.push(span(8, 60, Some(0), "odd", vec![]));
    let last = req.resource_spans[0].scope_spans[0].spans.len() - 1;
    let mut json: serde_json::Value = serde_json::to_value(&req).unwrap();
    json["resourceSpans"][0]["scopeSpans"][0]["spans"][last]["traceId"] = serde_json::json!("xyz");
    let r = post(&c.url, "application/json", None, json.to_string().into_bytes()).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["partialSuccess"]["rejectedSpans"], serde_json::json!(1), "{body}");

    // A JSON list is not an ExportTraceServiceRequest, whatever it holds.
    for list in ["[]", "[[]]"] {
        let r = post(&c.url, "application/json", None, list.as_bytes().to_vec()).await;
        assert_eq!(r.status(), 400, "{list}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains("must be a JSON object"), "{body}");
    }

    let m = c.wait_metric("attest_collect_traces_evaluated_total", 2.0, 20).await;
    assert_eq!(
        metric(&m, r#"attest_collect_requests_total{code="400",encoding="protobuf"}"#),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_requests_total{code="400",encoding="json"}"#),
        4.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_requests_total{code="415",encoding="unknown"}"#),
        1.0,
        "{m}"
    );
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    let results = read_jsonl(&results);
    assert_eq!(results.len(), 6);
    for id in ["07070707070707070707070707070707", "08080808080808080808080808080808"] {
        assert_eq!(results.iter().filter(|r| r["trace_id"] == id).count(), 3, "{results:?}");
    }
}

#[tokio::test]
async fn requests_that_would_decode_to_far_more_than_their_size_are_refused_and_counted() {
    use opentelemetry_proto::tonic::trace::v1::span::Event;
    let dir = tempfile::tempdir().unwrap();
    // A 1 MB request may decode to at most 8 MB.
    let c = Collector::start(dir.path(), RULES, &["--max-request-bytes", "1000000"]);
    // 100,000 empty events: 200 KB of protobuf, 2 KB gzipped.
    let mut bomb = span(1, 0, None, "invoke_agent a", vec![]);
    bomb.events = vec![Event::default(); 100_000];
    let body = request(vec![bomb]).encode_to_vec();
    assert!(body.len() < 300_000);
    let r = post(&c.url, "application/x-protobuf", Some("gzip"), gzip(&body)).await;
    assert_eq!(r.status(), 400);
    let status = opentelemetry_proto_status(&r.bytes().await.unwrap());
    assert!(
        status.contains("would decode to more than 7 MiB (8 × --max-request-bytes)"),
        "{status}"
    );
    // The same in JSON: an empty object per event.
    let events = vec!["{}"; 100_000].join(",");
    let json = format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"01010101010101010101010101010101","spanId":"0000000000000001","name":"s","events":[{events}]}}]}}]}}]}}"#
    );
    let r = post(&c.url, "application/json", None, json.into_bytes()).await;
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("would decode to more than 7 MiB"),
        "{body}"
    );
    // Spans refused for their ids are counted as dropped spans.
    let mut bad = span(2, 0, None, "invoke_agent a", vec![]);
    bad.span_id = vec![0; 8];
    let r = post(&c.url, "application/x-protobuf", None, request(vec![bad]).encode_to_vec()).await;
    assert_eq!(r.status(), 200);
    let m = c.metrics().await;
    assert_eq!(metric(&m, "attest_collect_spans_dropped_total{reason=\"invalid_id\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_traces_dropped_total{reason=\"malformed\"}"), 2.0, "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

fn opentelemetry_proto_status(body: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Status {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    let s = Status::decode(body).expect("google.rpc.Status body");
    assert_eq!(s.code, 3, "INVALID_ARGUMENT");
    s.message
}

#[tokio::test]
async fn trace_limits_are_counted_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start(
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "300",
            "--orphan-timeout-ms",
            "600",
            // Room for the 10,000-span trace below (some 1.5 KB each, as
            // docs/continuous.md estimates), not for the 17 MB attribute.
            "--max-trace-bytes",
            "16000000",
            "--results-jsonl",
            results.to_str().unwrap(),
        ],
    );
    // The answer's partial success: (rejected spans, message).
    let send = |spans| {
        let url = c.url.clone();
        async move {
            let r = post(&url, "application/x-protobuf", None, request(spans).encode_to_vec()).await;
            assert_eq!(r.status(), 200);
            let body = r.bytes().await.unwrap();
            let answer = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::decode(body).unwrap();
            answer
                .partial_success
                .map(|p| (p.rejected_spans, p.error_message))
                .unwrap_or_default()
        }
    };
    // Exactly at the span limit: evaluated.
    assert_eq!(send(agent_trace(1, 9_999, "lookup_order")).await.0, 0);
    // One span over: dropped whole, counted, and the exporter told.
    let (rejected, why) = send(agent_trace(2, 10_000, "lookup_order")).await;
    assert_eq!(rejected, 10_001);
    assert!(
        why.contains("10001 spans were dropped") && why.contains("--max-trace-spans"),
        "{why}"
    );
    // Over the byte limit.
    let mut big = agent_trace(3, 1, "lookup_order");
    big[1].attributes.push(kv("gen_ai.tool.call.result", &"x".repeat(17_000_000)));
    let (rejected, why) = send(big).await;
    assert_eq!(rejected, 2);
    assert!(why.contains("--max-trace-bytes"), "{why}");
    // A span of a trace already dropped is rejected too.
    let (rejected, _) = send(agent_trace(2, 1, "lookup_order").split_off(1)).await;
    assert_eq!(rejected, 1);
    // No root span ever arrives.
    send(agent_trace(4, 2, "lookup_order").split_off(1)).await;
    // Spans of no known convention.
    send(vec![span(5, 0, None, "GET /orders", vec![kv("http.request.method", "GET")])]).await;

    let m = c
        .wait_metric(r#"attest_collect_traces_dropped_total{reason="no_root"}"#, 1.0, 20)
        .await;
    let m = if metric(&m, "attest_collect_traces_evaluated_total") < 1.0 {
        c.wait_metric("attest_collect_traces_evaluated_total", 1.0, 20).await
    } else {
        m
    };
    assert_eq!(
        metric(&m, r#"attest_collect_traces_dropped_total{reason="too_many_spans"}"#),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_spans_dropped_total{reason="too_many_spans"}"#),
        10_002.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_traces_dropped_total{reason="trace_too_large"}"#),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_traces_dropped_total{reason="unknown_convention"}"#),
        1.0,
        "{m}"
    );
    assert_eq!(metric(&m, r#"attest_collect_spans_dropped_total{reason="no_root"}"#), 2.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_traces_evaluated_total"), 1.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_open_traces"), 0.0, "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    let results = read_jsonl(&results);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r["trace_id"] == "01010101010101010101010101010101"));
}

#[tokio::test]
async fn a_full_evaluation_queue_answers_503_with_retry_after_and_sigterm_drains_it() {
    refused_once_full(&["--queue-capacity", "1"]).await;
}

#[tokio::test]
async fn a_spent_queue_byte_budget_answers_503_too() {
    // Room for a hundred traces by count, one by bytes.
    let one = one_trace_kib().to_string();
    refused_once_full(&["--queue-capacity", "100", "--max-trace-bytes", &one, "--max-queued-bytes", &one]).await;
}

/// What one test trace counts toward the byte bounds, rounded up to the
/// KiB the queue's budget counts in: the collector's own estimate.
fn one_trace_kib() -> usize {
    let body = request(agent_trace(1, 1, "lookup_order")).encode_to_vec();
    let decoded = attest_collect::otlp::decode(&body, attest_collect::otlp::Encoding::Protobuf, 1 << 20).unwrap();
    let bytes = decoded.spans.iter().map(|s| s.size_bytes).sum::<usize>() + attest_collect::assemble::TRACE_BYTES;
    bytes.div_ceil(1024) * 1024
}

/// Sends one complete trace at a time to a collector that evaluates one at
/// a time, slowly, with `bounds` on its queue, until it answers 503; checks
/// the `Retry-After` and that SIGTERM evaluates every accepted trace.
async fn refused_once_full(bounds: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start_with_env(
        dir.path(),
        RULES,
        &[
            ["--settle-ms", "50", "--concurrency", "1", "--results-jsonl"].as_slice(),
            &[results.to_str().unwrap()],
            bounds,
        ]
        .concat(),
        &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "1500")],
    );
    let mut accepted = 0;
    let mut refused = None;
    for t in 1..=20u8 {
        let r = post(
            &c.url,
            "application/x-protobuf",
            None,
            request(agent_trace(t, 1, "lookup_order")).encode_to_vec(),
        )
        .await;
        if r.status() == 503 {
            refused = Some(r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string()));
            break;
        }
        assert_eq!(r.status(), 200);
        accepted += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let retry_after = refused.expect("a 503 once the queue is full");
    assert_eq!(retry_after.as_deref(), Some("2"));
    // Open traces are evaluated on SIGTERM, results flushed, exit 0.
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    let results = read_jsonl(&results);
    assert_eq!(results.len(), accepted * 3, "every accepted trace evaluated before exit");
}

#[tokio::test]
async fn bearer_token_and_public_binding_are_explicit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
    let rules = dir.path().join("rules.yaml");
    let mut p = Proc::spawn(
        dir.path(),
        "public",
        &["collect", "--rules", rules.to_str().unwrap(), "--otlp-http", "0.0.0.0:0"],
        &[],
    );
    assert_eq!(p.wait_exit(20), 2);
    assert!(p.stderr_text().contains("--listen-public"), "{}", p.stderr_text());
    // A worker's /metrics too; refused before any NATS server is needed.
    let mut w = Proc::spawn(
        dir.path(),
        "public-worker",
        &[
            "worker",
            "--nats",
            "nats://127.0.0.1:1",
            "--role",
            "sink",
            "--metrics-addr",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert_eq!(w.wait_exit(20), 2);
    let log = w.stderr_text();
    assert!(
        log.contains("--metrics-addr 0.0.0.0:0 is not a loopback address: pass --listen-public"),
        "{log}"
    );

    let c = Collector::start_with_env(
        dir.path(),
        RULES,
        &["--bearer-token-env", "COLLECT_TOKEN"],
        &[("COLLECT_TOKEN", "s3cret")],
    );
    let body = request(agent_trace(9, 1, "lookup_order")).encode_to_vec();
    let r = post(&c.url, "application/x-protobuf", None, body.clone()).await;
    assert_eq!(r.status(), 401);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/traces", c.url))
        .header("content-type", "application/x-protobuf")
        .header("authorization", "Bearer s3cret")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The token guards /metrics too.
    let r = reqwest::get(format!("{}/metrics", c.url)).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(c.metrics().await.contains("attest_collect_traces_received_total"));
    let (code, _) = c.proc.terminate();
    assert_eq!(code, 0);
}

#[test]
fn rules_files_with_errors_are_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "rules:\n- name: refunds\n  sample_rat: 0.5\n  assertions: [{assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}}]\n",
            &["rule #1 'refunds'", "unknown field `sample_rat`", "sample_rate"][..],
        ),
        (
            "rules:\n- name: refunds\n  assertions: [{assertion_id: a, type: semantic, spec: {}}]\n",
            &["rule #1 'refunds'", "assertions[0].type", "valid choices: trace, content"][..],
        ),
        (
            "rules:\n- name: refunds\n  match: {agent: x}\n  assertions: [{assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}}]\n",
            &["unknown field `agent`", "agent_id, root_span, attributes"][..],
        ),
        (
            "rules:\n- name: refunds\n  sample_rate: half\n  assertions: [{assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}}]\n",
            &["rule #1 'refunds': sample_rate: invalid type: string \"half\""][..],
        ),
        (
            "rules:\n- name: refunds\n  budget: {judge_calls_per_minute: -1}\n  assertions: [{assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}}]\n",
            &["rule #1 'refunds': budget.judge_calls_per_minute: invalid value: integer `-1`"][..],
        ),
        // A key given twice: the last would silently win, inverting the check.
        (
            "rules:\n- name: refunds\n  assertions: [{assertion_id: a, type: content, spec: {target: output.message, check: contains, value: refund, check: not_contains}}]\n",
            &["not valid YAML: rules[0].assertions[0].spec: duplicate key 'check': a key may appear once in each mapping; remove or rename one of them at line 3"][..],
        ),
        // 200 KB of nested brackets: refused at once, not after minutes of parsing.
        (
            &*format!("rules: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)).leak(),
            &["not valid YAML: the document nests deeper than 256 levels of lists and mappings; no file needs that many: flatten it", "line 1"][..],
        ),
    ];
    // A price below zero is refused too.
    let prices = dir.path().join("prices.yaml");
    std::fs::write(&prices, "models:\n  gpt-4o: {input_per_million: -1, output_per_million: 2}\n").unwrap();
    std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
    let rules = dir.path().join("rules.yaml");
    let mut p = Proc::spawn(
        dir.path(),
        "prices",
        &[
            "collect",
            "--rules",
            rules.to_str().unwrap(),
            "--prices",
            prices.to_str().unwrap(),
            "--otlp-http",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(p.wait_exit(20), 2);
    assert!(
        p.stderr_text().contains("models.gpt-4o.input_per_million is -1"),
        "{}",
        p.stderr_text()
    );
    // Flags that would refuse every trace, and output paths that are directories.
    let flag_cases: [(&[&str], &str); 11] = [
        (&["--max-trace-bytes", "0"], "--max-trace-bytes must be at least 1"),
        (&["--max-trace-bytes", "1000"], "--max-trace-bytes 1000 is less than 1024 bytes"),
        (&["--max-open-bytes", "1023"], "--max-open-bytes 1023 is less than 1024 bytes"),
        (&["--max-connections", "0"], "--max-connections must be at least 1"),
        (&["--max-trace-spans", "0"], "--max-trace-spans must be at least 1"),
        (&["--request-timeout-secs", "0"], "'0' is out of range; give 1s to 1day"),
        // Past what a deadline can be computed for: once, every connection panicked.
        (
            &["--request-timeout", "18446744073709551615"],
            "'18446744073709551615' is out of range; give 1s to 1day",
        ),
        // Results are the workers' to write; refused before connecting.
        (
            &["--nats", "nats://127.0.0.1:1", "--results-jsonl", "/dev/null"],
            "with --nats this collector evaluates nothing",
        ),
        (&["--results-jsonl", "."], "--results-jsonl .: cannot be opened for appending"),
        (&["--jsonl", ".", "--results-jsonl", "/dev/null"], "--jsonl .: is a directory"),
        // The test harness keeps no history.
        (&["--jsonl", "/dev/null"], "--jsonl with history off has nowhere to put its results"),
    ];
    for (i, (flags, needle)) in flag_cases.iter().enumerate() {
        let mut args = vec!["collect", "--rules", rules.to_str().unwrap(), "--otlp-http", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let mut p = Proc::spawn(dir.path(), &format!("flag{i}"), &args, &[]);
        assert_ne!(p.wait_exit(20), 0, "{flags:?}");
        assert!(p.stderr_text().contains(needle), "{needle:?} not in {}", p.stderr_text());
    }
    // A global engine flag that collect and worker would ignore is a usage error.
    if crate::support::engine_bin().is_some() {
        for sub in ["collect", "worker"] {
            let mut p = Proc::spawn_on(
                crate::support::Evaluator::Engine,
                dir.path(),
                &format!("mcr-{sub}"),
                &[
                    "--max-concurrent-requests",
                    "1",
                    sub,
                    "--rules",
                    rules.to_str().unwrap(),
                    "--nats",
                    "nats://127.0.0.1:1",
                ],
                &[],
            );
            assert_eq!(p.wait_exit(20), 2, "{}", p.stderr_text());
            let err = p.stderr_text();
            assert!(
                err.contains(&format!("attest-engine {sub}: --max-concurrent-requests")) && err.contains("--concurrency N"),
                "{err}"
            );
        }
    }
    for (i, (yaml, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("rules{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let mut p = Proc::spawn(
            dir.path(),
            &format!("bad{i}"),
            &["collect", "--rules", path.to_str().unwrap(), "--otlp-http", "127.0.0.1:0"],
            &[],
        );
        assert_eq!(p.wait_exit(20), 2);
        let err = p.stderr_text();
        for n in *needles {
            assert!(err.contains(n), "{n:?} not in {err}");
        }
    }
}

#[test]
fn jsonl_backfill_counts_bad_lines_and_rescoring_never_counts_twice() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
    let rules = dir.path().join("rules.yaml");
    let input = dir.path().join("traces.jsonl");
    let results = dir.path().join("results.jsonl");
    let mut lines = Vec::new();
    for i in 0..50 {
        let tool = if i % 2 == 0 { "lookup_order" } else { "cancel_order" };
        lines.push(
            serde_json::json!({
                "schema_version": 1, "trace_id": format!("trc_{i}"), "agent_id": "refund-agent",
                "steps": [{"type": "tool_call", "name": tool, "args": {}, "result": {}}],
                "output": {"message": "refund sent"}
            })
            .to_string(),
        );
    }
    lines.insert(10, "{not json".into());
    lines.insert(20, "[1, 2]".into());
    lines.insert(30, r#"{"trace_id": "no-output"}"#.into());
    std::fs::write(&input, lines.join("\n")).unwrap();
    for run in 0..2 {
        let mut p = Proc::spawn(
            dir.path(),
            &format!("backfill{run}"),
            &[
                "collect",
                "--rules",
                rules.to_str().unwrap(),
                "--jsonl",
                input.to_str().unwrap(),
                "--results-jsonl",
                results.to_str().unwrap(),
            ],
            &[],
        );
        // Lines that were not evaluated make the run fail, after the rest was.
        assert_eq!(p.wait_exit(60), 1, "{}", p.stderr_text());
        let err = p.stderr_text();
        assert!(err.contains("--jsonl: 53 lines"), "{err}");
        assert!(err.contains("3 malformed"), "{err}");
        assert!(err.contains("line 11: not JSON"), "{err}");
        assert!(err.contains("line 31: missing object field `output`"), "{err}");
    }
    let results_text = std::fs::read_to_string(&results).unwrap();
    let results_lines = read_jsonl(&results);
    assert_eq!(results_lines.len(), 150, "50 traces x 3 assertions, written once over two runs");
    let passes = results_lines
        .iter()
        .filter(|r| r["assertion_id"] == "uses-lookup" && r["status"] == "pass")
        .count();
    assert_eq!(passes, 25);

    // Results to a device: written, and the drain does not try to sync it.
    let good = dir.path().join("good.jsonl");
    let valid: Vec<&str> = lines.iter().map(String::as_str).filter(|l| l.contains("\"output\"")).collect();
    std::fs::write(&good, valid.join("\n")).unwrap();
    let args = [
        "collect",
        "--rules",
        rules.to_str().unwrap(),
        "--jsonl",
        good.to_str().unwrap(),
        "--results-jsonl",
        "/dev/null",
    ];
    let mut p = Proc::spawn(dir.path(), "to-device", &args, &[]);
    assert_eq!(p.wait_exit(60), 0, "{}", p.stderr_text());

    // A trace the engine's evaluator refuses (an answer over its size
    // limit) is a counted failure, not a silent skip.
    let evaluator = crate::support::Evaluator::product();
    if evaluator != crate::support::Evaluator::Engine {
        return;
    }
    let big = dir.path().join("big.jsonl");
    let message = "x".repeat(600_000);
    std::fs::write(
        &big,
        serde_json::json!({"schema_version": 1, "trace_id": "big", "agent_id": "refund-agent", "steps": [], "output": {"message": message}})
            .to_string(),
    )
    .unwrap();
    let mut p = Proc::spawn_on(
        evaluator,
        dir.path(),
        "big",
        &[
            "collect",
            "--rules",
            rules.to_str().unwrap(),
            "--jsonl",
            big.to_str().unwrap(),
            "--results-jsonl",
            results.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(p.wait_exit(60), 1, "{}", p.stderr_text());
    let err = p.stderr_text();
    assert!(err.contains("0 malformed") && err.contains("1 evaluations failed"), "{err}");
    assert_eq!(std::fs::read_to_string(&results).unwrap(), results_text, "nothing written for it");
}

#[test]
fn rescoring_names_the_rules_that_match_on_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    let by_service = "  - name: by-service\n    match:\n      attributes: {service.name: refund-service}\n    assertions:\n      - {assertion_id: any, type: trace, spec: {check: required_tools, tools: [lookup_order]}}\n";
    std::fs::write(&rules, format!("{RULES}{by_service}")).unwrap();
    let input = dir.path().join("traces.jsonl");
    let trace = serde_json::json!({"schema_version": 1, "trace_id": "t1", "agent_id": "refund-agent",
        "steps": [{"type": "tool_call", "name": "lookup_order", "args": {}, "result": {}}], "output": {"message": "refund"}});
    std::fs::write(&input, trace.to_string()).unwrap();
    let results = dir.path().join("results.jsonl");
    let args = [
        "collect",
        "--rules",
        rules.to_str().unwrap(),
        "--jsonl",
        input.to_str().unwrap(),
        "--results-jsonl",
        results.to_str().unwrap(),
    ];
    let mut p = Proc::spawn(dir.path(), "rescore", &args, &[]);
    assert_eq!(p.wait_exit(60), 0, "{}", p.stderr_text());
    let err = p.stderr_text();
    assert!(err.contains("rule(s) by-service match on span or resource attributes"), "{err}");
    let rules_run: std::collections::BTreeSet<String> = read_jsonl(&results)
        .iter()
        .map(|r| r["rule"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rules_run.into_iter().collect::<Vec<_>>(), ["refund-tools"]);
}

#[tokio::test]
async fn sigterm_evaluates_traces_that_are_still_settling() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--settle-ms", "600000", "--results-jsonl", results.to_str().unwrap()],
    );
    for t in 1..=3u8 {
        let r = post(
            &c.url,
            "application/x-protobuf",
            None,
            request(agent_trace(t, 2, "lookup_order")).encode_to_vec(),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    // One trace without its root: dropped as no_root on drain, not evaluated.
    let r = post(
        &c.url,
        "application/x-protobuf",
        None,
        request(agent_trace(4, 2, "lookup_order").split_off(1)).encode_to_vec(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let m = c.metrics().await;
    assert_eq!(metric(&m, "attest_collect_open_traces"), 4.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_traces_evaluated_total"), 0.0, "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("drained; 3 traces evaluated"), "{stderr}");
    assert_eq!(read_jsonl(&results).len(), 9);
}

#[tokio::test]
async fn a_body_sent_too_slowly_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--request-timeout-secs", "1"]);
    let addr = c.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!("POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&[0u8; 10]).await.unwrap();
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let m = c.metrics().await;
    assert_eq!(
        metric(&m, "attest_collect_requests_total{code=\"408\",encoding=\"unknown\"}"),
        1.0,
        "{m}"
    );
    let (code, _) = c.proc.terminate();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn headers_never_finished_close_the_connection_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--request-timeout-secs", "1", "--max-connections", "3"]);
    let addr = c.url.trim_start_matches("http://").to_string();
    // Three clients that stop mid-header hold every place.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        stalled.push(s);
    }
    for s in &mut stalled {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("the collector closed a stalled connection")
            .unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let m = c.metrics().await;
    assert!(m.contains("attest_collect_traces_received_total"), "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

/// Sends a request head and part of its body, and keeps the upload open.
async fn start_upload(addr: &str, declared: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head =
        format!("POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {declared}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&[0u8; 16]).await.unwrap();
    s
}

#[tokio::test]
async fn uploads_still_arriving_count_toward_the_request_and_byte_limits() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(
        dir.path(),
        RULES,
        &[
            "--max-inflight-requests",
            "3",
            "--max-request-bytes",
            "1000000",
            "--max-inflight-bytes",
            "1500000",
        ],
    );
    let addr = c.url.trim_start_matches("http://").to_string();
    let good = || request(agent_trace(3, 1, "lookup_order")).encode_to_vec();

    // Declared over the request limit: refused before any of it is read,
    // naming the limit and its flag.
    let mut over = good();
    over.resize(1_000_001, 0);
    let r = post(&c.url, "application/x-protobuf", None, over).await;
    assert_eq!(r.status(), 413);
    let status = opentelemetry_proto_status(&r.bytes().await.unwrap());
    assert!(status.contains("1000000-byte limit (--max-request-bytes)"), "{status}");

    // A declared length is no promise: two uploads that declare 800 kB each
    // and send 16 bytes hold what arrived (a first 64 KiB each), not 1.6 MB
    // of the 1.5 MB budget, so a third request still fits.
    let first = start_upload(&addr, 800_000).await;
    let second = start_upload(&addr, 800_000).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(post(&c.url, "application/x-protobuf", None, good()).await.status(), 200);

    // Uploads in progress fill the request slots, whatever their size...
    let third = start_upload(&addr, 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = post(&c.url, "application/x-protobuf", None, good()).await;
    assert_eq!(r.status(), 429);
    // ...but only for their grace: trickling, each is cut off with a 408
    // that says why, and gives its place back.
    let started = std::time::Instant::now();
    for upload in [first, second, third] {
        let answer = read_head(upload).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());

    // Once they are gone, requests are admitted again.
    let mut admitted = false;
    for _ in 0..50 {
        if post(&c.url, "application/x-protobuf", None, good()).await.status() == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "requests admitted once the uploads ended");
    let m = c
        .wait_metric("attest_collect_requests_total{code=\"429\",encoding=\"protobuf\"}", 1.0, 10)
        .await;
    assert_eq!(
        metric(&m, r#"attest_collect_requests_total{code="413",encoding="protobuf"}"#),
        1.0,
        "{m}"
    );
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

/// One client (127.0.0.1) holding slow uploads cannot take the receiver's
/// whole request budget from another (127.0.0.2), a well-behaved exporter.
#[tokio::test]
async fn one_client_cannot_take_the_whole_budget_from_others() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--max-inflight-requests", "8"]);
    let addr = c.url.trim_start_matches("http://").to_string();
    let good = || request(agent_trace(3, 1, "lookup_order")).encode_to_vec();
    let exporter = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let export = || async {
        exporter
            .post(format!("{}/v1/traces", c.url))
            .header("content-type", "application/x-protobuf")
            .body(good())
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(export().await, 200);
    // The hog opens as many uploads as there are slots, and sends nothing more.
    let mut hog = Vec::new();
    for _ in 0..8 {
        hog.push(start_upload(&addr, 100_000).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The exporter is still served while the hog holds six...
    for _ in 0..3 {
        assert_eq!(export().await, 200);
    }
    // ...because two of the hog's uploads were refused at once, naming why
    // (which two depends on the order the connections were served in), and
    // the six it holds are cut off only after their grace. Every answer is
    // awaited together, so a loaded machine cannot make one look missing.
    let answers = futures::future::join_all(hog.iter_mut().map(|upload| async move {
        use tokio::io::AsyncReadExt;
        let mut answer = vec![0u8; 512];
        match tokio::time::timeout(Duration::from_secs(30), upload.read(&mut answer)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&answer[..n]).to_string(),
            other => format!("no answer: {other:?}"),
        }
    }))
    .await;
    let refused: Vec<&String> = answers.iter().filter(|a| a.starts_with("HTTP/1.1 429")).collect();
    assert_eq!(refused.len(), 2, "{answers:?}");
    for answer in &refused {
        assert!(answer.contains("more than half of the receiver's requests in flight"), "{answer}");
    }
    let cut_off = answers.iter().filter(|a| a.starts_with("HTTP/1.1 408")).count();
    assert_eq!(cut_off, 6, "{answers:?}");
    drop(hog);
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test]
async fn a_byte_budget_equal_to_the_request_limit_admits_a_full_size_request() {
    let dir = tempfile::tempdir().unwrap();
    // A budget equal to the request limit, neither a whole number of KiB.
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--max-request-bytes", "1000000", "--max-inflight-bytes", "1000000"],
    );
    // Exactly the limit: the spans padded with an unknown field (field 15,
    // length-delimited, with a three-byte length), which decoders skip.
    let mut full = request(agent_trace(3, 1, "lookup_order")).encode_to_vec();
    let pad = 1_000_000 - full.len() - 4;
    full.extend_from_slice(&[0x7a, (pad & 0x7f) as u8 | 0x80, ((pad >> 7) & 0x7f) as u8 | 0x80, (pad >> 14) as u8]);
    full.resize(1_000_000, 0);
    assert_eq!(post(&c.url, "application/x-protobuf", None, full).await.status(), 200);
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

async fn read_head(mut s: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&answer[..n])
        .to_ascii_lowercase()
        .replace("http/1.1", "HTTP/1.1")
}

#[tokio::test]
async fn traces_that_do_not_fit_a_full_queue_are_rejected_in_the_answer_not_dropped_silently() {
    // Five open traces at most: a request with ten complete traces releases
    // the oldest five at once. One is evaluated (slowly), one or two wait
    // (the queue and the consumer's hand), and the rest cannot get in
    // within the wait.
    let rejected = fill_the_queue(&["--queue-capacity", "1"]).await;
    assert!((1..=3).contains(&rejected), "{rejected}");
}

#[tokio::test]
async fn traces_past_the_queue_byte_budget_are_rejected_in_the_answer() {
    // Room for a few closed traces by bytes, though the queue has room for
    // a hundred by count.
    let (one, two) = (one_trace_kib().to_string(), (2 * one_trace_kib()).to_string());
    let rejected = fill_the_queue(&["--queue-capacity", "100", "--max-trace-bytes", &one, "--max-queued-bytes", &two]).await;
    assert!((1..=4).contains(&rejected), "{rejected}");
}

#[tokio::test]
async fn an_export_that_needs_room_never_pushes_out_traces_already_acknowledged() {
    // Three traces held open (they would settle only after a minute), one
    // evaluated at a time, slowly, and one queue slot. B's trace pushes A's
    // first out to be evaluated. C's three new traces need A's other two and
    // B's trace out of the way, and there is room for at most two of them
    // (the queue and the consumer's hand): C's spans that found no room are
    // refused in C's answer, and every trace A and B were told was accepted
    // is evaluated.
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let args = [
        "--max-open-traces",
        "3",
        "--settle-ms",
        "60000",
        "--queue-capacity",
        "1",
        "--concurrency",
        "1",
        "--request-timeout-secs",
        "1",
        "--results-jsonl",
        results.to_str().unwrap(),
    ];
    let c = Collector::start_with_env(dir.path(), RULES, &args, &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "1500")]);
    let send = |traces: Vec<u8>| {
        let url = c.url.clone();
        async move {
            let spans = traces.into_iter().flat_map(|t| agent_trace(t, 1, "lookup_order")).collect();
            let r = post(&url, "application/x-protobuf", None, request(spans).encode_to_vec()).await;
            assert_eq!(r.status(), 200);
            ExportResponse::decode(r.bytes().await.unwrap()).unwrap()
        }
    };
    let per_trace = agent_trace(1, 1, "lookup_order").len() as i64;
    assert_eq!(send(vec![1, 2, 3]).await.partial_success, None, "A");
    assert_eq!(send(vec![4]).await.partial_success, None, "B");
    let partial = send(vec![5, 6, 7]).await.partial_success.expect("C is told what did not fit");
    let rejected = partial.rejected_spans / per_trace;
    assert!(
        (1..=2).contains(&rejected) && partial.rejected_spans % per_trace == 0,
        "{partial:?}"
    );
    assert!(
        partial.error_message.contains("--queue-capacity, --max-queued-bytes"),
        "{partial:?}"
    );
    let m = c.metrics().await;
    assert_eq!(
        metric(&m, r#"attest_collect_spans_dropped_total{reason="queue_full"}"#),
        partial.rejected_spans as f64,
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"attest_collect_traces_dropped_total{reason="queue_full"}"#),
        0.0,
        "{m}"
    );
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    let results = read_jsonl(&results);
    let evaluated: std::collections::BTreeSet<String> = results.iter().map(|r| r["trace_id"].as_str().unwrap().to_string()).collect();
    for t in 1..=4u8 {
        let id: String = [t; 16].iter().map(|b| format!("{b:02x}")).collect();
        assert!(evaluated.contains(&id), "trace {t} of A or B was not evaluated: {evaluated:?}");
    }
    assert_eq!(results.len(), (7 - rejected as usize) * 3);
}

#[derive(Clone, PartialEq, prost::Message)]
struct PartialSuccess {
    #[prost(int64, tag = "1")]
    rejected_spans: i64,
    #[prost(string, tag = "2")]
    error_message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExportResponse {
    #[prost(message, optional, tag = "1")]
    partial_success: Option<PartialSuccess>,
}

/// Posts ten complete traces to a collector that holds five open and
/// evaluates one at a time, slowly, with `bounds` on its queue; checks that
/// the traces that did not fit are rejected in the answer and counted, and
/// that every other one is evaluated. Returns how many were rejected.
async fn fill_the_queue(bounds: &[&str]) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let mut args = vec![
        "--max-open-traces",
        "5",
        "--concurrency",
        "1",
        "--request-timeout-secs",
        "2",
        "--results-jsonl",
        results.to_str().unwrap(),
    ];
    args.extend_from_slice(bounds);
    let c = Collector::start_with_env(dir.path(), RULES, &args, &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "1500")]);
    let spans: Vec<_> = (1..=10u8).flat_map(|t| agent_trace(t, 1, "lookup_order")).collect();
    let per_trace = agent_trace(1, 1, "lookup_order").len() as i64;
    let r = post(&c.url, "application/x-protobuf", None, request(spans).encode_to_vec()).await;
    assert_eq!(r.status(), 200);
    let answer = ExportResponse::decode(r.bytes().await.unwrap()).unwrap();
    let partial = answer.partial_success.expect("a partial success");
    let rejected = partial.rejected_spans / per_trace;
    assert!(rejected >= 1 && partial.rejected_spans % per_trace == 0, "{partial:?}");
    assert!(
        partial.error_message.contains("--queue-capacity, --max-queued-bytes"),
        "{partial:?}"
    );
    let m = c.wait_metric("attest_collect_traces_evaluated_total", 1.0, 20).await;
    assert_eq!(
        metric(&m, r#"attest_collect_traces_dropped_total{reason="queue_full"}"#),
        rejected as f64,
        "{m}"
    );
    // Everything not rejected is evaluated: the queued ones now, the open
    // ones when SIGTERM drains them.
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(read_jsonl(&results).len(), (10 - rejected as usize) * 3);
    rejected as usize
}

/// Keys the engine's checks never read are typos in a rules file: the
/// engine refuses them, naming the rule, the place and the keys it reads.
#[test]
fn rules_with_keys_no_check_reads_are_refused_by_the_engine() {
    if crate::support::Evaluator::product() != crate::support::Evaluator::Engine {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 2] = [
        // A misspelt spec key would be ignored, and flip the verdict.
        (
            "rules:\n- name: refunds\n  assertions: [{assertion_id: a, type: content, spec: {target: output.message, check: contains, value: X, case_sensitve: true}}]\n",
            &[
                "rule #1 'refunds': assertions[0].spec.case_sensitve: unknown key `case_sensitve`: this content assertion never reads it",
                "valid choices: case_sensitive, check, soft, target, value)",
            ],
        ),
        (
            "rules:\n- name: refunds\n  assertions: [{assertion_id: a, type: trace, spec: {check: required_tools, tools: [x]}, extra: 1}]\n",
            &["assertions[0].extra: unknown key `extra` in an assertion", "assertion_id, type, spec, request_id"],
        ),
    ];
    for (i, (yaml, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("rules{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let args = ["collect", "--rules", path.to_str().unwrap(), "--otlp-http", "127.0.0.1:0"];
        let mut p = Proc::spawn_on(crate::support::Evaluator::Engine, dir.path(), &format!("typo{i}"), &args, &[]);
        assert_eq!(p.wait_exit(20), 2, "{}", p.stderr_text());
        let err = p.stderr_text();
        for n in *needles {
            assert!(err.contains(n), "{n:?} not in {err}");
        }
    }
}

/// Clients that send requests and never read the answers hold their
/// connections only until a write to them has waited the request deadline:
/// then every place under `--max-connections` is free again, and a
/// well-behaved exporter is served.
#[tokio::test(flavor = "multi_thread")]
async fn clients_that_never_read_their_answers_cannot_lock_exporters_out() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--request-timeout-secs", "1", "--max-connections", "4"]);
    let addr = c.url.trim_start_matches("http://").to_string();
    let mut deaf = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
        // Thousands of pipelined requests whose answers (some MiB) are never read.
        let ask = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").repeat(2000);
        let _ = tokio::time::timeout(Duration::from_secs(5), s.write_all(ask.as_bytes())).await;
        deaf.push(s);
    }
    let started = std::time::Instant::now();
    let served = tokio::time::timeout(
        Duration::from_secs(20),
        post(
            &c.url,
            "application/x-protobuf",
            None,
            request(agent_trace(5, 1, "lookup_order")).encode_to_vec(),
        ),
    )
    .await
    .expect("an exporter locked out by clients that never read");
    assert_eq!(served.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    drop(deaf);
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

/// One attribute nested past the protobuf decoder's recursion limit costs
/// its own depth, not the whole batch: it is clipped, and the request's
/// traces are evaluated.
#[tokio::test]
async fn a_deeply_nested_attribute_is_clipped_not_fatal_to_the_batch() {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue, KeyValueList};
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--settle-ms", "100", "--results-jsonl", results.to_str().unwrap()],
    );
    let mut deep = AnyValue {
        value: Some(any_value::Value::StringValue("bottom".into())),
    };
    for _ in 0..60 {
        deep = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![KeyValue {
                    key: "k".into(),
                    value: Some(deep),
                    ..Default::default()
                }],
            })),
        };
    }
    let mut spans = agent_trace(7, 2, "lookup_order");
    spans[1].attributes.push(KeyValue {
        key: "deep".into(),
        value: Some(deep),
        ..Default::default()
    });
    let r = post(&c.url, "application/x-protobuf", None, request(spans).encode_to_vec()).await;
    assert_eq!(r.status(), 200);
    assert!(crate::support::wait_lines(&results, 3, 20) >= 3, "the trace was evaluated");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}
