//! Running CPU-bound checks that could outlast their request's deadline.
//!
//! Regex scans are linear in program size × text length, but both may be
//! large: a 1 MiB program over a 10 MB trace is minutes of work, and neither
//! the `regex` engine nor `jsonschema` can be interrupted. Such work runs on
//! its own thread while the request waits for it *with its deadline*: at the
//! deadline the request is answered `3002` and the thread finishes in the
//! background, its result dropped.
//!
//! Abandoned work still costs CPU, so at most [`SLOTS`] such threads exist at
//! once; a request that cannot get a slot before its deadline also gets
//! `3002`. Each thread's life is bounded by the regex size limit times the
//! trace size limit.

use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::{oneshot, Semaphore};

/// Threads running (or finishing abandoned) guarded work at once.
pub const SLOTS: usize = 2;

/// Estimated regex work (program bytes × text bytes) above which checks run
/// guarded. Below it a scan takes well under a second on one core.
pub const GUARDED_SCAN_COST: u64 = 1 << 31;

/// The deadline passed before the work finished (or could start).
#[derive(Debug)]
pub struct Expired;

fn slots() -> Arc<Semaphore> {
    static SLOTS_SEM: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS_SEM.get_or_init(|| Arc::new(Semaphore::new(SLOTS))).clone()
}

/// Runs `work` on a guarded thread and waits for it until `deadline`.
pub async fn run<T: Send + 'static>(deadline: Instant, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Expired> {
    let deadline = tokio::time::Instant::from_std(deadline);
    let permit = tokio::time::timeout_at(deadline, slots().acquire_owned())
        .await
        .map_err(|_| Expired)?
        .map_err(|_| Expired)?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("attest-guarded".into())
        .spawn(move || {
            // Held until the work ends, even when nobody waits for it any more.
            let _permit = permit;
            let _ = tx.send(work());
        })
        .map_err(|_| Expired)?;
    tokio::time::timeout_at(deadline, rx)
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
}
