//! Where a request's work runs: on the async workers, or where it may block.
//!
//! Every line starts on the async workers holding one of the general
//! request slots. Work that may hold a thread for up to the eval timeout
//! (plugin calls, history reads for dynamic thresholds and `query_drift`)
//! leaves the async workers once the request is parsed and planned and the
//! engine knows it is there, so the decision is made from the request's
//! parsed values, never from its bytes. On a multi-threaded runtime the work
//! stays on its thread, which hands its worker role to another thread while
//! the work runs (`block_in_place`); on the single-threaded runtime used on
//! one CPU it moves to the blocking pool. Leaving trades the general slot
//! for one of the blocking share (`plugins::call_share`), so slow plugins
//! cannot hold every slot while plain requests wait behind them, and off the
//! async workers they cannot stall other requests.
//!
//! Lines too large to parse quickly start on the pool (see `server`).

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

thread_local! {
    static ON_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is a blocking-pool thread running request work. The
/// async workers are as many as the cores; the pool's threads are as many as
/// requests in flight, which matters for state kept per thread (see
/// `watchdog`, schema patterns).
pub fn on_pool() -> bool {
    ON_POOL.get()
}

/// Runs `f` as request work on a blocking-pool thread.
pub fn pool_work<T>(f: impl FnOnce() -> T) -> T {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            ON_POOL.set(false);
        }
    }
    ON_POOL.set(true);
    let _unmark = Unmark;
    f()
}

/// One line's place: the slot it holds and whether it may block its thread.
pub struct Lane {
    general: Option<OwnedSemaphorePermit>,
    share: Option<Arc<Semaphore>>,
    pooled: Option<OwnedSemaphorePermit>,
    /// The current thread may block (a blocking-pool thread, or a caller
    /// that runs requests one at a time on its own thread).
    may_block: bool,
}

impl Lane {
    /// A line on the async workers, holding a general slot; `share` bounds
    /// the lines that may run blocking work at once.
    pub fn new(general: OwnedSemaphorePermit, share: Arc<Semaphore>) -> Lane {
        Lane {
            general: Some(general),
            share: Some(share),
            pooled: None,
            may_block: false,
        }
    }

    /// For callers whose thread may block: work runs where it is called
    /// (benchmarks, and callers that drive one request at a time).
    pub fn on_own_thread() -> Lane {
        Lane {
            general: None,
            share: None,
            pooled: None,
            may_block: true,
        }
    }

    /// Whether work may block the current thread.
    pub fn may_block(&self) -> bool {
        self.may_block
    }

    /// Trades the general slot for one of the blocking share (waiting for
    /// one) and marks the line as running where it may block. The caller
    /// then runs the line where it may block (see [`Lane::block`]).
    pub async fn enter_pool(&mut self) {
        if self.may_block {
            return;
        }
        if let Some(share) = &self.share {
            self.pooled = share.clone().acquire_owned().await.ok();
        }
        self.general = None;
        self.may_block = true;
    }

    /// Runs `work` where it may block: right here when this thread already
    /// may, else after [`Lane::enter_pool`] as blocking work: in place on a
    /// multi-threaded runtime (whose worker role moves to another thread
    /// meanwhile), on the blocking pool on a single-threaded one. A panic in
    /// `work` is raised again here, so the caller's panic handling sees it
    /// wherever the work ran.
    pub async fn block<T, F>(&mut self, work: F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        if self.may_block {
            return work.await;
        }
        self.enter_pool().await;
        let runtime = tokio::runtime::Handle::current();
        if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            // The work stays on this thread, which hands its worker role
            // (and the tasks queued on it) to another thread for as long as
            // the work runs. Nothing waits for a thread to wake up to start
            // the work or to take its answer back, which two hand-offs
            // between threads would cost (docs/benchmarks.md).
            return tokio::task::block_in_place(|| pool_work(|| runtime.block_on(work)));
        }
        match tokio::task::spawn_blocking(move || pool_work(|| runtime.block_on(work))).await {
            Ok(value) => value,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // The runtime is shutting down and dropped the task.
                Err(e) => std::panic::panic_any(format!("request task on the blocking pool did not finish: {e}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn work_moves_to_the_pool_once_and_hands_the_general_slot_back() {
        let general = Arc::new(Semaphore::new(1));
        let share = Arc::new(Semaphore::new(1));
        let mut lane = Lane::new(general.clone().acquire_owned().await.unwrap(), share.clone());
        assert!(!lane.may_block());
        let here = std::thread::current().id();
        let there = lane.block(async { std::thread::current().id() }).await;
        assert_ne!(here, there, "work ran on a blocking-pool thread");
        assert!(lane.may_block());
        assert_eq!(general.available_permits(), 1, "the general slot was handed back");
        assert_eq!(share.available_permits(), 0, "the line holds a slot of the blocking share");
        // Already on the pool's share: later work runs in place.
        assert_eq!(lane.block(async { std::thread::current().id() }).await, here);
        drop(lane);
        assert_eq!(share.available_permits(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn on_a_multi_threaded_runtime_work_blocks_in_place_while_other_tasks_go_on() {
        // On the runtime's only worker thread, as a request's task is.
        tokio::spawn(async {
            let general = Arc::new(Semaphore::new(1));
            let share = Arc::new(Semaphore::new(1));
            let mut lane = Lane::new(general.clone().acquire_owned().await.unwrap(), share.clone());
            let here = std::thread::current().id();
            // Queued on the same worker: it runs only if the blocked thread
            // handed its worker role on.
            let (tx, rx) = std::sync::mpsc::channel();
            let other = tokio::spawn(async move { tx.send(()).unwrap() });
            let (there, marked, other_ran) = lane
                .block(async move {
                    let other_ran = rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok();
                    (std::thread::current().id(), on_pool(), other_ran)
                })
                .await;
            assert_eq!(here, there, "the work ran on the thread that asked for it");
            assert!(marked, "as request work that may block");
            assert!(other_ran, "the runtime's other task ran while the work blocked");
            assert!(!on_pool(), "the thread runs async tasks again");
            assert_eq!(general.available_permits(), 1, "the general slot was handed back");
            assert_eq!(share.available_permits(), 0, "the line holds a slot of the blocking share");
            other.await.unwrap();
        })
        .await
        .unwrap();
    }

    /// A panic in a lane's blocking work reaches the caller, and the thread
    /// is no longer marked as running request work.
    async fn a_panic_in_work_reaches_the_caller() {
        use futures_util::FutureExt;
        let mut lane = Lane::new(
            Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap(),
            Arc::new(Semaphore::new(1)),
        );
        let caught = std::panic::AssertUnwindSafe(lane.block::<(), _>(async { panic!("plugin host bug") }))
            .catch_unwind()
            .await
            .unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"plugin host bug"));
        assert!(!on_pool());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_panic_in_work_blocking_in_place_is_raised_for_the_caller() {
        // On the runtime's only worker thread, as a request's task is.
        tokio::spawn(a_panic_in_work_reaches_the_caller()).await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_on_the_pool_is_raised_again_for_the_caller() {
        a_panic_in_work_reaches_the_caller().await;
    }
}
