//! Shared helpers for the ECP runtime's integration tests: finding the Python
//! venv with ecp-sdk (and the reference runtime), running the real binary,
//! checking that no agent process outlives a run, and a fake
//! OpenAI-compatible judge on loopback.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The venv holding ecp-sdk 0.10.0 and ecp-runtime 0.10.0, from ECP_TEST_VENV.
/// None (with a loud message) when it is not set up.
pub fn venv() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("ECP_TEST_VENV").map(PathBuf::from) else {
        return attest_test_support::missing(
            "ECP_TEST_VENV is not set, so the tests that need Python agents did not run",
            "scripts/test builds it (target/ecp-venv: ecp-runtime 0.10.0 with its judge extra, ecp-sdk 0.10.0) \
             and runs: ECP_TEST_VENV=target/ecp-venv cargo test -p attest-ecp",
        );
    };
    if !dir.join("bin/python").exists() {
        panic!("ECP_TEST_VENV={} has no bin/python", dir.display());
    }
    Some(dir)
}

pub fn python(venv: &Path) -> String {
    venv.join("bin/python").display().to_string()
}

pub fn agent(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/agents")
        .join(name)
        .display()
        .to_string()
}

/// The runtime's front door: `attest-engine ecp` when ATTEST_ENGINE_BIN
/// names the engine (as scripts/test does), so the tests exercise the binary
/// users run; otherwise this crate's own `attest-ecp`, the same runtime
/// without the engine's providers.
pub fn ecp_command() -> Command {
    match std::env::var_os("ATTEST_ENGINE_BIN").map(PathBuf::from) {
        Some(engine) if engine.exists() => {
            let mut cmd = Command::new(engine);
            cmd.arg("ecp");
            cmd
        }
        _ => Command::new(env!("CARGO_BIN_EXE_attest-ecp")),
    }
}

/// Whether `attest-engine ecp` is there (ATTEST_ENGINE_BIN) for a test whose
/// `llm_judge` graders need the engine's judge client: the standalone
/// `attest-ecp` has no model provider. Outside CI the test skips without it.
pub fn engine_for_judges() -> bool {
    match std::env::var_os("ATTEST_ENGINE_BIN").map(PathBuf::from) {
        Some(engine) if engine.exists() => true,
        _ => attest_test_support::missing::<()>(
            "ATTEST_ENGINE_BIN is not set, and llm_judge graders need the engine's judge client",
            "scripts/test builds the engine and sets it",
        )
        .is_some(),
    }
}

pub fn run_bin(args: &[&str], envs: &[(&str, &str)], cwd: Option<&Path>) -> Output {
    run_command(ecp_command(), args, envs, cwd)
}

/// This crate's own `attest-ecp`, whatever ATTEST_ENGINE_BIN says.
pub fn run_standalone(args: &[&str], envs: &[(&str, &str)], cwd: Option<&Path>) -> Output {
    run_command(Command::new(env!("CARGO_BIN_EXE_attest-ecp")), args, envs, cwd)
}

fn run_command(mut cmd: Command, args: &[&str], envs: &[(&str, &str)], cwd: Option<&Path>) -> Output {
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    cmd.output().expect("the attest-ecp binary runs")
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Every check of a JSON report: (scenario, step index, check index, type, field, passed).
pub fn verdicts(report: &Value) -> Vec<(String, usize, usize, String, String, bool)> {
    let mut out = Vec::new();
    for s in report["scenarios"].as_array().unwrap() {
        for (si, step) in s["steps"].as_array().unwrap().iter().enumerate() {
            for (ci, c) in step["checks"].as_array().unwrap().iter().enumerate() {
                out.push((
                    s["name"].as_str().unwrap().to_string(),
                    si + 1,
                    ci + 1,
                    c["type"].as_str().unwrap().to_string(),
                    c["field"].as_str().unwrap().to_string(),
                    c["passed"].as_bool().unwrap(),
                ));
            }
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its parent's bookkeeping is left.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Fail unless every pid in the file has exited (waiting briefly for a
/// signalled process to be reaped).
pub fn assert_no_survivors(pid_file: &Path) {
    let text = std::fs::read_to_string(pid_file).unwrap_or_default();
    let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(!pids.is_empty(), "the agent never wrote its pid to {}", pid_file.display());
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in pids {
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!alive(pid), "agent process {pid} outlived the run");
    }
}

pub fn validate_schema(schema_file: &str, instance: &Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema")
        .join(schema_file);
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{schema_file}: {errors:#?}");
}

/// The text a judge prompt asks about, whichever runtime wrote the prompt.
fn judged_text(prompt: &str) -> String {
    if let (Some(a), Some(b)) = (prompt.find("<text>"), prompt.find("</text>")) {
        return prompt[a + 6..b].to_string();
    }
    if let (Some(a), Some(b)) = (prompt.find("[TEXT TO EVALUATE]"), prompt.find("[CRITERIA]")) {
        return prompt[a + 18..b].to_string();
    }
    String::new()
}

/// An OpenAI-compatible chat completions server on 127.0.0.1 whose judge
/// passes a text exactly when it mentions a refund.
pub struct FakeJudge;

impl wiremock::Respond for FakeJudge {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let prompt = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        let verdict = if judged_text(&prompt).to_lowercase().contains("refund") {
            "RESULT: PASS"
        } else {
            "RESULT: FAIL"
        };
        wiremock::ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("The text was checked.\n{verdict}")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
    }
}

pub async fn fake_judge() -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(FakeJudge)
        .mount(&server)
        .await;
    server
}
