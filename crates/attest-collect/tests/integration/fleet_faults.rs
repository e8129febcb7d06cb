//! The distributed mode under faults, end to end through `attest-engine`:
//! two collectors taking OTLP/HTTP from an exporter that retries what is
//! not answered 200, two evaluation workers, and two groups of sinks (a
//! JSONL file with the embedded SQLite history, and the shared PostgreSQL
//! history), on a real nats-server and a real PostgreSQL.
//!
//! While traces flow, the test SIGKILLs workers, both sinks and a
//! collector at random points and restarts them, stalls a worker with
//! SIGSTOP past its ack wait, fills the sinks' disk and the JetStream
//! store's disk (small tmpfs mounts), restarts nats-server, and stops
//! PostgreSQL. At the end every result of every trace answered 200 is in
//! the JSONL file, the SQLite history and PostgreSQL exactly once. The one
//! documented exception: traces a collector had answered and was still
//! assembling when it was killed (only in its memory: `--settle-ms` plus
//! the publish); those may be missing, never doubled.
//!
//! The timings come from a seed (printed; `FLEET_FAULTS_SEED` replays it).
//! Needs root (tmpfs mounts), nats-server, PostgreSQL and ATTEST_ENGINE_BIN.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::otlp::{agent_trace_of, request};
use crate::support::{engine_bin, nats_server_bin, Evaluator, NatsServer, Proc, RULES, TEST_STORE};
use attest_test_support::PostgresServer;
use prost::Message;

/// Results per trace under [`RULES`].
const PER_TRACE: usize = 3;
const TRACES: usize = 400;
/// How long after its 200 a trace may still be only in its collector's
/// memory: `--settle-ms`, the assembler's tick and the publish.
const IN_MEMORY_WINDOW: Duration = Duration::from_millis(2_500);

/// A tiny deterministic generator (xorshift), so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A duration between `lo` and `hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

/// A tmpfs mounted on `dir` for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return attest_test_support::missing(
                "cannot mount a tmpfs (the fault test fills disks; it needs root)",
                "run the suite as root, as CI does",
            );
        }
        Some(Tmpfs(dir.to_owned()))
    }

    /// Fills the file system but for a few bytes.
    fn fill(&self) {
        let ballast = self.0.join("ballast");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", ballast.display()))
            .stderr(std::process::Stdio::null())
            .status();
    }

    fn free(&self) {
        let _ = std::fs::remove_file(self.0.join("ballast"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// What the exporter saw for one trace.
#[derive(Clone, Debug, Default)]
struct Sent {
    /// The collector (index) and instance that answered 200, and when.
    accepted: Option<(usize, u32, Instant)>,
    /// Non-200 answers and connection errors before that.
    refusals: u32,
}

/// One OTLP request holding trace `i`: an agent root span and a tool call.
fn trace_body(i: usize) -> Vec<u8> {
    request(agent_trace_of(trace_bytes(i), 1, "lookup_order")).encode_to_vec()
}

fn trace_bytes(i: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&0x0a77_e570_0000_0000u64.to_be_bytes());
    id[8..].copy_from_slice(&(i as u64 + 1).to_be_bytes());
    id
}

fn trace_hex(i: usize) -> String {
    trace_bytes(i).iter().map(|b| format!("{b:02x}")).collect()
}

/// The fleet's processes and where each writes.
struct Fleet {
    dir: PathBuf,
    nats_bin: PathBuf,
    nats_port: u16,
    nats_url: String,
    pg_url: String,
    rules: PathBuf,
    sink_config: PathBuf,
    results: PathBuf,
    collector_ports: [u16; 2],
    /// Instance numbers, bumped at each restart (names the stderr files).
    generation: HashMap<String, u32>,
}

impl Fleet {
    fn common(&self) -> Vec<String> {
        ["--nats", &self.nats_url, "--ack-wait-secs", "3", "--max-deliver", "50"]
            .map(String::from)
            .to_vec()
    }

    fn name(&mut self, role: &str) -> String {
        let g = self.generation.entry(role.to_owned()).or_default();
        *g += 1;
        format!("{role}-{g}")
    }

    fn spawn(&mut self, role: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        let name = self.name(role);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Proc::spawn_on(Evaluator::Engine, &self.dir, &name, &args, env)
    }

    fn worker(&mut self, role: &str) -> Proc {
        let mut args = vec!["worker".into(), "--rules".into(), self.rules.display().to_string()];
        args.extend(self.common());
        let mut p = self.spawn(role, &args, &[]);
        p.wait_for("evaluating from", 30);
        p
    }

    /// The JSONL file and the SQLite history, on the small disk.
    fn files_sink(&mut self) -> Proc {
        let mut args = vec![
            "--config".into(),
            self.sink_config.display().to_string(),
            "worker".into(),
            "--role".into(),
            "sink".into(),
            "--sink-name".into(),
            "files".into(),
            "--results-jsonl".into(),
            self.results.display().to_string(),
        ];
        args.extend(self.common());
        let mut p = self.spawn("sink-files", &args, &[]);
        p.wait_for("writing results from", 30);
        p
    }

    fn postgres_sink(&mut self) -> Proc {
        let mut args = vec!["worker".into(), "--role".into(), "sink".into(), "--sink-name".into(), "pg".into()];
        args.extend(self.common());
        let url = self.pg_url.clone();
        let mut p = self.spawn("sink-pg", &args, &[("ATTEST_HISTORY_URL", &url)]);
        p.wait_for("writing results from", 30);
        p
    }

    fn collector(&mut self, n: usize) -> Proc {
        let mut args = vec![
            "collect".into(),
            "--rules".into(),
            self.rules.display().to_string(),
            "--otlp-http".into(),
            format!("127.0.0.1:{}", self.collector_ports[n]),
            "--settle-ms".into(),
            "200".into(),
        ];
        args.extend(self.common());
        let mut p = self.spawn(&format!("collector{n}"), &args, &[]);
        p.wait_for("listening for OTLP/HTTP on ", 30);
        p
    }

    fn nats(&self) -> NatsServer {
        NatsServer::start_on_port(&self.nats_bin, &self.dir, TEST_STORE, self.nats_port)
    }
}

/// Sends every trace, one request each, to collector `i % 2`, retrying what
/// is not answered 200 (as OpenTelemetry exporters retry 429/502/503/504)
/// until `give_up`.
async fn export(ports: [u16; 2], generations: Arc<Mutex<[u32; 2]>>, sent: Arc<Mutex<Vec<Sent>>>, give_up: Instant) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let mut pending: Vec<usize> = (0..TRACES).collect();
    let mut round = 0;
    while !pending.is_empty() && Instant::now() < give_up {
        let mut again = Vec::new();
        for (n, &i) in pending.iter().enumerate() {
            // A steady stream, about 10 traces a second, that lasts
            // through every fault.
            if round == 0 && n > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let c = (i + round) % 2;
            let generation = generations.lock().unwrap()[c];
            let answer = client
                .post(format!("http://127.0.0.1:{}/v1/traces", ports[c]))
                .header("content-type", "application/x-protobuf")
                .body(trace_body(i))
                .send()
                .await;
            let mut sent = sent.lock().unwrap();
            match answer {
                Ok(r) if r.status() == 200 => sent[i].accepted = Some((c, generation, Instant::now())),
                _ => {
                    sent[i].refusals += 1;
                    again.push(i);
                }
            }
        }
        pending = again;
        round += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// (trace id, assertion id) → how many times the JSONL file holds it.
fn jsonl_counts(path: &Path) -> HashMap<(String, String), usize> {
    let mut counts = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("a torn line {line:?}: {e}"));
        *counts
            .entry((
                r["trace_id"].as_str().unwrap().to_owned(),
                format!("{}/{}", r["rule"].as_str().unwrap(), r["assertion_id"].as_str().unwrap()),
            ))
            .or_default() += 1;
    }
    counts
}

/// trace id → results the SQLite history holds for it.
fn sqlite_counts(path: &Path) -> HashMap<String, usize> {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = conn.prepare("SELECT trace_id, SUM(size) FROM batches GROUP BY trace_id").unwrap();
    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// trace id → results PostgreSQL holds for it (and how many distinct).
fn postgres_counts(pg: &PostgresServer) -> HashMap<String, (usize, usize)> {
    pg.psql(
        "fleet",
        "SELECT trace_id, count(*), count(DISTINCT assertion_id) FROM attest_results GROUP BY trace_id",
    )
    .lines()
    .map(|l| {
        let mut f = l.split('|');
        let id = f.next().unwrap().to_owned();
        let n = f.next().unwrap().parse().unwrap();
        let d = f.next().unwrap().parse().unwrap();
        (id, (n, d))
    })
    .collect()
}

#[test]
fn the_fleet_loses_nothing_it_answered_for_and_stores_nothing_twice() {
    if engine_bin().is_none() {
        attest_test_support::missing::<()>(
            "ATTEST_ENGINE_BIN is not set",
            "set it to target/debug/attest-engine (scripts/test does)",
        );
        return;
    }
    let Some(nats_bin) = nats_server_bin() else { return };
    let Some(pg) = PostgresServer::start() else { return };
    let seed = std::env::var("FLEET_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fleet fault test: FLEET_FAULTS_SEED={seed}");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let Some(js_disk) = Tmpfs::mount(&dir.join("js"), "48m") else {
        return;
    };
    let Some(sink_disk) = Tmpfs::mount(&dir.join("sinkdisk"), "16m") else {
        return;
    };
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let sink_config = dir.join("sink.toml");
    std::fs::write(
        &sink_config,
        format!("history_path = '{}'\n", sink_disk.0.join("history.sqlite3").display()),
    )
    .unwrap();
    let nats_port = crate::support::free_port();
    let mut fleet = Fleet {
        dir: dir.clone(),
        nats_bin,
        nats_port,
        nats_url: format!("nats://127.0.0.1:{nats_port}"),
        pg_url: pg.database("fleet"),
        rules,
        sink_config,
        results: sink_disk.0.join("results.jsonl"),
        collector_ports: [crate::support::free_port(), crate::support::free_port()],
        generation: HashMap::new(),
    };
    let mut nats = Some(fleet.nats());
    let mut workers = [fleet.worker("worker-a"), fleet.worker("worker-b")];
    let mut files = fleet.files_sink();
    let mut postgres = fleet.postgres_sink();
    let mut collectors = [fleet.collector(0), fleet.collector(1)];

    let sent = Arc::new(Mutex::new(vec![Sent::default(); TRACES]));
    let generations = Arc::new(Mutex::new([1u32, 1]));
    // Collectors killed: (index, instance, when).
    let mut killed_collectors: Vec<(usize, u32, Instant)> = Vec::new();
    let exporter = {
        let (sent, generations, ports) = (sent.clone(), generations.clone(), fleet.collector_ports);
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(export(ports, generations, sent, Instant::now() + Duration::from_secs(150)))
        })
    };

    let pause = |rng: &mut Rng| std::thread::sleep(rng.ms(300, 1_200));
    let mut faults = Vec::new();
    // 1. A worker killed mid-batch, then started again.
    pause(&mut rng);
    workers[0].signal("KILL");
    let _ = workers[0].wait_exit(10);
    workers[0] = fleet.worker("worker-a");
    faults.push("SIGKILL worker");
    // 2. A worker stalled past its ack wait: its messages go to the other.
    pause(&mut rng);
    workers[1].signal("STOP");
    std::thread::sleep(rng.ms(4_000, 6_000));
    workers[1].signal("CONT");
    faults.push("SIGSTOP worker past its ack wait");
    // 3. Each sink killed mid-write.
    pause(&mut rng);
    files.signal("KILL");
    let _ = files.wait_exit(10);
    files = fleet.files_sink();
    pause(&mut rng);
    postgres.signal("KILL");
    let _ = postgres.wait_exit(10);
    postgres = fleet.postgres_sink();
    faults.push("SIGKILL both sinks");
    // 4. The sinks' disk full for a while.
    pause(&mut rng);
    sink_disk.fill();
    std::thread::sleep(rng.ms(2_000, 4_000));
    sink_disk.free();
    faults.push("sink disk full");
    // 5. PostgreSQL down for a while.
    pause(&mut rng);
    pg.stop();
    std::thread::sleep(rng.ms(2_000, 4_000));
    pg.start_again();
    faults.push("PostgreSQL stopped");
    // 6. A collector killed, and started again on its port.
    pause(&mut rng);
    let c = (rng.next() % 2) as usize;
    collectors[c].signal("KILL");
    killed_collectors.push((c, generations.lock().unwrap()[c], Instant::now()));
    let _ = collectors[c].wait_exit(10);
    generations.lock().unwrap()[c] += 1;
    collectors[c] = fleet.collector(c);
    faults.push("SIGKILL collector");
    // 7. The JetStream store's disk full, then nats-server restarted.
    pause(&mut rng);
    js_disk.fill();
    std::thread::sleep(rng.ms(2_000, 4_000));
    js_disk.free();
    drop(nats.take());
    std::thread::sleep(rng.ms(200, 1_000));
    nats = Some(fleet.nats());
    faults.push("JetStream disk full, nats-server restarted");

    exporter.join().unwrap();
    let sent = sent.lock().unwrap().clone();
    let in_memory_when_killed = |s: &Sent| {
        s.accepted.is_some_and(|(c, generation, at)| {
            killed_collectors
                .iter()
                .any(|&(kc, kg, when)| kc == c && kg == generation && at <= when && when.duration_since(at) < IN_MEMORY_WINDOW)
        })
    };
    let answered: Vec<usize> = (0..TRACES).filter(|&i| sent[i].accepted.is_some()).collect();
    let must_have: Vec<usize> = answered.iter().copied().filter(|&i| !in_memory_when_killed(&sent[i])).collect();
    let refusals: u32 = sent.iter().map(|s| s.refusals).sum();
    eprintln!(
        "faults: {faults:?}; {} of {TRACES} traces answered 200 ({refusals} non-200 answers or refused connections retried); {} were in a killed collector's memory",
        answered.len(),
        answered.len() - must_have.len()
    );
    assert!(
        answered.len() > TRACES * 9 / 10,
        "the exporter could not deliver: {} of {TRACES}",
        answered.len()
    );

    // Wait (bounded) until every store holds what it must.
    let deadline = Instant::now() + Duration::from_secs(120);
    let complete = |counts: &HashMap<String, usize>| {
        must_have
            .iter()
            .all(|&i| counts.get(&trace_hex(i)).copied().unwrap_or(0) >= PER_TRACE)
    };
    loop {
        let jsonl: HashMap<String, usize> = jsonl_counts(&fleet.results).into_iter().fold(HashMap::new(), |mut m, ((t, _), n)| {
            *m.entry(t).or_default() += n;
            m
        });
        let pg_counts: HashMap<String, usize> = postgres_counts(&pg).into_iter().map(|(t, (n, _))| (t, n)).collect();
        let sqlite = sqlite_counts(&sink_disk.0.join("history.sqlite3"));
        if (complete(&jsonl) && complete(&pg_counts) && complete(&sqlite)) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Late redeliveries must not add anything.
    std::thread::sleep(Duration::from_secs(4));
    for c in collectors {
        let (code, log) = c.terminate();
        assert!(code == 0 || code == 1, "collector exit {code}: {log}");
    }
    for w in workers {
        let (code, log) = w.terminate();
        assert_eq!(code, 0, "{log}");
    }
    for s in [files, postgres] {
        let (code, log) = s.terminate();
        assert_eq!(code, 0, "{log}");
    }
    drop(nats);

    let jsonl = jsonl_counts(&fleet.results);
    let sqlite = sqlite_counts(&sink_disk.0.join("history.sqlite3"));
    let postgres = postgres_counts(&pg);
    let mut problems = Vec::new();
    for ((trace, assertion), n) in &jsonl {
        if *n != 1 {
            problems.push(format!("JSONL holds {trace} {assertion} {n} times"));
        }
    }
    for (i, sent) in sent.iter().enumerate() {
        let id = trace_hex(i);
        let in_jsonl = jsonl.keys().filter(|(t, _)| *t == id).count();
        let in_sqlite = sqlite.get(&id).copied().unwrap_or(0);
        let (in_pg, distinct_pg) = postgres.get(&id).copied().unwrap_or((0, 0));
        let must = must_have.contains(&i);
        // A trace's results travel as one message: all of them or none.
        for (store, n) in [("JSONL", in_jsonl), ("SQLite", in_sqlite), ("PostgreSQL", in_pg)] {
            if n != PER_TRACE && (must || n != 0) {
                problems.push(format!("{store} holds {n} results of trace {id} (answered: {sent:?})"));
            }
        }
        if in_pg != distinct_pg {
            problems.push(format!("PostgreSQL holds a result of {id} twice"));
        }
    }
    if !problems.is_empty() {
        let mut logs: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
        logs.sort();
        for log in logs.iter().filter(|p| p.extension().is_some_and(|x| x == "stderr" || x == "log")) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("--- {} (last 25 of {} lines)", log.display(), lines.len());
            for l in &lines[lines.len().saturating_sub(25)..] {
                eprintln!("{l}");
            }
        }
    }
    let shown: Vec<&String> = problems.iter().take(30).collect();
    assert!(problems.is_empty(), "{} problems (seed {seed}):\n{shown:#?}", problems.len());
    let lost_in_memory = answered
        .iter()
        .filter(|&&i| !must_have.contains(&i) && !jsonl.keys().any(|(t, _)| *t == trace_hex(i)))
        .count();
    // What the faults did, from the processes' own logs.
    let logs = |prefix: &str| -> String {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    };
    let sink_failures = logs("sink-").matches("storing failed").count();
    eprintln!(
        "fleet fault test: {lost_in_memory} traces lost in the killed collector's memory; sinks reported {sink_failures} failed stores; collectors logged {} refused or failed publishes",
        logs("collector").matches("publish").count()
    );
    eprintln!(
        "fleet fault test: {} results checked in each of 3 stores, none lost, none twice",
        must_have.len() * PER_TRACE
    );
}
