//! A kept trace as a tree of steps for the page: agents, LLM calls, tools
//! and retrievals, each with its arguments and result. Bounded whatever the
//! trace holds: steps shown, depth, and the text of each value.

use serde::Serialize;
use serde_json::Value;

/// Steps shown at most; the rest are counted.
pub const MAX_NODES: usize = 1_000;
/// Sub-traces followed at most.
pub const MAX_DEPTH: usize = 32;
/// Bytes of one value shown (pretty JSON).
pub const MAX_VALUE_BYTES: usize = 8 * 1024;
/// Bytes of all values on one page; past it values are only sized.
pub const MAX_PAGE_VALUE_BYTES: usize = 512 * 1024;

/// A value as shown: its text, clipped.
#[derive(Debug, Serialize)]
pub struct Shown {
    pub text: String,
    /// The whole text's size when it was clipped.
    pub clipped_from: Option<usize>,
}

/// What the page has left to show.
struct Budget {
    nodes: usize,
    bytes: usize,
}

fn shown(v: &Value, budget: &mut Budget) -> Shown {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    let room = MAX_VALUE_BYTES.min(budget.bytes);
    if text.len() <= room {
        budget.bytes -= text.len();
        return Shown { text, clipped_from: None };
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    budget.bytes -= end;
    Shown {
        text: text[..end].to_owned(),
        clipped_from: Some(text.len()),
    }
}

fn short(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[derive(Debug, Serialize)]
pub struct Node {
    /// The anchor: `s2`, `s2-0` (step 0 of step 2's sub-trace).
    pub anchor: String,
    /// As assertions name it: `steps[2].sub_trace.steps[0]`.
    pub path: String,
    pub kind: String,
    pub name: String,
    pub agent: Option<String>,
    pub duration_ms: Option<f64>,
    pub args: Option<Shown>,
    pub result: Option<Shown>,
    /// An assertion on the page points at this step.
    pub highlighted: bool,
    pub children: Vec<Node>,
    /// Steps of its sub-trace not shown (past the bounds).
    pub omitted: usize,
}

#[derive(Debug, Serialize)]
pub struct TraceView {
    pub trace_id: String,
    pub agent_id: Option<String>,
    pub input: Option<Shown>,
    pub output: Option<Shown>,
    pub metadata: Option<Shown>,
    pub steps: Vec<Node>,
    pub shown: usize,
    pub omitted: usize,
}

/// The anchor of the step at `at` (indexes through sub-traces): `s2-0`.
pub fn anchor(at: &[usize]) -> String {
    format!("s{}", at.iter().map(usize::to_string).collect::<Vec<_>>().join("-"))
}

/// Builds the tree of `trace` (JSON text), marking the steps `pointed`
/// (each a list of step indexes) names. `None` if it is not a JSON object.
pub fn build(trace: &str, pointed: &[Vec<usize>]) -> Option<TraceView> {
    let v: Value = serde_json::from_str(trace).ok()?;
    let obj = v.as_object()?;
    let text = |k: &str| obj.get(k).and_then(Value::as_str).map(|s| short(s, 256));
    let mut budget = Budget {
        nodes: MAX_NODES,
        bytes: MAX_PAGE_VALUE_BYTES,
    };
    let mut omitted = 0;
    // The trace's own input and output come before its steps' values.
    let input = obj.get("input").map(|v| shown(v, &mut budget));
    let output = obj.get("output").map(|v| shown(v, &mut budget));
    let metadata = obj.get("metadata").map(|v| shown(v, &mut budget));
    let steps = nodes(obj.get("steps"), &mut Vec::new(), 0, pointed, &mut budget, &mut omitted);
    Some(TraceView {
        trace_id: text("trace_id").unwrap_or_default(),
        agent_id: text("agent_id"),
        input,
        output,
        metadata,
        steps,
        shown: MAX_NODES - budget.nodes,
        omitted,
    })
}

fn nodes(
    steps: Option<&Value>,
    at: &mut Vec<usize>,
    depth: usize,
    pointed: &[Vec<usize>],
    budget: &mut Budget,
    omitted: &mut usize,
) -> Vec<Node> {
    let Some(steps) = steps.and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if budget.nodes == 0 || depth >= MAX_DEPTH {
            *omitted += steps[i..].iter().map(count).sum::<usize>();
            break;
        }
        budget.nodes -= 1;
        at.push(i);
        let text = |k: &str| step.get(k).and_then(Value::as_str).map(|s| short(s, 256));
        let timing = |k: &str| step.get(k).and_then(Value::as_f64);
        let sub = step.get("sub_trace");
        let mut sub_omitted = 0;
        // Its own values before its sub-trace's.
        let args = step.get("args").map(|v| shown(v, budget));
        let result = step.get("result").map(|v| shown(v, budget));
        let children = nodes(sub.and_then(|s| s.get("steps")), at, depth + 1, pointed, budget, &mut sub_omitted);
        *omitted += sub_omitted;
        // The deepest step a path names is the one marked.
        let highlighted = pointed.iter().any(|p| p.as_slice() == at.as_slice());
        out.push(Node {
            anchor: anchor(at),
            path: at.iter().map(|i| format!("steps[{i}]")).collect::<Vec<_>>().join(".sub_trace."),
            kind: text("type").unwrap_or_else(|| "step".into()),
            name: text("name").unwrap_or_default(),
            agent: text("agent_id").or_else(|| sub.and_then(|s| s.get("agent_id")).and_then(Value::as_str).map(|s| short(s, 256))),
            duration_ms: timing("ended_at_ms").zip(timing("started_at_ms")).map(|(e, s)| e - s),
            args,
            result,
            highlighted,
            children,
            omitted: sub_omitted,
        });
        at.pop();
    }
    out
}

/// Steps under `step`, itself included (iterative: a trace may nest deeper
/// than the stack would like).
fn count(step: &Value) -> usize {
    let mut n = 0;
    let mut stack = vec![step];
    while let Some(s) = stack.pop() {
        n += 1;
        if n > 1_000_000 {
            break;
        }
        if let Some(steps) = s.get("sub_trace").and_then(|t| t.get("steps")).and_then(Value::as_array) {
            stack.extend(steps);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_and_wide_traces_are_bounded() {
        // 35 levels of sub-traces (about as deep as JSON the engine parses
        // goes): shown to MAX_DEPTH, the rest counted.
        let mut t = serde_json::json!({"trace_id": "leaf", "steps": [{"type": "tool_call", "name": "x"}], "output": {}});
        for _ in 0..35 {
            t = serde_json::json!({"trace_id": "t", "steps": [{"type": "agent_call", "name": "a", "sub_trace": t}], "output": {}});
        }
        let view = build(&t.to_string(), &[]).unwrap();
        assert_eq!(view.shown, MAX_DEPTH);
        assert_eq!(view.omitted, 36 - MAX_DEPTH);
        let wide = serde_json::json!({"trace_id": "w", "steps": (0..5000).map(|i| serde_json::json!({"type": "tool_call", "name": i.to_string(), "args": {"s": "x".repeat(20_000)}})).collect::<Vec<_>>(), "output": {}});
        let view = build(&wide.to_string(), &[vec![3]]).unwrap();
        assert_eq!((view.shown, view.omitted), (MAX_NODES, 5000 - MAX_NODES));
        assert!(view.steps[3].highlighted && !view.steps[2].highlighted);
        let args = view.steps[0].args.as_ref().unwrap();
        assert!(args.text.len() <= MAX_VALUE_BYTES && args.clipped_from.unwrap() > 20_000);
        // The page's values together stay within their budget.
        let total: usize = view.steps.iter().flat_map(|n| &n.args).map(|a| a.text.len()).sum();
        assert!(total <= MAX_PAGE_VALUE_BYTES, "{total}");
        assert!(view.steps[MAX_NODES - 1].args.as_ref().unwrap().text.is_empty());
    }
}
