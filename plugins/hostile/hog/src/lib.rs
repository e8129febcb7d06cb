//! Hostile test plugin `hog`: `evaluate` allocates 1 MiB after 1 MiB, touching
//! every byte, and keeps it all. The engine's memory limit must stop it (a
//! failed `memory.grow` traps or makes the allocator abort, which traps too).
//!
//! With `{"churn_mib": N}` it is well-behaved instead: it allocates N MiB in
//! all, 64 KiB at a time, and frees each block before the next, with a small
//! allocation kept in between so that no block is freed as the most recent
//! one. The SDK's allocator (a bump arena, then dlmalloc) must reuse what was
//! freed, so this passes under a memory limit far below N MiB.

use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct Hog;

#[derive(Deserialize)]
pub struct Config {
    #[serde(default)]
    churn_mib: Option<usize>,
}

const CHUNK: usize = 1 << 20;

impl AssertionPlugin for Hog {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("hog", env!("CARGO_PKG_VERSION")).description("Hostile test plugin: grows memory without bound in evaluate.")
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        if let Some(n) = config.churn_mib {
            const BLOCK: usize = 64 << 10;
            let blocks = n * (CHUNK / BLOCK);
            let mut kept: Vec<Box<u64>> = Vec::with_capacity(blocks);
            for i in 0..blocks {
                let block = std::hint::black_box(vec![0xA5u8; BLOCK]);
                kept.push(Box::new(i as u64));
                drop(block);
            }
            return Ok(Verdict::pass(format!("churned {n} MiB, 64 KiB at a time")));
        }
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
