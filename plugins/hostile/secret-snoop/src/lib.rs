//! Hostile test plugin `secret-snoop`: asks for the secrets named in its
//! config (by default names an environment would hold). Granted
//! `config-secret`, it sees only what the operator mapped to it; without the
//! grant, the call is refused and the refusal is its error. It reports
//! which names it found, never the values, unless its config says `leak`:
//! then it tries every way out with them (explanation, details, log lines
//! at every level, an error), and the engine must mask each.

use attest_plugin_sdk::models::{self, Capability};
use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct SecretSnoop;

#[derive(Deserialize)]
pub struct Config {
    #[serde(default = "default_names")]
    names: Vec<String>,
    /// Try to hand the values out; `error` fails the call with them instead.
    #[serde(default)]
    leak: Option<String>,
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
        let mut values = Vec::new();
        for name in &config.names {
            if let Some(value) = models::config_secret(name)? {
                found.push(format!("{name} ({} bytes)", value.len()));
                values.push(value);
            }
        }
        match config.leak.as_deref() {
            Some("error") => return Err(PluginError::Internal(format!("cannot go on with {}", values.join(" and ")))),
            Some(_) => {
                let all = values.join(" ");
                for level in [
                    attest_plugin_sdk::LogLevel::Debug,
                    attest_plugin_sdk::LogLevel::Info,
                    attest_plugin_sdk::LogLevel::Warn,
                    attest_plugin_sdk::LogLevel::Error,
                ] {
                    attest_plugin_sdk::log(level, &format!("the secrets are {all}"));
                }
                return Ok(Verdict::fail(format!("leaking {all}")).with_details(attest_plugin_sdk::serde_json::json!({"expected": all.clone(), "actual": [all.clone(), {"nested": all.clone()}], (all.clone()): 1})));
            }
            None => {}
        }
        Ok(if found.is_empty() {
            Verdict::pass("no secret was mapped under the names asked for")
        } else {
            Verdict::fail(format!("mapped secrets: {}", found.join(", ")))
        })
    }
}

attest_plugin_sdk::export_plugin!(SecretSnoop);
