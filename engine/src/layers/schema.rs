//! Layer 1: JSON Schema validation of a target.
//!
//! Draft 2020-12 is the default; drafts 4, 6, 7 and 2019-09 are chosen by
//! `$schema`. The seed spelling `https://json-schema.org/draft/2020-12`
//! (without `/schema`) is accepted as 2020-12. Schemas are compiled once and
//! cached by their canonical text; remote `$ref`s are never fetched.

use super::{Spec, SpecError, Verdict};
use crate::target::{Target, GRAMMAR_HINT};
use crate::text::clip;
use crate::trace::Trace;
use jsonschema::{Draft, Validator};
use quick_cache::sync::Cache;
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// How many distinct compiled schemas are kept.
const SCHEMA_CACHE_ENTRIES: usize = 1024;
/// How many validation errors an explanation lists.
const MAX_REPORTED_ERRORS: usize = 3;

#[derive(Debug)]
pub struct SchemaCheck {
    target: Target,
    draft: &'static str,
    validator: Arc<Validator>,
}

const DRAFTS: &[(&str, Draft, &str)] = &[
    ("json-schema.org/draft/2020-12/schema", Draft::Draft202012, "2020-12"),
    ("json-schema.org/draft/2020-12", Draft::Draft202012, "2020-12"),
    ("json-schema.org/draft/2019-09/schema", Draft::Draft201909, "2019-09"),
    ("json-schema.org/draft/2019-09", Draft::Draft201909, "2019-09"),
    ("json-schema.org/draft-07/schema", Draft::Draft7, "7"),
    ("json-schema.org/draft-06/schema", Draft::Draft6, "6"),
    ("json-schema.org/draft-04/schema", Draft::Draft4, "4"),
];

/// Picks the draft from `$schema` (absent: 2020-12). Scheme and a trailing
/// `#` are not significant.
fn draft_of(schema: &Value) -> Result<(Draft, &'static str), SpecError> {
    let Some(uri) = schema.get("$schema") else {
        return Ok((Draft::Draft202012, "2020-12"));
    };
    let Some(uri) = uri.as_str() else {
        return Err(SpecError::new(
            "spec.schema.$schema",
            "$schema must be a string",
            supported_drafts(),
        ));
    };
    let bare = uri.trim_end_matches('#').trim_end_matches('/');
    let bare = bare
        .strip_prefix("https://")
        .or_else(|| bare.strip_prefix("http://"))
        .unwrap_or(bare);
    DRAFTS.iter().find(|(u, _, _)| *u == bare).map(|(_, d, n)| (*d, *n)).ok_or_else(|| {
        SpecError::new(
            "spec.schema.$schema",
            format!("unsupported $schema '{}'", clip(uri, 120)),
            supported_drafts(),
        )
    })
}

fn supported_drafts() -> String {
    "Supported $schema values: https://json-schema.org/draft/2020-12/schema (default, also without /schema), https://json-schema.org/draft/2019-09/schema, http://json-schema.org/draft-07/schema#, http://json-schema.org/draft-06/schema#, http://json-schema.org/draft-04/schema#.".into()
}

fn cache() -> &'static Cache<String, Arc<Validator>> {
    static CACHE: OnceLock<Cache<String, Arc<Validator>>> = OnceLock::new();
    CACHE.get_or_init(|| Cache::new(SCHEMA_CACHE_ENTRIES))
}

fn compile_schema(schema: &Value, draft: Draft) -> Result<Arc<Validator>, SpecError> {
    // Canonical text: serde_json maps are ordered, so key order does not matter.
    let key = format!("{draft:?}{schema}");
    if let Some(v) = cache().get(&key) {
        return Ok(v);
    }
    let mut body = schema.clone();
    if let Some(m) = body.as_object_mut() {
        // The draft is already chosen; dropping `$schema` lets non-canonical spellings compile.
        m.remove("$schema");
    }
    let validator = jsonschema::options().with_draft(draft).build(&body).map_err(|e| {
        SpecError::new(
            "spec.schema",
            format!("malformed JSON Schema: {}", clip(&e.to_string(), 300)),
            "Fix the schema so it is valid for its draft (remote $refs are not fetched; inline them under $defs).",
        )
    })?;
    let validator = Arc::new(validator);
    cache().insert(key, validator.clone());
    Ok(validator)
}

/// The first validation errors, each as `at <instance path>: <message>`.
/// Shared by schema assertions and plugin config checks.
pub fn describe_errors(errors: &[jsonschema::ValidationError<'_>]) -> Vec<String> {
    errors
        .iter()
        .take(MAX_REPORTED_ERRORS)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "(root)".to_owned() } else { at };
            format!("at {at}: {}", clip(&e.to_string(), 200))
        })
        .collect()
}

impl SchemaCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<SchemaCheck, SpecError> {
        let target_text = spec.str("target")?;
        let target = Target::parse(target_text).map_err(|e| SpecError::new("spec.target", e.message, GRAMMAR_HINT))?;
        let schema = spec.raw("schema").ok_or_else(|| {
            SpecError::new(
                "spec.schema",
                "spec missing required field: schema",
                "Set spec.schema to a JSON Schema object (draft 2020-12 unless $schema says otherwise).",
            )
        })?;
        if !schema.is_object() && !schema.is_boolean() {
            return Err(SpecError::new(
                "spec.schema",
                "spec.schema must be a JSON Schema object or boolean",
                "Set spec.schema to a JSON Schema object, e.g. {\"type\": \"object\", \"required\": [\"id\"]}.",
            ));
        }
        let (draft, draft_name) = draft_of(schema)?;
        Ok(SchemaCheck {
            target,
            draft: draft_name,
            validator: compile_schema(schema, draft)?,
        })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let t = self.target.as_str();
        let value = match self.target.resolve(trace) {
            Ok(v) => v,
            Err(missing) => return Verdict::fail(format!("{t} could not be validated: {}.", missing.0)),
        };
        if self.validator.is_valid(&value) {
            return Verdict::pass(format!("{t} matches schema (draft {}).", self.draft));
        }
        let errors: Vec<_> = self.validator.iter_errors(&value).collect();
        let shown = describe_errors(&errors);
        let more = match errors.len().saturating_sub(MAX_REPORTED_ERRORS) {
            0 => String::new(),
            n => format!(" (and {n} more)"),
        };
        Verdict::fail(format!("{t} failed schema validation: {}{more}.", shown.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use serde_json::value::RawValue;

    fn trace() -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t",
            "steps": [{"type": "tool_call", "name": "lookup", "result": {"status": "ok", "amount": 5}}],
            "output": {"message": "m", "structured": {"refund_id": "RFD-001", "confidence": 1.23}}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    fn compile(spec: Value) -> Result<SchemaCheck, SpecError> {
        SchemaCheck::compile(&Spec::new(Some(&spec), "schema").unwrap())
    }

    #[test]
    fn seed_spelling_of_2020_12_is_accepted() {
        let c = compile(json!({"target": "steps[?name=='lookup'].result", "schema": {
            "$schema": "https://json-schema.org/draft/2020-12", "type": "object", "required": ["status", "amount"]}}))
        .unwrap();
        let v = c.evaluate(&trace());
        assert!(v.passed, "{}", v.explanation);
    }

    #[test]
    fn failure_names_the_path_and_value() {
        let c = compile(json!({"target": "output.structured", "schema": {
            "type": "object", "properties": {"confidence": {"type": "number", "maximum": 1.0}}}}))
        .unwrap();
        let v = c.evaluate(&trace());
        assert!(!v.passed);
        assert!(v.explanation.contains("/confidence"), "{}", v.explanation);
        assert!(v.explanation.contains("1.23"), "{}", v.explanation);
    }

    #[test]
    fn older_drafts_are_selected() {
        // Draft 4 uses boolean exclusiveMaximum; in 2020-12 the same schema is invalid.
        let schema =
            json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "maximum": 1, "exclusiveMaximum": true});
        let c = compile(json!({"target": "output.structured.confidence", "schema": schema})).unwrap();
        assert_eq!(c.draft, "4");
        assert!(!c.evaluate(&trace()).passed);
        for (uri, name) in [
            ("http://json-schema.org/draft-06/schema#", "6"),
            ("http://json-schema.org/draft-07/schema#", "7"),
            ("https://json-schema.org/draft/2019-09/schema", "2019-09"),
        ] {
            let c = compile(json!({"target": "output", "schema": {"$schema": uri}})).unwrap();
            assert_eq!(c.draft, name);
        }
    }

    #[test]
    fn bad_schemas_are_spec_errors() {
        let e = compile(json!({"target": "output", "schema": {"type": "not-a-valid-type"}})).unwrap_err();
        assert!(e.message.starts_with("malformed JSON Schema"), "{}", e.message);
        let e = compile(json!({"target": "output", "schema": {"$schema": "https://example.com/mine"}})).unwrap_err();
        assert!(e.message.starts_with("unsupported $schema"));
        let e = compile(json!({"target": "output", "schema": {"$ref": "https://example.com/remote.json"}})).unwrap_err();
        assert!(e.message.starts_with("malformed JSON Schema"), "{}", e.message);
        assert!(compile(json!({"target": "output"})).is_err());
        assert!(compile(json!({"target": "outptu", "schema": {}})).is_err());
    }

    #[test]
    fn missing_target_data_fails_with_reason() {
        let c = compile(json!({"target": "steps[?name=='ship'].args", "schema": {}})).unwrap();
        let v = c.evaluate(&trace());
        assert!(!v.passed);
        assert!(v.explanation.contains("no step named 'ship'"), "{}", v.explanation);
    }
}
