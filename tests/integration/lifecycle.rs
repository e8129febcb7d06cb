//! Process lifecycle: shutdown, end of input, signals, concurrency,
//! back-pressure, oversized input, stalled stderr and start-up options.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Counts how many times each id was answered.
fn id_counts(responses: &[Value]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in responses {
        *counts.entry(r["id"].to_string()).or_insert(0) += 1;
    }
    counts
}

/// Asserts that `responses` answer exactly the ids in `expected`, once each.
fn assert_answered_once(responses: &[Value], expected: &[Value]) {
    let counts = id_counts(responses);
    for id in expected {
        assert_eq!(
            counts.get(&id.to_string()),
            Some(&1),
            "id {id} must be answered exactly once; answered: {counts:?}"
        );
    }
    assert_eq!(responses.len(), expected.len(), "unexpected extra responses: {counts:?}");
}

fn light_request(id: Value) -> Value {
    evaluate_request(id, refund_trace(), refund_assertions())
}

fn parse_lines(lines: Vec<Vec<u8>>) -> Vec<Value> {
    lines.into_iter().map(|l| serde_json::from_slice(&l).unwrap()).collect()
}

/// Statuses a [`heavy_assertions`] batch must produce on a [`heavy_trace`].
fn expected_heavy_statuses(n_steps: usize) -> Vec<&'static str> {
    let mut s = vec!["pass"; n_steps];
    s.extend(["hard_fail", "pass", "hard_fail"]);
    s
}

// ---------------------------------------------------------------- shutdown

#[test]
fn shutdown_reports_counts_then_exits_cleanly() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let r = expect_result(&engine.request(&light_request(json!(1))));
    assert_eq!(statuses(&r), ["pass"; 5]);
    let three = json!([
        content("x1", "contains", "refund"),
        content("x2", "contains", "apology"),
        {"assertion_id": "x3", "type": "trace", "spec": {"check": "no_duplicates"}}
    ]);
    let r = expect_result(&engine.request(&evaluate_request(json!(2), refund_trace(), three)));
    assert_eq!(statuses(&r), ["pass", "hard_fail", "pass"]);
    // Failed requests evaluate nothing.
    expect_error(
        &engine.request(&evaluate_request(json!(3), json!({"schema_version": 1}), refund_assertions())),
        1001,
    );
    expect_error(
        &engine.request(&evaluate_request(
            json!(4),
            refund_trace(),
            json!([content("bad", "regex_match", "(")]),
        )),
        1002,
    );

    let resp = engine.request(&shutdown_request(json!(99)));
    assert_eq!(resp["id"], json!(99));
    assert_eq!(expect_result(&resp), json!({"sessions_completed": 1, "assertions_evaluated": 8}));
    // stdin is still open: the engine exits on its own and prints nothing more.
    let rest = engine.lines_until_eof();
    assert!(
        rest.is_empty(),
        "output after the shutdown response: {:?}",
        rest.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>()
    );
    let status = engine.wait_exit();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn shutdown_waits_for_in_flight_requests() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let bytes = 4_000_000;
    let n = heavy_steps(bytes);
    engine.send(&evaluate_request(json!("heavy"), heavy_trace(bytes), heavy_assertions(n)));
    engine.send(&shutdown_request(json!("bye")));
    let all = engine.values_until_eof();
    assert_answered_once(&all, &[json!("heavy"), json!("bye")]);
    let heavy = all.iter().find(|r| r["id"] == json!("heavy")).unwrap();
    assert_eq!(statuses(&expect_result(heavy)), expected_heavy_statuses(n));
    let bye = all.iter().find(|r| r["id"] == json!("bye")).unwrap();
    assert_eq!(expect_result(bye), json!({"sessions_completed": 1, "assertions_evaluated": n + 3}));
    assert_eq!(engine.wait_exit().code(), Some(0));
}

/// What follows `shutdown` in the input is never read, so never run, however
/// the shutdown's task is scheduled; what precedes it runs to its answer.
#[test]
fn nothing_after_shutdown_runs_and_everything_before_it_is_answered() {
    for round in 0..5 {
        let mut engine = Engine::spawn();
        engine.initialize();
        engine.send(&light_request(json!("before")));
        engine.send(&shutdown_request(json!("bye")));
        engine.send(&light_request(json!("after")));
        engine.send(&json!({"jsonrpc": "2.0", "id": "listed", "method": "list_plugins"}));
        let all = engine.values_until_eof();
        assert_answered_once(&all, &[json!("before"), json!("bye")]);
        let before = all.iter().find(|r| r["id"] == json!("before")).unwrap();
        assert_eq!(statuses(&expect_result(before)), ["pass"; 5], "round {round}");
        let bye = all.iter().find(|r| r["id"] == json!("bye")).unwrap();
        assert_eq!(expect_result(bye)["assertions_evaluated"], json!(5), "round {round}: {bye}");
        assert_eq!(engine.wait_exit().code(), Some(0));
    }
}

/// A `shutdown` the handler refuses (wrong `jsonrpc`, params that are not
/// an object) is answered with its error and ends nothing.
#[test]
fn a_malformed_shutdown_is_refused_and_the_session_goes_on() {
    let mut engine = Engine::spawn();
    engine.initialize();
    for (id, line) in [
        (2, r#"{"jsonrpc":"1.0","id":2,"method":"shutdown"}"#),
        (3, r#"{"jsonrpc":"2.0","id":3,"method":"shutdown","params":5}"#),
    ] {
        engine.send_line(line);
        let resp: Value = serde_json::from_str(&engine.recv_line()).unwrap();
        assert_eq!(resp["id"], json!(id), "{resp}");
        assert!(resp.get("error").is_some(), "{resp}");
    }
    let r = expect_result(&engine.request(&light_request(json!("still"))));
    assert_eq!(statuses(&r), ["pass"; 5]);
    // A byte order mark before a real shutdown: still a shutdown.
    engine.send_line(&format!("\u{feff}{}", shutdown_request(json!("bye"))));
    engine.send(&light_request(json!("after")));
    let all = engine.values_until_eof();
    assert_answered_once(&all, &[json!("bye")]);
    assert_eq!(engine.wait_exit().code(), Some(0));
}

/// A client that closed its end of stdout can be sent nothing: the engine
/// stops reading (so evaluates nothing for no one) and exits 1, even with
/// stdin still open.
#[test]
fn closed_stdout_ends_the_engine() {
    use std::io::Write as _;
    let mut child = crate::common::command()
        .arg("--log-level=error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().unwrap();
    let started = std::time::Instant::now();
    let line = |v: Value| format!("{v}\n");
    let _ = stdin.write_all(line(initialize_request(json!(1), init_params())).as_bytes());
    for i in 0..50 {
        if stdin.write_all(line(light_request(json!(i))).as_bytes()).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the engine kept running");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1), "{status:?}");
    drop(stdin);
}

// ---------------------------------------------------------------- end of input

#[test]
fn end_of_input_drains_in_flight_work_and_exits_0() {
    let mut engine = Engine::spawn();
    engine.initialize();
    let bytes = 3_000_000;
    let n = heavy_steps(bytes);
    let mut expected = Vec::new();
    for h in 0..2 {
        let id = json!(format!("h{h}"));
        engine.send(&evaluate_request(id.clone(), heavy_trace(bytes), heavy_assertions(n)));
        expected.push(id);
    }
    for i in 0..10 {
        engine.send(&light_request(json!(i)));
        expected.push(json!(i));
    }
    engine.close_stdin();
    let all = engine.values_until_eof();
    assert_answered_once(&all, &expected);
    for r in &all {
        let result = expect_result(r);
        if r["id"].is_string() {
            assert_eq!(statuses(&result), expected_heavy_statuses(n));
        } else {
            assert_eq!(statuses(&result), ["pass"; 5]);
        }
    }
    assert_eq!(engine.wait_exit().code(), Some(0));
}

#[test]
fn end_of_input_before_initialize_exits_0_silently() {
    let mut engine = Engine::spawn();
    engine.close_stdin();
    assert!(engine.lines_until_eof().is_empty());
    assert_eq!(engine.wait_exit().code(), Some(0));
}

// ---------------------------------------------------------------- signals

/// Sends heavy and light requests, waits until the engine has read all of
/// them (a marker request sent last is answered), signals, and checks that
/// every request is answered and the exit code is 0.
fn signal_drains_in_flight_requests(signal: &str) {
    let mut engine = Engine::spawn();
    engine.initialize();
    let bytes = 3_000_000;
    let n = heavy_steps(bytes);
    let mut expected = Vec::new();
    for h in 0..2 {
        let id = json!(format!("h{h}"));
        engine.send(&evaluate_request(id.clone(), heavy_trace(bytes), heavy_assertions(n)));
        expected.push(id);
    }
    for i in 0..10 {
        engine.send(&light_request(json!(i)));
        expected.push(json!(i));
    }
    engine.send(&plugin_request(json!("marker")));
    expected.push(json!("marker"));
    // Lines are read in order: once the marker is answered, every request
    // before it has been read and is either answered or in flight.
    let mut seen = Vec::new();
    loop {
        let v: Value = engine.recv();
        let is_marker = v["id"] == json!("marker");
        seen.push(v);
        if is_marker {
            break;
        }
    }
    engine.signal(signal);
    seen.extend(engine.values_until_eof());
    assert_answered_once(&seen, &expected);
    for r in &seen {
        let result = expect_result(r);
        if r["id"].as_str().is_some_and(|s| s.starts_with('h')) {
            assert_eq!(statuses(&result), expected_heavy_statuses(n));
        }
    }
    let status = engine.wait_exit();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn sigterm_drains_in_flight_requests_and_exits_0() {
    signal_drains_in_flight_requests("TERM");
}

#[test]
fn sigint_drains_in_flight_requests_and_exits_0() {
    signal_drains_in_flight_requests("INT");
}

#[test]
fn sigterm_when_idle_exits_0() {
    let mut engine = Engine::spawn();
    engine.initialize();
    engine.signal("TERM");
    assert!(engine.lines_until_eof().is_empty());
    assert_eq!(engine.wait_exit().code(), Some(0));
}

// ---------------------------------------------------------------- concurrency

#[test]
fn sixty_four_concurrent_requests_are_answered_out_of_order() {
    let mut engine = Engine::spawn();
    let init = engine.initialize();
    assert_eq!(init["max_concurrent_requests"], json!(64));
    let bytes = 9_000_000;
    let n = heavy_steps(bytes);
    let heavy = heavy_trace(bytes);
    let heavy_line = serde_json::to_string(&evaluate_request(json!("heavy"), heavy, heavy_assertions(n))).unwrap();
    assert!(
        heavy_line.len() > 8_000_000 && heavy_line.len() < MAX_TRACE_BYTES,
        "{}",
        heavy_line.len()
    );
    engine.send_line(&heavy_line);
    let mut expected = vec![json!("heavy")];
    for i in 1..64 {
        engine.send(&light_request(json!(i)));
        expected.push(json!(i));
    }
    let responses: Vec<Value> = (0..64).map(|_| engine.recv()).collect();
    assert_answered_once(&responses, &expected);
    assert_ne!(
        responses[0]["id"],
        json!("heavy"),
        "the heavy request must not hold back the light ones"
    );
    let heavy_at = responses.iter().position(|r| r["id"] == json!("heavy")).unwrap();
    assert_eq!(statuses(&expect_result(&responses[heavy_at])), expected_heavy_statuses(n));
    for r in responses.iter().filter(|r| r["id"] != json!("heavy")) {
        assert_eq!(statuses(&expect_result(r)), ["pass"; 5], "{r}");
    }
}

#[test]
fn sequential_client_sees_answers_in_order() {
    let mut engine = Engine::spawn();
    engine.initialize();
    for i in 0..60 {
        let req = match i % 4 {
            0 => light_request(json!(i)),
            1 => plugin_request(json!(i)),
            2 => rpc(json!(i), "frobnicate", json!({})),
            _ => evaluate_request(json!(i), json!({"schema_version": 1}), json!([])),
        };
        let resp = engine.request(&req);
        assert_eq!(resp["id"], json!(i), "{resp}");
        match i % 4 {
            0 => assert_eq!(statuses(&expect_result(&resp)), ["pass"; 5]),
            1 => assert_eq!(expect_result(&resp), json!({"accepted": true})),
            2 => {
                expect_error(&resp, -32601);
            }
            _ => {
                expect_error(&resp, 1001);
            }
        }
    }
}

#[test]
fn pipelined_initialize_and_first_batch_are_both_served() {
    let mut engine = Engine::spawn();
    let mut text = serde_json::to_string(&initialize_request(json!("i"), init_params())).unwrap();
    text.push('\n');
    text.push_str(&serde_json::to_string(&light_request(json!("e"))).unwrap());
    text.push('\n');
    engine.write_raw(text.as_bytes());
    let first = engine.recv();
    assert_eq!(first["id"], json!("i"));
    assert_eq!(expect_result(&first)["compatible"], json!(true));
    let second = engine.recv();
    assert_eq!(second["id"], json!("e"));
    assert_eq!(statuses(&expect_result(&second)), ["pass"; 5]);
}

// ---------------------------------------------------------------- oversized input

/// A request line of exactly `len` bytes whose params carry a padded trace.
fn oversized_line(head: &str, len: usize) -> String {
    let tail = "\"},\"assertions\":[]}}";
    let head =
        format!("{head}\"params\":{{\"trace\":{{\"schema_version\":1,\"trace_id\":\"t\",\"output\":{{\"message\":\"m\"}},\"pad\":\"");
    let mut s = String::with_capacity(len);
    s.push_str(&head);
    s.extend(std::iter::repeat_n('x', len - head.len() - tail.len()));
    s.push_str(tail);
    assert_eq!(s.len(), len);
    s
}

#[test]
fn oversized_line_is_answered_and_memory_stays_bounded() {
    let mut engine = Engine::spawn();
    engine.initialize();
    // Growth over the idle engine, so the bound does not depend on binary size.
    let base_kb = engine.proc_status_kb("VmHWM");
    let len = 20_000_000;
    engine.send_line(&oversized_line(
        "{\"jsonrpc\":\"2.0\",\"id\":\"huge-1\",\"method\":\"evaluate_batch\",",
        len,
    ));
    let resp = engine.recv();
    assert_eq!(resp["id"], json!("huge-1"), "the id is recovered from the line prefix: {resp}");
    let err = expect_error(&resp, 1001);
    assert_eq!(
        err["message"],
        json!(format!("request line exceeds max size: {len} > {MAX_LINE_BYTES} bytes"))
    );
    assert_eq!(err["data"]["field"], json!("params.trace"));
    let hwm_kb = engine.proc_status_kb("VmHWM");
    assert!(
        hwm_kb - base_kb < 48 * 1024,
        "peak RSS after a 20 MB line is {hwm_kb} kB (idle: {base_kb} kB)"
    );

    // Still serving.
    let resp = engine.request(&light_request(json!("after")));
    assert_eq!(statuses(&expect_result(&resp)), ["pass"; 5]);

    // "id" after "params": it cannot be recovered, so the answer has id null.
    let len2 = 12_000_000;
    let mut line = oversized_line("{\"jsonrpc\":\"2.0\",\"method\":\"evaluate_batch\",", len2);
    line.truncate(line.len() - 1);
    line.push_str(",\"id\":\"late\"}");
    engine.send_line(&line);
    let resp = engine.recv();
    assert_eq!(resp["id"], Value::Null, "{resp}");
    expect_error(&resp, 1001);

    // An id too long to echo (a complete line's would be refused): the
    // answer has id null and stays one short line.
    let long_id = "i".repeat(60_000);
    engine.send_line(&oversized_line(
        &format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{long_id}\",\"method\":\"evaluate_batch\","),
        len2,
    ));
    let line = engine.recv_line();
    assert!(
        line.len() < 2048,
        "answer to an oversized line with a 60 KB id is {} bytes",
        line.len()
    );
    let resp: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(resp["id"], Value::Null, "{resp}");
    expect_error(&resp, 1001);

    // Another method: -32600 with the id.
    engine.send_line(&oversized_line(
        "{\"jsonrpc\":\"2.0\",\"id\":17,\"method\":\"submit_plugin_result\",",
        len2,
    ));
    let resp = engine.recv();
    assert_eq!(resp["id"], json!(17));
    let err = expect_error(&resp, -32600);
    assert_eq!(
        err["message"],
        json!(format!("request line exceeds max size: {len2} > {MAX_LINE_BYTES} bytes"))
    );

    let resp = engine.request(&light_request(json!("again")));
    assert_eq!(statuses(&expect_result(&resp)), ["pass"; 5]);
    let hwm_kb = engine.proc_status_kb("VmHWM");
    assert!(
        hwm_kb - base_kb < 64 * 1024,
        "peak RSS after oversized lines is {hwm_kb} kB (idle: {base_kb} kB)"
    );
}

// ---------------------------------------------------------------- stderr

#[test]
fn stalled_stderr_never_blocks_responses() {
    // Debug logging with nobody reading stderr: the pipe fills within a few
    // hundred requests; the engine must drop log lines rather than block.
    let mut engine = Engine::spawn_with(&["--log-level=debug"], Stderr::Stall);
    engine.initialize();
    let trace = minimal_trace();
    let assertions = json!([content("c", "contains", "hello"), content("d", "not_contains", "bye")]);
    for i in 0..3000 {
        engine.send(&evaluate_request(json!(i), trace.clone(), assertions.clone()));
        let resp = engine.recv();
        assert_eq!(resp["id"], json!(i));
        assert_eq!(statuses(&expect_result(&resp)), ["pass", "pass"], "{resp}");
    }
    let resp = engine.request(&shutdown_request(json!("end")));
    assert_eq!(expect_result(&resp), json!({"sessions_completed": 1, "assertions_evaluated": 6000}));
    assert_eq!(engine.wait_exit().code(), Some(0));
}

// ---------------------------------------------------------------- command line

#[test]
fn version_is_printed() {
    for args in [&["--version"][..], &["version"][..]] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("attest-engine {VERSION}\n"),
            "{args:?}"
        );
    }
}

#[test]
fn bad_log_level_exits_2_with_a_clear_message() {
    let out = run(&["--log-level", "loud"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    // Refused by the parser, whatever the command: `version` too.
    assert!(err.contains("--log-level") && err.contains("invalid value 'loud'"), "{err}");
    assert!(err.contains("[possible values: debug, info, warn, error]"), "{err}");
    let out = run(&["--log-level", "loud", "version"]);
    assert_eq!(out.status.code(), Some(2));

    let err = refused_with_env("ATTEST_LOG_LEVEL", "chatty");
    assert!(
        err.contains("ATTEST_LOG_LEVEL") && err.contains("invalid log level 'chatty'"),
        "{err}"
    );
}

/// The engine started with `key=value` in its environment, which must make
/// it refuse to start (exit 2, nothing on stdout); returns its stderr.
fn refused_with_env(key: &str, value: &str) -> String {
    let out = command().env(key, value).stdin(std::process::Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on stdout");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_provider_setting_from_the_environment_names_the_variable() {
    let err = refused_with_env("ATTEST_EMBEDDING_PROVIDER", "onnx");
    assert!(
        err.contains("ATTEST_EMBEDDING_PROVIDER: unknown embedding provider 'onnx'; use auto, openai, local or off"),
        "{err}"
    );
}

#[test]
fn bad_config_file_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "typo.toml",
            "max_concurent_requests = 3\n",
            vec!["invalid config file", "max_concurent_requests"],
        ),
        ("syntax.toml", "max_concurrent_requests = = 3\n", vec!["invalid config file"]),
        (
            "type.toml",
            "max_concurrent_requests = \"many\"\n",
            vec!["invalid config file", "max_concurrent_requests"],
        ),
        (
            "range.toml",
            "max_concurrent_requests = 0\n",
            vec!["max_concurrent_requests must be between 1 and 1024, got 0"],
        ),
        (
            "timeout.toml",
            "eval_timeout = \"soon\"\n",
            vec!["eval_timeout", "'soon' is not a duration"],
        ),
        (
            "forever.toml",
            "drain_timeout = \"18446744073709551615s\"\n",
            vec!["drain_timeout", "is too long: durations are at most 100 years"],
        ),
        (
            "level.toml",
            "log_level = \"loud\"\n",
            vec!["log_level", "invalid log level 'loud'"],
        ),
        (
            "judge.toml",
            "[judge]\nprovider = \"gemini\"\n",
            vec![
                "[judge] provider in ",
                "judge.toml: unknown judge provider 'gemini'; use openai, anthropic or off",
            ],
        ),
    ];
    for (name, text, needles) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = run(&["--config", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("configuration error"), "{name}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{name}: stderr should mention {needle:?}: {err}");
        }
    }
    // The same bound on the flag, for every front door.
    for args in [
        &["--eval-timeout", "18446744073709551615s"][..],
        &[
            "--eval-timeout",
            "1e30",
            "eval",
            "--trace",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/refund_trace.json"),
            "--assertions",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/refund_assertions.json"),
        ][..],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--eval-timeout") && err.contains("too long"), "{args:?}: {err}");
    }
    let missing = dir.path().join("missing.toml");
    let out = run(&["--config", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read config file") && err.contains("missing.toml"), "{err}");
    // A device reports no size; it is read no further than the cap.
    let out = run(&["--config", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config file /dev/zero is larger than 16 MiB: check that --config names the engine's TOML config file"),
        "{err}"
    );
}

#[test]
fn config_file_max_concurrent_requests_is_advertised_and_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("attest.toml");
    std::fs::write(&path, "# test config\nmax_concurrent_requests = 3\nstrict_step_types = true\n").unwrap();
    let mut engine = Engine::spawn_args(&["--log-level=warn", "--config", path.to_str().unwrap()]);
    let init = engine.initialize();
    assert_eq!(init["max_concurrent_requests"], json!(3));
    // strict_step_types from the file applies too.
    let mut t = minimal_trace();
    t["steps"] = json!([{"type": "banana", "name": "x"}]);
    let err = expect_error(&engine.request(&evaluate_request(json!(0), t, json!([]))), 1001);
    assert_eq!(err["message"], json!("trace step 'x' has invalid type 'banana'"));
    // With only 3 permits, 20 pipelined requests are all still answered.
    let expected: Vec<Value> = (1..=20).map(|i| json!(i)).collect();
    for id in &expected {
        engine.send(&light_request(id.clone()));
    }
    let responses: Vec<Value> = (0..20).map(|_| engine.recv()).collect();
    assert_answered_once(&responses, &expected);

    // The command-line flag wins over the file.
    let mut engine = Engine::spawn_args(&[
        "--log-level=warn",
        "--config",
        path.to_str().unwrap(),
        "--max-concurrent-requests",
        "5",
    ]);
    assert_eq!(engine.initialize()["max_concurrent_requests"], json!(5));
}

#[test]
fn eof_after_shutdown_request_pipelined_with_work() {
    // initialize, work and shutdown written in one go, then stdin closed.
    let mut engine = Engine::spawn();
    let mut text = String::new();
    for msg in [
        initialize_request(json!(1), init_params()),
        light_request(json!(2)),
        light_request(json!(3)),
        shutdown_request(json!(4)),
    ] {
        text.push_str(&serde_json::to_string(&msg).unwrap());
        text.push('\n');
    }
    engine.write_raw(text.as_bytes());
    engine.close_stdin();
    let all = parse_lines(engine.lines_until_eof());
    assert_answered_once(&all, &[json!(1), json!(2), json!(3), json!(4)]);
    for id in [2, 3] {
        let r = all.iter().find(|r| r["id"] == json!(id)).unwrap();
        // Sent before shutdown, so it must be evaluated, not refused.
        assert_eq!(statuses(&expect_result(r)), ["pass"; 5], "{r}");
    }
    let bye = all.iter().find(|r| r["id"] == json!(4)).unwrap();
    assert_eq!(expect_result(bye), json!({"sessions_completed": 1, "assertions_evaluated": 10}));
    assert_eq!(engine.wait_exit().code(), Some(0));
}
