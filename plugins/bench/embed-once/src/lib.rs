//! Benchmark plugin `embed-once`: embeds `output.message` with one
//! `models.embed` call and passes when a vector comes back. Set against the
//! engine embedding the same text for layer 5, what it costs beyond that is
//! the capability path: the sandboxed call, copying the text out and the
//! vector in, and the hand-over to the engine's provider.

use attest_plugin_sdk::models::{self, Capability};
use attest_plugin_sdk::{json, resolve_or_fail, AssertionPlugin, NoConfig, PluginError, PluginInfo, Target, Trace, Verdict};

pub struct EmbedOnce;

impl AssertionPlugin for EmbedOnce {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("embed-once", env!("CARGO_PKG_VERSION"))
            .description("Benchmark plugin: embeds output.message once.")
            .requests(Capability::Embed)
    }

    fn evaluate(trace: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        let target = Target::parse("output.message").map_err(|e| PluginError::internal(e.to_string()))?;
        let text = json::text(&*resolve_or_fail!(target, trace)).into_owned();
        let vectors = models::embed(&[text.as_str()])?;
        let dims = vectors.first().map_or(0, Vec::len);
        Ok(Verdict::from_bool(dims > 0, format!("embedded into {dims} dimensions")))
    }
}

attest_plugin_sdk::export_plugin!(EmbedOnce);
