//! Command-line arguments of `collect` and `worker`, and their entry points.
//! The host binary embeds [`CollectArgs`] / [`WorkerArgs`] as clap subcommands
//! and calls [`run_collect`] / [`run_worker`] with its evaluator and history.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use attest_io::DurationProblem;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::assemble::{Assembler, Limits};
use crate::convert::PriceTable;
use crate::events::{EvaluationFailed, InternalEvent, LogThrottle};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, WorkItem};
use crate::rules::RuleSet;
use crate::server::{self, ReceiverState};
use crate::sink::{JsonlSink, Wait};
use crate::writer::{FileWriter, Output};
use crate::{distributed, jsonl_input, listen, ResultStore, TraceEvaluator};

/// `collect`: receive traces, assemble them, evaluate (or publish to NATS).
#[derive(Debug, Clone, clap::Args)]
pub struct CollectArgs {
    /// Rules file (YAML, or JSON with a .json extension).
    #[arg(help_heading = "Input", long)]
    pub rules: PathBuf,
    /// OTLP/HTTP listen address (IP:PORT, or a host name such as localhost:4318).
    #[arg(help_heading = "Input", long, default_value = "127.0.0.1:4318", value_parser = listen_addr)]
    pub otlp_http: SocketAddr,
    /// OTLP/gRPC listen address (traces and GenAI log events), or `off`. Without the
    /// flag, 127.0.0.1:4317 is served when it is free (a busy default port is
    /// reported, not fatal); given explicitly, the address must be free.
    #[arg(help_heading = "Input", long, value_name = "ADDR|off", value_parser = grpc_addr)]
    pub otlp_grpc: Option<GrpcListen>,
    /// Required to listen on a non-loopback address.
    #[arg(help_heading = "Input", long)]
    pub listen_public: bool,
    /// Bearer token required on export requests (read from the environment so it stays out of `ps`).
    #[arg(help_heading = "Input", long = "bearer-token-env", value_name = "VAR")]
    pub bearer_token_env: Option<String>,
    /// Read Attest traces, one JSON object per line, from a file or `-` (stdin),
    /// evaluate them and exit; the OTLP receiver is not started.
    #[arg(help_heading = "Input", long, value_name = "FILE|-")]
    pub jsonl: Option<String>,
    /// Append one line per assertion result to this file (idempotent per trace, rule, assertion).
    #[arg(help_heading = "Results", long)]
    pub results_jsonl: Option<PathBuf>,
    /// Append every assembled Attest trace to this file, one per line (re-score it later with `--jsonl`).
    #[arg(help_heading = "Results", long)]
    pub traces_out: Option<PathBuf>,
    /// Model prices (YAML/JSON: `models: {NAME: {input_per_million, output_per_million}}`).
    #[arg(help_heading = "Results", long)]
    pub prices: Option<PathBuf>,
    /// Publish selected traces to this NATS JetStream server instead of evaluating here
    /// (nats://HOST:PORT; from ATTEST_NATS_URL when not given, which keeps credentials off the command line).
    #[arg(help_heading = "NATS JetStream", long, env = "ATTEST_NATS_URL", hide_env_values = true)]
    pub nats: Option<String>,
    #[command(flatten)]
    pub nats_opts: NatsOptions,
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Quiet time after the last span of a trace (with its root) before it
    /// is evaluated: 2s, 500ms (a bare number is milliseconds).
    #[arg(help_heading = "Trace assembly and limits", long = "settle", alias = "settle-ms", value_name = "DURATION", default_value = "2s", value_parser = millis)]
    pub settle_ms: u64,
    /// A trace whose root span never arrives is dropped this long after its
    /// last span: 30s, 2m (a bare number is milliseconds).
    #[arg(help_heading = "Trace assembly and limits", long = "orphan-timeout", alias = "orphan-timeout-ms", value_name = "DURATION", default_value = "30s", value_parser = millis)]
    pub orphan_timeout_ms: u64,
    /// Traces being assembled at once; past it the oldest is closed early
    /// (evaluated if its root is there, else dropped).
    #[arg(help_heading = "Trace assembly and limits", long, default_value_t = 10_000)]
    pub max_open_traces: usize,
    /// Estimated memory of the traces being assembled (see docs/continuous.md
    /// for the estimate); past it the oldest is closed early.
    #[arg(help_heading = "Trace assembly and limits", long, value_name = "SIZE", default_value = "256MiB", value_parser = size::<usize>)]
    pub max_open_bytes: usize,
    /// Estimated memory of one trace; a larger trace is dropped as trace_too_large.
    #[arg(help_heading = "Trace assembly and limits", long, value_name = "SIZE", default_value = "16MiB", value_parser = size::<usize>)]
    pub max_trace_bytes: usize,
    /// Bytes of closed traces waiting for evaluation or being evaluated;
    /// past it, traces are refused as with a full queue.
    #[arg(help_heading = "Trace assembly and limits", long, value_name = "SIZE", default_value = "256MiB", value_parser = size::<usize>)]
    pub max_queued_bytes: usize,
    /// Spans of one trace; a trace with more is dropped as too_many_spans.
    #[arg(help_heading = "Trace assembly and limits", long, default_value_t = 10_000)]
    pub max_trace_spans: usize,
    /// Largest export request body, after gzip inflation.
    #[arg(help_heading = "Trace assembly and limits", long, value_name = "SIZE", default_value = "32MiB", value_parser = size::<usize>)]
    pub max_request_bytes: usize,
    /// Deadline for reading and answering one export request (408 past it):
    /// 30s, 2m, from 1s to 24h (a bare number is seconds).
    #[arg(help_heading = "Trace assembly and limits", long = "request-timeout", alias = "request-timeout-secs", value_name = "DURATION", default_value = "30s", value_parser = seconds::<MAX_REQUEST_TIMEOUT_SECS>)]
    pub request_timeout_secs: u64,
    /// Export requests handled at once, uploads included; more get 429.
    #[arg(help_heading = "Trace assembly and limits", long, default_value_t = 64)]
    pub max_inflight_requests: usize,
    /// Client connections open at once; more wait to be accepted. Each must
    /// send a request's headers within --request-timeout.
    #[arg(help_heading = "Trace assembly and limits", long, default_value_t = 512)]
    pub max_connections: usize,
    /// Request body bytes being received or decoded at once (each request
    /// reserves its Content-Length; one without reserves 64 KiB, doubling as
    /// its body arrives); more get 429.
    #[arg(help_heading = "Trace assembly and limits", long, value_name = "SIZE", default_value = "256MiB", value_parser = size::<usize>)]
    pub max_inflight_bytes: usize,
    /// Closed traces waiting for evaluation; when full, export requests get 503.
    #[arg(help_heading = "Trace assembly and limits", long, default_value_t = 1024)]
    pub queue_capacity: usize,
    /// Traces evaluated at once (1 to 1024).
    #[arg(help_heading = "Evaluation", long, default_value_t = 4, value_parser = at_least_one::<MAX_CONCURRENCY, usize>)]
    pub concurrency: usize,
}

/// NATS JetStream names and settings shared by collectors and workers.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "NATS JetStream")]
pub struct NatsOptions {
    /// Subject prefix; streams are `<PREFIX>_TRACES`, `<PREFIX>_RESULTS`, `<PREFIX>_DEAD` (upper-cased).
    /// ASCII letters, digits, `_` and `-`, in dot-separated tokens (at most 64 bytes).
    #[arg(long, default_value = "attest", value_parser = nats_prefix)]
    pub nats_prefix: String,
    /// Stream replicas (3 on a production cluster; JetStream allows 1 to 5).
    #[arg(long, default_value_t = 1, value_parser = at_least_one::<5, usize>)]
    pub nats_replicas: usize,
    /// Deliveries of a work message before it goes to the dead-letter subject (1 to 10000).
    #[arg(long, default_value_t = 5, value_parser = at_least_one::<MAX_MAX_DELIVER, i64>)]
    pub max_deliver: i64,
    /// How long a worker has to acknowledge (progress acks extend it while
    /// evaluating): 30s, 5m, from 1s to 24h (a bare number is seconds).
    #[arg(long = "ack-wait", alias = "ack-wait-secs", value_name = "DURATION", default_value = "30s", value_parser = seconds::<MAX_ACK_WAIT_SECS>)]
    pub ack_wait_secs: u64,
    /// Most each of the three streams keeps (1MiB to 1PiB). JetStream sets
    /// this much of the server's store aside per stream when the stream is created.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = stream_bytes)]
    pub nats_stream_bytes: i64,
    /// NATS credentials file (a user JWT and its NKey seed, as `nsc` writes it).
    /// A user and password, or a token, go in the URL instead:
    /// nats://USER:PASSWORD@HOST:PORT, nats://TOKEN@HOST:PORT.
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// CA certificates (PEM) the NATS server's TLS certificate must chain to; implies TLS.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a server that verifies its clients; give --nats-tls-key with it.
    #[arg(long, value_name = "FILE", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

/// Smallest `--nats-stream-bytes`: a stream must hold a message of the
/// server's default `max_payload` (1 MiB).
const MIN_STREAM_BYTES: i64 = 1 << 20;
/// Largest `--nats-stream-bytes` (1 PiB), far above any real store.
const MAX_STREAM_BYTES: i64 = 1 << 50;

fn stream_bytes(s: &str) -> Result<i64, String> {
    let range = "give a size from 1MiB to 1PiB";
    let v: i64 = size(s)?;
    if !(MIN_STREAM_BYTES..=MAX_STREAM_BYTES).contains(&v) {
        return Err(format!("{v} bytes is out of range; {range}"));
    }
    Ok(v)
}

/// A size: with its unit (16MiB, 512KiB, 1GB: KiB and the like are 1024s,
/// KB and the like 1000s) or a bare number of bytes.
fn size<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let bytes = attest_io::size_with_unit(s, 1)
        .ok_or_else(|| format!("'{s}' is not a size; give a number with its unit (16MiB, 512KiB, 1GB) or a number of bytes"))?;
    T::try_from(bytes).map_err(|_| format!("'{s}' is too large"))
}

/// A duration in milliseconds: with its unit (2s, 500ms, 1m) or a bare
/// number of milliseconds (the flag's older `-ms` form).
fn millis(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(t.parse::<u64>().unwrap_or(u64::MAX));
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("'{s}' is not a duration ({e}); give it with its unit: 2s, 500ms, 1m"))
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
}

/// A duration in whole seconds from 1 to `MAX`: with its unit (30s, 5m) or
/// a bare number of seconds (the flag's older `-secs` form).
fn seconds<const MAX: i64>(s: &str) -> Result<u64, String> {
    let range = format!("give 1s to {}", humantime::format_duration(Duration::from_secs(MAX as u64)));
    let bare = s.trim().strip_prefix('-').unwrap_or(s.trim());
    let secs = match s.trim().parse::<i64>() {
        Ok(n) => n,
        // A bare number too large for the type is out of range, not a unit missing.
        Err(_) if !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_digit()) => i64::MAX,
        Err(_) => match attest_io::whole_seconds(s) {
            Ok(secs) => i64::try_from(secs).unwrap_or(i64::MAX),
            Err(DurationProblem::NotADuration(e)) => return Err(format!("'{s}' is not a duration ({e}); give it with its unit: 30s, 5m")),
            Err(DurationProblem::NotWhole) => return Err(format!("'{s}' is not a whole number of seconds; {range}")),
        },
    };
    if !(1..=MAX).contains(&secs) {
        return Err(format!("'{s}' is out of range; {range}"));
    }
    Ok(secs as u64)
}

/// Largest `--max-deliver`: the consumer is created with one delivery more.
const MAX_MAX_DELIVER: i64 = 10_000;
/// Most traces one process evaluates at once (`--concurrency`): each holds
/// its trace and a request's worth of evaluation state.
const MAX_CONCURRENCY: i64 = 1024;
/// Largest `--ack-wait` (a day): JetStream keeps durations as i64 nanoseconds.
const MAX_ACK_WAIT_SECS: i64 = 86_400;
/// Largest `--request-timeout` (a day): deadlines are computed from the
/// current time, and a far larger one cannot be represented.
const MAX_REQUEST_TIMEOUT_SECS: i64 = 86_400;

/// A whole number from 1 to `MAX`. Zero or a negative count is refused
/// rather than quietly raised to 1: the operator asked for something else.
fn at_least_one<const MAX: i64, T: TryFrom<i64>>(s: &str) -> Result<T, String> {
    let v: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number; give 1 to {MAX}"))?;
    if !(1..=MAX).contains(&v) {
        return Err(format!("{v} is out of range; give 1 to {MAX}"));
    }
    T::try_from(v).map_err(|_| format!("{v} is out of range; give 1 to {MAX}"))
}

/// Longest `--nats-prefix`, in bytes.
const MAX_NATS_PREFIX_BYTES: usize = 64;

/// `--nats-prefix`: it becomes subjects (`<PREFIX>.traces`) and, upper-cased
/// with `.` and `-` turned into `_`, stream and consumer names, so only
/// characters valid in all of them are accepted.
fn nats_prefix(s: &str) -> Result<String, String> {
    const RULE: &str = "use 1 to 64 ASCII letters, digits, '_' or '-', optionally in dot-separated tokens (attest, team_a.attest); wildcards ('*', '>'), spaces and empty tokens are not allowed";
    if s.is_empty() || s.len() > MAX_NATS_PREFIX_BYTES {
        return Err(format!("the prefix is {} bytes; {RULE}", s.len()));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        return Err(format!("{c:?} is not allowed; {RULE}"));
    }
    if s.split('.').any(str::is_empty) {
        return Err(format!("'{s}' has an empty token (a leading, trailing or doubled '.'); {RULE}"));
    }
    Ok(s.to_string())
}

fn sink_name(s: &str) -> Result<String, String> {
    const RULE: &str = "use 1 to 32 ASCII letters, digits, '_' or '-' (postgres, archive-jsonl)";
    if s.is_empty() || s.len() > 32 {
        return Err(format!("the name is {} bytes; {RULE}", s.len()));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))) {
        return Err(format!("{c:?} is not allowed; {RULE}"));
    }
    Ok(s.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkerRole {
    /// Evaluate traces from the work stream, publish results.
    Evaluate,
    /// Write results from the results stream to the sinks.
    Sink,
}

/// `worker`: evaluate traces from NATS JetStream, or (`--role sink`) store results.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// NATS server with JetStream to take work (or, with `--role sink`, results) from
    /// (nats://HOST:PORT; from ATTEST_NATS_URL when not given, which keeps credentials off the command line).
    #[arg(help_heading = "Worker", long, env = "ATTEST_NATS_URL", hide_env_values = true)]
    pub nats: String,
    /// What this worker does.
    #[arg(help_heading = "Worker", long, value_enum, default_value_t = WorkerRole::Evaluate)]
    pub role: WorkerRole,
    /// Rules file; the same file as the collectors'.
    #[arg(help_heading = "Worker", long, required_if_eq("role", "evaluate"))]
    pub rules: Option<PathBuf>,
    /// With `--role sink`: append results to this file.
    #[arg(help_heading = "Worker", long)]
    pub results_jsonl: Option<PathBuf>,
    /// With `--role sink`: which group of sinks this is. Each name has its
    /// own durable consumer and gets every result (one group per store: the
    /// shared PostgreSQL history, a JSONL archive); sinks with the same name
    /// share the work. 1 to 32 ASCII letters, digits, '_' or '-'.
    #[arg(help_heading = "Worker", long, value_parser = sink_name)]
    pub sink_name: Option<String>,
    #[command(flatten)]
    pub nats_opts: NatsOptions,
    /// With `--role sink`: also send each result as an OpenTelemetry event.
    #[command(flatten)]
    pub export: crate::export::ExportArgs,
    /// Traces evaluated at once by this worker (1 to 1024).
    #[arg(help_heading = "Worker", long, default_value_t = 4, value_parser = at_least_one::<MAX_CONCURRENCY, usize>)]
    pub concurrency: usize,
    /// Serve `/metrics` on this address (IP:PORT, or a host name such as localhost:9464).
    #[arg(help_heading = "Worker", long, value_parser = listen_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// Required for a `--metrics-addr` that is not a loopback address.
    #[arg(help_heading = "Worker", long)]
    pub listen_public: bool,
}

/// Refuses a listen address other hosts can reach unless `--listen-public`
/// was given: whether a process is reachable from other hosts is decided by
/// its operator, not by a typo in an address.
fn require_public(flag: &str, addr: SocketAddr, listen_public: bool, purpose: &str) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || listen_public {
        return Ok(());
    }
    bail!("{flag} {addr} is not a loopback address: pass --listen-public {purpose}")
}

/// Where OTLP/gRPC is served, when `--otlp-grpc` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcListen {
    At(SocketAddr),
    Off,
}

/// The OTLP/gRPC port OpenTelemetry exporters send to by default.
const DEFAULT_OTLP_GRPC: &str = "127.0.0.1:4317";

fn grpc_addr(s: &str) -> Result<GrpcListen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(GrpcListen::Off);
    }
    listen_addr(s).map(GrpcListen::At)
}

/// The OTLP/gRPC listener: the one asked for, or the default port when it is free.
async fn grpc_listener(choice: Option<GrpcListen>, listen_public: bool) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match choice {
        Some(GrpcListen::Off) => Ok(None),
        Some(GrpcListen::At(addr)) => {
            require_public(
                "--otlp-grpc",
                addr,
                listen_public,
                "to accept traces from other hosts (and consider --bearer-token-env)",
            )?;
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--otlp-grpc {addr}: cannot listen"))?;
            Ok(Some(l))
        }
        None => match tokio::net::TcpListener::bind(DEFAULT_OTLP_GRPC).await {
            Ok(l) => Ok(Some(l)),
            Err(e) => {
                tracing::warn!(
                    "OTLP/gRPC is not served: the default {DEFAULT_OTLP_GRPC} cannot be used ({e}); pass --otlp-grpc ADDR to serve it elsewhere, or --otlp-grpc off"
                );
                Ok(None)
            }
        },
    }
}

/// A listen address: `IP:PORT`, or `HOST:PORT` resolved to its first address.
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let hint = "give IP:PORT (127.0.0.1:4318, [::1]:4318) or HOST:PORT (localhost:4318)";
    match std::net::ToSocketAddrs::to_socket_addrs(s) {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("'{s}' resolves to no address; {hint}")),
        Err(e) => Err(format!("'{s}' is not a listen address ({e}); {hint}")),
    }
}

fn load_prices(path: &Option<PathBuf>) -> anyhow::Result<PriceTable> {
    let Some(p) = path else { return Ok(PriceTable::default()) };
    let text = crate::read_capped(p).map_err(|e| anyhow::anyhow!("--prices {} {e}", p.display()))?;
    let table: PriceTable = crate::parse_yaml(&text).map_err(|e| {
        anyhow::anyhow!(
            "--prices {}: expected `models: {{NAME: {{input_per_million, output_per_million}}}}`: {e}",
            p.display()
        )
    })?;
    for (model, price) in &table.models {
        for (field, v) in [
            ("input_per_million", price.input_per_million),
            ("output_per_million", price.output_per_million),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!(
                    "--prices {}: models.{model}.{field} is {v}; a price is a number of dollars, zero or more",
                    p.display()
                );
            }
        }
    }
    Ok(table)
}

/// How long a `--jsonl` run waits for room in the results file's queue
/// before it drops (and counts) a trace's results.
const JSONL_RESULTS_WAIT: Duration = Duration::from_secs(60);

/// The result sinks: `--results-jsonl` (see [`Wait`] for `wait`), the
/// history, then `--export-otlp` (whose counts `/metrics` shows).
fn sinks(
    results_jsonl: &Option<PathBuf>,
    history: Option<Arc<dyn ResultStore>>,
    export: &crate::export::ExportArgs,
    front_door: &str,
    metrics: &Arc<Metrics>,
    wait: Wait,
) -> anyhow::Result<crate::SharedSinks> {
    let mut v: Vec<Arc<dyn ResultStore>> = Vec::new();
    if let Some(p) = results_jsonl {
        let sink = JsonlSink::open(p, metrics.clone(), wait)?;
        v.push(Arc::new(sink));
    }
    if let Some(h) = history {
        v.push(h);
    }
    if let Some(endpoint) = &export.endpoint {
        let exporter = crate::export::OtlpExport::start(endpoint, export.protocol, front_door)?;
        let _ = metrics.export.set(exporter.stats.clone());
        v.push(Arc::new(exporter));
    }
    Ok(Arc::new(v))
}

/// SIGTERM and SIGINT (Ctrl-C), counted from the moment it is installed:
/// the first starts the drain, a second cuts its waits short.
pub(crate) struct Signals(tokio::sync::watch::Receiver<u32>);

impl Signals {
    pub(crate) fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let (tx, rx) = tokio::sync::watch::channel(0u32);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        Ok(Signals(rx))
    }

    /// Resolves once `n` signals have arrived.
    pub(crate) fn nth(&self, n: u32) -> impl std::future::Future<Output = ()> + 'static {
        let mut rx = self.0.clone();
        async move {
            // The sender lives as long as the runtime: an error cannot
            // happen before shutdown, and then waiting on is right.
            if rx.wait_for(|&seen| seen >= n).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Runs the collector until SIGTERM (or the end of `--jsonl` input), then
/// drains: open traces are evaluated, results flushed. Returns the exit code.
pub async fn run_collect(
    args: CollectArgs,
    evaluator: Arc<dyn TraceEvaluator>,
    history: Option<Arc<dyn ResultStore>>,
) -> anyhow::Result<i32> {
    check(&args, history.is_some())?;
    let bearer_token = bearer_token(&args)?;
    let (pipeline, publisher) = build(&args, evaluator.as_ref(), history).await?;
    let (tx, rx) = mpsc::channel::<server::Ready>(args.queue_capacity);
    let (abandon, abandoned) = tokio::sync::watch::channel(false);
    let consumer = tokio::spawn(consume(
        rx,
        pipeline.clone(),
        publisher.clone(),
        args.concurrency,
        Hurry(Some(abandoned)),
    ));

    if let Some(input) = &args.jsonl {
        if let Some(p) = &publisher {
            p.fail_fast_when_down();
        }
        let complete = jsonl_input::run(input, &pipeline, publisher.clone(), args.concurrency).await?;
        drop(tx);
        consumer.await?;
        let flushed = flushed(&pipeline).await;
        if let Some(export) = pipeline.metrics.export.get() {
            export.log_summary();
        }
        return Ok(if complete && flushed { 0 } else { 1 });
    }

    // Installed before anything is served, so that no signal finds the
    // default handler (which would end the process undrained). Not for
    // `--jsonl`, which SIGTERM ends as any command.
    let signals = Signals::install()?;
    let state = receiver_state(&args, &pipeline.metrics, tx, bearer_token, publisher.clone());
    serve(&args, &state, &signals).await?;
    if let Some(p) = &publisher {
        p.fail_fast_when_down();
    }
    drain(state, consumer, abandon, &signals, &pipeline).await
}

/// Refuses flag combinations that could never work, before anything starts.
fn check(args: &CollectArgs, history_on: bool) -> anyhow::Result<()> {
    if args.jsonl.is_none() {
        require_public(
            "--otlp-http",
            args.otlp_http,
            args.listen_public,
            "to accept traces from other hosts (and consider --bearer-token-env)",
        )?;
    }
    for (name, v) in [
        ("--queue-capacity", args.queue_capacity),
        ("--max-inflight-requests", args.max_inflight_requests),
        ("--max-connections", args.max_connections),
        ("--max-trace-bytes", args.max_trace_bytes),
        ("--max-trace-spans", args.max_trace_spans),
        ("--max-open-traces", args.max_open_traces),
        ("--max-open-bytes", args.max_open_bytes),
        ("--max-request-bytes", args.max_request_bytes),
        ("--max-queued-bytes", args.max_queued_bytes),
    ] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if let (Some(_), Some(e)) = (&args.nats, &args.export.endpoint) {
        bail!("--export-otlp {e}: with --nats this collector evaluates nothing; give --export-otlp to the sink (`worker --role sink`), which stores the workers' results");
    }
    if let (Some(_), Some(p)) = (&args.nats, &args.results_jsonl) {
        bail!(
            "--results-jsonl {}: with --nats this collector evaluates nothing; the workers evaluate and `worker --role sink --results-jsonl FILE` writes the results: drop --results-jsonl here and give it to the sink",
            p.display()
        );
    }
    // The estimate gives every trace its bookkeeping and every span its
    // record: a bound below one span's trace would refuse every trace.
    let smallest_trace = crate::assemble::TRACE_BYTES + crate::otlp::SPAN_BYTES;
    for (name, v) in [
        ("--max-trace-bytes", args.max_trace_bytes),
        ("--max-open-bytes", args.max_open_bytes),
    ] {
        if v < smallest_trace {
            bail!(
                "{name} {v} is less than {smallest_trace} bytes, what a trace of one unnamed span without attributes is estimated at: every trace would be dropped; raise it (the estimate is described in docs/continuous.md)"
            );
        }
    }
    if args.max_queued_bytes < args.max_trace_bytes {
        bail!(
            "--max-queued-bytes {} is less than --max-trace-bytes {}: a trace of the largest allowed size could never be queued; raise --max-queued-bytes or lower --max-trace-bytes",
            args.max_queued_bytes,
            args.max_trace_bytes
        );
    }
    if args.max_inflight_bytes < args.max_request_bytes {
        bail!(
            "--max-inflight-bytes {} is less than --max-request-bytes {}: a request of the largest allowed size could never be admitted; raise --max-inflight-bytes or lower --max-request-bytes",
            args.max_inflight_bytes,
            args.max_request_bytes
        );
    }
    // A backfill's results leave only through a sink or NATS: the metrics
    // endpoint is not served while --jsonl runs.
    if args.jsonl.is_some() && args.results_jsonl.is_none() && args.nats.is_none() && !history_on && args.export.endpoint.is_none() {
        bail!("--jsonl with history off has nowhere to put its results: pass --results-jsonl FILE, --export-otlp URL, --nats URL, or turn history back on");
    }
    Ok(())
}

/// The token `--bearer-token-env` names, read once.
fn bearer_token(args: &CollectArgs) -> anyhow::Result<Option<String>> {
    Ok(match &args.bearer_token_env {
        None => None,
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|t| !t.is_empty())
                .with_context(|| format!("--bearer-token-env {var}: the environment variable is not set or empty"))?,
        ),
    })
}

/// The rules, prices and sinks of the pipeline, and the NATS publisher
/// when the traces are handed on instead of evaluated here.
async fn build(
    args: &CollectArgs,
    evaluator: &dyn TraceEvaluator,
    history: Option<Arc<dyn ResultStore>>,
) -> anyhow::Result<(Arc<Pipeline>, Option<Arc<distributed::Publisher>>)> {
    let rules = Arc::new(RuleSet::load(&args.rules, evaluator)?);
    let prices = Arc::new(load_prices(&args.prices)?);
    let metrics = Arc::new(Metrics::default());
    let trace_archive = match &args.traces_out {
        None => None,
        Some(p) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("--traces-out {}: cannot be opened for appending", p.display()))?;
            Some(
                FileWriter::start(Output::Traces, p, file, metrics.clone())
                    .with_context(|| format!("--traces-out {}: cannot start its writer", p.display()))?,
            )
        }
    };
    let pipeline = Arc::new(Pipeline {
        rules,
        metrics: metrics.clone(),
        // Receiving, the collector must not hold evaluation on a stalled
        // file, and has nobody to offer results again: they are queued, and
        // dropped (counted) when the queue is full. A `--jsonl` run reads its
        // input at the pace the file takes results.
        sinks: sinks(
            &args.results_jsonl,
            history,
            &args.export,
            "collect",
            &metrics,
            if args.jsonl.is_some() {
                Wait::Room(JSONL_RESULTS_WAIT)
            } else {
                Wait::Queued
            },
        )?,
        prices,
        trace_archive,
        max_trace_bytes: evaluator.max_trace_bytes(),
    });
    let publisher = match &args.nats {
        Some(url) => Some(Arc::new(distributed::Publisher::connect(url, &args.nats_opts).await?)),
        None => None,
    };

    Ok((pipeline, publisher))
}

/// What the receivers share: the assembler, the queue's sender and budgets,
/// the token, and the publisher.
fn receiver_state(
    args: &CollectArgs,
    metrics: &Arc<Metrics>,
    tx: mpsc::Sender<server::Ready>,
    bearer_token: Option<String>,
    publisher: Option<Arc<distributed::Publisher>>,
) -> Arc<ReceiverState> {
    let limits = Limits {
        settle: Duration::from_millis(args.settle_ms),
        orphan_timeout: Duration::from_millis(args.orphan_timeout_ms),
        max_open_traces: args.max_open_traces,
        max_open_bytes: args.max_open_bytes,
        max_trace_bytes: args.max_trace_bytes,
        max_trace_spans: args.max_trace_spans,
    };
    Arc::new(ReceiverState {
        assembler: Mutex::new(Assembler::new(limits)),
        metrics: metrics.clone(),
        ready: tx,
        queued_kib: Arc::new(server::kib_budget(args.max_queued_bytes)),
        bearer_token,
        max_request_bytes: args.max_request_bytes,
        inflight: Semaphore::new(args.max_inflight_requests),
        // Rounded up, as each request's reservation is: a budget equal to
        // --max-request-bytes always admits a full-size request.
        inflight_kib: server::kib_budget(args.max_inflight_bytes),
        fairness: crate::fair::Fairness::new(args.max_inflight_requests, server::kib(args.max_inflight_bytes) as usize),
        // Half the request deadline: the answer must still reach the
        // exporter before it gives up and sends everything again.
        queue_wait: Duration::from_secs(args.request_timeout_secs) / 2,
        decoding: Arc::new(Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get()))),
        publisher,
    })
}

/// Serves OTLP/HTTP (and OTLP/gRPC when asked) until the first signal, and
/// lets requests in flight finish within the drain deadline.
async fn serve(args: &CollectArgs, state: &Arc<ReceiverState>, signals: &Signals) -> anyhow::Result<()> {
    let metrics = &state.metrics;
    let listener = tokio::net::TcpListener::bind(args.otlp_http)
        .await
        .with_context(|| format!("--otlp-http {}: cannot listen", args.otlp_http))?;
    let local = listener.local_addr()?;
    // One line on stderr so that scripts (and tests) can find an ephemeral port.
    // The address is a word of its own in the message too (a space
    // after it), for whoever reads the line as text rather than JSON.
    tracing::info!(target: attest_log::STARTED, url = %format!("http://{local}/v1/traces"), "listening for OTLP/HTTP on http://{local}/v1/traces (plain HTTP)");
    let grpc = match grpc_listener(args.otlp_grpc, args.listen_public).await? {
        Some(l) => {
            let grpc = l.local_addr()?;
            tracing::info!(target: attest_log::STARTED, address = %grpc, "listening for OTLP/gRPC on {grpc} (plain HTTP/2)");
            let limits = crate::grpc::Limits {
                request_timeout: Duration::from_secs(args.request_timeout_secs),
                streams_per_connection: u32::try_from(args.max_inflight_requests).unwrap_or(u32::MAX),
            };
            Some(tokio::spawn(crate::grpc::serve(
                l,
                state.clone(),
                limits,
                signals.nth(1),
                listen::DRAIN_TIMEOUT,
            )))
        }
        None => None,
    };

    let poller = {
        let state = state.clone();
        let tick = Duration::from_millis((args.settle_ms / 4).clamp(20, 1000));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            loop {
                interval.tick().await;
                state.close_settled(Instant::now());
            }
        })
    };
    let request_timeout = Duration::from_secs(args.request_timeout_secs);
    let limits = listen::Limits {
        max_connections: args.max_connections,
        header_timeout: request_timeout,
        drain_timeout: listen::DRAIN_TIMEOUT,
    };
    let router = server::router(state.clone(), request_timeout);
    listen::serve(listener, router, limits, signals.nth(1), signals.nth(2), Some(metrics.clone())).await;
    if let Some(grpc) = grpc {
        // It stops at the same signal, with the same drain deadline.
        let _ = grpc.await;
    }
    poller.abort();
    Ok(())
}

/// Hands the traces still open to evaluation and waits for them (unless a
/// second signal says to stop), then flushes every output. 0 when nothing
/// accepted was lost.
async fn drain(
    state: Arc<ReceiverState>,
    consumer: tokio::task::JoinHandle<()>,
    abandon: tokio::sync::watch::Sender<bool>,
    signals: &Signals,
    pipeline: &Pipeline,
) -> anyhow::Result<i32> {
    let metrics = &pipeline.metrics;
    tracing::info!("draining open traces");
    let events = state.assembler.lock().unwrap_or_else(|e| e.into_inner()).drain();
    for d in events.dropped {
        d.count(metrics);
    }
    let mut consumer = consumer;
    let mut unfed = events.ready.into_iter();
    // The spans of the trace being handed to the queue, if one is.
    let mut in_hand = None;
    let feed = async {
        for t in unfed.by_ref() {
            in_hand = Some(t.spans.len() as u64);
            // Draining waits for room instead of dropping.
            let Ok(permit) = state.queued_kib.clone().acquire_many_owned(server::kib(t.bytes)).await else {
                break;
            };
            let _ = state.ready.send((t, Instant::now(), permit)).await;
            in_hand = None;
        }
        // The last sender: the consumer ends once the queue is empty.
        drop(state);
    };
    // Accepted traces are evaluated before exit, however long that takes,
    // unless a second signal asks to stop: then what is still running gets
    // one drain deadline more, and the results stored so far are flushed.
    let hurried = async {
        signals.nth(2).await;
        tokio::time::sleep(listen::DRAIN_TIMEOUT).await;
    };
    let finished = tokio::select! {
        done = async {
            feed.await;
            (&mut consumer).await
        } => Some(done),
        _ = hurried => None,
    };
    match finished {
        Some(done) => done?,
        None => {
            // What never reached the queue, then what the consumer had: it
            // stops its evaluations and waits for them to end, so none stores
            // a result after the flush below.
            for spans in unfed.map(|t| t.spans.len() as u64).chain(in_hand) {
                metrics.dropped("shutdown", spans);
            }
            let _ = abandon.send(true);
            consumer.await?;
            tracing::warn!(
                "second signal: {} traces still queued or being evaluated {:?} after it were abandoned (traces_dropped_total{{reason=\"shutdown\"}})",
                metrics.dropped_count("shutdown"),
                listen::DRAIN_TIMEOUT
            );
        }
    }
    let flushed = flushed(pipeline).await;
    let publishes_failed = metrics.dropped_count("publish_failed");
    let evaluations_failed = metrics.rule_event_count("eval_error") + metrics.dropped_count("evaluation_failed");
    let summary = format!(
        "drained; {} traces evaluated ({} rule evaluations), {evaluations_failed} evaluations failed, {} published, {publishes_failed} publishes failed",
        metrics.traces_evaluated.load(Ordering::Relaxed),
        metrics.rule_evaluations.load(Ordering::Relaxed),
        metrics.traces_published.load(Ordering::Relaxed),
    );
    // A run that lost something says so at `--log-level warn` too.
    if evaluations_failed + publishes_failed > 0 || !flushed {
        tracing::warn!("{summary}");
    } else {
        tracing::info!("{summary}");
    }
    // Accepted traces whose results or copies were lost end the run with 1
    // (docs/continuous.md): a supervisor or a script sees it.
    Ok(if flushed && publishes_failed == 0 { 0 } else { 1 })
}

/// Flushes the pipeline's outputs; false, after saying what was lost, when
/// anything was (results or traces not written, a sync that failed).
async fn flushed(pipeline: &Pipeline) -> bool {
    match pipeline.flush().await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!("{e:#}");
            false
        }
    }
}

/// A second signal's request to stop waiting for evaluations, which each
/// evaluation watches. `Hurry(None)` where nothing can ask (`--jsonl`).
#[derive(Clone)]
pub(crate) struct Hurry(pub(crate) Option<tokio::sync::watch::Receiver<bool>>);

impl Hurry {
    fn is_asked(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Resolves once stopping was asked for; never, if it cannot be.
    async fn asked(&mut self) {
        if let Some(rx) = &mut self.0 {
            if rx.wait_for(|asked| *asked).await.is_ok() {
                return;
            }
        }
        std::future::pending().await
    }
}

/// How [`handle_item`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Evaluated and stored, published, or counted as failed.
    Done,
    /// Given up when stopping was asked for, before its results existed.
    Abandoned,
}

/// Takes closed traces off the queue: converts, selects, then evaluates here
/// or publishes to NATS, at most `concurrency` at a time. When `hurry` asks
/// to stop, what is queued or being evaluated is dropped and counted
/// (`shutdown`), and no evaluation outlives this call.
async fn consume(
    mut rx: mpsc::Receiver<server::Ready>,
    pipeline: Arc<Pipeline>,
    publisher: Option<Arc<distributed::Publisher>>,
    concurrency: usize,
    hurry: Hurry,
) {
    // Publishing waits on the broker, not the CPU: many publishes are kept
    // in flight (each still bounded by the queue it came from).
    let window = if publisher.is_some() {
        concurrency.max(PUBLISH_WINDOW)
    } else {
        concurrency
    };
    let sem = Arc::new(Semaphore::new(window));
    let mut tasks = JoinSet::new();
    // The spans of each trace dropped for shutdown, wherever it is found.
    let mut dropped: Vec<u64> = Vec::new();
    // The spans of the trace taken off the queue and not yet started.
    let mut in_hand = None;
    let note = |dropped: &mut Vec<u64>, joined: Result<(Handled, u64), tokio::task::JoinError>| match joined {
        Ok((Handled::Abandoned, spans)) => dropped.push(spans),
        Ok((Handled::Done, _)) => {}
        // A panic in an evaluation (a bug) loses that trace: counted, not
        // silent. Cancellation does not happen here: nothing aborts tasks.
        Err(_) => pipeline.metrics.dropped("evaluation_failed", 0),
    };
    // Whether the queue was worked off to its end (else stopping was asked
    // for). Evaluations that saw the request may end, and be joined, here
    // too, so every join notes what it dropped.
    let run = async {
        while let Some((closed, closed_at, queued)) = rx.recv().await {
            in_hand = Some(closed.spans.len() as u64);
            pipeline.metrics.queue_depth.store(rx.len() as u64, Ordering::Relaxed);
            let Ok(permit) = sem.clone().acquire_owned().await else { break };
            if hurry.is_asked() {
                return false;
            }
            pipeline
                .metrics
                .queue_lag_ms
                .store(closed_at.elapsed().as_millis() as u64, Ordering::Relaxed);
            let pipeline = pipeline.clone();
            let publisher = publisher.clone();
            let mut hurry = hurry.clone();
            tasks.spawn(async move {
                let _permits = (permit, queued);
                let spans = closed.spans.len() as u64;
                let handled = match pipeline.prepare(closed) {
                    Some(item) => handle_item(&pipeline, publisher.as_deref(), item, &mut hurry).await,
                    None => Handled::Done,
                };
                (handled, spans)
            });
            in_hand = None;
            while let Some(joined) = tasks.try_join_next() {
                note(&mut dropped, joined);
            }
        }
        while let Some(joined) = tasks.join_next().await {
            note(&mut dropped, joined);
        }
        true
    };
    // Biased: once stopping is asked for and seen, no further trace starts.
    let mut asked = hurry.clone();
    let worked_off = tokio::select! {
        biased;
        () = asked.asked() => false,
        worked_off = run => worked_off,
    };
    if !worked_off {
        rx.close();
        dropped.extend(in_hand);
        while let Some((closed, _, _)) = rx.recv().await {
            dropped.push(closed.spans.len() as u64);
        }
        while let Some(joined) = tasks.join_next().await {
            note(&mut dropped, joined);
        }
    }
    for spans in dropped {
        pipeline.metrics.dropped("shutdown", spans);
    }
}

/// Work messages a collector has published and awaits the server's
/// acknowledgement of, at most (at least `--concurrency`).
pub(crate) const PUBLISH_WINDOW: usize = 256;

/// First and longest pause before a refused publish is tried again.
const PUBLISH_RETRY_FIRST: Duration = Duration::from_millis(200);
const PUBLISH_RETRY_MAX: Duration = Duration::from_secs(5);

/// Evaluates and stores one selected trace, or publishes it for the workers.
/// The evaluation is given up when `hurry` asks; storing results that exist
/// is never cut short, so no trace is stored in part, and neither is
/// publishing, whose message may already be in the stream.
pub(crate) async fn handle_item(
    pipeline: &Pipeline,
    publisher: Option<&distributed::Publisher>,
    item: WorkItem,
    hurry: &mut Hurry,
) -> Handled {
    if let Some(p) = publisher {
        // The exporter was answered when the spans arrived, so a trace the
        // server refuses or stalls on is kept, holding its place in the
        // bounded queue, and offered again until the server takes it or
        // stopping is asked for (then it is counted as dropped). Meanwhile the
        // receiver answers 503, and a full queue refuses more.
        let mut wait = PUBLISH_RETRY_FIRST;
        loop {
            // An attempt is not given up once started: the message may be
            // in the stream already while its ack is awaited (at most the
            // publish timeout).
            match p.publish(&item).await {
                Ok(duplicate) => {
                    pipeline.metrics.traces_published.fetch_add(1, Ordering::Relaxed);
                    if duplicate {
                        pipeline.metrics.publish_duplicates.fetch_add(1, Ordering::Relaxed);
                    }
                    return Handled::Done;
                }
                // Logged, throttled, by the publisher.
                // Too large, a `--jsonl` run (which nothing can hurry), or a
                // drain with the server gone: counted as lost. A `--jsonl` run
                // fails then, and can be run again, since the stream's
                // duplicate window drops what it already published.
                Err(f) if f.too_large || hurry.0.is_none() || p.given_up() => {
                    pipeline.metrics.dropped("publish_failed", 0);
                    return Handled::Done;
                }
                Err(_) => {
                    pipeline.metrics.publish_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::select! {
                        biased;
                        () = hurry.asked() => return Handled::Abandoned,
                        () = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(PUBLISH_RETRY_MAX);
                }
            }
        }
    }
    let evaluated = tokio::select! {
        biased;
        () = hurry.asked() => return Handled::Abandoned,
        // One process has no one to hand the trace on to: its only attempt
        // is its last, and what succeeded is kept.
        evaluated = pipeline.evaluate(&item, 1, true) => evaluated,
    };
    match evaluated {
        Ok(crate::pipeline::Evaluated { records, failure }) => {
            if let Some(e) = failure {
                tracing::warn!(
                    trace_id = %crate::shown_id(item.trace_id()),
                    "evaluation of {} failed in part ({} results kept): {e}",
                    crate::shown_id(item.trace_id()),
                    records.len()
                );
            }
            if let Err(e) = pipeline.store(&records, crate::Durability::Queued).await {
                // Counted by the sink; said at most once per interval, as a
                // stalled file fails every trace.
                static LOG: std::sync::LazyLock<LogThrottle> = std::sync::LazyLock::new(LogThrottle::default);
                if let Some(n) = LOG.hit() {
                    tracing::warn!(
                        trace_id = %crate::shown_id(item.trace_id()),
                        "storing results of {} failed: {e:#}{}",
                        crate::shown_id(item.trace_id()),
                        crate::events::unshown(n)
                    );
                }
            }
        }
        Err(e) => EvaluationFailed {
            trace_id: item.trace_id(),
            error: &e,
        }
        .emit(&pipeline.metrics),
    }
    Handled::Done
}

/// Runs a NATS worker until SIGTERM; returns the exit code.
pub async fn run_worker(
    args: WorkerArgs,
    evaluator: Arc<dyn TraceEvaluator>,
    history: Option<Arc<dyn ResultStore>>,
) -> anyhow::Result<i32> {
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = args.metrics_addr {
        require_public(
            "--metrics-addr",
            addr,
            args.listen_public,
            "to serve /metrics to other hosts (a Prometheus scraping the worker)",
        )?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-addr {addr}"))?;
        let router = server::metrics_router(metrics.clone());
        tokio::spawn(listen::serve(
            listener,
            router,
            listen::METRICS_ONLY,
            std::future::pending(),
            std::future::pending(),
            None,
        ));
    }
    let rules = match (&args.rules, args.role) {
        (Some(p), _) => Arc::new(RuleSet::load(p, evaluator.as_ref())?),
        (None, WorkerRole::Sink) => Arc::new(RuleSet {
            rules: vec![],
            version: String::new(),
        }),
        (None, WorkerRole::Evaluate) => bail!("--rules is required for --role evaluate"),
    };
    if args.role == WorkerRole::Evaluate {
        if let Some(e) = &args.export.endpoint {
            bail!("--export-otlp {e}: an evaluating worker publishes its results to the results stream, and a sink (--role sink) stores them; give --export-otlp to the sink instead");
        }
        if let Some(p) = &args.results_jsonl {
            bail!(
                "--results-jsonl {}: an evaluating worker publishes its results to the results stream, and a sink (--role sink) writes them; give --results-jsonl to the sink instead",
                p.display()
            );
        }
    }
    if args.role == WorkerRole::Sink && args.results_jsonl.is_none() && history.is_none() {
        bail!("--role sink needs somewhere to write: pass --results-jsonl");
    }
    // A sink acks a message once its results are written: it waits for the
    // write, up to half the ack wait (the message is offered again after it).
    let confirm = Duration::from_secs(args.nats_opts.ack_wait_secs) / 2;
    let pipeline = Arc::new(Pipeline {
        rules,
        sinks: sinks(
            &args.results_jsonl,
            history,
            &args.export,
            "worker",
            &metrics,
            Wait::Written(confirm),
        )?,
        metrics,
        prices: Arc::new(PriceTable::default()),
        trace_archive: None,
        max_trace_bytes: evaluator.max_trace_bytes(),
    });
    match args.role {
        WorkerRole::Evaluate => distributed::run_evaluate(&args, pipeline).await?,
        WorkerRole::Sink => distributed::run_sink(&args, pipeline).await?,
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cmd {
        #[command(flatten)]
        nats: NatsOptions,
    }

    fn parse(args: &[&str]) -> Result<NatsOptions, String> {
        Cmd::try_parse_from([&["x"][..], args].concat())
            .map(|c| c.nats)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn zero_or_negative_deliveries_and_ack_waits_are_refused_naming_the_flag() {
        let o = parse(&[]).unwrap();
        assert_eq!((o.max_deliver, o.ack_wait_secs, o.nats_prefix.as_str()), (5, 30, "attest"));
        for (args, flag, want) in [
            (&["--max-deliver", "0"][..], "--max-deliver", "0 is out of range; give 1 to 10000"),
            (&["--max-deliver=-3"][..], "--max-deliver", "-3 is out of range; give 1 to 10000"),
            (&["--ack-wait-secs", "0"][..], "--ack-wait", "'0' is out of range; give 1s to 1day"),
            (
                &["--ack-wait", "90000s"][..],
                "--ack-wait",
                "'90000s' is out of range; give 1s to 1day",
            ),
            (
                &["--ack-wait", "1500ms"][..],
                "--ack-wait",
                "'1500ms' is not a whole number of seconds",
            ),
            (&["--ack-wait", "x"][..], "--ack-wait", "'x' is not a duration"),
            (&["--nats-replicas", "0"][..], "--nats-replicas", "0 is out of range; give 1 to 5"),
            (&["--nats-replicas", "7"][..], "--nats-replicas", "7 is out of range; give 1 to 5"),
            (
                &["--nats-stream-bytes", "1000"][..],
                "--nats-stream-bytes",
                "1000 bytes is out of range; give a size from 1MiB to 1PiB",
            ),
            (&["--nats-stream-bytes", "lots"][..], "--nats-stream-bytes", "'lots' is not a size"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(flag) && e.contains(want), "{args:?}: {e}");
        }
        assert_eq!(parse(&["--max-deliver", "1", "--ack-wait-secs", "1"]).unwrap().max_deliver, 1);
        // Durations and sizes with their units; bare numbers in the flags' older units.
        assert_eq!(parse(&["--ack-wait", "2m"]).unwrap().ack_wait_secs, 120);
        assert_eq!(parse(&["--ack-wait-secs", "45"]).unwrap().ack_wait_secs, 45);
        assert_eq!(o.nats_stream_bytes, 1 << 30);
        assert_eq!(parse(&["--nats-stream-bytes", "2GiB"]).unwrap().nats_stream_bytes, 2 << 30);
        assert_eq!(parse(&["--nats-stream-bytes", "10MB"]).unwrap().nats_stream_bytes, 10_000_000);
        assert_eq!(parse(&["--nats-stream-bytes", "1048576"]).unwrap().nats_stream_bytes, 1 << 20);
    }

    #[test]
    fn request_timeouts_out_of_range_are_refused_naming_the_range() {
        #[derive(Parser, Debug)]
        struct Collect {
            #[command(flatten)]
            args: CollectArgs,
        }
        let parse = |t: &str| {
            let arg = match t.strip_prefix('=') {
                Some(v) => format!("--request-timeout-secs={v}"),
                None => format!("--request-timeout-secs={t}"),
            };
            Collect::try_parse_from(["x", "--rules", "r.yaml", &arg])
                .map(|c| c.args.request_timeout_secs)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse("86400"), Ok(86_400));
        assert_eq!(parse("1h"), Ok(3_600));
        for bad in ["0", "86401", "25h", "18446744073709551615", "=-1"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("--request-timeout") && e.contains("give 1s to 1day"), "{bad}: {e}");
        }
    }

    #[test]
    fn nats_prefixes_are_checked_up_front() {
        for ok in ["attest", "team_a.attest", "a-b_c.D9"] {
            assert_eq!(parse(&["--nats-prefix", ok]).unwrap().nats_prefix, ok);
        }
        for (bad, why) in [
            ("", "the prefix is 0 bytes"),
            ("x.*", "'*' is not allowed"),
            ("a b", "' ' is not allowed"),
            (">", "'>' is not allowed"),
            ("a..b", "empty token"),
            (".a", "empty token"),
        ] {
            let e = parse(&["--nats-prefix", bad]).unwrap_err();
            assert!(
                e.contains("--nats-prefix") && e.contains(why) && e.contains("ASCII letters, digits, '_' or '-'"),
                "{bad:?}: {e}"
            );
        }
        assert!(parse(&["--nats-prefix", &"a".repeat(65)]).is_err());
    }

    #[test]
    fn every_flag_of_collect_and_worker_says_what_it_is_for() {
        use clap::{CommandFactory, Subcommand};
        #[derive(Parser, Debug)]
        struct Host {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(Subcommand, Debug)]
        #[allow(clippy::large_enum_variant)]
        enum Sub {
            Collect(CollectArgs),
            Worker(WorkerArgs),
        }
        let mut cmd = Host::command();
        cmd.build();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(!help.trim().is_empty(), "{} --{id} has no help text", sub.get_name());
            }
        }
        // The trace bounds are among them (their help once showed only defaults).
        let collect = cmd.find_subcommand("collect").unwrap();
        for flag in ["max_open_traces", "max_open_bytes", "max_trace_bytes", "max_trace_spans"] {
            assert!(collect.get_arguments().any(|a| a.get_id() == flag), "{flag}");
        }
    }
}
