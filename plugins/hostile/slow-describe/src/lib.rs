//! Hostile test plugin `slow-describe`: `describe` loops forever, so loading
//! it takes its whole deadline and then fails. Several of these must not
//! delay the engine's start by one deadline each.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

struct SlowDescribe;

impl Guest for SlowDescribe {
    fn describe() -> PluginInfo {
        // black_box keeps the optimizer from reasoning about the loop.
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        configs
            .iter()
            .map(|_| Err(PluginError::Internal("never loaded".to_owned())))
            .collect()
    }
}

export!(SlowDescribe);
