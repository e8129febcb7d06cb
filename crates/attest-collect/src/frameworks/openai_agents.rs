//! OpenAI Agents SDK (`openai-agents`), as `openinference-instrumentation-openai-agents`
//! records it.
//!
//! - The run is wrapped in a workflow: an AGENT span named after the
//!   workflow ("Agent workflow", or `RunConfig.workflow_name`) with no agent
//!   name, around a CHAIN of the same name. It is no agent: the agents are
//!   the AGENT spans that carry `agent.name`.
//! - A handoff is a TOOL span `handoff to <agent>` in the agent that hands
//!   off, and the agent handed to is a *sibling* AGENT span under the
//!   workflow, with `graph.node.parent_id` naming the agent that handed off.
//!   Read as written, one run becomes two unrelated agents; it is a
//!   delegation, so the agent handed to is moved to where the handoff is.
//! - Model calls are LLM spans `response` (Responses API) or `generation`
//!   (chat completions). Streamed chat completions carry no output messages:
//!   the output is in `output.value` as a list of Response objects.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::parsed;
use crate::convert::{Message, SpanRole};
use crate::otlp::Span;

const SCOPE: &str = "openinference.instrumentation.openai_agents";
const HANDOFF_PREFIX: &str = "handoff to ";

pub fn claims(span: &Span) -> bool {
    &*span.scope == SCOPE
        || (span.attributes.contains_key("graph.node.id")
            && span.attributes.contains_key("agent.name")
            && span.attr_str("openinference.span.kind") == Some("AGENT"))
}

pub fn role(span: &Span, convention: SpanRole) -> SpanRole {
    match convention {
        // The workflow wrapper names no agent.
        SpanRole::Agent if !span.attributes.contains_key("agent.name") => SpanRole::Passthrough,
        other => other,
    }
}

/// Moves each agent handed to from beside the agent that handed off to the
/// place of its handoff span, so that the handoff reads as a delegation.
pub fn nest_handoffs<'a>(spans: &'a [Span], children: &mut HashMap<&'a str, Vec<usize>>) {
    let agent_named = |name: &str, after: u64, taken: &[usize]| {
        (0..spans.len())
            .filter(|&i| {
                let s = &spans[i];
                s.attr_str("agent.name") == Some(name) && s.start_unix_nanos >= after && !taken.contains(&i)
            })
            .min_by_key(|&i| spans[i].start_unix_nanos)
    };
    let mut handoffs: Vec<usize> = (0..spans.len())
        .filter(|&i| spans[i].name.starts_with(HANDOFF_PREFIX) && spans[i].attr_str("openinference.span.kind") == Some("TOOL"))
        .collect();
    handoffs.sort_by_key(|&i| spans[i].start_unix_nanos);
    let mut taken = Vec::new();
    for h in handoffs {
        let handoff = &spans[h];
        let target = handoff.attr_str("output.value").unwrap_or(&handoff.name[HANDOFF_PREFIX.len()..]);
        let Some(agent) = agent_named(target, handoff.start_unix_nanos, &taken) else {
            continue;
        };
        let (Some(handoff_parent), Some(agent_parent)) = (&handoff.parent_span_id, &spans[agent].parent_span_id) else {
            continue;
        };
        // Not when the agent already sits under the handoff's own agent (a
        // later SDK that nests it itself), nor under the handoff span.
        if agent_parent == &handoff.span_id || is_ancestor(spans, children, agent, h) {
            continue;
        }
        if let Some(list) = children.get_mut(agent_parent.as_str()) {
            list.retain(|&i| i != agent);
        }
        if let Some(list) = children.get_mut(handoff_parent.as_str()) {
            if let Some(pos) = list.iter().position(|&i| i == h) {
                list[pos] = agent;
            }
        }
        taken.push(agent);
    }
}

/// Whether `ancestor` is above `idx` in the tree as it stands.
fn is_ancestor(spans: &[Span], children: &HashMap<&str, Vec<usize>>, ancestor: usize, idx: usize) -> bool {
    let mut stack = vec![ancestor];
    let mut seen = vec![false; spans.len()];
    while let Some(i) = stack.pop() {
        if i == idx {
            return true;
        }
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        if let Some(k) = children.get(spans[i].span_id.as_str()) {
            stack.extend(k.iter().copied());
        }
    }
    false
}

/// Output messages of a model call recorded only as Response objects in
/// `output.value` (streamed chat completions).
pub fn llm_outputs(span: &Span) -> Vec<Message> {
    let Some(v) = span.attributes.get("output.value").and_then(parsed) else {
        return Vec::new();
    };
    let responses = match v {
        Value::Array(a) => a,
        obj @ Value::Object(_) => vec![obj],
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for r in &responses {
        let Some(items) = r.get("output").and_then(Value::as_array) else {
            continue;
        };
        let mut m = Message {
            role: "assistant".into(),
            ..Default::default()
        };
        for item in items {
            match item.get("type").and_then(Value::as_str) {
                Some("message") => {
                    let texts: Vec<&str> = item
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c.get("text").and_then(Value::as_str))
                        .filter(|t| !t.is_empty())
                        .collect();
                    if !texts.is_empty() {
                        if !m.content.is_empty() {
                            m.content.push('\n');
                        }
                        m.content.push_str(&texts.join("\n"));
                    }
                }
                Some("function_call") => m.tool_calls.push(json!({
                    "id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": item.get("arguments"),
                })),
                _ => {}
            }
        }
        out.push(m);
    }
    out
}
