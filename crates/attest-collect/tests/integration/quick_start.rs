//! The README's `collect` and `worker` quick starts, run as written: their
//! shell blocks, with the engine this suite tests in place of
//! `target/release/attest-engine`, the nats-server found on this machine
//! first on `PATH`, a free port for 14222, and waits for the server and the
//! results instead of fixed sleeps.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::support::{engine_bin, free_port, nats_server_bin, read_jsonl};

/// The README, and the engine its commands run with here.
struct Readme {
    text: String,
    root: PathBuf,
    engine: PathBuf,
}

impl Readme {
    /// `None` (the test skipped, with a note) without an engine to run.
    fn load() -> Option<Readme> {
        let engine = engine_bin().or_else(|| {
            attest_test_support::missing(
                "ATTEST_ENGINE_BIN is not set",
                "set ATTEST_ENGINE_BIN=target/debug/attest-engine (scripts/test does)",
            )
        })?;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("README.md")).unwrap();
        Some(Readme { text, root, engine })
    }

    /// The first ```sh block after `heading`.
    fn block(&self, heading: &str) -> &str {
        let from = self.text.find(heading).unwrap_or_else(|| panic!("README has no {heading:?}"));
        let rest = &self.text[from..];
        let start = rest.find("```sh\n").expect("a shell block") + "```sh\n".len();
        let len = rest[start..].find("```").expect("the block ends");
        &rest[start..start + len]
    }

    /// The line of the `collect` quick start that writes `rules.yaml`.
    fn rules_line(&self) -> &str {
        self.text
            .lines()
            .find(|l| l.starts_with("printf 'rules:"))
            .expect("the collect quick start writes rules.yaml")
    }

    /// `script` as it runs here: under `set -e`, with the engine under test
    /// and the repository's examples. Whatever happens, nothing it starts in
    /// the background outlives it.
    fn script(&self, script: &str) -> String {
        format!("set -e\ntrap 's=$?; kill $(jobs -p) 2>/dev/null || true; exit $s' EXIT\n{script}\n")
            .replace("target/release/attest-engine", self.engine.to_str().unwrap())
            .replace("examples/", &format!("{}/", self.root.join("examples").display()))
    }
}

/// Runs `script` with bash in `dir`, giving up (and killing all it started)
/// after 90 s; returns the exit status, stdout and stderr.
fn run(script: &str, dir: &Path, env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("bash")
        .args(["-c", script])
        .current_dir(dir)
        .env("ATTEST_CACHE_DIR", dir.join("cache"))
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // The whole group: a server and workers the script started too.
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("the quick start did not finish in 90 s:\n{script}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    (status, read(&out), read(&err))
}

/// (trace id, status) of each result in a JSONL results file, sorted.
fn statuses(path: &Path) -> Vec<(String, String)> {
    let mut got: Vec<(String, String)> = read_jsonl(path)
        .iter()
        .map(|r| (r["trace_id"].as_str().unwrap().into(), r["status"].as_str().unwrap().into()))
        .collect();
    got.sort();
    got
}

/// The example traces under the quick start's rule: one in order, one not.
fn expected() -> Vec<(String, String)> {
    vec![("trc_bad".into(), "hard_fail".into()), ("trc_good".into(), "pass".into())]
}

#[test]
fn the_readme_worker_quick_start_runs_offline() {
    let Some(nats) = nats_server_bin() else { return };
    let Some(readme) = Readme::load() else { return };
    // A reader waits a few seconds for the server and for the results; a
    // loaded test machine may need longer, so the test waits for the
    // server's "ready" and for the two result lines themselves.
    let ready = "-l nats.log & for _ in $(seq 200); do grep -q 'Server is ready' nats.log 2>/dev/null && break; sleep 0.1; done";
    let results = "for _ in $(seq 100); do [ \"$(cat dist-results.jsonl 2>/dev/null | wc -l)\" -ge 2 ] && break; sleep 0.2; done; cat";
    let block = readme.block("### Scaling out: `worker`");
    let mut script = readme.script(&format!("{}\n{block}", readme.rules_line()));
    // Another test's server may hold the block's port.
    for (from, to) in [
        ("-l nats.log & sleep 1", ready),
        ("sleep 3; cat", results),
        ("14222", &free_port().to_string()),
    ] {
        assert!(script.contains(from), "the block no longer has {from:?}:\n{block}");
        script = script.replace(from, to);
    }
    let dir = tempfile::tempdir().unwrap();
    // The block finds nats-server on PATH or in /usr/sbin; this machine's may be elsewhere.
    let path = format!("{}:{}", nats.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let (status, stdout, stderr) = run(&script, dir.path(), &[("PATH", &path)]);
    assert!(status.success(), "{script}\n{stdout}\n{stderr}");
    assert!(stderr.contains("2 published (0 already in the stream)"), "{stderr}");
    assert_eq!(statuses(&dir.path().join("dist-results.jsonl")), expected(), "{stderr}");
    // What the block prints is what it stored.
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

/// The re-scoring half of the `collect` quick start (the other half listens
/// until stopped; the OpenTelemetry tests cover it).
#[test]
fn the_readme_collect_quick_start_rescores_the_example_traces() {
    let Some(readme) = Readme::load() else { return };
    let block = readme.block("### Production traces: `collect`");
    let lines: Vec<&str> = block
        .lines()
        .filter(|l| l.starts_with("printf 'rules:") || (l.starts_with("target/release/") && l.contains(" --jsonl ")))
        .collect();
    assert_eq!(lines.len(), 2, "the block writes rules.yaml and re-scores a file:\n{block}");
    let script = readme.script(&lines.join("\n"));
    let dir = tempfile::tempdir().unwrap();
    let (status, _, stderr) = run(&script, dir.path(), &[]);
    assert!(status.success(), "{script}\n{stderr}");
    let results = dir.path().join("results.jsonl");
    assert_eq!(statuses(&results), expected(), "{stderr}");
    // Re-scoring the same file stores nothing twice.
    let (status, _, stderr) = run(&script, dir.path(), &[]);
    assert!(status.success(), "{stderr}");
    assert_eq!(statuses(&results), expected(), "{stderr}");
}
