//! Hostile test plugin `silent-trap`: `evaluate` panics, and the plugin sets
//! `REPORT_PANICS = false`, so it has no host import and its panic message
//! reaches nobody. The engine must still report the trap, and say why no
//! message was logged.

use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct SilentTrap;

impl AssertionPlugin for SilentTrap {
    type Config = NoConfig;
    const REPORT_PANICS: bool = false;

    fn info() -> PluginInfo {
        PluginInfo::new("silent-trap", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: panics in evaluate, with no panic hook.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        panic!("the silent-trap test plugin panics on purpose")
    }
}

attest_plugin_sdk::export_plugin!(SilentTrap);
