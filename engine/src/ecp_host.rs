//! The engine behind `attest-engine ecp`: the ECP runtime's `attest` grader
//! runs any assertion through the same compiled checks as `evaluate_batch`
//! (layers 1–8, plugins included), its `llm_judge` grader asks the engine's
//! judge provider (retries, deadlines, pricing and the session budget), and
//! every graded step lands in the result history.
//!
//! The `llm_judge` grader asks the configured judge model unless
//! `ECP_LLM_JUDGE_MODEL` names one, and deterministic questions (temperature
//! 0) are answered from the provider cache when asked before, at no cost.
//!
//! Without a configured judge provider, `llm_judge` falls back to the
//! OpenAI-compatible endpoint the reference runtime reads (`OPENAI_API_BASE`
//! or `OPENAI_BASE_URL`, `OPENAI_API_KEY`), so existing manifests keep working.

use crate::batch::{Effects, Suite};
use crate::history::{Detail, Kept, Row, Rows, SpecDigest};
use crate::layers::Status;
use crate::providers::{Chat, Judge};
use crate::session::Engine;
use attest_ecp::{BoxFuture, CheckResult, GradeError, GradeOutcome, GradeStatus, GradingHost, JudgeRequest, JudgeVerdict};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// The engine configuration an `ecp` subcommand runs with. Only `run`
/// records results, so only `run` opens the result history: `init`,
/// `validate`, `conformance` and `trend` leave `<cache_dir>` as it was, and
/// create nothing there when it (or `$HOME`) does not exist. `main` builds
/// the engine for `attest-engine ecp` from this.
pub fn config_for(cmd: &attest_ecp::EcpCommand, mut config: crate::config::Config) -> crate::config::Config {
    if !matches!(cmd.action, attest_ecp::EcpAction::Run(_)) {
        config.history = None;
    }
    config
}

pub struct EngineGradingHost {
    engine: Arc<Engine>,
    /// Without a configured judge, the one ECP manifests expect: an
    /// OpenAI-compatible endpoint from `OPENAI_API_KEY` and
    /// `OPENAI_API_BASE`/`OPENAI_BASE_URL`, asked through the engine's own
    /// provider client (retries, deadlines, budget) like the configured one.
    fallback_judge: Option<Judge>,
    run_id: String,
}

impl EngineGradingHost {
    /// `label` names the run in the history (the manifest it runs).
    pub fn new(engine: Arc<Engine>, label: String) -> EngineGradingHost {
        engine.sinks.start_run(crate::history::RunKind::Ecp, label);
        let fallback_judge = match engine.providers.judge() {
            Ok(_) => None,
            Err(_) => fallback_judge(|k| std::env::var(k).ok()),
        };
        let run_id = format!(
            "ecp-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        );
        EngineGradingHost {
            engine,
            fallback_judge,
            run_id,
        }
    }
}

impl GradingHost for EngineGradingHost {
    fn attest<'a>(&'a self, trace: &'a Value, assertion: &'a Value) -> BoxFuture<'a, Result<GradeOutcome, GradeError>> {
        Box::pin(async move {
            let failed = |e: crate::protocol::RpcError| {
                GradeError::Failed(format!("{} ({}): {} {}", e.code.code(), e.code.error_type(), e.message, e.detail))
            };
            let suite = Suite::compile(&self.engine, std::slice::from_ref(assertion)).map_err(failed)?;
            let deadline = Instant::now() + self.engine.config.eval_timeout;
            let result = suite
                .evaluate_with(&self.engine, &trace.to_string(), deadline, Effects::ResultsOnly)
                .await
                .map_err(failed)?;
            let r = result
                .results
                .into_iter()
                .next()
                .ok_or_else(|| GradeError::Failed("the assertion produced no result".into()))?;
            Ok(GradeOutcome {
                status: match r.status {
                    Status::Pass => GradeStatus::Pass,
                    Status::SoftFail => GradeStatus::SoftFail,
                    Status::HardFail => GradeStatus::HardFail,
                },
                score: r.score,
                explanation: r.explanation,
            })
        })
    }

    /// A manifest's assertion compiles as `evaluate_batch` would compile
    /// it, and, like a collect rules file, may not hold keys nothing reads:
    /// in a file they are typos that would silently change a verdict.
    fn check_attest(&self, assertion: &Value) -> Result<(), String> {
        let one = std::slice::from_ref(assertion);
        let typo = |t: crate::batch::Typo| {
            let place = t.field.strip_prefix("assertions[0].").unwrap_or(&t.field).to_owned();
            format!("{place}: {t}")
        };
        if let Some(t) = crate::batch::first_unknown_member(one) {
            return Err(typo(t));
        }
        let suite = Suite::compile(&self.engine, one)
            .map_err(|e| format!("{} ({}): {} {}", e.code.code(), e.code.error_type(), e.message, e.detail))?;
        match suite.first_unread_key() {
            Some(t) => Err(typo(t)),
            None => Ok(()),
        }
    }

    fn judge(&self, request: JudgeRequest) -> BoxFuture<'_, Result<JudgeVerdict, GradeError>> {
        Box::pin(async move {
            let providers = &self.engine.providers;
            let (judge, fallback) = match (providers.judge(), &self.fallback_judge) {
                (Ok(judge), _) => (judge, false),
                (Err(_), Some(fallback)) => (fallback, true),
                (Err(e), None) => {
                    return Err(GradeError::Unavailable(format!(
                        "{} Or, as ECP manifests expect, set OPENAI_API_KEY (and OPENAI_API_BASE for another OpenAI-compatible endpoint).",
                        describe(e)
                    )))
                }
            };
            // The fallback is the runtime's own judge: the manifest's model
            // (ECP_LLM_JUDGE_MODEL, or ECP's default), as the reference asks.
            let model = if request.model_chosen || fallback {
                request.model_for(judge.kind.name())
            } else {
                judge.model.as_str()
            };
            let messages = match request.messages() {
                Value::Array(m) => m,
                other => vec![other],
            };
            // Sampled answers (temperature above 0) are asked afresh each time.
            let cache = providers.cache.as_ref().filter(|_| request.temperature == 0.0);
            let key = crate::providers::cache::key(&[
                "ecp-judge",
                judge.kind.name(),
                judge.base_url(),
                model,
                &Value::Array(messages.clone()).to_string(),
            ]);
            if let Some(c) = cache {
                if let Some(hit) = c.verdict(key).await {
                    return Ok(JudgeVerdict::from_reply(&hit.explanation));
                }
            }
            // A cached answer costs nothing; only a new question needs budget.
            if let Some(budget) = self.engine.config.budget_usd {
                if self.engine.cost_spent() >= budget {
                    return Err(GradeError::Failed(format!(
                        "the session's cost budget of ${budget} is spent; raise budget_usd to run more llm_judge checks"
                    )));
                }
            }
            let chat = Chat {
                model,
                messages,
                temperature: request.temperature,
                max_tokens: 1024,
                verdict_nonce: None,
            };
            let deadline = tokio::time::Instant::now() + self.engine.config.eval_timeout;
            let (completion, cost) = providers
                .complete(judge, &chat, deadline)
                .await
                .map_err(|e| GradeError::Failed(describe(e)))?;
            self.engine.add_cost(cost);
            let verdict = JudgeVerdict::from_reply(&completion.text);
            if let Some(c) = cache {
                let reply = crate::providers::cache::CachedVerdict {
                    score: verdict.score,
                    explanation: completion.text,
                    samples: vec![verdict.score],
                };
                c.put_verdict(key, reply).await;
            }
            Ok(verdict)
        })
    }

    fn record<'a>(&'a self, scenario: &'a str, step: usize, results: &'a [CheckResult]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let rows = results
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    // Stable across runs, so query_drift follows one check over time.
                    let name = format!("ecp/{scenario}/step{step}/{i}-{}", c.kind);
                    Row {
                        spec: SpecDigest::submitted(&name),
                        assertion_id: crate::text::clip(&name, 250),
                        assertion_type: "ecp",
                        status: match (c.status, c.passed) {
                            (Some(GradeStatus::SoftFail), _) => Status::SoftFail,
                            (Some(GradeStatus::HardFail), _) | (None, false) => Status::HardFail,
                            _ => Status::Pass,
                        },
                        score: c.score.clamp(0.0, 1.0),
                        cost: 0.0,
                    }
                })
                .collect::<Vec<Row>>();
            let kept = rows.iter().any(|r| r.status != Status::Pass).then(|| {
                Box::new(Kept {
                    trace: None,
                    details: results
                        .iter()
                        .map(|c| Detail {
                            explanation: c.reasoning.clone(),
                            trace_node_path: (!c.field.is_empty()).then(|| c.field.clone()),
                            ..Detail::default()
                        })
                        .collect(),
                })
            });
            let trace_id = format!("{}/{scenario}/{step}", self.run_id);
            if let Some(export) = self.engine.sinks.export() {
                for (row, c) in rows.iter().zip(results) {
                    export.send(attest_collect::export::Event {
                        trace_id: trace_id.clone(),
                        span_id: None,
                        name: row.assertion_id.clone(),
                        score: Some(row.score),
                        status: Some(row.status),
                        explanation: c.reasoning.clone(),
                        error_type: None,
                    });
                }
            }
            let Some(history) = &self.engine.sinks.history else {
                return;
            };
            history.record(Rows {
                trace_id,
                agent_id: None,
                rows,
                keyed: false,
                run: Some(self.engine.sinks.run()),
                kept,
                recorded_at_ms: None,
            });
        })
    }
}

/// The ECP runtime's own judge from `env`: an OpenAI-compatible endpoint
/// when `OPENAI_API_KEY` is set (the base URL from `OPENAI_API_BASE`, else
/// `OPENAI_BASE_URL`, else OpenAI's).
fn fallback_judge(env: impl Fn(&str) -> Option<String>) -> Option<Judge> {
    let key = env("OPENAI_API_KEY").filter(|k| !k.is_empty())?;
    let base = env("OPENAI_API_BASE")
        .or_else(|| env("OPENAI_BASE_URL"))
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
    Some(Judge::openai_compatible(&base, Some(key), attest_ecp::DEFAULT_JUDGE_MODEL))
}

fn describe(e: crate::providers::ProviderError) -> String {
    use crate::providers::ProviderError;
    match e {
        ProviderError::Timeout => "the judge did not answer before the deadline (--eval-timeout)".into(),
        ProviderError::Failed { message, attempts, .. } => format!("{message} (after {attempts} attempts)"),
        ProviderError::Unavailable { message, detail } => format!("{message}. {detail}"),
        e @ ProviderError::BudgetSpent { .. } => format!("{e}; raise budget_usd to run more llm_judge checks"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ecp: attest_ecp::EcpCommand,
    }

    #[test]
    fn only_run_opens_the_result_history() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("no/such/cache");
        let env = |k: &str| (k == "ATTEST_CACHE_DIR").then(|| cache.display().to_string());
        let load = || crate::config::Config::load(&crate::config::Overrides::default(), env).unwrap();
        assert!(load().history.is_some(), "the history is on by default");
        for args in [
            &["x", "init", "starter"][..],
            &["x", "validate", "m.yaml"],
            &["x", "conformance", "python3 agent.py"],
            &["x", "trend", "r-*.json"],
        ] {
            let cmd = Cli::parse_from(args).ecp;
            let config = config_for(&cmd, load());
            assert!(config.history.is_none(), "{args:?}");
            drop(Engine::new(config));
            assert!(!cache.exists(), "{args:?} created {}", cache.display());
        }
        let run = Cli::parse_from(["x", "run", "--manifest", "m.yaml"]).ecp;
        assert!(config_for(&run, load()).history.is_some());
    }
}
