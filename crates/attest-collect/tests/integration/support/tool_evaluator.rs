//! A small evaluator for the integration tests only: it checks tool names and
//! output text of Attest traces so the collector's plumbing can be tested
//! without the engine. Not a product feature; the engine plugs its own layers in.

use std::sync::Arc;
use std::time::Duration;

use attest_collect::{AssertionOutcome, BoxFuture, CompiledRule, RuleError, RuleFailure, Status, TraceEvaluator};
use serde_json::Value;

pub struct ToolEvaluator {
    /// Sleep before each evaluation (makes evaluations slow enough to crash mid-batch).
    pub delay: Duration,
    /// Traces whose evaluation fails with a retryable error (exercises redelivery limits).
    pub fail_trace: Option<String>,
}

enum Check {
    RequiredTools(Vec<String>),
    OutputContains(String),
}

struct ToolSuite {
    checks: Vec<(String, &'static str, Check)>,
    delay: Duration,
    fail_trace: Option<String>,
}

impl TraceEvaluator for ToolEvaluator {
    fn compile(&self, _rule: &str, assertions: &[Value]) -> Result<Arc<dyn CompiledRule>, RuleError> {
        let mut checks = Vec::new();
        for (i, a) in assertions.iter().enumerate() {
            let id = a["assertion_id"].as_str().ok_or_else(|| RuleError {
                field: format!("assertions[{i}].assertion_id"),
                message: "missing".into(),
                valid_choices: vec![],
            })?;
            let check = match (a["type"].as_str(), a["spec"]["check"].as_str()) {
                (Some("trace"), Some("required_tools")) => Check::RequiredTools(
                    a["spec"]["tools"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|t| t.as_str().map(String::from))
                        .collect(),
                ),
                (Some("content"), Some("contains")) => Check::OutputContains(a["spec"]["value"].as_str().unwrap_or("").to_string()),
                (Some("trace") | Some("content"), _) => {
                    return Err(RuleError {
                        field: format!("assertions[{i}].spec.check"),
                        message: "not supported by the test evaluator".into(),
                        valid_choices: vec!["required_tools".into(), "contains".into()],
                    })
                }
                _ => {
                    return Err(RuleError {
                        field: format!("assertions[{i}].type"),
                        message: format!("unknown assertion type {}", a["type"]),
                        valid_choices: vec!["trace".into(), "content".into()],
                    })
                }
            };
            let ty = if matches!(check, Check::RequiredTools(_)) {
                "trace"
            } else {
                "content"
            };
            checks.push((id.to_string(), ty, check));
        }
        Ok(Arc::new(ToolSuite {
            checks,
            delay: self.delay,
            fail_trace: self.fail_trace.clone(),
        }))
    }
}

fn tool_names(trace: &Value, out: &mut Vec<String>) {
    for step in trace["steps"].as_array().into_iter().flatten() {
        if step["type"] == "tool_call" {
            out.push(step["name"].as_str().unwrap_or("").to_string());
        }
        if step["type"] == "agent_call" {
            tool_names(&step["sub_trace"], out);
        }
    }
}

impl CompiledRule for ToolSuite {
    fn evaluate<'a>(&'a self, trace: &'a str) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>> {
        Box::pin(async move {
            let trace: Value = serde_json::from_str(trace).unwrap_or_default();
            let trace = &trace;
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if self.fail_trace.as_deref().is_some_and(|t| trace["trace_id"] == t) {
                return Err(RuleFailure {
                    message: "test evaluator: provider unavailable".into(),
                    retryable: true,
                    trace_refused: false,
                    error_type: Some("PROVIDER_ERROR".into()),
                });
            }
            let mut used = Vec::new();
            tool_names(trace, &mut used);
            let output = trace["output"]["message"].as_str().unwrap_or("");
            Ok(self
                .checks
                .iter()
                .map(|(id, ty, check)| {
                    let (pass, explanation) = match check {
                        Check::RequiredTools(tools) => {
                            let missing: Vec<_> = tools.iter().filter(|t| !used.contains(t)).collect();
                            (missing.is_empty(), format!("tools used {used:?}; missing {missing:?}"))
                        }
                        Check::OutputContains(v) => (
                            output.contains(v.as_str()),
                            format!("output contains {v:?}: {}", output.contains(v.as_str())),
                        ),
                    };
                    AssertionOutcome {
                        assertion_id: id.clone(),
                        assertion_type: ty.to_string(),
                        status: if pass { Status::Pass } else { Status::HardFail },
                        score: if pass { 1.0 } else { 0.0 },
                        explanation,
                        cost_usd: 0.0,
                        duration_ms: 0,
                        trace_node_path: None,
                    }
                })
                .collect())
        })
    }
}
