//! Standalone `ecp` runtime: the same subcommands `attest-engine ecp` offers,
//! without the Attest evaluator or a model provider: `attest` and
//! `llm_judge` graders report that they are unavailable and name the
//! command that has them (`attest-engine ecp run`).

use std::sync::Arc;

use attest_ecp::{EcpCommand, StandaloneHost};
use clap::Parser;

#[derive(Parser)]
#[command(name = "attest-ecp", version, about = "ECP runtime: run, validate, conformance, init, trend")]
struct Cli {
    #[command(flatten)]
    ecp: EcpCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    attest_log::init(attest_log::Level::Info, "ecp");
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = rt.block_on(async { attest_ecp::run_command(cli.ecp, Arc::new(StandaloneHost)).await });
    let code = match code {
        Ok(c) => std::process::ExitCode::from(u8::try_from(c).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    };
    attest_log::flush(std::time::Duration::from_millis(500));
    code
}
