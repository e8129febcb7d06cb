//! What each agent framework's spans mean, beyond the convention they are
//! written in. The conventions (GenAI, OpenInference) say what a span is; a
//! framework decides how it nests them, where it puts the user's question
//! and the final answer, and how it wraps tool arguments and results. That
//! knowledge lives here, one module per framework, recognised from the spans'
//! own instrumentation scope and attributes: the user never names the
//! framework.
//!
//! [`crate::convert`] asks the recognised [`Framework`] at each point where
//! frameworks differ; a framework that has nothing to say there answers
//! `None` and the convention's reading stands.

mod langchain;
mod llama_index;
mod openai_agents;

use std::collections::HashMap;

use serde_json::Value;

use crate::convert::{Message, SpanRole};
use crate::otlp::Span;

/// The agent framework that produced a trace's spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// OpenAI Agents SDK (`openai-agents`), through OpenInference.
    OpenAiAgents,
    /// LangChain and LangGraph, through OpenInference.
    LangChain,
    /// LlamaIndex agents and workflows, through OpenInference.
    LlamaIndex,
    /// Anything else: the conventions' reading alone.
    Generic,
}

impl Framework {
    /// The framework of a trace: the first span any framework claims.
    pub fn detect(spans: &[Span]) -> Framework {
        spans
            .iter()
            .find_map(|s| {
                if openai_agents::claims(s) {
                    Some(Framework::OpenAiAgents)
                } else if langchain::claims(s) {
                    Some(Framework::LangChain)
                } else if llama_index::claims(s) {
                    Some(Framework::LlamaIndex)
                } else {
                    None
                }
            })
            .unwrap_or(Framework::Generic)
    }

    pub fn name(self) -> &'static str {
        match self {
            Framework::OpenAiAgents => "openai-agents",
            Framework::LangChain => "langchain",
            Framework::LlamaIndex => "llama-index",
            Framework::Generic => "generic",
        }
    }

    /// The span's role, where the framework knows better than the
    /// convention: a workflow wrapper is no agent, a prompt-preparation
    /// step is no model call, a graph's root is the agent.
    pub fn role(self, span: &Span, convention: SpanRole, is_root: bool) -> SpanRole {
        match self {
            Framework::OpenAiAgents => openai_agents::role(span, convention),
            Framework::LangChain => langchain::role(span, convention, is_root),
            Framework::LlamaIndex => llama_index::role(span, convention, is_root),
            Framework::Generic => convention,
        }
    }

    /// The agent's name, when the framework keeps it somewhere of its own.
    /// `descendants` are the spans the agent span holds.
    pub fn agent_name<'s>(self, span: &'s Span, descendants: &mut dyn Iterator<Item = &'s Span>) -> Option<String> {
        match self {
            Framework::LlamaIndex => llama_index::agent_name(span, descendants),
            _ => None,
        }
    }

    /// Reorders the span tree where the framework records a relation as
    /// siblings: an OpenAI Agents handoff becomes a delegation from the
    /// agent that handed off.
    pub fn rearrange<'a>(self, spans: &'a [Span], children: &mut HashMap<&'a str, Vec<usize>>) {
        if self == Framework::OpenAiAgents {
            openai_agents::nest_handoffs(spans, children);
        }
    }

    /// The user's message, from an agent or root span's input.
    /// `Some(None)`: the framework recognises the input and it holds no
    /// user text (then the model calls' first user message is used).
    pub fn input_text(self, raw: &str) -> Option<Option<String>> {
        match self {
            Framework::LangChain => langchain::state_text(raw, langchain::Side::User),
            Framework::LlamaIndex => Some(None),
            _ => None,
        }
    }

    /// The final answer, from an agent or root span's output (see [`Framework::input_text`]).
    pub fn output_text(self, raw: &str) -> Option<Option<String>> {
        match self {
            Framework::LangChain => langchain::state_text(raw, langchain::Side::Assistant),
            Framework::LlamaIndex => Some(None),
            _ => None,
        }
    }

    /// A tool's arguments as the tool received them, unwrapped from the
    /// framework's envelope. `None` when the span does not hold them as an
    /// object (they are then taken from the model's tool call).
    pub fn tool_args(self, raw: &Value) -> Option<Value> {
        match self {
            Framework::LlamaIndex => llama_index::tool_args(raw),
            _ => None,
        }
    }

    /// A tool's result unwrapped from the framework's envelope, and the id of
    /// the model's tool call it answers when the envelope says.
    pub fn tool_result(self, raw: &Value) -> Option<(Value, Option<String>)> {
        match self {
            Framework::LangChain => langchain::tool_result(raw),
            Framework::LlamaIndex => llama_index::tool_result(raw),
            _ => None,
        }
    }

    /// A model call's output messages, where the framework records them in
    /// its own shape instead of the convention's message attributes.
    pub fn llm_outputs(self, span: &Span) -> Vec<Message> {
        match self {
            Framework::OpenAiAgents => openai_agents::llm_outputs(span),
            _ => Vec::new(),
        }
    }
}

/// Parses text that holds JSON; `None` for anything else.
fn json_of(raw: &str) -> Option<Value> {
    let t = raw.trim_start();
    if !(t.starts_with('{') || t.starts_with('[')) {
        return None;
    }
    serde_json::from_str(raw).ok()
}

/// A JSON value given as text or as itself.
fn parsed(v: &Value) -> Option<Value> {
    match v {
        Value::String(s) => json_of(s),
        other => Some(other.clone()),
    }
}

/// Text of a result, parsed when it is JSON (an object stays one; anything
/// else is wrapped as `{"output": …}`, as the convention's reading does).
fn result_value(text: &str) -> Value {
    match json_of(text) {
        Some(v @ Value::Object(_)) => v,
        Some(other) => serde_json::json!({ "output": other }),
        None => serde_json::json!({ "output": text }),
    }
}
