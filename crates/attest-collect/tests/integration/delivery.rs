//! How the receiver behaves toward real exporters: retries of the same
//! request, error bodies for every failure, the Authorization scheme,
//! and shutdown with a client stalled mid-upload.

use std::time::{Duration, Instant};

use crate::support::otlp::{agent_trace, request};
use crate::support::{metric, post, read_jsonl, Collector, RULES};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[tokio::test]
async fn an_export_sent_twice_is_assembled_once() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces.jsonl");
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--settle-ms", "3000", "--traces-out", traces.to_str().unwrap()],
    );
    // OTLP delivery is at least once: an exporter whose first attempt timed
    // out sends the same request again.
    let body = request(agent_trace(3, 2, "lookup_order")).encode_to_vec();
    for _ in 0..2 {
        let r = post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body.clone()).await;
        assert_eq!(r.status(), 200);
    }
    let m = c.wait_metric("attest_collect_traces_evaluated_total", 1.0, 20).await;
    assert_eq!(metric(&m, "attest_collect_spans_duplicate_total"), 3.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_spans_received_total"), 6.0, "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    let traces = read_jsonl(&traces);
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0]["steps"].as_array().unwrap().len(), 2, "each tool once: {}", traces[0]);
    assert_eq!(traces[0]["metadata"]["span_count"], 3);
}

#[tokio::test]
async fn the_root_of_a_trace_dropped_without_it_is_a_late_span_not_a_trace_scored_alone() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let c = Collector::start_on(
        crate::support::Evaluator::product(),
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "100",
            "--orphan-timeout-ms",
            "500",
            "--results-jsonl",
            results.to_str().unwrap(),
        ],
        &[],
    );
    // The tool span is exported while the agent (the root) works on a step
    // longer than the orphan timeout; the root comes after it.
    let mut spans = agent_trace(9, 1, "lookup_order");
    let root = spans.remove(0);
    let body = request(spans).encode_to_vec();
    let r = post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
    assert_eq!(r.status(), 200);
    c.wait_metric("attest_collect_traces_dropped_total{reason=\"no_root\"}", 1.0, 20)
        .await;
    let body = request(vec![root]).encode_to_vec();
    let r = post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
    assert_eq!(r.status(), 200);
    let m = c
        .wait_metric("attest_collect_spans_dropped_total{reason=\"late_span\"}", 1.0, 20)
        .await;
    // Well past the settle time: the root alone was not evaluated.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m2 = c.metrics().await;
    assert_eq!(metric(&m2, "attest_collect_traces_evaluated_total"), 0.0, "{m}\n{m2}");
    assert_eq!(
        metric(&m2, "attest_collect_traces_received_total"),
        0.0,
        "no trace closed for evaluation: {m2}"
    );
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
    assert!(read_jsonl(&results).is_empty(), "a partial trace was scored");
}

#[tokio::test]
async fn every_error_answer_is_a_google_rpc_status() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start_with_env(
        dir.path(),
        RULES,
        &["--bearer-token-env", "COLLECT_TOKEN", "--request-timeout-secs", "1"],
        &[("COLLECT_TOKEN", "s3cret")],
    );
    let proto = [("content-type", "application/x-protobuf"), ("authorization", "bearer s3cret")];
    let json = [("content-type", "application/json"), ("authorization", "bearer s3cret")];
    let body = request(agent_trace(4, 1, "lookup_order")).encode_to_vec();

    // A path collect does not serve (OTLP metrics), in the request's encoding.
    let r = post(&c.url, "/v1/metrics", &proto, vec![]).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");
    let s = Status::decode(r.bytes().await.unwrap()).unwrap();
    assert_eq!(s.code, 5, "NOT_FOUND: {s:?}");
    let r = post(&c.url, "/v1/metrics", &json, vec![]).await;
    let s: serde_json::Value = r.json().await.unwrap();
    assert_eq!(s["code"], 5, "{s}");
    // Counted by kind, and said once with what to change.
    let m = c.metrics().await;
    assert_eq!(
        crate::support::metric(&m, "attest_collect_unread_total{kind=\"otlp_metrics\"}"),
        2.0,
        "{m}"
    );
    let r = post(
        &c.url,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        &[("content-type", "application/grpc")],
        vec![],
    )
    .await;
    assert_eq!(r.status(), 404);
    let m = c.metrics().await;
    assert_eq!(
        crate::support::metric(&m, "attest_collect_unread_total{kind=\"grpc_on_http_port\"}"),
        1.0,
        "{m}"
    );
    // A gRPC client speaks HTTP/2 from its first byte: the connection is
    // closed, and counted the same way.
    let addr = c.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await;
    let m = c.metrics().await;
    assert_eq!(
        crate::support::metric(&m, "attest_collect_unread_total{kind=\"grpc_on_http_port\"}"),
        2.0,
        "{m}"
    );

    // Wrong method; the Allow header stays.
    let r = reqwest::get(format!("{}/v1/traces", c.url)).await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().contains_key("allow"));
    assert_eq!(r.headers()["content-type"], "application/json");
    let s: serde_json::Value = r.json().await.unwrap();
    assert_eq!(s["code"], 12, "{s}");

    // An unknown content type gets a JSON Status.
    let r = post(
        &c.url,
        "/v1/traces",
        &[("content-type", "text/plain"), ("authorization", "Bearer s3cret")],
        body.clone(),
    )
    .await;
    assert_eq!(r.status(), 415);
    let s: serde_json::Value = r.json().await.unwrap();
    assert!(
        s["message"].as_str().unwrap().contains("application/x-protobuf, application/json"),
        "{s}"
    );

    // The request deadline's 408.
    let addr = c.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nAuthorization: Bearer s3cret\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("content-type: application/x-protobuf"),
        "{answer}"
    );
    assert!(answer.contains("--request-timeout;"), "{answer}");

    // The Authorization scheme is case-insensitive (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let auth = format!("{scheme} s3cret");
        let r = post(
            &c.url,
            "/v1/traces",
            &[("content-type", "application/x-protobuf"), ("authorization", &auth)],
            body.clone(),
        )
        .await;
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

/// Starts an upload that never finishes.
async fn stalled_upload(url: &str) -> tokio::net::TcpStream {
    let addr = url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head =
        format!("POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n\n");
    s.write_all(head.as_bytes()).await.unwrap();
    // Time for the collector to accept the connection and read the headers
    // (the client cannot see it happen), also on a loaded machine.
    tokio::time::sleep(Duration::from_secs(1)).await;
    s
}

#[tokio::test]
async fn a_stalled_upload_does_not_hold_shutdown_and_a_second_signal_cuts_it_short() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let args = ["--settle-ms", "60000", "--results-jsonl", results.to_str().unwrap()];
    // One SIGTERM: the stalled upload is cut at its upload grace (2 s of no
    // progress), within the drain deadline (5 s) and long before the request
    // deadline (30 s); the trace accepted before is evaluated.
    let c = Collector::start(dir.path(), RULES, &args);
    let body = request(agent_trace(5, 1, "lookup_order")).encode_to_vec();
    let r = post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
    assert_eq!(r.status(), 200);
    let _upload = stalled_upload(&c.url).await;
    let t0 = Instant::now();
    let mut proc = c.proc;
    proc.signal("TERM");
    assert_eq!(proc.wait_exit(20), 0, "{}", proc.stderr_text());
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(read_jsonl(&results).len(), 3, "the accepted trace was evaluated");

    // A second signal ends the wait at once.
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--settle-ms", "60000"]);
    let _upload = stalled_upload(&c.url).await;
    let mut proc = c.proc;
    proc.signal("INT");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    proc.signal("INT");
    assert_eq!(proc.wait_exit(20), 0, "{}", proc.stderr_text());
    // Well under the 5 s the upload would otherwise be given.
    assert!(t0.elapsed() < Duration::from_secs(4), "took {:?}", t0.elapsed());
}

#[tokio::test]
async fn a_second_signal_abandons_slow_evaluations_and_counts_each() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    // Every evaluation takes a minute, and one runs at a time.
    let c = Collector::start_with_env(
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "100",
            "--concurrency",
            "1",
            "--results-jsonl",
            results.to_str().unwrap(),
        ],
        &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "60000")],
    );
    for trace in 1..=3 {
        let body = request(agent_trace(trace, 1, "lookup_order")).encode_to_vec();
        let r = post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
        assert_eq!(r.status(), 200);
    }
    // One is being evaluated; the others settle (100 ms) and wait behind it.
    c.wait_metric("attest_collect_traces_received_total", 1.0, 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut proc = c.proc;
    proc.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    proc.signal("TERM");
    // The drain deadline (5 s) after the second signal, not three minutes.
    assert_eq!(proc.wait_exit(60), 0, "{}", proc.stderr_text());
    let stderr = proc.stderr_text();
    assert!(
        stderr.contains("second signal: 3 traces still queued or being evaluated"),
        "{stderr}"
    );
    assert!(read_jsonl(&results).is_empty(), "an abandoned evaluation stored results");
}

/// Sends the head of a chunked export and its first chunk, leaving the
/// upload open: what the JavaScript exporters send has no Content-Length.
async fn open_chunked_upload(url: &str, body: &[u8]) -> tokio::net::TcpStream {
    let addr = url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    s
}

#[tokio::test]
async fn uploads_without_a_length_reserve_what_they_send_not_the_request_limit() {
    let dir = tempfile::tempdir().unwrap();
    // Room for one request of the largest size in flight, and for many small ones.
    let mib = (1 << 20).to_string();
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--max-request-bytes", &mib, "--max-inflight-bytes", &mib, "--settle-ms", "200"],
    );
    let mut uploads = Vec::new();
    for trace in 1..=10u8 {
        let body = request(agent_trace(trace, 1, "lookup_order")).encode_to_vec();
        uploads.push(open_chunked_upload(&c.url, &body).await);
    }
    // All ten are in flight at once; each ends now and is answered.
    for mut upload in uploads {
        upload.write_all(b"0\r\n\r\n").await.unwrap();
        let mut answer = vec![0u8; 12];
        upload.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&answer));
    }
    let m = c.wait_metric("attest_collect_traces_evaluated_total", 10.0, 20).await;
    assert_eq!(metric(&m, "attest_collect_requests_total{code=\"429\""), 0.0, "{m}");
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}

/// An exporter must read a 429 or 503 to know to retry later. Refused before
/// its body is read, a large upload is still read to the end (and thrown
/// away): closed on an unread upload, the connection would be reset, and
/// the exporter would see a broken pipe where the refusal was (the
/// OpenTelemetry JavaScript exporter then drops the batch).
#[tokio::test]
async fn a_refused_upload_is_read_to_the_end_so_that_the_exporter_sees_the_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collector::start(dir.path(), RULES, &["--max-inflight-requests", "1", "--settle-ms", "200"]);
    // The one request slot is taken by an upload that does not finish.
    let _stalled = stalled_upload(&c.url).await;
    // 8 MiB: far more than the socket buffers take while nobody reads.
    let big = vec![0u8; 8 << 20];
    for _ in 0..3 {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/traces", c.url))
            .header("content-type", "application/x-protobuf")
            .body(big.clone())
            .send()
            .await
            .expect("the refusal is answered, not a reset connection");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers().get("retry-after").unwrap(), "1");
        let status = Status::decode(r.bytes().await.unwrap()).unwrap();
        assert!(status.message.contains("too many export requests in flight"), "{}", status.message);
    }
    let (code, stderr) = c.proc.terminate();
    assert_eq!(code, 0, "{stderr}");
}
