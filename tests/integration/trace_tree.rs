//! Layer 7 (`trace_tree`) through the real binary: multi-agent traces as the
//! SDK builds them, every check's pass and fail, soft failures, spec errors
//! (1002) and tree validation errors (1001).

use crate::common::*;
use serde_json::{json, Value};

fn engine() -> Engine {
    let mut e = Engine::spawn();
    let mut params = init_params();
    params["required_capabilities"] = json!(["layers_1_4", "multi_agent", "layer_7", "trace_tree"]);
    let result = expect_result(&e.request(&initialize_request(json!(0), params)));
    assert_eq!(result["compatible"], json!(true), "{result}");
    e
}

/// orchestrator delegates to researcher (10–40 ms), which delegates to
/// fact_checker (20–30 ms), then to writer (50–90 ms); shaped like the SDK's
/// `delegate()` output (step name = agent id, `parent_trace_id` set).
fn multi_agent_trace() -> Value {
    let fact_checker = json!({"schema_version": 1, "trace_id": "trc_f", "agent_id": "fact_checker", "parent_trace_id": "trc_r",
        "output": {"verdict": "confirmed"},
        "steps": [{"type": "retrieval", "name": "kb", "started_at_ms": 21, "ended_at_ms": 29}]});
    let researcher = json!({"schema_version": 1, "trace_id": "trc_r", "agent_id": "researcher", "parent_trace_id": "trc_root",
    "input": {"question": "capital of France?"},
    "output": {"findings": {"city": "Paris"}, "summary": "Paris, per two sources"},
    "metadata": {"total_tokens": 50, "cost_usd": 0.002, "latency_ms": 30},
    "steps": [
        {"type": "tool_call", "name": "web_search", "started_at_ms": 12, "ended_at_ms": 18},
        {"type": "agent_call", "name": "fact_checker", "agent_id": "fact_checker", "started_at_ms": 20, "ended_at_ms": 30, "sub_trace": fact_checker}
    ]});
    let writer = json!({"schema_version": 1, "trace_id": "trc_w", "agent_id": "writer", "parent_trace_id": "trc_root",
        "input": {"notes": {"city": "Paris"}},
        "output": {"draft": "Paris is the capital."},
        "metadata": {"total_tokens": 70, "latency_ms": 40},
        "steps": [{"type": "tool_call", "name": "format", "started_at_ms": 55, "ended_at_ms": 85}]});
    json!({"schema_version": 1, "trace_id": "trc_root", "agent_id": "orchestrator",
    "input": {"question": "capital of France?"},
    "output": {"message": "Paris is the capital of France."},
    "metadata": {"total_tokens": 100, "cost_usd": 0.004, "latency_ms": 100},
    "parent_trace_id": null,
    "steps": [
        {"type": "llm_call", "name": "plan", "started_at_ms": 0, "ended_at_ms": 5},
        {"type": "agent_call", "name": "researcher", "agent_id": "researcher", "started_at_ms": 10, "ended_at_ms": 40,
         "result": {"findings": {"city": "Paris"}}, "sub_trace": researcher},
        {"type": "agent_call", "name": "writer", "agent_id": "writer", "started_at_ms": 50, "ended_at_ms": 90, "sub_trace": writer}
    ]})
}

fn tree(id: &str, spec: Value) -> Value {
    json!({"assertion_id": id, "type": "trace_tree", "spec": spec})
}

/// Evaluates the assertions on `trace` and returns the results array.
fn evaluate(e: &mut Engine, trace: Value, assertions: Value) -> Vec<Value> {
    let result = expect_result(&e.request(&evaluate_request(json!("t"), trace, assertions)));
    result["results"].as_array().unwrap().clone()
}

#[test]
fn every_check_passes_on_a_well_formed_tree() {
    let mut e = engine();
    let specs = [
        json!({"check": "agent_called", "agent_id": "fact_checker"}),
        json!({"check": "delegation_depth", "max_depth": 2}),
        json!({"check": "agent_output_contains", "agent_id": "researcher", "value": "TWO SOURCES", "case_sensitive": false}),
        json!({"check": "cross_agent_data_flow", "from_agent": "researcher", "to_agent": "writer", "field": "findings"}),
        json!({"check": "follows_transitions", "transitions": [["orchestrator", "researcher"], ["researcher", "fact_checker"], ["orchestrator", "writer"]]}),
        json!({"check": "aggregate_cost", "operator": "lte", "value": 0.01}),
        json!({"check": "aggregate_tokens", "operator": "lte", "value": 220}),
        json!({"check": "aggregate_latency", "operator": "lte", "value": 170}),
        json!({"check": "agent_ordered_before", "agent_a": "researcher", "agent_b": "writer"}),
        json!({"check": "agents_overlap", "agent_a": "researcher", "agent_b": "fact_checker"}),
        json!({"check": "agent_wall_time_under", "agent_id": "writer", "max_ms": 41}),
        json!({"check": "ordered_agents", "groups": [["researcher", "fact_checker"], ["writer"]]}),
        json!({"check": "all_tools_called", "tools": ["web_search", "kb", "format"]}),
    ];
    let assertions: Vec<Value> = specs.iter().enumerate().map(|(i, s)| tree(&format!("a{i}"), s.clone())).collect();
    let results = evaluate(&mut e, multi_agent_trace(), Value::Array(assertions));
    assert_eq!(results.len(), specs.len());
    for (r, spec) in results.iter().zip(&specs) {
        assert_eq!(r["status"], json!("pass"), "{spec}: {r}");
        assert_eq!(r["score"].as_f64(), Some(1.0), "{r}");
        let check = spec["check"].as_str().unwrap();
        assert!(r["explanation"].as_str().unwrap().starts_with(check), "{r}");
    }
}

#[test]
fn failures_explain_and_honour_soft() {
    let mut e = engine();
    let assertions = json!([
        tree("hard", json!({"check": "delegation_depth", "max_depth": 1})),
        tree("soft", json!({"check": "agent_called", "agent_id": "billing", "soft": true})),
        tree(
            "transitions",
            json!({"check": "follows_transitions", "transitions": [["orchestrator", "researcher"], ["orchestrator", "writer"]]})
        ),
        tree(
            "order",
            json!({"check": "agent_ordered_before", "agent_a": "writer", "agent_b": "researcher"})
        ),
        tree("tools", json!({"check": "all_tools_called", "tools": ["web_search", "send_email"]})),
    ]);
    let results = evaluate(&mut e, multi_agent_trace(), assertions);
    assert_eq!(
        statuses(&json!({"results": results})),
        ["hard_fail", "soft_fail", "hard_fail", "hard_fail", "hard_fail"]
    );
    let explanation = |i: usize| results[i]["explanation"].as_str().unwrap().to_owned();
    assert_eq!(explanation(0), "delegation_depth: tree depth 2 exceeds max_depth 1.");
    assert!(explanation(1).contains("agent 'billing' was not called"), "{}", explanation(1));
    assert!(explanation(2).contains("'researcher' -> 'fact_checker'"), "{}", explanation(2));
    // The evidence points at the agent_call step that made the handover.
    let path = results[2]["trace_node_path"].as_str().unwrap();
    assert!(path.starts_with("orchestrator > researcher > steps["), "{path}");
    assert!(explanation(3).contains("not before agent 'researcher'"), "{}", explanation(3));
    assert!(explanation(4).contains("['send_email']"), "{}", explanation(4));
}

#[test]
fn missing_data_fails_naming_what_is_missing() {
    let mut e = engine();
    let mut trace = multi_agent_trace();
    trace["steps"][2]["sub_trace"]["steps"][0]
        .as_object_mut()
        .unwrap()
        .remove("ended_at_ms");
    trace["metadata"].as_object_mut().unwrap().remove("cost_usd");
    trace["steps"][1]["sub_trace"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("cost_usd");
    let assertions = json!([
        tree("cost", json!({"check": "aggregate_cost", "operator": "lte", "value": 1})),
        tree(
            "time",
            json!({"check": "agent_wall_time_under", "agent_id": "writer", "max_ms": 100})
        ),
        tree(
            "ghost",
            json!({"check": "agent_output_contains", "agent_id": "ghost", "value": "x"})
        ),
        tree(
            "flow",
            json!({"check": "cross_agent_data_flow", "from_agent": "researcher", "to_agent": "fact_checker", "field": "findings"})
        ),
    ]);
    let results = evaluate(&mut e, trace, assertions);
    for r in &results {
        assert_eq!(r["status"], json!("hard_fail"), "{r}");
    }
    let explanation = |i: usize| results[i]["explanation"].as_str().unwrap().to_owned();
    assert!(
        explanation(0).contains("no trace in the tree sets metadata.cost_usd"),
        "{}",
        explanation(0)
    );
    assert!(
        explanation(1).contains("step 'format' of agent 'writer' at trace.steps[2].sub_trace.steps[0] has no ended_at_ms"),
        "{}",
        explanation(1)
    );
    assert!(
        explanation(2).contains("agent 'ghost' has no trace in the tree"),
        "{}",
        explanation(2)
    );
    assert!(explanation(3).contains("agent 'fact_checker' has no input"), "{}", explanation(3));
}

#[test]
fn agent_call_without_sub_trace_is_accepted_and_counts_as_a_call() {
    let mut e = engine();
    let trace = json!({"schema_version": 1, "trace_id": "trc_a", "agent_id": "crew",
        "output": {"message": "m"},
        "steps": [{"type": "agent_call", "name": "translator"}]});
    let results = evaluate(
        &mut e,
        trace,
        json!([
            tree("called", json!({"check": "agent_called", "agent_id": "translator"})),
            tree("depth", json!({"check": "delegation_depth", "max_depth": 0})),
        ]),
    );
    assert_eq!(statuses(&json!({"results": results})), ["pass", "pass"]);
}

#[test]
fn spec_errors_are_1002_naming_the_field() {
    let mut e = engine();
    let cases = [
        (json!({"check": "agent_count"}), "spec.check", "agent_called"),
        (json!({"check": "agent_called"}), "spec.agent_id", "spec.agent_id"),
        (
            json!({"check": "aggregate_cost", "operator": "between", "value": 1}),
            "spec.operator",
            "lt, lte, gt, gte, eq",
        ),
        (json!({"check": "ordered_agents", "groups": [["a"]]}), "spec.groups", "at least 2"),
        (
            json!({"check": "follows_transitions", "transitions": [["a"]]}),
            "spec.transitions[0]",
            "[parent_agent, child_agent]",
        ),
    ];
    for (spec, field, hint) in cases {
        let resp = e.request(&evaluate_request(
            json!("s"),
            multi_agent_trace(),
            json!([tree("bad", spec.clone())]),
        ));
        let err = expect_error(&resp, 1002);
        assert_eq!(
            err["data"]["field"],
            json!(format!("params.assertions[0].{field}")),
            "{spec}: {resp}"
        );
        assert_eq!(err["data"]["assertion_id"], json!("bad"), "{resp}");
        assert!(err["data"]["detail"].as_str().unwrap().contains(hint), "{spec}: {resp}");
    }
}

#[test]
fn broken_trees_are_1001() {
    let mut e = engine();
    let one = json!([tree("a", json!({"check": "agent_called", "agent_id": "writer"}))]);

    let mut wrong_parent = multi_agent_trace();
    wrong_parent["steps"][2]["sub_trace"]["parent_trace_id"] = json!("trc_r");
    let err = expect_error(&e.request(&evaluate_request(json!(1), wrong_parent, one.clone())), 1001);
    assert_eq!(
        err["message"],
        json!("sub_trace 'trc_w' has parent_trace_id 'trc_r' but its parent's trace_id is 'trc_root'")
    );
    assert_eq!(err["data"]["field"], json!("trace.steps[2].sub_trace.parent_trace_id"));

    let mut duplicate = multi_agent_trace();
    duplicate["steps"][1]["sub_trace"]["steps"][1]["sub_trace"]["trace_id"] = json!("trc_root");
    duplicate["steps"][1]["sub_trace"]["steps"][1]["sub_trace"]["parent_trace_id"] = json!(null);
    let err = expect_error(&e.request(&evaluate_request(json!(2), duplicate, one.clone())), 1001);
    assert_eq!(err["message"], json!("duplicate trace_id 'trc_root' in the tree (cycle or copy)"));
    assert_eq!(err["data"]["field"], json!("trace.steps[1].sub_trace.steps[1].sub_trace.trace_id"));

    // The engine keeps serving after rejecting a trace.
    let results = evaluate(&mut e, multi_agent_trace(), one);
    assert_eq!(results[0]["status"], json!("pass"));
}

#[test]
fn validate_trace_tree_reports_structure_and_every_problem() {
    let mut e = engine();
    let ok = expect_result(&e.request(&rpc(json!(1), "validate_trace_tree", json!({"trace": multi_agent_trace()}))));
    assert_eq!(
        ok,
        json!({"valid": true, "depth": 2, "agent_count": 4,
               "agent_ids": ["orchestrator", "researcher", "fact_checker", "writer"],
               "aggregate_tokens": 220, "aggregate_cost_usd": 0.006, "aggregate_latency_ms": 170})
    );

    // A wrong parent link and a repeated trace_id: reported, not refused.
    let mut broken = multi_agent_trace();
    broken["steps"][1]["sub_trace"]["parent_trace_id"] = json!("someone_else");
    broken["steps"][2]["sub_trace"]["trace_id"] = json!("trc_r");
    let r = expect_result(&e.request(&rpc(json!(2), "validate_trace_tree", json!({"trace": broken}))));
    assert_eq!(r["valid"], json!(false), "{r}");
    let errors: Vec<&str> = r["errors"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert_eq!(errors.len(), 2, "{r}");
    assert!(errors.iter().any(|m| m.contains("parent_trace_id 'someone_else'")), "{r}");
    assert!(errors.iter().any(|m| m.contains("duplicate trace_id 'trc_r'")), "{r}");

    // Too deep: reported with the depth found.
    let mut deep = json!({"schema_version": 1, "trace_id": "d6", "output": {"message": "m"}});
    for level in (0..6).rev() {
        deep = json!({"schema_version": 1, "trace_id": format!("d{level}"), "output": {"message": "m"},
                      "steps": [{"type": "agent_call", "name": "a", "sub_trace": deep}]});
    }
    let r = expect_result(&e.request(&rpc(json!(3), "validate_trace_tree", json!({"trace": deep}))));
    assert_eq!((r["valid"].clone(), r["depth"].clone()), (json!(false), json!(6)), "{r}");
    assert_eq!(r["errors"][0], json!("trace nesting depth 6 exceeds maximum 5"));

    // No trace, or a level that breaks Attest protocol v1 §7: 1001 naming the field.
    let err = expect_error(&e.request(&rpc(json!(4), "validate_trace_tree", json!({}))), 1001);
    assert_eq!(err["data"]["field"], json!("params.trace"));
    let err = expect_error(
        &e.request(&rpc(
            json!(5),
            "validate_trace_tree",
            json!({"trace": {"trace_id": "x", "output": {"message": "m"}}}),
        )),
        1001,
    );
    assert_eq!(err["data"]["field"], json!("trace.schema_version"));
}

/// A failed data flow shows what the receiving agent got, not the tree.
#[test]
fn a_failed_data_flow_shows_what_the_receiving_agent_got() {
    let mut e = engine();
    let mut trace = multi_agent_trace();
    trace["steps"][2]["sub_trace"]["input"] = json!({"notes": {"city": "Lyon"}});
    let results = evaluate(
        &mut e,
        trace,
        json!([tree(
            "flow",
            json!({"check": "cross_agent_data_flow", "from_agent": "researcher", "to_agent": "writer", "field": "findings"})
        )]),
    );
    let r = &results[0];
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    let actual = r["actual"].as_str().unwrap();
    assert!(actual.starts_with("input of `writer`: ") && actual.contains("Lyon"), "{r}");
    assert!(r["trace_node_path"].as_str().unwrap().ends_with("> input"), "{r}");
}
