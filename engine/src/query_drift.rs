//! `query_drift`'s params: what to look up in the result history, and over
//! how many results.

use crate::batch::MAX_ASSERTION_ID_BYTES;
use crate::history::{Fingerprint, Subject};
use crate::layers::spec::type_name;
use crate::protocol::{ErrorCode, Method, RpcError};
use crate::text::quote;
use serde_json::Value;

/// Largest `window_size` `query_drift` accepts.
pub const MAX_WINDOW: u64 = 10_000;
const DEFAULT_WINDOW: u64 = 50;
const QUERY_SHAPE: &str =
    "Send {\"assertion_id\": str} or {\"fingerprint\": str (32 hex digits, from an earlier report)}, with an optional \"window_size\": 1-10000 (default 50).";

/// Reads `query_drift` params into what to look up and the window size.
pub fn parse_query(params: Option<&serde_json::value::RawValue>) -> Result<(Subject, u64), RpcError> {
    let bad = |field: &str, message: String| {
        let path = if field.is_empty() {
            "params".to_owned()
        } else {
            format!("params.{field}")
        };
        RpcError::new(ErrorCode::AssertionError, message, QUERY_SHAPE).with_field(path)
    };
    let map = crate::params::object(Method::QueryDrift, params)?;
    let window = match map.get("window_size") {
        None | Some(Value::Null) => DEFAULT_WINDOW,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_WINDOW).contains(&n) => n,
            // The SDK documents 0 as "the default".
            Some(0) => DEFAULT_WINDOW,
            _ => {
                return Err(bad(
                    "window_size",
                    format!(
                        "query_drift window_size must be a whole number from 1 to {MAX_WINDOW}, got {}",
                        type_name(v)
                    ),
                ))
            }
        },
    };
    let text = |key: &str| match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() > MAX_ASSERTION_ID_BYTES => Err(bad(
            key,
            format!(
                "query_drift {key} exceeds maximum length: {} > {} bytes",
                s.len(),
                MAX_ASSERTION_ID_BYTES
            ),
        )),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(bad(key, format!("query_drift {key} must be a non-empty string"))),
    };
    match (text("fingerprint")?, text("assertion_id")?) {
        (Some(f), _) => match Fingerprint::parse(&f) {
            Some(fp) => Ok((Subject::Fingerprint(fp), window)),
            None => Err(bad(
                "fingerprint",
                format!("query_drift fingerprint {} is not 32 hex digits", quote(&f)),
            )),
        },
        (None, Some(id)) => Ok((Subject::AssertionId(id), window)),
        (None, None) => Err(bad(
            "assertion_id",
            "query_drift missing required field: assertion_id (or fingerprint)".into(),
        )),
    }
}
