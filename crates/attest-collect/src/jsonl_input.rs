//! `--jsonl`: Attest traces, one JSON object per line, for back-filling and
//! re-scoring. Lines go through the same rules, sampling and sinks as OTLP
//! traces; a progress line on stderr shows how far it got.

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::assemble::DropReason;
use crate::convert::MatchContext;
use crate::distributed::Publisher;
use crate::pipeline::Pipeline;
use crate::trace_doc::TraceDoc;

/// Longest accepted line; longer ones are counted as malformed and skipped.
pub const MAX_LINE_BYTES: usize = 64 << 20;

enum Line {
    Trace(TraceDoc),
    Malformed(String),
}

/// Evaluates (or publishes) every trace of `input`. Returns whether every
/// line was a trace that was evaluated or published: malformed lines, rule
/// evaluations that failed and publishes that failed are counted in the
/// summary and make the run fail.
pub async fn run(input: &str, pipeline: &Arc<Pipeline>, publisher: Option<Arc<Publisher>>, concurrency: usize) -> anyhow::Result<bool> {
    let reader: Box<dyn Read + Send> = if input == "-" {
        Box::new(std::io::stdin())
    } else {
        if std::path::Path::new(input).is_dir() {
            anyhow::bail!("--jsonl {input}: is a directory; give a file of traces, one JSON object per line, or - for stdin");
        }
        Box::new(std::fs::File::open(input).with_context(|| format!("--jsonl {input}: cannot be read"))?)
    };
    // An Attest trace keeps its agent id and root span name, not the spans'
    // and resource's attributes: rules that match on those never select a
    // trace read back, and are named rather than left to select nothing.
    let blind: Vec<&str> = pipeline
        .rules
        .rules
        .iter()
        .filter(|r| !r.attributes.is_empty())
        .map(|r| r.name.as_str())
        .collect();
    if !blind.is_empty() {
        tracing::warn!(
            "--jsonl: rule(s) {} match on span or resource attributes, which traces read from a file do not carry; they select no trace here (they do on live OTLP input)",
            blind.join(", ")
        );
    }
    let (tx, mut rx) = mpsc::channel::<(u64, Line)>(256);
    let reader_task = tokio::task::spawn_blocking(move || read_lines(reader, tx));
    // Publishes wait on the broker, not the CPU: many are kept in flight.
    let window = if publisher.is_some() {
        concurrency.max(crate::cli::PUBLISH_WINDOW)
    } else {
        concurrency
    };
    let sem = Arc::new(Semaphore::new(window));
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let (mut lines, mut malformed, mut crashed) = (0u64, 0u64, 0u64);
    while let Some((line_no, line)) = rx.recv().await {
        lines += 1;
        match line {
            Line::Malformed(why) => {
                malformed += 1;
                pipeline.metrics.dropped(DropReason::Malformed.as_str(), 0);
                tracing::warn!(line = line_no, "--jsonl line {line_no}: {why}");
            }
            Line::Trace(trace) => {
                pipeline.metrics.traces_received.fetch_add(1, Ordering::Relaxed);
                pipeline.metrics.traces_assembled.fetch_add(1, Ordering::Relaxed);
                let ctx = MatchContext {
                    agent_id: trace.agent_id().map(str::to_string),
                    root_span_name: trace.root_span().map(str::to_string),
                    attributes: HashMap::new(),
                };
                if let Some(item) = pipeline.select(trace, &ctx) {
                    let permit = sem.clone().acquire_owned().await?;
                    let pipeline = pipeline.clone();
                    let publisher = publisher.clone();
                    tasks.spawn(async move {
                        let _permit = permit;
                        crate::cli::handle_item(&pipeline, publisher.as_deref(), item, &mut crate::cli::Hurry(None)).await;
                    });
                }
            }
        }
        while let Some(joined) = tasks.try_join_next() {
            crashed += u64::from(joined.is_err());
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            progress(pipeline, lines, malformed, started);
            last_progress = Instant::now();
        }
    }
    while let Some(joined) = tasks.join_next().await {
        crashed += u64::from(joined.is_err());
    }
    reader_task.await?.with_context(|| format!("--jsonl {input}: cannot be read"))?;
    let failed = progress(pipeline, lines, malformed, started);
    if crashed > 0 {
        // A panic is logged where it happened; the run must not pass.
        tracing::error!("--jsonl: {crashed} traces stopped with an internal error (see the log)");
    }
    Ok(malformed == 0 && failed == 0 && crashed == 0)
}

/// Prints the run's counts so far; returns how many evaluations and
/// publishes failed.
fn progress(pipeline: &Pipeline, lines: u64, malformed: u64, started: Instant) -> u64 {
    let m = &pipeline.metrics;
    let evaluated = m.rule_evaluations.load(Ordering::Relaxed);
    let published = m.traces_published.load(Ordering::Relaxed);
    let duplicates = m.publish_duplicates.load(Ordering::Relaxed);
    let eval_failed = m.rule_event_count("eval_error") + m.dropped_count("evaluation_failed");
    let publish_failed = m.dropped_count("publish_failed");
    let rate = lines as f64 / started.elapsed().as_secs_f64().max(1e-3);
    let counts = format!(
        "--jsonl: {lines} lines ({rate:.0}/s), {malformed} malformed, {evaluated} rule evaluations, {eval_failed} evaluations failed, {published} published ({duplicates} already in the stream), {publish_failed} publishes failed"
    );
    // A run that lost something says so at `--log-level warn` too.
    if malformed + eval_failed + publish_failed > 0 {
        tracing::warn!("{counts}");
    } else {
        tracing::info!("{counts}");
    }
    eval_failed + publish_failed
}

fn read_lines(reader: Box<dyn Read + Send>, tx: mpsc::Sender<(u64, Line)>) -> anyhow::Result<()> {
    let mut reader = std::io::BufReader::with_capacity(1 << 20, reader);
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    loop {
        buf.clear();
        let n = (&mut reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let line = if buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n") {
            // Skip the rest of the over-long line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let m = (&mut reader).take(1 << 20).read_until(b'\n', &mut rest)?;
                if m == 0 || rest.ends_with(b"\n") {
                    break;
                }
            }
            Line::Malformed(format!("longer than {MAX_LINE_BYTES} bytes; skipped"))
        } else {
            let text = String::from_utf8_lossy(&buf);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            parse(text)
        };
        if tx.blocking_send((line_no, line)).is_err() {
            return Ok(());
        }
    }
}

fn parse(text: &str) -> Line {
    match serde_json::from_str::<Value>(text) {
        Err(e) => Line::Malformed(format!("not JSON: {e}")),
        Ok(v) if !v.is_object() => Line::Malformed("not a JSON object (expected an Attest trace)".into()),
        Ok(v) if !v["trace_id"].is_string() => Line::Malformed("missing string field `trace_id` (Attest trace, protocol §3)".into()),
        Ok(v) if !v["output"].is_object() => Line::Malformed("missing object field `output` (Attest trace, protocol §3)".into()),
        Ok(v) => Line::Trace(TraceDoc::from_value(&v)),
    }
}
