//! Structured JSON log lines on stderr (Attest protocol v1 §1.3), written so that logging
//! can never stall evaluation: the one channel every command's messages go
//! through, `serve`'s and `collect`'s alike, under one `--log-level`.
//!
//! Each line names the command that wrote it (`"command":"worker"`), so the
//! lines of a fleet's processes, gathered in one place, can be told apart.
//!
//! On a terminal the same events are written as text a person reads
//! (`2026-02-18T10:30:00.000Z  INFO collect: listening for ...`);
//! `ATTEST_LOG_FORMAT=json` or `text` chooses either way.
//!
//! Events are formatted on the calling thread and handed to a bounded queue;
//! one writer thread drains it into stderr. When the queue is full (stderr is
//! not being read, as with the Python SDK, which never reads it) lines are
//! dropped and counted, and a summary line is written once stderr moves again.
//!
//! Every string a line carries is clipped to [`FIELD_CHARS`] characters, so
//! the queue holds at most [`QUEUE_LINES`] lines of a few such fields: what a
//! request echoes into a log line (an id, a plugin's message) cannot make the
//! queue large while stderr is not read.

#![forbid(unsafe_code)]

use anyhow::{bail, Result};
use serde_json::{Map, Value};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The target of the line that says a service is up and where (`collect`'s
/// `listening for OTLP/HTTP on …`, a worker's `evaluating from …`,
/// `view`'s `serving … on …`): written whatever the level, since scripts and
/// supervisors wait for it.
pub const STARTED: &str = "attest::started";

/// Log lines buffered while stderr is slow; beyond this they are dropped.
const QUEUE_LINES: usize = 1024;
/// Longest message or string field in a log line, in characters.
const FIELD_CHARS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn parse(s: &str) -> Result<Level> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "debug" | "trace" => Level::Debug,
            "info" => Level::Info,
            "warn" | "warning" => Level::Warn,
            "error" => Level::Error,
            other => bail!("invalid log level '{other}'; use debug, info, warn or error"),
        })
    }

    fn filter(self) -> LevelFilter {
        match self {
            Level::Debug => LevelFilter::DEBUG,
            Level::Info => LevelFilter::INFO,
            Level::Warn => LevelFilter::WARN,
            Level::Error => LevelFilter::ERROR,
        }
    }
}

/// Lines handed to the writer thread, and lines it has written: what
/// [`flush`] waits on.
static QUEUED: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Waits, at most `within`, until every line logged so far is on stderr.
/// For a command about to exit: its last lines (why a report could not be
/// written, say) would otherwise die with the writer thread. Lines that
/// cannot be written in time (nobody reads stderr) are left.
pub fn flush(within: std::time::Duration) {
    let target = QUEUED.load(Ordering::Acquire);
    let deadline = std::time::Instant::now() + within;
    while WRITTEN.load(Ordering::Acquire) < target && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Counts lines dropped because stderr was not drained.
#[derive(Clone, Default)]
pub struct DropCounter(Arc<AtomicU64>);

impl DropCounter {
    pub fn dropped(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct JsonLines {
    tx: SyncSender<String>,
    dropped: DropCounter,
    command: &'static str,
    format: Format,
}

/// How lines are written: JSON for programs (the SDKs, log shippers), text
/// for a person at a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Text,
}

impl Format {
    /// `ATTEST_LOG_FORMAT` when set to `json` or `text`; otherwise text on
    /// a terminal and JSON anywhere else. A value that is neither is
    /// returned, to be said once the logger is up.
    fn chosen() -> (Format, Option<String>) {
        use std::io::IsTerminal;
        let auto = if std::io::stderr().is_terminal() {
            Format::Text
        } else {
            Format::Json
        };
        let value = std::env::var("ATTEST_LOG_FORMAT").ok().map(|v| v.trim().to_ascii_lowercase());
        match value.as_deref() {
            Some("json") => (Format::Json, None),
            Some("text") => (Format::Text, None),
            None | Some("") => (auto, None),
            Some(other) => (auto, Some(other.chars().take(40).collect())),
        }
    }

    /// One line of `command`'s: JSON carries the command as a field, text
    /// leads with it.
    fn line(self, level: &str, logger: &str, command: &str, msg: &str, mut fields: Map<String, Value>) -> String {
        match self {
            Format::Json => {
                fields.insert("command".to_owned(), Value::from(command));
                format_line(level, logger, msg, fields)
            }
            Format::Text => format_text(level, command, msg, fields),
        }
    }
}

/// Events at `level` or above, and the start-up lines ([`STARTED`]) at any.
fn level_filter(level: Level) -> tracing_subscriber::filter::FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool> {
    let max = level.filter();
    tracing_subscriber::filter::filter_fn(move |meta| meta.target() == STARTED || max >= *meta.level())
}

/// Installs the global JSON logger at `level`, for lines of `command` (the
/// subcommand's name: `serve`, `collect`, `worker`, ...).
pub fn init(level: Level, command: &'static str) -> DropCounter {
    let (format, unknown_format) = Format::chosen();
    let (tx, rx) = sync_channel::<String>(QUEUE_LINES);
    let dropped = DropCounter::default();
    let reported = dropped.clone();
    std::thread::Builder::new()
        .name("attest-log".into())
        .spawn(move || {
            let mut already_reported = 0;
            for line in rx {
                let mut err = std::io::stderr().lock();
                let now = reported.dropped();
                if now > already_reported {
                    let note = format.line(
                        "warn",
                        "engine.logging",
                        command,
                        "log lines dropped: stderr was not being read",
                        [("dropped".to_owned(), Value::from(now - already_reported))].into_iter().collect(),
                    );
                    let _ = err.write_all(note.as_bytes());
                    already_reported = now;
                }
                let _ = err.write_all(line.as_bytes());
                WRITTEN.fetch_add(1, Ordering::Release);
            }
        })
        .expect("spawning the log writer thread");
    let layer = JsonLines {
        tx,
        dropped: dropped.clone(),
        command,
        format,
    }
    .with_filter(level_filter(level));
    // The default panic hook writes to stderr directly, which blocks when
    // nobody drains it; report panics through the non-blocking logger instead.
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        tracing::error!(location = %location, "panic: {info}");
    }));
    // A second init (tests) keeps the first logger.
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    if let Some(value) = unknown_format {
        tracing::warn!(
            "ATTEST_LOG_FORMAT={value:?} is neither json nor text; writing {}",
            if format == Format::Json { "JSON" } else { "text" }
        );
    }
    dropped
}

impl<S: Subscriber> Layer<S> for JsonLines {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = FieldMap::default();
        event.record(&mut fields);
        let level = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            _ => "debug",
        };
        let logger = meta.target().replacen("attest_engine::", "engine.", 1).replace("::", ".");
        let line = self
            .format
            .line(level, &logger, self.command, fields.msg.as_deref().unwrap_or(""), fields.map);
        // Counted before it is sent, so the writer never gets ahead of it.
        QUEUED.fetch_add(1, Ordering::AcqRel);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(line) {
            QUEUED.fetch_sub(1, Ordering::AcqRel);
            self.dropped.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct FieldMap {
    msg: Option<String>,
    map: Map<String, Value>,
}

impl Visit for FieldMap {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_text(field, attest_trace::text::clip(value, FIELD_CHARS));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.map.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.map.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.map.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.map.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = format!("{value:?}");
        attest_trace::text::clip_in_place(&mut text, FIELD_CHARS);
        self.record_text(field, text);
    }
}

impl FieldMap {
    fn record_text(&mut self, field: &Field, text: String) {
        if field.name() == "message" {
            self.msg = Some(text);
        } else {
            self.map.insert(field.name().to_owned(), Value::from(text));
        }
    }
}

fn format_line(level: &str, logger: &str, msg: &str, fields: Map<String, Value>) -> String {
    // Written by hand so the spec's keys come first, in the spec's order.
    let q = |s: &str| Value::from(s).to_string();
    let mut line = format!(
        "{{\"level\":{},\"ts\":{},\"logger\":{},\"msg\":{}",
        q(level),
        q(&timestamp()),
        q(logger),
        q(msg)
    );
    for (k, v) in fields {
        if !matches!(k.as_str(), "level" | "ts" | "logger" | "msg") {
            line.push_str(&format!(",{}:{}", q(&k), v));
        }
    }
    line.push_str("}\n");
    line
}

/// `TS LEVEL command: msg key=value ...`, one line: the command first, the
/// logger left out (it names a module, which a person does not need).
fn format_text(level: &str, command: &str, msg: &str, fields: Map<String, Value>) -> String {
    // Control characters from echoed text must not move the cursor of the
    // terminal that shows it (`attest_io::printable`), and a newline must
    // not start a line of its own.
    let printable = |s: &str, out: &mut String| out.push_str(&attest_io::printable(s).replace('\n', "\\n"));
    let mut line = format!("{} {:>5} {command}: ", timestamp(), level.to_ascii_uppercase());
    printable(msg, &mut line);
    for (k, v) in fields {
        line.push(' ');
        line.push_str(&k);
        line.push('=');
        match v {
            Value::String(s) if !s.is_empty() && !s.contains([' ', '"', '=']) => printable(&s, &mut line),
            Value::String(s) => printable(&Value::from(s).to_string(), &mut line),
            other => line.push_str(&other.to_string()),
        }
    }
    line.push('\n');
    line
}

/// RFC 3339 UTC with milliseconds, as in Attest protocol v1 §1.3.
use attest_io::now_rfc3339 as timestamp;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_the_spec_keys_first() {
        let line = format_line(
            "info",
            "engine",
            "evaluation complete",
            [("trace_id".to_owned(), Value::from("t1"))].into_iter().collect(),
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["logger"], "engine");
        assert_eq!(v["msg"], "evaluation complete");
        assert_eq!(v["trace_id"], "t1");
        let ts = v["ts"].as_str().unwrap();
        assert!(
            time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).is_ok(),
            "{ts}"
        );
        assert!(line.ends_with('\n'));
        assert!(line.starts_with("{\"level\":\"info\",\"ts\":"), "{line}");
    }

    #[test]
    fn echoed_strings_are_clipped() {
        let (tx, rx) = sync_channel::<String>(4);
        let layer = JsonLines {
            tx,
            dropped: DropCounter::default(),
            command: "worker",
            format: Format::Json,
        };
        let long = "x".repeat(1_000_000);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::warn!(trace_id = %long, id = long.as_str(), "refused: {long}");
        });
        let line = rx.try_recv().unwrap();
        assert!(line.len() < 4 * (FIELD_CHARS + 64), "{} bytes", line.len());
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["command"], "worker", "every line names its command");
        for key in ["msg", "trace_id", "id"] {
            let text = v[key].as_str().unwrap();
            assert!(text.ends_with('…') && text.chars().count() <= FIELD_CHARS + 1, "{key}");
        }
    }

    #[test]
    fn text_lines_lead_with_the_command_and_stay_one_line() {
        let fields: Map<String, Value> = [
            ("trace_id".to_owned(), Value::from("t1")),
            ("why".to_owned(), Value::from("two words")),
            ("spans".to_owned(), Value::from(3)),
        ]
        .into_iter()
        .collect();
        let line = format_text("info", "collect", "listening\non http://x\u{1b}[2J", fields);
        let (_, rest) = line.split_once(' ').unwrap();
        assert_eq!(
            rest,
            " INFO collect: listening\\non http://x\\u{1b}[2J spans=3 trace_id=t1 why=\"two words\"\n"
        );
        assert_eq!(line.matches('\n').count(), 1);
    }

    #[test]
    fn start_up_lines_pass_any_level() {
        let (tx, rx) = sync_channel::<String>(8);
        let layer = JsonLines {
            tx,
            dropped: DropCounter::default(),
            command: "collect",
            format: Format::Json,
        }
        .with_filter(level_filter(Level::Error));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::info!("not written at error");
            tracing::info!(target: STARTED, url = "http://127.0.0.1:1/", "listening on http://127.0.0.1:1/");
        });
        let line: Value = serde_json::from_str(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(line["msg"], "listening on http://127.0.0.1:1/");
        assert_eq!(line["logger"], "attest.started");
        assert!(rx.try_recv().is_err(), "only the start-up line passes");
    }

    #[test]
    fn levels_parse() {
        assert_eq!(Level::parse("WARN").unwrap(), Level::Warn);
        assert!(Level::parse("verbose").is_err());
    }
}
