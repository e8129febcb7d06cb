//! Session reports: every batch result and every submitted plugin result of
//! one engine session, grouped by trace, written as JUnit XML, JSON or
//! Markdown at shutdown and at end of input (`--report kind=path`).
//!
//! Results are only kept in memory when at least one report is configured.

use crate::layers::{AssertionType, Status};
use crate::plugin_results::PluginResult;
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    Junit,
    Json,
    Markdown,
}

const KINDS: &[(&str, ReportKind)] = &[
    ("junit", ReportKind::Junit),
    ("json", ReportKind::Json),
    ("markdown", ReportKind::Markdown),
];

/// One `--report kind=path`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSpec {
    pub kind: ReportKind,
    pub path: PathBuf,
}

impl ReportSpec {
    /// Parses `kind=path`; a relative path in a config file is relative to it (`base`).
    pub fn parse(text: &str, base: &Path) -> Result<ReportSpec> {
        let valid = "use junit=<path>, json=<path> or markdown=<path>";
        let Some((kind, path)) = text.split_once('=') else {
            bail!("report '{text}' has no '=': {valid}");
        };
        let Some(&(_, kind)) = KINDS.iter().find(|(k, _)| *k == kind.trim()) else {
            bail!("unknown report kind '{}': {valid}", kind.trim());
        };
        if path.trim().is_empty() {
            bail!("report '{text}' has an empty path: {valid}");
        }
        let path = base.join(path.trim());
        if path.is_dir() {
            bail!(
                "report '{text}': {} is a directory; give the report file's path, e.g. {}",
                path.display(),
                path.join("attest.xml").display()
            );
        }
        Ok(ReportSpec { kind, path })
    }
}

/// One assertion result as reports show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportedResult {
    pub assertion_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub layer: u8,
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    pub cost: f64,
    pub duration_ms: u64,
    /// `batch` (evaluated here) or `submitted` (`submit_plugin_result`).
    pub source: &'static str,
    /// What the check wanted, what it found, and what to change (failures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggested_action: Option<String>,
}

impl ReportedResult {
    /// `expected: …`, `actual: …`, `hint: …` lines, for failure bodies.
    fn evidence_lines(&self) -> String {
        let mut out = String::new();
        for (label, v) in [
            ("expected", &self.expected),
            ("actual", &self.actual),
            ("hint", &self.suggested_action),
        ] {
            if let Some(v) = v {
                out.push('\n');
                out.push_str(label);
                out.push_str(": ");
                out.push_str(v);
            }
        }
        out
    }
}

/// Results of one `evaluate_batch`.
#[derive(Debug, Clone)]
pub struct LoggedBatch {
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub results: Vec<ReportedResult>,
}

/// Everything reports need, collected during the session.
/// Bounded by bytes: past the bound the oldest batches are dropped, and
/// reports say how many results they held (`omitted_results`).
pub struct SessionLog {
    enabled: bool,
    max_bytes: usize,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    batches: std::collections::VecDeque<(LoggedBatch, usize)>,
    bytes: usize,
    omitted: Omitted,
    errors: Vec<ReportedError>,
    /// Errors recorded, kept or not.
    error_count: u64,
}

/// What the results a bounded log let go add up to: reports still count
/// them, so their totals (and a CI job reading them) stay right.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Omitted {
    pub counts: Counts,
    pub by_layer: BTreeMap<String, Counts>,
    pub cost: f64,
    pub duration_ms: u64,
}

impl Omitted {
    fn add(&mut self, r: &ReportedResult) {
        self.counts.add(r.status);
        self.by_layer.entry(r.layer.to_string()).or_default().add(r.status);
        self.cost += r.cost;
        self.duration_ms += r.duration_ms;
    }
}

/// An input `eval` could not evaluate: a trace that is not one, or an
/// assertion list that does not compile. Reports list it as an error.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportedError {
    /// Where the input came from (`traces.jsonl:3`).
    pub input: String,
    pub code: i64,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
    pub detail: String,
}

/// Errors a report lists; later ones are counted only.
const MAX_LISTED_ERRORS: usize = 1_000;

impl LoggedBatch {
    fn size(&self) -> usize {
        64 + self.trace_id.len()
            + self.agent_id.as_ref().map_or(0, |a| a.len())
            + self
                .results
                .iter()
                .map(|r| {
                    96 + r.assertion_id.len()
                        + r.kind.len()
                        + r.explanation.len()
                        + [&r.expected, &r.actual, &r.suggested_action]
                            .iter()
                            .map(|s| s.as_ref().map_or(0, |s| s.len()))
                            .sum::<usize>()
                })
                .sum::<usize>()
    }
}

impl SessionLog {
    pub fn new(enabled: bool, max_bytes: usize) -> SessionLog {
        SessionLog {
            enabled,
            max_bytes,
            log: Mutex::new(Log::default()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn record(&self, batch: LoggedBatch) {
        if !self.enabled {
            return;
        }
        let size = batch.size();
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        while !log.batches.is_empty() && log.bytes + size > self.max_bytes {
            if let Some((old, bytes)) = log.batches.pop_front() {
                log.bytes -= bytes;
                old.results.iter().for_each(|r| log.omitted.add(r));
            }
        }
        log.bytes += size;
        log.batches.push_back((batch, size));
    }

    pub fn batches(&self) -> Vec<LoggedBatch> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.batches.iter().map(|(b, _)| b.clone()).collect()
    }

    /// What the results dropped from the log to stay within its bound add up to.
    pub fn omitted(&self) -> Omitted {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).omitted.clone()
    }

    /// Records an input that could not be evaluated. The first
    /// [`MAX_LISTED_ERRORS`] are kept, with their text clipped; the rest are counted.
    pub fn record_error(&self, input: &str, e: &crate::protocol::RpcError) {
        if !self.enabled {
            return;
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.error_count += 1;
        if log.errors.len() < MAX_LISTED_ERRORS {
            log.errors.push(ReportedError {
                input: crate::text::clip(input, 256),
                code: e.code.code(),
                kind: e.code.error_type(),
                message: crate::text::clip(&e.message, 512),
                detail: crate::text::clip(&e.detail, 512),
            });
        }
    }

    /// The errors kept, and how many were recorded in all.
    pub fn errors(&self) -> (Vec<ReportedError>, u64) {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        (log.errors.clone(), log.error_count)
    }
}

/// Counts by status.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub total: u64,
    pub passed: u64,
    pub soft_failures: u64,
    pub hard_failures: u64,
}

impl Counts {
    fn merge(&mut self, other: &Counts) {
        self.total += other.total;
        self.passed += other.passed;
        self.soft_failures += other.soft_failures;
        self.hard_failures += other.hard_failures;
    }

    fn add(&mut self, s: Status) {
        self.total += 1;
        match s {
            Status::Pass => self.passed += 1,
            Status::SoftFail => self.soft_failures += 1,
            Status::HardFail => self.hard_failures += 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceReport {
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub counts: Counts,
    pub cost: f64,
    pub duration_ms: u64,
    pub results: Vec<ReportedResult>,
}

/// The whole report, before rendering.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub engine_version: String,
    pub generated_at: String,
    pub counts: Counts,
    /// Keyed by layer number, as text (`"1"` … `"8"`).
    pub by_layer: BTreeMap<String, Counts>,
    pub total_cost: f64,
    pub total_duration_ms: u64,
    pub budget_usd: Option<f64>,
    /// Results evaluated but no longer held when the report was written
    /// (the session log is bounded by `session_log_mib`). They are counted
    /// in `counts`, `by_layer`, `total_cost` and `total_duration_ms`, but
    /// listed under no trace.
    #[serde(skip_serializing_if = "is_zero")]
    pub omitted_results: u64,
    /// Of those, how many hard-failed.
    #[serde(skip_serializing_if = "is_zero")]
    pub omitted_hard_failures: u64,
    /// Inputs that could not be evaluated (`eval`), in all.
    #[serde(skip_serializing_if = "is_zero")]
    pub error_count: u64,
    /// The first of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ReportedError>,
    pub traces: Vec<TraceReport>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Report {
    /// Groups batches and submitted results by trace, in first-seen order.
    pub fn build(batches: &[LoggedBatch], submitted: &[PluginResult], budget_usd: Option<f64>, generated_at: String) -> Report {
        let mut traces: Vec<TraceReport> = Vec::new();
        // Where each trace id's report is: a session may log hundreds of
        // thousands of batches, and a scan per batch would be quadratic.
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut slot = |traces: &mut Vec<TraceReport>, trace_id: &str, agent_id: Option<&String>| -> usize {
            if let Some(&i) = at.get(trace_id) {
                return i;
            }
            traces.push(TraceReport {
                trace_id: trace_id.to_owned(),
                agent_id: agent_id.cloned(),
                counts: Counts::default(),
                cost: 0.0,
                duration_ms: 0,
                results: Vec::new(),
            });
            at.insert(trace_id.to_owned(), traces.len() - 1);
            traces.len() - 1
        };
        for b in batches {
            let i = slot(&mut traces, &b.trace_id, b.agent_id.as_ref());
            traces[i].results.extend(b.results.iter().cloned());
        }
        for p in submitted {
            let i = slot(&mut traces, &p.trace_id, None);
            traces[i].results.push(ReportedResult {
                assertion_id: p.assertion_id.clone(),
                kind: format!("plugin:{}", p.plugin_name),
                layer: AssertionType::Plugin.layer(),
                status: p.status,
                score: p.score,
                explanation: p.explanation.clone(),
                cost: 0.0,
                duration_ms: 0,
                source: "submitted",
                expected: None,
                actual: None,
                suggested_action: None,
            });
        }
        let mut counts = Counts::default();
        let mut by_layer: BTreeMap<String, Counts> = BTreeMap::new();
        for t in &mut traces {
            for r in &t.results {
                t.counts.add(r.status);
                t.cost += r.cost;
                t.duration_ms += r.duration_ms;
                counts.add(r.status);
                by_layer.entry(r.layer.to_string()).or_default().add(r.status);
            }
        }
        Report {
            engine_version: crate::ENGINE_VERSION.to_owned(),
            generated_at,
            counts,
            by_layer,
            total_cost: traces.iter().map(|t| t.cost).sum(),
            total_duration_ms: traces.iter().map(|t| t.duration_ms).sum(),
            budget_usd,
            omitted_results: 0,
            omitted_hard_failures: 0,
            error_count: 0,
            errors: Vec::new(),
            traces,
        }
    }

    /// Counts results a bounded session log let go into the totals.
    pub fn add_omitted(&mut self, omitted: &Omitted) {
        self.counts.merge(&omitted.counts);
        for (layer, c) in &omitted.by_layer {
            self.by_layer.entry(layer.clone()).or_default().merge(c);
        }
        self.total_cost += omitted.cost;
        self.total_duration_ms += omitted.duration_ms;
        self.omitted_results = omitted.counts.total;
        self.omitted_hard_failures = omitted.counts.hard_failures;
    }

    /// What a report says of omitted results, or nothing when none were.
    fn omitted_note(&self) -> Option<String> {
        (self.omitted_results > 0).then(|| {
            format!(
                "{} results ({} of them hard failures) were evaluated but are not listed: the session log holds at most session_log_mib of results (raise it to list them all). They are counted in the totals.",
                self.omitted_results, self.omitted_hard_failures
            )
        })
    }

    pub fn render(&self, kind: ReportKind) -> String {
        match kind {
            ReportKind::Json => serde_json::to_string_pretty(self).unwrap_or_default() + "\n",
            ReportKind::Junit => self.junit(),
            ReportKind::Markdown => self.markdown(),
        }
    }

    /// JUnit XML: one `<testsuite>` per trace, one `<testcase>` per result.
    /// Hard failures are `<failure>`s; soft failures pass, with the
    /// explanation in `<system-out>` and a `status` property.
    fn junit(&self) -> String {
        use attest_junit::{Case, Counts, Outcome, Suite};
        let shown_clip = |s: &str, n: usize| shown(&crate::text::clip(s, n));
        let secs = |ms: u64| ms as f64 / 1000.0;
        let mut suites = Vec::new();
        // Tools that count testcases rather than read the totals still see
        // omitted failures and unevaluated inputs.
        if let Some(note) = self.omitted_note() {
            let failed = self.omitted_hard_failures > 0;
            let outcome = if failed {
                Outcome::Failure {
                    message: format!("{} hard failures not listed", self.omitted_hard_failures),
                    kind: "hard_fail".into(),
                    text: shown(&note),
                }
            } else {
                Outcome::Passed
            };
            suites.push(Suite {
                name: "omitted results".into(),
                counts: Counts {
                    tests: 1,
                    failures: u64::from(failed),
                    ..Counts::default()
                },
                cases: vec![Case {
                    name: "omitted results".into(),
                    classname: "attest-engine.omitted".into(),
                    system_out: (!failed).then(|| shown(&note)),
                    outcome,
                    ..Case::default()
                }],
                ..Suite::default()
            });
        }
        if self.error_count > 0 {
            // Past the errors listed, one more testcase stands for the rest.
            let unlisted = self.error_count.saturating_sub(self.errors.len() as u64);
            let mut cases: Vec<Case> = self
                .errors
                .iter()
                .map(|e| Case {
                    name: shown(&e.input),
                    classname: "attest-engine.error".into(),
                    outcome: Outcome::Error {
                        message: shown_clip(&e.message, 200),
                        kind: format!("{} {}", e.code, e.kind),
                        text: Some(shown(&format!("{}\n{}", e.message, e.detail))),
                    },
                    ..Case::default()
                })
                .collect();
            if unlisted > 0 {
                cases.push(Case {
                    name: format!("{unlisted} more inputs not evaluated"),
                    classname: "attest-engine.error".into(),
                    outcome: Outcome::Error {
                        message: format!(
                            "{unlisted} more inputs could not be evaluated; the first {} are listed",
                            self.errors.len()
                        ),
                        kind: "not listed".into(),
                        text: None,
                    },
                    ..Case::default()
                });
            }
            let n = cases.len() as u64;
            suites.push(Suite {
                name: "inputs not evaluated".into(),
                counts: Counts {
                    tests: n,
                    errors: n,
                    ..Counts::default()
                },
                cases,
                ..Suite::default()
            });
        }
        for (i, t) in self.traces.iter().enumerate() {
            let cases = t
                .results
                .iter()
                .map(|r| {
                    let (outcome, system_out) = match r.status {
                        Status::Pass => (Outcome::Passed, None),
                        Status::SoftFail => (
                            Outcome::Passed,
                            Some(format!(
                                "soft_fail (score {}): {}{}",
                                r.score,
                                shown(&r.explanation),
                                shown(&r.evidence_lines())
                            )),
                        ),
                        Status::HardFail => (
                            Outcome::Failure {
                                message: shown_clip(&r.explanation, 200),
                                kind: "hard_fail".into(),
                                text: format!("score {}: {}{}", r.score, shown(&r.explanation), shown(&r.evidence_lines())),
                            },
                            None,
                        ),
                    };
                    Case {
                        name: shown(&r.assertion_id),
                        classname: shown(&format!("{}.layer{}.{}", t.trace_id, r.layer, r.kind)),
                        seconds: secs(r.duration_ms),
                        outcome,
                        system_out,
                    }
                })
                .collect();
            suites.push(Suite {
                name: shown(&t.trace_id),
                id: Some(i),
                counts: Counts {
                    tests: t.counts.total,
                    failures: t.counts.hard_failures,
                    ..Counts::default()
                },
                seconds: secs(t.duration_ms),
                timestamp: Some(shown(self.generated_at.trim_end_matches('Z'))),
                properties: vec![
                    ("agent_id".into(), shown(t.agent_id.as_deref().unwrap_or(""))),
                    ("soft_failures".into(), t.counts.soft_failures.to_string()),
                    ("cost_usd".into(), t.cost.to_string()),
                ],
                cases,
                system_out: Some(String::new()),
                system_err: Some(String::new()),
            });
        }
        attest_junit::Report {
            name: "attest-engine".into(),
            counts: Counts {
                tests: self.counts.total + self.error_count,
                failures: self.counts.hard_failures,
                errors: self.error_count,
                skipped: 0,
            },
            seconds: secs(self.total_duration_ms),
            suites,
        }
        .to_xml()
    }

    fn markdown(&self) -> String {
        let cell = |s: &str| md_text(s);
        let mut m = String::from("# attest-engine session report\n\n");
        let _ = writeln!(m, "Engine {}, generated {}.\n", self.engine_version, self.generated_at);
        let _ = writeln!(
            m,
            "**{}** results: {} passed, {} soft failures, {} hard failures. Total cost ${:.4}, total duration {} ms.",
            self.counts.total,
            self.counts.passed,
            self.counts.soft_failures,
            self.counts.hard_failures,
            self.total_cost,
            self.total_duration_ms
        );
        match self.budget_usd {
            Some(b) => {
                let _ = writeln!(m, "Budget ${b:.4}: ${:.4} used.\n", self.total_cost);
            }
            None => m.push_str("No cost budget set.\n\n"),
        }
        if let Some(note) = self.omitted_note() {
            let _ = writeln!(m, "**Not listed:** {note}\n");
        }
        if self.error_count > 0 {
            let _ = writeln!(m, "## Inputs not evaluated ({})\n", self.error_count);
            m.push_str("| input | error | message |\n|---|---|---|\n");
            for e in &self.errors {
                let _ = writeln!(
                    m,
                    "| {} | {} {} | {} {} |",
                    cell(&e.input),
                    e.code,
                    e.kind,
                    cell(&e.message),
                    cell(&e.detail)
                );
            }
            if self.error_count > self.errors.len() as u64 {
                let _ = writeln!(m, "\n… and {} more.", self.error_count - self.errors.len() as u64);
            }
            m.push('\n');
        }
        m.push_str("## By layer\n\n| layer | total | passed | soft failures | hard failures |\n|---|---:|---:|---:|---:|\n");
        for (layer, c) in &self.by_layer {
            let _ = writeln!(
                m,
                "| {layer} | {} | {} | {} | {} |",
                c.total, c.passed, c.soft_failures, c.hard_failures
            );
        }
        for t in &self.traces {
            let _ = writeln!(m, "\n## Trace {}\n", md_code(&t.trace_id));
            if let Some(a) = &t.agent_id {
                let _ = writeln!(m, "Agent {}.\n", md_code(a));
            }
            let _ = writeln!(
                m,
                "{} results: {} passed, {} soft failures, {} hard failures; cost ${:.4}; {} ms.\n",
                t.counts.total, t.counts.passed, t.counts.soft_failures, t.counts.hard_failures, t.cost, t.duration_ms
            );
            m.push_str("| assertion | type | layer | status | score | explanation |\n|---|---|---:|---|---:|---|\n");
            for r in &t.results {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} |",
                    cell(&r.assertion_id),
                    cell(&r.kind),
                    r.layer,
                    r.status.as_str(),
                    r.score,
                    cell(&r.explanation)
                );
            }
            let failed: Vec<&ReportedResult> = t
                .results
                .iter()
                .filter(|r| r.status != Status::Pass && (r.expected.is_some() || r.actual.is_some() || r.suggested_action.is_some()))
                .collect();
            if !failed.is_empty() {
                m.push_str("\n### Failures\n");
                for r in failed {
                    let _ = writeln!(m, "\n- **{}** (L{} {})", cell(&r.assertion_id), r.layer, cell(&r.kind));
                    for (label, v) in [("expected", &r.expected), ("actual", &r.actual), ("hint", &r.suggested_action)] {
                        if let Some(v) = v {
                            let _ = writeln!(m, "  - {label}: {}", cell(v));
                        }
                    }
                }
            }
        }
        m
    }
}

/// Text from input as Markdown shows it, in a table cell or a line: as
/// [`shown`], on one line, with the characters that would start link or
/// image syntax, a code span, emphasis or strikethrough escaped, so a trace
/// cannot put a remote image (or a link of its choosing) into a report posted
/// to a pull request, and `|` and `<` cannot break the table or open HTML. A
/// bare URL may still be linked by the renderer, as in any text.
fn md_text(s: &str) -> String {
    let shown = shown(s);
    let mut out = String::with_capacity(shown.len() + 8);
    let chars: Vec<char> = shown.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        // An underscore inside a word (`cost_usd`) starts no emphasis.
        let inside_word = || {
            let alnum = |j: Option<usize>| j.and_then(|j| chars.get(j)).is_some_and(|c| c.is_alphanumeric());
            alnum(i.checked_sub(1)) && alnum(Some(i + 1))
        };
        match c {
            '_' if inside_word() => out.push(c),
            '\\' | '`' | '*' | '_' | '~' | '[' | ']' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Text from input as an inline code span: fenced by more backticks than it
/// holds in a row, so none of it can close the span early.
fn md_code(s: &str) -> String {
    let text = shown(s).replace('\n', " ");
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // A span that starts or ends with a backtick needs a space inside its fence.
    let pad = if text.starts_with('`') || text.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// Text from input (ids, explanations, evidence) as a report shows it:
/// control characters other than newline and tab escaped, so an agent's
/// ANSI colours or a carriage return cannot break a line or a row, and bidi
/// controls named (`<U+202E>`), so they cannot disguise one. Explanations
/// are built that way already; ids and evidence come straight from input.
pub(crate) fn shown(s: &str) -> String {
    crate::text::neutralise_bidi(&attest_io::printable(s)).into_owned()
}

/// Writes every configured report; problems are logged, and the result says
/// whether every report was written.
pub fn write_all(specs: &[ReportSpec], report: &Report) -> bool {
    let mut all = true;
    for spec in specs {
        let text = report.render(spec.kind);
        let written = spec
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| write_whole(&spec.path, text.as_bytes()));
        match written {
            Ok(()) => tracing::info!(path = %spec.path.display(), "report written"),
            Err(e) => {
                all = false;
                tracing::error!(path = %spec.path.display(), error = %e, "cannot write report");
            }
        }
    }
    all
}

/// Writes `bytes` beside `path` and renames it into place, so a reader (a
/// CI job picking the report up) never sees half a report, and a run that
/// fails midway leaves the previous one whole.
///
/// Only a regular file (or none yet) is replaced that way: a device
/// (`/dev/null`), a pipe or a socket is written through, and a link is
/// followed to the file it names, which is then replaced in its place.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return std::fs::write(path, bytes),
        Ok(_) => std::fs::canonicalize(path)?,
        // A link to nothing yet: writing through it makes its file.
        Err(_) if std::fs::symlink_metadata(path).is_ok() => return std::fs::write(path, bytes),
        Err(_) => path.to_path_buf(),
    };
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = target.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &target));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether two paths name one regular file (or one path where none is yet):
/// the same path, or the same file by another path. Devices such as
/// `/dev/null` take any number of writers and are never the same file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let special = |p: &Path| std::fs::metadata(p).is_ok_and(|m| !m.is_file());
    if special(a) || special(b) {
        return false;
    }
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    if absolute(a) == absolute(b) {
        return true;
    }
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, kind: AssertionType, status: Status, score: f64, explanation: &str) -> ReportedResult {
        ReportedResult {
            assertion_id: id.into(),
            kind: kind.name().into(),
            layer: kind.layer(),
            status,
            score,
            explanation: explanation.into(),
            cost: 0.0,
            duration_ms: 2,
            source: "batch",
            expected: None,
            actual: None,
            suggested_action: None,
        }
    }

    fn sample() -> Report {
        let batches = vec![
            LoggedBatch {
                trace_id: "trc_refund".into(),
                agent_id: Some("support-bot".into()),
                results: vec![
                    result(
                        "schema_ok",
                        AssertionType::Schema,
                        Status::Pass,
                        1.0,
                        "output matches schema (draft 2020-12).",
                    ),
                    ReportedResult {
                        expected: Some("metadata.cost_usd lte 0.01".into()),
                        actual: Some("metadata.cost_usd = 0.02".into()),
                        suggested_action: Some("metadata.cost_usd is 0.02 and must be lte 0.01: bring it down (by 0.01), or revise the bound if 0.02 is acceptable.".into()),
                        ..result(
                            "cost_cap",
                            AssertionType::Constraint,
                            Status::SoftFail,
                            0.0,
                            "metadata.cost_usd = 0.02, expected <= 0.01.",
                        )
                    },
                    ReportedResult {
                        expected: Some("no <personal> data".into()),
                        actual: Some("email & phone at output.message".into()),
                        ..result(
                            "no_leak",
                            AssertionType::Plugin,
                            Status::HardFail,
                            0.0,
                            "plugin 'pii-leak': leaks <personal> data & \"more\"",
                        )
                    },
                ],
            },
            LoggedBatch {
                trace_id: "trc_2".into(),
                agent_id: None,
                results: vec![result("tools", AssertionType::Trace, Status::Pass, 1.0, "tools called in order.")],
            },
        ];
        let submitted = vec![PluginResult {
            trace_id: "trc_refund".into(),
            plugin_name: "toxicity".into(),
            assertion_id: "tox".into(),
            status: Status::Pass,
            score: 0.97,
            explanation: "not toxic | fine".into(),
            metadata: None,
        }];
        let mut r = Report::build(&batches, &submitted, Some(5.0), "2026-11-22T10:00:00Z".into());
        r.engine_version = "0.0.0-test".into();
        r
    }

    #[test]
    fn text_from_input_cannot_break_a_report() {
        // An agent's ANSI colours, a carriage return, characters XML cannot
        // hold at all, bidi controls and markup, in ids and in explanations.
        let hostile = "a\u{1b}[31mred\u{1b}[0m\r\nb\u{0}\u{7}\u{FFFE}\u{FFFF} \u{202E}txt.exe ]]> <x> & | \"q\"";
        let batches = vec![LoggedBatch {
            trace_id: format!("trc{hostile}"),
            agent_id: Some(hostile.into()),
            results: vec![ReportedResult {
                expected: Some(hostile.into()),
                ..result(&format!("id{hostile}"), AssertionType::Content, Status::HardFail, 0.0, hostile)
            }],
        }];
        let report = Report::build(&batches, &[], None, "2026-11-30T08:00:00Z".into());
        let junit = report.render(ReportKind::Junit);
        let mut reader = quick_xml::Reader::from_str(&junit);
        let mut elements = 0;
        loop {
            match reader.read_event() {
                Ok(quick_xml::events::Event::Eof) => break,
                Ok(quick_xml::events::Event::Start(_) | quick_xml::events::Event::Empty(_)) => elements += 1,
                Ok(_) => {}
                Err(e) => panic!("not well-formed XML ({e}):\n{junit}"),
            }
        }
        assert!(elements > 5, "{junit}");
        for (kind, text) in [("junit", &junit), ("markdown", &report.render(ReportKind::Markdown))] {
            for bad in ['\u{1b}', '\u{0}', '\u{7}', '\r', '\u{202E}'] {
                assert!(!text.contains(bad), "{kind} holds {:?}:\n{text}", bad);
            }
            // Noncharacters only XML refuses.
            assert_eq!(kind == "junit", !text.contains('\u{FFFE}') && !text.contains('\u{FFFF}'), "{kind}");
            // Shown, not dropped: `<U+202E>`, with its `<` escaped by both formats.
            assert!(text.contains("\\u{1b}[31mred") && text.contains("&lt;U+202E"), "{kind}:\n{text}");
        }
    }

    /// Golden files: a changed field, order or escape fails the comparison.
    /// `UPDATE_GOLDEN=1 cargo test -p attest-engine report` rewrites them.
    fn golden(name: &str, actual: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden").join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(actual, expected, "{} differs from the rendered report", path.display());
    }

    #[test]
    fn junit_report_matches_golden_file() {
        golden("report.junit.xml", &sample().render(ReportKind::Junit));
    }

    #[test]
    fn json_report_matches_golden_file() {
        golden("report.json", &sample().render(ReportKind::Json));
    }

    #[test]
    fn markdown_report_matches_golden_file() {
        golden("report.md", &sample().render(ReportKind::Markdown));
    }

    #[test]
    fn markdown_shows_input_as_text_never_as_markup() {
        let batches = vec![LoggedBatch {
            trace_id: "x` ![p](https://evil.example/p.png) `".into(),
            agent_id: Some("``bot``".into()),
            results: vec![result(
                "[click](javascript:alert(1)) ![i](https://evil.example/i.png)",
                AssertionType::Content,
                Status::HardFail,
                0.0,
                "*bold* | pipe <b>tag</b>\nnext line \\ `code`",
            )],
        }];
        let md = Report::build(&batches, &[], None, "t".into()).render(ReportKind::Markdown);
        assert!(md.contains("## Trace `` x` ![p](https://evil.example/p.png) ` ``"), "{md}");
        assert!(md.contains("Agent ``` ``bot`` ```."), "{md}");
        assert!(
            md.contains("| \\[click\\](javascript:alert(1)) !\\[i\\](https://evil.example/i.png) |"),
            "{md}"
        );
        assert!(
            md.contains("\\*bold\\* \\| pipe &lt;b>tag&lt;/b> next line \\\\ \\`code\\`"),
            "{md}"
        );
        let emphasis = LoggedBatch {
            trace_id: "t".into(),
            agent_id: None,
            results: vec![result("a", AssertionType::Content, Status::Pass, 1.0, "_em_ ~~gone~~ cost_usd")],
        };
        let md = Report::build(&[emphasis], &[], None, "t".into()).render(ReportKind::Markdown);
        assert!(md.contains("\\_em\\_ \\~\\~gone\\~\\~ cost_usd"), "{md}");
    }

    #[test]
    fn counts_group_by_trace_and_layer() {
        let r = sample();
        assert_eq!(r.traces.len(), 2);
        assert_eq!(r.traces[0].results.len(), 4, "the submitted result joins its trace");
        assert_eq!(
            (r.counts.total, r.counts.passed, r.counts.soft_failures, r.counts.hard_failures),
            (5, 3, 1, 1)
        );
        assert_eq!(r.by_layer["8"].total, 2);
        assert_eq!(r.traces[0].duration_ms, 6);
    }

    #[test]
    fn report_specs_parse_or_explain() {
        let s = ReportSpec::parse("junit=out/r.xml", Path::new("/base")).unwrap();
        assert_eq!((s.kind, s.path), (ReportKind::Junit, PathBuf::from("/base/out/r.xml")));
        let e = ReportSpec::parse("html=x", Path::new("")).unwrap_err().to_string();
        assert!(e.contains("unknown report kind 'html'") && e.contains("markdown=<path>"), "{e}");
        assert!(ReportSpec::parse("junit", Path::new("")).is_err());
        assert!(ReportSpec::parse("json=", Path::new("")).is_err());
    }
}
