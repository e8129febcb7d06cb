//! What the core asks of the engine's backends, as traits: the plugin host
//! (layer 8) and the model providers (layers 5 and 6) implement them, so the
//! evaluator runs every layer without linking wasmtime, an HTTP client or a
//! model runtime, and without knowing how any of them work.

use crate::drift::Fingerprint;
use crate::layers::{AssertionType, Spec, SpecError, Verdict};
use crate::trace::Trace;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use tokio::time::Instant;

/// A future a backend returns; boxed so the traits stay object-safe.
pub use futures_util::future::BoxFuture;

/// Why a provider could not give an answer. Never an agent failure: these
/// become request errors (`2001`, `3002`), not `hard_fail` results.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// The request's evaluation deadline passed (→ `3002`).
    Timeout,
    /// The provider failed, after `attempts` attempts (→ `2001`).
    /// `permanent`: it refused the request itself (an HTTP 4xx other than
    /// 408 and 429), so asking again the same way cannot succeed.
    Failed { message: String, attempts: u32, permanent: bool },
    /// No provider is configured for this layer (→ `2001`); `detail` says
    /// how to enable one.
    Unavailable { message: String, detail: String },
    /// The session's cost budget has no room for the call's worst-case
    /// cost (→ `1002`): the call was not sent.
    BudgetSpent { budget: f64, spent: f64 },
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Timeout => write!(f, "the provider did not answer before the deadline"),
            ProviderError::Failed { message, attempts: 1, .. } => write!(f, "{message}"),
            ProviderError::Failed { message, attempts, .. } => write!(f, "{message} (after {attempts} attempts)"),
            ProviderError::Unavailable { message, .. } => write!(f, "{message}"),
            ProviderError::BudgetSpent { budget, spent } => {
                write!(
                    f,
                    "the session's cost budget of ${budget} is spent (${spent:.6} so far, with calls in flight reserved)"
                )
            }
        }
    }
}

impl std::error::Error for ProviderError {}

impl ProviderError {
    pub fn failed(message: impl Into<String>, attempts: u32) -> ProviderError {
        ProviderError::Failed {
            message: message.into(),
            attempts,
            permanent: false,
        }
    }

    /// The provider refused the request itself: no retry can help.
    pub fn refused(message: impl Into<String>, attempts: u32) -> ProviderError {
        ProviderError::Failed {
            message: message.into(),
            attempts,
            permanent: true,
        }
    }
}

/// A compiled check of a paid layer (embedding, llm_judge): asks its
/// provider, returns the verdict and its cost in USD.
pub trait PaidCheck: fmt::Debug + Send + Sync {
    fn evaluate<'a>(&'a self, trace: &'a Trace, deadline: Instant) -> BoxFuture<'a, Result<(Verdict, f64), ProviderError>>;

    /// The most one evaluation on a trace of `trace_bytes` can cost in USD
    /// (every call it may make, each at its prompt's bound and its output
    /// limit): what a budget reserves before the evaluation starts.
    fn worst_cost(&self, _trace_bytes: usize) -> f64 {
        0.0
    }
}

/// A loaded assertion plugin (layer 8).
pub trait AssertionPlugin: fmt::Debug + Send + Sync {
    fn id(&self) -> &str;
    /// Evaluates one trace (its JSON text, as received) against each config;
    /// one answer per config, in order. A plugin that fails answers with
    /// failures, never with fewer answers.
    fn evaluate(&self, trace_json: &str, configs: &[&str], call: &PluginCall) -> Vec<PluginAnswer>;
}

/// What a plugin's model calls (embeddings, judge) may spend and how long
/// they may wait, for one evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PluginCall {
    /// The evaluation's deadline.
    pub deadline: std::time::Instant,
    /// USD left in the session's budget (`None`: no budget).
    pub budget_left: Option<f64>,
}

/// One plugin verdict, as the plugin gave it (scores unclamped).
#[derive(Debug, Clone, PartialEq)]
pub struct PluginAnswer {
    pub passed: bool,
    pub always_hard: bool,
    pub score: f64,
    pub explanation: String,
    pub details: Option<Value>,
    /// USD the plugin's model calls cost while answering.
    pub cost: f64,
}

/// A plugin assertion, compiled: the plugin and the config it receives.
#[derive(Debug)]
pub struct PluginCheck {
    pub plugin: Arc<dyn AssertionPlugin>,
    /// The config as JSON text, defaults filled in.
    pub config: String,
}

/// Compiles the assertion types the core does not evaluate itself.
pub trait Backends: Send + Sync {
    /// `plugin`: finds the plugin and checks the config against its schema.
    fn compile_plugin(&self, spec: &Spec<'_>) -> Result<PluginCheck, SpecError>;
    /// `embedding` or `llm_judge`.
    fn compile_paid(&self, kind: AssertionType, spec: &Spec<'_>) -> Result<Box<dyn PaidCheck>, SpecError>;
}

/// Earlier scores of an assertion, for `threshold: "dynamic"`.
pub trait ScoreHistory: Send + Sync {
    /// Up to `limit` most recent scores of `fingerprint`, newest first; an
    /// error once `deadline` passes without an answer.
    fn recent_scores(&self, fingerprint: Fingerprint, limit: u64, deadline: std::time::Instant) -> Result<Vec<f64>, String>;
}
