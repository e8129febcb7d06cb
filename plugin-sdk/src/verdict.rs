//! What a plugin returns: [`Verdict`] (built so it is always well formed),
//! [`PluginError`] and [`PluginInfo`]. These are the SDK's own types; the
//! conversion to the WIT types lives in the export glue (`crate::export`).

use serde_json::Value;
use std::fmt;

/// What a plugin concluded about one assertion (WIT `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The assertion holds.
    Pass,
    /// The assertion does not hold. The engine reports `soft_fail` when the
    /// assertion was sent with `soft: true`, `hard_fail` otherwise.
    Fail,
    /// The assertion does not hold and must not be softened.
    HardFail,
}

/// One assertion's verdict (WIT `verdict`).
///
/// The builder keeps it well formed: the score is always within `[0, 1]`
/// and the details, when present, are always valid JSON.
///
/// ```
/// use attest_plugin_sdk::{Status, Verdict};
/// use serde_json::json;
///
/// let v = Verdict::fail("output.message contains an email address ('j***@example.com').")
///     .with_score(0.25)
///     .with_details(json!({"kind": "email"}));
/// assert_eq!(v.status(), Status::Fail);
/// assert_eq!(v.details(), Some(r#"{"kind":"email"}"#));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    status: Status,
    score: f64,
    explanation: String,
    details: Option<String>,
}

impl Verdict {
    /// The assertion holds; score 1.0.
    pub fn pass(explanation: impl Into<String>) -> Verdict {
        Verdict::new(Status::Pass, 1.0, explanation)
    }

    /// The assertion does not hold; score 0.0. The engine softens it to
    /// `soft_fail` for assertions sent with `soft: true`.
    pub fn fail(explanation: impl Into<String>) -> Verdict {
        Verdict::new(Status::Fail, 0.0, explanation)
    }

    /// The assertion does not hold and must not be softened; score 0.0.
    pub fn hard_fail(explanation: impl Into<String>) -> Verdict {
        Verdict::new(Status::HardFail, 0.0, explanation)
    }

    /// `pass` when `passed`, else `fail`, with the same explanation.
    pub fn from_bool(passed: bool, explanation: impl Into<String>) -> Verdict {
        if passed {
            Verdict::pass(explanation)
        } else {
            Verdict::fail(explanation)
        }
    }

    /// The failure every plugin gives when its config's target is not in
    /// the trace: the explanation says what is missing, and the evidence
    /// names the target, what was found instead and what to change.
    /// [`crate::resolve_or_fail!`] returns it for you.
    pub fn target_missing(target: &crate::Target, missing: &crate::Missing) -> Verdict {
        Verdict::fail(format!("{target} could not be checked: {missing}."))
            .with_evidence(format!("{target} present"), format!("not found: {missing}"))
            .with_path(target.as_str())
            .with_hint(format!(
                "Make the agent produce {target}, or point the config's target at where the value is."
            ))
    }

    fn new(status: Status, score: f64, explanation: impl Into<String>) -> Verdict {
        Verdict {
            status,
            score,
            explanation: explanation.into(),
            details: None,
        }
    }

    /// Sets the score, clamped to `[0, 1]`. NaN becomes 0.0: a score that
    /// cannot be trusted should not count for anything.
    pub fn with_score(mut self, score: f64) -> Verdict {
        self.score = if score.is_nan() { 0.0 } else { score.clamp(0.0, 1.0) };
        self
    }

    /// Attaches structured details (sent to the engine as JSON text).
    /// Evidence set before or after ([`Verdict::with_evidence`]) is kept.
    pub fn with_details(mut self, details: Value) -> Verdict {
        let evidence = self.evidence_fields();
        self.details = Some(details.to_string());
        for (key, text) in evidence {
            self = self.with_detail_string(key, text);
        }
        self
    }

    /// What the check wanted and what the trace held, as short concrete
    /// strings. The engine shows them as the result's `expected` and `actual`
    /// (the SDK renders them as `expected:` / `actual:` lines).
    ///
    /// ```
    /// use attest_plugin_sdk::Verdict;
    ///
    /// let v = Verdict::fail("argument 'amount' is 80.0")
    ///     .with_evidence("amount equals 89.99", "amount is 80.0")
    ///     .with_path("steps[2].args.amount")
    ///     .with_hint("Pass the order total to process_refund, not the subtotal.");
    /// let d = v.details_value().unwrap();
    /// assert_eq!(d["expected"], "amount equals 89.99");
    /// assert_eq!(d["actual"], "amount is 80.0");
    /// assert_eq!(d["path"], "steps[2].args.amount");
    /// ```
    pub fn with_evidence(self, expected: impl Into<String>, actual: impl Into<String>) -> Verdict {
        self.with_detail_string("expected", expected.into())
            .with_detail_string("actual", actual.into())
    }

    /// Where in the trace the evidence is (`steps[2].args.amount`); the
    /// result's `trace_node_path`.
    pub fn with_path(self, path: impl Into<String>) -> Verdict {
        self.with_detail_string("path", path.into())
    }

    /// One concrete sentence about what to change; the result's
    /// `suggested_action` (the SDK's `hint:` line).
    pub fn with_hint(self, hint: impl Into<String>) -> Verdict {
        self.with_detail_string("hint", hint.into())
    }

    /// Sets one string member of the details object. Details that are not
    /// an object are kept under `"value"` so nothing is lost.
    fn with_detail_string(mut self, key: &'static str, text: String) -> Verdict {
        let mut map = match self.details_value() {
            Some(Value::Object(m)) => m,
            Some(other) => serde_json::Map::from_iter([("value".to_owned(), other)]),
            None => serde_json::Map::new(),
        };
        map.insert(key.to_owned(), Value::String(text));
        self.details = Some(Value::Object(map).to_string());
        self
    }

    /// The evidence members currently in the details.
    fn evidence_fields(&self) -> Vec<(&'static str, String)> {
        let Some(Value::Object(m)) = self.details_value() else {
            return Vec::new();
        };
        ["expected", "actual", "path", "hint"]
            .into_iter()
            .filter_map(|k| match m.get(k) {
                Some(Value::String(s)) => Some((k, s.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn is_pass(&self) -> bool {
        self.status == Status::Pass
    }

    pub fn score(&self) -> f64 {
        self.score
    }

    pub fn explanation(&self) -> &str {
        &self.explanation
    }

    /// The details as JSON text.
    pub fn details(&self) -> Option<&str> {
        self.details.as_deref()
    }

    /// The details parsed back into a value (for tests).
    pub fn details_value(&self) -> Option<Value> {
        self.details.as_deref().and_then(|d| serde_json::from_str(d).ok())
    }

    /// The parts, in WIT order.
    pub(crate) fn into_parts(self) -> (Status, f64, String, Option<String>) {
        (self.status, self.score, self.explanation, self.details)
    }
}

/// Why a plugin could not reach a verdict (WIT `plugin-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    /// The config is unusable beyond what its JSON Schema can express (for
    /// example an invalid regex). Config decoding errors arrive as this.
    InvalidConfig(String),
    /// The trace lacks something the plugin needs.
    UnsupportedTrace(String),
    /// Any other failure inside the plugin.
    Internal(String),
}

impl PluginError {
    pub fn invalid_config(message: impl Into<String>) -> PluginError {
        PluginError::InvalidConfig(message.into())
    }

    pub fn unsupported_trace(message: impl Into<String>) -> PluginError {
        PluginError::UnsupportedTrace(message.into())
    }

    pub fn internal(message: impl Into<String>) -> PluginError {
        PluginError::Internal(message.into())
    }

    pub fn message(&self) -> &str {
        match self {
            PluginError::InvalidConfig(m) | PluginError::UnsupportedTrace(m) | PluginError::Internal(m) => m,
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            PluginError::InvalidConfig(_) => "invalid config",
            PluginError::UnsupportedTrace(_) => "unsupported trace",
            PluginError::Internal(_) => "internal error",
        };
        write!(f, "{kind}: {}", self.message())
    }
}

impl std::error::Error for PluginError {}

/// The schema a plugin declares when it does not set one: any object.
pub const ANY_OBJECT_SCHEMA: &str = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#;

/// What `describe` returns (WIT `plugin-info`).
///
/// ```
/// use attest_plugin_sdk::PluginInfo;
///
/// let info = PluginInfo::new("my-check", "1.2.0")
///     .description("Checks something.")
///     .config_schema(r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#);
/// assert_eq!(info.id, "my-check");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The id assertions use in `spec.plugin_id`.
    pub id: String,
    /// The plugin's own semver; `env!("CARGO_PKG_VERSION")` is the usual value.
    pub version: String,
    pub description: String,
    /// JSON Schema (draft 2020-12) of the assertion's `config` object, as
    /// JSON text; usually `include_str!("../config.schema.json")`.
    pub config_schema: String,
    /// Capabilities the plugin asks the operator for (see [`crate::models`]).
    pub capabilities: Vec<crate::models::Capability>,
}

impl PluginInfo {
    /// An id and version, no description, [`ANY_OBJECT_SCHEMA`], and no
    /// capability.
    pub fn new(id: impl Into<String>, version: impl Into<String>) -> PluginInfo {
        PluginInfo {
            id: id.into(),
            version: version.into(),
            description: String::new(),
            config_schema: ANY_OBJECT_SCHEMA.to_owned(),
            capabilities: Vec::new(),
        }
    }

    /// Requests a capability; the operator still has to grant it.
    pub fn requests(mut self, capability: crate::models::Capability) -> PluginInfo {
        if !self.capabilities.contains(&capability) {
            self.capabilities.push(capability);
        }
        self
    }

    pub fn description(mut self, description: impl Into<String>) -> PluginInfo {
        self.description = description.into();
        self
    }

    pub fn config_schema(mut self, schema: impl Into<String>) -> PluginInfo {
        self.config_schema = schema.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn constructors_set_status_and_default_score() {
        assert_eq!((Verdict::pass("p").status(), Verdict::pass("p").score()), (Status::Pass, 1.0));
        assert_eq!((Verdict::fail("f").status(), Verdict::fail("f").score()), (Status::Fail, 0.0));
        assert_eq!(Verdict::hard_fail("h").status(), Status::HardFail);
        assert!(Verdict::from_bool(true, "x").is_pass());
        assert_eq!(Verdict::from_bool(false, "x").status(), Status::Fail);
        assert_eq!(Verdict::pass("why").explanation(), "why");
    }

    #[test]
    fn score_is_clamped() {
        assert_eq!(Verdict::pass("").with_score(7.5).score(), 1.0);
        assert_eq!(Verdict::pass("").with_score(-1.0).score(), 0.0);
        assert_eq!(Verdict::pass("").with_score(f64::NAN).score(), 0.0);
        assert_eq!(Verdict::pass("").with_score(f64::INFINITY).score(), 1.0);
        assert_eq!(Verdict::fail("").with_score(0.4).score(), 0.4);
    }

    #[test]
    fn details_are_json_text() {
        let v = Verdict::fail("").with_details(json!({"a": [1, "two"], "b": null}));
        assert_eq!(v.details(), Some(r#"{"a":[1,"two"],"b":null}"#));
        assert_eq!(v.details_value(), Some(json!({"a": [1, "two"], "b": null})));
        assert_eq!(Verdict::pass("").details(), None);
    }

    #[test]
    fn evidence_merges_into_details_in_either_order() {
        let before = Verdict::fail("").with_evidence("e", "a").with_details(json!({"n": 1}));
        let after = Verdict::fail("").with_details(json!({"n": 1})).with_evidence("e", "a");
        for v in [before, after] {
            assert_eq!(v.details_value(), Some(json!({"n": 1, "expected": "e", "actual": "a"})));
        }
        let wrapped = Verdict::fail("").with_details(json!([1])).with_hint("h");
        assert_eq!(wrapped.details_value(), Some(json!({"value": [1], "hint": "h"})));
        assert_eq!(
            Verdict::fail("").with_path("steps[0]").details_value(),
            Some(json!({"path": "steps[0]"}))
        );
    }

    #[test]
    fn errors_display_their_kind() {
        assert_eq!(PluginError::invalid_config("bad regex").to_string(), "invalid config: bad regex");
        assert_eq!(PluginError::unsupported_trace("x").message(), "x");
        assert!(matches!(PluginError::internal("boom"), PluginError::Internal(m) if m == "boom"));
    }

    #[test]
    fn info_builder_defaults_to_any_object() {
        let info = PluginInfo::new("id", "0.1.0");
        assert_eq!(info.config_schema, ANY_OBJECT_SCHEMA);
        let schema: Value = serde_json::from_str(ANY_OBJECT_SCHEMA).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(info.description("d").description, "d");
    }
}
