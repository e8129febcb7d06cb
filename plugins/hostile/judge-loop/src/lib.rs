//! Hostile test plugin `judge-loop`: calls `judge` in a loop, ignoring every
//! answer and error, until it is stopped. The engine must stop it at its
//! deadline (or its model-call limit), charge what it spent to its
//! assertion, and leave neighbouring assertions and requests alone.

use attest_plugin_sdk::models::{self, Capability, JudgeRequest};
use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct JudgeLoop;

impl AssertionPlugin for JudgeLoop {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("judge-loop", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: calls judge in a loop until its deadline.")
            .requests(Capability::Judge)
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        let mut n: u64 = 0;
        loop {
            n += 1;
            let _ = std::hint::black_box(models::judge(&JudgeRequest::new("anything", format!("ask {n}"))));
        }
    }
}

attest_plugin_sdk::export_plugin!(JudgeLoop);
