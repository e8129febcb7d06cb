//! On-disk cache of compiled plugins.
//!
//! Compiling a component with Cranelift takes from tens of milliseconds (a
//! small Rust plugin) to seconds (a Python or JavaScript one). The compiled
//! artefact is stored under `<cache dir>/plugins/`, named by the SHA-256 of
//! the `.wasm` bytes and of the engine build (engine version plus wasmtime's
//! own compatibility hash), so a restart loads it in well under a millisecond.
//!
//! Deserialising compiled code means running it, so a cached file is only
//! used when it is exactly what this engine wrote: names are content hashes,
//! files are written to a temporary name and renamed into place, and every
//! file ends with the SHA-256 of the artefact before it. A file whose
//! checksum does not match (a bad disk, a partial copy) or that wasmtime
//! rejects (another engine build or configuration) is recompiled and replaced.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Bytes of the SHA-256 trailer after each stored artefact.
const CHECKSUM_BYTES: usize = 32;

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
            match std::fs::read(p) {
                Ok(file) => match verified(&file) {
                    // SAFETY: the bytes are, checksum-verified, what this cache
                    // stored for this input and engine build (see module docs).
                    Some(artefact) => match unsafe { Component::deserialize(engine, artefact) } {
                        Ok(c) => return Ok((c, Source::Cache)),
                        Err(e) => tracing::warn!(path = %p.display(), reason = %e, "ignoring a cached compiled plugin; recompiling"),
                    },
                    None => {
                        tracing::warn!(path = %p.display(), reason = "checksum mismatch: the file is damaged", "ignoring a cached compiled plugin; recompiling")
                    }
                },
                Err(e) => tracing::warn!(path = %p.display(), reason = %e, "ignoring a cached compiled plugin; recompiling"),
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

/// The artefact in a stored file, if its checksum trailer matches.
fn verified(file: &[u8]) -> Option<&[u8]> {
    let (artefact, sum) = file.split_at_checked(file.len().checked_sub(CHECKSUM_BYTES)?)?;
    (Sha256::digest(artefact).as_slice() == sum).then_some(artefact)
}

fn store(path: &Path, artefact: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = Vec::with_capacity(artefact.len() + CHECKSUM_BYTES);
    file.extend_from_slice(artefact);
    file.extend_from_slice(&Sha256::digest(artefact));
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &file)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_with_a_matching_checksum_are_used() {
        let artefact = b"compiled code".as_slice();
        let mut file = artefact.to_vec();
        file.extend_from_slice(&Sha256::digest(artefact));
        assert_eq!(verified(&file), Some(artefact));
        let mut flipped = file.clone();
        flipped[3] ^= 1;
        assert_eq!(verified(&flipped), None);
        assert_eq!(verified(&file[..file.len() - 1]), None);
        assert_eq!(verified(&[0; 5]), None);
    }
}
