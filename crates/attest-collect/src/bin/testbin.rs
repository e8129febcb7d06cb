//! Test harness binary: `collect` and `worker` wired to the integration tests'
//! tool-name evaluator. The product binary is attest-engine, which wires the
//! engine's evaluator instead.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

#[path = "../../tests/integration/support/tool_evaluator.rs"]
mod tool_evaluator;

#[derive(Parser)]
#[command(name = "attest-collect-testbin")]
#[allow(clippy::large_enum_variant)]
enum Command {
    Collect(attest_collect::CollectArgs),
    Worker(attest_collect::WorkerArgs),
}

#[tokio::main]
async fn main() {
    let delay = std::env::var("ATTEST_COLLECT_TEST_EVAL_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fail_trace = std::env::var("ATTEST_COLLECT_TEST_FAIL_TRACE").ok();
    let evaluator = Arc::new(tool_evaluator::ToolEvaluator {
        delay: Duration::from_millis(delay),
        fail_trace,
    });
    // The product's log channel, as `attest-engine` installs it: the tests
    // read the same lines from both binaries.
    let result = match Command::parse() {
        Command::Collect(args) => {
            attest_log::init(attest_log::Level::Info, "collect");
            attest_collect::run_collect(args, evaluator, None).await
        }
        Command::Worker(args) => {
            attest_log::init(attest_log::Level::Info, "worker");
            attest_collect::run_worker(args, evaluator, None).await
        }
    };
    let code = result.unwrap_or_else(|e| {
        tracing::error!("{e:#}");
        2
    });
    attest_log::flush(Duration::from_millis(500));
    std::process::exit(code);
}
