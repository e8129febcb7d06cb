//! Hostile test plugin `malformed`: returns verdicts the WIT types allow but
//! the contract forbids, chosen per config with `{"kind": …}`:
//!
//! | kind             | what comes back                                 |
//! |------------------|-------------------------------------------------|
//! | `nan`            | score NaN                                       |
//! | `too_high`       | score 7.5                                       |
//! | `negative`       | score -0.5                                      |
//! | `infinity`       | score +inf                                      |
//! | `bad_details`    | details `{"unterminated": ` (not JSON)          |
//! | `missing_result` | one result fewer than configs (for the batch)   |
//! | `extra_result`   | one result more than configs (for the batch)    |
//! | anything else    | a well-formed pass, as a control                |
//!
//! It uses wit-bindgen directly instead of the SDK, whose verdict builder
//! makes exactly these mistakes impossible; that is also what a plugin from
//! another toolchain looks like to the engine.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

use attest::plugin::types::Status;

struct Malformed;

const SCHEMA: &str =
    r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"kind":{"type":"string"}}}"#;

fn kind(config: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
    v.get("kind").and_then(|k| k.as_str()).unwrap_or("valid").to_owned()
}

fn verdict(kind: &str) -> Verdict {
    let (score, details) = match kind {
        "nan" => (f64::NAN, None),
        "too_high" => (7.5, None),
        "negative" => (-0.5, None),
        "infinity" => (f64::INFINITY, None),
        "bad_details" => (1.0, Some(r#"{"unterminated": "#.to_owned())),
        _ => (1.0, None),
    };
    Verdict {
        status: Status::Pass,
        score,
        explanation: format!("malformed plugin, kind {kind}"),
        details,
    }
}

impl Guest for Malformed {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "malformed".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: malformed verdicts (NaN or out-of-range scores, non-JSON details, wrong result counts)."
                .to_owned(),
            config_schema: SCHEMA.to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        let kinds: Vec<String> = configs.iter().map(|c| kind(c)).collect();
        let mut out: Vec<Result<Verdict, PluginError>> = kinds.iter().map(|k| Ok(verdict(k))).collect();
        if kinds.iter().any(|k| k == "missing_result") {
            out.pop();
        }
        if kinds.iter().any(|k| k == "extra_result") {
            out.push(Ok(verdict("extra")));
        }
        out
    }
}

export!(Malformed);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let out = Malformed::evaluate(
            "{}".into(),
            vec![r#"{"kind":"nan"}"#.into(), r#"{"kind":"too_high"}"#.into(), "{}".into()],
        );
        assert_eq!(out.len(), 3);
        assert!(out[0].as_ref().unwrap().score.is_nan());
        assert_eq!(out[1].as_ref().unwrap().score, 7.5);
        assert_eq!(out[2].as_ref().unwrap().score, 1.0);
        let out = Malformed::evaluate("{}".into(), vec![r#"{"kind":"bad_details"}"#.into()]);
        assert!(serde_json::from_str::<serde_json::Value>(out[0].as_ref().unwrap().details.as_deref().unwrap()).is_err());
        assert_eq!(
            Malformed::evaluate("{}".into(), vec![r#"{"kind":"missing_result"}"#.into(), "{}".into()]).len(),
            1
        );
        assert_eq!(Malformed::evaluate("{}".into(), vec![r#"{"kind":"extra_result"}"#.into()]).len(), 2);
        assert_eq!(Malformed::describe().id, "malformed");
    }
}
