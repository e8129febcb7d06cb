//! The trace as the engine receives it: validated (Attest protocol v1 §7),
//! then built into the eager model of `attest-trace`.
//!
//! A trace reaches the engine as raw JSON; [`validate::parse_trace`] checks it
//! against the protocol's §7 in its order and only then builds a [`Trace`], so
//! evaluators work on typed, already-valid data.

pub mod tree;
pub mod validate;

pub use validate::{parse_trace, Limits};

/// The eager trace model and its steps, shared with the plugin SDK's
/// vocabulary (`attest-trace`).
pub use attest_trace::trace::{Step, Trace};
/// A step's `type`. Unknown types are kept (lax mode) and skipped by
/// type-specific checks, as Attest protocol v1 §6 asks.
pub use attest_trace::StepType;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;
    use serde_json::json;
    use serde_json::value::RawValue;

    /// The grammar's own cases live in `attest-trace`; this checks that the
    /// engine's eager trace answers them the same way.
    #[test]
    fn targets_resolve_against_the_engine_trace() {
        let v = json!({
            "schema_version": 1, "trace_id": "t", "input": {"q": "hi"},
            "steps": [
                {"type": "llm_call", "name": "think"},
                {"type": "tool_call", "name": "lookup", "args": {"id": "A"}, "result": {"items": [1, 2, 3]}}
            ],
            "output": {"message": "done"}
        });
        let raw = RawValue::from_string(v.to_string()).unwrap();
        let trace = parse_trace(&raw, &Limits::default()).unwrap().trace;
        let get = |t: &str| Target::parse(t).unwrap().resolve(&trace).map(|v| v.into_owned());
        assert_eq!(get("output.message").unwrap(), json!("done"));
        assert_eq!(get("input.q").unwrap(), json!("hi"));
        assert_eq!(get("steps[?type=='tool_call'].length").unwrap(), json!(1));
        assert_eq!(get("steps[?name=='lookup'].result.items.length").unwrap(), json!(3));
        assert_eq!(get("steps[0].type").unwrap(), json!("llm_call"));
        assert_eq!(get("steps[?name=='think'].args").unwrap_err().0, "step 'think' has no args");
        assert_eq!(get("metadata.x").unwrap_err().0, "trace has no metadata");
    }
}
