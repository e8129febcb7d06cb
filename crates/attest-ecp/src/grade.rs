//! Graders: turning one agent step result into checks. The built-in graders
//! give the same verdicts as the reference ECP runtime on the same step:
//! `text_match` is case- and whitespace-sensitive substring/equality, an empty
//! text fails every condition, `regex` is an unanchored search; `tool_usage`
//! matches a name exactly and arguments as a subset with Python equality
//! (`1 == 1.0 == true`).

use serde_json::{Map, Value};

use crate::host::{CheckResult, GradeError, GradeStatus, GradingHost, JudgeRequest};
use crate::manifest::{AttestScope, Field, Grader, Step, TextCondition};
use crate::trace;
use crate::util::clip;

/// The agent's own status for a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStatus {
    Done,
    /// The agent stopped to wait (e.g. for approval). Graded like `done`.
    Paused,
}

impl AgentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Done => "done",
            AgentStatus::Paused => "paused",
        }
    }
}

/// A validated `agent/step` result.
#[derive(Debug, Clone)]
pub struct StepResult {
    pub status: AgentStatus,
    pub public_output: Option<String>,
    /// `evaluation_context`, or the deprecated `private_thought` when the former is empty.
    pub evaluation_context: Option<String>,
    /// `private_thought`, or `evaluation_context` when the former is empty.
    pub private_thought: Option<String>,
    pub logs: Option<String>,
    pub tool_calls: Vec<Map<String, Value>>,
    pub usage: Option<Map<String, Value>>,
}

fn non_empty(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string)
}

impl StepResult {
    /// Validate a raw `agent/step` result against the protocol contract.
    pub fn from_wire(result: &Value) -> Result<StepResult, String> {
        let Some(obj) = result.as_object() else {
            return Err("agent/step result must be an object".into());
        };
        let status = match obj.get("status").and_then(Value::as_str) {
            Some("done") => AgentStatus::Done,
            Some("paused") => AgentStatus::Paused,
            _ => {
                return Err(format!(
                    "agent/step result status must be one of: done, paused (got {})",
                    clip_value(obj.get("status"))
                ))
            }
        };
        for f in ["public_output", "evaluation_context", "private_thought", "logs"] {
            match obj.get(f) {
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(other) => {
                    return Err(format!(
                        "agent/step result {f} must be a string or null (got {})",
                        clip_value(Some(other))
                    ))
                }
            }
        }
        let mut tool_calls = Vec::new();
        match obj.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for (i, c) in calls.iter().enumerate() {
                    let Some(c) = c.as_object() else {
                        return Err(format!("agent/step result tool_calls[{i}] must be an object"));
                    };
                    if c.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
                        return Err(format!("agent/step result tool_calls[{i}].name must be a non-empty string"));
                    }
                    if c.get("arguments").is_some_and(|a| !a.is_object()) {
                        return Err(format!("agent/step result tool_calls[{i}].arguments must be an object"));
                    }
                    tool_calls.push(c.clone());
                }
            }
            Some(_) => return Err("agent/step result tool_calls must be an array or null".into()),
        }
        let usage = match obj.get("usage") {
            None | Some(Value::Null) => None,
            Some(Value::Object(u)) => {
                for f in ["input_tokens", "output_tokens", "total_tokens"] {
                    match u.get(f) {
                        None | Some(Value::Null) => {}
                        Some(Value::Number(n)) if n.is_u64() => {}
                        Some(Value::Number(n)) if n.is_i64() => return Err(format!("agent/step result usage.{f} must not be negative")),
                        Some(_) => return Err(format!("agent/step result usage.{f} must be an integer or null")),
                    }
                }
                Some(u.clone())
            }
            Some(_) => return Err("agent/step result usage must be an object or null".into()),
        };
        let ec = non_empty(obj.get("evaluation_context"));
        let pt = non_empty(obj.get("private_thought"));
        Ok(StepResult {
            status,
            public_output: obj.get("public_output").and_then(Value::as_str).map(str::to_string),
            evaluation_context: ec.clone().or_else(|| pt.clone()),
            private_thought: pt.or(ec),
            logs: obj.get("logs").and_then(Value::as_str).map(str::to_string),
            tool_calls,
            usage,
        })
    }

    /// The text a grader on `field` reads ("" when absent).
    pub fn text(&self, field: Field) -> &str {
        let t = match field {
            Field::PublicOutput => &self.public_output,
            Field::EvaluationContext => &self.evaluation_context,
            Field::PrivateThought => &self.private_thought,
        };
        t.as_deref().unwrap_or("")
    }
}

fn clip_value(v: Option<&Value>) -> String {
    v.map(|v| clip(&v.to_string(), 200)).unwrap_or_else(|| "nothing".into())
}

/// One graded turn of a scenario, kept for transcript-scoped graders.
#[derive(Debug, Clone)]
pub struct Turn {
    pub input: String,
    pub result: StepResult,
    pub duration_ms: f64,
}

/// `pattern` is the pattern as written and its compiled form.
pub fn check_text_match(
    condition: TextCondition,
    value: Option<&str>,
    pattern: Option<&(String, fancy_regex::Regex)>,
    text: &str,
) -> (bool, String) {
    if text.is_empty() {
        return (false, "the text is empty".into());
    }
    let value = value.unwrap_or("");
    let shown = clip(value, 200);
    match condition {
        TextCondition::Contains => {
            let ok = text.contains(value);
            (
                ok,
                if ok {
                    format!("contains '{shown}'")
                } else {
                    format!("does not contain '{shown}'")
                },
            )
        }
        TextCondition::Equals => {
            let ok = text == value;
            (
                ok,
                if ok {
                    format!("equals '{shown}'")
                } else {
                    format!("expected exactly '{shown}', got '{}'", clip(text, 200))
                },
            )
        }
        TextCondition::DoesNotContain => {
            let ok = !text.contains(value);
            (
                ok,
                if ok {
                    format!("does not contain '{shown}'")
                } else {
                    format!("contains '{shown}', which it must not")
                },
            )
        }
        TextCondition::Regex => {
            let Some((written, re)) = pattern else {
                return (false, "no pattern given".into());
            };
            regex_verdict(re.is_match(text), written)
        }
    }
}

/// Equality as Python compares decoded JSON: numbers by value across
/// int/float, booleans equal to 0/1, containers element-wise.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    fn num(v: &Value) -> Option<Value> {
        match v {
            Value::Bool(b) => Some(Value::from(u8::from(*b))),
            Value::Number(_) => Some(v.clone()),
            _ => None,
        }
    }
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w))),
        _ => match (num(a), num(b)) {
            (Some(Value::Number(x)), Some(Value::Number(y))) => {
                if let (Some(p), Some(q)) = (
                    x.as_i64().map(i128::from).or(x.as_u64().map(i128::from)),
                    y.as_i64().map(i128::from).or(y.as_u64().map(i128::from)),
                ) {
                    p == q
                } else {
                    x.as_f64() == y.as_f64()
                }
            }
            _ => false,
        },
    }
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
    }
}

/// The name a tool call reports: `name`, else `tool`, else `id`.
fn call_name(call: &Map<String, Value>) -> Value {
    for k in ["name", "tool", "id"] {
        if truthy(call.get(k)) {
            return call[k].clone();
        }
    }
    Value::Null
}

pub fn check_tool_usage(tool_name: Option<&str>, expected: &Map<String, Value>, calls: &[Map<String, Value>]) -> (bool, String) {
    if calls.is_empty() {
        return (false, "the agent reported no tool calls".into());
    }
    let want_name = tool_name.filter(|n| !n.is_empty());
    let empty = Map::new();
    for call in calls {
        let name = call_name(call);
        if let Some(n) = want_name {
            if name.as_str() != Some(n) {
                continue;
            }
        }
        let args = ["arguments", "args"]
            .iter()
            .find(|k| truthy(call.get(**k)))
            .and_then(|k| call[*k].as_object())
            .unwrap_or(&empty);
        if expected.iter().all(|(k, v)| args.get(k).is_some_and(|a| py_eq(a, v))) {
            return (true, format!("found a call to {} with the expected arguments", name));
        }
    }
    let seen: Vec<String> = calls.iter().map(|c| call_name(c).to_string()).collect();
    let mut reason = "no matching tool call".to_string();
    if let Some(n) = want_name {
        reason.push_str(&format!(" named '{n}'"));
    }
    if !expected.is_empty() {
        reason.push_str(&format!(
            " with arguments {}",
            clip(&Value::Object(expected.clone()).to_string(), 300)
        ));
    }
    reason.push_str(&format!("; calls seen: [{}]", clip(&seen.join(", "), 300)));
    (false, reason)
}

/// Identifies the trace a step's `attest` graders see.
#[derive(Debug, Clone)]
pub struct TraceContext<'a> {
    pub run_id: &'a str,
    pub agent_name: Option<&'a str>,
    pub scenario_index: usize,
}

/// A `regex` text_match's outcome and its reason.
fn regex_verdict(found: Result<bool, fancy_regex::Error>, written: &str) -> (bool, String) {
    match found {
        Ok(true) => (true, format!("matches /{written}/")),
        Ok(false) => (false, format!("no match for /{written}/")),
        Err(e) => (false, format!("regex /{written}/ could not be evaluated: {e}")),
    }
}

/// Texts up to this size are matched on the grading thread: even a pattern
/// whose lookarounds make matching quadratic finishes in milliseconds.
const INLINE_REGEX_TEXT: usize = 4 * 1024;
/// Regex matches running on their own threads at once, abandoned ones
/// included; past it a regex check fails at once rather than pile up more.
const MAX_REGEX_THREADS: usize = 4;
/// Backtracking steps a match on its own thread may take: some seconds of
/// work at most, so that an abandoned match still ends.
const LONG_TEXT_BACKTRACK_LIMIT: usize = 200_000_000;
static REGEX_THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A `regex` text_match within `deadline`. Lookarounds and backreferences
/// (Python `re` syntax) need a backtracking matcher, whose time on a long
/// agent answer can grow with the square of its length and cannot be
/// interrupted: past a few KiB the match runs on a thread of its own, and
/// at the deadline the check fails and the thread is left to finish (it
/// ends with the process).
async fn regex_within(written: &str, re: &fancy_regex::Regex, text: &str, deadline: std::time::Instant) -> (bool, String) {
    use std::sync::atomic::Ordering;
    if text.len() <= INLINE_REGEX_TEXT {
        return regex_verdict(re.is_match(text), written);
    }
    if REGEX_THREADS.fetch_add(1, Ordering::AcqRel) >= MAX_REGEX_THREADS {
        REGEX_THREADS.fetch_sub(1, Ordering::AcqRel);
        return (
            false,
            format!("regex /{written}/ not evaluated: {MAX_REGEX_THREADS} earlier matches ran past their deadline and are still running"),
        );
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let len = text.len();
    let (re, text) = (re.clone(), text.to_owned());
    let spawned = std::thread::Builder::new().name("ecp-regex".into()).spawn(move || {
        // The matcher's default bound on backtracking (a million steps) is
        // for texts matched inline; a long answer needs more steps for an
        // ordinary lookaround, and here the deadline bounds the wait.
        let long = fancy_regex::RegexBuilder::new(re.as_str())
            .backtrack_limit(LONG_TEXT_BACKTRACK_LIMIT)
            .build();
        let _ = tx.send(long.as_ref().unwrap_or(&re).is_match(&text));
        REGEX_THREADS.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        REGEX_THREADS.fetch_sub(1, Ordering::AcqRel);
        return (false, format!("regex /{written}/ not evaluated: no thread for it ({e})"));
    }
    match tokio::time::timeout_at(deadline.into(), rx).await {
        Ok(Ok(found)) => regex_verdict(found, written),
        Ok(Err(_)) => (false, format!("regex /{written}/ could not be evaluated: its matcher stopped")),
        Err(_) => (
            false,
            format!(
                "regex /{written}/ did not finish matching {} bytes before the grading deadline (--timeout, or what --max-duration leaves); simplify the pattern (lookarounds over long text are slow) or shorten the answer",
                len
            ),
        ),
    }
}

/// `call`, cut short when the run's `--max-duration` runs out (`None`).
/// A model call has its own timeout besides (the judge's client, the
/// engine's providers), so `--timeout`, which bounds agent calls, does not
/// bound it.
async fn within_run<F: std::future::Future>(run_deadline: Option<std::time::Instant>, call: F) -> Option<F::Output> {
    match run_deadline {
        Some(d) => tokio::time::timeout_at(d.into(), call).await.ok(),
        None => Some(call.await),
    }
}

/// A grader's call cut short by the run's budget.
fn past_deadline(what: &str, started: std::time::Instant) -> String {
    format!(
        "{what} before --max-duration ran out ({:.1} s into grading)",
        started.elapsed().as_secs_f64()
    )
}

/// Grade one step, regex checks within `deadline`. `turns` holds every
/// graded turn of the scenario so far, the current one last.
pub async fn grade_step(
    host: &dyn GradingHost,
    step: &Step,
    turns: &[Turn],
    ctx: &TraceContext<'_>,
    deadline: std::time::Instant,
    run_deadline: Option<std::time::Instant>,
) -> Vec<CheckResult> {
    let Some(current) = turns.last() else { return Vec::new() };
    let started = std::time::Instant::now();
    let result = &current.result;
    let mut checks = Vec::with_capacity(step.graders.len());
    for (gi, grader) in step.graders.iter().enumerate() {
        let kind = grader.type_name().to_string();
        let field = grader.field_name().to_string();
        let check = |passed: bool, reasoning: String| CheckResult {
            kind: kind.clone(),
            field: field.clone(),
            passed,
            score: if passed { 1.0 } else { 0.0 },
            reasoning,
            status: None,
        };
        let c = match grader {
            Grader::TextMatch {
                field,
                condition,
                value,
                pattern,
            } => {
                let text = result.text(*field);
                let (ok, why) = match (condition, pattern) {
                    (TextCondition::Regex, Some((written, re))) if !text.is_empty() => regex_within(written, re, text, deadline).await,
                    _ => check_text_match(*condition, value.as_deref(), pattern.as_ref(), text),
                };
                check(ok, why)
            }
            Grader::ToolUsage { tool_name, arguments } => {
                let (ok, why) = check_tool_usage(tool_name.as_deref(), arguments, &result.tool_calls);
                check(ok, why)
            }
            Grader::LlmJudge { field, prompt, .. } => {
                let asked = host.judge(JudgeRequest::new(*field, result.text(*field), prompt));
                match within_run(run_deadline, asked).await {
                    Some(Ok(v)) => CheckResult {
                        score: v.score,
                        ..check(v.passed, v.reasoning)
                    },
                    Some(Err(e)) => check(false, format!("LLM judge error: {e}")),
                    None => check(false, past_deadline("the LLM judge did not answer", started)),
                }
            }
            Grader::Attest { field, scope, assertion } => {
                let span = match scope {
                    AttestScope::Step => std::slice::from_ref(current),
                    AttestScope::Transcript => turns,
                };
                let trace = trace::build(span, *field, ctx, turns.len());
                let mut assertion = assertion.clone();
                if let Some(obj) = assertion.as_object_mut() {
                    obj.entry("assertion_id")
                        .or_insert_with(|| Value::from(format!("ecp_s{}_t{}_g{}", ctx.scenario_index + 1, turns.len(), gi + 1)));
                }
                let evaluated = match within_run(run_deadline, host.attest(&trace, &assertion)).await {
                    Some(evaluated) => evaluated,
                    None => Err(GradeError::Failed(past_deadline("the evaluation did not finish", started))),
                };
                match evaluated {
                    Ok(o) => CheckResult {
                        kind: kind.clone(),
                        field: field.as_str().to_string(),
                        // A soft failure is a warning in Attest: it does not fail the check.
                        passed: o.status != GradeStatus::HardFail,
                        score: o.score,
                        reasoning: if o.status == GradeStatus::SoftFail {
                            format!("soft failure: {}", o.explanation)
                        } else {
                            o.explanation
                        },
                        status: Some(o.status),
                    },
                    Err(GradeError::Unavailable(e)) => check(false, format!("attest grader unavailable: {e}")),
                    Err(GradeError::Failed(e)) => check(false, format!("attest grader error: {e}")),
                }
            }
        };
        checks.push(c);
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn re(p: &str) -> (String, fancy_regex::Regex) {
        (
            p.to_string(),
            fancy_regex::Regex::new(&crate::python_regex::python_regex(p).unwrap()).unwrap(),
        )
    }

    #[test]
    fn text_match_is_exact_and_empty_text_fails() {
        use TextCondition::*;
        assert!(check_text_match(Contains, Some("Paris"), None, "in Paris.").0);
        assert!(!check_text_match(Contains, Some("paris"), None, "in Paris.").0);
        assert!(!check_text_match(Equals, Some("hi"), None, "hi ").0);
        assert!(
            !check_text_match(DoesNotContain, Some("x"), None, "").0,
            "empty text fails even does_not_contain"
        );
        assert!(check_text_match(Regex, None, Some(&re(r"\d{2}")), "a 42").0);
        assert!(
            check_text_match(Regex, None, Some(&re(r"(?<=a )\d")), "a 42").0,
            "lookbehind as in Python re"
        );
        assert!(!check_text_match(Regex, None, Some(&re(r"^42")), "a 42").0);
    }

    #[tokio::test]
    async fn a_slow_regex_fails_its_check_at_the_deadline() {
        use std::time::{Duration, Instant};
        // Lookaheads over a long text: quadratic, seconds of matching.
        let slow = re(r"(?=.*refund)(?=.*approved)");
        let text = "a".repeat(64 * 1024);
        let t0 = Instant::now();
        let (ok, why) = regex_within(&slow.0, &slow.1, &text, t0 + Duration::from_millis(100)).await;
        assert!(
            !ok && why.contains("did not finish matching 65536 bytes before the grading deadline"),
            "{why}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "waited {:?}", t0.elapsed());
        // A fast pattern over the same text still answers.
        let fast = re(r"a{3}$");
        let (ok, why) = regex_within(&fast.0, &fast.1, &text, Instant::now() + Duration::from_secs(10)).await;
        assert!(ok, "{why}");
    }

    #[tokio::test]
    async fn a_lookbehind_over_a_long_answer_is_not_cut_by_the_inline_backtracking_bound() {
        use std::time::{Duration, Instant};
        let text = format!("{}approved", "word ".repeat(200_000));
        let lb = re(r"(?<!not )approved");
        assert!(lb.1.is_match(&text).is_err(), "the default bound is too small for this answer");
        let (ok, why) = regex_within(&lb.0, &lb.1, &text, Instant::now() + Duration::from_secs(60)).await;
        assert!(ok, "{why}");
    }

    #[test]
    fn python_equality() {
        assert!(py_eq(&json!(1), &json!(1.0)));
        assert!(py_eq(&json!(true), &json!(1)));
        assert!(!py_eq(&json!("1"), &json!(1)));
        assert!(py_eq(&json!({"a": [1, 2.0]}), &json!({"a": [1.0, 2]})));
        assert!(!py_eq(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
    }

    #[test]
    fn tool_usage_subset_semantics() {
        let calls: Vec<Map<String, Value>> = vec![
            json!({"name": "search", "arguments": {"q": "x", "n": 3}})
                .as_object()
                .unwrap()
                .clone(),
            json!({"name": "calc", "arguments": {}, "args": {"e": "2+2"}})
                .as_object()
                .unwrap()
                .clone(),
        ];
        let args = |v: Value| v.as_object().unwrap().clone();
        assert!(check_tool_usage(Some("search"), &args(json!({"n": 3.0})), &calls).0);
        assert!(!check_tool_usage(Some("search"), &args(json!({"n": "3"})), &calls).0);
        assert!(
            check_tool_usage(None, &args(json!({"e": "2+2"})), &calls).0,
            "empty arguments fall back to args"
        );
        assert!(check_tool_usage(Some(""), &Map::new(), &calls).0);
        let (ok, why) = check_tool_usage(Some("missing"), &Map::new(), &calls);
        assert!(!ok && why.contains("\"search\""), "{why}");
        assert!(!check_tool_usage(None, &Map::new(), &[]).0);
    }

    #[test]
    fn step_result_contract_and_alias() {
        let r = StepResult::from_wire(&json!({"status": "paused", "public_output": "o", "private_thought": "p"})).unwrap();
        assert_eq!(r.status, AgentStatus::Paused);
        assert_eq!(r.text(Field::EvaluationContext), "p");
        let r = StepResult::from_wire(&json!({"status": "done", "evaluation_context": "", "private_thought": "p"})).unwrap();
        assert_eq!(r.text(Field::EvaluationContext), "p");
        assert!(StepResult::from_wire(&json!({"status": "finished"}))
            .unwrap_err()
            .contains("done, paused"));
        assert!(StepResult::from_wire(&json!({"status": "done", "usage": {"input_tokens": -1}})).is_err());
        assert!(StepResult::from_wire(&json!({"status": "done", "tool_calls": [{"name": ""}]})).is_err());
    }
}
