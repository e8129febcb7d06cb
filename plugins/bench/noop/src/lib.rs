//! Benchmark plugin `noop`: passes without reading the trace (the SDK only
//! scans it). What it costs is the host's per-call overhead.

use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct Noop;

impl AssertionPlugin for Noop {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("noop", env!("CARGO_PKG_VERSION")).description("Benchmark plugin: always passes.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        Ok(Verdict::pass("noop"))
    }
}

attest_plugin_sdk::export_plugin!(Noop);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes() {
        attest_plugin_sdk::testing::check_info::<Noop>();
        let trace = attest_plugin_sdk::testing::message_trace("hi");
        let v = attest_plugin_sdk::testing::evaluate::<Noop>(&trace, &serde_json::json!({})).unwrap();
        assert_eq!(v.status(), attest_plugin_sdk::Status::Pass);
    }
}
