//! attest-collect's integration tests: one binary, a module per area (as
//! ripgrep's `tests/integration`), so the crate links its test harness
//! once. `cargo test -p attest-collect --test integration nats_crash::`
//! runs one area.

mod support;

mod bad_input;
mod delivery;
mod fleet_faults;
mod frameworks;
mod nats_crash;
mod nats_hostile;
mod otel_pipeline;
mod otlp_export;
mod quick_start;
mod stalled_output;
