//! Hostile test plugin `snoop`: tries to read a file, an environment variable
//! and to open a TCP connection, and reports what happened. On
//! `wasm32-unknown-unknown` with no WASI imports granted, all three must
//! fail: the verdict is `pass` ("contained") when they do and `hard_fail`
//! ("escaped") when any succeeds. Each outcome is also logged through the
//! host, so the plugin exercises the `host.log` import.

use attest_plugin_sdk::text::clip;
use attest_plugin_sdk::{log, AssertionPlugin, LogLevel, NoConfig, PluginError, PluginInfo, Trace, Verdict};
use serde_json::json;

pub struct Snoop;

/// One attempt and its outcome.
struct Probe {
    what: &'static str,
    escaped: bool,
    outcome: String,
}

fn probes() -> Vec<Probe> {
    let fs = match std::fs::read("/etc/hostname") {
        Ok(bytes) => Probe {
            what: "std::fs::read(\"/etc/hostname\")",
            escaped: true,
            outcome: format!("read {} bytes", bytes.len()),
        },
        Err(e) => Probe {
            what: "std::fs::read(\"/etc/hostname\")",
            escaped: false,
            outcome: format!("failed: {e}"),
        },
    };
    let env = match std::env::var("HOME") {
        Ok(v) => Probe {
            what: "std::env::var(\"HOME\")",
            escaped: true,
            outcome: format!("got {:?}", clip(&v, 60)),
        },
        Err(e) => Probe {
            what: "std::env::var(\"HOME\")",
            escaped: false,
            outcome: format!("failed: {e}"),
        },
    };
    let net = match std::net::TcpStream::connect("127.0.0.1:1") {
        Ok(_) => Probe {
            what: "std::net::TcpStream::connect(\"127.0.0.1:1\")",
            escaped: true,
            outcome: "connected".to_owned(),
        },
        // A refused connection still means the plugin reached the network.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe {
            what: "std::net::TcpStream::connect(\"127.0.0.1:1\")",
            escaped: true,
            outcome: format!("reached the network: {e}"),
        },
        Err(e) => Probe {
            what: "std::net::TcpStream::connect(\"127.0.0.1:1\")",
            escaped: false,
            outcome: format!("failed: {e}"),
        },
    };
    vec![fs, env, net]
}

impl AssertionPlugin for Snoop {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("snoop", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: tries the file system, the environment and the network, and reports what happened.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        let probes = probes();
        for p in &probes {
            let level = if p.escaped { LogLevel::Error } else { LogLevel::Info };
            log(level, &format!("snoop: {} {}", p.what, p.outcome));
        }
        let report: Vec<String> = probes.iter().map(|p| format!("{} {}", p.what, p.outcome)).collect();
        let details = json!(probes
            .iter()
            .map(|p| json!({"probe": p.what, "escaped": p.escaped, "outcome": p.outcome}))
            .collect::<Vec<_>>());
        let verdict = if probes.iter().any(|p| p.escaped) {
            Verdict::hard_fail(format!("snoop escaped the sandbox: {}.", report.join("; ")))
        } else {
            Verdict::pass(format!("snoop was contained: {}.", report.join("; ")))
        };
        Ok(verdict.with_details(details))
    }
}

attest_plugin_sdk::export_plugin!(Snoop);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing::{check_info, evaluate, message_trace, take_logs};

    // Natively nothing is sandboxed, so only the report's shape is checked;
    // the contained case is what the engine's tests see from the component.
    #[test]
    fn reports_every_probe() {
        check_info::<Snoop>();
        let v = evaluate::<Snoop>(&message_trace("x"), &json!({})).unwrap();
        for probe in [
            "std::fs::read(\"/etc/hostname\")",
            "std::env::var(\"HOME\")",
            "TcpStream::connect(\"127.0.0.1:1\")",
        ] {
            assert!(v.explanation().contains(probe), "{}", v.explanation());
        }
        assert_eq!(v.details_value().unwrap().as_array().unwrap().len(), 3);
        assert_eq!(take_logs().len(), 3);
    }
}
