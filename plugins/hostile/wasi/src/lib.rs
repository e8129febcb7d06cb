//! Hostile test plugin `wasi`: makes the WASI calls a plugin from another
//! toolchain makes, chosen per config with `{"call": …}`:
//!
//! | call         | what it does                                                        |
//! |--------------|---------------------------------------------------------------------|
//! | `print`      | writes to stdout (as Python's `print()` does), 1 MiB in all          |
//! | `poll`       | polls a zero-length timer (a non-blocking readiness check)           |
//! | `sleep`      | waits an hour on a timer                                            |
//! | `wall_clock` | reads the wall clock; the explanation is `wall clock: <seconds>`    |
//! | `random`     | reads secure and insecure randomness; `random: <u64> <u64>`         |
//! | `crash`      | writes 1 MiB to stderr, then a last line, then traps (as a Python    |
//! |              | plugin's uncaught exception does)                                   |
//!
//! It imports WASI (the interfaces in `wit/world.wit`) but grants itself
//! nothing: what these calls do is the engine's choice. The engine must
//! serve stdio and polling without failing the request, stop a plugin that
//! waits, give a fixed wall clock and deterministic randomness.

wit_bindgen::generate!({
    path: "wit",
    world: "attest:hostile-wasi/wasi-caller",
    generate_all,
});

use attest::plugin::types::Status;

struct Wasi;

fn call(config: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
    v.get("call").and_then(|k| k.as_str()).unwrap_or("none").to_owned()
}

fn run(call: &str) -> Result<String, String> {
    use wasi::clocks::monotonic_clock;
    match call {
        "print" => {
            let out = wasi::cli::stdout::get_stdout();
            let line = [b'x'; 1024];
            for _ in 0..1024 {
                out.blocking_write_and_flush(&line)
                    .map_err(|e| format!("stdout write failed: {e:?}"))?;
            }
            Ok("printed 1 MiB".to_owned())
        }
        "poll" => {
            let timer = monotonic_clock::subscribe_duration(0);
            let ready = wasi::io::poll::poll(&[&timer]);
            Ok(format!("poll returned {ready:?}"))
        }
        "sleep" => {
            let timer = monotonic_clock::subscribe_duration(3600 * 1_000_000_000);
            timer.block();
            Ok("slept an hour".to_owned())
        }
        "wall_clock" => {
            let now = wasi::clocks::wall_clock::now();
            Ok(format!("wall clock: {}", now.seconds))
        }
        "random" => Ok(format!(
            "random: {} {}",
            wasi::random::random::get_random_u64(),
            wasi::random::insecure::get_insecure_random_u64()
        )),
        "crash" => {
            let err = wasi::cli::stderr::get_stderr();
            let noise = [b'.'; 1024];
            for _ in 0..1024 {
                err.blocking_write_and_flush(&noise)
                    .map_err(|e| format!("stderr write failed: {e:?}"))?;
            }
            err.blocking_write_and_flush(b"\nWasiError: the wasi test plugin crashes on purpose\n")
                .map_err(|e| format!("stderr write failed: {e:?}"))?;
            std::process::abort()
        }
        other => Err(format!("unknown call '{other}'")),
    }
}

impl Guest for Wasi {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "wasi".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: WASI stdio, poll, timers, clocks and randomness.".to_owned(),
            config_schema:
                r#"{"type":"object","properties":{"call":{"enum":["print","poll","sleep","wall_clock","random","crash"]}},"required":["call"]}"#
                    .to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        configs
            .iter()
            .map(|c| match run(&call(c)) {
                Ok(explanation) => Ok(Verdict {
                    status: Status::Pass,
                    score: 1.0,
                    explanation,
                    details: None,
                }),
                Err(e) => Err(PluginError::Internal(e)),
            })
            .collect()
    }
}

export!(Wasi);
