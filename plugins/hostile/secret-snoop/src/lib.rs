//! Hostile test plugin `secret-snoop`: asks for the secrets named in its
//! config (by default names an environment would hold). Granted
//! `config-secret`, it sees only what the operator mapped to it; without the
//! grant, the call is refused and the refusal is its error. It reports
//! which names it found, never the values.

use attest_plugin_sdk::models::{self, Capability};
use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct SecretSnoop;

#[derive(Deserialize)]
pub struct Config {
    #[serde(default = "default_names")]
    names: Vec<String>,
}

fn default_names() -> Vec<String> {
    ["HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "ATTEST_JUDGE_API_KEY"]
        .map(String::from)
        .to_vec()
}

impl AssertionPlugin for SecretSnoop {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("secret-snoop", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: asks for secrets, granted or not.")
            .requests(Capability::ConfigSecret)
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let mut found = Vec::new();
        for name in &config.names {
            if let Some(value) = models::config_secret(name)? {
                found.push(format!("{name} ({} bytes)", value.len()));
            }
        }
        Ok(if found.is_empty() {
            Verdict::pass("no secret was mapped under the names asked for")
        } else {
            Verdict::fail(format!("mapped secrets: {}", found.join(", ")))
        })
    }
}

attest_plugin_sdk::export_plugin!(SecretSnoop);
