//! Hostile test plugin `spin`: `evaluate` never returns. The engine must stop
//! it (fuel or epoch deadline) and report a timeout for its assertions
//! without hanging the batch. `describe` behaves, so the plugin loads.

use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct Spin;

impl AssertionPlugin for Spin {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("spin", env!("CARGO_PKG_VERSION")).description("Hostile test plugin: loops forever in evaluate.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        // black_box keeps the optimizer from reasoning about the loop.
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

attest_plugin_sdk::export_plugin!(Spin);

#[cfg(test)]
mod tests {
    #[test]
    fn describes_itself() {
        attest_plugin_sdk::testing::check_info::<super::Spin>();
    }
}
