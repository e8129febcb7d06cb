//! Grouping spans into traces. A trace is closed for evaluation once its root
//! span has arrived and no span of it arrived for the settle time. Open traces
//! are bounded by count and by bytes; when a bound is hit the oldest trace is
//! closed early (if its root is there) or dropped, and every drop is counted
//! with its reason. A trace that an earlier export opened is only closed once
//! it has its place in the evaluation queue: an export that would push it out
//! of a full queue has its own spans refused instead.
//!
//! OTLP delivery is at least once: an exporter whose request timed out sends
//! it again. A span whose (trace id, span id) the open trace holds already is
//! a duplicate; the first copy is kept and the others only counted.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::otlp::Span;

/// Bounds and timings of the assembler; defaults are documented in docs/continuous.md.
#[derive(Debug, Clone)]
pub struct Limits {
    pub settle: Duration,
    /// A trace whose root never arrives is dropped this long after its last span.
    pub orphan_timeout: Duration,
    pub max_open_traces: usize,
    pub max_open_bytes: usize,
    pub max_trace_bytes: usize,
    pub max_trace_spans: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            settle: Duration::from_secs(2),
            orphan_timeout: Duration::from_secs(30),
            max_open_traces: 10_000,
            max_open_bytes: 256 << 20,
            max_trace_bytes: 16 << 20,
            max_trace_spans: 10_000,
        }
    }
}

/// Why spans were dropped instead of evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The trace grew past `max_trace_bytes`, or converted to more JSON
    /// than the evaluator takes.
    TraceTooLarge,
    /// The trace grew past `max_trace_spans`.
    TooManySpans,
    /// No root span arrived within the orphan timeout (or before shutdown).
    NoRoot,
    /// Evicted by the open-trace bounds before its root arrived.
    EvictedWithoutRoot,
    /// Arrived after its trace was already closed: evaluated, or dropped
    /// without its root (`no_root`, `evicted_without_root`), whose late
    /// root is not evaluated alone. Counted as dropped spans only: the
    /// trace itself was counted when it closed.
    LateSpan,
    /// Spans map to no known convention (neither GenAI nor OpenInference).
    UnknownConvention,
    /// The evaluation queue was full when the trace closed.
    QueueFull,
    /// A JSONL input line that is not an Attest trace.
    Malformed,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TraceTooLarge => "trace_too_large",
            DropReason::TooManySpans => "too_many_spans",
            DropReason::NoRoot => "no_root",
            DropReason::EvictedWithoutRoot => "evicted_without_root",
            DropReason::LateSpan => "late_span",
            DropReason::UnknownConvention => "unknown_convention",
            DropReason::QueueFull => "queue_full",
            DropReason::Malformed => "malformed",
        }
    }
}

/// A complete trace ready for conversion.
#[derive(Debug)]
pub struct ClosedTrace {
    pub trace_id: String,
    pub spans: Vec<Span>,
    /// The spans' size as the assembler counted it (`Span::size_bytes`).
    pub bytes: usize,
    /// True when the bounds closed it before its settle time passed.
    pub early: bool,
}

#[derive(Debug, PartialEq)]
pub struct Dropped {
    pub trace_id: String,
    pub reason: DropReason,
    pub spans: u64,
    /// Whether this drop is the trace's own: false for spans that arrive
    /// after their trace was already dropped for its size, which count as
    /// dropped spans of a trace counted once.
    pub counts_trace: bool,
}

impl Dropped {
    /// Adds this drop to the collector's counters.
    pub fn count(&self, metrics: &crate::metrics::Metrics) {
        if self.counts_trace {
            metrics.dropped(self.reason.as_str(), self.spans);
        } else {
            metrics.dropped_spans(self.reason.as_str(), self.spans);
        }
    }
}

/// What adding spans or polling did. `P` is a place in the evaluation queue,
/// granted by the caller's `admit` (see [`Assembler::add`] and
/// [`Assembler::poll`]).
#[derive(Debug)]
pub struct Events<P = ()> {
    /// Closed traces still to be queued: the export's own, closed early by
    /// the bounds, or everything at [`Assembler::drain`].
    pub ready: Vec<ClosedTrace>,
    /// Closed traces that hold their place in the queue already.
    pub placed: Vec<(ClosedTrace, P)>,
    pub dropped: Vec<Dropped>,
    /// The export's spans refused because making room for them would have
    /// closed an earlier export's trace while the queue had no place for it.
    pub refused: Vec<Span>,
    /// Spans not added because their trace holds a span with the same id
    /// already (an exporter's retry).
    pub duplicates: u64,
    /// This export's spans that will not be evaluated, and the first
    /// reason: their trace went over a bound (with the spans this export
    /// had added to it), or was closed before they came. What the answer
    /// reports as rejected (an OTLP partial success).
    pub rejected: u64,
    pub rejected_reason: Option<DropReason>,
}

impl<P> Default for Events<P> {
    fn default() -> Self {
        Events {
            ready: Vec::new(),
            placed: Vec::new(),
            dropped: Vec::new(),
            rejected: 0,
            rejected_reason: None,
            refused: Vec::new(),
            duplicates: 0,
        }
    }
}

struct OpenTrace {
    seq: u64,
    spans: Vec<Span>,
    /// Ids of `spans`, to recognise a span sent again.
    span_ids: HashSet<String>,
    bytes: usize,
    has_root: bool,
    last_arrival: Instant,
}

/// Memory an open trace holds besides its spans: its entries in the
/// assembler's maps (by id, by age), its id twice as text, its span id set.
/// Measured with the spans' estimate (see `otlp::SPAN_BYTES`).
pub const TRACE_BYTES: usize = 512;

/// How many closed trace ids are remembered to recognise late spans.
const CLOSED_MEMORY: usize = 100_000;

pub struct Assembler {
    limits: Limits,
    open: HashMap<String, OpenTrace>,
    /// Open traces by first arrival, oldest first.
    order: BTreeMap<u64, String>,
    next_seq: u64,
    bytes: usize,
    closed: HashMap<String, DropReason>,
    closed_order: VecDeque<String>,
}

impl Assembler {
    pub fn new(limits: Limits) -> Self {
        Assembler {
            limits,
            open: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            closed: HashMap::new(),
            closed_order: VecDeque::new(),
        }
    }

    pub fn open_traces(&self) -> usize {
        self.open.len()
    }

    pub fn open_bytes(&self) -> usize {
        self.bytes
    }

    /// Adds one export's spans. When the bounds close a trace that an earlier
    /// export opened, `admit` (given the trace's bytes) must grant its place
    /// in the evaluation queue first; when it cannot, the span that needed
    /// the room is refused (`Events::refused`) and that trace stays open. The
    /// export's own traces closed early come back in `Events::ready`, for the
    /// export to queue or reject in its answer.
    pub fn add<P>(&mut self, spans: Vec<Span>, now: Instant, mut admit: impl FnMut(usize) -> Option<P>) -> Events<P> {
        let mut events = Events::default();
        // Traces numbered from here on were opened by this export.
        let first_own = self.next_seq;
        // Spans this export added to each trace, so that a trace dropped
        // for a bound rejects this export's part of it.
        let mut added_here: HashMap<String, u64> = HashMap::new();
        let reject = |events: &mut Events<P>, spans: u64, reason: DropReason| {
            events.rejected += spans;
            events.rejected_reason.get_or_insert(reason);
        };
        for span in spans {
            if let Some(reason) = self.closed.get(&span.trace_id) {
                // Spans of a trace dropped for its size keep that reason; spans of
                // an evaluated trace are late. Neither is another dropped
                // trace: the trace was counted when it closed.
                let reason = match reason {
                    DropReason::TraceTooLarge | DropReason::TooManySpans => *reason,
                    _ => DropReason::LateSpan,
                };
                push_spans_drop(&mut events, &span.trace_id, reason, 1);
                reject(&mut events, 1, reason);
                continue;
            }
            if self.open.get(&span.trace_id).is_some_and(|t| t.span_ids.contains(&span.span_id)) {
                events.duplicates += 1;
                continue;
            }
            let trace_id = span.trace_id.clone();
            // The first span of a trace also pays for the trace's own
            // bookkeeping; it stays in the trace's bytes until it closes.
            let size = span.size_bytes + if self.open.contains_key(&trace_id) { 0 } else { TRACE_BYTES };
            let is_root = span.is_local_root();
            let seq = self.next_seq;
            let entry = self.open.entry(trace_id.clone()).or_insert_with(|| OpenTrace {
                seq,
                spans: Vec::new(),
                span_ids: HashSet::new(),
                bytes: 0,
                has_root: false,
                last_arrival: now,
            });
            if entry.seq == seq {
                self.next_seq += 1;
                self.order.insert(seq, trace_id.clone());
            }
            let too_many = entry.spans.len() + 1 > self.limits.max_trace_spans;
            let too_large = entry.bytes + size > self.limits.max_trace_bytes;
            if too_many || too_large {
                let reason = if too_many {
                    DropReason::TooManySpans
                } else {
                    DropReason::TraceTooLarge
                };
                let dropped = self.remove(&trace_id).map(|t| t.spans.len() as u64).unwrap_or(0);
                push_drop(&mut events, &trace_id, reason, dropped + 1);
                reject(&mut events, 1 + added_here.remove(&trace_id).unwrap_or(0), reason);
                self.remember_closed(trace_id, reason);
                continue;
            }
            *added_here.entry(trace_id.clone()).or_default() += 1;
            let had_root = entry.has_root;
            entry.span_ids.insert(span.span_id.clone());
            entry.spans.push(span);
            entry.bytes += size;
            entry.has_root |= is_root;
            entry.last_arrival = now;
            self.bytes += size;
            if !self.enforce_bounds(&mut events, first_own, &mut admit) {
                if let Some(n) = added_here.get_mut(&trace_id) {
                    *n -= 1;
                }
                events.refused.extend(self.take_back(&trace_id, had_root));
            }
        }
        events
    }

    /// Undoes the last span added to `trace_id`, whose room could not be
    /// made. The bounds held before it came, so they hold again.
    fn take_back(&mut self, trace_id: &str, had_root: bool) -> Option<Span> {
        let t = self.open.get_mut(trace_id)?;
        let span = t.spans.pop()?;
        t.span_ids.remove(&span.span_id);
        t.bytes -= span.size_bytes;
        t.has_root = had_root;
        self.bytes -= span.size_bytes;
        if t.spans.is_empty() {
            self.remove(trace_id);
        }
        Some(span)
    }

    /// The bytes of the oldest open trace: the one the bounds close next.
    pub fn oldest_bytes(&self) -> Option<usize> {
        let (_, id) = self.order.first_key_value()?;
        self.open.get(id).map(|t| t.bytes)
    }

    /// Closes settled traces, oldest first, each once `admit` grants it a
    /// place in the evaluation queue (given the trace's bytes) into
    /// `Events::placed`; the first it refuses and all later ones stay open
    /// until there is room. Also drops orphans whose root never came.
    pub fn poll<P>(&mut self, now: Instant, mut admit: impl FnMut(usize) -> Option<P>) -> Events<P> {
        let mut events = Events::default();
        let mut settled = Vec::new();
        let mut orphans = Vec::new();
        for (id, t) in &self.open {
            let idle = now.saturating_duration_since(t.last_arrival);
            if t.has_root && idle >= self.limits.settle {
                settled.push((t.seq, t.bytes, id.clone()));
            } else if !t.has_root && idle >= self.limits.orphan_timeout {
                orphans.push(id.clone());
            }
        }
        settled.sort();
        for (_, bytes, id) in settled {
            let Some(place) = admit(bytes) else { break };
            if let Some(t) = self.close(id, false) {
                events.placed.push((t, place));
            }
        }
        for id in orphans {
            if let Some(t) = self.remove(&id) {
                push_drop(&mut events, &id, DropReason::NoRoot, t.spans.len() as u64);
                // Its root may still come (an agent step longer than the
                // orphan timeout): alone, it would open a new trace missing
                // the dropped spans and be scored as if complete.
                self.remember_closed(id, DropReason::NoRoot);
            }
        }
        events
    }

    /// Closes everything (shutdown): traces with a root are evaluated, the rest dropped.
    pub fn drain(&mut self) -> Events {
        let mut events = Events::default();
        let ids: Vec<String> = self.order.values().cloned().collect();
        for id in ids {
            if let Some(t) = self.remove(&id) {
                if t.has_root {
                    events.ready.push(ClosedTrace {
                        trace_id: id,
                        spans: t.spans,
                        bytes: t.bytes,
                        early: true,
                    });
                } else {
                    push_drop(&mut events, &id, DropReason::NoRoot, t.spans.len() as u64);
                    self.remember_closed(id, DropReason::NoRoot);
                }
            }
        }
        events
    }

    /// Closes or drops the oldest open traces until the bounds hold. Returns
    /// false, leaving the rest open, when the oldest is an earlier export's
    /// trace with its root and `admit` has no place for it: that export was
    /// told its spans were accepted, so they are not dropped on another's
    /// behalf.
    fn enforce_bounds<P>(&mut self, events: &mut Events<P>, first_own: u64, admit: &mut impl FnMut(usize) -> Option<P>) -> bool {
        while self.open.len() > self.limits.max_open_traces || self.bytes > self.limits.max_open_bytes {
            let Some((&seq, oldest)) = self.order.first_key_value() else {
                break;
            };
            let oldest = oldest.clone();
            let Some(t) = self.open.get(&oldest) else {
                self.order.remove(&seq);
                continue;
            };
            if !t.has_root {
                let spans = self.remove(&oldest).map_or(0, |t| t.spans.len() as u64);
                push_drop(events, &oldest, DropReason::EvictedWithoutRoot, spans);
                // As for an orphan: a root arriving later must not be
                // evaluated without the spans dropped here.
                self.remember_closed(oldest, DropReason::EvictedWithoutRoot);
            } else if seq < first_own {
                let Some(place) = admit(t.bytes) else { return false };
                if let Some(t) = self.close(oldest, true) {
                    events.placed.push((t, place));
                }
            } else if let Some(t) = self.close(oldest, true) {
                events.ready.push(t);
            }
        }
        true
    }

    /// Takes a trace out for evaluation; its later spans count as late.
    fn close(&mut self, id: String, early: bool) -> Option<ClosedTrace> {
        let t = self.remove(&id)?;
        self.remember_closed(id.clone(), DropReason::LateSpan);
        Some(ClosedTrace {
            trace_id: id,
            spans: t.spans,
            bytes: t.bytes,
            early,
        })
    }

    fn remove(&mut self, id: &str) -> Option<OpenTrace> {
        let t = self.open.remove(id)?;
        self.order.remove(&t.seq);
        self.bytes -= t.bytes;
        Some(t)
    }

    fn remember_closed(&mut self, id: String, reason: DropReason) {
        if self.closed.insert(id.clone(), reason).is_none() {
            self.closed_order.push_back(id);
            if self.closed_order.len() > CLOSED_MEMORY {
                if let Some(old) = self.closed_order.pop_front() {
                    self.closed.remove(&old);
                }
            }
        }
    }
}

fn push_drop<P>(events: &mut Events<P>, trace_id: &str, reason: DropReason, spans: u64) {
    push(events, trace_id, reason, spans, true);
}

/// Spans of a trace whose own drop was counted already.
fn push_spans_drop<P>(events: &mut Events<P>, trace_id: &str, reason: DropReason, spans: u64) {
    push(events, trace_id, reason, spans, false);
}

fn push<P>(events: &mut Events<P>, trace_id: &str, reason: DropReason, spans: u64, counts_trace: bool) {
    if let Some(last) = events.dropped.last_mut() {
        if last.trace_id == trace_id && last.reason == reason && last.counts_trace == counts_trace {
            last.spans += spans;
            return;
        }
    }
    events.dropped.push(Dropped {
        trace_id: trace_id.to_string(),
        reason,
        spans,
        counts_trace,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;
    use std::sync::Arc;

    fn span(trace: &str, id: &str, parent: Option<&str>) -> Span {
        Span {
            trace_id: trace.into(),
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            parent_is_remote: false,
            name: "s".into(),
            start_unix_nanos: 0,
            end_unix_nanos: 0,
            attributes: Map::new(),
            events: vec![],
            resource: Arc::new(Map::new()),
            scope: "".into(),
            log_event: false,
            is_error: false,
            size_bytes: 100,
        }
    }

    /// Adds spans with room in the queue for every trace closed.
    fn add(a: &mut Assembler, spans: Vec<Span>, now: Instant) -> Events {
        a.add(spans, now, |_| Some(()))
    }

    fn limits() -> Limits {
        Limits {
            settle: Duration::from_secs(1),
            orphan_timeout: Duration::from_secs(5),
            max_open_traces: 2,
            max_open_bytes: 10_000,
            max_trace_bytes: 1_000,
            max_trace_spans: 3,
        }
    }

    #[test]
    fn closes_after_settle_only_with_root() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        add(&mut a, vec![span("t1", "b", Some("a"))], t0);
        let any = |_: usize| Some(());
        assert!(a.poll(t0 + Duration::from_secs(2), any).placed.is_empty(), "no root yet");
        add(&mut a, vec![span("t1", "a", None)], t0 + Duration::from_secs(2));
        assert!(a.poll(t0 + Duration::from_millis(2500), any).placed.is_empty(), "not settled");
        assert!(
            a.poll(t0 + Duration::from_secs(3), |_| None::<()>).placed.is_empty(),
            "no room in the queue: stays open"
        );
        let ev = a.poll(t0 + Duration::from_secs(3), any);
        assert!(ev.ready.is_empty());
        assert_eq!(ev.placed.len(), 1);
        assert_eq!(ev.placed[0].0.spans.len(), 2);
        let late = add(&mut a, vec![span("t1", "c", Some("a"))], t0 + Duration::from_secs(4));
        // A late span is a dropped span, not another dropped trace: the
        // trace was evaluated.
        assert_eq!(
            late.dropped,
            vec![Dropped {
                trace_id: "t1".into(),
                reason: DropReason::LateSpan,
                spans: 1,
                counts_trace: false,
            }]
        );
        assert_eq!(a.open_traces(), 0);
        assert_eq!(a.open_bytes(), 0);
    }

    #[test]
    fn oldest_is_evaluated_or_dropped_when_count_bound_hit() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        add(&mut a, vec![span("t1", "a", None)], t0);
        add(&mut a, vec![span("t2", "a", Some("x"))], t0);
        let ev = add(&mut a, vec![span("t3", "a", None)], t0);
        // An earlier export's trace leaves with its place in the queue.
        assert!(ev.ready.is_empty());
        assert_eq!(ev.placed.len(), 1);
        assert_eq!(ev.placed[0].0.trace_id, "t1");
        assert!(ev.placed[0].0.early);
        let ev = add(&mut a, vec![span("t4", "a", None)], t0);
        assert_eq!(ev.dropped[0].reason, DropReason::EvictedWithoutRoot);
        assert_eq!(a.open_traces(), 2);
        // An export's own traces closed early come back for it to queue.
        let ev = add(
            &mut a,
            vec![span("t5", "a", None), span("t6", "a", None), span("t7", "a", None)],
            t0,
        );
        let ids: Vec<_> = ev.ready.iter().map(|t| t.trace_id.as_str()).collect();
        assert_eq!((ev.placed.len(), ids), (2, vec!["t5"]), "t3 and t4 placed, t5 the export's own");
    }

    #[test]
    fn an_earlier_exports_trace_is_not_closed_without_a_place_in_the_queue() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        add(&mut a, vec![span("t1", "a", None)], t0);
        add(&mut a, vec![span("t2", "a", None)], t0);
        // The queue is full: the new export's spans are refused, and the
        // traces the earlier exports were told were accepted stay open.
        let ev = a.add(vec![span("t3", "a", None), span("t1", "b", Some("a"))], t0, |_| None::<()>);
        let refused: Vec<_> = ev.refused.iter().map(|s| s.trace_id.as_str()).collect();
        assert_eq!(refused, ["t3"], "t3 needed room; t1's span did not");
        assert!(ev.placed.is_empty() && ev.ready.is_empty() && ev.dropped.is_empty());
        assert_eq!((a.open_traces(), a.open_bytes()), (2, 300 + 2 * TRACE_BYTES));
        // By bytes too, and a refused span that joined an open trace leaves
        // it as it was.
        let mut big = span("t2", "b", Some("a"));
        big.size_bytes = 900;
        let mut tight = limits();
        tight.max_open_bytes = 1_000 + 2 * TRACE_BYTES;
        tight.max_trace_bytes = 10_000;
        let mut b = Assembler::new(tight);
        add(&mut b, vec![span("t1", "a", None)], t0);
        add(&mut b, vec![span("t2", "x", Some("a"))], t0);
        let ev = b.add(vec![big], t0, |_| None::<()>);
        // t1 cannot leave, so the span is taken back from t2.
        assert_eq!(ev.refused.len(), 1);
        assert_eq!(
            (b.open_traces(), b.open_bytes(), b.oldest_bytes()),
            (2, 200 + 2 * TRACE_BYTES, Some(100 + TRACE_BYTES))
        );
        let ev = b.poll(t0 + Duration::from_secs(2), |_| Some(()));
        assert_eq!(ev.placed.len(), 1, "t1 settles and leaves once the queue has room");
    }

    #[test]
    fn oversized_traces_are_dropped_with_their_later_spans() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        let ev = add(
            &mut a,
            vec![
                span("t1", "a", None),
                span("t1", "b", Some("a")),
                span("t1", "c", Some("a")),
                span("t1", "d", Some("a")),
            ],
            t0,
        );
        assert_eq!(
            ev.dropped,
            vec![Dropped {
                trace_id: "t1".into(),
                reason: DropReason::TooManySpans,
                spans: 4,
                counts_trace: true,
            }]
        );
        // Later spans of it are dropped spans, not another dropped trace.
        let ev = add(&mut a, vec![span("t1", "e", Some("a"))], t0);
        assert_eq!(
            (ev.dropped[0].reason, ev.dropped[0].counts_trace),
            (DropReason::TooManySpans, false)
        );
        let mut big = span("t2", "a", None);
        big.size_bytes = 5_000;
        assert_eq!(add(&mut a, vec![big], t0).dropped[0].reason, DropReason::TraceTooLarge);
        assert_eq!(a.open_bytes(), 0);
    }

    #[test]
    fn orphans_time_out_and_drain_closes_everything() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        add(&mut a, vec![span("t1", "b", Some("a"))], t0);
        assert_eq!(
            a.poll(t0 + Duration::from_secs(6), |_| Some(())).dropped[0].reason,
            DropReason::NoRoot
        );
        add(&mut a, vec![span("t2", "a", None)], t0);
        add(&mut a, vec![span("t3", "b", Some("a"))], t0);
        let ev = a.drain();
        assert_eq!(ev.ready.len(), 1);
        assert_eq!(ev.dropped.len(), 1);
        assert_eq!(a.open_traces(), 0);
    }

    #[test]
    fn the_late_root_of_a_trace_dropped_without_it_is_late_not_a_new_trace() {
        let late_root = |a: &mut Assembler, trace: &str, at: Instant| {
            let ev = add(a, vec![span(trace, "a", None)], at);
            assert_eq!(
                ev.dropped,
                vec![Dropped {
                    trace_id: trace.into(),
                    reason: DropReason::LateSpan,
                    spans: 1,
                    counts_trace: false,
                }],
                "{trace}"
            );
            assert!(a.poll(at + Duration::from_secs(60), |_| Some(())).placed.is_empty(), "{trace}");
        };
        // Dropped as an orphan: its root came after the orphan timeout.
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        add(&mut a, vec![span("t1", "b", Some("a"))], t0);
        let ev = a.poll(t0 + Duration::from_secs(6), |_| Some(()));
        assert_eq!(ev.dropped[0].reason, DropReason::NoRoot);
        late_root(&mut a, "t1", t0 + Duration::from_secs(7));
        // Evicted by the bounds before its root came.
        add(&mut a, vec![span("t2", "b", Some("a"))], t0);
        add(&mut a, vec![span("t3", "b", Some("a"))], t0);
        let ev = add(&mut a, vec![span("t4", "b", Some("a"))], t0);
        assert_eq!(ev.dropped[0].reason, DropReason::EvictedWithoutRoot);
        late_root(&mut a, "t2", t0);
        // Dropped at shutdown's drain.
        a.drain();
        late_root(&mut a, "t3", t0);
    }

    #[test]
    fn a_span_sent_again_is_kept_once_and_counted() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        // An exporter's retry: the same request twice, one copy inside it too.
        let request = vec![span("t1", "a", None), span("t1", "b", Some("a"))];
        assert_eq!(add(&mut a, request.clone(), t0).duplicates, 0);
        let ev = add(&mut a, [request, vec![span("t1", "b", Some("a"))]].concat(), t0);
        assert_eq!(ev.duplicates, 3);
        assert_eq!(a.open_bytes(), 200 + TRACE_BYTES, "duplicates hold no memory");
        let ev = a.poll(t0 + Duration::from_secs(2), |_| Some(()));
        let ids: Vec<_> = ev.placed[0].0.spans.iter().map(|s| s.span_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        // A span refused for room is forgotten too, so its retry is taken.
        let mut tight = limits();
        tight.max_open_traces = 1;
        let mut b = Assembler::new(tight);
        add(&mut b, vec![span("t1", "a", None)], t0);
        let ev = b.add(vec![span("t2", "a", None)], t0, |_| None::<()>);
        assert_eq!(ev.refused.len(), 1);
        let ev = add(&mut b, vec![span("t2", "a", None)], t0);
        assert_eq!((ev.duplicates, ev.placed.len()), (0, 1));
    }

    #[test]
    fn a_span_whose_parent_is_remote_is_a_root() {
        let mut a = Assembler::new(limits());
        let t0 = Instant::now();
        let mut local_root = span("t1", "a", Some("caller"));
        local_root.parent_is_remote = true;
        add(&mut a, vec![local_root, span("t1", "b", Some("a"))], t0);
        let ev = a.poll(t0 + Duration::from_secs(2), |_| Some(()));
        assert_eq!(ev.placed.len(), 1, "settled and closed, not held as an orphan");
        // Without the remote flag the same spans wait for their root.
        add(&mut a, vec![span("t2", "a", Some("caller"))], t0);
        assert!(a.poll(t0 + Duration::from_secs(2), |_| Some(())).placed.is_empty());
    }
}
