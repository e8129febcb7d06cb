//! Regex threads: a fixed set of threads for regex work that must not run
//! on the request's own thread.
//!
//! - **Guarded work.** Regex scans are linear in program size × text length,
//!   but both may be large: a 1 MiB program over a 10 MB trace is minutes of
//!   work, and neither the regex engine nor `jsonschema` can be interrupted.
//!   Such work runs here while the request waits for it *with its deadline*:
//!   at the deadline the request is answered `3002` and the thread finishes
//!   in the background, its result dropped. Abandoned work still costs CPU,
//!   so at most [`SLOTS`] guarded jobs run at once; a request that cannot get
//!   a slot before its deadline also gets `3002`. Each job's life is bounded
//!   by the regex size limit times the trace size limit.
//! - **Schema `patternProperties`.** A `regex::Regex` keeps a search cache
//!   for every thread that has used it, for as long as the regex lives.
//!   `jsonschema` owns the regexes of `patternProperties` keys, so the only
//!   way to bound those caches is to bound the threads. The async workers
//!   are as many as the cores; the blocking pool's threads are as many as
//!   requests in flight, so schema validations with such keys from the pool
//!   run here, on at most [`THREADS`] threads for the life of the process.
//!   (`regex_match` and a schema's `pattern` are matched by the engine's own
//!   regexes, whose kept caches are bounded whatever the threads; see
//!   `layers::content`.)
//!
//! Guarded jobs may hold [`SLOTS`] threads; the others stay free for short
//! jobs, so abandoned scans never starve ordinary schema checks.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Regex threads, for the life of the process.
pub const THREADS: usize = 3;

/// Guarded jobs running (or finishing abandoned) at once.
pub const SLOTS: usize = 2;

/// Estimated regex work (program bytes × text bytes) above which checks run
/// guarded. Below it a scan takes well under a second on one core.
pub const GUARDED_SCAN_COST: u64 = 1 << 31;

/// The deadline passed before the work finished (or could start).
#[derive(Debug)]
pub struct Expired;

type Job = Box<dyn FnOnce() + Send>;

struct Threads {
    jobs: mpsc::Sender<Job>,
    guarded: Arc<Semaphore>,
}

fn threads() -> &'static Threads {
    static THREADS_CELL: OnceLock<Threads> = OnceLock::new();
    THREADS_CELL.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..THREADS {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new().name(format!("attest-regex-{i}")).spawn(move || loop {
                // The lock is held only while waiting for the next job.
                let job = match queue.lock() {
                    Ok(q) => q.recv(),
                    Err(_) => return,
                };
                match job {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a regex thread");
            }
        }
        Threads {
            jobs,
            guarded: Arc::new(Semaphore::new(SLOTS)),
        }
    })
}

/// Runs `work` as a guarded job and waits for it until `deadline`.
pub async fn run<T: Send + 'static>(deadline: Instant, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Expired> {
    let slot = tokio::time::timeout_at(deadline.into(), threads().guarded.clone().acquire_owned())
        .await
        .map_err(|_| Expired)?
        .map_err(|_| Expired)?;
    submit(deadline, Some(slot), work).await
}

/// Runs short `work` on a regex thread and waits for it until `deadline`.
pub async fn run_short<T: Send + 'static>(deadline: Instant, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Expired> {
    submit(deadline, None, work).await
}

async fn submit<T: Send + 'static>(
    deadline: Instant,
    slot: Option<OwnedSemaphorePermit>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Expired> {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        // Held until the work ends, even when nobody waits for it any more.
        let _slot = slot;
        // Queued past its deadline: nobody waits for it.
        if Instant::now() < deadline {
            let _ = tx.send(work());
        }
    });
    threads().jobs.send(job).map_err(|_| Expired)?;
    tokio::time::timeout_at(deadline.into(), rx)
        .await
        .map_err(|_| Expired)?
        .map_err(|_| Expired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn answers_at_the_deadline_and_lets_the_work_finish() {
        let t0 = Instant::now();
        let r = run(t0 + Duration::from_millis(50), || std::thread::sleep(Duration::from_millis(400))).await;
        assert!(r.is_err());
        assert!(t0.elapsed() < Duration::from_millis(300));
        let ok = run(Instant::now() + Duration::from_secs(5), || 7).await.unwrap();
        assert_eq!(ok, 7);
    }

    #[tokio::test]
    async fn abandoned_guarded_work_leaves_a_thread_for_short_work_and_every_job_runs_on_the_same_threads() {
        let t0 = Instant::now();
        let long = || std::thread::sleep(Duration::from_millis(600));
        // Both guarded slots taken and abandoned.
        for _ in 0..SLOTS {
            assert!(run(t0 + Duration::from_millis(20), long).await.is_err());
        }
        let name = run_short(Instant::now() + Duration::from_secs(5), || {
            std::thread::current().name().map(str::to_owned)
        })
        .await
        .unwrap()
        .unwrap();
        assert!(name.starts_with("attest-regex-"), "{name}");
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "short work waited for the abandoned scans"
        );
    }
}
