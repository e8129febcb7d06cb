//! The grading host: what the runtime asks of the evaluator it is plugged
//! into (Attest assertions, LLM judgements, result history), and a standalone
//! host that judges through any OpenAI-compatible chat completions endpoint.

use serde::Serialize;
use serde_json::{json, Value};

use crate::manifest::Field;

pub use futures_util::future::BoxFuture;

/// Outcome status of an Attest assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GradeStatus {
    Pass,
    SoftFail,
    HardFail,
}

impl GradeStatus {
    pub fn parse(s: &str) -> Option<GradeStatus> {
        match s {
            "pass" => Some(GradeStatus::Pass),
            "soft_fail" => Some(GradeStatus::SoftFail),
            "hard_fail" => Some(GradeStatus::HardFail),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GradeStatus::Pass => "pass",
            GradeStatus::SoftFail => "soft_fail",
            GradeStatus::HardFail => "hard_fail",
        }
    }
}

/// One assertion result, as `evaluate_batch` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GradeOutcome {
    pub status: GradeStatus,
    pub score: f64,
    pub explanation: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum GradeError {
    /// The host cannot grade this kind of check at all (not configured).
    #[error("{0}")]
    Unavailable(String),
    /// Grading was attempted and failed (provider error, bad assertion, ...).
    #[error("{0}")]
    Failed(String),
}

/// One `llm_judge` grader applied to one step. The prompts are built here so
/// every host asks the same question; the host only chooses how to reach a
/// model (provider, cache, retries, budget) and must turn the model's reply
/// into a verdict with [`JudgeVerdict::from_reply`].
#[derive(Debug, Clone, Serialize)]
pub struct JudgeRequest {
    /// `ECP_LLM_JUDGE_MODEL`, default `gpt-4o-mini`.
    pub model: String,
    /// Whether `ECP_LLM_JUDGE_MODEL` chose the model. A host with a judge
    /// model of its own configured uses that one when it did not.
    pub model_chosen: bool,
    /// `ECP_LLM_JUDGE_TEMPERATURE`, default 0 (an unparsable value means 0).
    pub temperature: f64,
    pub system_prompt: String,
    pub user_prompt: String,
    /// The text under evaluation (already chosen by the grader's field).
    pub text: String,
    /// The grader's `prompt`: the criteria.
    pub criteria: String,
    pub field: &'static str,
}

pub const DEFAULT_JUDGE_MODEL: &str = "gpt-4o-mini";
const PASS_MARKER: &str = "RESULT: PASS";
const FAIL_MARKER: &str = "RESULT: FAIL";

impl JudgeRequest {
    /// Build the request from the grader and the environment variables the
    /// ECP runtime honours.
    pub fn new(field: Field, text: &str, criteria: &str) -> JudgeRequest {
        Self::with_env(field, text, criteria, |k| std::env::var(k).ok())
    }

    pub fn with_env(field: Field, text: &str, criteria: &str, env: impl Fn(&str) -> Option<String>) -> JudgeRequest {
        let chosen = env("ECP_LLM_JUDGE_MODEL").filter(|m| !m.is_empty());
        let model_chosen = chosen.is_some();
        let model = chosen.unwrap_or_else(|| DEFAULT_JUDGE_MODEL.to_string());
        let temperature = env("ECP_LLM_JUDGE_TEMPERATURE")
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|t| t.is_finite())
            .unwrap_or(0.0);
        let system_prompt = "You are an impartial judge. You decide whether a text meets the criteria you are given.".to_string();
        let user_prompt = format!(
            "Judge the text below against the criteria.\n\n<text>\n{text}\n</text>\n\n<criteria>\n{criteria}\n</criteria>\n\n\
             Explain your decision in a few sentences, then finish with exactly one line: \
             \"{PASS_MARKER}\" if the text meets the criteria, or \"{FAIL_MARKER}\" if it does not."
        );
        JudgeRequest {
            model,
            model_chosen,
            temperature,
            system_prompt,
            user_prompt,
            text: text.to_string(),
            criteria: criteria.to_string(),
            field: field.as_str(),
        }
    }

    /// The model name a provider of `provider`'s kind (`openai`,
    /// `anthropic`) knows: manifests written for the reference runtime name
    /// models the way its LiteLLM client routes them (`openai/gpt-4o-mini`).
    pub fn model_for(&self, provider: &str) -> &str {
        self.model
            .strip_prefix(provider)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(&self.model)
    }

    /// The chat messages to send.
    pub fn messages(&self) -> Value {
        json!([
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.user_prompt},
        ])
    }
}

/// A judge's decision: pass when the reply contains `RESULT: PASS`
/// (case-sensitive, anywhere); the reasoning is the reply without the markers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JudgeVerdict {
    pub passed: bool,
    pub score: f64,
    pub reasoning: String,
}

impl JudgeVerdict {
    pub fn from_reply(content: &str) -> JudgeVerdict {
        let passed = content.contains(PASS_MARKER);
        let reasoning = content.replace(PASS_MARKER, "").replace(FAIL_MARKER, "").trim().to_string();
        JudgeVerdict {
            passed,
            score: if passed { 1.0 } else { 0.0 },
            reasoning,
        }
    }
}

/// One check's result, as it appears in the JSON report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckResult {
    #[serde(rename = "type")]
    pub kind: String,
    pub field: String,
    pub passed: bool,
    pub score: f64,
    pub reasoning: String,
    /// For `attest` checks: the assertion's status (`pass`, `soft_fail`, `hard_fail`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<GradeStatus>,
}

/// What the runtime needs from the evaluator it runs inside.
pub trait GradingHost: Send + Sync {
    /// Evaluate one `evaluate_batch` assertion object against an Attest v1 trace.
    fn attest<'a>(&'a self, trace: &'a Value, assertion: &'a Value) -> BoxFuture<'a, Result<GradeOutcome, GradeError>>;
    /// Ask an LLM judge; see [`JudgeRequest`].
    fn judge(&self, request: JudgeRequest) -> BoxFuture<'_, Result<JudgeVerdict, GradeError>>;
    /// Every graded step is reported here (1-based step index) so results reach the host's history.
    fn record<'a>(&'a self, scenario: &'a str, step: usize, results: &'a [CheckResult]) -> BoxFuture<'a, ()>;
    /// Checks an `attest` grader's assertion without evaluating it, so that
    /// a manifest with a bad one is refused before any agent starts. `Err`
    /// says what is wrong, as `evaluate_batch` would. A host without an
    /// evaluator has nothing to check against and accepts every assertion.
    fn check_attest(&self, _assertion: &Value) -> Result<(), String> {
        Ok(())
    }
}

/// The standalone `attest-ecp` binary's host: no Attest evaluator, no
/// model provider, no history. Its `llm_judge` graders refuse with what to
/// run instead: the judge client (retries, deadline, cache, budget) is the
/// engine's, one for every path (`attest-engine ecp run`).
pub struct StandaloneHost;

impl GradingHost for StandaloneHost {
    fn attest<'a>(&'a self, _trace: &'a Value, _assertion: &'a Value) -> BoxFuture<'a, Result<GradeOutcome, GradeError>> {
        Box::pin(async {
            Err(GradeError::Unavailable(
                "attest graders need the Attest evaluator: run the manifest with `attest-engine ecp run`".into(),
            ))
        })
    }

    fn judge(&self, _request: JudgeRequest) -> BoxFuture<'_, Result<JudgeVerdict, GradeError>> {
        Box::pin(async {
            Err(GradeError::Unavailable(
                "llm_judge graders need a model provider: run the manifest with `attest-engine ecp run`, which asks the judge configured for the engine or, without one, the OPENAI_API_KEY/OPENAI_API_BASE endpoint".into(),
            ))
        })
    }

    fn record<'a>(&'a self, _scenario: &'a str, _step: usize, _results: &'a [CheckResult]) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_needs_the_exact_pass_marker() {
        let v = JudgeVerdict::from_reply("Looks right.\nRESULT: PASS");
        assert!(v.passed);
        assert_eq!(v.reasoning, "Looks right.");
        assert!(!JudgeVerdict::from_reply("result: pass").passed);
        let f = JudgeVerdict::from_reply("RESULT: FAIL because RESULT: PASS was not earned");
        assert!(f.passed, "the marker anywhere means pass");
        assert_eq!(JudgeVerdict::from_reply("  RESULT: FAIL ").reasoning, "");
    }

    #[test]
    fn judge_settings_come_from_the_environment() {
        let r = JudgeRequest::with_env(Field::PublicOutput, "t", "c", |k| match k {
            "ECP_LLM_JUDGE_MODEL" => Some("m".into()),
            "ECP_LLM_JUDGE_TEMPERATURE" => Some("warm".into()),
            _ => None,
        });
        assert_eq!((r.model.as_str(), r.temperature), ("m", 0.0));
        let d = JudgeRequest::with_env(Field::PublicOutput, "t", "c", |k| {
            (k == "ECP_LLM_JUDGE_TEMPERATURE").then(|| "0.5".into())
        });
        assert_eq!((d.model.as_str(), d.temperature), (DEFAULT_JUDGE_MODEL, 0.5));
        assert!(d.user_prompt.contains("<text>\nt\n</text>"));
    }
}
