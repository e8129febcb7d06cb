//! Anthropic's Messages API (`POST {base_url}/v1/messages`), a second judge
//! provider.

use super::http::HttpClient;
use super::openai::Endpoint;
use super::{Chat, Completion, ProviderError, Usage};
use serde_json::{json, Value};
use tokio::time::Instant;

const API_VERSION: &str = "2023-06-01";
/// The tool a judge is made to call with its verdict.
const VERDICT_TOOL: &str = "record_verdict";

/// One completion. A `system` message becomes the request's top-level
/// `system` field.
pub async fn chat(http: &HttpClient, ep: &Endpoint, chat: &Chat<'_>, deadline: Instant) -> Result<Completion, ProviderError> {
    let mut system = String::new();
    let mut turns = Vec::new();
    for m in &chat.messages {
        match m.get("role").and_then(Value::as_str) {
            Some("system") => system.push_str(m.get("content").and_then(Value::as_str).unwrap_or("")),
            _ => turns.push(m.clone()),
        }
    }
    let mut body = json!({
        "model": chat.model,
        "max_tokens": chat.max_tokens,
        "temperature": chat.temperature,
        "messages": turns,
    });
    if !system.is_empty() {
        body["system"] = Value::String(system);
    }
    if let Some(nonce) = chat.verdict_nonce {
        // A forced tool call: the verdict arrives as the tool's input, a
        // content block that no quoted text can become.
        body["tools"] = json!([{
            "name": VERDICT_TOOL,
            "description": "Record your verdict on the agent's output.",
            "input_schema": super::verdict_schema(nonce),
        }]);
        body["tool_choice"] = json!({"type": "tool", "name": VERDICT_TOOL});
    }
    let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
    if let Some(k) = &ep.api_key {
        headers.push(("x-api-key", k.clone()));
    }
    let url = format!("{}/v1/messages", ep.base_url.trim_end_matches('/').trim_end_matches("/v1"));
    let reply = http.post_json("judge", &url, &headers, &body, deadline).await?;
    let blocks = reply
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let of_type = |t: &'static str| blocks.iter().filter(move |b| b.get("type").and_then(Value::as_str) == Some(t));
    let text: String = of_type("text").filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
    let calls: Vec<&Value> = of_type("tool_use")
        .filter(|b| b.get("name").and_then(Value::as_str) == Some(VERDICT_TOOL))
        .collect();
    let verdict = match calls.as_slice() {
        [] => None,
        [one] => Some(one.get("input").cloned().unwrap_or(Value::Null)),
        more => {
            return Err(ProviderError::failed(
                format!(
                    "the judge called {VERDICT_TOOL} {} times; the contract allows one verdict",
                    more.len()
                ),
                1,
            ))
        }
    };
    if text.is_empty() && verdict.is_none() {
        return Err(ProviderError::failed(
            "judge provider sent an unexpected reply: no text or tool_use content block",
            1,
        ));
    }
    Ok(Completion {
        text,
        verdict,
        usage: Usage {
            input_tokens: reply.pointer("/usage/input_tokens").and_then(Value::as_u64).unwrap_or(0),
            output_tokens: reply.pointer("/usage/output_tokens").and_then(Value::as_u64).unwrap_or(0),
        },
    })
}
