//! Plugin capabilities (`attest:plugin@0.2.0`) through the real binary:
//! `embed`, `judge` and `config-secret`, each granted and denied in the
//! config file; their cost and the session budget; a 0.1.0 and a 0.2.0
//! plugin in one batch; and hostile 0.2.0 plugins (a judge loop, an
//! ungranted secret, a huge embed), each contained while neighbouring
//! assertions and concurrent requests go on.
//!
//! Plugins come from `plugins/dist/` (built by `plugins/build.sh`); the
//! judge and the embeddings are the deterministic fakes of
//! [`common::fake_provider`], reached over loopback as a user would
//! configure them.

use crate::common::fake_provider::*;
use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const DIST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist");
const V0_1_0_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/plugins/v0_1_0-noop.wasm");

fn wasm(name: &str) -> String {
    let path = Path::new(DIST).join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} is missing: run plugins/build.sh", path.display());
    path.to_str().unwrap().to_owned()
}

/// A config file listing `plugins` (TOML `[[plugins]]` bodies) after `head`.
fn config_file(dir: &Path, head: &str, plugins: &[String]) -> String {
    let mut text = format!("{head}\n");
    for p in plugins {
        text.push_str(&format!("\n[[plugins]]\n{p}\n"));
    }
    let path = dir.join("attest.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn entry(name: &str, extra: &str) -> String {
    format!("path = {:?}\n{extra}", wasm(name))
}

/// An engine with `config`, its providers pointed at `fake` (when given).
fn engine(dir: &Path, config: &str, fake: Option<&Fake>, env: &[(&str, &str)]) -> Engine {
    let cache = dir.join("cache");
    let v1 = fake.map(Fake::v1);
    let mut vars: Vec<(&str, &str)> = vec![("ATTEST_CACHE_DIR", cache.to_str().unwrap())];
    if let Some(v1) = &v1 {
        vars.push(("ATTEST_JUDGE_BASE_URL", v1));
        vars.push(("ATTEST_EMBEDDING_BASE_URL", v1));
    }
    vars.extend_from_slice(env);
    let mut e = Engine::spawn_env(&["--log-level=warn", "--config", config], Stderr::Drain, &vars);
    e.initialize();
    e
}

fn plugin(id: &str, plugin_id: &str, config: Value) -> Value {
    json!({"assertion_id": id, "type": "plugin", "spec": {"plugin_id": plugin_id, "config": config}})
}

fn results(e: &mut Engine, trace: Value, assertions: Value) -> Vec<Value> {
    let resp = e.request(&evaluate_request(json!(1), trace, assertions));
    resp["result"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {resp}"))
        .clone()
}

fn answer(message: &str) -> Value {
    json!({"schema_version": 1, "trace_id": "t", "output": {"message": message},
           "steps": [{"type": "retrieval", "name": "kb", "result": {"documents": [
               {"id": "d1", "content": "Refunds are accepted within 30 days of purchase with a receipt."},
               {"id": "d2", "content": "Standard shipping is free on orders over 50 dollars."}]}}]})
}

fn explanation(r: &Value) -> &str {
    r["explanation"].as_str().unwrap()
}

const REFUND_PRICE: &str = "[prices.\"gpt-4.1\"]\ninput_per_mtok = 10.0\noutput_per_mtok = 10.0";

#[test]
fn a_0_1_0_and_a_0_2_0_plugin_answer_in_one_batch_with_judge_granted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::with_openai();
    let config = config_file(
        dir.path(),
        REFUND_PRICE,
        &[format!("path = {V0_1_0_FIXTURE:?}"), entry("rubric", "grants = [\"judge\"]")],
    );
    let mut e = engine(dir.path(), &config, Some(&fake), &[]);
    let listing = e.request(&rpc(json!(0), "list_plugins", json!({})))["result"].clone();
    assert_eq!(listing["api_versions"], json!(["0.2.0", "0.1.0"]), "{listing}");
    let find = |id: &str| {
        listing["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(find("noop")["api_version"], "0.1.0");
    assert_eq!(find("rubric")["api_version"], "0.2.0");
    assert_eq!(
        find("rubric")["capabilities"],
        json!({"requested": ["judge"], "granted": ["judge"], "usable": ["judge"], "secrets": []})
    );
    assert_eq!(find("noop")["capabilities"]["requested"], json!([]));

    let r = results(
        &mut e,
        answer("GOOD: your refund is on its way."),
        json!([
            plugin("old", "noop", json!({})),
            plugin("good", "rubric", json!({"rubric": "Warm and clear.", "threshold": 0.8})),
            plugin("strict", "rubric", json!({"rubric": "Warm and clear.", "threshold": 0.95})),
        ]),
    );
    assert_eq!(r[0]["status"], "pass", "{}", r[0]);
    assert_eq!(r[1]["status"], "pass", "{}", r[1]);
    assert_eq!(r[1]["score"], 0.9);
    assert!(explanation(&r[1]).contains("fake judge saw the output"), "{}", r[1]);
    assert_eq!(r[2]["status"], "hard_fail", "{}", r[2]);
    // 1,000 + 100 tokens at $10 per million: $0.011 for the first ask; the
    // second is the same question, answered by the verdict cache for free.
    let cost = |r: &Value| r["cost"].as_f64().unwrap();
    assert!((cost(&r[1]) - 0.011).abs() < 1e-9, "{}", r[1]);
    assert_eq!(cost(&r[2]), 0.0, "{}", r[2]);
    assert_eq!(cost(&r[0]), 0.0);
    // The judge saw the rubric as criteria and the answer as marked data.
    let bodies = fake.bodies("/v1/chat/completions");
    assert_eq!(bodies.len(), 1, "one provider call, then the cache");
    let user = user_message(&bodies[0]);
    assert!(
        user.contains("Warm and clear.") && output_block(&bodies[0]).contains("GOOD: your refund"),
        "{user}"
    );
}

#[test]
fn each_capability_granted_works_and_denied_names_its_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::with_openai();
    let granted = config_file(
        dir.path(),
        "",
        &[
            entry("grounding", "grants = [\"embed\"]"),
            entry("rubric", "grants = [\"judge\"]"),
            entry(
                "secret-snoop",
                "grants = [\"config-secret\"]\n[plugins.secrets]\nbrand_key = \"k-123\"\nfrom_env = { env = \"SNOOP_TEST_TOKEN\" }",
            ),
        ],
    );
    let mut e = engine(dir.path(), &granted, Some(&fake), &[("SNOOP_TEST_TOKEN", "tok")]);
    let docs = "steps[?name=='kb'].result.documents";
    let r = results(
        &mut e,
        answer("Refunds are accepted within 30 days of purchase with a receipt. We also operate a colony on Mars."),
        json!([
            plugin("grounded", "grounding", json!({"documents": docs, "min_supported": 0.5})),
            plugin("strict", "grounding", json!({"documents": docs, "min_supported": 1.0})),
            plugin("judged", "rubric", json!({"rubric": "r"})),
            plugin("env", "secret-snoop", json!({})),
            plugin("mapped", "secret-snoop", json!({"names": ["brand_key", "from_env", "HOME"]})),
        ]),
    );
    assert_eq!(r[0]["status"], "pass", "{}", r[0]);
    assert_eq!(r[0]["score"], 0.5, "{}", r[0]);
    assert_eq!(r[1]["status"], "hard_fail", "{}", r[1]);
    assert!(
        explanation(&r[1]).contains("Least supported: 'We also operate a colony on Mars.'"),
        "{}",
        r[1]
    );
    assert!(
        !fake.bodies("/v1/embeddings").is_empty(),
        "embeddings came from the engine's provider"
    );
    assert_eq!(r[2]["status"], "hard_fail", "the fake scores 0.5 < 0.7: {}", r[2]);
    assert_eq!(r[3]["status"], "pass", "the environment is never a secret: {}", r[3]);
    assert_eq!(r[4]["status"], "hard_fail", "{}", r[4]);
    assert_eq!(
        explanation(&r[4]),
        "mapped secrets: brand_key (5 bytes), from_env (3 bytes)",
        "only mapped values, read from the operator's mapping"
    );
    drop(e);

    // The same plugins, nothing granted: they load, and every call is refused.
    let dir = tempfile::tempdir().unwrap();
    let denied = config_file(
        dir.path(),
        "",
        &[entry("grounding", ""), entry("rubric", ""), entry("secret-snoop", "")],
    );
    let mut e = engine(dir.path(), &denied, Some(&fake), &[]);
    let before = fake.requests().len();
    let r = results(
        &mut e,
        answer("Refunds take 30 days."),
        json!([
            plugin("g", "grounding", json!({"documents": docs})),
            plugin("j", "rubric", json!({"rubric": "r"})),
            plugin("s", "secret-snoop", json!({})),
        ]),
    );
    for (r, cap) in r.iter().zip(["embed", "judge", "config-secret"]) {
        assert_eq!(r["status"], "hard_fail", "{r}");
        let text = explanation(r);
        assert!(
            text.contains(&format!("capability '{cap}' is not granted"))
                && text.contains(&format!("grants = [\"{cap}\"]"))
                && text.contains("plugins[].grants"),
            "{text}"
        );
        assert_eq!(r["cost"], 0.0);
    }
    assert_eq!(fake.requests().len(), before, "no provider call without a grant");
}

#[test]
fn a_plugins_judge_call_is_refused_once_the_budget_is_spent() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::with_openai();
    let config = config_file(
        dir.path(),
        &format!("budget_usd = 0.015\n{REFUND_PRICE}"),
        &[entry("rubric", "grants = [\"judge\"]")],
    );
    let mut e = engine(dir.path(), &config, Some(&fake), &[]);
    // Different texts: no cached verdicts. The first ask costs $0.011; the
    // second is admitted ($0.004 left) and overspends; the third is refused.
    let r = results(
        &mut e,
        answer("GOOD one"),
        json!([
            plugin("a", "rubric", json!({"rubric": "r1"})),
            plugin("b", "rubric", json!({"rubric": "r2"})),
            plugin("c", "rubric", json!({"rubric": "r3"})),
            {"assertion_id": "free", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "GOOD"}},
        ]),
    );
    assert_eq!(r[0]["status"], "pass", "{}", r[0]);
    assert_eq!(r[1]["status"], "pass", "{}", r[1]);
    assert_eq!(r[2]["status"], "hard_fail", "{}", r[2]);
    let text = explanation(&r[2]);
    assert!(
        text.contains("was refused a model call") && text.contains("budget") && text.contains("budget_usd"),
        "{text}"
    );
    assert_eq!(r[2]["cost"], 0.0);
    assert_eq!(r[3]["status"], "pass", "free layers still run: {}", r[3]);
    assert_eq!(
        fake.bodies("/v1/chat/completions").len(),
        2,
        "the refused call never reached the provider"
    );
    // The next request finds the budget spent too.
    let r = results(&mut e, answer("GOOD two"), json!([plugin("d", "rubric", json!({"rubric": "r4"}))]));
    assert!(explanation(&r[0]).contains("budget"), "{}", r[0]);
}

/// A plugin that keeps calling after the refusal until its deadline still
/// fails for the budget, not for the timeout it ran into.
#[test]
fn a_budget_refusal_outlives_what_the_plugin_does_next() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::with_openai();
    let config = config_file(
        dir.path(),
        &format!("budget_usd = 0.015\n{REFUND_PRICE}"),
        &[entry("judge-loop", "grants = [\"judge\"]\ntimeout = \"1s\"")],
    );
    let mut e = engine(dir.path(), &config, Some(&fake), &[]);
    let r = results(&mut e, answer("GOOD"), json!([plugin("loop", "judge-loop", json!({}))]));
    assert_eq!(r[0]["status"], "hard_fail", "{}", r[0]);
    let text = explanation(&r[0]);
    assert!(
        text.contains("was refused a model call") && text.contains("budget_usd") && text.contains("timed out"),
        "{text}"
    );
}

#[test]
fn the_local_embedding_model_serves_embed() {
    let Some(model) = std::env::var_os("ATTEST_TEST_MODEL_DIR").or_else(|| {
        attest_test_support::missing(
            "ATTEST_TEST_MODEL_DIR is not set, so the local embedding model was not loaded",
            "set it to an all-MiniLM-L6-v2 directory (scripts/test unpacks one into target/models)",
        )
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "", &[entry("grounding", "grants = [\"embed\"]\ntimeout = \"60s\"")]);
    let mut e = engine(
        dir.path(),
        &config,
        None,
        &[("ATTEST_EMBEDDING_MODEL_DIR", model.to_str().unwrap())],
    );
    let docs = "steps[?name=='kb'].result.documents";
    let r = results(
        &mut e,
        answer("You can get a refund within 30 days if you bring the receipt. Penguins huddle in the antarctic winter."),
        json!([
            plugin(
                "half",
                "grounding",
                json!({"documents": docs, "min_similarity": 0.5, "min_supported": 0.5})
            ),
            plugin(
                "all",
                "grounding",
                json!({"documents": docs, "min_similarity": 0.5, "min_supported": 1.0})
            ),
        ]),
    );
    assert_eq!(r[0]["status"], "pass", "{}", r[0]);
    assert_eq!(r[0]["score"], 0.5, "{}", r[0]);
    assert_eq!(r[1]["status"], "hard_fail", "{}", r[1]);
    assert!(explanation(&r[1]).contains("Penguins"), "{}", r[1]);
    assert_eq!(r[0]["cost"], 0.0, "the local model is free");
}

#[test]
fn hostile_capability_plugins_are_contained_and_their_neighbours_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::with_openai();
    let config = config_file(
        dir.path(),
        "max_concurrent_requests = 8",
        &[
            entry("judge-loop", "grants = [\"judge\"]\ntimeout = \"1s\""),
            entry("embed-flood", "grants = [\"embed\"]"),
            entry("secret-snoop", ""),
            entry("refusal", ""),
        ],
    );
    let mut e = engine(dir.path(), &config, Some(&fake), &[]);
    // A concurrent plain request is answered while the loop runs.
    e.send(&evaluate_request(
        json!("loop"),
        answer("GOOD"),
        json!([plugin("loop", "judge-loop", json!({})), plugin("neighbour", "refusal", json!({})),]),
    ));
    std::thread::sleep(Duration::from_millis(100));
    e.send(&evaluate_request(
        json!("plain"),
        answer("Sure, here it is."),
        json!([plugin("fine", "refusal", json!({}))]),
    ));
    let mut by_id = std::collections::HashMap::new();
    for _ in 0..2 {
        let resp = e.recv();
        by_id.insert(resp["id"].as_str().unwrap().to_owned(), resp);
    }
    assert_eq!(by_id["plain"]["result"]["results"][0]["status"], "pass", "{}", by_id["plain"]);
    let r = by_id["loop"]["result"]["results"].as_array().unwrap().clone();
    assert_eq!(r[0]["status"], "hard_fail", "{}", r[0]);
    assert!(explanation(&r[0]).contains("timed out after 1000 ms"), "{}", r[0]);
    assert_eq!(r[1]["status"], "pass", "the neighbour is unaffected: {}", r[1]);
    // Stopped at the model-call limit (32), not by the provider.
    assert!(fake.bodies("/v1/chat/completions").len() <= 32);

    let r = results(
        &mut e,
        answer("x"),
        json!([
            plugin("many", "embed-flood", json!({"mode": "many"})),
            plugin("huge", "embed-flood", json!({"mode": "huge"})),
            plugin("snoop", "secret-snoop", json!({})),
            plugin("neighbour", "refusal", json!({})),
        ]),
    );
    assert!(
        explanation(&r[0]).contains("embed was given 100000 texts; one call takes at most 64"),
        "{}",
        r[0]
    );
    assert!(
        explanation(&r[1]).contains("is 16777216 bytes; the limit is 32768 bytes"),
        "{}",
        r[1]
    );
    assert!(explanation(&r[2]).contains("capability 'config-secret' is not granted"), "{}", r[2]);
    for r in &r[..3] {
        assert_eq!(r["status"], "hard_fail", "{r}");
    }
    assert_eq!(r[3]["status"], "pass", "{}", r[3]);
    assert!(fake.bodies("/v1/embeddings").is_empty(), "nothing oversized reached the provider");
}

#[test]
fn plugin_test_prints_capability_calls_and_grants_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    std::fs::write(&trace, answer("x").to_string()).unwrap();
    let file = wasm("embed-flood");
    let run_both = |extra: &[&str]| {
        let mut args = vec!["plugin", "test", file.as_str(), "--trace", trace.to_str().unwrap()];
        args.extend_from_slice(&["--plugin-config-json", r#"{"mode": "many"}"#]);
        args.extend_from_slice(extra);
        let out = command()
            .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
            .args(&args)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let run = |extra: &[&str]| run_both(extra).0;
    let denied = run(&[]);
    assert!(denied.contains("capabilities: requested embed; granted none"), "{denied}");
    assert!(
        denied.contains("embed (100000 texts)") && denied.contains("not-granted"),
        "{denied}"
    );
    let (granted, said) = run_both(&["--grant", "embed", "--grant", "judge"]);
    assert!(granted.contains("granted embed"), "{granted}");
    // A grant the plugin never asked for is pointed out, not silently dropped.
    assert!(
        said.contains("--grant judge: embed-flood does not request it (it requests embed), so the grant changes nothing"),
        "{said}"
    );
    assert!(!said.contains("--grant embed"), "{said}");
    assert!(
        granted.contains("embed (100000 texts)") && granted.contains("over-limit"),
        "{granted}"
    );
}

/// A plugin granted secrets tries every way out with their values: its
/// verdict's explanation and details (keys included), log lines at every
/// level, an error. None reaches the answer, the session reports or the
/// engine's log; the log names the secret instead.
#[test]
fn granted_secrets_never_leave_by_any_channel() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "",
        &[entry(
            "secret-snoop",
            "grants = [\"config-secret\"]\n[plugins.secrets]\nbrand_key = \"k-7Yq93pLr\"\nfrom_env = { env = \"SNOOP_TEST_TOKEN\" }",
        )],
    );
    let reports = dir.path().join("report");
    let json_report = format!("json={}", reports.with_extension("json").display());
    let junit_report = format!("junit={}", reports.with_extension("xml").display());
    let cache = dir.path().join("cache");
    let mut e = Engine::spawn_env(
        &[
            "--log-level=debug",
            "--config",
            &config,
            "--report",
            &json_report,
            "--report",
            &junit_report,
        ],
        Stderr::Drain,
        &[("ATTEST_CACHE_DIR", cache.to_str().unwrap()), ("SNOOP_TEST_TOKEN", "tok-Zz81xQ")],
    );
    e.initialize();
    let names = json!({"names": ["brand_key", "from_env"], "leak": "all"});
    let failing = json!({"names": ["brand_key", "from_env"], "leak": "error"});
    let resp = e.request(&evaluate_request(
        json!(1),
        answer("hello"),
        json!([plugin("leak", "secret-snoop", names), plugin("leak-error", "secret-snoop", failing)]),
    ));
    let _ = e.request(&shutdown_request(json!(2)));
    e.wait_exit();
    let mut outputs = vec![("answer", resp.to_string()), ("stderr", e.stderr_text())];
    for ext in ["json", "xml"] {
        outputs.push((ext, std::fs::read_to_string(reports.with_extension(ext)).unwrap_or_default()));
    }
    for (channel, text) in &outputs {
        for value in ["k-7Yq93pLr", "tok-Zz81xQ"] {
            assert!(!text.contains(value), "the secret {value} left through the {channel}: {text}");
        }
    }
    let r = &resp["result"]["results"];
    assert!(explanation(&r[0]).contains("[secret 'brand_key']"), "{}", r[0]);
    assert!(explanation(&r[1]).contains("[secret 'from_env']"), "{}", r[1]);
    assert!(
        outputs[1].1.contains("[secret 'brand_key']"),
        "the log names the secret: {}",
        outputs[1].1
    );
}
