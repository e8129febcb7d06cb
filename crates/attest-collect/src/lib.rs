//! Continuous evaluation of production agent traces.
//!
//! This crate owns everything between an agent's telemetry and a stored
//! verdict: OTLP/HTTP ingest ([`server`], [`otlp`], with the listener's
//! bounds in [`listen`] and decoding's in [`elements`]), grouping spans into
//! traces ([`assemble`]), mapping the OpenTelemetry GenAI and OpenInference
//! span conventions onto Attest traces ([`convert`]), the rules file that
//! says which traces get which assertions ([`rules`]), result sinks
//! ([`sink`]), Prometheus metrics ([`metrics`]), the events that count
//! themselves there and log themselves ([`events`]) and the NATS JetStream
//! distributed mode ([`distributed`]).
//!
//! It does not evaluate assertions itself: the host plugs an [`TraceEvaluator`] in
//! (the attest-engine binary plugs its layers 1–8) and, optionally, a
//! [`ResultStore`] that stores results.

#![forbid(unsafe_code)]

pub mod assemble;
pub mod cli;
pub mod convert;
pub mod distributed;
pub mod elements;
pub mod events;
pub mod export;
pub mod fair;
pub mod frameworks;
pub mod grpc;
pub mod jsonl_input;
pub mod listen;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod pipeline;
pub mod rules;
pub mod server;
pub mod sink;
pub mod trace_doc;
pub mod writer;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use cli::{run_collect, run_worker, CollectArgs, WorkerArgs, WorkerRole};
pub use convert::PriceTable;

/// A boxed, sendable future (the shape the host's async evaluators return).
pub use futures::future::BoxFuture;

/// Verdict of one assertion, as in the Attest protocol's `evaluate_batch`
/// results: the engine's own type.
pub use attest_trace::Status;

/// One assertion's outcome, returned by [`CompiledRule::evaluate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssertionOutcome {
    pub assertion_id: String,
    /// The assertion's `type` (`schema`, `constraint`, `trace`, ...).
    #[serde(rename = "type")]
    pub assertion_type: String,
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    /// USD spent on this assertion (non-zero for paid layers).
    #[serde(default)]
    pub cost_usd: f64,
    #[serde(default)]
    pub duration_ms: u64,
    /// Where in the trace the result points (`steps[2]`, `output.message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_node_path: Option<String>,
}

/// A rules file's assertions refused by the evaluator: where, what, and what is accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleError {
    /// Path inside the rule's `assertions`, e.g. `assertions[2].spec.check`.
    pub field: String,
    pub message: String,
    /// Accepted values for `field`, when there is a closed set.
    #[serde(default)]
    pub valid_choices: Vec<String>,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)?;
        if !self.valid_choices.is_empty() {
            write!(f, " (valid choices: {})", self.valid_choices.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleError {}

/// Evaluation of one trace failed as a whole (not an assertion verdict).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleFailure {
    pub message: String,
    /// True when trying again later may succeed (provider outage, rate limit).
    pub retryable: bool,
    /// True when no retry and no other worker can evaluate it: the trace
    /// breaks the trace format, or a provider refuses the request itself
    /// (a 4xx: a wrong model name, a bad key), which only a change of
    /// configuration can fix.
    #[serde(default)]
    pub trace_refused: bool,
    /// What failed, in the evaluator's words (`TIMEOUT`, `PROVIDER_ERROR`):
    /// the `error.type` of the event `--export-otlp` sends for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
}

impl std::fmt::Display for RuleFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RuleFailure {}

/// Turns a rule's assertion objects into a runnable [`CompiledRule`]; called once per
/// rule at start-up so that a bad rules file is refused before any traffic.
pub trait TraceEvaluator: Send + Sync + 'static {
    fn compile(&self, rule: &str, assertions: &[serde_json::Value]) -> Result<Arc<dyn CompiledRule>, RuleError>;

    /// The largest trace, as compact JSON, that its suites evaluate; larger
    /// converted traces are dropped as `trace_too_large` before any rule
    /// runs. `None`: no limit of its own.
    fn max_trace_bytes(&self) -> Option<usize> {
        None
    }
}

/// A compiled rule: evaluates Attest traces (the shape of Attest protocol v1 §3).
pub trait CompiledRule: Send + Sync + 'static {
    /// Evaluates the trace given as compact JSON text.
    fn evaluate<'a>(&'a self, trace: &'a str) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>>;

    /// The results of only the assertions that make no paid model call:
    /// what is kept of a trace whose paid assertions fail for good. `None`
    /// when there is no such assertion, or nothing but.
    fn evaluate_free<'a>(&'a self, _trace: &'a str) -> Option<BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>>> {
        None
    }

    /// Paid model calls (judge or embedding) one evaluation makes at most; the
    /// per-rule budget is checked against it before evaluating. 0 = free layers only.
    fn paid_calls(&self) -> u32 {
        0
    }

    /// The most one evaluation of a trace of `trace_bytes` (compact JSON) can
    /// cost in USD: what the rule's `usd_per_day` reserves before it runs.
    fn worst_cost_usd(&self, _trace_bytes: usize) -> f64 {
        0.0
    }
}

/// Identity of a result: evaluating the same trace again yields the same key,
/// so sinks can make writes idempotent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ResultKey {
    pub trace_id: String,
    pub rule: String,
    pub assertion_id: String,
}

/// One stored assertion result: the line written by the JSONL sink and the
/// record handed to [`ResultStore`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    #[serde(flatten)]
    pub key: ResultKey,
    #[serde(rename = "type")]
    pub assertion_type: String,
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    pub cost_usd: f64,
    pub duration_ms: u64,
    pub agent_id: Option<String>,
    /// RFC 3339 time the evaluation finished.
    pub evaluated_at: String,
    /// Delivery attempt that produced it (1 unless a worker redelivery happened).
    pub delivery: u64,
    /// The span the result is about: the step's an assertion points at,
    /// else the agent's (hex; for `--export-otlp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
}

#[cfg(test)]
impl ResultRecord {
    /// A passing result for `(trace, rule, assertion)`, as the unit tests of
    /// the sinks and the distributed path store it.
    pub(crate) fn passing(trace: &str, rule: &str, assertion: &str) -> Self {
        ResultRecord {
            key: ResultKey {
                trace_id: trace.into(),
                rule: rule.into(),
                assertion_id: assertion.into(),
            },
            assertion_type: "trace".into(),
            status: Status::Pass,
            score: 1.0,
            explanation: "ok".into(),
            cost_usd: 0.0,
            duration_ms: 0,
            agent_id: Some("agent".into()),
            evaluated_at: "2026-01-01T00:00:00.000Z".into(),
            delivery: 1,
            span_id: None,
        }
    }
}

/// Where results go. Implementations must be idempotent on [`ResultRecord::key`]:
/// a trace can be evaluated again (redelivery, re-scoring), and a key already
/// stored must not be counted twice.
pub trait ResultStore: Send + Sync + 'static {
    /// Stores results; returns once they are as durable as `durability` asks.
    fn record<'a>(&'a self, results: &'a [ResultRecord], durability: Durability) -> BoxFuture<'a, anyhow::Result<()>>;

    /// A rule's evaluation of `trace` failed for good (no verdict; what
    /// did not depend on the failing provider is still recorded).
    fn evaluation_failed(&self, _trace: &trace_doc::TraceDoc, _rule: &str, _error: &RuleFailure) {}

    /// Makes everything recorded so far durable (called on drain).
    fn flush(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// What a store has done with results when [`ResultStore::record`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Handed to the store's writer, which commits them shortly: for the
    /// collector, which answered its exporter when the spans arrived and
    /// must not hold evaluation on a store.
    Queued,
    /// Committed: for a sink, which acks the messages that carried them
    /// only afterwards.
    Committed,
}

/// RFC 3339 (UTC, milliseconds) for a Unix time in nanoseconds.
pub(crate) fn rfc3339_from_unix_nanos(nanos: u64) -> String {
    attest_io::rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos))
}

pub(crate) use attest_io::now_rfc3339;
pub(crate) use attest_trace::text::clip_bytes as bounded;

/// `id` with `%`, space, every control character and every non-ASCII byte
/// percent-encoded (`%0D`, `%0A`, `%25`, `%C3%A9`). Injective: percent-decoding
/// gives the id back, so two ids never share an encoding.
///
/// Ids come off the wire (OTLP trace ids, `--jsonl` lines, NATS messages):
/// NATS header values must not hold CR/LF (async-nats panics on them), and a
/// raw CR/LF echoed to stderr would forge log lines.
pub fn escape_id(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for &b in id.as_bytes() {
        if b == b'%' || !(0x21..=0x7e).contains(&b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// An id as it is written to stderr and logs: escaped ([`escape_id`]) and
/// cut to 128 bytes.
pub fn shown_id(id: &str) -> String {
    bounded(&escape_id(id), 128)
}

pub(crate) type SharedSinks = Arc<Vec<Arc<dyn ResultStore>>>;

/// Largest configuration file (rules, prices) read, in bytes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 << 20;

/// A configuration file's text, read no further than
/// [`MAX_CONFIG_FILE_BYTES`] whatever the file is (`attest-io`).
pub fn read_capped(path: &std::path::Path) -> Result<String, attest_io::ReadError> {
    attest_io::read_capped_text(path, MAX_CONFIG_FILE_BYTES)
}

/// Parses a YAML configuration file (rules, prices) with the workspace's
/// one YAML reader (`attest-yaml`: YAML 1.1 as PyYAML resolves it, as ECP
/// manifests are read, bounded in nesting and size), refusing a key given
/// twice in one mapping. Of the values JSON cannot hold, a timestamp
/// (`2024-05-01`) is its text, and `.nan`/`.inf` are refused by their path.
/// A value of the wrong type is named by its path too.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut value = attest_yaml::load_refusing_duplicates(text)?;
    plain_json(&mut value, &mut String::new())?;
    serde_path_to_error::deserialize(value).map_err(|e| match e.path().to_string() {
        p if p == "." => e.inner().to_string(),
        p => format!("{p}: {}", e.inner()),
    })
}

/// Replaces the YAML-only values `attest-yaml` keeps apart from strings:
/// a timestamp becomes its text; a non-finite number is an error at `path`.
fn plain_json(value: &mut serde_json::Value, path: &mut String) -> Result<(), String> {
    use attest_yaml::Special;
    use serde_json::Value;
    match attest_yaml::special(value) {
        Some(Special::Timestamp(text)) => {
            *value = Value::String(text.to_owned());
            return Ok(());
        }
        Some(Special::NonFinite(_)) => {
            let at = if path.is_empty() { "the file's value" } else { path.as_str() };
            return Err(format!(
                "{at} is not a finite number (.nan and .inf have no meaning in a rules or prices file); give a number"
            ));
        }
        None => {}
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                plain_json(v, path)?;
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                plain_json(v, path)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// The first key a JSON document gives twice in one mapping, with its path
/// and the parser's position (`rules[0].assertions[1].spec: duplicate key
/// 'check'`): read into a map, a duplicate replaces the first value (JSON
/// parsers disagree), so a copy-paste slip could rename a rule or invert a
/// check. YAML files are checked by `attest-yaml` as they are read.
///
/// `None` also when the text does not parse: its own error is reported by
/// the parse that follows.
pub(crate) fn first_misread_value<'de, D: serde::Deserializer<'de>>(d: D) -> Option<String> {
    use serde::de::DeserializeSeed;
    let mut walk = dupes::Walk::default();
    let e = (&mut walk).deserialize(d).err()?;
    let found = walk.found?;
    // The parser adds where it was (` at line 3 column 55`).
    let text = e.to_string();
    let location = text.find(&found).map_or("", |at| &text[at + found.len()..]);
    Some(format!("{found}{location}"))
}

mod dupes {
    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::collections::HashSet;
    use std::fmt;

    /// Walks a document keeping the path to where it is, and fails at the
    /// first key its mapping holds already (`found` tells that failure
    /// from the parser's own).
    #[derive(Default)]
    pub(super) struct Walk {
        path: String,
        pub(super) found: Option<String>,
    }

    impl<'de> DeserializeSeed<'de> for &mut Walk {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for &mut Walk {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_i128<E>(self, _: i128) -> Result<(), E> {
            Ok(())
        }
        fn visit_u128<E>(self, _: u128) -> Result<(), E> {
            Ok(())
        }
        // JSON numbers are always finite: nothing to refuse.
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_bytes<E>(self, _: &[u8]) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_none<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.deserialize(d)
        }
        fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.deserialize(d)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            for i in 0.. {
                let len = self.path.len();
                self.path.push_str(&format!("[{i}]"));
                let more = seq.next_element_seed(&mut *self)?;
                self.path.truncate(len);
                if more.is_none() {
                    break;
                }
            }
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key_seed(Key)? {
                let len = self.path.len();
                if let Some(key) = key {
                    // Compared whole (keys may share a long prefix, as model
                    // ARNs do), shown clipped.
                    let fresh = seen.insert(key.clone());
                    let key = super::bounded(&key, 64);
                    if !fresh {
                        let at = if self.path.is_empty() { "the top level" } else { &self.path };
                        let found =
                            format!("{at}: duplicate key '{key}': a key may appear once in each mapping; remove or rename one of them");
                        self.found = Some(found.clone());
                        return Err(de::Error::custom(found));
                    }
                    if !self.path.is_empty() {
                        self.path.push('.');
                    }
                    self.path.push_str(&key);
                }
                map.next_value_seed(&mut *self)?;
                self.path.truncate(len);
            }
            Ok(())
        }
    }

    /// A mapping key as text when it is a scalar (`1` and `'1'` are one
    /// key once the document is read as JSON); `None` for a collection used
    /// as a key, which no field of ours is.
    struct Key;

    impl<'de> DeserializeSeed<'de> for Key {
        type Value = Option<String>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Key {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a key")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Some("null".to_owned()))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_is_refused_quickly() {
        let deep = format!("rules: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let t = std::time::Instant::now();
        let e = parse_yaml::<serde_json::Value>(&deep).unwrap_err();
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "took {:?}", t.elapsed());
        assert!(e.contains("nests deeper than 256 levels") && e.contains("line 1"), "{e}");
        // Brackets in quoted scalars and comments do not count, nor do
        // quotes inside words open a quoted scalar.
        let quoted = format!(
            "a: \"{0}\"\nb: '{0}'\n# {0}\nc: don't [x]\nf: 5\" [y]\nd: [{{e: 1}}]\n",
            "[".repeat(500)
        );
        let v: serde_json::Value = parse_yaml(&quoted).unwrap();
        assert_eq!(v["d"][0]["e"], 1);
        assert_eq!(v["c"], "don't [x]");
    }

    #[test]
    fn a_non_finite_number_is_named_by_its_path() {
        let e = parse_yaml::<serde_json::Value>("rules:\n  - name: r\n    sample_rate: .NaN\n").unwrap_err();
        assert!(e.starts_with("rules[0].sample_rate is not a finite number"), "{e}");
        let e = parse_yaml::<serde_json::Value>("models:\n  m: {input_per_million: -.inf}\n").unwrap_err();
        assert!(e.starts_with("models.m.input_per_million is not a finite number"), "{e}");
        // Spelled as text, it is text.
        let v: serde_json::Value = parse_yaml("a: '.nan'\nb: x.info\n").unwrap();
        assert_eq!(v["a"], ".nan");
    }

    /// Rules and price files resolve plain scalars as ECP manifests do
    /// (YAML 1.1, as PyYAML): `yes`/`on` are true, `010` is octal.
    #[test]
    fn rules_files_read_yaml_as_manifests_do() {
        let v: serde_json::Value = parse_yaml("a: yes\nb: off\nc: 010\nd: 2024-05-01\ne: 'yes'\nf: 1e3\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": true, "b": false, "c": 8, "d": "2024-05-01", "e": "yes", "f": "1e3"})
        );
        let e = parse_yaml::<serde_json::Value>("rules:\n  - name: a\n    name: b\n").unwrap_err();
        assert!(e.starts_with("rules[0]: duplicate key 'name'"), "{e}");
    }

    #[test]
    fn ids_are_escaped_injectively_without_line_breaks() {
        assert_eq!(escape_id("trc_0af3-9"), "trc_0af3-9");
        assert_eq!(escape_id("a\r\nX-Evil: 1"), "a%0D%0AX-Evil:%201");
        assert_eq!(escape_id("50%"), "50%25");
        assert_eq!(escape_id("é\u{7f}"), "%C3%A9%7F");
        // `%` is encoded too, so an id that looks like an encoding stays distinct.
        assert_ne!(escape_id("a%0D"), escape_id("a\r"));
        let hostile = "x\r\n".repeat(1000);
        let shown = shown_id(&hostile);
        assert!(shown.len() <= 128 + '…'.len_utf8() && !shown.contains(['\r', '\n']), "{shown}");
    }

    #[test]
    fn configuration_files_are_read_up_to_the_cap_and_refused_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("rules.yaml");
        std::fs::write(&small, "rules: []\n").unwrap();
        assert_eq!(read_capped(&small).unwrap(), "rules: []\n");
        let e = read_capped(std::path::Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "is larger than 16 MiB");
    }
}
