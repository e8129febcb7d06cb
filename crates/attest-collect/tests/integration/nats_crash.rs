//! Distributed mode on a real nats-server (Debian package `nats-server`, or a
//! binary named by NATS_SERVER_BIN): three evaluation workers, one killed with
//! SIGKILL mid-batch, one that exits after publishing a result and before
//! acknowledging. Every trace must be evaluated exactly once in the sink —
//! none lost, none counted twice — and redelivery must really have happened.
//! The crash test runs `attest-engine worker` when ATTEST_ENGINE_BIN names
//! the engine; the dead-letter and progress-ack tests need the harness's
//! failure and delay hooks.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::support::{nats_server_bin, plugin_wasm, read_jsonl, wait_lines, Evaluator, NatsServer, Proc, RULES};

/// Rules and global flags that make every evaluation take about half a
/// second, so a worker can be killed mid-batch. The engine gets a real
/// plugin assertion that spins until its 500 ms deadline (it reports a
/// `timeout` result); the harness sleeps in its test evaluator.
fn slow_setup(evaluator: Evaluator, dir: &Path) -> (String, Vec<String>, Vec<(&'static str, &'static str)>, usize) {
    match evaluator {
        Evaluator::Engine => {
            let config = dir.join("attest.toml");
            std::fs::write(
                &config,
                format!("[[plugins]]\npath = '{}'\ntimeout = '500ms'\n", plugin_wasm("spin").display()),
            )
            .unwrap();
            let rules = format!("{RULES}      - {{assertion_id: slow, type: plugin, spec: {{plugin_id: spin, config: {{}}}}}}\n");
            (rules, vec!["--config".into(), config.display().to_string()], vec![], 4)
        }
        Evaluator::TestHarness => (RULES.to_owned(), vec![], vec![("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "500")], 3),
    }
}

#[test]
fn killed_and_crashing_workers_lose_nothing_and_count_nothing_twice() {
    let Some(bin) = nats_server_bin() else { return };
    let evaluator = Evaluator::product();
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&bin, dir.path());
    let (rules_text, global, slow_env, per_trace_results) = slow_setup(evaluator, dir.path());
    let global: Vec<&str> = global.iter().map(String::as_str).collect();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, rules_text).unwrap();
    let rules = rules.to_str().unwrap();
    let results = dir.path().join("results.jsonl");

    const TRACES: usize = 90;
    let input = dir.path().join("traces.jsonl");
    let lines: Vec<String> = (0..TRACES)
        .map(|i| {
            serde_json::json!({
                "schema_version": 1, "trace_id": format!("trc_{i:03}"), "agent_id": "refund-agent",
                "steps": [{"type": "tool_call", "name": "lookup_order", "args": {}, "result": {}}],
                "output": {"message": "refund sent"}
            })
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();

    let common = ["--nats", &nats.url, "--ack-wait-secs", "3", "--max-deliver", "5"];
    let sink = Proc::spawn_on(
        evaluator,
        dir.path(),
        "sink",
        &[
            &global[..],
            &["worker", "--role", "sink", "--results-jsonl", results.to_str().unwrap()][..],
            &common[..],
        ]
        .concat(),
        &[],
    );
    let worker = |name: &str, env: &[(&str, &str)]| {
        Proc::spawn_on(
            evaluator,
            dir.path(),
            name,
            &[&global[..], &["worker", "--rules", rules, "--concurrency", "2"][..], &common[..]].concat(),
            &[&slow_env[..], env].concat(),
        )
    };
    let mut killed = worker("killed", &[]);
    let mut crashing = worker("crashing", &[("ATTEST_COLLECT_FAULT_EXIT_AFTER_PUBLISH", "3")]);
    let mut survivor = worker("survivor", &[]);
    for w in [&mut killed, &mut crashing, &mut survivor] {
        w.wait_for("evaluating from", 20);
    }

    // Publish every trace twice: the server drops the second copy by message id.
    for run in 0..2 {
        let mut collector = Proc::spawn_on(
            evaluator,
            dir.path(),
            &format!("collector{run}"),
            &[
                &global[..],
                &["collect", "--rules", rules, "--jsonl", input.to_str().unwrap()][..],
                &common[..],
            ]
            .concat(),
            &[],
        );
        assert_eq!(collector.wait_exit(60), 0, "{}", collector.stderr_text());
        let dups = if run == 0 { 0 } else { TRACES };
        let expected = format!("{TRACES} published ({dups} already in the stream)");
        assert!(
            collector.stderr_text().contains(&expected),
            "{expected:?} not in {}",
            collector.stderr_text()
        );
    }

    // Kill one worker mid-batch.
    let early = wait_lines(&results, 30, 60);
    assert!(early >= 30, "no progress before the kill: {early} results");
    killed.signal("KILL");
    assert_eq!(killed.wait_exit(10), -1, "killed by a signal");

    let total = wait_lines(&results, TRACES * per_trace_results, 120);
    assert_eq!(total, TRACES * per_trace_results, "sink has {total} results");
    // Give late redeliveries a moment to show up (they must not add lines).
    std::thread::sleep(Duration::from_secs(4));

    let crash_log = crashing.stderr_text();
    assert_eq!(crashing.wait_exit(10), 70, "{crash_log}");
    let crashed_trace = crash_log
        .lines()
        .find_map(|l| l.split("publishing results of ").nth(1))
        .map(|s| s.split(',').next().unwrap().trim().to_string())
        .expect("crashing worker said which trace it published");

    let (code, survivor_log) = survivor.terminate();
    assert_eq!(code, 0, "{survivor_log}");
    let (code, sink_log) = sink.terminate();
    assert_eq!(code, 0, "{sink_log}");

    let records = read_jsonl(&results);
    assert_eq!(records.len(), TRACES * per_trace_results);
    let mut per_trace: HashMap<String, HashSet<String>> = HashMap::new();
    for r in &records {
        let key = r["assertion_id"].as_str().unwrap().to_string();
        assert!(
            per_trace
                .entry(r["trace_id"].as_str().unwrap().to_string())
                .or_default()
                .insert(key),
            "counted twice: {r}"
        );
    }
    assert_eq!(per_trace.len(), TRACES, "every trace evaluated");
    assert!(per_trace.values().all(|a| a.len() == per_trace_results));
    if evaluator == Evaluator::Engine {
        // The engine's own verdicts, and the spinning plugin stopped at its deadline.
        for r in &records {
            let want = match r["assertion_id"].as_str().unwrap() {
                "uses-lookup" | "says-refund" => "pass",
                _ => "hard_fail",
            };
            assert_eq!(r["status"], want, "{r}");
        }
    }

    // Redelivery really happened: the killed worker's in-flight traces were
    // evaluated again (delivery >= 2), and the trace whose ack was lost in the
    // crash was delivered again to a surviving worker.
    let redelivered = records.iter().filter(|r| r["delivery"].as_u64().unwrap() >= 2).count();
    assert!(redelivered > 0, "no result came from a redelivery");
    assert!(
        survivor_log.contains(&format!("of trace {crashed_trace}"))
            || std::fs::read_to_string(&killed.stderr)
                .unwrap()
                .contains(&format!("of trace {crashed_trace}")),
        "trace {crashed_trace} was not redelivered; survivor:\n{survivor_log}"
    );
    eprintln!("{redelivered} results from redeliveries; crash-before-ack trace {crashed_trace} redelivered");
}

/// A nats-server with the standard rules beside it, a sink writing
/// `results.jsonl`, and the flags every process of the test shares.
/// `dir` is declared first so that it outlives the server and the processes.
struct Scene {
    dir: tempfile::TempDir,
    _nats: NatsServer,
    rules: String,
    results: std::path::PathBuf,
    common: Vec<String>,
    sink: Proc,
}

impl Scene {
    /// `None` (the test skipped, with a note) without a nats-server.
    fn start(flags: &[&str]) -> Option<Scene> {
        let bin = nats_server_bin()?;
        let dir = tempfile::tempdir().unwrap();
        let nats = NatsServer::start(&bin, dir.path());
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, RULES).unwrap();
        let results = dir.path().join("results.jsonl");
        let common: Vec<String> = [&["--nats", nats.url.as_str()][..], flags]
            .concat()
            .into_iter()
            .map(String::from)
            .collect();
        let sink_args = [
            &["worker", "--role", "sink", "--results-jsonl", results.to_str().unwrap()][..],
            &strs(&common),
        ]
        .concat();
        let sink = Proc::spawn(dir.path(), "sink", &sink_args, &[]);
        Some(Scene {
            rules: rules.to_str().unwrap().to_owned(),
            dir,
            _nats: nats,
            results,
            common,
            sink,
        })
    }

    /// An evaluating worker on the test harness, ready to take messages.
    fn worker(&self, name: &str, env: &[(&str, &str)]) -> Proc {
        let args = [&["worker", "--rules", self.rules.as_str()][..], &strs(&self.common)].concat();
        let mut w = Proc::spawn(self.dir.path(), name, &args, env);
        w.wait_for("evaluating from", 20);
        w
    }

    /// Publishes these traces with `collect --jsonl`, which must succeed.
    fn publish(&self, ids: &[&str]) {
        let input = self.dir.path().join("traces.jsonl");
        let lines: Vec<String> = ids
            .iter()
            .map(|id| {
                serde_json::json!({"schema_version": 1, "trace_id": id, "agent_id": "refund-agent", "steps": [], "output": {"message": "x"}})
                    .to_string()
            })
            .collect();
        std::fs::write(&input, lines.join("\n")).unwrap();
        let args = [
            &["collect", "--rules", self.rules.as_str(), "--jsonl", input.to_str().unwrap()][..],
            &strs(&self.common),
        ]
        .concat();
        let mut collector = Proc::spawn(self.dir.path(), "collector", &args, &[]);
        assert_eq!(collector.wait_exit(60), 0, "{}", collector.stderr_text());
    }

    /// Stops the sink (it must exit cleanly) and returns the stored results.
    fn finish(self) -> Vec<serde_json::Value> {
        let (code, log) = self.sink.terminate();
        assert_eq!(code, 0, "{log}");
        read_jsonl(&self.results)
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_trace_that_keeps_failing_goes_to_the_dead_letter_subject_at_its_last_delivery() {
    let Some(scene) = Scene::start(&["--ack-wait-secs", "3", "--max-deliver", "2"]) else {
        return;
    };
    let mut worker = scene.worker("worker", &[("ATTEST_COLLECT_TEST_FAIL_TRACE", "trc_3")]);
    scene.publish(&["trc_0", "trc_1", "trc_2", "trc_3", "trc_4"]);
    // The last delivery that evaluates (the second) dead-letters it with
    // its error; no third delivery is needed.
    let log = worker.wait_for(
        "trace trc_3 moved to attest.dead (rule refund-tools: test evaluator: provider unavailable)",
        60,
    );
    assert!(log.contains("redelivery 2 of trace trc_3"), "{log}");
    assert!(!log.contains("redelivery 3 of trace trc_3"), "{log}");
    assert_eq!(wait_lines(&scene.results, 12, 30), 12, "the other four traces are evaluated");
    let (code, _) = worker.terminate();
    assert_eq!(code, 0);
    assert!(scene.finish().iter().all(|r| r["trace_id"] != "trc_3"));
}

#[test]
fn a_slow_evaluation_keeps_its_message_with_progress_acks() {
    // Evaluation takes 3.5 s, more than three times the 1 s ack wait.
    let Some(scene) = Scene::start(&["--ack-wait-secs", "1", "--max-deliver", "5"]) else {
        return;
    };
    let workers: Vec<Proc> = (0..2)
        .map(|i| scene.worker(&format!("worker{i}"), &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "3500")]))
        .collect();
    scene.publish(&["trc_slow"]);
    assert_eq!(wait_lines(&scene.results, 3, 30), 3);
    std::thread::sleep(Duration::from_secs(2));
    for w in workers {
        let (code, log) = w.terminate();
        assert_eq!(code, 0, "{log}");
        assert!(
            !log.contains("redelivery"),
            "the message was taken away from the slow worker:\n{log}"
        );
    }
    assert!(scene.finish().iter().all(|r| r["delivery"] == 1));
}

/// SIGTERM drains a worker's evaluations for at most 30 s; a second signal
/// stops waiting at once. An abandoned message is not lost: unacknowledged,
/// it goes back to the stream and another worker evaluates it.
#[test]
fn a_worker_stopped_twice_abandons_its_evaluation_and_another_takes_the_message() {
    let Some(scene) = Scene::start(&["--ack-wait-secs", "2", "--max-deliver", "5"]) else {
        return;
    };
    // An evaluation of ten minutes.
    let mut stuck = scene.worker("stuck", &[("ATTEST_COLLECT_TEST_EVAL_DELAY_MS", "600000")]);
    scene.publish(&["trc_stuck"]);
    // The worker's pull is already waiting: the message is in its hands at once.
    std::thread::sleep(Duration::from_millis(1500));
    stuck.signal("TERM");
    stuck.wait_for("draining 1 in-flight evaluations (at most 30 s; a second signal stops waiting)", 10);
    stuck.signal("TERM");
    assert_eq!(stuck.wait_exit(10), 0, "{}", stuck.stderr_text());
    assert!(
        stuck
            .stderr_text()
            .contains("1 evaluations abandoned; their messages will be delivered again after the ack wait"),
        "{}",
        stuck.stderr_text()
    );
    let worker = scene.worker("worker", &[]);
    assert_eq!(wait_lines(&scene.results, 3, 30), 3, "another worker evaluates the abandoned trace");
    let (code, log) = worker.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(scene.finish().iter().all(|r| r["trace_id"] == "trc_stuck" && r["delivery"] == 2));
}
