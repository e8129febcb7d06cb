//! JSON-RPC 2.0 behaviour of the engine, driven through the real binary.

use crate::common::*;
use serde_json::{json, Value};

/// Proves the engine still answers after an error: a fresh request succeeds.
fn assert_still_serving(engine: &mut Engine, initialized: bool) {
    if initialized {
        let resp = engine.request(&evaluate_request(
            json!("alive"),
            minimal_trace(),
            json!([content("ok", "contains", "hello")]),
        ));
        assert_eq!(resp["id"], json!("alive"), "{resp}");
        let result = expect_result(&resp);
        assert_eq!(statuses(&result), ["pass"], "{resp}");
    } else {
        let result = engine.initialize();
        assert_eq!(result["compatible"], json!(true));
    }
}

/// The raw response line must start with exactly this envelope prefix.
fn assert_line_prefix(line: &str, prefix: &str) {
    assert!(line.starts_with(prefix), "expected the line to start with {prefix:?}, got: {line}");
}

// ---------------------------------------------------------------- -32700

#[test]
fn non_json_line_is_a_parse_error_with_null_id() {
    let mut engine = Engine::spawn();
    for bad in [
        "this is not json",
        "{\"jsonrpc\":\"2.0\",\"id\":1,",
        "{'single': 'quotes'}",
        "[1, 2",
    ] {
        engine.send_line(bad);
        let line = engine.recv_line();
        assert_line_prefix(&line, "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":");
        let resp: Value = serde_json::from_str(&line).unwrap();
        let err = expect_error(&resp, -32700);
        assert_eq!(err["message"], json!("parse error: line is not valid JSON"), "{bad}: {resp}");
    }
    assert_still_serving(&mut engine, false);
}

#[test]
fn invalid_utf8_is_a_parse_error_with_null_id() {
    let mut engine = Engine::spawn();
    let bytes = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"sdk_name\":\"\xff\xfe\"}}";
    let bad_at = bytes.iter().position(|b| *b == 0xff).unwrap();
    engine.send_bytes(bytes);
    let line = engine.recv_line();
    assert_line_prefix(&line, "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":");
    let resp: Value = serde_json::from_str(&line).unwrap();
    let err = expect_error(&resp, -32700);
    assert_eq!(err["message"], json!("parse error: line is not valid UTF-8"));
    assert!(
        err["data"]["detail"].as_str().unwrap().contains(&format!("byte {bad_at}")),
        "{resp}"
    );
    assert_still_serving(&mut engine, false);
}

#[test]
fn an_assertion_naming_a_member_twice_is_told_so() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let trace = minimal_trace().to_string();
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"evaluate_batch","params":{{"trace":{trace},"assertions":[{{"assertion_id":"a","type":"content","type":"schema","spec":{{}}}}]}}}}"#
    );
    engine.send_line(&line);
    let resp: Value = serde_json::from_str(&engine.recv_line()).unwrap();
    let err = expect_error(&resp, 1002);
    assert_eq!(err["message"], json!("assertions[0] has the member 'type' twice"), "{resp}");
    assert_eq!(err["data"]["field"], json!("params.assertions[0].type"), "{resp}");
    assert_still_serving(&mut engine, true);
}

/// A client writing UTF-8 "with BOM" puts U+FEFF before its first line: it
/// is ignored, as RFC 8259 allows, and the request is answered.
#[test]
fn a_byte_order_mark_before_a_request_is_ignored() {
    let mut engine = Engine::spawn();
    let mut line = "\u{feff}".to_owned();
    line.push_str(&initialize_request(json!(1), init_params()).to_string());
    engine.send_line(&line);
    let resp: Value = serde_json::from_str(&engine.recv_line()).unwrap();
    assert_eq!(resp["id"], json!(1), "{resp}");
    assert!(resp["result"]["compatible"].as_bool().unwrap(), "{resp}");
    assert_still_serving(&mut engine, true);
}

// ---------------------------------------------------------------- -32600

#[test]
fn non_object_request_is_invalid_request_with_null_id() {
    let mut engine = Engine::spawn();
    for bad in ["42", "\"initialize\"", "true", "null"] {
        engine.send_line(bad);
        let resp = engine.recv();
        assert_eq!(resp["id"], Value::Null, "{bad}: {resp}");
        let err = expect_error(&resp, -32600);
        assert_eq!(err["message"], json!("invalid request: expected a JSON object"), "{bad}: {resp}");
    }
    assert_still_serving(&mut engine, false);
}

#[test]
fn missing_jsonrpc_member_is_invalid_request_with_id_echoed() {
    let mut engine = Engine::spawn();
    let resp = engine.request(&json!({"id": 5, "method": "initialize", "params": init_params()}));
    assert_eq!(resp["id"], json!(5), "{resp}");
    let err = expect_error(&resp, -32600);
    assert_eq!(err["message"], json!("invalid request: missing jsonrpc member"));
    // The request was refused, so the session is still uninitialized.
    assert_still_serving(&mut engine, false);
}

#[test]
fn jsonrpc_1_0_is_invalid_request_with_id_echoed() {
    let mut engine = Engine::spawn();
    let resp = engine.request(&json!({"jsonrpc": "1.0", "id": 7, "method": "initialize", "params": init_params()}));
    assert_eq!(resp["id"], json!(7), "{resp}");
    let err = expect_error(&resp, -32600);
    assert_eq!(err["message"], json!("invalid request: jsonrpc must be \"2.0\""));
    assert!(err["data"]["detail"].as_str().unwrap().contains("\"1.0\""), "{resp}");
    let resp = engine.request(&json!({"jsonrpc": 2.0, "id": "num", "method": "initialize", "params": init_params()}));
    assert_eq!(resp["id"], json!("num"), "{resp}");
    expect_error(&resp, -32600);
    assert_still_serving(&mut engine, false);
}

#[test]
fn non_string_method_is_invalid_request() {
    let mut engine = Engine::spawn();
    for (id, method) in [
        (1, json!(5)),
        (2, json!(["initialize"])),
        (3, json!(null)),
        (4, json!({"name": "initialize"})),
    ] {
        let resp = engine.request(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}));
        assert_eq!(resp["id"], json!(id), "{resp}");
        let err = expect_error(&resp, -32600);
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg == "invalid request: method must be a string" || (method.is_null() && msg == "invalid request: missing method"),
            "{method}: {resp}"
        );
    }
    let resp = engine.request(&json!({"jsonrpc": "2.0", "id": 9}));
    assert_eq!(expect_error(&resp, -32600)["message"], json!("invalid request: missing method"));
    assert_still_serving(&mut engine, false);
}

#[test]
fn scalar_params_are_invalid_request() {
    let mut engine = Engine::spawn();
    for (id, params) in [(1, json!(3)), (2, json!("params")), (3, json!(true))] {
        let resp = engine.request(&json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params}));
        assert_eq!(resp["id"], json!(id), "{resp}");
        let err = expect_error(&resp, -32600);
        assert_eq!(
            err["message"],
            json!("invalid request: params must be an object or an array"),
            "{resp}"
        );
    }
    assert_still_serving(&mut engine, false);
}

#[test]
fn empty_batch_array_is_a_single_invalid_request() {
    let mut engine = Engine::spawn();
    engine.send_line("[]");
    let line = engine.recv_line();
    let resp: Value = serde_json::from_str(&line).unwrap();
    assert!(
        resp.is_object(),
        "an empty batch is answered with one response object, not an array: {line}"
    );
    assert_eq!(resp["id"], Value::Null);
    let err = expect_error(&resp, -32600);
    assert_eq!(err["message"], json!("invalid request: empty batch"));
    assert_still_serving(&mut engine, false);
}

// ---------------------------------------------------------------- -32601

#[test]
fn unknown_method_is_method_not_found_listing_methods() {
    let mut engine = Engine::spawn();
    let resp = engine.request(&rpc(json!("m1"), "frobnicate", json!({})));
    assert_eq!(resp["id"], json!("m1"));
    let err = expect_error(&resp, -32601);
    assert_eq!(err["message"], json!("method not found: frobnicate"));
    let detail = err["data"]["detail"].as_str().unwrap();
    for m in ["initialize", "evaluate_batch", "submit_plugin_result", "shutdown"] {
        assert!(detail.contains(m), "detail should list {m}: {detail}");
    }
    // Also after initialize.
    engine.initialize();
    let resp = engine.request(&rpc(json!(2), "evaluate", json!({})));
    assert_eq!(expect_error(&resp, -32601)["message"], json!("method not found: evaluate"));
    assert_still_serving(&mut engine, true);
}

// ---------------------------------------------------------------- ids

#[test]
fn ids_of_every_json_type_are_echoed_exactly() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let plugin_params = plugin_request(json!(0))["params"].to_string();
    let ids = [
        "\"req-abc\"",
        "\"\"",
        "\"caf\\u00e9 \\\"q\\\"\"",
        "1.50",
        "12345678901234567890",
        "-42",
        "0",
        "1e3",
        "null",
        "{\"a\":[1,2],\"b\":null}",
        "[1,\"two\"]",
    ];
    for id in ids {
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"submit_plugin_result\",\"params\":{plugin_params}}}");
        engine.send_line(&line);
        let reply = engine.recv_line();
        assert_line_prefix(&reply, &format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":"));
        let resp: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(expect_result(&resp), json!({"accepted": true}), "{reply}");
    }
    // Ids are echoed on errors too.
    for id in ["1.50", "12345678901234567890", "-7", "{\"k\":\"v\"}"] {
        engine.send_line(&format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"nope\"}}"));
        let reply = engine.recv_line();
        assert_line_prefix(&reply, &format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":"));
    }
}

// ---------------------------------------------------------------- notifications

#[test]
fn notification_gets_no_response() {
    let mut engine = Engine::spawn();
    // Before initialize lines are handled in order, so the next line answers
    // the next request with an id if (and only if) the notifications were silent.
    engine.send(&notification("evaluate_batch", json!({})));
    engine.send(&notification("frobnicate", json!({})));
    engine.send(&json!({"jsonrpc": "2.0", "method": "shutdown"}));
    engine.send(&rpc(json!("after"), "frobnicate", json!({})));
    let resp = engine.recv();
    assert_eq!(resp["id"], json!("after"), "a notification was answered: {resp}");
    expect_error(&resp, -32601);

    // A notification of a good request does its work silently: this one
    // starts the session, so a later initialize is refused as a second one.
    engine.send(&json!({"jsonrpc": "2.0", "method": "initialize", "params": init_params()}));
    let resp = engine.request(&initialize_request(json!("init-2"), init_params()));
    assert_eq!(resp["id"], json!("init-2"), "the initialize notification was answered: {resp}");
    assert_eq!(
        expect_error(&resp, 3003)["message"],
        json!("initialize called on already-initialized session")
    );

    // After initialize requests run concurrently, so collect everything the
    // engine writes until it exits: only requests with an id may appear.
    engine.send(&notification("submit_plugin_result", plugin_request(json!(0))["params"].clone()));
    engine.send(&json!({"jsonrpc": "2.0", "method": "evaluate_batch", "params": {"trace": minimal_trace(), "assertions": [content("n1", "contains", "hello")]}}));
    engine.send(&json!({"jsonrpc": "2.0", "method": "evaluate_batch", "params": {"trace": {"schema_version": 1}, "assertions": []}}));
    engine.send(&notification("frobnicate", json!({})));
    let resp = engine.request(&rpc(json!("bad-then-notify"), "frobnicate", json!({})));
    assert_eq!(resp["id"], json!("bad-then-notify"), "a notification was answered: {resp}");
    engine.send(&shutdown_request(json!("bye")));
    let rest = engine.values_until_eof();
    assert_eq!(rest.len(), 1, "only the shutdown request may be answered: {rest:?}");
    assert_eq!(rest[0]["id"], json!("bye"), "{rest:?}");
    assert_eq!(expect_result(&rest[0])["sessions_completed"], json!(1));
}

#[test]
fn null_id_is_a_request_not_a_notification() {
    let mut engine = Engine::spawn();
    let resp = engine.request(&initialize_request(Value::Null, init_params()));
    assert_eq!(resp["id"], Value::Null);
    assert_eq!(expect_result(&resp)["compatible"], json!(true));
}

// ---------------------------------------------------------------- batches

#[test]
fn batch_array_is_answered_with_an_array_without_notifications() {
    let mut engine = Engine::spawn();
    let batch = json!([
        initialize_request(json!(1), init_params()),
        notification("submit_plugin_result", plugin_request(json!(0))["params"].clone()),
        evaluate_request(json!(2), refund_trace(), refund_assertions()),
        rpc(json!(3), "frobnicate", json!({})),
        42,
        plugin_request(json!("p"))
    ]);
    engine.send(&batch);
    let resp = engine.recv();
    let items = resp
        .as_array()
        .unwrap_or_else(|| panic!("a batch is answered with an array: {resp}"));
    assert_eq!(
        items.len(),
        5,
        "one response per request with an id (and one for the invalid entry): {resp}"
    );
    let by_id = |id: Value| {
        items
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no response for id {id}: {resp}"))
    };
    assert_eq!(expect_result(by_id(json!(1)))["compatible"], json!(true));
    assert_eq!(statuses(&expect_result(by_id(json!(2)))), ["pass"; 5]);
    expect_error(by_id(json!(3)), -32601);
    assert_eq!(expect_result(by_id(json!("p"))), json!({"accepted": true}));
    let invalid = items.iter().filter(|r| r["id"].is_null()).collect::<Vec<_>>();
    assert_eq!(invalid.len(), 1, "{resp}");
    expect_error(invalid[0], -32600);
    assert_still_serving(&mut engine, true);
}

#[test]
fn all_notification_batch_gets_nothing() {
    let mut engine = Engine::spawn();
    engine.send(&json!([
        notification("frobnicate", json!({})),
        notification("evaluate_batch", json!({})),
        {"jsonrpc": "2.0", "method": "shutdown"}
    ]));
    engine.send(&rpc(json!("next"), "frobnicate", json!({})));
    let resp = engine.recv();
    assert!(resp.is_object(), "the all-notification batch was answered: {resp}");
    assert_eq!(resp["id"], json!("next"), "{resp}");
    assert_still_serving(&mut engine, false);
}

// ---------------------------------------------------------------- sessions

#[test]
fn methods_before_initialize_are_session_errors() {
    let mut engine = Engine::spawn();
    let cases = [
        (
            evaluate_request(json!(1), refund_trace(), refund_assertions()),
            "evaluate_batch called before initialize",
        ),
        (plugin_request(json!(2)), "submit_plugin_result called before initialize"),
        (shutdown_request(json!(3)), "shutdown called before initialize"),
    ];
    for (req, message) in cases {
        let resp = engine.request(&req);
        assert_eq!(resp["id"], req["id"]);
        let err = expect_error(&resp, 3003);
        assert_eq!(err["message"], json!(message), "{resp}");
    }
    assert_still_serving(&mut engine, false);
    assert_still_serving(&mut engine, true);
}

#[test]
fn initialize_twice_is_a_session_error() {
    let mut engine = Engine::spawn();
    engine.initialize();
    // Whatever the second call's params hold: its fault is being a second call.
    for (id, params) in [
        (json!(2), init_params()),
        (json!(3), json!({})),
        (json!(4), json!({"protocol_version": 99, "required_capabilities": "layers_1_4"})),
    ] {
        let resp = engine.request(&initialize_request(id.clone(), params));
        assert_eq!(resp["id"], id);
        let err = expect_error(&resp, 3003);
        assert_eq!(err["message"], json!("initialize called on already-initialized session"));
    }
    assert_still_serving(&mut engine, true);
}

#[test]
fn unsupported_protocol_versions_name_the_supported_ones() {
    let mut engine = Engine::spawn();
    for (version, message) in [
        (3, "protocol version 3 not supported; engine supports versions 0 and 1"),
        (-1, "protocol version -1 is too old; engine supports versions 0 and 1"),
        (2, "protocol version 2 not supported; engine supports versions 0 and 1"),
    ] {
        let mut params = init_params();
        params["protocol_version"] = json!(version);
        let resp = engine.request(&initialize_request(json!(version), params));
        assert_eq!(resp["id"], json!(version));
        let err = expect_error(&resp, 3003);
        assert_eq!(err["message"], json!(message), "{resp}");
        assert_eq!(err["data"]["field"], json!("params.protocol_version"), "{resp}");
    }
    // A refused initialize does not start the session.
    let resp = engine.request(&evaluate_request(json!(9), minimal_trace(), json!([])));
    expect_error(&resp, 3003);
    assert_still_serving(&mut engine, false);
}

#[test]
fn protocol_version_0_is_accepted() {
    let mut engine = Engine::spawn();
    let mut params = init_params();
    params["protocol_version"] = json!(0);
    let resp = engine.request(&initialize_request(json!(1), params));
    let result = expect_result(&resp);
    assert_eq!(result["compatible"], json!(true), "{resp}");
    let v = result["protocol_version"].as_i64().unwrap();
    assert!(v == 0 || v == 1, "{resp}");
    assert_still_serving(&mut engine, true);
}

#[test]
fn capabilities_are_negotiated() {
    let cases = [
        (json!(["layers_1_4"]), json!([]), true),
        (json!(["layers_1_4", "soft_failures"]), json!([]), true),
        (json!([]), json!([]), true),
        (json!(["plugins", "layer_8"]), json!([]), true),
        (json!(["multi_agent", "layer_7", "trace_tree"]), json!([]), true),
        (json!(["layers_5_6"]), json!(["layers_5_6"]), false),
        (json!(["layers_1_4", "layers_5_6", "plugins"]), json!(["layers_5_6"]), false),
    ];
    for (required, missing, compatible) in cases {
        let mut engine = Engine::spawn();
        let mut params = init_params();
        params["required_capabilities"] = required.clone();
        let result = expect_result(&engine.request(&initialize_request(json!(1), params)));
        assert_eq!(result["missing"], missing, "{required}: {result}");
        assert_eq!(result["compatible"], json!(compatible), "{required}: {result}");
    }
}

#[test]
fn initialize_result_has_every_spec_field() {
    let mut engine = Engine::spawn();
    let result = engine.initialize();
    let obj = result.as_object().unwrap();
    for key in [
        "engine_version",
        "protocol_version",
        "capabilities",
        "missing",
        "compatible",
        "encoding",
        "max_concurrent_requests",
        "max_trace_size_bytes",
        "max_steps_per_trace",
    ] {
        assert!(obj.contains_key(key), "initialize result lacks {key}: {result}");
    }
    assert_eq!(result["engine_version"], json!(VERSION));
    assert_eq!(result["protocol_version"], json!(1));
    assert_eq!(
        result["capabilities"],
        json!([
            "layers_1_4",
            "soft_failures",
            "multi_agent",
            "layer_7",
            "trace_tree",
            "plugins",
            "layer_8",
            "continuous_eval"
        ])
    );
    assert_eq!(result["missing"], json!([]));
    assert_eq!(result["compatible"], json!(true));
    assert_eq!(result["encoding"], json!("json"));
    assert_eq!(result["max_concurrent_requests"], json!(64));
    assert_eq!(result["max_trace_size_bytes"], json!(MAX_TRACE_BYTES));
    assert_eq!(result["max_steps_per_trace"], json!(MAX_STEPS));
}

#[test]
fn initialize_params_errors_are_invalid_params() {
    let mut engine = Engine::spawn();
    let mut no_name = init_params();
    no_name.as_object_mut().unwrap().remove("sdk_name");
    let resp = engine.request(&initialize_request(json!(1), no_name));
    let err = expect_error(&resp, -32602);
    assert_eq!(err["message"], json!("initialize params missing required field: sdk_name"));
    assert_eq!(err["data"]["field"], json!("params.sdk_name"));

    let mut bad_version = init_params();
    bad_version["protocol_version"] = json!("1");
    let err = expect_error(&engine.request(&initialize_request(json!(2), bad_version)), -32602);
    assert_eq!(err["message"], json!("initialize params field protocol_version must be an integer"));

    // Absent params read as {}: the first missing member is named.
    let resp = engine.request(&json!({"jsonrpc": "2.0", "id": 3, "method": "initialize"}));
    let err = expect_error(&resp, -32602);
    assert_eq!(err["message"], json!("initialize params missing required field: sdk_name"));
    let resp = engine.request(&json!({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": ["attest", "0.1.0", 1]}));
    let err = expect_error(&resp, -32602);
    assert_eq!(err["message"], json!("initialize params must be an object"));
    assert_eq!(err["data"]["field"], json!("params"));
    assert_still_serving(&mut engine, false);
}

// ---------------------------------------------------------------- 1002

/// Sends one evaluate_batch of the refund trace with `assertions` and returns its error.
fn batch_error(engine: &mut Engine, assertions: Value) -> Value {
    let resp = engine.request(&evaluate_request(json!("e"), refund_trace(), assertions));
    assert_eq!(resp["id"], json!("e"));
    expect_error(&resp, 1002)
}

#[test]
fn assertions_and_simulation_members_are_objects_never_positional_arrays() {
    let mut engine = Engine::spawn();
    engine.initialize();
    for bad in [
        json!(5),
        json!(["a", "content", {"target": "output.message", "check": "contains", "value": "refund"}]),
    ] {
        let err = batch_error(&mut engine, json!([bad]));
        assert_eq!(err["message"], json!("assertions[0] must be an object"), "{err}");
        assert_eq!(err["data"]["field"], json!("params.assertions[0]"));
    }
    let mut gum = |params: Value| {
        let resp = engine.request(&rpc(json!("g"), "generate_user_message", params));
        expect_error(&resp, 1002)["message"].as_str().unwrap().to_owned()
    };
    let persona = json!({"name": "a", "system_prompt": "b"});
    for (params, want) in [
        (json!({"persona": ["a", "b"]}), "at params.persona: expected an object, got a list"),
        (
            json!({"persona": persona, "conversation_history": [["user", "hi"]]}),
            "expected an object, got a list",
        ),
        (
            json!({"persona": persona, "fault_config": [0.5]}),
            "at params.fault_config: expected an object, got a list",
        ),
    ] {
        let message = gum(params.clone());
        assert!(message.contains(want), "{params}: {message}");
        assert!(!message.contains("struct") && !message.contains("invalid JSON"), "{message}");
    }
}

#[test]
fn unknown_assertion_type_lists_supported_types() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let err = batch_error(&mut engine, json!([{"assertion_id": "a1", "type": "magic", "spec": {}}]));
    assert_eq!(err["message"], json!("assertion 'a1': unknown assertion type 'magic'"));
    assert_eq!(
        err["data"]["detail"],
        json!("Supported assertion types: schema, constraint, trace, content, embedding, llm_judge, trace_tree, plugin.")
    );
    assert_eq!(err["data"]["assertion_id"], json!("a1"));
    assert_eq!(err["data"]["field"], json!("params.assertions[0].type"));
    assert_still_serving(&mut engine, true);
}

#[test]
fn paid_assertion_types_without_a_provider_say_how_to_configure_one() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let cases = [
        (
            "embedding",
            json!({"target": "output.message", "reference": "refund processed", "threshold": 0.8}),
            "assertion 'x_embedding' (embedding): no embedding provider is available",
            "ATTEST_EMBEDDING_BASE_URL",
        ),
        (
            "llm_judge",
            json!({"rubric": "helpfulness", "threshold": 0.7, "model": "gpt-4.1"}),
            "assertion 'x_llm_judge' (llm_judge): no LLM judge provider is configured",
            "ATTEST_JUDGE_BASE_URL",
        ),
    ];
    for (kind, spec, message, how) in cases {
        let mut assertions = refund_assertions();
        assertions
            .as_array_mut()
            .unwrap()
            .push(json!({"assertion_id": format!("x_{kind}"), "type": kind, "spec": spec}));
        let resp = engine.request(&evaluate_request(json!(1), refund_trace(), assertions));
        let err = &resp["error"];
        assert_eq!(err["code"], 2001, "{resp}");
        assert!(err["message"].as_str().unwrap().starts_with(message), "{err}");
        assert_eq!(err["data"]["assertion_id"], json!(format!("x_{kind}")));
        assert_eq!(err["data"]["field"], json!("params.assertions[5]"));
        assert!(err["data"]["detail"].as_str().unwrap().contains(how), "{err}");
    }
    assert_still_serving(&mut engine, true);
}

#[test]
fn spec_errors_are_assertion_errors_naming_the_field() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let cases = [
        (
            json!({"assertion_id": "re", "type": "content", "spec": {"target": "output.message", "check": "regex_match", "value": "[unclosed"}}),
            "assertion 're' (content): invalid regex '[unclosed'",
            "params.assertions[0].spec.value",
        ),
        (
            json!({"assertion_id": "sch", "type": "schema", "spec": {"target": "output", "schema": {"type": "not-a-valid-type"}}}),
            "assertion 'sch' (schema): malformed JSON Schema",
            "params.assertions[0].spec.schema",
        ),
        (
            json!({"assertion_id": "sch2", "type": "schema", "spec": {"target": "output", "schema": [1, 2]}}),
            "assertion 'sch2' (schema): spec.schema must be a JSON Schema object or boolean",
            "params.assertions[0].spec.schema",
        ),
        (
            json!({"assertion_id": "tgt", "type": "content", "spec": {"target": "outptu.message", "check": "contains", "value": "x"}}),
            "assertion 'tgt' (content): unsupported target 'outptu.message'",
            "params.assertions[0].spec.target",
        ),
        (
            json!({"assertion_id": "tgt2", "type": "schema", "spec": {"target": "$.steps[*].result", "schema": {}}}),
            "assertion 'tgt2' (schema): unsupported target '$.steps[*].result'",
            "params.assertions[0].spec.target",
        ),
        (
            json!({"assertion_id": "op", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "approx", "value": 1}}),
            "assertion 'op' (constraint): unsupported operator 'approx'",
            "params.assertions[0].spec.operator",
        ),
        (
            json!({"assertion_id": "mv", "type": "content", "spec": {"target": "output.message", "check": "contains"}}),
            "assertion 'mv' (content): spec missing required field: value",
            "params.assertions[0].spec.value",
        ),
        (
            json!({"assertion_id": "mt", "type": "trace", "spec": {"check": "contains_in_order"}}),
            "assertion 'mt' (trace): spec missing required field: tools",
            "params.assertions[0].spec.tools",
        ),
        (
            json!({"assertion_id": "ms", "type": "constraint"}),
            "assertion 'ms' (constraint): missing required field: spec",
            "params.assertions[0].spec",
        ),
        (
            json!({"assertion_id": "chk", "type": "trace", "spec": {"check": "sequence", "tools": ["a"]}}),
            "assertion 'chk' (trace): unsupported check 'sequence'",
            "params.assertions[0].spec.check",
        ),
    ];
    for (assertion, message, field) in cases {
        let id = assertion["assertion_id"].clone();
        let err = batch_error(&mut engine, json!([assertion]));
        let got = err["message"].as_str().unwrap();
        assert!(got.starts_with(message), "expected message starting with {message:?}, got {got:?}");
        assert_eq!(err["data"]["assertion_id"], id, "{err}");
        assert_eq!(err["data"]["field"], json!(field), "{err}");
    }
    // A bad assertion after good ones fails the whole batch, naming the bad one.
    let mut assertions = refund_assertions();
    assertions.as_array_mut().unwrap().push(content("late_bad", "regex_match", "(open"));
    let err = batch_error(&mut engine, assertions);
    assert_eq!(err["message"], json!("assertion 'late_bad' (content): invalid regex '(open'"));
    assert_eq!(err["data"]["field"], json!("params.assertions[5].spec.value"));
    let op = batch_error(
        &mut engine,
        json!([{"assertion_id": "op", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "approx", "value": 1}}]),
    );
    assert!(
        op["data"]["detail"].as_str().unwrap().contains("lt, lte, gt, gte, eq, between"),
        "{op}"
    );
    assert_still_serving(&mut engine, true);
}

#[test]
fn duplicate_assertion_id_is_an_assertion_error() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let err = batch_error(
        &mut engine,
        json!([
            content("dup", "contains", "refund"),
            content("other", "contains", "x"),
            content("dup", "contains", "RFD")
        ]),
    );
    assert_eq!(
        err["message"],
        json!("duplicate assertion_id 'dup' in batch (assertions[0] and assertions[2])")
    );
    assert_eq!(err["data"]["assertion_id"], json!("dup"));
    assert_eq!(err["data"]["field"], json!("params.assertions[2].assertion_id"));
    assert_still_serving(&mut engine, true);
}

#[test]
fn assertion_id_longer_than_256_bytes_is_an_assertion_error() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let long = "a".repeat(257);
    let err = batch_error(&mut engine, json!([content(&long, "contains", "refund")]));
    assert_eq!(err["message"], json!("assertion_id exceeds maximum length: 257 > 256"));
    assert_eq!(err["data"]["field"], json!("params.assertions[0].assertion_id"));
    // 256 bytes (here 128 two-byte characters) is still fine.
    let ok = "é".repeat(128);
    let resp = engine.request(&evaluate_request(
        json!(2),
        refund_trace(),
        json!([content(&ok, "contains", "refund")]),
    ));
    let result = expect_result(&resp);
    assert_eq!(result["results"][0]["assertion_id"], json!(ok));
    // Missing or empty ids are refused.
    let err = batch_error(
        &mut engine,
        json!([{"type": "content", "spec": {"target": "output.message", "check": "contains", "value": "x"}}]),
    );
    assert_eq!(err["message"], json!("assertions[0] missing required field: assertion_id"));
    let err = batch_error(&mut engine, json!([content("", "contains", "refund")]));
    assert_eq!(err["message"], json!("assertions[0] assertion_id is empty"));
    assert_eq!(err["data"]["field"], json!("params.assertions[0].assertion_id"));
    assert_still_serving(&mut engine, true);
}

#[test]
fn evaluate_batch_params_that_are_not_an_object_are_invalid_params() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let cases = [
        json!({"jsonrpc": "2.0", "id": 3, "method": "evaluate_batch", "params": []}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "evaluate_batch", "params": [refund_trace(), refund_assertions()]}),
    ];
    for req in cases {
        let resp = engine.request(&req);
        assert_eq!(resp["id"], req["id"]);
        let err = expect_error(&resp, -32602);
        assert_eq!(
            err["message"],
            json!("evaluate_batch params must be an object with trace and assertions"),
            "{req}: {resp}"
        );
        assert_eq!(err["data"]["field"], json!("params"), "{resp}");
    }
    // Absent params read as `{}`, as for every method: the trace is missing.
    let cases = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "evaluate_batch"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "evaluate_batch", "params": null}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "evaluate_batch", "params": {}}),
    ];
    for req in cases {
        let resp = engine.request(&req);
        let err = expect_error(&resp, 1001);
        assert_eq!(
            err["message"],
            json!("evaluate_batch params missing required field: trace"),
            "{req}: {resp}"
        );
        assert_eq!(err["data"]["field"], json!("params.trace"), "{resp}");
    }
    // A member sent twice: which one was meant cannot be told.
    let line = r#"{"jsonrpc":"2.0","id":6,"method":"evaluate_batch","params":{"assertions":[],"trace":{"schema_version":1,"trace_id":"t","output":{"message":"x"}},"assertions":[]}}"#;
    engine.send_line(line);
    let resp: Value = serde_json::from_slice(&engine.recv_bytes_within(std::time::Duration::from_secs(10))).unwrap();
    let err = expect_error(&resp, 1002);
    assert_eq!(
        err["message"],
        json!("evaluate_batch params hold the member assertions more than once")
    );
    assert_eq!(err["data"]["field"], json!("params.assertions"), "{resp}");
    engine.send_line(
        &line
            .replacen(r#""assertions":[],"#, r#""trace":{},"#, 1)
            .replace(r#""id":6"#, r#""id":7"#),
    );
    let resp: Value = serde_json::from_slice(&engine.recv_bytes_within(std::time::Duration::from_secs(10))).unwrap();
    let err = expect_error(&resp, 1001);
    assert_eq!(err["data"]["field"], json!("params.trace"), "{resp}");
    // A member the method does not read, named with a lone surrogate: 1002
    // like every other unusable member of evaluate_batch.
    engine.send_line(r#"{"jsonrpc":"2.0","id":8,"method":"evaluate_batch","params":{"trace":{"schema_version":1,"trace_id":"t","output":{"message":"x"}},"assertions":[],"\ud800":1}}"#);
    let resp: Value = serde_json::from_slice(&engine.recv_bytes_within(std::time::Duration::from_secs(10))).unwrap();
    let err = expect_error(&resp, 1002);
    assert!(err["message"].as_str().unwrap().contains("invalid escape"), "{resp}");
    assert_still_serving(&mut engine, true);
}

// ---------------------------------------------------------------- results

#[test]
fn results_are_in_request_order_with_request_id_echoed() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let mut assertions = refund_assertions();
    let list = assertions.as_array_mut().unwrap();
    list.reverse();
    list[1]["request_id"] = json!("rid-2");
    list[3]["request_id"] = json!("rid-4");
    list.push(content("z_fail", "contains", "apology"));
    list.push(json!({"assertion_id": "a_soft", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "sorry", "soft": true}}));
    let resp = engine.request(&evaluate_request(json!(11), refund_trace(), assertions.clone()));
    assert_eq!(resp["id"], json!(11));
    let result = expect_result(&resp);
    let results = result["results"].as_array().unwrap();
    let ids: Vec<&str> = results.iter().map(|r| r["assertion_id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "assert_005",
            "assert_004",
            "assert_003",
            "assert_002",
            "assert_001",
            "z_fail",
            "a_soft"
        ]
    );
    let rids: Vec<&Value> = results.iter().map(|r| &r["request_id"]).collect();
    assert_eq!(
        rids,
        [
            &Value::Null,
            &json!("rid-2"),
            &Value::Null,
            &json!("rid-4"),
            &Value::Null,
            &Value::Null,
            &Value::Null
        ]
    );
    assert_eq!(
        statuses(&result),
        ["pass", "pass", "pass", "pass", "pass", "hard_fail", "soft_fail"]
    );
    for r in results {
        let obj = r.as_object().unwrap();
        for key in ["assertion_id", "status", "score", "explanation", "cost", "duration_ms"] {
            assert!(obj.contains_key(key), "result lacks {key}: {r}");
        }
        // Echoed when the assertion carried one; omitted, never null, when not.
        assert!(obj.get("request_id").is_none_or(Value::is_string), "{r}");
        assert!(r["explanation"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
        assert_eq!(r["cost"].as_f64(), Some(0.0), "{r}");
        assert!(r.get("cached").is_none(), "fresh results are not marked cached: {r}");
    }
    assert_eq!(results[1]["score"].as_f64(), Some(1.0));
    assert_eq!(results[5]["score"].as_f64(), Some(0.0));
    assert_eq!(
        results[1]["explanation"],
        json!("output.message contains 'refund' (case-insensitive).")
    );
    assert_eq!(
        results[2]["explanation"],
        json!("Tool sequence ['lookup_order', 'process_refund'] found in order at steps [1, 2].")
    );
    assert_eq!(
        results[3]["explanation"],
        json!("metadata.cost_usd = 0.0067, constraint lte 0.01 satisfied.")
    );
    assert_eq!(result["total_cost"].as_f64(), Some(0.0));
    assert!(result["total_duration_ms"].is_u64(), "{result}");
}

#[test]
fn request_id_makes_evaluation_idempotent() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let assertions = refund_assertions_with_request_ids();
    let first = expect_result(&engine.request(&evaluate_request(json!(1), refund_trace(), assertions.clone())));
    for r in first["results"].as_array().unwrap() {
        assert!(r.get("cached").is_none(), "{r}");
    }
    // The same request again (same ids, specs and trace): the cached results come back.
    let second = expect_result(&engine.request(&evaluate_request(json!(2), refund_trace(), assertions.clone())));
    let (a, b) = (first["results"].as_array().unwrap(), second["results"].as_array().unwrap());
    assert_eq!(a.len(), 5);
    assert_eq!(b.len(), 5);
    for (x, y) in a.iter().zip(b) {
        assert_eq!(y["cached"], json!(true), "{y}");
        for key in ["assertion_id", "status", "score", "explanation", "request_id"] {
            assert_eq!(x[key], y[key], "{key}: {x} vs {y}");
        }
    }
    assert_eq!(b[3]["request_id"], json!("req_idempotency_key_004"));
    // The same request ids on a different trace are a different request: refused, never a stale answer.
    let mut changed = refund_trace();
    changed["output"]["message"] = json!("We cannot process this.");
    let err = expect_error(&engine.request(&evaluate_request(json!(3), changed, assertions)), 1002);
    assert_eq!(
        err["message"],
        json!("assertion 'assert_001': request_id 'req_idempotency_key_001' was already used for a different request")
    );
}

/// `assertion` with the idempotency key `request_id`.
fn keyed(mut assertion: Value, request_id: &str) -> Value {
    assertion["request_id"] = json!(request_id);
    assertion
}

#[test]
fn request_id_reused_for_a_different_spec_is_an_assertion_error() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let a = keyed(content("first", "contains", "refund"), "rid-x");
    expect_result(&engine.request(&evaluate_request(json!(1), refund_trace(), json!([a]))));
    let b = keyed(content("second", "contains", "business days"), "rid-x");
    let err = batch_error(&mut engine, json!([content("fresh", "contains", "RFD"), b]));
    assert_eq!(
        err["message"],
        json!("assertion 'second': request_id 'rid-x' was already used for a different request")
    );
    assert_eq!(err["data"]["assertion_id"], json!("second"));
    assert_eq!(err["data"]["field"], json!("params.assertions[1].request_id"));
    // Reusing it for another type is refused too.
    let c = keyed(
        json!({"assertion_id": "third", "type": "trace", "spec": {"check": "no_duplicates"}}),
        "rid-x",
    );
    let err = batch_error(&mut engine, json!([c]));
    assert_eq!(err["data"]["assertion_id"], json!("third"));
    assert_still_serving(&mut engine, true);
}

#[test]
fn one_request_id_for_two_different_assertions_of_a_batch_is_refused_up_front() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let a = keyed(content("first", "contains", "refund"), "rid-twice");
    let b = keyed(content("second", "contains", "business days"), "rid-twice");
    // Refused the first time, so that a retry of the same batch is answered
    // the same way rather than refused against itself.
    for id in [1, 2] {
        let err = expect_error(
            &engine.request(&evaluate_request(json!(id), refund_trace(), json!([a.clone(), b.clone()]))),
            1002,
        );
        assert_eq!(
            err["message"],
            json!("assertion 'second': request_id 'rid-twice' is also the request_id of assertions[0] in this batch, which is a different assertion")
        );
        assert_eq!(err["data"]["field"], json!("params.assertions[1].request_id"));
    }
    // The same assertion twice under one key is the same request: both answered.
    let mut c = a.clone();
    c["assertion_id"] = json!("first-again");
    let ok = expect_result(&engine.request(&evaluate_request(json!(3), refund_trace(), json!([a, c]))));
    assert_eq!(ok["results"].as_array().unwrap().len(), 2, "{ok}");
    assert_still_serving(&mut engine, true);
}

/// Long keyword lists that never occur in [`big_output`].
fn missing_keywords(seed: usize, n: usize) -> Vec<String> {
    (0..n).map(|k| format!("zz{seed:03}-{k:02}-{}", "z0123456789".repeat(11))).collect()
}

/// ~400k characters of text made only of the letters a-m and spaces.
fn big_output() -> String {
    let words = ["alpha", "beige", "cable", "dime", "glade", "hike", "jade", "lilac", "maid", "blame"];
    let mut s = String::with_capacity(400_100);
    let mut i = 0;
    while s.len() < 400_000 {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i += 1;
    }
    s
}

/// 500 failing content assertions whose explanations list long keywords.
fn long_explanation_assertions() -> Value {
    let checks = ["keyword_all", "keyword_any", "keyword_all", "contains"];
    let list: Vec<Value> = (0..500)
        .map(|i| {
            let check = checks[i % checks.len()];
            let mut spec = json!({"target": "output.message", "check": check, "case_sensitive": true});
            if check == "contains" {
                spec["value"] = json!(missing_keywords(i, 1)[0]);
            } else {
                spec["values"] = json!(missing_keywords(i, 20));
            }
            json!({"assertion_id": format!("a{i:03}"), "type": "content", "spec": spec})
        })
        .collect();
    Value::Array(list)
}

#[test]
fn response_line_never_exceeds_64k_with_500_long_explanations() {
    // 500 failing checks on 400 KB, each finding the closest miss: seconds
    // in a release build, near the default deadline in the unoptimised test
    // binary. The deadline is not what this test is about.
    let mut engine = Engine::spawn_args(&["--log-level=warn", "--eval-timeout=120s"]);
    engine.initialize();
    let mut trace = minimal_trace();
    trace["output"]["message"] = json!(big_output());
    engine.send(&evaluate_request(json!("big"), trace, long_explanation_assertions()));
    // Waited for as long as the deadline allows: about 28 s on a busy 2-core machine.
    let line = String::from_utf8(engine.recv_bytes_within(std::time::Duration::from_secs(120))).unwrap();
    assert!(line.len() <= MAX_RESPONSE_LINE, "response line is {} bytes", line.len());
    let resp: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(resp["id"], json!("big"));
    let result = expect_result(&resp);
    let results = result["results"].as_array().unwrap();
    assert_eq!(results.len(), 500);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["assertion_id"], json!(format!("a{i:03}")));
        assert_eq!(r["status"], json!("hard_fail"), "{r}");
        assert!(r["explanation"].is_string(), "{r}");
    }
    assert_still_serving(&mut engine, true);
}

#[test]
fn response_line_limit_holds_at_the_exact_boundary() {
    // Results whose serialised size lands exactly on the engine's budget for
    // the `result` member: the whole line must still be at most 65536 bytes.
    let mut engine = Engine::spawn();
    engine.initialize();
    let trace = minimal_trace();
    let assertions = |n: usize, pad: usize| -> Value {
        let mut list: Vec<Value> = (0..n).map(|i| content(&format!("c{i:03}"), "contains", "hello")).collect();
        list.push(content(&"p".repeat(pad), "contains", "hello"));
        Value::Array(list)
    };
    // Envelope around the result: {"jsonrpc":"2.0","id":7,"result":...}
    let envelope = "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":}".len();
    let mut measure = |n: usize, pad: usize| -> usize {
        engine.send(&evaluate_request(json!(7), trace.clone(), assertions(n, pad)));
        let line = engine.recv_line();
        assert!(line.len() <= MAX_RESPONSE_LINE, "response line is {} bytes", line.len());
        line.len() - envelope
    };
    let one = measure(1, 1);
    let two = measure(2, 1);
    let per = two - one;
    let base = one - per;
    // Leave 100-250 bytes of room, then close it with the pad id's length.
    let n = (MAX_RESPONSE_LINE - envelope - base - 100) / per;
    let result_len = measure(n, 1);
    let gap = MAX_RESPONSE_LINE - envelope - result_len;
    assert!((1..=250).contains(&gap), "calibration failed: gap {gap}");
    let mut closest = usize::MAX;
    let lo = gap.saturating_sub(12).max(1);
    for extra in lo..=(gap + 12).min(255) {
        let len = measure(n, 1 + extra) + envelope;
        closest = closest.min(MAX_RESPONSE_LINE - len);
    }
    assert!(closest <= 4, "the sweep never came within 4 bytes of the limit (closest {closest})");
}

#[test]
fn batch_array_response_line_never_exceeds_64k() {
    // Each evaluate_batch result fits on its own; the array line holding two must fit too.
    let mut engine = Engine::spawn();
    engine.initialize();
    let mut trace = minimal_trace();
    trace["output"]["message"] = json!(big_output());
    let batch = json!([
        evaluate_request(json!("b1"), trace.clone(), long_explanation_assertions()),
        evaluate_request(json!("b2"), trace, long_explanation_assertions())
    ]);
    engine.send(&batch);
    let line = engine.recv_line();
    assert!(line.len() <= MAX_RESPONSE_LINE, "batch response line is {} bytes", line.len());
    let resp: Value = serde_json::from_str(&line).unwrap();
    let items = resp.as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_still_serving(&mut engine, true);
}

// ---------------------------------------------------------------- plugins

#[test]
fn submit_plugin_result_is_accepted() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let resp = engine.request(&plugin_request(json!(10)));
    assert_eq!(resp["id"], json!(10));
    assert_eq!(expect_result(&resp), json!({"accepted": true}));
    // Unknown fields are ignored (Attest protocol v1 §6), metadata is optional.
    let mut req = plugin_request(json!(11));
    req["params"]["result"].as_object_mut().unwrap().remove("metadata");
    req["params"]["future_field"] = json!({"x": 1});
    req["params"]["result"]["status"] = json!("soft_fail");
    req["params"]["result"]["score"] = json!(0);
    assert_eq!(expect_result(&engine.request(&req)), json!({"accepted": true}));
}

#[test]
fn submit_plugin_result_validation_errors_name_the_field() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let cases: [(&str, Value, &str, &str); 6] = [
        (
            "/result/status",
            json!("passed"),
            "params.result.status",
            "submit_plugin_result result.status 'passed' is not one of pass, soft_fail, hard_fail",
        ),
        (
            "/result/score",
            json!(1.5),
            "params.result.score",
            "submit_plugin_result result.score 1.5 is outside [0, 1]",
        ),
        (
            "/result/score",
            json!(-0.1),
            "params.result.score",
            "submit_plugin_result result.score -0.1 is outside [0, 1]",
        ),
        (
            "/trace_id",
            json!(""),
            "params.trace_id",
            "submit_plugin_result trace_id must be a non-empty string",
        ),
        (
            "/plugin_name",
            Value::Null,
            "params.plugin_name",
            "submit_plugin_result missing required field: plugin_name",
        ),
        (
            "/result/explanation",
            json!(3),
            "params.result.explanation",
            "submit_plugin_result result.explanation must be a string",
        ),
    ];
    for (i, (pointer, value, field, message)) in cases.into_iter().enumerate() {
        let mut req = plugin_request(json!(i));
        *req.pointer_mut(&format!("/params{pointer}")).unwrap() = value;
        let resp = engine.request(&req);
        assert_eq!(resp["id"], json!(i));
        let err = expect_error(&resp, 1002);
        assert_eq!(err["message"], json!(message), "{resp}");
        assert_eq!(err["data"]["field"], json!(field), "{resp}");
        // Still serving: a good plugin result is accepted right after.
        assert_eq!(
            expect_result(&engine.request(&plugin_request(json!("ok")))),
            json!({"accepted": true})
        );
    }
    assert_still_serving(&mut engine, true);
}
