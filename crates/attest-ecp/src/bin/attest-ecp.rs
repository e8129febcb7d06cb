//! Standalone `ecp` runtime: the same subcommands `attest-engine ecp` offers,
//! with LLM judges through an OpenAI-compatible endpoint and no Attest
//! evaluator (the `attest` grader reports that it is unavailable).

use std::sync::Arc;

use attest_ecp::{EcpCommand, OpenAiJudgeHost};
use clap::Parser;

#[derive(Parser)]
#[command(name = "attest-ecp", version, about = "ECP runtime: run, validate, conformance, init, trend")]
struct Cli {
    #[command(flatten)]
    ecp: EcpCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = rt.block_on(async {
        let host = OpenAiJudgeHost::from_env()?;
        attest_ecp::run_command(cli.ecp, Arc::new(host)).await
    });
    match code {
        Ok(c) => std::process::ExitCode::from(u8::try_from(c).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
