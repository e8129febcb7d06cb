//! Target and field paths: one grammar for every layer.
//!
//! ```text
//! target   := base segment*
//! base     := "output" | "input" | "metadata"
//!           | "steps" selector? ( ".length" | "." step_field )
//! selector := "[?name==" quoted "]" | "[?type==" quoted "]" | "[" index "]"
//! step_field := "args" | "result" | "metadata" | "name" | "type"
//! segment  := "." key | "[" index "]" | "[" quoted "]"
//! quoted   := '…' | "…"
//! ```
//!
//! - `steps[?name=='x']` and `steps[?type=='t']` select the **first** matching
//!   top-level step when followed by a field, and count all matches when
//!   followed by `.length`. `steps.length` counts every top-level step.
//! - `.length` after any path counts the elements of an array (unless the
//!   value is an object with a `length` key, which is then read as a key).
//! - Keys containing dots or brackets are written `['a.b']`.
//!
//! The engine's built-in assertions and the plugin SDK both use this one
//! implementation, so a target means the same thing in a built-in assertion
//! and in a plugin config. Each side's trace model implements [`TraceView`]
//! (the engine's trace is decoded eagerly, the SDK's lazily).
//!
//! A target is parsed once, when its assertion is compiled or its plugin
//! config decoded (a [`Target`] field in a config struct deserializes from
//! the target string). Resolving against a trace can only fail because the
//! data is not there, and that failure ([`Missing`]) names what is missing.

use crate::text::{clip, quote, quote_list};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// What a target reads from a trace. The engine's and the SDK's trace
/// models both implement it.
pub trait TraceView {
    type Step: StepView;
    fn input(&self) -> Option<&Value>;
    fn output(&self) -> &Value;
    fn metadata(&self) -> Option<&Value>;
    /// Top-level steps, in order.
    fn steps(&self) -> &[Self::Step];
}

/// What a target reads from a step.
pub trait StepView {
    fn name(&self) -> &str;
    fn kind(&self) -> &crate::StepType;
    fn args(&self) -> Option<&Value>;
    fn result(&self) -> Option<&Value>;
    fn metadata(&self) -> Option<&Value>;
}

/// A parsed target, e.g. `output.message` or
/// `steps[?name=='lookup_order'].result.amount`.
///
/// Every key and step filter is a span of the target's own text, so parsing
/// allocates only that text and the list of segments: a plugin decodes its
/// targets on every call (docs/benchmarks.md, "targets without copies").
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    text: String,
    /// Length of the base part of `text` (before the path segments).
    base_len: usize,
    base: Base,
    path: Path,
}

#[derive(Debug, Clone, PartialEq)]
enum Base {
    Output,
    Input,
    Metadata,
    StepCount(StepSelector),
    StepField(StepSelector, StepField),
}

#[derive(Debug, Clone, PartialEq)]
enum StepSelector {
    All,
    Name(Span),
    Type(Span),
    Index(usize),
}

/// Where a key or a filter's value sits in the target's text.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    start: u16,
    end: u16,
}

impl Span {
    /// Targets are at most 1,024 bytes long, so a position fits.
    fn new(start: usize, end: usize) -> Span {
        Span {
            start: start as u16,
            end: end as u16,
        }
    }

    fn of(self, text: &str) -> &str {
        &text[usize::from(self.start)..usize::from(self.end)]
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StepField {
    Args,
    Result,
    Metadata,
    Name,
    Type,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Segment {
    Key(Span),
    Index(usize),
}

/// Segments kept in the target itself; longer paths go on the heap.
const INLINE_SEGMENTS: usize = 3;

/// The segments after the base. Most targets have one to three
/// (`output.message`, `steps[0].result.amount`), and a plugin parses its
/// targets on every call, so those are kept without an allocation.
#[derive(Debug, Clone, PartialEq)]
enum Path {
    Inline(u8, [Segment; INLINE_SEGMENTS]),
    Heap(Vec<Segment>),
}

impl Path {
    const EMPTY: Path = Path::Inline(0, [Segment::Index(0); INLINE_SEGMENTS]);

    fn push(&mut self, segment: Segment) {
        match self {
            Path::Inline(len, inline) if usize::from(*len) < INLINE_SEGMENTS => {
                inline[usize::from(*len)] = segment;
                *len += 1;
            }
            Path::Inline(_, inline) => {
                let mut heap = Vec::with_capacity(2 * INLINE_SEGMENTS);
                heap.extend_from_slice(inline);
                heap.push(segment);
                *self = Path::Heap(heap);
            }
            Path::Heap(heap) => heap.push(segment),
        }
    }

    fn as_slice(&self) -> &[Segment] {
        match self {
            Path::Inline(len, inline) => &inline[..usize::from(*len)],
            Path::Heap(heap) => heap,
        }
    }
}

/// Why a target string is not valid syntax.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSyntaxError {
    pub message: String,
}

impl std::error::Error for TargetSyntaxError {}

impl fmt::Display for TargetSyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The forms a target may take, for `detail` texts.
pub const GRAMMAR_HINT: &str = "Supported targets: output, output.<path>, input.<path>, metadata.<path>, steps.length, steps[?name=='<name>'].length, steps[?type=='<type>'].length, steps[?name=='<name>'].args|result|metadata|name|type[.<path>], steps[<index>].<field>[.<path>]; a <path> is .key, [index] or ['key'] segments.";

/// The data a target points at is not in this trace; the text says what is
/// missing, e.g. `no step named 'ship' (steps: ['think', 'lookup'])`.
#[derive(Debug, Clone, PartialEq)]
pub struct Missing(pub String);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Target {
    /// Parses a target; the error names the position and what was expected.
    pub fn parse(text: &str) -> Result<Target, TargetSyntaxError> {
        Parser { text, pos: 0 }.target()
    }

    /// The target as written, for explanations.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Resolves the target against `trace`.
    pub fn resolve<'t, T: TraceView>(&self, trace: &'t T) -> Result<Cow<'t, Value>, Missing> {
        let start: Cow<'t, Value> = match &self.base {
            Base::Output => Cow::Borrowed(trace.output()),
            Base::Input => match trace.input() {
                Some(v) => Cow::Borrowed(v),
                None => return Err(Missing("trace has no input".into())),
            },
            Base::Metadata => match trace.metadata() {
                Some(v) => Cow::Borrowed(v),
                None => return Err(Missing("trace has no metadata".into())),
            },
            Base::StepCount(sel) => {
                let n = trace
                    .steps()
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| sel.matches(*i, *s, &self.text))
                    .count();
                Cow::Owned(Value::from(n))
            }
            Base::StepField(sel, field) => {
                let Some((_, step)) = trace.steps().iter().enumerate().find(|(i, s)| sel.matches(*i, *s, &self.text)) else {
                    return Err(Missing(sel.not_found(trace, &self.text)));
                };
                let v = match field {
                    StepField::Args => step.args().map(Cow::Borrowed),
                    StepField::Result => step.result().map(Cow::Borrowed),
                    StepField::Metadata => step.metadata().map(Cow::Borrowed),
                    StepField::Name => Some(Cow::Owned(Value::from(step.name()))),
                    StepField::Type => Some(Cow::Owned(Value::from(step.kind().as_str()))),
                };
                match v {
                    Some(v) => v,
                    None => return Err(Missing(format!("step {} has no {}", quote(step.name()), field.name()))),
                }
            }
        };
        walk(start, self.path.as_slice(), &self.text, self.base_len)
    }
}

/// Follows `path` from `cur`. Error messages name where the walk stopped
/// (the base part of `text` plus the segments followed so far); that text is only built when
/// one is needed, as resolving is on every plugin's hot path.
fn walk<'t>(mut cur: Cow<'t, Value>, path: &[Segment], text: &str, base_len: usize) -> Result<Cow<'t, Value>, Missing> {
    for (depth, &seg) in path.iter().enumerate() {
        let at = || path[..depth].iter().fold(text[..base_len].to_owned(), |at, s| at + &s.render(text));
        let next = match (cur, seg.key(text)) {
            (Cow::Borrowed(Value::Object(m)), Seg::Key(k)) => match m.get(k) {
                Some(v) => Cow::Borrowed(v),
                None => return Err(missing_key(k, &at(), m.keys())),
            },
            (Cow::Owned(Value::Object(mut m)), Seg::Key(k)) => match m.remove(k) {
                Some(v) => Cow::Owned(v),
                None => return Err(missing_key(k, &at(), m.keys())),
            },
            (c, Seg::Key(k)) if k == "length" && c.is_array() => Cow::Owned(Value::from(c.as_array().map_or(0, Vec::len))),
            (Cow::Borrowed(Value::Array(a)), Seg::Index(i)) => match a.get(i) {
                Some(v) => Cow::Borrowed(v),
                None => return Err(Missing(format!("index {i} is out of range for {} (length {})", at(), a.len()))),
            },
            (Cow::Owned(Value::Array(mut a)), Seg::Index(i)) => {
                if i < a.len() {
                    Cow::Owned(a.swap_remove(i))
                } else {
                    return Err(Missing(format!("index {i} is out of range for {} (length {})", at(), a.len())));
                }
            }
            (c, seg) => {
                return Err(Missing(format!(
                    "{} is {}, so {} cannot be read from it",
                    at(),
                    crate::text::describe(&c),
                    seg.describe()
                )))
            }
        };
        cur = next;
    }
    Ok(cur)
}

fn missing_key<'a>(key: &str, at: &str, keys: impl Iterator<Item = &'a String>) -> Missing {
    let keys: Vec<&String> = keys.collect();
    if keys.is_empty() {
        Missing(format!("field {} not found in {at} (it is empty)", quote(key)))
    } else {
        Missing(format!("field {} not found in {at} (available: {})", quote(key), quote_list(&keys)))
    }
}

impl StepSelector {
    fn matches<S: StepView>(&self, index: usize, step: &S, text: &str) -> bool {
        match self {
            StepSelector::All => true,
            StepSelector::Name(n) => step.name() == n.of(text),
            StepSelector::Type(t) => step.kind().as_str() == t.of(text),
            StepSelector::Index(i) => index == *i,
        }
    }

    fn not_found(&self, trace: &impl TraceView, text: &str) -> String {
        match self {
            StepSelector::All => "trace has no steps".into(),
            StepSelector::Name(n) => {
                let n = n.of(text);
                let names: Vec<&str> = trace.steps().iter().map(|s| s.name()).collect();
                if names.is_empty() {
                    format!("no step named {} (the trace has no steps)", quote(n))
                } else {
                    format!("no step named {} (steps: {})", quote(n), quote_list(&names))
                }
            }
            StepSelector::Type(t) => format!("no step of type {}", quote(t.of(text))),
            StepSelector::Index(i) => format!("no step at index {i} (the trace has {} steps)", trace.steps().len()),
        }
    }
}

impl StepField {
    const NAMES: &'static str = "args, result, metadata, name, type";

    fn parse(s: &str) -> Option<StepField> {
        Some(match s {
            "args" => StepField::Args,
            "result" => StepField::Result,
            "metadata" => StepField::Metadata,
            "name" => StepField::Name,
            "type" => StepField::Type,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            StepField::Args => "args",
            StepField::Result => "result",
            StepField::Metadata => "metadata",
            StepField::Name => "name",
            StepField::Type => "type",
        }
    }
}

/// A segment with its key read from the target's text.
#[derive(Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

impl Segment {
    fn key(self, text: &str) -> Seg<'_> {
        match self {
            Segment::Key(k) => Seg::Key(k.of(text)),
            Segment::Index(i) => Seg::Index(i),
        }
    }

    fn render(self, text: &str) -> String {
        match self.key(text) {
            Seg::Key(k) if is_plain_key(k) => format!(".{k}"),
            Seg::Key(k) => format!("['{k}']"),
            Seg::Index(i) => format!("[{i}]"),
        }
    }
}

impl Seg<'_> {
    fn describe(self) -> String {
        match self {
            Seg::Key(k) => format!("field {}", quote(k)),
            Seg::Index(i) => format!("index {i}"),
        }
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'$')
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: &str) -> TargetSyntaxError {
        TargetSyntaxError {
            message: format!("unsupported target {}: {what} at position {}", quote(self.text), self.pos),
        }
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        while self.rest().starts_with(' ') {
            self.pos += 1;
        }
    }

    fn ident(&mut self) -> Option<&'a str> {
        let text: &'a str = self.text;
        let start = self.pos;
        let len = self
            .rest()
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-' || *b == b'$')
            .count();
        if len == 0 {
            return None;
        }
        self.pos += len;
        Some(&text[start..self.pos])
    }

    fn index(&mut self) -> Option<usize> {
        let len = self.rest().bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        let n = self.rest()[..len].parse().ok()?;
        self.pos += len;
        Some(n)
    }

    fn quoted(&mut self) -> Result<Span, TargetSyntaxError> {
        let quote_char = match self.rest().chars().next() {
            Some(c @ ('\'' | '"')) => c,
            _ => return Err(self.err("expected a quoted string")),
        };
        self.pos += 1;
        match self.rest().find(quote_char) {
            Some(end) => {
                let s = Span::new(self.pos, self.pos + end);
                self.pos += end + 1;
                Ok(s)
            }
            None => Err(self.err("unterminated quoted string")),
        }
    }

    fn target(mut self) -> Result<Target, TargetSyntaxError> {
        if self.text.len() > 1024 {
            return Err(TargetSyntaxError {
                message: format!("unsupported target {}: longer than 1024 bytes", quote(self.text)),
            });
        }
        let base = match self.ident() {
            Some("output") => Base::Output,
            Some("input") => Base::Input,
            Some("metadata") => Base::Metadata,
            Some("steps") => self.steps()?,
            _ => return Err(self.err("a target starts with output, input, metadata or steps")),
        };
        let base_len = self.pos;
        let mut path = Path::EMPTY;
        while !self.rest().is_empty() {
            if self.eat(".") {
                let start = self.pos;
                match self.ident() {
                    Some(_) => path.push(Segment::Key(Span::new(start, self.pos))),
                    None => return Err(self.err("expected a key after '.'")),
                }
            } else if self.eat("[") {
                let seg = match self.index() {
                    Some(i) => Segment::Index(i),
                    None => Segment::Key(self.quoted()?),
                };
                if !self.eat("]") {
                    return Err(self.err("expected ']'"));
                }
                path.push(seg);
            } else {
                return Err(self.err("expected '.' or '['"));
            }
        }
        Ok(Target {
            text: self.text.to_owned(),
            base_len,
            base,
            path,
        })
    }

    fn steps(&mut self) -> Result<Base, TargetSyntaxError> {
        let selector = if self.eat("[") {
            let sel = if self.eat("?") {
                let key = self.ident();
                self.skip_ws();
                if !self.eat("==") {
                    return Err(self.err("expected '==' in a step filter"));
                }
                self.skip_ws();
                let value = self.quoted()?;
                match key {
                    Some("name") => StepSelector::Name(value),
                    Some("type") => StepSelector::Type(value),
                    _ => return Err(self.err("steps can be filtered by name or type")),
                }
            } else {
                match self.index() {
                    Some(i) => StepSelector::Index(i),
                    None => return Err(self.err("expected ?name=='…', ?type=='…' or an index inside steps[…]")),
                }
            };
            if !self.eat("]") {
                return Err(self.err("expected ']'"));
            }
            sel
        } else {
            StepSelector::All
        };
        if !self.eat(".") {
            return Err(self.err(&format!("expected .length or a step field ({})", StepField::NAMES)));
        }
        let field_pos = self.pos;
        match self.ident() {
            Some("length") if self.rest().is_empty() => Ok(Base::StepCount(selector)),
            Some(_) if selector == StepSelector::All => {
                self.pos = field_pos;
                Err(self
                    .err("select a step first (steps[?name=='…'], steps[?type=='…'] or steps[<index>]); plain steps only supports .length"))
            }
            Some(f) => match StepField::parse(f) {
                Some(field) => Ok(Base::StepField(selector, field)),
                None => {
                    self.pos = field_pos;
                    Err(self.err(&format!(
                        "unknown step field {} (expected {} or length)",
                        quote(&clip(f, 40)),
                        StepField::NAMES
                    )))
                }
            },
            None => Err(self.err(&format!("expected .length or a step field ({})", StepField::NAMES))),
        }
    }
}

impl FromStr for Target {
    type Err = TargetSyntaxError;

    fn from_str(s: &str) -> Result<Target, TargetSyntaxError> {
        Target::parse(s)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A target in a config is written as its string; a syntax error is a
/// config error that quotes the target and lists the supported forms.
impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Target, D::Error> {
        // Parsed from the string as the decoder has it (borrowed or in its
        // scratch buffer), without a copy first.
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Target;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a target string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Target, E> {
                Target::parse(text).map_err(|e| E::custom(format!("{e}. {GRAMMAR_HINT}")))
            }
        }
        d.deserialize_str(Text)
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A trace read straight from JSON, for these tests.
    struct Trace {
        input: Option<Value>,
        output: Value,
        metadata: Option<Value>,
        steps: Vec<crate::Step<()>>,
    }

    impl Trace {
        fn from_value(v: Value) -> Result<Trace, serde_json::Error> {
            Ok(Trace {
                input: v.get("input").cloned(),
                output: v["output"].clone(),
                metadata: v.get("metadata").cloned(),
                steps: serde_json::from_value(v.get("steps").cloned().unwrap_or(json!([])))?,
            })
        }
    }

    impl TraceView for Trace {
        type Step = crate::Step<()>;
        fn input(&self) -> Option<&Value> {
            self.input.as_ref()
        }
        fn output(&self) -> &Value {
            &self.output
        }
        fn metadata(&self) -> Option<&Value> {
            self.metadata.as_ref()
        }
        fn steps(&self) -> &[crate::Step<()>] {
            &self.steps
        }
    }

    fn trace() -> Trace {
        Trace::from_value(json!({
            "schema_version": 1, "trace_id": "t",
            "input": {"q": "hi"},
            "steps": [
                {"type": "llm_call", "name": "think", "result": {"completion": "ok"}},
                {"type": "tool_call", "name": "lookup", "args": {"id": "A"}, "result": {"amount": 5, "items": [1, 2, 3], "a.b": true}},
                {"type": "tool_call", "name": "refund", "args": {"id": "A"}}
            ],
            "output": {"message": "done", "structured": {"refund_id": "R1"}},
            "metadata": {"cost_usd": 0.01, "custom": {"depth": 2}}
        }))
        .unwrap()
    }

    fn get(t: &str) -> Result<Value, Missing> {
        Target::parse(t).unwrap().resolve(&trace()).map(Cow::into_owned)
    }

    mod cases {
        use super::*;

        #[test]
        fn resolves_every_base() {
            assert_eq!(get("output.message").unwrap(), json!("done"));
            assert_eq!(get("output").unwrap()["structured"]["refund_id"], json!("R1"));
            assert_eq!(get("input.q").unwrap(), json!("hi"));
            assert_eq!(get("metadata.custom.depth").unwrap(), json!(2));
            assert_eq!(get("steps[?name=='lookup'].result.amount").unwrap(), json!(5));
            assert_eq!(get("steps[?name==\"lookup\"].args").unwrap(), json!({"id": "A"}));
            assert_eq!(get("steps[1].result.items[2]").unwrap(), json!(3));
            assert_eq!(get("steps[?name=='lookup'].result['a.b']").unwrap(), json!(true));
            assert_eq!(get("steps[?type=='llm_call'].name").unwrap(), json!("think"));
        }

        #[test]
        fn paths_longer_than_the_inline_ones() {
            let t = Trace::from_value(json!({
                "schema_version": 1, "trace_id": "t",
                "output": {"a": {"b": {"c": {"d": [0, {"e": 7}]}}}}
            }))
            .unwrap();
            let get = |s: &str| Target::parse(s).unwrap().resolve(&t).map(Cow::into_owned);
            for (target, segments) in [("output.a.b.c", 3), ("output.a.b.c.d", 4), ("output.a.b.c.d[1].e", 6)] {
                assert_eq!(Target::parse(target).unwrap().path.as_slice().len(), segments, "{target}");
            }
            assert_eq!(get("output.a.b.c.d[1].e").unwrap(), json!(7));
            assert_eq!(get("output.a.b.c.d.length").unwrap(), json!(2));
            assert_eq!(
                get("output.a.b.c.d[1].x").unwrap_err().0,
                "field 'x' not found in output.a.b.c.d[1] (available: ['e'])"
            );
            assert_eq!(Target::parse("output.a.b.c.d").unwrap(), Target::parse("output.a.b.c.d").unwrap());
            assert_ne!(Target::parse("output.a.b.c.d").unwrap(), Target::parse("output.a.b.c.e").unwrap());
        }

        #[test]
        fn counts() {
            assert_eq!(get("steps.length").unwrap(), json!(3));
            assert_eq!(get("steps[?type=='tool_call'].length").unwrap(), json!(2));
            assert_eq!(get("steps[?name=='nope'].length").unwrap(), json!(0));
            assert_eq!(get("steps[?name=='lookup'].result.items.length").unwrap(), json!(3));
        }

        #[test]
        fn missing_data_is_explained() {
            assert_eq!(
                get("steps[?name=='ship'].result").unwrap_err().0,
                "no step named 'ship' (steps: ['think', 'lookup', 'refund'])"
            );
            assert_eq!(get("steps[?name=='refund'].result").unwrap_err().0, "step 'refund' has no result");
            assert_eq!(
                get("output.structured.nope").unwrap_err().0,
                "field 'nope' not found in output.structured (available: ['refund_id'])"
            );
            assert_eq!(
                get("output.message.x").unwrap_err().0,
                "output.message is a string (\"done\"), so field 'x' cannot be read from it"
            );
            assert_eq!(
                get("steps[?name=='lookup'].result.items[9]").unwrap_err().0,
                "index 9 is out of range for steps[?name=='lookup'].result.items (length 3)"
            );
        }

        #[test]
        fn syntax_errors() {
            for bad in [
                "",
                "outputs",
                "steps",
                "steps.name",
                "steps[?id=='x'].result",
                "steps[?name=='x'].resultz",
                "output..x",
                "output[",
                "steps[?name=='x]",
                "output.a b",
                "$.output",
            ] {
                assert!(Target::parse(bad).is_err(), "{bad} should not parse");
            }
        }
    }

    #[test]
    fn step_fields_by_index_and_type() {
        assert_eq!(get("steps[0].type").unwrap(), json!("llm_call"));
        assert_eq!(get("steps[2].name").unwrap(), json!("refund"));
        assert_eq!(get("steps[?type=='tool_call'].args.id").unwrap(), json!("A"));
        assert_eq!(get("steps[?name=='lookup'].result['items'][0]").unwrap(), json!(1));
        assert_eq!(get("steps[?name == 'lookup'].result.amount").unwrap(), json!(5), "spaces around ==");
        assert_eq!(get("steps[9].name").unwrap_err().0, "no step at index 9 (the trace has 3 steps)");
        assert_eq!(get("steps[?type=='retrieval'].name").unwrap_err().0, "no step of type 'retrieval'");
    }

    #[test]
    fn length_prefers_a_length_key_on_objects() {
        let t = Trace::from_value(json!({"schema_version": 1, "trace_id": "t",
            "output": {"list": [1, 2], "obj": {"length": "long"}, "s": "abc"}}))
        .unwrap();
        let get = |s: &str| Target::parse(s).unwrap().resolve(&t).map(Cow::into_owned);
        assert_eq!(get("output.list.length").unwrap(), json!(2));
        assert_eq!(get("output.obj.length").unwrap(), json!("long"));
        assert!(get("output.s.length").is_err(), "strings have no .length");
    }

    #[test]
    fn absent_bases_are_missing() {
        let t = Trace::from_value(json!({"schema_version": 1, "trace_id": "t", "output": {"m": 1}})).unwrap();
        let get = |s: &str| Target::parse(s).unwrap().resolve(&t).map(Cow::into_owned);
        assert_eq!(get("input.q").unwrap_err().0, "trace has no input");
        assert_eq!(get("metadata.x").unwrap_err().0, "trace has no metadata");
        assert_eq!(get("steps.length").unwrap(), json!(0));
        assert_eq!(
            get("steps[?name=='a'].args").unwrap_err().0,
            "no step named 'a' (the trace has no steps)"
        );
    }

    #[test]
    fn syntax_error_messages_name_the_position() {
        let e = Target::parse("steps.name").unwrap_err();
        assert!(e.message.starts_with("unsupported target 'steps.name': select a step first"), "{e}");
        let e = Target::parse("steps[?name=='x'].resultz").unwrap_err();
        assert!(e.message.contains("unknown step field 'resultz'"), "{e}");
        assert!(Target::parse(&"a".repeat(1025))
            .unwrap_err()
            .message
            .contains("longer than 1024 bytes"));
    }

    #[test]
    fn deserializes_from_config_strings() {
        #[derive(Deserialize)]
        struct Config {
            target: Target,
        }
        let c: Config = serde_json::from_str(r#"{"target": "steps[?name=='x'].args.id"}"#).unwrap();
        assert_eq!(c.target.as_str(), "steps[?name=='x'].args.id");
        assert_eq!(c.target.to_string(), "steps[?name=='x'].args.id");
        let err = serde_json::from_str::<Config>(r#"{"target": "outputs"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("unsupported target 'outputs'") && err.contains("Supported targets:"),
            "{err}"
        );
        assert_eq!(serde_json::to_value(&c.target).unwrap(), json!("steps[?name=='x'].args.id"));
        assert_eq!("output.a".parse::<Target>().unwrap().as_str(), "output.a");

        // An escaped string is parsed from the decoder's buffer, and its keys
        // and filters are read back from the target's own text.
        let c: Config = serde_json::from_str(r#"{"target": "steps[?name==\u0027l\u00e9\u0027].result[\"a.b\"].c"}"#).unwrap();
        assert_eq!(c.target.as_str(), "steps[?name=='lé'].result[\"a.b\"].c");
        let t =
            Trace::from_value(json!({"output": {}, "steps": [{"type": "tool_call", "name": "lé", "result": {"a.b": {"c": 7}}}]})).unwrap();
        assert_eq!(c.target.resolve(&t).unwrap().into_owned(), json!(7));
        let err = serde_json::from_str::<Config>(r#"{"target": 5}"#).err().unwrap().to_string();
        assert!(err.starts_with("invalid type: integer `5`, expected a target string"), "{err}");
    }
}
