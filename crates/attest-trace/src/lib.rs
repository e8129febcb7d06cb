//! The Attest trace vocabulary that the engine and its plugin SDK share:
//!
//! - [`Status`]: an assertion's outcome, as `evaluate_batch` reports it;
//! - [`Step`] and [`StepType`]: one step of a trace, generic over the trace
//!   model of its `sub_trace` (the engine's eager one, the SDK's lazy one);
//! - [`target`]: the target/field grammar every layer uses, and its
//!   resolution against any trace model that implements [`TraceView`];
//! - [`trace`]: the eager trace model the engine evaluates;
//! - [`text`]: bounded quoting, number formatting and the one value
//!   describer for explanations, and [`is_plugin_id`], the plugin-id rule;
//! - [`json_errors`]: which member of valid JSON text cannot become a value.
//!
//! It depends on serde and serde_json only and builds for wasm32, so a
//! plugin resolves a target and words an explanation exactly as the engine
//! does.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod json_errors;
pub mod target;
pub mod text;
pub mod trace;

pub use target::{Missing, StepView, Target, TargetSyntaxError, TraceView, GRAMMAR_HINT};
pub use trace::Trace;

/// What a plugin id may hold, for messages.
pub const PLUGIN_ID_RULE: &str = "letters, digits, '-', '_' and '.'";

/// Whether `id` may name a plugin ([`PLUGIN_ID_RULE`], not empty): the
/// engine refuses to load a plugin whose `describe()` gives another id, and
/// the SDK's tests check the same rule.
pub fn is_plugin_id(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// An assertion's outcome (Attest protocol v1 §2.2): the engine's results, and the
/// results continuous evaluation records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    SoftFail,
    HardFail,
}

impl Status {
    pub const ALL: [Status; 3] = [Status::Pass, Status::SoftFail, Status::HardFail];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::SoftFail => "soft_fail",
            Status::HardFail => "hard_fail",
        }
    }

    /// The status `as_str` names (`None` for anything else).
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

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

/// One step of a trace. `T` is the trace model of a delegated agent's
/// `sub_trace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step<T> {
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
    #[serde(default = "no_sub_trace", skip_serializing_if = "Option::is_none")]
    pub sub_trace: Option<Box<T>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<f64>,
}

/// `#[serde(default)]` on `sub_trace` would ask for `T: Default`.
fn no_sub_trace<T>() -> Option<Box<T>> {
    None
}

impl<T> Default for Step<T> {
    fn default() -> Step<T> {
        Step {
            kind: StepType::default(),
            name: String::new(),
            args: None,
            result: None,
            metadata: None,
            sub_trace: None,
            agent_id: None,
            started_at_ms: None,
            ended_at_ms: None,
        }
    }
}

impl<T> StepView for Step<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &StepType {
        &self.kind
    }
    fn args(&self) -> Option<&Value> {
        self.args.as_ref()
    }
    fn result(&self) -> Option<&Value> {
        self.result.as_ref()
    }
    fn metadata(&self) -> Option<&Value> {
        self.metadata.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::{is_plugin_id, Status};

    #[test]
    fn statuses_parse_from_their_names_only() {
        for status in Status::ALL {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
        assert_eq!(Status::parse("Pass"), None);
        assert_eq!(Status::parse("fail"), None);
    }

    #[test]
    fn plugin_ids_are_letters_digits_dashes_underscores_and_dots() {
        for ok in ["pii-leak", "acme.tone_v2", "X1"] {
            assert!(is_plugin_id(ok), "{ok}");
        }
        for bad in ["", "has space", "slash/id", "émoji", "semi;colon"] {
            assert!(!is_plugin_id(bad), "{bad}");
        }
    }
}
