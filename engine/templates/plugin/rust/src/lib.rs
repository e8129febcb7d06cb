//! `{{name}}`: an attest-engine assertion plugin. It passes when the target
//! (by default `output.message`) contains `phrase`, ignoring case. Replace
//! the check with yours; `cargo test` runs the tests below natively.

use attest_plugin_sdk::text::quote;
use attest_plugin_sdk::{json, resolve_or_fail, AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
use serde::Deserialize;

pub struct Plugin;

/// The assertion's `config`, as `config.schema.json` describes it. The
/// engine validates it against the schema and fills in the schema's
/// defaults before the plugin sees it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to look, in the engine's target grammar (`output.message`,
    /// `steps[?name=='search'].result.text`, ...).
    #[serde(default = "default_target")]
    pub target: Target,
    pub phrase: String,
}

fn default_target() -> Target {
    Target::parse("output.message").expect("the default target parses")
}

impl AssertionPlugin for Plugin {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("{{name}}", env!("CARGO_PKG_VERSION"))
            .description("Passes when a target contains a phrase, ignoring case.")
            .config_schema(include_str!("../config.schema.json"))
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let t = &config.target;
        // A target the trace lacks is a failed assertion that says so.
        let value = resolve_or_fail!(t, trace);
        let found = json::text(&value).to_lowercase().contains(&config.phrase.to_lowercase());
        let verb = if found { "contains" } else { "does not contain" };
        Ok(Verdict::from_bool(found, format!("{t} {verb} {}.", quote(&config.phrase))))
    }
}

attest_plugin_sdk::export_plugin!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::serde_json::json;
    use attest_plugin_sdk::testing;

    #[test]
    fn describes_itself_as_the_engine_expects() {
        testing::check_info::<Plugin>();
        testing::validate_config::<Plugin>(&json!({"phrase": "refund"})).unwrap();
        assert!(testing::validate_config::<Plugin>(&json!({})).is_err(), "phrase is required");
    }

    #[test]
    fn passes_when_the_phrase_is_there_and_fails_when_it_is_not() {
        let trace = testing::message_trace("Your REFUND is on its way.");
        let v = testing::evaluate::<Plugin>(&trace, &json!({"phrase": "refund"})).unwrap();
        assert!(v.is_pass(), "{}", v.explanation());
        let v = testing::evaluate::<Plugin>(&trace, &json!({"phrase": "apology"})).unwrap();
        assert!(!v.is_pass());
        assert_eq!(v.explanation(), "output.message does not contain 'apology'.");
        let v = testing::evaluate::<Plugin>(&trace, &json!({"phrase": "x", "target": "output.missing"})).unwrap();
        assert!(!v.is_pass() && v.explanation().contains("could not be checked"), "{}", v.explanation());
    }
}
