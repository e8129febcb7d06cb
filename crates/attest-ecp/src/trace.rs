//! Mapping ECP steps onto Attest protocol v1 traces for the `attest` grader.
//!
//! - `input.user_message` is the step input (the last one for a transcript);
//!   a transcript also lists every input in `input.context.turns`.
//! - Each tool call becomes one `tool_call` step (`name`, `args`), in order,
//!   with `metadata.turn` saying which turn made it.
//! - `output.message` is the text of the grader's field: `public_output` by
//!   default. A transcript also gives every turn in `output.structured.turns`.
//! - The evaluation context never enters `output` unless the grader targets
//!   it; it is kept in `metadata.evaluation_context`, so a judge reading the
//!   output does not see private reasoning.

use serde_json::{json, Map, Value};

use crate::grade::{TraceContext, Turn};
use crate::manifest::Field;

pub fn build(span: &[Turn], field: Field, ctx: &TraceContext<'_>, turn_number: usize) -> Value {
    let first_turn = turn_number + 1 - span.len();
    let mut steps = Vec::new();
    let mut total_tokens: u64 = 0;
    let mut saw_tokens = false;
    for (i, turn) in span.iter().enumerate() {
        for call in &turn.result.tool_calls {
            let name = call.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let args = call
                .get("arguments")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::Object(Map::new()));
            let mut step = json!({"type": "tool_call", "name": name, "args": args, "metadata": {"turn": first_turn + i}});
            if let Some(r) = call.get("result") {
                step["result"] = if r.is_object() { r.clone() } else { json!({"value": r}) };
            }
            steps.push(step);
        }
        if let Some(t) = turn
            .result
            .usage
            .as_ref()
            .and_then(|u| u.get("total_tokens"))
            .and_then(Value::as_u64)
        {
            total_tokens += t;
            saw_tokens = true;
        }
    }
    let last = span.last().expect("a trace spans at least one turn");
    let mut metadata = json!({
        "latency_ms": span.iter().map(|t| t.duration_ms).sum::<f64>().round() as u64,
        "ecp": {"scenario": ctx.scenario_index + 1, "turns": span.len(), "first_turn": first_turn, "agent_status": last.result.status.as_str()},
    });
    if saw_tokens {
        metadata["total_tokens"] = json!(total_tokens);
    }
    if field == Field::PublicOutput {
        if let Some(ec) = &last.result.evaluation_context {
            metadata["evaluation_context"] = json!(ec);
        }
    }
    let mut output = json!({"message": last.result.text(field)});
    let mut input = json!({"user_message": last.input, "context": {}});
    if span.len() > 1 {
        output["structured"] = json!({
            "turns": span.iter().map(|t| json!({"input": t.input, "output": t.result.text(field)})).collect::<Vec<_>>()
        });
        input["context"] = json!({"turns": span.iter().map(|t| t.input.clone()).collect::<Vec<_>>()});
    }
    let mut trace = json!({
        "schema_version": 1,
        "trace_id": format!("trc_ecp_{}_s{}_t{}", ctx.run_id.replace('-', ""), ctx.scenario_index + 1, turn_number),
        "input": input,
        "steps": steps,
        "output": output,
        "metadata": metadata,
    });
    if let Some(a) = ctx.agent_name {
        trace["agent_id"] = json!(a);
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grade::StepResult;

    fn turn(input: &str, v: Value) -> Turn {
        Turn {
            input: input.into(),
            result: StepResult::from_wire(&v).unwrap(),
            duration_ms: 10.0,
        }
    }

    #[test]
    fn context_stays_out_of_the_output() {
        let t = turn(
            "hi",
            json!({"status": "done", "public_output": "hello", "evaluation_context": "secret", "tool_calls": [{"name": "a", "arguments": {"x": 1}}]}),
        );
        let ctx = TraceContext {
            run_id: "r-1",
            agent_name: Some("A"),
            scenario_index: 0,
        };
        let tr = build(std::slice::from_ref(&t), Field::PublicOutput, &ctx, 1);
        assert_eq!(tr["output"], json!({"message": "hello"}));
        assert_eq!(tr["metadata"]["evaluation_context"], "secret");
        assert_eq!(
            tr["steps"][0],
            json!({"type": "tool_call", "name": "a", "args": {"x": 1}, "metadata": {"turn": 1}})
        );
        let tr = build(std::slice::from_ref(&t), Field::EvaluationContext, &ctx, 1);
        assert_eq!(tr["output"]["message"], "secret");
        assert!(tr["metadata"].get("evaluation_context").is_none());
    }

    #[test]
    fn transcript_spans_turns_in_order() {
        let a = turn(
            "one",
            json!({"status": "done", "public_output": "1", "tool_calls": [{"name": "lookup"}]}),
        );
        let b = turn(
            "two",
            json!({"status": "done", "public_output": "2", "tool_calls": [{"name": "refund"}]}),
        );
        let ctx = TraceContext {
            run_id: "r",
            agent_name: None,
            scenario_index: 1,
        };
        let tr = build(&[a, b], Field::PublicOutput, &ctx, 2);
        let names: Vec<_> = tr["steps"].as_array().unwrap().iter().map(|s| s["name"].clone()).collect();
        assert_eq!(names, vec![json!("lookup"), json!("refund")]);
        assert_eq!(tr["steps"][1]["metadata"]["turn"], 2);
        assert_eq!(tr["output"]["structured"]["turns"][0]["input"], "one");
        assert_eq!(tr["trace_id"], "trc_ecp_r_s2_t2");
    }
}
