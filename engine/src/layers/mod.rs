//! Assertion layers as the engine runs them: the core's native layers
//! (`attest-core`: schema, constraint, trace, content, trace tree) beside the
//! layers that need the engine's backends, the model providers (embedding,
//! llm_judge) and the plugin host (plugin).
//!
//! This module owns [`CompiledAssertion`]: a spec compiled once into its
//! typed [`Check`], with the properties every layer shares (`soft`,
//! `threshold: "dynamic"`, the spec's identity across runs).

pub use attest_core::layers::{
    constraint, content, paid, schema, spec, trace, trace_tree, AssertionType, BiasProbe, Evidence, JudgeMetadata, NativeCheck, Probe,
    Spec, SpecError, Status, Verdict, PROBES,
};
pub mod embedding;
pub mod llm_judge;
pub mod plugin;

use crate::plugins::PluginHost;
use crate::providers::{ProviderError, Providers};
use crate::trace::Trace;
use serde_json::Value;

/// A spec compiled into its typed check.
#[derive(Debug)]
pub enum Check {
    /// Layers 1-4 and 7, evaluated by the core.
    Native(NativeCheck),
    /// Answered by a WebAssembly plugin; run per batch by [`crate::batch`].
    Plugin(plugin::PluginCheck),
    /// Answered by a provider, asynchronously; see [`CompiledAssertion::evaluate_paid`].
    Embedding(embedding::EmbeddingCheck),
    LlmJudge(llm_judge::JudgeCheck),
}

/// A compiled assertion: shareable across requests (see the batch cache).
#[derive(Debug)]
pub struct CompiledAssertion {
    pub kind: AssertionType,
    pub check: Check,
    pub soft: bool,
    /// `threshold: "dynamic"`: the status comes from the score's history.
    pub dynamic: bool,
    /// The assertion's identity across runs, before the trace's agent is mixed in.
    pub spec_digest: crate::history::SpecDigest,
}

impl CompiledAssertion {
    /// Compiles `spec` for an assertion of type `kind` (an available type).
    pub fn compile(kind: AssertionType, spec: Option<&Value>, plugins: &PluginHost) -> Result<CompiledAssertion, SpecError> {
        let reader = Spec::new(spec, kind.name())?;
        let check = match NativeCheck::compile(kind, &reader) {
            Some(native) => Check::Native(native?),
            None => match kind {
                AssertionType::Plugin => Check::Plugin(plugin::PluginCheck::compile(&reader, plugins)?),
                AssertionType::Embedding => Check::Embedding(embedding::EmbeddingCheck::compile(&reader)?),
                // The one type left: every other is native.
                _ => Check::LlmJudge(llm_judge::JudgeCheck::compile(&reader)?),
            },
        };
        let dynamic = match reader.raw("threshold") {
            Some(Value::String(s)) if s == "dynamic" => true,
            Some(Value::String(s)) => {
                return Err(SpecError::new(
                    "spec.threshold",
                    format!("threshold must be a number or \"dynamic\", got {}", crate::text::quote(s)),
                    "Use a number, or \"dynamic\" to judge the score against this assertion's history (see README, Result history).",
                ))
            }
            _ => false,
        };
        Ok(CompiledAssertion {
            kind,
            check,
            soft: reader.bool_or("soft", false)?,
            dynamic,
            spec_digest: crate::history::SpecDigest::of(kind.name(), spec),
        })
    }

    /// Bytes of compiled regex program a scan of the target may walk per
    /// byte of text (0 for checks without patterns). With the trace's size
    /// it bounds the check's running time.
    pub fn scan_weight(&self) -> usize {
        match &self.check {
            Check::Native(c) => c.scan_weight(),
            _ => 0,
        }
    }

    /// Whether evaluating this check must not happen on any thread that asks:
    /// schema validations with patterns, whose regex caches grow with the
    /// threads that use them (see `watchdog`).
    pub fn needs_regex_thread(&self) -> bool {
        matches!(&self.check, Check::Native(c) if c.needs_regex_thread())
    }

    /// Estimated memory this compiled assertion holds, for cache accounting.
    pub fn memory_bytes(&self) -> usize {
        const BASE: usize = 512;
        BASE + match &self.check {
            Check::Native(c) => c.memory_bytes(),
            _ => 0,
        }
    }

    /// Evaluates a built-in check. Plugin checks are run per batch instead
    /// (see [`crate::batch`]) and classified with [`CompiledAssertion::classify`].
    pub fn evaluate(&self, trace: &Trace) -> (Status, Verdict) {
        let verdict = match &self.check {
            Check::Native(c) => c.evaluate(trace),
            Check::Plugin(c) => unreachable!("plugin {} checks are evaluated per batch", c.plugin.id),
            Check::Embedding(_) | Check::LlmJudge(_) => unreachable!("paid checks are evaluated with evaluate_paid"),
        };
        self.classify(verdict)
    }

    /// Evaluates a paid check (layers 5 and 6) through its provider; returns
    /// the verdict and its cost in USD. Provider failures are errors, never
    /// verdicts: an unreachable judge says nothing about the agent.
    pub async fn evaluate_paid(
        &self,
        trace: &Trace,
        providers: &Providers,
        deadline: tokio::time::Instant,
    ) -> Result<(Verdict, f64), ProviderError> {
        match &self.check {
            Check::Embedding(c) => c.evaluate(trace, providers, deadline).await,
            Check::LlmJudge(c) => c.evaluate(trace, providers, deadline).await,
            _ => unreachable!("{} is not a paid check", self.kind.name()),
        }
    }

    /// Applies `soft` to a verdict.
    pub fn classify(&self, verdict: Verdict) -> (Status, Verdict) {
        let status = if verdict.passed {
            Status::Pass
        } else if self.soft && !verdict.always_hard {
            Status::SoftFail
        } else {
            Status::HardFail
        };
        (status, verdict)
    }
}
