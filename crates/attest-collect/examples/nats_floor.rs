//! The broker's own ceiling for the distributed pipeline's message flow,
//! measured with the client the pipeline uses (async-nats): what `collect
//! --nats`, `worker` and `worker --role sink` could reach if evaluating and
//! storing cost nothing.
//!
//! One process plays the three parts against a running nats-server, each
//! with the same JetStream round trips as the product, batched the same way:
//! - a publisher sends N work messages of `--bytes` each, deduplicated by
//!   `Nats-Msg-Id`, keeping up to 256 publish acknowledgements in flight;
//! - workers fetch batches, publish one results message of `--result-bytes`
//!   per work message, wait for those acknowledgements, then ack the work
//!   messages (plain acks, as the product sends);
//! - a sink fetches results in batches and acks them.
//!
//! It prints one JSON line: messages per second and the process's CPU time
//! per message. `scripts/bench_collect.py --floor` runs it beside the product.
//!
//! ```sh
//! cargo run --release -p attest-collect --example nats_floor -- nats://127.0.0.1:4222 20000 2000 1000 1
//! ```

use std::future::IntoFuture as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use futures::{stream::FuturesUnordered, StreamExt};

const WINDOW: usize = 256;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, n, bytes, result_bytes, workers] = args.as_slice() else {
        anyhow::bail!("usage: nats_floor URL MESSAGES BYTES RESULT_BYTES WORKERS");
    };
    let (n, bytes, result_bytes, workers): (usize, usize, usize, usize) =
        (n.parse()?, bytes.parse()?, result_bytes.parse()?, workers.parse()?);
    let js = jetstream::new(async_nats::connect(url.as_str()).await?);
    for (name, subject, retention) in [
        ("FLOOR_WORK", "floor.work", stream::RetentionPolicy::WorkQueue),
        ("FLOOR_RESULTS", "floor.results", stream::RetentionPolicy::Limits),
    ] {
        let _ = js.delete_stream(name).await;
        js.create_stream(stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            retention,
            duplicate_window: Duration::from_secs(120),
            max_bytes: 1 << 30,
            ..Default::default()
        })
        .await?;
    }
    let started = Instant::now();
    let cpu0 = cpu_seconds();

    // Polled beside the sink below: its acknowledgement futures are not `Send`.
    let publisher = {
        let js = js.clone();
        async move {
            let payload = bytes::Bytes::from(vec![b'x'; bytes]);
            let mut acks = FuturesUnordered::new();
            for i in 0..n {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("trc_{i:08}").as_str());
                acks.push(js.publish_with_headers("floor.work", headers, payload.clone()).await?.into_future());
                while acks.len() >= WINDOW {
                    acks.next().await.transpose()?;
                }
            }
            while acks.next().await.transpose()?.is_some() {}
            anyhow::Ok(())
        }
    };

    let work = js.get_stream("FLOOR_WORK").await?;
    let taker: consumer::PullConsumer = work
        .create_consumer(consumer::pull::Config {
            durable_name: Some("floor-workers".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut worker_tasks = Vec::new();
    for _ in 0..workers {
        let (js, taker, done) = (js.clone(), taker.clone(), done.clone());
        worker_tasks.push(tokio::spawn(async move {
            let result = bytes::Bytes::from(vec![b'r'; result_bytes]);
            while done.load(std::sync::atomic::Ordering::Relaxed) < n {
                let mut batch = taker
                    .fetch()
                    .max_messages(WINDOW)
                    .expires(Duration::from_millis(200))
                    .messages()
                    .await?;
                let mut held = Vec::new();
                while let Some(m) = batch.next().await {
                    held.push(m.map_err(|e| anyhow::anyhow!("{e}"))?);
                }
                let mut acks = Vec::with_capacity(held.len());
                for m in &held {
                    // Each results message is named after its work message, as the product's are.
                    let seq = m.info().map(|i| i.stream_sequence).unwrap_or_default();
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", format!("res_{seq}").as_str());
                    acks.push(
                        js.publish_with_headers("floor.results", headers, result.clone())
                            .await?
                            .into_future(),
                    );
                }
                for a in futures::future::join_all(acks).await {
                    a?;
                }
                for r in futures::future::join_all(held.iter().map(|m| m.ack())).await {
                    r.map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                done.fetch_add(held.len(), std::sync::atomic::Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }

    let results = js.get_stream("FLOOR_RESULTS").await?;
    let sink: consumer::PullConsumer = results
        .create_consumer(consumer::pull::Config {
            durable_name: Some("floor-sink".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let sinking = async {
        let mut stored = 0usize;
        let mut messages = sink.stream().max_messages_per_batch(256).messages().await?;
        while stored < n {
            let Some(first) = messages.next().await else { break };
            let mut batch = vec![first.map_err(|e| anyhow::anyhow!("{e}"))?];
            while batch.len() < 256 {
                match futures::FutureExt::now_or_never(messages.next()) {
                    Some(Some(Ok(m))) => batch.push(m),
                    _ => break,
                }
            }
            for r in futures::future::join_all(batch.iter().map(|m| m.ack())).await {
                r.map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            stored += batch.len();
        }
        anyhow::Ok(())
    };
    let (published, sunk) = tokio::join!(publisher, sinking);
    published?;
    sunk?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    for w in worker_tasks {
        w.await??;
    }
    println!(
        "{{\"messages\": {n}, \"seconds\": {elapsed:.3}, \"per_second\": {:.0}, \"cpu_us_per_message\": {:.1}}}",
        n as f64 / elapsed,
        cpu * 1e6 / n as f64
    );
    Ok(())
}

/// This process's user and system CPU time so far, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start past ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks: f64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<f64>().ok()).sum();
    ticks / 100.0
}
