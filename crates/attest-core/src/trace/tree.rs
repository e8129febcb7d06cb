//! The multi-agent trace tree (Attest protocol v1 §3.3): a root trace plus the sub-traces
//! its `agent_call` steps carry, recursively.
//!
//! This module owns the tree's shape and the facts derived from it: the
//! depth-first order of traces, tree depth, trace-level agent ids,
//! delegations, step attribution to agents, metadata aggregates, and the
//! tree integrity rules (`parent_trace_id` links and unique `trace_id`s).
//! Layer 7 checks ([`crate::layers::trace_tree`]), trace validation and the
//! `validate_trace_tree` summary all read the tree through [`Tree`], so they
//! agree on what "the agents of a trace" means.

use super::{Step, StepType, Trace};
use crate::text::quote;
use serde::Serialize;
use std::collections::HashMap;

/// One trace of the tree.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    pub trace: &'a Trace,
    /// Root = 0; each `agent_call` sub-trace is one deeper than its parent.
    pub depth: usize,
    /// `(parent node index, index of the agent_call step in the parent)`; `None` for the root.
    pub parent: Option<(usize, usize)>,
}

impl<'a> Node<'a> {
    /// The trace-level agent id; an empty id counts as no id.
    pub fn agent(&self) -> Option<&'a str> {
        non_empty(&self.trace.agent_id)
    }
}

/// A parent trace handing work to the sub-trace of one of its `agent_call`
/// steps. Either side may lack an agent id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delegation<'a> {
    pub parent: Option<&'a str>,
    pub child: Option<&'a str>,
    /// Node index of the sub-trace.
    pub node: usize,
}

/// A step anywhere in the tree, with the agent it is attributed to.
#[derive(Debug, Clone, Copy)]
pub struct TreeStep<'a> {
    pub node: usize,
    /// Index into the owning trace's `steps`.
    pub index: usize,
    pub step: &'a Step,
    /// The step's own `agent_id` when set, else its trace's agent id: a step
    /// may record work done on behalf of another agent (e.g. an adapter that
    /// flattens a crew into one trace).
    pub agent: Option<&'a str>,
}

/// The numeric trace-level metadata the tree aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Tokens,
    CostUsd,
    LatencyMs,
}

impl Metric {
    /// The `metadata` key summed.
    pub fn key(self) -> &'static str {
        match self {
            Metric::Tokens => "total_tokens",
            Metric::CostUsd => "cost_usd",
            Metric::LatencyMs => "latency_ms",
        }
    }
}

/// A sum over the traces that carry a metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    pub total: f64,
    /// How many traces carry the metric (at least 1).
    pub traces: usize,
}

/// A tree integrity problem, located by the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeError {
    pub message: String,
    pub detail: String,
    /// e.g. `trace.steps[1].sub_trace.parent_trace_id`.
    pub field: String,
}

/// The traces of a tree in depth-first order (root first, then each
/// `agent_call` step's sub-trace in step order, recursively).
#[derive(Debug)]
pub struct Tree<'a> {
    nodes: Vec<Node<'a>>,
}

impl<'a> Tree<'a> {
    pub fn new(root: &'a Trace) -> Tree<'a> {
        let mut nodes = Vec::new();
        collect(root, 0, None, &mut nodes);
        Tree { nodes }
    }

    pub fn nodes(&self) -> &[Node<'a>] {
        &self.nodes
    }

    /// Deepest sub-trace level (root = 0). Validation bounds it (Attest protocol v1 §7).
    pub fn depth(&self) -> usize {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0)
    }

    /// Trace-level agent ids, depth-first, duplicates kept.
    pub fn agent_ids(&self) -> Vec<&'a str> {
        self.nodes.iter().filter_map(Node::agent).collect()
    }

    /// Distinct trace-level agent ids in first-seen order, for explanations.
    pub fn distinct_agent_ids(&self) -> Vec<&'a str> {
        distinct(self.nodes.iter().filter_map(Node::agent))
    }

    /// Nodes whose trace-level agent id is `agent`.
    pub fn traces_of<'s>(&'s self, agent: &'s str) -> impl Iterator<Item = &'s Node<'a>> + 's {
        self.nodes.iter().filter(move |n| n.agent() == Some(agent))
    }

    /// Every parent → sub-trace handover, depth-first. `agent_call` steps
    /// without a sub-trace are not delegations here: there is no child trace
    /// whose agent could be named.
    pub fn delegations(&self) -> Vec<Delegation<'a>> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let (parent, _) = n.parent?;
                Some(Delegation {
                    parent: self.nodes[parent].agent(),
                    child: n.agent(),
                    node: i,
                })
            })
            .collect()
    }

    /// Every step of every trace, depth-first by trace, in step order within one.
    pub fn steps(&self) -> impl Iterator<Item = TreeStep<'a>> + '_ {
        self.nodes.iter().enumerate().flat_map(|(i, n)| {
            n.trace.steps.iter().enumerate().map(move |(index, step)| TreeStep {
                node: i,
                index,
                step,
                agent: non_empty(&step.agent_id).or(n.agent()),
            })
        })
    }

    /// Sum of trace-level `metadata.<metric>` over the traces that set it as a
    /// number; `None` when no trace does (absence is not zero).
    pub fn aggregate(&self, metric: Metric) -> Option<Aggregate> {
        let mut agg = Aggregate { total: 0.0, traces: 0 };
        for n in &self.nodes {
            if let Some(x) = n.trace.metadata.as_ref().and_then(|m| m.get(metric.key())).and_then(|v| v.as_f64()) {
                agg.total += x;
                agg.traces += 1;
            }
        }
        (agg.traces > 0).then_some(agg)
    }

    /// JSON path of a node's trace: `trace`, `trace.steps[1].sub_trace`, ….
    pub fn path(&self, node: usize) -> String {
        match self.nodes[node].parent {
            None => "trace".to_owned(),
            Some((parent, step)) => format!("{}.steps[{step}].sub_trace", self.path(parent)),
        }
    }

    /// Agent path of a node: `root > researcher` (agents without an id are `?`,
    /// the root is named by its agent id or `root`).
    pub fn agent_path(&self, node: usize) -> String {
        let name = self.nodes[node]
            .agent()
            .unwrap_or(if self.nodes[node].parent.is_none() { "root" } else { "?" });
        match self.nodes[node].parent {
            None => name.to_owned(),
            Some((parent, _)) => format!("{} > {name}", self.agent_path(parent)),
        }
    }

    /// JSON path of a step: `trace.steps[1].sub_trace.steps[0]`.
    pub fn step_path(&self, node: usize, index: usize) -> String {
        format!("{}.steps[{index}]", self.path(node))
    }

    /// Every integrity problem, depth-first: a sub-trace whose
    /// `parent_trace_id` (when set) is not its parent's `trace_id`, and any
    /// `trace_id` used twice. An `agent_call` step without a sub-trace is not
    /// a problem: adapters emit those for delegations they cannot trace.
    pub fn problems(&self) -> Vec<TreeError> {
        let mut out = Vec::new();
        let mut first_seen: HashMap<&str, usize> = HashMap::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            if let (Some((parent, _)), Some(claimed)) = (n.parent, n.trace.parent_trace_id.as_deref()) {
                let actual = &self.nodes[parent].trace.trace_id;
                if claimed != actual {
                    out.push(TreeError {
                        message: format!(
                            "sub_trace {} has parent_trace_id {} but its parent's trace_id is {}",
                            quote(&n.trace.trace_id),
                            quote(claimed),
                            quote(actual)
                        ),
                        detail: format!(
                            "Set the sub_trace's parent_trace_id to {} (the trace_id of the trace whose agent_call step holds it), or omit it.",
                            quote(actual)
                        ),
                        field: format!("{}.parent_trace_id", self.path(i)),
                    });
                }
            }
            match first_seen.get(n.trace.trace_id.as_str()) {
                Some(&first) => out.push(TreeError {
                    message: format!("duplicate trace_id {} in the tree (cycle or copy)", quote(&n.trace.trace_id)),
                    detail: format!(
                        "Every trace in a tree needs its own trace_id; this one is first used at {}. Give each sub-agent invocation a fresh trace_id.",
                        self.path(first)
                    ),
                    field: format!("{}.trace_id", self.path(i)),
                }),
                None => {
                    first_seen.insert(&n.trace.trace_id, i);
                }
            }
        }
        out
    }
}

/// The first integrity problem of the tree under `root`, if any (see
/// [`Tree::problems`]). Free for traces without sub-traces, which is nearly all.
pub fn check_tree(root: &Trace) -> Result<(), TreeError> {
    if !root.steps.iter().any(|s| s.sub_trace.is_some()) {
        return Ok(());
    }
    match Tree::new(root).problems().into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The `validate_trace_tree` result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeSummary {
    pub valid: bool,
    /// Every integrity problem's message; omitted when valid.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    pub depth: usize,
    pub agent_count: usize,
    /// Depth-first trace-level agent ids, duplicates kept; always an array.
    pub agent_ids: Vec<String>,
    pub aggregate_tokens: u64,
    pub aggregate_cost_usd: f64,
    pub aggregate_latency_ms: u64,
}

/// Summarises the tree under `root`, reporting all integrity problems.
/// Aggregates of absent metadata are 0 here (the summary has no "unknown").
pub fn summary(root: &Trace) -> TreeSummary {
    // Echoed lists are bounded so the answer fits one response line; the
    // counts stay exact and a marker entry says what was left out.
    const MAX_LISTED: usize = 100;
    let tree = Tree::new(root);
    let problems = tree.problems();
    let valid = problems.is_empty();
    let mut errors: Vec<String> = problems
        .iter()
        .take(MAX_LISTED)
        .map(|e| crate::text::clip(&e.message, 300))
        .collect();
    if problems.len() > MAX_LISTED {
        errors.push(format!("… and {} more problems", problems.len() - MAX_LISTED));
    }
    let all_ids = tree.agent_ids();
    let mut agent_ids: Vec<String> = all_ids.iter().take(MAX_LISTED).map(|a| crate::text::clip(a, 128)).collect();
    if all_ids.len() > MAX_LISTED {
        agent_ids.push(format!("… and {} more", all_ids.len() - MAX_LISTED));
    }
    // Sums of huge values saturate instead of becoming infinite (which JSON
    // cannot carry).
    let total = |m| tree.aggregate(m).map_or(0.0, |a| a.total.min(f64::MAX));
    TreeSummary {
        valid,
        errors,
        depth: tree.depth(),
        agent_count: all_ids.len(),
        agent_ids,
        // Validation guarantees non-negative numbers; token and millisecond
        // counts are integers on the wire, so rounding only hides float noise.
        aggregate_tokens: total(Metric::Tokens).round() as u64,
        aggregate_cost_usd: total(Metric::CostUsd),
        aggregate_latency_ms: total(Metric::LatencyMs).round() as u64,
    }
}

fn collect<'a>(trace: &'a Trace, depth: usize, parent: Option<(usize, usize)>, nodes: &mut Vec<Node<'a>>) {
    let me = nodes.len();
    nodes.push(Node { trace, depth, parent });
    for (i, step) in trace.steps.iter().enumerate() {
        // Validation only lets agent_call steps carry a sub-trace; the kind
        // check keeps the walk honest for traces built some other way.
        if let (StepType::AgentCall, Some(sub)) = (&step.kind, &step.sub_trace) {
            collect(sub, depth + 1, Some((me, i)), nodes);
        }
    }
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

/// The distinct names in first-seen order. Through a set: a tree may hold
/// hundreds of thousands of steps and sub-traces, and a scan of the names so
/// far for each one would be quadratic.
pub fn distinct<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = std::collections::HashSet::new();
    names.into_iter().filter(|n| seen.insert(*n)).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::{parse_trace, Limits};
    use serde_json::value::RawValue;
    use serde_json::{json, Value};

    /// Builds a `Trace` without §7 validation's tree rules, so that broken
    /// trees can be summarised.
    fn typed(v: Value) -> Trace {
        let Value::Object(m) = v else { panic!("not an object") };
        Trace::from_validated(m)
    }

    pub(crate) fn parse(v: Value) -> Trace {
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    fn sub(id: &str, agent: &str, steps: Value, metadata: Value) -> Value {
        json!({"schema_version": 1, "trace_id": id, "agent_id": agent, "parent_trace_id": "root",
            "output": {"m": agent}, "steps": steps, "metadata": metadata})
    }

    fn tree_json() -> Value {
        let leaf = json!({"schema_version": 1, "trace_id": "leaf", "agent_id": "fact_checker", "parent_trace_id": "r1",
            "output": {"ok": true}, "steps": [{"type": "tool_call", "name": "check"}], "metadata": {"total_tokens": 5}});
        json!({"schema_version": 1, "trace_id": "root", "agent_id": "orchestrator", "output": {"m": "done"},
        "metadata": {"total_tokens": 100, "cost_usd": 0.01, "latency_ms": 900},
        "steps": [
            {"type": "llm_call", "name": "plan"},
            {"type": "agent_call", "name": "researcher", "sub_trace":
                sub("r1", "researcher", json!([{"type": "agent_call", "name": "fact_checker", "sub_trace": leaf}]), json!({"total_tokens": 40, "cost_usd": 0.002}))},
            {"type": "agent_call", "name": "writer", "sub_trace": sub("w1", "writer", json!([]), json!({}))},
            {"type": "agent_call", "name": "untraced"}
        ]})
    }

    #[test]
    fn walks_depth_first() {
        let t = parse(tree_json());
        let tree = Tree::new(&t);
        let ids: Vec<&str> = tree.nodes().iter().map(|n| n.trace.trace_id.as_str()).collect();
        assert_eq!(ids, ["root", "r1", "leaf", "w1"]);
        assert_eq!(tree.depth(), 2);
        assert_eq!(tree.agent_ids(), ["orchestrator", "researcher", "fact_checker", "writer"]);
        assert_eq!(tree.path(2), "trace.steps[1].sub_trace.steps[0].sub_trace");
        let d: Vec<(Option<&str>, Option<&str>)> = tree.delegations().iter().map(|d| (d.parent, d.child)).collect();
        assert_eq!(
            d,
            [
                (Some("orchestrator"), Some("researcher")),
                (Some("researcher"), Some("fact_checker")),
                (Some("orchestrator"), Some("writer"))
            ]
        );
        let steps: Vec<(&str, Option<&str>)> = tree.steps().map(|s| (s.step.name.as_str(), s.agent)).collect();
        assert_eq!(steps[0], ("plan", Some("orchestrator")));
        assert_eq!(steps[4], ("fact_checker", Some("researcher")));
        assert_eq!(steps[5], ("check", Some("fact_checker")));
    }

    #[test]
    fn aggregates_count_only_traces_that_set_the_metric() {
        let t = parse(tree_json());
        let tree = Tree::new(&t);
        assert_eq!(tree.aggregate(Metric::Tokens), Some(Aggregate { total: 145.0, traces: 3 }));
        assert_eq!(tree.aggregate(Metric::LatencyMs), Some(Aggregate { total: 900.0, traces: 1 }));
        let bare = parse(json!({"schema_version": 1, "trace_id": "t", "output": {"m": 1}}));
        assert_eq!(Tree::new(&bare).aggregate(Metric::CostUsd), None);
    }

    #[test]
    fn summary_of_a_valid_tree() {
        let s = summary(&parse(tree_json()));
        assert!(s.valid);
        assert_eq!(s.depth, 2);
        assert_eq!(s.agent_count, 4);
        assert_eq!(s.aggregate_tokens, 145);
        assert!((s.aggregate_cost_usd - 0.012).abs() < 1e-12);
        assert_eq!(s.aggregate_latency_ms, 900);
        let v = serde_json::to_value(&s).unwrap();
        assert!(v.get("errors").is_none(), "{v}");
        let bare = serde_json::to_value(summary(&parse(json!({"schema_version": 1, "trace_id": "t", "output": {"m": 1}})))).unwrap();
        assert_eq!(bare["agent_ids"], json!([]));
        assert_eq!(bare["aggregate_tokens"], json!(0));
    }

    #[test]
    fn summary_reports_every_problem() {
        let mut v = tree_json();
        v["steps"][1]["sub_trace"]["parent_trace_id"] = json!("nope");
        v["steps"][2]["sub_trace"]["trace_id"] = json!("root");
        let s = summary(&typed(v));
        assert!(!s.valid);
        assert_eq!(
            s.errors,
            [
                "sub_trace 'r1' has parent_trace_id 'nope' but its parent's trace_id is 'root'",
                "duplicate trace_id 'root' in the tree (cycle or copy)",
            ]
        );
        assert!(serde_json::to_value(&s).unwrap()["errors"].is_array());
    }

    #[test]
    fn check_tree_returns_the_first_problem_with_its_field() {
        assert!(check_tree(&parse(tree_json())).is_ok());
        let mut v = tree_json();
        v["steps"][1]["sub_trace"]["steps"][0]["sub_trace"]["trace_id"] = json!("r1");
        v["steps"][1]["sub_trace"]["steps"][0]["sub_trace"]["parent_trace_id"] = json!(null);
        let e = check_tree(&typed(v)).unwrap_err();
        assert_eq!(e.message, "duplicate trace_id 'r1' in the tree (cycle or copy)");
        assert_eq!(e.field, "trace.steps[1].sub_trace.steps[0].sub_trace.trace_id");
        assert!(e.detail.contains("first used at trace.steps[1].sub_trace"), "{}", e.detail);
        let mut v = tree_json();
        v["steps"][2]["sub_trace"]["parent_trace_id"] = json!("r1");
        let e = check_tree(&typed(v)).unwrap_err();
        assert_eq!(e.field, "trace.steps[2].sub_trace.parent_trace_id");
    }
}
