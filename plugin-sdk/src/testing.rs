//! Helpers for plugin unit tests (native builds only).
//!
//! They drive a plugin through [`crate::evaluate_batch`], the same code path
//! as the component's `evaluate` export, so a native test covers config
//! decoding and trace decoding too, not just the plugin's own function.

use crate::models::{Capability, CapabilityError, JudgeRequest, Judgement};
use crate::{evaluate_batch, AssertionPlugin, LogLevel, PluginError, Verdict};
use serde_json::{json, Value};

/// Drains the log lines this thread's plugin code wrote with [`crate::log`].
pub fn take_logs() -> Vec<(LogLevel, String)> {
    crate::log::imp::take()
}

/// Fakes for the engine's capabilities in native tests, for this thread;
/// dropping it removes them. Calls without a fake are refused as not
/// granted, as an engine that did not grant them would.
///
/// ```
/// use attest_plugin_sdk::models::{self, Judgement};
/// use attest_plugin_sdk::testing::FakeHost;
///
/// let host = FakeHost::new()
///     .embed(|texts| Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect()))
///     .judge(|req| Ok(Judgement { score: 0.9, reasoning: format!("judged {}", req.content) }))
///     .secret("api_key", "k");
/// assert_eq!(models::embed(&["ab"]).unwrap(), vec![vec![2.0, 1.0]]);
/// assert_eq!(models::config_secret("api_key").unwrap().as_deref(), Some("k"));
/// assert_eq!(host.calls().len(), 2);
/// ```
pub struct FakeHost {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl FakeHost {
    /// Starts with no fake: every call is refused.
    pub fn new() -> FakeHost {
        crate::models::imp::FAKES.with(|f| *f.borrow_mut() = Default::default());
        FakeHost {
            _not_send: std::marker::PhantomData,
        }
    }

    /// Answers `embed` calls.
    pub fn embed(self, f: impl FnMut(&[&str]) -> Result<Vec<Vec<f32>>, CapabilityError> + 'static) -> FakeHost {
        crate::models::imp::FAKES.with(|fakes| fakes.borrow_mut().embed = Some(Box::new(f)));
        self
    }

    /// Answers `judge` calls.
    pub fn judge(self, f: impl FnMut(&JudgeRequest) -> Result<Judgement, CapabilityError> + 'static) -> FakeHost {
        crate::models::imp::FAKES.with(|fakes| fakes.borrow_mut().judge = Some(Box::new(f)));
        self
    }

    /// Grants `config-secret`, with `name` mapped to `value`.
    pub fn secret(self, name: &str, value: &str) -> FakeHost {
        crate::models::imp::FAKES.with(|fakes| {
            fakes
                .borrow_mut()
                .secrets
                .get_or_insert_with(Vec::new)
                .push((name.to_owned(), value.to_owned()))
        });
        self
    }

    /// The capability calls made so far, in order.
    pub fn calls(&self) -> Vec<Capability> {
        crate::models::imp::FAKES.with(|f| f.borrow().calls.clone())
    }
}

impl Default for FakeHost {
    fn default() -> FakeHost {
        FakeHost::new()
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        crate::models::imp::FAKES.with(|f| *f.borrow_mut() = Default::default());
    }
}

/// Evaluates one config against one trace, both given as JSON values, the
/// way the engine would (JSON text in, one result out).
pub fn evaluate<P: AssertionPlugin>(trace: &Value, config: &Value) -> Result<Verdict, PluginError> {
    evaluate_batch::<P>(&trace.to_string(), &[config.to_string()])
        .pop()
        .expect("evaluate_batch returns one result per config")
}

/// A minimal valid trace whose `output.message` is `message`.
pub fn message_trace(message: &str) -> Value {
    json!({"schema_version": 1, "trace_id": "test", "output": {"message": message}})
}

/// Asserts that `P::info()` is something the engine will accept: a
/// non-empty id the engine accepts ([`attest_trace::is_plugin_id`]), a `x.y.z` version,
/// and a config schema that is a JSON object declaring draft 2020-12 and
/// `"type": "object"`. Returns the parsed schema for further checks.
pub fn check_info<P: AssertionPlugin>() -> Value {
    let info = P::info();
    assert!(
        attest_trace::is_plugin_id(&info.id),
        "plugin id {:?} should hold only {} (the engine refuses other ids)",
        info.id,
        attest_trace::PLUGIN_ID_RULE
    );
    let parts: Vec<&str> = info.version.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        "plugin version {:?} should be x.y.z",
        info.version
    );
    assert!(!info.description.is_empty(), "plugin {} should have a description", info.id);
    let schema: Value = serde_json::from_str(&info.config_schema).expect("config schema is JSON");
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "config schema declares draft 2020-12"
    );
    assert_eq!(schema["type"], "object", "a config is always an object");
    schema
}

/// Validates `config` against `P`'s config schema exactly as the engine does
/// before any assertion reaches the plugin (draft 2020-12); the error lists
/// what is wrong. Use it to keep a schema and its README examples honest.
#[cfg(feature = "schema")]
pub fn validate_config<P: AssertionPlugin>(config: &Value) -> Result<(), Vec<String>> {
    let schema: Value = serde_json::from_str(&P::info().config_schema).map_err(|e| vec![format!("schema is not JSON: {e}")])?;
    jsonschema::meta::validate(&schema).map_err(|e| vec![format!("schema is not a valid JSON Schema: {e}")])?;
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .map_err(|e| vec![format!("schema does not compile: {e}")])?;
    let errors: Vec<String> = validator
        .iter_errors(config)
        .map(|e| format!("at '{}': {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The configs of every example assertion for `plugin_id` in a README's
/// ```` ```json ```` blocks (`spec.config`, `{}` when absent), so tests can
/// check that documented examples validate and decode. Panics on a JSON block
/// that does not parse.
pub fn readme_configs(readme: &str, plugin_id: &str) -> Vec<Value> {
    let mut configs = Vec::new();
    let mut rest = readme;
    while let Some(start) = rest.find("```json\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").expect("unterminated ```json block");
        let value: Value =
            serde_json::from_str(&body[..end]).unwrap_or_else(|e| panic!("README JSON block does not parse: {e}\n{}", &body[..end]));
        let examples = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for ex in examples {
            if ex["spec"]["plugin_id"] == plugin_id {
                configs.push(ex["spec"].get("config").cloned().unwrap_or_else(|| json!({})));
            }
        }
        rest = &body[end + 3..];
    }
    configs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NoConfig, PluginInfo, Trace};

    struct Described;

    impl AssertionPlugin for Described {
        type Config = NoConfig;

        fn info() -> PluginInfo {
            PluginInfo::new("described", "1.0.0").description("A plugin with the default schema.")
        }

        fn evaluate(trace: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
            Ok(Verdict::pass(trace.output()["message"].as_str().unwrap_or_default().to_owned()))
        }
    }

    #[test]
    fn evaluate_goes_through_json_text() {
        let v = evaluate::<Described>(&message_trace("hello"), &json!({"anything": [1]})).unwrap();
        assert_eq!(v.explanation(), "hello");
    }

    #[test]
    fn readme_configs_are_extracted() {
        let readme = "# x\n```json\n{\"spec\": {\"plugin_id\": \"described\"}}\n```\ntext\n```json\n[{\"spec\": {\"plugin_id\": \"described\", \"config\": {\"a\": 1}}}, {\"spec\": {\"plugin_id\": \"other\"}}]\n```\n```sh\nls\n```\n";
        assert_eq!(readme_configs(readme, "described"), vec![json!({}), json!({"a": 1})]);
    }

    #[test]
    fn check_info_accepts_a_well_formed_plugin() {
        assert_eq!(check_info::<Described>()["type"], "object");
    }

    #[cfg(feature = "schema")]
    #[test]
    fn validate_config_uses_the_declared_schema() {
        validate_config::<Described>(&json!({"a": 1})).unwrap();
        let errors = validate_config::<Described>(&json!([1])).unwrap_err();
        assert!(errors[0].contains("is not of type \"object\""), "{errors:?}");
    }
}
