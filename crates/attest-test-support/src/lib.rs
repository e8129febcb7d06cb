//! How an integration test steps aside when the machine lacks something it
//! drives from outside the workspace: a Python venv with a real client, a
//! server binary, a browser, the built engine.
//!
//! On a developer's machine such a test passes with a loud note, so that
//! `cargo test` stays usable without every third-party tool installed. Where
//! the tools are meant to be there (CI exports `ATTEST_TESTS_REQUIRE_ALL=1`,
//! and `scripts/test` installs them), a missing one fails the test instead: a
//! suite that skipped its real clients must not look like a suite that passed.

#![forbid(unsafe_code)]

use std::io::Write;

mod postgres;
pub use postgres::PostgresServer;

/// A loopback port nothing listens on now (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "ATTEST_TESTS_REQUIRE_ALL";

/// Whether skips are refused in this run.
pub fn skips_refused() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Reports that `what` is missing and how to provide it, then returns `None`
/// for the caller to skip with. Panics instead when skips are refused.
pub fn missing<T>(what: &str, how: &str) -> Option<T> {
    if skips_refused() {
        panic!("{what}, and {REQUIRE_ALL} is set, so the test may not skip: {how}");
    }
    // Written to the process's stderr, past the harness's capture, so it shows
    // even though the test passes.
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {what}. {how}\n");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_none_unless_refused() {
        // The variable is process-wide, so both cases run in one test.
        std::env::remove_var(REQUIRE_ALL);
        assert_eq!(missing::<u8>("a tool is missing", "install it"), None);
        std::env::set_var(REQUIRE_ALL, "0");
        assert!(!skips_refused());
        std::env::set_var(REQUIRE_ALL, "1");
        let refused = std::panic::catch_unwind(|| missing::<u8>("a tool is missing", "install it"));
        std::env::remove_var(REQUIRE_ALL);
        let message = refused.expect_err("a refused skip panics");
        let message = message.downcast_ref::<String>().expect("a formatted message");
        assert!(message.contains("a tool is missing") && message.contains("install it"), "{message}");
    }
}
