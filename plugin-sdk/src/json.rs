//! Comparisons on JSON values that plugins keep needing: numeric-aware
//! equality, containment (subset) and a value's text.
//!
//! Numbers compare by value, so `5` equals `5.0`; everything else compares
//! structurally. Equality tolerates the same relative error as the engine's
//! `eq` constraint (1e-9), so `0.1 + 0.2` equals `0.3`.

use serde_json::Value;
use std::borrow::Cow;

/// The relative error numeric equality always tolerates (as the engine's
/// constraint layer does).
pub const RELATIVE_EPSILON: f64 = 1e-9;

/// Whether two numbers are equal within `tolerance` (absolute), or within
/// [`RELATIVE_EPSILON`] of the larger magnitude.
pub fn numbers_equal(a: f64, b: f64, tolerance: f64) -> bool {
    let diff = (a - b).abs();
    diff <= tolerance || diff <= RELATIVE_EPSILON * a.abs().max(b.abs()).max(1.0)
}

/// Deep equality where numbers (at any depth) compare by value, within
/// `tolerance`. Object key order does not matter; array order does.
pub fn equal(a: &Value, b: &Value, tolerance: f64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => numbers_equal(x, y, tolerance),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b, tolerance)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w, tolerance)))
        }
        _ => a == b,
    }
}

/// Whether `haystack` contains `needle`:
///
/// - objects: every key of `needle` is in `haystack`, with a value that
///   contains the needle's value (recursively);
/// - arrays: every element of `needle` is contained by some element of
///   `haystack` (order and multiplicity ignored);
/// - strings: `needle` is a substring of `haystack`;
/// - anything else: [`equal`] with no tolerance.
pub fn contains(haystack: &Value, needle: &Value) -> bool {
    match (haystack, needle) {
        (Value::Object(h), Value::Object(n)) => n.iter().all(|(k, nv)| h.get(k).is_some_and(|hv| contains(hv, nv))),
        (Value::Array(h), Value::Array(n)) => n.iter().all(|nv| h.iter().any(|hv| contains(hv, nv))),
        (Value::String(h), Value::String(n)) => h.contains(n.as_str()),
        _ => equal(haystack, needle, 0.0),
    }
}

/// The JSON type of a value, for explanations: `a string`, `an object`, ….
pub use attest_trace::text::kind_name as type_name;

/// The text of a value: a string as itself, anything else as compact JSON
/// (how the engine's content checks read non-string targets).
pub fn text(v: &Value) -> Cow<'_, str> {
    match v {
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_by_value_at_any_depth() {
        assert!(equal(&json!(5), &json!(5.0), 0.0));
        assert!(equal(&json!({"a": [1, {"b": 2}]}), &json!({"a": [1.0, {"b": 2.0}]}), 0.0));
        assert!(equal(&json!(0.1 + 0.2), &json!(0.3), 0.0));
        assert!(!equal(&json!(5), &json!(5.01), 0.0));
        assert!(equal(&json!(5), &json!(5.01), 0.02));
        assert!(!equal(&json!([1, 2]), &json!([2, 1]), 0.0));
        assert!(!equal(&json!({"a": 1}), &json!({"a": 1, "b": 2}), 0.0));
        assert!(!equal(&json!("5"), &json!(5), 0.0));
    }

    #[test]
    fn containment() {
        let h = json!({"to": "a@b.c", "cc": ["x", "y"], "opts": {"retry": 3, "fast": true}});
        assert!(contains(&h, &json!({"opts": {"retry": 3}})));
        assert!(contains(&h, &json!({"cc": ["y"]})));
        assert!(contains(&h, &json!({"to": "@b."})), "substring");
        assert!(!contains(&h, &json!({"cc": ["z"]})));
        assert!(!contains(&h, &json!({"missing": 1})));
        assert!(contains(&json!([{"id": 1, "n": "a"}, {"id": 2}]), &json!([{"id": 2}])));
        assert!(contains(&json!(3), &json!(3.0)));
        assert!(!contains(&json!(3), &json!("3")));
    }

    #[test]
    fn text_and_type_names() {
        assert_eq!(text(&json!("hi")), "hi");
        assert_eq!(text(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(type_name(&json!([])), "an array");
        assert_eq!(type_name(&json!(null)), "null");
    }
}
