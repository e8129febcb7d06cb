//! Decoding an assertion's `config` (JSON text) into the plugin's typed
//! config.
//!
//! The engine has already checked the config against the plugin's JSON
//! Schema, so a decoding error here means the schema and the Rust type
//! disagree, or the config breaks a rule the schema cannot express (such
//! as a target's syntax). Either way it is the assertion author's to fix,
//! so it becomes `invalid-config`, naming the field (`` field `rules[1].max` ``)
//! in the config the assertion author wrote, since the JSON text serde's
//! line and column refer to is the engine's, which the author never sees.

use crate::PluginError;
use serde::de::DeserializeOwned;

/// A config type for plugins that take no configuration: accepts any JSON.
pub type NoConfig = serde::de::IgnoredAny;

/// Decodes `json` into `C`; errors become [`PluginError::InvalidConfig`].
pub fn decode_config<C: DeserializeOwned>(json: &str) -> Result<C, PluginError> {
    serde_json::from_str(json).map_err(|e| PluginError::InvalidConfig(describe::<C>(json, &e)))
}

/// What is wrong with a config that did not decode, and where. The path is
/// found by decoding once more with the path tracked, which a config that
/// decodes never pays for.
#[cold]
fn describe<C: DeserializeOwned>(json: &str, e: &serde_json::Error) -> String {
    if e.is_syntax() || e.is_eof() {
        // Not JSON at all (only native tests can send that): the position is the point.
        return format!("config is not JSON: {e}");
    }
    let message = e.to_string();
    let message = message
        .strip_suffix(&format!(" at line {} column {}", e.line(), e.column()))
        .unwrap_or(&message);
    let mut de = serde_json::Deserializer::from_str(json);
    match serde_path_to_error::deserialize::<_, C>(&mut de) {
        Err(located) if located.path().iter().next().is_some() => format!("field `{}`: {message}", located.path()),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        target: Target,
        #[serde(default)]
        limit: u32,
        #[serde(default)]
        #[allow(dead_code)]
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize)]
    struct Nested {
        #[allow(dead_code)]
        rules: Vec<Rule>,
    }

    #[derive(Debug, Deserialize)]
    struct Rule {
        #[allow(dead_code)]
        max: u32,
    }

    #[test]
    fn decodes_and_maps_errors_to_invalid_config() {
        let c: Config = decode_config(r#"{"target": "output.message", "limit": 3}"#).unwrap();
        assert_eq!((c.target.as_str(), c.limit), ("output.message", 3));
        for (bad, expect) in [
            (r#"{"limit": 3}"#, "missing field `target`"),
            (
                r#"{"target": "output", "limit": -1}"#,
                "field `limit`: invalid value: integer `-1`, expected u32",
            ),
            (r#"{"target": "out.put"}"#, "field `target`: unsupported target 'out.put'"),
            (r#"{"target": "output", "extra": 1}"#, "field `extra`: unknown field `extra`"),
            (
                r#"{"target": "output", "nested": {"rules": [{"max": 1}, {"max": "x"}]}}"#,
                "field `nested.rules[1].max`: invalid type: string \"x\", expected u32",
            ),
            ("not json", "config is not JSON: expected ident at line 1 column 2"),
        ] {
            match decode_config::<Config>(bad) {
                Err(PluginError::InvalidConfig(m)) => {
                    assert!(m.starts_with(expect), "{bad}: {m}");
                    assert!(
                        bad == "not json" || !m.contains("line 1"),
                        "the engine's JSON text is not the author's: {m}"
                    );
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn no_config_accepts_anything() {
        decode_config::<NoConfig>("{}").unwrap();
        decode_config::<NoConfig>(r#"{"a": [1, {"b": null}]}"#).unwrap();
    }
}
