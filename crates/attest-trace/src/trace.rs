//! The eager trace model (Attest protocol v1 §3): every member decoded up
//! front into owned values, as the engine evaluates it. The plugin SDK reads
//! the same JSON lazily instead; both implement [`TraceView`](crate::TraceView).
//!
//! Building one does not validate: the engine validates the JSON first and
//! then calls [`Trace::from_validated`].

use crate::StepType;
use serde_json::{Map, Value};

/// One step of an eager trace.
pub type Step = crate::Step<Trace>;

/// A trace, with its sub-traces, decoded eagerly.
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
    /// Members of the wrong type are read as absent, so only a trace that
    /// passed validation (Attest protocol v1 §7) reads faithfully.
    pub fn from_validated(mut obj: Map<String, Value>) -> Trace {
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

/// Targets resolve against the eager trace through the shared grammar.
impl crate::TraceView for Trace {
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

/// The step indexes, through sub-traces, a `trace_node_path` names:
/// `steps[2].sub_trace.steps[0].args` is `[2, 0]`. Whatever comes before the
/// first `steps[` (`trace.`, an agent's path) is passed over; the path goes
/// into a sub-trace only through `.sub_trace.`.
pub fn step_indexes(trace_node_path: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let Some(first) = trace_node_path.find("steps[") else {
        return out;
    };
    let mut rest = &trace_node_path[first..];
    while let Some(inside) = rest.strip_prefix("steps[") {
        let Some(end) = inside.find(']') else { break };
        let Ok(i) = inside[..end].parse() else { break };
        out.push(i);
        match inside[end + 1..].strip_prefix(".sub_trace.") {
            Some(deeper) => rest = deeper,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::step_indexes;

    #[test]
    fn node_paths_name_steps_through_sub_traces_only() {
        assert_eq!(step_indexes("steps[2].sub_trace.steps[0].args.q"), vec![2, 0]);
        assert_eq!(step_indexes("trace.steps[3]"), vec![3]);
        assert_eq!(step_indexes("output.message"), Vec::<usize>::new());
        // An argument that happens to be called `steps` is no sub-trace.
        assert_eq!(step_indexes("steps[1].args.steps[4]"), vec![1]);
        assert_eq!(step_indexes("steps[x]"), Vec::<usize>::new());
    }
}
