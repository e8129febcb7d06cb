//! Throughput benchmark: a generated workload of `evaluate_batch` requests,
//! each carrying the refund trace of Attest protocol v1 §2.2 with 8 mixed layer 1–4
//! assertions, piped through the real `attest-engine` binary.
//!
//! The same workload is piped through a "floor" process that only parses each
//! line as JSON and answers `{}` (this bench binary re-executed with
//! `ATTEST_BENCH_FLOOR=1`), so the two numbers come from the same run on the
//! same machine.
//!
//! Scenarios:
//! - `1 core`: both processes pinned to one CPU with `taskset` (one stream,
//!   one core);
//! - `all cores`: no pinning;
//! - `sequential`: one request at a time, as the Python SDK's pytest plugin
//!   sends them (round-trip latency).
//!
//! `cargo bench --bench throughput` (env `BENCH_REQUESTS` sets the count,
//! `BENCH_ENGINE` another engine binary to measure).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    if std::env::var_os("ATTEST_BENCH_FLOOR").is_some() {
        floor();
        return;
    }
    let n: usize = std::env::var("BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    // BENCH_ENGINE compares another build (an earlier commit's, say) with
    // the same workload and floor.
    let engine = std::env::var("BENCH_ENGINE").unwrap_or_else(|_| env!("CARGO_BIN_EXE_attest-engine").to_owned());
    let engine = engine.as_str();
    let me = std::env::current_exe().expect("current exe");
    let workload = workload(n);
    let bytes: usize = workload.iter().map(|l| l.len() + 1).sum();
    if let Some(path) = std::env::var_os("BENCH_DUMP") {
        // For profiling: `attest-engine --log-level=warn < $BENCH_DUMP`.
        std::fs::write(&path, workload.join("\n") + "\n").expect("writing the workload");
        println!("workload written to {}", path.to_string_lossy());
        return;
    }
    println!("workload: {n} evaluate_batch requests x 8 assertions, {:.1} MB", bytes as f64 / 1e6);
    let has_taskset = Command::new("taskset").arg("--version").stdout(Stdio::null()).status().is_ok();

    let mut rows = Vec::new();
    for (label, pin) in [("1 core", true), ("all cores", false)] {
        if pin && !has_taskset {
            println!("taskset not found: skipping the 1-core scenario");
            continue;
        }
        let floor = pipelined(&cmd(me.as_os_str(), &[], pin, true), &workload).0;
        let eng = pipelined(&cmd(engine.as_ref(), &["--log-level=warn", "--no-history"], pin, false), &workload).0;
        rows.push((label, floor, eng));
    }
    // The same workload with the result history on (a fresh SQLite file):
    // until the last answer, and until the process has written every row and exited.
    let mut history_rows = Vec::new();
    for (label, pin) in [("1 core", true), ("all cores", false)] {
        if pin && !has_taskset {
            continue;
        }
        // Single runs on a shared VM vary by ±30%: alternate off and on
        // runs and compare medians.
        let (mut offs, mut ons) = (Vec::new(), Vec::new());
        for _ in 0..HISTORY_RUNS {
            offs.push(pipelined(
                &cmd(engine.as_ref(), &["--log-level=warn", "--no-history"], pin, false),
                &workload,
            ));
            let dir = std::env::temp_dir().join(format!("attest-bench-history-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let mut on_cmd = cmd(engine.as_ref(), &["--log-level=warn"], pin, false);
            on_cmd.env("ATTEST_CACHE_DIR", &dir);
            ons.push(pipelined(&on_cmd, &workload));
            let _ = std::fs::remove_dir_all(&dir);
        }
        history_rows.push((label, median(&offs), median(&ons)));
    }
    println!();
    println!("| scenario | parse-only floor (req/s) | attest-engine (req/s) | engine / floor |");
    println!("|---|---:|---:|---:|");
    for (label, floor, eng) in &rows {
        println!(
            "| {label}, pipelined | {:.0} | {:.0} | {:.0}% |",
            rate(n, *floor),
            rate(n, *eng),
            100.0 * floor.as_secs_f64() / eng.as_secs_f64()
        );
    }
    println!();
    println!("| scenario (median of {HISTORY_RUNS} alternating runs) | history off | history on | slowdown |");
    println!("|---|---:|---:|---:|");
    for (label, off, on) in &history_rows {
        for (what, a, b) in [("last answer", off.0, on.0), ("exit, every row written", off.1, on.1)] {
            println!(
                "| {label}, {n} batches, until {what} | {:.0} ms | {:.0} ms | {:+.1}% |",
                a.as_secs_f64() * 1e3,
                b.as_secs_f64() * 1e3,
                100.0 * (b.as_secs_f64() / a.as_secs_f64() - 1.0)
            );
        }
    }
    let seq_n = (n / 10).clamp(100, 2_000);
    let floor = sequential(&cmd(me.as_os_str(), &[], false, true), &workload[..seq_n + 1]);
    let eng = sequential(
        &cmd(engine.as_ref(), &["--log-level=warn", "--no-history"], false, false),
        &workload[..seq_n + 1],
    );
    println!(
        "| sequential round trip ({seq_n} requests) | {:.1} µs median | {:.1} µs median | — |",
        floor, eng
    );
}

/// Alternating history off/on runs per scenario.
const HISTORY_RUNS: usize = 9;

/// The element-wise medians of (last answer, exit) pairs.
fn median(runs: &[(Duration, Duration)]) -> (Duration, Duration) {
    let pick = |f: fn(&(Duration, Duration)) -> Duration| {
        let mut v: Vec<Duration> = runs.iter().map(f).collect();
        v.sort();
        v[v.len() / 2]
    };
    (pick(|r| r.0), pick(|r| r.1))
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// The command for one run: optionally pinned to CPU 0.
fn cmd(program: &std::ffi::OsStr, args: &[&str], pin: bool, floor: bool) -> Command {
    let mut c = if pin {
        let mut c = Command::new("taskset");
        c.arg("-c").arg("0").arg(program);
        c
    } else {
        Command::new(program)
    };
    c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    if floor {
        c.env("ATTEST_BENCH_FLOOR", "1");
    }
    c
}

/// Writes every line without waiting and reads every answer. Returns the wall
/// time until the last answer, and until the process exited after end of input.
fn pipelined(cmd: &Command, lines: &[String]) -> (Duration, Duration) {
    let mut child = clone(cmd).spawn().expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let payload: Vec<u8> = lines.iter().flat_map(|l| l.bytes().chain(std::iter::once(b'\n'))).collect();
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&payload).unwrap();
        // Keep stdin open until every answer is in, so EOF handling is not measured.
        stdin
    });
    let mut reader = BufReader::with_capacity(1 << 20, stdout);
    let mut line = String::new();
    for i in 0..lines.len() {
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains("\"result\""), "request {i} failed: {line}");
    }
    let elapsed = start.elapsed();
    drop(writer.join().unwrap());
    let _ = child.wait();
    (elapsed, start.elapsed())
}

/// One request at a time; returns the median round trip in microseconds.
fn sequential(cmd: &Command, lines: &[String]) -> f64 {
    let mut child = clone(cmd).spawn().expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut times = Vec::with_capacity(lines.len());
    for l in lines {
        let t = Instant::now();
        stdin.write_all(l.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        line.clear();
        reader.read_line(&mut line).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(stdin);
    let _ = child.wait();
    times.remove(0); // initialize
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn clone(cmd: &Command) -> Command {
    let mut c = Command::new(cmd.get_program());
    c.args(cmd.get_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c
}

/// `initialize`, then `n` evaluate_batch requests (distinct ids and trace ids).
fn workload(n: usize) -> Vec<String> {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "sdk_name": "bench", "sdk_version": "0", "protocol_version": 1,
        "required_capabilities": ["layers_1_4"], "preferred_encoding": "json"}});
    let workload: Value = serde_json::from_str(WORKLOAD).expect("refund_workload.json");
    let assertions = &workload["assertions"];
    let mut out = vec![init.to_string()];
    for i in 0..n {
        let req = json!({"jsonrpc": "2.0", "id": i + 1, "method": "evaluate_batch",
                         "params": {"trace": refund_trace(&workload, i), "assertions": assertions}});
        out.push(req.to_string());
    }
    out
}

/// The refund trace of Attest protocol v1 §2.2 and 8 mixed layer 1–4 assertions, shared
/// with `scripts/bench_collect.py`.
const WORKLOAD: &str = include_str!("refund_workload.json");

/// The workload's trace with trace id `trc_<i>`.
fn refund_trace(workload: &Value, i: usize) -> Value {
    let mut trace = workload["trace"].clone();
    trace["trace_id"] = json!(format!("trc_{i:08}"));
    trace
}

/// The floor: parse each line as JSON, answer `{}` with its id.
fn floor() {
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut reader = BufReader::with_capacity(256 * 1024, stdin);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf).unwrap() == 0 {
            break;
        }
        let v: Value = serde_json::from_slice(&buf).expect("workload lines are JSON");
        let reply = json!({"jsonrpc": "2.0", "id": v["id"], "result": {}});
        serde_json::to_writer(&mut out, &reply).unwrap();
        out.write_all(b"\n").unwrap();
        if reader.buffer().is_empty() {
            out.flush().unwrap();
        }
    }
    out.flush().unwrap();
}
