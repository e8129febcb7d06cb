//! On-disk cache of compiled plugins.
//!
//! Compiling a component with Cranelift takes from tens of milliseconds (a
//! small Rust plugin) to seconds (a Python or JavaScript one). The compiled
//! artefact is stored under `<cache dir>/plugins/`, named by the SHA-256 of
//! the `.wasm` bytes and of the engine build (engine version plus wasmtime's
//! own compatibility hash), so a restart loads it in well under a millisecond.
//!
//! Only files this engine wrote are deserialised: names are content hashes,
//! files are written to a temporary name and renamed into place, and a file
//! wasmtime rejects (another engine build or configuration) is recompiled
//! and replaced.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Whether a load came from the cache; reported by `list_plugins` and `plugin check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Cache,
    Compiled,
}

pub struct ArtefactCache {
    dir: Option<PathBuf>,
}

impl ArtefactCache {
    /// `dir: None` disables the cache (every start compiles).
    pub fn new(dir: Option<PathBuf>) -> ArtefactCache {
        ArtefactCache { dir }
    }

    fn path_for(&self, engine: &Engine, wasm: &[u8]) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut h = Sha256::new();
        h.update(crate::ENGINE_VERSION.as_bytes());
        // wasmtime's own notion of "artefacts from this engine and configuration".
        let mut compat = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut compat);
        h.update(std::hash::Hasher::finish(&compat).to_le_bytes());
        h.update(wasm);
        let name: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Some(dir.join(format!("{name}.cwasm")))
    }

    /// Loads the compiled component for `wasm`, compiling and storing it on a miss.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> anyhow::Result<(Component, Source)> {
        let path = self.path_for(engine, wasm);
        if let Some(p) = path.as_deref().filter(|p| p.is_file()) {
            // SAFETY: the file is named by the hash of its input and engine, and
            // only this cache writes into the directory (see module docs).
            match unsafe { Component::deserialize_file(engine, p) } {
                Ok(c) => return Ok((c, Source::Cache)),
                Err(e) => tracing::warn!(path = %p.display(), error = %e, "ignoring a stale compiled plugin"),
            }
        }
        let compiled = engine.precompile_component(wasm)?;
        if let Some(p) = &path {
            if let Err(e) = store(p, &compiled) {
                tracing::warn!(path = %p.display(), error = %e, "cannot cache the compiled plugin");
            }
        }
        // SAFETY: the bytes were produced by this engine just now.
        let component = unsafe { Component::deserialize(engine, &compiled)? };
        Ok((component, Source::Compiled))
    }
}

fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
