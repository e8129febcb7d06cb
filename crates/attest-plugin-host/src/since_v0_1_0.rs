//! `attest:plugin@0.1.0`, frozen in `wit/since_v0.1.0/`: its bindings, its
//! imports on a linker, and how its plugins' answers are lifted (within the
//! sandbox's bounds) into the engine's types.
//!
//! A released contract version is never edited: a new version gets a
//! directory `wit/since_vX.Y.Z/` and a module `since_vX_Y_Z.rs` of its own.
//! Every module lifts its plugins' answers into the sandbox's own types
//! ([`super::sandbox::PluginInfo`], [`super::sandbox::Verdict`]); `evaluate`
//! has kept its shape since 0.1.0, so its results are lifted in one place
//! ([`super::sandbox`]).

use super::sandbox::{BoundedText, Fault, Info, LogLevel, State, MAX_INFO_BYTES, MAX_SCHEMA_BYTES};
use wasmtime::component::{ComponentExportIndex, ComponentType, HasSelf, Instance, InstancePre, Lift, Linker};
use wasmtime::Store;

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    world: "assertion-plugin",
});

/// The contract version this module was frozen at.
pub const MIN_VERSION: (u64, u64, u64) = (0, 1, 0);

/// Links this version's imports (`host.log`).
pub fn add_to_linker(linker: &mut Linker<State>) -> anyhow::Result<()> {
    AssertionPlugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    super::sandbox::link_log(linker, "attest:plugin/host@0.1.0", log_level)
}

/// Checks that a linked component exports this world's functions with this
/// world's types.
pub fn check_exports(pre: &InstancePre<State>) -> anyhow::Result<()> {
    AssertionPluginPre::new(pre.clone())?;
    Ok(())
}

impl attest::plugin::host::Host for State {
    // Linked by hand instead (`sandbox::link_log`), to cut long lines while they are copied.
    fn log(&mut self, level: attest::plugin::host::LogLevel, message: String) {
        self.write_log(log_level(level), &message);
    }
}

fn log_level(level: attest::plugin::host::LogLevel) -> LogLevel {
    use attest::plugin::host::LogLevel as Level;
    match level {
        Level::Debug => LogLevel::Debug,
        Level::Info => LogLevel::Info,
        Level::Warn => LogLevel::Warn,
        Level::Error => LogLevel::Error,
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

/// Calls `describe`.
pub fn describe(store: &mut Store<State>, instance: &Instance, export: &ComponentExportIndex) -> wasmtime::Result<Result<Info, Fault>> {
    let func = instance.get_typed_func::<(), (RawInfo,)>(&mut *store, export)?;
    let (raw,) = func.call(&mut *store, ())?;
    Ok(Info::bounded(raw.id, raw.version, raw.description, raw.config_schema))
}

#[cfg(test)]
pub(crate) mod tests {
    use sha2::{Digest, Sha256};

    /// Checks that `wit/<dir>/` holds exactly `frozen` (file names and
    /// SHA-256 sums). Plugins built against a released version depend on
    /// these bytes: the lists never change.
    pub(crate) fn assert_frozen(dir: &str, frozen: &[(&str, &str)]) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit").join(dir);
        let mut files: Vec<(String, String)> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|e| {
                let path = e.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let sum: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                (path.file_name().unwrap().to_string_lossy().into_owned(), sum)
            })
            .collect();
        files.sort();
        let frozen: Vec<(String, String)> = frozen.iter().map(|(f, s)| (f.to_string(), s.to_string())).collect();
        assert_eq!(
            files, frozen,
            "wit/{dir} is a released contract and must not change: add a new version directory and module instead (docs/plugins.md)"
        );
    }

    #[test]
    fn the_released_contract_is_unchanged() {
        assert_frozen(
            "since_v0.1.0",
            &[(
                "attest-plugin.wit",
                "3f8d174695fcbafde63bdf85344b42907e82094a1a7059fe74fd31feb30ff04d",
            )],
        );
    }
}
