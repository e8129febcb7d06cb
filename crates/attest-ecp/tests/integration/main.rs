//! attest-ecp's integration tests: one binary, a module per area (as
//! ripgrep's `tests/integration`). `cargo test -p attest-ecp --test
//! integration runtime::` runs one area.

mod common;

mod attest_grader;
mod compare;
mod engine_binary;
mod runtime;
