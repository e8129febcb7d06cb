//! The `ecp` subcommands: run, validate, conformance, init, trend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::host::GradingHost;
use crate::manifest;
use crate::report;
use crate::runner::{self, RunOptions};
use crate::transport::{Agent, AgentEnv};
use crate::{ConformanceArgs, RunArgs, TrendArgs};

/// The longest limit `--timeout` and `--max-duration` keep (31 years).
const MAX_SECONDS: f64 = 1e9;

fn positive_seconds(arg: Option<&str>, env_name: &str, flag: &str, default: Option<f64>) -> Result<Option<Duration>, String> {
    let (value, source) = match arg {
        Some(v) => (Some(v.to_string()), flag.to_string()),
        None => (std::env::var(env_name).ok().filter(|v| !v.is_empty()), env_name.to_string()),
    };
    let Some(raw) = value.or_else(|| default.map(|d| d.to_string())) else {
        return Ok(None);
    };
    // A bare number is seconds, as the reference runtime reads it; a
    // duration carries its unit (30s, 1500ms, 2m).
    let seconds = match raw.trim().parse::<f64>() {
        Ok(v) => Some(v),
        Err(_) => humantime::parse_duration(raw.trim()).ok().map(|d| d.as_secs_f64()),
    };
    match seconds {
        // Past 31 years, a limit is as good as none; kept at that, the
        // deadline it sets stays within what a clock can add.
        Some(v) if v.is_finite() && v > 0.0 => Ok(Some(Duration::from_secs_f64(v.min(MAX_SECONDS)))),
        _ => Err(format!(
            "{source} must be a duration above zero, with its unit (30s, 1500ms, 2m) or a number of seconds; got '{raw}'"
        )),
    }
}

fn write_file(path: &Path, contents: &str, what: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).map_err(|e| anyhow::anyhow!("cannot write the {what} to {}: {e}", path.display()))
}

/// Writes `value` as indented JSON (and a final line break) straight to
/// `out`: a report holds every kept step result, and its text is never
/// built in memory beside the report itself.
fn write_json(out: impl std::io::Write, value: &Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    serde_json::to_writer_pretty(&mut out, value)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn write_json_file(path: &Path, value: &Value, what: &str) -> anyhow::Result<()> {
    std::fs::File::create(path)
        .and_then(|f| write_json(f, value))
        .map_err(|e| anyhow::anyhow!("cannot write the {what} to {}: {e}", path.display()))
}

/// Whether `path` can take a report, checked before the run: a run can last
/// minutes, and a mistyped output path should not cost its results. An
/// existing file is opened without truncating it; a new one is created and
/// removed again.
fn check_writable(path: &Path, flag: &str) -> Result<(), String> {
    let fail = |why: String| Err(format!("{flag} {}: {why}", path.display()));
    if path.is_dir() {
        return fail("is a directory; name a file inside it".into());
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new().append(true).create(true).open(path) {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => fail(format!("cannot be written ({e}); check that its directory exists and is writable")),
    }
}

pub async fn run(args: RunArgs, host: Arc<dyn GradingHost>) -> anyhow::Result<i32> {
    let rpc_timeout = match positive_seconds(args.timeout.as_deref(), "ECP_RPC_TIMEOUT", "--timeout", Some(30.0)) {
        Ok(t) => t.expect("a default is given"),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let max_duration = match positive_seconds(args.max_duration.as_deref(), "ECP_MAX_DURATION", "--max-duration", None) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let reports = match args.outputs() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let outputs = [
        (&reports.html, "--report"),
        (&reports.json, "--json-out"),
        (&reports.audit, "--audit-out"),
        (&reports.junit, "--junit"),
    ];
    for (path, flag) in outputs {
        if let Some(Err(e)) = path.as_deref().map(|p| check_writable(p, flag)) {
            eprintln!("error: {e}");
            return Ok(1);
        }
    }
    let manifest = match manifest::load_checked(&args.manifest, host.as_ref()) {
        Ok(m) => m,
        Err(e) => {
            eprint!("error: {e}");
            return Ok(1);
        }
    };
    if let Err(e) = args.env.check() {
        eprintln!("error: {e}");
        return Ok(1);
    }
    let opts = RunOptions {
        rpc_timeout,
        max_duration,
        jobs: usize::from(args.jobs),
        agent_limits: args.limits.agent_limits(),
        progress: !args.quiet,
        verbose: args.verbose,
        pass_env: args.env.pass_env.clone(),
        inherit_env: args.env.inherit_env,
    };
    let outcome = runner::run(&manifest, host.as_ref(), &opts).await;
    let (passed, total) = outcome.tally();
    let failed = total - passed;
    let json_report = report::json_report(&outcome, &manifest);
    // Where each report went, said after the summary.
    let mut written = Vec::new();
    if let Some(p) = &reports.html {
        write_file(p, &report::html(&outcome, &manifest), "HTML report")?;
        written.push(("HTML report", p));
    }
    if let Some(p) = &reports.json {
        write_json_file(p, &json_report, "JSON report")?;
        written.push(("JSON report", p));
    }
    if let Some(p) = &reports.audit {
        write_json_file(p, &json_report["audit"], "audit record")?;
        written.push(("audit record", p));
    }
    if let Some(p) = &reports.junit {
        write_file(p, &report::junit(&outcome, &manifest)?, "JUnit report")?;
        written.push(("JUnit report", p));
    }
    if args.json {
        write_json(std::io::stdout().lock(), &json_report)?;
    }
    if !args.quiet {
        eprintln!("{passed}/{total} checks passed; exit reason: {}", outcome.exit_reason.as_str());
        for (what, path) in written {
            eprintln!("{what} written to {}", path.display());
        }
    }
    let fail_on_error = !args.no_fail_on_error || args.fail_on_error;
    Ok(if fail_on_error && failed > 0 { 2 } else { 0 })
}

pub fn validate(path: &Path, host: &dyn GradingHost) -> i32 {
    match manifest::load_checked(path, host) {
        Ok(m) => {
            println!("Manifest valid: {}", path.display());
            println!("Name: {}", m.name);
            println!("Scenarios: {}", m.scenarios.len());
            println!("Steps: {}", m.step_count());
            println!("Graders: {}", m.grader_count());
            0
        }
        Err(e) => {
            eprint!("{e}");
            1
        }
    }
}

fn check(name: &str, method: &str, outcome: Result<(), String>) -> Value {
    match outcome {
        Ok(()) => json!({"name": name, "method": method, "passed": true, "message": "passed"}),
        Err(m) => json!({"name": name, "method": method, "passed": false, "message": m}),
    }
}

fn skipped(name: &str, method: &str) -> Value {
    check(name, method, Err("skipped because a prerequisite failed".into()))
}

async fn call(agent: &mut Agent, timeout: Duration, method: &'static str, params: Value) -> Result<Value, String> {
    let resp = agent.call(method, params, timeout).await.map_err(|e| e.message)?;
    runner::envelope_result(&resp, method).map_err(|e| e.message)
}

pub async fn conformance(args: ConformanceArgs) -> anyhow::Result<i32> {
    let Some(target) = args.target_opt.clone().or(args.target.clone()) else {
        eprintln!("error: give the agent command or endpoint to check");
        return Ok(1);
    };
    if target.trim().is_empty() {
        eprintln!(
            "error: the agent command is empty: give the command that starts the agent (e.g. 'python agent.py') or its http(s) endpoint"
        );
        return Ok(1);
    }
    let timeout = match positive_seconds(args.timeout.as_deref(), "ECP_RPC_TIMEOUT", "--timeout", Some(30.0)) {
        Ok(t) => t.expect("a default is given"),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    if let Err(e) = args.env.check() {
        eprintln!("error: {e}");
        return Ok(1);
    }
    let mut checks = Vec::new();
    let env = AgentEnv {
        pass: args.env.pass_env.clone(),
        inherit: args.env.inherit_env,
        limits: args.limits.agent_limits(),
        ..AgentEnv::default()
    };
    match Agent::start(&target, &env) {
        Err(e) => {
            checks.push(check(
                "initialize response",
                "agent/initialize",
                Err(format!("agent could not start: {}", e.message)),
            ));
            checks.push(skipped("step result contract", "agent/step"));
            checks.push(skipped("reset response", "agent/reset"));
        }
        Ok(mut agent) => {
            let init = call(&mut agent, timeout, "agent/initialize", runner::initialize_params()).await;
            let caps = match init.and_then(|r| runner::check_initialize(&r).map_err(|e| e.message)) {
                Ok((_, _, caps)) => {
                    checks.push(check("initialize response", "agent/initialize", Ok(())));
                    let step = call(&mut agent, timeout, "agent/step", json!({"input": args.input})).await;
                    let step = step.and_then(|r| crate::grade::StepResult::from_wire(&r).map(|_| ()));
                    checks.push(check("step result contract", "agent/step", step));
                    caps
                }
                Err(m) => {
                    checks.push(check("initialize response", "agent/initialize", Err(m)));
                    checks.push(skipped("step result contract", "agent/step"));
                    serde_json::Map::new()
                }
            };
            let reset = call(&mut agent, timeout, "agent/reset", json!({})).await;
            let reset = reset.and_then(|r| {
                if r == json!(true) {
                    Ok(())
                } else {
                    Err(format!("agent/reset result must be true, got {r}"))
                }
            });
            let mut c = check("reset response", "agent/reset", reset);
            if c["passed"] == json!(true) && !caps.contains_key("reset") {
                c["message"] = json!("passed, but the agent does not declare the 'reset' capability, so the call may do nothing");
            }
            checks.push(c);
            agent.stop().await;
        }
    }
    let passed = checks.iter().filter(|c| c["passed"] == json!(true)).count();
    let total = checks.len();
    let report = json!({"target": target, "conformant": passed == total, "passed": passed, "failed": total - passed, "total": total, "checks": checks});
    let rendered = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &args.json_out {
        write_file(p, &(rendered.clone() + "\n"), "conformance report")?;
    }
    if args.json {
        println!("{rendered}");
    } else {
        for c in report["checks"].as_array().into_iter().flatten() {
            let mark = if c["passed"] == json!(true) { "PASS" } else { "FAIL" };
            println!(
                "{mark} | {} | {}",
                c["name"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            );
        }
        println!("Conformance: {passed}/{total} checks passed");
    }
    Ok(if passed == total { 0 } else { 1 })
}

const STARTER_AGENT: &str = r#""""A starter ECP agent written with ecp-sdk: it answers every input with an
echo, says why in its evaluation context, and reports the tool it used."""
from ecp import Result, agent, on_reset, on_step, serve


@agent(name="StarterAgent", capabilities={"tool_calls": {}, "evaluation_context": {}})
class StarterAgent:
    def __init__(self):
        self.history = []

    @on_step
    def step(self, user_input: str):
        self.history.append(user_input)
        return Result(
            public_output=f"Echo: {user_input}",
            evaluation_context=f"Turn {len(self.history)}: repeated the input back unchanged.",
            tool_calls=[{"name": "echo", "arguments": {"text": user_input}}],
        )

    @on_reset
    def reset(self):
        self.history.clear()


if __name__ == "__main__":
    serve(StarterAgent())
"#;

fn starter_manifest(target: &str) -> String {
    format!(
        r#"manifest_version: v1
name: Starter evaluation
# The command that starts the agent (stdio), or its http(s):// endpoint.
target: {target}

scenarios:
  - name: Echo
    steps:
      - input: hello ecp
        graders:
          - type: text_match
            field: public_output
            condition: contains
            value: hello ecp
          - type: text_match
            field: evaluation_context
            condition: contains
            value: repeated
          - type: tool_usage
            tool_name: echo
            arguments:
              text: hello ecp
      - input: second turn
        graders:
          - type: text_match
            condition: regex
            pattern: "^Echo: second"
"#
    )
}

fn shell_quote(s: &str) -> String {
    if s.chars().all(|c| c.is_alphanumeric() || "-_./".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub fn init(dir: &Path, force: bool) -> i32 {
    let agent_path = dir.join("agent.py");
    let manifest_path = dir.join("manifest.yaml");
    // A link counts as there, dangling or not: writing through it would put
    // the file somewhere else.
    let there = |p: &Path| std::fs::symlink_metadata(p).ok();
    if !force && (there(&agent_path).is_some() || there(&manifest_path).is_some()) {
        eprintln!("error: {} already holds starter files; use --force to replace them", dir.display());
        return 1;
    }
    // Checked before anything is written, so a refusal leaves no half-made directory.
    for p in [&agent_path, &manifest_path] {
        if there(p).is_some_and(|m| m.is_dir()) {
            eprintln!(
                "error: {} is a directory; move it away to write the starter file there",
                p.display()
            );
            return 1;
        }
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return 1;
    }
    // The manifest is YAML: quote the command so any path survives.
    let command = format!("python3 {}", shell_quote(&agent_path.to_string_lossy()));
    let target = serde_json::to_string(&command).unwrap_or(command);
    for (path, text) in [
        (&agent_path, STARTER_AGENT.to_string()),
        (&manifest_path, starter_manifest(&target)),
    ] {
        let written = if force { replace(path, &text) } else { create(path, &text) };
        if let Err(e) = written {
            eprintln!("error: cannot write {}: {e}", path.display());
            return 1;
        }
        println!("Created {}", path.display());
    }
    println!("The agent needs the ecp-sdk Python package: pip install ecp-sdk");
    println!("Try: attest-engine ecp validate {}", manifest_path.display());
    println!("Then: attest-engine ecp run --manifest {}", manifest_path.display());
    0
}

/// Writes a new file at `path`; fails if anything is there, a link
/// included (the open does not follow one).
fn create(path: &Path, text: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    std::io::Write::write_all(&mut f, text.as_bytes())
}

/// Puts a file with `text` at `path` in place of whatever is there: written
/// beside it, then renamed over it, so a link there is replaced rather than
/// written through, even one that appears meanwhile.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = create(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

struct RunPoint {
    manifest: String,
    passed: u64,
    total: u64,
    rate: f64,
}

/// Largest report `trend` reads; larger ones are skipped like unreadable ones.
const MAX_REPORT_BYTES: u64 = 256 << 20;

fn load_point(path: &Path) -> Option<RunPoint> {
    // Saved reports are regular files; a FIFO matched by the glob would
    // wait for a writer that never comes.
    std::fs::metadata(path).ok().filter(std::fs::Metadata::is_file)?;
    let v: Value = serde_json::from_slice(&attest_io::read_capped(path, MAX_REPORT_BYTES).ok()?).ok()?;
    // A run report says how many checks passed of how many, as whole
    // numbers. Other JSON the glob matches (an `--audit-out` record, a
    // summary list) is not a run at 0%.
    // A `conformance --json-out` record has the same two counts but is not
    // a run, and a run with no checks has no pass rate (as 0% it would read
    // as a fall).
    if v.get("conformant").is_some() {
        return None;
    }
    let (passed, total) = (v.get("passed")?.as_u64()?, v.get("total")?.as_u64()?);
    if passed > total || total == 0 {
        return None;
    }
    Some(RunPoint {
        manifest: v
            .get("manifest")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| path.display().to_string()),
        passed,
        total,
        rate: passed as f64 / total as f64,
    })
}

/// Least-squares slope of the pass rate per run.
fn slope(rates: &[f64]) -> f64 {
    let n = rates.len();
    if n < 2 {
        return 0.0;
    }
    let mean_x = (n - 1) as f64 / 2.0;
    let mean_y = rates.iter().sum::<f64>() / n as f64;
    let num: f64 = rates.iter().enumerate().map(|(i, r)| (i as f64 - mean_x) * (r - mean_y)).sum();
    let den: f64 = (0..n).map(|i| (i as f64 - mean_x).powi(2)).sum();
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

pub fn trend(args: &TrendArgs) -> i32 {
    let paths = match glob::glob(&args.pattern) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: '{}' is not a valid glob pattern: {e}", args.pattern);
            return 1;
        }
    };
    let mut matched: Vec<PathBuf> = paths.filter_map(Result::ok).collect();
    matched.sort();
    if matched.is_empty() {
        eprintln!("No files matched the pattern: {}", args.pattern);
        return 1;
    }
    let window = args.window as usize;
    let recent = &matched[matched.len().saturating_sub(window)..];
    let mut runs: Vec<RunPoint> = Vec::with_capacity(recent.len());
    let mut skipped: Vec<&Path> = Vec::new();
    for p in recent {
        match load_point(p) {
            Some(r) => runs.push(r),
            None => skipped.push(p),
        }
    }
    // Skipped as `ecp-runtime` skips them, but said: a glob that also
    // matches other files would otherwise shrink the window unnoticed.
    if !skipped.is_empty() {
        let named: Vec<String> = skipped.iter().take(3).map(|p| p.display().to_string()).collect();
        eprintln!(
            "note: {} of the last {} matched file(s) are not run reports (JSON objects with whole-number `passed` and `total`, `total` above 0, as `ecp run --json-out` writes) and were skipped: {}{}",
            skipped.len(),
            recent.len(),
            named.join(", "),
            if skipped.len() > named.len() { ", …" } else { "" }
        );
    }
    let s = if runs.len() < 2 {
        0.0
    } else {
        slope(&runs.iter().map(|r| r.rate).collect::<Vec<_>>())
    };
    let direction = if s > 0.001 {
        "improving"
    } else if s < -0.001 {
        "degrading"
    } else {
        "stable"
    };
    let regression = direction == "degrading";
    if args.json {
        let out = json!({
            "window": window,
            "runs": runs.iter().map(|r| json!({"manifest": r.manifest, "passed": r.passed, "total": r.total, "pass_rate": r.rate})).collect::<Vec<_>>(),
            "pass_rate_slope": (s * 1e6).round() / 1e6,
            "direction": direction,
            "any_regression": regression,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("Found {} report(s). Analysing last {window}...\n", matched.len());
        println!("{:<5}  {:<45}  {:>6}  {:>6}  {:>6}", "Run", "Manifest", "Passed", "Total", "Rate");
        println!("{}", "-".repeat(74));
        for (i, r) in runs.iter().enumerate() {
            let label = if r.manifest.len() > 45 {
                Path::new(&r.manifest)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default()
            } else {
                r.manifest.clone()
            };
            // A report file's text, on a terminal.
            let label = crate::util::one_line(&crate::util::clip(&label, 200));
            println!(
                "{:<5}  {:<45}  {:>6}  {:>6}  {:>5.1}%",
                i + 1,
                label,
                r.passed,
                r.total,
                r.rate * 100.0
            );
        }
        println!("\nTrend direction : {}", direction.to_uppercase());
        println!("Slope (per run) : {s:+.6}");
        println!("Window          : {} run(s) analysed (max {window})", runs.len());
        println!("Regression      : {}", if regression { "YES" } else { "no" });
    }
    if regression && args.exit_on_regression {
        eprintln!("Regression detected: exiting with status 2 (--exit-on-regression).");
        return 2;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_direction() {
        assert!(slope(&[1.0, 0.5, 0.0]) < -0.001);
        assert_eq!(slope(&[0.5, 0.5]), 0.0);
        assert!(slope(&[0.0, 1.0]) > 0.0);
    }

    #[test]
    fn timeouts_are_durations_or_seconds_and_must_be_positive() {
        assert!(positive_seconds(Some("-1"), "X_UNSET_VAR", "--timeout", Some(30.0)).is_err());
        assert!(positive_seconds(Some("0s"), "X_UNSET_VAR", "--timeout", Some(30.0)).is_err());
        let e = positive_seconds(Some("soon"), "X_UNSET_VAR", "--timeout", Some(30.0)).unwrap_err();
        assert!(
            e.contains("--timeout must be a duration above zero, with its unit (30s, 1500ms, 2m)"),
            "{e}"
        );
        for (text, ms) in [("2", 2000), ("1500ms", 1500), ("2m", 120_000), ("0.5", 500)] {
            assert_eq!(
                positive_seconds(Some(text), "X_UNSET_VAR", "--timeout", None).unwrap(),
                Some(Duration::from_millis(ms))
            );
        }
        assert_eq!(
            positive_seconds(Some("1e300"), "X_UNSET_VAR", "--timeout", Some(30.0)).unwrap(),
            Some(Duration::from_secs(1_000_000_000))
        );
        assert_eq!(
            positive_seconds(None, "X_UNSET_VAR", "--timeout", Some(30.0)).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(positive_seconds(None, "X_UNSET_VAR", "--max-duration", None).unwrap(), None);
    }
}
