//! The ECP runtime binary driving real ecp-sdk agents over stdio and HTTP,
//! including agents that hang, crash, write to stdout or never initialize.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

fn manifest(dir: &Path, target: &str, body: &str) -> String {
    let text = format!("manifest_version: v1\nname: runtime test\ntarget: '{target}'\n{body}");
    write(dir, "manifest.yaml", &text).display().to_string()
}

fn run_json(dir: &Path, manifest: &str, extra: &[&str], envs: &[(&str, &str)]) -> (i32, Value, String) {
    let out_path = dir.join("report.json");
    let out_str = out_path.display().to_string();
    let mut args = vec!["run", "--manifest", manifest, "--json-out", &out_str];
    args.extend_from_slice(extra);
    let out = run_bin(&args, envs, None);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out_path.exists(), "no report written; stderr:\n{stderr}");
    (out.status.code().unwrap_or(-1), read_json(&out_path), stderr)
}

const SUPPORT_SCENARIOS: &str = r#"
env:
  ECP_TEST_PID_FILE: PIDFILE
scenarios:
  - name: Refunds <b>&</b>
    steps:
      - input: refund ORD-7 <script>
        graders:
          - {type: text_match, condition: contains, value: "refund for ORD-7"}
          - {type: text_match, condition: does_not_contain, value: "cannot"}
          - {type: text_match, field: evaluation_context, condition: regex, pattern: 'within \d+ days'}
          - {type: tool_usage, tool_name: process_refund, arguments: {amount: 89.99, notify: 1, tags: [refund, 1.0]}}
          - {type: tool_usage, tool_name: process_refund, arguments: {amount: "89.99"}}
      - input: pause please
        graders:
          - {type: text_match, condition: equals, value: "Waiting for a manager to approve."}
  - name: Legacy context
    steps:
      - input: legacy
        graders:
          - {type: text_match, field: private_thought, condition: contains, value: deprecated}
          - {type: text_match, field: evaluation_context, condition: contains, value: deprecated}
      - input: empty
        graders:
          - {type: text_match, condition: does_not_contain, value: anything}
"#;

#[test]
fn stdio_run_grades_and_writes_valid_reports() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let body = SUPPORT_SCENARIOS.replace("PIDFILE", &pid_file.display().to_string());
    let m = manifest(dir.path(), &format!("{} {}", python(&venv), agent("support_agent.py")), &body);
    let html = dir.path().join("r.html").display().to_string();
    let junit = dir.path().join("r.xml").display().to_string();
    let audit = dir.path().join("audit.json").display().to_string();
    let (code, report, stderr) = run_json(dir.path(), &m, &["--report", &html, "--junit", &junit, "--audit-out", &audit], &[]);
    assert_eq!(code, 2, "one check fails, so the run exits 2; stderr:\n{stderr}");
    let v: Vec<bool> = verdicts(&report).iter().map(|v| v.5).collect();
    assert_eq!(v, vec![true, true, true, true, false, true, true, true, false]);
    assert_eq!(
        (report["passed"].as_u64(), report["total"].as_u64(), report["failed"].as_u64()),
        (Some(7), Some(9), Some(2))
    );
    assert_eq!(report["scenarios"][0]["steps"][1]["agent_status"], "paused");
    assert_eq!(report["scenarios"][0]["steps"][0]["checks"][3]["field"], "tool_calls");
    assert_eq!(report["audit"]["usage"]["total_tokens"], 28);
    validate_schema("report.schema.json", &report);
    validate_schema("audit.schema.json", &report["audit"]);
    validate_schema("audit.schema.json", &read_json(Path::new(&audit)));
    assert!(
        stderr.contains("step 1/2 FAIL 4/5 check(s)"),
        "plain progress lines when not a terminal:\n{stderr}"
    );

    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("Refunds &lt;b&gt;&amp;&lt;/b&gt;") && page.contains("refund ORD-7 &lt;script&gt;"),
        "escaped"
    );
    assert!(
        !page.contains("<script") && !page.contains("src=\"http") && !page.contains("href=\"http"),
        "self-contained"
    );
    assert!(page.contains("process_refund") && page.contains("FAIL") && page.contains("agent paused"));

    let xml = std::fs::read_to_string(&junit).unwrap();
    let mut reader = quick_xml::Reader::from_str(&xml);
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("the JUnit report is not well-formed XML: {e}\n{xml}"),
        }
    }
    assert_eq!(xml.matches("<testsuite ").count(), 2);
    assert_eq!(xml.matches("<testcase ").count(), 4);
    assert!(
        xml.contains("<failure message=\"1 of 5 check(s) failed\" type=\"check_failed\">"),
        "{xml}"
    );
    assert_no_survivors(&pid_file);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_agent(venv: &Path) -> (Server, String) {
    let port = free_port();
    let child = Command::new(python(venv))
        .args([agent("support_agent.py").as_str(), "--http", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the HTTP agent did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, format!("http://127.0.0.1:{port}/ecp"))
}

#[test]
fn streamable_http_agent_runs_and_conforms() {
    let Some(venv) = venv() else { return };
    let (_server, url) = http_agent(&venv);
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &url,
        r#"
scenarios:
  - name: Two turns
    steps:
      - input: lookup ORD-3
        graders:
          - {type: tool_usage, tool_name: lookup_order, arguments: {order_id: ORD-3}}
      - input: refund it
        graders:
          - {type: text_match, condition: contains, value: ORD-3}
  - name: Reset between scenarios
    steps:
      - input: refund it
        graders:
          - {type: text_match, condition: contains, value: None}
"#,
    );
    let (code, report, stderr) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(verdicts(&report).iter().filter(|v| v.5).count(), 3);
    validate_schema("report.schema.json", &report);
    validate_schema("audit.schema.json", &report["audit"]);

    let out = run_bin(&["conformance", &url, "--json"], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let conf: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(conf["conformant"], true);
    assert_eq!(conf["total"], 3);
}

#[test]
fn hanging_agent_times_out_and_its_whole_group_is_stopped() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let m = manifest(
        dir.path(),
        &format!("{} {} hang", python(&venv), agent("misbehaving_agent.py")),
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Hang\n    steps:\n      - input: one\n      - input: two\n",
            pid_file.display()
        ),
    );
    let (code, report, _) = run_json(dir.path(), &m, &["--timeout", "2"], &[]);
    assert_eq!(code, 2);
    assert_eq!(report["exit_reason"], "timeout");
    let steps = &report["scenarios"][0]["steps"];
    assert_eq!(steps[0]["exit_reason"], "timeout");
    assert!(
        steps[0]["error"]
            .as_str()
            .unwrap()
            .contains("did not answer agent/step within 2.0s"),
        "{}",
        steps[0]["error"]
    );
    assert_eq!(steps[1]["status"], "skipped");
    assert_eq!(steps[1]["checks"][0]["type"], "execution");
    let pids = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(
        pids.lines().count(),
        4,
        "the agent and the children it started, two outside its group"
    );
    assert_no_survivors(&pid_file);
}

#[test]
fn run_budget_stops_a_slow_agent_and_skips_what_is_left() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let m = manifest(
        dir.path(),
        &format!("{} {} hang", python(&venv), agent("misbehaving_agent.py")),
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Slow\n    steps:\n      - input: one\n  - name: Never started\n    steps:\n      - input: two\n",
            pid_file.display()
        ),
    );
    let (_, report, _) = run_json(dir.path(), &m, &["--timeout", "60", "--max-duration", "2"], &[]);
    assert_eq!(report["exit_reason"], "max_duration_exceeded");
    assert_eq!(report["scenarios"][0]["steps"][0]["exit_reason"], "max_duration_exceeded");
    assert_eq!(report["scenarios"][1]["exit_reason"], "max_duration_exceeded");
    assert_eq!(report["scenarios"][1]["steps"][0]["status"], "skipped");
    assert_eq!(report["audit"]["limits"]["max_duration_s"], 2.0);
    validate_schema("audit.schema.json", &report["audit"]);
    assert_no_survivors(&pid_file);
}

#[test]
fn crashing_agent_fails_its_step_with_stderr_and_the_next_scenario_starts_fresh() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let m = manifest(
        dir.path(),
        &format!("{} {} crash", python(&venv), agent("misbehaving_agent.py")),
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Crash\n    steps:\n      - input: one\n        graders: [{{type: text_match, condition: equals, value: 'Echo: one'}}]\n      - input: two\n      - input: three\n  - name: Fresh\n    steps:\n      - input: again\n        graders: [{{type: text_match, condition: equals, value: 'Echo: again'}}]\n",
            pid_file.display()
        ),
    );
    let (code, report, _) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 2);
    let steps = &report["scenarios"][0]["steps"];
    assert_eq!(steps[0]["checks"][0]["passed"], true);
    assert_eq!(steps[1]["exit_reason"], "transport_error");
    let err = steps[1]["error"].as_str().unwrap();
    assert!(
        err.contains("exit status: 3") && err.contains("the model server went away"),
        "{err}"
    );
    assert_eq!(steps[2]["status"], "skipped");
    assert!(report["scenarios"][0]["stderr"]
        .as_str()
        .unwrap()
        .contains("model server went away"));
    assert_eq!(report["scenarios"][1]["steps"][0]["checks"][0]["passed"], true);
    assert_eq!(report["exit_reason"], "transport_error");
    assert_no_survivors(&pid_file);
}

#[test]
fn an_agent_allocates_within_its_memory_limit_and_is_refused_past_it() {
    // Plain python3: each step allocates the MiB it names and says whether
    // it could.
    let dir = tempfile::tempdir().unwrap();
    let agent = write(
        dir.path(),
        "allocator.py",
        r#"import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg["method"] == "agent/initialize":
        result = {"name": "Allocator", "protocol_version": "1.0", "capabilities": {}}
    else:
        try:
            block = bytearray(int(msg["params"]["input"]) << 20)
            answer = "allocated"
        except MemoryError:
            answer = "refused"
        result = {"status": "done", "public_output": answer}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"#,
    );
    let steps = |mib: u32, answer: &str| {
        format!("scenarios:\n  - name: S\n    steps:\n      - input: '{mib}'\n        graders: [{{type: text_match, condition: equals, value: {answer}}}]\n")
    };
    let target = format!("python3 {}", agent.display());
    // 512 MiB under the default limit (4 GiB), then under a 256 MiB one.
    let m = manifest(dir.path(), &target, &steps(512, "allocated"));
    let (code, report, stderr) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    let m = manifest(dir.path(), &target, &steps(512, "refused"));
    let (code, report, stderr) = run_json(dir.path(), &m, &["--agent-memory", "256MiB"], &[]);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    let out = run_bin(&["conformance", "--agent-memory-mib", "-1", &target], &[], None);
    assert_eq!(out.status.code(), Some(1), "a limit that is no number of MiB is a usage error");
}

#[test]
fn helpers_of_an_agent_that_exits_mid_step_do_not_outlive_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    // Plain python3: starts a helper in its own process group, then dies
    // in the middle of agent/step without answering.
    let agent = write(
        dir.path(),
        "leaver.py",
        &format!(
            r#"import json, os, subprocess, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg["method"] == "agent/initialize":
        print(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": {{"name": "Leaver", "protocol_version": "1.0", "capabilities": {{}}}}}}), flush=True)
    else:
        helper = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({pids:?}, "w").write(str(helper.pid) + "\n")
        os._exit(1)
"#,
            pids = pid_file.display().to_string()
        ),
    );
    let m = manifest(
        dir.path(),
        &format!("python3 {}", agent.display()),
        "scenarios:\n  - name: S\n    steps:\n      - input: hi\n",
    );
    let (code, report, stderr) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(report["scenarios"][0]["steps"][0]["exit_reason"], "transport_error", "{report:#}");
    assert_no_survivors(&pid_file);
}

/// A library's warning on stdout (CrewAI prints them) is passed over, as
/// the reference runtime does: the step goes on, and the report shows the
/// line beside the agent's stderr.
#[test]
fn stray_stdout_text_is_passed_over_and_shown_in_the_report() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let m = manifest(
        dir.path(),
        &format!("{} {} noisy", python(&venv), agent("misbehaving_agent.py")),
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Noisy\n    steps:\n      - input: one\n",
            pid_file.display()
        ),
    );
    let (_, report, _) = run_json(dir.path(), &m, &["--timeout", "120"], &[]);
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["steps"][0]["exit_reason"], "ok", "{report:#}");
    let stderr = scenario["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("1 line(s) on stdout that are not JSON-RPC") && stderr.contains("\"Loading model weights... done\""),
        "{stderr}"
    );
    assert_no_survivors(&pid_file);
}

#[test]
fn conformance_refuses_a_pass_env_that_is_no_variable_name() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let target = format!("touch {}", started.display());
    let out = run_bin(&["conformance", &target, "--pass-env", "A=B"], &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--pass-env \"A=B\": not a valid environment variable name"),
        "{stderr}"
    );
    assert!(!started.exists(), "the agent started");
}

#[test]
fn conformance_refuses_an_empty_agent_command() {
    for target in ["", "  "] {
        let out = run_bin(&["conformance", target], &[], None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("the agent command is empty"), "{stderr}");
        assert!(out.stdout.is_empty(), "no report for a check that never ran");
    }
}

#[test]
fn agent_that_never_initializes_is_reported_and_stopped() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let target = format!("{} {} mute", python(&venv), agent("misbehaving_agent.py"));
    let m = manifest(
        dir.path(),
        &target,
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Mute\n    steps:\n      - input: one\n      - input: two\n",
            pid_file.display()
        ),
    );
    let (code, report, _) = run_json(dir.path(), &m, &["--timeout", "2"], &[]);
    assert_eq!(code, 2);
    let s = &report["scenarios"][0];
    assert_eq!(s["exit_reason"], "timeout");
    assert!(s["steps"][0]["error"].as_str().unwrap().contains("did not answer agent/initialize"));
    assert_eq!(s["steps"][1]["status"], "skipped");
    assert_no_survivors(&pid_file);

    let out = run_bin(&["conformance", "--target", &target, "--timeout", "2"], &[], None);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FAIL | initialize response | agent did not answer agent/initialize"),
        "{text}"
    );
    assert!(text.contains("Conformance: 0/3 checks passed"), "{text}");
}

#[test]
fn agents_get_a_sanitized_environment() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &format!("{} {}", python(&venv), agent("support_agent.py")),
        r#"
env: {GIVEN: "set in the manifest"}
pass_env: [ECP_TEST_PASSED]
scenarios:
  - name: Env
    steps:
      - input: env ECP_TEST_SECRET
        graders: [{type: text_match, condition: equals, value: "ECP_TEST_SECRET=<unset>"}]
      - input: ancestors ECP_TEST_SECRET
        graders: [{type: text_match, condition: equals, value: "ECP_TEST_SECRET in ancestors: no"}]
      - input: ancestors ECP_TEST_PASSED
        graders: [{type: text_match, condition: equals, value: "ECP_TEST_PASSED in ancestors: no"}]
      - input: env GIVEN
        graders: [{type: text_match, condition: equals, value: "GIVEN=set in the manifest"}]
      - input: env ECP_TEST_PASSED
        graders: [{type: text_match, condition: equals, value: "ECP_TEST_PASSED=passed through"}]
"#,
    );
    let (code, report, stderr) = run_json(
        dir.path(),
        &m,
        &[],
        &[("ECP_TEST_SECRET", "hunter2"), ("ECP_TEST_PASSED", "passed through")],
    );
    assert_eq!(code, 0, "{stderr}\n{report:#}");
}

/// A reference manifest runs unchanged: the model providers' credentials
/// and settings agent frameworks read pass by default, `--pass-env` takes
/// globs, `--inherit-env` passes everything, and other secrets stay out.
#[test]
fn provider_settings_pass_by_default_and_more_is_passed_on_request() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent_cmd = format!("{} {}", python(&venv), agent("support_agent.py"));
    let env = [
        ("OPENAI_API_KEY", "sk-test"),
        ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        ("MYAPP_MODE", "fast"),
        ("ECP_TEST_SECRET", "hunter2"),
    ];
    let steps = |secret: &str| {
        format!(
            "scenarios:\n  - name: Env\n    steps:\n      - input: env OPENAI_API_KEY\n        graders: [{{type: text_match, condition: equals, value: 'OPENAI_API_KEY=sk-test'}}]\n      - input: env OPENAI_BASE_URL\n        graders: [{{type: text_match, condition: equals, value: 'OPENAI_BASE_URL=http://127.0.0.1:9/v1'}}]\n      - input: env MYAPP_MODE\n        graders: [{{type: text_match, condition: equals, value: 'MYAPP_MODE=fast'}}]\n      - input: env ECP_TEST_SECRET\n        graders: [{{type: text_match, condition: equals, value: 'ECP_TEST_SECRET={secret}'}}]\n"
        )
    };
    let m = manifest(dir.path(), &agent_cmd, &steps("<unset>"));
    let (code, report, stderr) = run_json(dir.path(), &m, &["--pass-env", "MYAPP_*"], &env);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    assert!(
        stderr.contains("JSON report written to "),
        "run says where its reports went: {stderr}"
    );
    let m = manifest(dir.path(), &agent_cmd, &steps("hunter2"));
    let (code, report, stderr) = run_json(dir.path(), &m, &["--inherit-env"], &env);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
}

/// An agent that fails while the runtime held a variable it likely needed,
/// withheld from it, is told which and how to pass it.
#[test]
fn a_failing_agent_is_told_which_likely_variables_were_withheld() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &format!("{} {} crash", python(&venv), agent("misbehaving_agent.py")),
        "scenarios:\n  - name: Crash\n    steps:\n      - input: one\n      - input: two\n",
    );
    let (_, report, _) = run_json(dir.path(), &m, &[], &[("MYSERVICE_API_KEY", "k")]);
    let err = report["scenarios"][0]["steps"][1]["error"].as_str().unwrap();
    assert!(
        err.contains("started without MYSERVICE_API_KEY") && err.contains("--pass-env"),
        "{err}"
    );
}

#[test]
fn parallel_jobs_keep_report_order() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let mut body = format!("env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n", pid_file.display());
    for i in 0..5 {
        body.push_str(&format!(
            "  - name: S{i}\n    steps:\n      - input: hello {i}\n        graders: [{{type: text_match, condition: equals, value: 'Echo: hello {i}'}}]\n"
        ));
    }
    let m = manifest(dir.path(), &format!("{} {}", python(&venv), agent("support_agent.py")), &body);
    let (code, report, _) = run_json(dir.path(), &m, &["--jobs", "3"], &[]);
    assert_eq!(code, 0);
    let names: Vec<&str> = report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["S0", "S1", "S2", "S3", "S4"]);
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().lines().count(),
        5,
        "one agent per scenario"
    );
    assert_no_survivors(&pid_file);
}

#[test]
fn required_capabilities_stop_the_run_before_any_step() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &format!("{} {} crash", python(&venv), agent("misbehaving_agent.py")),
        "require_capabilities: true\nscenarios:\n  - name: A\n    steps:\n      - input: x\n        graders: [{type: tool_usage, tool_name: t}]\n  - name: B\n    steps:\n      - input: y\n",
    );
    let (code, report, _) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 2);
    assert_eq!(report["exit_reason"], "protocol_error");
    let err = report["scenarios"][0]["steps"][0]["error"].as_str().unwrap();
    assert!(
        err.contains("does not declare: tool_calls (needed by a tool_usage grader)"),
        "{err}"
    );
    assert_eq!(report["scenarios"][1]["steps"][0]["status"], "skipped");
    assert_eq!(report["scenarios"][1]["exit_reason"], "protocol_error");
}

#[test]
fn validate_names_the_bad_field_and_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "bad.yaml",
        "manifest_version: v1\nname: n\ntarget: agent\nscenarios:\n  - name: Checkout\n    steps:\n      - input: hi\n      - input: pay\n        graders:\n          - {type: text_match, condition: startswith, value: x}\n          - {type: tool_usage, field: public_output, arguments: [1]}\n",
    );
    let out = run_bin(&["validate", m.to_str().unwrap()], &[], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scenario 'Checkout' (#1), step 2, grader 1 (text_match): field 'condition' is 'startswith'; valid choices: contains, equals, does_not_contain, regex"), "{err}");
    assert!(
        err.contains("step 2, grader 2 (tool_usage): field 'arguments' must be a mapping"),
        "{err}"
    );
    let out = run_bin(&["run", "-m", m.to_str().unwrap()], &[], None);
    assert_eq!(out.status.code(), Some(1), "a bad manifest is refused before any agent starts");

    let good = write(
        dir.path(),
        "good.yaml",
        "manifest_version: v1\nname: n\ntarget: agent\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n",
    );
    let out = run_bin(&["validate", good.to_str().unwrap()], &[], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Manifest valid"));
}

#[test]
fn init_writes_a_project_that_passes_on_first_run() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = run_bin(&["init"], &[], Some(dir.path()));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let again = run_bin(&["init"], &[], Some(dir.path()));
    assert_eq!(again.status.code(), Some(1), "refuses to overwrite");
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = run_bin(
        &["run", "--manifest", "ecp_eval/manifest.yaml"],
        &[("PATH", &path)],
        Some(dir.path()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("4/4 checks passed"));
    let out = run_bin(&["conformance", "python3 ecp_eval/agent.py"], &[("PATH", &path)], Some(dir.path()));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn init_never_writes_through_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside.yaml");
    let project = dir.path().join("p");
    std::fs::create_dir(&project).unwrap();
    // A dangling link counts as a file that is there.
    std::os::unix::fs::symlink(&outside, project.join("manifest.yaml")).unwrap();
    let out = run_bin(&["init", project.to_str().unwrap()], &[], None);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!outside.exists() && !project.join("agent.py").exists());
    // --force replaces the link, not what it points to.
    std::fs::write(&outside, "kept").unwrap();
    let out = run_bin(&["init", project.to_str().unwrap(), "--force"], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
    let m = project.join("manifest.yaml");
    assert!(!std::fs::symlink_metadata(&m).unwrap().file_type().is_symlink());
    assert!(std::fs::read_to_string(&m).unwrap().contains("manifest_version"));
    // A directory where a starter file goes is refused before anything is written.
    let q = dir.path().join("q");
    std::fs::create_dir_all(q.join("manifest.yaml")).unwrap();
    let out = run_bin(&["init", q.to_str().unwrap(), "--force"], &[], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
    assert!(!q.join("agent.py").exists());
}

#[test]
fn output_paths_are_checked_before_the_agent_runs() {
    let dir = tempfile::tempdir().unwrap();
    // The agent would take a minute; a bad output path must not wait for it.
    let m = manifest(
        dir.path(),
        "python3 -c \"import time; time.sleep(60)\"",
        "scenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {type: text_match, condition: contains, value: x}\n",
    );
    let existing = dir.path().join("old.json");
    std::fs::write(&existing, "kept").unwrap();
    let missing_dir = dir.path().join("no-such-dir/report.xml");
    for (flag, path, why) in [
        ("--json-out", dir.path().to_str().unwrap(), "is a directory"),
        ("--junit", missing_dir.to_str().unwrap(), "check that its directory exists"),
    ] {
        let t0 = Instant::now();
        let out = run_bin(
            &["run", "--manifest", &m, "--audit-out", existing.to_str().unwrap(), flag, path],
            &[],
            None,
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains(&format!("error: {flag} {path}: ")) && said.contains(why), "{said}");
        assert!(t0.elapsed() < Duration::from_secs(30), "the agent ran first");
    }
    assert_eq!(
        std::fs::read_to_string(&existing).unwrap(),
        "kept",
        "an existing report is not truncated by the check"
    );
    assert!(!missing_dir.parent().unwrap().exists());
}

#[test]
fn trend_flags_a_degrading_pass_rate() {
    let dir = tempfile::tempdir().unwrap();
    for (i, passed) in [10, 9, 6].iter().enumerate() {
        write(
            dir.path(),
            &format!("run-{i}.json"),
            &format!("{{\"manifest\": \"m.yaml\", \"passed\": {passed}, \"total\": 10}}"),
        );
    }
    write(dir.path(), "run-9.json", "not json");
    // JSON that is not a run report: a list, an audit record, odd counts.
    write(dir.path(), "run-91.json", r#"["not", "a", "report"]"#);
    write(
        dir.path(),
        "run-92.json",
        r#"{"audit_version": "1", "totals": {"checks_passed": 0}}"#,
    );
    write(dir.path(), "run-93.json", r#"{"passed": 1e308, "total": 1e308}"#);
    write(dir.path(), "run-94.json", r#"{"passed": 3, "total": 2}"#);
    // A run with no checks, and a conformance record: neither is a pass rate.
    write(dir.path(), "run-95.json", r#"{"manifest": "m.yaml", "passed": 0, "total": 0}"#);
    write(
        dir.path(),
        "run-96.json",
        r#"{"target": "a", "conformant": false, "passed": 1, "total": 3}"#,
    );
    let pattern = format!("{}/run-*.json", dir.path().display());
    let out = run_bin(&["trend", &pattern, "--exit-on-regression"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DEGRADING") && text.contains("-0.200000"), "{text}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("7 of the last 10 matched file(s) are not run reports") && said.contains("run-9.json"),
        "{said}"
    );
    let out = run_bin(&["trend", &pattern, "--window", "1", "--json"], &[], None);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["direction"], "stable");
    let out = run_bin(&["trend", &format!("{}/none-*.json", dir.path().display())], &[], None);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn server_sent_event_responses_are_read() {
    let Some(venv) = venv() else { return };
    let port = free_port();
    let child = Command::new(python(&venv))
        .args([agent("sse_agent.py").as_str(), &port.to_string()])
        .spawn()
        .unwrap();
    let _server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the SSE agent did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &format!("http://127.0.0.1:{port}/ecp"),
        "scenarios:\n  - name: SSE\n    steps:\n      - input: hi\n        graders:\n          - {type: text_match, condition: equals, value: 'SSE echo: hi'}\n          - {type: tool_usage, tool_name: stream, arguments: {n: 1}}\n",
    );
    let (code, report, stderr) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 0, "{stderr}\n{report:#}");
    let out = run_bin(&["conformance", &format!("http://127.0.0.1:{port}/ecp")], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Runs `target` in `mode` for one step, SIGKILLs the runtime once the
/// agent's processes have written `pids` pids, and checks none survives.
fn killed_runtime_leaves_no_process(target: impl FnOnce(&std::path::Path, &str) -> String, mode: &str, pids: usize) {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let agent_command = format!("{} {} {mode}", python(&venv), agent("misbehaving_agent.py"));
    let m = manifest(
        dir.path(),
        &target(dir.path(), &agent_command),
        &format!(
            "env: {{ECP_TEST_PID_FILE: '{}'}}\nscenarios:\n  - name: Killed\n    steps:\n      - input: one\n",
            pid_file.display()
        ),
    );
    let mut runtime = ecp_command()
        .args(["run", "-m", &m, "--timeout", "600"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&pid_file).map(|s| s.lines().count()).unwrap_or(0) < pids {
        assert!(Instant::now() < deadline, "the agent did not start its {pids} process(es)");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGKILL: the runtime gets no chance to clean up.
    runtime.kill().unwrap();
    runtime.wait().unwrap();
    assert_no_survivors(&pid_file);
}

#[test]
fn agent_dies_when_the_runtime_is_killed() {
    killed_runtime_leaves_no_process(|_, agent| agent.to_owned(), "mute", 1);
}

#[test]
fn nothing_the_agent_started_outlives_a_killed_runtime() {
    // A compound target keeps a shell between the runtime and the agent, and
    // the hanging agent starts children of its own on its first step, two
    // of them outside its process group: the agent's guard takes all of them
    // down.
    killed_runtime_leaves_no_process(|dir, agent| format!("cd {} && {agent}", dir.display()), "hang", 4);
}

#[test]
fn agent_stderr_is_kept_bounded() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        dir.path(),
        &format!("{} {} chatty", python(&venv), agent("misbehaving_agent.py")),
        "scenarios:\n  - name: Chatty\n    steps:\n      - input: a\n        graders: [{type: text_match, condition: equals, value: 'Echo: a'}]\n      - input: b\n",
    );
    let (code, report, _) = run_json(dir.path(), &m, &[], &[]);
    assert_eq!(code, 0);
    let stderr = report["scenarios"][0]["stderr"].as_str().unwrap();
    assert!(stderr.len() <= 64 * 1024 + 100, "{} bytes kept", stderr.len());
    assert!(
        stderr.contains("earlier bytes dropped") && stderr.trim_end().ends_with(&"x".repeat(90)),
        "the most recent output is kept"
    );
    assert!(stderr.contains("debug 01999"));
}

/// Debian's Chromium, from CHROMIUM (scripts/test sets it) or /usr/bin/chromium;
/// None, loudly, when neither is there.
fn chromium() -> Option<String> {
    let configured = std::env::var("CHROMIUM").ok();
    let path = configured.clone().unwrap_or_else(|| "/usr/bin/chromium".to_owned());
    if Path::new(&path).exists() {
        return Some(path);
    }
    assert!(configured.is_none(), "CHROMIUM={path} does not exist");
    attest_test_support::missing(
        "Chromium is not installed, so the HTML report was not rendered",
        "apt-get install chromium poppler-utils",
    )
}

/// Runs headless Chromium on `url` with `args`, with the flags a closed
/// network needs (no background connections) and a throwaway profile.
fn headless(chromium: &str, profile: &Path, args: &[&str], url: &str) {
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let status = cmd.status().expect("chromium runs");
    assert!(status.success(), "chromium {args:?}: {status}");
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn html_report_renders_the_failing_reason_in_headless_chromium() {
    let (Some(venv), Some(chromium)) = (venv(), chromium()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let body = SUPPORT_SCENARIOS.replace("PIDFILE", &pid_file.display().to_string());
    let m = manifest(dir.path(), &format!("{} {}", python(&venv), agent("support_agent.py")), &body);
    let html = dir.path().join("r.html");
    let (code, report, _) = run_json(dir.path(), &m, &["--report", html.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    let failing = &report["scenarios"][0]["steps"][0]["checks"][4];
    assert_eq!(failing["passed"], false, "{failing}");
    let reason = squash(failing["reasoning"].as_str().unwrap());
    assert!(reason.len() > 10, "{failing}");
    let url = format!("file://{}", html.display());

    // A screenshot: the page renders as a picture with content (a blank
    // 1280x1800 page compresses to a few KB).
    let shot = dir.path().join("report.png");
    let screenshot = format!("--screenshot={}", shot.display());
    headless(
        &chromium,
        &dir.path().join("profile-shot"),
        &["--window-size=1280,1800", &screenshot],
        &url,
    );
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1280, 1800), "screenshot size");
    assert!(png.len() > 30_000, "a {}-byte screenshot is a blank page", png.len());
    if let Some(keep) = std::env::var_os("ECP_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }

    // What the page shows, as Chromium lays it out: printed to PDF and read
    // back as text, so hidden or collapsed text would not count.
    let pdf = dir.path().join("report.pdf");
    let print = format!("--print-to-pdf={}", pdf.display());
    headless(
        &chromium,
        &dir.path().join("profile-pdf"),
        &["--no-pdf-header-footer", &print],
        &url,
    );
    let text = Command::new("pdftotext")
        .arg(&pdf)
        .arg("-")
        .output()
        .expect("pdftotext (poppler-utils)");
    assert!(text.status.success());
    let shown = squash(&String::from_utf8_lossy(&text.stdout));
    let head: String = reason.chars().take(40).collect();
    assert!(
        shown.contains(&head),
        "the failing check's reason {reason:?} is not on the rendered page:\n{shown}"
    );
    assert!(shown.contains("FAIL") && shown.contains("Refunds <b>&</b>"), "{shown}");
    assert_no_survivors(&pid_file);
}

/// A crashing agent's long traceback (deep recursion, a message with no
/// spaces) and long reasons stay inside their cards at a laptop's width,
/// keep their line breaks, and the page never scrolls sideways.
#[test]
fn html_report_with_long_tracebacks_fits_the_page_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        return;
    };
    let modules = std::env::var_os("VIEWER_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/viewer-node/node_modules"));
    if !modules.join("playwright-core").is_dir() {
        return attest_test_support::missing(
            "playwright-core is not installed",
            "scripts/test installs it into target/viewer-node (npm install --prefix target/viewer-node playwright-core)",
        )
        .unwrap_or(());
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = write(
        dir.path(),
        "crash.py",
        "import sys\ndef deep(n):\n    if n == 0:\n        raise RuntimeError('no-spaces-' + 'x' * 600)\n    return deep(n - 1)\nsys.stdin.readline()\ndeep(40)\n",
    );
    let body = "scenarios:\n  - name: Crashes\n    steps:\n      - input: Hello\n        graders: [{type: text_match, field: public_output, condition: contains, value: ";
    let m = manifest(
        dir.path(),
        &format!("python3 {}", agent.display()),
        &format!("{body}'{}'}}]\n", "y".repeat(300)),
    );
    let html = dir.path().join("r.html");
    let (code, _, stderr) = run_json(dir.path(), &m, &["--report", html.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "{stderr}");
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/report_fits.mjs"))
        .arg(&html)
        .env("PLAYWRIGHT_CORE", modules.join("playwright-core/index.mjs"))
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["page"], seen["viewport"], "the page scrolls sideways: {}", seen["spilling"]);
    assert_eq!(seen["spilling"], serde_json::json!([]), "content spills out of its box");
    let text = seen["text"].as_str().unwrap();
    assert!(
        text.contains("Traceback (most recent call last):\n"),
        "the traceback keeps its lines: {text}"
    );
    assert!(!text.contains("\\u{a}"), "line breaks shown as escapes: {text}");
}

/// A judge that never answers is cut short by the run's budget like an
/// agent call is: the check fails naming the run's budget, and the run
/// ends as having run out of time, not two minutes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_that_never_answers_is_cut_short_by_max_duration() {
    if !engine_for_judges() {
        return;
    }
    let judge = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_delay(Duration::from_secs(600)))
        .mount(&judge)
        .await;
    let base = format!("{}/v1", judge.uri());
    let dir = tempfile::tempdir().unwrap();
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/ecp/refund_agent.py");
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: j\ntarget: 'python3 {}'\nscenarios:\n  - name: J\n    steps:\n      - input: Hello\n        graders: [{{type: llm_judge, prompt: 'Is it polite?'}}, {{type: llm_judge, prompt: 'Is it short?'}}]\n",
            agent.display()
        ),
    );
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        run_bin(
            &["run", "-m", m.to_str().unwrap(), "--json", "--max-duration", "3"],
            &[("OPENAI_API_KEY", "sk-test"), ("OPENAI_API_BASE", &base)],
            None,
        )
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let checks = &report["scenarios"][0]["steps"][0]["checks"];
    for c in checks.as_array().unwrap() {
        assert_eq!(c["passed"], false, "{c}");
        assert!(
            c["reasoning"]
                .as_str()
                .unwrap()
                .contains("did not answer before --max-duration ran out"),
            "{c}"
        );
    }
    assert_eq!(checks.as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["exit_reason"], "max_duration_exceeded", "{report}");
}
