//! Talking JSON-RPC 2.0 to an agent, over stdio (the runtime spawns the
//! target command) or Streamable HTTP (the target is an `http(s)://` URL).
//!
//! Spawned agents are untrusted: they get a sanitized environment (an
//! allowlist plus what the manifest passes), their own process group, and on
//! Linux `PR_SET_PDEATHSIG` so they die with the runtime even when it is
//! SIGKILLed. Dropping an [`Agent`] kills the whole group. Stdout carries
//! protocol only: a line that is not JSON fails the call at once as a protocol
//! violation naming the line. Stderr is kept, bounded, for the report.
//!
//! One module per concern: the agent's environment and limits (`env`),
//! the stdio agent (`stdio`) and, on Linux, its guard process (`guard`),
//! the HTTP agent and its server-sent events (`http`), and how an agent's
//! JSON is read (`agent_json`).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use crate::util::clip;
use attest_trace::text::error_chain;

mod agent_json;
mod env;
#[cfg(target_os = "linux")]
mod guard;
mod http;
mod stdio;

pub use agent_json::*;
pub use env::*;
pub use http::*;
pub use stdio::*;

/// Longest stdout line (one JSON-RPC message) accepted from an agent.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Largest HTTP response body accepted from an agent.
pub const MAX_HTTP_BODY: usize = 16 * 1024 * 1024;

/// How much of an agent's stderr is kept (the most recent bytes).
pub const STDERR_KEEP_BYTES: usize = 64 * 1024;

/// Why a run, scenario or step ended; the audit record's `exit_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    Ok,
    Timeout,
    TransportError,
    ProtocolError,
    AgentError,
    MaxDurationExceeded,
    Error,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Ok => "ok",
            ExitReason::Timeout => "timeout",
            ExitReason::TransportError => "transport_error",
            ExitReason::ProtocolError => "protocol_error",
            ExitReason::AgentError => "agent_error",
            ExitReason::MaxDurationExceeded => "max_duration_exceeded",
            ExitReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub reason: ExitReason,
    pub message: String,
}

impl CallError {
    pub fn new(reason: ExitReason, message: impl Into<String>) -> Self {
        CallError {
            reason,
            message: message.into(),
        }
    }
}

/// True when the target names a Streamable HTTP endpoint rather than a command.
pub fn is_http_target(target: &str) -> bool {
    let t = target.trim();
    let lower = t.get(..8).unwrap_or(t).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return false;
    }
    match reqwest::Url::parse(t) {
        Ok(u) => matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()),
        Err(_) => false,
    }
}

pub enum Agent {
    Stdio(Box<StdioAgent>),
    Http(HttpAgent),
}

impl Agent {
    pub fn start(target: &str, env: &AgentEnv) -> Result<Agent, CallError> {
        if is_http_target(target) {
            Ok(Agent::Http(HttpAgent::new(target.trim())?))
        } else {
            Ok(Agent::Stdio(Box::new(StdioAgent::spawn(target, env)?)))
        }
    }

    /// Send one request and return its validated-as-JSON response object.
    pub async fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
        match self {
            Agent::Stdio(a) => a.call(method, params, timeout).await,
            Agent::Http(a) => a.call(method, params, timeout).await,
        }
    }

    /// The retained tail of the agent's stderr ("" over HTTP).
    pub fn stderr(&self) -> String {
        match self {
            Agent::Stdio(a) => a.stderr_tail(),
            Agent::Http(_) => String::new(),
        }
    }

    pub async fn stop(&mut self) {
        if let Agent::Stdio(a) = self {
            a.stop().await;
        }
    }

    pub fn is_http(&self) -> bool {
        matches!(self, Agent::Http(_))
    }
}

fn clip_json(v: Option<&Value>) -> String {
    v.map(|v| clip(&v.to_string(), 100)).unwrap_or_else(|| "no id".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_ecp_sdk_is_named_with_its_package() {
        let tb = "Traceback (most recent call last):\n  File \"agent.py\", line 3, in <module>\n    from ecp import agent\nModuleNotFoundError: No module named 'ecp'\n";
        assert!(super::missing_sdk_hint(tb).contains("pip install ecp-sdk"));
        assert!(super::missing_sdk_hint("ModuleNotFoundError: No module named 'ecp.server'").contains("ecp-sdk"));
        assert_eq!(super::missing_sdk_hint("ModuleNotFoundError: No module named 'ecpx'"), "");
        assert_eq!(super::missing_sdk_hint("ValueError: boom"), "");
    }

    use super::*;

    #[test]
    fn lone_surrogates_read_as_replacement_characters_and_pairs_stay() {
        let v = agent_json(r#"{"a": "x\ud800y", "b": "\ud83d\ude00", "c": "\\ud800", "d": "\udc00"}"#).unwrap();
        assert_eq!(v["a"], "x\u{FFFD}y");
        assert_eq!(v["b"], "\u{1F600}");
        assert_eq!(v["c"], "\\ud800", "an escaped backslash is text");
        assert_eq!(v["d"], "\u{FFFD}");
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let e = agent_json(&deep).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
        assert!(agent_json("{\"a\": \"\\u12").is_err());
        // A line of tiny objects, far more than its size allows.
        let many = format!("[{}]", vec!["{}"; 100_000].join(","));
        let e = agent_json(&many).unwrap_err().to_string();
        assert!(e.contains("more than 18750 JSON objects and arrays"), "{e}");
    }

    #[test]
    fn python_non_finite_numbers_read_as_null() {
        let v = agent_json(r#"{"a": NaN, "b": [Infinity, -Infinity, 1], "c": "NaN \" Infinity", "d": "x\ud800", "e": -1}"#).unwrap();
        assert_eq!(v["a"], Value::Null);
        assert_eq!(v["b"], serde_json::json!([null, null, 1]));
        assert_eq!(v["c"], "NaN \" Infinity", "text inside strings stays");
        assert_eq!(v["d"], "x\u{FFFD}", "with a lone surrogate in the same line");
        assert_eq!(v["e"], -1);
        assert!(agent_json(r#"{"a": NaNa}"#).is_err(), "only whole tokens");
        assert!(agent_json(r#"{"a": nan}"#).is_err(), "only Python's spelling");
    }

    #[test]
    fn http_targets_are_urls_with_a_host() {
        assert!(is_http_target("http://127.0.0.1:8765/ecp"));
        assert!(is_http_target("https://agent.example/ecp"));
        assert!(!is_http_target("python agent.py"));
        assert!(!is_http_target("http:/nohost"));
    }

    #[test]
    fn sse_events_are_parsed() {
        let raw = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"note\"}\r\n\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":1,\"result\":true}\r\n\r\n";
        let mut events = SseEvents::default();
        assert!(events.push(raw.as_bytes()).is_some_and(|v| v["result"] == true));
        // Split anywhere, a CRLF and a boundary included, it reads the same.
        for cut in 1..raw.len() {
            let mut events = SseEvents::default();
            let first = events.push(&raw.as_bytes()[..cut]);
            let v = first
                .or_else(|| events.push(&raw.as_bytes()[cut..]))
                .unwrap_or_else(|| panic!("cut at {cut}"));
            assert_eq!(v["id"], 1, "cut at {cut}");
        }
        // Lines may end in a lone CR too.
        let mut cr = SseEvents::default();
        assert!(cr.push(b"data: {\"id\":2,\r").is_none());
        assert_eq!(cr.push(b"data: \"result\":3}\r\r").unwrap()["result"], 3);
        // An event without the blank line after it counts only at the end.
        let mut open = SseEvents::default();
        assert!(open.push(b"data: {\"id\":1,\"result\":1}").is_none());
        assert_eq!(open.finish().unwrap()["result"], 1);
        // A long stream of progress events keeps only the event in progress.
        let mut long = SseEvents::default();
        for _ in 0..10_000 {
            assert!(long.push(b"data: {\"jsonrpc\":\"2.0\",\"method\":\"progress\"}\n\n").is_none());
        }
        assert!(long.pending.is_empty());
    }

    /// A stdio agent (Python's standard library only) that answers every
    /// call with its id, after writing the stray stdout `params.mode` asks for.
    fn scripted_agent(dir: &std::path::Path) -> StdioAgent {
        let script = dir.join("agent.py");
        std::fs::write(
            &script,
            r#"import json, sys
for line in sys.stdin:
    req = json.loads(line)
    mode = req["params"].get("mode")
    if mode == "json_not_object":
        print("42"); print("[1, 2]"); print("null")
    if mode == "text":
        print("starting up...")
    if mode == "slow":
        import time; time.sleep(1)
    answer_id = req["id"] - 1 if mode == "lag" else req["id"]
    answer = json.dumps({"jsonrpc": "2.0", "id": answer_id, "result": {"answered": req["id"]}})
    print(answer, flush=True)
    if mode == "twice":
        print(answer, flush=True)
"#,
        )
        .unwrap();
        StdioAgent::spawn(&format!("python3 {}", script.display()), &AgentEnv::default()).unwrap()
    }

    #[tokio::test]
    async fn stdout_json_that_is_not_an_object_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        let answer = agent.call("agent/step", json!({"mode": "json_not_object"}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 1, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn stray_stdout_text_is_passed_over_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let answer = agent
            .call("agent/step", json!({"mode": "text"}), Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(answer["result"]["answered"], 1, "{answer}");
        let tail = agent.stderr_tail();
        assert!(
            tail.contains("1 line(s) on stdout that are not JSON-RPC") && tail.contains("starting up..."),
            "{tail}"
        );
        agent.stop().await;
    }

    #[tokio::test]
    async fn the_late_answer_of_a_failed_call_is_not_taken_for_the_next_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        // A call given up at its timeout; the agent's answer to it follows.
        let e = agent
            .call("agent/step", json!({"mode": "slow"}), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(e.reason, ExitReason::Timeout, "{e}");
        let answer = agent.call("agent/reset", json!({}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 2, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn a_duplicate_answer_fails_one_call_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        let t = Duration::from_secs(20);
        agent.call("agent/step", json!({"mode": "twice"}), t).await.unwrap();
        // The second copy of call 1's answer comes first: call 2 fails ...
        let e = agent.call("agent/step", json!({}), t).await.unwrap_err();
        assert!(e.message.contains("expected 2, got 1"), "{e}");
        // ... and its own answer, which follows, is passed over by call 3.
        let answer = agent.call("agent/step", json!({}), t).await.unwrap();
        assert_eq!(answer["result"]["answered"], 3, "{answer}");
        agent.stop().await;
    }

    #[tokio::test]
    async fn an_agent_answering_with_the_wrong_id_fails_each_call_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = scripted_agent(dir.path());
        // Each call's answer carries the previous call's id. The first is a
        // mismatch; so is the second, at once, instead of being passed over
        // as a late answer and waiting out its deadline.
        let t = Duration::from_secs(20);
        for (want, got) in [(1, 0), (2, 1)] {
            let e = agent.call("agent/step", json!({"mode": "lag"}), t).await.unwrap_err();
            assert!(e.message.contains(&format!("expected {want}, got {got}")), "{e}");
        }
        agent.stop().await;
    }

    #[tokio::test]
    async fn http_redirects_are_transport_errors_naming_the_location() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/ecp"))
            .respond_with(ResponseTemplate::new(307).insert_header("Location", "/elsewhere"))
            .mount(&server)
            .await;
        // Were the redirect followed, the call would pass here.
        Mock::given(method("POST"))
            .and(path("/elsewhere"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"jsonrpc": "2.0", "id": 1, "result": true})))
            .mount(&server)
            .await;
        let mut agent = HttpAgent::new(&format!("{}/ecp", server.uri())).unwrap();
        let e = agent.call("agent/reset", json!({}), Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(e.reason, ExitReason::TransportError, "{e}");
        assert!(e.message.contains("307") && e.message.contains("\"/elsewhere\""), "{e}");
    }

    #[tokio::test]
    async fn http_connection_errors_name_their_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut agent = HttpAgent::new(&format!("http://127.0.0.1:{port}/ecp")).unwrap();
        let e = agent.call("agent/reset", json!({}), Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(e.reason, ExitReason::TransportError, "{e}");
        assert!(e.message.to_lowercase().contains("connection refused"), "{e}");
    }

    #[test]
    fn environment_variable_names_are_checked() {
        assert!(check_env_name("OPENAI_API_KEY").is_ok());
        for bad in ["", "A=B", "A\0B"] {
            assert!(check_env_name(bad).unwrap_err().contains("must not be empty"), "{bad:?}");
        }
    }

    #[test]
    fn simple_commands_are_execed() {
        assert_eq!(shell_line("python3 agent.py --x=1"), "exec python3 agent.py --x=1");
        assert_eq!(shell_line("cd a && python3 b.py"), "cd a && python3 b.py");
        for as_written in [
            "MODE=test python3 agent.py",
            "exec python3 agent.py",
            "command python3 agent.py",
            "exit 3",
            "cd a",
        ] {
            assert_eq!(shell_line(as_written), as_written);
        }
    }
}
