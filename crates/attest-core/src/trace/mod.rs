//! The trace data model (spec §3) and its construction from the wire.
//!
//! A trace reaches the engine as raw JSON; [`validate::parse_trace`] checks it
//! against spec §7 in the spec's order and only then builds a [`Trace`], so
//! evaluators work on typed, already-valid data.

pub mod tree;
pub mod validate;

use serde_json::{Map, Value};

pub use validate::{parse_trace, Limits};

/// A step's `type`. Unknown types are kept (lax mode) and skipped by
/// type-specific checks, as spec §6 asks.
pub use attest_trace::StepType;

/// One step (shared with the plugin SDK, `attest-trace`).
pub type Step = attest_trace::Step<Trace>;

#[derive(Debug, Clone)]
pub struct Trace {
    pub schema_version: i64,
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub input: Option<Value>,
    pub steps: Vec<Step>,
    /// Always a non-empty JSON object (validated).
    pub output: Value,
    pub metadata: Option<Value>,
    pub parent_trace_id: Option<String>,
}

impl Trace {
    /// Steps that count as tool calls, in order, with their indexes.
    pub fn tool_steps(&self) -> impl Iterator<Item = (usize, &Step)> {
        self.steps.iter().enumerate().filter(|(_, s)| s.kind.is_tool())
    }

    /// Builds the typed trace from a JSON object that already passed validation.
    pub(crate) fn from_validated(mut obj: Map<String, Value>) -> Trace {
        let steps = match obj.remove("steps") {
            Some(Value::Array(steps)) => steps
                .into_iter()
                .filter_map(|s| match s {
                    Value::Object(m) => Some(step_from_validated(m)),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Trace {
            schema_version: obj.get("schema_version").and_then(Value::as_i64).unwrap_or(1),
            trace_id: take_string(&mut obj, "trace_id").unwrap_or_default(),
            agent_id: take_string(&mut obj, "agent_id"),
            input: take_present(&mut obj, "input"),
            steps,
            output: obj.remove("output").unwrap_or(Value::Null),
            metadata: take_present(&mut obj, "metadata"),
            parent_trace_id: take_string(&mut obj, "parent_trace_id"),
        }
    }
}

/// Builds one step from a JSON object that already passed validation.
fn step_from_validated(mut obj: Map<String, Value>) -> Step {
    let kind = StepType::parse(obj.get("type").and_then(Value::as_str).unwrap_or_default());
    Step {
        kind,
        name: take_string(&mut obj, "name").unwrap_or_default(),
        args: take_present(&mut obj, "args"),
        result: take_present(&mut obj, "result"),
        metadata: take_present(&mut obj, "metadata"),
        sub_trace: match obj.remove("sub_trace") {
            Some(Value::Object(m)) => Some(Box::new(Trace::from_validated(m))),
            _ => None,
        },
        agent_id: take_string(&mut obj, "agent_id"),
        started_at_ms: obj.get("started_at_ms").and_then(Value::as_f64),
        ended_at_ms: obj.get("ended_at_ms").and_then(Value::as_f64),
    }
}

fn take_string(obj: &mut Map<String, Value>, key: &str) -> Option<String> {
    match obj.remove(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// Absent and explicit `null` both mean "not provided".
fn take_present(obj: &mut Map<String, Value>, key: &str) -> Option<Value> {
    obj.remove(key).filter(|v| !v.is_null())
}

/// Targets resolve against the engine's trace through the shared grammar.
impl attest_trace::TraceView for Trace {
    type Step = Step;
    fn input(&self) -> Option<&Value> {
        self.input.as_ref()
    }
    fn output(&self) -> &Value {
        &self.output
    }
    fn metadata(&self) -> Option<&Value> {
        self.metadata.as_ref()
    }
    fn steps(&self) -> &[Step] {
        &self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;
    use serde_json::json;
    use serde_json::value::RawValue;

    /// The grammar's own cases live in `attest-trace`; this checks that the
    /// engine's eager trace answers them the same way.
    #[test]
    fn targets_resolve_against_the_engine_trace() {
        let v = json!({
            "schema_version": 1, "trace_id": "t", "input": {"q": "hi"},
            "steps": [
                {"type": "llm_call", "name": "think"},
                {"type": "tool_call", "name": "lookup", "args": {"id": "A"}, "result": {"items": [1, 2, 3]}}
            ],
            "output": {"message": "done"}
        });
        let raw = RawValue::from_string(v.to_string()).unwrap();
        let trace = parse_trace(&raw, &Limits::default()).unwrap().trace;
        let get = |t: &str| Target::parse(t).unwrap().resolve(&trace).map(|v| v.into_owned());
        assert_eq!(get("output.message").unwrap(), json!("done"));
        assert_eq!(get("input.q").unwrap(), json!("hi"));
        assert_eq!(get("steps[?type=='tool_call'].length").unwrap(), json!(1));
        assert_eq!(get("steps[?name=='lookup'].result.items.length").unwrap(), json!(3));
        assert_eq!(get("steps[0].type").unwrap(), json!("llm_call"));
        assert_eq!(get("steps[?name=='think'].args").unwrap_err().0, "step 'think' has no args");
        assert_eq!(get("metadata.x").unwrap_err().0, "trace has no metadata");
    }
}
