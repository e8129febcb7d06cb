//! Decoding an assertion's `config` (JSON text) into the plugin's typed
//! config.
//!
//! The engine has already checked the config against the plugin's JSON
//! Schema, so a decoding error here means the schema and the Rust type
//! disagree, or the config breaks a rule the schema cannot express (such
//! as a target's syntax). Either way it is the assertion author's to fix,
//! so it becomes `invalid-config`, with serde's message naming the field.

use crate::PluginError;
use serde::de::DeserializeOwned;

/// A config type for plugins that take no configuration: accepts any JSON.
pub type NoConfig = serde::de::IgnoredAny;

/// Decodes `json` into `C`; errors become [`PluginError::InvalidConfig`].
pub fn decode_config<C: DeserializeOwned>(json: &str) -> Result<C, PluginError> {
    serde_json::from_str(json).map_err(|e| PluginError::InvalidConfig(format!("config: {e}")))
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
    }

    #[test]
    fn decodes_and_maps_errors_to_invalid_config() {
        let c: Config = decode_config(r#"{"target": "output.message", "limit": 3}"#).unwrap();
        assert_eq!((c.target.as_str(), c.limit), ("output.message", 3));
        for (bad, expect) in [
            (r#"{"limit": 3}"#, "missing field `target`"),
            (r#"{"target": "output", "limit": -1}"#, "invalid value: integer `-1`"),
            (r#"{"target": "out.put"}"#, "unsupported target 'out.put'"),
            (r#"{"target": "output", "extra": 1}"#, "unknown field `extra`"),
            ("not json", "expected ident"),
        ] {
            match decode_config::<Config>(bad) {
                Err(PluginError::InvalidConfig(m)) => assert!(m.starts_with("config: ") && m.contains(expect), "{bad}: {m}"),
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
