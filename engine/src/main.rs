//! The `attest-engine` binary: serve JSON-RPC on stdio (the default), or one
//! of the other front doors (`eval`, `collect`, `worker`, `ecp`,
//! `calibrate`, `plugin`). Each is a thin layer over the library; see
//! docs/architecture.md.

#![forbid(unsafe_code)]

use attest_engine::config::{Config, Overrides, ENV_VARS};
use attest_engine::eval_cmd::{self, Format};
use attest_engine::plugin_cmd;
use attest_engine::plugin_new::{self, Lang};
use attest_engine::plugins::capabilities::Capability;
use attest_engine::plugins::PluginHost;
use attest_engine::session::Engine;
use attest_engine::{logging, server, ENGINE_VERSION};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

// The engine allocates many small, short-lived strings and JSON values per
// request; mimalloc measurably beats the system allocator on that pattern
// (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
// A negative number is a value to refuse by name (`--max-trace-bytes -1`),
// not an unknown flag.
#[command(
    name = "attest-engine",
    version,
    about = "Attest evaluation engine: JSON-RPC 2.0 over stdio",
    after_help = env_help(),
    allow_negative_numbers = true
)]
struct Cli {
    /// What a bare `attest-engine` (the stdio server) takes; also accepted
    /// before any subcommand, where that subcommand uses them.
    #[command(flatten)]
    serve: ServeOptions,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Options of every command that loads the engine's configuration.
#[derive(Args, Clone, Default)]
struct Common {
    /// debug, info, warn or error (structured JSON lines on stderr; default
    /// info, warn for eval, calibrate and plugin check/test) [env: ATTEST_LOG_LEVEL].
    #[arg(long, help_heading = "Common options", value_name = "LEVEL", value_parser = clap::builder::PossibleValuesParser::new(["debug", "info", "warn", "error"]), ignore_case = true)]
    log_level: Option<String>,
    /// TOML configuration file [env: ATTEST_CONFIG].
    #[arg(long, help_heading = "Common options", value_name = "FILE")]
    config: Option<PathBuf>,
}

/// `-v` and `-q`: the log level in one letter (`ecp run` has its own, for
/// its progress lines).
#[derive(Args, Clone, Default)]
struct Verbosity {
    /// More log lines: -v is debug.
    #[arg(short = 'v', long = "verbose", help_heading = "Common options", conflicts_with_all = ["quiet", "log_level"])]
    verbose: bool,
    /// Fewer log lines: -q is errors only.
    #[arg(short = 'q', long = "quiet", help_heading = "Common options", conflicts_with = "log_level")]
    quiet: bool,
}

impl Verbosity {
    fn level(&self) -> Option<&'static str> {
        match (self.verbose, self.quiet) {
            (true, _) => Some("debug"),
            (_, true) => Some("error"),
            _ => None,
        }
    }
}

/// How long one evaluation may take.
#[derive(Args, Clone, Default)]
struct Deadline {
    /// Per-request evaluation deadline, e.g. 30s, 1500ms, 2m (default 25s)
    /// [env: ATTEST_EVAL_TIMEOUT].
    #[arg(long, help_heading = "Evaluation options", value_name = "DURATION")]
    eval_timeout: Option<String>,
}

/// Options of the commands that evaluate traces with the engine's layers.
#[derive(Args, Clone, Default)]
struct Evaluation {
    #[command(flatten)]
    deadline: Deadline,
    /// Reject steps whose type is not llm_call, tool_call, retrieval or
    /// agent_call [env: ATTEST_STRICT_STEP_TYPES].
    #[arg(long, help_heading = "Evaluation options")]
    strict_step_types: bool,
    /// Load a WebAssembly plugin component (repeatable).
    #[arg(long = "plugin", help_heading = "Evaluation options", value_name = "FILE")]
    plugins: Vec<PathBuf>,
    /// Load every .wasm file in this directory as a plugin [env: ATTEST_PLUGIN_DIR].
    #[arg(long, help_heading = "Evaluation options", value_name = "DIR")]
    plugin_dir: Option<PathBuf>,
    /// Do not record results in the history store [env: ATTEST_HISTORY=false].
    #[arg(long, help_heading = "Evaluation options")]
    no_history: bool,
}

/// The stdio server's options.
#[derive(Args, Clone, Default)]
struct ServeOptions {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    verbosity: Verbosity,
    #[command(flatten)]
    evaluation: Evaluation,
    /// Requests evaluated at once (default 64) [env: ATTEST_MAX_CONCURRENT_REQUESTS].
    #[arg(long, help_heading = "Evaluation options", value_name = "N")]
    max_concurrent_requests: Option<usize>,
    /// Write a report of the session at shutdown or end of input:
    /// junit=<path>, json=<path> or markdown=<path> (repeatable).
    #[arg(long = "report", value_name = "KIND=PATH")]
    reports: Vec<String>,
}

/// The engine options a command line gives: a subcommand's own over those
/// given before it.
struct Given<'a> {
    common: [Option<&'a Common>; 2],
    verbosity: [Option<&'a Verbosity>; 2],
    deadline: [Option<&'a Deadline>; 2],
    evaluation: [Option<&'a Evaluation>; 2],
    max_concurrent_requests: Option<usize>,
    reports: Vec<String>,
}

impl Given<'_> {
    fn overrides(&self, skip_plugin_dir: bool) -> Overrides {
        let commons = || self.common.iter().rev().flatten();
        let evaluations = || self.evaluation.iter().flatten();
        Overrides {
            config_path: commons().find_map(|c| c.config.clone()),
            log_level: commons()
                .find_map(|c| c.log_level.clone())
                .or_else(|| self.verbosity.iter().rev().flatten().find_map(|v| v.level().map(str::to_owned))),
            eval_timeout: self.deadline.iter().rev().flatten().find_map(|d| d.eval_timeout.clone()),
            max_concurrent_requests: self.max_concurrent_requests,
            strict_step_types: evaluations().any(|e| e.strict_step_types),
            plugins: evaluations().flat_map(|e| e.plugins.iter().cloned()).collect(),
            plugin_dir: evaluations().rev().find_map(|e| e.plugin_dir.clone()),
            reports: self.reports.clone(),
            no_history: evaluations().any(|e| e.no_history),
            skip_plugin_dir,
        }
    }
}

impl Cli {
    fn given(&self) -> Given<'_> {
        let top = &self.serve;
        let (common, deadline, evaluation) = match &self.command {
            None
            | Some(
                Command::Version
                | Command::Plugin {
                    command: PluginCommand::New { .. },
                },
            ) => (None, None, None),
            Some(Command::Serve { options }) => (Some(&options.common), Some(&options.evaluation.deadline), Some(&options.evaluation)),
            Some(
                Command::Eval { common, evaluation, .. }
                | Command::Collect { common, evaluation, .. }
                | Command::Worker { common, evaluation, .. },
            ) => (Some(common), Some(&evaluation.deadline), Some(evaluation)),
            Some(
                Command::Calibrate { common, deadline, .. }
                | Command::Ecp { common, deadline, .. }
                | Command::Plugin {
                    command: PluginCommand::Test { common, deadline, .. },
                },
            ) => (Some(common), Some(deadline), None),
            Some(
                Command::View { common, .. }
                | Command::Plugin {
                    command: PluginCommand::Check { common, .. },
                },
            ) => (Some(common), None, None),
        };
        let verbosity = match &self.command {
            Some(Command::Serve {
                options: ServeOptions { verbosity, .. },
            })
            | Some(
                Command::Eval { verbosity, .. }
                | Command::Calibrate { verbosity, .. }
                | Command::Collect { verbosity, .. }
                | Command::Worker { verbosity, .. }
                | Command::View { verbosity, .. }
                | Command::Plugin {
                    command: PluginCommand::Check { verbosity, .. } | PluginCommand::Test { verbosity, .. },
                },
            ) => Some(verbosity),
            _ => None,
        };
        let (own_reports, max_concurrent_requests): (&[String], _) = match &self.command {
            Some(Command::Serve { options }) => (&options.reports, options.max_concurrent_requests),
            Some(Command::Eval { reports, .. }) => (reports, None),
            _ => (&[], None),
        };
        Given {
            common: [Some(&top.common), common],
            verbosity: [Some(&top.verbosity), verbosity],
            deadline: [Some(&top.evaluation.deadline), deadline],
            evaluation: [Some(&top.evaluation), evaluation],
            max_concurrent_requests: max_concurrent_requests.or(top.max_concurrent_requests),
            reports: top.reports.iter().chain(own_reports).cloned().collect(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve JSON-RPC 2.0 on stdin/stdout (the default).
    Serve {
        #[command(flatten)]
        options: ServeOptions,
    },
    /// Evaluate traces from files and print the results.
    Eval {
        /// A .json trace (or array of traces) or a .jsonl file of traces.
        #[arg(long, value_name = "FILE")]
        trace: PathBuf,
        /// A JSON list of assertions (or {"assertions": [...]}).
        #[arg(long, value_name = "FILE")]
        assertions: PathBuf,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Write a report of the run: junit=<path>, json=<path> or
        /// markdown=<path> (repeatable; also accepted before the subcommand).
        #[arg(long = "report", value_name = "KIND=PATH")]
        reports: Vec<String>,
        #[command(flatten)]
        export: attest_collect::export::ExportArgs,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
        #[command(flatten)]
        evaluation: Evaluation,
    },
    /// Run the LLM judge over human-labelled records and report agreement
    /// (see docs/calibration.md).
    #[command(allow_negative_numbers = true)]
    Calibrate {
        /// Labels: .csv or .jsonl records with input and human_label.
        #[arg(long, value_name = "FILE")]
        labels: PathBuf,
        /// Built-in rubric to calibrate.
        #[arg(long, default_value = "default")]
        rubric: String,
        /// The assertion's `criteria`, as the SDK's `passes_judge` sends it:
        /// part of the prompt, so part of the key a calibration is stored under.
        #[arg(long)]
        criteria: Option<String>,
        /// Binarisation threshold for agreement, kappa and ROC-AUC, in (0, 1).
        #[arg(long, default_value_t = 0.5)]
        threshold: f64,
        /// Store the result so later judge results of this rubric carry it.
        #[arg(long)]
        persist: bool,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
        #[command(flatten)]
        deadline: Deadline,
    },
    /// Print the engine version.
    Version,
    /// Score production traces: OTLP/HTTP ingest (or JSONL), trace assembly,
    /// sampling rules, results to the history, JSONL and metrics.
    #[command(allow_negative_numbers = true)]
    Collect {
        #[command(flatten)]
        args: Box<attest_collect::CollectArgs>,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
        #[command(flatten)]
        evaluation: Evaluation,
    },
    /// Evaluate assembled traces from NATS JetStream (scale-out of `collect`).
    #[command(allow_negative_numbers = true)]
    Worker {
        #[command(flatten)]
        args: attest_collect::WorkerArgs,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
        #[command(flatten)]
        evaluation: Evaluation,
    },
    /// Look at the result history in a browser: pass rates, scores over
    /// time, failing evaluations with their traces, runs compared.
    /// Read-only; listens on 127.0.0.1:8787.
    View {
        #[command(flatten)]
        args: attest_view::ViewArgs,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
    },
    /// Drive agents over the Evaluation Context Protocol from YAML manifests
    /// (engine options go before the ecp subcommand: `ecp --config FILE run …`).
    Ecp {
        #[command(flatten)]
        cmd: attest_ecp::EcpCommand,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        deadline: Deadline,
    },
    /// Create, check and test WebAssembly plugins.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Write a new plugin project: a config schema, an example check, its
    /// unit tests, a build script and a README, ready to build.
    New {
        /// The plugin's id, also its project, crate or package name
        /// (lowercase letters and digits, joined by single '-').
        name: String,
        /// The plugin's language (required).
        #[arg(long, value_enum)]
        lang: Lang,
        /// Where to write it (default: ./<name>); must be new or empty.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The Rust plugin SDK (`plugin-sdk/` of attest-engine's repository;
        /// found on its own when the engine runs from a checkout).
        #[arg(long, value_name = "DIR")]
        sdk: Option<PathBuf>,
    },
    /// Load a plugin as the engine would and print its metadata, API version
    /// and limits, or exactly why it would be refused.
    Check {
        /// The plugin component.
        file: PathBuf,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
    },
    /// Run one plugin on one trace (or a file of traces), without an SDK,
    /// and print its verdict, evidence, details and duration.
    Test {
        /// The plugin component.
        file: PathBuf,
        /// A .json trace (or array of traces) or a .jsonl file of traces.
        #[arg(long, value_name = "FILE")]
        trace: PathBuf,
        /// The assertion's `config` as a JSON file (default: `{}`). Named
        /// apart from `--config`, which is the engine's own config file
        /// (where `[[plugins]]` limits come from).
        #[arg(long, value_name = "FILE", conflicts_with = "plugin_config_json")]
        plugin_config: Option<PathBuf>,
        /// The assertion's `config` as inline JSON.
        #[arg(long, value_name = "JSON")]
        plugin_config_json: Option<String>,
        /// Grant a capability for this run (embed, judge, config-secret),
        /// on top of what the plugin's `[[plugins]]` entry grants. Repeatable.
        #[arg(long = "grant", value_name = "CAPABILITY")]
        grants: Vec<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        verbosity: Verbosity,
        #[command(flatten)]
        deadline: Deadline,
    },
}

impl PluginCommand {
    /// The subcommand's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            PluginCommand::New { .. } => "new",
            PluginCommand::Check { .. } => "check",
            PluginCommand::Test { .. } => "test",
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Table,
    Json,
}

impl From<OutputFormat> for Format {
    fn from(f: OutputFormat) -> Format {
        match f {
            OutputFormat::Table => Format::Table,
            OutputFormat::Json => Format::Json,
        }
    }
}

impl From<OutputFormat> for attest_engine::calibrate_cmd::Format {
    fn from(f: OutputFormat) -> Self {
        match f {
            OutputFormat::Table => Self::Table,
            OutputFormat::Json => Self::Json,
        }
    }
}

fn env_help() -> String {
    let mut s = String::from("Environment:\n");
    for (name, what) in ENV_VARS {
        s.push_str(&format!("  {name:<32} {what}\n"));
    }
    s
}

/// The exit code for a command line clap refused: 0 for `--help` and
/// `--version`; for `ecp` subcommands 1, as for their other input errors
/// (2 means failed checks there); 2 elsewhere.
fn usage_error_code(e: &clap::Error) -> u8 {
    if !e.use_stderr() {
        return 0;
    }
    use clap::CommandFactory;
    // Without help and version flags, a `--help` later on the line does not
    // stop the parse before the subcommand is known.
    let subcommand = Cli::command()
        .disable_help_flag(true)
        .disable_version_flag(true)
        .ignore_errors(true)
        .try_get_matches_from(std::env::args_os())
        .ok()
        .and_then(|m| m.subcommand_name().map(str::to_owned));
    if subcommand.as_deref() == Some("ecp") {
        1
    } else {
        2
    }
}

/// Runs a command that needs no engine configuration; `None` for the others.
fn without_config(command: &Command) -> Option<ExitCode> {
    match command {
        Command::Version => {
            println!("attest-engine {ENGINE_VERSION}");
            Some(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command: PluginCommand::New { name, lang, dir, sdk },
        } => {
            let dir = dir.clone().unwrap_or_else(|| PathBuf::from(name));
            Some(match plugin_new::create(name, *lang, &dir, sdk.as_deref()) {
                Ok(_) => {
                    print!("{}", plugin_new::next_steps(name, *lang, &dir, sdk.as_deref()));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("attest-engine plugin new: {e}");
                    ExitCode::from(2)
                }
            })
        }
        // They grade nothing, so they need no engine, nor its configuration.
        Command::Ecp { cmd, .. } if !cmd.action.grades() => {
            logging::init(logging::Level::Info, "ecp");
            let runtime = match async_runtime() {
                Ok(runtime) => runtime,
                Err(code) => return Some(code),
            };
            Some(match runtime.block_on(attest_ecp::run_ungraded(cmd.action.clone())) {
                Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                Err(e) => {
                    eprintln!("attest-engine ecp: {e:#}");
                    ExitCode::from(1)
                }
            })
        }
        _ => None,
    }
}

/// Longest a one-shot command waits at exit for its last log lines to reach
/// stderr.
const LOG_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

fn main() -> ExitCode {
    let code = run();
    logging::flush(LOG_FLUSH_WAIT);
    code
}

fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(usage_error_code(&e));
        }
    };
    // `eval` instead notices a closed output itself: its reports and the
    // history it records still need writing (see `eval_cmd`).
    if matches!(
        cli.command,
        Some(Command::Calibrate { .. } | Command::Version | Command::Plugin { .. })
    ) {
        attest_io::end_on_closed_output();
    }
    let given = cli.given();
    if let Some(code) = misplaced_options(&cli) {
        return code;
    }
    // Commands that read no engine configuration run before it is loaded:
    // a broken config file or environment must not stop them.
    if let Some(code) = cli.command.as_ref().and_then(without_config) {
        return code;
    }
    let overrides = given.overrides(matches!(cli.command, Some(Command::Plugin { .. })));
    let config = match Config::load(&overrides, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attest-engine: configuration error: {e:#}");
            // `ecp` keeps 2 for failed checks; its usage errors are 1.
            return ExitCode::from(if matches!(cli.command, Some(Command::Ecp { .. })) { 1 } else { 2 });
        }
    };
    match cli.command.unwrap_or(Command::Serve { options: cli.serve }) {
        command @ (Command::Version
        | Command::Plugin {
            command: PluginCommand::New { .. },
        }) => without_config(&command).unwrap_or(ExitCode::SUCCESS),
        Command::Plugin {
            command: PluginCommand::Check { file, .. },
        } => {
            logging::init(one_shot_level(&config), "plugin");
            plugin_cmd::check(&config, &file)
        }
        Command::Plugin {
            command:
                PluginCommand::Test {
                    file,
                    trace,
                    plugin_config,
                    plugin_config_json,
                    grants,
                    format,
                    ..
                },
        } => plugin_test(
            config,
            &file,
            &trace,
            plugin_config.as_deref(),
            plugin_config_json.as_deref(),
            &grants,
            format,
        ),
        Command::Eval {
            trace,
            assertions,
            format,
            export,
            ..
        } => eval(config, trace, assertions, format, export),
        Command::Collect { args, .. } => {
            logging::init(config.log_level, "collect");
            // A collector that publishes to workers evaluates nothing itself.
            let providers = match args.nats {
                Some(_) => attest_engine::batch::Providers::Elsewhere,
                None => attest_engine::batch::Providers::Required,
            };
            let label = format!("collect --rules {}", args.rules.display());
            run_front_door(config, move |engine| async move {
                engine.sinks.start_run(attest_engine::history::RunKind::Collect, label);
                let (evaluator, history) = attest_engine::collect_host::backends_with(engine, providers);
                attest_collect::run_collect(*args, evaluator, history).await
            })
        }
        Command::Worker { args, .. } => {
            logging::init(config.log_level, "worker");
            let label = match (args.role, &args.sink_name) {
                (attest_collect::WorkerRole::Sink, Some(name)) => format!("worker --role sink --sink-name {name}"),
                (attest_collect::WorkerRole::Sink, None) => "worker --role sink".to_owned(),
                (attest_collect::WorkerRole::Evaluate, _) => "worker --role evaluate".to_owned(),
            };
            run_front_door(config, |engine| async move {
                engine.sinks.start_run(attest_engine::history::RunKind::Collect, label);
                let (evaluator, history) = attest_engine::collect_host::backends(engine);
                attest_collect::run_worker(args, evaluator, history).await
            })
        }
        Command::View { args, .. } => view(config, args),
        Command::Ecp { cmd, .. } => ecp(config, cmd),
        Command::Calibrate {
            labels,
            rubric,
            criteria,
            threshold,
            persist,
            format,
            ..
        } => {
            logging::init(one_shot_level(&config), "calibrate");
            // Only the judge is used: no plugin is loaded (or compiled).
            let engine = Engine::with_plugins(config, PluginHost::default());
            let mut out = std::io::stdout().lock();
            let judged = attest_engine::calibrate_cmd::Judged {
                rubric: &rubric,
                criteria: criteria.as_deref(),
                threshold,
            };
            match attest_engine::calibrate_cmd::run(&engine, &labels, judged, persist, format.into(), &mut out) {
                Ok(code) => ExitCode::from(code as u8),
                Err(e) => {
                    eprintln!("attest-engine calibrate: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve { .. } => serve(config),
    }
}

/// Options accepted before a subcommand, where the server takes them, that
/// the subcommand given would ignore: refused (exit 2), naming what to do.
fn misplaced_options(cli: &Cli) -> Option<ExitCode> {
    if let Some(Command::Plugin { command }) = &cli.command {
        if !cli.serve.evaluation.plugins.is_empty() || cli.serve.evaluation.plugin_dir.is_some() {
            // Accepted before the subcommand, where the server takes them,
            // but a plugin subcommand works on the file it names and would
            // ignore them.
            let sub = command.name();
            eprintln!(
                "attest-engine plugin {sub}: --plugin and --plugin-dir choose the plugins a server loads; `plugin {sub}` works on the one file it names, so drop them"
            );
            return Some(ExitCode::from(2));
        }
    }
    if let (Some(sub @ ("collect" | "worker")), Some(_)) = (
        match &cli.command {
            Some(Command::Collect { .. }) => Some("collect"),
            Some(Command::Worker { .. }) => Some("worker"),
            _ => None,
        },
        cli.serve.max_concurrent_requests,
    ) {
        // Accepted before the subcommand, where the server takes it, but it
        // bounds the requests `serve` evaluates at once; a collector or
        // worker would ignore it.
        eprintln!(
            "attest-engine {sub}: --max-concurrent-requests bounds the requests `serve` evaluates at once; {sub} evaluates --concurrency traces at once (default 4), so give --concurrency N instead"
        );
        return Some(ExitCode::from(2));
    }
    None
}

/// `eval`: one trace and its assertions, evaluated once, reports written.
fn eval(config: Config, trace: PathBuf, assertions: PathBuf, format: OutputFormat, export: attest_collect::export::ExportArgs) -> ExitCode {
    logging::init(one_shot_level(&config), "eval");
    // A one-shot run's results are all it has to record: wait for
    // the history writer rather than drop rows when it falls behind.
    let mut config = config;
    if let Some(h) = &mut config.history {
        h.wait_when_behind = true;
    }
    // Read before the engine opens anything (the result history, plugins).
    // A report written over an input would destroy it.
    for input in [&trace, &assertions] {
        if let Some(r) = config.reports.iter().find(|r| attest_engine::report::same_file(&r.path, input)) {
            eprintln!(
                "attest-engine eval: --report writes to {}, which is an input of this run: give the report another path",
                r.path.display()
            );
            return ExitCode::from(2);
        }
    }
    let inputs = match eval_cmd::Inputs::read(&trace, &assertions) {
        Ok(inputs) => inputs,
        Err(e) => {
            eprintln!("attest-engine eval: {e:#}");
            return ExitCode::from(2);
        }
    };
    let Some(engine) = load_engine(config) else {
        return ExitCode::from(2);
    };
    engine.sinks.start_run(
        attest_engine::history::RunKind::Eval,
        format!("eval {} {}", trace.display(), assertions.display()),
    );
    let exporter = match export
        .endpoint
        .as_deref()
        .map(|e| attest_collect::export::OtlpExport::start(e, export.protocol, "eval"))
    {
        None => None,
        Some(Ok(x)) => Some(Arc::new(x)),
        Some(Err(e)) => {
            eprintln!("attest-engine eval: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(x) = &exporter {
        engine.sinks.export_to(x.clone());
    }
    let code = match eval_cmd::run(&engine, &inputs, format.into(), &mut std::io::stdout().lock()) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("attest-engine eval: {e:#}");
            ExitCode::from(2)
        }
    };
    if let Some(summary) = exporter.and_then(|x| x.finish()) {
        eprintln!("attest-engine eval: {summary}");
    }
    code
}

/// `ecp`: the ECP runtime with the engine as its grading host.
fn ecp(config: Config, cmd: attest_ecp::EcpCommand) -> ExitCode {
    // A person reads `ecp`'s progress lines: the engine's own info
    // lines (the history it opened) are JSON noise above them, so
    // only warnings and errors show unless a level was asked for.
    let level = if config.log_level_chosen {
        config.log_level
    } else {
        logging::Level::Warn
    };
    logging::init(level, "ecp");
    let config = attest_engine::ecp_host::config_for(&cmd, config);
    let label = match &cmd.action {
        attest_ecp::EcpAction::Run(r) => format!("ecp run {}", r.manifest.display()),
        _ => "ecp".to_owned(),
    };
    let exporter = match &cmd.action {
        attest_ecp::EcpAction::Run(attest_ecp::RunArgs {
            export_otlp: Some(endpoint),
            export_otlp_protocol,
            ..
        }) => {
            let protocol = match export_otlp_protocol.as_str() {
                "grpc" => attest_collect::export::Protocol::Grpc,
                _ => attest_collect::export::Protocol::Http,
            };
            match attest_collect::export::OtlpExport::start(endpoint, protocol, "ecp") {
                Ok(x) => Some(Arc::new(x)),
                Err(e) => {
                    eprintln!("attest-engine ecp: {e:#}");
                    return ExitCode::from(1);
                }
            }
        }
        _ => None,
    };
    run_front_door(config, |engine| async move {
        if let Some(x) = &exporter {
            engine.sinks.export_to(x.clone());
        }
        let host = Arc::new(attest_engine::ecp_host::EngineGradingHost::new(engine, label));
        let code = attest_ecp::run_command(cmd, host).await;
        if let Some(x) = exporter {
            if let Some(summary) = tokio::task::spawn_blocking(move || x.finish()).await? {
                eprintln!("attest-engine ecp: {summary}");
            }
        }
        code
    })
}

/// The Attest protocol v1 server on stdio (the default command).
fn serve(config: Config) -> ExitCode {
    logging::init(config.log_level, "serve");
    // With one CPU a work-stealing pool only adds thread hand-offs.
    let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let mut builder = if one_cpu {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("attest-engine: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(engine) = load_engine(config) else {
        return ExitCode::from(2);
    };
    let engine = Arc::new(engine);
    // The read loop runs on this thread; the requests it spawns go to the
    // shared queue, from which every worker takes them.
    let ended = runtime.block_on(server::serve(engine, tokio::io::stdin(), std::io::stdout()));
    let code = match ended {
        server::Ended::InputError | server::Ended::OutputClosed => 1,
        _ => 0,
    };
    // stdin's blocking reader thread cannot be interrupted; exit rather
    // than wait for it. Responses were flushed by `serve`.
    std::process::exit(code);
}

/// `plugin test`: the capabilities granted by name, then the run.
fn plugin_test(
    config: Config,
    file: &Path,
    trace: &Path,
    plugin_config: Option<&Path>,
    plugin_config_json: Option<&str>,
    grants: &[String],
    format: OutputFormat,
) -> ExitCode {
    logging::init(one_shot_level(&config), "plugin");
    let mut granted = Vec::new();
    for name in grants {
        match Capability::parse(name) {
            Some(c) => granted.push(c),
            None => {
                let valid: Vec<&str> = Capability::ALL.iter().map(|c| c.name()).collect();
                eprintln!(
                    "attest-engine plugin test: --grant {name}: unknown capability; valid capabilities: {}",
                    valid.join(", ")
                );
                return ExitCode::from(2);
            }
        }
    }
    plugin_cmd::test(config, file, trace, plugin_config, plugin_config_json, &granted, format.into())
}

/// `view`: the read-only web viewer over the history the engine writes.
fn view(config: Config, args: attest_view::ViewArgs) -> ExitCode {
    logging::init(config.log_level, "view");
    // The store the engine writes, whether or not history is on now.
    let default = match config.history.as_ref().map(|h| &h.location) {
        Some(location) => Some(location.clone()),
        None => config
            .cache_dir
            .as_ref()
            .map(|d| attest_engine::history::Location::File(d.join("history.sqlite3"))),
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(attest_view::run_view(args, default)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("attest-engine view: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs a front door that is not the stdio server (`collect`, `worker`,
/// `ecp`) on a multi-threaded runtime over one engine; returns its exit code.
fn run_front_door<F, Fut>(config: attest_engine::config::Config, front: F) -> ExitCode
where
    F: FnOnce(Arc<Engine>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<i32>>,
{
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let Some(engine) = load_engine(config) else {
        return ExitCode::from(2);
    };
    // A service that records results must not run on without the store it
    // was told to record them in (the stdio engine goes on, answering
    // query_drift with what to fix).
    if let (Some(wanted), None) = (&engine.config.history, &engine.sinks.history) {
        tracing::error!(
            "cannot open the result history {} (see the error above); fix it, or run with --no-history",
            wanted.location
        );
        return ExitCode::from(2);
    }
    let engine = Arc::new(engine);
    let code = runtime.block_on(front(engine.clone()));
    engine.finish();
    // What the front door left running it has given up on (a worker's
    // evaluations abandoned at a second signal): a plugin call blocking its
    // thread must not hold the exit past its own short wait.
    runtime.shutdown_timeout(FRONT_DOOR_EXIT_WAIT);
    match code {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(2)
        }
    }
}

/// The multi-threaded runtime a front door runs on; when it cannot start,
/// the exit code after saying why.
fn async_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
        eprintln!("attest-engine: cannot start the async runtime: {e}");
        ExitCode::from(1)
    })
}

/// Longest a front door's exit waits for work still blocking a thread.
const FRONT_DOOR_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Builds the engine, loading its plugins first (from the compiled cache
/// when possible). `None` (after saying why on stderr) when plugins named
/// one by one claim the same id: which one is meant cannot be guessed.
fn load_engine(config: attest_engine::config::Config) -> Option<Engine> {
    let plugins = PluginHost::load(&config.plugins, config.cache_dir.as_ref().map(|d| d.join("plugins")));
    if !plugins.conflicts().is_empty() {
        for conflict in plugins.conflicts() {
            eprintln!("attest-engine: configuration error: {conflict}");
        }
        return None;
    }
    // Components the start-up index spared reading load now, off the path
    // to the first answer.
    plugins.warm_in_background();
    Some(Engine::with_plugins(config, plugins))
}

/// The log level of a command that prints its own results for a person
/// (`eval`, `calibrate`, `plugin check`, `plugin test`): warnings and errors
/// unless a level was chosen, so informational lines (the history opened, a
/// report written) do not interleave with the results on a terminal.
fn one_shot_level(config: &Config) -> logging::Level {
    if config.log_level_chosen {
        config.log_level
    } else {
        logging::Level::Warn
    }
}
