//! Helpers shared by the integration tests: spawning the collector (the
//! product binary, or the test harness), reading its stderr, signalling it,
//! reading result files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which binary serves `collect` and `worker` in a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluator {
    /// `attest-engine`, named by ATTEST_ENGINE_BIN (scripts/test sets it):
    /// the product, evaluating with the engine's own layers.
    Engine,
    /// This crate's harness with the test evaluator, whose hooks
    /// (ATTEST_COLLECT_TEST_EVAL_DELAY_MS, ATTEST_COLLECT_TEST_FAIL_TRACE)
    /// make evaluations slow or failing on demand.
    TestHarness,
}

impl Evaluator {
    /// The engine when ATTEST_ENGINE_BIN names one, else the harness (with a
    /// loud note, since the product path is then not exercised).
    pub fn product() -> Evaluator {
        if engine_bin().is_some() {
            Evaluator::Engine
        } else {
            attest_test_support::missing::<()>(
                "ATTEST_ENGINE_BIN is not set, so this test runs on the test harness instead of attest-engine",
                "set ATTEST_ENGINE_BIN=target/debug/attest-engine (scripts/test does)",
            );
            Evaluator::TestHarness
        }
    }

    pub fn command(self) -> Command {
        match self {
            Evaluator::Engine => {
                let mut cmd = Command::new(engine_bin().expect("ATTEST_ENGINE_BIN"));
                cmd.arg("--log-level=info");
                cmd
            }
            Evaluator::TestHarness => Command::new(env!("CARGO_BIN_EXE_attest-collect-testbin")),
        }
    }
}

pub fn engine_bin() -> Option<PathBuf> {
    std::env::var_os("ATTEST_ENGINE_BIN").map(PathBuf::from).filter(|p| p.exists())
}

/// nats-server for the distributed-mode tests (Debian package `nats-server`,
/// or a binary named by NATS_SERVER_BIN); `None` (test skipped, with a note) without one.
pub fn nats_server_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return Some(PathBuf::from(p));
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/bin"])
    {
        let p = Path::new(dir).join("nats-server");
        if p.is_file() {
            return Some(p);
        }
    }
    attest_test_support::missing(
        "nats-server is not installed",
        "apt-get install nats-server, or set NATS_SERVER_BIN",
    )
}

pub use attest_test_support::free_port;

/// The JetStream store a test server gets. Left to itself, the server may
/// use 75% of the disk that is free when it starts, so on a nearly full disk
/// it would refuse the streams' 1 GiB reservations; the streams of a test
/// hold a few kilobytes.
pub const TEST_STORE: &str = "jetstream { max_file_store: 64GB }\n";

pub struct NatsServer {
    child: Child,
    pub url: String,
    pub port: u16,
}

impl NatsServer {
    pub fn start(bin: &Path, dir: &Path) -> NatsServer {
        Self::start_with(bin, dir, TEST_STORE)
    }

    /// With this server configuration (written to `nats.conf` in `dir`).
    pub fn start_with(bin: &Path, dir: &Path, config: &str) -> NatsServer {
        Self::start_on_port(bin, dir, config, free_port())
    }

    /// On this port: a server started again where a stopped one was.
    pub fn start_on_port(bin: &Path, dir: &Path, config: &str, port: u16) -> NatsServer {
        let conf = dir.join("nats.conf");
        std::fs::write(&conf, config).unwrap();
        let store = dir.join("js");
        Self::launch(
            bin,
            dir,
            port,
            &["-js", "-sd", store.to_str().unwrap(), "-c", conf.to_str().unwrap()],
        )
    }

    /// A server without JetStream, as `nats-server` runs when not asked for it.
    pub fn start_without_jetstream(bin: &Path, dir: &Path) -> NatsServer {
        Self::launch(bin, dir, free_port(), &[])
    }

    /// Starts the server on loopback and waits (bounded) until it is ready.
    fn launch(bin: &Path, dir: &Path, port: u16, args: &[&str]) -> NatsServer {
        let log = dir.join("nats.log");
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start nats-server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("Server is ready") {
            assert!(
                Instant::now() < deadline,
                "nats-server not ready: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        NatsServer {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            port,
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_lines(path: &Path, n: usize, secs: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let have = std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0);
        if have >= n || Instant::now() > deadline {
            return have;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A built plugin component from the repository's `plugins/dist`.
pub fn plugin_wasm(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plugins/dist")
        .join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} is missing: run plugins/build.sh", p.display());
    p
}

pub const RULES: &str = r#"
rules:
  - name: refund-tools
    match:
      agent_id: refund-agent
    sample_rate: 1.0
    assertions:
      - {assertion_id: uses-lookup, type: trace, spec: {check: required_tools, tools: [lookup_order]}}
      - {assertion_id: says-refund, type: content, spec: {target: output.message, check: contains, value: refund}}
      - {assertion_id: escalates, type: trace, spec: {check: required_tools, tools: [escalate]}}
"#;

/// A spawned harness process whose stderr goes to a file.
pub struct Proc {
    pub child: Child,
    pub stderr: PathBuf,
}

impl Proc {
    /// The test harness (see [`Evaluator::TestHarness`]).
    pub fn spawn(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        Proc::spawn_on(Evaluator::TestHarness, dir, name, args, env)
    }

    pub fn spawn_on(evaluator: Evaluator, dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let stderr = dir.join(format!("{name}.stderr"));
        let mut cmd = evaluator.command();
        if evaluator == Evaluator::Engine {
            // Hermetic: the history and plugin cache live in the test's directory.
            cmd.env("ATTEST_CACHE_DIR", dir.join("engine-cache"))
                .env_remove("ATTEST_PLUGIN_DIR")
                .env_remove("ATTEST_CONFIG");
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc {
            child: cmd.spawn().expect("spawn harness"),
            stderr,
        }
    }

    /// What the process said: the message of each JSON log line, and any
    /// other line as it is (a panic, a usage error printed before logging
    /// starts).
    pub fn stderr_text(&self) -> String {
        messages(&self.stderr_raw())
    }

    /// Stderr as written: JSON log lines.
    pub fn stderr_raw(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until stderr contains `needle`; panics (with stderr) after `secs`.
    pub fn wait_for(&mut self, needle: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.stderr_text();
            if text.contains(needle) {
                return text;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("process exited ({status}) before printing {needle:?}; stderr:\n{text}");
            }
            assert!(Instant::now() < deadline, "no {needle:?} within {secs}s; stderr:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// SIGTERM, then waits (bounded) for the exit code.
    pub fn terminate(mut self) -> (i32, String) {
        self.signal("TERM");
        let code = self.wait_exit(30);
        (code, self.stderr_text())
    }

    pub fn wait_exit(&mut self, secs: u64) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("process did not exit within {secs}s; stderr:\n{}", self.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A collector listening on an ephemeral loopback port.
pub struct Collector {
    pub proc: Proc,
    pub url: String,
    /// The bearer token the collector was given (`--bearer-token-env`),
    /// which guards `/metrics` too.
    pub token: Option<String>,
}

impl Collector {
    pub fn start(dir: &Path, rules: &str, extra: &[&str]) -> Collector {
        Self::start_with_env(dir, rules, extra, &[])
    }

    pub fn start_with_env(dir: &Path, rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Collector {
        Self::start_on(Evaluator::TestHarness, dir, rules, extra, env)
    }

    pub fn start_on(evaluator: Evaluator, dir: &Path, rules: &str, extra: &[&str], env: &[(&str, &str)]) -> Collector {
        let rules_path = dir.join("rules.yaml");
        std::fs::write(&rules_path, rules).unwrap();
        let mut args = vec!["collect", "--rules", rules_path.to_str().unwrap(), "--otlp-http", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut proc = Proc::spawn_on(evaluator, dir, "collector", &args, env);
        proc.wait_for("listening for OTLP/HTTP on ", 30);
        let url = logged_field(&proc.stderr_raw(), "listening for OTLP/HTTP on ", "url")
            .trim_end_matches("/v1/traces")
            .to_string();
        let token = extra
            .iter()
            .position(|a| *a == "--bearer-token-env")
            .and_then(|i| extra.get(i + 1))
            .and_then(|var| env.iter().find(|(k, _)| k == var))
            .map(|(_, v)| v.to_string());
        Collector { proc, url, token }
    }

    pub async fn metrics(&self) -> String {
        let mut get = reqwest::Client::new().get(format!("{}/metrics", self.url));
        if let Some(t) = &self.token {
            get = get.bearer_auth(t);
        }
        get.send().await.unwrap().text().await.unwrap()
    }

    /// The OTLP/gRPC address (`host:port`) the collector said it listens on.
    pub fn grpc_addr(&mut self) -> String {
        self.proc.wait_for("listening for OTLP/gRPC on ", 30);
        logged_field(&self.proc.stderr_raw(), "listening for OTLP/gRPC on ", "address")
    }

    /// Waits until a metrics line starts with `prefix` and has a value >= `min`.
    pub async fn wait_metric(&self, prefix: &str, min: f64, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let m = self.metrics().await;
            if metric(&m, prefix) >= min {
                return m;
            }
            assert!(Instant::now() < deadline, "{prefix} did not reach {min} in {secs}s; metrics:\n{m}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Value of the series `prefix` (a name, with labels if it has any) in metrics text; 0 if absent.
/// POSTs `body` to `path` of the collector at `url` with `headers`.
pub async fn post(url: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> reqwest::Response {
    let mut req = reqwest::Client::new().post(format!("{url}{path}")).body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix) && l.as_bytes().get(prefix.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// OTLP request building for tests, with the `opentelemetry-proto` types.
pub mod otlp {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    pub fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            ..Default::default()
        }
    }

    pub fn span(trace: u8, id: u64, parent: Option<u64>, name: &str, attrs: Vec<KeyValue>) -> Span {
        span_of([trace; 16], id, parent, name, attrs)
    }

    /// [`span`] in a trace with any 16-byte id.
    pub fn span_of(trace_id: [u8; 16], id: u64, parent: Option<u64>, name: &str, attrs: Vec<KeyValue>) -> Span {
        Span {
            trace_id: trace_id.to_vec(),
            span_id: (id + 1).to_be_bytes().to_vec(),
            parent_span_id: parent.map(|p| (p + 1).to_be_bytes().to_vec()).unwrap_or_default(),
            name: name.into(),
            start_time_unix_nano: 1_700_000_000_000_000_000 + id * 1000,
            end_time_unix_nano: 1_700_000_000_000_000_000 + id * 1000 + 500,
            attributes: attrs,
            ..Default::default()
        }
    }

    /// An agent trace: invoke_agent root plus `tools` execute_tool spans (GenAI conventions).
    pub fn agent_trace(trace: u8, tools: usize, tool_name: &str) -> Vec<Span> {
        agent_trace_of([trace; 16], tools, tool_name)
    }

    /// [`agent_trace`] with any 16-byte trace id.
    pub fn agent_trace_of(trace: [u8; 16], tools: usize, tool_name: &str) -> Vec<Span> {
        let mut spans = vec![span_of(
            trace,
            0,
            None,
            "invoke_agent refund-agent",
            vec![
                kv("gen_ai.operation.name", "invoke_agent"),
                kv("gen_ai.agent.name", "refund-agent"),
                kv(
                    "gen_ai.output.messages",
                    r#"[{"role":"assistant","parts":[{"type":"text","content":"refund sent"}]}]"#,
                ),
            ],
        )];
        for i in 0..tools {
            spans.push(span_of(
                trace,
                i as u64 + 1,
                Some(0),
                "execute_tool",
                vec![kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", tool_name)],
            ));
        }
        spans
    }

    pub fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "refund-service")],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }
}

/// The JSON log lines in `text` (what a collector or worker wrote on
/// stderr), parsed; other lines are left out.
pub fn log_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Field `field` of the first log line in `text` whose message starts with
/// `msg`. Every such line names the command that wrote it.
pub fn logged_field(text: &str, msg: &str, field: &str) -> String {
    let line = log_lines(text)
        .into_iter()
        .find(|l| l["msg"].as_str().is_some_and(|m| m.starts_with(msg)))
        .unwrap_or_else(|| panic!("no log line '{msg}…': {text}"));
    assert!(
        matches!(line["command"].as_str(), Some("collect" | "worker")),
        "the line names its command: {line}"
    );
    line[field]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no {field} in {line}"))
}

/// Each JSON log line in `text` as its message and then its fields
/// (`msg key=value ...`, strings as they are), a line each, and any other
/// line as it is.
pub fn messages(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(l)) if l.contains_key("msg") => {
                out.push_str(l["msg"].as_str().unwrap_or_default());
                for (key, value) in l
                    .iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "level" | "ts" | "logger" | "msg" | "command"))
                {
                    match value {
                        serde_json::Value::String(s) => out.push_str(&format!(" {key}={s}")),
                        other => out.push_str(&format!(" {key}={other}")),
                    }
                }
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
