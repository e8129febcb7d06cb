//! Layer 4: text checks on a target.
//!
//! - `case_sensitive` defaults to false for `contains`, `not_contains`,
//!   `keyword_all`, `keyword_any` and `forbidden` (comparison by Unicode
//!   lower-casing of both sides).
//! - `regex_match` is RE2 syntax (the `regex` crate's engine: linear time, no
//!   backtracking) and case-sensitive unless `case_sensitive: false` is given
//!   explicitly; patterns are compiled once with the assertion, within
//!   [`REGEX_SIZE_LIMIT`] bytes of compiled program and a lazy-DFA cache of
//!   [`REGEX_DFA_CACHE_BYTES`], so one pattern's memory is bounded. Matching
//!   time is at worst proportional to program size × text length; batches
//!   where that product is large run under a watchdog (see `batch`).
//! - `forbidden` failures are always `hard_fail`, even with `soft: true`.
//! - A non-string target is matched against its compact JSON text.

use super::{Evidence, Spec, SpecError, Verdict};
use crate::target::{Target, GRAMMAR_HINT};
use crate::text::{clip, quote, quote_list};
use crate::trace::Trace;
use aho_corasick::AhoCorasick;
use regex_automata::meta::Regex;
use regex_automata::util::syntax;
use serde_json::Value;
use std::borrow::Cow;

/// Longest accepted regex pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 10_000;
/// Largest compiled regex program (its NFA), in bytes. Bounds both the
/// memory a pattern holds and the cost of each text position it scans.
pub const REGEX_SIZE_LIMIT: usize = 1024 * 1024;
/// Capacity of a regex's lazy-DFA transition cache, per search cache.
pub const REGEX_DFA_CACHE_BYTES: usize = 512 * 1024;
/// A regex's search cache at its largest: the forward and reverse lazy
/// DFAs, and the bounded backtracker's visited set (256 KiB by default).
pub const REGEX_CACHE_BYTES: usize = 2 * REGEX_DFA_CACHE_BYTES + 256 * 1024;

#[derive(Debug)]
pub struct ContentCheck {
    target: Target,
    case_sensitive: bool,
    rule: Rule,
}

#[derive(Debug)]
enum Rule {
    Contains(Needle),
    NotContains(Needle),
    RegexMatch(Pattern),
    KeywordAll(Needles),
    KeywordAny(Needles),
    Forbidden(Needles),
}

/// A compiled regex with the text it was written as.
///
/// The regex keeps at most [`KEPT_CACHES`] search caches between uses. A
/// search that finds none free makes a cache of its own, kept afterwards
/// only if there is room, so what a pattern holds does not grow with the
/// number of threads that ever used it (the regex's built-in pool would
/// keep a cache for each).
#[derive(Debug)]
pub(crate) struct Pattern {
    pub(crate) written: String,
    regex: Regex,
    /// Warm search caches, each with the bytes it held when it was kept.
    kept: std::sync::Mutex<Vec<(regex_automata::meta::Cache, usize)>>,
}

/// Search caches a regex keeps between uses: enough for two searches at
/// once to reuse their warm lazy DFAs.
const KEPT_CACHES: usize = 2;

/// Bytes of warm search caches all regexes together keep between uses. A
/// cache is kept only while the total has room, else dropped after its
/// search; so what compiled regexes hold beyond their programs is bounded
/// here once, and a compiled check is weighed by its program alone (a
/// simple pattern's program is a few KiB, where its caches at their largest
/// would be 2.5 MiB).
pub const KEPT_CACHE_BUDGET: usize = 64 * 1024 * 1024;

/// The bytes [`KEPT_CACHE_BUDGET`] bounds, across every pattern.
static KEPT_CACHE_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Pattern {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().map(|k| k.iter().map(|(_, n)| n).sum::<usize>()).unwrap_or(0);
        KEPT_CACHE_BYTES.fetch_sub(kept, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Texts from this size up are searched at most one per core at a time.
/// Such a search can hold several MiB of state while it runs (a pattern that
/// defeats the lazy DFA), and only requests whose line is larger still carry
/// such texts: they run on the blocking pool, where waiting is harmless, and
/// without this bound as many of them as requests in flight would search at
/// once. With one per core, no throughput is lost.
///
/// The wait for a slot is bounded without a clock: a search costing more
/// than `watchdog::GUARDED_SCAN_COST` runs guarded on the regex threads, never
/// here, so each holder frees its slot well within a second, and the
/// waiters are at most the requests in flight. Sending these searches to the
/// guarded threads instead would queue them behind abandoned slow scans.
const LARGE_TEXT_BYTES: usize = 256 * 1024;

/// A slot among the large searches running at once (see [`LARGE_TEXT_BYTES`]).
struct LargeSearch;

thread_local! {
    /// The deadline of the evaluation running on this thread, if it set one
    /// (see [`within_deadline`]), and whether a search was given up for it.
    static SEARCH_DEADLINE: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    static SEARCH_GIVEN_UP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// When the process gives up on every evaluation still running: the end of
/// its drain at shutdown ([`abandon_at`]).
static ABANDON_AT: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Gives up every evaluation still running at `when` (the end of the
/// drain): long checks stop there and their requests are answered `3002`,
/// so the drain limit bounds the exit whatever is running. Set once.
pub fn abandon_at(when: std::time::Instant) {
    let _ = ABANDON_AT.set(when);
}

/// Whether the evaluation on this thread is past its deadline or the
/// drain's end; if so, it is marked given up (see [`within_deadline`]).
/// For long computations to check every so often.
pub(crate) fn past_deadline(now: std::time::Instant) -> bool {
    let past = SEARCH_DEADLINE.with(std::cell::Cell::get).is_some_and(|d| now >= d) || ABANDON_AT.get().is_some_and(|d| now >= *d);
    if past {
        SEARCH_GIVEN_UP.with(|g| g.set(true));
    }
    past
}

/// Runs `f`, an evaluation of checks, where a large search waits for its
/// slot no later than `deadline`; `None` when one gave up waiting, so that
/// the request is answered `3002` at its deadline rather than late (64
/// requests over half-megabyte texts would otherwise queue past it).
pub fn within_deadline<T>(deadline: std::time::Instant, f: impl FnOnce() -> T) -> Option<T> {
    /// Puts the thread's deadline back however `f` ends, a panic included:
    /// a stale deadline would make a later search on this thread give up.
    struct Restore(Option<std::time::Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEARCH_DEADLINE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(SEARCH_DEADLINE.with(|d| d.replace(Some(deadline))));
    SEARCH_GIVEN_UP.with(|g| g.set(false));
    let out = f();
    (!SEARCH_GIVEN_UP.with(|g| g.replace(false))).then_some(out)
}

impl LargeSearch {
    fn slots() -> &'static (std::sync::Mutex<usize>, std::sync::Condvar) {
        static SLOTS: std::sync::OnceLock<(std::sync::Mutex<usize>, std::sync::Condvar)> = std::sync::OnceLock::new();
        SLOTS.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
            (std::sync::Mutex::new(cores), std::sync::Condvar::new())
        })
    }

    /// A slot, waited for until the evaluation's deadline at most (see
    /// [`within_deadline`]); `None` when it passed first.
    fn acquire() -> Option<LargeSearch> {
        let deadline = match (SEARCH_DEADLINE.with(std::cell::Cell::get), ABANDON_AT.get()) {
            (Some(d), Some(a)) => Some(d.min(*a)),
            (d, a) => d.or(a.copied()),
        };
        let (free, freed) = Self::slots();
        let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        SEARCH_GIVEN_UP.with(|g| g.set(true));
                        return None;
                    }
                    freed.wait_timeout(free, left).unwrap_or_else(|p| p.into_inner()).0
                }
                None => freed.wait(free).unwrap_or_else(|p| p.into_inner()),
            };
        }
        *free -= 1;
        Some(LargeSearch)
    }
}

impl Drop for LargeSearch {
    fn drop(&mut self) {
        let (free, freed) = Self::slots();
        *free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        freed.notify_one();
    }
}

impl Pattern {
    fn new(written: &str, regex: Regex) -> Pattern {
        Pattern {
            written: written.to_owned(),
            regex,
            kept: std::sync::Mutex::new(Vec::with_capacity(KEPT_CACHES)),
        }
    }

    /// Bytes its program holds (its warm search caches are bounded apart,
    /// by [`KEPT_CACHE_BUDGET`]).
    pub(crate) fn program_bytes(&self) -> usize {
        self.regex.memory_usage()
    }

    /// Whether the pattern matches anywhere in `hay` (a JSON Schema
    /// `pattern`: an unanchored search, as ECMA-262's `test`). It stops at
    /// the first match it can prove, without finding where it starts.
    pub(crate) fn is_match(&self, hay: &str) -> bool {
        let input = regex_automata::Input::new(hay).earliest(true);
        self.search(hay.len(), |regex, cache| regex.search_half_with(cache, &input).is_some())
            .unwrap_or(false)
    }

    fn find(&self, hay: &[u8]) -> Option<regex_automata::Match> {
        let input = regex_automata::Input::new(hay);
        self.search(hay.len(), |regex, cache| regex.search_with(cache, &input)).flatten()
    }

    /// Runs `search` with a warm search cache if one is kept, and keeps the
    /// cache afterwards if there is room; `None` when the deadline passed
    /// while the search waited for its slot (the evaluator answers 3002 for
    /// the request, whatever the search would have found).
    fn search<T>(&self, hay_len: usize, search: impl FnOnce(&Regex, &mut regex_automata::meta::Cache) -> T) -> Option<T> {
        let _slot = if hay_len >= LARGE_TEXT_BYTES {
            Some(LargeSearch::acquire()?)
        } else {
            None
        };
        use std::sync::atomic::Ordering;
        let kept = self.kept.lock().ok().and_then(|mut k| k.pop());
        let mut cache = match kept {
            Some((cache, bytes)) => {
                KEPT_CACHE_BYTES.fetch_sub(bytes, Ordering::AcqRel);
                cache
            }
            None => self.regex.create_cache(),
        };
        let found = search(&self.regex, &mut cache);
        if let Ok(mut kept) = self.kept.lock() {
            let bytes = cache.memory_usage();
            let room = KEPT_CACHE_BYTES
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n + bytes <= KEPT_CACHE_BUDGET).then_some(n + bytes)
                })
                .is_ok();
            if kept.len() < KEPT_CACHES && room {
                kept.push((cache, bytes));
            } else if room {
                KEPT_CACHE_BYTES.fetch_sub(bytes, Ordering::AcqRel);
            }
        }
        Some(found)
    }
}

/// A search string as written and as compared.
#[derive(Debug)]
struct Needle {
    written: String,
    compared: String,
}

/// The search strings of a multi-keyword check, with one automaton over
/// them all: the list may hold thousands of keywords and the target
/// megabytes, and a pass over the target per keyword would cost their
/// product.
#[derive(Debug)]
struct Needles {
    list: Vec<Needle>,
    automaton: AhoCorasick,
}

/// Keyword bytes up to which the automaton may be a DFA (built in about 2 ms
/// at this size, whatever the keywords).
const DFA_KEYWORD_BYTES: usize = 2048;

/// Overlapping matches one pass reports before the keywords still unseen
/// are searched for one by one, per byte of the target: keywords that are
/// suffixes of one another (`a`, `aa`, `aaa` …) all match at every
/// position of a text like theirs.
const OVERLAPS_PER_BYTE: usize = 4;

impl Needles {
    fn new(list: Vec<Needle>) -> Result<Needles, SpecError> {
        // The crate's own choice for a few keywords is a DFA, which searches
        // fastest but takes time growing with the square of the keywords'
        // length to build when they repeat themselves (`"ab"` × 40,000: 11 s).
        // Past a few KiB of keywords the contiguous NFA, built in time
        // proportional to their length, is the one taken.
        let bytes: usize = list.iter().map(|n| n.compared.len()).sum();
        let kind = (bytes > DFA_KEYWORD_BYTES).then_some(aho_corasick::AhoCorasickKind::ContiguousNFA);
        let automaton = AhoCorasick::builder()
            .kind(kind)
            .build(list.iter().map(|n| n.compared.as_str()))
            .map_err(|e| {
                SpecError::new(
                    "spec.values",
                    format!("spec.values cannot be searched for: {e}"),
                    "List fewer or shorter keywords.",
                )
            })?;
        Ok(Needles { list, automaton })
    }

    /// Which keywords occur in `hay`, by position in the list.
    fn found(&self, hay: &str) -> Vec<bool> {
        let mut found = vec![false; self.list.len()];
        let mut unseen = self.list.len();
        let mut budget = hay.len().saturating_mul(OVERLAPS_PER_BYTE).max(4096);
        for m in self.automaton.find_overlapping_iter(hay) {
            if !std::mem::replace(&mut found[m.pattern().as_usize()], true) {
                unseen -= 1;
                if unseen == 0 {
                    return found;
                }
            }
            budget -= 1;
            if budget == 0 {
                // Each keyword not seen yet gets a pass of its own.
                for (f, n) in found.iter_mut().zip(&self.list).filter(|(f, _)| !**f) {
                    *f = memchr::memmem::find(hay.as_bytes(), n.compared.as_bytes()).is_some();
                }
                return found;
            }
        }
        found
    }
}

impl std::ops::Deref for Needles {
    type Target = [Needle];
    fn deref(&self) -> &[Needle] {
        &self.list
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Contains,
    NotContains,
    RegexMatch,
    KeywordAll,
    KeywordAny,
    Forbidden,
}

const CHECKS: &[(&str, Kind)] = &[
    ("contains", Kind::Contains),
    ("not_contains", Kind::NotContains),
    ("regex_match", Kind::RegexMatch),
    ("keyword_all", Kind::KeywordAll),
    ("keyword_any", Kind::KeywordAny),
    ("forbidden", Kind::Forbidden),
];

impl ContentCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<ContentCheck, SpecError> {
        let target = Target::parse(spec.str("target")?).map_err(|e| SpecError::new("spec.target", e.message, GRAMMAR_HINT))?;
        let kind = spec.choice("check", CHECKS)?;
        let explicit_case = spec.opt_bool("case_sensitive")?;
        let case_sensitive = match kind {
            Kind::RegexMatch => explicit_case.unwrap_or(true),
            _ => explicit_case.unwrap_or(false),
        };
        let needle = |s: &str| Needle {
            written: s.to_owned(),
            compared: if case_sensitive { s.to_owned() } else { s.to_lowercase() },
        };
        let needles =
            |key: &'static str| -> Result<Needles, SpecError> { Needles::new(spec.str_list(key)?.iter().map(|s| needle(s)).collect()) };
        let rule = match kind {
            Kind::Contains => Rule::Contains(needle(spec.str("value")?)),
            Kind::NotContains => Rule::NotContains(needle(spec.str("value")?)),
            Kind::RegexMatch => Rule::RegexMatch(compile_regex(spec.str("value")?, case_sensitive)?),
            Kind::KeywordAll => Rule::KeywordAll(needles("values")?),
            Kind::KeywordAny => Rule::KeywordAny(needles("values")?),
            Kind::Forbidden => Rule::Forbidden(needles("values")?),
        };
        Ok(ContentCheck {
            target,
            case_sensitive,
            rule,
        })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let t = self.target.as_str();
        let value = match self.target.resolve(trace) {
            Ok(v) => v,
            Err(missing) => {
                let mut v = Verdict::fail(format!("{t} could not be checked: {}.", missing.0)).with(
                    Evidence::new(format!("{t} present"), "not found")
                        .at(t)
                        .hint(format!("Make the agent produce {t}, or point spec.target at the text to check.")),
                );
                v.always_hard = matches!(self.rule, Rule::Forbidden(_));
                return v;
            }
        };
        let text: Cow<'_, str> = match value.as_ref() {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            other => Cow::Owned(other.to_string()),
        };
        let hay: Cow<'_, str> = if self.case_sensitive || matches!(self.rule, Rule::RegexMatch(_)) {
            Cow::Borrowed(&text)
        } else {
            Cow::Owned(text.to_lowercase())
        };
        // Which of a multi-keyword check's keywords occur: one pass over the text.
        let found = match &self.rule {
            Rule::KeywordAll(ns) | Rule::KeywordAny(ns) | Rule::Forbidden(ns) => ns.found(&hay),
            _ => Vec::new(),
        };
        self.decide(t, &hay, &found).on_failure(|| self.evidence(t, &text, &hay, &found))
    }

    /// The expected text and an excerpt of the target around the closest match.
    /// `found`: which keywords of a multi-keyword check occur in `hay`.
    fn evidence(&self, t: &str, text: &str, hay: &str, found: &[bool]) -> Evidence {
        let list = |ns: &[Needle]| ns.iter().map(|n| format!("'{}'", n.written)).collect::<Vec<_>>().join(", ");
        let (expected, near, hint) = match &self.rule {
            Rule::Contains(n) => (
                format!("contains '{}'", n.written),
                closest(hay, &n.compared),
                format!(
                    "Make the agent's {t} include '{}', or loosen the check (keyword_any, regex_match) if other wording is acceptable.",
                    clip(&n.written, 80)
                ),
            ),
            Rule::NotContains(n) => (
                format!("does not contain '{}'", n.written),
                hay.find(n.compared.as_str()),
                format!(
                    "Stop the agent writing '{}' in {t} (prompt or post-processing).",
                    clip(&n.written, 80)
                ),
            ),
            Rule::RegexMatch(p) => (
                format!("matches /{}/", p.written),
                None,
                format!(
                    "Make {t} follow the pattern /{}/, or widen the pattern to accept this output.",
                    clip(&p.written, 80)
                ),
            ),
            Rule::KeywordAll(ns) => {
                let missing = ns.iter().zip(found).find(|(_, f)| !**f).map(|(n, _)| n);
                (
                    format!("all of {}", list(ns)),
                    missing.and_then(|n| closest(hay, &n.compared)),
                    format!(
                        "Make the agent's {t} mention '{}', or drop it from spec.values if it is optional.",
                        clip(missing.map_or("", |n| n.written.as_str()), 80)
                    ),
                )
            }
            Rule::KeywordAny(ns) => (
                format!("any of {}", list(ns)),
                // The first few keywords only: each costs a few passes over the text.
                ns.iter().take(CLOSEST_TRIED).find_map(|n| closest(hay, &n.compared)),
                format!(
                    "Make the agent's {t} mention one of {}, or add the wording it uses to spec.values.",
                    clip(&list(ns), 120)
                ),
            ),
            Rule::Forbidden(ns) => {
                let hit = ns
                    .iter()
                    .zip(found)
                    .find(|(_, f)| **f)
                    .and_then(|(n, _)| hay.find(n.compared.as_str()).map(|at| (n, at)));
                (
                    format!("none of {}", list(ns)),
                    hit.map(|(_, at)| at),
                    format!(
                        "'{}' must never appear in {t}: filter it out of the agent's output or fix the prompt that produces it.",
                        clip(hit.map_or("", |(n, _)| n.written.as_str()), 80)
                    ),
                )
            }
        };
        // Lower-casing can move byte offsets; then the excerpt is of the compared text.
        let source = if hay.len() == text.len() { text } else { hay };
        Evidence::new(clip(&expected, 300), excerpt(source, near.unwrap_or(0)))
            .at(t)
            .hint(hint)
    }

    fn decide(&self, t: &str, hay: &str, found: &[bool]) -> Verdict {
        let mode = if self.case_sensitive { "" } else { " (case-insensitive)" };
        match &self.rule {
            Rule::Contains(n) => {
                let ok = hay.contains(n.compared.as_str());
                let rel = if ok { "contains" } else { "does not contain" };
                Verdict::from_bool(ok, format!("{t} {rel} {}{mode}.", quote(&n.written)))
            }
            Rule::NotContains(n) => {
                let ok = !hay.contains(n.compared.as_str());
                let rel = if ok { "does not contain" } else { "contains" };
                let tail = if ok { "" } else { " but should not" };
                Verdict::from_bool(ok, format!("{t} {rel} {}{tail}{mode}.", quote(&n.written)))
            }
            Rule::RegexMatch(p) => match p.find(hay.as_bytes()) {
                Some(m) => Verdict::pass(format!("{t} matches regex {} at {}.", quote(&p.written), quote(&hay[m.range()]))),
                None => Verdict::fail(format!("{t} does not match regex {}.", quote(&p.written))),
            },
            Rule::KeywordAll(ns) => {
                let missing: Vec<&str> = ns
                    .iter()
                    .zip(found)
                    .filter(|(_, f)| !**f)
                    .map(|(n, _)| n.written.as_str())
                    .collect();
                if missing.is_empty() {
                    Verdict::pass(format!("{t} contains all {} keywords{mode}.", ns.len()))
                } else {
                    let found = ns.len() - missing.len();
                    Verdict {
                        passed: false,
                        score: found as f64 / ns.len() as f64,
                        explanation: format!(
                            "{t} is missing keywords {} ({found} of {} found){mode}.",
                            quote_list(&missing),
                            ns.len()
                        ),
                        always_hard: false,
                        evidence: None,
                    }
                }
            }
            Rule::KeywordAny(ns) => match ns.iter().zip(found).find(|(_, f)| **f) {
                Some((n, _)) => Verdict::pass(format!("{t} contains keyword {}{mode}.", quote(&n.written))),
                None => {
                    let all: Vec<&str> = ns.iter().map(|n| n.written.as_str()).collect();
                    Verdict::fail(format!("{t} contains none of the keywords {}{mode}.", quote_list(&all)))
                }
            },
            Rule::Forbidden(ns) => {
                let hits: Vec<&str> = ns.iter().zip(found).filter(|(_, f)| **f).map(|(n, _)| n.written.as_str()).collect();
                if hits.is_empty() {
                    Verdict::pass(format!("{t} contains none of the {} forbidden terms{mode}.", ns.len()))
                } else {
                    Verdict {
                        always_hard: true,
                        ..Verdict::fail(format!("{t} contains forbidden terms {}{mode}.", quote_list(&hits)))
                    }
                }
            }
        }
    }
}

/// Keywords of a `keyword_any` check tried for the evidence's excerpt.
const CLOSEST_TRIED: usize = 8;

/// Byte offset where the longest prefix of `needle` (at least 3 chars)
/// occurs in `hay`: where the text comes closest to containing it.
///
/// A prefix occurs wherever a longer one does, so the longest is found by
/// bisection: a few passes over the text, not one per character.
fn closest(hay: &str, needle: &str) -> Option<usize> {
    let ends: Vec<usize> = needle
        .char_indices()
        .map(|(i, c)| i + c.len_utf8())
        .filter(|&e| e >= 3.min(needle.len()))
        .collect();
    let at = |k: usize| memchr::memmem::find(hay.as_bytes(), &needle.as_bytes()[..ends[k]]);
    // Invariant: the prefix ending at ends[lo - 1] occurs (or lo == 0);
    // those ending at ends[hi] and beyond do not.
    let (mut lo, mut hi, mut best) = (0, ends.len(), None);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match at(mid) {
            Some(pos) => {
                best = Some(pos);
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    best
}

/// About 120 characters of `text` around byte `at`, marked where clipped.
fn excerpt(text: &str, at: usize) -> String {
    const BEFORE: usize = 40;
    const LEN: usize = 120;
    let mut start = at.saturating_sub(BEFORE).min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let body = clip(&text[start..], LEN);
    if start > 0 {
        format!("…{body}")
    } else {
        body
    }
}

impl ContentCheck {
    /// Bytes of compiled program a scan of the target walks: with the
    /// text's length, an upper bound on how long matching may take.
    pub fn scan_weight(&self) -> usize {
        match &self.rule {
            Rule::RegexMatch(p) => p.regex.memory_usage().max(1),
            _ => 0,
        }
    }

    /// Memory this check holds, for cache accounting: the compiled program
    /// (its warm search caches are bounded apart, by [`KEPT_CACHE_BUDGET`]).
    pub fn memory_bytes(&self) -> usize {
        match &self.rule {
            Rule::RegexMatch(p) => p.regex.memory_usage() + p.written.len() + 256,
            Rule::Contains(n) | Rule::NotContains(n) => n.written.len() + n.compared.len(),
            Rule::KeywordAll(ns) | Rule::KeywordAny(ns) | Rule::Forbidden(ns) => {
                ns.automaton.memory_usage() + ns.iter().map(|n| n.written.len() + n.compared.len() + 48).sum::<usize>()
            }
        }
    }
}

/// The parser's reason and where it found it, from its display:
/// `regex parse error:`, the pattern indented by four, carets under the
/// problem, then `error: <reason>`; the build error around it only says
/// "error parsing pattern 0".
fn syntax_reason(display: &str) -> String {
    let lines: Vec<&str> = display.lines().collect();
    let reason = lines.last().map_or("", |l| l.trim().trim_start_matches("error: "));
    let at = lines
        .iter()
        .find(|l| l.trim_start().starts_with('^'))
        .map(|l| l.len() - l.trim_start().len())
        .filter(|&indent| indent >= 4)
        .map(|indent| format!(" at character {}", indent - 4 + 1));
    format!("{reason}{}", at.unwrap_or_default())
}

/// Why a pattern is not run.
enum Refusal {
    Oversized(Size),
    Invalid(String),
}

/// Which bound an oversized pattern passes.
enum Size {
    /// Its text, past [`MAX_PATTERN_BYTES`].
    Long,
    /// Its compiled program, past [`REGEX_SIZE_LIMIT`].
    Large,
}

/// Who runs a compiled pattern, which decides what is built for it.
#[derive(Clone, Copy)]
enum Runner {
    /// The engine's own searches (`regex_match`, a schema's `pattern`): they
    /// ask where a match is, never for capture groups, so no one-pass DFA is
    /// built (it only serves capture searches, and for a pattern like
    /// `\b\d{3}-\d{4}\b` it is four times the rest of the program).
    Engine,
    /// The schema crate's `regex::Regex` (a `patternProperties` key), built
    /// as that crate builds it, so that its size is measured as it is held.
    SchemaCrate,
}

/// The pattern as `runner` runs it, within the bounds every regex keeps:
/// at most [`MAX_PATTERN_BYTES`] of text and [`REGEX_SIZE_LIMIT`] compiled.
fn build_regex(pattern: &str, case_sensitive: bool, runner: Runner) -> Result<Regex, Refusal> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(Refusal::Oversized(Size::Long));
    }
    let config = Regex::config()
        .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
        .hybrid_cache_capacity(REGEX_DFA_CACHE_BYTES);
    let config = match runner {
        Runner::Engine => config.onepass(false),
        Runner::SchemaCrate => config,
    };
    Regex::builder()
        .syntax(syntax::Config::new().case_insensitive(!case_sensitive))
        .configure(config)
        .build(pattern)
        .map_err(|e| match e.size_limit() {
            Some(_) => Refusal::Oversized(Size::Large),
            None => Refusal::Invalid(e.syntax_error().map_or_else(|| e.to_string(), |s| syntax_reason(&s.to_string()))),
        })
}

/// The error for a pattern refused for its size, at `field` (`spec.value`,
/// or the schema keyword that holds it).
fn oversized(field: &str, pattern: &str, size: Size) -> SpecError {
    match size {
        Size::Long => SpecError::new(
            field,
            format!("regex pattern exceeds maximum length: {} > {MAX_PATTERN_BYTES} bytes", pattern.len()),
            "Shorten the pattern; split very large alternations into several assertions or use keyword_any.",
        ),
        Size::Large => SpecError::new(
            field,
            format!("regex {} is too large: it compiles to more than {REGEX_SIZE_LIMIT} bytes", quote(pattern)),
            "Large counted repetitions (a{10000}, \\w{500}) and big Unicode classes repeated many times make huge programs. Use smaller counts, ASCII classes ((?-u:\\w)), or split the check into several assertions.",
        ),
    }
}

/// Checks a schema's `patternProperties` key (at `field`) against
/// `regex_match`'s bounds, before the schema compiler spends seconds on a
/// huge one; returns the bytes its compiled program holds (0 for one that
/// does not compile: the schema compiler refuses it, naming why).
pub(crate) fn check_schema_pattern(field: &str, pattern: &str) -> Result<usize, SpecError> {
    match build_regex(pattern, true, Runner::SchemaCrate) {
        Err(Refusal::Oversized(size)) => Err(oversized(field, pattern, size)),
        Err(Refusal::Invalid(_)) => Ok(0),
        Ok(regex) => Ok(regex.memory_usage()),
    }
}

/// A schema's `pattern` (at `field`, as written in ECMA-262 syntax),
/// compiled for layer 4's engine with `regex_match`'s bounds.
pub(crate) fn schema_pattern(field: &str, written: &str) -> Result<Pattern, SchemaPatternError> {
    // ECMA-262's classes (`\d` is ASCII digits, `\s` its own whitespace) in
    // the regex crate's syntax, as the schema crate's own `pattern` reads
    // them. The translation fails where the parser does: the pattern as
    // written then says why.
    let translated = jsonschema_regex::to_rust_regex(written);
    let invalid = |reason: &str| {
        SchemaPatternError::Invalid(format!(
            "{} is not a valid regular expression: {}",
            quote(written),
            clip(reason, 200)
        ))
    };
    match build_regex(translated.as_deref().unwrap_or(written), true, Runner::Engine) {
        Err(Refusal::Oversized(size)) => Err(SchemaPatternError::Refused(oversized(field, written, size))),
        Err(Refusal::Invalid(reason)) => Err(invalid(&reason)),
        Ok(_) if translated.is_err() => Err(invalid("it is not valid ECMA-262 syntax")),
        Ok(regex) => Ok(Pattern::new(written, regex)),
    }
}

/// Why a schema's `pattern` is not run.
#[derive(Clone)]
pub(crate) enum SchemaPatternError {
    /// Past `regex_match`'s bounds: refused before the schema is compiled,
    /// naming where the pattern is.
    Refused(SpecError),
    /// Not a regular expression, and why: the schema compiler's to refuse.
    Invalid(String),
}

fn compile_regex(pattern: &str, case_sensitive: bool) -> Result<Pattern, SpecError> {
    let regex = build_regex(pattern, case_sensitive, Runner::Engine).map_err(|refusal| match refusal {
        Refusal::Oversized(size) => oversized("spec.value", pattern, size),
        Refusal::Invalid(reason) => SpecError::new(
            "spec.value",
            format!("invalid regex {}", quote(pattern)),
            format!(
                "The regex pattern {} is not valid RE2 syntax ({}). Fix the regex in the assertion spec; note RE2 has no lookaround or backreferences.",
                quote(pattern),
                clip(&reason, 200)
            ),
        ),
    })?;
    Ok(Pattern::new(pattern, regex))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every large-search slot taken (others' long scans): a search under a
    /// deadline gives up waiting at the deadline and says so, instead of
    /// answering whenever a slot frees.
    #[test]
    fn a_large_search_waits_for_a_slot_no_later_than_its_deadline() {
        let taken: Vec<LargeSearch> = std::iter::from_fn(|| {
            let (free, _) = LargeSearch::slots();
            let any = *free.lock().unwrap() > 0;
            any.then(|| LargeSearch::acquire().unwrap())
        })
        .collect();
        let p = compile_regex("refund", true).unwrap();
        let hay = "x".repeat(LARGE_TEXT_BYTES);
        let started = std::time::Instant::now();
        let deadline = started + std::time::Duration::from_millis(200);
        assert_eq!(
            within_deadline(deadline, || p.find(hay.as_bytes())),
            None,
            "gave up at the deadline"
        );
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(190) && waited < std::time::Duration::from_secs(2),
            "{waited:?}"
        );
        drop(taken);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        assert_eq!(
            within_deadline(deadline, || p.find(hay.as_bytes()).is_some()),
            Some(false),
            "a free slot searches"
        );
    }

    /// The engine never asks for capture groups, so its regexes carry no
    /// one-pass DFA, which for this pattern is four times the rest.
    #[test]
    fn a_regex_holds_no_one_pass_dfa() {
        let p = compile_regex(r"\b\d{3}-\d{4}\b", true).unwrap();
        assert!(p.program_bytes() < 100 * 1024, "{}", p.program_bytes());
        let m = p.find("call 555-1234 now".as_bytes()).unwrap();
        assert_eq!(m.range(), 5..13);
    }
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use serde_json::value::RawValue;

    fn needles(words: &[&str]) -> Needles {
        let list = words
            .iter()
            .map(|w| Needle {
                written: w.to_string(),
                compared: w.to_string(),
            })
            .collect();
        Needles::new(list).unwrap()
    }

    #[test]
    fn keywords_are_found_in_one_pass_whatever_their_overlaps() {
        let ns = needles(&["refund", "fund", "zzz", "processed", "und"]);
        assert_eq!(ns.found("your refund is processed"), [true, true, false, true, true]);
        // Keywords that are suffixes of one another all match at every
        // position: past the overlap budget, the unseen ones are searched
        // for one by one, with the same answer.
        let nested: Vec<String> = (1..=200).map(|k| "a".repeat(k)).chain(["b".into()]).collect();
        let ns = needles(&nested.iter().map(String::as_str).collect::<Vec<_>>());
        let text = "a".repeat(150);
        let found = ns.found(&text);
        assert!(found[..150].iter().all(|f| *f) && !found[150..].iter().any(|f| *f), "{found:?}");
        assert!(ns.found(&format!("{text}b"))[200]);
        // Long keywords that repeat themselves are searched with an NFA,
        // which their length cannot make slow to build; a few short ones
        // with the DFA.
        let long = "ab".repeat(40_000);
        let ns = needles(&[long.as_str(), "zz"]);
        assert_eq!(ns.automaton.kind(), aho_corasick::AhoCorasickKind::ContiguousNFA);
        assert_eq!(ns.found(&format!("x{long}x")), [true, false]);
        assert_eq!(ns.found(&long[1..]), [false, false]);
        assert_eq!(needles(&["refund"]).automaton.kind(), aho_corasick::AhoCorasickKind::DFA);
    }

    #[test]
    fn closest_finds_the_longest_prefix_that_occurs() {
        assert_eq!(closest("the refunded order", "refund id"), Some(4));
        assert_eq!(closest("xx abcdef", "abcdefgh"), Some(3));
        assert_eq!(closest("no match here", "qqqq"), None);
        assert_eq!(closest("ab", "ab"), Some(0), "short needles count from their whole length");
        let long = "k".repeat(500);
        assert_eq!(closest(&format!("..{}", &long[..300]), &long), Some(2));
    }

    fn trace() -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t",
            "steps": [{"type": "tool_call", "name": "lookup", "result": {"status": "Delivered", "amount": 89.99}}],
            "output": {"message": "Your Refund of $89.99 has been processed. Refund ID: RFD-001.", "structured": {"n": 3}}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    fn run(spec: Value) -> Verdict {
        ContentCheck::compile(&Spec::new(Some(&spec), "content").unwrap())
            .unwrap()
            .evaluate(&trace())
    }

    fn msg(check: &str, extra: Value) -> Value {
        let mut s = json!({"target": "output.message", "check": check});
        s.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        s
    }

    #[test]
    fn contains_is_case_insensitive_by_default() {
        assert!(run(msg("contains", json!({"value": "refund"}))).passed);
        assert!(!run(msg("contains", json!({"value": "refund", "case_sensitive": true}))).passed);
        assert!(!run(msg("not_contains", json!({"value": "REFUND"}))).passed);
        assert!(run(msg("not_contains", json!({"value": "cannot process"}))).passed);
    }

    #[test]
    fn a_regex_keeps_a_bounded_number_of_search_caches_whatever_the_threads() {
        let p = compile_regex("(?-u)[ab]*a[ab]{13}c", true).unwrap();
        let hay = "ab".repeat(20_000);
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    barrier.wait();
                    for _ in 0..5 {
                        assert!(p.find(hay.as_bytes()).is_none());
                    }
                });
            }
        });
        let kept = p.kept.lock().unwrap().len();
        assert!(
            (1..=KEPT_CACHES).contains(&kept),
            "{kept} caches kept after 8 threads searched at once"
        );
        assert_eq!(p.find(b"xaabbbbbbbbbbbbc").map(|m| m.range()), Some(1..16));
    }

    #[test]
    fn regex_is_case_sensitive_unless_asked() {
        let v = run(msg("regex_match", json!({"value": "RFD-\\d{3,}"})));
        assert!(v.passed);
        assert!(v.explanation.contains("'RFD-001'"), "{}", v.explanation);
        assert!(!run(msg("regex_match", json!({"value": "rfd-\\d+"}))).passed);
        assert!(run(msg("regex_match", json!({"value": "rfd-\\d+", "case_sensitive": false}))).passed);
    }

    #[test]
    fn keywords() {
        assert!(run(msg("keyword_all", json!({"values": ["refund", "processed"]}))).passed);
        let v = run(msg(
            "keyword_all",
            json!({"values": ["refund", "business days", "apology", "rfd-"]}),
        ));
        assert!(!v.passed);
        assert_eq!(v.score, 0.5);
        assert!(run(msg("keyword_any", json!({"values": ["nope", "processed"]}))).passed);
        assert!(!run(msg("keyword_any", json!({"values": ["nope", "never"]}))).passed);
    }

    #[test]
    fn forbidden_is_always_hard() {
        let v = run(msg("forbidden", json!({"values": ["kill", "REFUND"]})));
        assert!(!v.passed && v.always_hard);
        assert!(v.explanation.contains("'REFUND'"));
        assert!(run(msg("forbidden", json!({"values": ["kill"]}))).passed);
    }

    #[test]
    fn other_targets() {
        let s = json!({"target": "steps[?name=='lookup'].result.status", "check": "contains", "value": "deliver"});
        assert!(run(s).passed);
        let s = json!({"target": "output.structured", "check": "contains", "value": "\"n\":3"});
        assert!(run(s).passed, "objects are matched as compact JSON");
        let s = json!({"target": "output.summary", "check": "contains", "value": "x"});
        let v = run(s);
        assert!(!v.passed);
        assert!(v.explanation.contains("field 'summary' not found in output"), "{}", v.explanation);
    }

    #[test]
    fn spec_errors() {
        let err = |s: Value| ContentCheck::compile(&Spec::new(Some(&s), "content").unwrap()).unwrap_err();
        let e = err(msg("regex_match", json!({"value": "[unclosed"})));
        assert_eq!(e.message, "invalid regex '[unclosed'");
        assert!(
            e.detail.contains("not valid RE2 syntax (unclosed character class at character 1)"),
            "{}",
            e.detail
        );
        // The parser's own reason and place, not "error parsing pattern 0".
        let e = err(msg("regex_match", json!({"value": "ab(?=x)"})));
        assert!(
            e.detail.contains("look-around") && e.detail.contains("at character 3"),
            "{}",
            e.detail
        );
        assert!(!e.detail.contains("pattern 0"), "{}", e.detail);
        assert_eq!(err(msg("contains", json!({"value": ""}))).field, "spec.value");
        assert_eq!(err(msg("keyword_all", json!({"values": []}))).field, "spec.values");
        assert_eq!(err(msg("keyword_all", json!({"values": ["a", 1]}))).field, "spec.values[1]");
        assert!(err(msg("fuzzy", json!({}))).detail.contains("regex_match"));
        assert_eq!(err(json!({"check": "contains", "value": "x"})).field, "spec.target");
        assert_eq!(
            err(msg("contains", json!({"value": "x", "case_sensitive": "yes"}))).field,
            "spec.case_sensitive"
        );
        let long = "a".repeat(MAX_PATTERN_BYTES + 1);
        assert!(err(msg("regex_match", json!({"value": long})))
            .message
            .starts_with("regex pattern exceeds maximum length"));
    }
}
