//! The Attest protocol v1 wire, apart from what travels on it.
//!
//! - [`protocol`]: JSON-RPC 2.0 envelopes, the method names and error codes,
//!   and `RpcError`, the one type a domain error becomes on the wire;
//! - [`params`]: the one rule for malformed `params`;
//! - [`json_errors`]: field paths for JSON that parses but cannot become a value;
//! - [`transport`]: bounded NDJSON framing on stdin/stdout.
//!
//! The engine's server, session and evaluator sit on top; nothing here
//! knows about traces or assertions.

#![forbid(unsafe_code)]

/// JSON error locations, from `attest-trace` (trace validation names fields with them too).
pub use attest_trace::json_errors;
pub mod params;
pub mod protocol;
pub mod transport;

/// Bounded quoting for every string echoed from input.
pub(crate) use attest_trace::text;
