//! Output files that stop taking lines: a `--results-jsonl` or `--traces-out`
//! pipe whose reader stops reading must not stop the collector. Exports,
//! evaluation, `/metrics` and SIGTERM keep working; what could not be written
//! is counted and said, and the exit code says it too.

use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::otlp::{agent_trace, request};
use crate::support::{metric, post, Collector, Evaluator, RULES};
use prost::Message;

/// A FIFO whose reader is open and never reads, like a stalled `| consumer`.
fn stalled_fifo(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::fs::File) {
    let path = dir.join(name);
    assert!(Command::new("mkfifo").arg(&path).status().unwrap().success());
    // O_NONBLOCK: opening the read end does not wait for a writer.
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(0o4000).open(&path).unwrap();
    (path, reader)
}

#[tokio::test]
async fn a_stalled_output_pipe_neither_holds_evaluation_nor_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (results, _results_reader) = stalled_fifo(dir.path(), "results.fifo");
    let (traces, _traces_reader) = stalled_fifo(dir.path(), "traces.fifo");
    let c = Collector::start_on(
        Evaluator::product(),
        dir.path(),
        RULES,
        &[
            "--settle-ms",
            "100",
            "--results-jsonl",
            results.to_str().unwrap(),
            "--traces-out",
            traces.to_str().unwrap(),
        ],
        &[],
    );
    // 200 traces: their result lines and trace lines are several times what
    // a pipe's buffer (64 KiB) holds.
    for batch in 0..10u8 {
        let spans = (0..20u8).flat_map(|i| agent_trace(batch * 20 + i + 1, 1, "lookup_order")).collect();
        let r = post(
            &c.url,
            "/v1/traces",
            &[("content-type", "application/x-protobuf")],
            request(spans).encode_to_vec(),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    // Evaluation goes on, and /metrics answers, with both pipes full.
    let m = c.wait_metric("attest_collect_traces_evaluated_total", 200.0, 60).await;
    assert_eq!(metric(&m, "attest_collect_traces_evaluated_total"), 200.0, "{m}");
    let t0 = Instant::now();
    let mut proc = c.proc;
    proc.signal("TERM");
    // One signal: the drain's 5 s for the queued lines, not forever.
    let code = proc.wait_exit(30);
    let stderr = proc.stderr_text();
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}: {stderr}", t0.elapsed());
    assert_eq!(code, 1, "lost lines end the run with 1: {stderr}");
    for flag in ["--results-jsonl", "--traces-out"] {
        assert!(
            stderr.contains(&format!("{flag} {}", dir.path().display())) && stderr.contains("were not written"),
            "{flag}: {stderr}"
        );
    }
    assert!(stderr.contains("drained; 200 traces evaluated"), "{stderr}");
}
