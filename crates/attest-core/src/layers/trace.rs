//! Layer 3: structural checks on the sequence of tool calls.
//!
//! "Tools" are `tool_call` and `retrieval` steps of the top-level trace; LLM
//! calls and delegations are not tool calls, so a repeated `llm_call` name is
//! not a duplicate and does not interrupt an exact order. Step numbers in
//! explanations are 0-based indexes into `steps`.

use super::{Evidence, Spec, SpecError, Verdict};
use crate::text::{clip, quote, quote_list};
use crate::trace::Trace;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The first sub-agent below `trace` (depth first) that called `tool`, and
/// the path of its sub-trace.
fn called_below(trace: &Trace, tool: &str) -> Option<(String, String)> {
    fn walk(t: &Trace, tool: &str, path: &str, depth: usize) -> Option<(String, String)> {
        if depth > 8 {
            return None;
        }
        t.steps.iter().enumerate().find_map(|(i, s)| {
            let sub = s.sub_trace.as_deref()?;
            let here = format!("{path}.steps[{i}].sub_trace");
            if sub.tool_steps().any(|(_, c)| c.name == tool) {
                let agent = sub.agent_id.clone().unwrap_or_else(|| s.name.clone());
                return Some((agent, here));
            }
            walk(sub, tool, &here, depth + 1)
        })
    }
    walk(trace, tool, "trace", 0)
}

#[derive(Debug, Clone, PartialEq)]
pub enum TraceCheck {
    /// The tools appear in this order, gaps allowed.
    ContainsInOrder(Vec<String>),
    /// The tools appear as a contiguous run of tool calls.
    ExactOrder(Vec<String>),
    /// `tool` is called at most `max` times.
    LoopDetection {
        tool: String,
        max: u64,
    },
    /// No tool is called twice.
    NoDuplicates,
    RequiredTools(Vec<String>),
    ForbiddenTools(Vec<String>),
    /// Every consecutive pair of tool calls is an allowed transition
    /// (the protocol's `transitions` field).
    FollowsTransitions(Vec<(String, String)>),
}

#[derive(Clone, Copy)]
enum Kind {
    ContainsInOrder,
    ExactOrder,
    LoopDetection,
    NoDuplicates,
    RequiredTools,
    ForbiddenTools,
    FollowsTransitions,
}

const CHECKS: &[(&str, Kind)] = &[
    ("contains_in_order", Kind::ContainsInOrder),
    ("exact_order", Kind::ExactOrder),
    ("loop_detection", Kind::LoopDetection),
    ("no_duplicates", Kind::NoDuplicates),
    ("required_tools", Kind::RequiredTools),
    ("forbidden_tools", Kind::ForbiddenTools),
    ("follows_transitions", Kind::FollowsTransitions),
];

impl TraceCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<TraceCheck, SpecError> {
        Ok(match spec.choice("check", CHECKS)? {
            Kind::ContainsInOrder => TraceCheck::ContainsInOrder(spec.str_list("tools")?),
            Kind::ExactOrder => TraceCheck::ExactOrder(spec.str_list("tools")?),
            Kind::LoopDetection => TraceCheck::LoopDetection {
                tool: spec.str("tool")?.to_owned(),
                max: spec.count("max_repetitions")?,
            },
            Kind::NoDuplicates => TraceCheck::NoDuplicates,
            Kind::RequiredTools => TraceCheck::RequiredTools(spec.str_list("tools")?),
            Kind::ForbiddenTools => TraceCheck::ForbiddenTools(spec.str_list("tools")?),
            Kind::FollowsTransitions => TraceCheck::FollowsTransitions(transitions(spec)?),
        })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let calls: Vec<(usize, &str)> = trace.tool_steps().map(|(i, s)| (i, s.name.as_str())).collect();
        let names: Vec<&str> = calls.iter().map(|(_, n)| *n).collect();
        self.decide(&calls, &names).on_failure(|| self.evidence(trace, &calls, &names))
    }

    /// Expected tools and the observed sequence, for a failed check; the
    /// path names the offending step when one call is at fault.
    fn evidence(&self, trace: &Trace, calls: &[(usize, &str)], names: &[&str]) -> Evidence {
        // A tool this trace never called may have been called by a sub-agent:
        // then the agent works, and the check is in the wrong place.
        let not_called = |tool: &str| {
            match called_below(trace, tool) {
            Some((agent, path)) => format!(
                "`{tool}` was not called by this agent but by its sub-agent {} (at {path}): layer 3 checks the trace's own steps; check the whole tree with layer 7 (trace_tree, check all_tools_called), or match a rule on that agent.",
                quote(&agent)
            ),
            None => format!("`{tool}` was never called: make the agent call it, or drop it from spec.tools."),
        }
        };
        let arrow = |tools: &[&str]| {
            if tools.is_empty() {
                "(no tool calls)".to_owned()
            } else {
                tools.join(" → ")
            }
        };
        fn owned(tools: &[String]) -> Vec<&str> {
            tools.iter().map(String::as_str).collect()
        }
        let observed = format!("tool calls: {}", clip(&arrow(names), 400));
        // The position among the tool calls of the `nth` call (0-based) of `tool`.
        let nth_call = |tool: &str, nth: usize| names.iter().enumerate().filter(|(_, n)| **n == tool).nth(nth).map(|(k, _)| k);
        let (expected, hint, culprit) = match self {
            TraceCheck::ContainsInOrder(tools) | TraceCheck::ExactOrder(tools) => {
                let exact = matches!(self, TraceCheck::ExactOrder(_));
                let want = format!(
                    "{}: {}",
                    if exact { "exact_order" } else { "contains_in_order" },
                    arrow(&owned(tools))
                );
                // Match the tools in order, each at its first call after the
                // previous one, as the check does: the first that cannot be
                // matched is what went wrong.
                let mut at: Vec<usize> = Vec::with_capacity(tools.len());
                let mut unmatched = None;
                for (j, tool) in tools.iter().enumerate() {
                    let from = at.last().map_or(0, |k| k + 1);
                    match names[from..].iter().position(|n| n == tool) {
                        Some(p) => at.push(from + p),
                        None => {
                            unmatched = Some(j);
                            break;
                        }
                    }
                }
                let (hint, culprit) = match unmatched {
                    Some(j) if !names.contains(&tools[j].as_str()) => (not_called(&tools[j]), None),
                    Some(j) if tools[..j].contains(&tools[j]) => (
                        format!(
                            "`{}` is expected again after `{}` but was not called again: make the agent call it once more, or drop the repeat from spec.tools.",
                            tools[j],
                            tools[j - 1]
                        ),
                        at.last().copied(),
                    ),
                    // Called, but only before the tool it must follow.
                    Some(j) => {
                        let prev = &tools[j - 1];
                        (
                            format!(
                                "`{}` ran before `{prev}`: make the agent call `{prev}` first, or relax the check to `required_tools`.",
                                tools[j]
                            ),
                            names[..at[j - 1]].iter().rposition(|n| *n == tools[j]),
                        )
                    }
                    // All in order, with other calls between them (exact_order).
                    None => (
                        "The tools were called but with other tool calls between them: remove the calls in between, or use `contains_in_order`, which allows gaps.".to_owned(),
                        at.windows(2).find(|w| w[1] != w[0] + 1).map(|w| w[0] + 1),
                    ),
                };
                (want, hint, culprit)
            }
            TraceCheck::LoopDetection { tool, max } => {
                let n = names.iter().filter(|n| **n == tool).count();
                (
                    format!("`{tool}` called at most {}", crate::text::count(*max, "time", "times")),
                    format!("`{tool}` ran {}: stop the agent retrying it (cache its result or add a stop condition), or raise max_repetitions to {n}.", crate::text::count(n as u64, "time", "times")),
                    usize::try_from(*max).ok().and_then(|m| nth_call(tool, m)),
                )
            }
            TraceCheck::NoDuplicates => {
                let mut before: HashSet<&str> = HashSet::with_capacity(names.len());
                let repeat = names.iter().enumerate().find(|(_, n)| !before.insert(n));
                let dup = repeat.map_or("", |(_, n)| *n);
                (
                    "no tool called more than once".to_owned(),
                    format!("`{dup}` was called more than once: reuse its first result instead of calling it again, or replace no_duplicates with loop_detection and a limit."),
                    repeat.map(|(k, _)| k),
                )
            }
            TraceCheck::RequiredTools(tools) => {
                let called: HashSet<&str> = names.iter().copied().collect();
                let missing: Vec<&str> = tools.iter().map(String::as_str).filter(|t| !called.contains(t)).collect();
                let (below, never): (Vec<&str>, Vec<&str>) = missing.iter().partition(|m| called_below(trace, m).is_some());
                let mut hint = Vec::new();
                if !never.is_empty() {
                    hint.push(format!(
                        "Make the agent call {} (never called), or drop it from spec.tools.",
                        never.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
                    ));
                }
                hint.extend(below.iter().map(|m| not_called(m)));
                (format!("required_tools: {}", owned(tools).join(", ")), hint.join(" "), None)
            }
            TraceCheck::ForbiddenTools(tools) => {
                let forbidden: HashSet<&str> = tools.iter().map(String::as_str).collect();
                let hit = names.iter().position(|n| forbidden.contains(n));
                (
                    format!("never call: {}", owned(tools).join(", ")),
                    format!(
                        "`{}` must not run: remove it from the agent's tools or guard the path that calls it.",
                        hit.map_or("", |k| names[k])
                    ),
                    hit,
                )
            }
            TraceCheck::FollowsTransitions(allowed) => {
                let pairs: Vec<String> = allowed.iter().map(|(a, b)| format!("{a} → {b}")).collect();
                let ok = allowed_pairs(allowed);
                let bad_at = names.windows(2).position(|w| !ok.contains(&(w[0], w[1])));
                let bad = bad_at.map(|k| &names[k..k + 2]);
                let hint = match bad {
                    Some(w) => format!(
                        "`{}` → `{}` is not an allowed transition: change the agent's plan, or add [\"{}\", \"{}\"] to spec.transitions.",
                        w[0], w[1], w[0], w[1]
                    ),
                    None => "Change the agent's tool order to follow spec.transitions.".to_owned(),
                };
                (
                    format!("allowed transitions: {}", clip(&pairs.join(", "), 400)),
                    hint,
                    bad_at.map(|k| k + 1),
                )
            }
        };
        let path = culprit.map_or_else(|| "steps".to_owned(), |k| format!("steps[{}]", calls[k].0));
        Evidence::new(expected, observed).at(path).hint(hint)
    }

    fn decide(&self, calls: &[(usize, &str)], names: &[&str]) -> Verdict {
        match self {
            TraceCheck::ContainsInOrder(tools) => {
                let mut at = Vec::with_capacity(tools.len());
                let mut next = 0;
                for tool in tools {
                    match calls[next..].iter().position(|(_, n)| n == tool) {
                        Some(p) => {
                            at.push(calls[next + p].0);
                            next += p + 1;
                        }
                        None => {
                            let after = match at.last() {
                                Some(i) => format!(" after step {i}"),
                                None => String::new(),
                            };
                            return Verdict::fail(format!(
                                "Tool sequence {} not found in order: {} was not called{after}. Tool calls: {}.",
                                quote_list(tools),
                                quote(tool),
                                quote_list(names)
                            ));
                        }
                    }
                }
                Verdict::pass(format!("Tool sequence {} found in order at steps {at:?}.", quote_list(tools)))
            }
            TraceCheck::ExactOrder(tools) => {
                let found = names.windows(tools.len()).position(|w| w.iter().zip(tools).all(|(a, b)| a == b));
                match found {
                    Some(p) => {
                        let at: Vec<usize> = calls[p..p + tools.len()].iter().map(|(i, _)| *i).collect();
                        Verdict::pass(format!("Tool sequence {} found in exact order at steps {at:?}.", quote_list(tools)))
                    }
                    None => Verdict::fail(format!(
                        "Tool sequence {} not found as a contiguous run of tool calls. Tool calls: {}.",
                        quote_list(tools),
                        quote_list(names)
                    )),
                }
            }
            TraceCheck::LoopDetection { tool, max } => {
                let n = names.iter().filter(|n| **n == tool).count() as u64;
                let ok = n <= *max;
                let rel = if ok { "within" } else { "exceeds" };
                Verdict::from_bool(ok, format!("Tool {} called {n} times, {rel} max_repetitions {max}.", quote(tool)))
            }
            TraceCheck::NoDuplicates => {
                // Counted in first-call order, through an index: a trace may
                // hold 10,000 calls of as many tools, and a scan per call
                // would be quadratic.
                let mut seen: Vec<(&str, usize)> = Vec::new();
                let mut at: HashMap<&str, usize> = HashMap::with_capacity(names.len());
                for n in names {
                    match at.get(n) {
                        Some(&i) => seen[i].1 += 1,
                        None => {
                            at.insert(n, seen.len());
                            seen.push((n, 1));
                        }
                    }
                }
                let dups: Vec<String> = seen
                    .iter()
                    .filter(|(_, c)| *c > 1)
                    .map(|(n, c)| format!("{} ({c} times)", quote(n)))
                    .collect();
                if dups.is_empty() {
                    Verdict::pass(format!("No tool called more than once ({} tool calls).", names.len()))
                } else {
                    Verdict::fail(format!("Tools called more than once: {}.", dups.join(", ")))
                }
            }
            TraceCheck::RequiredTools(tools) => {
                let called: HashSet<&str> = names.iter().copied().collect();
                let missing: Vec<&String> = tools.iter().filter(|t| !called.contains(t.as_str())).collect();
                if missing.is_empty() {
                    Verdict::pass(format!("All required tools called: {}.", quote_list(tools)))
                } else {
                    Verdict::fail(format!(
                        "Required tools not called: {}. Tool calls: {}.",
                        quote_list(&missing),
                        quote_list(names)
                    ))
                }
            }
            TraceCheck::ForbiddenTools(tools) => {
                let forbidden: HashSet<&str> = tools.iter().map(String::as_str).collect();
                let hits: Vec<String> = calls
                    .iter()
                    .filter(|(_, n)| forbidden.contains(n))
                    .map(|(i, n)| format!("{} at step {i}", quote(n)))
                    .collect();
                if hits.is_empty() {
                    Verdict::pass(format!("None of the forbidden tools {} was called.", quote_list(tools)))
                } else {
                    Verdict::fail(format!("Forbidden tools called: {}.", hits.join(", ")))
                }
            }
            TraceCheck::FollowsTransitions(allowed) => {
                let allowed = allowed_pairs(allowed);
                let bad: Vec<String> = calls
                    .windows(2)
                    .filter(|w| !allowed.contains(&(w[0].1, w[1].1)))
                    .map(|w| format!("{} -> {} at steps [{}, {}]", quote(w[0].1), quote(w[1].1), w[0].0, w[1].0))
                    .collect();
                if bad.is_empty() {
                    Verdict::pass(format!("All {} tool transitions are allowed.", calls.len().saturating_sub(1)))
                } else {
                    Verdict::fail(format!("Disallowed tool transitions: {}.", bad.join(", ")))
                }
            }
        }
    }
}

/// The allowed transitions as a set: checking each of a trace's (up to
/// 10,000) transitions, or a tree's delegations (layer 7), against a list
/// would be quadratic.
pub(super) fn allowed_pairs(allowed: &[(String, String)]) -> HashSet<(&str, &str)> {
    allowed.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

/// `transitions`: `[["a","b"], …]` or `[{"from":"a","to":"b"}, …]`.
fn transitions(spec: &Spec<'_>) -> Result<Vec<(String, String)>, SpecError> {
    let shape = "Set spec.transitions to a non-empty list of [from, to] tool-name pairs, e.g. [[\"lookup_order\", \"process_refund\"]].";
    let Some(Value::Array(items)) = spec.raw("transitions") else {
        return Err(SpecError::new(
            "spec.transitions",
            "spec missing required field: transitions",
            shape,
        ));
    };
    if items.is_empty() {
        return Err(SpecError::new("spec.transitions", "spec.transitions must not be empty", shape));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let pair = match item {
                Value::Array(p) if p.len() == 2 => (p[0].as_str(), p[1].as_str()),
                Value::Object(m) => (m.get("from").and_then(Value::as_str), m.get("to").and_then(Value::as_str)),
                _ => (None, None),
            };
            match pair {
                (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
                _ => Err(SpecError::new(
                    format!("spec.transitions[{i}]"),
                    format!("spec.transitions[{i}] is not a [from, to] pair of strings"),
                    shape,
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use serde_json::value::RawValue;

    fn trace(steps: Value) -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t", "steps": steps, "output": {"message": "m"}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    #[test]
    fn a_tool_a_sub_agent_called_is_not_called_never_called() {
        let t = trace(json!([
            {"type": "llm_call", "name": "route"},
            {"type": "agent_call", "name": "refund-agent", "sub_trace": {
                "schema_version": 1, "trace_id": "t:1", "agent_id": "refund-agent", "output": {"message": "done"},
                "steps": [{"type": "tool_call", "name": "lookup_order"}]}}
        ]));
        for check in [
            TraceCheck::RequiredTools(vec!["lookup_order".into(), "escalate".into()]),
            TraceCheck::ContainsInOrder(vec!["lookup_order".into()]),
        ] {
            let v = check.evaluate(&t);
            let hint = v.evidence.as_ref().and_then(|e| e.hint.clone()).unwrap_or_default();
            assert!(
                hint.contains("by its sub-agent 'refund-agent' (at trace.steps[1].sub_trace)"),
                "{hint}"
            );
            assert!(hint.contains("all_tools_called"), "{hint}");
        }
        let v = TraceCheck::RequiredTools(vec!["escalate".into()]).evaluate(&t);
        assert!(v.evidence.unwrap().hint.unwrap().contains("`escalate` (never called)"));
    }

    fn refund() -> Trace {
        trace(json!([
            {"type": "llm_call", "name": "reasoning"},
            {"type": "tool_call", "name": "lookup_order"},
            {"type": "llm_call", "name": "reasoning"},
            {"type": "retrieval", "name": "policy_kb"},
            {"type": "tool_call", "name": "process_refund"}
        ]))
    }

    fn run(spec: Value) -> Verdict {
        TraceCheck::compile(&Spec::new(Some(&spec), "trace").unwrap())
            .unwrap()
            .evaluate(&refund())
    }

    #[test]
    fn the_evidence_path_names_the_step_at_fault() {
        let t = trace(json!([
            {"type": "llm_call", "name": "plan"},
            {"type": "tool_call", "name": "search"},
            {"type": "tool_call", "name": "delete_account"},
            {"type": "tool_call", "name": "search"},
            {"type": "tool_call", "name": "search"}
        ]));
        let path = |spec: Value| {
            let v = TraceCheck::compile(&Spec::new(Some(&spec), "trace").unwrap()).unwrap().evaluate(&t);
            assert!(!v.passed, "{spec}");
            v.evidence.and_then(|e| e.path).unwrap()
        };
        assert_eq!(
            path(json!({"check": "loop_detection", "tool": "search", "max_repetitions": 2})),
            "steps[4]"
        );
        assert_eq!(path(json!({"check": "no_duplicates"})), "steps[3]");
        assert_eq!(path(json!({"check": "forbidden_tools", "tools": ["delete_account"]})), "steps[2]");
        assert_eq!(
            path(json!({"check": "contains_in_order", "tools": ["delete_account", "search", "plan_b"]})),
            "steps"
        );
        // The third search never came after the second.
        assert_eq!(
            path(json!({"check": "exact_order", "tools": ["delete_account", "search", "search", "search"]})),
            "steps[4]"
        );
        // delete_account ran, but only before the last search it must follow.
        assert_eq!(
            path(json!({"check": "contains_in_order", "tools": ["search", "search", "search", "delete_account"]})),
            "steps[2]"
        );
        assert_eq!(
            path(
                json!({"check": "follows_transitions", "transitions": [["search", "delete_account"], ["delete_account", "delete_account"]]})
            ),
            "steps[3]"
        );
        assert_eq!(path(json!({"check": "required_tools", "tools": ["refund"]})), "steps");
    }

    #[test]
    fn a_repeated_tool_is_diagnosed_where_the_sequence_breaks() {
        let check = |steps: &[&str], spec: Value| {
            let t = trace(Value::Array(
                steps.iter().map(|n| json!({"type": "tool_call", "name": n})).collect(),
            ));
            let v = TraceCheck::compile(&Spec::new(Some(&spec), "trace").unwrap()).unwrap().evaluate(&t);
            assert!(!v.passed, "{spec}");
            let e = v.evidence.unwrap();
            (e.path.unwrap(), e.hint.unwrap())
        };
        let (path, hint) = check(
            &["lookup_order", "process_refund", "lookup_order"],
            json!({"check": "contains_in_order", "tools": ["process_refund", "lookup_order", "process_refund"]}),
        );
        assert_eq!(path, "steps[2]", "the sequence broke after the second lookup_order");
        assert!(
            hint.starts_with("`process_refund` is expected again after `lookup_order`"),
            "{hint}"
        );
        let (path, hint) = check(
            &["search", "delete", "search", "search", "lookup"],
            json!({"check": "exact_order", "tools": ["search", "delete", "search", "lookup"]}),
        );
        assert_eq!(path, "steps[3]", "the extra search between them");
        assert!(
            hint.starts_with("The tools were called but with other tool calls between them"),
            "{hint}"
        );
    }

    #[test]
    fn contains_in_order() {
        let v = run(json!({"check": "contains_in_order", "tools": ["lookup_order", "process_refund"]}));
        assert!(v.passed);
        assert_eq!(
            v.explanation,
            "Tool sequence ['lookup_order', 'process_refund'] found in order at steps [1, 4]."
        );
        let v = run(json!({"check": "contains_in_order", "tools": ["process_refund", "lookup_order"]}));
        assert!(!v.passed);
        assert!(
            v.explanation.contains("'lookup_order' was not called after step 4"),
            "{}",
            v.explanation
        );
    }

    #[test]
    fn exact_order_ignores_llm_calls_but_not_tools() {
        assert!(run(json!({"check": "exact_order", "tools": ["lookup_order", "policy_kb"]})).passed);
        assert!(!run(json!({"check": "exact_order", "tools": ["lookup_order", "process_refund"]})).passed);
    }

    #[test]
    fn counting_checks() {
        assert!(run(json!({"check": "no_duplicates"})).passed, "llm_call names are not tools");
        assert!(run(json!({"check": "loop_detection", "tool": "lookup_order", "max_repetitions": 1})).passed);
        assert!(!run(json!({"check": "loop_detection", "tool": "lookup_order", "max_repetitions": 0})).passed);
        let t = trace(json!([{"type": "tool_call", "name": "a"}, {"type": "tool_call", "name": "a"}]));
        let c = TraceCheck::NoDuplicates.evaluate(&t);
        assert_eq!(c.explanation, "Tools called more than once: 'a' (2 times).");
        // Repeats are listed in the order of their first call, each counted,
        // and the evidence points at the first repeat.
        let names = ["b", "a", "c", "a", "b", "b"];
        let t = trace(json!(names.map(|n| json!({"type": "tool_call", "name": n}))));
        let c = TraceCheck::NoDuplicates.evaluate(&t);
        assert_eq!(c.explanation, "Tools called more than once: 'b' (3 times), 'a' (2 times).");
        assert_eq!(c.evidence.unwrap().path.as_deref(), Some("steps[3]"));
    }

    #[test]
    fn required_and_forbidden() {
        assert!(run(json!({"check": "required_tools", "tools": ["policy_kb", "lookup_order"]})).passed);
        let v = run(json!({"check": "required_tools", "tools": ["reasoning"]}));
        assert!(!v.passed, "an llm_call does not satisfy a required tool");
        let v = run(json!({"check": "forbidden_tools", "tools": ["process_refund"]}));
        assert_eq!(v.explanation, "Forbidden tools called: 'process_refund' at step 4.");
        assert!(run(json!({"check": "forbidden_tools", "tools": ["delete_account"]})).passed);
    }

    #[test]
    fn transitions() {
        let ok = json!({"check": "follows_transitions", "transitions": [["lookup_order", "policy_kb"], {"from": "policy_kb", "to": "process_refund"}]});
        assert!(run(ok).passed);
        let v = run(json!({"check": "follows_transitions", "transitions": [["lookup_order", "policy_kb"]]}));
        assert_eq!(
            v.explanation,
            "Disallowed tool transitions: 'policy_kb' -> 'process_refund' at steps [3, 4]."
        );
    }

    #[test]
    fn spec_errors_name_the_field() {
        let err = |s: Value| TraceCheck::compile(&Spec::new(Some(&s), "trace").unwrap()).unwrap_err();
        assert_eq!(err(json!({"check": "contains_in_order"})).field, "spec.tools");
        assert_eq!(err(json!({"check": "contains_in_order", "tools": []})).field, "spec.tools");
        assert_eq!(err(json!({"check": "loop_detection", "tool": "a"})).field, "spec.max_repetitions");
        assert_eq!(
            err(json!({"check": "loop_detection", "tool": "a", "max_repetitions": -1})).field,
            "spec.max_repetitions"
        );
        let e = err(json!({"check": "sequence"}));
        assert!(e.detail.contains("contains_in_order"), "{}", e.detail);
        assert_eq!(
            err(json!({"check": "follows_transitions", "transitions": [["a"]]})).field,
            "spec.transitions[0]"
        );
    }
}
