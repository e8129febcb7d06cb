//! Model providers for the paid layers: embeddings (layer 5) and LLM judges
//! (layer 6).
//!
//! - Remote providers speak HTTP ([`openai`] for OpenAI-compatible servers,
//!   [`anthropic`] for Anthropic's Messages API) through one retrying,
//!   concurrency-bounded client ([`http`]).
//! - Embeddings can also be computed in-process by a local model ([`local`]).
//! - Answers are cached persistently ([`cache`]).
//!
//! Nothing here touches the network or loads a model at start-up: the
//! engine answers `initialize` at once, and work starts with the first
//! assertion that needs it.

pub mod anthropic;
pub mod bert;
pub mod cache;
pub mod config;
pub mod embedding;
pub mod http;
pub mod llm_judge;
pub mod local;
pub mod openai;

/// Bounded quoting for messages.
use attest_core::backends::{BoxFuture, PaidCheck};
use attest_core::layers::{AssertionType, Spec, SpecError, Verdict};
use attest_core::trace::Trace;
use attest_trace::text;

use cache::{Key, ProviderCache};
use config::{EmbeddingSource, ProvidersConfig};
use http::HttpClient;
use openai::Endpoint;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{OnceCell, Semaphore};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JudgeKind {
    OpenAi,
    Anthropic,
}

impl JudgeKind {
    pub fn name(self) -> &'static str {
        match self {
            JudgeKind::OpenAi => "openai",
            JudgeKind::Anthropic => "anthropic",
        }
    }
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    #[serde(default)]
    pub output_per_mtok: f64,
}

impl Price {
    /// What `usage` costs at this price, in USD.
    pub fn cost(&self, usage: Usage) -> f64 {
        (usage.input_tokens as f64 * self.input_per_mtok + usage.output_tokens as f64 * self.output_per_mtok) / 1_000_000.0
    }
}

/// Tokens a provider call used, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One chat completion request, in the OpenAI message shape.
pub struct Chat<'a> {
    pub model: &'a str,
    /// `{role, content}` objects; roles `system`, `user`, `assistant`.
    pub messages: Vec<serde_json::Value>,
    pub temperature: f64,
    pub max_tokens: u32,
    /// Set when the reply is a judge's verdict: the call's nonce. A judge
    /// with structured output asks for the verdict in the provider's own
    /// out-of-band form (an OpenAI JSON schema that requires the nonce, an
    /// Anthropic tool call), which no text the judge quotes can produce.
    pub verdict_nonce: Option<&'a str>,
}

pub struct Completion {
    pub text: String,
    /// A verdict the provider returned as a tool call's input, apart from
    /// the reply's text.
    pub verdict: Option<serde_json::Value>,
    pub usage: Usage,
}

pub use attest_core::backends::ProviderError;

/// The JSON schema of a judge's verdict: a score in [0, 1], a short
/// explanation, and the call's nonce echoed back.
fn verdict_schema(nonce: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "score": {"type": "number"},
            "explanation": {"type": "string"},
            "verdict_id": {"type": "string", "enum": [nonce]},
        },
        "required": ["score", "explanation", "verdict_id"],
        "additionalProperties": false,
    })
}

/// Embeddings and what they cost.
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub cost: f64,
    /// How many of the texts came from the cache.
    pub cached: usize,
    /// The model that produced them, for explanations.
    pub model: String,
    /// For each text, whether the model saw only its beginning (the local
    /// model reads at most `local::MAX_TOKENS` tokens); all `false` for an
    /// API, which reports no such thing.
    pub truncated: Vec<bool>,
}

enum Embedder {
    Remote { endpoint: Endpoint, model: String },
    Local(LocalEmbedder),
}

struct LocalEmbedder {
    dir: PathBuf,
    name: String,
    model: OnceCell<Result<Arc<Loaded>, String>>,
    /// Jobs queued or running: one pass's worth per inference thread
    /// (`local::JOBS_PER_PASS`), so that a job waits at most one pass.
    permits: Semaphore,
    /// How many: one inference thread each.
    threads: usize,
}

/// The model and the threads that run it.
struct Loaded {
    model: Arc<local::LocalModel>,
    inference: local::Inference,
}

pub struct Judge {
    pub kind: JudgeKind,
    endpoint: Endpoint,
    pub model: String,
    /// Ask for verdicts in the provider's structured form (`[judge]
    /// structured_output`); off for servers that refuse it.
    pub structured: bool,
}

impl Judge {
    /// An OpenAI-compatible judge at `base_url` (with its `/v1`) that is not
    /// the engine's configured one: the ECP runtime's `OPENAI_API_KEY`
    /// fallback. It is asked through [`Providers::complete`] like the
    /// configured judge, with the same client, retries, deadlines, budget
    /// and credential masking. Its replies are free text (no structured
    /// verdict), as the ECP grader reads them.
    pub fn openai_compatible(base_url: &str, api_key: Option<String>, model: &str) -> Judge {
        Judge {
            kind: JudgeKind::OpenAi,
            endpoint: Endpoint {
                base_url: base_url.trim_end_matches('/').to_owned(),
                api_key,
            },
            model: model.to_owned(),
            structured: false,
        }
    }

    /// Where the judge answers: part of what a cached verdict is keyed by,
    /// since two endpoints serving one model name may answer differently.
    pub fn base_url(&self) -> &str {
        &self.endpoint.base_url
    }

    /// `text` (a reply quoted in an error) with the judge's API key masked.
    pub fn mask(&self, text: &str) -> String {
        let headers: Vec<http::Header> = self.endpoint.api_key.iter().map(|k| ("x-api-key", k.clone())).collect();
        http::mask_credentials(text, &headers)
    }
}

/// How to give the engine an embedder (the `detail` of a missing one).
const EMBEDDING_SETUP: &str = "Either point the engine at an OpenAI-compatible embeddings API (ATTEST_EMBEDDING_BASE_URL and/or ATTEST_EMBEDDING_API_KEY, or [embedding] in the config file), or install a local sentence-transformers model (config.json, tokenizer.json, model.safetensors of all-MiniLM-L6-v2) in ~/.attest/models/all-MiniLM-L6-v2 or the directory named by ATTEST_EMBEDDING_MODEL_DIR. See README, Layers 5 and 6.";

pub struct Providers {
    /// Calls to the embedding provider and to the judge, each with its own
    /// concurrency and pacing: a provider that hangs holds only its own
    /// slots, never the other's.
    embedding_http: HttpClient,
    judge_http: HttpClient,
    embedder: Result<Embedder, String>,
    judge: Option<Judge>,
    pub cache: Option<ProviderCache>,
    prices: HashMap<String, Price>,
    pub short_circuit: bool,
    pub judge_samples: u32,
    pub judge_bias_probes: Vec<attest_core::layers::Probe>,
    /// What paid calls have spent and hold reserved, against the session's budget.
    pub ledger: Arc<Ledger>,
}

/// The session's spending on paid calls, kept as reservations: before a
/// call is sent its worst-case cost (prices × its prompt's bytes, a bound
/// on its input tokens, plus its output-token limit) is reserved; when its
/// answer arrives the reservation is settled with the real cost; a call
/// never sent gives its reservation back. A call cut off at a deadline may
/// still have been served and billed, so it is counted at its worst case.
/// Calls are admitted while what is spent and reserved is under the
/// budget, so the total never passes the budget by more than one call's
/// worst case, however many calls run at once (plugins' included).
#[derive(Debug, Default)]
pub struct Ledger {
    budget: Option<f64>,
    state: std::sync::Mutex<Spend>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Spend {
    spent: f64,
    reserved: f64,
}

/// A call's place in the [`Ledger`], given back if it is never settled.
pub struct Reservation {
    ledger: Arc<Ledger>,
    worst: f64,
    settled: bool,
}

impl Ledger {
    pub fn new(budget: Option<f64>) -> Ledger {
        Ledger {
            budget,
            state: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spend> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `worst` USD for a call, or refuses it when the budget is spent.
    pub fn reserve(self: &Arc<Self>, worst: f64) -> Result<Reservation, ProviderError> {
        let mut s = self.lock();
        if let Some(budget) = self.budget {
            if s.spent + s.reserved >= budget {
                return Err(ProviderError::BudgetSpent { budget, spent: s.spent });
            }
        }
        s.reserved += worst;
        Ok(Reservation {
            ledger: self.clone(),
            worst,
            settled: false,
        })
    }

    /// USD spent by settled calls (abandoned ones at their worst case).
    pub fn spent(&self) -> f64 {
        self.lock().spent
    }

    /// USD reserved by calls in flight.
    pub fn reserved(&self) -> f64 {
        self.lock().reserved
    }
}

impl Reservation {
    /// The call ended: what it cost replaces what was reserved for it.
    pub fn settle(mut self, cost: f64) {
        let mut s = self.ledger.lock();
        s.reserved = (s.reserved - self.worst).max(0.0);
        s.spent += cost;
        self.settled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            let mut s = self.ledger.lock();
            s.reserved = (s.reserved - self.worst).max(0.0);
        }
    }
}

impl Providers {
    /// Builds the providers without touching the network or loading models.
    pub fn new(c: &ProvidersConfig) -> Providers {
        let embedder = match &c.embedding {
            EmbeddingSource::Remote { base_url, api_key, model } => Ok(Embedder::Remote {
                endpoint: Endpoint {
                    base_url: base_url.clone(),
                    api_key: api_key.clone(),
                },
                model: model.clone(),
            }),
            EmbeddingSource::Local { dir } => {
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                Ok(Embedder::Local(LocalEmbedder {
                    name: local::model_name(dir),
                    dir: dir.clone(),
                    model: OnceCell::new(),
                    permits: Semaphore::new(threads * local::JOBS_PER_PASS),
                    threads,
                }))
            }
            EmbeddingSource::Off { why } => Err(why.clone()),
        };
        // Without any provider there is nothing to cache: no file is opened.
        let any_provider = embedder.is_ok() || c.judge.is_some();
        let cache = c
            .cache_path
            .as_ref()
            .filter(|_| any_provider)
            .and_then(|p| match ProviderCache::open(p, c.cache_bounds) {
                Ok(cache) => Some(cache),
                Err(e) => {
                    tracing::error!(path = %p.display(), error = %e, "cannot open the provider cache; provider answers will not be cached");
                    None
                }
            });
        let http = HttpClient::new(c.max_concurrency, c.requests_per_second, c.attempt_timeout);
        Providers {
            judge_http: http.with_own_limits(),
            embedding_http: http,
            embedder,
            judge: c.judge.as_ref().map(|j| Judge {
                kind: j.kind,
                endpoint: Endpoint {
                    base_url: j.base_url.clone(),
                    api_key: j.api_key.clone(),
                },
                model: j.model.clone(),
                structured: j.structured_output,
            }),
            cache,
            prices: c.prices.clone(),
            short_circuit: c.short_circuit,
            judge_samples: c.judge_samples,
            judge_bias_probes: c.judge_bias_probes.clone(),
            ledger: Arc::new(Ledger::default()),
        }
    }

    /// The providers under a session cost budget (`budget_usd`), enforced
    /// per call by the [`Ledger`].
    pub fn with_budget(mut self, budget: Option<f64>) -> Providers {
        self.ledger = Arc::new(Ledger::new(budget));
        self
    }

    /// The most a call to `model` can cost: every byte of its input a token,
    /// and its output at its token limit.
    pub(crate) fn worst_cost(&self, model: &str, input_bytes: usize, max_output_tokens: u32) -> f64 {
        self.cost(
            model,
            Usage {
                input_tokens: input_bytes as u64,
                output_tokens: u64::from(max_output_tokens),
            },
        )
    }

    /// [`Providers::worst_cost`] of embedding `input_bytes` with `model` (or
    /// the configured one); nothing for the local model.
    pub(crate) fn worst_embedding_cost(&self, model: Option<&str>, input_bytes: usize) -> f64 {
        match &self.embedder {
            Ok(Embedder::Remote { model: default, .. }) => self.worst_cost(model.unwrap_or(default), input_bytes, 0),
            _ => 0.0,
        }
    }

    pub fn has_embedder(&self) -> bool {
        self.embedder.is_ok()
    }

    pub fn has_judge(&self) -> bool {
        self.judge.is_some()
    }

    /// The configured judge, or why there is none.
    pub fn judge(&self) -> Result<&Judge, ProviderError> {
        self.judge.as_ref().ok_or_else(|| ProviderError::Unavailable {
            message: "no LLM judge provider is configured".into(),
            detail: "Set ATTEST_JUDGE_BASE_URL (an OpenAI-compatible server such as OpenAI, Ollama, vLLM or llama.cpp) and/or ATTEST_JUDGE_API_KEY (or ATTEST_OPENAI_API_KEY), or ATTEST_ANTHROPIC_API_KEY for Anthropic; or the [judge] section of the config file. See README, Layers 5 and 6.".into(),
        })
    }

    /// Why an assertion of layer 5 (`embedding`) or 6 (`llm_judge`) cannot
    /// run on this engine, if it cannot: no provider is configured for it.
    pub fn missing_for(&self, kind: attest_core::layers::AssertionType) -> Option<ProviderError> {
        match kind {
            attest_core::layers::AssertionType::LlmJudge => self.judge().err(),
            attest_core::layers::AssertionType::Embedding => self.embedder.as_ref().err().map(|why| ProviderError::Unavailable {
                message: format!("no embedding provider is available: {why}"),
                detail: EMBEDDING_SETUP.into(),
            }),
            _ => None,
        }
    }

    /// What a call to `model` cost, from the price table (0 when unknown).
    pub fn cost(&self, model: &str, usage: Usage) -> f64 {
        self.prices.get(model).map_or(0.0, |p| p.cost(usage))
    }

    /// Embeds `texts` with the configured embedder (`model` overrides a
    /// remote provider's default model), using the cache for each text.
    pub async fn embed(&self, texts: &[&str], model: Option<&str>, deadline: Instant) -> Result<Embedded, ProviderError> {
        let embedder = self.embedder.as_ref().map_err(|why| ProviderError::Unavailable {
            message: format!("no embedding provider is available: {why}"),
            detail: EMBEDDING_SETUP.into(),
        })?;
        let (source, model_name) = match embedder {
            Embedder::Remote { model: default, endpoint } => (endpoint.base_url.as_str(), model.unwrap_or(default).to_owned()),
            Embedder::Local(l) => {
                if let Some(m) = model.filter(|m| *m != l.name) {
                    return Err(ProviderError::Unavailable {
                        message: format!("embedding model '{}' is not available: this engine embeds locally with {}", crate::text::clip(m, 80), l.name),
                        detail: format!("Drop spec.model (or set it to '{}'), or configure an OpenAI-compatible embeddings API that serves this model (ATTEST_EMBEDDING_BASE_URL).", l.name),
                    });
                }
                ("local", l.name.clone())
            }
        };
        let keys: Vec<Key> = texts.iter().map(|t| cache::key(&["embedding", source, &model_name, t])).collect();
        let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
        for k in &keys {
            vectors.push(match &self.cache {
                Some(c) => c.embedding(*k).await,
                None => None,
            });
        }
        let todo: Vec<usize> = (0..texts.len()).filter(|i| vectors[*i].is_none()).collect();
        let cached = texts.len() - todo.len();
        let mut cost = 0.0;
        if !todo.is_empty() {
            let batch: Vec<&str> = todo.iter().map(|i| texts[*i]).collect();
            let fresh = match embedder {
                Embedder::Remote { endpoint, .. } => {
                    let worst = self.worst_cost(&model_name, batch.iter().map(|t| t.len()).sum(), 0);
                    let reservation = self.ledger.reserve(worst)?;
                    let (v, usage) = match openai::embed(&self.embedding_http, endpoint, &model_name, &batch, deadline).await {
                        Ok(answer) => answer,
                        Err(ProviderError::Timeout) => {
                            reservation.settle(worst);
                            return Err(ProviderError::Timeout);
                        }
                        Err(e) => return Err(e),
                    };
                    cost = self.cost(&model_name, usage);
                    reservation.settle(cost);
                    v
                }
                Embedder::Local(l) => l.embed(&batch, deadline).await?,
            };
            for (i, v) in todo.into_iter().zip(fresh) {
                if let Some(c) = &self.cache {
                    c.put_embedding(keys[i], model_name.clone(), &v).await;
                }
                vectors[i] = Some(v);
            }
        }
        let truncated = match embedder {
            Embedder::Local(l) => l.truncates(texts).await,
            Embedder::Remote { .. } => vec![false; texts.len()],
        };
        Ok(Embedded {
            vectors: vectors.into_iter().map(Option::unwrap_or_default).collect(),
            cost,
            cached,
            model: model_name,
            truncated,
        })
    }

    /// One chat completion from the judge provider; returns it and its cost.
    ///
    /// The call runs as a task of its own holding its budget reservation and
    /// its concurrency slot: a caller that gives up (a plugin's deadline, a
    /// batch's) does not end the call early, and what it cost is counted
    /// when it ends.
    pub async fn complete(&self, judge: &Judge, chat: &Chat<'_>, deadline: Instant) -> Result<(Completion, f64), ProviderError> {
        let input_bytes: usize = chat.messages.iter().map(|m| m.to_string().len()).sum();
        let worst = self.worst_cost(chat.model, input_bytes, chat.max_tokens);
        let reservation = self.ledger.reserve(worst)?;
        let http = self.judge_http.clone();
        let endpoint = judge.endpoint.clone();
        let kind = judge.kind;
        let model = chat.model.to_owned();
        let messages = chat.messages.clone();
        let (temperature, max_tokens) = (chat.temperature, chat.max_tokens);
        let verdict_nonce = chat.verdict_nonce.filter(|_| judge.structured).map(str::to_owned);
        let price = self.prices.get(chat.model).copied();
        let call = tokio::spawn(async move {
            let chat = Chat {
                model: &model,
                messages,
                temperature,
                max_tokens,
                verdict_nonce: verdict_nonce.as_deref(),
            };
            let answer = match kind {
                JudgeKind::OpenAi => openai::chat(&http, &endpoint, &chat, deadline).await,
                JudgeKind::Anthropic => anthropic::chat(&http, &endpoint, &chat, deadline).await,
            };
            match answer {
                Ok(c) => {
                    let cost = price.map_or(0.0, |p| p.cost(c.usage));
                    reservation.settle(cost);
                    Ok((c, cost))
                }
                // Cut off: the provider may have served and billed it.
                Err(ProviderError::Timeout) => {
                    reservation.settle(worst);
                    Err(ProviderError::Timeout)
                }
                Err(e) => Err(e),
            }
        });
        call.await
            .unwrap_or_else(|e| Err(ProviderError::failed(format!("the judge call failed: {e}"), 1)))
    }
}

impl LocalEmbedder {
    /// Which of `texts` the model reads only the beginning of; all `false`
    /// when that cannot be told (the model is not loaded, tokenising failed).
    async fn truncates(&self, texts: &[&str]) -> Vec<bool> {
        let Some(Ok(model)) = self.model.get().map(|m| m.as_ref().map(|l| l.model.clone())) else {
            return vec![false; texts.len()];
        };
        let owned: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        let n = owned.len();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
            model.truncates(&refs)
        })
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| vec![false; n])
    }

    async fn embed(&self, texts: &[&str], deadline: Instant) -> Result<Vec<Vec<f32>>, ProviderError> {
        let model = self
            .model
            .get_or_init(|| async {
                let dir = self.dir.clone();
                let threads = self.threads;
                let started = std::time::Instant::now();
                let loaded = tokio::task::spawn_blocking(move || {
                    let model = Arc::new(local::LocalModel::load(&dir)?);
                    let inference = local::Inference::start(model.clone(), threads)?;
                    anyhow::Ok(Loaded { model, inference })
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| format!("{e:#}")));
                match &loaded {
                    Ok(_) => tracing::info!(dir = %self.dir.display(), ms = started.elapsed().as_millis() as u64, "local embedding model loaded"),
                    Err(e) => tracing::error!(dir = %self.dir.display(), error = %e, "cannot load the local embedding model"),
                }
                loaded.map(Arc::new)
            })
            .await
            .clone()
            .map_err(|e| ProviderError::Unavailable {
                message: format!("the local embedding model in {} could not be loaded: {}", self.dir.display(), crate::text::clip(&e, 300)),
                detail: "The directory needs config.json, tokenizer.json and model.safetensors of a BERT sentence-transformers model (all-MiniLM-L6-v2). Reinstall it, point ATTEST_EMBEDDING_MODEL_DIR elsewhere, or configure an embeddings API (ATTEST_EMBEDDING_BASE_URL).".into(),
            })?;
        let _permit = tokio::time::timeout_at(deadline, self.permits.acquire())
            .await
            .map_err(|_| ProviderError::Timeout)?
            .expect("the semaphore is never closed");
        let owned: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        let run = model.inference.embed(owned, deadline.into_std());
        match tokio::time::timeout_at(deadline, run).await {
            Err(_) | Ok(None) if Instant::now() >= deadline => Err(ProviderError::Timeout),
            Err(_) | Ok(None) => Err(ProviderError::failed(
                "local embedding model failed: its inference thread stopped",
                1,
            )),
            Ok(Some(Err(e))) => Err(ProviderError::failed(format!("local embedding model failed: {e:#}"), 1)),
            Ok(Some(Ok(v))) => Ok(v),
        }
    }
}

/// A compiled check of layer 5 or 6 with the providers it asks: what the
/// core's evaluator calls.
pub struct Asking<C> {
    pub check: C,
    pub providers: Arc<Providers>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Asking<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.check.fmt(f)
    }
}

impl PaidCheck for Asking<embedding::EmbeddingCheck> {
    fn evaluate<'a>(&'a self, trace: &'a Trace, deadline: tokio::time::Instant) -> BoxFuture<'a, Result<(Verdict, f64), ProviderError>> {
        Box::pin(self.check.evaluate(trace, &self.providers, deadline))
    }

    fn worst_cost(&self, trace_bytes: usize) -> f64 {
        self.check.worst_cost(&self.providers, trace_bytes)
    }
}

impl PaidCheck for Asking<llm_judge::JudgeCheck> {
    fn evaluate<'a>(&'a self, trace: &'a Trace, deadline: tokio::time::Instant) -> BoxFuture<'a, Result<(Verdict, f64), ProviderError>> {
        Box::pin(self.check.evaluate(trace, &self.providers, deadline))
    }

    fn worst_cost(&self, trace_bytes: usize) -> f64 {
        self.check.worst_cost(&self.providers, trace_bytes)
    }
}

/// Compiles an `embedding` or `llm_judge` assertion against `providers`.
pub fn compile_paid(kind: AssertionType, spec: &Spec<'_>, providers: &Arc<Providers>) -> Result<Box<dyn PaidCheck>, SpecError> {
    let providers = providers.clone();
    Ok(match kind {
        AssertionType::Embedding => Box::new(Asking {
            check: embedding::EmbeddingCheck::compile(spec)?,
            providers,
        }),
        _ => Box::new(Asking {
            check: llm_judge::JudgeCheck::compile(spec)?,
            providers,
        }),
    })
}
