//! `attest-engine eval`: evaluate traces from files without an SDK.
//!
//! Traces come from a `.json` file (one trace, or an array of traces) or a
//! `.jsonl` file (one trace per line). Assertions come from a JSON file
//! holding a list of assertion objects, or `{"assertions": [...]}`. Each trace
//! is evaluated exactly as `evaluate_batch` would evaluate it.
//!
//! Exit codes: 0 when nothing hard-failed, 1 when any assertion hard-failed,
//! 2 when an input could not be evaluated (bad trace, bad assertion, bad file).

use crate::batch::{AssertionResult, BatchResult, Suite};
use crate::layers::Status;
use crate::protocol::RpcError;
use crate::session::Engine;
use crate::text::clip;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::path::Path;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// One trace's outcome.
#[derive(Serialize)]
struct Outcome {
    trace: String,
    #[serde(flatten)]
    body: Body,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Body {
    Results(BatchResult),
    Error { error: RpcError },
}

/// A table for a terminal. Explanations, ids and provider errors come from
/// input, so they are shown as reports show them ([`crate::report::shown`]).
fn terminal_text(table: &[u8]) -> String {
    crate::report::shown(&String::from_utf8_lossy(table))
}

/// The command's two inputs, read before the engine starts: a mistake in
/// either is reported before anything (the result history, plugins) is
/// opened.
pub struct Inputs {
    assertions: Vec<Value>,
    traces: TraceFile,
}

impl Inputs {
    pub fn read(trace_path: &Path, assertions_path: &Path) -> Result<Inputs> {
        if trace_path == Path::new("-") && assertions_path == Path::new("-") {
            anyhow::bail!("--trace and --assertions cannot both be - (standard input holds one of them): give the other as a file");
        }
        let assertions = read_assertions(assertions_path)?;
        let traces = TraceFile::read(trace_path)?;
        Ok(Inputs { assertions, traces })
    }
}

/// Runs the command; returns the process exit code.
pub fn run(engine: &Engine, inputs: &Inputs, format: Format, out: &mut impl std::io::Write) -> Result<i32> {
    evaluate_files(engine, &inputs.assertions, &inputs.traces, format, false, out)
}

/// The exit code of a command whose output was closed early (`| head`), as
/// a shell reports one that SIGPIPE ended.
pub const OUTPUT_CLOSED: i32 = 141;

/// Standard output that may be closed early (`eval … | head`). Once it is,
/// writes are discarded rather than failed: the run goes on to its end, so
/// that its reports and result history are still written, and then exits
/// with [`OUTPUT_CLOSED`].
struct MayClose<W> {
    inner: W,
    closed: bool,
}

impl<W: std::io::Write> std::io::Write for MayClose<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.inner.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            _ if self.closed => Ok(()),
            other => other,
        }
    }
}

/// Largest input file (traces, assertions, a plugin's config) read, in
/// bytes. The cap holds for any kind of file: a pipe or a device reports no
/// size to check first.
pub const MAX_INPUT_FILE_BYTES: u64 = 256 << 20;

/// Reads `path` (`what` names it in errors) as UTF-8 text, up to
/// [`MAX_INPUT_FILE_BYTES`].
pub fn read_input(path: &Path, what: &str) -> Result<String> {
    let mut text = read_text(path, what, MAX_INPUT_FILE_BYTES, "split it into smaller files")?;
    // Saved as "UTF-8 with BOM" (Windows editors): the mark is not JSON.
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}

/// Reads `path` (`what` names it in errors) as UTF-8 text of at most
/// `limit` bytes; `too_large` is the advice for a file over it.
pub fn read_text(path: &Path, what: &str, limit: u64, too_large: &str) -> Result<String> {
    use attest_io::ReadError;
    // `-` is standard input, as for most command-line tools; it is read
    // under the same cap as a file.
    let source = if path == Path::new("-") { Path::new("/dev/stdin") } else { path };
    attest_io::read_capped_text(source, limit).map_err(|e| match e {
        ReadError::Io(io) => anyhow::anyhow!("cannot read {what} {}: {io}", path.display()),
        ReadError::TooLarge { .. } => anyhow::anyhow!("{what} {} {e}: {too_large}", path.display()),
        ReadError::NotUtf8 { .. } => anyhow::anyhow!("{what} {} {e}: save it as UTF-8", path.display()),
    })
}

/// `attest-engine plugin test`: one plugin assertion with `config`, on each
/// trace (read with [`read_traces`]), printed with the plugin's details and evidence.
pub fn run_plugin(
    engine: &Engine,
    plugin_id: &str,
    config: Value,
    traces: &TraceFile,
    format: Format,
    out: &mut impl std::io::Write,
) -> Result<i32> {
    let assertion = serde_json::json!({
        "assertion_id": "plugin-test",
        "type": "plugin",
        "spec": {"plugin_id": plugin_id, "config": config},
    });
    let plugin = engine.plugins.get(plugin_id);
    if let Some(p) = plugin {
        p.record_capability_use();
    }
    let labels: Vec<String> = traces.iter().map(|(label, _)| label).collect();
    let code = evaluate_files(engine, &[assertion], traces, format, true, out)?;
    if let (Some(p), Format::Table) = (plugin, format) {
        let mut listing = Vec::new();
        write_capability_use(&labels, &p.capability_listing(), &p.take_capability_use(), &mut listing)?;
        out.write_all(terminal_text(&listing).as_bytes())?;
    }
    Ok(code)
}

/// What the plugin's capability calls did, trace by trace.
fn write_capability_use(
    labels: &[String],
    listing: &crate::plugins::CapabilityListing,
    uses: &[crate::plugins::CapabilityUse],
    out: &mut impl std::io::Write,
) -> Result<()> {
    let names = |cs: &[crate::plugins::capabilities::Capability]| {
        if cs.is_empty() {
            "none".to_owned()
        } else {
            cs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
        }
    };
    // As `plugin check` and `list_plugins` show them: what was granted,
    // whether or not the plugin asks for it.
    writeln!(
        out,
        "\ncapabilities: requested {}; granted {}",
        names(&listing.requested),
        names(&listing.granted)
    )?;
    let ungranted: Vec<_> = listing.requested.iter().copied().filter(|c| !listing.usable.contains(c)).collect();
    if !ungranted.is_empty() {
        writeln!(out, "  not granted: {} (calls answer not-granted)", names(&ungranted))?;
    }
    if !listing.secrets.is_empty() {
        writeln!(out, "secrets: {}", listing.secrets.join(", "))?;
    }
    let calls: usize = uses.iter().map(|u| u.calls.len() + u.unrecorded).sum();
    if calls == 0 {
        writeln!(out, "capability calls: none")?;
        return Ok(());
    }
    writeln!(out, "capability calls:")?;
    for (label, used) in labels.iter().zip(uses) {
        for c in &used.calls {
            let outcome = match &c.error {
                Some(e) => format!("{}: {e}", c.outcome),
                None => c.outcome.clone(),
            };
            writeln!(
                out,
                "  {label}  {} ({})  {:.1} ms  ${:.6}  {outcome}",
                c.capability.name(),
                c.asked,
                c.ms,
                c.cost
            )?;
        }
        if used.unrecorded > 0 {
            writeln!(out, "  {label}  … {} more calls", used.unrecorded)?;
        }
    }
    Ok(())
}

/// Evaluates `assertions` on each trace, prints the outcomes, and returns the
/// exit code. `verbose`: the table also shows details and evidence.
///
/// Each trace is evaluated, written and dropped in turn, so what a run
/// holds does not grow with the number of traces (beyond the input's text
/// and the bounded session log that reports are built from).
fn evaluate_files(
    engine: &Engine,
    assertions: &[Value],
    traces: &TraceFile,
    format: Format,
    verbose: bool,
    out: &mut impl std::io::Write,
) -> Result<i32> {
    // Paid layers (5 and 6) talk to providers asynchronously.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Compiled once, evaluated on every trace.
    let suite = Suite::compile(engine, assertions);
    // The wire ignores spec keys an assertion does not read (specs are
    // forward-compatible), but in a file someone wrote they are most likely
    // typos (`case_sensitve`), so say so.
    for (i, kind, unread) in suite.iter().flat_map(|s| s.unread_keys()) {
        tracing::warn!(
            assertion = i,
            assertion_id = %crate::text::clip(assertions[i]["assertion_id"].as_str().unwrap_or(""), 64),
            ignored = %crate::text::clip(&unread.keys.join(", "), 200),
            reads = %unread.known.join(", "),
            "spec keys this {} assertion does not read are ignored: check their spelling",
            kind.name()
        );
    }
    use std::io::Write as _;
    let mut out = MayClose { inner: out, closed: false };
    let (mut errored, mut hard) = (false, false);
    let mut evaluate = |(label, trace_text): (String, &str)| {
        // request_ids are idempotency keys within one trace's evaluation, not across the file.
        engine.sinks.forget_request_ids();
        let deadline = Instant::now() + engine.config.eval_timeout;
        let result =
            match &suite {
                // Files are not bounded by a line as requests are: an oversized
                // trace is refused before it is parsed.
                _ if trace_text.len() > engine.limits.max_trace_bytes => Err(crate::errors::trace_error(
                    crate::trace::validate::too_large(trace_text.len(), &engine.limits, "trace"),
                )),
                Ok(suite) => runtime.block_on(suite.evaluate(engine, trace_text, deadline)),
                // As in evaluate_batch, a trace's own problems are reported before the assertions'.
                Err(e) => Err(trace_problem(engine, trace_text).unwrap_or_else(|| e.clone())),
            };
        let body = match result {
            Ok(r) => {
                hard |= r.results.iter().any(|a| a.status == Status::HardFail);
                Body::Results(r)
            }
            Err(error) => {
                errored = true;
                engine.sinks.session_log.record_error(&label, &error);
                let ids = assertions
                    .iter()
                    .enumerate()
                    .map(|(i, a)| a["assertion_id"].as_str().map_or_else(|| format!("assertions[{i}]"), str::to_owned));
                engine.sinks.evaluation_failed(trace_text, ids, &error);
                Body::Error { error }
            }
        };
        Outcome { trace: label, body }
    };
    match format {
        Format::Json => {
            // Standard output is line-buffered: written straight to it,
            // pretty JSON would cost a system call per line.
            use serde::Serializer as _;
            let mut w = std::io::BufWriter::with_capacity(1 << 16, &mut out);
            let mut json = serde_json::Serializer::pretty(&mut w);
            json.collect_seq(traces.iter().map(&mut evaluate))?;
            writeln!(w)?;
            w.flush()?;
        }
        Format::Table => {
            let mut table = Vec::new();
            for trace in traces.iter() {
                write_outcome(&evaluate(trace), verbose, &mut table)?;
                out.write_all(terminal_text(&table).as_bytes())?;
                table.clear();
            }
        }
    }
    // Drift alerts post in the background, on this runtime.
    runtime.block_on(engine.sinks.settle_alerts(Instant::now() + engine.config.drain_timeout));
    let reports_written = engine.finish();
    if !reports_written {
        // Standard error may have gone with standard output (`2>&1 | head`).
        let _ = writeln!(
            std::io::stderr(),
            "attest-engine: a report could not be written (the log above says why)"
        );
    }
    Ok(if out.closed {
        OUTPUT_CLOSED
    } else if errored || !reports_written {
        2
    } else if hard {
        1
    } else {
        0
    })
}

/// Why `trace_text` is not a valid trace, if it is not.
fn trace_problem(engine: &Engine, trace_text: &str) -> Option<RpcError> {
    let raw: &RawValue = match serde_json::from_str(trace_text) {
        Ok(raw) => raw,
        Err(e) => return Some(crate::errors::trace_not_json(&e)),
    };
    crate::trace::parse_trace(raw, &engine.limits).err().map(crate::errors::trace_error)
}

/// Whether parsing stopped at a second JSON value after the first: how a
/// file of one value per line reads where one document is expected.
fn more_than_one_value(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("trailing characters")
}

fn read_assertions(path: &Path) -> Result<Vec<Value>> {
    let text = read_input(path, "assertions file")?;
    if text.trim().is_empty() {
        bail!(
            "assertions file {} is empty: give a JSON list of assertion objects, or {{\"assertions\": [...]}}",
            path.display()
        );
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        // A second value after the first: one assertion per line.
        let lines = if more_than_one_value(&e) {
            " (for several assertions, put them in one JSON list: [{...}, {...}])"
        } else {
            ""
        };
        anyhow::Error::new(e).context(format!("assertions file {} is not valid JSON{lines}", path.display()))
    })?;
    let list = match v {
        Value::Array(items) => items,
        Value::Object(mut m) if m.get("assertions").is_some_and(Value::is_array) => match m.remove("assertions") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => bail!(
            "assertions file {} must hold a JSON list of assertions or {{\"assertions\": [...]}}",
            path.display()
        ),
    };
    if list.is_empty() {
        bail!(
            "assertions file {} holds no assertion: a run would check nothing; add at least one assertion object",
            path.display()
        );
    }
    Ok(list)
}

/// The traces of one input file: its text, read whole (up to
/// [`MAX_INPUT_FILE_BYTES`]), and where each trace sits in it. Traces are cut
/// out without building their JSON, so a file of a million small traces
/// costs its text and a range per trace.
pub struct TraceFile {
    name: String,
    text: String,
    traces: Vec<(Place, std::ops::Range<usize>)>,
}

/// Where a trace sits, for its label.
#[derive(Debug, Clone, Copy)]
enum Place {
    Whole,
    Item(usize),
    Line(usize),
}

impl TraceFile {
    /// One trace object, a JSON list of them, or (`.jsonl`, `.ndjson`) one
    /// per line. A file with no trace is an error, not a run that checks
    /// nothing.
    pub fn read(path: &Path) -> Result<TraceFile> {
        let text = read_input(path, "trace file")?;
        let name = path.display().to_string();
        if text.trim().is_empty() {
            bail!("trace file {name} is empty: give one trace object, a JSON list of traces, or a .jsonl file with one trace per line");
        }
        let offset = |part: &str| part.as_ptr() as usize - text.as_ptr() as usize;
        let lines = path.extension().is_some_and(|e| e == "jsonl" || e == "ndjson");
        // One pretty-printed trace named .jsonl reads as a line per error.
        if lines
            && text
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|first| serde_json::from_str::<&RawValue>(first).is_err())
            && serde_json::from_str::<&RawValue>(&text).is_ok()
        {
            bail!("trace file {name} holds one JSON document over several lines, not one trace per line: name it .json");
        }
        let traces = if lines {
            text.lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| (Place::Line(i + 1), offset(l)..offset(l) + l.len()))
                .collect()
        } else {
            let whole: &RawValue = serde_json::from_str(&text).map_err(|e| {
                // A second value after the first is how a file of one trace per
                // line reads when its extension does not say so.
                let lines = if more_than_one_value(&e) {
                    " (if it holds one trace per line, name it .jsonl)"
                } else {
                    ""
                };
                anyhow::Error::new(e).context(format!("trace file {name} is not valid JSON{lines}"))
            })?;
            if whole.get().starts_with('[') {
                let items: Vec<&RawValue> =
                    serde_json::from_str(whole.get()).with_context(|| format!("trace file {name} is not a JSON list of traces"))?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (Place::Item(i), offset(t.get())..offset(t.get()) + t.get().len()))
                    .collect()
            } else {
                vec![(Place::Whole, 0..text.len())]
            }
        };
        if traces.is_empty() {
            bail!(
                "trace file {name} holds no trace: give one trace object, a JSON list of traces, or a .jsonl file with one trace per line"
            );
        }
        Ok(TraceFile { name, text, traces })
    }

    /// `(label, trace JSON text)` per trace, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (String, &str)> + '_ {
        self.traces.iter().map(|(place, range)| {
            let label = match place {
                Place::Whole => self.name.clone(),
                Place::Item(i) => format!("{}[{i}]", self.name),
                Place::Line(n) => format!("{}:{n}", self.name),
            };
            (label, &self.text[range.clone()])
        })
    }
}

/// A field of one table row: a line break or tab from input would start a
/// new row or shift the columns, so they are escaped as reports escape
/// other control characters (the rest is left to [`terminal_text`]).
fn cell(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\n', '\t']) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.replace('\n', "\\u{a}").replace('\t', "\\u{9}"))
}

fn write_outcome(o: &Outcome, verbose: bool, out: &mut impl std::io::Write) -> Result<()> {
    {
        match &o.body {
            Body::Error { error } => {
                writeln!(
                    out,
                    "{}: error {} ({}): {}",
                    o.trace,
                    error.code.code(),
                    error.code.error_type(),
                    cell(&error.message)
                )?;
                writeln!(out, "  {}", cell(&error.detail))?;
            }
            Body::Results(r) => {
                writeln!(
                    out,
                    "{} (trace_id {}): {} assertion{} in {} ms",
                    o.trace,
                    cell(&r.trace_id),
                    r.results.len(),
                    if r.results.len() == 1 { "" } else { "s" },
                    r.total_duration_ms
                )?;
                let id_w = r
                    .results
                    .iter()
                    .map(|a| cell(&a.assertion_id).chars().count())
                    .max()
                    .unwrap_or(0)
                    .clamp(9, 32);
                writeln!(out, "  {:<id_w$}  {:<9}  {:>5}  EXPLANATION", "ASSERTION", "STATUS", "SCORE")?;
                for a in &r.results {
                    writeln!(
                        out,
                        "  {:<id_w$}  {:<9}  {:>5.2}  {}",
                        clip(&cell(&a.assertion_id), id_w),
                        a.status.as_str(),
                        a.score,
                        clip(&cell(&a.explanation), if verbose { 2000 } else { 100 })
                    )?;
                    if verbose {
                        write_evidence(a, out)?;
                    }
                }
                let count = |s: Status| r.results.iter().filter(|a| a.status == s).count();
                writeln!(
                    out,
                    "  {} passed, {} soft_fail, {} hard_fail\n",
                    count(Status::Pass),
                    count(Status::SoftFail),
                    count(Status::HardFail)
                )?;
            }
        }
    }
    Ok(())
}

/// A result's evidence and plugin details, a line each.
fn write_evidence(a: &AssertionResult, out: &mut impl std::io::Write) -> Result<()> {
    let e = &a.evidence;
    for (label, value) in [
        ("path", &e.trace_node_path),
        ("expected", &e.expected),
        ("actual", &e.actual),
        ("hint", &e.suggested_action),
    ] {
        if let Some(v) = value {
            writeln!(out, "    {label:<9}{}", cell(v))?;
        }
    }
    if let Some(details) = &a.details {
        writeln!(out, "    details  {details}")?;
    }
    writeln!(out, "    took     {} ms", a.duration_ms)?;
    Ok(())
}
