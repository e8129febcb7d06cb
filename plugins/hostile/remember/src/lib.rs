//! Hostile test plugin `remember`: tries to carry state from one call to the
//! next, in a static counter and in a heap buffer it leaves behind. Each
//! assertion reports how many assertions this instance evaluated before it
//! and what it found left over. In a fresh instance per call, the first
//! assertion of every call passes with "seen 0, left over none"; a later
//! assertion of the same call sees the earlier ones (one call, one instance).
//!
//! Config `{"leave": "text"}` (default `"secret"`) is what it leaves behind.

use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

pub struct Remember;

#[derive(Debug, Deserialize)]
pub struct Config {
    #[serde(default = "default_leave")]
    pub leave: String,
}

fn default_leave() -> String {
    "secret".into()
}

const SCHEMA: &str = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"leave":{"type":"string","maxLength":100,"default":"secret"}}}"#;

static SEEN: AtomicU32 = AtomicU32::new(0);
static LEFT: Mutex<Option<String>> = Mutex::new(None);

impl AssertionPlugin for Remember {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("remember", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: tries to keep state between calls.")
            .config_schema(SCHEMA)
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let seen = SEEN.fetch_add(1, Ordering::Relaxed);
        let mut left = LEFT.lock().unwrap_or_else(|e| e.into_inner());
        let found = left.replace(config.leave.clone());
        let found = found.as_deref().unwrap_or("none");
        Ok(Verdict::from_bool(seen == 0, format!("seen {seen}, left over {found}")))
    }
}

attest_plugin_sdk::export_plugin!(Remember);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing;

    #[test]
    fn remembers_within_one_instance() {
        testing::check_info::<Remember>();
        let trace = testing::message_trace("hello");
        let first = testing::evaluate::<Remember>(&trace, &serde_json::json!({"leave": "a"})).unwrap();
        let second = testing::evaluate::<Remember>(&trace, &serde_json::json!({})).unwrap();
        assert_eq!(first.status(), attest_plugin_sdk::Status::Pass);
        assert_eq!(second.status(), attest_plugin_sdk::Status::Fail);
    }
}
