//! The glue between a plugin's [`AssertionPlugin`] impl and the component's
//! exports: the wit-bindgen bindings for `attest:plugin@0.2.0`, an adapter
//! implementing the generated `Guest` trait, and conversions from the SDK's
//! types to the generated ones. Nothing here is part of the public API; the
//! [`export_plugin!`](crate::export_plugin) macro is the only way in.

use crate::{AssertionPlugin, PluginError, Status, Verdict};
use std::marker::PhantomData;

/// The bindings wit-bindgen generates for the `assertion-plugin` world.
///
/// They are generated here, once, rather than in each plugin crate. The
/// export macro they come with (`pub_export_macro`) is what
/// `export_plugin!` expands to; it also carries the custom section that
/// describes the world, so that section is emitted into the plugin's own
/// object code and the component linker always finds it.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/since_v0.2.0/attest-plugin.wit",
        world: "assertion-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_assertion_plugin",
        default_bindings_module: "attest_plugin_sdk::__bindings",
    });
}

use bindings::attest::plugin::types as wit;

/// Implements the generated `Guest` trait for any [`AssertionPlugin`].
pub struct Export<P>(PhantomData<P>);

impl<P: AssertionPlugin> bindings::Guest for Export<P> {
    fn describe() -> wit::PluginInfo {
        if P::REPORT_PANICS {
            report_panics();
        }
        let info = P::info();
        wit::PluginInfo {
            id: info.id,
            version: info.version,
            description: info.description,
            config_schema: info.config_schema,
            capabilities: info
                .capabilities
                .into_iter()
                .map(|c| match c {
                    crate::models::Capability::Embed => wit::Capability::Embed,
                    crate::models::Capability::Judge => wit::Capability::Judge,
                    crate::models::Capability::ConfigSecret => wit::Capability::ConfigSecret,
                })
                .collect(),
        }
    }

    fn evaluate(trace: String, configs: Vec<String>) -> Vec<Result<wit::Verdict, wit::PluginError>> {
        if P::REPORT_PANICS {
            report_panics();
        }
        let verdicts = crate::evaluate_trace::<P>(crate::Trace::from_engine(trace), &configs)
            .into_iter()
            .map(|r| r.map(verdict_to_wit).map_err(error_to_wit))
            .collect();
        crate::done_with(configs);
        verdicts
    }
}

/// A panic in a component is a trap, and the engine can only say "trapped".
/// Sending the panic message to the engine's log first tells the plugin's
/// author what went wrong. Native builds keep the test harness's hook.
/// Only called when [`AssertionPlugin::REPORT_PANICS`] is set: otherwise no
/// code refers to the `log` import and the linker leaves it out.
fn report_panics() {
    #[cfg(target_arch = "wasm32")]
    {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| std::panic::set_hook(Box::new(|info| crate::log(crate::LogLevel::Error, &format!("panicked: {info}")))));
    }
}

fn verdict_to_wit(v: Verdict) -> wit::Verdict {
    let (status, score, explanation, details) = v.into_parts();
    wit::Verdict {
        status: match status {
            Status::Pass => wit::Status::Pass,
            Status::Fail => wit::Status::Fail,
            Status::HardFail => wit::Status::HardFail,
        },
        score,
        explanation,
        details,
    }
}

fn error_to_wit(e: PluginError) -> wit::PluginError {
    match e {
        PluginError::InvalidConfig(m) => wit::PluginError::InvalidConfig(m),
        PluginError::UnsupportedTrace(m) => wit::PluginError::UnsupportedTrace(m),
        PluginError::Internal(m) => wit::PluginError::Internal(m),
    }
}

#[cfg(test)]
mod tests {
    use super::bindings::Guest;
    use super::*;
    use crate::{NoConfig, PluginInfo, Trace};

    struct Echo;

    impl AssertionPlugin for Echo {
        type Config = NoConfig;

        fn info() -> PluginInfo {
            PluginInfo::new("echo", "0.0.1").description("test")
        }

        fn evaluate(trace: &Trace, _: &NoConfig) -> Result<Verdict, PluginError> {
            match trace.trace_id() {
                "pass" => Ok(Verdict::pass("p").with_score(0.5).with_details(serde_json::json!([1]))),
                "hard" => Ok(Verdict::hard_fail("h")),
                _ => Err(PluginError::internal("boom")),
            }
        }
    }

    #[test]
    fn guest_converts_to_wit_types() {
        let info = <Export<Echo> as Guest>::describe();
        assert_eq!(
            (info.id.as_str(), info.version.as_str(), info.description.as_str()),
            ("echo", "0.0.1", "test")
        );

        let trace = |id: &str| format!(r#"{{"schema_version":1,"trace_id":"{id}","output":{{"m":1}}}}"#);
        let out = <Export<Echo> as Guest>::evaluate(trace("pass"), vec!["{}".into(), "{}".into()]);
        assert_eq!(out.len(), 2);
        let v = out[0].as_ref().unwrap();
        assert!(matches!(v.status, wit::Status::Pass));
        assert_eq!((v.score, v.explanation.as_str(), v.details.as_deref()), (0.5, "p", Some("[1]")));

        let out = <Export<Echo> as Guest>::evaluate(trace("hard"), vec!["{}".into()]);
        assert!(matches!(out[0].as_ref().unwrap().status, wit::Status::HardFail));
        let out = <Export<Echo> as Guest>::evaluate(trace("other"), vec!["{}".into()]);
        assert!(matches!(&out[0], Err(wit::PluginError::Internal(m)) if m == "boom"));
        let out = <Export<Echo> as Guest>::evaluate("not json".into(), vec!["{}".into()]);
        assert!(matches!(&out[0], Err(wit::PluginError::UnsupportedTrace(_))));
    }
}
