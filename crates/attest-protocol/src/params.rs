//! The one rule for malformed `params`, for every method:
//!
//! - `params` that is not an object (an array or a scalar) is `-32602`,
//!   with `field: "params"`; absent params read as `{}`.
//! - A member that is missing, of the wrong type, out of range or
//!   unrepresentable (`1e400`, a lone surrogate, nesting past 128 levels) gets
//!   the method's domain code: `1001` for a trace (`evaluate_batch`,
//!   `validate_trace_tree`), `1002` for every other member of
//!   `evaluate_batch`, `submit_plugin_result`, `query_drift` and
//!   `generate_user_message`. Methods without a domain code (`initialize`,
//!   `shutdown`, `list_plugins`, `cache_stats`) use `-32602` for members too.
//!
//! Errors always name the member as a path (`params.result.score`).

use crate::protocol::{ErrorCode, Method, RpcError};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The code a malformed member of `method`'s params gets.
pub fn member_code(method: Method) -> ErrorCode {
    match method {
        Method::ValidateTraceTree => ErrorCode::InvalidTrace,
        Method::EvaluateBatch | Method::SubmitPluginResult | Method::QueryDrift | Method::GenerateUserMessage => ErrorCode::AssertionError,
        Method::Initialize | Method::Shutdown | Method::ListPlugins | Method::CacheStats => ErrorCode::InvalidParams,
    }
}

/// `params` must be an object (or absent); `-32602` otherwise.
pub fn require_object(method: Method, params: Option<&RawValue>) -> Result<(), RpcError> {
    match params.map(|p| p.get().as_bytes().first()) {
        None | Some(Some(b'{')) => Ok(()),
        Some(_) => Err(not_an_object(method)),
    }
}

fn not_an_object(method: Method) -> RpcError {
    RpcError::invalid_params(
        format!("{} params must be an object", method.name()),
        "Send params as a JSON object of named members (positional array params are not supported).",
    )
    .with_field("params")
}

/// Reads `params` into an object; absent params are `{}`.
pub fn object(method: Method, params: Option<&RawValue>) -> Result<Map<String, Value>, RpcError> {
    require_object(method, params)?;
    let Some(raw) = params else {
        return Ok(Map::new());
    };
    serde_json::from_str(raw.get()).map_err(|e| match crate::json_errors::unrepresentable(raw.get(), &e, "params") {
        Some(u) => RpcError::new(member_code(method), u.message, crate::json_errors::PLAIN_JSON_HINT).with_field(u.field),
        None => not_an_object(method),
    })
}

/// A member error from typed (serde) reading of `text`, the params of
/// `method`: named by path, in the method's domain code, with the parser's
/// position dropped and every echoed value bounded.
pub fn member_error(method: Method, text: &str, e: &serde_json::Error, shape: &str) -> RpcError {
    if let Some(u) = crate::json_errors::unrepresentable(text, e, "params") {
        return RpcError::new(member_code(method), u.message, shape).with_field(u.field);
    }
    let offset = text.lines().take(e.line().saturating_sub(1)).map(|l| l.len() + 1).sum::<usize>() + e.column().saturating_sub(1);
    let field = crate::json_errors::path_at(text, offset, "params");
    let what = e.to_string();
    let what = what.rsplit_once(" at line ").map_or(what.as_str(), |(w, _)| w);
    RpcError::new(
        member_code(method),
        format!("invalid {} params at {field}: {}", method.name(), crate::text::clip(what, 160)),
        shape,
    )
    .with_field(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn non_objects_are_invalid_params_for_every_method() {
        for m in Method::ALL {
            let e = object(m, Some(&raw("[1,2]"))).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParams, "{m:?}");
            assert_eq!(e.field.as_deref(), Some("params"));
        }
    }

    #[test]
    fn unrepresentable_members_get_the_domain_code_and_path() {
        let e = object(Method::QueryDrift, Some(&raw(r#"{"window_size":1e400}"#))).unwrap_err();
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.field.as_deref(), Some("params.window_size"));
        assert!(e.message.starts_with("number out of range"), "{}", e.message);
    }

    #[test]
    fn absent_params_are_empty() {
        assert!(object(Method::ListPlugins, None).unwrap().is_empty());
    }
}
