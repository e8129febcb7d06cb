//! `query_drift`'s params: what to look up in the result history, and over
//! how many results.

use crate::batch::MAX_ASSERTION_ID_BYTES;
use crate::history::{Fingerprint, Subject};
use crate::layers::spec::type_name;
use crate::params::{Members, Wording};
use crate::protocol::{Method, RpcError};
use crate::text::quote;
use serde_json::value::RawValue;

/// Largest `window_size` `query_drift` accepts.
pub const MAX_WINDOW: u64 = 10_000;
const DEFAULT_WINDOW: u64 = 50;
const QUERY_SHAPE: &str =
    "Send {\"assertion_id\": str} or {\"fingerprint\": str (32 hex digits, from an earlier report)}, with an optional \"window_size\": 1-10000 (default 50, also sent as 0).";

/// Reads `query_drift` params into what to look up and the window size.
pub fn parse_query(params: Option<&RawValue>) -> Result<(Subject, u64), RpcError> {
    let map = crate::params::object(Method::QueryDrift, params, &["window_size", "fingerprint", "assertion_id"])?;
    let p = Members::new(Method::QueryDrift, &map, QUERY_SHAPE, Wording::Method);
    let window = match p.get("window_size") {
        None => DEFAULT_WINDOW,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_WINDOW).contains(&n) => n,
            // The SDK documents 0 as "the default".
            Some(0) => DEFAULT_WINDOW,
            _ => {
                return Err(p.error(
                    "window_size",
                    format!(
                        "query_drift window_size must be a whole number from 1 to {MAX_WINDOW} (or 0 for the default, {DEFAULT_WINDOW}), got {}",
                        type_name(v)
                    ),
                ))
            }
        },
    };
    match (
        p.id("fingerprint", MAX_ASSERTION_ID_BYTES)?,
        p.id("assertion_id", MAX_ASSERTION_ID_BYTES)?,
    ) {
        (Some(f), _) => match Fingerprint::parse(f) {
            Some(fp) => Ok((Subject::Fingerprint(fp), window)),
            None => Err(p.error("fingerprint", format!("query_drift fingerprint {} is not 32 hex digits", quote(f)))),
        },
        (None, Some(id)) => Ok((Subject::AssertionId(id.to_owned()), window)),
        (None, None) => Err(p.error("assertion_id", "query_drift missing required field: assertion_id (or fingerprint)")),
    }
}
