//! The agent frameworks teams run, instrumented as their docs say, scored by
//! `attest-engine collect`: the OpenAI Agents SDK (Responses and chat
//! completions, plain and streamed, a named workflow, a handoff), LangChain
//! `create_agent`, LangGraph's prebuilt and a custom graph, and LlamaIndex's
//! `FunctionAgent`, each through its OpenInference instrumentation, against
//! the scripted fake LLM server of `tests/python/fake_llm.py`.
//!
//! Each run's truth is known before it starts (`tests/python/frameworks.py`
//! prints it); the assembled Attest trace is compared with it field by
//! field, and every verdict with what the run deserves: right runs, a
//! missing tool, wrong arguments, a wrong answer, a handoff.
//!
//! The live tests need the venvs named by FRAMEWORKS_TEST_VENV (OpenAI
//! Agents, LangChain, LangGraph) and LLAMAINDEX_TEST_VENV (scripts/test makes
//! both). The recorded OTLP payloads in `tests/fixtures/frameworks/` are
//! checked the same way without any framework installed; set
//! ATTEST_RECORD_FRAMEWORK_FIXTURES=1 on a live run to record them again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use crate::support::{read_jsonl, Collector, Evaluator};
use attest_collect::convert::{convert, Converted, PriceTable};
use attest_collect::otlp::{decode, Encoding, Span};
use serde_json::Value;

/// One rule per agent a run may be rooted in; every verdict is known per variant.
const RULES: &str = r#"
rules:
  - name: refund
    match: {agent_id: refund-agent}
    assertions:
      - {assertion_id: both-tools, type: trace, spec: {check: required_tools, tools: [lookup_order, process_refund]}}
      - {assertion_id: in-order, type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}
      - {assertion_id: right-order-id, type: content, spec: {target: "steps[?name=='lookup_order'].args.order_id", check: contains, value: ORD-7}}
      - {assertion_id: says-processed, type: content, spec: {target: output.message, check: contains, value: is processed}}
  - name: desk
    match: {agent_id: triage-agent}
    assertions:
      - {assertion_id: hands-to-refund, type: trace_tree, spec: {check: follows_transitions, transitions: [[triage-agent, refund-agent]]}}
      - {assertion_id: refund-called, type: trace_tree, spec: {check: agent_called, agent_id: refund-agent}}
      - {assertion_id: all-tools, type: trace_tree, spec: {check: all_tools_called, tools: [lookup_order, process_refund]}}
      - {assertion_id: refund-answers, type: trace_tree, spec: {check: agent_output_contains, agent_id: refund-agent, value: is processed}}
      - {assertion_id: tokens-once, type: trace_tree, spec: {check: aggregate_tokens, operator: eq, value: 208}}
"#;

/// The verdict each assertion deserves on each variant.
fn expected_status(fw: &Framework, variant: &str, assertion: &str) -> &'static str {
    // Tokens no model call reported are unknown, and a limit on them cannot pass.
    if assertion == "tokens-once" && !fw.reports_usage {
        return "hard_fail";
    }
    let fails = match variant {
        "missing_tool" => &["both-tools", "in-order"][..],
        "wrong_args" => &["right-order-id"][..],
        "wrong_answer" => &["says-processed"][..],
        _ => &[][..],
    };
    if fails.contains(&assertion) {
        "hard_fail"
    } else {
        "pass"
    }
}

struct Framework {
    /// The name `frameworks.py` takes.
    name: &'static str,
    /// The venv variable.
    venv: &'static str,
    /// Whether its model calls report token usage as the docs set it up
    /// (streamed chat completions without `include_usage` do not).
    reports_usage: bool,
    handoffs: bool,
}

const FRAMEWORKS: &[Framework] = &[
    fw("agents-responses", true, true),
    fw("agents-stream", true, true),
    fw("agents-chat", true, true),
    fw("agents-chat-stream", false, true),
    fw("agents-workflow", true, true),
    fw("langchain", true, false),
    fw("langgraph", true, false),
    fw("langgraph-custom", true, false),
    Framework {
        name: "llamaindex",
        venv: "LLAMAINDEX_TEST_VENV",
        reports_usage: false,
        handoffs: false,
    },
];

const fn fw(name: &'static str, reports_usage: bool, handoffs: bool) -> Framework {
    Framework {
        name,
        venv: "FRAMEWORKS_TEST_VENV",
        reports_usage,
        handoffs,
    }
}

fn framework(name: &str) -> &'static Framework {
    FRAMEWORKS.iter().find(|f| f.name == name).unwrap()
}

fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frameworks")
}

/// Every way the assembled trace differs from the run's truth.
fn differences(fw: &Framework, trace: &Value, truth: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let handoff = truth["handoff_from"].is_string();
    same(&mut bad, "input.user_message", &trace["input"]["user_message"], &truth["input"]);
    same(&mut bad, "output.message", &trace["output"]["message"], &truth["output"]);
    // The agent whose tools ran: the root's, or the delegate's after a handoff.
    let agent = if handoff {
        same(&mut bad, "agent_id", &trace["agent_id"], &truth["handoff_from"]);
        let calls: Vec<&Value> = steps(trace).filter(|s| s["type"] == "agent_call").collect();
        if calls.len() != 1 {
            bad.push(format!("want one agent_call step for the handoff, got {}", calls.len()));
            return bad;
        }
        same(&mut bad, "handoff agent_call name", &calls[0]["name"], &truth["agent_id"]);
        same(
            &mut bad,
            "delegate agent_id",
            &calls[0]["sub_trace"]["agent_id"],
            &truth["agent_id"],
        );
        same(
            &mut bad,
            "delegate parent_trace_id",
            &calls[0]["sub_trace"]["parent_trace_id"],
            &trace["trace_id"],
        );
        same(
            &mut bad,
            "delegate output",
            &calls[0]["sub_trace"]["output"]["message"],
            &truth["output"],
        );
        &calls[0]["sub_trace"]
    } else {
        same(&mut bad, "agent_id", &trace["agent_id"], &truth["agent_id"]);
        let mut agents = 0;
        walk(trace, &mut |t| agents += steps(t).filter(|s| s["type"] == "agent_call").count());
        same(&mut bad, "agent_call steps of a one-agent run", &agents.into(), &0.into());
        trace
    };
    let tools: Vec<Value> = steps(agent)
        .filter(|s| s["type"] == "tool_call")
        .map(|s| serde_json::json!({"name": s["name"], "args": s["args"], "result": s["result"]}))
        .collect();
    same(&mut bad, "tool steps (name, args, result)", &Value::Array(tools), &truth["tools"]);
    // Every model call once, wherever in the tree.
    let mut llm = 0;
    let mut tokens = 0u64;
    let mut any_tokens = false;
    let mut untimed = 0;
    walk(trace, &mut |t| {
        if let Some(n) = t["metadata"]["total_tokens"].as_u64() {
            tokens += n;
            any_tokens = true;
        }
        for s in steps(t) {
            llm += usize::from(s["type"] == "llm_call");
            let (a, b) = (s["started_at_ms"].as_f64(), s["ended_at_ms"].as_f64());
            if !matches!((a, b), (Some(a), Some(b)) if a > 1e12 && a <= b) {
                untimed += 1;
            }
        }
    });
    same(&mut bad, "llm_call steps in the tree", &llm.into(), &truth["llm_calls"]);
    if untimed > 0 {
        bad.push(format!("{untimed} steps without a start and end in Unix ms"));
    }
    if fw.reports_usage {
        same(&mut bad, "tokens summed over the tree", &tokens.into(), &truth["tokens"]);
    } else if any_tokens {
        bad.push(format!(
            "tokens reported as {tokens}, but the model calls reported none (unknown, not a number)"
        ));
    }
    bad
}

fn same(bad: &mut Vec<String>, what: &str, got: &Value, want: &Value) {
    if got != want {
        bad.push(format!("{what}: got {got}, want {want}"));
    }
}

fn steps(t: &Value) -> impl Iterator<Item = &Value> {
    t["steps"].as_array().into_iter().flatten()
}

fn walk<'a>(t: &'a Value, f: &mut dyn FnMut(&'a Value)) {
    f(t);
    for s in steps(t) {
        if s["sub_trace"].is_object() {
            walk(&s["sub_trace"], f);
        }
    }
}

fn run_tag(trace: &Value) -> Option<String> {
    let msg = trace["input"]["user_message"].as_str()?;
    let start = msg.find("[run ")? + 5;
    Some(msg[start..].trim_end_matches(']').to_string())
}

fn check_traces(fw: &Framework, traces: &[Value], truths: &[Value]) {
    let by_tag: HashMap<String, &Value> = traces.iter().filter_map(|t| Some((run_tag(t)?, t))).collect();
    let mut problems = Vec::new();
    for truth in truths {
        let tag = truth["tag"].as_str().unwrap();
        let Some(trace) = by_tag.get(tag) else {
            problems.push(format!("{tag}: no assembled trace has this run's user message"));
            continue;
        };
        for d in differences(fw, trace, truth) {
            problems.push(format!("{tag}: {d}\n  trace: {trace}"));
        }
    }
    assert_eq!(traces.len(), truths.len(), "one trace per run");
    assert!(problems.is_empty(), "{} differences:\n{}", problems.len(), problems.join("\n"));
}

fn venv_python(fw: &Framework) -> Option<PathBuf> {
    match std::env::var(fw.venv) {
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v).join("bin/python")),
        _ => attest_test_support::missing(
            &format!("{} is not set, so the {} framework test did not run", fw.venv, fw.name),
            "scripts/test makes the venv (target/frameworks-venv, target/llamaindex-venv) and sets it",
        ),
    }
}

/// Runs the framework against `attest-engine collect` over OTLP/HTTP and checks traces and verdicts.
async fn live(name: &str) {
    live_over(name, "http").await;
}

/// The same over `protocol`: `http` or `grpc`.
async fn live_over(name: &str, protocol: &str) {
    let fw = framework(name);
    let Some(python) = venv_python(fw) else { return };
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results.jsonl");
    let traces = dir.path().join("traces.jsonl");
    let mut collector = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        RULES,
        &[
            "--otlp-grpc",
            "127.0.0.1:0",
            "--settle-ms",
            "500",
            "--results-jsonl",
            results.to_str().unwrap(),
            "--traces-out",
            traces.to_str().unwrap(),
        ],
        &[],
    );
    let endpoint = if protocol == "grpc" {
        collector.grpc_addr()
    } else {
        collector.url.clone()
    };
    let record = std::env::var_os("ATTEST_RECORD_FRAMEWORK_FIXTURES")
        .filter(|_| protocol == "http")
        .map(|_| {
            std::fs::create_dir_all(fixture_dir()).unwrap();
            fixture_dir().join(format!("{name}.otlp.pb"))
        });
    let mut cmd = Command::new(&python);
    cmd.current_dir(python_dir())
        .arg("frameworks.py")
        .args([name, &endpoint, protocol])
        .env("PYTHONPATH", python_dir())
        .env_remove("OPENAI_API_KEY");
    if let Some(r) = &record {
        cmd.arg(r);
    }
    let out = cmd.output().expect("run the framework");
    assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    let truths: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    if record.is_some() {
        let lines: Vec<String> = truths.iter().map(Value::to_string).collect();
        std::fs::write(fixture_dir().join(format!("{name}.truth.jsonl")), lines.join("\n") + "\n").unwrap();
    }
    let n = truths.len() as f64;
    collector.wait_metric("attest_collect_traces_evaluated_total", n, 60).await;
    let (code, stderr) = collector.proc.terminate();
    assert_eq!(code, 0, "{stderr}");

    let traces = read_jsonl(&traces);
    check_traces(fw, &traces, &truths);
    check_verdicts(fw, &traces, &read_jsonl(&results));
}

fn check_verdicts(fw: &Framework, traces: &[Value], results: &[Value]) {
    let tag_of: HashMap<&str, String> = traces.iter().filter_map(|t| Some((t["trace_id"].as_str()?, run_tag(t)?))).collect();
    let per_rule = |rule: &str| {
        RULES
            .split("- name: ")
            .find(|r| r.starts_with(rule))
            .unwrap()
            .matches("assertion_id")
            .count()
    };
    let runs = traces.len() - usize::from(fw.handoffs);
    assert_eq!(
        results.len(),
        runs * per_rule("refund") + usize::from(fw.handoffs) * per_rule("desk"),
        "every rule's assertions on every run: {results:#?}"
    );
    let mut wrong = Vec::new();
    for r in results {
        let tag = &tag_of[r["trace_id"].as_str().unwrap()];
        let variant = tag.trim_start_matches(fw.name).trim_start_matches('-');
        let want = expected_status(fw, variant, r["assertion_id"].as_str().unwrap());
        if r["status"] != want {
            wrong.push(format!(
                "{tag} {}: got {}, want {want}: {}",
                r["assertion_id"], r["status"], r["explanation"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{} wrong verdicts:\n{}", wrong.len(), wrong.join("\n"));
}

/// The recorded payload of one framework, assembled as the collector does, checked against its truth.
fn from_fixture(name: &str) {
    let fw = framework(name);
    let pb = fixture_dir().join(format!("{name}.otlp.pb"));
    let body = std::fs::read(&pb).unwrap_or_else(|e| panic!("{}: {e}", pb.display()));
    let decoded = decode(&body, Encoding::Protobuf, 64 << 20).expect("the recorded payload decodes");
    let mut by_trace: HashMap<String, Vec<Span>> = HashMap::new();
    for s in decoded.spans {
        by_trace.entry(s.trace_id.clone()).or_default().push(s);
    }
    let traces: Vec<Value> = by_trace
        .iter()
        .map(|(id, spans)| match convert(id, spans, &PriceTable::default()) {
            Converted::Trace { trace, .. } => trace,
            other => panic!("{name}: trace {id} did not convert: {other:?}"),
        })
        .collect();
    let truths = read_jsonl(&fixture_dir().join(format!("{name}.truth.jsonl")));
    check_traces(fw, &traces, &truths);
}

macro_rules! framework_tests {
    ($($live:ident, $fixture:ident => $name:literal;)*) => {$(
        #[tokio::test]
        async fn $live() {
            live($name).await;
        }

        #[test]
        fn $fixture() {
            from_fixture($name);
        }
    )*};
}

#[tokio::test]
async fn openai_agents_over_otlp_grpc() {
    live_over("agents-responses", "grpc").await;
}

#[tokio::test]
async fn langgraph_over_otlp_grpc() {
    live_over("langgraph", "grpc").await;
}

framework_tests! {
    openai_agents_responses_api, openai_agents_responses_api_recorded => "agents-responses";
    openai_agents_responses_api_streamed, openai_agents_responses_api_streamed_recorded => "agents-stream";
    openai_agents_chat_completions, openai_agents_chat_completions_recorded => "agents-chat";
    openai_agents_chat_completions_streamed, openai_agents_chat_completions_streamed_recorded => "agents-chat-stream";
    openai_agents_named_workflow, openai_agents_named_workflow_recorded => "agents-workflow";
    langchain_create_agent, langchain_create_agent_recorded => "langchain";
    langgraph_prebuilt_react_agent, langgraph_prebuilt_react_agent_recorded => "langgraph";
    langgraph_custom_graph, langgraph_custom_graph_recorded => "langgraph-custom";
    llamaindex_function_agent, llamaindex_function_agent_recorded => "llamaindex";
}
