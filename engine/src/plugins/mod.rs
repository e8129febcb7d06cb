//! The plugin host: WebAssembly assertion plugins (layer 8) loaded at
//! start-up, validated, precompiled (with an on-disk cache) and run in the
//! [`sandbox`].
//!
//! A plugin that cannot be loaded is reported (in the log, in `list_plugins`
//! and by `attest-engine plugin check`) and skipped; it never stops the
//! engine. Loading happens in parallel, one thread per core.

pub mod cache;
pub mod sandbox;

use cache::{ArtefactCache, Source};
use sandbox::{AssertionPluginPre, PluginError, Sandbox, State, Status, SUPPORTED_API_VERSIONS};
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

/// One plugin to load.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSpec {
    pub path: PathBuf,
    pub limits: PluginLimits,
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
    sandbox: &'static Sandbox,
    pre: AssertionPluginPre<State>,
    pub source: Source,
    pub load_ms: f64,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("id", &self.id)
            .field("version", &self.version)
            .finish()
    }
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
}

/// `list_plugins` result.
#[derive(Serialize)]
pub struct Listing<'a> {
    pub api_versions: &'static [&'static str],
    pub plugins: Vec<PluginEntry<'a>>,
    pub failed: &'a [LoadFailure],
}

#[derive(Serialize)]
pub struct PluginEntry<'a> {
    pub id: &'a str,
    pub version: &'a str,
    pub description: &'a str,
    pub api_version: &'a str,
    pub path: &'a Path,
    pub limits: &'a PluginLimits,
    pub config_schema: &'a Value,
    pub loaded_from: Source,
    pub load_ms: f64,
}

impl PluginHost {
    /// Loads every plugin in `specs` (in parallel); failures are kept, not fatal.
    pub fn load(specs: &[PluginSpec], cache_dir: Option<PathBuf>) -> PluginHost {
        let mut host = PluginHost::default();
        if specs.is_empty() {
            return host;
        }
        let cache = ArtefactCache::new(cache_dir);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(specs.len());
        let mut outcomes: Vec<Option<Result<Plugin, String>>> = (0..specs.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let chunks: Vec<_> = outcomes.chunks_mut(specs.len().div_ceil(workers)).collect();
            let mut start = 0;
            for chunk in chunks {
                let first = start;
                start += chunk.len();
                let cache = &cache;
                scope.spawn(move || {
                    for (k, slot) in chunk.iter_mut().enumerate() {
                        *slot = Some(load_one(&specs[first + k], cache));
                    }
                });
            }
        });
        for (spec, outcome) in specs.iter().zip(outcomes) {
            match outcome.expect("every slot is filled") {
                Ok(plugin) => {
                    if let Some(existing) = host.plugins.get(&*plugin.id) {
                        let error = format!("plugin id '{}' is already provided by {}", plugin.id, existing.path.display());
                        host.fail(&spec.path, error);
                        continue;
                    }
                    tracing::info!(plugin = %plugin.id, version = %plugin.version, api = %plugin.api_version, from = ?plugin.source, load_ms = plugin.load_ms, "plugin loaded");
                    host.order.push(plugin.id.to_string());
                    host.plugins.insert(plugin.id.to_string(), Arc::new(plugin));
                }
                Err(error) => host.fail(&spec.path, error),
            }
        }
        host
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

    pub fn listing(&self) -> Listing<'_> {
        Listing {
            api_versions: SUPPORTED_API_VERSIONS,
            plugins: self
                .order
                .iter()
                .map(|id| {
                    let p = &self.plugins[id];
                    PluginEntry {
                        id: &p.id,
                        version: &p.version,
                        description: &p.description,
                        api_version: &p.api_version,
                        path: &p.path,
                        limits: &p.limits,
                        config_schema: &p.config_schema,
                        loaded_from: p.source,
                        load_ms: p.load_ms,
                    }
                })
                .collect(),
            failed: &self.failures,
        }
    }
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

/// Loads one plugin, or says exactly why it is refused.
pub fn load_one(spec: &PluginSpec, cache: &ArtefactCache) -> Result<Plugin, String> {
    let started = Instant::now();
    let path = &spec.path;
    let wasm = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    match wasm.get(..8) {
        Some([0, b'a', b's', b'm', 0x0d, 0, 0x01, 0]) => {}
        Some([0, b'a', b's', b'm', 0x01, 0, 0, 0]) => {
            return Err("this is a core WebAssembly module, not a component: build it as a component (see docs/plugins.md) or convert it with `wasm-tools component new`".into())
        }
        _ => return Err("not a WebAssembly component (bad magic bytes)".into()),
    }
    if spec.limits.memory_bytes > sandbox::MAX_MEMORY_BYTES {
        return Err(format!(
            "memory limit {} bytes exceeds the engine's maximum of {} bytes",
            spec.limits.memory_bytes,
            sandbox::MAX_MEMORY_BYTES
        ));
    }
    let sandbox = Sandbox::get(spec.limits.fuel.is_some()).map_err(|e| e.to_string())?;
    let (component, source) = cache
        .load(sandbox.engine(), &wasm)
        .map_err(|e| format!("invalid component: {}", crate::text::clip(&format!("{e:#}"), 400)))?;
    let served = SUPPORTED_API_VERSIONS.join(", ");
    let api_version = match sandbox.api_version(&component) {
        Some(v) if Sandbox::serves(&v) => v,
        Some(v) => {
            return Err(format!(
                "built against attest:plugin@{v}, but this engine serves attest:plugin@{served}; rebuild the plugin against wit/attest-plugin.wit (attest:plugin@{})",
                SUPPORTED_API_VERSIONS[0]
            ))
        }
        None => {
            return Err(format!(
                "declares no attest:plugin API version (it imports neither attest:plugin/types nor attest:plugin/host); build it against wit/attest-plugin.wit (attest:plugin@{served})"
            ))
        }
    };
    let pre = sandbox.prepare(&component).map_err(|e| {
        format!(
            "does not fit the assertion-plugin world or needs imports the sandbox does not grant: {}",
            crate::text::clip(&format!("{e:#}"), 400)
        )
    })?;
    let file_label: Arc<str> = Arc::from(path.file_name().map_or("plugin".into(), |n| n.to_string_lossy()).as_ref());
    let info = sandbox
        .describe(&pre, &file_label, &spec.limits)
        .map_err(|f| format!("describe() failed: the plugin {f}"))?;
    if info.id.is_empty()
        || !info
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(format!(
            "plugin id '{}' is invalid: use letters, digits, '-', '_' and '.'",
            crate::text::clip(&info.id, 60)
        ));
    }
    let config_schema: Value =
        serde_json::from_str(&info.config_schema).map_err(|e| format!("plugin '{}' config schema is not JSON: {e}", info.id))?;
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&config_schema)
        .map_err(|e| {
            format!(
                "plugin '{}' config schema is not a valid JSON Schema: {}",
                info.id,
                crate::text::clip(&e.to_string(), 300)
            )
        })?;
    Ok(Plugin {
        id: Arc::from(info.id.as_str()),
        version: info.version,
        description: info.description,
        api_version,
        path: path.clone(),
        limits: spec.limits.clone(),
        config_schema,
        validator,
        sandbox,
        pre,
        source,
        load_ms: started.elapsed().as_secs_f64() * 1000.0,
    })
}

/// A plugin's answer for one assertion, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub passed: bool,
    pub always_hard: bool,
    pub score: f64,
    pub explanation: String,
    pub details: Option<Value>,
}

impl Plugin {
    /// Checks an assertion's `config` against the plugin's schema; lists up to 3 problems.
    pub fn check_config(&self, config: &Value) -> Result<(), String> {
        let errors: Vec<_> = self.validator.iter_errors(config).collect();
        let errors = crate::layers::schema::describe_errors(&errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Runs the plugin once for several configs on one trace. If the call
    /// faults or answers with the wrong number of results and there was more
    /// than one config, each config is retried on its own so that one bad
    /// config cannot take the others down; except after a timeout, which
    /// fails every config of the call.
    pub fn evaluate(&self, trace: &str, configs: &[String]) -> Vec<Outcome> {
        let (why, retry) = match self.sandbox.evaluate(&self.pre, &self.id, &self.limits, trace, configs) {
            Ok(results) if results.len() == configs.len() => return results.into_iter().map(|r| self.check(r)).collect(),
            Ok(results) => (format!("returned {} results for {} configs", results.len(), configs.len()), true),
            // Retrying after a timeout would hold the batch for one more
            // deadline per config.
            Err(fault @ sandbox::Fault::Timeout { .. }) => (fault.to_string(), false),
            Err(fault) => (fault.to_string(), true),
        };
        if retry && configs.len() > 1 {
            return configs.iter().flat_map(|c| self.evaluate(trace, std::slice::from_ref(c))).collect();
        }
        tracing::warn!(plugin = %self.id, fault = %why, "plugin call failed");
        configs.iter().map(|_| self.fault_outcome(&why)).collect()
    }

    fn check(&self, result: Result<sandbox::Verdict, PluginError>) -> Outcome {
        let v = match result {
            Ok(v) => v,
            Err(e) => {
                let (kind, msg) = match e {
                    PluginError::InvalidConfig(m) => ("rejected its config", m),
                    PluginError::UnsupportedTrace(m) => ("cannot evaluate this trace", m),
                    PluginError::Internal(m) => ("failed", m),
                };
                return Outcome {
                    passed: false,
                    always_hard: true,
                    score: 0.0,
                    explanation: format!("plugin '{}' {kind}: {}", self.id, crate::text::clip(&msg, 1000)),
                    details: None,
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
        Outcome {
            passed: v.status == Status::Pass,
            always_hard: v.status == Status::HardFail,
            score: v.score,
            explanation: v.explanation,
            details,
        }
    }

    fn fault_outcome(&self, why: &str) -> Outcome {
        Outcome {
            passed: false,
            always_hard: true,
            score: 0.0,
            explanation: format!("plugin '{}' {why}; no verdict.", self.id),
            details: None,
        }
    }
}
