//! `generate_user_message`: the next turn of a simulated user, written by the
//! judge provider's LLM playing a persona (the SDK's simulation mode asks
//! for it when a real engine is attached).
//!
//! Params (the SDK 0.9.0 shape):
//! - `persona`: `{name, system_prompt, style?, temperature?, max_tokens?}`;
//! - `conversation_history`: `[{role, content}]`, passed to the LLM as-is;
//! - `fault_config` (optional): `{error_rate, latency_jitter_ms,
//!   content_corruption, timeout_after_ms}`, faults injected on purpose so a
//!   test can see how the agent copes with a flaky user.
//!
//! Result: `{"message": "<text>"}`.

use crate::errors::simulation_failed;
use crate::params::Object;
use crate::protocol::{ErrorCode, Method, RpcError};
use crate::providers::{Chat, Providers};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    persona: Object<Persona>,
    #[serde(default)]
    conversation_history: Vec<Object<Turn>>,
    #[serde(default)]
    fault_config: Option<Object<Faults>>,
}

#[derive(Deserialize)]
struct Persona {
    name: String,
    system_prompt: String,
    #[serde(default)]
    style: Option<String>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    role: String,
    content: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Faults {
    #[serde(default)]
    error_rate: f64,
    #[serde(default)]
    latency_jitter_ms: u64,
    #[serde(default)]
    content_corruption: bool,
    #[serde(default)]
    timeout_after_ms: u64,
}

const SHAPE: &str = "Send {\"persona\": {\"name\": str, \"system_prompt\": str, \"style\"?: str, \"temperature\"?: number, \"max_tokens\"?: int}, \"conversation_history\": [{\"role\": \"user\"|\"assistant\"|\"system\", \"content\": str}], \"fault_config\"?: {\"error_rate\": 0-1, \"latency_jitter_ms\": int, \"content_corruption\": bool, \"timeout_after_ms\": int}}.";

fn invalid(message: impl Into<String>, field: &str) -> RpcError {
    RpcError::new(ErrorCode::AssertionError, message, SHAPE).with_field(field)
}

fn parse(params: Option<&RawValue>) -> Result<Params, RpcError> {
    crate::params::require_object(Method::GenerateUserMessage, params)?;
    let text = params.map_or("{}", |p| p.get());
    let p: Params = serde_json::from_str(text).map_err(|e| crate::params::member_error(Method::GenerateUserMessage, text, &e, SHAPE))?;
    if p.persona.system_prompt.trim().is_empty() {
        return Err(invalid("persona.system_prompt must not be empty", "params.persona.system_prompt"));
    }
    if let Some(t) = p.persona.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(invalid(
                format!("persona.temperature {} is out of range (0 to 2)", crate::text::num(t)),
                "params.persona.temperature",
            ));
        }
    }
    for (i, turn) in p.conversation_history.iter().enumerate() {
        if !matches!(turn.role.as_str(), "user" | "assistant" | "system") {
            return Err(invalid(
                format!(
                    "conversation_history[{i}].role must be user, assistant or system, got '{}'",
                    crate::text::clip(&turn.role, 40)
                ),
                &format!("params.conversation_history[{i}].role"),
            ));
        }
    }
    if let Some(f) = &p.fault_config {
        if !(0.0..=1.0).contains(&f.error_rate) {
            return Err(invalid(
                format!(
                    "fault_config.error_rate {} is out of range (0 to 1)",
                    crate::text::num(f.error_rate)
                ),
                "params.fault_config.error_rate",
            ));
        }
    }
    Ok(p)
}

/// Answers one `generate_user_message` request.
pub async fn generate(providers: &Providers, params: Option<&RawValue>, deadline: Instant) -> Result<Value, RpcError> {
    let p = parse(params)?;
    let judge = providers.judge().map_err(simulation_failed)?;
    let faults = p.fault_config.map(|f| f.0).unwrap_or_default();
    if faults.error_rate > 0.0 && fastrand::f64() < faults.error_rate {
        return Err(RpcError::new(
            ErrorCode::ProviderError,
            "generate_user_message failed: injected fault (fault_config.error_rate)",
            "This failure was injected on purpose by fault_config; retry, or set error_rate to 0.",
        ));
    }
    // Injected delays count against the request's deadline like real ones.
    let past_deadline = || {
        RpcError::new(
            ErrorCode::Timeout,
            "generate_user_message timed out: the injected delay (fault_config) outlasted the evaluation deadline",
            "Lower fault_config.latency_jitter_ms / timeout_after_ms below the engine timeout (--eval-timeout), or raise the timeout.",
        )
    };
    if faults.latency_jitter_ms > 0 {
        let delay = Duration::from_millis(fastrand::u64(0..faults.latency_jitter_ms));
        tokio::time::timeout_at(deadline, tokio::time::sleep(delay))
            .await
            .map_err(|_| past_deadline())?;
    }
    if faults.timeout_after_ms > 0 {
        let delay = Duration::from_millis(faults.timeout_after_ms);
        tokio::time::timeout_at(deadline, tokio::time::sleep(delay))
            .await
            .map_err(|_| past_deadline())?;
        return Err(RpcError::new(
            ErrorCode::Timeout,
            format!(
                "generate_user_message timed out after {}ms (injected by fault_config.timeout_after_ms)",
                faults.timeout_after_ms
            ),
            "This time-out was injected on purpose by fault_config; set timeout_after_ms to 0 to disable it.",
        ));
    }
    let mut system = p.persona.system_prompt.clone();
    if let Some(style) = p.persona.style.as_deref().filter(|s| !s.is_empty()) {
        system.push_str(&format!("\nWrite in this style: {style}."));
    }
    system.push_str(&format!(
        "\nYou are {}, the user in this conversation. Reply with the user's next message only.",
        p.persona.name
    ));
    let mut messages = vec![json!({"role": "system", "content": system})];
    messages.extend(p.conversation_history.iter().map(|t| json!({"role": t.role, "content": t.content})));
    if p.conversation_history.is_empty() {
        messages.push(json!({"role": "user", "content": "Start the conversation."}));
    }
    let chat = Chat {
        model: &judge.model,
        messages,
        temperature: p.persona.temperature.unwrap_or(0.7),
        max_tokens: p.persona.max_tokens.filter(|m| *m > 0).unwrap_or(300),
        verdict_nonce: None,
    };
    let (c, _cost) = providers.complete(judge, &chat, deadline).await.map_err(simulation_failed)?;
    let mut message = c.text.trim().to_owned();
    if faults.content_corruption {
        message = corrupt(&message);
    }
    Ok(json!({ "message": message }))
}

/// Swaps each adjacent pair of characters with probability 0.3: typos a
/// robust agent should survive.
fn corrupt(text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i + 1 < chars.len() {
        if fastrand::f64() < 0.3 {
            chars.swap(i, i + 1);
            i += 2;
        } else {
            i += 1;
        }
    }
    chars.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    #[test]
    fn bad_params_name_the_field() {
        let e = parse(Some(&raw(json!({"persona": {"name": "a", "system_prompt": ""}}))))
            .err()
            .unwrap();
        assert_eq!(e.field.as_deref(), Some("params.persona.system_prompt"));
        let e = parse(Some(&raw(
            json!({"persona": {"name": "a", "system_prompt": "p"}, "conversation_history": [{"role": "robot", "content": "x"}]}),
        )))
        .err()
        .unwrap();
        assert_eq!(e.field.as_deref(), Some("params.conversation_history[0].role"));
        let e = parse(Some(&raw(
            json!({"persona": {"name": "a", "system_prompt": "p"}, "fault_config": {"error_rate": 2.0}}),
        )))
        .err()
        .unwrap();
        assert_eq!(e.field.as_deref(), Some("params.fault_config.error_rate"));
        assert!(parse(None).is_err());
    }

    #[test]
    fn corruption_keeps_the_characters() {
        let c = corrupt("hello world, how are you?");
        let mut a: Vec<char> = c.chars().collect();
        let mut b: Vec<char> = "hello world, how are you?".chars().collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }
}
