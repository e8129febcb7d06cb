//! Where the engine's domain errors become JSON-RPC errors.
//!
//! Domain code returns errors named after what the user got wrong (a
//! [`TraceError`] for a trace the protocol refuses, say) and knows nothing
//! of error codes; the wire form, code and field path included, is decided
//! here, once.

use crate::protocol::{ErrorCode, RpcError};
use crate::trace::validate::TraceError;

/// A refused trace is `1001` (`INVALID_TRACE`), naming the member at fault.
impl From<TraceError> for RpcError {
    fn from(e: TraceError) -> RpcError {
        RpcError::new(ErrorCode::InvalidTrace, e.message, e.detail).with_field(e.field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_error_is_1001_with_its_field() {
        let e = RpcError::from(TraceError {
            field: "trace.steps[0].type".into(),
            message: "unknown step type".into(),
            detail: "Use llm_call, tool_call, retrieval or agent_call.".into(),
        });
        assert_eq!(e.code, ErrorCode::InvalidTrace);
        assert_eq!(e.message, "unknown step type");
        assert_eq!(e.detail, "Use llm_call, tool_call, retrieval or agent_call.");
        assert_eq!(e.field.as_deref(), Some("trace.steps[0].type"));
    }
}
