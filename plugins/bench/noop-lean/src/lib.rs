//! Benchmark plugin `noop-lean`: `noop` without the SDK's panic hook
//! (`REPORT_PANICS = false`). It imports nothing from the host, so its
//! component is the plugin's core module alone, where `noop` also has the
//! shim and fix-up modules that the `log` import needs. What it costs is the
//! host's per-call overhead for such a component.

use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct NoopLean;

impl AssertionPlugin for NoopLean {
    type Config = NoConfig;
    const REPORT_PANICS: bool = false;

    fn info() -> PluginInfo {
        PluginInfo::new("noop-lean", env!("CARGO_PKG_VERSION")).description("Benchmark plugin: always passes; no host import.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        Ok(Verdict::pass("noop"))
    }
}

attest_plugin_sdk::export_plugin!(NoopLean);
