//! LangChain 1.x (`create_agent`) and LangGraph (prebuilt and custom graphs),
//! as `openinference-instrumentation-langchain` records them.
//!
//! - The graph is the root span: an AGENT span named after the graph
//!   (`name=` of `create_agent`, `create_react_agent` or `compile`), or a
//!   CHAIN when the graph has no name. Either way it is the agent.
//! - Its `input.value` and `output.value` are the graph's whole state as
//!   JSON (`{"messages": [...]}`), user question included: the user's message
//!   and the final answer are read out of the state's messages.
//! - LangGraph's prebuilt ReAct agent runs each model turn in a node named
//!   `agent` that the instrumentation marks AGENT; it is a turn, not an agent.
//! - Tool spans record a single-argument tool's input as the bare value
//!   (`"ORD-7"`), not its arguments, and the result as LangChain's
//!   `ToolMessage` envelope, which names the model's tool call it answers.

use serde_json::Value;

use super::{json_of, result_value};
use crate::convert::SpanRole;
use crate::otlp::Span;

const SCOPE: &str = "openinference.instrumentation.langchain";

pub fn claims(span: &Span) -> bool {
    if &*span.scope == SCOPE {
        return true;
    }
    // Every span of the instrumentation carries LangChain's run metadata.
    span.attr_str("metadata")
        .is_some_and(|m| m.contains("\"langgraph_") || m.contains("\"lc_agent_name\"") || m.contains("\"ls_integration\""))
}

pub fn role(span: &Span, convention: SpanRole, is_root: bool) -> SpanRole {
    match convention {
        // An unnamed graph is a CHAIN root; it is still the agent that ran.
        SpanRole::Passthrough if is_root => SpanRole::Agent,
        // LangGraph's prebuilt ReAct graph calls its model node `agent`, and
        // the instrumentation marks that node AGENT: it is one model turn of
        // the agent above it, not an agent of its own.
        SpanRole::Agent if !is_root && span.name == "agent" && graph_node(span).as_deref() == Some("agent") => SpanRole::Passthrough,
        other => other,
    }
}

/// The LangGraph node a span runs in (`metadata.langgraph_node`).
fn graph_node(span: &Span) -> Option<String> {
    let meta: Value = serde_json::from_str(span.attr_str("metadata")?).ok()?;
    meta.get("langgraph_node")?.as_str().map(str::to_owned)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    User,
    Assistant,
}

/// The text of the last message of one side in a graph state
/// (`{"messages": [...]}`, or a bare list of messages). `None` when `raw` is
/// no message state; `Some(None)` when it is one without such text.
pub fn state_text(raw: &str, side: Side) -> Option<Option<String>> {
    let v = json_of(raw)?;
    let messages = match &v {
        Value::Object(o) => o.get("messages")?.as_array()?,
        Value::Array(a) => a,
        _ => return None,
    };
    // LLM inputs nest the list once more: [[message, ...]].
    let flat: Vec<&Value> = messages
        .iter()
        .flat_map(|m| match m {
            Value::Array(inner) => inner.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .collect();
    if !flat.iter().any(|m| message_side(m).is_some()) {
        return None;
    }
    Some(
        flat.iter()
            .rev()
            .filter(|m| message_side(m) == Some(side))
            .map(|m| message_text(m))
            .find(|t| !t.is_empty()),
    )
}

/// What a serialised LangChain message's body is: the message itself
/// (`{"role", "content"}`), its `data` (`{"type": "ai", "data": {...}}`) or
/// its `kwargs` (`{"lc": 1, "type": "constructor", "kwargs": {...}}`).
fn body(m: &Value) -> &Value {
    m.get("kwargs").or_else(|| m.get("data")).unwrap_or(m)
}

fn message_side(m: &Value) -> Option<Side> {
    let b = body(m);
    let kind = b
        .get("type")
        .or_else(|| b.get("role"))
        .or_else(|| m.get("role"))
        .or_else(|| m.get("type"))
        .and_then(Value::as_str)
        .or_else(|| {
            // `{"lc": 1, "id": ["langchain", ..., "AIMessage"]}`
            m.get("id")
                .and_then(Value::as_array)
                .and_then(|id| id.last())
                .and_then(Value::as_str)
        })?;
    match kind {
        "human" | "user" | "HumanMessage" | "HumanMessageChunk" => Some(Side::User),
        "ai" | "assistant" | "AIMessage" | "AIMessageChunk" => Some(Side::Assistant),
        _ => None,
    }
}

fn message_text(m: &Value) -> String {
    match body(m).get("content") {
        Some(Value::String(s)) => s.clone(),
        // Content blocks: the text ones, a line break apart.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                other => other.get("text").and_then(Value::as_str),
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The content of a `ToolMessage` envelope, and the tool call it answers.
pub fn tool_result(raw: &Value) -> Option<(Value, Option<String>)> {
    let v = super::parsed(raw)?;
    let b = body(&v);
    let is_tool_message = b.get("type").and_then(Value::as_str) == Some("tool")
        || v.get("id")
            .and_then(Value::as_array)
            .and_then(|id| id.last())
            .and_then(Value::as_str)
            == Some("ToolMessage");
    if !is_tool_message {
        return None;
    }
    let id = b.get("tool_call_id").and_then(Value::as_str).map(str::to_owned);
    let result = match b.get("content") {
        Some(Value::String(s)) => result_value(s),
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(other) => serde_json::json!({ "output": other }),
        None => serde_json::json!({}),
    };
    Some((result, id))
}
