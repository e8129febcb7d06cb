//! Attest protocol v1 §7 trace validation through the binary: every rule's message, its
//! field, the limits at and just past their boundary, and the order in which
//! rules are applied (the first failing rule is the one reported).

use crate::common::*;
use serde_json::{json, Value};

fn engine() -> Engine {
    let mut e = Engine::spawn();
    e.initialize();
    e
}

fn one_assertion() -> Value {
    json!([content("c1", "contains", "m")])
}

/// Evaluates `trace` and returns the `INVALID_TRACE` error, checking the
/// structured data every 1001 must carry, the exact message and the field.
fn expect_invalid(engine: &mut Engine, trace: &Value, message: &str, field: &str) -> Value {
    let resp = engine.request(&evaluate_request(json!("v"), trace.clone(), one_assertion()));
    check_invalid(&resp, message, field)
}

fn check_invalid(resp: &Value, message: &str, field: &str) -> Value {
    let err = expect_error(resp, 1001);
    assert_eq!(err["message"], json!(message), "{resp}");
    assert_eq!(err["data"]["error_type"], json!("INVALID_TRACE"), "{resp}");
    assert_eq!(err["data"]["retryable"], json!(false), "{resp}");
    assert!(err["data"]["detail"].as_str().is_some_and(|d| !d.trim().is_empty()), "{resp}");
    assert_eq!(err["data"]["field"], json!(field), "{resp}");
    err
}

/// Evaluates `trace` and expects success.
fn expect_valid(engine: &mut Engine, trace: &Value) -> Value {
    let resp = engine.request(&evaluate_request(json!("ok"), trace.clone(), one_assertion()));
    assert_eq!(resp["id"], json!("ok"));
    let result = expect_result(&resp);
    assert_eq!(result["results"].as_array().unwrap().len(), 1, "{resp}");
    result
}

fn base() -> Value {
    json!({"schema_version": 1, "trace_id": "trc_v", "output": {"message": "m"}, "steps": []})
}

fn steps(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!({"type": "tool_call", "name": format!("s{i}")})).collect())
}

/// A trace whose sub-traces nest `depth` levels below the root.
fn nested(depth: usize) -> Value {
    let mut t = base();
    for d in 0..depth {
        let mut parent = base();
        parent["trace_id"] = json!(format!("p{d}"));
        parent["steps"] = json!([{"type": "agent_call", "name": format!("sub{d}"), "sub_trace": t}]);
        t = parent;
    }
    t
}

/// Compact trace text of exactly `bytes` bytes, padded in an ignored field.
fn padded_trace_text(bytes: usize, extra: &str) -> String {
    let head = format!("{{\"schema_version\":1,\"trace_id\":\"trc_pad\",\"output\":{{\"message\":\"m\"}}{extra},\"pad\":\"");
    let tail = "\"}";
    let fill = bytes - head.len() - tail.len();
    let mut s = String::with_capacity(bytes);
    s.push_str(&head);
    s.extend(std::iter::repeat_n('x', fill));
    s.push_str(tail);
    assert_eq!(s.len(), bytes);
    s
}

// ---------------------------------------------------------------- order

#[test]
fn schema_version_is_reported_before_missing_trace_id() {
    let mut e = engine();
    let t = json!({"schema_version": 7, "output": {"message": "m"}});
    expect_invalid(
        &mut e,
        &t,
        "unsupported schema_version 7; engine supports versions 0 to 1",
        "trace.schema_version",
    );
    let t = json!({"schema_version": -1, "trace_id": "x", "output": {"message": "m"}});
    expect_invalid(
        &mut e,
        &t,
        "unsupported schema_version -1; engine supports versions 0 to 1",
        "trace.schema_version",
    );
    let t = json!({"output": {"message": "m"}});
    expect_invalid(&mut e, &t, "trace missing required field: schema_version", "trace.schema_version");
    let t = json!({"schema_version": "1", "output": {}});
    expect_invalid(
        &mut e,
        &t,
        "trace schema_version must be an integer, got a string (\"1\")",
        "trace.schema_version",
    );
    let t = json!({"schema_version": 1.5, "trace_id": "x", "output": {"message": "m"}});
    expect_invalid(
        &mut e,
        &t,
        "trace schema_version must be an integer, got a number (1.5)",
        "trace.schema_version",
    );
}

#[test]
fn missing_trace_id_is_reported_before_too_many_steps() {
    let mut e = engine();
    let mut t = base();
    t.as_object_mut().unwrap().remove("trace_id");
    t["steps"] = steps(MAX_STEPS + 1);
    expect_invalid(&mut e, &t, "trace missing required field: trace_id", "trace.trace_id");
    t["trace_id"] = json!("   ");
    expect_invalid(&mut e, &t, "trace missing required field: trace_id", "trace.trace_id");
    t["trace_id"] = json!(42);
    expect_invalid(&mut e, &t, "trace trace_id must be a string, got a number (42)", "trace.trace_id");
}

#[test]
fn missing_output_is_reported_before_too_many_steps() {
    let mut e = engine();
    let mut t = base();
    t.as_object_mut().unwrap().remove("output");
    t["steps"] = steps(MAX_STEPS + 1);
    expect_invalid(&mut e, &t, "trace missing required field: output", "trace.output");
    t["output"] = json!({});
    expect_invalid(
        &mut e,
        &t,
        "trace output must be a non-empty JSON object, got an empty object",
        "trace.output",
    );
    t["output"] = Value::Null;
    expect_invalid(&mut e, &t, "trace output must be a non-empty JSON object, got null", "trace.output");
    t["output"] = json!("done");
    expect_invalid(
        &mut e,
        &t,
        "trace output must be a non-empty JSON object, got a string (\"done\")",
        "trace.output",
    );
}

#[test]
fn too_many_steps_is_reported_before_a_bad_timestamp() {
    let mut e = engine();
    let mut t = base();
    t["steps"] = steps(MAX_STEPS + 1);
    t["metadata"] = json!({"timestamp": "yesterday"});
    expect_invalid(&mut e, &t, "trace exceeds max steps: 10001 > 10000", "trace.steps");
}

#[test]
fn long_output_is_reported_before_a_bad_timestamp() {
    let mut e = engine();
    let mut t = base();
    t["output"]["message"] = json!("a".repeat(MAX_OUTPUT_CHARS + 1));
    t["metadata"] = json!({"timestamp": "yesterday"});
    expect_invalid(
        &mut e,
        &t,
        "output.message length 500001 exceeds 500000 characters",
        "trace.output.message",
    );
}

#[test]
fn bad_timestamp_is_reported_before_an_empty_step_name() {
    let mut e = engine();
    let mut t = base();
    t["metadata"] = json!({"timestamp": "yesterday"});
    t["steps"] = json!([{"type": "tool_call", "name": ""}]);
    expect_invalid(
        &mut e,
        &t,
        "trace metadata.timestamp must be RFC 3339, got a string (\"yesterday\")",
        "trace.metadata.timestamp",
    );
}

#[test]
fn empty_step_name_is_reported_before_depth() {
    let mut e = engine();
    let mut t = nested(6);
    t["steps"].as_array_mut().unwrap().push(json!({"type": "tool_call", "name": ""}));
    expect_invalid(&mut e, &t, "trace step 1 missing required field: name", "trace.steps[1].name");
    t["steps"][1]["name"] = json!("  ");
    expect_invalid(&mut e, &t, "trace step 1 missing required field: name", "trace.steps[1].name");
    t["steps"][1]["name"] = json!(7);
    expect_invalid(
        &mut e,
        &t,
        "trace step 1 name must be a string, got a number (7)",
        "trace.steps[1].name",
    );
    // With the step fixed, depth is what remains.
    t["steps"][1]["name"] = json!("fine");
    expect_invalid(&mut e, &t, "trace nesting depth 6 exceeds maximum 5", "trace.steps");
}

#[test]
fn wire_size_is_reported_before_steps_and_formats() {
    let mut e = engine();
    let extra = ",\"metadata\":{\"timestamp\":\"yesterday\"},\"steps\":[{\"type\":\"tool_call\",\"name\":\"\"}]";
    let text = padded_trace_text(MAX_TRACE_BYTES + 150_000, extra);
    engine_send_raw_trace(&mut e, "big", &text);
    let resp = e.recv();
    assert_eq!(resp["id"], json!("big"));
    check_invalid(&resp, &format!("trace exceeds max size: {} > 10485760 bytes", text.len()), "trace");
}

#[test]
fn trace_is_validated_before_assertions_are_compiled() {
    let mut e = engine();
    let mut t = base();
    t.as_object_mut().unwrap().remove("trace_id");
    let resp = e.request(&evaluate_request(
        json!(1),
        t,
        json!([content("re", "regex_match", "[unclosed"), {"assertion_id": "x", "type": "magic"}]),
    ));
    check_invalid(&resp, "trace missing required field: trace_id", "trace.trace_id");
}

// ---------------------------------------------------------------- limits

fn engine_send_raw_trace(e: &mut Engine, id: &str, trace_text: &str) {
    e.send_line(&evaluate_line_raw(id, trace_text, &one_assertion()));
}

#[test]
fn trace_over_10_mib_on_the_wire_is_rejected() {
    let mut e = engine();
    // ~10.6 MB: over the trace limit but within the request line limit.
    let text = padded_trace_text(10_600_000, "");
    engine_send_raw_trace(&mut e, "over", &text);
    let resp = e.recv();
    assert_eq!(resp["id"], json!("over"));
    let err = check_invalid(&resp, "trace exceeds max size: 10600000 > 10485760 bytes", "trace");
    assert!(err["data"]["detail"].as_str().unwrap().contains("10485760"), "{err}");
    // Exactly at the limit is accepted.
    let text = padded_trace_text(MAX_TRACE_BYTES, "");
    engine_send_raw_trace(&mut e, "at", &text);
    let resp = e.recv();
    assert_eq!(resp["id"], json!("at"));
    assert_eq!(statuses(&expect_result(&resp)), ["pass"]);
}

#[test]
fn more_than_10000_steps_is_rejected() {
    let mut e = engine();
    let mut t = base();
    t["steps"] = steps(MAX_STEPS + 1);
    let err = expect_invalid(&mut e, &t, "trace exceeds max steps: 10001 > 10000", "trace.steps");
    assert!(err["data"]["detail"].as_str().unwrap().contains("10000"), "{err}");
    t["steps"] = steps(MAX_STEPS);
    expect_valid(&mut e, &t);
}

#[test]
fn output_message_over_500000_characters_is_rejected() {
    let mut e = engine();
    let mut t = base();
    t["output"]["message"] = json!("m".repeat(MAX_OUTPUT_CHARS + 1));
    expect_invalid(
        &mut e,
        &t,
        "output.message length 500001 exceeds 500000 characters",
        "trace.output.message",
    );
    t["output"]["message"] = json!("m".repeat(MAX_OUTPUT_CHARS));
    expect_valid(&mut e, &t);
    // Characters, not bytes: 500000 two-byte characters are fine, one more is not.
    t["output"]["message"] = json!("é".repeat(MAX_OUTPUT_CHARS));
    expect_valid(&mut e, &t);
    t["output"]["message"] = json!("é".repeat(MAX_OUTPUT_CHARS + 1));
    expect_invalid(
        &mut e,
        &t,
        "output.message length 500001 exceeds 500000 characters",
        "trace.output.message",
    );
}

#[test]
fn step_result_over_1_mib_is_rejected() {
    let mut e = engine();
    // {"data":"…"} is 11 bytes of JSON around the string.
    let mut t = base();
    t["steps"] = json!([
        {"type": "llm_call", "name": "think", "result": {"completion": "ok"}},
        {"type": "tool_call", "name": "fetch_blob", "result": {"data": "x".repeat(MAX_STEP_RESULT_BYTES - 10)}}
    ]);
    let err = expect_invalid(
        &mut e,
        &t,
        "trace step 'fetch_blob' result exceeds 1048576 bytes (actual: 1048577 bytes)",
        "trace.steps[1].result",
    );
    assert!(err["data"]["detail"].as_str().unwrap().contains("'fetch_blob'"), "{err}");
    t["steps"][1]["result"]["data"] = json!("x".repeat(MAX_STEP_RESULT_BYTES - 11));
    expect_valid(&mut e, &t);
}

#[test]
fn nesting_depth_6_is_rejected_and_5_accepted() {
    let mut e = engine();
    expect_invalid(&mut e, &nested(6), "trace nesting depth 6 exceeds maximum 5", "trace.steps");
    expect_valid(&mut e, &nested(5));
}

#[test]
fn nesting_depth_message_reports_the_actual_depth() {
    // Attest protocol v1 §7: "trace nesting depth <actual> exceeds maximum 5".
    let mut e = engine();
    expect_invalid(&mut e, &nested(9), "trace nesting depth 9 exceeds maximum 5", "trace.steps");
}

#[test]
fn sub_traces_are_validated_with_their_location() {
    let mut e = engine();
    let mut t = base();
    t["steps"] = json!([
        {"type": "tool_call", "name": "lookup"},
        {"type": "agent_call", "name": "helper", "sub_trace": {"schema_version": 1, "trace_id": "s"}}
    ]);
    expect_invalid(
        &mut e,
        &t,
        "trace missing required field: output (in sub_trace of step 'helper' at depth 1)",
        "trace.steps[1].sub_trace.output",
    );
    t["steps"][1]["sub_trace"] = json!({"schema_version": 1, "trace_id": "s", "output": {"m": 1}, "parent_trace_id": ""});
    expect_invalid(
        &mut e,
        &t,
        "trace parent_trace_id must be a non-empty string or null, got a string (\"\") (in sub_trace of step 'helper' at depth 1)",
        "trace.steps[1].sub_trace.parent_trace_id",
    );
}

// ---------------------------------------------------------------- formats

#[test]
fn parent_trace_id_must_be_a_non_empty_string_or_null() {
    let mut e = engine();
    let mut t = base();
    t["parent_trace_id"] = json!("");
    expect_invalid(
        &mut e,
        &t,
        "trace parent_trace_id must be a non-empty string or null, got a string (\"\")",
        "trace.parent_trace_id",
    );
    t["parent_trace_id"] = json!(5);
    expect_invalid(
        &mut e,
        &t,
        "trace parent_trace_id must be a non-empty string or null, got a number (5)",
        "trace.parent_trace_id",
    );
    t["parent_trace_id"] = Value::Null;
    expect_valid(&mut e, &t);
    t["parent_trace_id"] = json!("trc_parent");
    expect_valid(&mut e, &t);
    t.as_object_mut().unwrap().remove("parent_trace_id");
    expect_valid(&mut e, &t);
}

#[test]
fn metadata_timestamp_must_be_rfc3339() {
    let mut e = engine();
    let mut t = base();
    for good in [
        "2026-02-18T10:30:00Z",
        "2026-02-18T10:30:00.123+01:00",
        "2026-02-18T10:30:00.5-08:00",
        "2024-02-29T23:59:59Z",
    ] {
        t["metadata"] = json!({"timestamp": good});
        expect_valid(&mut e, &t);
    }
    for bad in [
        "2026-02-18 10:30:00",
        "2026-02-18T10:30:00",
        "2026-02-18",
        "1700000000",
        "2026-13-01T00:00:00Z",
        "2025-02-29T10:00:00Z",
    ] {
        t["metadata"] = json!({"timestamp": bad});
        expect_invalid(
            &mut e,
            &t,
            &format!("trace metadata.timestamp must be RFC 3339, got a string (\"{bad}\")"),
            "trace.metadata.timestamp",
        );
    }
    t["metadata"] = json!({"timestamp": 1_700_000_000});
    expect_invalid(
        &mut e,
        &t,
        "trace metadata.timestamp must be RFC 3339, got a number (1700000000)",
        "trace.metadata.timestamp",
    );
    t["metadata"] = json!({"timestamp": null});
    expect_valid(&mut e, &t);
}

#[test]
fn unknown_step_type_is_tolerated_by_default() {
    let mut e = engine();
    let mut t = base();
    t["steps"] = json!([
        {"type": "tool_call", "name": "lookup_order"},
        {"type": "banana", "name": "x"},
        {"type": "tool_call", "name": "process_refund"}
    ]);
    let resp = e.request(&evaluate_request(
        json!(1),
        t.clone(),
        json!([
            {"assertion_id": "order", "type": "trace", "spec": {"check": "exact_order", "tools": ["lookup_order", "process_refund"]}},
            {"assertion_id": "count", "type": "constraint", "spec": {"field": "steps.length", "operator": "eq", "value": 3}}
        ]),
    ));
    let result = expect_result(&resp);
    assert_eq!(statuses(&result), ["pass", "pass"], "{resp}");
    // A missing type is still an error.
    t["steps"][1].as_object_mut().unwrap().remove("type");
    expect_invalid(&mut e, &t, "trace step 'x' missing required field: type", "trace.steps[1].type");
}

#[test]
fn unknown_step_type_is_rejected_with_strict_step_types() {
    let mut e = Engine::spawn_args(&["--log-level=warn", "--strict-step-types"]);
    e.initialize();
    let mut t = base();
    t["steps"] = json!([{"type": "banana", "name": "x"}]);
    let err = expect_invalid(&mut e, &t, "trace step 'x' has invalid type 'banana'", "trace.steps[0].type");
    let detail = err["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("llm_call, tool_call, retrieval, agent_call"), "{detail}");
    // Trace ids are unique within a tree (validation rule 8).
    let mut sub = base();
    sub["trace_id"] = json!("trc_sub");
    t["steps"] = json!([
        {"type": "llm_call", "name": "a"},
        {"type": "tool_call", "name": "b"},
        {"type": "retrieval", "name": "c"},
        {"type": "agent_call", "name": "d", "sub_trace": sub}
    ]);
    expect_valid(&mut e, &t);
}

#[test]
fn other_field_rules() {
    let mut e = engine();
    let mut t = base();
    t["schema_version"] = json!(0);
    expect_valid(&mut e, &t);
    t = base();
    t["steps"] = json!({"a": 1});
    expect_invalid(&mut e, &t, "trace steps must be an array, got an object", "trace.steps");
    t = base();
    t["metadata"] = json!([1]);
    expect_invalid(&mut e, &t, "trace metadata must be an object, got an array", "trace.metadata");
    t = base();
    t["metadata"] = json!({"cost_usd": "0.01"});
    expect_invalid(
        &mut e,
        &t,
        "trace metadata.cost_usd must be a non-negative number, got a string (\"0.01\")",
        "trace.metadata.cost_usd",
    );
    t = base();
    t["steps"] = json!([{"type": "tool_call", "name": "t", "sub_trace": base()}]);
    expect_invalid(
        &mut e,
        &t,
        "trace step 't' carries a sub_trace but is not an agent_call",
        "trace.steps[0].sub_trace",
    );
    t = base();
    t["steps"] = json!(["lookup"]);
    expect_invalid(
        &mut e,
        &t,
        "trace step 0 must be an object, got a string (\"lookup\")",
        "trace.steps[0]",
    );
    let resp = e.request(&evaluate_request(json!(1), json!([base()]), one_assertion()));
    check_invalid(&resp, "trace must be a JSON object, got an array", "trace");
    let resp = e.request(&rpc(json!(2), "evaluate_batch", json!({"assertions": []})));
    check_invalid(&resp, "evaluate_batch params missing required field: trace", "params.trace");
    // Unknown top-level and step fields are ignored (Attest protocol v1 §6).
    t = base();
    t["future_field"] = json!({"x": [1, 2]});
    t["steps"] = json!([{"type": "tool_call", "name": "a", "future": true}]);
    expect_valid(&mut e, &t);
}
