//! Where the engine's domain errors become JSON-RPC errors.
//!
//! Domain code returns errors named after what the user got wrong (a
//! [`TraceError`] for a trace the protocol refuses, say) and knows nothing
//! of error codes; the wire form, code and field path included, is decided
//! here, once.

use crate::layers::{AssertionType, SpecError};
use crate::protocol::{ErrorCode, RpcError};
use crate::text::quote;
use crate::trace::validate::TraceError;

/// A refused trace is `1001` (`INVALID_TRACE`), naming the member at fault.
pub fn trace_error(e: TraceError) -> RpcError {
    RpcError::new(ErrorCode::InvalidTrace, e.message, e.detail).with_field(e.field)
}

/// An assertion whose spec does not compile is `1002`, naming the
/// assertion and the member at fault (`params.assertions[2].spec.check`).
pub fn spec_error(e: SpecError, index: usize, assertion_id: &str, kind: AssertionType) -> RpcError {
    RpcError::new(
        ErrorCode::AssertionError,
        format!("assertion {} ({}): {}", quote(assertion_id), kind.name(), e.message),
        e.detail,
    )
    .with_assertion(assertion_id)
    .with_field(format!("params.assertions[{index}].{}", e.field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_error_is_1001_with_its_field() {
        let e = trace_error(TraceError {
            field: "trace.steps[0].type".into(),
            message: "unknown step type".into(),
            detail: "Use llm_call, tool_call, retrieval or agent_call.".into(),
        });
        assert_eq!(e.code, ErrorCode::InvalidTrace);
        assert_eq!(e.message, "unknown step type");
        assert_eq!(e.detail, "Use llm_call, tool_call, retrieval or agent_call.");
        assert_eq!(e.field.as_deref(), Some("trace.steps[0].type"));
    }

    #[test]
    fn a_spec_error_is_1002_naming_the_assertion_and_its_member() {
        let e = spec_error(
            SpecError::new("spec.check", "unknown check 'contain'", "Valid checks: contains, ..."),
            2,
            "a3",
            AssertionType::Content,
        );
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.message, "assertion 'a3' (content): unknown check 'contain'");
        assert_eq!(e.assertion_id.as_deref(), Some("a3"));
        assert_eq!(e.field.as_deref(), Some("params.assertions[2].spec.check"));
    }
}
