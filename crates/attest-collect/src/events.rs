//! What the collector and its workers observe, one type per event: each
//! counts itself in [`Metrics`] and logs itself through `tracing`, in one
//! place, so a counter and its log line can neither drift apart nor be
//! forgotten one without the other (Vector's internal events).
//!
//! A repeated failure (a full disk fails every trace) is logged at most once
//! per [`LogThrottle::EVERY`] with [`InternalEvent::emit_throttled`], saying how
//! many like it were counted but not shown. Counters with no line of their
//! own (spans received, traces assembled) stay plain counters in
//! [`Metrics`]; messages with no counter (start-up, drains, summaries) are
//! plain `tracing` calls where they happen.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::assemble::DropReason;
use crate::metrics::Metrics;
use crate::writer::Output;
use crate::{bounded, shown_id};

/// An observable event: counted, then logged.
pub trait InternalEvent: Sized {
    /// Adds the event to its counters.
    fn count(&self, metrics: &Metrics);

    /// Writes its log line. `unshown` is how many like it were counted but
    /// not logged since the last line (see [`InternalEvent::emit_throttled`]).
    fn log(&self, unshown: u64);

    /// Counts the event and logs it.
    fn emit(self, metrics: &Metrics) {
        self.count(metrics);
        self.log(0);
    }

    /// Counts the event, and logs it unless a line like it was written
    /// within the last [`LogThrottle::EVERY`].
    fn emit_throttled(self, metrics: &Metrics, throttle: &LogThrottle) {
        self.count(metrics);
        if let Some(unshown) = throttle.hit() {
            self.log(unshown);
        }
    }
}

/// At most one log line per [`LogThrottle::EVERY`] for a repeated event,
/// saying how many were not shown: a failing disk or a stalled reader must
/// not flood stderr with a line per trace.
#[derive(Default)]
pub struct LogThrottle {
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    pub const EVERY: Duration = Duration::from_secs(10);

    /// `Some(not shown since the last line)` when this occurrence is to be
    /// logged, `None` when it is only counted.
    pub fn hit(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.0.is_some_and(|t| now.duration_since(t) < Self::EVERY) {
            s.1 += 1;
            return None;
        }
        s.0 = Some(now);
        Some(std::mem::take(&mut s.1))
    }
}

/// Suffix of a throttled log line: how many like it were not shown.
pub(crate) fn unshown(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last such line, not shown)")
    }
}

/// A work message delivered again: its last holder did not ack it in time
/// (crashed, stalled, or gave it back).
pub struct Redelivered<'a> {
    /// `None` when the message is not a work item (it is dead-lettered next).
    pub trace_id: Option<&'a str>,
    pub delivery: i64,
}

impl InternalEvent for Redelivered<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.redeliveries.fetch_add(1, Ordering::Relaxed);
    }
    fn log(&self, _: u64) {
        let trace = self.trace_id.map(shown_id).unwrap_or_default();
        tracing::info!(trace_id = %trace, delivery = self.delivery, "redelivery {} of trace {trace}", self.delivery);
    }
}

/// A work message selected under other rules than this worker's, given back
/// for a worker that has the same rules.
pub struct RulesMismatch<'a> {
    pub trace_id: &'a str,
    /// The version the message was selected under, and this worker's.
    pub theirs: &'a str,
    pub ours: &'a str,
}

impl RulesMismatch<'_> {
    /// Why the message is refused, as its dead letter says it.
    pub fn why(&self) -> String {
        format!(
            "selected under rules version {} but this worker runs {}",
            bounded(self.theirs, 64),
            self.ours
        )
    }
}

impl InternalEvent for RulesMismatch<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.rules_mismatches.fetch_add(1, Ordering::Relaxed);
    }
    fn log(&self, unshown_n: u64) {
        tracing::warn!(
            trace_id = %shown_id(self.trace_id),
            theirs = %bounded(self.theirs, 64),
            ours = %self.ours,
            "trace {} {}; given back for a worker with the same rules (counted in attest_collect_rules_mismatch_total){}",
            shown_id(self.trace_id),
            self.why(),
            unshown(unshown_n)
        );
    }
}

/// A publish the server dropped as a duplicate: the same message id within
/// the stream's duplicate window (a redelivery after a crash before the ack).
pub struct AlreadyPublished<'a> {
    pub trace_id: &'a str,
    pub stream: &'a str,
}

impl InternalEvent for AlreadyPublished<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.publish_duplicates.fetch_add(1, Ordering::Relaxed);
    }
    fn log(&self, _: u64) {
        tracing::info!(
            trace_id = %shown_id(self.trace_id),
            stream = %self.stream,
            "results of trace {} were already in {} (same message id within the duplicate window); not stored twice",
            shown_id(self.trace_id),
            self.stream
        );
    }
}

/// A work message moved to the dead-letter subject, to be replayed once its
/// cause is fixed.
pub struct DeadLettered<'a> {
    pub trace_id: &'a str,
    pub subject: &'a str,
    pub why: &'a str,
    /// The dead letter was there already, from an earlier delivery.
    pub already: bool,
}

impl InternalEvent for DeadLettered<'_> {
    fn count(&self, metrics: &Metrics) {
        if self.already {
            metrics.publish_duplicates.fetch_add(1, Ordering::Relaxed);
        } else {
            metrics.dead_lettered.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn log(&self, _: u64) {
        let already = if self.already {
            " (it was there already, from an earlier delivery)"
        } else {
            ""
        };
        tracing::warn!(
            trace_id = %shown_id(self.trace_id),
            subject = %self.subject,
            "trace {} moved to {}{already} ({})",
            shown_id(self.trace_id),
            self.subject,
            self.why
        );
    }
}

/// A durable consumer made again because its stream was reset beneath it.
pub struct ConsumerReset<'a> {
    pub consumer: &'a str,
    pub stream: &'a str,
    pub consumer_delivered: u64,
    pub stream_first: u64,
    pub stream_last: u64,
    pub stream_messages: u64,
}

impl InternalEvent for ConsumerReset<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.consumer_resets.fetch_add(1, Ordering::Relaxed);
    }
    fn log(&self, _: u64) {
        tracing::warn!(
            consumer = %self.consumer,
            stream = %self.stream,
            consumer_delivered = self.consumer_delivered,
            stream_first = self.stream_first,
            stream_last = self.stream_last,
            stream_messages = self.stream_messages,
            "the stream was reset beneath its durable consumer (a server that lost part of its store); making the consumer again so that it delivers what the stream holds"
        );
    }
}

/// A batch of results messages a sink could not store; they are offered
/// again.
pub struct StoreFailed<'a> {
    pub error: &'a anyhow::Error,
}

impl InternalEvent for StoreFailed<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.store_failures.fetch_add(1, Ordering::Relaxed);
    }
    fn log(&self, unshown_n: u64) {
        tracing::warn!("storing failed, will retry: {:#}{}", self.error, unshown(unshown_n));
    }
}

/// A trace whose evaluation failed as a whole: no result is stored.
pub struct EvaluationFailed<'a> {
    pub trace_id: &'a str,
    pub error: &'a dyn std::fmt::Display,
}

impl InternalEvent for EvaluationFailed<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.dropped("evaluation_failed", 0);
    }
    fn log(&self, _: u64) {
        tracing::warn!(
            trace_id = %shown_id(self.trace_id),
            "evaluation of {} failed: {}",
            shown_id(self.trace_id),
            self.error
        );
    }
}

/// Spans of a trace that are no steps of their own: a model call inside a
/// tool, say. Its tokens count and the trace names them.
pub struct SpansNested<'a> {
    pub trace_id: &'a str,
    pub spans: u64,
}

impl InternalEvent for SpansNested<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.spans_nested.fetch_add(self.spans, Ordering::Relaxed);
    }
    fn log(&self, _: u64) {
        tracing::info!(
            trace_id = %shown_id(self.trace_id),
            spans = self.spans,
            "spans nested under a tool or model call are no steps of their own; metadata.nested_spans names them"
        );
    }
}

/// Spans whose parent never came (an exporter that lost it, a service not
/// instrumented): the trace is evaluated without them.
pub struct SpansUnreachable<'a> {
    pub trace_id: &'a str,
    pub spans: u64,
}

impl InternalEvent for SpansUnreachable<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.spans_unreachable.fetch_add(self.spans, Ordering::Relaxed);
    }
    fn log(&self, _: u64) {
        tracing::info!(
            trace_id = %shown_id(self.trace_id),
            spans = self.spans,
            "spans left out of the evaluated trace: no chain of parents joins them to its root"
        );
    }
}

/// A trace that converted to more JSON than the evaluator takes.
pub struct ConvertedTooLarge<'a> {
    pub trace_id: &'a str,
    pub spans: u64,
    pub limit: usize,
}

impl InternalEvent for ConvertedTooLarge<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.dropped(DropReason::TraceTooLarge.as_str(), self.spans);
    }
    fn log(&self, _: u64) {
        tracing::warn!(
            trace_id = %bounded(self.trace_id, 64),
            "the converted trace is over the engine's {}-byte trace limit and was not evaluated",
            self.limit
        );
    }
}

/// A message on the results stream that is not a result list.
pub struct MalformedResults<'a> {
    pub bytes: usize,
    pub error: &'a serde_json::Error,
}

impl InternalEvent for MalformedResults<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.dropped("malformed_results", 0);
    }
    fn log(&self, _: u64) {
        tracing::warn!(
            bytes = self.bytes,
            "a results message ({} bytes) is not a result list, dropped: {}",
            self.bytes,
            bounded(&self.error.to_string(), 300)
        );
    }
}

/// Result records of a message whose ids the stores would refuse.
pub struct ResultsRefused<'a> {
    pub refused: u64,
    pub total: usize,
    pub problem: &'a str,
    pub trace_id: &'a str,
}

impl InternalEvent for ResultsRefused<'_> {
    fn count(&self, metrics: &Metrics) {
        metrics.results_dropped("id_too_long", self.refused);
    }
    fn log(&self, _: u64) {
        tracing::warn!(
            trace_id = %shown_id(self.trace_id),
            "{} of {} results in a message not stored ({}; trace {})",
            self.refused,
            self.total,
            self.problem,
            shown_id(self.trace_id)
        );
    }
}

/// Why lines of an output file (`--results-jsonl`, `--traces-out`) were lost.
pub enum LostCause<'a> {
    /// The write queue was full: the file or the pipe's reader takes lines
    /// slower than they come.
    QueueFull {
        entries: usize,
        bytes: usize,
    },
    WriteFailed(&'a str),
    /// Still queued when a drain's deadline passed.
    Stalled(Duration),
}

/// Lines an output file did not get.
pub struct OutputLost<'a> {
    pub output: Output,
    /// The file as shown (its path).
    pub file: &'a str,
    pub lines: u64,
    pub cause: LostCause<'a>,
    /// Whether the lines count here: a write asked to confirm is retried by
    /// its caller, which counts it if it gives up.
    pub counted: bool,
}

impl InternalEvent for OutputLost<'_> {
    fn count(&self, metrics: &Metrics) {
        if self.counted {
            let reason = match self.cause {
                LostCause::QueueFull { .. } => "queue_full",
                LostCause::WriteFailed(_) => "write_failed",
                LostCause::Stalled(_) => "shutdown",
            };
            self.output.count(metrics, reason, self.lines);
        }
    }
    fn log(&self, unshown_n: u64) {
        let (flag, file, lines, what) = (self.output.flag(), self.file, self.lines, self.output.what());
        let more = unshown(unshown_n);
        match &self.cause {
            LostCause::QueueFull { entries, bytes } => tracing::warn!(
                "{flag} {file}: the write queue is full ({entries} writes or {} MiB; the file or the pipe's reader takes lines slower than they come): {lines} {what} dropped{more}",
                bytes >> 20
            ),
            LostCause::WriteFailed(e) => tracing::warn!("{flag} {file}: writing {lines} {what} failed: {e}{more}"),
            LostCause::Stalled(timeout) => tracing::warn!(
                "{flag} {file}: {lines} {what} still queued were not written within {timeout:?} (the file or the pipe's reader is stalled){more}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_counts_whether_or_not_it_is_logged() {
        let metrics = Metrics::default();
        let throttle = LogThrottle::default();
        for delivery in 2..5 {
            Redelivered {
                trace_id: Some("t"),
                delivery,
            }
            .emit_throttled(&metrics, &throttle);
        }
        assert_eq!(metrics.redeliveries.load(Ordering::Relaxed), 3);
        // The first was shown; the next two were held back.
        assert_eq!(throttle.hit(), None);
    }

    #[test]
    fn a_repeated_failure_is_logged_once_per_interval_with_the_count_not_shown() {
        let log = LogThrottle::default();
        assert_eq!((log.hit(), log.hit(), log.hit()), (Some(0), None, None));
        log.state.lock().unwrap().0 = Instant::now().checked_sub(LogThrottle::EVERY);
        assert_eq!(log.hit(), Some(2));
        assert_eq!(unshown(2), " (2 more since the last such line, not shown)");
    }

    #[test]
    fn a_dead_letter_already_there_counts_as_a_duplicate() {
        let metrics = Metrics::default();
        let dead = |already| DeadLettered {
            trace_id: "t",
            subject: "ATTEST_DEAD",
            why: "x",
            already,
        };
        dead(false).emit(&metrics);
        dead(true).emit(&metrics);
        assert_eq!(metrics.dead_lettered.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.publish_duplicates.load(Ordering::Relaxed), 1);
    }
}
