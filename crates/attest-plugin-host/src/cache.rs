//! On-disk cache of compiled plugins.
//!
//! Compiling a component with Cranelift takes from tens of milliseconds (a
//! small Rust plugin) to seconds (a Python or JavaScript one). The compiled
//! artefact is stored under `<cache dir>/plugins/`, named by a hash of the
//! `.wasm` bytes and of the engine build (engine version plus wasmtime's own
//! compatibility hash), so a restart loads it in well under a millisecond.
//!
//! Deserialising compiled code means running it, so a cached file is only
//! used when it is exactly what this engine wrote for this component: names
//! are content hashes, files are written to a temporary name and renamed
//! into place, and every file ends with a checksum over the component's own
//! hash and the artefact before it. A file whose trailer does not match (a
//! bad disk, a partial copy, or another plugin's entry copied over this one)
//! or that wasmtime rejects (another engine build or configuration) is
//! recompiled and replaced.
//!
//! The hashes are XXH3-128: they guard against accidents, not attackers, and
//! they sit on every engine start, where hashing an 18 MB Python component
//! and its larger artefact with SHA-256 took most of the start-up. Whoever
//! can write the cache directory can write native code the engine will run,
//! so the directory must be trusted like the engine binary itself
//! (docs/plugins.md, "The compiled cache"); a cryptographic hash would not
//! change that. Stored artefacts are read through a memory map, so a start
//! neither copies them nor zeroes fresh pages for them.
//!
//! Beside each artefact, `<name>.describe.json` keeps what the plugin's
//! `describe()` answered. `describe()` is a pure function of the component
//! (a plugin has no clock, no files and no environment), and calling it
//! means instantiating the plugin. A record names the component hash it
//! was made for and the limits `describe()` ran under (a plugin that
//! describes itself within generous limits may not within tighter ones);
//! one that does not match both, or does not parse, is ignored and
//! rewritten. Failed `describe()` calls are never recorded, so a broken
//! plugin is described (and reported) on every start.
//!
//! Every rebuild of a plugin and every engine upgrade adds an entry, so the
//! cache keeps at most [`MAX_ENTRIES`] artefacts and [`MAX_BYTES`] of them:
//! after storing one, the oldest others are removed, with their records.

use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

/// Bytes of the checksum trailer after each stored artefact.
const CHECKSUM_BYTES: usize = 16;
/// Names the trailer's layout, so entries of an older layout never verify.
const TRAILER_DOMAIN: &[u8] = b"attest-engine compiled plugin v3\0";

/// Most compiled artefacts the cache keeps.
pub const MAX_ENTRIES: usize = 256;
/// Most bytes of compiled artefacts the cache keeps (a Python or
/// JavaScript plugin's artefact is tens of MB).
pub const MAX_BYTES: u64 = 4 << 30;

/// A component's identity in the cache: the hash of its bytes.
type SourceHash = [u8; 16];

/// Whether a load came from the cache; reported by `list_plugins` and `plugin check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Cache,
    Compiled,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cache => "cache",
            Source::Compiled => "compiled",
        })
    }
}

#[derive(Debug, Clone)]
pub struct ArtefactCache {
    dir: Option<PathBuf>,
    /// Use what is stored, store nothing (`plugin check`, `plugin test`:
    /// inspecting a plugin must not change the engine's cache).
    read_only: bool,
    /// A person waits at a terminal (`plugin check`, `plugin test`): a
    /// compile is said on stderr, prefixed with the command, whatever the
    /// log level, with how long it took.
    progress: Option<&'static str>,
}

/// A loaded component, where it came from, and its place in the cache.
pub struct Loaded {
    pub component: Component,
    pub source: Source,
    /// The hash of the component's bytes ([`source_hash`]).
    pub hash: String,
    /// Its cache entry (`None` with the cache off).
    pub entry: Option<Entry>,
}

/// A component's cache entry: the artefact's path and the component's hash.
pub struct Entry {
    path: PathBuf,
    hash: SourceHash,
    read_only: bool,
}

/// What a plugin's `describe()` answered, as the cache keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Described {
    pub id: String,
    pub version: String,
    pub description: String,
    pub config_schema: String,
    /// Requested capabilities. A record without them (made before plugins
    /// could request any) is not sound, and the plugin is described again.
    pub capabilities: Vec<crate::capabilities::Capability>,
}

impl Described {
    /// Within what a fresh `describe()` could have answered: a record is
    /// never trusted beyond that.
    fn fits(&self) -> bool {
        self.config_schema.len() <= crate::sandbox::MAX_SCHEMA_BYTES
            && [&self.id, &self.version, &self.description]
                .iter()
                .all(|s| s.chars().count() <= crate::sandbox::MAX_INFO_CHARS)
    }
}

/// Largest record file read: a description at its bounds, and room for the rest.
const MAX_RECORD_BYTES: u64 = crate::sandbox::MAX_SCHEMA_BYTES as u64 + 16 * 1024;

/// A JSON record, read no further than [`MAX_RECORD_BYTES`].
fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&attest_io::read_capped(path, MAX_RECORD_BYTES).ok()?).ok()
}

/// Writes a record under a temporary name and renames it into place.
fn write_record<T: serde::Serialize>(path: &Path, record: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The record on disk: a description, the component it describes, and the
/// limits `describe()` ran under (as the plugin's limits serialise).
#[derive(serde::Serialize, serde::Deserialize)]
struct DescribeRecord {
    component: String,
    limits: String,
    #[serde(flatten)]
    described: Described,
}

impl Entry {
    fn describe_path(&self) -> PathBuf {
        self.path.with_extension("describe.json")
    }

    /// The recorded description of this component under `limits`, if
    /// there is a sound one.
    pub fn described(&self, limits: &str) -> Option<Described> {
        let record: DescribeRecord = read_record(&self.describe_path())?;
        (record.described.fits() && record.component == hex(&self.hash) && record.limits == limits).then_some(record.described)
    }

    /// Records what `describe()` answered under `limits`, for the next start.
    pub fn remember(&self, described: &Described, limits: &str) {
        if self.read_only {
            return;
        }
        let record = DescribeRecord {
            component: hex(&self.hash),
            limits: limits.to_owned(),
            described: described.clone(),
        };
        let path = self.describe_path();
        if let Err(e) = write_record(&path, &record) {
            tracing::warn!(path = %path.display(), error = %e, "cannot cache the plugin's description");
        }
    }
}

/// What a start needs to know of a plugin file it has loaded before, without
/// reading it: the file as it was (length, times, inode), the limits and the
/// engine version it was loaded under, the hash of its bytes, and what it
/// described itself as.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Indexed {
    pub path: PathBuf,
    stamp: FileStamp,
    limits: String,
    engine: String,
    /// The hash of the component's bytes, checked when it is loaded.
    pub source: String,
    pub api_version: String,
    pub described: Described,
}

/// A file's identity as `stat` gives it; any write changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
}

impl FileStamp {
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            ino: meta.ino(),
        }
    }
}

/// The hash of a component's bytes, as [`Indexed::source`] holds it.
pub fn source_hash(wasm: &[u8]) -> String {
    hex(&xxh3_128(wasm).to_le_bytes())
}

fn hex(hash: &SourceHash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

impl ArtefactCache {
    /// A cache that uses what is stored in `dir` and stores nothing.
    pub fn read_only(dir: Option<PathBuf>) -> ArtefactCache {
        ArtefactCache {
            dir: usable(dir),
            read_only: true,
            progress: None,
        }
    }

    /// This cache, saying each compile on stderr as `prefix: compiling …`.
    pub fn with_progress(self, prefix: &'static str) -> ArtefactCache {
        ArtefactCache {
            progress: Some(prefix),
            ..self
        }
    }

    fn index_path(&self, plugin: &Path) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let key = xxh3_128(plugin.as_os_str().as_encoded_bytes());
        Some(dir.join("index").join(format!("{key:032x}.json")))
    }

    /// What the start-up index holds for `plugin`, when the file is still the
    /// one it was made for and the limits and engine version match. A
    /// read-only cache (`plugin check`, `plugin test`) never uses the index:
    /// inspecting a plugin loads it in full.
    pub fn indexed(&self, plugin: &Path, meta: &std::fs::Metadata, limits: &str) -> Option<Indexed> {
        if self.read_only {
            return None;
        }
        let record: Indexed = read_record(&self.index_path(plugin)?)?;
        let current = record.path == plugin
            && record.stamp == FileStamp::of(meta)
            && record.limits == limits
            && record.engine == env!("CARGO_PKG_VERSION")
            && record.described.fits();
        current.then_some(record)
    }

    /// Drops `plugin`'s index record (it no longer matches the file), so the
    /// next start loads the plugin in full.
    pub fn forget(&self, plugin: &Path) {
        if let Some(path) = self.index_path(plugin).filter(|_| !self.read_only) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Records a plugin that loaded in full, for the next start's index.
    pub fn index(&self, plugin: &Path, meta: &std::fs::Metadata, limits: &str, source: String, api_version: &str, described: &Described) {
        let Some(path) = self.index_path(plugin).filter(|_| !self.read_only) else {
            return;
        };
        let record = Indexed {
            path: plugin.to_owned(),
            stamp: FileStamp::of(meta),
            limits: limits.to_owned(),
            engine: env!("CARGO_PKG_VERSION").to_owned(),
            source,
            api_version: api_version.to_owned(),
            described: described.clone(),
        };
        if let Err(e) = write_record(&path, &record) {
            tracing::warn!(path = %path.display(), error = %e, "cannot index the plugin for the next start");
        }
    }

    /// `dir: None` disables the cache (every start compiles).
    pub fn new(dir: Option<PathBuf>) -> ArtefactCache {
        ArtefactCache {
            dir: usable(dir),
            read_only: false,
            progress: None,
        }
    }

    fn path_for(&self, engine: &Engine, source: &SourceHash) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut h = Xxh3::new();
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.update(&[0]);
        // wasmtime's own notion of "artefacts from this engine and configuration".
        let mut compat = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut compat);
        h.update(&std::hash::Hasher::finish(&compat).to_le_bytes());
        h.update(source);
        Some(dir.join(format!("{:032x}.cwasm", h.digest128())))
    }

    /// Loads the compiled component for `wasm`, compiling and storing it on a miss.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> anyhow::Result<Loaded> {
        let source: SourceHash = xxh3_128(wasm).to_le_bytes();
        let path = self.path_for(engine, &source);
        let (component, from) = self.load_at(engine, wasm, &source, path.as_deref())?;
        Ok(Loaded {
            component,
            source: from,
            hash: hex(&source),
            entry: path.map(|path| Entry {
                path,
                hash: source,
                read_only: self.read_only,
            }),
        })
    }

    fn load_at(&self, engine: &Engine, wasm: &[u8], source: &SourceHash, path: Option<&Path>) -> anyhow::Result<(Component, Source)> {
        if let Some(p) = path {
            match map(p) {
                // wasmtime maps the file itself (its trailer is past the
                // artefact's end), so loading copies nothing.
                Ok(Some(file)) => match verified(&file, source) {
                    // SAFETY: the file is, checksum-verified, what this cache
                    // stored for this input and engine build, and entries are
                    // never modified in place (see module docs).
                    Some(_) => match unsafe { Component::deserialize_file(engine, p) } {
                        Ok(c) => return Ok((c, Source::Cache)),
                        Err(e) => tracing::warn!(path = %p.display(), reason = %e, "ignoring a cached compiled plugin; recompiling"),
                    },
                    None => {
                        tracing::warn!(path = %p.display(), reason = "checksum mismatch: the file is damaged or was not compiled from this component", "ignoring a cached compiled plugin; recompiling")
                    }
                },
                Ok(None) => {}
                Err(e) => tracing::warn!(path = %p.display(), reason = %e, "ignoring a cached compiled plugin; recompiling"),
            }
        }
        // Say so before the wait: a large component compiles for tens of seconds.
        let kept = path.filter(|_| !self.read_only);
        tracing::info!(
            bytes = wasm.len(),
            "compiling a plugin (first load: well under a second for a small Rust plugin, tens of seconds for a Python or JavaScript one){}",
            if kept.is_some() { "; the result is cached" } else { "" }
        );
        let started = std::time::Instant::now();
        if let Some(prefix) = self.progress {
            eprintln!(
                "{prefix}: compiling the plugin ({:.1} MB) for this machine: under a second for a small Rust plugin, 10-20 s for a Python or JavaScript one{}",
                wasm.len() as f64 / 1e6,
                if kept.is_some() { "; later runs use the compiled copy" } else { "" }
            );
        }
        let compiled = engine.precompile_component(wasm)?;
        if let Some(prefix) = self.progress {
            eprintln!("{prefix}: compiled in {:.1} s", started.elapsed().as_secs_f64());
        }
        if let Some(p) = kept {
            match store(p, &compiled, source) {
                Ok(()) => prune(p, MAX_ENTRIES, MAX_BYTES),
                Err(e) => tracing::warn!(path = %p.display(), error = %e, "cannot cache the compiled plugin"),
            }
        }
        // SAFETY: the bytes were produced by this engine just now.
        let component = unsafe { Component::deserialize(engine, &compiled)? };
        Ok((component, Source::Compiled))
    }
}

/// `dir`, unless it can never hold a cache because it, or the nearest of
/// its parents that exists, is a file. That is said once here; otherwise
/// every plugin's every read and write would warn on its own.
fn usable(dir: Option<PathBuf>) -> Option<PathBuf> {
    let d = dir?;
    let blocker = d.ancestors().find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m.is_dir())));
    match blocker {
        Some((file, false)) => {
            tracing::warn!(
                dir = %d.display(),
                file = %file.display(),
                "the compiled-plugin cache is off: its directory's path runs through a file; plugins compile on every start. Point ATTEST_CACHE_DIR (or cache_dir in the config file) at a directory"
            );
            None
        }
        _ => Some(d),
    }
}

/// A stored entry, mapped read-only (`None` when there is none).
fn map(path: &Path) -> std::io::Result<Option<memmap2::Mmap>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: entries are written under a temporary name and renamed into
    // place, never modified in place, and the directory is trusted like the
    // engine binary (see module docs): the mapping does not change under us.
    unsafe { memmap2::Mmap::map(&file) }.map(Some)
}

/// The trailer of an entry: a hash over the layout name, the hash of the
/// component it was compiled from, and the artefact.
fn trailer(artefact: &[u8], source: &SourceHash) -> [u8; CHECKSUM_BYTES] {
    let mut h = Xxh3::new();
    h.update(TRAILER_DOMAIN);
    h.update(source);
    h.update(artefact);
    h.digest128().to_le_bytes()
}

/// The artefact in a stored file, if its trailer matches the component
/// (by its hash, `source`) this load is for.
fn verified<'a>(file: &'a [u8], source: &SourceHash) -> Option<&'a [u8]> {
    let (artefact, sum) = file.split_at_checked(file.len().checked_sub(CHECKSUM_BYTES)?)?;
    (trailer(artefact, source).as_slice() == sum).then_some(artefact)
}

/// Removes the oldest artefacts (and their records) beside `kept`, the one
/// just stored, until at most `max_entries` and `max_bytes` of them remain.
/// Another process may still map a removed file; on Unix it stays readable
/// until unmapped.
fn prune(kept: &Path, max_entries: usize, max_bytes: u64) {
    let Some(dir) = kept.parent() else { return };
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = listing
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let (mut count, mut bytes) = (entries.len(), entries.iter().map(|e| e.1).sum::<u64>());
    if count <= max_entries && bytes <= max_bytes {
        return;
    }
    entries.sort();
    for (_, len, path) in entries {
        if count <= max_entries && bytes <= max_bytes {
            break;
        }
        if path == kept {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                let _ = std::fs::remove_file(path.with_extension("describe.json"));
                (count, bytes) = (count - 1, bytes - len);
                tracing::info!(path = %path.display(), "removed an old compiled plugin from the cache");
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove an old compiled plugin"),
        }
    }
}

fn store(path: &Path, artefact: &[u8], source: &SourceHash) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = Vec::with_capacity(artefact.len() + CHECKSUM_BYTES);
    file.extend_from_slice(artefact);
    file.extend_from_slice(&trailer(artefact, source));
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &file)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_directory_behind_a_file_turns_the_cache_off() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache");
        std::fs::write(&file, "not a directory").unwrap();
        assert_eq!(ArtefactCache::new(Some(file.join("plugins"))).dir, None);
        assert_eq!(ArtefactCache::read_only(Some(file.clone())).dir, None);
        // Not there yet, or a directory: used (stores create it).
        let fresh = dir.path().join("new/plugins");
        assert_eq!(ArtefactCache::new(Some(fresh.clone())).dir, Some(fresh));
        assert_eq!(ArtefactCache::new(Some(dir.path().to_owned())).dir, Some(dir.path().to_owned()));
    }

    #[test]
    fn the_oldest_entries_go_first_past_either_bound() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now();
        let entry = |i: u64, len: usize| {
            let path = dir.path().join(format!("{i:032x}.cwasm"));
            std::fs::write(&path, vec![0u8; len]).unwrap();
            std::fs::write(path.with_extension("describe.json"), "{}").unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(now - std::time::Duration::from_secs(1000 - i)).unwrap();
            path
        };
        let paths: Vec<PathBuf> = (0..6).map(|i| entry(i, 100)).collect();
        std::fs::write(dir.path().join("other.txt"), "not an entry").unwrap();
        // By count: the two oldest go, with their records.
        prune(&paths[5], 4, u64::MAX);
        let left = |p: &PathBuf| p.exists();
        assert_eq!(paths.iter().map(left).collect::<Vec<_>>(), [false, false, true, true, true, true]);
        assert!(!paths[0].with_extension("describe.json").exists());
        assert!(dir.path().join("other.txt").exists());
        // By bytes; the entry just stored stays even when it is the oldest.
        prune(&paths[2], usize::MAX, 250);
        assert_eq!(paths.iter().map(left).collect::<Vec<_>>(), [false, false, true, false, false, true]);
    }

    #[test]
    fn only_files_with_a_matching_trailer_are_used() {
        let artefact = b"compiled code".as_slice();
        let source: SourceHash = xxh3_128(b"component").to_le_bytes();
        let mut file = artefact.to_vec();
        file.extend_from_slice(&trailer(artefact, &source));
        assert_eq!(verified(&file, &source), Some(artefact));
        let mut flipped = file.clone();
        flipped[3] ^= 1;
        assert_eq!(verified(&flipped, &source), None);
        assert_eq!(verified(&file[..file.len() - 1], &source), None);
        assert_eq!(verified(&[0; 5], &source), None);
    }

    #[test]
    fn a_description_is_used_only_for_the_component_it_was_recorded_for() {
        let dir = std::env::temp_dir().join(format!("attest-describe-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let entry = |component: &[u8]| Entry {
            path: dir.join("entry.cwasm"),
            hash: xxh3_128(component).to_le_bytes(),
            read_only: false,
        };
        let d = Described {
            id: "pii-leak".into(),
            version: "1.0.0".into(),
            description: "finds PII".into(),
            config_schema: r#"{"type":"object"}"#.into(),
            capabilities: vec![crate::capabilities::Capability::Judge],
        };
        assert_eq!(entry(b"component").described("l"), None);
        entry(b"component").remember(&d, "l");
        assert_eq!(entry(b"component").described("l"), Some(d.clone()));
        assert_eq!(entry(b"component").described("tighter"), None, "described under other limits");
        assert_eq!(entry(b"another component").described("l"), None, "another component's record");
        std::fs::write(entry(b"component").describe_path(), b"{damaged").unwrap();
        assert_eq!(entry(b"component").described("l"), None, "a damaged record");
        let oversized = Described {
            description: "x".repeat(crate::sandbox::MAX_INFO_CHARS + 1),
            ..d
        };
        entry(b"component").remember(&oversized, "l");
        assert_eq!(entry(b"component").described("l"), None, "a record beyond describe()'s bounds");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_index_holds_only_for_the_same_file_limits_and_engine() {
        let dir = std::env::temp_dir().join(format!("attest-index-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plugin = dir.join("p.wasm");
        std::fs::write(&plugin, b"component").unwrap();
        let cache = ArtefactCache::new(Some(dir.join("cache")));
        let d = Described {
            id: "p".into(),
            version: "1.0.0".into(),
            description: "d".into(),
            config_schema: "{}".into(),
            capabilities: vec![],
        };
        let meta = || std::fs::metadata(&plugin).unwrap();
        assert_eq!(cache.indexed(&plugin, &meta(), "l"), None);
        cache.index(&plugin, &meta(), "l", source_hash(b"component"), "0.2.0", &d);
        let hit = cache.indexed(&plugin, &meta(), "l").unwrap();
        assert_eq!(
            (hit.described, hit.source.as_str()),
            (d.clone(), source_hash(b"component").as_str())
        );
        assert_eq!(cache.indexed(&plugin, &meta(), "other limits"), None);
        assert_eq!(
            ArtefactCache::read_only(Some(dir.join("cache"))).indexed(&plugin, &meta(), "l"),
            None
        );
        // Any write to the file changes its stamp.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&plugin, b"component").unwrap();
        assert_eq!(cache.indexed(&plugin, &meta(), "l"), None);
        cache.index(&plugin, &meta(), "l", source_hash(b"component"), "0.2.0", &d);
        cache.forget(&plugin);
        assert_eq!(cache.indexed(&plugin, &meta(), "l"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_compiled_from_another_component_is_not_used() {
        let artefact = b"compiled code".as_slice();
        let other: SourceHash = xxh3_128(b"another component").to_le_bytes();
        let mut file = artefact.to_vec();
        file.extend_from_slice(&trailer(artefact, &other));
        let source: SourceHash = xxh3_128(b"component").to_le_bytes();
        assert_eq!(verified(&file, &source), None);
        // A plain checksum of the artefact does not verify either.
        let mut plain = artefact.to_vec();
        plain.extend_from_slice(&xxh3_128(artefact).to_le_bytes());
        assert_eq!(verified(&plain, &source), None);
    }
}
