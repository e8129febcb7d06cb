//! Hostile test plugin `flood`: floods the host, chosen per call by the first
//! config:
//!
//! | config                              | what it does                                      |
//! |-------------------------------------|---------------------------------------------------|
//! | `{"results": N}`                    | returns N verdicts (whatever the number of configs) |
//! | `{"log_lines": N, "line_bytes": M}` | writes N log lines of M bytes each, then passes   |
//! | anything else                       | a well-formed pass per config                     |
//!
//! The engine must count results before copying them, and cap what a call
//! may write to its log.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

use attest::plugin::host::{log, LogLevel};
use attest::plugin::types::Status;

struct Flood;

fn pass(explanation: String) -> Result<Verdict, PluginError> {
    Ok(Verdict {
        status: Status::Pass,
        score: 1.0,
        explanation,
        details: None,
    })
}

fn number(config: &serde_json::Value, key: &str) -> Option<usize> {
    config.get(key).and_then(|v| v.as_u64()).map(|n| n as usize)
}

impl Guest for Flood {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "flood".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: too many results or log lines.".to_owned(),
            config_schema: r#"{"type":"object"}"#.to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        let first: serde_json::Value = configs.first().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default();
        if let Some(n) = number(&first, "results") {
            return (0..n).map(|i| pass(format!("verdict {i} of {n}"))).collect();
        }
        if let Some(lines) = number(&first, "log_lines") {
            let line = "x".repeat(number(&first, "line_bytes").unwrap_or(100));
            for _ in 0..lines {
                log(LogLevel::Warn, &line);
            }
            return configs.iter().map(|_| pass(format!("wrote {lines} log lines"))).collect();
        }
        configs.iter().map(|_| pass("flood stayed calm".to_owned())).collect()
    }
}

export!(Flood);
