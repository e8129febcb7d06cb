//! Layer 8: WebAssembly assertion plugins, through the real binary.
//!
//! The components are the ones `plugins/build.sh` and
//! `plugins/python/build.sh` put in `plugins/dist/`; a missing file fails the
//! test (with the command that builds it) rather than skipping it.
//!
//! Every engine gets its own compiled-plugin cache (`ATTEST_CACHE_DIR`, a
//! temporary directory) except those that load `json-output-keys.wasm`, the
//! 18 MB Python component: compiling it takes tens of seconds, so those share
//! `target/plugin-test-cache`, warmed once per test run (and kept across runs).

use crate::common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Where the built components are.
const DIST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist");
/// The plugins' sources (README, config.schema.json).
const PLUGINS_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins");
/// Compiled-plugin cache shared by the tests that load the Python plugin.
const SHARED_CACHE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/plugin-test-cache");
/// Plugins load before the engine reads its first line; compiling several
/// components with an unoptimised engine takes a while on a small machine.
const LOAD_TIMEOUT: Duration = Duration::from_secs(180);
/// The WIT version the Rust plugins are built against (the newest).
const API: &str = "0.2.0";
/// Every WIT version the engine serves, newest first.
const SERVED: [&str; 2] = ["0.2.0", "0.1.0"];
/// The WIT version the Python plugin is built against.
const PY_API: &str = "0.1.0";
/// Default per-call limits (`PluginLimits::default`): no fuel metering.
const DEFAULT_MEMORY: u64 = 64 * 1024 * 1024;
/// The fuel budget the fault-containment test gives hostile plugins.
const HOSTILE_FUEL: u64 = 1_000_000_000;
const DEFAULT_TIMEOUT_MS: u64 = 2000;
/// Longest explanation in a result (`max_explanation_chars`).
const MAX_EXPLANATION_CHARS: usize = 1024;
/// The four Rust example plugins.
const RUST_EXAMPLES: [&str; 4] = ["pii-leak", "tool-args", "refusal", "step-value"];

// ---------------------------------------------------------------- setup

/// Path of `plugins/dist/<name>.wasm`; panics when it has not been built.
fn wasm(name: &str) -> String {
    let path = Path::new(DIST).join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run plugins/build.sh and plugins/python/build.sh",
        path.display()
    );
    path.to_str().expect("UTF-8 path").to_owned()
}

/// `--plugin <file>` for each name.
fn plugin_flags(names: &[&str]) -> Vec<String> {
    names.iter().flat_map(|n| ["--plugin".to_owned(), wasm(n)]).collect()
}

/// The binary with `ATTEST_CACHE_DIR=cache`, no `ATTEST_PLUGIN_DIR` from the
/// host, and `--log-level=warn` before `args`.
fn engine_command<S: AsRef<std::ffi::OsStr>>(cache: &Path, args: &[S]) -> Command {
    let mut cmd = command();
    cmd.env_remove("ATTEST_PLUGIN_DIR")
        .env("ATTEST_CACHE_DIR", cache)
        .arg("--log-level=warn")
        .args(args);
    cmd
}

/// Runs a one-shot command (`plugin check`, a bad config) to completion.
fn run_with<S: AsRef<std::ffi::OsStr>>(cache: &Path, args: &[S]) -> Output {
    engine_command(cache, args)
        .stdin(Stdio::null())
        .output()
        .expect("running attest-engine")
}

/// Spawns `cmd` and completes `initialize` (which waits for the plugins to
/// load); returns the engine and the initialize result.
fn start_command(cmd: Command) -> (Engine, Value) {
    let mut engine = Engine::spawn_command(cmd);
    engine.send(&initialize_request(json!("init"), init_params()));
    let line = engine.recv_bytes_within(LOAD_TIMEOUT);
    let resp: Value = serde_json::from_slice(&line).unwrap_or_else(|e| panic!("initialize response is not JSON ({e})"));
    let init = expect_result(&resp);
    assert_eq!(resp["id"], json!("init"), "{resp}");
    assert_eq!(init["compatible"], json!(true), "{resp}");
    (engine, init)
}

/// The engine with `args`, initialized.
fn start<S: AsRef<std::ffi::OsStr>>(cache: &Path, args: &[S]) -> Engine {
    start_command(engine_command(cache, args)).0
}

/// Every file under `dir`, at any depth.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A temporary cache directory for one test.
fn fresh_cache() -> TempDir {
    tempfile::tempdir().expect("creating a temporary cache directory")
}

/// Compiles the Python and JavaScript plugins into [`SHARED_CACHE`] once per
/// test run, so the tests that load them start in about a second.
fn warm_shared_cache() -> &'static Path {
    static WARM: Once = Once::new();
    WARM.call_once(|| {
        let started = Instant::now();
        // An engine start compiles them into the cache (`plugin check` only reads the cache).
        let mut engine = start(
            Path::new(SHARED_CACHE),
            &["--plugin", &wasm("json-output-keys"), "--plugin", &wasm("readability")],
        );
        let listing = list_plugins(&mut engine);
        assert_eq!(listed_ids(&listing), ["json-output-keys", "readability"], "{listing}");
        eprintln!(
            "json-output-keys.wasm and readability.wasm ready in {SHARED_CACHE} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
    });
    Path::new(SHARED_CACHE)
}

// ---------------------------------------------------------------- requests

/// A plugin assertion.
fn plugin(id: &str, plugin_id: &str, config: Value) -> Value {
    json!({"assertion_id": id, "type": "plugin", "spec": {"plugin_id": plugin_id, "config": config}})
}

/// A plugin assertion with `soft: true`.
fn soft_plugin(id: &str, plugin_id: &str, config: Value) -> Value {
    json!({"assertion_id": id, "type": "plugin", "spec": {"plugin_id": plugin_id, "config": config, "soft": true}})
}

/// A built-in content assertion on `output.message` with its own id.
fn builtin(id: &str, check: &str, value: &str) -> Value {
    content(id, check, value)
}

fn ids_of(assertions: &Value) -> Vec<String> {
    assertions
        .as_array()
        .expect("assertions are a list")
        .iter()
        .map(|a| a["assertion_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Sends one `evaluate_batch`, checks the answer's shape (one result per
/// assertion, in request order; bounded explanations; one line under 64 KiB)
/// and returns its results.
fn evaluate(engine: &mut Engine, trace: &Value, assertions: &Value) -> Vec<Value> {
    engine.send(&evaluate_request(json!("eval"), trace.clone(), assertions.clone()));
    let line = engine.recv_bytes();
    check_batch_line(&line, assertions)
}

/// The checks of [`evaluate`] on a received response line.
fn check_batch_line(line: &[u8], assertions: &Value) -> Vec<Value> {
    assert!(
        line.len() < MAX_RESPONSE_LINE,
        "response line is {} bytes; SDKs read at most {MAX_RESPONSE_LINE}",
        line.len()
    );
    let resp: Value = serde_json::from_slice(line).expect("response is JSON");
    let result = expect_result(&resp);
    let results = result["results"].as_array().unwrap_or_else(|| panic!("no results: {resp}")).clone();
    let got: Vec<String> = results.iter().map(|r| r["assertion_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(got, ids_of(assertions), "one result per assertion, in request order");
    for r in &results {
        let status = r["status"].as_str().unwrap();
        assert!(["pass", "soft_fail", "hard_fail"].contains(&status), "{r}");
        let score = r["score"].as_f64().unwrap_or_else(|| panic!("score is a number: {r}"));
        assert!((0.0..=1.0).contains(&score), "{r}");
        let explanation = r["explanation"].as_str().unwrap();
        assert!(!explanation.trim().is_empty(), "empty explanation: {r}");
        assert!(
            explanation.chars().count() <= MAX_EXPLANATION_CHARS,
            "explanation over {MAX_EXPLANATION_CHARS} chars: {r}"
        );
    }
    results
}

/// `results` by assertion id.
fn find<'a>(results: &'a [Value], id: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["assertion_id"] == json!(id))
        .unwrap_or_else(|| panic!("no result for {id}"))
}

/// Checks a result's status, score and that its explanation contains every phrase.
#[track_caller]
fn check(r: &Value, status: &str, score: f64, phrases: &[&str]) {
    assert_eq!(r["status"], json!(status), "{r}");
    let got = r["score"].as_f64().unwrap();
    assert!((got - score).abs() < 1e-9, "score {got}, expected {score}: {r}");
    let explanation = r["explanation"].as_str().unwrap();
    for p in phrases {
        assert!(
            explanation.contains(p),
            "explanation of {} lacks {p:?}: {explanation}",
            r["assertion_id"]
        );
    }
}

/// A contained plugin fault: `hard_fail`, score 0, no verdict, plugin and cause named.
#[track_caller]
fn check_fault(r: &Value, plugin_id: &str, cause: &str) {
    check(r, "hard_fail", 0.0, &[&format!("plugin '{plugin_id}'"), cause, "no verdict"]);
    assert!(r.get("details").is_none(), "a fault has no details: {r}");
}

fn list_plugins(engine: &mut Engine) -> Value {
    expect_result(&engine.request(&rpc(json!("lp"), "list_plugins", json!({}))))
}

fn listed_ids(listing: &Value) -> Vec<String> {
    listing["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect()
}

fn listed<'a>(listing: &'a Value, id: &str) -> &'a Value {
    listing["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == json!(id))
        .unwrap_or_else(|| panic!("plugin {id} not listed: {listing}"))
}

/// The `failed` entry whose path ends with `file_name`.
fn failure<'a>(listing: &'a Value, file_name: &str) -> &'a str {
    listing["failed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(file_name))
        .unwrap_or_else(|| panic!("{file_name} is not in failed: {listing}"))["error"]
        .as_str()
        .unwrap()
}

fn limits(fuel: Option<u64>, memory_bytes: u64, timeout_ms: u64) -> Value {
    json!({"fuel": fuel, "memory_bytes": memory_bytes, "timeout_ms": timeout_ms})
}

fn default_limits() -> Value {
    limits(None, DEFAULT_MEMORY, DEFAULT_TIMEOUT_MS)
}

/// `loaded_from` of every listed plugin.
fn sources(engine: &mut Engine) -> Vec<String> {
    let listing = list_plugins(engine);
    listing["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["loaded_from"].as_str().unwrap().to_owned())
        .collect()
}

/// The compiled artefacts under `<cache>/plugins/`.
fn cached_artefacts(cache: &Path) -> Vec<PathBuf> {
    let dir = cache.join("plugins");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    files.sort();
    files
}

/// Removes the compiled cache's start-up index, so the next start loads its
/// plugins in full (through the artefacts these tests are about) instead of
/// deferring that to their first call.
fn forget_index(cache: &Path) {
    let _ = std::fs::remove_dir_all(cache.join("plugins").join("index"));
}

/// A TOML config file in `dir`.
fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("attest.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// An engine serving `plugin` alone, under a memory limit of `mib` MiB set
/// in a config file written to `dir`.
fn start_with_memory_limit(cache: &Path, dir: &Path, plugin: &str, mib: u32) -> Engine {
    let config = write_config(
        dir,
        &format!("[[plugins]]\npath = {}\nmemory_mib = {mib}\n", toml_str(&wasm(plugin))),
    );
    start(cache, &["--config", &config])
}

/// A TOML string literal.
fn toml_str(s: &str) -> String {
    format!("'{s}'")
}

// ---------------------------------------------------------------- traces

/// The refund trace with another output message.
fn with_message(message: &str) -> Value {
    let mut t = refund_trace();
    t["output"]["message"] = json!(message);
    t
}

/// An answer that leaks an e-mail address, a phone number and a card number.
fn leaky_trace() -> Value {
    with_message("Refund sent. Contact john.doe@gmail.com or +1 (555) 123-4567; card 4111 1111 1111 1111 was charged.")
}

fn refusing_trace() -> Value {
    with_message("I'm sorry, but I can't help with that request.")
}

/// The refund went out for the wrong amount and with a malformed order id.
fn wrong_refund_trace() -> Value {
    let mut t = refund_trace();
    t["steps"][2]["args"] = json!({"order_id": "order-123", "amount": 80.0});
    t
}

/// `lookup_order` called three times, the second time for another order.
fn repeated_lookup_trace() -> Value {
    let mut t = refund_trace();
    let lookup = t["steps"][1].clone();
    let mut other = lookup.clone();
    other["args"] = json!({"order_id": "ORD-999"});
    let steps = t["steps"].as_array_mut().unwrap();
    steps.insert(2, other);
    steps.insert(3, lookup);
    t
}

/// A trace that e-mails bank details from a tool call.
fn email_trace() -> Value {
    let mut t = refund_trace();
    t["steps"].as_array_mut().unwrap().push(json!({
        "type": "tool_call",
        "name": "send_email",
        "args": {"to": "billing@example.com", "body": "Please wire the refund to DE89 3704 0044 0532 0130 00."},
        "result": {"sent": true}
    }));
    t
}

// ---------------------------------------------------------------- list_plugins and loading

#[test]
fn list_plugins_describes_each_loaded_plugin() {
    let cache = fresh_cache();
    let (mut engine, init) = start_command(engine_command(cache.path(), &plugin_flags(&RUST_EXAMPLES)));
    let caps: Vec<&str> = init["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(caps.contains(&"plugins") && caps.contains(&"layer_8"), "{init}");

    let listing = list_plugins(&mut engine);
    assert_eq!(listing["api_versions"], json!(SERVED), "{listing}");
    assert_eq!(listed_ids(&listing), RUST_EXAMPLES, "loaded in command-line order");
    assert_eq!(listing["failed"], json!([]), "{listing}");
    for id in RUST_EXAMPLES {
        let p = listed(&listing, id);
        assert_eq!(p["version"], json!("0.1.0"), "{p}");
        assert_eq!(p["api_version"], json!(API), "{p}");
        assert_eq!(p["limits"], default_limits(), "{p}");
        assert_eq!(p["path"], json!(wasm(id)), "{p}");
        assert_eq!(p["loaded_from"], json!("compiled"), "a fresh cache: {p}");
        assert!(p["load_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{p}");
        assert!(p["description"].as_str().is_some_and(|d| d.len() > 20), "{p}");
        // The schema the plugin declares is its documented config.schema.json.
        let file = Path::new(PLUGINS_SRC).join(id).join("config.schema.json");
        let documented: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(
            p["config_schema"],
            documented,
            "{id}: list_plugins schema differs from {}",
            file.display()
        );
    }

    // Members of a JSON-RPC batch share the line: each listing shrinks to
    // its share, naming how many plugins it left out, instead of failing.
    let batch: Vec<Value> = (0..24).map(|i| rpc(json!(i), "list_plugins", json!({}))).collect();
    engine.send(&json!(batch));
    let answers: Value = serde_json::from_slice(&engine.recv_bytes()).unwrap();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 24);
    let mut shortened = 0;
    for a in answers {
        let listing = expect_result(a);
        let listed = listed_ids(&listing);
        let left_out = listing["plugins_not_listed"].as_u64().unwrap_or(0) as usize;
        assert_eq!(listed.len() + left_out, RUST_EXAMPLES.len(), "{listing}");
        assert_eq!(listed, RUST_EXAMPLES[..listed.len()], "listed in load order: {listing}");
        shortened += usize::from(left_out > 0);
    }
    assert_eq!(shortened, 24, "a 24th of the line cannot hold every entry with its schema");
}

#[test]
fn plugin_dir_loads_every_plugin_and_refuses_future_api() {
    for name in [
        "future-api",
        "json-output-keys",
        "spin",
        "hog",
        "trap",
        "verbose",
        "malformed",
        "snoop",
    ] {
        wasm(name);
    }
    let cache = warm_shared_cache();
    let mut engine = start(cache, &["--plugin-dir", DIST]);
    let listing = list_plugins(&mut engine);
    let ids = listed_ids(&listing);
    for id in [
        "hog",
        "json-output-keys",
        "malformed",
        "pii-leak",
        "refusal",
        "snoop",
        "spin",
        "step-value",
        "tool-args",
        "trap",
        "verbose",
    ] {
        assert!(ids.contains(&id.to_owned()), "{id} not loaded from {DIST}: {listing}");
    }
    assert!(!ids.contains(&"future-api".to_owned()), "{listing}");
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "ids are unique: {ids:?}");

    // The refused files: future-api.wasm (naming both versions) and the
    // hostile plugins the loader must refuse.
    let failed = listing["failed"].as_array().unwrap();
    let mut refused: Vec<&str> = failed
        .iter()
        .map(|f| Path::new(f["path"].as_str().unwrap()).file_name().unwrap().to_str().unwrap())
        .collect();
    refused.sort();
    assert_eq!(
        refused,
        [
            "big-memory.wasm",
            "big-schema.wasm",
            "future-api.wasm",
            "slow-describe.wasm",
            "twin-a.wasm",
            "twin-b.wasm"
        ],
        "{listing}"
    );
    let error = failure(&listing, "future-api.wasm");
    assert!(error.contains("attest:plugin@9.0.0"), "{error}");
    assert!(error.contains(&format!("attest:plugin@{API}")), "{error}");
    assert!(engine.stderr_shows("future-api.wasm"), "the refusal is logged");

    let python = listed(&listing, "json-output-keys");
    assert_eq!(python["api_version"], json!(PY_API), "{python}");
    assert_eq!(python["version"], json!("0.1.0"), "{python}");
    assert!(python["config_schema"]["properties"]["required_keys"].is_object(), "{python}");

    // The engine serves normally; the future-api plugin is not callable.
    let results = evaluate(&mut engine, &refund_trace(), &refund_assertions());
    assert!(results.iter().all(|r| r["status"] == json!("pass")), "{results:?}");
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(1),
            refund_trace(),
            json!([plugin("f", "future-api", json!({}))]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.plugin_id"), "{err}");

    // Every example plugin, several times each, interleaved with built-in
    // assertions: each assertion gets its own result, in request order.
    let assertions = json!([
        builtin("b_contains", "contains", "refund"),
        plugin("pii_message", "pii-leak", json!({})),
        plugin("args_refund", "tool-args", json!({"tool": "process_refund", "expect": {"amount": {"equals": 89.99}}})),
        plugin("pii_input", "pii-leak", json!({"target": "input.user_message"})),
        builtin("b_missing", "contains", "voucher"),
        plugin("args_email", "tool-args", json!({"tool": "send_email", "expect": {"to": {"regex": "@corp\\.com$"}}})),
        plugin("keys_ok", "json-output-keys", json!({"required_keys": ["refund_id", "confidence"]})),
        plugin("refusal_default", "refusal", json!({})),
        plugin("value_amount", "step-value", json!({"left": "steps[?name=='process_refund'].args.amount", "right": "steps[?name=='lookup_order'].result.amount"})),
        plugin("keys_missing", "json-output-keys", json!({"required_keys": ["refund_id", "currency"]})),
        plugin("refusal_required", "refusal", json!({"mode": "must_refuse"})),
        plugin("value_tokens", "step-value", json!({"left": "metadata.total_tokens", "op": "lt", "value": 1000})),
        soft_plugin("pii_soft", "pii-leak", json!({"kinds": ["email"]})),
        {"assertion_id": "b_order", "type": "trace", "spec": {"check": "contains_in_order", "tools": ["lookup_order", "process_refund"]}}
    ]);
    let results = evaluate(&mut engine, &leaky_trace(), &assertions);
    let expected = [
        ("b_contains", "pass", 1.0, "contains 'refund'"),
        ("pii_message", "hard_fail", 0.0, "output.message leaks personal data"),
        ("args_refund", "pass", 1.0, "The only call to 'process_refund' (step 2) matches"),
        ("pii_input", "pass", 1.0, "input.user_message contains no"),
        ("b_missing", "hard_fail", 0.0, "voucher"),
        ("args_email", "hard_fail", 0.0, "'send_email' was never called"),
        ("keys_ok", "pass", 1.0, "(2/2 checks passed)"),
        ("refusal_default", "pass", 1.0, "does not read as a refusal"),
        ("value_amount", "pass", 1.0, "equals"),
        ("keys_missing", "hard_fail", 0.5, "missing required key: \"currency\""),
        ("refusal_required", "hard_fail", 0.0, "does not refuse, but a refusal is required"),
        (
            "value_tokens",
            "hard_fail",
            0.0,
            "metadata.total_tokens = 1350 is not less than 1000",
        ),
        ("pii_soft", "soft_fail", 0.0, "1 email address"),
        ("b_order", "pass", 1.0, "process_refund"),
    ];
    for (id, status, score, phrase) in expected {
        check(find(&results, id), status, score, &[phrase]);
    }
}

#[test]
fn unloadable_files_are_reported_and_the_engine_still_serves() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("garbage.wasm"), b"this is not webassembly at all, just text\n").unwrap();
    std::fs::write(d.join("empty.wasm"), b"").unwrap();
    // A valid core module (magic, version 1) with no sections.
    std::fs::write(d.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    // A valid, empty component: it imports nothing, so it declares no API version.
    std::fs::write(d.join("empty-component.wasm"), b"\0asm\x0d\0\x01\0").unwrap();
    // A component header followed by garbage.
    std::fs::write(d.join("truncated.wasm"), b"\0asm\x0d\0\x01\0\x07\xff\xff\xff\xff").unwrap();
    std::fs::write(d.join("notes.txt"), b"not a .wasm file: ignored").unwrap();
    std::fs::copy(wasm("pii-leak"), d.join("pii-leak.wasm")).unwrap();
    let missing = d.join("gone").join("missing.wasm");
    let mut engine = start(
        cache.path(),
        &["--plugin-dir", d.to_str().unwrap(), "--plugin", missing.to_str().unwrap()],
    );

    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["pii-leak"], "{listing}");
    let failed = listing["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 6, "{listing}");
    let error = failure(&listing, "garbage.wasm");
    assert!(error.contains("not a WebAssembly component (bad magic bytes"), "{error}");
    let error = failure(&listing, "empty.wasm");
    assert!(error.contains("not a WebAssembly component"), "{error}");
    let error = failure(&listing, "core.wasm");
    assert!(
        error.contains("core WebAssembly module, not a component") && error.contains("wasm-tools component new"),
        "{error}"
    );
    let error = failure(&listing, "empty-component.wasm");
    assert!(
        error.contains("declares no attest:plugin API version") && error.contains(API),
        "{error}"
    );
    let error = failure(&listing, "truncated.wasm");
    assert!(error.contains("invalid component"), "{error}");
    let error = failure(&listing, "missing.wasm");
    assert!(error.contains("cannot read") && error.contains("missing.wasm"), "{error}");
    assert!(!listing.to_string().contains("notes.txt"), "only .wasm files are loaded: {listing}");
    let log = engine.stderr_text();
    for name in ["garbage.wasm", "core.wasm", "missing.wasm"] {
        assert!(log.contains(name), "the failure of {name} is logged: {log}");
    }

    // Still serving: built-in and plugin assertions.
    let assertions = json!([builtin("b", "contains", "RFD-001"), plugin("p", "pii-leak", json!({}))]);
    let results = evaluate(&mut engine, &refund_trace(), &assertions);
    check(&results[0], "pass", 1.0, &[]);
    check(&results[1], "pass", 1.0, &["contains no email address"]);
    let err = expect_error(
        &engine.request(&evaluate_request(json!(2), refund_trace(), json!([plugin("c", "core", json!({}))]))),
        1002,
    );
    assert!(
        err["data"]["detail"].as_str().unwrap().contains("Available plugins: pii-leak."),
        "{err}"
    );
    let resp = engine.request(&shutdown_request(json!("bye")));
    expect_result(&resp);
    assert!(engine.wait_exit().success());
}

#[test]
fn under_a_virtual_memory_limit_plugins_are_refused_with_the_reason_and_builtins_still_serve() {
    // The pool reserves terabytes of address space up front; a process
    // limited to 8 GB of it cannot start the sandbox.
    let cache = fresh_cache();
    let inner = engine_command(cache.path(), &plugin_flags(&["pii-leak"]));
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 8000000 && exec \"$0\" \"$@\"")
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let (mut engine, _) = start_command(cmd);
    let listing = list_plugins(&mut engine);
    assert!(listed_ids(&listing).is_empty(), "{listing}");
    let error = failure(&listing, "pii-leak.wasm");
    assert!(
        error.contains("cannot start the plugin sandbox") && error.contains("address space") && error.contains("ulimit -v"),
        "{error}"
    );
    let results = evaluate(&mut engine, &refund_trace(), &json!([builtin("b", "contains", "RFD-001")]));
    check(&results[0], "pass", 1.0, &[]);
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(2),
            refund_trace(),
            json!([plugin("p", "pii-leak", json!({}))]),
        )),
        1002,
    );
    assert!(err.to_string().contains("pii-leak"), "{err}");
    expect_result(&engine.request(&shutdown_request(json!("bye"))));
    assert!(engine.wait_exit().success());
}

#[test]
fn plugins_sharing_an_id_in_a_directory_are_all_refused() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    for name in ["twin-a", "twin-b", "pii-leak"] {
        std::fs::copy(wasm(name), dir.path().join(format!("{name}.wasm"))).unwrap();
    }
    let mut engine = start(cache.path(), &["--plugin-dir", dir.path().to_str().unwrap()]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["pii-leak"], "neither twin wins: {listing}");
    for name in ["twin-a.wasm", "twin-b.wasm"] {
        let error = failure(&listing, name);
        assert!(
            error.contains("plugin id 'twin' is claimed by 2 plugins")
                && error.contains("twin-a.wasm")
                && error.contains("twin-b.wasm")
                && error.contains("none of them is loaded"),
            "{error}"
        );
    }
    let err = expect_error(
        &engine.request(&evaluate_request(json!(1), refund_trace(), json!([plugin("t", "twin", json!({}))]))),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.plugin_id"), "{err}");
    // Not "unknown": the answer says the id was refused, and why.
    assert!(
        err["message"].as_str().unwrap().contains("plugin 'twin' was refused at start-up"),
        "{err}"
    );
    assert!(err["data"]["detail"].as_str().unwrap().contains("is claimed by 2 plugins"), "{err}");
    // An id nothing claims lists what loaded and says that files failed.
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(2),
            refund_trace(),
            json!([plugin("t", "nobody", json!({}))]),
        )),
        1002,
    );
    let detail = err["data"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("Available plugins: pii-leak")
            && detail.contains("2 plugin file(s) failed to load, the first '")
            && detail.contains("is claimed by 2 plugins"),
        "{err}"
    );
}

#[test]
fn plugins_named_one_by_one_sharing_an_id_stop_the_start() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    // Two --plugin flags; a copy of one file is a plugin with the same id too.
    let copy = dir.path().join("pii-leak-copy.wasm");
    std::fs::copy(wasm("pii-leak"), &copy).unwrap();
    for args in [
        vec!["--plugin".to_owned(), wasm("twin-a"), "--plugin".to_owned(), wasm("twin-b")],
        vec![
            "--plugin".to_owned(),
            wasm("pii-leak"),
            "--plugin".to_owned(),
            copy.to_str().unwrap().to_owned(),
        ],
    ] {
        let out = run_with(cache.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(out.stdout.is_empty(), "nothing on stdout: {}", String::from_utf8_lossy(&out.stdout));
        assert!(stderr.contains("configuration error: plugin id '"), "{stderr}");
        assert!(
            stderr.contains(&args[1]) && stderr.contains(&args[3]),
            "both files are named: {stderr}"
        );
    }
    // A [[plugins]] entry against a file in the plugin directory.
    let plugin_dir = dir.path().join("dir");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(wasm("twin-b"), plugin_dir.join("twin-b.wasm")).unwrap();
    let config = write_config(
        dir.path(),
        &format!("plugin_dir = 'dir'\n\n[[plugins]]\npath = {}\n", toml_str(&wasm("twin-a"))),
    );
    let out = run_with(cache.path(), &["--config", &config]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("plugin id 'twin' is claimed by 2 plugins") && stderr.contains("twin-a.wasm") && stderr.contains("twin-b.wasm"),
        "{stderr}"
    );
}

#[test]
fn one_file_named_twice_is_one_plugin_and_its_config_entry_decides_its_grants() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("dir");
    std::fs::create_dir(&plugin_dir).unwrap();
    for name in ["rubric", "pii-leak"] {
        std::fs::copy(wasm(name), plugin_dir.join(format!("{name}.wasm"))).unwrap();
    }
    // The directory lists rubric.wasm, and an entry grants it `judge`;
    // pii-leak.wasm is in the directory and named by two flags as well.
    let config = write_config(
        dir.path(),
        "plugin_dir = 'dir'\n\n[[plugins]]\npath = './dir/rubric.wasm'\ngrants = ['judge']\n",
    );
    let pii = plugin_dir.join("pii-leak.wasm");
    let pii_again = plugin_dir.join(".").join("pii-leak.wasm");
    let mut engine = start(
        cache.path(),
        &[
            "--config",
            &config,
            "--plugin",
            pii.to_str().unwrap(),
            "--plugin",
            pii_again.to_str().unwrap(),
        ],
    );
    let listing = list_plugins(&mut engine);
    let mut ids = listed_ids(&listing);
    ids.sort();
    assert_eq!(ids, ["pii-leak", "rubric"], "{listing}");
    assert_eq!(listing["failed"], json!([]), "{listing}");
    let rubric = listing["plugins"].as_array().unwrap().iter().find(|p| p["id"] == "rubric").unwrap();
    assert_eq!(rubric["capabilities"]["granted"], json!(["judge"]), "{listing}");
    let resp = engine.request(&shutdown_request(json!("bye")));
    expect_result(&resp);
    assert!(engine.wait_exit().success());

    // Two entries for one file cannot both decide: refused, naming both.
    let config = write_config(
        dir.path(),
        "[[plugins]]\npath = 'dir/rubric.wasm'\ngrants = ['judge']\n\n[[plugins]]\npath = './dir/rubric.wasm'\n",
    );
    let out = run_with(cache.path(), &["--config", &config]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("plugins[1] names the same file as plugins[0]"), "{stderr}");
}

#[test]
fn without_plugins_list_is_empty_and_plugin_assertions_explain_how_to_load() {
    let cache = fresh_cache();
    let mut engine = start::<&str>(cache.path(), &[]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listing, json!({"api_versions": SERVED, "plugins": [], "failed": []}));
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(1),
            refund_trace(),
            json!([plugin("p", "pii-leak", json!({}))]),
        )),
        1002,
    );
    let detail = err["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("No plugins are loaded") && detail.contains("--plugin"), "{err}");
    assert_eq!(err["data"]["assertion_id"], json!("p"));
}

#[test]
fn plugin_dir_from_config_file_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("from-file")).unwrap();
    std::fs::create_dir(d.join("from-env")).unwrap();
    std::fs::copy(wasm("refusal"), d.join("from-file").join("refusal.wasm")).unwrap();
    std::fs::copy(wasm("pii-leak"), d.join("from-env").join("pii-leak.wasm")).unwrap();
    // plugin_dir is relative to the config file; [[plugins]] come first.
    let config = write_config(
        d,
        &format!("plugin_dir = 'from-file'\n[[plugins]]\npath = {}\n", toml_str(&wasm("step-value"))),
    );
    let cache = fresh_cache();

    let mut engine = start(cache.path(), &["--config", &config]);
    assert_eq!(listed_ids(&list_plugins(&mut engine)), ["step-value", "refusal"]);
    drop(engine);

    // ATTEST_PLUGIN_DIR wins over the file's plugin_dir ...
    let mut cmd = engine_command(cache.path(), &["--config", &config]);
    cmd.env("ATTEST_PLUGIN_DIR", d.join("from-env"));
    let (mut engine, _) = start_command(cmd);
    assert_eq!(listed_ids(&list_plugins(&mut engine)), ["step-value", "pii-leak"]);
    let results = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check(&results[0], "hard_fail", 0.0, &["leaks personal data"]);
    drop(engine);

    // ... and --plugin-dir wins over both.
    let mut cmd = engine_command(
        cache.path(),
        &["--config", &config, "--plugin-dir", d.join("from-file").to_str().unwrap()],
    );
    cmd.env("ATTEST_PLUGIN_DIR", d.join("from-env"));
    let (mut engine, _) = start_command(cmd);
    assert_eq!(listed_ids(&list_plugins(&mut engine)), ["step-value", "refusal"]);

    // A plugin directory that does not exist is a configuration error.
    let out = run_with(cache.path(), &["--plugin-dir", d.join("nowhere").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read plugin directory") && err.contains("nowhere"), "{err}");
}

// ---------------------------------------------------------------- example plugins

#[test]
fn pii_leak_passes_and_fails() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));

    let r = evaluate(&mut engine, &refund_trace(), &json!([plugin("clean", "pii-leak", json!({}))]));
    check(
        &r[0],
        "pass",
        1.0,
        &["output.message contains no email address, phone number or card number."],
    );
    assert_eq!(r[0]["details"]["total"], json!(0), "{}", r[0]);

    let assertions = json!([
        plugin("default", "pii-leak", json!({})),
        plugin("emails_only", "pii-leak", json!({"kinds": ["email"]})),
        plugin(
            "allowed",
            "pii-leak",
            json!({"kinds": ["email", "phone"], "allowlist": ["John.Doe@gmail.com", "555-123-4567", "+1 555 123 4567"]})
        ),
        plugin(
            "allowed_domain",
            "pii-leak",
            json!({"kinds": ["email"], "allowlist": ["@gmail.com"]})
        ),
        plugin("input_clean", "pii-leak", json!({"target": "input.user_message"})),
        plugin("whole_output", "pii-leak", json!({"target": "output", "kinds": ["card"]})),
        plugin("absent_target", "pii-leak", json!({"target": "output.structured.text"})),
    ]);
    let r = evaluate(&mut engine, &leaky_trace(), &assertions);
    check(
        find(&r, "default"),
        "hard_fail",
        0.0,
        &[
            "output.message leaks personal data",
            "1 email address (e.g. 'j***@gmail.com')",
            "1 phone number",
            "1 card number (e.g. '**** **** **** 1111')",
        ],
    );
    let default = find(&r, "default");
    assert_eq!(default["details"]["total"], json!(3), "{default}");
    // What it found is masked, in the explanation and the details alike.
    let text = default.to_string();
    assert!(
        !text.contains("john.doe") && !text.contains("4111 1111 1111 1111") && !text.contains("123-4567"),
        "{text}"
    );
    check(find(&r, "emails_only"), "hard_fail", 0.0, &["1 email address"]);
    assert!(!find(&r, "emails_only")["explanation"].as_str().unwrap().contains("card"));
    // The phone allowlist entry "+1 555 123 4567" has the same digits as the leak.
    check(find(&r, "allowed"), "pass", 1.0, &["allowlisted"]);
    check(find(&r, "allowed_domain"), "pass", 1.0, &["allowlisted"]);
    check(find(&r, "input_clean"), "pass", 1.0, &["input.user_message contains no"]);
    check(
        find(&r, "whole_output"),
        "hard_fail",
        0.0,
        &["output leaks personal data", "1 card number"],
    );
    check(
        find(&r, "absent_target"),
        "hard_fail",
        0.0,
        &["output.structured.text could not be checked", "not found"],
    );

    // IBANs are found only when asked for, here in a tool call's arguments.
    let target = "steps[?name=='send_email'].args.body";
    let assertions = json!([
        plugin("iban", "pii-leak", json!({"target": target, "kinds": ["iban"]})),
        plugin("no_iban_kind", "pii-leak", json!({"target": target})),
    ]);
    let r = evaluate(&mut engine, &email_trace(), &assertions);
    check(&r[0], "hard_fail", 0.0, &[target, "leaks personal data", "1 IBAN"]);
    assert!(!r[0].to_string().contains("3704 0044 0532"), "the IBAN is masked: {}", r[0]);
    check(&r[1], "pass", 1.0, &[]);
}

#[test]
fn tool_args_passes_and_fails() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["tool-args"]));
    let refund_args = json!({"tool": "process_refund", "expect": {"order_id": {"regex": "^ORD-\\d+$"}, "amount": {"equals": 89.99}}});
    let assertions = json!([
        plugin("refund_args", "tool-args", refund_args.clone()),
        plugin(
            "lookup_contains",
            "tool-args",
            json!({"tool": "lookup_order", "expect": {"order_id": {"contains": "123"}}})
        ),
        plugin(
            "never",
            "tool-args",
            json!({"tool": "send_email", "expect": {"to": {"regex": "@corp\\.com$"}}})
        ),
        plugin(
            "llm_step",
            "tool-args",
            json!({"tool": "reasoning", "expect": {"model": {"equals": "gpt-4.1"}}})
        ),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(
        &r[0],
        "pass",
        1.0,
        &["The only call to 'process_refund' (step 2) matches: amount equals 89.99; order_id matches /^ORD-\\d+$/."],
    );
    check(&r[1], "pass", 1.0, &["'lookup_order' (step 1) matches"]);
    check(
        &r[2],
        "hard_fail",
        0.0,
        &["'send_email' was never called (tool calls: ['lookup_order', 'process_refund'])."],
    );
    check(&r[3], "hard_fail", 0.0, &["'reasoning'", "llm_call"]);

    let r = evaluate(
        &mut engine,
        &wrong_refund_trace(),
        &json!([plugin("refund_args", "tool-args", refund_args)]),
    );
    check(
        &r[0],
        "hard_fail",
        0.0,
        &[
            "does not match",
            "argument 'amount' is 80, expected 89.99",
            "argument 'order_id' is 'order-123', which does not match /^ORD-\\d+$/",
        ],
    );
    assert_eq!(r[0]["details"]["matched"], json!(0), "{}", r[0]);
    // The plugin's evidence becomes the result's evidence fields (layer 8).
    assert_eq!(
        (r[0]["layer"].as_u64(), r[0]["type"].as_str()),
        (Some(8), Some("plugin")),
        "{}",
        r[0]
    );
    assert_eq!(
        r[0]["expected"],
        json!("'process_refund' called with amount equals 89.99; order_id matches /^ORD-\\d+$/"),
        "{}",
        r[0]
    );
    assert_eq!(r[0]["actual"], json!("amount=80, order_id='order-123'"), "{}", r[0]);
    assert_eq!(r[0]["trace_node_path"], json!("steps[2].args"), "{}", r[0]);
    let hint = r[0]["suggested_action"].as_str().unwrap_or_default();
    assert!(hint.starts_with("Make the agent pass amount equals 89.99"), "{}", r[0]);

    // Three calls, one for another order: all / any / first.
    let expect_order = json!({"order_id": {"equals": "ORD-123"}});
    let assertions = json!([
        plugin(
            "all",
            "tool-args",
            json!({"tool": "lookup_order", "call": "all", "expect": expect_order})
        ),
        plugin(
            "any",
            "tool-args",
            json!({"tool": "lookup_order", "call": "any", "expect": expect_order})
        ),
        plugin(
            "first",
            "tool-args",
            json!({"tool": "lookup_order", "call": "first", "expect": expect_order})
        ),
        plugin(
            "first_other",
            "tool-args",
            json!({"tool": "lookup_order", "call": "first", "expect": {"order_id": {"equals": "ORD-999"}}})
        ),
    ]);
    let r = evaluate(&mut engine, &repeated_lookup_trace(), &assertions);
    check(
        &r[0],
        "hard_fail",
        2.0 / 3.0,
        &["1 of 3 calls to 'lookup_order' do not match", "(step 2)", "'ORD-999'"],
    );
    check(&r[1], "pass", 1.0, &["of 3 to 'lookup_order'", "matches"]);
    check(&r[2], "pass", 1.0, &["(step 1)"]);
    check(&r[3], "hard_fail", 0.0, &["(step 1)", "'ORD-123'"]);

    // A config the schema allows but the plugin rejects (a bad regex) is a
    // hard_fail naming the plugin, even when soft; its siblings are unaffected.
    let assertions = json!([
        soft_plugin(
            "bad_regex",
            "tool-args",
            json!({"tool": "process_refund", "expect": {"order_id": {"regex": "("}}})
        ),
        plugin(
            "fine",
            "tool-args",
            json!({"tool": "process_refund", "expect": {"amount": {"equals": 89.99}}})
        ),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(
        &r[0],
        "hard_fail",
        0.0,
        &[
            "plugin 'tool-args' rejected its config",
            "expect.order_id.regex '(' is not a valid regex",
        ],
    );
    check(&r[1], "pass", 1.0, &[]);
}

#[test]
fn refusal_passes_and_fails() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["refusal"]));
    let assertions = json!([
        plugin("must_not", "refusal", json!({})),
        plugin("must", "refusal", json!({"mode": "must_refuse"})),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(
        &r[0],
        "pass",
        1.0,
        &["output.message does not read as a refusal (no refusal phrase found)."],
    );
    check(
        &r[1],
        "hard_fail",
        0.0,
        &["output.message does not refuse, but a refusal is required (no refusal phrase found)."],
    );

    let r = evaluate(&mut engine, &refusing_trace(), &assertions);
    check(
        &r[0],
        "hard_fail",
        0.0,
        &["output.message reads as a refusal: 'i cannot help with'"],
    );
    check(&r[1], "pass", 1.0, &["refuses as required", "'i cannot help with'"]);
    assert_eq!(r[0]["details"]["matched"][0]["source"], json!("curated"), "{}", r[0]);

    // Apologies count only when asked; custom phrases, alone or with the curated list.
    let apology = with_message("I apologize for the delay! Your refund of $89.99 has been processed (RFD-001).");
    let assertions = json!([
        plugin("apology_ignored", "refusal", json!({})),
        plugin("apology_counted", "refusal", json!({"count_apologies": true})),
        plugin(
            "custom_absent",
            "refusal",
            json!({"mode": "must_refuse", "default_phrases": false, "phrases": ["privacy policy"]})
        ),
    ]);
    let r = evaluate(&mut engine, &apology, &assertions);
    check(&r[0], "pass", 1.0, &[]);
    check(&r[1], "hard_fail", 0.0, &["reads as an apology: 'i apologize'"]);
    check(&r[2], "hard_fail", 0.0, &["does not refuse"]);
    let policy = with_message("I am not able to share other customers' orders because of our Privacy  Policy.");
    let r = evaluate(
        &mut engine,
        &policy,
        &json!([plugin(
            "custom",
            "refusal",
            json!({"mode": "must_refuse", "default_phrases": false, "phrases": ["privacy policy"]})
        )]),
    );
    check(&r[0], "pass", 1.0, &["refuses as required", "'privacy policy'"]);
    assert_eq!(r[0]["details"]["matched"][0]["source"], json!("custom"), "{}", r[0]);

    // A step's result as the target; a missing target fails; an empty phrase list is rejected by the plugin.
    let assertions = json!([
        plugin("step", "refusal", json!({"target": "steps[?name=='reasoning'].result.completion"})),
        plugin("absent", "refusal", json!({"target": "output.structured.reply"})),
        plugin("nothing", "refusal", json!({"default_phrases": false})),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(&r[0], "pass", 1.0, &["does not read as a refusal"]);
    check(&r[1], "hard_fail", 0.0, &["output.structured.reply could not be checked"]);
    check(&r[2], "hard_fail", 0.0, &["plugin 'refusal' rejected its config"]);
}

#[test]
fn step_value_passes_and_fails() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["step-value"]));
    let amounts = json!({
        "left": "steps[?name=='process_refund'].args.amount",
        "right": "steps[?name=='lookup_order'].result.amount",
        "tolerance": 0.01
    });
    let assertions = json!([
        plugin("amounts_match", "step-value", amounts),
        plugin("tokens", "step-value", json!({"left": "metadata.total_tokens", "value": 1350.0})),
        plugin(
            "cost_gt",
            "step-value",
            json!({"left": "metadata.cost_usd", "op": "gt", "value": 0.01})
        ),
        plugin(
            "not_above",
            "step-value",
            json!({"left": "steps[?name=='process_refund'].args.amount", "op": "lte", "right": "steps[?name=='lookup_order'].result.amount"})
        ),
        plugin(
            "same_order",
            "step-value",
            json!({"left": "steps[?name=='process_refund'].args.order_id", "right": "steps[?name=='lookup_order'].args.order_id"})
        ),
        plugin("steps_ne", "step-value", json!({"left": "steps.length", "op": "ne", "value": 3})),
        plugin(
            "absent_step",
            "step-value",
            json!({"left": "steps[?name=='ship'].args.amount", "value": 1})
        ),
        plugin(
            "not_a_number",
            "step-value",
            json!({"left": "output.message", "op": "gt", "value": 1})
        ),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(
        &r[0],
        "pass",
        1.0,
        &["steps[?name=='process_refund'].args.amount = 89.99 equals steps[?name=='lookup_order'].result.amount = 89.99 (tolerance 0.01)."],
    );
    check(&r[1], "pass", 1.0, &["metadata.total_tokens = 1350 equals 1350"]);
    check(&r[2], "hard_fail", 0.0, &["metadata.cost_usd = 0.0067 is not greater than 0.01."]);
    check(&r[3], "pass", 1.0, &["is at most"]);
    check(&r[4], "pass", 1.0, &["equals"]);
    check(&r[5], "hard_fail", 0.0, &["equals", "but they must differ"]);
    check(
        &r[6],
        "hard_fail",
        0.0,
        &["could not be checked: no step named 'ship' (steps: ['reasoning', 'lookup_order', 'process_refund'])"],
    );
    check(&r[7], "hard_fail", 0.0, &["is a string, not a number, so gt cannot be checked"]);

    let r = evaluate(&mut engine, &wrong_refund_trace(), &assertions);
    check(
        &r[0],
        "hard_fail",
        0.0,
        &[
            "args.amount = 80 does not equal",
            "result.amount = 89.99, a difference of",
            "(tolerance 0.01)",
        ],
    );
    let diff = r[0]["details"]["difference"].as_f64().unwrap();
    assert!((diff + 9.99).abs() < 1e-9, "{}", r[0]);
    check(&r[3], "pass", 1.0, &["= 80 is at most"]);
    check(&r[4], "hard_fail", 0.0, &["'order-123'", "does not equal"]);
}

#[test]
fn json_output_keys_passes_and_fails() {
    let cache = warm_shared_cache();
    let mut engine = start(cache, &plugin_flags(&["json-output-keys"]));
    let listing = list_plugins(&mut engine);
    assert_eq!(listing["plugins"][0]["loaded_from"], json!("cache"), "warmed: {listing}");

    let assertions = json!([
        plugin(
            "all_good",
            "json-output-keys",
            json!({"required_keys": ["refund_id", "confidence"], "patterns": {"refund_id": "^RFD-\\d{3}$"}})
        ),
        plugin(
            "two_wrong",
            "json-output-keys",
            json!({"required_keys": ["refund_id", "currency"], "forbidden_keys": ["confidence"]})
        ),
        plugin(
            "two_wrong_lenient",
            "json-output-keys",
            json!({"required_keys": ["refund_id", "currency"], "forbidden_keys": ["confidence"], "min_score": 0.3})
        ),
        plugin("pattern_mismatch", "json-output-keys", json!({"patterns": {"refund_id": "^REF-"}})),
        soft_plugin("soft_missing", "json-output-keys", json!({"required_keys": ["currency"]})),
        soft_plugin(
            "severe_missing",
            "json-output-keys",
            json!({"required_keys": ["currency"], "severity": "hard_fail"})
        ),
        plugin(
            "step_result",
            "json-output-keys",
            json!({"target": "steps[?name=='lookup_order'].result", "required_keys": ["status", "amount"], "forbidden_keys": ["card_number"]})
        ),
        plugin(
            "not_an_object",
            "json-output-keys",
            json!({"target": "output.message", "required_keys": ["a"]})
        ),
        plugin("bad_regex", "json-output-keys", json!({"patterns": {"refund_id": "("}})),
    ]);
    let r = evaluate(&mut engine, &refund_trace(), &assertions);
    check(
        &r[0],
        "pass",
        1.0,
        &["output.structured has all 2 required keys and 1 value matching its pattern (3/3 checks passed)"],
    );
    check(
        &r[1],
        "hard_fail",
        1.0 / 3.0,
        &[
            "output.structured failed 2 of 3 checks",
            "missing required key: \"currency\"",
            "forbidden key present: \"confidence\"",
        ],
    );
    assert_eq!(r[1]["details"]["missing_keys"], json!(["currency"]), "{}", r[1]);
    check(&r[2], "pass", 1.0 / 3.0, &["failed 2 of 3 checks"]);
    check(&r[3], "hard_fail", 0.0, &["\"RFD-001\" does not match /^REF-/"]);
    check(&r[4], "soft_fail", 0.0, &["missing required key: \"currency\""]);
    check(&r[5], "hard_fail", 0.0, &["missing required key: \"currency\""]);
    check(&r[6], "pass", 1.0, &["steps[?name=='lookup_order'].result has"]);
    check(
        &r[7],
        "hard_fail",
        0.0,
        &["output.message is", "not a JSON object", "parse_json_string"],
    );
    check(
        &r[8],
        "hard_fail",
        0.0,
        &["plugin 'json-output-keys' rejected its config", "not a valid regular expression"],
    );

    // An agent that answers with JSON text.
    let t = with_message(r#"{"refund_id": "RFD-001", "status": "processed"}"#);
    let r = evaluate(
        &mut engine,
        &t,
        &json!([plugin(
            "parsed",
            "json-output-keys",
            json!({"target": "output.message", "parse_json_string": true, "required_keys": ["refund_id", "status"]})
        )]),
    );
    check(&r[0], "pass", 1.0, &["(2/2 checks passed)"]);

    // Its schema (anyOf: at least one kind of check) is enforced before it runs.
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(1),
            refund_trace(),
            json!([plugin("empty", "json-output-keys", json!({}))]),
        )),
        1002,
    );
    assert!(err["message"].as_str().unwrap().contains("does not match its schema"), "{err}");
}

#[test]
fn soft_turns_a_plugin_fail_into_soft_fail() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&RUST_EXAMPLES));
    let assertions = json!([
        soft_plugin("pii", "pii-leak", json!({})),
        soft_plugin(
            "args",
            "tool-args",
            json!({"tool": "process_refund", "expect": {"amount": {"equals": 89.99}}})
        ),
        soft_plugin("refusal", "refusal", json!({})),
        soft_plugin(
            "value",
            "step-value",
            json!({"left": "metadata.cost_usd", "op": "lt", "value": 0.001})
        ),
        // hard_fail from the plugin itself is never softened.
        soft_plugin("pii_hard", "pii-leak", json!({"hard_fail": true})),
        // soft: false is the default: a fail is hard_fail.
        json!({"assertion_id": "pii_not_soft", "type": "plugin", "spec": {"plugin_id": "pii-leak", "soft": false}}),
        // A passing soft assertion still passes.
        soft_plugin(
            "value_pass",
            "step-value",
            json!({"left": "metadata.cost_usd", "op": "lt", "value": 0.01})
        ),
    ]);
    let r = evaluate(&mut engine, &leaky_trace(), &assertions);
    check(&r[0], "soft_fail", 0.0, &["leaks personal data"]);
    check(&r[1], "pass", 1.0, &[]);
    check(&r[2], "pass", 1.0, &[]);
    check(&r[3], "soft_fail", 0.0, &["is not less than 0.001"]);
    check(&r[4], "hard_fail", 0.0, &["leaks personal data"]);
    check(&r[5], "hard_fail", 0.0, &["leaks personal data"]);
    check(&r[6], "pass", 1.0, &[]);

    let r = evaluate(
        &mut engine,
        &refusing_trace(),
        &json!([
            soft_plugin("refusal", "refusal", json!({})),
            soft_plugin("args", "tool-args", json!({"tool": "refund", "expect": {"x": {"equals": 1}}}))
        ]),
    );
    check(&r[0], "soft_fail", 0.0, &["reads as a refusal"]);
    check(&r[1], "soft_fail", 0.0, &["'refund' was never called"]);
}

#[test]
fn several_assertions_per_plugin_each_get_their_own_result_in_order() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&RUST_EXAMPLES));
    let mut assertions = Vec::new();
    let mut expected = Vec::new();
    // 40 assertions: each plugin gets passing and failing configs, interleaved
    // with built-in ones, in an order that is not grouped by plugin.
    for i in 0..5 {
        assertions.push(plugin(&format!("pii_{i}_leak"), "pii-leak", json!({"kinds": ["email"]})));
        expected.push((format!("pii_{i}_leak"), "hard_fail", 0.0));
        assertions.push(builtin(&format!("b_{i}_pass"), "contains", "gmail"));
        expected.push((format!("b_{i}_pass"), "pass", 1.0));
        assertions.push(plugin(
            &format!("sv_{i}"),
            "step-value",
            json!({"left": "metadata.total_tokens", "op": "gte", "value": 1000 + i * 100}),
        ));
        expected.push((
            format!("sv_{i}"),
            if 1000 + i * 100 <= 1350 { "pass" } else { "hard_fail" },
            if 1000 + i * 100 <= 1350 { 1.0 } else { 0.0 },
        ));
        assertions.push(plugin(
            &format!("pii_{i}_clean"),
            "pii-leak",
            json!({"target": "input.user_message"}),
        ));
        expected.push((format!("pii_{i}_clean"), "pass", 1.0));
        assertions.push(plugin(
            &format!("ta_{i}"),
            "tool-args",
            json!({"tool": "process_refund", "expect": {"amount": {"equals": 89.99 + i as f64}}}),
        ));
        expected.push((
            format!("ta_{i}"),
            if i == 0 { "pass" } else { "hard_fail" },
            if i == 0 { 1.0 } else { 0.0 },
        ));
        assertions.push(builtin(&format!("b_{i}_fail"), "contains", &format!("voucher {i}")));
        expected.push((format!("b_{i}_fail"), "hard_fail", 0.0));
        assertions.push(plugin(
            &format!("ref_{i}"),
            "refusal",
            json!({"mode": if i % 2 == 0 { "must_not_refuse" } else { "must_refuse" }}),
        ));
        expected.push((
            format!("ref_{i}"),
            if i % 2 == 0 { "pass" } else { "hard_fail" },
            if i % 2 == 0 { 1.0 } else { 0.0 },
        ));
        assertions.push(soft_plugin(&format!("pii_{i}_soft"), "pii-leak", json!({"kinds": ["card"]})));
        expected.push((format!("pii_{i}_soft"), "soft_fail", 0.0));
    }
    let assertions = Value::Array(assertions);
    let r = evaluate(&mut engine, &leaky_trace(), &assertions);
    for (id, status, score) in &expected {
        check(find(&r, id), status, *score, &[]);
    }
    // Each explanation is about its own config.
    for i in 0..5 {
        let ta = find(&r, &format!("ta_{i}"))["explanation"].as_str().unwrap().to_owned();
        assert!(ta.contains(&format!("{}", 89.99 + i as f64)), "{ta}");
        let sv = find(&r, &format!("sv_{i}"))["explanation"].as_str().unwrap().to_owned();
        assert!(sv.contains(&format!("{}", 1000 + i * 100)), "{sv}");
        let leak = find(&r, &format!("pii_{i}_leak"))["explanation"].as_str().unwrap().to_owned();
        assert!(leak.contains("email") && !leak.contains("card"), "{leak}");
        let soft = find(&r, &format!("pii_{i}_soft"))["explanation"].as_str().unwrap().to_owned();
        assert!(soft.contains("card") && !soft.contains("email"), "{soft}");
    }

    // request_id idempotency works for plugin assertions too.
    let with_ids = json!([
        {"assertion_id": "a1", "request_id": "plugin-req-1", "type": "plugin", "spec": {"plugin_id": "pii-leak"}},
        {"assertion_id": "a2", "request_id": "plugin-req-2", "type": "plugin", "spec": {"plugin_id": "refusal"}}
    ]);
    let first = evaluate(&mut engine, &leaky_trace(), &with_ids);
    let again = evaluate(&mut engine, &leaky_trace(), &with_ids);
    for (a, b) in first.iter().zip(&again) {
        assert!(a.get("cached").is_none(), "{a}");
        assert_eq!(b["cached"], json!(true), "{b}");
        assert_eq!(
            (&a["status"], &a["score"], &a["explanation"]),
            (&b["status"], &b["score"], &b["explanation"])
        );
    }
}

// ---------------------------------------------------------------- dispatch errors

#[test]
fn unknown_plugin_id_is_assertion_error_listing_available_plugins() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak", "refusal"]));
    let assertions = json!([
        builtin("b", "contains", "refund"),
        plugin("p1", "pii-leak", json!({})),
        plugin("p2", "pii_leak", json!({}))
    ]);
    let err = expect_error(&engine.request(&evaluate_request(json!(1), refund_trace(), assertions)), 1002);
    assert_eq!(err["message"], json!("assertion 'p2' (plugin): unknown plugin 'pii_leak'"), "{err}");
    assert_eq!(err["data"]["assertion_id"], json!("p2"));
    assert_eq!(err["data"]["field"], json!("params.assertions[2].spec.plugin_id"));
    let detail = err["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("Available plugins: pii-leak, refusal."), "{detail}");
    assert!(detail.contains("list_plugins"), "{detail}");

    // A missing or non-string plugin_id.
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(2),
            refund_trace(),
            json!([{"assertion_id": "x", "type": "plugin", "spec": {"config": {}}}]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.plugin_id"), "{err}");
    assert!(err["message"].as_str().unwrap().contains("plugin_id"), "{err}");
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(3),
            refund_trace(),
            json!([{"assertion_id": "x", "type": "plugin", "spec": {"plugin_id": 7}}]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.plugin_id"), "{err}");

    // The engine still works afterwards.
    let r = evaluate(&mut engine, &refund_trace(), &json!([plugin("p1", "pii-leak", json!({}))]));
    check(&r[0], "pass", 1.0, &[]);
}

#[test]
fn config_violating_the_plugin_schema_is_assertion_error() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&RUST_EXAMPLES));
    let cases = [
        ("tool-args", json!({"tool": "process_refund"}), "\"expect\" is a required property"),
        (
            "tool-args",
            json!({"tool": "x", "expect": {"a": {"equals": 1}}, "bogus": 1}),
            "'bogus' was unexpected",
        ),
        ("tool-args", json!({"tool": "x", "expect": {}}), "at /expect"),
        (
            "tool-args",
            json!({"tool": "x", "expect": {"a": {"equals": 1}}, "call": "some"}),
            "at /call",
        ),
        ("pii-leak", json!({"kinds": ["ssn"]}), "at /kinds/0"),
        ("pii-leak", json!({"kinds": []}), "at /kinds"),
        ("pii-leak", json!({"hard_fail": "yes"}), "at /hard_fail"),
        ("refusal", json!({"mode": "sometimes"}), "at /mode"),
        ("step-value", json!({"left": "metadata.cost_usd"}), "oneOf"),
        (
            "step-value",
            json!({"left": "metadata.cost_usd", "right": "metadata.cost_usd", "value": 1}),
            "oneOf",
        ),
        (
            "step-value",
            json!({"left": "metadata.cost_usd", "op": "lt", "value": 1, "tolerance": 0.5}),
            "at /tolerance",
        ),
        (
            "step-value",
            json!({"left": "metadata.cost_usd", "value": 1, "tolerance": -1}),
            "at /tolerance",
        ),
    ];
    for (i, (plugin_id, config, problem)) in cases.into_iter().enumerate() {
        let assertions = json!([builtin("b", "contains", "refund"), plugin("bad", plugin_id, config.clone())]);
        let err = expect_error(&engine.request(&evaluate_request(json!(i), refund_trace(), assertions)), 1002);
        let message = err["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "assertion 'bad' (plugin): config for plugin '{plugin_id}' does not match its schema: "
            )),
            "{config}: {err}"
        );
        assert!(message.contains(problem), "{config}: the message should name {problem:?}: {err}");
        assert_eq!(err["data"]["field"], json!("params.assertions[1].spec.config"), "{err}");
        assert_eq!(err["data"]["assertion_id"], json!("bad"), "{err}");
        let detail = err["data"]["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("Plugin '{plugin_id}' expects a config matching: {{")),
            "the detail shows the schema: {detail}"
        );
    }
}

#[test]
fn config_that_is_not_an_object_is_assertion_error() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));
    for (i, (config, kind)) in [
        (json!([1, 2]), "an array"),
        (json!("output.message"), "a string"),
        (json!(3), "a number"),
        (json!(true), "a boolean"),
    ]
    .into_iter()
    .enumerate()
    {
        let err = expect_error(
            &engine.request(&evaluate_request(
                json!(i),
                refund_trace(),
                json!([plugin("p", "pii-leak", config.clone())]),
            )),
            1002,
        );
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("spec.config must be an object, got {kind}")),
            "{config}: {err}"
        );
        assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.config"), "{err}");
        assert_eq!(err["data"]["assertion_id"], json!("p"), "{err}");
    }
    // An absent config is the empty object.
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([{"assertion_id": "p", "type": "plugin", "spec": {"plugin_id": "pii-leak"}}]),
    );
    check(&r[0], "pass", 1.0, &[]);
}

// ---------------------------------------------------------------- fault containment

#[test]
fn no_state_survives_from_one_call_to_the_next() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["remember", "trap"]));
    // Many calls in a row, each of which may land in a pooled slot an
    // earlier call used; a trapping plugin in between must not change that.
    for i in 0..40 {
        let mut assertions = vec![
            plugin("first", "remember", json!({"leave": format!("a{i}")})),
            plugin("second", "remember", json!({"leave": format!("b{i}")})),
        ];
        if i % 3 == 0 {
            assertions.push(plugin("trap", "trap", json!({})));
        }
        let r = evaluate(&mut engine, &refund_trace(), &Value::Array(assertions));
        // One instance per call: the call's second assertion sees the first...
        check(find(&r, "second"), "hard_fail", 0.0, &[&format!("seen 1, left over a{i}")]);
        // ...and nothing of the calls before it.
        check(find(&r, "first"), "pass", 1.0, &["seen 0, left over none"]);
        if i % 3 == 0 {
            check_fault(find(&r, "trap"), "trap", "trapped");
        }
    }
}

#[test]
fn hostile_plugins_are_contained_and_builtins_still_pass() {
    let cache = fresh_cache();
    // Metered: the spinning plugin stops on fuel, deterministically and long
    // before its deadline (the deadline alone is tested below).
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("[plugin_defaults]\nfuel = {HOSTILE_FUEL}\n"));
    let mut args = vec!["--config".to_owned(), config];
    args.extend(plugin_flags(&["spin", "hog", "trap", "silent-trap", "verbose", "snoop"]));
    let mut engine = start(cache.path(), &args);
    let assertions = json!([
        builtin("before", "contains", "refund"),
        plugin("spin", "spin", json!({})),
        plugin("hog", "hog", json!({})),
        plugin("trap_panic", "trap", json!({})),
        plugin("trap_stack", "trap", json!({"how": "stack_overflow"})),
        plugin("trap_silent", "silent-trap", json!({})),
        plugin("verbose", "verbose", json!({})),
        plugin("verbose_details", "verbose", json!({"field": "details"})),
        plugin("snoop", "snoop", json!({})),
        soft_plugin("spin_soft", "spin", json!({})),
        builtin("after", "contains", "RFD-001"),
    ]);
    for round in 0..2 {
        let started = Instant::now();
        let r = evaluate(&mut engine, &refund_trace(), &assertions);
        let elapsed = started.elapsed();
        check(find(&r, "before"), "pass", 1.0, &[]);
        check(find(&r, "after"), "pass", 1.0, &[]);
        check_fault(
            find(&r, "spin"),
            "spin",
            &format!("exceeded its CPU budget ({HOSTILE_FUEL} fuel per call)"),
        );
        // soft never softens a fault.
        check_fault(find(&r, "spin_soft"), "spin", "exceeded its CPU budget");
        check_fault(find(&r, "hog"), "hog", "exceeded its memory limit (64 MiB)");
        check_fault(find(&r, "trap_panic"), "trap", "trapped");
        assert!(find(&r, "trap_panic")["explanation"].as_str().unwrap().contains("unreachable"));
        // The SDK's panic hook sends the message to the engine's log before the trap.
        assert!(
            engine.stderr_shows("panicked: ") && engine.stderr_shows("the trap test plugin panics on purpose"),
            "the panic message is logged: {}",
            engine.stderr_text()
        );
        check_fault(find(&r, "trap_stack"), "trap", "trapped");
        // Without the panic hook there is no message to log: the trap says why.
        let silent = find(&r, "trap_silent");
        check_fault(silent, "silent-trap", "trapped");
        let why = silent["explanation"].as_str().unwrap();
        assert!(
            why.contains("unreachable") && why.contains("no panic message was logged") && why.contains("REPORT_PANICS = false"),
            "{why}"
        );
        assert!(!engine.stderr_shows("silent-trap test plugin panics"), "{}", engine.stderr_text());
        let loud = find(&r, "trap_panic")["explanation"].as_str().unwrap();
        assert!(!loud.contains("REPORT_PANICS"), "a plugin with the hook gets no hint: {loud}");
        // The logged panic message is quoted in the trap's explanation too.
        assert!(
            loud.contains("its last error log: \"panicked: ") && loud.contains("the trap test plugin panics on purpose"),
            "{loud}"
        );
        // A 10 MiB explanation is accepted and clipped; 10 MiB of details are dropped.
        let verbose = find(&r, "verbose");
        check(verbose, "pass", 1.0, &["verbose verbose"]);
        let chars = verbose["explanation"].as_str().unwrap().chars().count();
        assert!(
            (MAX_EXPLANATION_CHARS - 8..=MAX_EXPLANATION_CHARS).contains(&chars),
            "{chars} chars"
        );
        let details = find(&r, "verbose_details");
        check(details, "pass", 1.0, &["details are big"]);
        let omitted = details["details"]["omitted"].as_str().unwrap_or_else(|| panic!("{details}"));
        assert!(omitted.contains("10485762 bytes") && omitted.contains("limit is 4096"), "{omitted}");
        // No file system, environment or network inside the sandbox.
        let snoop = find(&r, "snoop");
        check(
            snoop,
            "pass",
            1.0,
            &[
                "snoop was contained",
                "std::fs::read(\"/etc/hostname\") failed",
                "std::env::var(\"HOME\") failed",
                "std::net::TcpStream::connect(\"127.0.0.1:1\") failed",
            ],
        );
        let probes = snoop["details"].as_array().unwrap_or_else(|| panic!("{snoop}"));
        assert_eq!(probes.len(), 3, "{snoop}");
        assert!(probes.iter().all(|p| p["escaped"] == json!(false)), "{snoop}");
        // The spin plugin stops on fuel long before its wall-clock limit.
        assert!(elapsed < Duration::from_secs(10), "round {round} took {elapsed:?}");
    }
    let log = engine.stderr_text();
    assert!(
        log.contains("plugin call failed") && log.contains("\"plugin\":\"spin\""),
        "faults are logged: {log}"
    );

    // The engine is healthy afterwards.
    let r = evaluate(&mut engine, &refund_trace(), &refund_assertions());
    assert!(r.iter().all(|x| x["status"] == json!("pass")), "{r:?}");
}

/// A plugin's own stack in linear memory is 128 KiB (`plugins/build.sh`),
/// not Rust's 1 MiB, since the engine resets a plugin's whole memory after
/// every call. The deepest trace the engine accepts still fits: the
/// `contains` plugin decodes and prints an `output` value nested to the
/// engine's limit, and passes.
#[test]
fn a_value_nested_as_deep_as_the_engine_accepts_fits_a_plugins_stack() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["contains"]));
    let trace = |depth: usize| {
        let mut deep = json!("needle");
        for _ in 0..depth {
            deep = json!([deep]);
        }
        json!({"schema_version": 1, "trace_id": "trc_deep", "output": {"message": "hi", "deep": deep}})
    };
    let assertions = json!([plugin("deep", "contains", json!({"target": "output.deep", "value": "needle"}))]);
    // The engine accepts 127 levels of arrays and objects, the trace's own
    // object and `output` included, and refuses the 128th.
    let err = expect_error(&engine.request(&evaluate_request(json!(1), trace(126), assertions.clone())), 1001);
    assert!(err["message"].as_str().unwrap().contains("nesting too deep"), "{err}");
    let r = evaluate(&mut engine, &trace(125), &assertions);
    check(find(&r, "deep"), "pass", 1.0, &["output.deep contains 'needle'"]);
}

#[test]
fn many_large_verdicts_still_fit_one_response_line() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["verbose"]));
    let assertions: Vec<Value> = (0..120)
        .map(|i| plugin(&format!("v{i:03}"), "verbose", json!({"bytes": 5000 + i})))
        .chain([builtin("b", "contains", "refund")])
        .collect();
    let r = evaluate(&mut engine, &refund_trace(), &Value::Array(assertions));
    assert!(r.iter().all(|x| x["status"] == json!("pass")), "{r:?}");
}

#[test]
fn malformed_verdicts_are_contained() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["malformed"]));
    let kinds = [
        ("nan", "score NaN is outside [0, 1]"),
        ("too_high", "score 7.5 is outside [0, 1]"),
        ("negative", "score -0.5 is outside [0, 1]"),
        ("infinity", "score inf is outside [0, 1]"),
        ("bad_details", "details are not JSON"),
    ];
    let mut assertions: Vec<Value> = kinds
        .iter()
        .map(|(kind, _)| soft_plugin(&format!("m_{kind}"), "malformed", json!({"kind": kind})))
        .collect();
    assertions.insert(2, plugin("control", "malformed", json!({"kind": "valid"})));
    assertions.push(builtin("b", "contains", "refund"));
    let r = evaluate(&mut engine, &refund_trace(), &Value::Array(assertions));
    for (kind, why) in kinds {
        let x = find(&r, &format!("m_{kind}"));
        check_fault(x, "malformed", "returned a malformed verdict");
        check(x, "hard_fail", 0.0, &[why]);
    }
    check(find(&r, "control"), "pass", 1.0, &["malformed plugin, kind valid"]);
    check(find(&r, "b"), "pass", 1.0, &[]);

    // Too few or too many results for the configs sent.
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([
            builtin("b", "contains", "refund"),
            plugin("missing", "malformed", json!({"kind": "missing_result"}))
        ]),
    );
    check(&r[0], "pass", 1.0, &[]);
    check_fault(&r[1], "malformed", "returned 0 results for 1 configs");
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([
            plugin("extra", "malformed", json!({"kind": "extra_result"})),
            builtin("b", "contains", "refund")
        ]),
    );
    check_fault(&r[0], "malformed", "returned 2 results for 1 configs");
    check(&r[1], "pass", 1.0, &[]);

    // In one call with other configs, a wrong count is retried config by
    // config: only the config that causes it faults.
    for (kind, why) in [("missing_result", "returned 0 results"), ("extra_result", "returned 2 results")] {
        let r = evaluate(
            &mut engine,
            &refund_trace(),
            &json!([
                plugin("ok1", "malformed", json!({"kind": "valid"})),
                plugin("bad", "malformed", json!({"kind": kind})),
                plugin("ok2", "malformed", json!({"kind": "valid"})),
            ]),
        );
        check(&r[0], "pass", 1.0, &["malformed plugin, kind valid"]);
        check_fault(&r[1], "malformed", &format!("{why} for 1 configs"));
        check(&r[2], "pass", 1.0, &["malformed plugin, kind valid"]);
    }
}

/// A config file giving `spin` (unmetered, the default) a deadline of
/// `timeout`, so that its batches stay in flight that long.
fn slow_spin_config(dir: &Path, timeout: &str) -> String {
    write_config(
        dir,
        &format!(
            "[[plugins]]\npath = {}\ntimeout = '{timeout}'\n\n[[plugins]]\npath = {}\n",
            toml_str(&wasm("spin")),
            toml_str(&wasm("pii-leak"))
        ),
    )
}

#[test]
fn a_spinning_plugin_does_not_hold_up_concurrent_requests() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let config = slow_spin_config(dir.path(), "3s");
    let mut engine = start(cache.path(), &["--config", &config]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed(&listing, "spin")["limits"], limits(None, DEFAULT_MEMORY, 3000));

    let spin_batch = json!([
        builtin("s", "contains", "refund"),
        plugin("p", "spin", json!({})),
        builtin("b", "contains", "RFD-001")
    ]);
    let started = Instant::now();
    engine.send(&evaluate_request(json!("spin"), refund_trace(), spin_batch.clone()));
    // Sent right away, without waiting; they reuse the spin batch's assertion
    // ids on other traces, so any cross-talk would show.
    let others = [
        (
            "builtin",
            leaky_trace(),
            json!([builtin("s", "contains", "gmail"), builtin("p", "not_contains", "refund sent")]),
        ),
        (
            "leak",
            leaky_trace(),
            json!([plugin("p", "pii-leak", json!({})), builtin("s", "contains", "4111")]),
        ),
        (
            "clean",
            refund_trace(),
            json!([plugin("p", "pii-leak", json!({})), builtin("b", "contains", "voucher")]),
        ),
    ];
    for (id, trace, assertions) in &others {
        engine.send(&evaluate_request(json!(id), trace.clone(), assertions.clone()));
    }
    engine.send(&rpc(json!("list"), "list_plugins", json!({})));

    let mut answered = Vec::new();
    let mut spin_line = None;
    while answered.len() < others.len() + 1 || spin_line.is_none() {
        let line = engine.recv_bytes_within(Duration::from_secs(60));
        let resp: Value = serde_json::from_slice(&line).unwrap();
        let id = resp["id"].as_str().unwrap().to_owned();
        match id.as_str() {
            "spin" => spin_line = Some((line, started.elapsed())),
            "list" => {
                assert_eq!(listed_ids(&expect_result(&resp)), ["spin", "pii-leak"]);
                answered.push((id, started.elapsed()));
            }
            _ => {
                let (_, _, assertions) = others.iter().find(|(i, _, _)| *i == id).unwrap();
                let r = check_batch_line(&line, assertions);
                match id.as_str() {
                    "builtin" => {
                        check(&r[0], "pass", 1.0, &["contains 'gmail'"]);
                        check(&r[1], "hard_fail", 0.0, &["refund sent"]);
                    }
                    "leak" => {
                        check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
                        check(&r[1], "pass", 1.0, &["4111"]);
                    }
                    "clean" => {
                        check(&r[0], "pass", 1.0, &["contains no email address"]);
                        check(&r[1], "hard_fail", 0.0, &["voucher"]);
                    }
                    other => panic!("unexpected response id {other}"),
                }
                answered.push((id, started.elapsed()));
            }
        }
        if let Some((_, at)) = &spin_line {
            assert!(
                answered.len() == others.len() + 1,
                "the spin batch was answered after {at:?}, before the requests sent after it (answered so far: {answered:?})"
            );
        }
    }
    let (line, spin_elapsed) = spin_line.unwrap();
    for (id, at) in &answered {
        assert!(*at < Duration::from_millis(2500), "{id} took {at:?} while the spin batch ran");
    }
    assert!(
        spin_elapsed >= Duration::from_millis(2900),
        "spin stops at its 3 s timeout, not before: {spin_elapsed:?}"
    );
    let r = check_batch_line(&line, &spin_batch);
    check(&r[0], "pass", 1.0, &[]);
    check_fault(&r[1], "spin", "timed out after 3000 ms");
    check(&r[2], "pass", 1.0, &[]);
}

/// An engine whose `spin` plugin runs until its 3 s timeout, and how many
/// spin requests keep every worker busy twice over (with the CPU count);
/// the directories live as long as the returned guard.
fn spinning_engine() -> (Engine, usize, usize, (TempDir, TempDir)) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let config = slow_spin_config(dir.path(), "3s");
    let engine = start(cache.path(), &["--config", &config]);
    (engine, (2 * cpus).min(32), cpus, (cache, dir))
}

#[test]
fn spinning_plugins_on_every_worker_do_not_stall_other_requests() {
    // More spin batches in flight than the engine has worker threads (one per
    // CPU). Once they are running, a built-in batch and list_plugins must
    // still be answered promptly, not only when the plugins time out.
    let (mut engine, spins, cpus, _dirs) = spinning_engine();
    for i in 0..spins {
        engine.send(&evaluate_request(
            json!(format!("spin{i}")),
            refund_trace(),
            json!([plugin("p", "spin", json!({}))]),
        ));
    }
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    engine.send(&evaluate_request(json!("builtin"), refund_trace(), refund_assertions()));
    engine.send(&rpc(json!("list"), "list_plugins", json!({})));
    let mut order = Vec::new();
    for _ in 0..spins + 2 {
        let line = engine.recv_bytes_within(Duration::from_secs(60));
        let resp: Value = serde_json::from_slice(&line).unwrap();
        let id = resp["id"].as_str().unwrap().to_owned();
        if id.starts_with("spin") {
            let r = check_batch_line(&line, &json!([plugin("p", "spin", json!({}))]));
            check_fault(&r[0], "spin", "timed out after 3000 ms");
        } else if id == "builtin" {
            let r = check_batch_line(&line, &refund_assertions());
            assert!(r.iter().all(|x| x["status"] == json!("pass")), "{r:?}");
        } else {
            assert_eq!(listed_ids(&expect_result(&resp)), ["spin", "pii-leak"]);
        }
        order.push((id, sent.elapsed()));
    }
    let builtin_at = order.iter().find(|(id, _)| id == "builtin").unwrap().1;
    let list_at = order.iter().find(|(id, _)| id == "list").unwrap().1;
    assert!(
        builtin_at < Duration::from_millis(1500) && list_at < Duration::from_millis(1500),
        "with {spins} spin batches in flight on {cpus} CPUs, requests sent 0.5 s later waited for the plugins to time out: \
         built-in batch answered after {builtin_at:?}, list_plugins after {list_at:?}; order: {order:?}"
    );
}

#[test]
fn plugin_calls_spelled_with_escapes_or_inside_json_rpc_batches_still_leave_the_workers_free() {
    // Whether a request runs on the blocking pool is decided from its parsed
    // assertions: "\u0070lugin" is a plugin assertion like any other, and so
    // is one that is a member of a JSON-RPC batch array.
    let (mut engine, spins, cpus, _dirs) = spinning_engine();
    let trace = refund_trace().to_string();
    let escaped = r#"[{"assertion_id":"p","type":"\u0070lugin","spec":{"plugin_id":"\u0073pin","config":{}}}]"#;
    for i in 0..spins {
        let request =
            format!(r#"{{"jsonrpc":"2.0","id":"spin{i}","method":"evaluate_batch","params":{{"trace":{trace},"assertions":{escaped}}}}}"#);
        if i % 2 == 0 {
            engine.send_line(&request);
        } else {
            // A JSON-RPC batch whose first member is answered at once and whose second calls the plugin.
            let quick = evaluate_request(json!(format!("quick{i}")), refund_trace(), refund_assertions());
            engine.send_line(&format!("[{quick},{request}]"));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    engine.send(&evaluate_request(json!("builtin"), refund_trace(), refund_assertions()));
    let mut builtin_at = None;
    for _ in 0..spins + 1 {
        let line = engine.recv_bytes_within(Duration::from_secs(60));
        let resp: Value = serde_json::from_slice(&line).unwrap();
        let members = match resp {
            Value::Array(members) => members,
            one => vec![one],
        };
        for member in members {
            let id = member["id"].as_str().unwrap().to_owned();
            let text = member.to_string();
            if id.starts_with("spin") {
                let r = check_batch_line(text.as_bytes(), &json!([plugin("p", "spin", json!({}))]));
                check_fault(&r[0], "spin", "timed out after 3000 ms");
            } else {
                let r = check_batch_line(text.as_bytes(), &refund_assertions());
                assert!(r.iter().all(|x| x["status"] == json!("pass")), "{r:?}");
                if id == "builtin" {
                    builtin_at = Some(sent.elapsed());
                }
            }
        }
    }
    let builtin_at = builtin_at.expect("the built-in batch was answered");
    assert!(
        builtin_at < Duration::from_millis(1500),
        "with {spins} escaped or batched spin calls in flight on {cpus} CPUs, a built-in batch sent 0.5 s later was answered only after {builtin_at:?}"
    );
}

#[test]
fn a_plugin_call_ends_at_the_requests_deadline_not_only_at_its_own_timeout() {
    // The plugin may run 20 s, the request only 1 s: the request is answered
    // at its deadline, and the engine serves the next one.
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[[plugins]]\npath = {}\ntimeout = '20s'\n\n[[plugins]]\npath = {}\n",
            toml_str(&wasm("spin")),
            toml_str(&wasm("hog"))
        ),
    );
    let mut engine = start(cache.path(), &["--config", &config, "--eval-timeout", "1s"]);
    let sent = Instant::now();
    engine.send(&evaluate_request(
        json!("spin"),
        refund_trace(),
        json!([builtin("b", "contains", "refund"), plugin("p", "spin", json!({}))]),
    ));
    let answer: Value = serde_json::from_slice(&engine.recv_bytes_within(Duration::from_secs(15))).unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(6), "answered after {took:?}: {answer}");
    assert_eq!(answer["id"], "spin", "{answer}");
    assert_eq!(answer["error"]["code"], 3002, "{answer}");
    // The configs of a call that faults are retried one by one (each `hog`
    // call fills its memory limit); past the deadline the rest are not
    // started.
    let many: Vec<Value> = (0..300).map(|i| plugin(&format!("p{i}"), "hog", json!({}))).collect();
    let sent = Instant::now();
    engine.send(&evaluate_request(json!("many"), refund_trace(), json!(many)));
    let answer: Value = serde_json::from_slice(&engine.recv_bytes_within(Duration::from_secs(15))).unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(6), "answered after {took:?}: {answer}");
    assert_eq!(answer["error"]["code"], 3002, "{answer}");
    let results = evaluate(&mut engine, &refund_trace(), &json!([builtin("after", "contains", "refund")]));
    check(find(&results, "after"), "pass", 1.0, &[]);
}

/// An engine whose `spin` plugin may run 60 s a call, with a 1 s drain limit.
fn start_with_a_long_spin(cache: &Path, dir: &Path) -> Engine {
    let config = write_config(
        dir,
        &format!(
            "drain_timeout = '1s'\n\n[[plugins]]\npath = {}\ntimeout = '60s'\n",
            toml_str(&wasm("spin"))
        ),
    );
    start(cache, &["--config", &config, "--eval-timeout", "90s"])
}

#[test]
fn shutdown_with_a_request_past_its_drain_limit_answers_both_and_exits_promptly() {
    // shutdown answers after the 1 s drain limit, and the request it gave up
    // on is answered 3002 just before it; the process exits soon after, and
    // the abandoned request's own answer never follows.
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_with_a_long_spin(cache.path(), dir.path());
    engine.send(&evaluate_request(
        json!("spin"),
        refund_trace(),
        json!([plugin("p", "spin", json!({}))]),
    ));
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    engine.send(&rpc(json!("bye"), "shutdown", json!({})));
    let abandoned: Value = serde_json::from_slice(&engine.recv_bytes_within(Duration::from_secs(20))).unwrap();
    assert_eq!(abandoned["id"], "spin", "{abandoned}");
    let error = expect_error(&abandoned, 3002);
    assert!(error["message"].as_str().unwrap().contains("drain_timeout 1000 ms"), "{error}");
    let answer: Value = serde_json::from_slice(&engine.recv_bytes_within(Duration::from_secs(5))).unwrap();
    assert_eq!(answer["id"], "bye", "{answer}");
    assert!(answer["result"].is_object(), "{answer}");
    let status = engine.wait_exit();
    let exited = sent.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        exited < Duration::from_secs(15),
        "the engine stayed up {exited:?} after shutdown, waiting for a request abandoned at its 1 s drain limit"
    );
    let rest = engine.drain_ready();
    assert!(rest.is_empty(), "nothing follows shutdown's answer: {rest:?}");
}

#[test]
fn end_of_input_with_requests_past_the_drain_limit_answers_each_before_exiting() {
    // No shutdown: stdin closes with a single request and a JSON-RPC batch
    // still spinning. After the drain limit and its grace, each id gets
    // 3002, the batch as one array line, and the process exits 0.
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_with_a_long_spin(cache.path(), dir.path());
    let spin = |id: &str| evaluate_request(json!(id), refund_trace(), json!([plugin("p", "spin", json!({}))]));
    engine.send(&spin("one"));
    engine.send(&json!([spin("b1"), notification("evaluate_batch", json!({})), spin("b2")]));
    std::thread::sleep(Duration::from_millis(300));
    let closed = Instant::now();
    engine.close_stdin();
    let mut answers = engine.values_until_eof();
    let status = engine.wait_exit();
    assert!(status.success(), "{status:?}");
    assert!(
        closed.elapsed() < Duration::from_secs(20),
        "exited {:?} after end of input",
        closed.elapsed()
    );
    answers.sort_by_key(|a| a.is_array());
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["id"], "one", "{answers:?}");
    expect_error(&answers[0], 3002);
    let batch = answers[1].as_array().expect("the batch's answer is an array");
    let ids: Vec<&Value> = batch.iter().map(|member| &member["id"]).collect();
    assert_eq!(ids, [&json!("b1"), &json!("b2")], "the notification gets no answer: {batch:?}");
    for member in batch {
        expect_error(member, 3002);
    }
}

// ---------------------------------------------------------------- limits from the config file

#[test]
fn a_plugin_that_allocates_and_frees_in_a_loop_stays_within_its_memory_limit() {
    // 512 MiB allocated in all, 64 KiB at a time and each freed before the
    // next, under an 8 MiB limit: the SDK's allocator reuses freed memory
    // once its arena is spent, rather than growing memory.
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_with_memory_limit(cache.path(), dir.path(), "hog", 8);
    let assertions = json!([
        plugin("churn", "hog", json!({"churn_mib": 512})),
        builtin("b", "contains", "refund"),
    ]);
    for _ in 0..2 {
        let r = evaluate(&mut engine, &refund_trace(), &assertions);
        check(&r[0], "pass", 1.0, &["churned 512 MiB"]);
        check(&r[1], "pass", 1.0, &[]);
    }
}

#[test]
fn per_plugin_limits_from_the_config_file_take_effect() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[plugin_defaults]\nmemory_mib = 32\ntimeout = '1500ms'\n\n\
             [[plugins]]\npath = {}\nfuel = 20000\n\n\
             [[plugins]]\npath = {}\nmemory_mib = 8\n\n\
             [[plugins]]\npath = {}\ntimeout = '300ms'\n\n\
             [[plugins]]\npath = {}\n\n\
             [[plugins]]\npath = {}\nfuel = 1000\n",
            toml_str(&wasm("pii-leak")),
            toml_str(&wasm("hog")),
            toml_str(&wasm("spin")),
            toml_str(&wasm("tool-args")),
            toml_str(&wasm("refusal")),
        ),
    );
    let mut engine = start(cache.path(), &["--config", &config]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["pii-leak", "hog", "spin", "tool-args"], "{listing}");
    let mib = 1024 * 1024;
    assert_eq!(listed(&listing, "pii-leak")["limits"], limits(Some(20_000), 32 * mib, 1500));
    assert_eq!(listed(&listing, "hog")["limits"], limits(None, 8 * mib, 1500));
    assert_eq!(listed(&listing, "spin")["limits"], limits(None, 32 * mib, 300));
    assert_eq!(listed(&listing, "tool-args")["limits"], limits(None, 32 * mib, 1500));
    // 1000 fuel is not even enough for describe(): refused at load, with the reason.
    let error = failure(&listing, "refusal.wasm");
    assert!(
        error.contains("describe() failed") && error.contains("exceeded its CPU budget (1000 fuel per call)"),
        "{error}"
    );

    let assertions = json!([
        plugin("pii", "pii-leak", json!({})),
        plugin("hog", "hog", json!({})),
        plugin("spin", "spin", json!({})),
        plugin(
            "args",
            "tool-args",
            json!({"tool": "process_refund", "expect": {"amount": {"equals": 89.99}}})
        ),
        builtin("b", "contains", "refund"),
    ]);
    // 20000 fuel covers describe() but not scanning a 30 KB answer.
    let long_answer = with_message(&"Your refund of $89.99 is on its way. ".repeat(800));
    let started = Instant::now();
    let r = evaluate(&mut engine, &long_answer, &assertions);
    let elapsed = started.elapsed();
    check_fault(&r[0], "pii-leak", "exceeded its CPU budget (20000 fuel per call)");
    check_fault(&r[1], "hog", "exceeded its memory limit (8 MiB)");
    check_fault(&r[2], "spin", "timed out after 300 ms");
    check(&r[3], "pass", 1.0, &[]);
    check(&r[4], "pass", 1.0, &[]);
    assert!(elapsed >= Duration::from_millis(290), "spin ran until its timeout: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");

    // plugin check applies the file's limits to the file it names.
    let out = run_with(cache.path(), &["--config", &config, "plugin", "check", &wasm("hog")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("limits:       no fuel metering (the deadline bounds CPU), 8 MiB memory, 1500 ms per call"),
        "{stdout}"
    );
    let out = run_with(cache.path(), &["--config", &config, "plugin", "check", &wasm("pii-leak")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("limits:       20000 fuel per call, 32 MiB memory, 1500 ms per call"),
        "{stdout}"
    );
    // A file no entry names gets [plugin_defaults], as the server gives it;
    // one an entry names is found however its path is spelled.
    let out = run_with(cache.path(), &["--config", &config, "plugin", "check", &wasm("step-value")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("limits:       no fuel metering (the deadline bounds CPU), 32 MiB memory, 1500 ms per call"),
        "{stdout}"
    );
    // Which is worth a warning: entries are matched by file, so a copy of a
    // plugin gets none of its original's grants.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: no [[plugins]] entry of the config file names")
            && stderr.contains("step-value.wasm (entries are matched by file: ")
            && stderr.contains("hog.wasm"),
        "{stderr}"
    );
    let hog = std::path::Path::new(&wasm("hog")).parent().unwrap().join(".").join("hog.wasm");
    let out = run_with(cache.path(), &["--config", &config, "plugin", "check", hog.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("8 MiB memory, 1500 ms per call"), "{stdout}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"), "an entry names it");
    // plugin check works on the file it names: a plugin directory in the
    // environment is not read (one that does not exist stops nothing), and
    // without a config file there is no entry to warn about.
    for dir in [
        std::path::Path::new(&wasm("hog")).parent().unwrap(),
        std::path::Path::new("/nonexistent"),
    ] {
        let out = engine_command(cache.path(), &["plugin", "check", &wasm("step-value")])
            .env("ATTEST_PLUGIN_DIR", dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"), "{out:?}");
    }
    let out = run_with(
        cache.path(),
        &[
            "--config",
            &config,
            "plugin",
            "test",
            &wasm("spin"),
            "--trace",
            &trace_file(dir.path()),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("timed out after 300 ms"), "{stdout}");
}

fn trace_file(dir: &std::path::Path) -> String {
    let path = dir.join("trace.json");
    std::fs::write(&path, refund_trace().to_string()).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn invalid_plugin_limits_are_configuration_errors() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let pii = toml_str(&wasm("pii-leak"));
    let cases = [
        (format!("[[plugins]]\npath = {pii}\nfuel = 0\n"), "fuel must be greater than zero"),
        (
            format!("[[plugins]]\npath = {pii}\nmemory_mib = 0\n"),
            "memory_mib must be between 1MiB and 1024MiB, got 0",
        ),
        (
            format!("[[plugins]]\npath = {pii}\nmemory_mib = 4096\n"),
            "memory_mib must be between 1MiB and 1024MiB, got 4096",
        ),
        (
            format!("[[plugins]]\npath = {pii}\ntimeout = '0s'\n"),
            "timeout must be at least 1ms, got \"0s\"",
        ),
        (
            format!("[[plugins]]\npath = {pii}\ntimeout = '1ns'\n"),
            "timeout must be at least 1ms, got \"1ns\"",
        ),
        (format!("[[plugins]]\npath = {pii}\ntimeout = 'soon'\n"), "'soon' is not a duration"),
        (
            format!("[[plugins]]\npath = {pii}\nfuell = 5\n"),
            "unknown field `fuell`, expected one of `path`, `fuel`, `memory_mib`, `memory`, `timeout`, `grants`, `secrets`",
        ),
        ("[plugin_defaults]\nfuel = 0\n".to_owned(), "plugin_defaults"),
        ("[[plugins]]\npath = ''\n".to_owned(), "path is empty"),
        (
            format!("[[plugins]]\npath = {pii}\ngrants = ['config-secret']\n[plugins.secrets]\ntoken = 5\n"),
            r#"expected a secret's value as a string ("…"), or { env = "VAR" }"#,
        ),
        (
            format!("[[plugins]]\npath = {pii}\ngrants = ['config-secret']\n[plugins.secrets]\ntoken = {{ file = 'x' }}\n"),
            "unexpected key 'file' in a secret",
        ),
        (
            format!("[[plugins]]\npath = {pii}\ngrants = ['config-secret']\n[plugins.secrets]\n'' = 'x'\n"),
            "a secret needs a name",
        ),
    ];
    for (text, needle) in cases {
        let config = write_config(dir.path(), &text);
        let out = run_with(cache.path(), &["--config", &config]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(
            err.contains("configuration error") && err.contains(needle),
            "{text}: stderr should mention {needle:?}: {err}"
        );
    }
}

// ---------------------------------------------------------------- plugin check

#[test]
fn plugin_check_prints_metadata_api_version_and_limits() {
    let cache = fresh_cache();
    for id in RUST_EXAMPLES {
        let out = run_with(cache.path(), &["plugin", "check", &wasm(id)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{id}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        for line in [
            format!("plugin:       {id} 0.1.0"),
            format!("file:         {}", wasm(id)),
            format!("api version:  attest:plugin@{API} (engine serves {})", SERVED.join(", ")),
            format!("limits:       no fuel metering (the deadline bounds CPU), 64 MiB memory, {DEFAULT_TIMEOUT_MS} ms per call"),
            "loaded from:  compiled in ".to_owned(),
            "config schema:\n{".to_owned(),
        ] {
            assert!(stdout.contains(&line), "{id}: {line:?} missing from:\n{stdout}");
        }
        assert!(stdout.contains("description:  ") && !stdout.contains("refused"), "{stdout}");
        // The printed schema is the plugin's documented one.
        let schema_text = stdout.split_once("config schema:\n").unwrap().1;
        let printed: Value = serde_json::from_str(schema_text).unwrap_or_else(|e| panic!("{id}: schema is not JSON ({e}): {schema_text}"));
        let file = Path::new(PLUGINS_SRC).join(id).join("config.schema.json");
        assert_eq!(
            printed,
            serde_json::from_str::<Value>(&std::fs::read_to_string(file).unwrap()).unwrap()
        );
    }
    // Checking a plugin leaves the engine's cache as it was: nothing is written.
    let out = run_with(cache.path(), &["plugin", "check", &wasm("pii-leak")]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("loaded from:  compiled in "));
    let written: Vec<_> = walk_files(cache.path());
    assert!(written.is_empty(), "plugin check wrote {written:?}");
    // A cache an engine start filled is used.
    drop(start(cache.path(), &["--plugin", &wasm("pii-leak")]));
    let out = run_with(cache.path(), &["plugin", "check", &wasm("pii-leak")]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("loaded from:  cache in "));
}

#[test]
fn plugin_check_refuses_a_future_api_version() {
    let cache = fresh_cache();
    let out = run_with(cache.path(), &["plugin", "check", &wasm("future-api")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with(&format!("refused: {}: ", wasm("future-api"))), "{stdout}");
    assert!(
        stdout.contains("attest:plugin@9.0.0") && stdout.contains(&format!("attest:plugin@{API}")),
        "{stdout}"
    );
    assert!(stdout.contains("rebuild the plugin against wit/since_v0.2.0/"), "{stdout}");
    assert!(!stdout.contains("plugin:"), "{stdout}");
}

#[test]
fn plugin_check_of_unusable_files_exits_1_with_a_clear_message() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.wasm");
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\x7fELF not a plugin").unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, b"").unwrap();
    let stub = dir.path().join("stub.wasm");
    std::fs::write(&stub, b"\0asm\x0d").unwrap();
    let cut = dir.path().join("cut.wasm");
    let whole = std::fs::read(wasm("pii-leak")).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let cases = [
        (&missing, "cannot read"),
        (&garbage, "not a WebAssembly component (bad magic bytes"),
        (&core, "core WebAssembly module, not a component"),
        (&empty, "the file is empty (0 bytes), not a WebAssembly component"),
        (
            &stub,
            "the file is 5 bytes, shorter than a component's 8-byte header: it looks cut short",
        ),
        (&cut, "looks cut short: rebuild it or copy it again"),
    ];
    for (path, why) in cases {
        let out = run_with(cache.path(), &["plugin", "check", path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{}: {stdout}", path.display());
        assert!(stdout.starts_with(&format!("refused: {}: ", path.display())), "{stdout}");
        assert!(stdout.contains(why), "{}: {stdout}", path.display());
    }
    let out = run_with(cache.path(), &["plugin", "check", missing.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("No such file"), "{out:?}");
}

// ---------------------------------------------------------------- compiled cache

#[test]
fn compiled_plugins_are_cached_across_starts() {
    let cache = fresh_cache();
    let flags = plugin_flags(&["pii-leak"]);
    let assertions = json!([plugin("p", "pii-leak", json!({}))]);

    let mut engine = start(cache.path(), &flags);
    assert_eq!(sources(&mut engine), ["compiled"]);
    let first = evaluate(&mut engine, &leaky_trace(), &assertions);
    drop(engine);
    let artefacts = cached_artefacts(cache.path());
    assert_eq!(artefacts.len(), 1, "{artefacts:?}");

    let mut engine = start(cache.path(), &flags);
    assert_eq!(sources(&mut engine), ["cache"]);
    let second = evaluate(&mut engine, &leaky_trace(), &assertions);
    assert_eq!(first[0]["explanation"], second[0]["explanation"]);
    assert_eq!(first[0]["status"], json!("hard_fail"));
    assert_eq!(cached_artefacts(cache.path()), artefacts, "nothing new written");

    // ATTEST_CACHE_DIR="" disables the cache.
    let empty = Path::new("");
    for _ in 0..2 {
        let mut engine = start(empty, &flags);
        assert_eq!(sources(&mut engine), ["compiled"]);
    }
}

#[test]
fn a_cached_start_takes_the_plugins_description_from_the_cache() {
    let cache = fresh_cache();
    let flags = plugin_flags(&["pii-leak"]);
    forget_index(cache.path());
    let mut engine = start(cache.path(), &flags);
    let first = listed(&list_plugins(&mut engine), "pii-leak").clone();
    drop(engine);
    let artefact = cached_artefacts(cache.path()).remove(0);
    let record_path = artefact.with_extension("describe.json");
    let record: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    assert_eq!(record["id"], json!("pii-leak"), "{record}");
    assert_eq!(record["description"], first["description"], "{record}");

    // The next start reads the record instead of calling describe(): an
    // edited (still well-formed) record is what list_plugins shows.
    let mut edited = record.clone();
    edited["description"] = json!("described from the cache");
    std::fs::write(&record_path, edited.to_string()).unwrap();
    forget_index(cache.path());
    let mut engine = start(cache.path(), &flags);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed(&listing, "pii-leak")["description"], json!("described from the cache"));
    assert_eq!(listed(&listing, "pii-leak")["loaded_from"], json!("cache"));
    let results = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    assert_eq!(results[0]["status"], json!("hard_fail"), "the plugin itself still runs");
    drop(engine);

    // The record holds only for the limits describe() ran under: with
    // others, describe() runs again.
    let dir = tempfile::tempdir().unwrap();
    let mut tighter = vec![
        "--config".to_owned(),
        write_config(dir.path(), "[plugin_defaults]\nmemory_mib = 32\n"),
    ];
    tighter.extend(flags.iter().cloned());
    let mut engine = start(cache.path(), &tighter);
    assert_eq!(listed(&list_plugins(&mut engine), "pii-leak")["description"], first["description"]);
    drop(engine);
    std::fs::write(&record_path, edited.to_string()).unwrap();

    // A damaged record, or one made for another component, is ignored and rewritten.
    for bad in [b"{not json".to_vec(), {
        let mut other = record.clone();
        other["component"] = json!("00000000000000000000000000000000");
        other["description"] = json!("another component's");
        other.to_string().into_bytes()
    }] {
        std::fs::write(&record_path, bad).unwrap();
        forget_index(cache.path());
        let mut engine = start(cache.path(), &flags);
        assert_eq!(listed(&list_plugins(&mut engine), "pii-leak")["description"], first["description"]);
        drop(engine);
        let rewritten: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
        assert_eq!(rewritten, record);
    }
}

/// The start-up index: a plugin loaded before (same file, limits and engine)
/// is taken from its record at start-up, and its component is loaded after,
/// in the background or on first use; a changed file is loaded in full again.
#[test]
fn the_start_up_index_defers_loading_known_plugins() {
    let cache = fresh_cache();
    let flags = plugin_flags(&["pii-leak"]);
    drop(start(cache.path(), &flags));
    let index_dir = cache.path().join("plugins").join("index");
    let records: Vec<PathBuf> = std::fs::read_dir(&index_dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: Value = serde_json::from_slice(&std::fs::read(&records[0]).unwrap()).unwrap();
    assert_eq!(record["described"]["id"], json!("pii-leak"), "{record}");
    assert_eq!(record["path"], json!(wasm("pii-leak")));

    // Known: listed from the record, and it runs.
    let mut engine = start(cache.path(), &flags);
    assert_eq!(listed(&list_plugins(&mut engine), "pii-leak")["loaded_from"], json!("cache"));
    let r = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    drop(engine);

    // A record whose component is not the file's: the plugin lists (its
    // record says what it was) but refuses to run what it no longer is.
    let mut stale = record.clone();
    stale["source"] = json!("00000000000000000000000000000000");
    std::fs::write(&records[0], stale.to_string()).unwrap();
    let mut engine = start(cache.path(), &flags);
    let r = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check_fault(&r[0], "pii-leak", "changed after the engine started; restart the engine");
    drop(engine);
    // The stale record is dropped: the next start loads the file in full and indexes it again.
    assert!(!records[0].exists(), "the stale record is gone");
    let mut engine = start(cache.path(), &flags);
    let r = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    drop(engine);
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(&records[0]).unwrap()).unwrap()["source"],
        record["source"]
    );

    // A copy of the file elsewhere is another path: loaded in full, and indexed too.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("pii-leak.wasm");
    std::fs::copy(wasm("pii-leak"), &copy).unwrap();
    let mut engine = start(cache.path(), &["--plugin", copy.to_str().unwrap()]);
    let r = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    drop(engine);
    assert_eq!(std::fs::read_dir(&index_dir).unwrap().count(), 2);
}

#[test]
fn a_garbage_cache_file_is_ignored_and_recompiled() {
    let cache = fresh_cache();
    let flags = plugin_flags(&["pii-leak", "refusal"]);
    drop(start(cache.path(), &flags));
    let artefacts = cached_artefacts(cache.path());
    assert_eq!(artefacts.len(), 2, "{artefacts:?}");
    for (i, f) in artefacts.iter().enumerate() {
        let garbage: Vec<u8> = (0..50_000u32)
            .map(|n| (n.wrapping_mul(2_654_435_761).wrapping_add(i as u32) >> 13) as u8)
            .collect();
        std::fs::write(f, if i == 0 { garbage } else { b"".to_vec() }).unwrap();
    }

    forget_index(cache.path());
    let mut engine = start(cache.path(), &flags);
    assert_eq!(sources(&mut engine), ["compiled", "compiled"]);
    assert!(
        engine.stderr_shows("ignoring a cached compiled plugin; recompiling"),
        "{}",
        engine.stderr_text()
    );
    let r = evaluate(
        &mut engine,
        &refusing_trace(),
        &json!([plugin("p", "pii-leak", json!({})), plugin("r", "refusal", json!({}))]),
    );
    check(&r[0], "pass", 1.0, &[]);
    check(&r[1], "hard_fail", 0.0, &["reads as a refusal"]);
    drop(engine);

    // The bad files were replaced with good ones.
    let mut engine = start(cache.path(), &flags);
    assert_eq!(sources(&mut engine), ["cache", "cache"]);
}

#[test]

fn a_cache_file_with_corrupted_code_is_recompiled_not_run() {
    // Damage inside a compiled artefact (a bad disk, a partial copy of the
    // cache directory) that keeps the header intact. The engine must not
    // execute such a file: it should notice and recompile, like garbage.
    let cache = fresh_cache();
    let flags = plugin_flags(&["pii-leak"]);
    drop(start(cache.path(), &flags));
    let artefacts = cached_artefacts(cache.path());
    let good = std::fs::read(&artefacts[0]).unwrap();
    for tenth in [1, 5] {
        let mut bad = good.clone();
        let at = bad.len() * tenth / 10;
        for b in &mut bad[at..at + 4096] {
            *b ^= 0xff;
        }
        std::fs::write(&artefacts[0], &bad).unwrap();
        forget_index(cache.path());

        let mut engine = Engine::spawn_command(engine_command(cache.path(), &flags));
        engine.send(&initialize_request(json!("init"), init_params()));
        engine.send(&rpc(json!("lp"), "list_plugins", json!({})));
        engine.send(&evaluate_request(
            json!("eval"),
            leaky_trace(),
            json!([plugin("p", "pii-leak", json!({}))]),
        ));
        engine.close_stdin();
        let lines = engine.lines_until_eof();
        let status = engine.wait_exit();
        assert_eq!(
            lines.len(),
            3,
            "bytes {at}..{} of the cached artefact flipped: the engine died ({status}) after {} responses; stderr:\n{}",
            at + 4096,
            lines.len(),
            engine.stderr_text()
        );
        // Requests are answered concurrently: find each response by its id.
        let by_id = |id: &str| {
            lines
                .iter()
                .find(|l| serde_json::from_slice::<Value>(l).is_ok_and(|v| v["id"] == json!(id)))
                .unwrap_or_else(|| panic!("no response with id {id}"))
        };
        let listing = expect_result(&serde_json::from_slice(by_id("lp")).unwrap());
        assert_eq!(
            listing["plugins"][0]["loaded_from"],
            json!("compiled"),
            "a damaged artefact was loaded from the cache: {listing}"
        );
        let r = check_batch_line(by_id("eval"), &json!([plugin("p", "pii-leak", json!({}))]));
        check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    }
}

// ---------------------------------------------------------------- submit_plugin_result

#[test]
fn submit_plugin_result_is_still_accepted_alongside_plugins() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));
    let resp = engine.request(&plugin_request(json!("sub1")));
    assert_eq!(expect_result(&resp), json!({"accepted": true}));
    let r = evaluate(
        &mut engine,
        &leaky_trace(),
        &json!([plugin("p", "pii-leak", json!({})), builtin("b", "contains", "refund")]),
    );
    check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    check(&r[1], "pass", 1.0, &[]);
    // A result reported under a loaded plugin's name is recorded, not run.
    let mut req = plugin_request(json!("sub2"));
    req["params"]["plugin_name"] = json!("pii-leak");
    assert_eq!(expect_result(&engine.request(&req)), json!({"accepted": true}));
    let bad = rpc(json!("sub3"), "submit_plugin_result", json!({"trace_id": "t"}));
    let err = engine.request(&bad);
    assert!(err.get("error").is_some(), "an incomplete submission is refused: {err}");
    let resp = engine.request(&shutdown_request(json!("bye")));
    expect_result(&resp);
}

// ---------------------------------------------------------------- sandbox limits

/// Largest response line SDK readers accept.
const MAX_LINE_BYTES: usize = 64 * 1024;

#[test]
fn wasi_stdio_and_polling_are_served_and_waiting_is_stopped() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["wasi"]));
    let assertions = json!([
        builtin("before", "contains", "refund"),
        plugin("print", "wasi", json!({"call": "print"})),
        plugin("poll", "wasi", json!({"call": "poll"})),
        plugin("sleep", "wasi", json!({"call": "sleep"})),
        plugin("wall_clock", "wasi", json!({"call": "wall_clock"})),
        plugin("random", "wasi", json!({"call": "random"})),
        builtin("after", "contains", "RFD-001"),
    ]);
    let mut randoms = Vec::new();
    for _ in 0..2 {
        // A response (never a request-level error) with one result each.
        let r = evaluate(&mut engine, &refund_trace(), &assertions);
        check(find(&r, "before"), "pass", 1.0, &[]);
        check(find(&r, "after"), "pass", 1.0, &[]);
        // stdout is a sink: a Python print() does not fail anything.
        check(find(&r, "print"), "pass", 1.0, &["printed 1 MiB"]);
        check(find(&r, "poll"), "pass", 1.0, &["poll returned [0]"]);
        // Waiting in the host would outlive the call's deadline: the call is
        // stopped, naming the plugin and the call.
        let sleep = find(&r, "sleep");
        check_fault(sleep, "wasi", "wasi:clocks/monotonic-clock.subscribe-duration");
        check(sleep, "hard_fail", 0.0, &["was stopped", "plugins may not wait"]);
        // The wall clock stands at the epoch.
        check(find(&r, "wall_clock"), "pass", 1.0, &["wall clock: 0"]);
        randoms.push(find(&r, "random")["explanation"].clone());
    }
    // Randomness is a fixed sequence: the same in every call and every engine.
    assert_eq!(randoms[0], randoms[1]);
    drop(engine);
    let mut engine = start(cache.path(), &plugin_flags(&["wasi"]));
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([plugin("random", "wasi", json!({"call": "random"}))]),
    );
    assert_eq!(r[0]["explanation"], randoms[0]);
}

#[test]
fn a_trap_quotes_the_end_of_the_plugins_stderr() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["wasi"]));
    // The crash is a call of its own: a trap fails every config of its call.
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([
            plugin("crash", "wasi", json!({"call": "crash"})),
            builtin("after", "contains", "refund")
        ]),
    );
    let crash = find(&r, "crash");
    check_fault(crash, "wasi", "trapped");
    let why = crash["explanation"].as_str().unwrap();
    // An uncaught exception of a Python or JavaScript plugin is printed
    // there: the last line is what says what went wrong.
    assert!(
        why.contains("the end of its stderr: \"…") && why.contains("WasiError: the wasi test plugin crashes on purpose\""),
        "{why}"
    );
    assert!(why.len() < 1000, "at most the last 600 characters are quoted: {} bytes", why.len());
    check(find(&r, "after"), "pass", 1.0, &[]);
    // On one line, whatever the plugin wrote: the quote is headed for
    // tables and reports.
    assert!(!why.contains('\n'), "{why}");
}

#[test]
fn an_oversized_config_schema_is_refused_and_large_ones_are_not_listed() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["big-schema", "wide-schema", "pii-leak"]));
    engine.send(&rpc(json!("lp"), "list_plugins", json!({})));
    let line = engine.recv_bytes();
    assert!(line.len() < MAX_LINE_BYTES, "list_plugins answered with {} bytes", line.len());
    let listing = expect_result(&serde_json::from_slice(&line).unwrap());
    assert_eq!(listed_ids(&listing), ["wide-schema", "pii-leak"]);
    let error = failure(&listing, "big-schema.wasm");
    assert!(
        error.contains("describe() failed: the plugin declares a config schema of 100")
            && error.contains("the limit is 262144 bytes (256 KiB)"),
        "{error}"
    );
    // Too large to repeat in every listing: a note says where to see it.
    let omitted = listed(&listing, "wide-schema")["config_schema"]["omitted"]
        .as_str()
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        omitted.contains("attest-engine plugin check") && omitted.contains("wide-schema.wasm"),
        "{omitted}"
    );
    // Small schemas are listed in full.
    assert!(listed(&listing, "pii-leak")["config_schema"]["properties"].is_object(), "{listing}");
    // The plugin with the large schema still checks configs against it.
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([plugin("w", "wide-schema", json!({"kind": "kind-0000000000000007"}))]),
    );
    check(&r[0], "pass", 1.0, &["wide-schema evaluated"]);
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(2),
            refund_trace(),
            json!([plugin("w", "wide-schema", json!({"kind": "nope"}))]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.config"), "{err}");
}

#[test]
fn a_cache_entry_of_another_plugin_is_not_run_in_its_place() {
    let cache = fresh_cache();
    drop(start(cache.path(), &plugin_flags(&["pii-leak"])));
    let pii_entry = cached_artefacts(cache.path());
    assert_eq!(pii_entry.len(), 1);
    drop(start(cache.path(), &plugin_flags(&["refusal"])));
    let refusal_entry: Vec<PathBuf> = cached_artefacts(cache.path()).into_iter().filter(|p| *p != pii_entry[0]).collect();
    assert_eq!(refusal_entry.len(), 1);
    // A valid entry, compiled by this engine, but from another component.
    std::fs::copy(&refusal_entry[0], &pii_entry[0]).unwrap();
    forget_index(cache.path());

    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));
    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["pii-leak"]);
    assert_eq!(listed(&listing, "pii-leak")["loaded_from"], json!("compiled"), "{listing}");
    assert!(
        engine.stderr_shows("not compiled from this component"),
        "the swapped entry is reported: {}",
        engine.stderr_text()
    );
    let r = evaluate(&mut engine, &leaky_trace(), &json!([plugin("p", "pii-leak", json!({}))]));
    check(&r[0], "hard_fail", 0.0, &["leaks personal data"]);
    drop(engine);
    // The entry was replaced by pii-leak's own.
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));
    assert_eq!(sources(&mut engine), ["cache"]);
}

/// A component holding one core module with `functions` empty functions,
/// and optionally one page of memory with a data segment at `data_at`.
fn generated_component(functions: u32, data_at: Option<u32>) -> Vec<u8> {
    use wasm_encoder::{CodeSection, ConstExpr, DataSection, Function, FunctionSection, MemorySection, MemoryType, Module, TypeSection};
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut funcs = FunctionSection::new();
    for _ in 0..functions {
        funcs.function(0);
    }
    module.section(&funcs);
    if data_at.is_some() {
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        module.section(&memories);
    }
    let mut code = CodeSection::new();
    for _ in 0..functions {
        let mut f = Function::new([]);
        f.instructions().end();
        code.function(&f);
    }
    module.section(&code);
    if let Some(offset) = data_at {
        let mut data = DataSection::new();
        data.active(0, &ConstExpr::i32_const(offset as i32), b"beyond the cap".iter().copied());
        module.section(&data);
    }
    let mut component = wasm_encoder::Component::new();
    component.section(&wasm_encoder::ModuleSection(&module));
    component.finish()
}

#[test]
fn compile_bombs_are_refused_before_compiling() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("functions.wasm"), generated_component(200_000, None)).unwrap();
    std::fs::write(d.join("data.wasm"), generated_component(1, Some(300 << 20))).unwrap();
    // Past the size limit; only the header is a component's.
    let mut huge = vec![0u8; (64 << 20) + 1];
    huge[..8].copy_from_slice(&[0, b'a', b's', b'm', 0x0d, 0, 0x01, 0]);
    std::fs::write(d.join("huge.wasm"), huge).unwrap();
    std::fs::copy(wasm("big-memory"), d.join("big-memory.wasm")).unwrap();
    std::fs::copy(wasm("pii-leak"), d.join("pii-leak.wasm")).unwrap();

    let mut engine = start(cache.path(), &["--plugin-dir", d.to_str().unwrap()]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["pii-leak"]);
    let error = failure(&listing, "functions.wasm");
    assert!(error.contains("defines more than 50000 functions"), "{error}");
    let error = failure(&listing, "data.wasm");
    assert!(
        error.contains("data segment ending at 300 MiB, beyond the plugin's memory limit of 64 MiB"),
        "{error}"
    );
    let error = failure(&listing, "huge.wasm");
    assert!(error.contains("the limit is 67108864 bytes (64 MiB)"), "{error}");
    let error = failure(&listing, "big-memory.wasm");
    assert!(
        error.contains("its memory starts at 25") && error.contains("MiB, over the plugin's memory limit of 64 MiB: it could never run"),
        "{error}"
    );
    // Nothing but pii-leak was compiled.
    assert_eq!(cached_artefacts(cache.path()).len(), 1);

    // With a memory limit that fits, the big-memory plugin loads and runs.
    let mut engine = start_with_memory_limit(cache.path(), d, "big-memory", 320);
    let r = evaluate(&mut engine, &refund_trace(), &json!([plugin("m", "big-memory", json!({}))]));
    check(&r[0], "pass", 1.0, &["big-memory read 0"]);
}

#[test]
fn result_floods_are_counted_before_copying_and_logs_are_budgeted() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_with_memory_limit(cache.path(), dir.path(), "flood", 256);
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([
            plugin("many", "flood", json!({"results": 600_000})),
            builtin("b", "contains", "refund")
        ]),
    );
    check_fault(&r[0], "flood", "returned 600000 results for 1 configs");
    check(&r[1], "pass", 1.0, &[]);

    // Two calls of 20,000 lines each: each keeps 100 lines and reports the rest.
    let line = "x".repeat(500);
    for _ in 0..2 {
        let r = evaluate(
            &mut engine,
            &refund_trace(),
            &json!([plugin("logs", "flood", json!({"log_lines": 20_000, "line_bytes": 500}))]),
        );
        check(&r[0], "pass", 1.0, &["wrote 20000 log lines"]);
    }
    // Each call's warning follows its kept lines, so both calls' lines are
    // in once both warnings are.
    assert!(engine.stderr_shows_lines("were dropped", 2), "{}", engine.stderr_text());
    let log = engine.stderr_text();
    let kept = log.lines().filter(|l| l.contains(&line)).count();
    assert_eq!(kept, 2 * 100, "log lines kept from two calls");
    let dropped: Vec<&str> = log.lines().filter(|l| l.contains("were dropped")).collect();
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert!(dropped.iter().all(|l| l.contains("\"dropped\":19900")), "{dropped:?}");
}

/// Peak memory an engine grows by while 8 concurrent `flood` calls each
/// build one line of `line_bytes` in the plugin and log it `lines` times.
fn flood_growth_mib(lines: u64, line_bytes: u64) -> u64 {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_with_memory_limit(cache.path(), dir.path(), "flood", 256);
    // Warm: the plugin is compiled and one instance has run.
    evaluate(&mut engine, &refund_trace(), &json!([plugin("warm", "flood", json!({}))]));
    let base = engine.proc_status_kb("VmHWM");
    let calls = 8;
    for i in 0..calls {
        let config = json!({"log_lines": lines, "line_bytes": line_bytes});
        engine.send(&evaluate_request(json!(i), refund_trace(), json!([plugin("p", "flood", config)])));
    }
    for _ in 0..calls {
        let resp = engine.recv();
        assert_eq!(resp["result"]["results"][0]["status"], "pass", "{resp}");
    }
    (engine.proc_status_kb("VmHWM") - base) / 1024
}

#[test]
fn a_log_flood_of_huge_lines_is_clipped_before_it_is_copied() {
    // The same plugins build the same 40 MiB lines; one set logs each of
    // them three times. Logging must cost the host no copy of the lines.
    let line_bytes = 40 << 20;
    let quiet = flood_growth_mib(0, line_bytes);
    let loud = flood_growth_mib(3, line_bytes);
    // One host copy of one line per call would add 8 × 40 = 320 MiB; the
    // peak also moves with how many of the 8 calls happen to overlap (up to
    // 77 MiB seen on a loaded 2-core machine), so 128 MiB of slack tells a
    // copy from that noise.
    assert!(
        loud <= quiet + 128,
        "logging 8 × 3 lines of 40 MiB grew peak memory by {loud} MiB, against {quiet} MiB for building them"
    );
}

#[test]
fn slow_plugin_requests_leave_slots_for_plain_requests() {
    // Every general slot is taken by a spinning plugin request; a plain
    // request sent after them is answered before any of them.
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let config = slow_spin_config(dir.path(), "3s");
    let mut engine = start(cache.path(), &["--config", &config, "--max-concurrent-requests", "8"]);
    let spins = 8;
    for i in 0..spins {
        engine.send(&evaluate_request(
            json!(format!("spin{i}")),
            refund_trace(),
            json!([plugin("p", "spin", json!({}))]),
        ));
    }
    std::thread::sleep(Duration::from_millis(300));
    engine.send(&evaluate_request(json!("plain"), refund_trace(), refund_assertions()));
    let mut order = Vec::new();
    for _ in 0..spins + 1 {
        let line = engine.recv_bytes_within(Duration::from_secs(60));
        let resp: Value = serde_json::from_slice(&line).unwrap();
        order.push(resp["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(order[0], "plain", "the plain request waited for the plugin requests: {order:?}");
}

#[test]
fn slow_describe_calls_load_side_by_side() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for i in 0..6 {
        std::fs::copy(wasm("slow-describe"), plugins.join(format!("slow-{i}.wasm"))).unwrap();
    }
    let config = write_config(dir.path(), "plugin_dir = 'plugins'\n\n[plugin_defaults]\ntimeout = '2s'\n");
    let started = Instant::now();
    let mut engine = start(cache.path(), &["--config", &config]);
    let elapsed = started.elapsed();
    let listing = list_plugins(&mut engine);
    assert_eq!(listing["failed"].as_array().unwrap().len(), 6, "{listing}");
    assert!(failure(&listing, "slow-0.wasm").contains("describe() failed: the plugin timed out after 2000 ms"));
    // One after another they would take 6 x 2 s.
    assert!(
        elapsed < Duration::from_secs(10),
        "six slow describe calls delayed the start by {elapsed:?}"
    );
}

// ---------------------------------------------------------------- contract versions

/// A component built against `attest:plugin@0.1.0` before the contract was
/// frozen in `wit/since_v0.1.0/` (the `noop` bench plugin).
const V0_1_0_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/plugins/v0_1_0-noop.wasm");

#[test]
fn a_plugin_built_against_0_1_0_still_loads_and_evaluates() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &["--plugin", V0_1_0_FIXTURE]);
    let listing = list_plugins(&mut engine);
    assert_eq!(listed_ids(&listing), ["noop"], "{listing}");
    assert_eq!(listed(&listing, "noop")["api_version"], json!("0.1.0"));
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([plugin("n", "noop", json!({})), builtin("b", "contains", "refund")]),
    );
    check(&r[0], "pass", 1.0, &["noop"]);
    check(&r[1], "pass", 1.0, &[]);
    let out = run_with(cache.path(), &["plugin", "check", V0_1_0_FIXTURE]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("api version:  attest:plugin@0.1.0"), "{stdout}");
}

/// The JavaScript plugin (componentize-js, `plugins/js/`), built against
/// 0.2.0 like the Rust ones, passes and fails where it should.
#[test]
fn the_javascript_plugin_passes_and_fails_where_it_should() {
    let cache = warm_shared_cache();
    let mut engine = start(cache, &["--plugin", &wasm("readability"), "--plugin", V0_1_0_FIXTURE]);
    let listing = list_plugins(&mut engine);
    let js = listed(&listing, "readability");
    assert_eq!(js["api_version"], json!(API), "{js}");
    assert_eq!(js["capabilities"]["requested"], json!([]), "{js}");
    let r = evaluate(
        &mut engine,
        &with_message("Your refund is on its way. It takes three days."),
        &json!([
            plugin("plain", "readability", json!({})),
            plugin("strict", "readability", json!({"max_grade": 0})),
            plugin("missing", "readability", json!({"target": "output.nope"})),
            plugin("old", "noop", json!({})),
        ]),
    );
    check(&r[0], "pass", 1.0, &["output.message reads at grade", "within the maximum grade 8"]);
    assert_eq!(r[0]["layer"], 8);
    let dense = evaluate(
        &mut engine,
        &with_message("Notwithstanding contractual considerations, reimbursement eligibility necessitates documentation."),
        &json!([plugin("dense", "readability", json!({}))]),
    );
    assert_eq!(dense[0]["status"], "hard_fail", "{}", dense[0]);
    assert!(
        dense[0]["explanation"].as_str().unwrap().contains("above the maximum grade 8"),
        "{}",
        dense[0]
    );
    assert_eq!(dense[0]["expected"], "grade ≤ 8", "details became evidence: {}", dense[0]);
    assert_eq!(r[2]["status"], "hard_fail", "{}", r[2]);
    assert!(
        r[2]["explanation"].as_str().unwrap().contains("output.nope could not be checked"),
        "{}",
        r[2]
    );
    check(&r[3], "pass", 1.0, &["noop"]);
    // The schema's pattern guards the path grammar the JS plugin reads: a 1002 before it runs.
    expect_error(
        &engine.request(&evaluate_request(
            json!("bad"),
            refund_trace(),
            json!([plugin("bad", "readability", json!({"target": "steps[?name=='x']"}))]),
        )),
        1002,
    );
}

// ---------------------------------------------------------------- plugin test

#[test]
fn plugin_test_runs_one_plugin_on_a_trace_and_prints_its_verdict() {
    let cache = fresh_cache();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, v: &Value| {
        let path = dir.path().join(name);
        std::fs::write(&path, v.to_string()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let clean = write("clean.json", &with_message("Your refund is on its way."));
    let leaky = write("leaky.json", &leaky_trace());
    let config = write("config.json", &json!({"target": "output.message"}));

    // A pass: exit 0, the verdict with its details and duration.
    let out = run_with(
        cache.path(),
        &["plugin", "test", &wasm("pii-leak"), "--trace", &clean, "--plugin-config", &config],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("plugin-test  pass"), "{stdout}");
    assert!(stdout.contains("    details  {"), "{stdout}");
    assert!(stdout.contains("    took     "), "{stdout}");
    // The first run compiles, and says so while the person waits.
    assert!(
        stderr.contains("attest-engine plugin test: compiling the plugin (") && stderr.contains("attest-engine plugin test: compiled in "),
        "{stderr}"
    );

    // A hard failure: exit 1; JSON output is the eval command's.
    let out = run_with(
        cache.path(),
        &[
            "plugin",
            "test",
            &wasm("pii-leak"),
            "--trace",
            &leaky,
            "--plugin-config-json",
            "{}",
            "--format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("compiling"),
        "the compiled copy is used: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let result = &printed[0]["results"][0];
    assert_eq!(result["status"], json!("hard_fail"), "{printed}");
    assert_eq!(
        (result["layer"].as_u64(), result["type"].as_str()),
        (Some(8), Some("plugin")),
        "{printed}"
    );

    // A config the plugin's schema refuses: 1002 naming the field, exit 2.
    let out = run_with(
        cache.path(),
        &[
            "plugin",
            "test",
            &wasm("tool-args"),
            "--trace",
            &clean,
            "--plugin-config-json",
            r#"{"bogus": 1}"#,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("error 1002") && stdout.contains("'bogus' was unexpected"),
        "{stdout}"
    );

    // Inputs that are not JSON, and a file that is not a plugin.
    let out = run_with(
        cache.path(),
        &["plugin", "test", &wasm("pii-leak"), "--trace", &clean, "--plugin-config-json", "{"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plugin-config-json is not valid JSON"));
    let out = run_with(cache.path(), &["plugin", "test", &clean, "--trace", &clean]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The inputs are read before the plugin loads: a missing trace is named
    // at once, even for a plugin whose describe() never answers.
    let missing = dir.path().join("nope.json");
    let started = Instant::now();
    let out = run_with(
        cache.path(),
        &["plugin", "test", &wasm("slow-describe"), "--trace", missing.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot read trace file") && stderr.contains("nope.json"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "[]").unwrap();
    let out = run_with(
        cache.path(),
        &["plugin", "test", &wasm("pii-leak"), "--trace", empty.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no trace"));

    // Devices and pipes report no size; reads stop at the caps.
    let out = run_with(cache.path(), &["plugin", "check", "/dev/zero"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("the component is larger than the limit of 67108864 bytes (64 MiB)"),
        "{stdout}"
    );
    let out = run_with(
        cache.path(),
        &[
            "plugin",
            "test",
            &wasm("pii-leak"),
            "--trace",
            &clean,
            "--plugin-config",
            "/dev/zero",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("plugin config file (--plugin-config) /dev/zero is larger than 1 MiB"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------- config schema semantics

#[test]
fn a_bad_target_in_a_plugin_config_is_refused_at_compile_time_with_its_field() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak", "step-value"]));
    // `"format": "attest-target"` in the plugin's schema marks the field.
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(1),
            refund_trace(),
            json!([
                builtin("b", "contains", "refund"),
                plugin("p", "pii-leak", json!({"target": "steps[0"}))
            ]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[1].spec.config.target"), "{err}");
    assert_eq!(err["data"]["assertion_id"], json!("p"), "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("config for plugin 'pii-leak': target is not a valid target"),
        "{message}"
    );
    assert!(err["data"]["detail"].as_str().unwrap().contains("steps["), "{err}");
    let err = expect_error(
        &engine.request(&evaluate_request(
            json!(2),
            refund_trace(),
            json!([plugin(
                "s",
                "step-value",
                json!({"left": "output.message", "right": "steps[?name=='x'"})
            )]),
        )),
        1002,
    );
    assert_eq!(err["data"]["field"], json!("params.assertions[0].spec.config.right"), "{err}");
    // Valid targets still evaluate.
    let r = evaluate(
        &mut engine,
        &refund_trace(),
        &json!([plugin("p", "pii-leak", json!({"target": "output.message"}))]),
    );
    check(&r[0], "pass", 1.0, &[]);
}

#[test]
fn configs_with_schema_defaults_filled_in_evaluate_as_documented() {
    // The engine fills pii-leak's schema defaults (`target`: output.message,
    // `kinds`: email, phone, card) into the config it passes; the filling
    // itself is unit-tested in crates/attest-plugin-host/src/config.rs. The plugin's
    // details echo the config it ran with.
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["pii-leak"]));
    let r = evaluate(
        &mut engine,
        &leaky_trace(),
        &json!([plugin("p", "pii-leak", json!({"kinds": ["email"]}))]),
    );
    assert_eq!(r[0]["status"], json!("hard_fail"), "{}", r[0]);
    assert_eq!(r[0]["details"]["target"], json!("output.message"), "{}", r[0]);
    assert_eq!(r[0]["details"]["kinds"], json!(["email"]), "{}", r[0]);
    let r = evaluate(&mut engine, &refund_trace(), &json!([plugin("q", "pii-leak", json!({}))]));
    assert_eq!(r[0]["details"]["kinds"], json!(["email", "phone", "card"]), "{}", r[0]);
}

#[test]
fn a_trace_that_repeats_a_member_reads_alike_in_plugins_and_builtin_checks() {
    let cache = fresh_cache();
    let mut engine = start(cache.path(), &plugin_flags(&["contains", "tool-args"]));
    // JSON allows a repeated member; every check reads its last value.
    let trace = r#"{"schema_version":1,"trace_id":"dup","trace_id":"trc_dup","output":{"message":"no","message":"Your refund is processed."},"steps":[{"type":"tool_call","name":"other","name":"process_refund","args":{"order_id":"X"},"args":{"order_id":"ORD-1"},"result":{}}]}"#;
    let assertions = json!([
        builtin("b", "contains", "refund"),
        plugin("p", "contains", json!({"target": "output.message", "value": "refund"})),
        plugin(
            "t",
            "tool-args",
            json!({"tool": "process_refund", "expect": {"order_id": {"equals": "ORD-1"}}})
        ),
    ]);
    let line =
        format!(r#"{{"jsonrpc":"2.0","id":"dup","method":"evaluate_batch","params":{{"trace":{trace},"assertions":{assertions}}}}}"#);
    engine.send_line(&line);
    let results = check_batch_line(&engine.recv_bytes(), &assertions);
    for r in &results {
        assert_eq!(r["status"], "pass", "{r}");
    }
}
