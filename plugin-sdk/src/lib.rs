//! Write attest-engine assertion plugins in plain Rust.
//!
//! An assertion plugin is a WebAssembly component for the `assertion-plugin`
//! world of `wit/since_v0.2.0/attest-plugin.wit` (`attest:plugin@0.2.0`). This crate hides
//! the WIT plumbing: a plugin implements [`AssertionPlugin`] on typed data and
//! exports itself with one macro, [`export_plugin!`].
//!
//! ```
//! use attest_plugin_sdk::{AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
//! use serde::Deserialize;
//!
//! /// Fails when the target's text is longer than `max_chars`.
//! struct MaxLength;
//!
//! #[derive(Deserialize)]
//! struct Config {
//!     #[serde(default = "default_target")]
//!     target: Target,
//!     max_chars: usize,
//! }
//!
//! fn default_target() -> Target {
//!     Target::parse("output.message").unwrap()
//! }
//!
//! impl AssertionPlugin for MaxLength {
//!     type Config = Config;
//!
//!     fn info() -> PluginInfo {
//!         PluginInfo::new("max-length", "0.1.0").description("Caps the length of a text.")
//!     }
//!
//!     fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
//!         let t = &config.target;
//!         let value = match t.resolve(trace) {
//!             Ok(v) => v,
//!             Err(missing) => return Ok(Verdict::fail(format!("{t} could not be checked: {missing}."))),
//!         };
//!         let n = attest_plugin_sdk::json::text(&value).chars().count();
//!         Ok(Verdict::from_bool(n <= config.max_chars, format!("{t} has {n} characters (max {}).", config.max_chars)))
//!     }
//! }
//!
//! attest_plugin_sdk::export_plugin!(MaxLength);
//!
//! // Natively, the same code path the component export takes:
//! let trace = r#"{"schema_version": 1, "trace_id": "t", "output": {"message": "hello"}}"#;
//! let results = attest_plugin_sdk::evaluate_batch::<MaxLength>(trace, &[r#"{"max_chars": 3}"#]);
//! assert_eq!(results[0].as_ref().unwrap().explanation(), "output.message has 5 characters (max 3).");
//! ```
//!
//! What the crate owns:
//!
//! - [`trace`]: the typed trace model, mirroring the engine's;
//! - [`target`]: the engine's target grammar (`output.<path>`,
//!   `steps[?name=='x'].result.<path>`, …), usable as a config field;
//! - [`verdict`]: [`Verdict`] builders, [`PluginError`], [`PluginInfo`];
//! - [`config`]: typed config decoding, errors mapped to `invalid-config`;
//! - [`log()`]: the host's log import, with a native recorder for tests;
//! - [`models`]: embeddings, an LLM judge and operator secrets, through the
//!   engine, once the operator grants them;
//! - [`json`] and [`text`]: comparison and explanation helpers;
//! - [`testing`] (native only): helpers for plugin unit tests.
//!
//! Plugins build to `wasm32-unknown-unknown` components (see
//! `plugins/build.sh`); their logic is tested natively with `cargo test`.

#[cfg(any(test, all(target_arch = "wasm32", feature = "allocator")))]
mod arena;
pub mod config;
mod export;
#[cfg(all(target_arch = "wasm32", feature = "allocator"))]
pub mod heap;
pub mod json;
mod log;
pub mod models;
/// The target grammar, shared with the engine (`attest-trace`).
pub use attest_trace::target;
/// Bounded quoting for explanations, shared with the engine (`attest-trace`).
pub use attest_trace::text;
pub mod trace;
pub mod verdict;

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use config::{decode_config, NoConfig};
pub use log::{log, LogLevel};
/// The `serde_json` the SDK is built with: `Verdict::with_details` takes its
/// `Value`, and tests build configs with its `json!`, so a plugin needs no
/// dependency of its own (and no version to keep in step).
pub use serde_json;
pub use target::{Missing, Target, TargetSyntaxError, GRAMMAR_HINT};
pub use trace::{Step, StepType, Trace};
pub use verdict::{PluginError, PluginInfo, Status, Verdict, ANY_OBJECT_SCHEMA};

// Used by `export_plugin!`'s expansion in the plugin crate; not API.
#[doc(hidden)]
pub use export::bindings as __bindings;
#[doc(hidden)]
pub use export::Export as __Export;

use serde::de::DeserializeOwned;

/// An assertion plugin: a config type, a description, and a check.
///
/// Both functions are associated functions (no `self`): a plugin keeps no
/// state between calls, and the engine may run every call in a fresh instance.
pub trait AssertionPlugin: 'static {
    /// The assertion's `config`, decoded from JSON. The engine validates it
    /// against [`PluginInfo::config_schema`] first; anything decoding still
    /// rejects is reported as `invalid-config`. Use [`NoConfig`] for none.
    type Config: DeserializeOwned;

    /// Id, version, description and config schema, returned by `describe`.
    fn info() -> PluginInfo;

    /// Checks one trace against one config.
    ///
    /// Return `Ok(verdict)` whenever the assertion could be judged, including
    /// when the data it looks at is missing (a fail that says what is
    /// missing, as the engine's built-in checks do); return an error only
    /// when no verdict can be reached.
    fn evaluate(trace: &Trace, config: &Self::Config) -> Result<Verdict, PluginError>;

    /// Whether a panic's message is sent to the engine's log before the
    /// panic traps the call. On by default.
    ///
    /// Sending it needs the host's `log` import, and an import that takes a
    /// string makes the component three core instances instead of one (a
    /// shim and a fix-up module around the plugin's own), each instantiated
    /// on every call. A plugin that never calls [`log`] and sets this to
    /// `false` has no host import at all, which takes about 15% off a
    /// trivial call (docs/benchmarks.md). Its panics are then reported only
    /// as traps.
    const REPORT_PANICS: bool = true;
}

/// Resolves a [`Target`] on a [`Trace`], or returns from the enclosing
/// `evaluate` with [`Verdict::target_missing`]: a target the trace lacks is
/// a failed assertion, never a plugin error.
///
/// ```
/// use attest_plugin_sdk::{resolve_or_fail, PluginError, Target, Trace, Verdict};
///
/// fn evaluate(trace: &Trace, target: &Target) -> Result<Verdict, PluginError> {
///     let value = resolve_or_fail!(target, trace);
///     Ok(Verdict::from_bool(value.is_string(), format!("{target} is {value}")))
/// }
///
/// let trace = Trace::from_json(r#"{"output": {"message": "hi"}}"#).unwrap();
/// assert!(evaluate(&trace, &Target::parse("output.message").unwrap()).unwrap().is_pass());
/// let v = evaluate(&trace, &Target::parse("output.structured.id").unwrap()).unwrap();
/// assert!(!v.is_pass() && v.explanation().starts_with("output.structured.id could not be checked"));
/// assert_eq!(v.details_value().unwrap()["path"], "output.structured.id");
/// ```
#[macro_export]
macro_rules! resolve_or_fail {
    ($target:expr, $trace:expr) => {{
        let target: &$crate::Target = &$target;
        match target.resolve($trace) {
            Ok(value) => value,
            Err(missing) => return Ok($crate::Verdict::target_missing(target, &missing)),
        }
    }};
}

/// What the component's `evaluate` export does: reads the trace once (see
/// [`trace`]: its parts are decoded on first use and shared by every
/// config), then decodes each config and evaluates it, one result per
/// config, in order. Exposed so native tests exercise exactly the exported
/// path.
pub fn evaluate_batch<P: AssertionPlugin>(trace_json: &str, configs: &[impl AsRef<str>]) -> Vec<Result<Verdict, PluginError>> {
    evaluate_trace::<P>(Trace::from_json(trace_json), configs)
}

pub(crate) fn evaluate_trace<P: AssertionPlugin>(
    trace: Result<Trace, PluginError>,
    configs: &[impl AsRef<str>],
) -> Vec<Result<Verdict, PluginError>> {
    let trace = match trace {
        Ok(t) => t,
        Err(e) => return configs.iter().map(|_| Err(e.clone())).collect(),
    };
    let verdicts = configs
        .iter()
        .map(|c| {
            decode_config::<P::Config>(c.as_ref()).and_then(|config| {
                let verdict = P::evaluate(&trace, &config);
                done_with(config);
                verdict
            })
        })
        .collect();
    done_with(trace);
    verdicts
}

/// Lets go of what a call has finished with. Natively that is a drop. In a
/// component nothing is dropped: the engine runs each call in an instance of
/// its own and then discards the instance's memory whole, so destructors
/// (walking a decoded trace's trees, a free per string) would be work that
/// changes nothing.
#[inline]
pub(crate) fn done_with<T>(value: T) {
    #[cfg(target_arch = "wasm32")]
    core::mem::forget(value);
    #[cfg(not(target_arch = "wasm32"))]
    drop(value);
}

/// Exports a type implementing [`AssertionPlugin`] as the component's
/// `describe` and `evaluate`. Use it once per plugin crate, at the top level:
///
/// ```
/// # use attest_plugin_sdk::{AssertionPlugin, NoConfig, PluginError, PluginInfo, Trace, Verdict};
/// # struct MyPlugin;
/// # impl AssertionPlugin for MyPlugin {
/// #     type Config = NoConfig;
/// #     fn info() -> PluginInfo { PluginInfo::new("my-plugin", "0.1.0") }
/// #     fn evaluate(_: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> { Ok(Verdict::pass("ok")) }
/// # }
/// attest_plugin_sdk::export_plugin!(MyPlugin);
/// ```
///
/// The crate must be built as a `cdylib` for `wasm32-unknown-unknown` (see
/// `plugins/build.sh`). Natively the macro still compiles, so `cargo test`
/// and `cargo clippy` see the same code.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            // wit-bindgen's export macro takes an identifier, not a generic
            // type, hence the alias.
            type __AttestPluginExport = $crate::__Export<$plugin>;
    $crate::__bindings::__export_assertion_plugin!(__AttestPluginExport with_types_in $crate::__bindings);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    struct Threshold;

    #[derive(Deserialize)]
    struct Config {
        field: Target,
        min: f64,
    }

    impl AssertionPlugin for Threshold {
        type Config = Config;

        fn info() -> PluginInfo {
            PluginInfo::new("threshold", "0.1.0")
        }

        fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
            log(LogLevel::Debug, &format!("checking {}", config.field));
            let v = config.field.resolve(trace).map_err(|m| PluginError::unsupported_trace(m.0))?;
            let x = v.as_f64().ok_or_else(|| PluginError::unsupported_trace("not a number"))?;
            Ok(Verdict::from_bool(x >= config.min, format!("{} = {x}", config.field)))
        }
    }

    const TRACE: &str = r#"{"schema_version": 1, "trace_id": "t", "output": {"message": "m"}, "metadata": {"score": 0.8}}"#;

    #[test]
    fn batch_decodes_each_config_and_keeps_order() {
        let out = evaluate_batch::<Threshold>(
            TRACE,
            &[
                r#"{"field": "metadata.score", "min": 0.5}"#,
                r#"{"field": "metadata.score", "min": 0.9}"#,
                r#"{"field": "metadata.nope", "min": 0.9}"#,
                r#"{"field": "meta.score", "min": 0.9}"#,
                r#"{"min": 0.9}"#,
            ],
        );
        assert_eq!(out.len(), 5);
        assert!(out[0].as_ref().unwrap().is_pass());
        assert_eq!(out[1].as_ref().unwrap().status(), Status::Fail);
        assert!(matches!(&out[2], Err(PluginError::UnsupportedTrace(m)) if m.contains("'nope' not found")));
        assert!(matches!(&out[3], Err(PluginError::InvalidConfig(m)) if m.contains("unsupported target 'meta.score'")));
        assert!(matches!(&out[4], Err(PluginError::InvalidConfig(m)) if m.contains("missing field `field`")));
        let logs = testing::take_logs();
        assert_eq!(logs.len(), 3, "one line per config that decoded: {logs:?}");
        assert_eq!(logs[0], (LogLevel::Debug, "checking metadata.score".to_owned()));
        assert!(testing::take_logs().is_empty(), "take_logs drains");
    }

    #[test]
    fn an_undecodable_trace_fails_every_config() {
        let out = evaluate_batch::<Threshold>(r#"{"steps": 3}"#, &["{}", "{}"]);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|r| matches!(r, Err(PluginError::UnsupportedTrace(_)))));
        assert!(evaluate_batch::<Threshold>(TRACE, &[] as &[&str]).is_empty());
    }
}
