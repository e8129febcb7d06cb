//! Layer 5: cosine similarity between a target's text and a reference text.
//!
//! - `target` defaults to `output.message`; `threshold` to 0.8 (Attest protocol v1);
//!   `model` picks the provider's model; `soft` softens a failure.
//! - The score is the cosine similarity clamped to [0, 1]; the check passes
//!   when it is at least the threshold.
//! - A non-string target is compared as its compact JSON text.

use crate::local::cosine;
use crate::{ProviderError, Providers};
use attest_core::layers::paid::{target_text, threshold};
use attest_core::layers::{Evidence, Spec, SpecError, Verdict};
use attest_core::target::{Target, GRAMMAR_HINT};
use attest_core::text::{clip, num, quote};
use attest_core::trace::Trace;
use tokio::time::Instant;

pub const DEFAULT_THRESHOLD: f64 = 0.8;

#[derive(Debug)]
pub struct EmbeddingCheck {
    target: Target,
    reference: String,
    threshold: f64,
    model: Option<String>,
}

impl EmbeddingCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<EmbeddingCheck, SpecError> {
        let target = Target::parse(spec.opt_str("target")?.unwrap_or("output.message"))
            .map_err(|e| SpecError::new("spec.target", e.message, GRAMMAR_HINT))?;
        Ok(EmbeddingCheck {
            target,
            reference: spec.str("reference")?.to_owned(),
            threshold: threshold(spec, DEFAULT_THRESHOLD)?,
            model: spec.opt_str("model")?.filter(|m| !m.is_empty()).map(str::to_owned),
        })
    }

    /// Embeds the target and the reference and compares them. Returns the
    /// verdict and its cost.
    /// The most one evaluation can cost: the target text (at most the
    /// trace) and the reference, embedded remotely at the model's price.
    pub fn worst_cost(&self, providers: &Providers, trace_bytes: usize) -> f64 {
        providers.worst_embedding_cost(self.model.as_deref(), trace_bytes + self.reference.len())
    }

    pub async fn evaluate(&self, trace: &Trace, providers: &Providers, deadline: Instant) -> Result<(Verdict, f64), ProviderError> {
        let t = self.target.as_str();
        let text = match target_text(&self.target, trace) {
            Ok(text) => text,
            Err(missing) => return Ok((Verdict::fail(format!("{t} could not be compared: {}.", missing.0)), 0.0)),
        };
        let e = providers.embed(&[&text, &self.reference], self.model.as_deref(), deadline).await?;
        let Some(sim) = cosine(&e.vectors[0], &e.vectors[1]) else {
            return Err(ProviderError::failed(
                format!(
                    "embedding provider returned unusable vectors ({} and {} dimensions, all zeros, or non-finite values)",
                    e.vectors[0].len(),
                    e.vectors[1].len()
                ),
                1,
            ));
        };
        let score = sim.clamp(0.0, 1.0);
        let passed = score >= self.threshold;
        let rel = if passed { "meets" } else { "is below" };
        let mut explanation = format!(
            "Cosine similarity {:.4} between {t} and the reference text {rel} the threshold {} ({}).",
            sim,
            num(self.threshold),
            e.model
        );
        if e.cached == 2 {
            explanation.push_str(" Both embeddings came from the cache: cost 0.");
        } else if e.cached == 1 {
            explanation.push_str(" One embedding came from the cache.");
        }
        // The local model reads only the beginning of a long text: say so,
        // since the rest could not have moved the score.
        match (e.truncated.first() == Some(&true), e.truncated.get(1) == Some(&true)) {
            (true, true) => explanation.push_str(&format!(
                " Both texts are longer than the {} tokens the model reads: only their beginnings were compared.",
                crate::local::MAX_TOKENS
            )),
            (true, false) => explanation.push_str(&format!(
                " {t} is longer than the {} tokens the model reads: only its beginning was compared.",
                crate::local::MAX_TOKENS
            )),
            (false, true) => explanation.push_str(&format!(
                " The reference is longer than the {} tokens the model reads: only its beginning was compared.",
                crate::local::MAX_TOKENS
            )),
            (false, false) => {}
        }
        Ok((
            Verdict {
                passed,
                score,
                explanation,
                always_hard: false,
                evidence: None,
            }
            .with({
                let ev = Evidence::new(
                    format!("cosine similarity ≥ {} to {}", num(self.threshold), quote(&clip(&self.reference, 120))),
                    format!("{} (similarity {:.4}, {})", quote(&clip(&text, 120)), sim, e.model),
                )
                .at(t);
                if passed {
                    ev
                } else {
                    ev.hint(format!(
                        "{t} drifted from the reference ({:.2} < {}): bring the agent's answer back to the reference's meaning, or update spec.reference if the new answer is correct.",
                        sim,
                        num(self.threshold)
                    ))
                }
            }),
            e.cost,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(spec: serde_json::Value) -> Result<EmbeddingCheck, SpecError> {
        EmbeddingCheck::compile(&Spec::new(Some(&spec), "embedding")?)
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = compile(json!({"reference": "r", "model": null})).unwrap();
        assert_eq!(c.target.as_str(), "output.message");
        assert_eq!(c.threshold, 0.8);
        assert_eq!(c.model, None);
    }

    #[test]
    fn bad_specs_name_the_field() {
        assert_eq!(compile(json!({"target": "output.message"})).unwrap_err().field, "spec.reference");
        assert_eq!(
            compile(json!({"reference": "r", "threshold": 1.5})).unwrap_err().field,
            "spec.threshold"
        );
        assert_eq!(
            compile(json!({"reference": "r", "target": "steps["})).unwrap_err().field,
            "spec.target"
        );
        assert_eq!(compile(json!({"reference": "r", "model": 3})).unwrap_err().field, "spec.model");
    }

    #[test]
    fn dynamic_threshold_is_accepted() {
        assert!(compile(json!({"reference": "r", "threshold": "dynamic"})).is_ok());
    }
}
