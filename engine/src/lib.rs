//! attest-engine: the Attest evaluation engine as a product.
//!
//! SDKs spawn the `attest-engine` binary and talk JSON-RPC 2.0 over NDJSON on
//! stdin/stdout; `eval`, `plugin`, `collect`, `worker` and `ecp` reach the
//! same evaluator without the wire, and `calibrate` reaches its judge (layer
//! 6). This crate is the thin layer around `attest-core`'s evaluator: the
//! front doors, sessions, params, configuration, reports, and the one place
//! domain errors become JSON-RPC errors (`docs/architecture.md` is the map).
//!
//! Where things live:
//! - [`server`]: the request loop, concurrency, back-pressure, draining, dispatch.
//! - [`unanswered`]: requests not yet answered, which a drain that gives up answers.
//! - [`session`]: session state, `initialize`, `shutdown`, counters, the backends.
//! - [`batch`]: `evaluate_batch` around the evaluator, result shaping, `Suite`.
//! - [`sinks`]: where evaluations are recorded (`request_id` cache, history,
//!   session log, spending).
//! - [`errors`]: domain errors to JSON-RPC errors.
//! - [`plugin_results`], [`query_drift`], [`simulation`]: the other methods.
//! - [`config`], [`logging`], [`report`], [`alerts`]: configuration, stderr
//!   logs, session reports, drift alerts.
//! - [`eval_cmd`], [`calibrate_cmd`], [`plugin_cmd`], [`plugin_new`],
//!   [`collect_host`], [`ecp_host`]: the front doors besides the stdio server.
//!
//! Re-exported under one path: [`protocol`], [`params`], [`json_errors`],
//! [`transport`] (`attest-protocol`); [`trace`], [`layers`], [`evaluator`],
//! [`lane`], [`watchdog`] (`attest-core`, with layers 5, 6 and 8 from the
//! backends); [`plugins`] (`attest-plugin-host`), [`providers`]
//! (`attest-providers`), [`history`] (`attest-history`); [`target`],
//! [`text`] (`attest-trace`).

#![forbid(unsafe_code)]

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
pub use attest_log as logging;
pub mod plugin_cmd;
pub mod plugin_models;
pub mod plugin_new;
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
pub mod unanswered;
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
