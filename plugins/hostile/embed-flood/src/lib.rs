//! Hostile test plugin `embed-flood`: passes `embed` more than the engine
//! takes: `{"mode": "many"}` sends 100,000 short texts, `{"mode": "huge"}`
//! one text of 16 MiB. The engine must refuse either as `over-limit`
//! without copying it, and the refusal is the plugin's error.

use attest_plugin_sdk::models::{self, Capability};
use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct EmbedFlood;

#[derive(Deserialize)]
pub struct Config {
    mode: String,
}

impl AssertionPlugin for EmbedFlood {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("embed-flood", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: passes oversized input to embed.")
            .requests(Capability::Embed)
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let vectors = match config.mode.as_str() {
            "many" => models::embed(&vec!["x"; 100_000])?,
            _ => models::embed(&["y".repeat(16 << 20).as_str()])?,
        };
        Ok(Verdict::hard_fail(format!("the engine embedded {} oversized texts", vectors.len())))
    }
}

attest_plugin_sdk::export_plugin!(EmbedFlood);
