//! Reading assertion specs into typed values, with errors that name the
//! field and list what would have been valid.
//!
//! Specs are forward-compatible (Attest protocol v1 §6): unknown keys are ignored, and an
//! explicit `null` means "not given" (the SDK sends `"model": null`).

use crate::text::quote;
use serde_json::{Map, Value};
use std::fmt;

/// A problem with one assertion's spec: always the user's to fix.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecError {
    /// The offending member, as a path (`spec.check`).
    pub field: String,
    pub message: String,
    pub detail: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>, detail: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            message: message.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpecError {}

/// Typed, error-reporting access to a spec object.
///
/// It remembers which keys were asked for, so that once an assertion is
/// compiled the keys it never read can be named ([`Spec::unread_keys`]): the
/// wire ignores them, but a rules file refuses them, since there they are
/// typos that silently change a verdict.
pub struct Spec<'a> {
    map: &'a Map<String, Value>,
    asked: std::cell::RefCell<Vec<&'static str>>,
}

impl<'a> Spec<'a> {
    pub fn new(spec: Option<&'a Value>, kind: &str) -> Result<Spec<'a>, SpecError> {
        match spec {
            Some(Value::Object(map)) => Ok(Spec {
                map,
                asked: Default::default(),
            }),
            None | Some(Value::Null) => Err(SpecError::new(
                "spec",
                "missing required field: spec",
                format!("A {kind} assertion needs a spec object; see spec §4 for its fields."),
            )),
            Some(other) => Err(SpecError::new(
                "spec",
                format!("spec must be an object, got {}", type_name(other)),
                format!("Send the {kind} assertion's parameters as a JSON object."),
            )),
        }
    }

    fn get(&self, key: &'static str) -> Option<&'a Value> {
        self.asked.borrow_mut().push(key);
        self.peek(key)
    }

    /// The spec's keys that no accessor asked for, with the keys that were
    /// asked for; `None` when every key was read. A key set to `null` means
    /// "not given", so it is never counted.
    pub fn unread_keys(&self) -> Option<Box<super::UnreadKeys>> {
        let mut known = self.asked.borrow().clone();
        known.sort_unstable();
        known.dedup();
        let keys: Vec<String> = self
            .map
            .iter()
            .filter(|(k, v)| !v.is_null() && known.binary_search(&k.as_str()).is_err())
            .map(|(k, _)| k.clone())
            .collect();
        (!keys.is_empty()).then(|| Box::new(super::UnreadKeys { keys, known }))
    }

    fn missing(key: &str, what: &str) -> SpecError {
        SpecError::new(
            format!("spec.{key}"),
            format!("spec missing required field: {key}"),
            format!("Set spec.{key} to {what}."),
        )
    }

    fn wrong(key: &str, v: &Value, what: &str) -> SpecError {
        SpecError::new(
            format!("spec.{key}"),
            format!("spec.{key} must be {what}, got {}", type_name(v)),
            format!("Set spec.{key} to {what}."),
        )
    }

    /// A required, non-empty string.
    pub fn str(&self, key: &'static str) -> Result<&'a str, SpecError> {
        match self.get(key) {
            None => Err(Self::missing(key, "a non-empty string")),
            Some(Value::String(s)) if !s.is_empty() => Ok(s),
            Some(v) => Err(Self::wrong(key, v, "a non-empty string")),
        }
    }

    pub fn opt_str(&self, key: &'static str) -> Result<Option<&'a str>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(key, v, "a string")),
        }
    }

    pub fn bool_or(&self, key: &'static str, default: bool) -> Result<bool, SpecError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Self::wrong(key, v, "true or false")),
        }
    }

    pub fn opt_bool(&self, key: &'static str) -> Result<Option<bool>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(key, v, "true or false")),
        }
    }

    pub fn opt_f64(&self, key: &'static str) -> Result<Option<f64>, SpecError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(Self::wrong(key, v, "a number")),
        }
    }

    pub fn f64(&self, key: &'static str, why: &str) -> Result<f64, SpecError> {
        self.opt_f64(key)?.ok_or_else(|| {
            SpecError::new(
                format!("spec.{key}"),
                format!("spec missing required field: {key} ({why})"),
                format!("Set spec.{key} to a number."),
            )
        })
    }

    /// A required non-negative integer.
    pub fn count(&self, key: &'static str) -> Result<u64, SpecError> {
        match self.get(key) {
            None => Err(Self::missing(key, "a non-negative integer")),
            Some(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| Self::wrong(key, &Value::Number(n.clone()), "a non-negative integer")),
            Some(v) => Err(Self::wrong(key, v, "a non-negative integer")),
        }
    }

    /// A required, non-empty list of non-empty strings.
    pub fn str_list(&self, key: &'static str) -> Result<Vec<String>, SpecError> {
        let what = "a non-empty list of non-empty strings";
        match self.get(key) {
            None => Err(Self::missing(key, what)),
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) if !s.is_empty() => Ok(s.clone()),
                    other => Err(SpecError::new(
                        format!("spec.{key}[{i}]"),
                        format!("spec.{key}[{i}] must be a non-empty string, got {}", type_name(other)),
                        format!("Set spec.{key} to {what}."),
                    )),
                })
                .collect(),
            Some(v) => Err(Self::wrong(key, v, what)),
        }
    }

    /// `key`'s value without counting it as read: for a key whose meaning
    /// depends on its value (see [`super::CompiledAssertion::compile`]).
    pub fn peek(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn raw(&self, key: &'static str) -> Option<&'a Value> {
        self.get(key)
    }

    /// A required string that must be one of `choices`.
    pub fn choice<T: Copy>(&self, key: &'static str, choices: &[(&str, T)]) -> Result<T, SpecError> {
        let names = choices.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        let s = match self.get(key) {
            None => return Err(Self::missing(key, &format!("one of: {names}"))),
            Some(Value::String(s)) => s,
            Some(v) => return Err(Self::wrong(key, v, &format!("one of: {names}"))),
        };
        choices.iter().find(|(n, _)| *n == s).map(|(_, t)| *t).ok_or_else(|| {
            SpecError::new(
                format!("spec.{key}"),
                format!("unsupported {key} {}", quote(s)),
                format!("Supported values for spec.{key}: {names}."),
            )
        })
    }
}

/// How messages describe a value (`a string ("abc")`, `an object`).
pub use crate::text::describe as type_name;
