//! The same manifests through the reference runtime (`ecp` from ecp-runtime
//! 0.10.0) and through ours: every check must get the same verdict. Covers
//! every built-in grader, a CSV and a JSONL dataset, and llm_judge against a
//! fake OpenAI-compatible server on loopback.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use serde_json::Value;

fn prepare(dir: &Path, target: &str) -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/compare");
    for f in ["qa.csv", "qa.jsonl"] {
        std::fs::copy(fixtures.join(f), dir.join(f)).unwrap();
    }
    let manifest = std::fs::read_to_string(fixtures.join("manifest.yaml"))
        .unwrap()
        .replace("TARGET", &format!("'{target}'"));
    write(dir, "manifest.yaml", &manifest).display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_match_the_reference_runtime() {
    if !engine_for_judges() {
        return;
    }
    let Some(venv) = venv() else { return };
    // litellm loads the cl100k_base tokenizer at import; offline it must come
    // from a local tiktoken cache (scripts/test fills venv/tiktoken-cache).
    let cache = venv.join("tiktoken-cache").display().to_string();
    let has_litellm = Command::new(python(&venv))
        .args(["-c", "import litellm"])
        .env("TIKTOKEN_CACHE_DIR", &cache)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        has_litellm,
        "the reference llm_judge needs litellm importable offline: see scripts/test (ecp-runtime[judge] and the tiktoken cache)"
    );
    let judge = fake_judge().await;
    let base = format!("{}/v1", judge.uri());
    let dir = tempfile::tempdir().unwrap();
    let manifest = prepare(dir.path(), &format!("{} {}", python(&venv), agent("support_agent.py")));
    let envs = [
        ("OPENAI_API_KEY", "sk-test"),
        ("OPENAI_API_BASE", base.as_str()),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        ("ECP_LLM_JUDGE_MODEL", "openai/gpt-3.5-turbo"),
        ("TIKTOKEN_CACHE_DIR", cache.as_str()),
    ];

    let reference_out = dir.path().join("reference.json");
    let out = tokio::task::spawn_blocking({
        let (venv, manifest, reference_out) = (venv.clone(), manifest.clone(), reference_out.clone());
        let envs: Vec<(String, String)> = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move || {
            Command::new(venv.join("bin/ecp"))
                .args(["run", "--manifest", &manifest, "--json-out", reference_out.to_str().unwrap()])
                .envs(envs)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        reference_out.exists(),
        "reference run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference_code = out.status.code();
    let reference = read_json(&reference_out);

    let ours_out = dir.path().join("ours.json");
    let ours_run = tokio::task::spawn_blocking({
        let (manifest, ours_out) = (manifest.clone(), ours_out.clone());
        let envs: Vec<(String, String)> = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move || {
            let env_refs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            run_bin(
                &[
                    "run",
                    "--manifest",
                    &manifest,
                    "--json-out",
                    ours_out.to_str().unwrap(),
                    "--jobs",
                    "2",
                ],
                &env_refs,
                None,
            )
        }
    })
    .await
    .unwrap();
    let ours = read_json(&ours_out);

    let theirs = verdicts(&reference);
    let mine = verdicts(&ours);
    assert!(theirs.len() >= 40, "the comparison covers many checks, got {}", theirs.len());
    for (a, b) in theirs.iter().zip(&mine) {
        assert_eq!(
            a,
            b,
            "verdicts differ\nreference reasoning: {}\nour reasoning: {}",
            reasoning(&reference, a),
            reasoning(&ours, b)
        );
    }
    assert_eq!(theirs.len(), mine.len());
    assert_eq!(reference_code, ours_run.status.code(), "same exit status");
    for k in ["passed", "total", "failed", "exit_reason"] {
        assert_eq!(reference[k], ours[k], "{k}");
    }
    // The judge saw every llm_judge check: three from each runtime.
    let requests = judge.received_requests().await.unwrap();
    assert_eq!(requests.len(), 6);
    let judged = &ours["scenarios"][2]["steps"];
    assert_eq!(judged[0]["checks"][0]["passed"], true);
    assert_eq!(judged[1]["checks"][0]["passed"], false);
    validate_schema("report.schema.json", &ours);
    validate_schema("report.schema.json", &reference);
    validate_schema("audit.schema.json", &ours["audit"]);
}

fn reasoning(report: &Value, v: &(String, usize, usize, String, String, bool)) -> String {
    let s = report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == v.0.as_str())
        .unwrap();
    s["steps"][v.1 - 1]["checks"][v.2 - 1]["reasoning"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge_settings_reach_the_endpoint() {
    if !engine_for_judges() {
        return;
    }
    let Some(venv) = venv() else { return };
    let judge = fake_judge().await;
    let base = format!("{}/v1", judge.uri());
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &format!(
            "manifest_version: v1\nname: j\ntarget: '{} {}'\nscenarios:\n  - name: J\n    steps:\n      - input: refund ORD-4\n        graders: [{{type: llm_judge, prompt: 'Is a refund confirmed?'}}]\n",
            python(&venv),
            agent("support_agent.py")
        ),
    );
    let out = tokio::task::spawn_blocking(move || {
        run_bin(
            &["run", "-m", m.to_str().unwrap(), "--json"],
            &[
                ("OPENAI_API_KEY", "sk-test"),
                ("OPENAI_API_BASE", &base),
                ("ECP_LLM_JUDGE_MODEL", "judge-model-x"),
                ("ECP_LLM_JUDGE_TEMPERATURE", "0.25"),
            ],
            None,
        )
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["scenarios"][0]["steps"][0]["checks"][0]["reasoning"],
        "The text was checked."
    );
    let requests = judge.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["model"], "judge-model-x");
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(requests[0].headers.get("authorization").unwrap(), "Bearer sk-test");
}
