//! The runtime as users reach it: `attest-engine ecp run`, where the `attest`
//! grader is the engine's own evaluator (real layer 1-4 checks, not a test
//! double) and results land in the engine's history. The engine binary comes
//! from ATTEST_ENGINE_BIN (scripts/test sets it to the debug build).

use crate::common::*;
use std::path::PathBuf;
use std::process::Command;

fn engine_bin() -> Option<PathBuf> {
    match std::env::var_os("ATTEST_ENGINE_BIN").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        _ => attest_test_support::missing(
            "ATTEST_ENGINE_BIN is not set to a built attest-engine, so the engine-binary ECP tests did not run",
            "build it (cargo build -p attest-engine) and set ATTEST_ENGINE_BIN=target/debug/attest-engine",
        ),
    }
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
            assertion: {type: content, spec: {target: output.message, check: regex_match, value: "ORD-\\d+ was refunded"}}
          - type: attest
            assertion: {type: schema, spec: {target: "steps[?name=='lookup_order'].args", schema: {type: object, required: [order_id]}}}
      - input: refund it
        graders:
          - type: attest
            scope: transcript
            assertion: {assertion_id: spans_turns, type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}
          - type: attest
            assertion: {type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}
          - type: attest
            assertion: {type: constraint, spec: {field: steps.length, operator: lte, value: 1}}
"#;

#[test]
fn attest_graders_run_on_the_engines_evaluator() {
    let (Some(venv), Some(engine)) = (venv(), engine_bin()) else {
        return;
    };
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
    let junit = dir.path().join("r.xml");
    let run = Command::new(&engine)
        .args(["--log-level=warn", "ecp", "run", "-m"])
        .arg(&m)
        .arg("--json-out")
        .arg(&out)
        .arg("--junit")
        .arg(&junit)
        .arg("--quiet")
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("attest-engine runs");
    assert_eq!(
        run.status.code(),
        Some(2),
        "one check fails on purpose; stderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = read_json(&out);
    let got: Vec<bool> = verdicts(&report).iter().map(|v| v.5).collect();
    assert_eq!(got, vec![true, false, true, true, false, true], "{report}");
    let steps = &report["scenarios"][0]["steps"];
    let failed = steps[0]["checks"][1]["reasoning"].as_str().unwrap();
    assert!(failed.contains("does not match regex"), "the engine's own explanation: {failed}");
    assert_eq!(steps[1]["checks"][1]["status"], "hard_fail");
    assert!(std::fs::read_to_string(&junit).unwrap().contains("<testsuite"));
    // Every graded step went into the engine's result history.
    assert!(dir.path().join("cache/history.sqlite3").exists());
}

#[test]
fn the_engine_binary_validates_manifests() {
    let Some(engine) = engine_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "bad.yaml",
        "manifest_version: v1\nname: bad\ntarget: python3 agent.py\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {type: text_match, condition: startswith, value: x}\n",
    );
    let run = Command::new(&engine).args(["ecp", "validate"]).arg(&m).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(
        text.contains("startswith") && text.contains("contains, equals, does_not_contain, regex"),
        "{text}"
    );

    // An attest grader's assertion is checked by the engine's evaluator, as
    // evaluate_batch would check it: refused by validate and by run, before
    // the agent (which would leave a mark) starts.
    let marker = dir.path().join("agent-started");
    let m = write(
        dir.path(),
        "bad-attest.yaml",
        &format!(
            "manifest_version: v1\nname: bad\ntarget: touch {}\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {{type: attest, assertion: {{type: trace, spec: {{check: bogus}}}}}}\n          - {{type: attest, assertion: {{type: nonsense, spec: {{}}}}}}\n",
            marker.display()
        ),
    );
    for action in ["validate", "run"] {
        let mut cmd = Command::new(&engine);
        cmd.args(["ecp", action]);
        if action == "run" {
            cmd.arg("--manifest");
        }
        let run = cmd.arg(&m).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert_eq!(run.status.code(), Some(1), "{action}: {text}");
        assert!(
            text.contains("2 problem(s)")
                && text.contains("scenario 'S' (#1), step 1, grader 1 (attest): field 'assertion': 1002")
                && text.contains("bogus")
                && text.contains("scenario 'S' (#1), step 1, grader 2 (attest)")
                && text.contains("nonsense"),
            "{action}: {text}"
        );
        assert!(!marker.exists(), "{action} started the agent");
    }
    // As in a collect rules file, a key nothing reads is a typo that would
    // silently change the verdict, in the spec or beside it.
    let m = write(
        dir.path(),
        "typo-attest.yaml",
        &format!(
            "manifest_version: v1\nname: typo\ntarget: touch {}\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {{type: attest, assertion: {{type: content, spec: {{target: output.message, check: contains, value: Hi, case_sensitve: true}}}}}}\n          - {{type: attest, assertion: {{type: content, sofft: true, spec: {{target: output.message, check: contains, value: hi}}}}}}\n",
            marker.display()
        ),
    );
    let run = Command::new(&engine).args(["ecp", "validate"]).arg(&m).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        text.contains("grader 1 (attest): field 'assertion': spec.case_sensitve: unknown key `case_sensitve`: this content assertion never reads it")
            && text.contains("case_sensitive")
            && text.contains("grader 2 (attest): field 'assertion': sofft: unknown key `sofft` in an assertion; valid choices: assertion_id, type, spec, request_id"),
        "{text}"
    );
    assert!(!marker.exists(), "validate started the agent");
    // A structural problem does not hide an assertion problem: one pass lists both.
    let m = write(
        dir.path(),
        "both.yaml",
        "manifest_version: v1\nname: both\ntarget: python3 agent.py\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {type: text_match, condition: startswith, value: x}\n          - {type: attest, assertion: {type: trace, spec: {check: bogus}}}\n",
    );
    let run = Command::new(&engine).args(["ecp", "validate"]).arg(&m).output().unwrap();
    let text = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        text.contains("2 problem(s)") && text.contains("startswith") && text.contains("grader 2 (attest): field 'assertion': 1002"),
        "{text}"
    );

    // Bad arguments are input errors (1); 2 means failed checks. Options
    // before the subcommand do not hide it.
    for args in [
        &["ecp", "run"][..],
        &["ecp", "run", "--manifest", "m.yaml", "--jobs", "100"],
        &["--log-level", "warn", "ecp", "run"],
        &["ecp", "run", "--manifest", "--help"],
    ] {
        let run = Command::new(&engine).args(args).output().unwrap();
        assert_eq!(run.status.code(), Some(1), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
    }
}

/// The `attest` grader runs WebAssembly plugins (layer 8) loaded by the engine.
#[test]
fn attest_graders_run_wasm_plugins() {
    let (Some(venv), Some(engine)) = (venv(), engine_bin()) else {
        return;
    };
    let plugin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/dist/tool-args.wasm");
    assert!(plugin.is_file(), "{} is missing: run plugins/build.sh", plugin.display());
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            r#"manifest_version: v1
name: plugin grader
target: '{} {}'
scenarios:
  - name: Refund
    steps:
      - input: refund ORD-7
        graders:
          - type: attest
            assertion: {{type: plugin, spec: {{plugin_id: tool-args, config: {{tool: process_refund, expect: {{order_id: {{equals: ORD-7}}, amount: {{equals: 89.99}}}}}}}}}}
          - type: attest
            assertion: {{type: plugin, spec: {{plugin_id: tool-args, config: {{tool: process_refund, expect: {{amount: {{equals: 10}}}}}}}}}}
"#,
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let out = dir.path().join("r.json");
    let run = Command::new(&engine)
        .args(["--log-level=warn", "--plugin"])
        .arg(&plugin)
        .args(["ecp", "run", "--quiet", "-m"])
        .arg(&m)
        .arg("--json-out")
        .arg(&out)
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("attest-engine runs");
    assert_eq!(run.status.code(), Some(2), "{}", String::from_utf8_lossy(&run.stderr));
    let report = read_json(&out);
    let checks = &report["scenarios"][0]["steps"][0]["checks"];
    assert_eq!(
        (checks[0]["passed"].as_bool(), checks[1]["passed"].as_bool()),
        (Some(true), Some(false)),
        "{report}"
    );
    let reason = checks[1]["reasoning"].as_str().unwrap();
    assert!(
        reason.contains("argument 'amount' is 89.99, expected 10"),
        "the plugin's own explanation: {reason}"
    );
}

/// With no judge configured, the engine grades `llm_judge` the way ECP
/// manifests expect, from `OPENAI_API_KEY` and `OPENAI_API_BASE`, through
/// its own provider client: a transient 503 is retried, not a failed check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_fallback_judge_retries_a_transient_failure() {
    let (Some(venv), Some(engine)) = (venv(), engine_bin()) else {
        return;
    };
    let judge = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(wiremock::ResponseTemplate::new(503).set_body_string("overloaded"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&judge)
        .await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(FakeJudge)
        .with_priority(2)
        .mount(&judge)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: fallback\ntarget: '{} {}'\nscenarios:\n  - name: Refund\n    steps:\n      - input: refund ORD-7\n        graders:\n          - {{type: llm_judge, prompt: The reply confirms a refund.}}\n",
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let (base, cache) = (format!("{}/v1", judge.uri()), dir.path().join("cache"));
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(engine);
        cmd.args(["--log-level=warn", "--no-history", "ecp", "run", "--quiet", "--json", "-m"])
            .arg(&m)
            .env("ATTEST_CACHE_DIR", &cache)
            .env("OPENAI_API_KEY", "sk-fallback")
            .env("OPENAI_API_BASE", base)
            .env_remove("ECP_LLM_JUDGE_MODEL");
        for (k, _) in std::env::vars() {
            if k.starts_with("ATTEST_JUDGE_") || k == "ATTEST_OPENAI_API_KEY" || k == "ATTEST_ANTHROPIC_API_KEY" {
                cmd.env_remove(k);
            }
        }
        cmd.output().expect("attest-engine runs")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", String::from_utf8_lossy(&out.stdout));
    let requests = judge.received_requests().await.unwrap_or_default();
    assert_eq!(requests.len(), 2, "one 503, then the retry that passed");
    for r in &requests {
        assert_eq!(r.headers.get("authorization").unwrap(), "Bearer sk-fallback");
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["model"], attest_ecp::DEFAULT_JUDGE_MODEL, "the manifest's default model");
    }
    assert!(!stderr.contains("sk-fallback"), "{stderr}");
}

/// `llm_judge` graders on the engine's judge provider: the configured model
/// unless the manifest's environment names one (LiteLLM's `openai/` prefix
/// dropped), deterministic questions answered from the provider cache on the
/// next run, and every graded step in the history `query_drift` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_judge_graders_use_the_engines_judge_its_cache_and_history() {
    let (Some(venv), Some(engine)) = (venv(), engine_bin()) else {
        return;
    };
    let judge = fake_judge().await;
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: judged\ntarget: '{} {}'\nscenarios:\n  - name: Refund\n    steps:\n      - input: refund ORD-7\n        graders:\n          - {{type: llm_judge, prompt: The reply confirms a refund.}}\n",
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let cache = dir.path().join("cache");
    let run = |model: Option<&'static str>| {
        let (engine, m, cache, base) = (engine.clone(), m.clone(), cache.clone(), format!("{}/v1", judge.uri()));
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(engine);
            cmd.args(["--log-level=warn", "ecp", "run", "--quiet", "-m"])
                .arg(&m)
                .env("ATTEST_CACHE_DIR", &cache)
                .env("ATTEST_JUDGE_BASE_URL", base)
                .env("ATTEST_JUDGE_API_KEY", "sk-test")
                .env("ATTEST_JUDGE_MODEL", "llama3.1")
                .env_remove("ECP_LLM_JUDGE_MODEL");
            if let Some(model) = model {
                cmd.env("ECP_LLM_JUDGE_MODEL", model);
            }
            cmd.output().expect("attest-engine runs")
        })
    };
    let models = |requests: Option<Vec<wiremock::Request>>| {
        let requests = requests.unwrap_or_default();
        requests
            .iter()
            .map(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["model"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    for _ in 0..2 {
        let out = run(None).await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(
        models(judge.received_requests().await),
        ["llama3.1"],
        "the second run's question came from the cache"
    );
    let out = run(Some("openai/gpt-3.5-turbo")).await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(models(judge.received_requests().await), ["llama3.1", "gpt-3.5-turbo"]);

    // The three runs of the check, as query_drift sees them.
    let query = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"sdk_name\":\"t\",\"sdk_version\":\"0\",\"protocol_version\":1,\"required_capabilities\":[]}}\n\
                 {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"query_drift\",\"params\":{\"assertion_id\":\"ecp/Refund/step1/0-llm_judge\"}}\n";
    let out = tokio::task::spawn_blocking({
        let (engine, cache) = (engine.clone(), cache.clone());
        move || {
            use std::io::Write;
            let mut child = Command::new(engine)
                .arg("--log-level=warn")
                .env("ATTEST_CACHE_DIR", cache)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(query.as_bytes()).unwrap();
            child.wait_with_output().unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let drift: serde_json::Value = serde_json::from_str(stdout.lines().nth(1).expect("a query_drift answer")).unwrap();
    let report = &drift["result"]["report"];
    assert_eq!(report["count"], 3, "{drift}");
    assert_eq!(
        (report["mean"].as_f64(), report["latest_score"].as_f64()),
        (Some(1.0), Some(1.0)),
        "{drift}"
    );
}

/// The README's ECP quick start, as written: a standard-library agent, no
/// network and no packages.
#[test]
fn the_readme_quick_start_runs_offline() {
    let Some(engine) = engine_bin() else { return };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let (report, junit) = (dir.path().join("report.html"), dir.path().join("junit.xml"));
    // As the README writes it: no log level given.
    let run = Command::new(&engine)
        .args(["ecp", "run", "--manifest", "examples/ecp/manifest.yaml", "--report"])
        .arg(&report)
        .arg("--junit")
        .arg(&junit)
        .current_dir(&root)
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .env_remove("ATTEST_LOG_LEVEL")
        .output()
        .expect("attest-engine runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("5/5 checks passed"), "{stderr}");
    // A person reads these lines: no JSON log line among them.
    assert!(stderr.lines().all(|l| !l.starts_with('{')), "{stderr}");
    assert!(std::fs::read_to_string(&junit)
        .unwrap()
        .contains(r#"tests="2" failures="0" errors="0""#));
    assert!(std::fs::read_to_string(&report).unwrap().contains("Refund request"));

    // The example agent is a conformant ECP agent.
    let run = Command::new(&engine)
        .args(["--log-level=warn", "ecp", "conformance", "python3 examples/ecp/refund_agent.py"])
        .current_dir(&root)
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("attest-engine runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Conformance: 3/3 checks passed"), "{stdout}");
}
