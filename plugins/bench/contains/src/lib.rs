//! Benchmark plugin `contains`: the engine's `content` / `contains` check
//! (case-insensitive by default) as a plugin, to compare a plugin's cost per
//! assertion with the native check's.

use attest_plugin_sdk::text::quote;
use attest_plugin_sdk::{json, AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
use serde::Deserialize;

pub struct Contains;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub target: Target,
    pub value: String,
    #[serde(default)]
    pub case_sensitive: bool,
}

impl AssertionPlugin for Contains {
    type Config = Config;
    // It never logs: no host import, one core instance per call.
    const REPORT_PANICS: bool = false;

    fn info() -> PluginInfo {
        PluginInfo::new("contains", env!("CARGO_PKG_VERSION"))
            .description("Benchmark plugin: the target contains value (content.contains as a plugin).")
            .config_schema(include_str!("../config.schema.json"))
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let t = config.target.as_str();
        let value = match config.target.resolve(trace) {
            Ok(v) => v,
            Err(missing) => return Ok(Verdict::fail(format!("{t} could not be checked: {}.", missing.0))),
        };
        let text = json::text(&value);
        let found = if config.case_sensitive {
            text.contains(config.value.as_str())
        } else {
            attest_plugin_sdk::text::contains_ignore_case(&text, &config.value)
        };
        let rel = if found { " contains " } else { " does not contain " };
        let q = quote(&config.value);
        let mut e = String::with_capacity(t.len() + rel.len() + q.len() + 1);
        e.push_str(t);
        e.push_str(rel);
        e.push_str(&q);
        e.push('.');
        Ok(Verdict::from_bool(found, e))
    }
}

attest_plugin_sdk::export_plugin!(Contains);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing;
    use serde_json::json as j;

    #[test]
    fn matches_like_the_engine() {
        testing::check_info::<Contains>();
        let trace = testing::message_trace("Your Refund is processed");
        let pass = testing::evaluate::<Contains>(&trace, &j!({"target": "output.message", "value": "refund"})).unwrap();
        assert_eq!(pass.status(), attest_plugin_sdk::Status::Pass);
        let fail =
            testing::evaluate::<Contains>(&trace, &j!({"target": "output.message", "value": "refund", "case_sensitive": true})).unwrap();
        assert_eq!(fail.status(), attest_plugin_sdk::Status::Fail);
    }
}
