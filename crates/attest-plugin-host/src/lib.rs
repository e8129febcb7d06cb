//! The plugin host: WebAssembly assertion plugins (layer 8) loaded at
//! start-up, validated, precompiled (with an on-disk cache) and run in the
//! [`sandbox`].
//!
//! A plugin that cannot be loaded is reported (in the log, in `list_plugins`
//! and by `attest-engine plugin check`) and skipped; it never stops the
//! engine, except when plugins named one by one (`--plugin`, `[[plugins]]`)
//! claim the same id. Loading happens in parallel (see [`LOAD_THREADS`]).
//!
//! Before anything is compiled, [`preflight`] reads the component's sections
//! and refuses what could never run or would cost too much to compile.

pub mod cache;
pub mod capabilities;
pub mod check;
pub mod config;
pub mod sandbox;
pub mod since_v0_1_0;
pub mod since_v0_2_0;
mod stderr_tail;

/// The target/field grammar plugin configs use.
use attest_trace::target;
/// Bounded quoting for messages.
use attest_trace::text;

use attest_core::backends::AssertionPlugin;
pub use attest_core::backends::{PluginAnswer, PluginCall};
use cache::{ArtefactCache, Source};
use capabilities::{CallContext, CallRecord, Capability, Grants, Models};
use sandbox::{Answer, ApiVersion, PluginError, Prepared, Sandbox, Status, SUPPORTED_API_VERSIONS};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one plugin call may use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginLimits {
    /// Fuel per call (roughly one unit per wasm instruction), when the
    /// plugin is metered; otherwise the `timeout` alone bounds its CPU use.
    pub fuel: Option<u64>,
    /// Linear memory cap per instance.
    pub memory_bytes: usize,
    /// Wall-clock cap per call.
    #[serde(serialize_with = "as_millis", rename = "timeout_ms")]
    pub timeout: Duration,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            fuel: None,
            memory_bytes: 64 * 1024 * 1024,
            timeout: Duration::from_secs(2),
        }
    }
}

/// What every component file starts with: the `\0asm` magic, then
/// version 0x0d and layer 1 (a core module has version 1 and layer 0).
const COMPONENT_HEADER: [u8; 8] = [0, b'a', b's', b'm', 0x0d, 0, 0x01, 0];

/// Largest component file loaded.
pub const MAX_COMPONENT_BYTES: usize = 64 * 1024 * 1024;
/// Most functions (over all its core modules) a component may define:
/// compile time and memory grow with it.
pub const MAX_FUNCTIONS: u32 = 50_000;
/// Threads loading plugins at once. Compiling uses every core anyway; the
/// extra threads are for `describe` calls, which may each take up to their
/// deadline, so slow ones wait side by side rather than one after another.
pub const LOAD_THREADS: usize = 16;
/// Bytes of config schemas one `list_plugins` answer carries in all; a
/// schema that does not fit is replaced by a note (see [`PluginHost::listing`]).
pub const LISTED_SCHEMA_BYTES: usize = 16 * 1024;

/// Requests that may block (those that call plugins) running at once, for a
/// server admitting `max_concurrent_requests`: three quarters of it, at most
/// 128 (the sandbox's pool holds 256 instances). Such a request holds this
/// share instead of a general slot once it runs, so at least a quarter of
/// the general slots stay free for plain requests however slow plugins are.
pub fn call_share(max_concurrent_requests: usize) -> usize {
    (max_concurrent_requests * 3 / 4).clamp(1, 128)
}

/// Failed files `list_plugins` names; each entry is at most about 1 KB.
pub const LISTED_FAILURES: usize = 32;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One plugin to load.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSpec {
    pub path: PathBuf,
    pub limits: PluginLimits,
    /// Named on its own (`--plugin`, `[[plugins]]`) rather than found in a
    /// plugin directory: an id conflict involving it stops the start.
    pub explicit: bool,
    /// What the operator granted it (`[[plugins]] grants`, `secrets`).
    pub grants: Grants,
}

/// A loaded, ready plugin.
pub struct Plugin {
    pub id: Arc<str>,
    pub version: String,
    pub description: String,
    pub api_version: String,
    pub path: PathBuf,
    pub limits: PluginLimits,
    pub config_schema: Value,
    validator: jsonschema::Validator,
    /// The schema's `default`s that the schema refuses
    /// ([`config::default_problems`]): the plugin's author's to fix, and
    /// each fails an assertion that leaves its field out.
    pub default_problems: Vec<String>,
    /// The linked component, ready to instantiate: loaded at start-up, or,
    /// for a plugin the start-up index knew, on first use (or by
    /// [`PluginHost::warm_in_background`]).
    runtime: std::sync::OnceLock<Result<Runtime, String>>,
    /// How to load it later, for a plugin the index knew.
    deferred: Option<Deferred>,
    pub source: Source,
    pub load_ms: f64,
    /// Capabilities the plugin asked for in `describe()`.
    pub requested: Vec<Capability>,
    /// What the operator granted it.
    pub grants: Grants,
    secrets: Arc<std::collections::BTreeMap<String, String>>,
    /// The engine's models, connected once the engine has built them.
    models: std::sync::OnceLock<Arc<dyn Models>>,
    /// Capability use of each call, kept only when asked (`plugin test`).
    recorded: std::sync::OnceLock<std::sync::Mutex<Vec<CapabilityUse>>>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("id", &self.id)
            .field("version", &self.version)
            .finish()
    }
}

/// A plugin's linked component and the sandbox it runs in.
struct Runtime {
    sandbox: &'static Sandbox,
    prepared: Prepared,
}

/// What loading a plugin the start-up index knew takes: its cache, and what
/// its bytes must still be.
struct Deferred {
    cache: ArtefactCache,
    source: String,
}

/// A plugin file that could not be loaded, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFailure {
    pub path: PathBuf,
    pub error: String,
}

/// Every plugin the engine knows, by id.
#[derive(Default)]
pub struct PluginHost {
    plugins: HashMap<String, Arc<Plugin>>,
    order: Vec<String>,
    failures: Vec<LoadFailure>,
    /// Ids claimed by more than one plugin where one of them was named on
    /// its own; the start must not go on.
    conflicts: Vec<String>,
}

/// `list_plugins` result.
#[derive(Serialize)]
pub struct Listing<'a> {
    pub api_versions: &'static [&'static str],
    pub plugins: Vec<PluginEntry<'a>>,
    /// Loaded plugins whose entries did not fit the response line, after
    /// the listed ones (`attest-engine plugin check` describes any of them).
    #[serde(skip_serializing_if = "is_zero")]
    pub plugins_not_listed: usize,
    /// The first [`LISTED_FAILURES`] files that failed to load.
    pub failed: &'a [LoadFailure],
    /// How many more failed than are listed (`attest-engine plugin check`
    /// or the log names them).
    #[serde(skip_serializing_if = "is_zero")]
    pub failed_not_listed: usize,
}

#[derive(Serialize)]
pub struct PluginEntry<'a> {
    pub id: &'a str,
    pub version: &'a str,
    pub description: &'a str,
    pub api_version: &'a str,
    pub path: &'a Path,
    pub limits: &'a PluginLimits,
    pub config_schema: Value,
    pub loaded_from: Source,
    pub load_ms: f64,
    /// Capabilities the plugin asked for, and those the operator granted.
    pub capabilities: CapabilityListing,
}

/// Requested and granted capabilities, and the names of mapped secrets
/// (never their values).
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityListing {
    pub requested: Vec<Capability>,
    pub granted: Vec<Capability>,
    /// Requested and granted: what calls may use.
    pub usable: Vec<Capability>,
    pub secrets: Vec<String>,
}

impl PluginHost {
    /// Loads every plugin in `specs` (in parallel); failures are kept, not
    /// fatal. Plugins that claim the same id are all refused.
    pub fn load(specs: &[PluginSpec], cache_dir: Option<PathBuf>) -> PluginHost {
        PluginHost::load_with(specs, &ArtefactCache::new(cache_dir))
    }

    /// [`PluginHost::load`] through a given cache (a read-only one, for
    /// inspecting plugins without changing the engine's cache).
    pub fn load_with(specs: &[PluginSpec], cache: &ArtefactCache) -> PluginHost {
        let mut host = PluginHost::default();
        if specs.is_empty() {
            return host;
        }
        let workers = LOAD_THREADS.min(specs.len());
        let mut outcomes: Vec<Option<Result<Plugin, LoadError>>> = (0..specs.len()).map(|_| None).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<&mut Option<Result<Plugin, LoadError>>>> = outcomes.iter_mut().map(std::sync::Mutex::new).collect();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let (next, slots) = (&next, &slots);
                scope.spawn(move || loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(slot) = slots.get(k) else { break };
                    let outcome = load_one(&specs[k], cache);
                    **slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
                });
            }
        });
        drop(slots);
        let mut loaded: Vec<(&PluginSpec, Plugin)> = Vec::new();
        for (spec, outcome) in specs.iter().zip(outcomes) {
            match outcome {
                Some(Ok(plugin)) => loaded.push((spec, plugin)),
                Some(Err(error)) => host.fail(&spec.path, error.to_string()),
                None => host.fail(&spec.path, "the loader stopped before reaching this plugin".into()),
            }
        }
        let mut claims: HashMap<String, Vec<(&Path, bool)>> = HashMap::new();
        for (spec, plugin) in &loaded {
            claims.entry(plugin.id.to_string()).or_default().push((&spec.path, spec.explicit));
        }
        for (spec, plugin) in loaded {
            let claimants = &claims[&*plugin.id];
            if claimants.len() > 1 {
                let mut files: Vec<String> = claimants
                    .iter()
                    .take(5)
                    .map(|(p, _)| crate::text::quote(&p.display().to_string()))
                    .collect();
                if claimants.len() > 5 {
                    files.push(format!("… {} more", claimants.len() - 5));
                }
                let files = files.join(", ");
                let error = format!(
                    "plugin id '{}' is claimed by {} plugins ({files}); none of them is loaded: give each plugin its own id, or load only one of them",
                    plugin.id,
                    claimants.len(),
                );
                if claimants.iter().any(|(_, explicit)| *explicit) && !host.conflicts.iter().any(|c| c == &error) {
                    host.conflicts.push(error.clone());
                }
                host.fail(&spec.path, error);
                continue;
            }
            tracing::info!(plugin = %plugin.id, version = %plugin.version, api = %plugin.api_version, from = %plugin.source, load_ms = plugin.load_ms, "plugin loaded");
            host.order.push(plugin.id.to_string());
            host.plugins.insert(plugin.id.to_string(), Arc::new(plugin));
        }
        host
    }

    /// Id conflicts that involve a plugin named on its own (`--plugin`,
    /// `[[plugins]]`): each a message for a start-up error.
    pub fn conflicts(&self) -> &[String] {
        &self.conflicts
    }

    fn fail(&mut self, path: &Path, error: String) {
        tracing::error!(path = %path.display(), %error, "plugin not loaded");
        self.failures.push(LoadFailure {
            path: path.to_owned(),
            error,
        });
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Plugin>> {
        self.plugins.get(id)
    }

    /// Loaded plugin ids, in load order.
    pub fn ids(&self) -> &[String] {
        &self.order
    }

    pub fn failures(&self) -> &[LoadFailure] {
        &self.failures
    }

    /// The `list_plugins` answer, in at most `budget` bytes of JSON. Config
    /// schemas are included while they fit [`LISTED_SCHEMA_BYTES`] in all;
    /// the others are replaced by a note (`attest-engine plugin check`
    /// prints them in full). Plugins are listed in load order while their
    /// entries fit what is left of `budget`; the rest are counted in
    /// `plugins_not_listed`, so the answer stays one bounded line however
    /// many plugins there are and however long their descriptions.
    pub fn listing(&self, budget: usize) -> Listing<'_> {
        let mut schema_budget = LISTED_SCHEMA_BYTES;
        let mut listing = Listing {
            api_versions: SUPPORTED_API_VERSIONS,
            plugins: Vec::new(),
            plugins_not_listed: 0,
            failed: &self.failures[..self.failures.len().min(LISTED_FAILURES)],
            failed_not_listed: self.failures.len().saturating_sub(LISTED_FAILURES),
        };
        // Room for the envelope, the failures and the `plugins_not_listed`
        // member. A small budget (a member of a JSON-RPC batch has a share
        // of the line) lists fewer failures, newest last to go, and counts
        // the rest.
        let fixed = |listing: &Listing<'_>| serde_json::to_string(listing).map_or(budget, |s| s.len()) + 64;
        while fixed(&listing) > budget && !listing.failed.is_empty() {
            listing.failed = &listing.failed[..listing.failed.len() - 1];
            listing.failed_not_listed += 1;
        }
        let mut left = budget.saturating_sub(fixed(&listing));
        for id in &self.order {
            let p = &self.plugins[id];
            let entry = PluginEntry {
                id: &p.id,
                version: &p.version,
                description: &p.description,
                api_version: &p.api_version,
                path: &p.path,
                limits: &p.limits,
                config_schema: listed_schema(&p.config_schema, &p.path, &mut schema_budget),
                loaded_from: p.source,
                load_ms: p.load_ms,
                capabilities: p.capability_listing(),
            };
            let size = serde_json::to_string(&entry).map_or(usize::MAX, |s| s.len() + 1);
            if listing.plugins_not_listed > 0 || size > left {
                listing.plugins_not_listed += 1;
                continue;
            }
            left -= size;
            listing.plugins.push(entry);
        }
        listing
    }
}

/// A plugin's schema for `list_plugins`, or a note in its place when it
/// does not fit what is left of `budget`.
fn listed_schema(schema: &Value, path: &Path, budget: &mut usize) -> Value {
    let len = schema.to_string().len();
    if len <= *budget {
        *budget -= len;
        return schema.clone();
    }
    serde_json::json!({
        "omitted": format!(
            "the config schema is {len} bytes, more than list_plugins has room for; `attest-engine plugin check {}` prints it",
            crate::text::clip(&path.display().to_string(), 200)
        )
    })
}

/// The `.wasm` files of a plugin directory, sorted by name.
pub fn files_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "wasm") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Why a plugin was refused. Its text is what the log, `list_plugins` and
/// `attest-engine plugin check` show.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// The file could not be read.
    Unreadable { path: PathBuf, why: String },
    /// Larger than [`MAX_COMPONENT_BYTES`]: `bytes` when the file system
    /// reports a size (a pipe or a device does not).
    TooLarge { bytes: Option<u64> },
    /// A core WebAssembly module, not a component.
    CoreModule,
    /// An empty file.
    Empty,
    /// Shorter than a component's 8-byte header, and what there is of it
    /// matches: a copy or a build that stopped early.
    CutShort { bytes: usize },
    /// Not WebAssembly at all.
    NotWasm,
    /// Its configured memory limit is over the engine's maximum.
    MemoryLimit { asked: usize },
    /// Refused before compiling: it could never run, or would cost too much
    /// to compile (see [`preflight`]).
    Preflight(String),
    /// The sandbox for its limits could not be set up.
    Sandbox(String),
    /// It does not compile.
    Invalid(String),
    /// Built against a plugin API version this engine does not serve.
    UnknownApiVersion { built: String },
    /// Imports `attest:plugin` interfaces of more than one version.
    MixedApiVersions { versions: Vec<String> },
    /// It declares no plugin API version.
    NoApiVersion,
    /// It does not fit the assertion-plugin world, or needs imports the sandbox does not grant.
    Unfit(String),
    /// Its `describe()` failed.
    Describe(String),
    /// Its id breaks the plugin-id rule.
    BadId(String),
    /// Its config schema is not JSON, or not a valid JSON Schema.
    BadSchema { id: String, why: String },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served = SUPPORTED_API_VERSIONS.join(", ");
        let newest = SUPPORTED_API_VERSIONS[0];
        match self {
            LoadError::Unreadable { path, why } => write!(f, "cannot read {}: {why}", path.display()),
            LoadError::TooLarge { bytes: Some(bytes) } => write!(
                f,
                "the component is {bytes} bytes; the limit is {MAX_COMPONENT_BYTES} bytes ({} MiB)",
                MAX_COMPONENT_BYTES >> 20
            ),
            LoadError::TooLarge { bytes: None } => write!(
                f,
                "the component is larger than the limit of {MAX_COMPONENT_BYTES} bytes ({} MiB)",
                MAX_COMPONENT_BYTES >> 20
            ),
            LoadError::CoreModule => f.write_str("this is a core WebAssembly module, not a component: build it as a component (see docs/plugins.md) or convert it with `wasm-tools component new`"),
            LoadError::Empty => f.write_str(
                "the file is empty (0 bytes), not a WebAssembly component: rebuild the plugin, or check that the path names the built .wasm",
            ),
            LoadError::CutShort { bytes } => write!(
                f,
                "the file is {bytes} bytes, shorter than a component's 8-byte header: it looks cut short; rebuild the plugin or copy it again"
            ),
            LoadError::NotWasm => f.write_str(
                "not a WebAssembly component (bad magic bytes: a component starts with \\0asm and layer 0x0d): check that the path names the built .wasm",
            ),
            LoadError::MemoryLimit { asked } => write!(
                f,
                "memory limit {asked} bytes exceeds the engine's maximum of {} bytes",
                sandbox::MAX_MEMORY_BYTES
            ),
            LoadError::Preflight(why) => f.write_str(why),
            LoadError::Sandbox(why) => f.write_str(why),
            LoadError::Invalid(why) => write!(f, "invalid component: {why}"),
            LoadError::UnknownApiVersion { built } => write!(
                f,
                "built against attest:plugin@{built}, but this engine serves attest:plugin@{served}; rebuild the plugin against wit/since_v{newest}/ (attest:plugin@{newest})"
            ),
            LoadError::MixedApiVersions { versions } => write!(
                f,
                "imports attest:plugin interfaces of several versions ({}); a plugin is built against one: rebuild it against wit/since_v{newest}/ (attest:plugin@{newest})",
                versions.join(" and ")
            ),
            LoadError::NoApiVersion => write!(
                f,
                "declares no attest:plugin API version (it imports neither attest:plugin/types nor attest:plugin/host); build it against wit/since_v{newest}/ (attest:plugin@{served})"
            ),
            LoadError::Unfit(why) => write!(
                f,
                "does not fit the assertion-plugin world or needs imports the sandbox does not grant: {why}"
            ),
            LoadError::Describe(why) => write!(f, "describe() failed: the plugin {why}"),
            LoadError::BadId(id) => write!(f, "plugin id '{id}' is invalid: use {}", attest_trace::PLUGIN_ID_RULE),
            LoadError::BadSchema { id, why } => write!(f, "plugin '{id}' config schema {why}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// A component file's bytes, up to [`MAX_COMPONENT_BYTES`].
fn read_component(path: &Path) -> Result<Vec<u8>, LoadError> {
    attest_io::read_capped(path, MAX_COMPONENT_BYTES as u64).map_err(|e| match e {
        attest_io::ReadError::TooLarge { size, .. } => LoadError::TooLarge { bytes: size },
        attest_io::ReadError::Io(e) => LoadError::Unreadable {
            path: path.to_path_buf(),
            why: e.to_string(),
        },
        // Bytes are not checked as text; kept total for the compiler.
        other @ attest_io::ReadError::NotUtf8 { .. } => LoadError::Unreadable {
            path: path.to_path_buf(),
            why: other.to_string(),
        },
    })
}

/// Loads one plugin, or says exactly why it is refused. A plugin the cache's
/// start-up index knows (the same file, limits and engine) is taken from its
/// record without reading the file; its component is loaded on first use.
pub fn load_one(spec: &PluginSpec, cache: &ArtefactCache) -> Result<Plugin, LoadError> {
    let started = Instant::now();
    let path = &spec.path;
    let unreadable = |e: std::io::Error| LoadError::Unreadable {
        path: path.clone(),
        why: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let size = meta.len();
    if size > MAX_COMPONENT_BYTES as u64 {
        return Err(LoadError::TooLarge { bytes: Some(size) });
    }
    if spec.limits.memory_bytes > sandbox::MAX_MEMORY_BYTES {
        return Err(LoadError::MemoryLimit {
            asked: spec.limits.memory_bytes,
        });
    }
    // A description holds only for the limits it was made under.
    let limits_key = serde_json::to_string(&spec.limits).unwrap_or_default();
    if let Some(known) = cache.indexed(path, &meta, &limits_key) {
        if ApiVersion::serving(&known.api_version).is_some() {
            let deferred = Deferred {
                cache: cache.clone(),
                source: known.source,
            };
            return described_plugin(
                spec,
                known.described,
                known.api_version,
                Source::Cache,
                None,
                Some(deferred),
                started,
            );
        }
    }
    let wasm = read_component(path)?;
    match wasm.get(..8) {
        Some(header) if header == COMPONENT_HEADER => {}
        Some([0, b'a', b's', b'm', 0x01, 0, 0, 0]) => return Err(LoadError::CoreModule),
        _ if wasm.is_empty() => return Err(LoadError::Empty),
        _ if wasm.len() < 8 && COMPONENT_HEADER.starts_with(&wasm) => return Err(LoadError::CutShort { bytes: wasm.len() }),
        _ => return Err(LoadError::NotWasm),
    }
    preflight(&wasm, &spec.limits).map_err(LoadError::Preflight)?;
    let sandbox = Sandbox::get(spec.limits.fuel.is_some()).map_err(|e| LoadError::Sandbox(e.to_string()))?;
    let cache::Loaded {
        component,
        source,
        hash,
        entry,
    } = cache
        .load(sandbox.engine(), &wasm)
        .map_err(|e| LoadError::Invalid(crate::text::clip(&format!("{e:#}"), 400)))?;
    let mut versions = sandbox.api_versions(&component);
    if versions.len() > 1 {
        return Err(LoadError::MixedApiVersions {
            versions: versions.iter().take(4).map(|v| crate::text::clip(v, 40)).collect(),
        });
    }
    let (api, api_version) = match versions.pop() {
        Some(v) => match ApiVersion::serving(&v) {
            Some(api) => (api, v),
            None => {
                return Err(LoadError::UnknownApiVersion {
                    built: crate::text::clip(&v, 40),
                })
            }
        },
        None => return Err(LoadError::NoApiVersion),
    };
    let prepared = sandbox
        .prepare(&component, api)
        .map_err(|e| LoadError::Unfit(crate::text::clip(&format!("{e:#}"), 400)))?;
    let file_label: Arc<str> = Arc::from(path.file_name().map_or("plugin".into(), |n| n.to_string_lossy()).as_ref());
    // A cached description spares instantiating the plugin at start-up.
    let info = match entry.as_ref().and_then(|e| e.described(&limits_key)) {
        Some(known) => known,
        None => {
            let info = sandbox
                .describe(&prepared, &file_label, &spec.limits)
                .map_err(|f| LoadError::Describe(f.to_string()))?;
            let described = cache::Described {
                id: info.id,
                version: info.version,
                description: info.description,
                config_schema: info.config_schema,
                capabilities: info.capabilities,
            };
            if let Some(entry) = &entry {
                entry.remember(&described, &limits_key);
            }
            described
        }
    };
    let plugin = described_plugin(
        spec,
        info.clone(),
        api_version.clone(),
        source,
        Some(Runtime { sandbox, prepared }),
        None,
        started,
    )?;
    cache.index(path, &meta, &limits_key, hash, &api_version, &info);
    Ok(plugin)
}

/// A plugin from what it described itself as; `runtime` is its linked
/// component, or `None` when `deferred` says how to load it on first use.
fn described_plugin(
    spec: &PluginSpec,
    info: cache::Described,
    api_version: String,
    source: Source,
    runtime: Option<Runtime>,
    deferred: Option<Deferred>,
    started: Instant,
) -> Result<Plugin, LoadError> {
    if !attest_trace::is_plugin_id(&info.id) {
        return Err(LoadError::BadId(crate::text::clip(&info.id, 60)));
    }
    let config_schema: Value = serde_json::from_str(&info.config_schema).map_err(|e| LoadError::BadSchema {
        id: info.id.clone(),
        why: format!("is not JSON: {e}"),
    })?;
    let validator = attest_core::layers::schema::validator(&config_schema, jsonschema::Draft::Draft202012).map_err(|e| {
        // Where in the schema: the message alone names only the value.
        // (An unresolvable `$ref` has no place; its message names it.)
        let at = e.instance_path().to_string();
        let at = if at.is_empty() {
            String::new()
        } else {
            format!(", at {}", crate::text::clip(&at, 200))
        };
        LoadError::BadSchema {
            id: info.id.clone(),
            why: format!("is not a valid JSON Schema{at}: {}", crate::text::clip(&e.to_string(), 300)),
        }
    })?;
    let loaded = std::sync::OnceLock::new();
    if let Some(runtime) = runtime {
        let _ = loaded.set(Ok(runtime));
    }
    let default_problems = config::default_problems(&config_schema);
    Ok(Plugin {
        id: Arc::from(info.id.as_str()),
        version: info.version,
        description: info.description,
        api_version,
        path: spec.path.clone(),
        limits: spec.limits.clone(),
        config_schema,
        validator,
        default_problems,
        runtime: loaded,
        deferred,
        source,
        load_ms: started.elapsed().as_secs_f64() * 1000.0,
        requested: info.capabilities,
        secrets: Arc::new(spec.grants.secrets.clone()),
        grants: spec.grants.clone(),
        models: std::sync::OnceLock::new(),
        recorded: std::sync::OnceLock::new(),
    })
}

/// Reads a component's sections (without compiling anything) and refuses
/// it when it could never run under `limits` or would cost too much to
/// compile: more than [`MAX_FUNCTIONS`] functions, a memory whose initial
/// size is over the memory cap, or a data segment that lies beyond it.
pub fn preflight(wasm: &[u8], limits: &PluginLimits) -> Result<(), String> {
    use wasmparser::{DataKind, Operator, Payload};
    let cap = limits.memory_bytes as u64;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut functions: u32 = 0;
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| {
            let why = crate::text::clip(&e.to_string(), 300);
            // The header was right, so the likely story is a copy or a
            // download that stopped early.
            let cut = if why.contains("unexpected end-of-file") {
                format!("; the file ({} bytes) looks cut short: rebuild it or copy it again", wasm.len())
            } else {
                String::new()
            };
            format!("invalid component: {why}{cut}")
        })?;
        match payload {
            Payload::CodeSectionStart { count, .. } => {
                functions = functions.saturating_add(count);
                if functions > MAX_FUNCTIONS {
                    return Err(format!(
                        "the component defines more than {MAX_FUNCTIONS} functions (the limit); compiling it would take too long and too much memory"
                    ));
                }
            }
            Payload::MemorySection(memories) => {
                for memory in memories {
                    let memory = memory.map_err(|e| format!("invalid component: {e}"))?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                    let initial = memory.initial.saturating_mul(page);
                    if initial > cap {
                        return Err(format!(
                            "its memory starts at {:.0} MiB, over the plugin's memory limit of {:.0} MiB: it could never run (raise memory_mib for it, or make the plugin smaller)",
                            mib(initial),
                            mib(cap)
                        ));
                    }
                }
            }
            Payload::DataSection(segments) => {
                for segment in segments {
                    let segment = segment.map_err(|e| format!("invalid component: {e}"))?;
                    let DataKind::Active { offset_expr, .. } = segment.kind else {
                        continue;
                    };
                    let offset = match offset_expr.get_operators_reader().read() {
                        Ok(Operator::I32Const { value }) => u64::from(value as u32),
                        Ok(Operator::I64Const { value }) => value as u64,
                        _ => 0,
                    };
                    let end = offset.saturating_add(segment.data.len() as u64);
                    if end > cap {
                        return Err(format!(
                            "it has a data segment ending at {:.0} MiB, beyond the plugin's memory limit of {:.0} MiB: it could never run",
                            mib(end),
                            mib(cap)
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The evaluator calls plugins through the core's trait.
impl AssertionPlugin for Plugin {
    fn id(&self) -> &str {
        &self.id
    }

    fn evaluate(&self, trace_json: &str, configs: &[&str], call: &PluginCall) -> Vec<PluginAnswer> {
        let (mut answers, used) = Plugin::evaluate(self, trace_json, configs, call);
        // Whatever the plugin wrote leaves the host with its secrets masked.
        if !self.secrets.is_empty() {
            for a in &mut answers {
                if let std::borrow::Cow::Owned(m) = capabilities::mask(&a.explanation, &self.secrets) {
                    a.explanation = m;
                }
                if let Some(d) = &mut a.details {
                    capabilities::mask_json(d, &self.secrets);
                }
            }
        }
        if let Some(recorded) = self.recorded.get() {
            let mut recorded = recorded.lock().unwrap_or_else(|e| e.into_inner());
            if recorded.len() < MAX_RECORDED_USES {
                recorded.push(used);
            }
        }
        answers
    }
}

/// Calls whose capability use a recording plugin keeps.
const MAX_RECORDED_USES: usize = 10_000;

impl CapabilityUse {
    fn merge(&mut self, other: CapabilityUse) {
        let room = capabilities::MAX_RECORDED_CALLS.saturating_sub(self.calls.len());
        self.unrecorded += other.unrecorded + other.calls.len().saturating_sub(room);
        self.calls.extend(other.calls.into_iter().take(room));
        self.cost += other.cost;
    }
}

/// One plugin call's capability use, for `plugin test`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CapabilityUse {
    pub calls: Vec<CallRecord>,
    /// Calls beyond those recorded.
    #[serde(skip_serializing_if = "is_zero")]
    pub unrecorded: usize,
    pub cost: f64,
}

impl PluginHost {
    /// Loads, on a thread of its own, the components of plugins taken from
    /// the start-up index, so that first calls rarely wait for them.
    pub fn warm_in_background(&self) {
        let pending: Vec<Arc<Plugin>> = self.plugins.values().filter(|p| p.runtime.get().is_none()).cloned().collect();
        if pending.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new().name("attest-plugin-warm".into()).spawn(move || {
            for plugin in pending {
                let _ = plugin.runtime();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot load plugin components in the background; they load on first use");
        }
    }

    /// Connects the engine's models to every plugin, for `embed` and
    /// `judge` (the engine builds its providers after loading plugins).
    pub fn connect_models(&self, models: Arc<dyn Models>) {
        for plugin in self.plugins.values() {
            let _ = plugin.models.set(models.clone());
        }
    }
}

impl Plugin {
    /// The linked component, loading it first for a plugin the start-up
    /// index knew. A load that fails is remembered: every call then fails
    /// with its reason.
    fn runtime(&self) -> Result<&Runtime, &str> {
        self.runtime
            .get_or_init(|| {
                let deferred = self.deferred.as_ref().ok_or("the plugin has no component")?;
                let loaded = self.load_deferred(deferred);
                if let Err(why) = &loaded {
                    tracing::error!(plugin = %self.id, path = %self.path.display(), %why, "plugin component not loaded");
                }
                loaded
            })
            .as_ref()
            .map_err(String::as_str)
    }

    fn load_deferred(&self, deferred: &Deferred) -> Result<Runtime, String> {
        let wasm = match read_component(&self.path) {
            Ok(wasm) if cache::source_hash(&wasm) == deferred.source => wasm,
            // Start-up listed it from the cache, within the cap: a file now
            // over the cap has changed too.
            Ok(_) | Err(LoadError::TooLarge { .. }) => {
                deferred.cache.forget(&self.path);
                return Err(format!(
                    "{} changed after the engine started; restart the engine to load the new version",
                    self.path.display()
                ));
            }
            Err(e) => return Err(e.to_string()),
        };
        let sandbox = Sandbox::get(self.limits.fuel.is_some()).map_err(|e| e.to_string())?;
        let loaded = deferred
            .cache
            .load(sandbox.engine(), &wasm)
            .map_err(|e| format!("is not a loadable component: {}", crate::text::clip(&format!("{e:#}"), 300)))?;
        let api = ApiVersion::serving(&self.api_version)
            .filter(|_| sandbox.api_versions(&loaded.component) == [self.api_version.as_str()])
            .ok_or_else(|| format!("is no longer built against attest:plugin@{}", self.api_version))?;
        let prepared = sandbox
            .prepare(&loaded.component, api)
            .map_err(|e| crate::text::clip(&format!("{e:#}"), 300))?;
        Ok(Runtime { sandbox, prepared })
    }

    /// From now on, keeps what each call's capability calls did (for
    /// `plugin test`, which prints them).
    pub fn record_capability_use(&self) {
        let _ = self.recorded.set(std::sync::Mutex::new(Vec::new()));
    }

    /// What was recorded since the last time, one entry per call.
    pub fn take_capability_use(&self) -> Vec<CapabilityUse> {
        self.recorded
            .get()
            .map(|r| std::mem::take(&mut *r.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default()
    }

    /// Requested and granted capabilities, as listed.
    pub fn capability_listing(&self) -> CapabilityListing {
        CapabilityListing {
            requested: self.requested.clone(),
            granted: self.grants.capabilities.clone(),
            usable: self.usable(),
            secrets: self.grants.secrets.keys().cloned().collect(),
        }
    }

    /// Capabilities both requested and granted.
    pub fn usable(&self) -> Vec<Capability> {
        self.requested.iter().copied().filter(|c| self.grants.allows(*c)).collect()
    }

    /// Whether calls may spend money or wait on a provider.
    fn uses_models(&self) -> bool {
        self.requested.iter().any(|c| c.is_model() && self.grants.allows(*c))
    }

    /// The context a call starts with; `None` when the plugin requested no
    /// capability (its calls are refused without one).
    fn call_context(&self, call: &PluginCall) -> Option<Box<CallContext>> {
        if self.requested.is_empty() {
            return None;
        }
        let deadline = (Instant::now() + self.limits.timeout).min(call.deadline);
        Some(Box::new(CallContext {
            plugin_id: self.id.clone(),
            usable: self.usable(),
            requested: self.requested.clone(),
            secrets: self.secrets.clone(),
            models: self.models.get().cloned(),
            deadline,
            budget_left: call.budget_left,
            spent: 0.0,
            model_calls: 0,
            budget_refusal: None,
            records: Vec::new(),
            unrecorded: 0,
        }))
    }

    /// Checks an assertion's `config` against the plugin's schema; lists up to 3 problems.
    pub fn check_config(&self, config: &Value) -> Result<(), String> {
        // The schema's size only decides whether errors are listed; a
        // compact rendering of it is a fair stand-in for its text.
        use attest_core::layers::schema::{describe_errors, errors_of, within_steps, VALIDATION_STEPS};
        let schema_bytes = self.config_schema.to_string().len();
        match within_steps(VALIDATION_STEPS, || self.validator.is_valid(config)) {
            Some(true) => return Ok(()),
            Some(false) => {}
            None => {
                return Err(format!(
                    "the config could not be checked: the plugin's config schema entered {VALIDATION_STEPS} subschemas without an answer"
                ))
            }
        }
        let (errors, _) = errors_of(&self.validator, config, schema_bytes);
        let errors = describe_errors(&errors);
        if errors.is_empty() {
            Err("the config does not match the plugin's config schema (its errors are not listed: the schema branches recursively)".into())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Runs the plugin for several configs on one trace, and says what its
    /// capability calls did. If the call faults or answers with the wrong
    /// number of results and there was more than one config, each config is
    /// retried on its own so that one bad config cannot take the others
    /// down; except after a timeout, which fails every config of the call.
    ///
    /// A plugin that may call models is called once per config, so that each
    /// assertion carries exactly its own cost and its own share of the
    /// budget; the others get one call for all their configs.
    pub fn evaluate(&self, trace: &str, configs: &[&str], call: &PluginCall) -> (Vec<PluginAnswer>, CapabilityUse) {
        let mut used = CapabilityUse::default();
        if configs.len() > 1 && self.uses_models() {
            let mut budget_left = call.budget_left;
            let answers = configs
                .iter()
                .flat_map(|c| {
                    let one = PluginCall { budget_left, ..*call };
                    // Past the request's deadline, the rest are not started
                    // (the sandbox refuses a call with no time left).
                    let (answers, u) = self.evaluate_once(trace, std::slice::from_ref(c), &one);
                    budget_left = budget_left.map(|b| b - u.cost);
                    used.merge(u);
                    answers
                })
                .collect();
            return (answers, used);
        }
        self.evaluate_once(trace, configs, call)
    }

    fn evaluate_once(&self, trace: &str, configs: &[&str], call: &PluginCall) -> (Vec<PluginAnswer>, CapabilityUse) {
        let rt = match self.runtime() {
            Ok(rt) => rt,
            Err(why) => {
                let why = format!("could not be loaded: {why}");
                return (configs.iter().map(|_| self.fault_outcome(&why)).collect(), CapabilityUse::default());
            }
        };
        // The call runs within the plugin's timeout and the request's
        // deadline, whichever comes first.
        let time = sandbox::CallTime::within(self.limits.timeout, call.deadline);
        let (answer, cx) = rt
            .sandbox
            .evaluate(&rt.prepared, &self.id, &self.limits, time, trace, configs, self.call_context(call));
        let (used, refusal) = match cx {
            Some(cx) => {
                let cx = *cx;
                (
                    CapabilityUse {
                        calls: cx.records,
                        unrecorded: cx.unrecorded,
                        cost: cx.spent,
                    },
                    cx.budget_refusal,
                )
            }
            None => (CapabilityUse::default(), None),
        };
        let cost_each = used.cost / configs.len().max(1) as f64;
        let (why, retry) = match answer {
            Ok(Answer::Results(results)) => {
                let answers = results
                    .into_iter()
                    .map(|r| {
                        let mut answer = match &refusal {
                            // The budget, not the plugin, decides: whatever
                            // the plugin made of the refusal.
                            Some(why) => self.fault_outcome(&format!("was refused a model call: {why}")),
                            None => self.check(r),
                        };
                        answer.cost = cost_each;
                        answer
                    })
                    .collect();
                return (answers, used);
            }
            Ok(Answer::WrongCount(n)) => (format!("returned {n} results for {} configs", configs.len()), true),
            // Retrying after a timeout would hold the batch for one more
            // deadline per config.
            Err(fault @ sandbox::Fault::Timeout { .. }) => (fault.to_string(), false),
            Err(fault) => (fault.to_string(), true),
        };
        // Here too the budget decides, whatever the plugin did after the
        // refusal (looping on it until its deadline, trapping); a retry
        // would only be refused again.
        let (why, retry) = match &refusal {
            Some(refused) => (format!("was refused a model call: {refused} (the call then ended: {why})"), false),
            None => (why, retry),
        };
        if retry && configs.len() > 1 {
            let mut all = used;
            let answers = configs
                .iter()
                .flat_map(|c| {
                    let (answers, u) = self.evaluate_once(trace, std::slice::from_ref(c), call);
                    all.merge(u);
                    answers
                })
                .collect();
            return (answers, all);
        }
        tracing::warn!(plugin = %self.id, fault = %why, "plugin call failed");
        let answers = configs
            .iter()
            .map(|_| PluginAnswer {
                cost: cost_each,
                ..self.fault_outcome(&why)
            })
            .collect();
        (answers, used)
    }

    fn check(&self, result: Result<sandbox::Verdict, PluginError>) -> PluginAnswer {
        let v = match result {
            Ok(v) => v,
            Err(e) => {
                let (kind, msg) = match e {
                    PluginError::InvalidConfig(m) => ("rejected its config", m),
                    PluginError::UnsupportedTrace(m) => ("cannot evaluate this trace", m),
                    PluginError::Internal(m) => ("failed", m),
                };
                return PluginAnswer {
                    passed: false,
                    always_hard: true,
                    score: 0.0,
                    explanation: format!("plugin '{}' {kind}: {}", self.id, crate::text::clip(&msg, 1000)),
                    details: None,
                    cost: 0.0,
                };
            }
        };
        if !v.score.is_finite() || !(0.0..=1.0).contains(&v.score) {
            return self.fault_outcome(&format!("returned a malformed verdict: score {} is outside [0, 1]", v.score));
        }
        let details = match v.details.as_deref().map(serde_json::from_str::<Value>) {
            None => None,
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => return self.fault_outcome(&format!("returned a malformed verdict: details are not JSON ({e})")),
        };
        PluginAnswer {
            passed: v.status == Status::Pass,
            always_hard: v.status == Status::HardFail,
            score: v.score,
            explanation: v.explanation,
            details,
            cost: 0.0,
        }
    }

    fn fault_outcome(&self, why: &str) -> PluginAnswer {
        PluginAnswer {
            passed: false,
            always_hard: true,
            score: 0.0,
            explanation: format!("plugin '{}' {why}; no verdict.", self.id),
            details: None,
            cost: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin described with `schema`, without a component behind it.
    fn described_with(schema: &str) -> Plugin {
        describe_with(schema).unwrap_or_else(|e| panic!("{e}"))
    }

    fn describe_with(schema: &str) -> Result<Plugin, LoadError> {
        let spec = PluginSpec {
            path: PathBuf::from("schema.wasm"),
            limits: PluginLimits::default(),
            explicit: true,
            grants: Default::default(),
        };
        let info = cache::Described {
            id: "schema".into(),
            version: "1.0.0".into(),
            description: String::new(),
            config_schema: schema.into(),
            capabilities: vec![],
        };
        described_plugin(&spec, info, "0.2.0".into(), Source::Compiled, None, None, Instant::now())
    }

    #[test]
    fn an_invalid_schema_is_refused_naming_the_place_in_it() {
        for (schema, at) in [
            (r#"{"type":"objekt"}"#, "is not a valid JSON Schema, at /type:"),
            (
                r#"{"properties":{"phrase":{"minLength":"one"}}}"#,
                "is not a valid JSON Schema, at /properties/phrase/minLength:",
            ),
        ] {
            let why = describe_with(schema).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(why.contains(at), "{why}");
        }
    }

    #[test]
    fn leaving_out_a_field_whose_default_the_schema_refuses_is_a_1002_that_says_whose_value_it_is() {
        let plugin = Arc::new(described_with(
            r#"{"type":"object","properties":{"mode":{"enum":["a","b"],"default":5}}}"#,
        ));
        let host = PluginHost {
            plugins: HashMap::from([("schema".to_owned(), plugin)]),
            order: vec!["schema".to_owned()],
            failures: vec![],
            conflicts: vec![],
        };
        let compile = |spec: Value| crate::check::compile(&attest_core::layers::Spec::new(Some(&spec), "plugin").unwrap(), &host);
        assert!(compile(serde_json::json!({"plugin_id": "schema", "config": {"mode": "b"}})).is_ok());
        let refused = compile(serde_json::json!({"plugin_id": "schema", "config": {}})).err().unwrap();
        assert_eq!(refused.field, "spec.config");
        assert!(
            refused
                .message
                .contains("config schema fills in a default that the schema itself refuses: at /mode"),
            "{}",
            refused.message
        );
        assert!(refused.detail.contains("plugin check schema.wasm"), "{}", refused.detail);
    }

    #[test]
    fn defaults_the_schema_refuses_are_found_and_missing_required_fields_are_not_their_problem() {
        let good = described_with(
            r#"{"type":"object","required":["phrase"],"properties":{"phrase":{"type":"string"},"mode":{"enum":["a","b"],"default":"a"}}}"#,
        );
        assert_eq!(good.default_problems, Vec::<String>::new());
        let bad = described_with(
            r#"{"type":"object","required":["phrase"],"properties":{"phrase":{"type":"string"},"mode":{"enum":["a","b"],"default":5},"n":{"type":"integer","minimum":1,"default":0}}}"#,
        );
        let problems = bad.default_problems.join("; ");
        assert!(problems.contains("at /mode") && problems.contains("at /n"), "{problems}");
        assert!(!problems.contains("phrase"), "{problems}");
    }

    /// A core module with `functions` empty functions and one memory of
    /// `pages` pages, wrapped in a component.
    fn component(functions: u32, pages: u64) -> Vec<u8> {
        use wasm_encoder::{CodeSection, Function, FunctionSection, MemorySection, MemoryType, Module, TypeSection};
        let mut module = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        module.section(&types);
        let mut funcs = FunctionSection::new();
        (0..functions).for_each(|_| {
            funcs.function(0);
        });
        module.section(&funcs);
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: pages,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        module.section(&memories);
        let mut code = CodeSection::new();
        for _ in 0..functions {
            let mut f = Function::new([]);
            f.instructions().end();
            code.function(&f);
        }
        module.section(&code);
        let mut c = wasm_encoder::Component::new();
        c.section(&wasm_encoder::ModuleSection(&module));
        c.finish()
    }

    #[test]
    fn a_component_importing_two_api_versions_is_refused_naming_both() {
        use wasm_encoder::{ComponentImportSection, ComponentTypeRef, ComponentTypeSection, InstanceType};
        let mut c = wasm_encoder::Component::new();
        let mut types = ComponentTypeSection::new();
        types.instance(&InstanceType::new());
        c.section(&types);
        let mut imports = ComponentImportSection::new();
        imports.import("attest:plugin/types@0.1.0", ComponentTypeRef::Instance(0));
        imports.import("attest:plugin/host@0.2.0", ComponentTypeRef::Instance(0));
        c.section(&imports);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.wasm");
        std::fs::write(&path, c.finish()).unwrap();
        let spec = PluginSpec {
            path,
            limits: PluginLimits::default(),
            explicit: true,
            grants: Default::default(),
        };
        let Err(err) = load_one(&spec, &ArtefactCache::new(None)) else {
            panic!("a component of two API versions loaded")
        };
        let err = err.to_string();
        assert!(
            err.contains("imports attest:plugin interfaces of several versions (0.1.0 and 0.2.0)"),
            "{err}"
        );
    }

    #[test]
    fn preflight_counts_functions_and_checks_initial_memory() {
        let limits = PluginLimits::default();
        assert_eq!(preflight(&component(10, 16), &limits), Ok(()));
        let err = preflight(&component(MAX_FUNCTIONS + 1, 1), &limits).unwrap_err();
        assert!(err.contains("more than 50000 functions"), "{err}");
        // 1025 pages of 64 KiB: just over the default 64 MiB.
        let err = preflight(&component(1, 1025), &limits).unwrap_err();
        assert!(
            err.contains("memory starts at 64 MiB, over the plugin's memory limit of 64 MiB"),
            "{err}"
        );
        let roomy = PluginLimits {
            memory_bytes: 128 << 20,
            ..PluginLimits::default()
        };
        assert_eq!(preflight(&component(1, 1025), &roomy), Ok(()));
        assert!(preflight(b"\0asm\x0d\0\x01\0garbage", &limits)
            .unwrap_err()
            .starts_with("invalid component"));
    }

    #[test]
    fn listing_keeps_schemas_within_one_budget() {
        let small = serde_json::json!({"type": "object"});
        let mut budget = 100;
        assert_eq!(listed_schema(&small, Path::new("a.wasm"), &mut budget), small);
        assert_eq!(budget, 100 - small.to_string().len());
        let big = serde_json::json!({"description": "x".repeat(200)});
        let note = listed_schema(&big, Path::new("b.wasm"), &mut budget);
        assert!(note["omitted"].as_str().unwrap().contains("plugin check b.wasm"), "{note}");
    }

    #[test]
    fn listing_names_a_bounded_number_of_failures() {
        let mut host = PluginHost::default();
        for i in 0..40 {
            host.fail(Path::new(&format!("bad-{i}.wasm")), "not a WebAssembly component".into());
        }
        let listing = host.listing(64 * 1024);
        assert_eq!(listing.failed.len(), LISTED_FAILURES);
        assert_eq!(listing.failed_not_listed, 8);
        let json = serde_json::to_value(&listing).unwrap();
        assert_eq!(json["failed_not_listed"], 8);
        assert!(serde_json::to_value(PluginHost::default().listing(64 * 1024))
            .unwrap()
            .get("failed_not_listed")
            .is_none());
    }

    #[test]
    fn a_small_budget_lists_fewer_failures_and_still_fits() {
        let mut host = PluginHost::default();
        for i in 0..40 {
            host.fail(Path::new(&format!("bad-{i}.wasm")), "not a WebAssembly component".into());
        }
        // A member's share of the line in a JSON-RPC batch of 128.
        let budget = 64 * 1024 / 128;
        let listing = host.listing(budget);
        let text = serde_json::to_string(&listing).unwrap();
        assert!(text.len() <= budget, "{} bytes: {text}", text.len());
        assert!(listing.failed.len() < LISTED_FAILURES);
        assert_eq!(listing.failed.len() + listing.failed_not_listed, 40);
    }

    #[test]
    fn plugin_requests_get_a_share_below_the_request_limit() {
        assert_eq!(call_share(64), 48);
        assert_eq!(call_share(1), 1);
        assert_eq!(call_share(4), 3);
        assert_eq!(call_share(10_000), 128);
    }
}
