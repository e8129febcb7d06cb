//! Hostile test plugin `big-schema`: `describe` declares a config schema of
//! about 10 MB (a valid JSON Schema: one enum of 420,000 strings). The engine
//! must refuse it at load time instead of keeping it and repeating it in
//! every `list_plugins` answer.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

struct BigSchema;

/// Enum entries in the schema; each is 24 bytes, so about 10 MB in all.
const ENTRIES: usize = 420_000;

fn schema() -> String {
    let mut s = String::with_capacity(ENTRIES * 26 + 100);
    s.push_str(r#"{"type":"object","properties":{"kind":{"enum":["#);
    for i in 0..ENTRIES {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!("\"kind-{i:0>16}\""));
    }
    s.push_str("]}}}");
    s
}

impl Guest for BigSchema {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "big-schema".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: a 10 MB config schema.".to_owned(),
            config_schema: schema(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        configs
            .iter()
            .map(|_| {
                Ok(Verdict {
                    status: attest::plugin::types::Status::Pass,
                    score: 1.0,
                    explanation: "big-schema evaluated".to_owned(),
                    details: None,
                })
            })
            .collect()
    }
}

export!(BigSchema);

#[cfg(test)]
mod tests {
    #[test]
    fn schema_is_about_ten_megabytes_of_json() {
        let s = super::schema();
        assert!(s.len() > 10_000_000, "{}", s.len());
        serde_json::from_str::<serde_json::Value>(&s).unwrap();
    }
}
