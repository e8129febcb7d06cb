//! Hostile test plugin `hog`: `evaluate` allocates 1 MiB after 1 MiB, touching
//! every byte, and keeps it all. The engine's memory limit must stop it (a
//! failed `memory.grow` traps or makes the allocator abort, which traps too).

use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};

pub struct Hog;

const CHUNK: usize = 1 << 20;

impl AssertionPlugin for Hog {
    type Config = NoConfig;

    fn info() -> PluginInfo {
        PluginInfo::new("hog", env!("CARGO_PKG_VERSION")).description("Hostile test plugin: grows memory without bound in evaluate.")
    }

    fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            // Non-zero fill, so the pages are really written, not just reserved.
            hoard.push(std::hint::black_box(vec![0xA5; CHUNK]));
        }
    }
}

attest_plugin_sdk::export_plugin!(Hog);

#[cfg(test)]
mod tests {
    #[test]
    fn describes_itself() {
        attest_plugin_sdk::testing::check_info::<super::Hog>();
    }
}
