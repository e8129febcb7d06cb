//! `rubric`: an LLM judge with the team's own rubric and few-shot examples,
//! through the engine (`models.judge`, the capability `judge`). The engine
//! marks the judged text as data (injection hardening), retries, caches and
//! prices the call, and refuses it once the session's budget is spent.

use attest_plugin_sdk::models::{self, Capability, JudgeRequest};
use attest_plugin_sdk::serde_json;
use attest_plugin_sdk::text::{clip, num};
use attest_plugin_sdk::{json, resolve_or_fail, AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
use serde::Deserialize;

pub struct Rubric;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub rubric: String,
    #[serde(default = "default_target")]
    pub target: Target,
    /// Material the judge may check the target against.
    #[serde(default)]
    pub context: Option<Target>,
    #[serde(default)]
    pub examples: Vec<Example>,
    #[serde(default = "default_threshold")]
    pub threshold: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    pub content: String,
    pub score: f64,
    #[serde(default)]
    pub reasoning: String,
}

fn default_target() -> Target {
    Target::parse("output.message").expect("the default target parses")
}
fn default_threshold() -> f64 {
    0.7
}

impl AssertionPlugin for Rubric {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("rubric", env!("CARGO_PKG_VERSION"))
            .description("An LLM judge with your own rubric and few-shot examples, through the engine's judge provider.")
            .config_schema(include_str!("../config.schema.json"))
            .requests(Capability::Judge)
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let t = &config.target;
        let content = json::text(&*resolve_or_fail!(t, trace)).into_owned();
        let mut request = JudgeRequest::new(config.rubric.clone(), content);
        if let Some(c) = &config.context {
            request = request.context(json::text(&*resolve_or_fail!(c, trace)).into_owned());
        }
        for e in &config.examples {
            request = request.example(e.content.clone(), e.score, e.reasoning.clone());
        }
        let judged = models::judge(&request)?;
        let passed = judged.score >= config.threshold;
        let rel = if passed { "meets" } else { "is below" };
        Ok(Verdict::from_bool(
            passed,
            format!(
                "The judge scored {t} {} against the rubric, which {rel} the threshold {}: {}",
                num((judged.score * 100.0).round() / 100.0),
                num(config.threshold),
                clip(&judged.reasoning, 600)
            ),
        )
        .with_score(judged.score)
        .with_details(serde_json::json!({
            "expected": format!("judged score ≥ {}", num(config.threshold)),
            "actual": format!("score {}", num((judged.score * 100.0).round() / 100.0)),
            "path": t.as_str(),
        })))
    }
}

attest_plugin_sdk::export_plugin!(Rubric);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::models::{CapabilityError, Judgement};
    use attest_plugin_sdk::serde_json::json;
    use attest_plugin_sdk::testing::{self, FakeHost};
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn describes_itself_and_requests_judge() {
        let schema = testing::check_info::<Rubric>();
        assert_eq!(schema["required"], json!(["rubric"]));
        assert_eq!(Rubric::info().capabilities, vec![Capability::Judge]);
        for config in testing::readme_configs(include_str!("../README.md"), "rubric") {
            testing::validate_config::<Rubric>(&config).unwrap();
        }
    }

    #[test]
    fn the_judges_score_decides_and_the_request_carries_rubric_context_and_examples() {
        let seen = Rc::new(RefCell::new(None));
        let keep = seen.clone();
        let _host = FakeHost::new().judge(move |req| {
            *keep.borrow_mut() = Some(req.clone());
            Ok(Judgement {
                score: if req.content.contains("warm") { 0.9 } else { 0.3 },
                reasoning: "fake".into(),
            })
        });
        let trace = json!({"schema_version": 1, "trace_id": "t", "output": {"message": "A warm hello!"}, "input": {"user_message": "hi"}});
        let config = json!({"rubric": "Friendly, on-brand tone.", "context": "input.user_message",
                            "examples": [{"content": "Go away.", "score": 0.0, "reasoning": "rude"}]});
        let v = testing::evaluate::<Rubric>(&trace, &config).unwrap();
        assert!(v.is_pass() && v.score() == 0.9, "{}", v.explanation());
        let req = seen.borrow().clone().unwrap();
        assert_eq!(
            (req.rubric.as_str(), req.content.as_str(), req.context.as_deref()),
            ("Friendly, on-brand tone.", "A warm hello!", Some("hi"))
        );
        assert_eq!(req.examples[0].reasoning, "rude");
        let cold = json!({"schema_version": 1, "trace_id": "t", "output": {"message": "Fine."}});
        let v = testing::evaluate::<Rubric>(&cold, &json!({"rubric": "r"})).unwrap();
        assert!(
            !v.is_pass() && v.explanation().contains("is below the threshold 0.7"),
            "{}",
            v.explanation()
        );
    }

    #[test]
    fn a_spent_budget_is_an_error() {
        let _host = FakeHost::new().judge(|_| Err(CapabilityError::BudgetExhausted("spent".into())));
        let e = testing::evaluate::<Rubric>(&testing::message_trace("x"), &json!({"rubric": "r"})).unwrap_err();
        assert!(matches!(e, PluginError::Internal(ref m) if m.contains("budget exhausted")), "{e:?}");
    }
}
