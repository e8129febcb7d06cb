//! The `attest` grader: steps mapped onto Attest traces, one step or the
//! whole transcript, graded through the host. The host here evaluates the two
//! assertion kinds the manifest uses (`trace` contains_in_order and `content`
//! contains) over the trace it is given, and keeps what it saw.

use std::sync::{Arc, Mutex};

use crate::common::*;
use attest_ecp::{BoxFuture, CheckResult, EcpCommand, GradeError, GradeOutcome, GradeStatus, GradingHost, JudgeRequest, JudgeVerdict};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Default)]
struct Evaluator {
    traces: Mutex<Vec<(Value, Value)>>,
    recorded: Mutex<Vec<(String, usize, Vec<bool>)>>,
}

fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| &v[k])
}

impl GradingHost for Evaluator {
    fn attest<'a>(&'a self, trace: &'a Value, assertion: &'a Value) -> BoxFuture<'a, Result<GradeOutcome, GradeError>> {
        Box::pin(async move {
            self.traces.lock().unwrap().push((trace.clone(), assertion.clone()));
            let spec = &assertion["spec"];
            let ok = match (assertion["type"].as_str(), spec["check"].as_str()) {
                (Some("trace"), Some("contains_in_order")) => {
                    let names: Vec<&str> = trace["steps"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|s| s["name"].as_str())
                        .collect();
                    let mut it = names.iter();
                    spec["tools"].as_array().unwrap().iter().all(|t| it.any(|n| Some(*n) == t.as_str()))
                }
                (Some("content"), Some("contains")) => at(trace, spec["target"].as_str().unwrap())
                    .as_str()
                    .unwrap_or("")
                    .contains(spec["value"].as_str().unwrap()),
                _ => return Err(GradeError::Failed(format!("unsupported assertion {assertion}"))),
            };
            let status = if ok { GradeStatus::Pass } else { GradeStatus::HardFail };
            Ok(GradeOutcome {
                status,
                score: f64::from(u8::from(ok)),
                explanation: format!("evaluated {}", assertion["assertion_id"]),
            })
        })
    }

    fn judge(&self, _request: JudgeRequest) -> BoxFuture<'_, Result<JudgeVerdict, GradeError>> {
        Box::pin(async { Err(GradeError::Unavailable("no judge in this test".into())) })
    }

    fn record<'a>(&'a self, scenario: &'a str, step: usize, results: &'a [CheckResult]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.recorded
                .lock()
                .unwrap()
                .push((scenario.to_string(), step, results.iter().map(|r| r.passed).collect()));
        })
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    ecp: EcpCommand,
}

const MANIFEST: &str = r#"
scenarios:
  - name: Refund conversation
    steps:
      - input: lookup ORD-5
        graders:
          - type: attest
            assertion: {type: content, spec: {target: output.message, check: contains, value: delivered}}
          - type: attest
            assertion: {type: content, spec: {target: output.message, check: contains, value: before acting}}
      - input: refund it
        graders:
          - type: attest
            scope: transcript
            assertion: {assertion_id: spans_turns, type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}
          - type: attest
            assertion: {type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}
          - type: attest
            field: evaluation_context
            assertion: {type: content, spec: {target: output.message, check: contains, value: previous turn}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attest_grader_maps_steps_and_transcripts_onto_traces() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: attest\ntarget: '{} {}'\n{MANIFEST}",
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let out = dir.path().join("r.json");
    let cli = Cli::parse_from([
        "ecp",
        "run",
        "-m",
        m.to_str().unwrap(),
        "--json-out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let host = Arc::new(Evaluator::default());
    let code = attest_ecp::run_command(cli.ecp, host.clone()).await.unwrap();
    assert_eq!(code, 2, "one check fails on purpose");
    let report = read_json(&out);
    let got: Vec<bool> = verdicts(&report).iter().map(|v| v.5).collect();
    // The evaluation context stays out of output.message, so "before acting" is not found
    // there; a step-scoped trace holds only the refund, so the order spans turns only in
    // the transcript.
    assert_eq!(got, vec![true, false, true, false, true]);
    let steps = &report["scenarios"][0]["steps"];
    assert_eq!(steps[1]["checks"][0]["status"], "pass");
    assert_eq!(steps[1]["checks"][1]["status"], "hard_fail");
    assert_eq!(steps[1]["checks"][2]["field"], "evaluation_context");

    let traces = host.traces.lock().unwrap();
    let (first, first_assertion) = &traces[0];
    assert_eq!(first["schema_version"], 1);
    assert_eq!(first["agent_id"], "SupportAgent");
    assert_eq!(first["input"]["user_message"], "lookup ORD-5");
    assert_eq!(first["output"], json!({"message": "Order ORD-5 was delivered on Monday."}));
    assert_eq!(first["metadata"]["evaluation_context"], "Looked the order up before acting.");
    assert_eq!(
        first["steps"],
        json!([{"type": "tool_call", "name": "lookup_order", "args": {"order_id": "ORD-5"}, "metadata": {"turn": 1}}])
    );
    assert_eq!(first_assertion["assertion_id"], "ecp_s1_t1_g1");
    let (transcript, assertion) = &traces[2];
    assert_eq!(assertion["assertion_id"], "spans_turns");
    assert_eq!(transcript["steps"].as_array().unwrap().len(), 2);
    assert_eq!(transcript["input"]["context"]["turns"], json!(["lookup ORD-5", "refund it"]));
    assert_eq!(transcript["output"]["structured"]["turns"][1]["output"], "Refunded ORD-5.");
    let (context_trace, _) = &traces[4];
    assert_eq!(context_trace["output"]["message"], "Refunded the order from the previous turn.");
    assert!(context_trace["metadata"].get("evaluation_context").is_none());

    let recorded = host.recorded.lock().unwrap();
    assert_eq!(
        *recorded,
        vec![
            ("Refund conversation".to_string(), 1, vec![true, false]),
            ("Refund conversation".to_string(), 2, vec![true, false, true])
        ]
    );
}

#[test]
fn standalone_binary_reports_that_no_attest_evaluator_is_configured() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: attest\ntarget: '{} {}'\n{MANIFEST}",
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let out = run_standalone(&["run", "-m", m.to_str().unwrap(), "--json", "--quiet"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let reason = report["scenarios"][0]["steps"][0]["checks"][0]["reasoning"].as_str().unwrap();
    assert_eq!(
        reason,
        "attest grader unavailable: attest graders need the Attest evaluator: run the manifest with `attest-engine ecp run`"
    );
}
