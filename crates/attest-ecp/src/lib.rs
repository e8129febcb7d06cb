//! An ECP (Evaluation Context Protocol) runtime: it drives agents over
//! JSON-RPC (stdio or Streamable HTTP) through the scenarios of a YAML
//! manifest, grades every step, and writes JSON, audit, HTML and JUnit
//! reports. Grading that needs an evaluator (Attest assertions, LLM judges)
//! goes through a [`GradingHost`] supplied by the program embedding this crate.
//!
//! Entry points: [`EcpCommand`] (the `ecp` subcommands, for clap) and
//! [`run_command`].

pub mod commands;
pub mod grade;
pub mod host;
pub mod manifest;
pub mod python_regex;
pub mod report;
pub mod runner;
pub mod trace;
pub mod transport;
mod util;

use std::path::PathBuf;
use std::sync::Arc;

pub use host::{
    BoxFuture, CheckResult, GradeError, GradeOutcome, GradeStatus, GradingHost, JudgeRequest, JudgeVerdict, StandaloneHost,
    DEFAULT_JUDGE_MODEL,
};

/// `ecp` subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct EcpCommand {
    #[command(subcommand)]
    pub action: EcpAction,
}

/// The variables `ecp run` reads, as the reference runtime does (`--help`).
const RUN_ENVIRONMENT: &str = "Environment:
  ECP_RPC_TIMEOUT            default of --timeout (a duration or seconds; else 30s)
  ECP_MAX_DURATION           default of --max-duration (else unlimited)
  ECP_LLM_JUDGE_MODEL        the llm_judge grader's model (else the engine's judge model, or gpt-4o-mini)
  ECP_LLM_JUDGE_TEMPERATURE  the llm_judge grader's temperature (default 0)
  OPENAI_API_KEY             llm_judge without a judge configured for the engine: the endpoint's key
  OPENAI_API_BASE            ... and its base URL (also OPENAI_BASE_URL; default https://api.openai.com/v1)
  NO_COLOR                   no colour in progress lines
Model providers' credentials and settings (OPENAI_*, ANTHROPIC_*, ...) also reach the agent; see --pass-env.";

#[derive(Debug, Clone, clap::Subcommand)]
pub enum EcpAction {
    /// Run the scenarios of a manifest against its agent and grade them.
    #[command(allow_negative_numbers = true, after_long_help = RUN_ENVIRONMENT)]
    Run(RunArgs),
    /// Check a manifest without running the agent.
    Validate {
        /// The manifest YAML file.
        manifest: PathBuf,
    },
    /// Check that an agent honours the protocol contract (initialize, step, reset).
    #[command(allow_negative_numbers = true)]
    Conformance(ConformanceArgs),
    /// Write a starter agent (Python, ecp-sdk) and a manifest that passes on first run.
    Init {
        /// Directory for the starter files.
        #[arg(default_value = "ecp_eval")]
        directory: PathBuf,
        /// Overwrite existing starter files.
        #[arg(long)]
        force: bool,
    },
    /// Pass-rate trend across saved JSON reports.
    #[command(allow_negative_numbers = true)]
    Trend(TrendArgs),
}

/// Where `run` writes each of its reports.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outputs {
    pub html: Option<PathBuf>,
    pub json: Option<PathBuf>,
    pub audit: Option<PathBuf>,
    pub junit: Option<PathBuf>,
}

impl RunArgs {
    /// The reports asked for, by `--report` (a path, or `KIND=PATH`) and by
    /// `--json-out`, `--audit-out` and `--junit`; a report asked for twice
    /// is refused, naming both.
    pub fn outputs(&self) -> Result<Outputs, String> {
        let mut out = Outputs {
            html: None,
            json: self.json_out.clone(),
            audit: self.audit_out.clone(),
            junit: self.junit.clone(),
        };
        for given in &self.reports {
            let (kind, path) = match given.split_once('=') {
                Some((kind @ ("html" | "json" | "junit" | "audit"), path)) => (kind, path),
                Some((kind, _)) if matches!(kind, "markdown" | "md" | "xml" | "text") => {
                    return Err(format!(
                        "--report {given}: ecp run writes no {kind} report; valid kinds: html, json, junit, audit (or give a path for the HTML report)"
                    ))
                }
                _ => ("html", given.as_str()),
            };
            if path.is_empty() {
                return Err(format!("--report {given}: the path is empty; give {kind}=PATH"));
            }
            let slot = match kind {
                "html" => &mut out.html,
                "json" => &mut out.json,
                "junit" => &mut out.junit,
                _ => &mut out.audit,
            };
            if let Some(before) = slot.replace(PathBuf::from(path)) {
                return Err(format!(
                    "--report {given}: the {kind} report is already written to {}; ask for each report once",
                    before.display()
                ));
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Run options")]
pub struct RunArgs {
    /// The manifest YAML file.
    #[arg(long, short = 'm')]
    pub manifest: PathBuf,
    /// Write a report (repeatable): FILE is the self-contained HTML report,
    /// as the reference's --report; KIND=PATH as the engine's other commands
    /// take it, with KIND html, json, junit or audit.
    #[arg(long = "report", value_name = "FILE|KIND=PATH")]
    pub reports: Vec<String>,
    /// Print the JSON report on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Write the audit record here.
    #[arg(long)]
    pub audit_out: Option<PathBuf>,
    /// Write JUnit XML here (one testsuite per scenario, one testcase per step).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// How long to wait for each agent call: a duration (30s, 1500ms) or a
    /// number of seconds (default: ECP_RPC_TIMEOUT or 30s).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// How long the whole run may take: a duration (10m) or a number of
    /// seconds (default: ECP_MAX_DURATION, else unlimited).
    #[arg(long, value_name = "DURATION")]
    pub max_duration: Option<String>,
    /// Exit with status 2 when any check fails (the default).
    #[arg(long, overrides_with = "no_fail_on_error")]
    pub fail_on_error: bool,
    /// Exit with status 0 even when checks fail.
    #[arg(long)]
    pub no_fail_on_error: bool,
    /// Scenarios run in parallel, each with its own agent process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// No progress lines on stderr, and the engine logs at warn unless a log level was set.
    #[arg(long, short = 'q', conflicts_with = "verbose")]
    pub quiet: bool,
    /// Progress lines give the reason of every check, not only failed ones.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Send every graded check as a `gen_ai.evaluation.result` OpenTelemetry event to this OTLP
    /// endpoint (http://host:4318; http://host:4317 with --export-otlp-protocol grpc).
    #[arg(long, value_name = "URL")]
    pub export_otlp: Option<String>,
    /// The endpoint's protocol: http (protobuf) or grpc.
    #[arg(long, value_parser = ["http", "grpc"], default_value = "http", requires = "export_otlp")]
    pub export_otlp_protocol: String,
    #[command(flatten)]
    pub env: AgentEnvArgs,
    #[command(flatten)]
    pub limits: AgentLimitArgs,
}

/// Which of the runtime's environment variables a spawned agent gets.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Agent environment")]
pub struct AgentEnvArgs {
    /// Pass this variable of the runtime's environment to the agent, beyond the basic set and the
    /// model providers' credentials and settings passed by default (repeatable; a glob such as
    /// 'MYAPP_*' passes every match).
    #[arg(long = "pass-env", value_name = "NAME|GLOB")]
    pub pass_env: Vec<String>,
    /// Pass the runtime's whole environment to the agent, as the reference runtime does.
    #[arg(long)]
    pub inherit_env: bool,
}

impl AgentEnvArgs {
    /// Every `--pass-env` entry can name a variable; else the error to print.
    pub fn check(&self) -> Result<(), String> {
        for name in &self.pass_env {
            transport::check_env_name(name).map_err(|why| format!("--pass-env {name:?}: {why}"))?;
        }
        Ok(())
    }
}

/// What each process of a spawned agent may use (Linux).
#[derive(Debug, Clone, clap::Args)]
pub struct AgentLimitArgs {
    /// Memory each agent process may allocate: a size (4GiB, 512MiB), or a
    /// bare number of MiB as the older --agent-memory-mib took (0: no limit).
    #[arg(long = "agent-memory", alias = "agent-memory-mib", value_name = "SIZE", default_value = "4GiB", value_parser = memory_limit)]
    pub agent_memory_bytes: u64,
    /// CPU time each agent process may use: a duration (30s, 5m), or a bare
    /// number of seconds as the older --agent-cpu-secs took (default: no
    /// limit beyond the timeouts).
    #[arg(long = "agent-cpu", alias = "agent-cpu-secs", value_name = "DURATION", value_parser = cpu_limit)]
    pub agent_cpu_secs: Option<u64>,
}

impl AgentLimitArgs {
    pub fn agent_limits(&self) -> transport::AgentLimits {
        transport::AgentLimits {
            memory_bytes: (self.agent_memory_bytes > 0).then_some(self.agent_memory_bytes),
            cpu_secs: self.agent_cpu_secs,
        }
    }
}

/// `--agent-memory`: a size with its unit, or a bare number of MiB.
fn memory_limit(s: &str) -> Result<u64, String> {
    attest_io::size_with_unit(s, 1 << 20)
        .ok_or_else(|| format!("'{s}' is not a size; give it with its unit (4GiB, 512MiB), a number of MiB, or 0 for no limit"))
}

/// `--agent-cpu`: whole seconds, at least 1, with a unit or bare.
fn cpu_limit(s: &str) -> Result<u64, String> {
    let secs = match s.trim().parse::<u64>() {
        Ok(n) => n,
        Err(_) => attest_io::whole_seconds(s).map_err(|problem| match problem {
            attest_io::DurationProblem::NotADuration(e) => format!("'{s}' is not a duration ({e}); give it with its unit: 30s, 5m"),
            attest_io::DurationProblem::NotWhole => format!("'{s}' is not a whole number of seconds; give 1s or more"),
        })?,
    };
    if secs == 0 {
        return Err("the CPU limit must be at least 1s".into());
    }
    Ok(secs)
}

#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Conformance options")]
pub struct ConformanceArgs {
    /// Agent command or http(s):// endpoint.
    #[arg(required_unless_present = "target_opt")]
    pub target: Option<String>,
    /// Agent command or http(s):// endpoint (same as the positional argument).
    #[arg(long = "target", short = 't')]
    pub target_opt: Option<String>,
    /// Input for the conformance agent/step call.
    #[arg(long, default_value = "hello")]
    pub input: String,
    /// Write the conformance report (JSON) here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Print only the JSON conformance report.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each call: a duration (30s, 1500ms) or a number
    /// of seconds (default: ECP_RPC_TIMEOUT or 30s).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    #[command(flatten)]
    pub env: AgentEnvArgs,
    #[command(flatten)]
    pub limits: AgentLimitArgs,
}

#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Trend options")]
pub struct TrendArgs {
    /// Glob of saved JSON reports, e.g. 'results/run-*.json'.
    pub pattern: String,
    /// How many of the most recent reports to analyse.
    #[arg(long, short = 'w', default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub window: u32,
    /// Exit with status 2 when the pass rate is degrading.
    #[arg(long)]
    pub exit_on_regression: bool,
    /// Print the analysis as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run one `ecp` subcommand; returns the process exit code
/// (0 success, 1 usage or input error, 2 failed checks / regression).
pub async fn run_command(cmd: EcpCommand, host: Arc<dyn GradingHost>) -> anyhow::Result<i32> {
    match cmd.action {
        EcpAction::Run(args) => commands::run(args, host).await,
        EcpAction::Validate { manifest } => Ok(commands::validate(&manifest, host.as_ref())),
        ungraded => run_ungraded(ungraded).await,
    }
}

impl EcpAction {
    /// Whether the action grades checks, and so needs a grading host (and
    /// whatever stands behind it: the engine, its configuration).
    pub fn grades(&self) -> bool {
        matches!(self, EcpAction::Run(_) | EcpAction::Validate { .. })
    }
}

/// Runs an action that grades nothing: `conformance`, `init`, `trend`.
pub async fn run_ungraded(action: EcpAction) -> anyhow::Result<i32> {
    match action {
        EcpAction::Conformance(args) => commands::conformance(args).await,
        EcpAction::Init { directory, force } => Ok(commands::init(&directory, force)),
        EcpAction::Trend(args) => Ok(commands::trend(&args)),
        EcpAction::Run(_) | EcpAction::Validate { .. } => {
            anyhow::bail!("`ecp run` and `ecp validate` grade checks: they need a grading host")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_limits_read_sizes_and_durations_and_the_older_bare_numbers() {
        assert_eq!(super::memory_limit("4GiB"), Ok(4 << 30));
        assert_eq!(super::memory_limit("512MiB"), Ok(512 << 20));
        assert_eq!(
            super::memory_limit("256"),
            Ok(256 << 20),
            "a bare number is MiB, as --agent-memory-mib took"
        );
        assert_eq!(super::memory_limit("0"), Ok(0));
        assert!(super::memory_limit("-1").unwrap_err().contains("is not a size"));
        assert_eq!(super::cpu_limit("90"), Ok(90));
        assert_eq!(super::cpu_limit("2m"), Ok(120));
        assert!(super::cpu_limit("1500ms").unwrap_err().contains("whole number of seconds"));
        assert!(super::cpu_limit("0").is_err());
    }
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ecp: EcpCommand,
    }

    fn outputs(args: &[&str]) -> Result<Outputs, String> {
        let cli = Cli::try_parse_from([&["x", "run", "-m", "m.yaml"][..], args].concat()).unwrap();
        match cli.ecp.action {
            EcpAction::Run(r) => r.outputs(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn report_takes_a_path_as_the_reference_does_or_kind_equals_path() {
        let html = |p: &str| Some(PathBuf::from(p));
        assert_eq!(outputs(&["--report", "r.html"]).unwrap().html, html("r.html"));
        let all = outputs(&[
            "--report",
            "junit=r.xml",
            "--report",
            "json=r.json",
            "--report",
            "html=r.html",
            "--audit-out",
            "a.json",
        ])
        .unwrap();
        assert_eq!(
            all,
            Outputs {
                html: html("r.html"),
                json: html("r.json"),
                audit: html("a.json"),
                junit: html("r.xml"),
            }
        );
        // A path with '=' in it, not a kind, is a path.
        assert_eq!(outputs(&["--report", "run=1.html"]).unwrap().html, html("run=1.html"));
        let twice = outputs(&["--report", "json=a.json", "--json-out", "b.json"]).unwrap_err();
        assert!(twice.contains("already written to b.json"), "{twice}");
        let kind = outputs(&["--report", "markdown=r.md"]).unwrap_err();
        assert!(kind.contains("valid kinds: html, json, junit, audit"), "{kind}");
    }
}
