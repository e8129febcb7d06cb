//! `--export-otlp`: every result as a `gen_ai.evaluation.result` log record,
//! received by a real OTLP receiver built on the opentelemetry-proto Python
//! package (`tests/python/otlp_logs_receiver.py`), over OTLP/HTTP and
//! OTLP/gRPC. Traces come from a real OpenTelemetry pipeline (the openai
//! client instrumented by the GenAI instrumentation, `tests/python/agent.py`)
//! and are scored by `attest-engine collect`. Checks every field of every
//! event and its parenting (the trace's id, and the span of the step an
//! assertion points at, else the agent's); then kills the backend mid-run
//! and checks the losses are bounded and counted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::{read_jsonl, Collector, Evaluator};
use serde_json::Value;

/// The support rules, and one assertion that points at a step: the tool
/// call `forbidden_tools` finds.
fn rules() -> String {
    format!(
        "{}      - {{assertion_id: no-lookup, type: trace, spec: {{check: forbidden_tools, tools: [lookup_order]}}}}\n",
        crate::support::RULES
    )
}

fn venv_python() -> Option<PathBuf> {
    match std::env::var("COLLECT_TEST_VENV") {
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v).join("bin/python")),
        _ => attest_test_support::missing(
            "COLLECT_TEST_VENV is not set, so the OTLP export tests did not run",
            "scripts/test makes the venv (target/collect-venv) and sets it",
        ),
    }
}

struct Receiver {
    child: Child,
    http: u16,
    grpc: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(python: &Path, dir: &Path) -> Receiver {
        let out = dir.join("events.jsonl");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/otlp_logs_receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.len(), 4, "{line:?}");
        Receiver {
            child,
            http: words[1].parse().unwrap(),
            grpc: words[3].parse().unwrap(),
            out,
        }
    }

    fn events(&self) -> Vec<Value> {
        read_jsonl(&self.out)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn export_over(protocol: &str) {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(&python, dir.path());
    let endpoint = match protocol {
        "grpc" => format!("http://127.0.0.1:{}", receiver.grpc),
        _ => format!("http://127.0.0.1:{}", receiver.http),
    };
    let results = dir.path().join("results.jsonl");
    let traces = dir.path().join("traces.jsonl");
    let collector = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        &rules(),
        &[
            "--settle-ms",
            "300",
            "--results-jsonl",
            results.to_str().unwrap(),
            "--traces-out",
            traces.to_str().unwrap(),
            "--export-otlp",
            &endpoint,
            "--export-otlp-protocol",
            protocol,
        ],
        &[],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/agent.py");
    let out = Command::new(&python)
        .arg(&script)
        .args(["genai", &collector.url, "3"])
        .env("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        .output()
        .expect("run the instrumented agent");
    assert!(out.status.success(), "agent failed: {}", String::from_utf8_lossy(&out.stderr));
    collector.wait_metric("attest_collect_traces_evaluated_total", 3.0, 30).await;
    // The drain sends what the exporter holds before the process exits.
    let metrics = collector.wait_metric("attest_export_events_sent_total", 12.0, 30).await;
    assert_eq!(
        crate::support::metric(&metrics, "attest_export_events_failed_total"),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        crate::support::metric(&metrics, "attest_export_events_dropped_total"),
        0.0,
        "{metrics}"
    );
    let (code, stderr) = collector.proc.terminate();
    assert_eq!(code, 0, "{stderr}");

    let traces = read_jsonl(&traces);
    let results = read_jsonl(&results);
    let events = receiver.events();
    assert_eq!(results.len(), 12, "3 traces x 4 assertions");
    assert_eq!(events.len(), 12, "{events:#?}");
    for r in &results {
        let name = format!("refund-tools/{}", r["assertion_id"].as_str().unwrap());
        let trace_id = r["trace_id"].as_str().unwrap();
        let e = events
            .iter()
            .find(|e| e["attributes"]["gen_ai.evaluation.name"] == name.as_str() && e["attributes"]["attest.trace_id"] == trace_id)
            .unwrap_or_else(|| panic!("no event for {name} on {trace_id}: {events:#?}"));
        assert_eq!(e["transport"], protocol);
        assert_eq!(e["event_name"], "gen_ai.evaluation.result");
        assert_eq!(e["scope"], "attest-engine");
        assert_eq!(e["resource"]["service.name"], "attest-engine");
        assert_eq!(e["resource"]["attest.front_door"], "collect");
        let a = &e["attributes"];
        assert_eq!(a["gen_ai.evaluation.score.value"], r["score"]);
        assert_eq!(a["gen_ai.evaluation.score.label"], r["status"]);
        assert_eq!(a["gen_ai.evaluation.explanation"], r["explanation"]);
        assert!(a.get("error.type").is_none(), "{e}");
        assert!(e["time_unix_nano"].as_u64().unwrap() > 0);
        // Parenting: the OpenTelemetry trace the spans came in, and the
        // span the result is about.
        assert_eq!(e["trace_id"].as_str().unwrap().len(), 32, "{e}");
        assert_eq!(e["trace_id"], trace_id, "the record joins the evaluated trace");
        let t = traces.iter().find(|t| t["trace_id"] == trace_id).unwrap();
        let expected_span = if r["assertion_id"] == "no-lookup" {
            // forbidden_tools points at the tool call it found.
            let steps = t["steps"].as_array().unwrap();
            let tool = steps.iter().find(|s| s["name"] == "lookup_order").unwrap();
            tool["metadata"]["span_id"].clone()
        } else {
            t["metadata"]["span_id"].clone()
        };
        assert_eq!(e["span_id"], expected_span, "{e}\n{t:#}");
        assert_eq!(e["span_id"].as_str().unwrap().len(), 16);
        let failed = r["status"] != "pass";
        assert_eq!(
            e["severity_number"],
            if failed { 13 } else { 9 },
            "WARN for failures, INFO for passes"
        );
    }
}

#[tokio::test]
async fn results_reach_an_otlp_http_backend_as_genai_evaluation_events() {
    export_over("http").await;
}

#[tokio::test]
async fn results_reach_an_otlp_grpc_backend_as_genai_evaluation_events() {
    export_over("grpc").await;
}

/// The backend dies mid-run: what it did not take is counted as lost,
/// and the evaluation itself is not held up.
#[tokio::test]
async fn a_backend_killed_mid_run_loses_events_only_within_the_bounds_and_counts_them() {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(&python, dir.path());
    let input = dir.path().join("traces.jsonl");
    let n = 6_000;
    let lines: String = (0..n)
        .map(|i| {
            format!(
                "{{\"schema_version\":1,\"trace_id\":\"trc_{i}\",\"agent_id\":\"refund-agent\",\"steps\":[{{\"type\":\"tool_call\",\"name\":\"lookup_order\"}}],\"output\":{{\"message\":\"refund sent\"}}}}\n"
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, self::rules()).unwrap();
    let bin = std::env::var("ATTEST_ENGINE_BIN").ok().filter(|b| !b.is_empty());
    let Some(bin) =
        bin.or_else(|| attest_test_support::missing("ATTEST_ENGINE_BIN is not set", "scripts/test builds the engine and sets it"))
    else {
        return;
    };
    let collect = Command::new(&bin)
        .args(["--log-level=warn", "--no-history", "collect"])
        .arg("--rules")
        .arg(&rules)
        .arg("--jsonl")
        .arg(&input)
        .args(["--export-otlp", &format!("http://127.0.0.1:{}", receiver.http)])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed once it has taken some of the events.
    let mut receiver = receiver;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while receiver.events().len() < 500 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    receiver.child.kill().unwrap();
    receiver.child.wait().unwrap();
    let received = receiver.events().len() as u64;
    let out = collect.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the evaluation completes whatever the backend does: {stderr}"
    );
    let lines = crate::support::log_lines(&stderr);
    let summary = lines
        .iter()
        .find_map(|l| l["msg"].as_str()?.strip_prefix("--export-otlp: "))
        .unwrap_or_else(|| panic!("no export summary: {stderr}"));
    let number = |word: &str| -> u64 {
        let before = summary.split(word).next().unwrap();
        before.split_whitespace().last().unwrap().trim_start_matches('(').parse().unwrap()
    };
    let (sent, lost) = (number(" evaluation events sent"), number(" lost"));
    let total = n * 4;
    assert_eq!(sent + lost, total, "every event is sent or counted as lost: {summary}");
    assert!(received >= 500 && received >= sent, "the backend took {received}, {summary}");
    // A request stored and then cut off before its answer counts as lost:
    // at most one batch in flight.
    assert!(
        received <= sent + attest_collect::export::BATCH_EVENTS as u64,
        "{received} {summary}"
    );
    assert!(lost > 0, "{summary}");
}

/// `eval` and `ecp run` export through the same path: every result an event.
#[test]
fn eval_and_ecp_run_export_their_results_too() {
    let Some(python) = venv_python() else { return };
    let Some(bin) = std::env::var("ATTEST_ENGINE_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .or_else(|| attest_test_support::missing("ATTEST_ENGINE_BIN is not set", "scripts/test builds the engine and sets it"))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(&python, dir.path());
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let eval = Command::new(&bin)
        .current_dir(&repo)
        .args(["--log-level=warn", "--no-history", "eval", "--trace", "examples/refund_trace.json"])
        .args(["--assertions", "examples/refund_assertions.json", "--format", "json"])
        .args([
            "--export-otlp",
            &format!("http://127.0.0.1:{}", receiver.grpc),
            "--export-otlp-protocol",
            "grpc",
        ])
        .output()
        .unwrap();
    assert_eq!(eval.status.code(), Some(0), "{}", String::from_utf8_lossy(&eval.stderr));
    let answered: Value = serde_json::from_slice(&eval.stdout).unwrap();
    let events = receiver.events();
    let results = answered["results"]
        .as_array()
        .or_else(|| answered[0]["results"].as_array())
        .unwrap_or_else(|| panic!("{answered}"));
    assert_eq!(events.len(), results.len(), "{events:#?}");
    for r in results {
        let e = events
            .iter()
            .find(|e| e["attributes"]["gen_ai.evaluation.name"] == r["assertion_id"])
            .unwrap_or_else(|| panic!("no event for {r}"));
        assert_eq!(e["attributes"]["gen_ai.evaluation.score.label"], r["status"]);
        assert_eq!(e["attributes"]["attest.trace_id"], "trc_abc123");
        // A test trace's id is no OpenTelemetry id: the record carries it as an attribute only.
        assert_eq!(e["trace_id"], "");
        assert_eq!(e["resource"]["attest.front_door"], "eval");
    }

    // An evaluation that fails before any verdict (a judge assertion, no
    // judge configured) is an event per assertion with its error type.
    let failing = dir.path().join("judged.json");
    std::fs::write(
        &failing,
        r#"[{"assertion_id": "polite", "type": "llm_judge", "spec": {"criteria": "polite"}}]"#,
    )
    .unwrap();
    let eval = Command::new(&bin)
        .current_dir(&repo)
        .args([
            "--log-level=warn",
            "--no-history",
            "eval",
            "--trace",
            "examples/refund_trace.json",
            "--assertions",
        ])
        .arg(&failing)
        .args(["--export-otlp", &format!("http://127.0.0.1:{}", receiver.http)])
        .env("ATTEST_JUDGE_PROVIDER", "off")
        .output()
        .unwrap();
    assert_eq!(eval.status.code(), Some(2), "{}", String::from_utf8_lossy(&eval.stderr));
    let failed: Vec<Value> = receiver
        .events()
        .into_iter()
        .filter(|e| e["attributes"]["gen_ai.evaluation.name"] == "polite")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    let a = &failed[0]["attributes"];
    assert_eq!(a["error.type"], "PROVIDER_ERROR", "{a}");
    assert_eq!(a["attest.trace_id"], "trc_abc123", "{a}");
    assert!(a.get("gen_ai.evaluation.score.value").is_none(), "{a}");

    let ecp = Command::new(&bin)
        .current_dir(&repo)
        .args([
            "--log-level=warn",
            "--no-history",
            "ecp",
            "run",
            "--manifest",
            "examples/ecp/manifest.yaml",
            "-q",
        ])
        .args(["--export-otlp", &format!("http://127.0.0.1:{}", receiver.http)])
        .output()
        .unwrap();
    assert_eq!(ecp.status.code(), Some(0), "{}", String::from_utf8_lossy(&ecp.stderr));
    let from_ecp: Vec<Value> = receiver
        .events()
        .into_iter()
        .filter(|e| e["resource"]["attest.front_door"] == "ecp")
        .collect();
    assert_eq!(from_ecp.len(), 5, "five graded checks in the example manifest: {from_ecp:#?}");
    assert!(from_ecp.iter().all(|e| e["attributes"]["gen_ai.evaluation.name"]
        .as_str()
        .unwrap()
        .starts_with("ecp/Refund request/")));
}

/// An evaluation that fails for good is an event too: `error.type` set, no
/// score, on the rule.
#[test]
fn a_failed_evaluation_is_an_event_with_its_error_type() {
    let Some(python) = venv_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(&python, dir.path());
    let input = dir.path().join("traces.jsonl");
    let line = |id: &str| {
        format!("{{\"schema_version\":1,\"trace_id\":\"{id}\",\"agent_id\":\"refund-agent\",\"steps\":[{{\"type\":\"tool_call\",\"name\":\"lookup_order\"}}],\"output\":{{\"message\":\"refund sent\"}}}}\n")
    };
    std::fs::write(&input, format!("{}{}", line("trc_ok"), line("trc_broken"))).unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, crate::support::RULES).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_attest-collect-testbin"))
        .args(["collect", "--rules"])
        .arg(&rules)
        .arg("--jsonl")
        .arg(&input)
        .args(["--export-otlp", &format!("http://127.0.0.1:{}", receiver.http)])
        .env("ATTEST_COLLECT_TEST_FAIL_TRACE", "trc_broken")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        crate::support::messages(&stderr).lines().any(|l| l.starts_with("--export-otlp: ")),
        "{stderr}"
    );
    let events = receiver.events();
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e["attributes"]["attest.trace_id"] == "trc_broken")
        .collect();
    assert_eq!(failed.len(), 1, "{events:#?}");
    let a = &failed[0]["attributes"];
    assert_eq!(a["error.type"], "PROVIDER_ERROR");
    assert_eq!(a["gen_ai.evaluation.name"], "refund-tools");
    assert!(
        a["gen_ai.evaluation.explanation"]
            .as_str()
            .unwrap()
            .contains("provider unavailable"),
        "{a}"
    );
    assert!(
        a.get("gen_ai.evaluation.score.value").is_none() && a.get("gen_ai.evaluation.score.label").is_none(),
        "{a}"
    );
    assert_eq!(failed[0]["severity_number"], 13);
    // The other trace's results are there as usual.
    assert_eq!(
        events.iter().filter(|e| e["attributes"]["attest.trace_id"] == "trc_ok").count(),
        3,
        "{events:#?}"
    );
}
