//! The one YAML reader of the workspace: YAML 1.1 as PyYAML's `safe_load`
//! resolves it, into JSON values. ECP manifests are read so because the
//! reference runtime reads them so; `collect`'s rules and price files are
//! read the same way, so that a value means one thing in every file the
//! engine takes (`enabled: yes` is `true` in both).
//!
//! YAML 1.1 and the 1.2 core schema disagree on plain scalars that manifests
//! do write: `yes`/`no`/`on`/`off` are booleans, `010` is octal, `1:30` is a
//! base-60 number, and `1e3` (no dot) is a string. Tool-call arguments are
//! compared with what the agent reports, so the difference changes verdicts.
//! Quoted and block scalars are always strings, as there. Merge keys
//! (`<<: *base`) are applied as PyYAML applies them: explicit keys win, a
//! later `<<` wins over an earlier one, and within one `<<: [*a, *b]` the
//! first mapping wins.
//!
//! PyYAML values JSON cannot hold stay distinct from strings, so they compare
//! and validate as they do there: a timestamp (`2024-05-01`) becomes
//! `{"yaml:timestamp": "2024-05-01"}` and an infinity or NaN (`.inf`)
//! `{"yaml:float": ".inf"}`; neither equals a string, and neither is accepted
//! where a string is required.
//!
//! A key given twice in one mapping is the later value, as in PyYAML
//! ([`load`]), or refused ([`load_refusing_duplicates`], for files whose
//! format is ours: there a copy-paste slip could silently rename a rule or
//! invert a check).
//!
//! Aliases are expanded into copies, so what one document may expand to is
//! bounded, in values ([`MAX_NODES`]) and in bytes of text
//! ([`MAX_TEXT_BYTES`]), and counted before anything is copied: a small file
//! cannot grow into gigabytes.

#![forbid(unsafe_code)]

use fancy_regex::Regex;
use serde_json::{Map, Number, Value};
use std::collections::HashMap;
use std::sync::OnceLock;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Deepest nesting of lists and mappings a document may have. PyYAML
/// builds values recursively and stops near 1,000 levels (Python's
/// recursion limit); the values here are dropped and compared recursively,
/// so a deeper document would exhaust the stack.
pub const MAX_DEPTH: usize = 256;

/// Most values one document may hold once its aliases are expanded.
pub const MAX_NODES: usize = 1_000_000;
/// Most bytes of scalar text one document may hold once its aliases are
/// expanded (manifest files themselves are at most 32 MiB).
pub const MAX_TEXT_BYTES: usize = 64 * 1024 * 1024;

/// Parses the one document of `text` into a JSON value. A stream of more
/// than one document is refused, as PyYAML's `safe_load` refuses it: a
/// second document would otherwise be silently ignored.
pub fn load(text: &str) -> Result<Value, String> {
    load_with(text, false)
}

/// [`load`], refusing a key given twice in one mapping, with its place.
pub fn load_refusing_duplicates(text: &str) -> Result<Value, String> {
    load_with(text, true)
}

fn load_with(text: &str, refuse_duplicates: bool) -> Result<Value, String> {
    // A byte order mark opens the stream, not the first key: editors on
    // Windows write one, and PyYAML's reader drops it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match parse(text, refuse_duplicates) {
        // JSON writers escape characters outside the BMP as surrogate pairs
        // (`"\ud83d\ude00"`), which YAML does not define but PyYAML reads.
        Err(e) if e.contains("invalid Unicode character escape") => parse(&join_surrogate_escapes(text), refuse_duplicates).map_err(|_| e),
        other => other,
    }
}

fn parse(text: &str, refuse_duplicates: bool) -> Result<Value, String> {
    let mut builder = Builder {
        refuse_duplicates,
        ..Builder::default()
    };
    // Events are pulled one at a time: the parser's own `load` recurses once
    // per level of nesting, and block sequences on one line (`- - - 1`) are
    // bounded by nothing, so 25,000 of them in a 50 KB file would overflow
    // the stack. The builder refuses nesting past MAX_DEPTH, and reading
    // stops at its first error.
    let mut parser = Parser::new_from_str(text);
    loop {
        let (ev, mark) = parser.next_token().map_err(|e| {
            // The scanner's own guard on nesting, worded as the builder's.
            let text = e.to_string();
            match text.strip_prefix("recursion limit exceeded") {
                Some(at) => format!("{}{at}", too_deep()),
                None => text,
            }
        })?;
        let end = ev == Event::StreamEnd;
        builder.on_event(ev, mark);
        if end || builder.error.is_some() {
            break;
        }
    }
    if let Some(e) = builder.error {
        return Err(e);
    }
    Ok(builder.root.unwrap_or(Value::Null))
}

/// `\uD83D\uDE00` (a surrogate pair) as the one escape `\U0001F600`.
fn join_surrogate_escapes(text: &str) -> String {
    let pair = Regex::new(r"\\u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})").expect("valid");
    pair.replace_all(text, |c: &fancy_regex::Captures<'_, str>| {
        let hi = u32::from_str_radix(&c[1], 16).unwrap_or(0xD800);
        let lo = u32::from_str_radix(&c[2], 16).unwrap_or(0xDC00);
        format!("\\U{:08X}", 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
    })
    .into_owned()
}

/// What a node expands to.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    nodes: usize,
    bytes: usize,
}

impl Size {
    const ONE: Size = Size { nodes: 1, bytes: 0 };

    fn add(&mut self, other: Size) {
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

enum Frame {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        size: Size,
    },
    Map {
        entries: Map<String, Value>,
        key: Option<Key>,
        merged: Vec<Value>,
        anchor: usize,
        size: Size,
    },
}

/// A mapping key as it was read.
enum Key {
    Merge,
    Text(String),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    /// Anchored values, with what each expands to.
    anchors: HashMap<usize, (Value, Size)>,
    root: Option<Value>,
    /// Everything the document has expanded to so far.
    total: Size,
    /// Whether an alias has been copied: only then can the document hold
    /// more than its text shows.
    aliased: bool,
    /// Documents begun in the stream.
    documents: usize,
    error: Option<String>,
    refuse_duplicates: bool,
}

impl Builder {
    fn fail(&mut self, mark: Marker, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(format!("{} at line {} column {}", message.into(), mark.line(), mark.col() + 1));
        }
    }

    /// Counts what is new to the document (a scalar, an alias's copy, a
    /// collection's own node) against the bounds; false when over them.
    fn count(&mut self, fresh: Size, mark: Marker) -> bool {
        self.total.add(fresh);
        if self.total.nodes > MAX_NODES || self.total.bytes > MAX_TEXT_BYTES {
            let mib = MAX_TEXT_BYTES >> 20;
            // Only a document with aliases can hold more than its text shows.
            let message = if self.aliased {
                format!("the document expands to more than {MAX_NODES} values or {mib} MiB of text (aliases are copied: each use of one counts all it holds)")
            } else {
                format!("the document holds more than {MAX_NODES} values or {mib} MiB of text")
            };
            self.fail(mark, message);
            return false;
        }
        true
    }

    /// Adds a finished node (of `size` once expanded) to its parent.
    fn push(&mut self, value: Value, size: Size, anchor: usize, mark: Marker) {
        if anchor > 0 {
            self.anchors.insert(anchor, (value.clone(), size));
        }
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Seq { items, size: s, .. }) => {
                items.push(value);
                s.add(size);
            }
            Some(Frame::Map {
                entries,
                key,
                merged,
                size: s,
                ..
            }) => match key.take() {
                None => match key_text(&value) {
                    Some(text) => *key = Some(Key::Text(text)),
                    None => self.fail(mark, "a mapping key must be a scalar"),
                },
                Some(Key::Merge) => {
                    merged.push(value);
                    s.add(size);
                }
                Some(Key::Text(k)) => {
                    if self.refuse_duplicates && entries.contains_key(&k) {
                        let message = format!(
                            "{}: duplicate key '{k}': a key may appear once in each mapping; remove or rename one of them",
                            self.path_of_open_mapping()
                        );
                        return self.fail(mark, message);
                    }
                    entries.insert(k, value);
                    s.add(size);
                }
            },
        }
    }

    /// Where the innermost open mapping sits in the document
    /// (`rules[0].assertions[1].spec`), or `the top level`.
    fn path_of_open_mapping(&self) -> String {
        let mut path = String::new();
        let parents = &self.stack[..self.stack.len().saturating_sub(1)];
        for frame in parents {
            match frame {
                Frame::Seq { items, .. } => path.push_str(&format!("[{}]", items.len())),
                Frame::Map { key, .. } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(match key {
                        Some(Key::Text(k)) => k,
                        Some(Key::Merge) => "<<",
                        None => "?",
                    });
                }
            }
        }
        if path.is_empty() {
            "the top level".into()
        } else {
            path
        }
    }

    /// Closes a mapping: merged keys are filled in under the explicit ones.
    fn close_map(&mut self, mut entries: Map<String, Value>, merged: Vec<Value>, anchor: usize, size: Size, mark: Marker) {
        // A later `<<` wins over an earlier one; within one list, the first.
        for source in merged.iter().rev().flat_map(|m| match m {
            Value::Array(list) => list.iter().collect::<Vec<_>>(),
            one => vec![one],
        }) {
            let Value::Object(source) = source else {
                return self.fail(mark, "a merge key (<<) must name a mapping or a list of mappings");
            };
            for (k, v) in source {
                entries.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        self.push(Value::Object(entries), size, anchor, mark)
    }
}

fn too_deep() -> String {
    format!("the document nests deeper than {MAX_DEPTH} levels of lists and mappings; no file needs that many: flatten it")
}

fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(if *b { "true" } else { "false" }.into()),
        Value::Number(n) => Some(n.to_string()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        if matches!(ev, Event::DocumentStart) {
            self.documents += 1;
            if self.documents > 1 {
                self.fail(
                    mark,
                    "expected a single document in the stream, but found another document (a manifest is one YAML document: remove the second '---')",
                );
            }
            return;
        }
        match ev {
            // A plain `<<` where a key is due is a merge key (a quoted one is
            // an ordinary key).
            Event::Scalar(text, TScalarStyle::Plain, _, None)
                if text == "<<" && matches!(self.stack.last(), Some(Frame::Map { key: None, .. })) =>
            {
                if let Some(Frame::Map { key, .. }) = self.stack.last_mut() {
                    *key = Some(Key::Merge);
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                let size = Size {
                    nodes: 1,
                    bytes: text.len(),
                };
                if self.count(size, mark) {
                    match scalar(text, style, tag.as_ref()) {
                        Ok(v) => self.push(v, size, anchor, mark),
                        Err(e) => self.fail(mark, e),
                    }
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).map(|(_, size)| *size) {
                // Counted before it is copied.
                Some(size) => {
                    self.aliased = true;
                    if self.count(size, mark) {
                        let value = self.anchors[&id].0.clone();
                        self.push(value, size, 0, mark);
                    }
                }
                None => self.fail(mark, "an alias names an anchor that is not defined before it"),
            },
            Event::SequenceStart(..) | Event::MappingStart(..) if self.stack.len() >= MAX_DEPTH => self.fail(mark, too_deep()),
            Event::SequenceStart(anchor, _) => self.stack.push(Frame::Seq {
                items: Vec::new(),
                anchor,
                size: Size::ONE,
            }),
            Event::MappingStart(anchor, _) => self.stack.push(Frame::Map {
                entries: Map::new(),
                key: None,
                merged: Vec::new(),
                anchor,
                size: Size::ONE,
            }),
            Event::SequenceEnd | Event::MappingEnd => {
                if !self.count(Size::ONE, mark) {
                    return;
                }
                match self.stack.pop() {
                    Some(Frame::Seq { items, anchor, size }) => self.push(Value::Array(items), size, anchor, mark),
                    Some(Frame::Map {
                        entries,
                        merged,
                        anchor,
                        size,
                        ..
                    }) => self.close_map(entries, merged, anchor, size, mark),
                    None => self.fail(mark, "unbalanced collection"),
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

/// A scalar's value: quoted and block scalars are strings, plain ones are
/// resolved; `!!str`, `!!int`, `!!float`, `!!bool` and `!!null` are honoured.
fn scalar(text: String, style: TScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    if let Some(tag) = tag {
        return match (tag.handle.as_str(), tag.suffix.as_str()) {
            ("!!", "str") | ("tag:yaml.org,2002:", "str") => Ok(Value::String(text)),
            ("!!", kind @ ("int" | "float" | "bool" | "null")) | ("tag:yaml.org,2002:", kind @ ("int" | "float" | "bool" | "null")) => {
                let v = resolve(&text);
                let fits = matches!(
                    (kind, &v),
                    ("int", Value::Number(_)) | ("float", Value::Number(_)) | ("bool", Value::Bool(_)) | ("null", Value::Null)
                ) || (kind == "float" && matches!(special(&v), Some(Special::NonFinite(_))));
                if fits {
                    Ok(v)
                } else {
                    Err(format!("'{text}' is not a valid !!{kind}"))
                }
            }
            (handle, suffix) => Err(format!("unsupported tag {handle}{suffix}: manifests use plain YAML values")),
        };
    }
    Ok(match style {
        TScalarStyle::Plain => resolve(&text),
        _ => Value::String(text),
    })
}

fn patterns() -> &'static [Regex; 5] {
    static P: OnceLock<[Regex; 5]> = OnceLock::new();
    P.get_or_init(|| {
        [
            // Integers: binary, octal (a leading 0), decimal, hexadecimal, base 60.
            Regex::new(r"^[-+]?(?:0b[0-1_]+|0[0-7_]+|(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|[1-9][0-9_]*(?::[0-5]?[0-9])+)$").expect("valid"),
            // Floats need a dot (or are base 60, infinite or not a number).
            Regex::new(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*)$").expect("valid"),
            Regex::new(r"^[-+]?\.(?:inf|Inf|INF)$").expect("valid"),
            Regex::new(r"^\.(?:nan|NaN|NAN)$").expect("valid"),
            // Timestamps, as PyYAML's resolver reads them: a date alone has a
            // two-digit month and day (`2024-5-1` is a string); with a time,
            // month, day and hour may have one digit, and a zone may follow.
            Regex::new(r"^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)$").expect("valid"),
        ]
    })
}

/// A plain scalar as YAML 1.1 reads it.
fn resolve(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => return Value::Bool(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => return Value::Bool(false),
        _ => {}
    }
    let [int, float, inf, nan, timestamp] = patterns();
    let is = |re: &Regex| re.is_match(text).unwrap_or(false);
    if is(int) {
        if let Some(n) = integer(text) {
            return Value::Number(n);
        }
        // Beyond 64 bits: the nearest float, as a number all the same.
        if let Some(n) = real(text).and_then(Number::from_f64) {
            return Value::Number(n);
        }
    } else if is(float) {
        if let Some(n) = real(text).and_then(Number::from_f64) {
            return Value::Number(n);
        }
    } else if is(inf) || is(nan) {
        return tagged(NON_FINITE, text);
    } else if is(timestamp) {
        return tagged(TIMESTAMP, text);
    }
    Value::String(text.to_owned())
}

/// Keys of the one-entry mappings that hold the PyYAML values JSON cannot
/// (see [`Special`]).
const TIMESTAMP: &str = "yaml:timestamp";
const NON_FINITE: &str = "yaml:float";

/// A PyYAML value JSON cannot hold, kept apart from strings.
fn tagged(kind: &str, text: &str) -> Value {
    Value::Object(Map::from_iter([(kind.to_owned(), Value::String(text.to_owned()))]))
}

/// A value [`load`] keeps apart from strings, with its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special<'a> {
    /// A timestamp (`2024-05-01`).
    Timestamp(&'a str),
    /// An infinity or NaN (`.inf`, `.nan`).
    NonFinite(&'a str),
}

/// Which special value `v` is, if it is one.
pub fn special(v: &Value) -> Option<Special<'_>> {
    let Value::Object(m) = v else { return None };
    if m.len() != 1 {
        return None;
    }
    let (key, text) = m.iter().next()?;
    let text = text.as_str()?;
    match key.as_str() {
        TIMESTAMP => Some(Special::Timestamp(text)),
        NON_FINITE => Some(Special::NonFinite(text)),
        _ => None,
    }
}

fn split_sign(text: &str) -> (bool, String) {
    let digits = text.replace('_', "");
    match digits.strip_prefix('-') {
        Some(rest) => (true, rest.to_owned()),
        None => (false, digits.strip_prefix('+').unwrap_or(&digits).to_owned()),
    }
}

fn integer(text: &str) -> Option<Number> {
    let (negative, body) = split_sign(text);
    let magnitude: i128 = if let Some(b) = body.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()?
    } else if let Some(h) = body.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?
    } else if body.contains(':') {
        body.split(':')
            .try_fold(0i128, |acc, part| acc.checked_mul(60)?.checked_add(part.parse::<i128>().ok()?))?
    } else if body.len() > 1 && body.starts_with('0') {
        i128::from_str_radix(&body[1..], 8).ok()?
    } else {
        body.parse().ok()?
    };
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value)
        .map(Number::from)
        .ok()
        .or_else(|| u64::try_from(value).ok().map(Number::from))
}

fn real(text: &str) -> Option<f64> {
    let (negative, body) = split_sign(text);
    let magnitude = if body.contains(':') {
        body.split(':')
            .try_fold(0f64, |acc, part| Some(acc * 60.0 + part.parse::<f64>().ok()?))?
    } else {
        body.parse::<f64>().ok()?
    };
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_nested_past_the_limit_is_refused_not_a_stack_overflow() {
        for (open, close) in [("[", "]"), ("{a: ", "}")] {
            let deep = format!("{}1{}", open.repeat(25_000), close.repeat(25_000));
            // The scanner refuses deep flow collections itself.
            let e = load(&deep).unwrap_err();
            assert!(e.contains("nests deeper than 256 levels") && e.contains("line 1"), "{e}");
        }
        // Block sequences on one line (`- - - 1`), which the scanner does not bound.
        let e = load(&format!("{}1", "- ".repeat(25_000))).unwrap_err();
        assert!(e.contains("nests deeper than 256 levels"), "{e}");
        let fine = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(load(&fine).is_ok());
    }
    use serde_json::json;

    #[test]
    fn plain_scalars_resolve_as_yaml_1_1() {
        let v = load(
            "a: yes\nb: Off\nc: 010\nd: 1:30\ne: 0x1F\nf: 0b101\ng: 1_000\nh: 1.5\ni: 1e3\nj: 1.0e+3\nk: ~\nl: .inf\nm: '010'\nn: \"yes\"\no: -7\np: .5\nq: 190:20:30\nr: 1.\ns: !!str 010\nt: 2001-12-14\n",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"a": true, "b": false, "c": 8, "d": 90, "e": 31, "f": 5, "g": 1000, "h": 1.5, "i": "1e3",
                   "j": 1000.0, "k": null, "l": {"yaml:float": ".inf"}, "m": "010", "n": "yes", "o": -7, "p": 0.5, "q": 685230,
                   "r": 1.0, "s": "010", "t": {"yaml:timestamp": "2001-12-14"}})
        );
    }

    #[test]
    fn merge_keys_and_aliases() {
        let v = load("base: &b {type: text_match, value: x}\nlist:\n  - <<: *b\n    value: y\n  - *b\n").unwrap();
        assert_eq!(
            v["list"],
            json!([{"type": "text_match", "value": "y"}, {"type": "text_match", "value": "x"}])
        );
        let v = load("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n").unwrap();
        assert_eq!(v["c"], json!({"x": 1, "y": 2}), "the first merged mapping wins");
        let v = load("b: &b {value: Echo, type: t}\ng:\n  <<: *b\n  <<: {value: zzz}\n").unwrap();
        assert_eq!(v["g"], json!({"value": "zzz", "type": "t"}), "a later << wins");
        let v = load("'<<': {x: 1}\n").unwrap();
        assert_eq!(v, json!({"<<": {"x": 1}}), "a quoted << is an ordinary key");
    }

    #[test]
    fn bad_documents_are_refused_with_their_place() {
        assert!(load("a: [1, 2\n").unwrap_err().contains("line"));
        assert!(load("a: *nowhere\n").unwrap_err().contains("unknown anchor"));
        assert!(load("a: !custom x\n").unwrap_err().contains("unsupported tag !custom"));
        assert!(load("a: !!int nope\n").unwrap_err().contains("not a valid !!int"));
        assert!(load("? [1, 2]\n: x\n").unwrap_err().contains("must be a scalar"));
        // Nine levels of ten aliases each would be a billion values.
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            doc.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(load(&doc).unwrap_err().contains("expands to more than"));
        // Few values, much text: a 1 MB string copied a hundred thousand times.
        let mut doc = format!("s: &s {}\n", "x".repeat(1_000_000));
        doc.push_str("l1: &l1 [*s, *s, *s, *s, *s, *s, *s, *s, *s, *s]\n");
        for i in 2..6 {
            let p = i - 1;
            doc.push_str(&format!(
                "l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"
            ));
        }
        assert!(load(&doc).unwrap_err().contains("MiB of text"));
        assert!(
            load("k: 2835686391007820528861455061931401762:59\n").is_ok(),
            "base 60 past 128 bits"
        );
    }

    #[test]
    fn a_duplicate_key_is_the_later_value_or_refused_with_its_place() {
        let text = "rules:\n  - name: a\n    check: x\n    check: y\n";
        assert_eq!(load(text).unwrap()["rules"][0]["check"], "y");
        assert_eq!(
            load_refusing_duplicates(text).unwrap_err(),
            "rules[0]: duplicate key 'check': a key may appear once in each mapping; remove or rename one of them at line 4 column 12"
        );
        // The same key in two mappings is no duplicate, nor one a merge fills in.
        assert!(load_refusing_duplicates("a: {k: 1}\nb: {k: 2}\nbase: &b {k: 1}\nc: {<<: *b, k: 2}\n").is_ok());
    }

    #[test]
    fn a_second_document_is_refused() {
        let e = load("a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.contains("expected a single document in the stream"), "{e}");
        assert!(load("a: 1\n---\n").unwrap_err().contains("single document"));
        assert!(load("a: 1\n...\n---\nb: 1\n").unwrap_err().contains("single document"));
        assert_eq!(load("---\na: 1\n...\n").unwrap(), json!({"a": 1}));
        assert_eq!(load("# only a comment\n").unwrap(), Value::Null);
    }

    #[test]
    fn a_byte_order_mark_opens_the_stream() {
        assert_eq!(load("\u{feff}manifest_version: v1\n").unwrap(), json!({"manifest_version": "v1"}));
        // Only at the start: elsewhere it is text.
        assert_eq!(load("a: \"\u{feff}x\"\n").unwrap(), json!({"a": "\u{feff}x"}));
    }

    #[test]
    fn timestamps_are_what_pyyaml_resolves() {
        let v = load("a: 2024-5-1\nb: 2024-05-01\nc: 2024-5-1 10:00:00\nd: 2024-5-1T1:00:00Z\ne: 2024-05-1\n").unwrap();
        assert_eq!(v["a"], "2024-5-1", "a date alone needs a two-digit month and day");
        assert_eq!(v["e"], "2024-05-1");
        for k in ["b", "c", "d"] {
            assert!(v[k].get("yaml:timestamp").is_some(), "{k}: {}", v[k]);
        }
    }

    #[test]
    fn only_aliases_are_blamed_for_a_document_too_large() {
        let doc: String = (0..MAX_NODES).map(|i| format!("- {i}\n")).collect();
        let e = load(&doc).unwrap_err();
        assert!(e.contains("holds more than") && !e.contains("alias"), "{e}");
    }

    #[test]
    fn large_documents_without_aliases_load() {
        // Each value counts once, however deep it sits.
        let steps: String = (0..20_000)
            .map(|i| format!("      - input: step {i}\n        graders: [{{type: text_match, value: x}}]\n"))
            .collect();
        let doc = format!("scenarios:\n  - name: S\n    steps:\n{steps}");
        assert_eq!(load(&doc).unwrap()["scenarios"][0]["steps"].as_array().unwrap().len(), 20_000);
        let deep = format!("{}x{}", "{a: ".repeat(100), "}".repeat(100));
        assert!(load(&deep).is_ok());
    }

    #[test]
    fn json_surrogate_pairs_read_as_their_character() {
        assert_eq!(load("v: \"smile \\ud83d\\ude00\"\n").unwrap(), json!({"v": "smile \u{1F600}"}));
        assert!(load("v: \"\\ud83d alone\"\n").is_err());
    }
}
