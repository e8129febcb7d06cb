//! Distributed mode against hostile or unlucky messages, on a real
//! nats-server (see `crate::support::nats_server_bin`): trace ids with CR/LF, work
//! messages at the server's max payload, results too large to publish,
//! malformed results, stray results for a trace, work waiting for a free
//! evaluation slot, and a durable consumer created with other flags. Each
//! must end counted and accounted for: evaluated, dead-lettered or dropped
//! with a reason, never a panic or a message stuck in the stream. Also the
//! server's side: a store too small for the streams, and secured servers
//! (credentials, TLS).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{
    free_port, metric, nats_server_bin, read_jsonl, wait_lines, Collector, Evaluator, NatsServer, Proc, RULES, TEST_STORE,
};

fn trace(id: &str) -> serde_json::Value {
    serde_json::json!({
        "schema_version": 1, "trace_id": id, "agent_id": "refund-agent",
        "steps": [{"type": "tool_call", "name": "lookup_order", "args": {}, "result": {}}],
        "output": {"message": "refund sent"}
    })
}

fn work(id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"trace": trace(id), "rules": ["refund-tools"]})).unwrap()
}

fn rules_file(dir: &Path, text: &str) -> String {
    let p = dir.join("rules.yaml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A nats-server in a temporary directory, with the standard rules file
/// beside it; `None` when no nats-server is installed.
/// Tests bind `dir` before `nats`, so that the server stops before its
/// directory is removed.
struct Setup {
    dir: tempfile::TempDir,
    nats: NatsServer,
    rules: String,
}

impl Setup {
    fn start() -> Option<Setup> {
        let bin = nats_server_bin()?;
        let dir = tempfile::tempdir().unwrap();
        let nats = NatsServer::start(&bin, dir.path());
        let rules = rules_file(dir.path(), RULES);
        Some(Setup { nats, dir, rules })
    }
}

/// A worker (`role` evaluate or sink) with `/metrics` on a free port.
fn worker(dir: &Path, name: &str, nats: &str, args: &[&str], env: &[(&str, &str)]) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut p = Proc::spawn(
        dir,
        name,
        &[&["worker", "--nats", nats, "--metrics-addr", &addr][..], args].concat(),
        env,
    );
    p.wait_for(
        if args.contains(&"sink") {
            "writing results from"
        } else {
            "evaluating from"
        },
        20,
    );
    (p, addr)
}

async fn metrics(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap()
}

async fn wait_metric(addr: &str, series: &str, want: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = metrics(addr).await;
        if metric(&m, series) >= want {
            return m;
        }
        assert!(Instant::now() < deadline, "{series} did not reach {want}:\n{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn js(url: &str) -> async_nats::jetstream::Context {
    async_nats::jetstream::new(async_nats::connect(url).await.unwrap())
}

async fn publish(js: &async_nats::jetstream::Context, subject: &str, headers: &[(&str, &str)], payload: Vec<u8>) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), h, payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Messages of the dead-letter stream: (headers, payload length).
async fn dead_letters(js: &async_nats::jetstream::Context) -> Vec<(async_nats::HeaderMap, usize)> {
    let mut stream = js.get_stream("ATTEST_DEAD").await.unwrap();
    let n = stream.info().await.unwrap().state.messages;
    let mut out = Vec::new();
    for seq in 1..=n {
        let m = stream.get_raw_message(seq).await.unwrap();
        out.push((m.headers, m.payload.len()));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_ids_with_line_breaks_are_published_evaluated_and_dead_lettered() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let results = dir.path().join("results.jsonl");
    let common = ["--ack-wait-secs", "3", "--max-deliver", "1"];
    let (sink, _) = worker(
        dir.path(),
        "sink",
        &nats.url,
        &[&["--role", "sink", "--results-jsonl", results.to_str().unwrap()][..], &common[..]].concat(),
        &[],
    );
    let failing = "trc_fail\r\nX-Evil: 1";
    let (mut w, waddr) = worker(
        dir.path(),
        "worker",
        &nats.url,
        &[&["--rules", &rules][..], &common[..]].concat(),
        &[("ATTEST_COLLECT_TEST_FAIL_TRACE", failing)],
    );

    // The collector publishes a --jsonl trace whose id holds CR/LF (raw in
    // a Nats-Msg-Id, it would panic inside async-nats).
    let input = dir.path().join("traces.jsonl");
    let lines = [trace("trc_ok\r\nX-Evil: 1"), trace(failing), trace("trc_plain")];
    std::fs::write(&input, lines.map(|t| t.to_string()).join("\n")).unwrap();
    let mut collector = Proc::spawn(
        dir.path(),
        "collector",
        &[
            &[
                "collect",
                "--rules",
                &rules,
                "--jsonl",
                input.to_str().unwrap(),
                "--nats",
                &nats.url,
            ][..],
            &common[..],
        ]
        .concat(),
        &[],
    );
    assert_eq!(collector.wait_exit(60), 0, "{}", collector.stderr_text());
    assert!(
        collector.stderr_text().contains("3 published (0 already in the stream)"),
        "{}",
        collector.stderr_text()
    );

    assert_eq!(wait_lines(&results, 6, 30), 6);
    let ids: std::collections::HashSet<String> = read_jsonl(&results)
        .iter()
        .map(|r| r["trace_id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.contains("trc_ok\r\nX-Evil: 1") && ids.contains("trc_plain"), "{ids:?}");

    // The failing one is dead-lettered (not stuck), its id escaped in the
    // header and in the log.
    let log = w.wait_for("moved to attest.dead", 30);
    assert!(
        log.contains("trace trc_fail%0D%0AX-Evil:%201 moved to attest.dead (rule refund-tools: test evaluator: provider unavailable)"),
        "{log}"
    );
    assert!(!log.contains("X-Evil: 1"), "a raw id reached the log:\n{log}");
    wait_metric(&waddr, "attest_collect_dead_lettered_total", 1.0).await;
    let dead = dead_letters(&js(&nats.url).await).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0.get("Attest-Trace-Id").unwrap().as_str(), "trc_fail%0D%0AX-Evil:%201");

    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(sink.terminate().0, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn work_waiting_for_a_free_slot_is_not_redelivered_or_dead_lettered() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let results = dir.path().join("results.jsonl");
    // Each evaluation takes 1.5 s, longer than the 1 s ack wait, and two run
    // at a time: the others wait their turn. With --max-deliver 1 a single
    // redelivery would dead-letter a healthy trace.
    let common = ["--ack-wait-secs", "1", "--max-deliver", "1"];
    let (sink, _) = worker(
        dir.path(),
        "sink",
        &nats.url,
        &[&["--role", "sink", "--results-jsonl", results.to_str().unwrap()][..], &common[..]].concat(),
        &[],
    );
    let js = js(&nats.url).await;
    for i in 0..8 {
        publish(&js, "attest.traces", &[], work(&format!("trc_{i}"))).await;
    }
    let (w, waddr) = worker(
        dir.path(),
        "worker",
        &nats.url,
        &[&["--rules", &rules, "--concurrency", "2"][..], &common[..]].concat(),
        &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "1500")],
    );
    assert_eq!(wait_lines(&results, 24, 60), 24);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = metrics(&waddr).await;
    assert_eq!(metric(&m, "attest_collect_redeliveries_total"), 0.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_dead_lettered_total"), 0.0, "{m}");
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("redelivery") && !log.contains("moved to"), "{log}");
    assert!(read_jsonl(&results).iter().all(|r| r["delivery"] == 1));
    assert_eq!(sink.terminate().0, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_message_at_the_max_payload_is_dead_lettered_cut_to_fit() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let (w, waddr) = worker(
        dir.path(),
        "worker",
        &nats.url,
        &["--rules", &rules, "--ack-wait-secs", "3", "--max-deliver", "2"],
        &[],
    );
    let client = async_nats::connect(&nats.url).await.unwrap();
    let max = client.server_info().max_payload;
    let js = async_nats::jetstream::new(client);
    // Fits alone; with the dead-letter headers it is over the limit.
    publish(&js, "attest.traces", &[], vec![b'x'; max - 64]).await;
    wait_metric(&waddr, "attest_collect_dead_lettered_total", 1.0).await;
    let dead = dead_letters(&js).await;
    assert_eq!(dead.len(), 1);
    let (headers, len) = &dead[0];
    assert_eq!(*len, max - 4096);
    assert_eq!(
        headers.get("Attest-Truncated").unwrap().as_str(),
        format!("kept the first {} of {} payload bytes", max - 4096, max - 64)
    );
    assert!(headers.get("Attest-Dead-Reason").unwrap().as_str().starts_with("not a work item"));
    // Named by the work message's place in its stream: a second dead letter
    // of the same message (a worker stopped before its `term`) is dropped as
    // a duplicate.
    assert_eq!(headers.get("Nats-Msg-Id").unwrap().as_str(), "dead:ATTEST_TRACES:1");
    let m = metrics(&waddr).await;
    assert_eq!(
        metric(&m, "attest_collect_traces_dropped_total{reason=\"dead_letter_failed\"}"),
        0.0
    );
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("will be redelivered"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn results_over_the_max_payload_are_dead_lettered_with_the_reason() {
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with(&bin, dir.path(), &format!("{TEST_STORE}max_payload: 2048\n"));
    // Twenty assertions: a results message of about 5 KB for a work message of 200 bytes.
    let assertions: String = (0..20)
        .map(|i| format!("      - {{assertion_id: says-refund-{i}, type: content, spec: {{target: output.message, check: contains, value: refund}}}}\n"))
        .collect();
    let rules = rules_file(
        dir.path(),
        &format!("rules:\n  - name: refund-tools\n    assertions:\n{assertions}"),
    );
    let (w, waddr) = worker(
        dir.path(),
        "worker",
        &nats.url,
        &["--rules", &rules, "--ack-wait-secs", "3", "--max-deliver", "2"],
        &[],
    );
    let js = js(&nats.url).await;
    publish(&js, "attest.traces", &[], work("trc_big")).await;
    wait_metric(&waddr, "attest_collect_dead_lettered_total", 1.0).await;
    let dead = dead_letters(&js).await;
    let reason = dead[0].0.get("Attest-Dead-Reason").unwrap().as_str().to_string();
    assert!(reason.contains("over the server's max_payload of 2048 bytes"), "{reason}");
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(
        log.contains("results of trace trc_big are") && log.contains("over the server's max_payload of 2048 bytes"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_results_are_counted_and_over_long_ids_are_not_stored() {
    let Some(Setup { dir, nats, .. }) = Setup::start() else { return };
    let results = dir.path().join("results.jsonl");
    let (sink, saddr) = worker(
        dir.path(),
        "sink",
        &nats.url,
        &["--role", "sink", "--results-jsonl", results.to_str().unwrap()],
        &[],
    );
    let record = |trace_id: &str, status: &str| {
        serde_json::json!({
            "trace_id": trace_id, "rule": "r", "assertion_id": "a", "type": "trace",
            "status": status, "score": 1.0, "explanation": "", "cost_usd": 0.0, "duration_ms": 0,
            "agent_id": null, "evaluated_at": "2026-01-01T00:00:00.000Z", "delivery": 1
        })
    };
    let js = js(&nats.url).await;
    let long = "t".repeat(300_000);
    for payload in [
        b"hello".to_vec(),
        b"{\"a\":1}".to_vec(),
        serde_json::to_vec(&[record("t1", "bogus")]).unwrap(),
        b"[]".to_vec(),
        serde_json::to_vec(&[record(&long, "pass"), record("t2", "pass")]).unwrap(),
    ] {
        publish(&js, "attest.results", &[], payload).await;
    }
    wait_metric(&saddr, "attest_collect_results_dropped_total{reason=\"id_too_long\"}", 1.0).await;
    // Counted once the batch is stored, after its refusals are.
    let m = wait_metric(&saddr, "attest_collect_traces_evaluated_total", 1.0).await;
    assert_eq!(
        metric(&m, "attest_collect_traces_dropped_total{reason=\"malformed_results\"}"),
        3.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "attest_collect_traces_evaluated_total"),
        1.0,
        "`[]` is no evaluation: {m}"
    );
    let (code, log) = sink.terminate();
    assert_eq!(code, 0, "{log}");
    let stored = read_jsonl(&results);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["trace_id"], "t2");
    assert!(
        log.contains("1 of 2 results in a message not stored (trace_id is 300000 bytes"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stray_results_message_does_not_suppress_the_real_results() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let results = dir.path().join("results.jsonl");
    let (sink, _) = worker(
        dir.path(),
        "sink",
        &nats.url,
        &["--role", "sink", "--results-jsonl", results.to_str().unwrap()],
        &[],
    );
    let (w, _) = worker(dir.path(), "worker", &nats.url, &["--rules", &rules], &[]);
    let js = js(&nats.url).await;
    // Earlier results for the same trace, with the bare trace id as message
    // id: were the real results' id the same, the server would drop them
    // within the duplicate window.
    publish(&js, "attest.results", &[("Nats-Msg-Id", "trc_x")], b"[]".to_vec()).await;
    publish(&js, "attest.traces", &[], work("trc_x")).await;
    assert_eq!(wait_lines(&results, 3, 30), 3);
    assert_eq!(w.terminate().0, 0);
    assert_eq!(sink.terminate().0, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_created_with_other_flags_is_updated_to_this_workers() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let (first, _) = worker(
        dir.path(),
        "first",
        &nats.url,
        &["--rules", &rules, "--max-deliver", "1", "--ack-wait-secs", "7"],
        &[],
    );
    assert_eq!(first.terminate().0, 0);
    let (second, _) = worker(dir.path(), "second", &nats.url, &["--rules", &rules], &[]);
    let js = js(&nats.url).await;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream("ATTEST_TRACES")
        .await
        .unwrap()
        .get_consumer("attest-workers")
        .await
        .unwrap();
    let config = consumer.info().await.unwrap().config.clone();
    assert_eq!((config.max_deliver, config.ack_wait), (6, Duration::from_secs(30)));
    let (code, log) = second.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(
        log.contains(
            "durable consumer attest-workers had max_deliver 2, ack_wait 7 s; updated to this worker's max_deliver 6, ack_wait 30 s"
        ),
        "{log}"
    );
}

#[test]
fn zero_deliveries_and_ack_waits_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, named, want) in [
        ("--max-deliver", "0", "--max-deliver", "out of range; give 1 to 10000"),
        ("--max-deliver", "-3", "--max-deliver", "out of range; give 1 to 10000"),
        ("--ack-wait-secs", "0", "--ack-wait", "out of range; give 1s to 1day"),
        ("--ack-wait", "0s", "--ack-wait", "out of range; give 1s to 1day"),
    ] {
        let mut p = Proc::spawn(
            dir.path(),
            "worker",
            &[
                "worker",
                "--nats",
                "nats://127.0.0.1:1",
                "--rules",
                "r.yaml",
                &format!("{flag}={value}"),
            ],
            &[],
        );
        assert_eq!(p.wait_exit(20), 2);
        let err = p.stderr_text();
        assert!(err.contains(named) && err.contains(want), "{flag}={value}: {err}");
    }
}

#[test]
fn a_server_store_too_small_for_the_streams_is_named_with_the_flag_that_fits_them() {
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Room for three streams of 16 MiB, not for three of the default 1 GiB.
    // (100MB is 100 MiB to nats-server.)
    let nats = NatsServer::start_with(&bin, dir.path(), "jetstream { max_file_store: 100MB }\n");
    let rules = rules_file(dir.path(), RULES);
    let mut refused = Proc::spawn(dir.path(), "refused", &["worker", "--nats", &nats.url, "--rules", &rules], &[]);
    assert_eq!(refused.wait_exit(30), 2);
    let err = refused.stderr_text();
    assert!(
        err.contains("creating JetStream stream ATTEST_TRACES: the server has less room left in its JetStream store than the 1073741824 bytes (--nats-stream-bytes)"),
        "{err}"
    );
    assert!(err.contains("max_file_store"), "{err}");
    assert!(!err.contains("already set aside"), "{err}");
    // 40 MiB each: two fit, the third does not, and the error names what the
    // first two hold (they keep it: a stream that exists keeps its size).
    let mut refused = Proc::spawn(
        dir.path(),
        "refused-third",
        &["worker", "--nats", &nats.url, "--rules", &rules, "--nats-stream-bytes", "41943040"],
        &[],
    );
    assert_eq!(refused.wait_exit(30), 2);
    let err = refused.stderr_text();
    assert!(
        err.contains("creating JetStream stream ATTEST_DEAD: the server has less room left in its JetStream store than the 41943040 bytes (--nats-stream-bytes) the stream sets aside (already set aside by existing streams: ATTEST_TRACES 41943040 bytes, ATTEST_RESULTS 41943040 bytes)"),
        "{err}"
    );
    let (w, _) = worker(
        dir.path(),
        "worker",
        &nats.url,
        &["--rules", &rules, "--nats-stream-bytes", "16777216"],
        &[],
    );
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
}

/// A secured server: a user and password, or a token, in the URL; TLS with
/// the operator's CA. The credentials never appear in what is printed.
#[test]
fn secured_servers_take_credentials_from_the_url_and_tls_from_the_ca_flag() {
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(dir.path(), RULES);
    let conf = format!("{TEST_STORE}authorization {{ user: bob, password: \"s3cr%t\" }}\n");
    let nats = NatsServer::start_with(&bin, dir.path(), &conf);
    let port = nats.port;
    // The password's % is percent-encoded in the URL.
    let with_user = format!("nats://bob:s3cr%25t@127.0.0.1:{port}");
    let (w, _) = worker(dir.path(), "user", &with_user, &["--rules", &rules], &[]);
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    let mut wrong = Proc::spawn(
        dir.path(),
        "wrong",
        &["worker", "--nats", &format!("nats://bob:nope@127.0.0.1:{port}"), "--rules", &rules],
        &[],
    );
    assert_eq!(wrong.wait_exit(30), 2);
    let err = wrong.stderr_text();
    assert!(err.contains(&format!("--nats nats://127.0.0.1:{port}: cannot connect")), "{err}");
    assert!(err.contains("authorization violation"), "{err}");
    assert!(!err.contains("nope") && !log.contains("s3cr"), "credentials are not printed: {err}");
    drop(nats);

    let dir = tempfile::tempdir().unwrap();
    let conf = format!("{TEST_STORE}authorization {{ token: \"t0k3n\" }}\n");
    let nats = NatsServer::start_with(&bin, dir.path(), &conf);
    let port = nats.port;
    let (w, _) = worker(
        dir.path(),
        "token",
        &format!("nats://t0k3n@127.0.0.1:{port}"),
        &["--rules", &rules],
        &[],
    );
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    drop(nats);

    // TLS, with a CA made for the test.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=attest test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    let conf = format!(
        "{TEST_STORE}tls {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
        d.join("server.pem").display(),
        d.join("server.key").display()
    );
    let nats = NatsServer::start_with(&bin, d, &conf);
    let port = nats.port;
    let rules = rules_file(d, RULES);
    let ca = d.join("ca.pem");
    let (w, _) = worker(
        d,
        "tls",
        &format!("tls://127.0.0.1:{port}"),
        &["--rules", &rules, "--nats-tls-ca", ca.to_str().unwrap()],
        &[],
    );
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
    // Without the CA the server's certificate is not trusted.
    let mut untrusted = Proc::spawn(
        d,
        "untrusted",
        &["worker", "--nats", &format!("tls://127.0.0.1:{port}"), "--rules", &rules],
        &[],
    );
    assert_eq!(untrusted.wait_exit(30), 2, "{}", untrusted.stderr_text());
}

/// Prefixes that differ only in case, or in '-' and '_', map to the same
/// stream names: the second is refused instead of sharing streams whose
/// subjects it never uses.
#[test]
fn a_prefix_whose_streams_belong_to_another_prefix_is_refused() {
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let (w, _) = worker(dir.path(), "first", &nats.url, &["--rules", &rules, "--nats-prefix", "team-a"], &[]);
    for other in ["team_a", "TEAM-A"] {
        let mut p = Proc::spawn(
            dir.path(),
            other,
            &["worker", "--nats", &nats.url, "--rules", &rules, "--nats-prefix", other],
            &[],
        );
        assert_eq!(p.wait_exit(30), 2);
        let err = p.stderr_text();
        let subject = format!("{other}.traces");
        assert!(
            err.contains("JetStream stream TEAM_A_TRACES exists with subjects [\"team-a.traces\"]")
                && err.contains(&format!("this --nats-prefix needs subject {subject}"))
                && err.contains("use another --nats-prefix, or remove the stream"),
            "{err}"
        );
    }
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
}

/// A trace the engine refuses (no `schema_version`) fails every rule: the
/// worker dead-letters it with the engine's reason instead of acking it as
/// done, and the valid trace beside it is evaluated.
#[tokio::test(flavor = "multi_thread")]
async fn a_trace_every_rule_fails_on_is_dead_lettered_with_the_reason() {
    if Evaluator::product() != Evaluator::Engine {
        return;
    }
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    let addr = format!("127.0.0.1:{}", free_port());
    let mut w = Proc::spawn_on(
        Evaluator::Engine,
        dir.path(),
        "worker",
        &["worker", "--nats", &nats.url, "--metrics-addr", &addr, "--rules", &rules],
        &[],
    );
    w.wait_for("evaluating from", 30);
    let js = js(&nats.url).await;
    let mut invalid = trace("trc_invalid");
    invalid.as_object_mut().unwrap().remove("schema_version");
    let item = serde_json::json!({"trace": invalid, "rules": ["refund-tools"]});
    publish(&js, "attest.traces", &[], serde_json::to_vec(&item).unwrap()).await;
    publish(&js, "attest.traces", &[], work("trc_valid")).await;
    wait_metric(&addr, "attest_collect_dead_lettered_total", 1.0).await;
    // The valid trace may still be in flight when the invalid one is
    // dead-lettered; once it is evaluated, the invalid one must not count.
    let m = wait_metric(&addr, "attest_collect_traces_evaluated_total", 1.0).await;
    assert_eq!(metric(&m, "attest_collect_traces_evaluated_total"), 1.0, "{m}");
    assert_eq!(metric(&m, "attest_collect_dead_lettered_total"), 1.0, "{m}");
    let dead = dead_letters(&js).await;
    assert_eq!(dead.len(), 1);
    let headers = &dead[0].0;
    assert_eq!(headers.get("Attest-Trace-Id").unwrap().as_str(), "trc_invalid");
    let reason = headers.get("Attest-Dead-Reason").unwrap().as_str().to_string();
    assert!(
        reason.starts_with("rule refund-tools: ") && reason.contains("schema_version"),
        "{reason}"
    );
    let (code, log) = w.terminate();
    assert_eq!(code, 0, "{log}");
}

/// Set-ups that cannot work are refused at start-up, saying what to change:
/// results given to an evaluating worker (the sink writes them), and a
/// server without JetStream.
#[test]
fn a_worker_set_up_wrong_is_told_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(dir.path(), RULES);
    let mut p = Proc::spawn(
        dir.path(),
        "results",
        &[
            "worker",
            "--nats",
            "nats://127.0.0.1:1",
            "--rules",
            &rules,
            "--results-jsonl",
            "r.jsonl",
        ],
        &[],
    );
    assert_eq!(p.wait_exit(20), 2);
    assert!(
        p.stderr_text().contains("give --results-jsonl to the sink instead"),
        "{}",
        p.stderr_text()
    );

    let Some(bin) = nats_server_bin() else { return };
    let server = NatsServer::start_without_jetstream(&bin, dir.path());
    let mut p = Proc::spawn(
        dir.path(),
        "no-jetstream",
        &["worker", "--nats", &server.url, "--rules", &rules],
        &[],
    );
    let code = p.wait_exit(30);
    drop(server);
    assert_eq!(code, 2);
    assert!(
        p.stderr_text().contains("the NATS server has no JetStream; start it with -js"),
        "{}",
        p.stderr_text()
    );
}

/// A collector that publishes evaluates nothing: a rule with an LLM judge
/// loads without a judge provider there (its spec is still checked), and
/// the workers, which evaluate, are the ones that need one.
#[test]
fn a_publishing_collector_needs_no_judge_provider_but_a_worker_does() {
    if Evaluator::product() != Evaluator::Engine {
        return;
    }
    let Some(Setup { dir, nats, .. }) = Setup::start() else { return };
    let judged = "rules:\n  - name: judged\n    assertions:\n      - {assertion_id: polite, type: llm_judge, spec: {target: output.message, criteria: Is it polite?}}\n";
    let rules = rules_file(dir.path(), judged);
    let input = dir.path().join("traces.jsonl");
    std::fs::write(&input, trace("trc_judged").to_string()).unwrap();
    let spawn = |name: &str, args: &[&str]| Proc::spawn_on(Evaluator::Engine, dir.path(), name, args, &[]);
    let mut collector = spawn(
        "collector",
        &[
            "collect",
            "--nats",
            &nats.url,
            "--rules",
            &rules,
            "--jsonl",
            input.to_str().unwrap(),
        ],
    );
    assert_eq!(collector.wait_exit(60), 0, "{}", collector.stderr_text());
    assert!(collector.stderr_text().contains("1 published"), "{}", collector.stderr_text());
    let mut worker = spawn("worker", &["worker", "--nats", &nats.url, "--rules", &rules]);
    assert_eq!(worker.wait_exit(60), 2);
    assert!(
        worker.stderr_text().contains("no LLM judge provider is configured"),
        "{}",
        worker.stderr_text()
    );
    // A spec error is still refused where nothing is evaluated.
    let bad = rules_file(
        dir.path(),
        "rules:\n  - name: judged\n    assertions:\n      - {assertion_id: polite, type: llm_judge, spec: {target: nope, criteria: x}}\n",
    );
    let mut collector = spawn(
        "bad-collector",
        &["collect", "--nats", &nats.url, "--rules", &bad, "--jsonl", input.to_str().unwrap()],
    );
    assert_eq!(collector.wait_exit(60), 2);
    assert!(
        collector
            .stderr_text()
            .contains("assertions[0].spec.target: assertion 'polite' (llm_judge): unsupported target 'nope'"),
        "{}",
        collector.stderr_text()
    );
}

/// While the NATS server is unreachable, a collector that publishes answers
/// exports 503 with `Retry-After`, so that exporters keep their spans and
/// send them again, instead of accepting traces it cannot hand on; once the
/// server is back, exports are accepted again.
#[tokio::test(flavor = "multi_thread")]
async fn exports_are_refused_while_the_nats_server_is_down_and_accepted_when_it_is_back() {
    use prost::Message;
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&bin, dir.path());
    let port = nats.port;
    let c = Collector::start(dir.path(), RULES, &["--nats", &nats.url, "--settle-ms", "200"]);
    let export = |trace: u8| {
        let body = crate::support::otlp::request(crate::support::otlp::agent_trace(trace, 1, "lookup_order")).encode_to_vec();
        crate::support::post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body)
    };
    assert_eq!(export(1).await.status(), 200);
    drop(nats);
    // The client notices the closed connection at once; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = export(2).await;
        if r.status() == 503 {
            assert_eq!(r.headers().get("retry-after").unwrap(), "2");
            let body = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
            assert!(body.contains("the NATS server is unreachable"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "still {} with the server down", r.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _nats = NatsServer::start_on_port(&bin, dir.path(), TEST_STORE, port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while export(3).await.status() != 200 {
        assert!(Instant::now() < deadline, "exports still refused after the server came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = c.metrics().await;
    assert!(
        metric(&m, "attest_collect_requests_total{code=\"503\",encoding=\"protobuf\"}") >= 1.0,
        "{m}"
    );
    let (code, log) = c.proc.terminate();
    assert_eq!(code, 0, "{log}");
}

/// Traces accepted while the server was up, still open when it goes away:
/// the drain fails their publishes at once instead of waiting 10 s for each,
/// counts them, and exits 1, since acknowledged traces were lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_with_the_nats_server_gone_fails_fast_and_exits_1() {
    use prost::Message;
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&bin, dir.path());
    // Settled only at shutdown, one publish at a time: 10 s each would be 80 s.
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--nats", &nats.url, "--settle-ms", "600000", "--concurrency", "1"],
    );
    for trace in 1..=8 {
        let body = crate::support::otlp::request(crate::support::otlp::agent_trace(trace, 1, "lookup_order")).encode_to_vec();
        let r = crate::support::post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
        assert_eq!(r.status(), 200);
    }
    drop(nats);
    // Until the client has noticed, exports are still answered 200.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = crate::support::otlp::request(crate::support::otlp::agent_trace(99, 1, "lookup_order")).encode_to_vec();
        let r = crate::support::post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
        if r.status() == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "still {} with the server down", r.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    let (code, log) = c.proc.terminate();
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}: {log}", t0.elapsed());
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("0 published, 8 publishes failed"), "{log}");
}

/// A `--jsonl` run whose NATS server goes away part-way fails the lines left
/// at once, instead of waiting 10 s for each publish's acknowledgement,
/// counts them, and exits 1 (run again, it publishes only what is missing:
/// the stream's duplicate window drops the rest).
#[tokio::test(flavor = "multi_thread")]
async fn a_jsonl_run_whose_nats_server_goes_away_fails_the_rest_fast_and_exits_1() {
    use std::io::Write;
    let Some(Setup { dir, nats, rules }) = Setup::start() else { return };
    // The engine logs the NATS client's events; the harness does not.
    if Evaluator::product() != Evaluator::Engine {
        return;
    }
    // A FIFO, so that the test decides when the rest of the input comes.
    let input = dir.path().join("traces.fifo");
    assert!(std::process::Command::new("mkfifo").arg(&input).status().unwrap().success());
    let input_arg = input.to_str().unwrap();
    let args = [
        "collect",
        "--rules",
        &rules,
        "--jsonl",
        input_arg,
        "--nats",
        &nats.url,
        "--concurrency",
        "1",
    ];
    let mut collector = Proc::spawn_on(Evaluator::Engine, dir.path(), "collector", &args, &[]);
    // Opening a FIFO to write waits for its reader: the collector, once connected.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = input.clone();
    std::thread::spawn(move || tx.send(std::fs::OpenOptions::new().write(true).open(path)));
    let mut fifo = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the collector did not open its input: {}", collector.stderr_text()))
        .unwrap();
    writeln!(fifo, "{}\n{}", trace("trc_1"), trace("trc_2")).unwrap();
    let js = js(&nats.url).await;
    let published = || async { js.get_stream("ATTEST_TRACES").await.unwrap().info().await.unwrap().state.messages };
    let deadline = Instant::now() + Duration::from_secs(30);
    while published().await < 2 {
        let log = collector.stderr_text();
        assert!(Instant::now() < deadline, "the first two traces were not published: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(nats);
    collector.wait_for("event: disconnected", 20);
    for i in 3..=8 {
        writeln!(fifo, "{}", trace(&format!("trc_{i}"))).unwrap();
    }
    drop(fifo);
    // Waiting for acknowledgements, one publish at a time, would take 60 s.
    let t0 = Instant::now();
    let code = collector.wait_exit(90);
    let log = collector.stderr_text();
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}: {log}", t0.elapsed());
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("2 published (0 already in the stream), 6 publishes failed"), "{log}");
    assert!(log.contains("not published: the NATS server is unreachable"), "{log}");
}

/// A full JetStream store: the collector never answers 200 for a trace it
/// then drops. Refused publishes keep their traces and the receiver answers
/// 503 (with the reason) until the store has room; then every trace that
/// was answered 200 reaches the stream.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_stream_turns_exports_to_503_and_loses_no_accepted_trace() {
    use async_nats::jetstream::consumer;
    use futures::StreamExt;
    use prost::Message;
    let Some(bin) = nats_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&bin, dir.path());
    let c = Collector::start(
        dir.path(),
        RULES,
        &["--nats", &nats.url, "--settle-ms", "100", "--nats-stream-bytes", "1048576"],
    );
    // About 40 KB each: the 1 MiB work stream holds some 25.
    let tool = "t".repeat(4000);
    let mut accepted = std::collections::BTreeSet::new();
    let mut refused = None;
    for trace in 1..=200u8 {
        let body = crate::support::otlp::request(crate::support::otlp::agent_trace(trace, 10, &tool)).encode_to_vec();
        let r = crate::support::post(&c.url, "/v1/traces", &[("content-type", "application/x-protobuf")], body).await;
        match r.status().as_u16() {
            200 => {
                accepted.insert(trace);
            }
            503 => {
                assert!(r.headers().get("retry-after").is_some());
                refused = Some(String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned());
                break;
            }
            other => panic!("export of trace {trace}: HTTP {other}"),
        }
        // Let each trace settle and be offered to the stream in turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let refused = refused.expect("a full stream never turned exports away");
    assert!(refused.contains("not taking traces"), "{refused}");
    assert!(accepted.len() >= 20, "only {} accepted before the stream filled", accepted.len());
    // Room is made: a consumer takes (and so removes) the work messages.
    let js = js(&nats.url).await;
    let stream = js.get_stream("ATTEST_TRACES").await.unwrap();
    let taker: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("attest-workers".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < accepted.len() && Instant::now() < deadline {
        let mut batch = taker
            .fetch()
            .max_messages(50)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            let item: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            seen.insert(item["trace"]["trace_id"].as_str().unwrap().to_owned());
            m.ack().await.unwrap();
        }
    }
    let m = c.metrics().await;
    assert_eq!(seen.len(), accepted.len(), "traces answered 200 never reached the stream; {m}");
    assert_eq!(
        metric(&m, "attest_collect_traces_dropped_total{reason=\"publish_failed\"}"),
        0.0,
        "{m}"
    );
    assert!(metric(&m, "attest_collect_publish_retries_total") >= 1.0, "{m}");
    let (code, log) = c.proc.terminate();
    assert_eq!(code, 0, "{log}");
}

/// A judge that answers every call with a 500.
fn failing_judge() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 65536];
                // Read the request (headers and body arrive together here).
                let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
                let _ = conn.read(&mut buf);
                let body = r#"{"error":{"message":"the judge is overloaded"}}"#;
                let _ = write!(
                    conn,
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    format!("http://{addr}/v1")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trace_whose_judge_keeps_failing_keeps_its_built_in_results_and_its_dead_letter_says_why_each_time() {
    if crate::support::engine_bin().is_none() {
        attest_test_support::missing::<()>(
            "ATTEST_ENGINE_BIN is not set",
            "set it to target/debug/attest-engine (scripts/test does)",
        );
        return;
    }
    let Some(s) = Setup::start() else { return };
    let dir = s.dir.path();
    // Every built-in check passes, so the judge is asked (a failed one
    // would short-circuit it).
    let rules = rules_file(
        dir,
        r#"
rules:
  - name: refund-tools
    match: {agent_id: refund-agent}
    assertions:
      - {assertion_id: uses-lookup, type: trace, spec: {check: required_tools, tools: [lookup_order]}}
      - {assertion_id: says-refund, type: content, spec: {target: output.message, check: contains, value: refund}}
      - {assertion_id: polite, type: llm_judge, spec: {target: output.message, rubric: tone}}
"#,
    );
    let results = dir.join("results.jsonl");
    let judge = failing_judge();
    let env = [
        ("ATTEST_JUDGE_BASE_URL", judge.as_str()),
        ("ATTEST_JUDGE_API_KEY", "test-key"),
        ("ATTEST_PROVIDER_CACHE", "false"),
    ];
    let common = ["--nats", s.nats.url.as_str(), "--ack-wait-secs", "30", "--max-deliver", "3"];
    let mut sink = Proc::spawn_on(
        Evaluator::Engine,
        dir,
        "sink",
        &[
            &["worker", "--role", "sink", "--results-jsonl", results.to_str().unwrap()][..],
            &common,
        ]
        .concat(),
        &[],
    );
    sink.wait_for("writing results from", 30);
    let mut w = Proc::spawn_on(
        Evaluator::Engine,
        dir,
        "worker",
        &[&["worker", "--rules", &rules][..], &common].concat(),
        &env,
    );
    w.wait_for("evaluating from", 30);
    let input = dir.join("traces.jsonl");
    std::fs::write(&input, format!("{}\n", trace("trc_poison"))).unwrap();
    let mut c = Proc::spawn_on(
        Evaluator::Engine,
        dir,
        "collector",
        &[&["collect", "--rules", &rules, "--jsonl", input.to_str().unwrap()][..], &common].concat(),
        &[],
    );
    assert_eq!(c.wait_exit(60), 0, "{}", c.stderr_text());
    let log = w.wait_for("trace trc_poison moved to attest.dead", 120);
    // The built-in assertions' results are stored, once; the judge's is not.
    assert_eq!(wait_lines(&results, 2, 30), 2);
    std::thread::sleep(Duration::from_secs(1));
    let stored = read_jsonl(&results);
    let mut ids: Vec<&str> = stored.iter().map(|r| r["assertion_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["says-refund", "uses-lookup"], "{stored:?}");
    let dead = dead_letters(&js(&s.nats.url).await).await;
    assert_eq!(dead.len(), 1, "{log}");
    let errors: Vec<String> = serde_json::from_str(dead[0].0.get("Attest-Attempt-Errors").unwrap().as_str()).unwrap();
    assert_eq!(errors.len(), 3, "one error per attempt: {errors:?}");
    for (i, e) in errors.iter().enumerate() {
        assert!(e.starts_with(&format!("attempt {}: ", i + 1)), "{errors:?}");
        assert!(e.contains("500") || e.contains("overloaded"), "{errors:?}");
    }
    assert!(
        dead[0].0.get("Attest-Dead-Reason").unwrap().as_str().contains("rule refund-tools"),
        "{:?}",
        dead[0].0
    );
    let (code, _) = w.terminate();
    assert_eq!(code, 0);
    let (code, _) = sink.terminate();
    assert_eq!(code, 0);
}
