//! What the paid layers (5, embedding; 6, llm_judge) share: reading their
//! `threshold` and turning their target into text.

use super::{Spec, SpecError};
use crate::target::{Missing, Target};
use crate::trace::Trace;
use serde_json::Value;

/// `spec.threshold`: a number in [0, 1], or `"dynamic"` (judged from
/// history by the batch; `default` then only shapes the explanation).
pub fn threshold(spec: &Spec<'_>, default: f64) -> Result<f64, SpecError> {
    match spec.raw("threshold") {
        // "dynamic"; any other string is refused, with the valid choices,
        // by CompiledAssertion::compile.
        Some(Value::String(_)) => Ok(default),
        _ => match spec.opt_f64("threshold")? {
            None => Ok(default),
            Some(t) if (0.0..=1.0).contains(&t) => Ok(t),
            Some(t) => Err(SpecError::new(
                "spec.threshold",
                format!("threshold {t} is out of range"),
                format!("Set spec.threshold to a number from 0.0 to 1.0 (default {default}), or \"dynamic\"."),
            )),
        },
    }
}

/// The target as text: strings as they are, anything else as compact JSON.
pub fn target_text(target: &Target, trace: &Trace) -> Result<String, Missing> {
    Ok(match target.resolve(trace)?.as_ref() {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}
