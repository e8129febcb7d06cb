//! Hostile test plugin `twin-b`: claims the plugin id `twin`, as `twin-a`
//! does. Neither may win silently: the engine must refuse both and name both.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

struct Twin;

impl Guest for Twin {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "twin".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: twin-b, one of two plugins with the id 'twin'.".to_owned(),
            config_schema: r#"{"type":"object"}"#.to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        configs
            .iter()
            .map(|_| {
                Ok(Verdict {
                    status: attest::plugin::types::Status::Pass,
                    score: 1.0,
                    explanation: "twin-b answered".to_owned(),
                    details: None,
                })
            })
            .collect()
    }
}

export!(Twin);
