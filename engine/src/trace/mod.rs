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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepType {
    LlmCall,
    ToolCall,
    Retrieval,
    AgentCall,
    Other(String),
}

impl StepType {
    pub const KNOWN: [&'static str; 4] = ["llm_call", "tool_call", "retrieval", "agent_call"];

    pub fn parse(s: &str) -> StepType {
        match s {
            "llm_call" => StepType::LlmCall,
            "tool_call" => StepType::ToolCall,
            "retrieval" => StepType::Retrieval,
            "agent_call" => StepType::AgentCall,
            other => StepType::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            StepType::LlmCall => "llm_call",
            StepType::ToolCall => "tool_call",
            StepType::Retrieval => "retrieval",
            StepType::AgentCall => "agent_call",
            StepType::Other(s) => s,
        }
    }

    /// Trace-layer checks treat tool and retrieval calls as "tools"; LLM
    /// calls and delegations are not tools.
    pub fn is_tool(&self) -> bool {
        matches!(self, StepType::ToolCall | StepType::Retrieval)
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    pub kind: StepType,
    pub name: String,
    pub args: Option<Value>,
    pub result: Option<Value>,
    pub metadata: Option<Value>,
    pub sub_trace: Option<Box<Trace>>,
    pub agent_id: Option<String>,
    pub started_at_ms: Option<f64>,
    pub ended_at_ms: Option<f64>,
}

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
                    Value::Object(m) => Some(Step::from_validated(m)),
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

impl Step {
    fn from_validated(mut obj: Map<String, Value>) -> Step {
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
