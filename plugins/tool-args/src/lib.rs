//! `tool-args`: checks the arguments a tool was called with. Per argument, an
//! exact value (`equals`), a contained subset (`contains`) or a pattern
//! (`regex`), applied to the first call, to every call, or to any call.
//!
//! This module owns the config, the per-call checks and the verdict. A
//! "call" is a top-level `tool_call` or `retrieval` step with the tool's
//! name, the same notion as the engine's trace assertions.

use attest_plugin_sdk::text::{clip, quote, quote_list, render};
use attest_plugin_sdk::{json, AssertionPlugin, PluginError, PluginInfo, Step, Trace, Verdict};
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json as j, Value};
use std::collections::BTreeMap;

/// Most calls listed in a verdict's details.
const MAX_DETAILED: usize = 20;
/// Compiled-regex size cap, so a hostile pattern cannot exhaust memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

pub struct ToolArgs;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub tool: String,
    /// By argument name; a BTreeMap so checks and messages come in a stable order.
    pub expect: BTreeMap<String, Expectation>,
    #[serde(default)]
    pub call: Which,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    First,
    #[default]
    All,
    Any,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    /// `Some(Value::Null)` when the config says `"equals": null`.
    #[serde(default, deserialize_with = "present")]
    pub equals: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub contains: Option<Value>,
    #[serde(default)]
    pub regex: Option<String>,
}

/// Tells `"key": null` (expect null) apart from an absent key.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// One argument's checks, ready to run.
struct ArgCheck<'c> {
    name: &'c str,
    equals: Option<&'c Value>,
    contains: Option<&'c Value>,
    regex: Option<Regex>,
}

impl<'c> ArgCheck<'c> {
    fn compile(name: &'c str, e: &'c Expectation) -> Result<ArgCheck<'c>, PluginError> {
        if e.equals.is_none() && e.contains.is_none() && e.regex.is_none() {
            return Err(PluginError::invalid_config(format!(
                "expect.{name} has no check: give equals, contains or regex"
            )));
        }
        let regex = match &e.regex {
            None => None,
            Some(p) => Some(RegexBuilder::new(p).size_limit(REGEX_SIZE_LIMIT).build().map_err(|err| {
                PluginError::invalid_config(format!(
                    "expect.{name}.regex {} is not a valid regex: {}",
                    quote(p),
                    regex_error(&err)
                ))
            })?),
        };
        Ok(ArgCheck {
            name,
            equals: e.equals.as_ref(),
            contains: e.contains.as_ref(),
            regex,
        })
    }

    /// What this check requires, for explanations: `to equals 'a@b.c'`.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = self.equals {
            parts.push(format!("equals {}", render(v)));
        }
        if let Some(v) = self.contains {
            parts.push(format!("contains {}", render(v)));
        }
        if let Some(r) = &self.regex {
            parts.push(format!("matches /{}/", clip(r.as_str(), 80)));
        }
        format!("{} {}", self.name, parts.join(" and "))
    }

    /// The problems with one call's value of this argument (none: it holds).
    fn problems(&self, args: Option<&Value>, out: &mut Vec<String>) {
        let name = quote(self.name);
        let value = match args {
            Some(Value::Object(m)) => match m.get(self.name) {
                Some(v) => v,
                None => {
                    let keys: Vec<&String> = m.keys().collect();
                    out.push(format!("argument {name} is missing (arguments: {})", quote_list(&keys)));
                    return;
                }
            },
            Some(other) => {
                out.push(format!(
                    "args is {}, not an object, so argument {name} cannot be read",
                    json::type_name(other)
                ));
                return;
            }
            None => {
                out.push(format!("the call has no args, so argument {name} is missing"));
                return;
            }
        };
        if let Some(want) = self.equals {
            if !json::equal(value, want, 0.0) {
                out.push(format!("argument {name} is {}, expected {}", render(value), render(want)));
            }
        }
        if let Some(want) = self.contains {
            if !json::contains(value, want) {
                out.push(format!(
                    "argument {name} is {}, which does not contain {}",
                    render(value),
                    render(want)
                ));
            }
        }
        if let Some(re) = &self.regex {
            if !re.is_match(&json::text(value)) {
                out.push(format!(
                    "argument {name} is {}, which does not match /{}/",
                    render(value),
                    clip(re.as_str(), 80)
                ));
            }
        }
    }
}

/// The regex crate's syntax errors draw the pattern over several lines with
/// a caret; an error message is one line, so keep only the reason.
fn regex_error(err: &regex::Error) -> String {
    let text = err.to_string();
    match text.rsplit_once("error: ") {
        Some((_, reason)) => reason.trim().to_owned(),
        None => text.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// How one call fared.
struct CallResult {
    step: usize,
    problems: Vec<String>,
}

impl CallResult {
    fn matched(&self) -> bool {
        self.problems.is_empty()
    }

    fn summary(&self) -> String {
        self.problems.join("; ")
    }
}

impl AssertionPlugin for ToolArgs {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("tool-args", env!("CARGO_PKG_VERSION"))
            .description("Checks the arguments of a tool's calls: an exact value, a contained subset or a regex per argument, on the first, every or any call.")
            .config_schema(include_str!("../config.schema.json"))
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        if config.expect.is_empty() {
            return Err(PluginError::invalid_config("expect is empty: name at least one argument"));
        }
        let checks = config
            .expect
            .iter()
            .map(|(name, e)| ArgCheck::compile(name, e))
            .collect::<Result<Vec<_>, _>>()?;
        let tool = quote(&config.tool);
        let calls: Vec<(usize, &Step)> = trace.tool_steps().filter(|(_, s)| s.name == config.tool).collect();
        if calls.is_empty() {
            let seen = tool_names(trace);
            let actual = if seen.is_empty() {
                "no tool calls".to_owned()
            } else {
                format!("tool calls: {}", clip(&seen.join(", "), 200))
            };
            return Ok(Verdict::fail(never_called(trace, &config.tool))
                .with_evidence(format!("a call to {tool}"), actual)
                .with_path("steps")
                .with_hint(format!(
                    "Make the agent call {tool}, or correct the plugin config's tool name if the tool is called something else."
                )));
        }
        let considered = if config.call == Which::First { &calls[..1] } else { &calls[..] };
        let results: Vec<CallResult> = considered
            .iter()
            .map(|(step, s)| {
                let mut problems = Vec::new();
                for c in &checks {
                    c.problems(s.args.as_ref(), &mut problems);
                }
                CallResult { step: *step, problems }
            })
            .collect();
        let wanted: Vec<String> = checks.iter().map(ArgCheck::describe).collect();
        let wanted = wanted.join("; ");
        let n = calls.len();
        let matched = results.iter().filter(|r| r.matched()).count();
        let details = j!({
            "tool": config.tool,
            "call": config.call,
            "calls": n,
            "matched": matched,
            "results": results.iter().take(MAX_DETAILED).map(|r| j!({"step": r.step, "matched": r.matched(), "problems": r.problems})).collect::<Vec<_>>(),
        });
        let verdict = match config.call {
            Which::First => {
                let r = &results[0];
                if r.matched() {
                    Verdict::pass(format!("The first call to {tool} (step {}) matches: {wanted}.", r.step))
                } else {
                    Verdict::fail(format!(
                        "The first call to {tool} (step {}) does not match: {}.",
                        r.step,
                        r.summary()
                    ))
                }
            }
            Which::All => {
                let score = matched as f64 / n as f64;
                match results.iter().find(|r| !r.matched()) {
                    None if n == 1 => Verdict::pass(format!("The only call to {tool} (step {}) matches: {wanted}.", results[0].step)),
                    None => Verdict::pass(format!("All {n} calls to {tool} match: {wanted}.")),
                    Some(r) if n == 1 => Verdict::fail(format!(
                        "The only call to {tool} (step {}) does not match: {}.",
                        r.step,
                        r.summary()
                    )),
                    Some(r) => Verdict::fail(format!(
                        "{} of {n} calls to {tool} do not match; the first that does not (step {}): {}.",
                        n - matched,
                        r.step,
                        r.summary()
                    ))
                    .with_score(score),
                }
            }
            Which::Any => match results.iter().position(CallResult::matched) {
                Some(i) => Verdict::pass(format!(
                    "Call {} of {n} to {tool} (step {}) matches: {wanted}.",
                    i + 1,
                    results[i].step
                )),
                None if n == 1 => Verdict::fail(format!(
                    "The only call to {tool} (step {}) does not match: {}.",
                    results[0].step,
                    results[0].summary()
                )),
                None => Verdict::fail(format!(
                    "None of the {n} calls to {tool} match; the first (step {}): {}.",
                    results[0].step,
                    results[0].summary()
                )),
            },
        };
        let verdict = verdict.with_details(details);
        if verdict.is_pass() {
            return Ok(verdict);
        }
        // Evidence from the first call that fails: its arguments as the
        // checks see them, and where they are.
        let Some(r) = results.iter().find(|r| !r.matched()) else {
            return Ok(verdict);
        };
        let args = calls.iter().find(|(i, _)| *i == r.step).and_then(|(_, s)| s.args.as_ref());
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        Ok(verdict
            .with_evidence(format!("{tool} called with {wanted}"), observed(args, &names))
            .with_path(format!("steps[{}].args", r.step))
            .with_hint(format!(
                "Make the agent pass {wanted} to {tool}, or relax the plugin config's expect entries if other values are acceptable."
            )))
    }
}

/// The checked arguments of one call as they are: `to='bob@else.org', subject missing`.
fn observed(args: Option<&Value>, names: &[&str]) -> String {
    let Some(Value::Object(m)) = args else {
        return match args {
            None => "the call has no args".to_owned(),
            Some(other) => format!("args is {}", render(other)),
        };
    };
    let parts: Vec<String> = names
        .iter()
        .map(|n| match m.get(*n) {
            Some(v) => format!("{n}={}", render(v)),
            None => format!("{n} missing"),
        })
        .collect();
    clip(&parts.join(", "), 300)
}

attest_plugin_sdk::export_plugin!(ToolArgs);

/// The tools the trace calls, each once, in order of first call.
fn tool_names(trace: &Trace) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, s) in trace.tool_steps() {
        if !names.contains(&s.name.as_str()) {
            names.push(&s.name);
        }
    }
    names
}

/// Why there is no call to check, naming what the trace does have.
fn never_called(trace: &Trace, tool: &str) -> String {
    let others: Vec<&str> = trace.steps_named(tool).map(|(_, s)| s.kind.as_str()).collect();
    if let Some(kind) = others.first() {
        return format!(
            "{} was never called as a tool: the step with that name is a {kind}, and only tool_call and retrieval steps count as calls.",
            quote(tool)
        );
    }
    let names = tool_names(trace);
    if names.is_empty() {
        format!("{} was never called (the trace has no tool calls).", quote(tool))
    } else {
        format!("{} was never called (tool calls: {}).", quote(tool), quote_list(&names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing::{check_info, evaluate, readme_configs, validate_config};
    use attest_plugin_sdk::Status;
    use serde_json::json;

    fn trace() -> Value {
        json!({"schema_version": 1, "trace_id": "t",
            "steps": [
                {"type": "llm_call", "name": "plan"},
                {"type": "tool_call", "name": "send_email", "args": {"to": "ann@corp.com", "subject": "Refund R-1001", "cc": ["ops@corp.com", "audit@corp.com"], "priority": 2, "meta": {"lang": "en", "retry": true}}},
                {"type": "tool_call", "name": "lookup", "args": {"id": 7}},
                {"type": "tool_call", "name": "send_email", "args": {"to": "bob@else.org", "subject": "Hello", "cc": [], "priority": 2.0}}
            ],
            "output": {"message": "done"}})
    }

    fn run(config: Value) -> Verdict {
        evaluate::<ToolArgs>(&trace(), &config).unwrap()
    }

    #[test]
    fn readme_examples_are_valid() {
        let configs = readme_configs(include_str!("../README.md"), "tool-args");
        assert!(configs.len() >= 2, "README examples: {configs:?}");
        for c in configs {
            validate_config::<ToolArgs>(&c).unwrap_or_else(|e| panic!("{c}: {e:?}"));
            if let Err(PluginError::InvalidConfig(m)) = evaluate::<ToolArgs>(&trace(), &c) {
                panic!("{c}: {m}");
            }
        }
    }

    #[test]
    fn info_and_schema() {
        check_info::<ToolArgs>();
        validate_config::<ToolArgs>(
            &json!({"tool": "t", "expect": {"a": {"equals": null}, "b": {"regex": "x", "contains": [1]}}, "call": "any"}),
        )
        .unwrap();
        for bad in [
            json!({"tool": "t"}),
            json!({"tool": "t", "expect": {}}),
            json!({"tool": "t", "expect": {"a": {}}}),
            json!({"tool": "t", "expect": {"a": {"startswith": "x"}}}),
            json!({"tool": "t", "expect": {"a": {"equals": 1}}, "call": "last"}),
        ] {
            assert!(validate_config::<ToolArgs>(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn first_call_equals() {
        let v =
            run(json!({"tool": "send_email", "expect": {"to": {"equals": "ann@corp.com"}, "priority": {"equals": 2}}, "call": "first"}));
        assert!(v.is_pass(), "{}", v.explanation());
        assert_eq!(
            v.explanation(),
            "The first call to 'send_email' (step 1) matches: priority equals 2; to equals 'ann@corp.com'."
        );
    }

    #[test]
    fn failures_carry_evidence_for_the_result_fields() {
        let v = run(json!({"tool": "send_email", "expect": {"subject": {"equals": "Refund R-1001"}, "to": {"regex": "@corp\\.com$"}}}));
        assert!(!v.is_pass());
        let d = v.details_value().unwrap();
        assert_eq!(
            d["expected"],
            "'send_email' called with subject equals 'Refund R-1001'; to matches /@corp\\.com$/"
        );
        assert_eq!(d["actual"], "subject='Hello', to='bob@else.org'");
        assert_eq!(d["path"], "steps[3].args");
        assert!(d["hint"].as_str().unwrap().starts_with("Make the agent pass subject equals"), "{d}");
        assert_eq!(d["calls"], 2, "the plugin's own details stay: {d}");

        let never = run(json!({"tool": "refund", "expect": {"id": {"equals": 1}}}));
        let d = never.details_value().unwrap();
        assert_eq!(
            (d["expected"].as_str(), d["actual"].as_str()),
            (Some("a call to 'refund'"), Some("tool calls: send_email, lookup"))
        );
        assert_eq!(
            run(json!({"tool": "lookup", "expect": {"id": {"equals": 7}}}))
                .details_value()
                .unwrap()
                .get("expected"),
            None
        );
    }

    #[test]
    fn all_calls_must_match_by_default() {
        let v = run(json!({"tool": "send_email", "expect": {"to": {"regex": "@corp\\.com$"}}}));
        assert_eq!(v.status(), Status::Fail);
        assert_eq!(
            v.explanation(),
            "1 of 2 calls to 'send_email' do not match; the first that does not (step 3): argument 'to' is 'bob@else.org', which does not match /@corp\\.com$/."
        );
        assert_eq!(v.score(), 0.5);
        let d = v.details_value().unwrap();
        assert_eq!((d["calls"].clone(), d["matched"].clone()), (json!(2), json!(1)));
        assert_eq!(d["results"][1]["step"], 3);

        let v = run(json!({"tool": "send_email", "expect": {"priority": {"equals": 2}}}));
        assert_eq!(v.explanation(), "All 2 calls to 'send_email' match: priority equals 2.");
    }

    #[test]
    fn any_call_may_match() {
        let v = run(json!({"tool": "send_email", "expect": {"subject": {"regex": "(?i)^hello$"}}, "call": "any"}));
        assert_eq!(
            v.explanation(),
            "Call 2 of 2 to 'send_email' (step 3) matches: subject matches /(?i)^hello$/."
        );
        let v = run(json!({"tool": "send_email", "expect": {"subject": {"equals": "Bye"}}, "call": "any"}));
        assert_eq!(v.status(), Status::Fail);
        assert!(v.explanation().starts_with(
            "None of the 2 calls to 'send_email' match; the first (step 1): argument 'subject' is 'Refund R-1001', expected 'Bye'."
        ));
    }

    #[test]
    fn contains_on_objects_arrays_and_strings() {
        let pass = run(json!({"tool": "send_email", "call": "first", "expect": {
            "meta": {"contains": {"lang": "en"}}, "cc": {"contains": ["audit@corp.com"]}, "subject": {"contains": "R-1001"}}}));
        assert!(pass.is_pass(), "{}", pass.explanation());
        let fail = run(json!({"tool": "send_email", "call": "first", "expect": {"meta": {"contains": {"lang": "fr"}}}}));
        assert_eq!(
            fail.explanation(),
            r#"The first call to 'send_email' (step 1) does not match: argument 'meta' is {"lang":"en","retry":true}, which does not contain {"lang":"fr"}."#
        );
    }

    #[test]
    fn several_checks_on_one_argument_all_hold() {
        let v = run(json!({"tool": "send_email", "call": "first", "expect": {"to": {"contains": "ann", "regex": "org$"}}}));
        assert!(
            v.explanation()
                .ends_with("argument 'to' is 'ann@corp.com', which does not match /org$/."),
            "{}",
            v.explanation()
        );
    }

    #[test]
    fn missing_arguments_and_calls() {
        let v = run(json!({"tool": "send_email", "expect": {"bcc": {"equals": null}}, "call": "first"}));
        assert!(
            v.explanation()
                .contains("argument 'bcc' is missing (arguments: ['cc', 'meta', 'priority', 'subject', 'to'])"),
            "{}",
            v.explanation()
        );
        let v = run(json!({"tool": "refund", "expect": {"id": {"equals": 1}}}));
        assert_eq!(v.status(), Status::Fail);
        assert_eq!(v.explanation(), "'refund' was never called (tool calls: ['send_email', 'lookup']).");
        let v = run(json!({"tool": "plan", "expect": {"id": {"equals": 1}}}));
        assert!(
            v.explanation().contains("the step with that name is a llm_call"),
            "{}",
            v.explanation()
        );
    }

    #[test]
    fn null_is_a_value() {
        let t = json!({"schema_version": 1, "trace_id": "t", "output": {"m": 1},
            "steps": [{"type": "tool_call", "name": "f", "args": {"x": null}}]});
        assert!(evaluate::<ToolArgs>(&t, &json!({"tool": "f", "expect": {"x": {"equals": null}}}))
            .unwrap()
            .is_pass());
        assert!(!evaluate::<ToolArgs>(&t, &json!({"tool": "f", "expect": {"x": {"equals": 0}}}))
            .unwrap()
            .is_pass());
    }

    #[test]
    fn config_errors_are_invalid_config() {
        for (config, expect) in [
            (
                json!({"tool": "send_email", "expect": {"to": {"regex": "("}}}),
                "expect.to.regex '(' is not a valid regex: unclosed group",
            ),
            (
                json!({"tool": "send_email", "expect": {"to": {"regex": "a{99999}{99999}"}}}),
                "exceeds size limit",
            ),
            (json!({"tool": "send_email", "expect": {"to": {}}}), "expect.to has no check"),
            (json!({"tool": "send_email", "expect": {}}), "expect is empty"),
            (
                json!({"tool": "send_email", "expect": {"to": {"equals": 1}}, "call": "last"}),
                "unknown variant `last`",
            ),
        ] {
            match evaluate::<ToolArgs>(&trace(), &config) {
                Err(PluginError::InvalidConfig(m)) => assert!(m.contains(expect), "{m}"),
                other => panic!("{config}: {other:?}"),
            }
        }
    }
}
