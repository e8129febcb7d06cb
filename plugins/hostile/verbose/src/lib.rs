//! Hostile test plugin `verbose`: answers with a huge verdict, 10 MiB by
//! default. The engine must cap what it accepts from a plugin (and still
//! answer the assertion) instead of passing the bulk on.
//!
//! Config: `bytes` (default 10485760) and `field`: `explanation` (default)
//! or `details` (a JSON string of that size).

use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Trace, Verdict};
use serde::Deserialize;

pub struct Verbose;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    #[default]
    Explanation,
    Details,
}

#[derive(Debug, Deserialize)]
pub struct Config {
    #[serde(default = "ten_mib")]
    pub bytes: usize,
    #[serde(default)]
    pub field: Field,
}

fn ten_mib() -> usize {
    10 * 1024 * 1024
}

const SCHEMA: &str = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"bytes":{"type":"integer","minimum":0,"default":10485760},"field":{"enum":["explanation","details"],"default":"explanation"}}}"#;

impl AssertionPlugin for Verbose {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("verbose", env!("CARGO_PKG_VERSION"))
            .description("Hostile test plugin: returns a 10 MB explanation (or details).")
            .config_schema(SCHEMA)
    }

    fn evaluate(_: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let bulk = "verbose ".repeat(config.bytes / 8 + 1);
        let bulk = &bulk[..config.bytes];
        Ok(match config.field {
            Field::Explanation => Verdict::pass(bulk),
            Field::Details => Verdict::pass("details are big").with_details(serde_json::Value::String(bulk.to_owned())),
        })
    }
}

attest_plugin_sdk::export_plugin!(Verbose);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing::{check_info, evaluate, message_trace};
    use serde_json::json;

    #[test]
    fn sizes() {
        check_info::<Verbose>();
        let v = evaluate::<Verbose>(&message_trace("x"), &json!({})).unwrap();
        assert_eq!(v.explanation().len(), 10_485_760);
        let v = evaluate::<Verbose>(&message_trace("x"), &json!({"bytes": 20, "field": "details"})).unwrap();
        assert_eq!(v.details(), Some(r#""verbose verbose verb""#));
    }
}
