//! The trace model plugins see: the same members as the engine's eager
//! `attest_trace::Trace` (Attest protocol v1 §3), decoded lazily.
//!
//! The engine hands a plugin the trace's JSON text exactly as it received it,
//! after validating it, so decoding here is lenient in the same places the
//! engine's own construction is: an explicit `null` means "not provided",
//! unknown step types are kept, and unknown fields are ignored.
//!
//! A [`Trace`] is decoded lazily. Building one only scans the text once (in
//! a component, a skim of the engine's validated text) and
//! decodes the small identifying fields; `input`, `output`, `metadata` and
//! `steps` are each decoded the first time they are read. A plugin that
//! checks `output.message` never pays for decoding the steps, and one that
//! does not look at the trace pays for nothing but the scan. Inside a
//! component, building JSON trees is most of what a simple plugin costs
//! (docs/benchmarks.md).

use crate::PluginError;
/// A step's `type`, shared with the engine (`attest-trace`).
pub use attest_trace::StepType;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::cell::OnceCell;
use std::ops::Range;

/// One step of a trace (shared with the engine, `attest-trace`).
pub type Step = attest_trace::Step<Trace>;

/// A whole trace, as the engine validated it.
///
/// Read it through its accessors; each large part is decoded on first use
/// and then kept (see the module docs).
#[derive(Debug, Clone)]
pub struct Trace {
    text: Box<str>,
    schema_version: i64,
    trace_id: String,
    agent_id: Option<String>,
    parent_trace_id: Option<String>,
    input: Lazy<Value>,
    output: Lazy<Value>,
    metadata: Lazy<Value>,
    steps: Lazy<Vec<Step>>,
}

/// One large field: where its JSON sits in the trace text (`None` when it is
/// absent or `null`), and its decoded value once someone asked for it.
#[derive(Debug, Clone)]
struct Lazy<T> {
    span: Option<Range<usize>>,
    value: OnceCell<T>,
}

/// What the scan decodes at once: the identifying fields, and only the
/// extent of the large ones.
#[derive(Deserialize)]
struct Scan<'a> {
    #[serde(default = "current_schema_version")]
    schema_version: i64,
    #[serde(default)]
    trace_id: String,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    parent_trace_id: Option<String>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    #[serde(default, borrow)]
    output: Option<&'a RawValue>,
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default, borrow)]
    steps: Option<&'a RawValue>,
}

fn current_schema_version() -> i64 {
    1
}

/// What a trace's scan finds: the identifying fields, decoded, and where
/// the large ones sit in the text (`None` when absent or `null`).
struct Members {
    schema_version: i64,
    trace_id: String,
    agent_id: Option<String>,
    parent_trace_id: Option<String>,
    input: Option<Range<usize>>,
    output: Option<Range<usize>>,
    metadata: Option<Range<usize>>,
    steps: Option<Range<usize>>,
}

/// The top-level members of a JSON object that is known to be valid: keys
/// are compared as written, strings are jumped with `memchr` to their
/// closing quote, and a nested value ends where its brackets balance. Inside
/// a component this is several times cheaper than serde's skipping, which
/// checks every byte. `None` for anything it does not expect, including a
/// member given twice (JSON allows it; the typed decode handles it).
fn skim(text: &str) -> Option<Members> {
    let b = text.as_bytes();
    let mut m = Members {
        schema_version: current_schema_version(),
        trace_id: String::new(),
        agent_id: None,
        parent_trace_id: None,
        input: None,
        output: None,
        metadata: None,
        steps: None,
    };
    let mut seen = 0u8;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(m);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(b, i + 1)?;
        let key = &b[i + 1..key_end];
        i = skip_ws(b, key_end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let end = value_end(b, start)?;
        let value = &text[start..end];
        let span = (value != "null").then_some(start..end);
        let bit = match key {
            b"schema_version" => 1,
            b"trace_id" => 2,
            b"agent_id" => 4,
            b"parent_trace_id" => 8,
            b"input" => 16,
            b"output" => 32,
            b"metadata" => 64,
            b"steps" => 128,
            // An escaped key may spell a known one.
            _ if key.contains(&b'\\') => return None,
            _ => 0,
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        match bit {
            1 => m.schema_version = serde_json::from_str(value).ok()?,
            2 => m.trace_id = serde_json::from_str(value).ok()?,
            4 => m.agent_id = serde_json::from_str(value).ok()?,
            8 => m.parent_trace_id = serde_json::from_str(value).ok()?,
            16 => m.input = span,
            32 => m.output = span,
            64 => m.metadata = span,
            128 => m.steps = span,
            _ => {}
        }
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return (skip_ws(b, i + 1) == b.len()).then_some(m),
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// The index of the quote that closes the string whose contents start at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some(i);
        }
        // A backslash and the character it escapes.
        i += 2;
    }
}

/// Where the value starting at `start` ends (one past its last byte).
fn value_end(b: &[u8], start: usize) -> Option<usize> {
    match *b.get(start)? {
        b'"' => string_end(b, start + 1).map(|end| end + 1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            loop {
                match *b.get(i)? {
                    b'"' => i = string_end(b, i + 1)?,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let len = b[start..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))?;
            (len > 0).then_some(start + len)
        }
    }
}

static NULL: Value = Value::Null;

impl Trace {
    /// Reads a trace from the JSON text the engine sends. Only the scan
    /// happens here; a trace the SDK cannot read at all is an
    /// `unsupported-trace` error for every config.
    pub fn from_json(json: &str) -> Result<Trace, PluginError> {
        Trace::from_string(json.into())
    }

    /// [`Trace::from_json`], keeping the given text instead of copying it.
    pub fn from_string(text: String) -> Result<Trace, PluginError> {
        let text = text.into_boxed_str();
        let scan: Scan<'_> = match serde_json::from_str(&text) {
            Ok(scan) => scan,
            // Once more without them: that text has no repeats left.
            Err(e) if is_duplicate(&e) => return Trace::from_string(without_duplicates(&text).ok_or_else(|| undecodable(e))?),
            Err(e) => return Err(undecodable(e)),
        };
        let span = |raw: Option<&RawValue>| {
            raw.map(|r| {
                let start = r.get().as_ptr() as usize - text.as_ptr() as usize;
                start..start + r.get().len()
            })
        };
        let members = Members {
            schema_version: scan.schema_version,
            trace_id: scan.trace_id,
            agent_id: scan.agent_id,
            parent_trace_id: scan.parent_trace_id,
            input: span(scan.input),
            output: span(scan.output),
            metadata: span(scan.metadata),
            steps: span(scan.steps),
        };
        Trace::from_members(text, members)
    }

    /// Reads the trace text the engine hands a component. The engine has
    /// validated it as JSON, so its top-level members are found by skimming
    /// ([`skim`]) rather than by a typed decode that checks every byte. A
    /// text the skim does not expect (not an object, a repeated member, an
    /// escaped key) is read by [`Trace::from_string`], which then says what
    /// is wrong with it.
    pub(crate) fn from_engine(text: String) -> Result<Trace, PluginError> {
        match skim(&text) {
            Some(members) => Trace::from_members(text.into_boxed_str(), members),
            None => Trace::from_string(text),
        }
    }

    fn from_members(text: Box<str>, m: Members) -> Result<Trace, PluginError> {
        // The shapes the engine guarantees, checked now so that a trace that
        // is not one fails up front rather than on first access.
        for (field, span, open, kind) in [("steps", &m.steps, b'[', "an array"), ("output", &m.output, b'{', "an object")] {
            if span.as_ref().is_some_and(|s| text.as_bytes()[s.start] != open) {
                return Err(PluginError::UnsupportedTrace(format!(
                    "the trace could not be decoded: {field} must be {kind}"
                )));
            }
        }
        Ok(Trace {
            schema_version: m.schema_version,
            trace_id: m.trace_id,
            agent_id: m.agent_id,
            parent_trace_id: m.parent_trace_id,
            input: Lazy::new(m.input),
            output: Lazy::new(m.output),
            metadata: Lazy::new(m.metadata),
            steps: Lazy::new(m.steps),
            text,
        })
    }

    /// Reads a trace from a JSON value (handy in tests with `json!`).
    pub fn from_value(value: Value) -> Result<Trace, PluginError> {
        Trace::from_string(value.to_string())
    }

    /// Decodes every part now, so that a trace the SDK's model cannot hold
    /// is an error here rather than a panic on first access. Tests use it;
    /// plugins need not (the engine validates traces before sending them).
    pub fn decode_all(&self) -> Result<&Trace, PluginError> {
        self.input.try_get(&self.text, "input")?;
        self.output.try_get(&self.text, "output")?;
        self.metadata.try_get(&self.text, "metadata")?;
        self.steps.try_get(&self.text, "steps")?;
        Ok(self)
    }

    /// The trace's JSON text, exactly as the engine sent it.
    pub fn as_json(&self) -> &str {
        &self.text
    }

    pub fn schema_version(&self) -> i64 {
        self.schema_version
    }

    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    pub fn agent_id(&self) -> Option<&str> {
        self.agent_id.as_deref()
    }

    /// The parent's trace id, for a trace delegated to from another.
    pub fn parent_trace_id(&self) -> Option<&str> {
        self.parent_trace_id.as_deref()
    }

    pub fn input(&self) -> Option<&Value> {
        self.input.get(&self.text, "input")
    }

    /// The output object (the engine guarantees a non-empty one); `null`
    /// when a hand-built trace has none.
    pub fn output(&self) -> &Value {
        self.output.get(&self.text, "output").unwrap_or(&NULL)
    }

    pub fn metadata(&self) -> Option<&Value> {
        self.metadata.get(&self.text, "metadata")
    }

    /// The top-level steps, in order (empty when `steps` is absent or `null`).
    pub fn steps(&self) -> &[Step] {
        self.steps.get(&self.text, "steps").map_or(&[], Vec::as_slice)
    }

    /// Top-level steps that count as tool calls, in order, with their indexes
    /// (the same notion as the engine's trace layer).
    pub fn tool_steps(&self) -> impl Iterator<Item = (usize, &Step)> {
        self.steps().iter().enumerate().filter(|(_, s)| s.kind.is_tool())
    }

    /// Top-level steps with this name, in order, with their indexes.
    pub fn steps_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (usize, &'a Step)> + 'a {
        self.steps().iter().enumerate().filter(move |(_, s)| s.name == name)
    }
}

impl<T: serde::de::DeserializeOwned> Lazy<T> {
    fn new(span: Option<Range<usize>>) -> Lazy<T> {
        Lazy {
            span,
            value: OnceCell::new(),
        }
    }

    fn try_get(&self, text: &str, field: &str) -> Result<Option<&T>, PluginError> {
        let Some(span) = &self.span else { return Ok(None) };
        if let Some(v) = self.value.get() {
            return Ok(Some(v));
        }
        let part = &text[span.clone()];
        let decoded = match serde_json::from_str(part) {
            Err(e) if is_duplicate(&e) => without_duplicates(part).map_or(Err(e), |t| serde_json::from_str(&t)),
            decoded => decoded,
        }
        .map_err(|e| PluginError::UnsupportedTrace(format!("the trace's {field} could not be decoded: {e}")))?;
        Ok(Some(self.value.get_or_init(|| decoded)))
    }

    /// The engine validated the trace before sending it, so a part that does
    /// not decode means the SDK and the engine disagree about the trace
    /// model. Panicking (a trap, with the message in the engine's log) is the
    /// honest answer: no verdict can be trusted.
    fn get(&self, text: &str, field: &str) -> Option<&T> {
        match self.try_get(text, field) {
            Ok(v) => v,
            Err(e) => panic!("attest-plugin-sdk: {e}"),
        }
    }
}

/// Whether `e` is a member repeated in one object, which JSON allows and
/// typed decoding refuses.
fn is_duplicate(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("duplicate field")
}

/// `text` with every repeated member reduced to its last value, which is
/// what the engine's own checks read; `None` if it is not JSON at all.
/// Only taken when a typed decode found a repeat, so other traces pay nothing.
fn without_duplicates(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text).ok().map(|v| v.to_string())
}

fn undecodable(e: serde_json::Error) -> PluginError {
    PluginError::UnsupportedTrace(format!("the trace could not be decoded: {e}"))
}

/// Traces compare by their JSON text.
impl PartialEq for Trace {
    fn eq(&self, other: &Trace) -> bool {
        self.text == other.text
    }
}

/// A delegated agent's trace inside a step: kept as text, decoded lazily too.
impl<'de> Deserialize<'de> for Trace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Trace, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Trace::from_string(Box::<str>::from(raw).into_string()).map_err(|e| serde::de::Error::custom(e.message()))
    }
}

impl Serialize for Trace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_str(&self.text).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// Targets ([`crate::Target`]) resolve against the lazy trace through the
/// grammar the engine uses.
impl attest_trace::TraceView for Trace {
    type Step = Step;
    fn input(&self) -> Option<&Value> {
        Trace::input(self)
    }
    fn output(&self) -> &Value {
        Trace::output(self)
    }
    fn metadata(&self) -> Option<&Value> {
        Trace::metadata(self)
    }
    fn steps(&self) -> &[Step] {
        Trace::steps(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a trace's scan found, to compare the two ways of scanning.
    fn scanned(t: &Trace) -> (i64, &str, Option<&str>, Option<&str>, [Option<&str>; 4]) {
        let part = |span: &Option<Range<usize>>| -> Option<&str> { span.clone().map(|r| &t.text[r]) };
        let parts = [
            part(&t.input.span),
            part(&t.output.span),
            part(&t.metadata.span),
            part(&t.steps.span),
        ];
        (
            t.schema_version,
            t.trace_id.as_str(),
            t.agent_id.as_deref(),
            t.parent_trace_id.as_deref(),
            parts,
        )
    }

    #[test]
    fn the_skim_finds_what_the_typed_decode_finds() {
        let skimmed = [
            r#"{"schema_version":1,"trace_id":"t","agent_id":"a","input":{"q":"hi"},"steps":[{"type":"tool_call","name":"x","args":{"s":"]}\"{["}}],"output":{"message":"m"},"metadata":{"n":1.5e3}}"#,
            "{ \"trace_id\" : \"t\\\"q\\\\\" ,\n\t\"output\" :\r\n{ \"message\" : \"a\\u005c\\\"\" } , \"steps\" : [ ] , \"extra\" : [[{}],{\"x\":[1,-2.5,true,null]}] }",
            r#"{"trace_id":"t","input":null,"output":{"m":"é ✓ \u00e9"},"metadata":null,"steps":null,"agent_id":null,"parent_trace_id":"p"}"#,
            r#"{"schema_version":2,"trace_id":"","output":{},"unknown":"x","n":-0,"b":false}"#,
            r#"{}"#,
            " { } ",
            r#"{"output":"not an object"}"#,
            r#"{"steps":{"not":"an array"}}"#,
            r#"{"schema_version":1.5,"output":{}}"#,
            r#"{"trace_id":5}"#,
        ];
        let typed_only = [
            r#"{"trace_id":"a","trace_id":"b","output":{"m":1}}"#,
            r#"{"trace\u005fid":"escaped key","output":{"m":1}}"#,
            r#"{"output":{"message":"a","message":"b"},"output":{"m":2}}"#,
            r#"[1, 2]"#,
            r#"not json"#,
            r#"{"trace_id":"t",}"#,
            r#"{"trace_id":"t"} x"#,
        ];
        for text in skimmed.iter().chain(&typed_only) {
            let (typed, fast) = (Trace::from_string(text.to_string()), Trace::from_engine(text.to_string()));
            match (&typed, &fast) {
                (Ok(typed), Ok(fast)) => assert_eq!(scanned(fast), scanned(typed), "{text}"),
                (Err(typed), Err(fast)) => assert_eq!(fast, typed, "{text}"),
                _ => panic!("{text}: the typed decode gives {typed:?}, the skim {fast:?}"),
            }
        }
        for text in skimmed {
            assert!(
                skim(text).is_some() || Trace::from_string(text.to_string()).is_err(),
                "skimmed: {text}"
            );
        }
        for text in typed_only {
            assert!(skim(text).is_none(), "left to the typed decode: {text}");
        }
    }

    #[test]
    fn repeated_members_read_as_their_last_value_as_in_the_engine() {
        let t = Trace::from_json(
            r#"{"schema_version":1,"trace_id":"old","trace_id":"t","output":{"message":"a","message":"b"},
                "steps":[{"type":"tool_call","name":"x","name":"lookup","args":{"id":1},"args":{"id":2}}]}"#,
        )
        .unwrap();
        assert_eq!(t.trace_id(), "t");
        assert_eq!(t.output()["message"], json!("b"));
        assert_eq!(t.steps()[0].name, "lookup");
        assert_eq!(t.steps()[0].args, Some(json!({"id": 2})));
    }

    #[test]
    fn decodes_every_field() {
        let t = Trace::from_value(json!({
            "schema_version": 1, "trace_id": "t1", "agent_id": "a",
            "input": {"q": "hi"},
            "steps": [
                {"type": "tool_call", "name": "lookup", "args": {"id": 1}, "result": {"ok": true},
                 "metadata": {"m": 1}, "agent_id": "a", "started_at_ms": 1.5, "ended_at_ms": 2},
                {"type": "agent_call", "name": "delegate", "sub_trace": {
                    "schema_version": 1, "trace_id": "t2", "output": {"message": "sub"}}},
                {"type": "custom_kind", "name": "x", "args": null}
            ],
            "output": {"message": "done"},
            "metadata": {"cost_usd": 0.1},
            "parent_trace_id": "p",
            "unknown_field": 1
        }))
        .unwrap();
        assert_eq!((t.schema_version(), t.trace_id(), t.agent_id()), (1, "t1", Some("a")));
        assert_eq!(t.input(), Some(&json!({"q": "hi"})));
        assert_eq!(t.steps().len(), 3);
        assert_eq!(t.steps()[0].kind, StepType::ToolCall);
        assert_eq!(t.steps()[0].ended_at_ms, Some(2.0));
        let sub = t.steps()[1].sub_trace.as_ref().unwrap();
        assert_eq!((sub.trace_id(), &sub.output()["message"]), ("t2", &json!("sub")));
        assert_eq!(t.steps()[2].kind, StepType::Other("custom_kind".into()));
        assert_eq!(t.steps()[2].args, None, "null means absent");
        assert_eq!(t.tool_steps().map(|(i, _)| i).collect::<Vec<_>>(), vec![0]);
        assert_eq!(t.metadata(), Some(&json!({"cost_usd": 0.1})));
        assert_eq!(t.parent_trace_id(), Some("p"));
    }

    #[test]
    fn minimal_trace_and_null_steps() {
        let t = Trace::from_json(r#"{"schema_version":1,"trace_id":"t","steps":null,"output":{"message":"m"}}"#).unwrap();
        assert!(t.steps().is_empty());
        assert_eq!((t.input(), t.metadata()), (None, None));
        assert_eq!(t.output()["message"], "m");
    }

    #[test]
    fn round_trips_step_types() {
        let s: Step = serde_json::from_value(json!({"type": "retrieval", "name": "r"})).unwrap();
        assert!(s.kind.is_tool());
        assert_eq!(serde_json::to_value(&s).unwrap(), json!({"type": "retrieval", "name": "r"}));
    }

    #[test]
    fn parts_are_decoded_on_first_use_only() {
        // Steps the model cannot hold: the scan accepts the trace, reading
        // the output works, and only touching the steps fails.
        let t = Trace::from_json(r#"{"trace_id":"t","steps":[{"name":5}],"output":{"message":"m"}}"#).unwrap();
        assert_eq!(t.output()["message"], "m");
        assert!(t.steps.value.get().is_none(), "steps not decoded by reading the output");
        let err = t.decode_all().unwrap_err();
        assert!(err.message().contains("steps could not be decoded"), "{err:?}");
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.steps().len())).unwrap_err();
        assert!(panic.downcast_ref::<String>().unwrap().contains("steps could not be decoded"));
    }

    #[test]
    fn serialises_as_its_text_and_compares_by_it() {
        let text = r#"{"schema_version":1,"trace_id":"t","output":{"message":"m"}}"#;
        let t = Trace::from_json(text).unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), text);
        assert_eq!(t.as_json(), text);
        assert_eq!(t, t.clone());
        assert_ne!(t, Trace::from_json(r#"{"trace_id":"u"}"#).unwrap());
    }

    #[test]
    fn undecodable_trace_is_unsupported() {
        let err = Trace::from_json("[1, 2]").unwrap_err();
        assert!(matches!(err, PluginError::UnsupportedTrace(_)), "{err:?}");
    }
}
