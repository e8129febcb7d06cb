//! Plugin benchmarks (docs/benchmarks.md), in process through the library:
//!
//! 1. per-call overhead of a trivial plugin (`noop`) on the refund trace:
//!    fresh sandboxed instance + trace hand-over + call + verdict checks,
//!    built against `attest:plugin@0.2.0` and against 0.1.0 (the fixture),
//!    and `noop-lean` (no panic hook, so no host import), interleaved in one
//!    run;
//!    then the same for the Python and JavaScript example plugins (their
//!    load, compiled and cached, and one assertion per call);
//! 2. `content.contains` as a plugin (`contains`) against the native check
//!    (and the same batch of 8 `noop` assertions, to separate the guest's work),
//!    per assertion, both inside a full `evaluate_batch` of 8 assertions;
//!    with `BENCH_COMPARE_DIST=<dir>`, also `noop` and `contains` built
//!    another way (components in `<dir>`), interleaved with these;
//! 3. one `embed` through a plugin (`embed-once`, capability path) against
//!    the same text embedded directly by the engine's providers (layer 5's
//!    path), both answered by the provider cache, so what differs is the
//!    path; needs the local model (`ATTEST_TEST_MODEL_DIR`, as the tests);
//! 4. loading every plugin in `plugins/dist` with an empty compiled cache
//!    and again with a warm one (run last);
//! 5. what one `noop` plugin assertion adds to a round trip through the
//!    `attest-engine` binary, requests sent one at a time as the SDK sends
//!    them (`BENCH_ENGINE` measures another build).
//!
//! Each figure is wall time per run, with the CPU time per run of the whole
//! process beside it. The benchmark runs on the binary's allocator
//! (mimalloc), so in-process figures are the shipped engine's.
//!
//! Needs the components: `bash plugins/build.sh` (and `plugins/python/build.sh`
//! for the Python plugin). `cargo bench --bench plugins`; `BENCH_SKIP_STARTUP=1`
//! skips part 4; `BENCH_PROFILE=noop`, `=noop-lean`, `=contains` or `=noop-batch` runs only that part, for
//! ten seconds, under a sampling profiler.

/// The allocator the `attest-engine` binary uses, so that the in-process
/// figures are the shipped engine's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use attest_engine::config::Config;
use attest_engine::plugins::capabilities::{Capability, Grants};
use attest_engine::plugins::{files_in, Plugin, PluginCall, PluginHost, PluginLimits, PluginSpec};
use attest_engine::session::Engine;
use serde_json::{json, value::RawValue, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist")
}

fn spec(name: &str) -> PluginSpec {
    at(dist().join(format!("{name}.wasm")))
}

fn at(path: PathBuf) -> PluginSpec {
    assert!(path.is_file(), "{} is missing: run plugins/build.sh", path.display());
    PluginSpec {
        path,
        limits: PluginLimits::default(),
        explicit: true,
        grants: Grants::default(),
    }
}

fn call() -> PluginCall {
    PluginCall {
        deadline: Instant::now() + Duration::from_secs(30),
        budget_left: None,
    }
}

fn main() {
    let cache = tempdir("attest-bench-cache");
    let host = PluginHost::load(&[spec("noop"), spec("noop-lean"), spec("contains")], Some(cache.clone()));
    assert!(host.failures().is_empty(), "{:?}", host.failures());
    let trace = refund_trace().to_string();

    // 1. Per-call overhead, 0.2.0 and 0.1.0 (the same plugin id: two hosts).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/plugins/v0_1_0-noop.wasm");
    let old_host = PluginHost::load(&[at(fixture)], Some(cache.clone()));
    let old = old_host.get("noop").expect("the 0.1.0 noop loaded");
    assert_eq!(old.api_version, "0.1.0");
    let noop = host.get("noop").expect("noop loaded");
    assert_eq!(noop.api_version, "0.2.0");
    let lean = host.get("noop-lean").expect("noop-lean loaded");
    let one = ["{}"];
    if profiling("noop") {
        spin_for_profiler(&mut || {
            noop.evaluate(&trace, &one, &call());
        });
    }
    if profiling("noop-lean") {
        spin_for_profiler(&mut || {
            lean.evaluate(&trace, &one, &call());
        });
    }
    // A profiled part runs alone: the parts before it are skipped, so that
    // their calls (the 0.1.0 fixture's memory growth, say) are not in its profile.
    if profiled_part().is_none() {
        per_call_overhead(&trace, &one, noop, old, lean);
    }

    // 2. contains: plugin vs native, inside evaluate_batch.
    let engine = std::sync::Arc::new(Engine::with_plugins(Config::default(), host));
    let words = [
        "refund",
        "processed",
        "business days",
        "RFD-001",
        "89.99",
        "Refund ID",
        "3 business",
        "order",
    ];
    let native: Vec<Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| json!({"assertion_id": format!("n{i}"), "type": "content", "spec": {"target": "output.message", "check": "contains", "value": w}}))
        .collect();
    let plugin: Vec<Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| json!({"assertion_id": format!("p{i}"), "type": "plugin", "spec": {"plugin_id": "contains", "config": {"target": "output.message", "value": w}}}))
        .collect();
    let batch =
        |assertions: &Vec<Value>| RawValue::from_string(json!({"trace": refund_trace(), "assertions": assertions}).to_string()).unwrap();
    let (native_req, plugin_req) = (batch(&native), batch(&plugin));
    let run = |req: &RawValue| evaluate_passing(&engine, req);
    if profiling("contains") {
        spin_for_profiler(&mut || run(&plugin_req));
    }
    // The same batch shape with a plugin that does nothing: what the batch
    // and one plugin call cost around the guest's own work.
    let noop8: Vec<Value> = (0..8)
        .map(|i| json!({"assertion_id": format!("z{i}"), "type": "plugin", "spec": {"plugin_id": "noop"}}))
        .collect();
    let noop_req = batch(&noop8);
    if profiling("noop-batch") {
        spin_for_profiler(&mut || run(&noop_req));
    }
    let [t_native, t_plugin, t_noop] = rounds([&mut || run(&native_req), &mut || run(&plugin_req), &mut || run(&noop_req)]);
    println!(
        "evaluate_batch of 8 contains assertions: native {t_native} ({:.2} µs per assertion), plugin {t_plugin} ({:.2} µs per assertion): {:.2}x (median of per-round ratios {:.2}x)",
        t_native.median / 8.0,
        t_plugin.median / 8.0,
        t_plugin.median / t_native.median,
        median(t_native.rounds.iter().zip(&t_plugin.rounds).map(|(n, p)| p / n).collect()),
    );
    println!("evaluate_batch of 8 noop plugin assertions (no guest work): {t_noop}");

    // 2b. Another build of the same plugins, interleaved with these.
    if let Some(other) = std::env::var_os("BENCH_COMPARE_DIST") {
        compare_builds(Path::new(&other), &cache, &trace, &one, &engine, [&native_req, &plugin_req]);
    }

    // 3. One embed: through a plugin against the engine's own path.
    match std::env::var_os("ATTEST_TEST_MODEL_DIR") {
        Some(model) => embed_overhead(PathBuf::from(model), &cache),
        None => println!("embed through a plugin: skipped (set ATTEST_TEST_MODEL_DIR to the local model's directory)"),
    }

    // 5. The round trip through the binary, as the SDK sees it.
    if profiled_part().is_none() {
        round_trips();
    }

    if std::env::var_os("BENCH_SKIP_STARTUP").is_some() {
        return;
    }
    // 4. Start-up: every component in plugins/dist, uncached then cached.
    let specs: Vec<PluginSpec> = files_in(&dist())
        .expect("plugins/dist")
        .into_iter()
        .map(|path| PluginSpec {
            explicit: false,
            ..at(path)
        })
        .collect();
    let cold_dir = tempdir("attest-bench-cold");
    let t0 = Instant::now();
    let cold = PluginHost::load(&specs, Some(cold_dir.clone()));
    let uncached = t0.elapsed();
    let t0 = Instant::now();
    let warm = PluginHost::load(&specs, Some(cold_dir.clone()));
    let cached = t0.elapsed();
    println!(
        "loading {} plugin files ({} load, {} refused): uncached {:.0} ms, cached {:.1} ms",
        specs.len(),
        warm.ids().len(),
        warm.failures().len(),
        uncached.as_secs_f64() * 1000.0,
        cached.as_secs_f64() * 1000.0
    );
    drop(cold);
    let _ = std::fs::remove_dir_all(&cold_dir);
    let _ = std::fs::remove_dir_all(&cache);
}

/// Part 1: a trivial plugin's call, 0.2.0 against 0.1.0 and `noop-lean`,
/// interleaved; then the other guest languages.
fn per_call_overhead(trace: &str, one: &[&str], noop: &Plugin, old: &Plugin, lean: &Plugin) {
    let eight = ["{}"; 8];
    let [per_call, per_call_old, per_call8, per_call_lean] = rounds([
        &mut || {
            let (out, _) = noop.evaluate(trace, one, &call());
            assert!(out[0].passed);
        },
        &mut || {
            let (out, _) = old.evaluate(trace, one, &call());
            assert!(out[0].passed);
        },
        &mut || {
            let (out, _) = noop.evaluate(trace, &eight, &call());
            assert_eq!(out.len(), 8);
        },
        &mut || {
            let (out, _) = lean.evaluate(trace, one, &call());
            assert!(out[0].passed);
        },
    ]);
    println!("noop plugin (attest:plugin@0.2.0), one assertion per call: {per_call}");
    println!(
        "noop plugin (attest:plugin@0.1.0), one assertion per call: {per_call_old}; 0.2.0/0.1.0 {:.3} (median of per-round ratios)",
        median(per_call.rounds.iter().zip(&per_call_old.rounds).map(|(n, o)| n / o).collect())
    );
    println!("noop plugin (attest:plugin@0.2.0), eight assertions per call: {per_call8}");
    println!(
        "noop-lean plugin (no host import: one core instance), one assertion per call: {per_call_lean}; noop-lean/noop {:.3} (median of per-round ratios)",
        median(per_call_lean.rounds.iter().zip(&per_call.rounds).map(|(l, n)| l / n).collect())
    );

    // 1b. The same trace through each guest language: load (compiled, then
    // cached) and one assertion per call.
    guest_languages(trace, per_call.median);
}

/// One `evaluate_batch` of `req` on `engine`, every assertion of which must pass.
fn evaluate_passing(engine: &std::sync::Arc<Engine>, req: &RawValue) {
    // Free checks never wait, so the future completes on its first poll.
    let r = futures_util::FutureExt::now_or_never(attest_engine::batch::evaluate(
        engine,
        Some(req),
        Instant::now() + Duration::from_secs(30),
        usize::MAX,
        // Plugin calls run right here: the benchmark measures the call, not a thread hand-off.
        &mut attest_engine::lane::Lane::on_own_thread(),
    ))
    .expect("free checks never wait")
    .expect("batch evaluates");
    assert!(
        r.results.iter().all(|a| a.status == attest_engine::layers::Status::Pass),
        "{:?}",
        r.results
    );
}

/// Part 2b (`BENCH_COMPARE_DIST`): `noop` and `contains` from another
/// directory of components (the same plugins built another way, say),
/// interleaved with the ones in `plugins/dist`: a `noop` call, and the
/// `contains` batch against the native one, for each build.
fn compare_builds(
    other: &Path,
    cache: &Path,
    trace: &str,
    one: &[&str],
    engine: &std::sync::Arc<Engine>,
    [native_req, plugin_req]: [&RawValue; 2],
) {
    let host = PluginHost::load(
        &[at(other.join("noop.wasm")), at(other.join("contains.wasm"))],
        Some(cache.to_owned()),
    );
    assert!(host.failures().is_empty(), "{:?}", host.failures());
    let other_engine = std::sync::Arc::new(Engine::with_plugins(Config::default(), host));
    let (noop, other_noop) = (engine.plugins.get("noop").unwrap(), other_engine.plugins.get("noop").unwrap());
    let [t_noop, t_other_noop, t_native, t_plugin, t_other_plugin] = rounds([
        &mut || assert!(noop.evaluate(trace, one, &call()).0[0].passed),
        &mut || assert!(other_noop.evaluate(trace, one, &call()).0[0].passed),
        &mut || evaluate_passing(engine, native_req),
        &mut || evaluate_passing(engine, plugin_req),
        &mut || evaluate_passing(&other_engine, plugin_req),
    ]);
    let ratio = |a: &Timing, b: &Timing| median(a.rounds.iter().zip(&b.rounds).map(|(a, b)| a / b).collect());
    println!("compared with {}:", other.display());
    println!(
        "  noop, one assertion per call: this build {t_noop}, that build {t_other_noop}: {:.3}",
        ratio(&t_other_noop, &t_noop)
    );
    println!(
        "  contains batch against native {t_native}: this build {t_plugin} ({:.2}x), that build {t_other_plugin} ({:.2}x)",
        ratio(&t_plugin, &t_native),
        ratio(&t_other_plugin, &t_native)
    );
}

/// Part 5: requests sent one at a time through the `attest-engine` binary,
/// each awaited before the next, as the SDK sends them: a batch of one
/// native `content.contains` assertion and a batch of one `noop` plugin
/// assertion, alternating. What the plugin assertion adds to a round trip
/// is the difference. `BENCH_ENGINE` measures another build of the engine
/// (an earlier commit's, say) with the same requests.
fn round_trips() {
    use std::io::{BufRead, BufReader, Write};
    const REQUESTS: usize = 4_000;
    let engine = std::env::var("BENCH_ENGINE").unwrap_or_else(|_| env!("CARGO_BIN_EXE_attest-engine").to_owned());
    let cache = tempdir("attest-bench-round-trips");
    let noop = dist().join("noop.wasm");
    let mut child = std::process::Command::new(&engine)
        .args(["--log-level=warn", "--no-history", "--plugin"])
        .arg(&noop)
        .env("ATTEST_CACHE_DIR", &cache)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn attest-engine");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut ask = |request: &Value| {
        let t0 = Instant::now();
        writeln!(stdin, "{request}").and_then(|()| stdin.flush()).expect("write a request");
        line.clear();
        stdout.read_line(&mut line).expect("read an answer");
        let elapsed = t0.elapsed().as_secs_f64() * 1e6;
        assert!(line.contains(r#""result""#), "{line}");
        assert!(!line.contains(r#""status":"#) || line.contains(r#""status":"pass""#), "{line}");
        elapsed
    };
    ask(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "sdk_name": "bench", "sdk_version": "0", "protocol_version": 1,
        "required_capabilities": ["layers_1_4"], "preferred_encoding": "json"}}));
    let batch = |id: usize, assertion: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "evaluate_batch",
               "params": {"trace": refund_trace(), "assertions": [assertion]}})
    };
    let native =
        json!({"assertion_id": "n", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "refund"}});
    let plugin = json!({"assertion_id": "p", "type": "plugin", "spec": {"plugin_id": "noop"}});
    let (mut t_native, mut t_plugin) = (Vec::new(), Vec::new());
    for i in 0..2 * REQUESTS {
        let (assertion, times) = if i % 2 == 0 {
            (&native, &mut t_native)
        } else {
            (&plugin, &mut t_plugin)
        };
        let t = ask(&batch(i + 1, assertion.clone()));
        // The first tenth warms up.
        if i >= REQUESTS / 5 {
            times.push(t);
        }
    }
    drop(stdin);
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&cache);
    let timed = t_native.len();
    let (native, plugin) = (median(t_native), median(t_plugin));
    println!(
        "round trip through the binary, one request at a time: one native contains assertion {native:.1} µs, one noop plugin assertion {plugin:.1} µs (medians of {timed} each): the plugin assertion adds {:.1} µs",
        plugin - native
    );
}

/// Part 1b: the Python (`json-output-keys`, componentize-py) and JavaScript
/// (`readability`, componentize-js) plugins against the Rust `noop`.
fn guest_languages(trace: &str, rust_noop_us: f64) {
    let plugins = [
        ("json-output-keys", "Python", r#"{"required_keys": ["refund_id"]}"#),
        ("readability", "JavaScript", r#"{"target": "output.message", "max_grade": 12}"#),
    ];
    for (name, lang, config) in plugins {
        let path = dist().join(format!("{name}.wasm"));
        if !path.is_file() {
            println!("{lang} plugin {name}: skipped ({} is not built)", path.display());
            continue;
        }
        let dir = tempdir(&format!("attest-bench-{name}"));
        let cold = PluginHost::load(&[at(path.clone())], Some(dir.clone()));
        let warm = PluginHost::load(&[at(path)], Some(dir.clone()));
        let (Some(c), Some(p)) = (
            cold.ids().first().and_then(|id| cold.get(id)),
            warm.ids().first().and_then(|id| warm.get(id)),
        ) else {
            println!("{lang} plugin {name}: not loaded: {:?}", warm.failures());
            continue;
        };
        let configs = [config];
        let [t] = rounds_of(
            50,
            [&mut || {
                let (out, _) = p.evaluate(trace, &configs, &call());
                assert!(out[0].passed, "{}", out[0].explanation);
            }],
        );
        println!(
            "{lang} plugin {name} (attest:plugin@{}): load {:.0} ms compiled, {:.1} ms cached; one assertion per call {t}: {:.0}x the Rust noop",
            p.api_version,
            c.load_ms,
            p.load_ms,
            t.median / rust_noop_us
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Part 3: `embed-once` (one `models.embed` of `output.message`) against
/// `Providers::embed` of the same text, both answered by the provider cache.
fn embed_overhead(model: PathBuf, cache: &Path) {
    let mut config = Config::default();
    config.providers.embedding = attest_engine::providers::config::EmbeddingSource::Local { dir: model };
    config.providers.cache_path = Some(cache.join("providers.sqlite3"));
    let mut spec = spec("embed-once");
    spec.grants.capabilities.push(Capability::Embed);
    let host = PluginHost::load(&[spec], Some(cache.to_owned()));
    let engine = Engine::with_plugins(config, host);
    let plugin = engine.plugins.get("embed-once").expect("embed-once loaded");
    let trace = refund_trace().to_string();
    let text = refund_trace()["output"]["message"].as_str().unwrap().to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let one = ["{}"];
    let [through_plugin, direct] = rounds_of(
        200,
        [
            &mut || {
                let (out, used) = plugin.evaluate(&trace, &one, &call());
                assert!(out[0].passed, "{}", out[0].explanation);
                assert_eq!(used.calls.len(), 1);
            },
            &mut || {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                let e = runtime.block_on(engine.providers.embed(&[text.as_str()], None, deadline)).unwrap();
                assert_eq!(e.cached, 1);
            },
        ],
    );
    println!(
        "one embed of output.message, provider cache warm: through a plugin {through_plugin}, the engine's own path {direct}: {:.1} µs more per call",
        through_plugin.median - direct.median
    );
}

/// Rounds per measurement, and runs per round.
const ROUNDS: usize = 11;
const RUNS_PER_ROUND: u32 = 2_000;

/// Per-run times in µs: one mean per round, and their median; and the
/// median CPU time per run over every thread of the process, where Linux
/// tells it (work moved to another thread shows there, not in the wall time).
struct Timing {
    rounds: Vec<f64>,
    median: f64,
    cpu: Option<f64>,
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (lo, hi) = self.rounds.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        write!(f, "{:.1} µs (median of {ROUNDS} rounds; {lo:.1}–{hi:.1}", self.median)?;
        match self.cpu {
            Some(cpu) => write!(f, "; CPU {cpu:.1} µs per run, all threads)"),
            None => write!(f, ")"),
        }
    }
}

/// CPU time the whole process has used, in ns: the sum over its threads of
/// their time on a CPU (`/proc/self/task/*/schedstat`); `None` off Linux.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Times each workload in interleaved rounds (A, B, A, B, …), so that a noisy
/// stretch on a shared machine hits every workload alike; reports medians.
fn rounds<const N: usize>(work: [&mut dyn FnMut(); N]) -> [Timing; N] {
    rounds_of(RUNS_PER_ROUND, work)
}

/// The parts `BENCH_PROFILE` can name.
const PROFILED_PARTS: [&str; 4] = ["noop", "noop-lean", "contains", "noop-batch"];
/// How long a profiled part runs.
const PROFILE_FOR: Duration = Duration::from_secs(10);

/// The part `BENCH_PROFILE` names, if any; an unknown name stops the
/// benchmark with the valid ones rather than running a partial benchmark.
fn profiled_part() -> Option<String> {
    let part = std::env::var("BENCH_PROFILE").ok()?;
    assert!(
        PROFILED_PARTS.contains(&part.as_str()),
        "BENCH_PROFILE={part} names no part; use one of {}",
        PROFILED_PARTS.join(", ")
    );
    Some(part)
}

/// Whether `BENCH_PROFILE` names this part: it then runs alone, long enough
/// for a sampling profiler (`perf record`), and the benchmark exits.
fn profiling(part: &str) -> bool {
    profiled_part().is_some_and(|p| p == part)
}

fn spin_for_profiler(work: &mut dyn FnMut()) -> ! {
    let t0 = Instant::now();
    let mut runs = 0u64;
    while t0.elapsed() < PROFILE_FOR {
        work();
        runs += 1;
    }
    let elapsed = t0.elapsed();
    println!(
        "{runs} runs in {:.1} s: {:.2} µs each",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / runs as f64
    );
    std::process::exit(0)
}

/// [`rounds`] with `runs` runs per round.
fn rounds_of<const N: usize>(runs: u32, mut work: [&mut dyn FnMut(); N]) -> [Timing; N] {
    for w in work.iter_mut() {
        for _ in 0..runs {
            w();
        }
    }
    let mut per: [(Vec<f64>, Vec<f64>); N] = std::array::from_fn(|_| (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS)));
    for _ in 0..ROUNDS {
        for (w, (times, cpu)) in work.iter_mut().zip(per.iter_mut()) {
            let cpu0 = process_cpu_ns();
            let t0 = Instant::now();
            for _ in 0..runs {
                w();
            }
            times.push(t0.elapsed().as_secs_f64() * 1e6 / f64::from(runs));
            if let (Some(a), Some(b)) = (cpu0, process_cpu_ns()) {
                cpu.push(b.saturating_sub(a) as f64 / 1e3 / f64::from(runs));
            }
        }
    }
    per.map(|(rounds, cpu)| Timing {
        median: median(rounds.clone()),
        rounds,
        cpu: (cpu.len() == ROUNDS).then(|| median(cpu)),
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn refund_trace() -> Value {
    json!({
        "schema_version": 1, "trace_id": "trc_bench", "agent_id": "customer-service-agent",
        "input": {"user_message": "I want a refund for order ORD-123", "context": {}},
        "steps": [
            {"type": "llm_call", "name": "reasoning", "args": {"model": "gpt-4.1"}, "result": {"completion": "I need to look up the order."}},
            {"type": "tool_call", "name": "lookup_order", "args": {"order_id": "ORD-123"}, "result": {"status": "delivered", "amount": 89.99}},
            {"type": "tool_call", "name": "process_refund", "args": {"order_id": "ORD-123", "amount": 89.99}, "result": {"refund_id": "RFD-001"}}
        ],
        "output": {"message": "Your refund of $89.99 has been processed. You'll see it in 3 business days. Refund ID: RFD-001. Your order is closed.",
                   "structured": {"refund_id": "RFD-001", "confidence": 0.95}},
        "metadata": {"total_tokens": 1350, "cost_usd": 0.0067, "latency_ms": 4200}
    })
}
