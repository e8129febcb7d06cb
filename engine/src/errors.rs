//! Where the engine's domain errors become JSON-RPC errors.
//!
//! Domain code returns errors named after what the user got wrong (a
//! [`TraceError`] for a trace the protocol refuses, say) and knows nothing
//! of error codes; the wire form, code and field path included, is decided
//! here, once.

use crate::evaluator::EvalError;
use crate::layers::AssertionType;
use crate::protocol::{ErrorCode, RpcError};
use crate::providers::ProviderError;
use crate::sinks::RequestIdReused;
use crate::text::{clip, num, quote};
use crate::trace::validate::TraceError;
use attest_core::suite::SuiteError;
use std::time::Duration;

/// A refused trace is `1001` (`INVALID_TRACE`), naming the member at fault.
pub fn trace_error(e: TraceError) -> RpcError {
    RpcError::new(ErrorCode::InvalidTrace, e.message, e.detail).with_field(e.field)
}

/// An assertion list that is not a suite is `1002`, naming the assertion
/// and the member at fault (`params.assertions[2].spec.check`).
pub fn suite_error(e: SuiteError) -> RpcError {
    let field = format!("params.assertions[{}].{}", e.index(), e.field());
    let error = RpcError::new(ErrorCode::AssertionError, e.to_string(), e.detail()).with_field(field);
    match e.assertion_id() {
        Some(id) => error.with_assertion(id),
        None => error,
    }
}

/// A `request_id` resent for another assertion or trace is `1002`.
pub fn request_id_reused(e: RequestIdReused) -> RpcError {
    RpcError::new(
        ErrorCode::AssertionError,
        e.to_string(),
        "A request_id is an idempotency key: resend it only with the same type, spec and trace. Use a fresh request_id for a new evaluation.",
    )
    .with_assertion(&e.assertion_id)
    .with_field(format!("params.assertions[{}].request_id", e.position))
}

/// An evaluation that stopped: timeouts are `3002`, a spent budget `1002`
/// and a provider failure `2001`, each naming the assertion at fault
/// (`assertion(i)`: its id and type) and the engine's timeout (`limit`).
pub fn eval_error<'a>(e: EvalError, assertion: impl Fn(usize) -> (&'a str, AssertionType), limit: Duration) -> RpcError {
    let timed_out = |detail: String| {
        RpcError::new(
            ErrorCode::Timeout,
            format!("evaluation timed out after {}ms", limit.as_millis()),
            detail,
        )
    };
    match e {
        EvalError::Timeout { done, total } => timed_out(format!(
            "{done} of {total} assertions finished before the deadline. Reduce the batch size or trace size, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT)."
        )),
        EvalError::RegexTimeout => timed_out(
            "Regex checks (regex_match, schema pattern), or a schema that refers to itself, did not finish over this trace before the deadline. Use simpler patterns, give a recursive schema one branch per level, target a smaller field than the whole trace, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT).".into(),
        ),
        EvalError::PaidTimeout { pending, .. } => timed_out(format!(
            "{pending} LLM-backed assertions (layers 5-6) were still waiting for their provider at the deadline. Reduce the batch size, check the provider's latency, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT)."
        )),
        EvalError::BudgetSpent { index, budget, spent } => {
            let (id, kind) = assertion(index);
            RpcError::new(
                ErrorCode::AssertionError,
                format!(
                    "assertion {} ({}) refused: the session's cost budget of ${} is spent (${:.6} so far)",
                    quote(id),
                    kind.name(),
                    num(budget),
                    spent
                ),
                BUDGET_HINT,
            )
            .with_assertion(id)
            .with_field(format!("params.assertions[{index}]"))
        }
        EvalError::Provider { index, error, .. } => {
            let (id, kind) = assertion(index);
            let mut permanent = false;
            let (message, detail) = match error {
                ProviderError::Failed {
                    message,
                    attempts,
                    permanent: true,
                } => {
                    permanent = true;
                    (
                        format!("{message}{}", if attempts > 1 { format!(" (after {attempts} attempts)") } else { String::new() }),
                        "The provider refused the request itself, so retrying it unchanged cannot succeed: check the provider's URL, model name, API key and quota.".to_owned(),
                    )
                }
                ProviderError::Failed { message, attempts, .. } => (
                    format!("{message}{}", if attempts > 1 { format!(" (after {attempts} attempts)") } else { String::new() }),
                    "Wait and retry. The engine retries 429, 5xx, time-outs and connection errors with exponential backoff (up to 3 attempts, honouring Retry-After) before surfacing this error; check the provider's status, URL, model and API key.".to_owned(),
                ),
                ProviderError::Unavailable { message, detail } => (message, detail),
                e @ ProviderError::BudgetSpent { .. } => (e.to_string(), BUDGET_HINT.to_owned()),
                ProviderError::Timeout => (
                    "the provider did not answer before the deadline".to_owned(),
                    "Check the provider's latency, or raise the engine timeout with --eval-timeout (or ATTEST_EVAL_TIMEOUT).".to_owned(),
                ),
            };
            let e = RpcError::new(ErrorCode::ProviderError, format!("assertion {} ({}): {message}", quote(id), kind.name()), detail)
                .with_assertion(id)
                .with_field(format!("params.assertions[{index}]"));
            if permanent {
                e.not_retryable()
            } else {
                e
            }
        }
    }
}

/// What to do about a spent session budget.
const BUDGET_HINT: &str = "Paid assertions (embedding, llm_judge) are refused once a session's evaluated cost reaches budget_usd. Raise budget_usd in the config file or start a new engine session; layers 1-4, 7 and 8 still run.";

/// A trace text that is not JSON at all is `1001`.
pub fn trace_not_json(e: &serde_json::Error) -> RpcError {
    RpcError::new(
        ErrorCode::InvalidTrace,
        format!("trace is not valid JSON: {}", clip(&e.to_string(), 200)),
        "Send the trace as a JSON object.",
    )
    .with_field("trace")
}

/// A paid assertion whose layer has no provider is `2001`, found before
/// anything runs, and not worth retrying as is.
pub fn provider_missing(e: ProviderError, index: usize, assertion_id: &str, kind: AssertionType) -> RpcError {
    let (message, detail) = match e {
        ProviderError::Unavailable { message, detail } => (message, detail),
        other => (other.to_string(), "See README, Layers 5 and 6.".to_owned()),
    };
    RpcError::new(
        ErrorCode::ProviderError,
        format!("assertion {} ({}): {message}", quote(assertion_id), kind.name()),
        detail,
    )
    .not_retryable()
    .with_assertion(assertion_id)
    .with_field(format!("params.assertions[{index}]"))
}

/// `generate_user_message`'s provider failures: a timeout is `3002`, the
/// rest `2001`.
pub fn simulation_failed(e: ProviderError) -> RpcError {
    match e {
        ProviderError::Timeout => RpcError::new(
            ErrorCode::Timeout,
            "generate_user_message timed out",
            "The provider did not answer before the engine's deadline; raise --eval-timeout or check the provider.",
        ),
        ProviderError::Failed { message, .. } => RpcError::new(
            ErrorCode::ProviderError,
            format!("generate_user_message failed: {message}"),
            "Check LLM provider availability and retry.",
        ),
        e @ ProviderError::BudgetSpent { .. } => RpcError::new(
            ErrorCode::AssertionError,
            format!("generate_user_message refused: {e}"),
            BUDGET_HINT,
        ),
        // Configuration, not a fault: retrying cannot help.
        ProviderError::Unavailable { message, detail } => RpcError::new(
            ErrorCode::ProviderError,
            format!("generate_user_message needs an LLM: {message}"),
            detail,
        )
        .not_retryable(),
    }
}

/// `query_drift` on an engine without a history: configuration, not a fault.
pub fn history_unavailable() -> RpcError {
    RpcError::new(
        ErrorCode::ProviderError,
        "history store not available",
        "Result history is off or could not be opened (see the engine log). Enable it with history = true in the config file (or unset ATTEST_HISTORY=false, drop --no-history) and make sure the cache directory (ATTEST_CACHE_DIR) is writable.",
    )
    .not_retryable()
}

/// The history could not be read: `3001`.
pub fn history_failed(e: &anyhow::Error) -> RpcError {
    if e.is::<crate::history::Unanswered>() {
        return RpcError::new(
            ErrorCode::Timeout,
            format!("query_drift timed out: {e}"),
            "The history writer runs at low priority and answers after writing the results queued before the query. Retry once the engine is less busy, or raise --eval-timeout.",
        );
    }
    RpcError::new(
        ErrorCode::EngineError,
        format!("query_drift failed: {e}"),
        "The history database could not be read; see the engine log.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::SpecError;

    #[test]
    fn a_history_past_the_deadline_is_a_timeout() {
        let slow = history_failed(&anyhow::Error::new(crate::history::Unanswered));
        assert_eq!(slow.code, ErrorCode::Timeout);
        assert!(slow.message.starts_with("query_drift timed out"), "{}", slow.message);
        let broken = history_failed(&anyhow::anyhow!("disk I/O error"));
        assert_eq!(broken.code, ErrorCode::EngineError);
    }

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
        let e = suite_error(SuiteError::Spec {
            index: 2,
            id: "a3".into(),
            kind: AssertionType::Content,
            error: SpecError::new("spec.check", "unknown check 'contain'", "Valid checks: contains, ..."),
        });
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.message, "assertion 'a3' (content): unknown check 'contain'");
        assert_eq!(e.detail, "Valid checks: contains, ...");
        assert_eq!(e.assertion_id.as_deref(), Some("a3"));
        assert_eq!(e.field.as_deref(), Some("params.assertions[2].spec.check"));
    }

    #[test]
    fn an_assertion_without_an_id_is_1002_naming_its_position() {
        let e = suite_error(SuiteError::MissingId { index: 4, empty: false });
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.message, "assertions[4] missing required field: assertion_id");
        assert_eq!(e.detail, attest_core::suite::ASSERTIONS_SHAPE);
        assert_eq!(e.assertion_id, None);
        assert_eq!(e.field.as_deref(), Some("params.assertions[4].assertion_id"));
    }
}
