//! Hostile test plugin `wide-schema`: `describe` declares a valid config schema of
//! about 100 KB (one enum of 4,500 strings). It is within the
//! engine's load limit, so it loads, but too large to repeat in full in
//! `list_plugins`, which must omit it.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

struct WideSchema;

/// Enum entries in the schema; each is 24 bytes, so about 100 KB in all.
const ENTRIES: usize = 4_500;

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

impl Guest for WideSchema {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "wide-schema".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: a 100 KB config schema.".to_owned(),
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
                    explanation: "wide-schema evaluated".to_owned(),
                    details: None,
                })
            })
            .collect()
    }
}

export!(WideSchema);

#[cfg(test)]
mod tests {
    #[test]
    fn schema_is_about_a_hundred_kilobytes_of_json() {
        let s = super::schema();
        assert!(s.len() > 100_000, "{}", s.len());
        serde_json::from_str::<serde_json::Value>(&s).unwrap();
    }
}
