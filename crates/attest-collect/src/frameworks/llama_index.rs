//! LlamaIndex agents (`FunctionAgent`, `ReActAgent`, `AgentWorkflow`), as
//! `openinference-instrumentation-llama-index` records them.
//!
//! - There is no AGENT span: the root is a CHAIN `FunctionAgent.run` (or
//!   `AgentWorkflow.run`, ...), and the agent's name appears only inside the
//!   Python `repr` of its events (`current_agent_name='…'`).
//! - Inputs and outputs of the workflow's steps are Python `repr`s
//!   (`StopEvent(result=AgentOutput(...))`), not text: the user's message
//!   and the final answer come from the model calls instead.
//! - Each model call is two LLM spans: `*._prepare_chat_with_tools`, which
//!   only builds the request, and the call itself (`*.achat`,
//!   `*.astream_chat`, ...). Only the second is a call.
//! - Tool arguments are wrapped as `{"kwargs": {...}}` and results as a
//!   `ToolOutput` whose `raw_output` is what the tool returned.

use serde_json::Value;

use super::{parsed, result_value};
use crate::convert::SpanRole;
use crate::otlp::Span;

const SCOPE: &str = "openinference.instrumentation.llama_index";

pub fn claims(span: &Span) -> bool {
    &*span.scope == SCOPE || span.name.starts_with("BaseWorkflowAgent.") || span.name.ends_with("._prepare_chat_with_tools")
}

pub fn role(span: &Span, convention: SpanRole, is_root: bool) -> SpanRole {
    match convention {
        SpanRole::Llm if span.name.ends_with("._prepare_chat_with_tools") => SpanRole::Passthrough,
        SpanRole::Passthrough if is_root => SpanRole::Agent,
        other => other,
    }
}

/// `current_agent_name='…'` from the first event repr under the agent that names it.
pub fn agent_name<'s>(span: &'s Span, descendants: &mut dyn Iterator<Item = &'s Span>) -> Option<String> {
    const KEY: &str = "current_agent_name='";
    // The instrumentation clips long reprs, so the name may be in an
    // event's input (the next step's) rather than its output.
    std::iter::once(span).chain(descendants).find_map(|s| {
        ["output.value", "input.value"].iter().find_map(|key| {
            let text = s.attr_str(key)?;
            let start = text.find(KEY)? + KEY.len();
            let len = text[start..].find('\'')?;
            Some(text[start..start + len].to_owned()).filter(|n| !n.is_empty())
        })
    })
}

pub fn tool_args(raw: &Value) -> Option<Value> {
    let v = parsed(raw)?;
    let kwargs = v.get("kwargs")?.as_object()?;
    // Positional arguments have no names to give them.
    let positional = v.get("args").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    (!positional || !kwargs.is_empty()).then(|| Value::Object(kwargs.clone()))
}

pub fn tool_result(raw: &Value) -> Option<(Value, Option<String>)> {
    let v = parsed(raw)?;
    if let Some(out) = v.get("raw_output") {
        let value = match out {
            Value::Object(_) => out.clone(),
            Value::String(s) => result_value(s),
            other => serde_json::json!({ "output": other }),
        };
        return Some((value, None));
    }
    let text: Vec<&str> = v
        .get("blocks")?
        .as_array()?
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    Some((result_value(&text.join("\n")), None))
}
