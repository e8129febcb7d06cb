//! The trace model plugins see: a typed, serde-decoded mirror of the engine's
//! (`engine/src/trace/mod.rs`, spec §3).
//!
//! The engine hands a plugin the trace's JSON text exactly as it received it,
//! after validating it, so decoding here is lenient in the same places the
//! engine's own construction is: an explicit `null` means "not provided",
//! unknown step types are kept, and unknown fields are ignored.

use crate::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A step's `type`. Unknown types are kept as [`StepType::Other`], as the
/// engine does in lax mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum StepType {
    LlmCall,
    ToolCall,
    Retrieval,
    AgentCall,
    Other(String),
}

impl StepType {
    /// The step types the spec names.
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

    /// The engine's trace layer treats tool and retrieval calls as "tools";
    /// LLM calls and delegations are not tools.
    pub fn is_tool(&self) -> bool {
        matches!(self, StepType::ToolCall | StepType::Retrieval)
    }
}

impl From<String> for StepType {
    fn from(s: String) -> StepType {
        match StepType::parse(&s) {
            // Reuse the allocation for unknown types.
            StepType::Other(_) => StepType::Other(s),
            known => known,
        }
    }
}

impl From<StepType> for String {
    fn from(t: StepType) -> String {
        match t {
            StepType::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl Default for StepType {
    fn default() -> StepType {
        StepType::Other(String::new())
    }
}

/// One step of a trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    #[serde(rename = "type", default)]
    pub kind: StepType,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The delegated agent's own trace (`agent_call` steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_trace: Option<Box<Trace>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<f64>,
}

/// A whole trace, as the engine validated it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    #[serde(default = "current_schema_version")]
    pub schema_version: i64,
    #[serde(default)]
    pub trace_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// `null` or absent both mean no steps.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub steps: Vec<Step>,
    /// The engine guarantees a non-empty JSON object.
    #[serde(default)]
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_trace_id: Option<String>,
}

fn current_schema_version() -> i64 {
    1
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Step>, D::Error> {
    Ok(Option::<Vec<Step>>::deserialize(d)?.unwrap_or_default())
}

impl Trace {
    /// Decodes a trace from the JSON text the engine sends. A trace the SDK
    /// cannot read is an `unsupported-trace` error for every config.
    pub fn from_json(json: &str) -> Result<Trace, PluginError> {
        serde_json::from_str(json).map_err(|e| PluginError::UnsupportedTrace(format!("the trace could not be decoded: {e}")))
    }

    /// Decodes a trace from a JSON value (handy in tests with `json!`).
    pub fn from_value(value: Value) -> Result<Trace, PluginError> {
        serde_json::from_value(value).map_err(|e| PluginError::UnsupportedTrace(format!("the trace could not be decoded: {e}")))
    }

    /// Top-level steps that count as tool calls, in order, with their indexes
    /// (the same notion as the engine's trace layer).
    pub fn tool_steps(&self) -> impl Iterator<Item = (usize, &Step)> {
        self.steps.iter().enumerate().filter(|(_, s)| s.kind.is_tool())
    }

    /// Top-level steps with this name, in order, with their indexes.
    pub fn steps_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (usize, &'a Step)> + 'a {
        self.steps.iter().enumerate().filter(move |(_, s)| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert_eq!(t.trace_id, "t1");
        assert_eq!(t.steps.len(), 3);
        assert_eq!(t.steps[0].kind, StepType::ToolCall);
        assert_eq!(t.steps[0].ended_at_ms, Some(2.0));
        assert_eq!(t.steps[1].sub_trace.as_ref().unwrap().output["message"], "sub");
        assert_eq!(t.steps[2].kind, StepType::Other("custom_kind".into()));
        assert_eq!(t.steps[2].args, None, "null means absent");
        assert_eq!(t.tool_steps().map(|(i, _)| i).collect::<Vec<_>>(), vec![0]);
        assert_eq!(t.parent_trace_id.as_deref(), Some("p"));
    }

    #[test]
    fn minimal_trace_and_null_steps() {
        let t = Trace::from_json(r#"{"schema_version":1,"trace_id":"t","steps":null,"output":{"message":"m"}}"#).unwrap();
        assert!(t.steps.is_empty());
        assert_eq!(t.input, None);
    }

    #[test]
    fn round_trips_step_types() {
        let s: Step = serde_json::from_value(json!({"type": "retrieval", "name": "r"})).unwrap();
        assert!(s.kind.is_tool());
        assert_eq!(serde_json::to_value(&s).unwrap(), json!({"type": "retrieval", "name": "r"}));
    }

    #[test]
    fn undecodable_trace_is_unsupported() {
        let err = Trace::from_json("[1, 2]").unwrap_err();
        assert!(matches!(err, PluginError::UnsupportedTrace(_)), "{err:?}");
    }
}
