//! Hostile test plugin `big-memory`: a zeroed 256 MiB static, so the
//! component's linear memory starts at 256 MiB, four times the default
//! 64 MiB cap. It can never be instantiated under that cap; the engine must
//! refuse it at load time, before spending time compiling it.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0/attest-plugin.wit",
    world: "assertion-plugin",
});

struct BigMemory;

const BYTES: usize = 256 * 1024 * 1024;
static mut ARENA: [u8; BYTES] = [0; BYTES];

impl Guest for BigMemory {
    fn describe() -> PluginInfo {
        PluginInfo {
            id: "big-memory".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "Hostile test plugin: 256 MiB of initial memory.".to_owned(),
            config_schema: r#"{"type":"object"}"#.to_owned(),
        }
    }

    fn evaluate(_trace: String, configs: Vec<String>) -> Vec<Result<Verdict, PluginError>> {
        // Reading through a raw pointer keeps the array (and its memory) alive.
        let last = unsafe { std::ptr::read_volatile(std::ptr::addr_of!(ARENA).cast::<u8>().add(BYTES - 1)) };
        configs
            .iter()
            .map(|_| {
                Ok(Verdict {
                    status: attest::plugin::types::Status::Pass,
                    score: 1.0,
                    explanation: format!("big-memory read {last}"),
                    details: None,
                })
            })
            .collect()
    }
}

export!(BigMemory);
