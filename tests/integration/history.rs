//! Result history through the real binary: persistence across engine
//! processes, `query_drift` statistics, dynamic thresholds, `drift_alert`
//! notifications, retention and session reports.
//!
//! Every test gets its own cache directory (and so its own history file),
//! passed as `ATTEST_CACHE_DIR`, so tests never see each other's results.

use crate::common::*;
use attest_engine::history::Fingerprint;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;

// ---------------------------------------------------------------- helpers

/// The keywords of [`kw_spec`]; a trace mentioning `k` of them scores `k / 4`.
const KW: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

/// An engine serving on stdio with its own cache directory `cache`.
fn spawn_in(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Engine {
    let mut cmd = command();
    cmd.env("ATTEST_CACHE_DIR", cache).arg("--log-level=warn").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Engine::spawn_command(cmd)
}

/// Writes `text` as a config file in `dir` and returns its path.
fn config_file(dir: &Path, text: &str) -> String {
    let path = dir.join("attest.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A trace of `agent` whose output message is `message`.
fn trace(trace_id: &str, agent: Option<&str>, message: &str) -> Value {
    let mut t = json!({
        "schema_version": 1,
        "trace_id": trace_id,
        "output": {"message": message},
        "steps": [{"type": "tool_call", "name": "lookup", "args": {"q": 1}, "result": {"ok": true}}],
        "metadata": {"cost_usd": 0.02}
    });
    if let Some(a) = agent {
        t["agent_id"] = json!(a);
    }
    t
}

/// A message that mentions the first `found` keywords of [`KW`].
fn kw_message(found: usize) -> String {
    if found == 0 {
        "nothing relevant".to_owned()
    } else {
        format!("{} and some filler", KW[..found].join(" "))
    }
}

/// A trace of `agent` whose message mentions `found` of the keywords.
fn kw_trace(agent: &str, found: usize) -> Value {
    trace(&format!("trc_{agent}_{found}"), Some(agent), &kw_message(found))
}

/// The keyword_all spec over [`KW`], plus `extra` keys (threshold, soft).
fn kw_spec(extra: Value) -> Value {
    let mut spec = json!({"target": "output.message", "check": "keyword_all", "values": KW});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

fn kw(id: &str, extra: Value) -> Value {
    json!({"assertion_id": id, "type": "content", "spec": kw_spec(extra)})
}

/// The fingerprint the engine must report for a content assertion on `agent`'s traces.
fn fingerprint(spec: &Value, agent: Option<&str>) -> String {
    Fingerprint::of("content", Some(spec), agent).hex()
}

/// Evaluates and returns the result (panics on an error response).
fn evaluate(engine: &mut Engine, trace: Value, assertions: Value) -> Value {
    let resp = engine.request(&evaluate_request(json!("ev"), trace, assertions));
    assert_eq!(resp["id"], json!("ev"), "{resp}");
    expect_result(&resp)
}

/// Evaluates one assertion; returns its result object.
fn evaluate_one(engine: &mut Engine, trace: Value, assertion: Value) -> Value {
    let r = evaluate(engine, trace, json!([assertion]));
    r["results"][0].clone()
}

/// `query_drift` with `params`; returns the response.
fn query_drift(engine: &mut Engine, params: Value) -> Value {
    engine.request(&rpc(json!("qd"), "query_drift", params))
}

/// `query_drift`'s report (panics on an error response).
fn drift_report(engine: &mut Engine, params: Value) -> Value {
    let result = expect_result(&query_drift(engine, params));
    let keys: Vec<&String> = result.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["report"], "{result}");
    result["report"].clone()
}

/// Population mean and standard deviation, computed by hand.
fn stats(scores: &[f64]) -> (f64, f64) {
    let n = scores.len() as f64;
    let mean = scores.iter().sum::<f64>() / n;
    let var = scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

fn approx(actual: &Value, expected: f64, what: &str) {
    let a = actual.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {actual}"));
    assert!((a - expected).abs() < 1e-9, "{what}: expected {expected}, got {a}");
}

/// Checks a report against the window it must cover (`newest_first`).
fn assert_report(report: &Value, assertion_id: &str, fp: &str, newest_first: &[f64], window_size: u64, status: &str) {
    let (mean, stddev) = stats(newest_first);
    assert_eq!(report["assertion_id"], json!(assertion_id), "{report}");
    assert_eq!(report["fingerprint"], json!(fp), "{report}");
    assert_eq!(report["count"], json!(newest_first.len()), "{report}");
    assert_eq!(report["window_size"], json!(window_size), "{report}");
    approx(&report["mean"], mean, "mean");
    approx(&report["stddev"], stddev, "stddev");
    approx(&report["latest_score"], newest_first[0], "latest_score");
    approx(&report["deviation"], newest_first[0] - mean, "deviation");
    assert_eq!(report["status"], json!(status), "{report}");
    let mut keys: Vec<&str> = report.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "assertion_id",
            "count",
            "deviation",
            "fingerprint",
            "latest_score",
            "mean",
            "status",
            "stddev",
            "window_size"
        ]
    );
}

fn capabilities(init: &Value) -> Vec<String> {
    init["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

/// Sends shutdown, checks its answer, and waits for exit code 0.
fn shutdown(engine: &mut Engine, assertions_evaluated: u64) {
    let resp = engine.request(&shutdown_request(json!("bye")));
    assert_eq!(
        expect_result(&resp),
        json!({"sessions_completed": 1, "assertions_evaluated": assertions_evaluated})
    );
    let rest = engine.values_until_eof();
    assert!(rest.is_empty(), "output after the shutdown response: {rest:?}");
    assert_eq!(engine.wait_exit().code(), Some(0));
}

// ---------------------------------------------------------------- persistence

#[test]
fn history_persists_across_engine_processes_and_pools_by_fingerprint() {
    let cache = tempfile::tempdir().unwrap();
    let spec = kw_spec(json!({}));
    let contains_spec = json!({"target": "output.message", "check": "contains", "value": "alpha"});
    let fp_kw = fingerprint(&spec, Some("bot"));
    let fp_contains = fingerprint(&contains_spec, Some("bot"));

    // Process A: five runs, each with fresh assertion ids (as SDKs do).
    let found = [4, 3, 0, 4, 1];
    let mut a = spawn_in(cache.path(), &[], &[]);
    let init = a.initialize();
    assert!(capabilities(&init).contains(&"continuous_eval".to_owned()), "{init}");
    for (run, &k) in found.iter().enumerate() {
        let r = evaluate(
            &mut a,
            kw_trace("bot", k),
            json!([
                {"assertion_id": format!("contains_{run}"), "type": "content", "spec": contains_spec},
                kw(&format!("kw_{run}"), json!({}))
            ]),
        );
        let contains = if k >= 1 { "pass" } else { "hard_fail" };
        let keywords = if k == 4 { "pass" } else { "hard_fail" };
        assert_eq!(statuses(&r), [contains, keywords], "run {run}: {r}");
        approx(&r["results"][1]["score"], k as f64 / 4.0, "keyword_all score");
    }
    // Another agent's results are another fingerprint.
    evaluate(&mut a, kw_trace("other-bot", 4), json!([kw("kw_other", json!({}))]));
    // Process A sees its own results at once.
    let report = drift_report(&mut a, json!({"assertion_id": "kw_4"}));
    assert_report(&report, "kw_4", &fp_kw, &[0.25, 1.0, 0.0, 0.75, 1.0], 50, "ok");
    shutdown(&mut a, 11);
    assert!(cache.path().join("history.sqlite3").is_file());

    // Process B: the same cache directory answers from A's results.
    let mut b = spawn_in(cache.path(), &[], &[]);
    assert!(capabilities(&b.initialize()).contains(&"continuous_eval".to_owned()));
    // The oldest id resolves to the fingerprint, whose window holds all five runs.
    let newest_first = [0.25, 1.0, 0.0, 0.75, 1.0];
    let report = drift_report(&mut b, json!({"assertion_id": "kw_0"}));
    assert_report(&report, "kw_0", &fp_kw, &newest_first, 50, "ok");
    // Hand-computed: mean 3/5, variance 0.825/5.
    approx(&report["mean"], 0.6, "mean");
    approx(&report["stddev"], 0.165f64.sqrt(), "stddev");
    approx(&report["deviation"], -0.35, "deviation");
    // By fingerprint: the assertion_id is that of the latest result.
    let by_fp = drift_report(&mut b, json!({"fingerprint": fp_kw}));
    assert_report(&by_fp, "kw_4", &fp_kw, &newest_first, 50, "ok");
    // Upper-case hex is the same fingerprint.
    let upper = drift_report(&mut b, json!({"fingerprint": fp_kw.to_uppercase(), "window_size": 2}));
    assert_report(&upper, "kw_4", &fp_kw, &[0.25, 1.0], 2, "ok");
    // The contains assertion: scores 1 1 0 1 1, newest first 1 1 0 1 1.
    let report = drift_report(&mut b, json!({"assertion_id": "contains_2"}));
    assert_report(&report, "contains_2", &fp_contains, &[1.0, 1.0, 0.0, 1.0, 1.0], 50, "ok");
    approx(&report["mean"], 0.8, "mean");
    approx(&report["stddev"], 0.4, "stddev");
    // The other agent's history is separate.
    let other = drift_report(&mut b, json!({"assertion_id": "kw_other"}));
    assert_report(&other, "kw_other", &fingerprint(&spec, Some("other-bot")), &[1.0], 50, "ok");
    assert_eq!(other["stddev"], json!(0.0));

    // B adds a run under yet another id, with the spec's keys in another
    // order and soft/threshold set: still the same fingerprint.
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":\"raw\",\"method\":\"evaluate_batch\",\"params\":{{\"trace\":{},\"assertions\":[{{\"type\":\"content\",\"assertion_id\":\"kw_b\",\"spec\":{{\"values\":[\"alpha\",\"beta\",\"gamma\",\"delta\"],\"soft\":true,\"threshold\":0.9,\"check\":\"keyword_all\",\"target\":\"output.message\"}}}}]}}}}",
        kw_trace("bot", 0)
    );
    b.send_line(&line);
    let r = expect_result(&b.recv());
    assert_eq!(statuses(&r), ["soft_fail"], "{r}");
    // Six scores, newest first 0 .25 1 0 .75 1: mean .5, σ = sqrt(1.125/6) ≈ .433;
    // 0 < .5 - .433, so drift is detected.
    let report = drift_report(&mut b, json!({"assertion_id": "kw_b"}));
    assert_report(&report, "kw_b", &fp_kw, &[0.0, 0.25, 1.0, 0.0, 0.75, 1.0], 50, "drift_detected");
    approx(&report["stddev"], (1.125f64 / 6.0).sqrt(), "stddev");
    shutdown(&mut b, 1);
}

#[test]
fn submitted_plugin_results_are_recorded_and_pooled_by_plugin_name() {
    let cache = tempfile::tempdir().unwrap();
    let mut a = spawn_in(cache.path(), &[], &[]);
    a.initialize();
    for (i, (status, score)) in [("pass", 0.9), ("pass", 0.8), ("hard_fail", 0.2)].iter().enumerate() {
        let resp = a.request(&rpc(
            json!(i),
            "submit_plugin_result",
            json!({"trace_id": format!("trc_{i}"), "plugin_name": "toxicity", "assertion_id": format!("tox_{i}"),
                   "result": {"status": status, "score": score, "explanation": "classifier"}}),
        ));
        assert_eq!(expect_result(&resp), json!({"accepted": true}));
    }
    shutdown(&mut a, 3);
    let mut b = spawn_in(cache.path(), &[], &[]);
    b.initialize();
    let report = drift_report(&mut b, json!({"assertion_id": "tox_0"}));
    let fp = Fingerprint::submitted("toxicity").hex();
    // Newest first .2 .8 .9: mean 19/30, σ ≈ .3091; .2 < .633 - .309: drift.
    assert_report(&report, "tox_0", &fp, &[0.2, 0.8, 0.9], 50, "drift_detected");
}

#[test]
fn an_assertion_id_resolves_to_the_fingerprint_of_its_latest_result() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    let spec = kw_spec(json!({}));
    // The same id on two agents' traces: two fingerprints.
    evaluate(&mut e, kw_trace("first", 4), json!([kw("same", json!({}))]));
    evaluate(&mut e, kw_trace("first", 2), json!([kw("x1", json!({}))]));
    evaluate(&mut e, kw_trace("second", 1), json!([kw("same", json!({}))]));
    let report = drift_report(&mut e, json!({"assertion_id": "same"}));
    assert_report(&report, "same", &fingerprint(&spec, Some("second")), &[0.25], 50, "ok");
    let report = drift_report(&mut e, json!({"fingerprint": fingerprint(&spec, Some("first"))}));
    assert_report(&report, "x1", &fingerprint(&spec, Some("first")), &[0.5, 1.0], 50, "ok");
    // A trace without agent_id is its own identity too.
    evaluate(&mut e, trace("trc_none", None, "alpha beta gamma"), json!([kw("anon", json!({}))]));
    let report = drift_report(&mut e, json!({"assertion_id": "anon"}));
    assert_report(&report, "anon", &fingerprint(&spec, None), &[0.75], 50, "ok");
}

#[test]
fn history_off_hides_the_capability_and_query_drift_is_a_configuration_error() {
    for (args, env) in [
        (vec!["--no-history"], vec![]),
        (vec![], vec![("ATTEST_HISTORY", "false")]),
        // The flag wins over the environment.
        (vec!["--no-history"], vec![("ATTEST_HISTORY", "true")]),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let mut e = spawn_in(cache.path(), &args, &env);
        let init = e.initialize();
        let caps = capabilities(&init);
        assert!(!caps.contains(&"continuous_eval".to_owned()), "{args:?} {env:?}: {init}");
        assert!(caps.contains(&"layers_1_4".to_owned()), "{init}");
        // Evaluation still works; a dynamic threshold falls back to the static band.
        let r = evaluate_one(&mut e, kw_trace("bot", 3), kw("k", json!({"threshold": "dynamic"})));
        assert_eq!(r["status"], json!("soft_fail"), "{r}");
        let why = r["explanation"].as_str().unwrap();
        assert!(why.contains("static band (result history is off)"), "{why}");
        let resp = query_drift(&mut e, json!({"assertion_id": "k"}));
        let err = expect_error(&resp, 2001);
        assert_eq!(err["data"]["retryable"], json!(false), "{resp}");
        assert_eq!(err["message"], json!("history store not available"), "{resp}");
        assert!(err["data"]["detail"].as_str().unwrap().contains("ATTEST_HISTORY"), "{resp}");
        shutdown(&mut e, 1);
        assert!(
            !cache.path().join("history.sqlite3").exists(),
            "{args:?} {env:?}: no history file is created when history is off"
        );
    }
}

#[test]
fn history_false_in_the_config_file_switches_it_off_and_env_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "history = false\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    assert!(!capabilities(&e.initialize()).contains(&"continuous_eval".to_owned()));
    expect_error(&query_drift(&mut e, json!({"assertion_id": "k"})), 2001);
    let mut e = spawn_in(dir.path(), &["--config", &config], &[("ATTEST_HISTORY", "true")]);
    assert!(capabilities(&e.initialize()).contains(&"continuous_eval".to_owned()));
    assert_eq!(drift_report(&mut e, json!({"assertion_id": "k"}))["status"], json!("no_data"));
}

// ---------------------------------------------------------------- query_drift

#[test]
fn query_drift_window_uses_only_the_newest_results() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    let fp = fingerprint(&kw_spec(json!({})), Some("bot"));
    // Chronological scores 1 1 .75 1 .5 .25 0 .25.
    let found = [4, 4, 3, 4, 2, 1, 0, 1];
    for (i, &k) in found.iter().enumerate() {
        evaluate(&mut e, kw_trace("bot", k), json!([kw(&format!("run_{i}"), json!({}))]));
    }
    let all = [0.25, 0.0, 0.25, 0.5, 1.0, 0.75, 1.0, 1.0];
    let report = drift_report(&mut e, json!({"assertion_id": "run_7", "window_size": 50}));
    assert_report(&report, "run_7", &fp, &all, 50, "ok");
    // Window 3: .25 0 .25 -> mean 1/6, σ = sqrt(1/72); .25 is above the mean.
    let report = drift_report(&mut e, json!({"assertion_id": "run_7", "window_size": 3}));
    assert_report(&report, "run_7", &fp, &[0.25, 0.0, 0.25], 3, "ok");
    approx(&report["mean"], 1.0 / 6.0, "mean");
    approx(&report["stddev"], (1.0f64 / 72.0).sqrt(), "stddev");
    // Window 1: one score, no spread.
    let report = drift_report(&mut e, json!({"fingerprint": fp, "window_size": 1}));
    assert_report(&report, "run_7", &fp, &[0.25], 1, "ok");
    assert_eq!(report["stddev"], json!(0.0));
    // window_size 0 means the default (50); 10000 is the largest accepted.
    let report = drift_report(&mut e, json!({"assertion_id": "run_0", "window_size": 0}));
    assert_report(&report, "run_0", &fp, &all, 50, "ok");
    let report = drift_report(&mut e, json!({"assertion_id": "run_0", "window_size": 10000}));
    assert_report(&report, "run_0", &fp, &all, 10000, "ok");
    let report = drift_report(&mut e, json!({"assertion_id": "run_0", "window_size": null}));
    assert_eq!(report["window_size"], json!(50));
}

#[test]
fn drift_is_detected_only_more_than_one_stddev_below_the_mean() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    let spec = kw_spec(json!({}));
    let run = |e: &mut Engine, agent: &str, found: &[usize]| {
        for (i, &k) in found.iter().enumerate() {
            evaluate(e, kw_trace(agent, k), json!([kw(&format!("{agent}_{i}"), json!({}))]));
        }
        drift_report(e, json!({"assertion_id": format!("{agent}_{}", found.len() - 1)}))
    };
    // Newest first 0 1: mean .5, σ .5; 0 is exactly one σ below, not more: ok.
    let r = run(&mut e, "edge", &[4, 0]);
    assert_report(&r, "edge_1", &fingerprint(&spec, Some("edge")), &[0.0, 1.0], 50, "ok");
    // Newest first 0 1 1: mean 2/3, σ ≈ .471; 0 < .195: drift.
    let r = run(&mut e, "drop", &[4, 4, 0]);
    assert_report(
        &r,
        "drop_2",
        &fingerprint(&spec, Some("drop")),
        &[0.0, 1.0, 1.0],
        50,
        "drift_detected",
    );
    // Constant scores: σ 0, never drift, even when low.
    let r = run(&mut e, "flat", &[1, 1, 1]);
    assert_report(&r, "flat_2", &fingerprint(&spec, Some("flat")), &[0.25, 0.25, 0.25], 50, "ok");
    // A rise is never drift.
    let r = run(&mut e, "rise", &[0, 0, 4]);
    assert_report(&r, "rise_2", &fingerprint(&spec, Some("rise")), &[1.0, 0.0, 0.0], 50, "ok");
    // The drift window is the query's: with window 2, .25 .25 of "flat" and
    // 0 1 of "drop" (σ .5, 0 = mean - σ) are both ok.
    let r = drift_report(&mut e, json!({"assertion_id": "drop_2", "window_size": 2}));
    assert_report(&r, "drop_2", &fingerprint(&spec, Some("drop")), &[0.0, 1.0], 2, "ok");
}

#[test]
fn query_drift_for_an_unknown_subject_is_no_data() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    evaluate(&mut e, kw_trace("bot", 4), json!([kw("known", json!({}))]));
    let report = drift_report(&mut e, json!({"assertion_id": "never-seen", "window_size": 7}));
    assert_eq!(
        report,
        json!({"assertion_id": "never-seen", "fingerprint": null, "mean": 0.0, "stddev": 0.0, "count": 0,
               "latest_score": 0.0, "deviation": 0.0, "status": "no_data", "window_size": 7})
    );
    let unknown_fp = "00112233445566778899aabbccddeeff";
    let report = drift_report(&mut e, json!({"fingerprint": unknown_fp}));
    assert_eq!(
        report,
        json!({"assertion_id": "", "fingerprint": unknown_fp, "mean": 0.0, "stddev": 0.0, "count": 0,
               "latest_score": 0.0, "deviation": 0.0, "status": "no_data", "window_size": 50})
    );
}

#[test]
fn query_drift_rejects_bad_params_naming_the_field() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    let fp = "00112233445566778899aabbccddeeff";
    let cases = [
        (json!({"assertion_id": "a", "window_size": -1}), "params.window_size"),
        (json!({"assertion_id": "a", "window_size": 10001}), "params.window_size"),
        (json!({"assertion_id": "a", "window_size": "x"}), "params.window_size"),
        (json!({"assertion_id": "a", "window_size": 2.5}), "params.window_size"),
        (json!({"assertion_id": "a", "window_size": true}), "params.window_size"),
        (json!({}), "params.assertion_id"),
        (json!({"window_size": 5}), "params.assertion_id"),
        (json!({"assertion_id": null}), "params.assertion_id"),
        (json!({"assertion_id": ""}), "params.assertion_id"),
        (json!({"assertion_id": 5}), "params.assertion_id"),
        (json!({"fingerprint": "abc"}), "params.fingerprint"),
        (json!({"fingerprint": "zz".repeat(16)}), "params.fingerprint"),
        (json!({"fingerprint": format!("{fp}00")}), "params.fingerprint"),
        (json!({"fingerprint": 12}), "params.fingerprint"),
        // A bad fingerprint is not excused by a good assertion_id.
        (json!({"fingerprint": "abc", "assertion_id": "a"}), "params.fingerprint"),
    ];
    for (params, field) in cases {
        let resp = query_drift(&mut e, params.clone());
        let err = expect_error(&resp, 1002);
        assert_eq!(err["data"]["field"], json!(field), "{params}: {resp}");
        assert!(err["data"]["detail"].as_str().unwrap().contains("window_size"), "{resp}");
    }
    // The engine still answers.
    assert_eq!(drift_report(&mut e, json!({"fingerprint": fp}))["status"], json!("no_data"));
}

#[test]
fn query_drift_rejects_a_fingerprint_with_sign_characters() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    // 32 characters, but not 32 hex digits.
    let resp = query_drift(&mut e, json!({"fingerprint": "+1".repeat(16)}));
    let err = expect_error(&resp, 1002);
    assert_eq!(err["data"]["field"], json!("params.fingerprint"), "{resp}");
}

#[test]
fn query_drift_params_that_are_not_an_object_name_the_params_field() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    let resp = query_drift(&mut e, json!(["a"]));
    let err = expect_error(&resp, -32602);
    assert_eq!(err["data"]["field"], json!("params"), "{resp}");
    // Absent params read as {}: the missing member is named.
    let resp = query_drift(&mut e, json!(null));
    let err = expect_error(&resp, 1002);
    assert_eq!(err["data"]["field"], json!("params.assertion_id"), "{resp}");
}

// ---------------------------------------------------------------- dynamic thresholds

#[test]
fn dynamic_threshold_uses_the_static_band_until_enough_history() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "dynamic_min_samples = 4\ndynamic_window = 5\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    e.initialize();
    let dynamic = json!({"threshold": "dynamic"});
    // Four evaluations: 0..3 earlier scores, always fewer than 4.
    for (n, (found, status)) in [(4, "pass"), (3, "soft_fail"), (2, "soft_fail"), (1, "hard_fail")]
        .into_iter()
        .enumerate()
    {
        let r = evaluate_one(&mut e, kw_trace("fresh", found), kw(&format!("d{n}"), dynamic.clone()));
        assert_eq!(r["status"], json!(status), "{n}: {r}");
        approx(&r["score"], found as f64 / 4.0, "score");
        let why = r["explanation"].as_str().unwrap();
        let band = format!(
            "Dynamic threshold, static band ({n} of the 4 earlier scores needed are in history): score {:.4}; >= 0.8 passes, >= 0.5 soft-fails, lower hard-fails: {status}.",
            found as f64 / 4.0
        );
        assert!(why.contains(&band), "{why}");
        assert!(!why.contains("from history"), "{why}");
    }
    // 0.8 exactly passes the band (4 of 5 keywords).
    let five = json!({"assertion_id": "five", "type": "content", "spec": {"target": "output.message", "check": "keyword_all",
                      "values": ["alpha", "beta", "gamma", "delta", "omega"], "threshold": "dynamic"}});
    let r = evaluate_one(&mut e, kw_trace("fresh", 4), five);
    assert_eq!((r["status"].clone(), r["score"].clone()), (json!("pass"), json!(0.8)), "{r}");
    // soft: true does not change the band.
    let r = evaluate_one(&mut e, kw_trace("soft", 1), kw("s", json!({"threshold": "dynamic", "soft": true})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    // Other layers take a dynamic threshold too.
    let c = json!({"assertion_id": "cost", "type": "constraint",
                   "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 0.01, "threshold": "dynamic"}});
    let r = evaluate_one(&mut e, kw_trace("fresh", 0), c);
    assert_eq!((r["status"].clone(), r["score"].clone()), (json!("hard_fail"), json!(0.0)), "{r}");
    assert!(r["explanation"].as_str().unwrap().contains("static band"), "{r}");
    // A forbidden hit stays hard_fail and is never judged by history.
    let f = json!({"assertion_id": "forb", "type": "content",
                   "spec": {"target": "output.message", "check": "forbidden", "values": ["gamma"], "threshold": "dynamic", "soft": true}});
    let r = evaluate_one(&mut e, kw_trace("fresh", 3), f);
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    assert!(!r["explanation"].as_str().unwrap().contains("Dynamic threshold"), "{r}");
    // A numeric threshold is accepted and is not dynamic.
    let r = evaluate_one(&mut e, kw_trace("fresh", 3), kw("num", json!({"threshold": 0.5})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    assert!(!r["explanation"].as_str().unwrap().contains("threshold"), "{r}");
}

#[test]
fn a_threshold_string_other_than_dynamic_is_1002() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = spawn_in(cache.path(), &[], &[]);
    e.initialize();
    for bad in ["auto", "Dynamic", ""] {
        let resp = e.request(&evaluate_request(
            json!(1),
            kw_trace("bot", 4),
            json!([kw("ok", json!({})), kw("bad", json!({"threshold": bad}))]),
        ));
        let err = expect_error(&resp, 1002);
        assert_eq!(err["data"]["field"], json!("params.assertions[1].spec.threshold"), "{resp}");
        assert_eq!(err["data"]["assertion_id"], json!("bad"), "{resp}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("threshold must be a number or \"dynamic\""),
            "{resp}"
        );
    }
    // Nothing was evaluated, so nothing was recorded.
    assert_eq!(drift_report(&mut e, json!({"assertion_id": "ok"}))["count"], json!(0));
}

#[test]
fn dynamic_threshold_passes_a_low_score_when_history_is_low() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "dynamic_min_samples = 4\ndynamic_window = 5\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    e.initialize();
    // Three results without a threshold: the same fingerprint (threshold is not part of it).
    for (i, k) in [2, 1, 2].into_iter().enumerate() {
        let r = evaluate_one(&mut e, kw_trace("low", k), kw(&format!("seed{i}"), json!({})));
        assert_eq!(r["status"], json!("hard_fail"));
    }
    // 3 earlier scores < 4: the static band hard-fails 0.25.
    let r = evaluate_one(&mut e, kw_trace("low", 1), kw("dyn1", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    assert!(r["explanation"].as_str().unwrap().contains("static band (3 of the 4"), "{r}");
    // Now 4 earlier scores, newest first .25 .5 .25 .5: mean .375, σ .125, floor .125.
    let r = evaluate_one(&mut e, kw_trace("low", 1), kw("dyn2", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("pass"), "0.25 is within 2σ of a low history: {r}");
    approx(&r["score"], 0.25, "score");
    let why = r["explanation"].as_str().unwrap();
    assert!(
        why.contains(
            "Dynamic threshold from history: score 0.2500 vs mean 0.3750 - 2 x stddev 0.1250 = 0.1250 over the last 4 scores: pass."
        ),
        "{why}"
    );
    // The keyword explanation is kept in front.
    assert!(why.starts_with("output.message is missing keywords"), "{why}");
    // Window 5 (the dynamic_window), newest first .25 .25 .5 .25 .5: mean .35,
    // σ = sqrt(.015) ≈ .1225, floor ≈ .1051; 0.25 passes, 0 hard-fails.
    let r = evaluate_one(&mut e, kw_trace("low", 0), kw("dyn3", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    let floor = 0.35 - 2.0 * 0.015f64.sqrt();
    let expected = format!("score 0.0000 vs mean 0.3500 - 2 x stddev 0.1225 = {floor:.4} over the last 5 scores: hard_fail.");
    assert!(r["explanation"].as_str().unwrap().contains(&expected), "{r}");
}

#[test]
fn dynamic_threshold_fails_a_score_far_below_a_high_history() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "dynamic_min_samples = 4\ndynamic_window = 5\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    e.initialize();
    for (i, k) in [4, 4, 3, 4].into_iter().enumerate() {
        evaluate_one(&mut e, kw_trace("high", k), kw(&format!("seed{i}"), json!({})));
    }
    // History newest first 1 .75 1 1: mean .9375, σ ≈ .1083, floor ≈ .7210.
    // 0.5 would only soft-fail under the static band; from history it hard-fails.
    let r = evaluate_one(&mut e, kw_trace("high", 2), kw("dyn", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    let (mean, sd) = stats(&[1.0, 0.75, 1.0, 1.0]);
    let expected = format!(
        "Dynamic threshold from history: score 0.5000 vs mean {mean:.4} - 2 x stddev {sd:.4} = {:.4} over the last 4 scores: hard_fail.",
        mean - 2.0 * sd
    );
    assert!(r["explanation"].as_str().unwrap().contains(&expected), "{r}");
    // soft: true keeps the fingerprint and softens a failure from history.
    // Window newest first .5 1 .75 1 1: mean .85, σ .2, floor .45; .25 < .45.
    let r = evaluate_one(
        &mut e,
        kw_trace("high", 1),
        kw("dyn_soft", json!({"threshold": "dynamic", "soft": true})),
    );
    assert_eq!(r["status"], json!("soft_fail"), "{r}");
    assert!(
        r["explanation"]
            .as_str()
            .unwrap()
            .contains("score 0.2500 vs mean 0.8500 - 2 x stddev 0.2000 = 0.4500 over the last 5 scores: soft_fail."),
        "{r}"
    );
    // A full score passes from history.
    let r = evaluate_one(&mut e, kw_trace("high", 4), kw("dyn_ok", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("pass"), "{r}");
    assert!(r["explanation"].as_str().unwrap().contains("Dynamic threshold from history"), "{r}");
}

#[test]
fn dynamic_threshold_defaults_to_ten_samples_and_history_from_an_earlier_process() {
    let cache = tempfile::tempdir().unwrap();
    let mut a = spawn_in(cache.path(), &[], &[]);
    a.initialize();
    for i in 0..9 {
        evaluate_one(&mut a, kw_trace("bot", 1), kw(&format!("seed{i}"), json!({})));
    }
    shutdown(&mut a, 9);
    let mut b = spawn_in(cache.path(), &[], &[]);
    b.initialize();
    let r = evaluate_one(&mut b, kw_trace("bot", 1), kw("d1", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    assert!(r["explanation"].as_str().unwrap().contains("static band (9 of the 10"), "{r}");
    // Ten earlier scores of .25 (σ 0, floor .25): .25 passes, 0 fails.
    let r = evaluate_one(&mut b, kw_trace("bot", 1), kw("d2", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("pass"), "{r}");
    assert!(
        r["explanation"]
            .as_str()
            .unwrap()
            .contains("score 0.2500 vs mean 0.2500 - 2 x stddev 0.0000 = 0.2500 over the last 10 scores: pass."),
        "{r}"
    );
    let r = evaluate_one(&mut b, kw_trace("bot", 0), kw("d3", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"), "{r}");
    assert!(
        r["explanation"].as_str().unwrap().contains("over the last 11 scores: hard_fail."),
        "{r}"
    );
}

#[test]
fn bad_dynamic_settings_in_the_config_file_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for text in [
        "dynamic_min_samples = 1\n",
        "dynamic_min_samples = 20\ndynamic_window = 10\n",
        "history_max_rows = 0\n",
    ] {
        let config = config_file(dir.path(), text);
        let out = command()
            .env("ATTEST_CACHE_DIR", dir.path())
            .args(["--config", &config])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("configuration error"), "{text}: {err}");
    }
}

// ---------------------------------------------------------------- drift_alert

/// Seeds four high scores, then sends a dynamic assertion that fails from
/// history. Returns the lines received for it (alert lines, then the response).
fn failing_dynamic_run(e: &mut Engine) -> Vec<Value> {
    e.initialize();
    for (i, k) in [4, 4, 3, 4].into_iter().enumerate() {
        evaluate_one(e, kw_trace("alert-bot", k), kw(&format!("seed{i}"), json!({})));
    }
    // A dynamic pass and a static-band failure never alert: the next line is the response.
    let r = evaluate_one(e, kw_trace("alert-bot", 4), kw("fine", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("pass"));
    let r = evaluate_one(e, kw_trace("fresh-bot", 0), kw("band", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("hard_fail"));
    e.send(&evaluate_request(
        json!("dyn"),
        kw_trace("alert-bot", 2),
        json!([kw("plain", json!({})), kw("dyn", json!({"threshold": "dynamic"}))]),
    ));
    let mut lines = vec![e.recv()];
    while lines.last().unwrap().get("id").is_none() {
        lines.push(e.recv());
    }
    lines
}

#[test]
fn drift_alert_is_sent_before_the_response_when_enabled() {
    for how in ["env", "config"] {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("dynamic_min_samples = 4\ndynamic_window = 5\n");
        let mut env = vec![];
        match how {
            "env" => env.push(("ATTEST_DRIFT_ALERTS", "true")),
            _ => text.push_str("drift_alerts = true\n"),
        }
        let config = config_file(dir.path(), &text);
        let mut e = spawn_in(dir.path(), &["--config", &config], &env);
        let lines = failing_dynamic_run(&mut e);
        assert_eq!(lines.len(), 2, "{how}: one alert, then the response: {lines:?}");
        let alert = &lines[0];
        assert_eq!(alert["jsonrpc"], json!("2.0"), "{alert}");
        assert_eq!(alert["method"], json!("drift_alert"), "{alert}");
        assert!(alert.get("id").is_none(), "a notification has no id: {alert}");
        // History newest first 1 1 .75 1 1 (window 5): with 0.5 the window is .5 1 1 .75 1.
        let fp = fingerprint(&kw_spec(json!({})), Some("alert-bot"));
        assert_report(&alert["params"], "dyn", &fp, &[0.5, 1.0, 1.0, 0.75, 1.0], 5, "drift_detected");
        let resp = &lines[1];
        assert_eq!(resp["id"], json!("dyn"));
        assert_eq!(statuses(&expect_result(resp)), ["hard_fail", "hard_fail"], "{resp}");
        // Both results of the batch ("plain" has the same fingerprint) are recorded.
        let report = drift_report(&mut e, json!({"assertion_id": "dyn", "window_size": 5}));
        assert_report(&report, "dyn", &fp, &[0.5, 0.5, 1.0, 1.0, 0.75], 5, "drift_detected");
        shutdown(&mut e, 8);
    }
}

#[test]
fn without_the_option_no_drift_alert_line_is_ever_sent() {
    for env in [vec![], vec![("ATTEST_DRIFT_ALERTS", "false")]] {
        let dir = tempfile::tempdir().unwrap();
        // The config file turns alerts on; the environment turns them back off.
        let text = if env.is_empty() {
            "dynamic_min_samples = 4\ndynamic_window = 5\n"
        } else {
            "dynamic_min_samples = 4\ndynamic_window = 5\ndrift_alerts = true\n"
        };
        let config = config_file(dir.path(), text);
        let mut e = spawn_in(dir.path(), &["--config", &config], &env);
        let lines = failing_dynamic_run(&mut e);
        assert_eq!(lines.len(), 1, "{env:?}: the next line is the response: {lines:?}");
        assert_eq!(lines[0]["id"], json!("dyn"));
        assert_eq!(statuses(&expect_result(&lines[0])), ["hard_fail", "hard_fail"]);
        e.send(&shutdown_request(json!("bye")));
        let rest = e.values_until_eof();
        assert_eq!(rest.len(), 1, "{rest:?}");
        assert_eq!(rest[0]["id"], json!("bye"));
    }
}

// ---------------------------------------------------------------- retention

#[test]
fn history_max_rows_is_enforced_when_a_process_starts() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "history_max_rows = 5\n");
    let fp = fingerprint(&kw_spec(json!({})), Some("bot"));
    // Chronological .25 .5 .75 1 0 .25 .5 .75.
    let found = [1, 2, 3, 4, 0, 1, 2, 3];
    let mut a = spawn_in(dir.path(), &["--config", &config], &[]);
    a.initialize();
    for (i, &k) in found.iter().enumerate() {
        evaluate_one(&mut a, kw_trace("bot", k), kw(&format!("a{i}"), json!({})));
    }
    // Pruning runs at start-up (and every 50,000 rows), not after each write.
    let report = drift_report(&mut a, json!({"assertion_id": "a7"}));
    assert_report(&report, "a7", &fp, &[0.75, 0.5, 0.25, 0.0, 1.0, 0.75, 0.5, 0.25], 50, "ok");
    shutdown(&mut a, 8);

    // A fresh process keeps the newest five rows.
    let rows_in_file = || -> i64 {
        let conn = rusqlite::Connection::open(dir.path().join("history.sqlite3")).unwrap();
        conn.query_row("SELECT COALESCE(SUM(size), 0) FROM batches", [], |r| r.get(0))
            .unwrap()
    };
    let mut b = spawn_in(dir.path(), &["--config", &config], &[]);
    b.initialize();
    let report = drift_report(&mut b, json!({"fingerprint": fp}));
    assert_report(&report, "a7", &fp, &[0.75, 0.5, 0.25, 0.0, 1.0], 50, "ok");
    assert_eq!(rows_in_file(), 5);
    // Other fingerprints' rows count towards the limit too.
    evaluate_one(&mut b, kw_trace("other", 4), kw("o1", json!({})));
    evaluate_one(&mut b, kw_trace("other", 4), kw("o2", json!({})));
    shutdown(&mut b, 2);
    assert_eq!(rows_in_file(), 7);

    let mut c = spawn_in(dir.path(), &["--config", &config], &[]);
    c.initialize();
    let report = drift_report(&mut c, json!({"fingerprint": fp}));
    assert_report(&report, "a7", &fp, &[0.75, 0.5, 0.25], 50, "ok");
    let report = drift_report(&mut c, json!({"assertion_id": "o2"}));
    assert_report(
        &report,
        "o2",
        &fingerprint(&kw_spec(json!({})), Some("other")),
        &[1.0, 1.0],
        50,
        "ok",
    );
    assert_eq!(rows_in_file(), 5);
}

#[test]
fn history_max_age_drops_old_rows_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = spawn_in(dir.path(), &[], &[]);
    a.initialize();
    evaluate_one(&mut a, kw_trace("bot", 4), kw("old", json!({})));
    shutdown(&mut a, 1);
    // A generous age keeps the row...
    let keep = config_file(dir.path(), "history_max_age = \"1h\"\n");
    let mut b = spawn_in(dir.path(), &["--config", &keep], &[]);
    b.initialize();
    assert_eq!(drift_report(&mut b, json!({"assertion_id": "old"}))["count"], json!(1));
    shutdown(&mut b, 0);
    // ...a tiny one drops it (the row is older than 1 ms by now).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let drop = config_file(dir.path(), "history_max_age = \"1ms\"\n");
    let mut c = spawn_in(dir.path(), &["--config", &drop], &[]);
    c.initialize();
    assert_eq!(drift_report(&mut c, json!({"assertion_id": "old"}))["status"], json!("no_data"));
}

// ---------------------------------------------------------------- reports

/// The session of the report tests: three traces, results in layers 1-4 and
/// 8, passes, soft and hard failures, and a request that fails (1002) and so
/// evaluates nothing.
fn report_session(e: &mut Engine) {
    e.initialize();
    let r = evaluate(
        e,
        trace("trc_r1", Some("support-bot"), "alpha beta"),
        json!([
            {"assertion_id": "schema_ok", "type": "schema", "spec": {"target": "output", "schema": {"type": "object", "required": ["message"]}}},
            {"assertion_id": "cost_hard", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 0.01}},
            {"assertion_id": "cost_soft", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 0.01, "soft": true}},
            {"assertion_id": "tools", "type": "trace", "spec": {"check": "required_tools", "tools": ["lookup"]}},
            content("says_alpha", "contains", "alpha"),
            {"assertion_id": "kw_soft", "type": "content", "spec": {"target": "output.message", "check": "keyword_all", "values": KW, "soft": true}}
        ]),
    );
    assert_eq!(statuses(&r), ["pass", "hard_fail", "soft_fail", "pass", "pass", "soft_fail"]);
    let r = evaluate(
        e,
        trace("trc_r2", None, "gamma <b>&</b>"),
        json!([content("says_gamma", "contains", "gamma"), kw("kw_hard", json!({}))]),
    );
    assert_eq!(statuses(&r), ["pass", "hard_fail"]);
    // A failed request evaluates nothing.
    expect_error(
        &e.request(&evaluate_request(
            json!("bad"),
            trace("trc_bad", None, "x"),
            json!([content("re", "regex_match", "(")]),
        )),
        1002,
    );
    // trc_r1 again: its results join the first batch's.
    let r = evaluate(
        e,
        trace("trc_r1", Some("support-bot"), "delta"),
        json!([content("says_delta", "contains", "delta")]),
    );
    assert_eq!(statuses(&r), ["pass"]);
    for (trace_id, id, status, score) in [("trc_r1", "tox", "soft_fail", 0.6), ("trc_r3", "pii", "hard_fail", 0.1)] {
        let resp = e.request(&rpc(
            json!(id),
            "submit_plugin_result",
            json!({"trace_id": trace_id, "plugin_name": if id == "tox" { "toxicity" } else { "pii_scan" }, "assertion_id": id,
                   "result": {"status": status, "score": score, "explanation": format!("{id} says {status}")}}),
        ));
        expect_result(&resp);
    }
}

fn report_args(dir: &Path) -> Vec<String> {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    vec![
        "--report".into(),
        format!("junit={}", p("out/attest.xml")),
        "--report".into(),
        format!("json={}", p("out/attest.json")),
        "--report".into(),
        format!("markdown={}", p("attest.md")),
    ]
}

fn counts(total: u64, passed: u64, soft: u64, hard: u64) -> Value {
    json!({"total": total, "passed": passed, "soft_failures": soft, "hard_failures": hard})
}

/// Checks the three reports [`report_session`] must produce.
fn check_reports(dir: &Path) {
    let json_text = std::fs::read_to_string(dir.join("out/attest.json")).expect("the JSON report is written");
    let report: Value = serde_json::from_str(&json_text).unwrap();
    // 11 results: 6 + 2 + 1 evaluated, 2 submitted.
    assert_eq!(report["counts"], counts(11, 5, 3, 3), "{report}");
    assert_eq!(
        report["by_layer"],
        json!({"1": counts(1, 1, 0, 0), "2": counts(2, 0, 1, 1), "3": counts(1, 1, 0, 0),
               "4": counts(5, 3, 1, 1), "8": counts(2, 0, 1, 1)}),
        "{report}"
    );
    assert_eq!(report["engine_version"], json!(VERSION));
    assert_eq!(report["budget_usd"], Value::Null);
    let traces = report["traces"].as_array().unwrap();
    let ids: Vec<&str> = traces.iter().map(|t| t["trace_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["trc_r1", "trc_r2", "trc_r3"], "first-seen order");
    let result_ids = |t: &Value| -> Vec<String> {
        t["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["assertion_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        result_ids(&traces[0]),
        [
            "schema_ok",
            "cost_hard",
            "cost_soft",
            "tools",
            "says_alpha",
            "kw_soft",
            "says_delta",
            "tox"
        ]
    );
    assert_eq!(traces[0]["agent_id"], json!("support-bot"));
    assert_eq!(traces[0]["counts"], counts(8, 4, 3, 1));
    assert_eq!(result_ids(&traces[1]), ["says_gamma", "kw_hard"]);
    assert_eq!(traces[1]["agent_id"], Value::Null);
    assert_eq!(traces[1]["counts"], counts(2, 1, 0, 1));
    assert_eq!(result_ids(&traces[2]), ["pii"]);
    assert_eq!(traces[2]["counts"], counts(1, 0, 0, 1));
    let first = &traces[0]["results"];
    assert_eq!(
        (first[0]["type"].clone(), first[0]["layer"].clone(), first[0]["source"].clone()),
        (json!("schema"), json!(1), json!("batch"))
    );
    assert_eq!(
        (first[5]["status"].clone(), first[5]["score"].clone()),
        (json!("soft_fail"), json!(0.5))
    );
    assert_eq!(
        first[7],
        json!({"assertion_id": "tox", "type": "plugin:toxicity", "layer": 8, "status": "soft_fail", "score": 0.6,
               "explanation": "tox says soft_fail", "cost": 0.0, "duration_ms": 0, "source": "submitted"})
    );
    assert_eq!(traces[2]["results"][0]["type"], json!("plugin:pii_scan"));
    assert_eq!(traces[2]["results"][0]["source"], json!("submitted"));

    // JUnit: well formed, one testsuite per trace, one testcase per result,
    // a failure per hard failure, soft failures as system-out.
    let xml = std::fs::read_to_string(dir.join("out/attest.xml")).expect("the JUnit report is written");
    let mut reader = quick_xml::Reader::from_str(&xml);
    let (mut suites, mut cases, mut failures) = (0, 0, 0);
    let mut suite_names = Vec::new();
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(e)) | Ok(quick_xml::events::Event::Empty(e)) => {
                let name = e.name().as_ref().to_vec();
                match name.as_slice() {
                    b"testsuite" => {
                        suites += 1;
                        let n = e.try_get_attribute("name").unwrap().unwrap();
                        suite_names.push(String::from_utf8(n.value.to_vec()).unwrap());
                    }
                    b"testcase" => cases += 1,
                    b"failure" => failures += 1,
                    _ => {}
                }
            }
            Ok(_) => {}
            Err(err) => panic!(
                "the JUnit report is not well-formed XML at {}: {err}\n{xml}",
                reader.buffer_position()
            ),
        }
    }
    assert_eq!((suites, cases, failures), (3, 11, 3), "{xml}");
    assert_eq!(suite_names, ["trc_r1", "trc_r2", "trc_r3"]);
    assert_eq!(xml.matches("<system-out>soft_fail").count(), 3, "{xml}");
    assert!(
        xml.contains("<testsuites name=\"attest-engine\" tests=\"11\" failures=\"3\" errors=\"0\""),
        "{xml}"
    );
    assert!(xml.contains("classname=\"trc_r1.layer8.plugin:toxicity\""), "{xml}");

    let md = std::fs::read_to_string(dir.join("attest.md")).expect("the Markdown report is written");
    assert!(md.starts_with("# attest-engine session report\n"), "{md}");
    assert!(md.contains("**11** results: 5 passed, 3 soft failures, 3 hard failures."), "{md}");
    for t in ["trc_r1", "trc_r2", "trc_r3"] {
        assert!(md.contains(&format!("## Trace `{t}`")), "{t}: {md}");
    }
    assert!(!md.contains("trc_bad"), "{md}");
    assert!(md.contains("| tox | plugin:toxicity | 8 | soft_fail | 0.6 |"), "{md}");
    assert!(md.contains("| 4 | 5 | 3 | 1 | 1 |"), "{md}");
}

#[test]
fn reports_are_written_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let args = report_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut e = spawn_in(dir.path(), &args, &[]);
    report_session(&mut e);
    assert!(
        !dir.path().join("out/attest.json").exists(),
        "reports are written at the end of the session"
    );
    shutdown(&mut e, 11);
    check_reports(dir.path());
}

#[test]
fn reports_are_written_at_end_of_input() {
    let dir = tempfile::tempdir().unwrap();
    let args = report_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut e = spawn_in(dir.path(), &args, &[]);
    report_session(&mut e);
    e.close_stdin();
    assert!(e.values_until_eof().is_empty());
    assert_eq!(e.wait_exit().code(), Some(0));
    check_reports(dir.path());
}

#[test]
fn reports_are_written_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let args = report_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut e = spawn_in(dir.path(), &args, &[]);
    report_session(&mut e);
    e.signal("TERM");
    assert!(e.values_until_eof().is_empty());
    assert_eq!(e.wait_exit().code(), Some(0));
    check_reports(dir.path());
}

#[test]
fn reports_from_the_config_file_are_relative_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "reports = [\"json=reports/session.json\"]\nbudget_usd = 2.5\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    e.initialize();
    evaluate(&mut e, kw_trace("bot", 4), json!([kw("k", json!({}))]));
    shutdown(&mut e, 1);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("reports/session.json")).unwrap()).unwrap();
    assert_eq!(report["counts"], counts(1, 1, 0, 0));
    assert_eq!(report["by_layer"], json!({"4": counts(1, 1, 0, 0)}));
    assert_eq!(report["budget_usd"], json!(2.5));
}

#[test]
fn a_bad_report_kind_exits_2_naming_the_valid_kinds() {
    let dir = tempfile::tempdir().unwrap();
    for (arg, needle) in [
        ("html=x", "unknown report kind 'html'"),
        ("junit", "has no '='"),
        ("json=", "empty path"),
    ] {
        let out = command()
            .env("ATTEST_CACHE_DIR", dir.path())
            .args(["--report", arg])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{arg}");
        assert!(out.stdout.is_empty(), "{arg}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("configuration error") && err.contains("--report"), "{arg}: {err}");
        assert!(err.contains(needle), "{arg}: {err}");
        assert!(err.contains("junit=<path>, json=<path> or markdown=<path>"), "{arg}: {err}");
    }
}

#[test]
fn the_submitted_result_store_keeps_the_newest_within_its_byte_bound() {
    // 200 submissions of 16 KiB of metadata each (3.2 MiB) into a 1 MiB store:
    // the oldest are dropped, counted in the log, and the report shows only
    // the newest.
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "reports = [\"json=session.json\"]\nplugin_results_mib = 1\n");
    let mut e = spawn_in(dir.path(), &["--config", &config], &[]);
    e.initialize();
    evaluate(&mut e, kw_trace("bot", 4), json!([kw("k", json!({}))]));
    let blob = "x".repeat(16 * 1024 - 64);
    for i in 0..200 {
        let resp = e.request(&rpc(
            json!(i),
            "submit_plugin_result",
            json!({"trace_id": "trc_bot", "plugin_name": "p", "assertion_id": format!("sub{i:03}"),
                   "result": {"status": "pass", "score": 1.0, "explanation": "ok", "metadata": {"blob": blob}}}),
        ));
        assert_eq!(expect_result(&resp), json!({"accepted": true}));
    }
    shutdown(&mut e, 201);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("session.json")).unwrap()).unwrap();
    let kept: Vec<String> = report["traces"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["results"].as_array().unwrap())
        .filter_map(|r| r["assertion_id"].as_str().filter(|id| id.starts_with("sub")).map(str::to_owned))
        .collect();
    // Each is weighed at about twice its text (parsed metadata included).
    assert!((16..=64).contains(&kept.len()), "{} submissions kept in a 1 MiB store", kept.len());
    assert_eq!(kept.last().map(String::as_str), Some("sub199"), "the newest is kept");
    assert!(!kept.iter().any(|id| id == "sub000"), "the oldest is dropped");
    let log = e.stderr_text();
    assert!(
        log.contains("plugin result store full") && log.contains("\"max_bytes\":1048576"),
        "{log}"
    );
}

// ---------------------------------------------------------------- the shared PostgreSQL store

#[test]
fn engines_sharing_a_postgres_history_see_each_others_results() {
    let Some(pg) = attest_test_support::PostgresServer::start() else {
        return;
    };
    let url = pg.database("attest");
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!("history = \"{url}\"\ndynamic_min_samples = 4\ndynamic_window = 5\n"),
    );
    // Two engines, as two test runners or two machines of a fleet would be.
    let mut a = spawn_in(&dir.path().join("a"), &["--config", &config], &[]);
    let mut b = spawn_in(&dir.path().join("b"), &[], &[("ATTEST_HISTORY_URL", &url)]);
    a.initialize();
    b.initialize();
    for (i, k) in [2, 1, 2].into_iter().enumerate() {
        evaluate_one(&mut a, kw_trace("low", k), kw(&format!("seed{i}"), json!({})));
    }
    // Each engine writes in the background (within 100 ms when idle); a
    // question is answered after the asking engine's own results are
    // written, so asking is also how a test waits for them.
    let r = query_drift(&mut a, json!({"assertion_id": "seed0"}));
    assert_eq!(expect_result(&r)["report"]["count"], json!(3), "{r}");
    evaluate_one(&mut b, kw_trace("low", 1), kw("seed3", json!({})));
    let r = query_drift(&mut b, json!({"assertion_id": "seed3"}));
    assert_eq!(expect_result(&r)["report"]["count"], json!(4), "{r}");
    // Engine a reads what b wrote: 4 earlier scores, newest first .25 .5 .25 .5.
    let r = evaluate_one(&mut a, kw_trace("low", 1), kw("dyn", json!({"threshold": "dynamic"})));
    assert_eq!(r["status"], json!("pass"), "{r}");
    assert!(
        r["explanation"]
            .as_str()
            .unwrap()
            .contains("mean 0.3750 - 2 x stddev 0.1250 = 0.1250 over the last 4 scores"),
        "{r}"
    );
    let r = query_drift(&mut a, json!({"assertion_id": "seed3"}));
    let report = expect_result(&r)["report"].clone();
    assert_eq!(report["count"], json!(5), "{r}");
    assert_eq!(
        report["fingerprint"],
        json!(fingerprint(&kw_spec(json!({})), Some("low"))),
        "the same fingerprint as the file store reports"
    );
    // Nothing went to a history file.
    for engine in ["a", "b"] {
        assert!(!dir.path().join(engine).join("history.sqlite3").exists());
    }
    assert_eq!(pg.psql("attest", "SELECT count(*) FROM attest_results"), "5\n");
}

#[test]
fn an_unreachable_postgres_history_leaves_the_stdio_engine_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = spawn_in(
        dir.path(),
        &[],
        &[("ATTEST_HISTORY_URL", "postgres://attest:s3cret@127.0.0.1:9/attest")],
    );
    e.initialize();
    let r = evaluate_one(&mut e, kw_trace("bot", 3), kw("k", json!({})));
    assert_eq!((r["status"].as_str(), r["score"].as_f64()), (Some("hard_fail"), Some(0.75)), "{r}");
    let r = query_drift(&mut e, json!({"assertion_id": "k"}));
    assert_eq!(r["error"]["code"], json!(2001), "{r}");
}
