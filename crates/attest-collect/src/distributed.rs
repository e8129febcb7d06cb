//! Distributed mode on NATS JetStream (official `async-nats` client).
//!
//! - Collectors publish each selected trace to the work-queue stream
//!   `<PREFIX>_TRACES` with `Nats-Msg-Id` = trace id, so the server drops a
//!   second publish of the same trace within the duplicate window.
//! - Evaluation workers share one durable pull consumer. A work message is
//!   acknowledged only after its results are durably stored in
//!   `<PREFIX>_RESULTS` (publish ack received); while a slow evaluation runs
//!   the worker sends in-progress acks. After `max_deliver` attempts the next
//!   delivery is moved to `<PREFIX>.dead` (stream `<PREFIX>_DEAD`) instead.
//! - A sink worker reads the results stream with its own durable consumer
//!   and writes to the sinks, which are idempotent on the result key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cli::{NatsOptions, WorkerArgs};
use crate::pipeline::{Pipeline, WorkItem};
use crate::ResultRecord;

/// Subjects and stream names derived from `--nats-prefix`.
#[derive(Debug, Clone)]
pub struct Names {
    pub traces_subject: String,
    pub results_subject: String,
    pub dead_subject: String,
    pub traces_stream: String,
    pub results_stream: String,
    pub dead_stream: String,
    pub workers_consumer: String,
    pub sink_consumer: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        let up = prefix.to_ascii_uppercase().replace(['.', '-', ' '], "_");
        Names {
            traces_subject: format!("{prefix}.traces"),
            results_subject: format!("{prefix}.results"),
            dead_subject: format!("{prefix}.dead"),
            traces_stream: format!("{up}_TRACES"),
            results_stream: format!("{up}_RESULTS"),
            dead_stream: format!("{up}_DEAD"),
            workers_consumer: format!("{prefix}-workers").replace('.', "_"),
            sink_consumer: format!("{prefix}-results-sink").replace('.', "_"),
        }
    }
}

/// Window within which the server drops a re-published message id.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Deadline for a publish to be acknowledged by the server.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// An async-nats error as one message. Its `Display` already ends with its
/// source's text, so chaining the source as well would print it twice.
fn nats(what: impl std::fmt::Display, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

async fn connect(url: &str) -> anyhow::Result<jetstream::Context> {
    let client = tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url))
        .await
        .with_context(|| format!("--nats {url}: no answer within 10 s"))?
        .map_err(|e| nats(format_args!("--nats {url}: cannot connect"), e))?;
    Ok(jetstream::new(client))
}

/// Creates the three streams if missing (idempotent on every node).
pub async fn ensure_streams(js: &jetstream::Context, names: &Names, opts: &NatsOptions) -> anyhow::Result<()> {
    let specs = [
        (&names.traces_stream, &names.traces_subject, stream::RetentionPolicy::WorkQueue),
        (&names.results_stream, &names.results_subject, stream::RetentionPolicy::Limits),
        (&names.dead_stream, &names.dead_subject, stream::RetentionPolicy::Limits),
    ];
    for (name, subject, retention) in specs {
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            retention,
            storage: stream::StorageType::File,
            num_replicas: opts.nats_replicas,
            duplicate_window: DUPLICATE_WINDOW,
            // Bounded like everything else: 1 GiB per stream, oldest results go first.
            max_bytes: 1 << 30,
            discard: if retention == stream::RetentionPolicy::WorkQueue {
                stream::DiscardPolicy::New
            } else {
                stream::DiscardPolicy::Old
            },
            ..Default::default()
        };
        // Nodes that start together race to create the stream, and the
        // loser's create can fail (as a subject overlap) while the winner's
        // is being applied. A second look then finds the stream; a real
        // conflict still fails, after the last attempt.
        let mut attempt = 0;
        loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(_) => break,
                Err(_) if attempt < STREAM_CREATE_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    if js.get_stream(name).await.is_ok() {
                        break;
                    }
                }
                Err(e) => return Err(nats(format_args!("creating JetStream stream {name}"), e)),
            }
        }
    }
    Ok(())
}

/// Further attempts at creating a stream another node may be creating.
const STREAM_CREATE_RETRIES: u32 = 4;

async fn publish_with_id(js: &jetstream::Context, subject: &str, id: &str, payload: Vec<u8>) -> anyhow::Result<bool> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    let ack = tokio::time::timeout(PUBLISH_TIMEOUT, async {
        js.publish_with_headers(subject.to_string(), headers, payload.into()).await?.await
    })
    .await
    .context("publish not acknowledged within 10 s")?
    .map_err(|e| nats(format_args!("publish to {subject}"), e))?;
    Ok(ack.duplicate)
}

/// A collector's handle for publishing selected traces.
pub struct Publisher {
    js: jetstream::Context,
    names: Names,
}

impl Publisher {
    pub async fn connect(url: &str, opts: &NatsOptions) -> anyhow::Result<Publisher> {
        let js = connect(url).await?;
        let names = Names::new(&opts.nats_prefix);
        ensure_streams(&js, &names, opts).await?;
        Ok(Publisher { js, names })
    }

    /// Publishes a selected trace; returns true when the server already had it (duplicate).
    pub async fn publish(&self, item: &WorkItem) -> anyhow::Result<bool> {
        let payload = serde_json::to_vec(item)?;
        publish_with_id(&self.js, &self.names.traces_subject, item.trace_id(), payload).await
    }
}

/// Test-only fault injection: exit right after the Nth results publish, before
/// acknowledging the work message (proves results are not counted twice).
const FAULT_ENV: &str = "ATTEST_COLLECT_FAULT_EXIT_AFTER_PUBLISH";

/// Evaluation worker loop; returns on SIGTERM after in-flight messages finish.
pub async fn run_evaluate(args: &WorkerArgs, pipeline: Arc<Pipeline>) -> anyhow::Result<()> {
    let js = connect(&args.nats).await?;
    let names = Names::new(&args.nats_opts.nats_prefix);
    ensure_streams(&js, &names, &args.nats_opts).await?;
    let ack_wait = Duration::from_secs(args.nats_opts.ack_wait_secs.max(1));
    let max_deliver = args.nats_opts.max_deliver.max(1);
    let stream = js.get_stream(&names.traces_stream).await?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &names.workers_consumer,
            consumer::pull::Config {
                durable_name: Some(names.workers_consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait,
                // One delivery more than allowed attempts: that last one only moves the message to the dead-letter subject.
                max_deliver: max_deliver + 1,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| nats("creating the workers' durable consumer", e))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(args.concurrency)
        .messages()
        .await
        .map_err(|e| nats("pulling from the work stream", e))?;
    eprintln!(
        "attest-collect worker: evaluating from {} (consumer {})",
        names.traces_stream, names.workers_consumer
    );
    let fault_after: Option<u64> = std::env::var(FAULT_ENV).ok().and_then(|v| v.parse().ok());
    let published = Arc::new(AtomicU64::new(0));
    let sem = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = JoinSet::new();
    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = sem.clone().acquire_owned() => p?,
        };
        let msg = tokio::select! {
            _ = &mut shutdown => break,
            m = messages.next() => m,
        };
        let Some(msg) = msg else { break };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                eprintln!("attest-collect worker: pull error: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let ctx = WorkerCtx {
            js: js.clone(),
            names: names.clone(),
            pipeline: pipeline.clone(),
            ack_wait,
            max_deliver,
            fault_after,
            published: published.clone(),
        };
        tasks.spawn(async move {
            let _permit = permit;
            if let Err(e) = ctx.handle(msg).await {
                eprintln!("attest-collect worker: {e:#}");
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    eprintln!("attest-collect worker: draining {} in-flight evaluations", tasks.len());
    while tasks.join_next().await.is_some() {}
    Ok(())
}

struct WorkerCtx {
    js: jetstream::Context,
    names: Names,
    pipeline: Arc<Pipeline>,
    ack_wait: Duration,
    max_deliver: i64,
    fault_after: Option<u64>,
    published: Arc<AtomicU64>,
}

impl WorkerCtx {
    async fn handle(&self, msg: jetstream::Message) -> anyhow::Result<()> {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let metrics = &self.pipeline.metrics;
        if delivered > 1 {
            metrics.redeliveries.fetch_add(1, Ordering::Relaxed);
        }
        let item: WorkItem = match serde_json::from_slice(&msg.payload) {
            Ok(i) => i,
            Err(e) => return self.dead_letter(&msg, "", delivered, &format!("not a work item: {e}")).await,
        };
        let trace_id = item.trace_id().to_string();
        if delivered > 1 {
            eprintln!("attest-collect worker: redelivery {delivered} of trace {trace_id}");
        }
        if delivered > self.max_deliver {
            return self.dead_letter(&msg, &trace_id, delivered, "maximum deliveries reached").await;
        }
        // Keep the message ours while the evaluation runs.
        let evaluation = self.pipeline.evaluate(&item, delivered as u64);
        tokio::pin!(evaluation);
        let mut progress = tokio::time::interval(self.ack_wait / 3);
        progress.tick().await;
        let outcome = loop {
            tokio::select! {
                r = &mut evaluation => break r,
                _ = progress.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
            }
        };
        let records = match outcome {
            Ok(r) => r,
            Err(e) if e.retryable => {
                let _ = msg.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                anyhow::bail!("trace {trace_id}: retryable evaluation failure (will be redelivered): {e}");
            }
            Err(e) => return self.dead_letter(&msg, &trace_id, delivered, &e.message).await,
        };
        let payload = serde_json::to_vec(&records)?;
        // One results message per trace; the same id on a redelivery is dropped by the server.
        publish_with_id(&self.js, &self.names.results_subject, &trace_id, payload).await?;
        let n = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fault_after == Some(n) {
            eprintln!("attest-collect worker: {FAULT_ENV}={n}: exiting after publishing results of {trace_id}, before acking");
            std::process::exit(70);
        }
        msg.double_ack().await.map_err(|e| anyhow::anyhow!("ack of {trace_id}: {e}"))?;
        Ok(())
    }

    async fn dead_letter(&self, msg: &jetstream::Message, trace_id: &str, delivered: i64, why: &str) -> anyhow::Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Attest-Dead-Reason", crate::bounded(why, 200).as_str());
        headers.insert("Attest-Deliveries", delivered.to_string().as_str());
        headers.insert("Attest-Trace-Id", trace_id);
        let ack = tokio::time::timeout(PUBLISH_TIMEOUT, async {
            self.js
                .publish_with_headers(self.names.dead_subject.clone(), headers, msg.payload.clone())
                .await?
                .await
        })
        .await;
        match ack {
            Ok(Ok(_)) => {
                self.pipeline.metrics.dead_lettered.fetch_add(1, Ordering::Relaxed);
                msg.double_ack_with(AckKind::Term).await.map_err(|e| anyhow::anyhow!("term: {e}"))?;
                eprintln!(
                    "attest-collect worker: trace {trace_id} moved to {} ({why})",
                    self.names.dead_subject
                );
                Ok(())
            }
            _ => anyhow::bail!("trace {trace_id}: could not dead-letter; it will be redelivered"),
        }
    }
}

/// Results sink loop: results stream → sinks, ack after they are stored.
pub async fn run_sink(args: &WorkerArgs, pipeline: Arc<Pipeline>) -> anyhow::Result<()> {
    let js = connect(&args.nats).await?;
    let names = Names::new(&args.nats_opts.nats_prefix);
    ensure_streams(&js, &names, &args.nats_opts).await?;
    let stream = js.get_stream(&names.results_stream).await?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &names.sink_consumer,
            consumer::pull::Config {
                durable_name: Some(names.sink_consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(args.nats_opts.ack_wait_secs.max(1)),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| nats("creating the results sink consumer", e))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await
        .map_err(|e| nats("pulling from the results stream", e))?;
    eprintln!("attest-collect worker: writing results from {}", names.results_stream);
    let shutdown = crate::cli::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let msg = tokio::select! {
            _ = &mut shutdown => break,
            m = messages.next() => m,
        };
        let Some(msg) = msg else { break };
        let Ok(msg) = msg else { continue };
        match serde_json::from_slice::<Vec<ResultRecord>>(&msg.payload) {
            Ok(records) => {
                if let Err(e) = pipeline.store(&records).await {
                    eprintln!("attest-collect sink: storing failed, will retry: {e:#}");
                    let _ = msg.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    continue;
                }
                pipeline.metrics.traces_evaluated.fetch_add(1, Ordering::Relaxed);
                let _ = msg.double_ack().await;
            }
            Err(e) => {
                eprintln!("attest-collect sink: results message is not a result list: {e}");
                let _ = msg.ack_with(AckKind::Term).await;
            }
        }
    }
    pipeline.flush().await?;
    Ok(())
}
