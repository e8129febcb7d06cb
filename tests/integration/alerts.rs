//! Drift alerts through the real binary: the opt-in `drift_alert`
//! notification line and the webhook POST, received by a real HTTP listener
//! on loopback.

use crate::common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

/// A trace whose answer mentions `found` of the keywords a, b, c, d.
fn trace(found: usize) -> Value {
    let words = ["alpha", "bravo", "charlie", "delta"];
    json!({"schema_version": 1, "trace_id": format!("trc_{found}"), "agent_id": "bot",
           "output": {"message": words[..found].join(" ")}, "steps": []})
}

fn dynamic_keywords() -> Value {
    json!([{"assertion_id": "kw", "type": "content",
            "spec": {"target": "output.message", "check": "keyword_all",
                     "values": ["alpha", "bravo", "charlie", "delta"], "threshold": "dynamic"}}])
}

/// One HTTP request received by a loopback listener that answers 200.
fn http_listener() -> (String, mpsc::Receiver<(String, Value)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hooks/attest", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut length = 0;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap();
                    }
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .unwrap();
            let _ = tx.send((request_line.trim().to_owned(), serde_json::from_slice(&body).unwrap_or(Value::Null)));
        }
    });
    (url, rx)
}

fn engine(cache: &std::path::Path, config: &str, env: &[(&str, &str)]) -> Engine {
    let path = cache.join("attest.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = command();
    cmd.env("ATTEST_CACHE_DIR", cache).args(["--log-level=warn", "--config"]).arg(&path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut e = Engine::spawn_command(cmd);
    e.initialize();
    e
}

#[test]
fn a_dynamic_failure_from_history_is_posted_and_notified_when_enabled() {
    let cache = tempfile::tempdir().unwrap();
    let (url, posts) = http_listener();
    let config = format!("dynamic_min_samples = 2\ndrift_alerts = true\ndrift_webhook_url = '{url}'\n");
    let mut e = engine(cache.path(), &config, &[]);
    // History: 1.0 twice (the static band passes both).
    for (i, found) in [4, 4].into_iter().enumerate() {
        let r = expect_result(&e.request(&evaluate_request(json!(i), trace(found), dynamic_keywords())));
        assert_eq!(r["results"][0]["status"], json!("pass"), "{r}");
    }
    // 0.25 against mean 1.0, stddev 0: a failure from history. The alert's
    // window includes it: mean 0.75 over 3 results.
    e.send(&evaluate_request(json!("drop"), trace(1), dynamic_keywords()));
    let note = e.recv();
    assert_eq!(note["method"], json!("drift_alert"), "the notification comes first: {note}");
    assert!(note.get("id").is_none(), "{note}");
    let alert = &note["params"];
    assert_eq!(
        (alert["status"].clone(), alert["latest_score"].clone(), alert["count"].clone()),
        (json!("drift_detected"), json!(0.25), json!(3))
    );
    assert_eq!(alert["mean"], json!(0.75));
    let resp = e.recv();
    assert_eq!(resp["id"], json!("drop"), "{resp}");
    let result = &resp["result"]["results"][0];
    assert_eq!(result["status"], json!("hard_fail"), "{resp}");
    assert!(
        result["explanation"].as_str().unwrap().contains("Dynamic threshold from history"),
        "{result}"
    );

    let (request_line, body) = posts.recv_timeout(Duration::from_secs(30)).expect("the webhook receives the alert");
    assert_eq!(request_line, "POST /hooks/attest HTTP/1.1");
    assert_eq!(body["alert"], *alert, "the webhook gets the same report");
    assert!(
        body["text"]
            .as_str()
            .unwrap()
            .starts_with("[attest] drift alert: assertion kw scored 0.2500"),
        "{body}"
    );
}

/// `eval` posts its alerts before it exits: its runtime ends with the run,
/// and posts still waiting on it would be dropped with it.
#[test]
fn eval_posts_its_drift_alerts_before_it_exits() {
    let cache = tempfile::tempdir().unwrap();
    let (url, posts) = http_listener();
    let config = cache.path().join("attest.toml");
    std::fs::write(&config, format!("dynamic_min_samples = 2\ndrift_webhook_url = '{url}'\n")).unwrap();
    let lines: Vec<String> = [4, 4, 1].iter().map(|&found| trace(found).to_string()).collect();
    let traces = cache.path().join("traces.jsonl");
    std::fs::write(&traces, lines.join("\n")).unwrap();
    let assertions = cache.path().join("assertions.json");
    std::fs::write(&assertions, dynamic_keywords().to_string()).unwrap();
    let out = command()
        .env("ATTEST_CACHE_DIR", cache.path())
        .args(["--log-level=warn", "--config"])
        .arg(&config)
        .args(["eval", "--trace"])
        .arg(&traces)
        .arg("--assertions")
        .arg(&assertions)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the third trace fails from history: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, body) = posts
        .recv_timeout(Duration::from_secs(5))
        .expect("eval posted the alert before exiting");
    assert_eq!(body["alert"]["latest_score"], json!(0.25), "{body}");
}

#[test]
fn without_the_option_no_notification_line_is_ever_sent() {
    let cache = tempfile::tempdir().unwrap();
    let mut e = engine(cache.path(), "dynamic_min_samples = 2\n", &[]);
    for (i, found) in [4, 3, 1, 1].into_iter().enumerate() {
        let resp = e.request(&evaluate_request(json!(i), trace(found), dynamic_keywords()));
        assert_eq!(resp["id"], json!(i), "the next line is always the response: {resp}");
    }
    let r = expect_result(&e.request(&rpc(json!("q"), "query_drift", json!({"assertion_id": "kw"}))));
    assert_eq!(r["report"]["count"], json!(4), "{r}");
}

#[test]
fn a_bad_webhook_url_is_a_configuration_error() {
    let cache = tempfile::tempdir().unwrap();
    let path = cache.path().join("attest.toml");
    std::fs::write(&path, "drift_webhook_url = 'ftp://example.com/x'\n").unwrap();
    let out = command()
        .arg("--config")
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("drift_webhook_url must be an http:// or https:// URL, got scheme 'ftp'"),
        "{stderr}"
    );
}
