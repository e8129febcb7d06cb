//! Layers 5 and 6 benchmarks (`cargo bench --bench providers`):
//!
//! 1. **Local embeddings per second**: the in-process all-MiniLM-L6-v2 model
//!    on distinct sentences, one text per call, two per call (what an
//!    `embedding` assertion asks: target and reference), and 32 per call.
//!    Needs the model directory in `ATTEST_BENCH_MODEL_DIR` (or
//!    `ATTEST_TEST_MODEL_DIR`, which scripts/test sets up); skipped without it.
//! 2. **Judge throughput**: `evaluate_batch` requests with one `llm_judge`
//!    assertion each, pipelined through the release binary with 64 requests
//!    in flight, against a fake OpenAI-compatible judge on loopback that
//!    answers after a fixed latency. Every output is distinct and the cache
//!    is off, so every assertion is a real HTTP call. The ideal is
//!    64 / latency requests per second; the table shows how close the engine
//!    gets, and its own overhead with a zero-latency judge.

use attest_engine::providers::local::LocalModel;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

fn main() {
    local_embeddings();
    judge_throughput();
}

fn local_embeddings() {
    let Some(dir) = std::env::var_os("ATTEST_BENCH_MODEL_DIR").or_else(|| std::env::var_os("ATTEST_TEST_MODEL_DIR")) else {
        println!("local embeddings: skipped (set ATTEST_BENCH_MODEL_DIR to a model directory)");
        return;
    };
    let t0 = Instant::now();
    let model = LocalModel::load(std::path::Path::new(&dir)).expect("loading the model");
    println!("local model loaded in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    let sentences: Vec<String> = (0..256)
        .map(|i| {
            format!(
                "Your refund of ${}.{:02} for order ORD-{i} has been processed and will arrive in {} business days.",
                10 + i,
                i % 100,
                1 + i % 7
            )
        })
        .collect();
    model.embed(&[sentences[0].as_str()]).unwrap(); // warm-up
    println!("| texts per call | embeddings/s | ms per call |");
    println!("|---:|---:|---:|");
    for per_call in [1usize, 2, 32] {
        let t = Instant::now();
        let mut calls = 0;
        for chunk in sentences.chunks(per_call) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            model.embed(&refs).unwrap();
            calls += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "| {per_call} | {:.0} | {:.2} |",
            sentences.len() as f64 / secs,
            secs * 1e3 / calls as f64
        );
    }
}

struct FakeJudge {
    latency: Duration,
}

impl Respond for FakeJudge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        // The verdict goes between the tags of the nonce the engine chose.
        let text = String::from_utf8_lossy(&req.body);
        let start = text.find("<verdict-").map_or(0, |i| i + "<verdict-".len());
        let nonce: String = text[start..].chars().take_while(char::is_ascii_hexdigit).collect();
        ResponseTemplate::new(200)
            .set_body_json(json!({
                "choices": [{"message": {"content": format!("<verdict-{nonce}>{{\"score\": 0.9, \"explanation\": \"fine\"}}</verdict-{nonce}>")}}],
                "usage": {"prompt_tokens": 400, "completion_tokens": 20}
            }))
            .set_delay(self.latency)
    }
}

fn judge_throughput() {
    let n: usize = std::env::var("BENCH_JUDGE_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let engine = env!("CARGO_BIN_EXE_attest-engine");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("attest.toml");
    std::fs::write(
        &config,
        "max_concurrent_requests = 64\nhistory = false\n[providers]\nmax_concurrency = 64\ncache = false\n",
    )
    .unwrap();
    println!("\njudge throughput: {n} evaluate_batch requests x 1 llm_judge assertion, 64 in flight");
    println!("| judge latency | ideal (64 / latency) | attest-engine | of ideal |");
    println!("|---:|---:|---:|---:|");
    for latency_ms in [0u64, 20, 100] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(MockServer::start());
        rt.block_on(
            Mock::given(path("/v1/chat/completions"))
                .respond_with(FakeJudge {
                    latency: Duration::from_millis(latency_ms),
                })
                .mount(&server),
        );
        let mut child = Command::new(engine)
            .args(["--log-level=warn", "--config", config.to_str().unwrap()])
            .env("ATTEST_JUDGE_BASE_URL", format!("{}/v1", server.uri()))
            .env("ATTEST_CACHE_DIR", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning the engine");
        let mut stdin = child.stdin.take().unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"sdk_name": "bench", "sdk_version": "0", "protocol_version": 1, "required_capabilities": []}})).unwrap();
        reader.read_line(&mut line).unwrap();
        let lines: Vec<String> = (1..=n).map(|i| request(i, latency_ms)).collect();
        let start = Instant::now();
        let writer = std::thread::spawn(move || {
            for l in lines {
                stdin.write_all(l.as_bytes()).unwrap();
                stdin.write_all(b"\n").unwrap();
            }
            stdin
        });
        for _ in 0..n {
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert!(line.contains("\"pass\""), "a judge request failed: {line}");
        }
        let secs = start.elapsed().as_secs_f64();
        drop(writer.join().unwrap());
        let _ = child.wait();
        let rate = n as f64 / secs;
        let ideal = if latency_ms == 0 {
            "—".to_owned()
        } else {
            format!("{:.0} req/s", 64_000.0 / latency_ms as f64)
        };
        let of_ideal = if latency_ms == 0 {
            "—".to_owned()
        } else {
            format!("{:.0}%", rate / (64_000.0 / latency_ms as f64) * 100.0)
        };
        println!("| {latency_ms} ms | {ideal} | {rate:.0} req/s | {of_ideal} |");
    }
}

fn request(i: usize, salt: u64) -> String {
    let trace: Value = json!({
        "schema_version": 1,
        "trace_id": format!("trc_{i}"),
        "input": {"user_message": "I want a refund for order ORD-123"},
        "output": {"message": format!("Your refund {i}-{salt} has been processed.")},
    });
    json!({"jsonrpc": "2.0", "id": i, "method": "evaluate_batch", "params": {"trace": trace, "assertions": [
        {"assertion_id": "j", "type": "llm_judge", "spec": {"target": "output.message", "criteria": "confirms the refund", "rubric": "helpfulness", "threshold": 0.8, "model": null, "soft": false}}
    ]}})
    .to_string()
}
