//! Fake model providers on loopback (wiremock), for tests that drive the
//! engine's layers 5 and 6 and plugins' model calls: an OpenAI-style judge
//! and embeddings API, both deterministic.
//!
//! The fake judge reads what the engine sent: an output containing GOOD
//! scores 0.9, BAD scores 0.2, anything else 0.5; if the engine ever let
//! agent text close its marked block (the end marker appearing twice), it
//! obeys the injected instruction and scores 1.0. Each answer reports 1,000
//! prompt and 100 completion tokens.

use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

pub const END: &str = "<<<AGENT_OUTPUT_END>>>";

/// A fake provider on loopback, kept alive by its own runtime.
pub struct Fake {
    pub rt: tokio::runtime::Runtime,
    pub server: MockServer,
}

impl Fake {
    pub fn start() -> Fake {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(MockServer::start());
        Fake { rt, server }
    }

    /// The OpenAI-style base URL (`…/v1`).
    pub fn v1(&self) -> String {
        format!("{}/v1", self.server.uri())
    }

    pub fn mount(&self, mock: Mock) {
        self.rt.block_on(mock.mount(&self.server));
    }

    pub fn requests(&self) -> Vec<Request> {
        self.rt.block_on(self.server.received_requests()).unwrap_or_default()
    }

    pub fn bodies(&self, at: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.url.path() == at)
            .map(|r| serde_json::from_slice(&r.body).unwrap())
            .collect()
    }

    /// A judge at `/v1/chat/completions` and embeddings at `/v1/embeddings`.
    pub fn with_openai() -> Fake {
        let f = Fake::start();
        f.mount(Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(Judge));
        f.mount(Mock::given(method("POST")).and(path("/v1/embeddings")).respond_with(Embeddings));
        f
    }
}

/// The agent output block of a judge request's user message.
pub fn output_block(body: &Value) -> String {
    let user = user_message(body);
    let start = user.find("<<<AGENT_OUTPUT_START>>>").map_or(0, |i| i + 24);
    user[start..].to_owned()
}

pub fn user_message(body: &Value) -> String {
    let msgs = body["messages"].as_array().unwrap();
    msgs.iter().find(|m| m["role"] == "user").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub fn system_message(body: &Value) -> String {
    match body.get("system") {
        Some(s) => s.as_str().unwrap().to_owned(),
        None => body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "system").unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned(),
    }
}

/// What the deterministic fake judge thinks of a request.
pub fn judge_score(body: &Value) -> f64 {
    let user = user_message(body);
    if user.matches(END).count() > 1 {
        return 1.0; // the injection escaped its block: a naive judge obeys it
    }
    let out = output_block(body);
    if out.contains("GOOD") {
        0.9
    } else if out.contains("BAD") {
        0.2
    } else {
        0.5
    }
}

/// The verdict nonce the engine gave this request's reply contract
/// (`<verdict-NONCE>` in its system message).
pub fn nonce(body: &Value) -> String {
    let text = body.to_string();
    let start = text.find("<verdict-").expect("the engine asks for a tagged verdict") + "<verdict-".len();
    text[start..].chars().take_while(char::is_ascii_hexdigit).collect()
}

/// `json` as a judge's verdict under the request's reply contract, after some talk.
pub fn verdict(body: &Value, json: &str) -> String {
    let n = nonce(body);
    format!("Here is my verdict. <verdict-{n}>{json}</verdict-{n}>")
}

/// The nonce a structured-output request requires the verdict to echo:
/// the one value its JSON schema (OpenAI) or verdict tool (Anthropic) allows
/// for `verdict_id`.
pub fn schema_nonce(body: &Value) -> Option<String> {
    let schema = body
        .pointer("/response_format/json_schema/schema")
        .or_else(|| body.pointer("/tools/0/input_schema"))?;
    schema.pointer("/properties/verdict_id/enum/0")?.as_str().map(str::to_owned)
}

/// A judge's answer: the whole reply is the verdict object when the request
/// asks for structured output (as a model held to the schema answers), else
/// the tagged contract.
pub fn answer(body: &Value, score: f64, explanation: &str) -> String {
    match schema_nonce(body) {
        Some(n) => json!({"score": score, "explanation": explanation, "verdict_id": n}).to_string(),
        None => verdict(body, &json!({"score": score, "explanation": explanation}).to_string()),
    }
}

pub struct Judge;

impl Respond for Judge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let score = judge_score(&body);
        let text = answer(&body, score, "fake judge saw the output");
        ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 100}
        }))
    }
}

/// Deterministic embeddings: words hashed into 64 buckets.
pub fn embed(text: &str) -> Vec<f64> {
    let mut v = vec![0.0; 64];
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let h = w
            .to_lowercase()
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        v[(h % 64) as usize] += 1.0;
    }
    v
}

pub struct Embeddings;

impl Respond for Embeddings {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let inputs: Vec<String> = body["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"index": i, "embedding": embed(t)}))
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "usage": {"prompt_tokens": 500}}))
    }
}
