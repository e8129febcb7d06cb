//! Hostile test plugin `trap`: `evaluate` panics. Components are built with
//! `panic = "abort"`, so the panic is a wasm trap; the engine must report an
//! error for the plugin's assertions and use a fresh instance next time.
//!
//! Config `{"how": "panic"}` (default) panics; `{"how": "stack_overflow"}`
//! recurses until the wasm stack is exhausted, which traps as well.

use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct Trap;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    #[default]
    Panic,
    StackOverflow,
}

#[derive(Debug, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub how: How,
}

const SCHEMA: &str = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"how":{"enum":["panic","stack_overflow"],"default":"panic"}}}"#;

impl AssertionPlugin for Trap {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("trap", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: panics (or overflows the stack) in evaluate.")
            .config_schema(SCHEMA)
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        match config.how {
            How::Panic => panic!("the trap test plugin panics on purpose"),
            How::StackOverflow => Ok(Verdict::pass(format!("unreachable: {}", recurse(0)))),
        }
    }
}

/// Recursion with a frame the optimizer cannot drop or turn into a loop.
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 32]);
    if std::hint::black_box(true) {
        recurse(depth + 1).wrapping_add(frame[7])
    } else {
        frame[0]
    }
}

attest_plugin_sdk::export_plugin!(Trap);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing::{check_info, evaluate, message_trace};

    #[test]
    fn describes_itself() {
        check_info::<Trap>();
    }

    #[test]
    #[should_panic(expected = "on purpose")]
    fn panics() {
        let _ = evaluate::<Trap>(&message_trace("x"), &serde_json::json!({}));
    }
}
