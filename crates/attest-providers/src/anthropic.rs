//! Anthropic's Messages API (`POST {base_url}/v1/messages`), a second judge
//! provider.

use super::http::HttpClient;
use super::openai::Endpoint;
use super::{Chat, Completion, ProviderError, Usage};
use serde_json::{json, Value};
use tokio::time::Instant;

const API_VERSION: &str = "2023-06-01";

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
    let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
    if let Some(k) = &ep.api_key {
        headers.push(("x-api-key", k.clone()));
    }
    let url = format!("{}/v1/messages", ep.base_url.trim_end_matches('/').trim_end_matches("/v1"));
    let reply = http.post_json("judge", &url, &headers, &body, deadline).await?;
    let text: String = reply
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect()
        })
        .filter(|t: &String| !t.is_empty())
        .ok_or_else(|| ProviderError::failed("judge provider sent an unexpected reply: no text content block", 1))?;
    Ok(Completion {
        text,
        usage: Usage {
            input_tokens: reply.pointer("/usage/input_tokens").and_then(Value::as_u64).unwrap_or(0),
            output_tokens: reply.pointer("/usage/output_tokens").and_then(Value::as_u64).unwrap_or(0),
        },
    })
}
