//! The OpenAI-compatible wire format: `POST {base_url}/embeddings` and
//! `POST {base_url}/chat/completions`. OpenAI, Ollama, vLLM and llama.cpp's
//! server all speak it; `base_url` includes the `/v1` part.

use super::http::{Header, HttpClient};
use super::{Chat, Completion, ProviderError, Usage};
use serde_json::{json, Value};
use tokio::time::Instant;

#[derive(Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
}

impl Endpoint {
    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url.trim_end_matches('/'))
    }

    fn headers(&self) -> Vec<Header> {
        self.api_key.iter().map(|k| ("authorization", format!("Bearer {k}"))).collect()
    }
}

/// Embeds `texts` in one request.
pub async fn embed(
    http: &HttpClient,
    ep: &Endpoint,
    model: &str,
    texts: &[&str],
    deadline: Instant,
) -> Result<(Vec<Vec<f32>>, Usage), ProviderError> {
    let body = json!({ "model": model, "input": texts });
    let reply = http
        .post_json("embedding", &ep.url("embeddings"), &ep.headers(), &body, deadline)
        .await?;
    let bad = |why: &str| ProviderError::failed(format!("embedding provider sent an unexpected reply: {why}"), 1);
    let data = reply.get("data").and_then(Value::as_array).ok_or_else(|| bad("no 'data' list"))?;
    if data.len() != texts.len() {
        return Err(bad(&format!("{} embeddings for {} inputs", data.len(), texts.len())));
    }
    let mut out = vec![Vec::new(); texts.len()];
    for (pos, item) in data.iter().enumerate() {
        // Replies carry an `index`; honour it when present.
        let i = item.get("index").and_then(Value::as_u64).map_or(pos, |i| i as usize);
        let v = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("an item has no 'embedding' list"))?;
        let slot = out.get_mut(i).ok_or_else(|| bad("an item's index is out of range"))?;
        *slot = v
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad("an embedding holds a non-number"))?;
    }
    let usage = Usage {
        input_tokens: reply.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: 0,
    };
    Ok((out, usage))
}

/// One chat completion with a system and a user message.
pub async fn chat(http: &HttpClient, ep: &Endpoint, chat: &Chat<'_>, deadline: Instant) -> Result<Completion, ProviderError> {
    let mut body = json!({
        "model": chat.model,
        "messages": chat.messages,
        "temperature": chat.temperature,
        "max_tokens": chat.max_tokens,
    });
    if let Some(nonce) = chat.verdict_nonce {
        // Structured outputs: the reply's content is exactly one object of
        // this schema, and the nonce it must echo is in no text the judge reads
        // as data.
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": "verdict", "strict": true, "schema": super::verdict_schema(nonce)},
        });
    }
    let reply = http
        .post_json("judge", &ep.url("chat/completions"), &ep.headers(), &body, deadline)
        .await?;
    let text = reply
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or_else(|| ProviderError::failed("judge provider sent an unexpected reply: no choices[0].message.content", 1))?;
    Ok(Completion {
        text: text.to_owned(),
        verdict: None,
        usage: Usage {
            input_tokens: reply.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
            output_tokens: reply.pointer("/usage/completion_tokens").and_then(Value::as_u64).unwrap_or(0),
        },
    })
}
