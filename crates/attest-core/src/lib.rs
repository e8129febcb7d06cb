//! attest-core: what evaluating a trace needs, and nothing it does not.
//!
//! - [`trace`]: the trace model, its validation (Attest protocol v1 §7) and
//!   the agent tree of layer 7;
//! - [`layers`]: the spec reader, the assertion types, verdicts and evidence,
//!   and the layers evaluated natively: schema (1), constraint (2), trace (3),
//!   content (4) and trace tree (7), behind one [`layers::NativeCheck`];
//! - [`watchdog`]: the regex threads that long scans and schema patterns run on.
//!
//! It has no wire (no JSON-RPC errors: trace and spec errors are typed, and
//! the engine converts them), no sandbox, no model providers and no storage,
//! so its tests build without wasmtime, the embedding model, reqwest or SQLite. The
//! engine's plugin host (layer 8) and providers (layers 5 and 6) sit on top.

#![forbid(unsafe_code)]

pub mod backends;
pub mod drift;
pub mod evaluator;
pub mod lane;
pub mod layers;
pub mod suite;
pub mod trace;
pub mod watchdog;

/// Field paths for JSON that parses but cannot become a value.
use attest_trace::json_errors;
/// The target/field grammar shared with the plugin SDK.
pub use attest_trace::target;
/// Bounded quoting and number formatting, shared with the plugin SDK.
pub use attest_trace::text;
