//! Hostile test plugin `future-api`: a well-behaved plugin built against
//! `attest:plugin@9.0.0` (the WIT copy in `wit/`), a version the engine does
//! not serve. Its imports say so (`attest:plugin/types@9.0.0` and, because
//! `evaluate` logs, `attest:plugin/host@9.0.0`); the engine must refuse it at
//! load time with a message naming both versions, without calling it.
//!
//! It uses wit-bindgen directly: the SDK is bound to the current WIT.

wit_bindgen::generate!({
    path: "wit/attest-plugin.wit",
    world: "assertion-plugin",
});

use attest::plugin::host::{log, LogLevel};
use attest::plugin::types::Status;

struct FutureApi;

impl Guest for FutureApi {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "future-api".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: built against attest:plugin@9.0.0.".to_owned(),
            config_schema: r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#.to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        // Calling the host keeps `attest:plugin/host@9.0.0` among the imports.
        log(LogLevel::Warn, "future-api evaluated: the engine should have refused this plugin");
        configs
            .iter()
            .map(|_| {
                Ok(Verdict {
                    status: Status::Pass,
                    score: 1.0,
                    explanation: "built against attest:plugin@9.0.0".to_owned(),
                    details: None,
                })
            })
            .collect()
    }
}

export!(FutureApi);
