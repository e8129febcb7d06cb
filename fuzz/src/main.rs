//! `attest-fuzz`: a structure-aware black-box fuzzer for the `attest-engine`
//! JSON-RPC stdio server.
//!
//! It spawns the real binary, sends it seeded, reproducible traffic (see
//! `gen`), and checks every stdout line and every exchange against the
//! protocol's invariants (see `check`). Inputs go one round at a time, each
//! followed by a probe request for an unknown method: the probe's answer
//! tells the fuzzer the engine has read the round, so a missing response is
//! told apart from a slow one and notifications can be checked for silence.

#![forbid(unsafe_code)]

mod check;
mod engine;
mod gen;
mod json;
mod provider;

use anyhow::{bail, Context, Result};
use check::{Expect, Invariant, Reply, Violation};
use clap::Parser;
use engine::{Engine, Event, Launch};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "attest-fuzz",
    about = "Structure-aware black-box fuzzer for the attest-engine stdio server"
)]
struct Cli {
    /// The engine binary (default: target/release, then target/debug).
    #[arg(long, env = "ATTEST_ENGINE_PATH")]
    engine: Option<PathBuf>,
    /// Seed for the generator (printed; pass it back to reproduce a run).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<u64>,
    /// Stop after this many inputs.
    #[arg(long)]
    iterations: Option<u64>,
    /// Save every failing input here (an NDJSON file the engine can be fed, plus notes).
    #[arg(long)]
    corpus_out: Option<PathBuf>,
    /// Replay an NDJSON file, one line per round, instead of generating.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// The engine's --eval-timeout, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    eval_timeout_ms: u64,
    /// Slack on top of the eval timeout before a missing answer counts as a hang, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    deadline_margin_ms: u64,
    /// The engine's drain_timeout; it must exit within this plus the margin after shutdown or EOF.
    #[arg(long, default_value_t = 3000)]
    drain_timeout_ms: u64,
    /// Ceiling for the engine's peak RSS, in MiB.
    #[arg(long, default_value_t = 1024)]
    max_rss_mib: u64,
    /// Restart the engine (closing stdin) after this many inputs.
    #[arg(long, default_value_t = 400)]
    respawn_every: u64,
    /// Keep fuzzing after a violation (the exit status is still non-zero).
    #[arg(long)]
    keep_going: bool,
    /// Do not start the fake layer 5/6 provider on 127.0.0.1.
    #[arg(long)]
    no_provider: bool,
}

/// Where the binary is when no path is given.
fn find_engine(cli: &Cli) -> Result<PathBuf> {
    if let Some(p) = &cli.engine {
        return Ok(p.clone());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join("attest-engine");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("no engine binary: pass --engine, set ATTEST_ENGINE_PATH or build target/{{release,debug}}/attest-engine")
}

/// Running totals for the summary line.
#[derive(Default)]
struct Stats {
    inputs: u64,
    lines_sent: u64,
    responses: u64,
    spawns: u64,
    violations: BTreeMap<Invariant, u64>,
    /// Distinct violation classes (invariant + normalised detail) with counts.
    classes: BTreeMap<String, u64>,
    peak_rss_kib: u64,
}

struct Fuzzer {
    cli: Cli,
    seed: u64,
    launch: Launch,
    gen: gen::Gen,
    stats: Stats,
    engine: Option<Engine>,
    /// Inputs since the current engine started.
    session_inputs: u64,
    /// The initialize line that opened the current session, if it succeeded.
    init_line: Option<Vec<u8>>,
    probe: u64,
    /// A fresh engine gets extra time for its first answer (start-up).
    fresh: bool,
}

/// How a round ended, for the session bookkeeping.
#[derive(Default)]
struct RoundEnd {
    violations: Vec<Violation>,
    /// The engine is gone or unusable: start a new one.
    restart: bool,
    /// The engine may be shutting down: close its input and check it exits.
    retire: bool,
}

impl Fuzzer {
    fn engine(&mut self) -> Result<&mut Engine> {
        if self.engine.is_none() {
            self.engine = Some(Engine::spawn(&self.launch)?);
            self.stats.spawns += 1;
            self.session_inputs = 0;
            self.init_line = None;
            self.fresh = true;
        }
        Ok(self.engine.as_mut().expect("just spawned"))
    }

    fn deadline_for(&self, bytes: usize) -> Duration {
        let base = Duration::from_millis(self.cli.eval_timeout_ms + self.cli.deadline_margin_ms);
        // Reading and parsing a big line takes time of its own (about a second per MiB is generous).
        let size = Duration::from_millis((bytes as u64 >> 20) * 1000);
        let startup = if self.fresh { Duration::from_secs(10) } else { Duration::ZERO };
        base + size + startup
    }

    fn exit_limit(&self) -> Duration {
        Duration::from_millis(self.cli.drain_timeout_ms + self.cli.deadline_margin_ms)
    }

    /// Sends one round and checks everything the engine says until it has answered.
    fn round(&mut self, lines: &[Vec<u8>]) -> Result<RoundEnd> {
        let max_line = gen::MAX_LINE_BYTES;
        let expects: Vec<Expect> = lines.iter().map(|l| check::expect_line(l, max_line)).collect();
        let required: usize = expects.iter().map(Expect::required_lines).sum();
        let may_shut_down = lines.iter().any(|l| l.windows(8).any(|w| w == b"shutdown"));
        self.probe += 1;
        let probe_id = format!("\"attest-fuzz-probe-{}\"", self.probe);
        let total: usize = lines.iter().map(Vec::len).sum();
        let deadline_len = self.deadline_for(total);
        let exit_limit = self.exit_limit();

        let engine = self.engine()?;
        for l in lines {
            let mut bytes = Vec::with_capacity(l.len() + 1);
            bytes.extend_from_slice(l);
            bytes.push(b'\n');
            engine.send(bytes);
        }
        engine.send(format!("{{\"jsonrpc\":\"2.0\",\"id\":{probe_id},\"method\":\"attest_fuzz_probe\"}}\n").into_bytes());
        let deadline = Instant::now() + deadline_len;

        let mut end = RoundEnd::default();
        let mut replies = Vec::new();
        let mut received = 0usize;
        let mut probe_seen = false;
        let mut shutdown_answered = false;
        let mut initialized = false;
        let mut timed_out = false;
        let mut responses = 0u64;
        loop {
            if probe_seen && received >= required {
                break;
            }
            let Some(event) = engine.recv(deadline) else {
                timed_out = true;
                break;
            };
            match event {
                Event::Eof => break,
                Event::Line(bytes, len) => {
                    responses += 1;
                    let reply = check::check_line(&bytes, len, &mut end.violations);
                    match reply {
                        Some(Reply::One(r)) if r.id == probe_id => probe_seen = true,
                        Some(r) => {
                            received += 1;
                            let members = match &r {
                                Reply::One(one) => std::slice::from_ref(one),
                                Reply::Batch(all) => all.as_slice(),
                            };
                            for one in members {
                                let result = one.body.get("result");
                                shutdown_answered |= result.is_some_and(|x| x.get("sessions_completed").is_some());
                                initialized |= result.is_some_and(|x| x.get("compatible").is_some());
                            }
                            replies.push(r);
                        }
                        None => received += 1,
                    }
                }
            }
        }
        // Lines that are already here belong to this round too.
        while let Some(Event::Line(bytes, len)) = engine.recv(Instant::now()) {
            responses += 1;
            if let Some(r) = check::check_line(&bytes, len, &mut end.violations) {
                if !matches!(&r, Reply::One(one) if one.id == probe_id) {
                    replies.push(r);
                }
            }
        }
        self.fresh = false;
        self.stats.responses += responses;

        let mut matched = check::match_round(&expects, replies);
        if timed_out {
            // Whatever is still owed at the deadline was not answered in time.
            for v in &mut matched {
                if v.invariant == Invariant::MissingResponse {
                    v.invariant = Invariant::Hang;
                    let probe = if probe_seen {
                        " (the probe sent after it was answered)"
                    } else {
                        ""
                    };
                    v.detail = format!("{} within {:.1}s{probe}", v.detail, deadline_len.as_secs_f64());
                }
            }
            if !probe_seen && !may_shut_down {
                matched.push(Violation::new(
                    Invariant::Hang,
                    format!(
                        "engine silent for {:.1}s: not even the probe request was answered",
                        deadline_len.as_secs_f64()
                    ),
                ));
            }
        }
        end.violations.extend(matched);

        let engine = self.engine.as_mut().expect("engine running");
        let gone = engine.eof || shutdown_answered || (timed_out && may_shut_down && !probe_seen);
        if gone {
            match engine.wait_exit(exit_limit) {
                None => end.violations.push(Violation::new(
                    Invariant::ExitTimeout,
                    format!(
                        "engine still running {:.1}s after shutdown or closing stdout",
                        exit_limit.as_secs_f64()
                    ),
                )),
                Some(status) if !status.success() => end.violations.push(Violation::new(
                    Invariant::EngineDied,
                    format!(
                        "engine exited with {status}; stderr tail: {}",
                        check::clip(&engine.stderr_tail(), 2000)
                    ),
                )),
                Some(_) if !may_shut_down => end.violations.push(Violation::new(
                    Invariant::EngineDied,
                    format!(
                        "engine exited without shutdown; stderr tail: {}",
                        check::clip(&engine.stderr_tail(), 2000)
                    ),
                )),
                Some(_) => {}
            }
            end.restart = true;
        } else if timed_out {
            end.restart = true;
        } else if may_shut_down {
            // A shutdown notification (or one inside a batch) gets no answer,
            // so whether the engine is now draining is unknown: end the
            // session by closing stdin, which must also end it cleanly.
            end.retire = true;
        }
        if let Some(kib) = engine.peak_rss_kib() {
            self.stats.peak_rss_kib = self.stats.peak_rss_kib.max(kib);
            if kib > self.cli.max_rss_mib * 1024 {
                end.violations.push(Violation::new(
                    Invariant::RssCeiling,
                    format!("engine peak RSS {} MiB over the {} MiB ceiling", kib / 1024, self.cli.max_rss_mib),
                ));
                end.restart = true;
            }
        }
        if initialized && self.init_line.is_none() && lines.len() == 1 {
            self.init_line = Some(lines[0].clone());
        }
        Ok(end)
    }

    /// Closes stdin and checks the engine drains and exits cleanly.
    fn retire(&mut self) -> Vec<Violation> {
        let mut out = Vec::new();
        let limit = self.exit_limit();
        let Some(mut engine) = self.engine.take() else { return out };
        engine.close_stdin();
        let end = Instant::now() + limit;
        let mut replies = Vec::new();
        while let Some(event) = engine.recv(end) {
            match event {
                Event::Eof => break,
                Event::Line(bytes, len) => {
                    self.stats.responses += 1;
                    replies.extend(check::check_line(&bytes, len, &mut out));
                }
            }
        }
        out.extend(check::match_round(&[], replies));
        match engine.wait_exit(limit) {
            None => out.push(Violation::new(
                Invariant::ExitTimeout,
                format!("engine still running {:.1}s after end of input", limit.as_secs_f64()),
            )),
            Some(status) if !status.success() => out.push(Violation::new(
                Invariant::EngineDied,
                format!(
                    "engine exited with {status} at end of input; stderr tail: {}",
                    check::clip(&engine.stderr_tail(), 2000)
                ),
            )),
            Some(_) => {}
        }
        out
    }

    /// Records violations; returns whether to stop.
    fn report(&mut self, label: &str, lines: &[Vec<u8>], violations: Vec<Violation>) -> Result<bool> {
        if violations.is_empty() {
            return Ok(false);
        }
        let stderr_tail = self.engine.as_ref().map(Engine::stderr_tail).unwrap_or_default();
        for v in &violations {
            *self.stats.violations.entry(v.invariant).or_default() += 1;
            let class = class_of(v);
            let count = self.stats.classes.entry(class.clone()).or_default();
            *count += 1;
            if *count > 1 {
                continue;
            }
            // A new class: print it in full and save a reproducer.
            let mut repro = Vec::new();
            if let Some(init) = &self.init_line {
                repro.extend_from_slice(init);
                repro.push(b'\n');
            }
            for l in lines {
                repro.extend_from_slice(l);
                repro.push(b'\n');
            }
            let n = self.stats.classes.len();
            let dir = match &self.cli.corpus_out {
                Some(d) => d.clone(),
                None => std::env::temp_dir().join(format!("attest-fuzz-{}", self.seed)),
            };
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{n:03}-{}-{label}.ndjson", v.invariant.name()));
            std::fs::write(&path, &repro)?;
            std::fs::write(
                path.with_extension("txt"),
                format!(
                    "invariant: {}\ndetail: {}\nseed: {}\ninput #{} ({label})\nengine: {}\nreplay: attest-fuzz --engine {} --replay {}\n\nengine stderr (tail):\n{}\n",
                    v.invariant,
                    v.detail,
                    self.seed,
                    self.stats.inputs,
                    self.launch.binary.display(),
                    self.launch.binary.display(),
                    path.display(),
                    stderr_tail
                ),
            )?;
            let shown = String::from_utf8_lossy(&repro);
            eprintln!(
                "VIOLATION {} (seed {}, input #{}, {label}): {}\n  input: {}\n  saved: {}",
                v.invariant,
                self.seed,
                self.stats.inputs,
                v.detail,
                check::clip(shown.trim_end(), 1500),
                path.display()
            );
        }
        Ok(!self.cli.keep_going)
    }

    fn summary(&self, started: Instant) -> String {
        let secs = started.elapsed().as_secs_f64();
        let total: u64 = self.stats.violations.values().sum();
        let per: Vec<String> = Invariant::ALL
            .iter()
            .map(|i| format!("{}={}", i.name(), self.stats.violations.get(i).copied().unwrap_or(0)))
            .collect();
        format!(
            "attest-fuzz summary: seed={} inputs={} lines_sent={} responses_checked={} violations={} classes={} engines={} peak_rss_mib={} duration={:.1}s inputs/s={:.1}\n  per invariant: {}",
            self.seed,
            self.stats.inputs,
            self.stats.lines_sent,
            self.stats.responses,
            total,
            self.stats.classes.len(),
            self.stats.spawns,
            self.stats.peak_rss_kib / 1024,
            secs,
            self.stats.inputs as f64 / secs.max(1e-9),
            per.join(" ")
        )
    }
}

/// A violation's class: its invariant and its detail with numbers and
/// quoted values blurred, so that one bug counts once however often it recurs.
fn class_of(v: &Violation) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in check::clip(&v.detail, 90).chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    format!("{}: {}", v.invariant, out)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let binary = find_engine(&cli)?;
    if !binary.is_file() {
        bail!("engine binary {} does not exist", binary.display());
    }
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let work_dir = std::env::temp_dir().join(format!("attest-fuzz-work-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&work_dir)?;
    let provider_url = if cli.no_provider { None } else { Some(provider::start(seed)?) };
    let launch = Launch {
        binary: binary.clone(),
        eval_timeout: Duration::from_millis(cli.eval_timeout_ms),
        work_dir: work_dir.clone(),
        provider_url,
        drain_timeout: Duration::from_millis(cli.drain_timeout_ms),
    };
    eprintln!("attest-fuzz: seed {seed}, engine {}", binary.display());
    let budget = match (cli.duration, cli.iterations) {
        (None, None) => Some(Duration::from_secs(60)),
        (d, _) => d.map(Duration::from_secs),
    };
    let replay = match &cli.replay {
        Some(path) => Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?),
        None => None,
    };
    let mut fz = Fuzzer {
        gen: gen::Gen::new(seed),
        seed,
        launch,
        stats: Stats::default(),
        engine: None,
        session_inputs: 0,
        init_line: None,
        probe: 0,
        fresh: true,
        cli,
    };
    let started = Instant::now();
    let mut replay_lines = replay.map(|bytes| {
        let mut lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
        if lines.last().is_some_and(Vec::is_empty) {
            lines.pop();
        }
        lines.into_iter()
    });
    let mut stop = false;
    while !stop {
        if budget.is_some_and(|b| started.elapsed() >= b) || fz.cli.iterations.is_some_and(|n| fz.stats.inputs >= n) {
            break;
        }
        let input = match &mut replay_lines {
            Some(it) => match it.next() {
                Some(line) => gen::Input {
                    lines: vec![line],
                    label: "replay",
                },
                None => break,
            },
            None => {
                let initialized = fz.engine.is_some() && fz.init_line.is_some();
                fz.gen.next(initialized)
            }
        };
        fz.stats.inputs += 1;
        fz.stats.lines_sent += input.lines.len() as u64;
        fz.session_inputs += 1;
        let end = fz.round(&input.lines)?;
        stop = fz.report(input.label, &input.lines, end.violations)?;
        if end.restart {
            if let Some(mut e) = fz.engine.take() {
                e.kill();
            }
        } else if end.retire || (fz.session_inputs >= fz.cli.respawn_every && replay_lines.is_none()) {
            let v = fz.retire();
            stop |= fz.report("end_of_input", &[], v)?;
        }
    }
    if !stop && fz.engine.is_some() {
        let v = fz.retire();
        fz.report("end_of_input", &[], v)?;
    }
    let summary = fz.summary(started);
    eprintln!("{summary}");
    if !fz.stats.classes.is_empty() {
        eprintln!("  violation classes:");
        for (class, n) in &fz.stats.classes {
            eprintln!("    {n:>6}  {class}");
        }
    }
    let _ = std::fs::remove_dir_all(&work_dir);
    if fz.stats.violations.is_empty() {
        Ok(())
    } else {
        std::process::exit(1)
    }
}
