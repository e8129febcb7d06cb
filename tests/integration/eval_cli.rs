//! `attest-engine eval --trace <file> --assertions <file> [--format json]`.

use crate::common::*;
use serde_json::{json, Value};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use tempfile::TempDir;

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn write_json(dir: &TempDir, name: &str, value: &Value) -> PathBuf {
    write(dir, name, &serde_json::to_string_pretty(value).unwrap())
}

fn eval(trace: &Path, assertions: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "eval",
        "--trace",
        trace.to_str().unwrap(),
        "--assertions",
        assertions.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn eval_json(trace: &Path, assertions: &Path) -> (Option<i32>, Value) {
    let out = eval(trace, assertions, &["--format", "json"]);
    let text = stdout(&out);
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("--format json output is not JSON ({e}): {text}\nstderr: {}", stderr(&out)));
    (out.status.code(), v)
}

fn failing_trace() -> Value {
    let mut t = refund_trace();
    t["trace_id"] = json!("trc_fail");
    t["output"]["message"] = json!("Sorry, we cannot process your request.");
    t["metadata"]["cost_usd"] = json!(0.5);
    t
}

#[test]
fn table_output_for_a_passing_trace_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let out = eval(&trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{} (trace_id trc_abc123): 5 assertions in ", trace.display())),
        "{text}"
    );
    assert!(lines[0].ends_with(" ms"), "{text}");
    assert_eq!(lines[1], "  ASSERTION   STATUS     SCORE  EXPLANATION", "{text}");
    for (i, id) in ["assert_001", "assert_002", "assert_003", "assert_004", "assert_005"]
        .iter()
        .enumerate()
    {
        assert!(lines[2 + i].starts_with(&format!("  {id}  pass        1.00  ")), "{text}");
    }
    assert_eq!(
        lines[5],
        "  assert_004  pass        1.00  output.message contains 'refund' (case-insensitive)."
    );
    assert_eq!(lines[7], "  5 passed, 0 soft_fail, 0 hard_fail", "{text}");
}

#[test]
fn control_characters_from_input_are_escaped_in_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(
        &dir,
        "assertions.json",
        &json!([{"assertion_id": "c\u{1b}]0;TITLE\u{7}", "type": "content",
                 "spec": {"target": "output.message", "check": "contains", "value": "\u{1b}[2Jrefund"}}]),
    );
    let out = eval(&trace, &assertions, &[]);
    let text = stdout(&out);
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "{text:?}");
    assert!(text.contains("c\\u{1b}]0;TITLE\\u{7}"), "{text}");
    assert!(text.contains("\\u{1b}[2Jrefund"), "{text}");
}

#[test]
fn line_breaks_and_tabs_from_input_stay_in_their_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = refund_trace();
    t["trace_id"] = json!("trc\nsecond");
    let trace = write_json(&dir, "trace.json", &t);
    let assertions = write_json(
        &dir,
        "assertions.json",
        &json!([{"assertion_id": "a\nb\tc", "type": "content",
                 "spec": {"target": "output.message", "check": "contains", "value": "x\ny"}}]),
    );
    let out = eval(&trace, &assertions, &[]);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        5,
        "a header, the column names, one row, the counts and a blank line: {text}"
    );
    assert!(lines[0].contains("(trace_id trc\\u{a}second)"), "{text}");
    assert!(lines[2].starts_with("  a\\u{a}b\\u{9}c  hard_fail"), "{text}");
    assert!(lines[2].contains("'x\\u{a}y'"), "{text}");
}

#[test]
fn a_report_that_cannot_be_written_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let args = |report: &str| {
        let mut a: Vec<String> = vec!["--report".into(), report.into(), "eval".into()];
        a.extend(["--trace", trace.to_str().unwrap(), "--assertions", assertions.to_str().unwrap()].map(String::from));
        a
    };
    let run_args = |a: Vec<String>| run(&a.iter().map(String::as_str).collect::<Vec<_>>());

    // A directory is refused before anything runs.
    let out = run_args(args(&format!("junit={}", dir.path().display())));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a directory; give the report file's path"),
        "{}",
        stderr(&out)
    );

    // A path that cannot be created: the results are printed, and the run fails.
    let blocked = write(&dir, "a-file", "");
    let out = run_args(args(&format!("junit={}/attest.xml", blocked.display())));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).contains("5 passed"), "{}", stdout(&out));
    assert!(stderr(&out).contains("a report could not be written"), "{}", stderr(&out));

    // A report over an input, or two reports to one file, would destroy
    // what was there: refused before anything runs.
    let out = run_args(args(&format!("json={}", trace.display())));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("which is an input of this run"), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&trace).unwrap().contains("trace_id"), "the trace is intact");
    let same = dir.path().join("same.out");
    let mut twice = vec!["--report".to_owned(), format!("junit={}", same.display())];
    twice.extend(args(&format!("json={}", same.display())));
    let out = run_args(twice);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("two reports are written to"), "{}", stderr(&out));

    // A device takes any number of reports and stays a device; a link is
    // followed, and stays a link.
    let mut devnull = vec!["--report".to_owned(), "junit=/dev/null".to_owned()];
    devnull.extend(args("json=/dev/null"));
    let out = run_args(devnull);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        std::fs::metadata("/dev/null").unwrap().file_type().is_char_device(),
        "/dev/null is still a device"
    );
    let real = dir.path().join("real.xml");
    std::fs::write(&real, "old").unwrap();
    let link = dir.path().join("link.xml");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = run_args(args(&format!("junit={}", link.display())));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
        "the link is still a link"
    );
    assert!(
        std::fs::read_to_string(&real).unwrap().contains("<testsuite"),
        "the report went where the link points"
    );

    // A writable one is written and the run passes.
    let ok = dir.path().join("out/attest.xml");
    let out = run_args(args(&format!("junit={}", ok.display())));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&ok).unwrap().contains("<testsuite"));
}

#[test]
fn json_output_carries_every_result() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(0));
    let outcomes = v.as_array().unwrap();
    assert_eq!(outcomes.len(), 1);
    let o = &outcomes[0];
    assert_eq!(o["trace"], json!(trace.display().to_string()));
    assert_eq!(statuses(o), ["pass"; 5]);
    assert_eq!(
        o["results"][2]["explanation"],
        json!("Tool sequence ['lookup_order', 'process_refund'] found in order at steps [1, 2].")
    );
    assert_eq!(o["results"][0]["assertion_id"], json!("assert_001"));
    assert_eq!(o["total_cost"].as_f64(), Some(0.0));
    assert!(o["total_duration_ms"].is_u64(), "{o}");
}

#[test]
fn soft_failures_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(
        &dir,
        "assertions.json",
        &json!([
            content("mentions_refund", "contains", "refund"),
            {"assertion_id": "latency_sla", "type": "constraint", "spec": {"field": "metadata.latency_ms", "operator": "lte", "value": 1000, "soft": true}}
        ]),
    );
    let out = eval(&trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("  latency_sla      soft_fail   0.00  metadata.latency_ms = 4200, constraint lte 1000 not satisfied."),
        "{text}"
    );
    assert!(text.contains("  1 passed, 1 soft_fail, 0 hard_fail"), "{text}");
}

#[test]
fn hard_failures_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &failing_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let out = eval(&trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("  2 passed, 1 soft_fail, 2 hard_fail"), "{text}");
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(1));
    assert_eq!(statuses(&v[0]), ["pass", "hard_fail", "pass", "hard_fail", "soft_fail"]);
}

#[test]
fn invalid_trace_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = refund_trace();
    t.as_object_mut().unwrap().remove("trace_id");
    let trace = write_json(&dir, "trace.json", &t);
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let out = eval(&trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("{}: error 1001 (INVALID_TRACE): trace missing required field: trace_id\n  Every trace must include a non-empty trace_id string.", trace.display())),
        "{text}"
    );
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(2));
    assert_eq!(v[0]["error"]["code"], json!(1001));
    assert_eq!(
        v[0]["error"]["message"],
        json!("trace missing required field: trace_id — Every trace must include a non-empty trace_id string."),
        "the fix follows what went wrong"
    );
    assert_eq!(v[0]["error"]["data"]["error_type"], json!("INVALID_TRACE"));
    assert_eq!(v[0]["error"]["data"]["field"], json!("trace.trace_id"));
}

#[test]
fn bad_assertion_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    for (name, list, message) in [
        (
            "magic.json",
            json!([{"assertion_id": "m", "type": "magic", "spec": {}}]),
            "assertion 'm': unknown assertion type 'magic'",
        ),
        (
            "regex.json",
            json!([content("r", "regex_match", "[unclosed")]),
            "assertion 'r' (content): invalid regex '[unclosed'",
        ),
        (
            "judge.json",
            json!([{"assertion_id": "j", "type": "llm_judge", "spec": {"rubric": "helpfulness"}}]),
            "assertion 'j' (llm_judge): no LLM judge provider is configured",
        ),
    ] {
        let assertions = write_json(&dir, name, &list);
        let out = eval(&trace, &assertions, &[]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let text = stdout(&out);
        let code = if name == "judge.json" {
            "2001 (PROVIDER_ERROR)"
        } else {
            "1002 (ASSERTION_ERROR)"
        };
        assert!(text.contains(&format!("error {code}: {message}")), "{name}: {text}");
    }
}

#[test]
fn unreadable_inputs_exit_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let missing = dir.path().join("nope.json");

    let out = eval(&missing, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("attest-engine eval: cannot read trace file"),
        "{}",
        stderr(&out)
    );

    let out = eval(&trace, &missing, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read assertions file"), "{}", stderr(&out));

    let latin1 = dir.path().join("latin1.json");
    std::fs::write(&latin1, b"{\"trace_id\": \"t\",\n \"output\": {\"message\": \"caf\xe9\"}}").unwrap();
    let out = eval(&latin1, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not UTF-8 text (the first bad byte is on line 2): save it as UTF-8"),
        "{}",
        stderr(&out)
    );

    let not_json = write(&dir, "broken.json", "{\"assertions\": [");
    let out = eval(&trace, &not_json, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not valid JSON"), "{}", stderr(&out));

    let wrong_shape = write_json(&dir, "shape.json", &json!({"checks": []}));
    let out = eval(&trace, &wrong_shape, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("must hold a JSON list of assertions"), "{}", stderr(&out));

    let bad_trace = write(&dir, "bad.json", "{not json");
    let out = eval(&bad_trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not valid JSON"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(".jsonl"), "{}", stderr(&out));
    // Two traces on two lines of a .json file: the extension is the mistake.
    let lines = write(&dir, "lines.json", "{\"trace_id\": \"a\"}\n{\"trace_id\": \"b\"}\n");
    let out = eval(&lines, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not valid JSON (if it holds one trace per line, name it .jsonl)"),
        "{}",
        stderr(&out)
    );

    // A file with no trace checks nothing: an error, not a silent success.
    for (name, text, says) in [("empty.json", "[]", "holds no trace"), ("empty.jsonl", "\n\n", "is empty")] {
        let empty = write(&dir, name, text);
        let out = eval(&empty, &assertions, &[]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "{name}");
    }
    // A byte order mark ("UTF-8 with BOM") is not part of the JSON.
    let bom = write(&dir, "bom.json", &format!("\u{feff}{}", refund_trace()));
    let out = eval(&bom, &assertions, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // An empty file says so; one pretty-printed trace named .jsonl says what it is.
    let empty = write(&dir, "empty-file.json", "  \n");
    let out = eval(&empty, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is empty"), "{}", stderr(&out));
    let out = eval(&trace, &empty, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("assertions file") && stderr(&out).contains("is empty"),
        "{}",
        stderr(&out)
    );
    let pretty = write(&dir, "pretty.jsonl", &serde_json::to_string_pretty(&refund_trace()).unwrap());
    let out = eval(&pretty, &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("holds one JSON document over several lines, not one trace per line: name it .json"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
    // Nor does a list with no assertion.
    for (name, value) in [("none.json", json!([])), ("none-wrapped.json", json!({"assertions": []}))] {
        let none = write_json(&dir, name, &value);
        let out = eval(&trace, &none, &[]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(stderr(&out).contains("holds no assertion"), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "{name}");
    }
    // One assertion per line is not a JSON list: say what is.
    let lines = write(
        &dir,
        "lines-assertions.json",
        "{\"assertion_id\": \"a\"}\n{\"assertion_id\": \"b\"}\n",
    );
    let out = eval(&trace, &lines, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("put them in one JSON list"), "{}", stderr(&out));
}

#[test]
fn inputs_are_read_before_the_engine_opens_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let cache = dir.path().join("cache");
    let out = crate::common::command()
        .env("ATTEST_CACHE_DIR", &cache)
        .args(["eval", "--trace", dir.path().join("nope.json").to_str().unwrap(), "--assertions"])
        .arg(&assertions)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!cache.exists(), "a run that could not start created {}", cache.display());
}

/// Reports stay true to the run: an input that could not be evaluated is an
/// error in them, and results the bounded session log let go still count.
#[test]
fn reports_list_unevaluated_inputs_and_count_results_they_no_longer_hold() {
    let dir = tempfile::tempdir().unwrap();
    let good = serde_json::to_string(&refund_trace()).unwrap();
    let traces = write(
        &dir,
        "mixed.jsonl",
        &format!("{good}\n{{\"trace_id\": \"no-output\"}}\nnot json\n{good}\n"),
    );
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let (junit, json_report) = (dir.path().join("r.xml"), dir.path().join("r.json"));
    // `eval` with both reports (one named before the subcommand, one after)
    // and no history, after `first` global flags.
    let reported = |first: &[&str], traces: &Path| {
        let (junit, json) = (format!("junit={}", junit.display()), format!("json={}", json_report.display()));
        let mut args = first.to_vec();
        args.extend(["--no-history", "--report", &junit, "eval", "--trace"]);
        args.extend([
            traces.to_str().unwrap(),
            "--assertions",
            assertions.to_str().unwrap(),
            "--report",
            &json,
        ]);
        run(&args)
    };
    let out = reported(&[], &traces);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("errors=\"2\""), "{xml}");
    assert!(
        xml.contains("mixed.jsonl:2") && xml.contains("mixed.jsonl:3") && xml.contains("1001 INVALID_TRACE"),
        "{xml}"
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_report).unwrap()).unwrap();
    assert_eq!(report["error_count"], 2, "{report}");
    assert_eq!(report["errors"][0]["type"], "INVALID_TRACE", "{report}");

    // 2,000 failing traces through a 1 MiB session log: most results are let
    // go, yet the totals count every one and the hard failures show.
    let mut failing = failing_trace();
    failing["output"]["message"] = json!("x".repeat(2000));
    let line = serde_json::to_string(&failing).unwrap();
    let many = write(&dir, "many.jsonl", &format!("{line}\n").repeat(2000));
    let config = write(&dir, "small.toml", "session_log_mib = 1\n");
    let out = reported(&["--config", config.to_str().unwrap()], &many);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_report).unwrap()).unwrap();
    let per_trace = refund_assertions().as_array().unwrap().len() as u64;
    assert_eq!(report["counts"]["total"], 2000 * per_trace, "{}", report["counts"]);
    let omitted = report["omitted_results"].as_u64().unwrap();
    let listed: u64 = report["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["counts"]["total"].as_u64().unwrap())
        .sum();
    assert!(
        omitted > 0 && omitted + listed == 2000 * per_trace,
        "omitted {omitted}, listed {listed}"
    );
    let hard = report["counts"]["hard_failures"].as_u64().unwrap();
    assert!(hard >= 2000 && report["omitted_hard_failures"].as_u64().unwrap() > 0, "{report:#}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(&format!("failures=\"{hard}\"")), "the totals count every hard failure");
    assert!(
        xml.contains("<testsuite name=\"omitted results\"") && xml.contains("hard failures not listed"),
        "a failing testcase stands for them"
    );
}

#[test]
fn junit_counts_inputs_not_evaluated_past_those_it_lists() {
    let dir = tempfile::tempdir().unwrap();
    let traces = write(&dir, "bad.jsonl", &"{\"trace_id\": \"no-output\"}\n".repeat(1005));
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let junit = dir.path().join("r.xml");
    let out = run(&[
        "--no-history",
        "eval",
        "--trace",
        traces.to_str().unwrap(),
        "--assertions",
        assertions.to_str().unwrap(),
        "--report",
        &format!("junit={}", junit.display()),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let xml = std::fs::read_to_string(&junit).unwrap();
    // 1,000 listed and one testcase for the other 5: a tool that counts
    // testcases sees as many errors as the totals say.
    assert_eq!(xml.matches("classname=\"attest-engine.error\"").count(), 1001, "{}", &xml[..500]);
    assert!(
        xml.contains("<testcase name=\"5 more inputs not evaluated\""),
        "{}",
        &xml[xml.len() - 600..]
    );
    assert!(xml.contains("errors=\"1005\""), "{}", &xml[..300]);
}

#[test]
fn an_endless_input_file_is_read_no_further_than_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    // A device reports no size: the read itself stops at the cap.
    let out = eval(Path::new("/dev/zero"), &assertions, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("trace file /dev/zero is larger than 256 MiB"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_dash_reads_the_trace_or_the_assertions_from_standard_input() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "trace.json", &refund_trace());
    let assertions = write_json(&dir, "assertions.json", &refund_assertions());
    let piped = |args: &[&str], input: Vec<u8>| {
        let mut child = command()
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&input).unwrap();
        child.wait_with_output().unwrap()
    };
    let by_files = eval(&trace, &assertions, &["--format", "json"]);
    let trace_piped = piped(
        &[
            "eval",
            "--trace",
            "-",
            "--assertions",
            assertions.to_str().unwrap(),
            "--format",
            "json",
        ],
        std::fs::read(&trace).unwrap(),
    );
    let assertions_piped = piped(
        &["eval", "--trace", trace.to_str().unwrap(), "--assertions", "-", "--format", "json"],
        std::fs::read(&assertions).unwrap(),
    );
    for out in [&trace_piped, &assertions_piped] {
        assert_eq!(out.status.code(), by_files.status.code(), "{}", stderr(out));
        let results = |o: &Output| {
            serde_json::from_slice::<Value>(&o.stdout).unwrap()[0]["results"]
                .as_array()
                .unwrap()
                .len()
        };
        assert_eq!(results(out), results(&by_files));
    }
    let both = piped(&["eval", "--trace", "-", "--assertions", "-"], b"{}".to_vec());
    assert_eq!(both.status.code(), Some(2));
    assert!(
        stderr(&both).contains("--trace and --assertions cannot both be -"),
        "{}",
        stderr(&both)
    );
}

#[test]
fn jsonl_with_several_traces() {
    let dir = tempfile::tempdir().unwrap();
    let mut second = refund_trace();
    second["trace_id"] = json!("trc_two");
    let text = format!(
        "{}\n{}\n\n{}\n",
        serde_json::to_string(&refund_trace()).unwrap(),
        serde_json::to_string(&failing_trace()).unwrap(),
        serde_json::to_string(&second).unwrap()
    );
    let trace = write(&dir, "traces.jsonl", &text);
    let assertions = write_json(&dir, "assertions.json", &json!({"assertions": refund_assertions()}));
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(1), "one trace hard-failed: {v}");
    let outcomes = v.as_array().unwrap();
    let labels: Vec<&str> = outcomes.iter().map(|o| o["trace"].as_str().unwrap()).collect();
    let p = trace.display().to_string();
    assert_eq!(labels, [format!("{p}:1"), format!("{p}:2"), format!("{p}:4")]);
    assert_eq!(statuses(&outcomes[0]), ["pass"; 5]);
    assert_eq!(statuses(&outcomes[1]), ["pass", "hard_fail", "pass", "hard_fail", "soft_fail"]);
    assert_eq!(statuses(&outcomes[2]), ["pass"; 5]);

    let out = eval(&trace, &assertions, &[]);
    assert_eq!(out.status.code(), Some(1));
    let table = stdout(&out);
    assert!(table.contains(&format!("{p}:1 (trace_id trc_abc123): 5 assertions")), "{table}");
    assert!(table.contains(&format!("{p}:2 (trace_id trc_fail): 5 assertions")), "{table}");
    assert!(table.contains(&format!("{p}:4 (trace_id trc_two): 5 assertions")), "{table}");

    // An invalid trace among valid ones: exit 2, the others still evaluated.
    let text = format!("{}\n{{\"schema_version\": 9}}\n", serde_json::to_string(&refund_trace()).unwrap());
    let trace = write(&dir, "mixed.jsonl", &text);
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(2));
    assert_eq!(statuses(&v[0]), ["pass"; 5]);
    assert_eq!(v[1]["error"]["code"], json!(1001));
    assert!(
        v[1]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("unsupported schema_version 9; engine supports versions 0 to 1 — "),
        "{}",
        v[1]
    );
}

#[test]
fn json_array_of_traces() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_json(&dir, "traces.json", &json!([refund_trace(), minimal_trace()]));
    let assertions = write_json(&dir, "assertions.json", &json!([content("c", "contains", "refund")]));
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(code, Some(1));
    let p = trace.display().to_string();
    assert_eq!(v[0]["trace"], json!(format!("{p}[0]")));
    assert_eq!(v[1]["trace"], json!(format!("{p}[1]")));
    assert_eq!(statuses(&v[0]), ["pass"]);
    assert_eq!(statuses(&v[1]), ["hard_fail"]);
}

#[test]
fn request_ids_in_the_assertions_file_do_not_leak_between_traces() {
    // The spec's assertions carry request_ids; every trace of a .jsonl file must
    // still be evaluated on its own data.
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n{}\n",
        serde_json::to_string(&refund_trace()).unwrap(),
        serde_json::to_string(&failing_trace()).unwrap()
    );
    let trace = write(&dir, "traces.jsonl", &text);
    let assertions = write_json(&dir, "assertions.json", &refund_assertions_with_request_ids());
    let (code, v) = eval_json(&trace, &assertions);
    assert_eq!(statuses(&v[0]), ["pass"; 5]);
    assert_eq!(statuses(&v[1]), ["pass", "hard_fail", "pass", "hard_fail", "soft_fail"], "{}", v[1]);
    assert_eq!(code, Some(1));
}

#[test]
fn output_closed_early_still_writes_the_reports_and_exits_141() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (trace, assertions) = (
        root.join("examples/refund_trace.json"),
        root.join("examples/refund_assertions.json"),
    );
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    // Both streams go to one pipe that is closed before anything is written,
    // as `2>&1 | head -0` does: nothing panics, the run goes on to write its
    // report, and ends with the code a shell gives a command SIGPIPE ended.
    // The reading end is closed before the engine starts: closed after, a
    // busy machine may let the engine write its whole answer into the
    // pipe's buffer first.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = command()
        .args(["--report", &format!("json={}", report.display())])
        .args([
            "eval",
            "--trace",
            trace.to_str().unwrap(),
            "--assertions",
            assertions.to_str().unwrap(),
        ])
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{status:?}");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(written["counts"]["total"], json!(10), "{written}");
}
