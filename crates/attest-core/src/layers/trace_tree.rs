//! Layer 7: multi-agent checks over the whole trace tree (Attest protocol v1 §3.3).
//!
//! This module owns the `trace_tree` assertion: the checks SDK 0.9.0 emits,
//! their spec fields, and their verdicts. The tree itself (walk order, agent
//! attribution, aggregates) is [`crate::trace::tree`]'s. Semantics, and where
//! they deliberately differ from other engines of the protocol, are in docs/trace_tree.md.
//!
//! Two notions of "agent" meet here. A *trace-level* agent is the `agent_id`
//! of the root or of a sub-trace; output, input and delegation checks use it.
//! A step belongs to its own `agent_id` when set, else to its trace's agent;
//! the timing checks use that attribution.

use super::constraint::Comparison;
use super::spec::type_name;
use super::trace::allowed_pairs;
use super::{Evidence, Spec, SpecError, Verdict};
use crate::text::{clip, num, quote, quote_list};
use crate::trace::tree::{distinct, Metric, Tree, TreeStep};
use crate::trace::{StepType, Trace};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, PartialEq)]
pub enum TraceTreeCheck {
    /// Some trace has this agent id, or some `agent_call` step names it.
    AgentCalled(String),
    /// Tree depth (root = 0) is at most this.
    DelegationDepth(u64),
    /// A text value in the agent's output contains `value`.
    AgentOutputContains {
        agent: String,
        value: String,
        case_sensitive: bool,
    },
    /// The value of `field` in `from`'s output appears in `to`'s input.
    CrossAgentDataFlow { from: String, to: String, field: FieldPath },
    /// Every delegation is one of these `(parent, child)` pairs.
    FollowsTransitions(Vec<(String, String)>),
    /// The tree's sum of a metadata metric satisfies the comparison.
    Aggregate { metric: Metric, cmp: Comparison },
    /// Every step of `a` ends before any step of `b` starts.
    AgentOrderedBefore { a: String, b: String },
    /// The agents' bounding intervals overlap.
    AgentsOverlap { a: String, b: String },
    /// The agent's wall time (first start to last end) is under `max_ms`.
    AgentWallTimeUnder { agent: String, max_ms: f64 },
    /// Each group of agents finishes before the next group starts.
    OrderedAgents(Vec<Vec<String>>),
    /// Every tool is called somewhere in the tree.
    AllToolsCalled(Vec<String>),
}

/// A key in an output object: the literal key when present, else a dotted path.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldPath {
    text: String,
}

impl FieldPath {
    /// The value at this path in `output`. A literal key wins over the dotted
    /// reading, so keys that contain dots stay addressable.
    fn find<'v>(&self, output: &'v Value) -> Option<&'v Value> {
        if let Some(v) = output.get(&self.text) {
            return Some(v);
        }
        self.text.split('.').try_fold(output, |v, key| v.get(key))
    }
}

#[derive(Clone, Copy)]
enum Kind {
    AgentCalled,
    DelegationDepth,
    AgentOutputContains,
    CrossAgentDataFlow,
    FollowsTransitions,
    AggregateCost,
    AggregateTokens,
    AggregateLatency,
    AgentOrderedBefore,
    AgentsOverlap,
    AgentWallTimeUnder,
    OrderedAgents,
    AllToolsCalled,
}

const CHECKS: &[(&str, Kind)] = &[
    ("agent_called", Kind::AgentCalled),
    ("delegation_depth", Kind::DelegationDepth),
    ("agent_output_contains", Kind::AgentOutputContains),
    ("cross_agent_data_flow", Kind::CrossAgentDataFlow),
    ("follows_transitions", Kind::FollowsTransitions),
    ("aggregate_cost", Kind::AggregateCost),
    ("aggregate_tokens", Kind::AggregateTokens),
    ("aggregate_latency", Kind::AggregateLatency),
    ("agent_ordered_before", Kind::AgentOrderedBefore),
    ("agents_overlap", Kind::AgentsOverlap),
    ("agent_wall_time_under", Kind::AgentWallTimeUnder),
    ("ordered_agents", Kind::OrderedAgents),
    ("all_tools_called", Kind::AllToolsCalled),
];

impl TraceTreeCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<TraceTreeCheck, SpecError> {
        let owned = |key: &'static str| spec.str(key).map(str::to_owned);
        let aggregate_check = |metric: Metric| -> Result<TraceTreeCheck, SpecError> {
            let why = format!("the limit for the tree's total metadata.{}", metric.key());
            Ok(TraceTreeCheck::Aggregate {
                metric,
                cmp: Comparison::compile_threshold(spec, &why)?,
            })
        };
        Ok(match spec.choice("check", CHECKS)? {
            Kind::AgentCalled => TraceTreeCheck::AgentCalled(owned("agent_id")?),
            Kind::DelegationDepth => TraceTreeCheck::DelegationDepth(spec.count("max_depth")?),
            Kind::AgentOutputContains => TraceTreeCheck::AgentOutputContains {
                agent: owned("agent_id")?,
                value: owned("value")?,
                case_sensitive: spec.bool_or("case_sensitive", false)?,
            },
            Kind::CrossAgentDataFlow => TraceTreeCheck::CrossAgentDataFlow {
                from: owned("from_agent")?,
                to: owned("to_agent")?,
                field: FieldPath { text: owned("field")? },
            },
            Kind::FollowsTransitions => TraceTreeCheck::FollowsTransitions(transitions(spec)?),
            Kind::AggregateCost => aggregate_check(Metric::CostUsd)?,
            Kind::AggregateTokens => aggregate_check(Metric::Tokens)?,
            Kind::AggregateLatency => aggregate_check(Metric::LatencyMs)?,
            Kind::AgentOrderedBefore => TraceTreeCheck::AgentOrderedBefore {
                a: owned("agent_a")?,
                b: owned("agent_b")?,
            },
            Kind::AgentsOverlap => TraceTreeCheck::AgentsOverlap {
                a: owned("agent_a")?,
                b: owned("agent_b")?,
            },
            Kind::AgentWallTimeUnder => {
                let max_ms = spec.f64("max_ms", "the wall-time limit in milliseconds")?;
                if max_ms <= 0.0 {
                    return Err(SpecError::new(
                        "spec.max_ms",
                        format!("spec.max_ms must be greater than 0, got {}", num(max_ms)),
                        "Set spec.max_ms to the wall-time limit in milliseconds, e.g. 5000.",
                    ));
                }
                TraceTreeCheck::AgentWallTimeUnder {
                    agent: owned("agent_id")?,
                    max_ms,
                }
            }
            Kind::OrderedAgents => TraceTreeCheck::OrderedAgents(groups(spec)?),
            Kind::AllToolsCalled => TraceTreeCheck::AllToolsCalled(spec.str_list("tools")?),
        })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let tree = Tree::new(trace);
        self.decide(&tree).on_failure(|| self.evidence(&tree))
    }

    /// The agent relation expected, what the tree holds, and where.
    fn evidence(&self, tree: &Tree<'_>) -> Evidence {
        let node_of = |agent: &str| tree.nodes().iter().position(|n| n.agent() == Some(agent));
        let path_of = |agent: &str| node_of(agent).map_or_else(|| tree.agent_path(0), |i| tree.agent_path(i));
        let tree_shape = || {
            let paths: Vec<String> = (0..tree.nodes().len()).map(|i| tree.agent_path(i)).collect();
            format!("tree: {} (depth {})", clip(&paths.join(", "), 300), tree.depth())
        };
        let (expected, actual, path, hint) = match self {
            TraceTreeCheck::AgentCalled(a) => (
                format!("agent `{a}` called somewhere in the tree"),
                tree_shape(),
                tree.agent_path(0),
                format!("Make the orchestrator delegate to `{a}` (or fix its agent_id), or drop this check if `{a}` is optional."),
            ),
            TraceTreeCheck::DelegationDepth(max) => {
                let deepest = (0..tree.nodes().len()).max_by_key(|&i| tree.nodes()[i].depth).unwrap_or(0);
                (
                    format!("delegation depth ≤ {max}"),
                    format!("depth {} at {}", tree.depth(), tree.agent_path(deepest)),
                    tree.agent_path(deepest),
                    format!(
                        "Flatten the delegation chain to {} (let a parent call the deepest agent directly), or raise max_depth.",
                        crate::text::count(*max, "level", "levels")
                    ),
                )
            }
            TraceTreeCheck::AgentOutputContains { agent, value, .. } => {
                let out = node_of(agent)
                    .map(|i| tree.nodes()[i].trace.output.to_string())
                    .filter(|o| o != "null");
                (
                    format!("output of `{agent}` contains '{}'", clip(value, 120)),
                    out.map_or_else(
                        || format!("`{agent}` has no output in the tree"),
                        |o: String| format!("output: {}", clip(&o, 200)),
                    ),
                    format!("{} > output", path_of(agent)),
                    format!(
                        "Make `{agent}` include '{}' in its output, or check a different agent.",
                        clip(value, 80)
                    ),
                )
            }
            TraceTreeCheck::CrossAgentDataFlow { from, to, field } => {
                // What the receiving agent got, where it has an input; the
                // tree's shape when it has none (or no trace at all).
                let received = tree
                    .traces_of(to)
                    .find_map(|n| n.trace.input.as_ref())
                    .map(|input| format!("input of `{to}`: {}", clip(&crate::text::render(input), 200)));
                let at = if received.is_some() {
                    format!("{} > input", path_of(to))
                } else {
                    path_of(to)
                };
                (
                    format!("`{to}` receives `{}` produced by `{from}`", field.text),
                    received.unwrap_or_else(tree_shape),
                    at,
                    format!(
                        "Pass `{}` from `{from}`'s output into `{to}`'s input, or name the field the agents actually share.",
                        field.text
                    ),
                )
            }
            TraceTreeCheck::FollowsTransitions(allowed) => {
                let pairs: Vec<String> = allowed.iter().map(|(a, b)| format!("{a} → {b}")).collect();
                let seen: Vec<String> = tree
                    .delegations()
                    .iter()
                    .map(|d| format!("{} → {}", d.parent.unwrap_or("?"), d.child.unwrap_or("?")))
                    .collect();
                // The agent_call step of the first handover that is not allowed.
                let ok = allowed_pairs(allowed);
                let culprit = tree
                    .delegations()
                    .into_iter()
                    .find(|d| !is_allowed(&ok, d.parent, d.child))
                    .and_then(|d| tree.nodes()[d.node].parent);
                (
                    format!("delegations only along: {}", clip(&pairs.join(", "), 300)),
                    format!("delegations: {}", clip(&seen.join(", "), 300)),
                    culprit.map_or_else(
                        || tree.agent_path(0),
                        |(parent, step)| format!("{} > steps[{step}]", tree.agent_path(parent)),
                    ),
                    "Change the orchestration so every handover is an allowed transition, or add the observed one to spec.transitions."
                        .to_owned(),
                )
            }
            TraceTreeCheck::Aggregate { metric, cmp } => {
                let total = tree.aggregate(*metric).map_or_else(
                    || "not recorded".to_owned(),
                    |a| format!("{} over {} traces", num(a.total), a.traces),
                );
                (
                    format!("sum of metadata.{} {}", metric.key(), cmp.describe()),
                    total,
                    tree.agent_path(0),
                    format!(
                        "Reduce metadata.{} across the agents (fewer or cheaper calls), or revise the bound.",
                        metric.key()
                    ),
                )
            }
            TraceTreeCheck::AgentOrderedBefore { a, b } => (
                format!("`{a}` finishes before `{b}` starts"),
                spans(tree, &[a, b]),
                path_of(b),
                format!("Start `{b}` only after `{a}` has returned (await it), or use agents_overlap if they may run together."),
            ),
            TraceTreeCheck::AgentsOverlap { a, b } => (
                format!("`{a}` and `{b}` run concurrently"),
                spans(tree, &[a, b]),
                path_of(a),
                format!("Run `{a}` and `{b}` in parallel, or drop the overlap check if sequential runs are acceptable."),
            ),
            TraceTreeCheck::AgentWallTimeUnder { agent, max_ms } => (
                format!("`{agent}` wall time < {} ms", num(*max_ms)),
                spans(tree, &[agent]),
                path_of(agent),
                format!("Speed `{agent}` up (fewer or parallel steps) or raise max_ms above its wall time."),
            ),
            TraceTreeCheck::OrderedAgents(groups) => {
                let order: Vec<String> = groups.iter().map(|g| g.join(" | ")).collect();
                (
                    format!("agents in order: {}", clip(&order.join(" → "), 300)),
                    tree_shape(),
                    tree.agent_path(0),
                    "Reorder the orchestrator's delegations to follow spec.groups, or relax the order the check requires.".to_owned(),
                )
            }
            TraceTreeCheck::AllToolsCalled(tools) => {
                let called = distinct(tool_names(tree));
                let set: HashSet<&str> = called.iter().copied().collect();
                let missing: Vec<&str> = tools.iter().map(String::as_str).filter(|t| !set.contains(t)).collect();
                (
                    format!("every tool called somewhere: {}", clip(&tools.join(", "), 300)),
                    format!("tools called: {}", clip(&called.join(", "), 300)),
                    tree.agent_path(0),
                    format!(
                        "Give an agent in the tree the job of calling {}, or drop them from spec.tools.",
                        missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
                    ),
                )
            }
        };
        Evidence::new(expected, actual).at(path).hint(hint)
    }

    fn decide(&self, tree: &Tree<'_>) -> Verdict {
        match self {
            TraceTreeCheck::AgentCalled(agent) => agent_called(tree, agent),
            TraceTreeCheck::DelegationDepth(max) => {
                let depth = tree.depth() as u64;
                let ok = depth <= *max;
                let rel = if ok { "within" } else { "exceeds" };
                Verdict::from_bool(ok, format!("delegation_depth: tree depth {depth} {rel} max_depth {max}."))
            }
            TraceTreeCheck::AgentOutputContains {
                agent,
                value,
                case_sensitive,
            } => output_contains(tree, agent, value, *case_sensitive),
            TraceTreeCheck::CrossAgentDataFlow { from, to, field } => data_flow(tree, from, to, field),
            TraceTreeCheck::FollowsTransitions(allowed) => follows_transitions(tree, allowed),
            TraceTreeCheck::Aggregate { metric, cmp } => aggregate(tree, *metric, *cmp),
            TraceTreeCheck::AgentOrderedBefore { a, b } => {
                let name = "agent_ordered_before";
                let (ia, ib) = match (span(tree, a), span(tree, b)) {
                    (Ok(ia), Ok(ib)) => (ia, ib),
                    (Err(e), _) | (_, Err(e)) => return Verdict::fail(format!("{name}: {e}")),
                };
                let ok = ia.end < ib.start;
                let rel = if ok { "before" } else { "not before" };
                Verdict::from_bool(
                    ok,
                    format!(
                        "{name}: agent {} ends at {} ms, {rel} agent {} starts at {} ms.",
                        quote(a),
                        num(ia.end),
                        quote(b),
                        num(ib.start)
                    ),
                )
            }
            TraceTreeCheck::AgentsOverlap { a, b } => {
                let name = "agents_overlap";
                let (ia, ib) = match (span(tree, a), span(tree, b)) {
                    (Ok(ia), Ok(ib)) => (ia, ib),
                    (Err(e), _) | (_, Err(e)) => return Verdict::fail(format!("{name}: {e}")),
                };
                let ok = ia.start < ib.end && ib.start < ia.end;
                let rel = if ok { "overlap" } else { "do not overlap" };
                Verdict::from_bool(
                    ok,
                    format!(
                        "{name}: agent {} [{}, {}] ms and agent {} [{}, {}] ms {rel}.",
                        quote(a),
                        num(ia.start),
                        num(ia.end),
                        quote(b),
                        num(ib.start),
                        num(ib.end)
                    ),
                )
            }
            TraceTreeCheck::AgentWallTimeUnder { agent, max_ms } => {
                let name = "agent_wall_time_under";
                let s = match span(tree, agent) {
                    Ok(s) => s,
                    Err(e) => return Verdict::fail(format!("{name}: {e}")),
                };
                let wall = s.end - s.start;
                let ok = wall < *max_ms;
                let rel = if ok { "under" } else { "not under" };
                Verdict::from_bool(
                    ok,
                    format!(
                        "{name}: agent {} wall time {} ms (from {} to {} ms over {} steps), {rel} max_ms {}.",
                        quote(agent),
                        num(wall),
                        num(s.start),
                        num(s.end),
                        s.steps,
                        num(*max_ms)
                    ),
                )
            }
            TraceTreeCheck::OrderedAgents(groups) => ordered_agents(tree, groups),
            TraceTreeCheck::AllToolsCalled(tools) => {
                let called: HashSet<&str> = tool_names(tree).collect();
                let missing: Vec<&String> = tools.iter().filter(|t| !called.contains(t.as_str())).collect();
                if missing.is_empty() {
                    Verdict::pass(format!(
                        "all_tools_called: every tool in {} was called in the tree.",
                        quote_list(tools)
                    ))
                } else {
                    Verdict::fail(format!(
                        "all_tools_called: not called anywhere in the tree: {}. Tools called: {}.",
                        quote_list(&missing),
                        quote_list(&distinct(tool_names(tree)))
                    ))
                }
            }
        }
    }
}

/// Each agent's step span, or why it has none: `researcher [0, 1200] ms`.
fn spans(tree: &Tree<'_>, agents: &[&String]) -> String {
    agents
        .iter()
        .map(|a| match span(tree, a) {
            Ok(s) => format!("{a} [{}, {}] ms", num(s.start), num(s.end)),
            Err(e) => clip(&e, 160),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn agent_called(tree: &Tree<'_>, agent: &str) -> Verdict {
    let name = "agent_called";
    if let Some(i) = tree.nodes().iter().position(|n| n.agent() == Some(agent)) {
        return Verdict::pass(format!("{name}: agent {} has a trace at {}.", quote(agent), tree.path(i)));
    }
    // An agent_call step without a sub-trace still records the call: the SDK
    // names the step after the agent, adapters may set the step's agent_id.
    let by_step = tree
        .steps()
        .find(|s| s.step.kind == StepType::AgentCall && (s.step.name == agent || s.step.agent_id.as_deref() == Some(agent)));
    if let Some(s) = by_step {
        return Verdict::pass(format!(
            "{name}: agent {} called by the agent_call step at {}.",
            quote(agent),
            tree.step_path(s.node, s.index)
        ));
    }
    let by_call = tree
        .steps()
        .filter(|s| s.step.kind == StepType::AgentCall)
        .map(|s| s.step.name.as_str());
    let present = distinct(tree.nodes().iter().filter_map(|n| n.agent()).chain(by_call));
    Verdict::fail(format!(
        "{name}: agent {} was not called in the trace tree. Agents present: {}.",
        quote(agent),
        quote_list(&present)
    ))
}

/// "agent 'x' has no trace in the tree (trace-level agents: [...])".
fn no_trace(tree: &Tree<'_>, agent: &str) -> String {
    format!(
        "agent {} has no trace in the tree (trace-level agents: {})",
        quote(agent),
        quote_list(&tree.distinct_agent_ids())
    )
}

fn output_contains(tree: &Tree<'_>, agent: &str, value: &str, case_sensitive: bool) -> Verdict {
    let name = "agent_output_contains";
    let mut texts = Vec::new();
    let mut traces = 0;
    for n in tree.traces_of(agent) {
        traces += 1;
        string_leaves(&n.trace.output, &mut texts);
    }
    if traces == 0 {
        return Verdict::fail(format!("{name}: {}.", no_trace(tree, agent)));
    }
    let (found, mode) = if case_sensitive {
        (texts.iter().any(|t| t.contains(value)), "case-sensitive")
    } else {
        let needle = value.to_lowercase();
        (texts.iter().any(|t| t.to_lowercase().contains(&needle)), "case-insensitive")
    };
    let rel = if found { "contains" } else { "does not contain" };
    Verdict::from_bool(
        found,
        format!(
            "{name}: output of agent {} {rel} {} ({mode}; {} text values in {traces} trace(s)).",
            quote(agent),
            quote(value),
            texts.len()
        ),
    )
}

/// The string values inside `v` (not object keys), depth-first.
fn string_leaves<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| string_leaves(i, out)),
        Value::Object(m) => m.values().for_each(|i| string_leaves(i, out)),
        _ => {}
    }
}

/// Whether `haystack` or any value nested in it is one of `needles`: one
/// walk of the haystack whatever the number of needles (a tree may hold
/// thousands of traces of each agent).
///
/// Looking a node up hashes all of it, so only nodes of a kind some needle
/// is (a string, an object, ...) are looked up: a deep input is not hashed
/// again at every level for a needle that is a plain value.
fn contains_any(haystack: &Value, needles: &HashSet<&Value>) -> bool {
    let kinds = needles.iter().fold(0u8, |k, v| k | kind_bit(v));
    contains_kind(haystack, needles, kinds)
}

fn contains_kind(haystack: &Value, needles: &HashSet<&Value>, kinds: u8) -> bool {
    (kinds & kind_bit(haystack) != 0 && needles.contains(haystack))
        || match haystack {
            Value::Array(items) => items.iter().any(|i| contains_kind(i, needles, kinds)),
            Value::Object(m) => m.values().any(|i| contains_kind(i, needles, kinds)),
            _ => false,
        }
}

/// One bit per JSON kind.
fn kind_bit(v: &Value) -> u8 {
    match v {
        Value::Null => 1,
        Value::Bool(_) => 2,
        Value::Number(_) => 4,
        Value::String(_) => 8,
        Value::Array(_) => 16,
        Value::Object(_) => 32,
    }
}

fn data_flow(tree: &Tree<'_>, from: &str, to: &str, field: &FieldPath) -> Verdict {
    let name = "cross_agent_data_flow";
    let f = quote(&field.text);
    let froms: Vec<_> = tree.traces_of(from).collect();
    if froms.is_empty() {
        return Verdict::fail(format!("{name}: from_agent {}.", no_trace(tree, from)));
    }
    let values: Vec<&Value> = froms.iter().filter_map(|n| field.find(&n.trace.output)).collect();
    if values.is_empty() {
        let keys: Vec<&str> = froms
            .iter()
            .filter_map(|n| n.trace.output.as_object())
            .flat_map(|m| m.keys().map(String::as_str))
            .collect();
        return Verdict::fail(format!(
            "{name}: output of agent {} has no field {f} (output keys: {}).",
            quote(from),
            quote_list(&keys)
        ));
    }
    let tos: Vec<_> = tree.traces_of(to).collect();
    if tos.is_empty() {
        return Verdict::fail(format!("{name}: to_agent {}.", no_trace(tree, to)));
    }
    let inputs: Vec<&Value> = tos.iter().filter_map(|n| n.trace.input.as_ref()).collect();
    if inputs.is_empty() {
        return Verdict::fail(format!(
            "{name}: agent {} has no input to receive {} from agent {}; set its trace's input.",
            quote(to),
            f,
            quote(from)
        ));
    }
    let wanted: HashSet<&Value> = values.iter().copied().collect();
    if inputs.iter().any(|i| contains_any(i, &wanted)) {
        Verdict::pass(format!(
            "{name}: output field {f} of agent {} reaches the input of agent {}.",
            quote(from),
            quote(to)
        ))
    } else {
        Verdict::fail(format!(
            "{name}: the value of output field {f} of agent {} ({}) was not found in the input of agent {}.",
            quote(from),
            crate::text::render(values[0]),
            quote(to)
        ))
    }
}

fn follows_transitions(tree: &Tree<'_>, allowed: &[(String, String)]) -> Verdict {
    let name = "follows_transitions";
    let delegations = tree.delegations();
    let label = |a: Option<&str>| a.map_or_else(|| "(no agent_id)".to_owned(), quote);
    let ok = allowed_pairs(allowed);
    let bad: Vec<String> = delegations
        .iter()
        .filter(|d| !is_allowed(&ok, d.parent, d.child))
        .map(|d| format!("{} -> {} at {}", label(d.parent), label(d.child), tree.path(d.node)))
        .collect();
    if bad.is_empty() {
        Verdict::pass(format!("{name}: all {} delegations are allowed.", delegations.len()))
    } else {
        Verdict::fail(format!("{name}: disallowed delegation(s): {}.", bad.join(", ")))
    }
}

fn aggregate(tree: &Tree<'_>, metric: Metric, cmp: Comparison) -> Verdict {
    let name = match metric {
        Metric::CostUsd => "aggregate_cost",
        Metric::Tokens => "aggregate_tokens",
        Metric::LatencyMs => "aggregate_latency",
    };
    let key = metric.key();
    let Some(agg) = tree.aggregate(metric) else {
        return Verdict::fail(format!(
            "{name}: no trace in the tree sets metadata.{key}, so the total cannot be compared ({}). Record metadata.{key} on the traces.",
            cmp.describe()
        ));
    };
    let ok = cmp.holds(agg.total);
    let rel = if ok { "satisfied" } else { "not satisfied" };
    Verdict::from_bool(
        ok,
        format!(
            "{name}: total metadata.{key} = {} over {} of {} traces, constraint {} {rel}.",
            num(agg.total),
            agg.traces,
            tree.nodes().len(),
            cmp.describe()
        ),
    )
}

/// Names of the tool steps anywhere in the tree, in order, repeats kept.
fn tool_names<'a>(tree: &'a Tree<'_>) -> impl Iterator<Item = &'a str> + 'a {
    tree.steps().filter(|s| s.step.kind.is_tool()).map(|s| s.step.name.as_str())
}

/// A handover between two named agents that `allowed` lists.
fn is_allowed(allowed: &HashSet<(&str, &str)>, parent: Option<&str>, child: Option<&str>) -> bool {
    matches!((parent, child), (Some(p), Some(c)) if allowed.contains(&(p, c)))
}

/// The time an agent's steps cover.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: f64,
    end: f64,
    steps: usize,
}

impl Span {
    /// One step's interval, or which of its timestamps it lacks.
    fn of(s: &TreeStep<'_>) -> Result<Span, &'static str> {
        match (s.step.started_at_ms, s.step.ended_at_ms) {
            (Some(start), Some(end)) => Ok(Span { start, end, steps: 1 }),
            (None, None) => Err("started_at_ms and ended_at_ms"),
            (None, _) => Err("started_at_ms"),
            _ => Err("ended_at_ms"),
        }
    }

    fn merge(self, o: Span) -> Span {
        Span {
            start: self.start.min(o.start),
            end: self.end.max(o.end),
            steps: self.steps + o.steps,
        }
    }
}

/// Why a step of `agent` cannot be timed.
fn untimed(tree: &Tree<'_>, agent: &str, s: &TreeStep<'_>, missing: &str) -> String {
    format!(
        "step {} of agent {} at {} has no {missing}; timing checks need both timestamps on every step of the agent",
        quote(&s.step.name),
        quote(agent),
        tree.step_path(s.node, s.index)
    )
}

/// Why `agent` has no span at all.
fn no_steps(tree: &Tree<'_>, agent: &str) -> String {
    format!(
        "agent {} has no steps in the trace tree (agents with steps: {})",
        quote(agent),
        quote_list(&distinct(tree.steps().filter_map(|s| s.agent)))
    )
}

/// The bounding interval of the steps attributed to `agent`. Every such step
/// must carry both timestamps: skipping one would silently shrink the span.
fn span(tree: &Tree<'_>, agent: &str) -> Result<Span, String> {
    let mut out: Option<Span> = None;
    for s in tree.steps().filter(|s| s.agent == Some(agent)) {
        let one = Span::of(&s).map_err(|missing| untimed(tree, agent, &s, missing))?;
        out = Some(out.map_or(one, |o| o.merge(one)));
    }
    out.ok_or_else(|| no_steps(tree, agent))
}

fn ordered_agents(tree: &Tree<'_>, groups: &[Vec<String>]) -> Verdict {
    let name = "ordered_agents";
    // Every agent's span in one pass over the steps: the groups may name
    // thousands of agents, and a pass per agent would be quadratic. An
    // agent's first step without timestamps is kept as its error.
    let mut by_agent: HashMap<&str, Result<Span, (TreeStep<'_>, &'static str)>> = HashMap::new();
    for s in tree.steps() {
        let Some(agent) = s.agent else { continue };
        let one = Span::of(&s).map_err(|missing| (s, missing));
        match by_agent.get_mut(agent) {
            None => {
                by_agent.insert(agent, one);
            }
            Some(Ok(acc)) => match one {
                Ok(one) => *acc = acc.merge(one),
                Err(e) => {
                    by_agent.insert(agent, Err(e));
                }
            },
            Some(Err(_)) => {}
        }
    }
    let mut spans = Vec::with_capacity(groups.len());
    for group in groups {
        let mut g: Option<Span> = None;
        for agent in group {
            let s = match by_agent.get(agent.as_str()) {
                Some(Ok(s)) => *s,
                Some(Err((step, missing))) => return Verdict::fail(format!("{name}: {}.", untimed(tree, agent, step, missing))),
                None => return Verdict::fail(format!("{name}: {}.", no_steps(tree, agent))),
            };
            g = Some(g.map_or(s, |o| o.merge(s)));
        }
        spans.push(g.expect("groups are non-empty (checked at compile)"));
    }
    for (i, w) in spans.windows(2).enumerate() {
        if w[0].end >= w[1].start {
            return Verdict::fail(format!(
                "{name}: group {i} {} ends at {} ms, not before group {} {} starts at {} ms.",
                quote_list(&groups[i]),
                num(w[0].end),
                i + 1,
                quote_list(&groups[i + 1]),
                num(w[1].start)
            ));
        }
    }
    Verdict::pass(format!("{name}: all {} groups ran in order.", groups.len()))
}

/// `transitions`: a non-empty list of `[parent, child]` agent-id pairs.
fn transitions(spec: &Spec<'_>) -> Result<Vec<(String, String)>, SpecError> {
    let shape = "Set spec.transitions to a non-empty list of [parent_agent, child_agent] pairs, e.g. [[\"orchestrator\", \"researcher\"]].";
    let items = match spec.raw("transitions") {
        None => {
            return Err(SpecError::new(
                "spec.transitions",
                "spec missing required field: transitions",
                shape,
            ))
        }
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(other) => {
            return Err(SpecError::new(
                "spec.transitions",
                format!("spec.transitions must be a non-empty list of pairs, got {}", type_name(other)),
                shape,
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_array().map(Vec::as_slice) {
            Some([Value::String(p), Value::String(c)]) if !p.is_empty() && !c.is_empty() => Ok((p.clone(), c.clone())),
            _ => Err(SpecError::new(
                format!("spec.transitions[{i}]"),
                format!("spec.transitions[{i}] is not a [parent, child] pair of non-empty strings"),
                shape,
            )),
        })
        .collect()
}

/// `groups`: at least two non-empty lists of non-empty agent ids.
fn groups(spec: &Spec<'_>) -> Result<Vec<Vec<String>>, SpecError> {
    let shape = "Set spec.groups to a list of at least 2 non-empty lists of agent ids, e.g. [[\"researcher\", \"analyst\"], [\"writer\"]].";
    let items = match spec.raw("groups") {
        None => return Err(SpecError::new("spec.groups", "spec missing required field: groups", shape)),
        Some(Value::Array(items)) if items.len() >= 2 => items,
        Some(other) => {
            return Err(SpecError::new(
                "spec.groups",
                format!("spec.groups must list at least 2 groups, got {}", type_name(other)),
                shape,
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, group)| {
            let bad = || {
                SpecError::new(
                    format!("spec.groups[{i}]"),
                    format!("spec.groups[{i}] must be a non-empty list of non-empty agent id strings"),
                    shape,
                )
            };
            match group {
                Value::Array(ids) if !ids.is_empty() => ids
                    .iter()
                    .map(|id| match id {
                        Value::String(s) if !s.is_empty() => Ok(s.clone()),
                        _ => Err(bad()),
                    })
                    .collect(),
                _ => Err(bad()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::tree::tests::parse;
    use serde_json::json;

    /// orchestrator (0–100 ms) → researcher (10–40 ms) → fact_checker (20–30 ms),
    /// then writer (50–90 ms); plus an untraced agent_call to `translator`.
    fn multi() -> Value {
        let fact_checker = json!({"schema_version": 1, "trace_id": "f1", "agent_id": "fact_checker", "parent_trace_id": "r1",
            "output": {"verdict": "ok"},
            "steps": [{"type": "retrieval", "name": "kb", "started_at_ms": 21, "ended_at_ms": 29}]});
        let researcher = json!({"schema_version": 1, "trace_id": "r1", "agent_id": "researcher", "parent_trace_id": "root",
        "input": {"question": "capital of France?"},
        "output": {"findings": {"city": "Paris", "confidence": 0.9}, "Note": "Checked"},
        "metadata": {"total_tokens": 40, "cost_usd": 0.002},
        "steps": [
            {"type": "tool_call", "name": "web_search", "started_at_ms": 12, "ended_at_ms": 18},
            {"type": "agent_call", "name": "fact_checker", "started_at_ms": 20, "ended_at_ms": 30, "agent_id": "fact_checker", "sub_trace": fact_checker}
        ]});
        let writer = json!({"schema_version": 1, "trace_id": "w1", "agent_id": "writer",
            "input": {"brief": {"facts": [{"city": "Paris", "confidence": 0.9}]}},
            "output": {"draft": "Paris is the capital of France."},
            "metadata": {"total_tokens": 60},
            "steps": [{"type": "tool_call", "name": "format", "started_at_ms": 55, "ended_at_ms": 85}]});
        json!({"schema_version": 1, "trace_id": "root", "agent_id": "orchestrator",
        "input": {"question": "capital of France?"},
        "output": {"message": "Paris", "report": {"title": "Capital", "sections": ["Paris is the capital"]}},
        "metadata": {"total_tokens": 100, "cost_usd": 0.01},
        "steps": [
            {"type": "llm_call", "name": "plan", "started_at_ms": 0, "ended_at_ms": 5},
            {"type": "agent_call", "name": "researcher", "started_at_ms": 10, "ended_at_ms": 40, "agent_id": "researcher", "sub_trace": researcher},
            {"type": "agent_call", "name": "writer", "started_at_ms": 50, "ended_at_ms": 90, "agent_id": "writer", "sub_trace": writer},
            {"type": "agent_call", "name": "translator", "agent_id": "translator", "started_at_ms": 92, "ended_at_ms": 100}
        ]})
    }

    fn compile(spec: Value) -> Result<TraceTreeCheck, SpecError> {
        TraceTreeCheck::compile(&Spec::new(Some(&spec), "trace_tree").unwrap())
    }

    fn run_on(trace: Value, spec: Value) -> Verdict {
        compile(spec).unwrap().evaluate(&parse(trace))
    }

    fn run(spec: Value) -> Verdict {
        run_on(multi(), spec)
    }

    fn passes(spec: Value) -> String {
        let v = run(spec.clone());
        assert!(v.passed, "{spec}: {}", v.explanation);
        v.explanation
    }

    fn fails(spec: Value) -> String {
        let v = run(spec.clone());
        assert!(!v.passed, "{spec}: {}", v.explanation);
        assert_eq!(v.score, 0.0);
        v.explanation
    }

    #[test]
    fn agent_called() {
        assert_eq!(
            passes(json!({"check": "agent_called", "agent_id": "fact_checker"})),
            "agent_called: agent 'fact_checker' has a trace at trace.steps[1].sub_trace.steps[1].sub_trace."
        );
        assert!(passes(json!({"check": "agent_called", "agent_id": "translator"})).contains("agent_call step at trace.steps[3]"));
        assert_eq!(
            fails(json!({"check": "agent_called", "agent_id": "billing"})),
            "agent_called: agent 'billing' was not called in the trace tree. Agents present: ['orchestrator', 'researcher', 'fact_checker', 'writer', 'translator']."
        );
    }

    #[test]
    fn delegation_depth() {
        assert_eq!(
            passes(json!({"check": "delegation_depth", "max_depth": 2})),
            "delegation_depth: tree depth 2 within max_depth 2."
        );
        assert_eq!(
            fails(json!({"check": "delegation_depth", "max_depth": 1})),
            "delegation_depth: tree depth 2 exceeds max_depth 1."
        );
        let flat = json!({"schema_version": 1, "trace_id": "t", "output": {"m": 1}});
        assert!(run_on(flat, json!({"check": "delegation_depth", "max_depth": 0})).passed);
    }

    #[test]
    fn agent_output_contains_searches_text_values_only() {
        passes(json!({"check": "agent_output_contains", "agent_id": "researcher", "value": "checked"}));
        passes(json!({"check": "agent_output_contains", "agent_id": "orchestrator", "value": "IS THE CAPITAL"}));
        let e = fails(json!({"check": "agent_output_contains", "agent_id": "researcher", "value": "checked", "case_sensitive": true}));
        assert!(e.contains("does not contain 'checked' (case-sensitive"), "{e}");
        fails(json!({"check": "agent_output_contains", "agent_id": "researcher", "value": "findings"}));
        fails(json!({"check": "agent_output_contains", "agent_id": "researcher", "value": "0.9"}));
        assert_eq!(
            fails(json!({"check": "agent_output_contains", "agent_id": "critic", "value": "x"})),
            "agent_output_contains: agent 'critic' has no trace in the tree (trace-level agents: ['orchestrator', 'researcher', 'fact_checker', 'writer'])."
        );
    }

    #[test]
    fn cross_agent_data_flow() {
        let spec = |from: &str, to: &str, field: &str| json!({"check": "cross_agent_data_flow", "from_agent": from, "to_agent": to, "field": field});
        assert_eq!(
            passes(spec("researcher", "writer", "findings")),
            "cross_agent_data_flow: output field 'findings' of agent 'researcher' reaches the input of agent 'writer'."
        );
        passes(spec("researcher", "writer", "findings.city"));
        let e = fails(spec("researcher", "writer", "Note"));
        assert!(e.contains("('Checked') was not found in the input of agent 'writer'"), "{e}");
        assert!(fails(spec("critic", "writer", "x")).starts_with("cross_agent_data_flow: from_agent agent 'critic' has no trace"));
        let e = fails(spec("researcher", "writer", "sources"));
        assert!(
            e.starts_with("cross_agent_data_flow: output of agent 'researcher' has no field 'sources' (output keys: ["),
            "{e}"
        );
        assert!(fails(spec("researcher", "critic", "findings")).starts_with("cross_agent_data_flow: to_agent agent 'critic' has no trace"));
        assert!(fails(spec("researcher", "fact_checker", "findings")).contains("agent 'fact_checker' has no input"));
    }

    #[test]
    fn follows_transitions() {
        let all = json!([
            ["orchestrator", "researcher"],
            ["researcher", "fact_checker"],
            ["orchestrator", "writer"]
        ]);
        assert_eq!(
            passes(json!({"check": "follows_transitions", "transitions": all})),
            "follows_transitions: all 3 delegations are allowed."
        );
        assert_eq!(
            fails(json!({"check": "follows_transitions", "transitions": [["orchestrator", "researcher"], ["orchestrator", "writer"]]})),
            "follows_transitions: disallowed delegation(s): 'researcher' -> 'fact_checker' at trace.steps[1].sub_trace.steps[1].sub_trace."
        );
        let mut anonymous = multi();
        anonymous.as_object_mut().unwrap().remove("agent_id");
        let v = run_on(anonymous, json!({"check": "follows_transitions", "transitions": all}));
        assert!(v.explanation.contains("(no agent_id) -> 'researcher'"), "{}", v.explanation);
    }

    #[test]
    fn aggregates() {
        assert_eq!(
            passes(json!({"check": "aggregate_tokens", "operator": "lte", "value": 200})),
            "aggregate_tokens: total metadata.total_tokens = 200 over 3 of 4 traces, constraint lte 200 satisfied."
        );
        fails(json!({"check": "aggregate_tokens", "operator": "lt", "value": 200}));
        passes(json!({"check": "aggregate_cost", "operator": "eq", "value": 0.012}));
        fails(json!({"check": "aggregate_cost", "operator": "gt", "value": 0.012}));
        assert_eq!(
            fails(json!({"check": "aggregate_latency", "operator": "lte", "value": 5000})),
            "aggregate_latency: no trace in the tree sets metadata.latency_ms, so the total cannot be compared (lte 5000). Record metadata.latency_ms on the traces."
        );
    }

    #[test]
    fn agent_ordered_before() {
        let spec = |a: &str, b: &str| json!({"check": "agent_ordered_before", "agent_a": a, "agent_b": b});
        assert_eq!(
            passes(spec("researcher", "writer")),
            "agent_ordered_before: agent 'researcher' ends at 40 ms, before agent 'writer' starts at 50 ms."
        );
        fails(spec("writer", "researcher"));
        // agent_call steps carrying the delegate's agent_id count for the
        // delegate, so the orchestrator's own work is only its planning step.
        passes(spec("orchestrator", "writer"));
        fails(spec("fact_checker", "researcher"));
        assert!(fails(spec("critic", "writer")).starts_with("agent_ordered_before: agent 'critic' has no steps in the trace tree"));
        let mut t = multi();
        t["steps"][2]["sub_trace"]["steps"][0]
            .as_object_mut()
            .unwrap()
            .remove("started_at_ms");
        let v = run_on(t, spec("researcher", "writer"));
        assert_eq!(
            v.explanation,
            "agent_ordered_before: step 'format' of agent 'writer' at trace.steps[2].sub_trace.steps[0] has no started_at_ms; timing checks need both timestamps on every step of the agent"
        );
    }

    #[test]
    fn agents_overlap() {
        let spec = |a: &str, b: &str| json!({"check": "agents_overlap", "agent_a": a, "agent_b": b});
        assert_eq!(
            passes(spec("researcher", "fact_checker")),
            "agents_overlap: agent 'researcher' [10, 40] ms and agent 'fact_checker' [20, 30] ms overlap."
        );
        fails(spec("researcher", "writer"));
        fails(spec("researcher", "ghost"));
    }

    #[test]
    fn agent_wall_time_under() {
        let spec = |max: f64| json!({"check": "agent_wall_time_under", "agent_id": "researcher", "max_ms": max});
        assert_eq!(
            passes(spec(31.0)),
            "agent_wall_time_under: agent 'researcher' wall time 30 ms (from 10 to 40 ms over 2 steps), under max_ms 31."
        );
        fails(spec(30.0));
        assert!(run(json!({"check": "agent_wall_time_under", "agent_id": "ghost", "max_ms": 10}))
            .explanation
            .contains("no steps"));
    }

    #[test]
    fn ordered_agents() {
        let spec = |g: Value| json!({"check": "ordered_agents", "groups": g});
        assert_eq!(
            passes(spec(json!([["researcher", "fact_checker"], ["writer"], ["translator"]]))),
            "ordered_agents: all 3 groups ran in order."
        );
        assert_eq!(
            fails(spec(json!([["writer"], ["fact_checker"]]))),
            "ordered_agents: group 0 ['writer'] ends at 90 ms, not before group 1 ['fact_checker'] starts at 20 ms."
        );
        assert!(fails(spec(json!([["writer"], ["ghost"]]))).contains("agent 'ghost' has no steps"));
    }

    #[test]
    fn all_tools_called_covers_the_whole_tree() {
        passes(json!({"check": "all_tools_called", "tools": ["web_search", "kb", "format"]}));
        assert_eq!(
            fails(json!({"check": "all_tools_called", "tools": ["kb", "plan", "email"]})),
            "all_tools_called: not called anywhere in the tree: ['plan', 'email']. Tools called: ['web_search', 'kb', 'format']."
        );
    }

    #[test]
    fn spec_errors_name_the_field() {
        let err = |s: Value| compile(s).unwrap_err();
        let e = err(json!({"check": "agent_count"}));
        assert_eq!(e.field, "spec.check");
        assert!(
            e.detail.contains("agent_called, delegation_depth") && e.detail.contains("all_tools_called"),
            "{}",
            e.detail
        );
        assert_eq!(err(json!({})).field, "spec.check");
        assert_eq!(err(json!({"check": "agent_called"})).field, "spec.agent_id");
        assert_eq!(err(json!({"check": "delegation_depth", "max_depth": -1})).field, "spec.max_depth");
        assert_eq!(err(json!({"check": "delegation_depth", "max_depth": 1.5})).field, "spec.max_depth");
        assert_eq!(
            err(json!({"check": "agent_output_contains", "agent_id": "a", "value": ""})).field,
            "spec.value"
        );
        assert_eq!(
            err(json!({"check": "agent_output_contains", "agent_id": "a", "value": "v", "case_sensitive": "yes"})).field,
            "spec.case_sensitive"
        );
        assert_eq!(
            err(json!({"check": "cross_agent_data_flow", "from_agent": "a", "to_agent": "b"})).field,
            "spec.field"
        );
        assert_eq!(err(json!({"check": "follows_transitions"})).field, "spec.transitions");
        assert_eq!(
            err(json!({"check": "follows_transitions", "transitions": []})).field,
            "spec.transitions"
        );
        assert_eq!(
            err(json!({"check": "follows_transitions", "transitions": [["a", "b", "c"]]})).field,
            "spec.transitions[0]"
        );
        let e = err(json!({"check": "aggregate_cost", "operator": "between", "value": 1}));
        assert_eq!(e.field, "spec.operator");
        assert_eq!(e.detail, "Supported values for spec.operator: lt, lte, gt, gte, eq.");
        assert_eq!(err(json!({"check": "aggregate_tokens", "operator": "lte"})).field, "spec.value");
        assert_eq!(err(json!({"check": "agents_overlap", "agent_a": "a"})).field, "spec.agent_b");
        assert_eq!(
            err(json!({"check": "agent_wall_time_under", "agent_id": "a", "max_ms": 0})).field,
            "spec.max_ms"
        );
        assert_eq!(err(json!({"check": "ordered_agents", "groups": [["a"]]})).field, "spec.groups");
        assert_eq!(
            err(json!({"check": "ordered_agents", "groups": [["a"], []]})).field,
            "spec.groups[1]"
        );
        assert_eq!(err(json!({"check": "all_tools_called", "tools": []})).field, "spec.tools");
    }
}
