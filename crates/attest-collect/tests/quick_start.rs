//! The README's `collect` and `worker` quick starts, run as written: their
//! shell blocks, with the engine this suite tests in place of
//! `target/release/attest-engine`, the nats-server found on this machine,
//! and a free port for 4222.

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{engine_bin, free_port, nats_server_bin, read_jsonl};

/// The first ```sh block after `heading`.
fn shell_block<'a>(readme: &'a str, heading: &str) -> &'a str {
    let from = readme.find(heading).unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &readme[from..];
    let start = rest.find("```sh\n").expect("a shell block") + "```sh\n".len();
    let len = rest[start..].find("```").expect("the block ends");
    &rest[start..start + len]
}

#[test]
fn the_readme_worker_quick_start_runs_offline() {
    let Some(nats) = nats_server_bin() else { return };
    let Some(engine) = engine_bin().or_else(|| {
        attest_test_support::missing(
            "ATTEST_ENGINE_BIN is not set",
            "set ATTEST_ENGINE_BIN=target/debug/attest-engine (scripts/test does)",
        )
    }) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    // The rules file comes from the `collect` quick start just above.
    let rules = readme
        .lines()
        .find(|l| l.starts_with("printf 'rules:"))
        .expect("the collect quick start writes rules.yaml");
    let block = shell_block(&readme, "### Scaling out: `worker`");
    let port = free_port().to_string();
    let examples = format!("{}/", root.join("examples").display());
    // A reader waits a few seconds for the results; a loaded test machine may
    // need longer, so the test waits for the two lines themselves (20 s at most).
    let wait = "for _ in $(seq 100); do [ \"$(cat dist-results.jsonl 2>/dev/null | wc -l)\" -ge 2 ] && break; sleep 0.2; done; cat";
    // Likewise for the server to be ready; and whatever happens, nothing the
    // block started outlives it.
    let ready = "-l nats.log & for _ in $(seq 200); do grep -q 'Server is ready' nats.log 2>/dev/null && break; sleep 0.1; done";
    let script = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n{rules}\n{block}")
        .replace("sleep 3; cat", wait)
        .replace("-l nats.log & sleep 1", ready)
        .replace("target/release/attest-engine", engine.to_str().unwrap())
        .replace("\nnats-server ", &format!("\n{} ", nats.display()))
        .replace("4222", &port)
        .replace("examples/", &examples);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // The whole group: the server and workers the block started too.
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("the quick start did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(dir.path().join("stdout")).unwrap();
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(status.success(), "{script}\n{stdout}\n{stderr}");
    assert!(stderr.contains("2 published (0 already in the stream)"), "{stderr}");
    let results = read_jsonl(&dir.path().join("dist-results.jsonl"));
    let mut got: Vec<(String, String)> = results
        .iter()
        .map(|r| (r["trace_id"].as_str().unwrap().to_owned(), r["status"].as_str().unwrap().to_owned()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("trc_bad".into(), "hard_fail".into()), ("trc_good".into(), "pass".into())],
        "{stdout}"
    );
    // What the block prints is what it stored.
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

/// The re-scoring half of the `collect` quick start (the other half listens
/// until stopped; the OpenTelemetry tests cover it).
#[test]
fn the_readme_collect_quick_start_rescores_the_example_traces() {
    let Some(engine) = engine_bin().or_else(|| {
        attest_test_support::missing(
            "ATTEST_ENGINE_BIN is not set",
            "set ATTEST_ENGINE_BIN=target/debug/attest-engine (scripts/test does)",
        )
    }) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = shell_block(&readme, "### Production traces: `collect`");
    let lines: Vec<&str> = block
        .lines()
        .filter(|l| l.starts_with("printf 'rules:") || (l.starts_with("target/release/") && l.contains(" --jsonl ")))
        .collect();
    assert_eq!(lines.len(), 2, "the block writes rules.yaml and re-scores a file:\n{block}");
    let script = format!("set -e\n{}\n", lines.join("\n"))
        .replace("target/release/attest-engine", engine.to_str().unwrap())
        .replace("examples/", &format!("{}/", root.join("examples").display()));
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{script}\n{stderr}");
    let results = read_jsonl(&dir.path().join("results.jsonl"));
    let mut got: Vec<(&str, &str)> = results
        .iter()
        .map(|r| (r["trace_id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, [("trc_bad", "hard_fail"), ("trc_good", "pass")], "{stderr}");
    // Re-scoring the same file stores nothing twice.
    let again = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("ATTEST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(read_jsonl(&dir.path().join("results.jsonl")).len(), 2);
}
