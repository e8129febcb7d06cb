//! An assembled trace as it travels from a collector to evaluation: its
//! compact JSON text, which the evaluator parses once, and the few fields
//! the pipeline reads itself (ids, and the span each step came from).
//!
//! A worker never builds a JSON tree of the trace. Decoding the work message
//! into a `serde_json::Value`, writing it out again for the evaluator (once
//! per rule) and walking it by JSON pointer for each result's span took a
//! fifth of a worker's CPU; the text is carried as it arrived.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// An Attest trace as compact JSON, with its ids and step spans read once.
#[derive(Debug, Clone)]
pub struct TraceDoc {
    text: Box<RawValue>,
    index: Node,
}

impl TraceDoc {
    /// The trace `trace` written as compact JSON. Its index is read off the
    /// tree at hand rather than by parsing the text again: a collector
    /// builds one for every trace it assembles, selected by a rule or not.
    pub fn from_value(trace: &Value) -> TraceDoc {
        // A `Value` always serialises (its keys are strings, its numbers finite).
        let text = serde_json::value::to_raw_value(trace).unwrap_or_else(|_| RawValue::NULL.to_owned());
        TraceDoc {
            text,
            index: Node::of(trace),
        }
    }

    /// A trace received as JSON text. What cannot be read of it (a field of
    /// another type, say) reads as absent: the evaluator refuses such a
    /// trace with its own message.
    pub fn from_raw(text: Box<RawValue>) -> TraceDoc {
        let index = serde_json::from_str::<Lenient<Node>>(text.get()).map(|l| l.0).unwrap_or_default();
        TraceDoc { text, index }
    }

    /// The compact JSON text, as the evaluator reads it.
    pub fn text(&self) -> &str {
        self.text.get()
    }

    /// Size of [`TraceDoc::text`] in bytes.
    pub fn len(&self) -> usize {
        self.text.get().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `trace_id`, or `""` when it is missing or not a string.
    pub fn trace_id(&self) -> &str {
        self.index.trace_id.as_deref().unwrap_or("")
    }

    pub fn agent_id(&self) -> Option<&str> {
        self.index.agent_id.as_deref()
    }

    /// `metadata.root_span`: the name of the trace's root span.
    pub fn root_span(&self) -> Option<&str> {
        self.index.root_span.as_deref()
    }

    /// The span an assertion's result is about: the step its
    /// `trace_node_path` names (`steps[2].sub_trace.steps[0]…`), the
    /// nearest step above it that came from a span, else the trace's own.
    pub fn span_id(&self, trace_node_path: Option<&str>) -> Option<&str> {
        let mut found = self.index.span_id.as_deref();
        let mut at = &self.index;
        for i in attest_trace::trace::step_indexes(trace_node_path.unwrap_or_default()) {
            let Some(step) = at.steps.get(i) else {
                break;
            };
            found = step.span_id.as_deref().or(found);
            match &step.sub_trace {
                Some(sub) => at = sub,
                None => break,
            }
        }
        found
    }
}

impl Serialize for TraceDoc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.text.serialize(s)
    }
}

impl<'de> Deserialize<'de> for TraceDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(TraceDoc::from_raw)
    }
}

/// What the pipeline reads of a trace or sub-trace.
#[derive(Debug, Clone, Default, PartialEq)]
struct Node {
    trace_id: Option<String>,
    agent_id: Option<String>,
    /// `metadata.span_id`
    span_id: Option<String>,
    /// `metadata.root_span`
    root_span: Option<String>,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Step {
    /// `metadata.span_id`
    span_id: Option<String>,
    sub_trace: Option<Box<Node>>,
}

/// A string member of `v`; any other type reads as absent, as in [`Read`].
fn string_at(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl Node {
    /// The same index [`Read`] gives from the text, from a parsed tree.
    fn of(v: &Value) -> Node {
        let metadata = v.get("metadata").unwrap_or(&Value::Null);
        Node {
            trace_id: string_at(v, "trace_id"),
            agent_id: string_at(v, "agent_id"),
            span_id: string_at(metadata, "span_id"),
            root_span: string_at(metadata, "root_span"),
            steps: v
                .get("steps")
                .and_then(Value::as_array)
                .map_or_else(Vec::new, |steps| steps.iter().map(Step::of).collect()),
        }
    }
}

impl Step {
    fn of(v: &Value) -> Step {
        Step {
            span_id: v.get("metadata").and_then(|m| string_at(m, "span_id")),
            sub_trace: v.get("sub_trace").map(|sub| Box::new(Node::of(sub))),
        }
    }
}

#[derive(Default)]
struct Metadata {
    span_id: Option<String>,
    root_span: Option<String>,
}

#[derive(Default)]
struct Text(Option<String>);

#[derive(Default)]
struct Steps(Vec<Step>);

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Key {
    TraceId,
    AgentId,
    Metadata,
    SpanId,
    RootSpan,
    Steps,
    SubTrace,
    #[serde(other)]
    Other,
}

/// A part of the trace read from whatever JSON stands there: the shape it
/// expects gives its fields, any other gives its default.
trait Read: Default {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }

    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }

    fn from_str(_: &str) -> Self {
        Self::default()
    }
}

fn value<'de, T: Read, A: MapAccess<'de>>(map: &mut A) -> Result<T, A::Error> {
    map.next_value::<Lenient<T>>().map(|l| l.0)
}

impl Read for Node {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut node = Node::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::TraceId => node.trace_id = value::<Text, _>(&mut map)?.0,
                Key::AgentId => node.agent_id = value::<Text, _>(&mut map)?.0,
                Key::Metadata => {
                    let m = value::<Metadata, _>(&mut map)?;
                    (node.span_id, node.root_span) = (m.span_id, m.root_span);
                }
                Key::Steps => node.steps = value::<Steps, _>(&mut map)?.0,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(node)
    }
}

impl Read for Step {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut step = Step::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Metadata => step.span_id = value::<Metadata, _>(&mut map)?.span_id,
                Key::SubTrace => step.sub_trace = Some(Box::new(value::<Node, _>(&mut map)?)),
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(step)
    }
}

impl Read for Metadata {
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut m = Metadata::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::SpanId => m.span_id = value::<Text, _>(&mut map)?.0,
                Key::RootSpan => m.root_span = value::<Text, _>(&mut map)?.0,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(m)
    }
}

impl Read for Steps {
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut steps = Vec::new();
        while let Some(step) = seq.next_element::<Lenient<Step>>()? {
            steps.push(step.0);
        }
        Ok(Steps(steps))
    }
}

impl Read for Text {
    fn from_str(s: &str) -> Self {
        Text(Some(s.to_owned()))
    }
}

struct Lenient<T>(T);

impl<'de, T: Read> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LenientVisitor(PhantomData)).map(Lenient)
    }
}

struct LenientVisitor<T>(PhantomData<T>);

impl<'de, T: Read> Visitor<'de> for LenientVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_str<E>(self, s: &str) -> Result<T, E> {
        Ok(T::from_str(s))
    }

    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::from_seq(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::TraceDoc;
    use serde_json::json;

    /// The document of `v`, after checking that reading its text gives the
    /// same index as reading the tree.
    fn doc(v: serde_json::Value) -> TraceDoc {
        let from_tree = TraceDoc::from_value(&v);
        let from_text = TraceDoc::from_raw(serde_json::value::to_raw_value(&v).unwrap());
        assert_eq!(from_tree.index, from_text.index, "{v}");
        from_tree
    }

    #[test]
    fn a_result_names_the_span_of_its_step_else_the_nearest_above() {
        let d = doc(json!({
            "trace_id": "t", "agent_id": "a", "metadata": {"span_id": "root", "root_span": "invoke_agent"},
            "steps": [
                {"type": "llm_call", "metadata": {"span_id": "s0"}},
                {"type": "agent_call", "metadata": {"span_id": "s1"}, "sub_trace": {
                    "trace_id": "u", "steps": [{"type": "tool_call", "metadata": {"span_id": "s1.0"}}, {"type": "tool_call"}]
                }}
            ]
        }));
        assert_eq!((d.trace_id(), d.agent_id(), d.root_span()), ("t", Some("a"), Some("invoke_agent")));
        assert_eq!(d.span_id(None), Some("root"));
        assert_eq!(d.span_id(Some("steps[0].args")), Some("s0"));
        assert_eq!(d.span_id(Some("steps[1].sub_trace.steps[0]")), Some("s1.0"));
        assert_eq!(d.span_id(Some("steps[1].sub_trace.steps[1]")), Some("s1"));
        assert_eq!(d.span_id(Some("steps[7]")), Some("root"));
        assert_eq!(d.span_id(Some("output.message")), Some("root"));
    }

    #[test]
    fn fields_of_other_types_read_as_absent_and_the_text_is_kept_as_it_was() {
        let v = json!({"trace_id": 7, "agent_id": ["x"], "metadata": "m", "steps": {"a": 1},
                        "output": {"deep": [[[{"trace_id": "not this one"}]]]}});
        let d = doc(v.clone());
        assert_eq!((d.trace_id(), d.agent_id(), d.span_id(Some("steps[0]"))), ("", None, None));
        assert_eq!(serde_json::from_str::<serde_json::Value>(d.text()).unwrap(), v);
        let steps = doc(json!({"trace_id": "t", "steps": [3, null, {"metadata": {"span_id": 9}}, {"metadata": {"span_id": "s"}}]}));
        assert_eq!(steps.span_id(Some("steps[2]")), None);
        assert_eq!(steps.span_id(Some("steps[3]")), Some("s"));
    }

    #[test]
    fn a_work_message_round_trips_the_trace_text_unchanged() {
        let text = r#"{"trace":{"trace_id":"t","output":{"message":"caf\u00e9 \"q\""}},"rules":["r"]}"#;
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Item {
            trace: TraceDoc,
            rules: Vec<String>,
        }
        let item: Item = serde_json::from_str(text).unwrap();
        assert_eq!(item.trace.trace_id(), "t");
        assert_eq!(serde_json::to_string(&item).unwrap(), text);
    }
}
