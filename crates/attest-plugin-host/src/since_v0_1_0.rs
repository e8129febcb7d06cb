//! `attest:plugin@0.1.0`, frozen in `wit/since_v0.1.0/`: its bindings, its
//! imports on a linker, and how its plugins' answers are lifted (within the
//! sandbox's bounds) into the engine's types.
//!
//! A released contract version is never edited: a new version gets a
//! directory `wit/since_vX.Y.Z/` and a module `since_vX_Y_Z.rs` of its own,
//! and becomes [`super::sandbox::latest`]; older modules then convert their
//! answers into its types.

use super::sandbox::{
    BoundedText, CountedList, Fault, LogLevel, State, EXPECTED_RESULTS, MAX_DETAILS_BYTES, MAX_INFO_BYTES, MAX_INFO_CHARS,
    MAX_SCHEMA_BYTES, MAX_VERDICT_TEXT_BYTES, MAX_VERDICT_TEXT_CHARS,
};
use wasmtime::component::{ComponentExportIndex, ComponentType, HasSelf, Instance, InstancePre, Lift, Linker};
use wasmtime::Store;

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    world: "assertion-plugin",
});

// The world `use`s these types, so the bindings re-export them at the root.
pub use attest::plugin::types::Status;

/// The contract version this module was frozen at.
pub const MIN_VERSION: (u64, u64, u64) = (0, 1, 0);

/// Links this version's imports (`host.log`).
pub fn add_to_linker(linker: &mut Linker<State>) -> anyhow::Result<()> {
    AssertionPlugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    Ok(())
}

/// Checks that a linked component exports this world's functions with this
/// world's types.
pub fn check_exports(pre: &InstancePre<State>) -> anyhow::Result<()> {
    AssertionPluginPre::new(pre.clone())?;
    Ok(())
}

impl attest::plugin::host::Host for State {
    fn log(&mut self, level: attest::plugin::host::LogLevel, message: String) {
        use attest::plugin::host::LogLevel as Level;
        let level = match level {
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
        };
        self.write_log(level, &message);
    }
}

impl attest::plugin::types::Host for State {}

/// `plugin-info`, copied within bounds.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawInfo {
    id: BoundedText<MAX_INFO_BYTES>,
    version: BoundedText<MAX_INFO_BYTES>,
    description: BoundedText<MAX_INFO_BYTES>,
    #[component(name = "config-schema")]
    config_schema: BoundedText<MAX_SCHEMA_BYTES>,
}

/// `verdict`, copied within bounds.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawVerdict {
    status: Status,
    score: f64,
    explanation: BoundedText<MAX_VERDICT_TEXT_BYTES>,
    details: Option<BoundedText<MAX_DETAILS_BYTES>>,
}

/// `plugin-error`, copied within bounds.
#[derive(ComponentType, Lift)]
#[component(variant)]
enum RawError {
    #[component(name = "invalid-config")]
    InvalidConfig(BoundedText<MAX_VERDICT_TEXT_BYTES>),
    #[component(name = "unsupported-trace")]
    UnsupportedTrace(BoundedText<MAX_VERDICT_TEXT_BYTES>),
    #[component(name = "internal")]
    Internal(BoundedText<MAX_VERDICT_TEXT_BYTES>),
}

/// Calls `describe`.
pub fn describe(
    store: &mut Store<State>,
    instance: &Instance,
    export: &ComponentExportIndex,
) -> wasmtime::Result<Result<PluginInfo, Fault>> {
    let func = instance.get_typed_func::<(), (RawInfo,)>(&mut *store, export)?;
    let (raw,) = func.call(&mut *store, ())?;
    if raw.config_schema.len > MAX_SCHEMA_BYTES {
        return Ok(Err(Fault::TooLarge(format!(
            "declares a config schema of {} bytes; the limit is {MAX_SCHEMA_BYTES} bytes ({} KiB): describe the config more compactly",
            raw.config_schema.len,
            MAX_SCHEMA_BYTES / 1024
        ))));
    }
    Ok(Ok(PluginInfo {
        config_schema: raw.config_schema.text,
        id: crate::text::clip(&raw.id.text, MAX_INFO_CHARS),
        version: crate::text::clip(&raw.version.text, MAX_INFO_CHARS),
        description: crate::text::clip(&raw.description.text, MAX_INFO_CHARS),
    }))
}

/// Calls `evaluate`; `None` results means the plugin answered with the
/// wrong number of them (given), and none was copied.
pub fn evaluate(
    store: &mut Store<State>,
    instance: &Instance,
    export: &ComponentExportIndex,
    trace: &str,
    configs: &[String],
) -> wasmtime::Result<Result<Vec<Result<Verdict, PluginError>>, usize>> {
    type Results = CountedList<Result<RawVerdict, RawError>>;
    let func = instance.get_typed_func::<(&str, &[String]), (Results,)>(&mut *store, export)?;
    EXPECTED_RESULTS.with(|e| e.set(configs.len()));
    let (list,) = func.call(&mut *store, (trace, configs))?;
    let items = match list {
        CountedList::Items(items) => items,
        CountedList::WrongCount(n) => return Ok(Err(n)),
    };
    let text = |t: BoundedText<MAX_VERDICT_TEXT_BYTES>| crate::text::clip(&t.text, MAX_VERDICT_TEXT_CHARS);
    Ok(Ok(items
        .into_iter()
        .map(|item| match item {
            Ok(v) => Ok(Verdict {
                status: v.status,
                score: v.score,
                explanation: text(v.explanation),
                details: v.details.map(|d| {
                    if d.len > MAX_DETAILS_BYTES {
                        serde_json::json!({"omitted": format!("details were {} bytes; the limit is {MAX_DETAILS_BYTES}", d.len)})
                            .to_string()
                    } else {
                        d.text
                    }
                }),
            }),
            Err(RawError::InvalidConfig(m)) => Err(PluginError::InvalidConfig(text(m))),
            Err(RawError::UnsupportedTrace(m)) => Err(PluginError::UnsupportedTrace(text(m))),
            Err(RawError::Internal(m)) => Err(PluginError::Internal(text(m))),
        })
        .collect()))
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    /// Every file of `wit/since_v0.1.0/` and its SHA-256. Plugins built
    /// against 0.1.0 depend on these bytes: this list never changes.
    const FROZEN: &[(&str, &str)] = &[(
        "attest-plugin.wit",
        "3f8d174695fcbafde63bdf85344b42907e82094a1a7059fe74fd31feb30ff04d",
    )];

    #[test]
    fn the_released_contract_is_unchanged() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit/since_v0.1.0");
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                let path = e.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let sum: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                (path.file_name().unwrap().to_string_lossy().into_owned(), sum)
            })
            .collect();
        files.sort();
        let frozen: Vec<(String, String)> = FROZEN.iter().map(|(f, s)| (f.to_string(), s.to_string())).collect();
        assert_eq!(
            files, frozen,
            "wit/since_v0.1.0 is a released contract and must not change: add a new version directory and module instead (docs/plugins.md)"
        );
    }
}
