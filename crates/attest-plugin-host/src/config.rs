//! What a plugin's config schema means beyond validation: the `default`s the
//! engine fills in, and the string fields that hold targets.
//!
//! Both are read from the schema the plugin declares, so they work the same
//! for plugins in any language:
//!
//! - a property missing from the config gets its schema's `default` (at any
//!   depth of `properties`), so a plugin sees what its schema documents, and
//!   a default its own schema refuses is found when the plugin loads;
//! - a string marked `"format": "attest-target"` (under `properties` or
//!   `items`, at any depth) is parsed with the engine's target grammar when
//!   the assertion is compiled, so a typo is error `1002` naming the field,
//!   as for the built-in layers, instead of a failure at evaluation time.

use crate::target::{Target, GRAMMAR_HINT};
use serde_json::Value;

/// The `format` that marks a string as a target.
pub const TARGET_FORMAT: &str = "attest-target";

/// Nesting the walkers follow; deeper schemas are not walked further.
const MAX_DEPTH: usize = 32;

/// A target field whose text does not parse.
#[derive(Debug, Clone, PartialEq)]
pub struct BadTarget {
    /// Where in the config, as a path (`rules[0].target`).
    pub field: String,
    pub message: String,
}

impl BadTarget {
    pub fn hint() -> &'static str {
        GRAMMAR_HINT
    }
}

/// Fills in `default`s for properties missing from `config`; says whether
/// it filled any.
pub fn apply_defaults(schema: &Value, config: &mut Value) -> bool {
    fill(schema, config, 0)
}

fn fill(schema: &Value, config: &mut Value, depth: usize) -> bool {
    let (Some(properties), Value::Object(map)) = (schema.get("properties").and_then(Value::as_object), config) else {
        return false;
    };
    if depth >= MAX_DEPTH {
        return false;
    }
    let mut filled = false;
    for (key, sub) in properties {
        match map.get_mut(key) {
            Some(value) => filled |= fill(sub, value, depth + 1),
            None => {
                if let Some(default) = sub.get("default") {
                    map.insert(key.clone(), default.clone());
                    filled = true;
                }
            }
        }
    }
    filled
}

/// The `default`s of `schema`'s properties, at any depth, that their own
/// property's schema refuses (or, for a target, that do not parse), each as
/// `at /path: problem`. A property schema that cannot be compiled on its own
/// (a `$ref` into the whole schema) is not checked.
pub fn default_problems(schema: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check_defaults(schema, &mut String::new(), 0, &mut problems);
    problems
}

fn check_defaults(schema: &Value, path: &mut String, depth: usize, problems: &mut Vec<String>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    if depth >= MAX_DEPTH {
        return;
    }
    for (key, sub) in properties {
        let len = path.len();
        path.push('/');
        path.push_str(key);
        if let Some(default) = sub.get("default") {
            let validator = attest_core::layers::schema::validator(sub, jsonschema::Draft::Draft202012);
            if let Ok(validator) = validator {
                let (errors, _) = attest_core::layers::schema::errors_of(&validator, default, 0);
                for e in errors.iter().take(3) {
                    // The error's place inside the default, after the property's.
                    let message = crate::text::clip(&e.to_string(), 200);
                    problems.push(format!("at {path}{}: {message}", e.instance_path()));
                }
            }
            if let (Some(TARGET_FORMAT), Value::String(text)) = (sub.get("format").and_then(Value::as_str), default) {
                if let Err(e) = Target::parse(text) {
                    problems.push(format!("at {path}: not a valid target: {}", e.message));
                }
            }
        }
        check_defaults(sub, path, depth + 1, problems);
        path.truncate(len);
    }
}

/// The first target field of `config` that does not parse, if any.
pub fn check_targets(schema: &Value, config: &Value) -> Result<(), BadTarget> {
    walk(schema, config, &mut String::new(), 0)
}

fn walk(schema: &Value, value: &Value, path: &mut String, depth: usize) -> Result<(), BadTarget> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    if let (Some(TARGET_FORMAT), Value::String(text)) = (schema.get("format").and_then(Value::as_str), value) {
        return Target::parse(text).map(drop).map_err(|e| BadTarget {
            field: path.clone(),
            message: e.message,
        });
    }
    match value {
        Value::Object(map) => {
            let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
                return Ok(());
            };
            for (key, sub) in properties {
                if let Some(v) = map.get(key) {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                    walk(sub, v, path, depth + 1)?;
                    path.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            let Some(sub) = schema.get("items") else {
                return Ok(());
            };
            for (i, v) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(sub, v, path, depth + 1)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "target": {"type": "string", "format": "attest-target", "default": "output.message"},
                "kinds": {"type": "array", "default": ["email"]},
                "limits": {"type": "object", "properties": {"max": {"type": "integer", "default": 3}}},
                "checks": {"type": "array", "items": {"type": "object", "properties": {
                    "target": {"type": "string", "format": "attest-target"}}}},
                "note": {"type": "string"}
            }
        })
    }

    #[test]
    fn defaults_their_own_schema_refuses_are_named_at_any_depth() {
        assert_eq!(default_problems(&schema()), Vec::<String>::new());
        let bad = json!({"type": "object", "required": ["phrase"], "properties": {
            "phrase": {"type": "string"},
            "mode": {"enum": ["a", "b"], "default": 5},
            "target": {"type": "string", "format": "attest-target", "default": "steps[0"},
            "limits": {"type": "object", "properties": {
                "max": {"type": "integer", "minimum": 1, "default": 0},
                "pairs": {"type": "array", "items": {"type": "integer"}, "default": [1, "x"]},
            }},
            "shared": {"$ref": "#/$defs/mode", "default": 5},
        }});
        let problems = default_problems(&bad);
        assert_eq!(problems.len(), 4, "{problems:?}");
        let all = problems.join("; ");
        for expect in [
            "at /mode: 5 is not one of",
            "at /target: not a valid target",
            "at /limits/max: 0 is less than the minimum of 1",
            "at /limits/pairs/1: \"x\" is not of type \"integer\"",
        ] {
            assert!(all.contains(expect), "{expect}: {all}");
        }
    }

    #[test]
    fn missing_properties_get_their_defaults_at_any_depth() {
        let mut config = json!({"kinds": ["card"], "limits": {}});
        assert!(apply_defaults(&schema(), &mut config));
        assert_eq!(config, json!({"target": "output.message", "kinds": ["card"], "limits": {"max": 3}}));
        // Not an object: left alone.
        let mut odd = json!([1]);
        apply_defaults(&schema(), &mut odd);
        assert_eq!(odd, json!([1]));
    }

    #[test]
    fn target_fields_are_parsed_with_their_path() {
        assert_eq!(check_targets(&schema(), &json!({"target": "steps[0].args"})), Ok(()));
        let bad = check_targets(&schema(), &json!({"target": "steps[0"})).unwrap_err();
        assert_eq!(bad.field, "target");
        let bad = check_targets(&schema(), &json!({"checks": [{"target": "output"}, {"target": "nope["}]})).unwrap_err();
        assert_eq!(bad.field, "checks[1].target");
        assert!(!bad.message.is_empty());
        // Strings without the format are not targets.
        assert_eq!(check_targets(&schema(), &json!({"note": "steps[0"})), Ok(()));
    }
}
