//! The front doors that are not the stdio server, through the real binary:
//! `collect` re-scoring a JSONL file of traces with the engine's own checks,
//! idempotently, into the result history that `query_drift` reads.

use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

const RULES: &str = r#"
rules:
  - name: refund-flow
    match:
      agent_id: refund-agent
    sample_rate: 1.0
    assertions:
      - assertion_id: ordered
        type: trace
        spec: {check: contains_in_order, tools: [lookup_order, process_refund]}
      - assertion_id: mentions-refund
        type: content
        spec: {target: output.message, check: contains, value: refund}
      - assertion_id: amount-schema
        type: schema
        spec: {target: "steps[?name=='process_refund'].args", schema: {type: object, required: [amount]}}
"#;

fn trace(id: &str, tools: &[&str], message: &str) -> Value {
    let steps: Vec<Value> = tools
        .iter()
        .map(|t| json!({"type": "tool_call", "name": t, "args": {"order_id": "ORD-1", "amount": 5}}))
        .collect();
    json!({"schema_version": 1, "trace_id": id, "agent_id": "refund-agent", "steps": steps, "output": {"message": message}})
}

fn collect(dir: &Path, args: &[&str]) -> std::process::Output {
    collect_env(dir, args, &[])
}

fn collect_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = command();
    cmd.args(["--log-level=warn", "collect", "--otlp-http", "127.0.0.1:0"])
        .args(args)
        .env("ATTEST_CACHE_DIR", dir.join("cache"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running attest-engine collect")
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn collect_rescoring_uses_the_engines_checks_and_counts_each_result_once() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let traces = dir.path().join("traces.jsonl");
    let good = trace("t-good", &["lookup_order", "process_refund"], "Your refund is on its way.");
    let bad = trace("t-bad", &["process_refund", "lookup_order"], "Done.");
    std::fs::write(&traces, format!("{good}\n{bad}\n")).unwrap();
    let results = dir.path().join("results.jsonl");
    let args = [
        "--rules",
        rules.to_str().unwrap(),
        "--jsonl",
        traces.to_str().unwrap(),
        "--results-jsonl",
        results.to_str().unwrap(),
    ];
    for _ in 0..2 {
        let out = collect(dir.path(), &args);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.is_empty(), "collect writes nothing on stdout");
    }
    let rows = lines(&results);
    assert_eq!(rows.len(), 6, "3 assertions x 2 traces, once each despite two runs: {rows:?}");
    let status = |t: &str, a: &str| {
        rows.iter()
            .find(|r| r["trace_id"] == t && r["assertion_id"] == a)
            .map(|r| r["status"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(status("t-good", "ordered"), "pass");
    assert_eq!(status("t-bad", "ordered"), "hard_fail");
    assert_eq!(status("t-bad", "mentions-refund"), "hard_fail");
    assert_eq!(status("t-bad", "amount-schema"), "pass");
    let bad_ordered = rows
        .iter()
        .find(|r| r["trace_id"] == "t-bad" && r["assertion_id"] == "ordered")
        .unwrap();
    assert!(
        bad_ordered["explanation"].as_str().unwrap().contains("process_refund"),
        "{bad_ordered}"
    );
    assert_eq!(bad_ordered["rule"], "refund-flow");

    // The history holds each result once, under <rule>/<assertion_id>.
    let mut e = Engine::spawn_env(
        &["--log-level=warn"],
        Stderr::Drain,
        &[("ATTEST_CACHE_DIR", dir.path().join("cache").to_str().unwrap())],
    );
    e.initialize();
    let r = e.request(&rpc(json!("d"), "query_drift", json!({"assertion_id": "refund-flow/ordered"})));
    let report = expect_result(&r)["report"].clone();
    assert_eq!(report["count"], json!(2), "{r}");
}

#[test]
fn a_rules_file_with_a_bad_assertion_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - name: typo\n    assertions:\n      - {assertion_id: a, type: content, spec: {target: output.message, check: contians, value: x}}\n",
    )
    .unwrap();
    let traces = dir.path().join("t.jsonl");
    std::fs::write(&traces, "").unwrap();
    let out = collect(
        dir.path(),
        &["--rules", rules.to_str().unwrap(), "--jsonl", traces.to_str().unwrap()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("typo") && err.contains("check") && err.contains("regex_match"),
        "{err}"
    );
}

#[test]
fn every_front_door_parses_its_options() {
    // Global engine flags and front-door options share one command line:
    // a clash (two `--report`s) would only show when the command is used.
    for cmd in [
        &["serve", "--help"][..],
        &["eval", "--help"],
        &["collect", "--help"],
        &["worker", "--help"],
        &["ecp", "run", "--help"],
        &["ecp", "validate", "--help"],
        &["ecp", "conformance", "--help"],
        &["ecp", "init", "--help"],
        &["ecp", "trend", "--help"],
        &["plugin", "check", "--help"],
    ] {
        let out = run(cmd);
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Each subcommand's help lists only the flags it takes.
    for (cmd, absent) in [
        (
            &["plugin", "check", "--help"][..],
            &[
                "--plugin ",
                "--plugin-dir",
                "--max-concurrent-requests",
                "--no-history",
                "--eval-timeout",
            ][..],
        ),
        (&["plugin", "new", "--help"], &["--config", "--log-level", "--plugin "]),
        (&["collect", "--help"], &["--max-concurrent-requests", "--report "]),
        (&["view", "--help"], &["--plugin ", "--eval-timeout", "--no-history"]),
        (
            &["calibrate", "--help"],
            &["--plugin ", "--no-history", "--max-concurrent-requests"],
        ),
        (&["version", "--help"], &["--config", "--log-level"]),
    ] {
        let out = run(cmd);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd:?}");
        for flag in absent {
            assert!(!help.contains(flag), "{cmd:?} lists {flag}:\n{help}");
        }
    }
    // ...and the parser refuses the others, with exit 2.
    for cmd in [
        &["plugin", "test", "a.wasm", "--trace", "t.json", "--plugin", "b.wasm"][..],
        &["plugin", "new", "demo", "--lang", "rust", "--plugin", "b.wasm"],
        &["plugin", "check", "a.wasm", "--no-history"],
        &["collect", "--rules", "r.yaml", "--max-concurrent-requests", "4"],
        &["--log-level", "loud", "version"],
        &["eval", "-v", "-q", "--trace", "t.json", "--assertions", "a.json"],
    ] {
        let out = run(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
        assert!(stderr.contains("error:"), "{cmd:?}: {stderr}");
    }
    // The server's plugin flags given before a plugin subcommand (where the
    // server would take them) are refused, not ignored.
    let out = run(&["--plugin-dir", "plugins", "plugin", "check", "a.wasm"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--plugin and --plugin-dir choose the plugins a server loads"),
        "{stderr}"
    );
    // A listen address may name a host; one that is neither is refused with
    // the forms that work.
    let out = run(&["collect", "--rules", "missing.yaml", "--otlp-http", "no-such-address"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("give IP:PORT (127.0.0.1:4318, [::1]:4318) or HOST:PORT (localhost:4318)"),
        "{stderr}"
    );
    let out = run(&["collect", "--rules", "missing.yaml", "--otlp-http", "localhost:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rules file missing.yaml"), "the address was accepted: {stderr}");
    // A negative number is a bad value of its option, not an unknown flag.
    for (cmd, flag) in [
        (
            &["collect", "--rules", "r.yaml", "--max-trace-bytes", "-1"][..],
            "--max-trace-bytes",
        ),
        (&["worker", "--nats", "nats://x", "--concurrency", "-2"], "--concurrency"),
        (&["--max-concurrent-requests", "-3"], "--max-concurrent-requests"),
        (&["ecp", "trend", "r-*.json", "--window", "-1"], "--window"),
    ] {
        let out = run(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Usage errors exit 2, or 1 under `ecp` as its reference runtime does.
        let usage = if cmd[0] == "ecp" { 1 } else { 2 };
        assert_eq!(out.status.code(), Some(usage), "{cmd:?}: {stderr}");
        assert!(stderr.contains("invalid value '-") && stderr.contains(flag), "{cmd:?}: {stderr}");
    }
}

#[test]
fn an_unreachable_nats_server_is_named_once_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let out = run(&[
        "--no-history",
        "worker",
        "--nats",
        "nats://127.0.0.1:1",
        "--rules",
        rules.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("--nats nats://127.0.0.1:1: cannot connect"), "{stderr}");
    assert_eq!(stderr.matches("Connection refused").count(), 1, "the reason is said once: {stderr}");
}

#[test]
fn commands_that_read_no_engine_configuration_run_whatever_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("tone-check");
    // A missing config file and a bad log level stop the engine, not these.
    let out = command()
        .env("ATTEST_CONFIG", dir.path().join("missing.toml"))
        .env("ATTEST_LOG_LEVEL", "bogus")
        .args(["plugin", "new", "tone-check", "--lang", "js", "--dir"])
        .arg(&project)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(project.join("README.md").is_file());
    let out = command()
        .env("ATTEST_CONFIG", dir.path().join("missing.toml"))
        .arg("version")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("attest-engine "));
    // The engine itself still refuses the broken configuration.
    let out = command()
        .env("ATTEST_CONFIG", dir.path().join("missing.toml"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configuration error"));
    // `ecp init` grades nothing and needs none of it; `ecp run` refuses it
    // with its usage code, 1 (2 is for failed checks).
    let starter = dir.path().join("ecp_eval");
    let out = command()
        .env("ATTEST_CONFIG", dir.path().join("missing.toml"))
        .args(["ecp", "init", starter.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = command()
        .env("ATTEST_CONFIG", dir.path().join("missing.toml"))
        .args(["ecp", "run", "-m", starter.join("manifest.yaml").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configuration error"));
}

/// The fake judge's answers after a pause, each billed 2,000 + 300 tokens
/// ($0.0064 at gpt-4.1's prices).
struct PricedJudge;

impl wiremock::Respond for PricedJudge {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let text = fake_provider::answer(&body, 0.9, "fine");
        wiremock::ResponseTemplate::new(200)
            .set_body_json(json!({
                "choices": [{"message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 2000, "completion_tokens": 300}
            }))
            .set_delay(std::time::Duration::from_millis(200))
    }
}

#[test]
fn a_rules_daily_budget_holds_with_many_traces_in_flight() {
    let fake = fake_provider::Fake::start();
    fake.mount(wiremock::Mock::given(wiremock::matchers::path("/v1/chat/completions")).respond_with(PricedJudge));
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    let budget = 0.005;
    std::fs::write(
        &rules,
        format!("rules:\n  - name: judged\n    budget: {{usd_per_day: {budget}}}\n    assertions:\n      - {{assertion_id: j, type: llm_judge, spec: {{rubric: helpfulness}}}}\n"),
    )
    .unwrap();
    let traces = dir.path().join("traces.jsonl");
    let text: String = (0..40)
        .map(|i| format!("{}\n", trace(&format!("t{i}"), &["lookup_order"], "Your refund is on its way.")))
        .collect();
    std::fs::write(&traces, text).unwrap();
    let results = dir.path().join("results.jsonl");
    let out = command()
        .args(["--log-level=warn", "collect", "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "off"])
        .args(["--rules", rules.to_str().unwrap(), "--jsonl", traces.to_str().unwrap()])
        .args(["--results-jsonl", results.to_str().unwrap(), "--concurrency", "16"])
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .env("ATTEST_JUDGE_BASE_URL", fake.v1())
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let rows = lines(&results);
    let spent: f64 = rows.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum();
    let calls = fake.requests().len();
    assert!(!rows.is_empty() && rows.len() < 40, "{} of 40 traces judged", rows.len());
    assert_eq!(calls, rows.len(), "every call sent is a result counted");
    // One evaluation's worst case at gpt-4.1's prices: a prompt of a few KiB
    // and 400 reply tokens is under $0.02.
    assert!(
        spent <= budget + 0.02,
        "{calls} calls spent ${spent:.4} against a ${budget} day with 16 traces in flight"
    );
}

#[test]
fn collect_writes_a_shared_postgres_history_once_per_result() {
    let Some(pg) = attest_test_support::PostgresServer::start() else {
        return;
    };
    let url = pg.database("attest");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let traces = dir.path().join("traces.jsonl");
    let good = trace("t-good", &["lookup_order", "process_refund"], "Your refund is on its way.");
    let bad = trace("t-bad", &["process_refund", "lookup_order"], "Done.");
    std::fs::write(&traces, format!("{good}\n{bad}\n")).unwrap();
    let args = ["--rules", rules.to_str().unwrap(), "--jsonl", traces.to_str().unwrap()];
    let run = |url: &str| collect_env(dir.path(), &args, &[("ATTEST_HISTORY_URL", url)]);
    for _ in 0..2 {
        let out = run(&url);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(
        pg.psql(
            "attest",
            "SELECT trace_id || ' ' || assertion_id || ' ' || status FROM attest_results ORDER BY trace_id, assertion_id"
        ),
        "t-bad refund-flow/amount-schema pass\nt-bad refund-flow/mentions-refund hard_fail\nt-bad refund-flow/ordered hard_fail\n\
         t-good refund-flow/amount-schema pass\nt-good refund-flow/mentions-refund pass\nt-good refund-flow/ordered pass\n",
        "each result once, across two runs"
    );
    let mut e = Engine::spawn_env(&["--log-level=warn"], Stderr::Drain, &[("ATTEST_HISTORY_URL", &url)]);
    e.initialize();
    let r = e.request(&rpc(json!("d"), "query_drift", json!({"assertion_id": "refund-flow/ordered"})));
    assert_eq!(expect_result(&r)["report"]["count"], json!(2), "{r}");
    // A service told to record results does not start without its store.
    let out = run("postgres://attest:s3cret@127.0.0.1:9/attest");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open the result history postgres://attest:***@127.0.0.1:9/attest") && err.contains("--no-history"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}
