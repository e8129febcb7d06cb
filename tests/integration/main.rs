//! The engine's integration tests: one binary, a module per area. Every
//! test spawns the real `attest-engine` binary (`CARGO_BIN_EXE_attest-engine`)
//! and talks to it as a client would; `common` holds the harness.
//!
//! One binary rather than one per area: each was linked on its own with the
//! whole harness and its dependencies (14 binaries, 203 MB in a debug build;
//! now one of 59 MB, linked once).

mod common;

mod alerts;
mod capabilities;
mod eval_cli;
mod front_doors;
mod history;
mod hostile_input;
mod lifecycle;
mod plugins;
mod protocol;
mod providers;
mod results;
mod trace_tree;
mod validation;
mod viewer;
