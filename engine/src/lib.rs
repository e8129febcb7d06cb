//! attest-engine: the Attest evaluation engine.
//!
//! SDKs spawn the `attest-engine` binary and talk JSON-RPC 2.0 over NDJSON on
//! stdin/stdout. This crate is that engine as a library, so the binary, the
//! `eval` command and the tests all drive the same code.
//!
//! Where things live:
//! - [`protocol`], [`params`], [`json_errors`], [`transport`]: the wire, from
//!   the `attest-protocol` crate: JSON-RPC envelopes and error codes, the rule
//!   for malformed params, bounded NDJSON framing on stdin/stdout.
//! - [`server`]: the request loop, concurrency, back-pressure and draining.
//! - [`session`]: session state, `initialize`, `shutdown`, counters.
//! - [`trace`], [`watchdog`]: the trace model and its validation (Attest
//!   protocol v1 §7) and the regex threads, from the `attest-core` crate,
//!   which also holds the native layers.
//! - [`target`], [`text`]: the target/field grammar and bounded quoting, from
//!   the `attest-trace` crate the plugin SDK uses too.
//! - [`layers`]: the compiled assertion over the core's native layers and
//!   the engine's own (embedding, llm_judge, plugin).
//! - [`batch`]: `evaluate_batch` orchestration and the idempotency cache.
//! - [`plugin_results`]: `submit_plugin_result` validation and recording.
//! - [`plugins`]: the WebAssembly plugin host (layer 8) and its sandbox.
//! - [`providers`]: embedding and LLM judge providers (layers 5 and 6), their cache.
//! - [`config`], [`logging`], [`eval_cmd`]: configuration, stderr logs, the CLI evaluator.

pub use attest_protocol::{json_errors, params, protocol, transport};
pub mod alerts;
pub mod batch;
pub mod calibrate_cmd;
pub mod collect_host;
pub mod config;
pub mod ecp_host;
pub mod errors;
/// The wire-free evaluator, from `attest-core`.
pub use attest_core::evaluator;
pub mod eval_cmd;
/// Where a request's work runs, from `attest-core`.
pub use attest_core::lane;
/// The result history, from `attest-history`.
pub use attest_history as history;
pub mod layers;
pub mod logging;
pub mod plugin_results;
pub mod query_drift;
/// The WebAssembly plugin host (layer 8), from `attest-plugin-host`.
pub use attest_plugin_host as plugins;
/// The model providers of layers 5 and 6, from `attest-providers`.
pub use attest_providers as providers;
pub mod report;
pub mod server;
pub mod session;
pub mod simulation;
pub mod sinks;
/// The trace model and its validation, from `attest-core`.
pub use attest_core::trace;
/// The regex threads, from `attest-core`.
pub use attest_core::watchdog;
/// The target/field grammar shared with the plugin SDK (`attest-trace`).
pub use attest_trace::target;
/// Bounded quoting and number formatting, shared with the plugin SDK.
pub use attest_trace::text;

/// The engine's semver, reported by `initialize` and `--version`.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
