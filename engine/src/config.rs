//! Engine configuration: defaults, then the TOML file (`--config` or
//! `ATTEST_CONFIG`), then environment variables, then command-line flags.
//!
//! Unknown keys in the file are an error: a typo should not silently leave a
//! setting at its default.

use crate::logging::Level;
use crate::plugins::PluginSpec;
use crate::providers::config::{parse_bool, parse_duration, size, size_bytes, size_text, MAX_MIB};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the engine reads at start-up, resolved.
#[derive(Debug, Clone)]
pub struct Config {
    pub log_level: Level,
    /// Whether the level was chosen (config file, `ATTEST_LOG_LEVEL` or
    /// `--log-level`) rather than defaulted: front doors with a quiet mode
    /// lower only the default.
    pub log_level_chosen: bool,
    /// Per-request evaluation deadline (`3002 TIMEOUT` when exceeded).
    pub eval_timeout: Duration,
    /// Requests evaluated at once; also advertised by `initialize`.
    pub max_concurrent_requests: usize,
    /// Reject unknown step types (Attest protocol v1 §7 strict mode).
    pub strict_step_types: bool,
    /// Entries kept for `request_id` idempotency.
    pub idempotency_cache_entries: usize,
    /// Compiled assertion specs kept for reuse across requests.
    pub compiled_cache_entries: usize,
    /// Estimated bytes the compiled-assertion cache may hold (regex
    /// programs and their DFA caches count in full).
    pub compiled_cache_bytes: u64,
    /// Estimated bytes the compiled-schema cache may hold (layer 1's
    /// validators, their patterns' programs and search caches).
    pub schema_cache_bytes: u64,
    /// Bytes the `request_id` result cache may hold.
    pub idempotency_cache_bytes: u64,
    /// Bytes the `submit_plugin_result` store may hold.
    pub plugin_results_bytes: usize,
    /// Bytes of results kept for session reports.
    pub session_log_bytes: usize,
    /// Estimated parse memory of all requests in flight together: a request
    /// waits to be read further while admitting it would pass this.
    pub max_inflight_bytes: usize,
    /// Longest explanation in a result, in characters.
    pub max_explanation_chars: usize,
    /// Longest response line (excluding the newline). SDK readers fail above 64 KiB.
    pub max_response_bytes: usize,
    /// How long `shutdown`, end of input and signals wait for in-flight work.
    pub drain_timeout: Duration,
    /// Plugin results kept in memory for reporting.
    pub max_plugin_results: usize,
    /// WebAssembly plugins to load at start-up, in order.
    pub plugins: Vec<PluginSpec>,
    /// Limits for a plugin no `[[plugins]]` entry names (`[plugin_defaults]`).
    pub plugin_defaults: crate::plugins::PluginLimits,
    /// Where compiled plugins are cached (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Result history (`None`: off). Lives in the cache directory by default.
    pub history: Option<crate::history::HistoryConfig>,
    /// Scores in history needed before `threshold: "dynamic"` uses them.
    pub dynamic_min_samples: usize,
    /// How many recent scores a dynamic threshold looks at.
    pub dynamic_window: usize,
    /// Send `drift_alert` notifications on stdout (off: they confuse SDKs
    /// that read the next line as the answer).
    pub drift_alerts: bool,
    /// Drift alerts are also POSTed here (JSON), when set.
    pub drift_webhook_url: Option<String>,
    /// Session reports written at shutdown and end of input.
    pub reports: Vec<crate::report::ReportSpec>,
    /// The session's cost budget in USD: paid assertions are refused once
    /// it is spent; shown in reports.
    pub budget_usd: Option<f64>,
    /// Embedding and judge providers (layers 5 and 6).
    pub providers: crate::providers::config::ProvidersConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_level: Level::Info,
            log_level_chosen: false,
            // Under the SDKs' own 30 s wait for an answer
            // (`ATTEST_ENGINE_TIMEOUT`): a 3002 sent at their deadline would
            // arrive after they stopped reading, and a client that takes the
            // next line as its answer would then read each later answer one
            // request late.
            eval_timeout: Duration::from_secs(25),
            max_concurrent_requests: 64,
            strict_step_types: false,
            idempotency_cache_entries: 10_000,
            compiled_cache_entries: 4_096,
            compiled_cache_bytes: 192 * 1024 * 1024,
            schema_cache_bytes: crate::layers::schema::DEFAULT_SCHEMA_CACHE_BYTES,
            idempotency_cache_bytes: 32 * 1024 * 1024,
            plugin_results_bytes: 32 * 1024 * 1024,
            session_log_bytes: 64 * 1024 * 1024,
            max_inflight_bytes: 384 * 1024 * 1024,
            max_explanation_chars: 1_024,
            max_response_bytes: 65_536,
            drain_timeout: Duration::from_secs(30),
            max_plugin_results: 100_000,
            plugins: Vec::new(),
            plugin_defaults: crate::plugins::PluginLimits::default(),
            cache_dir: default_cache_dir(),
            history: None,
            dynamic_min_samples: 10,
            dynamic_window: 50,
            drift_alerts: false,
            drift_webhook_url: None,
            reports: Vec::new(),
            budget_usd: None,
            providers: Default::default(),
        }
    }
}

/// The TOML file's shape: every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub log_level: Option<String>,
    #[serde(default, deserialize_with = "crate::providers::config::duration_text")]
    pub eval_timeout: Option<String>,
    pub max_concurrent_requests: Option<usize>,
    pub strict_step_types: Option<bool>,
    pub idempotency_cache_entries: Option<usize>,
    pub compiled_cache_entries: Option<usize>,
    pub compiled_cache_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub compiled_cache_size: Option<String>,
    pub schema_cache_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub schema_cache_size: Option<String>,
    pub idempotency_cache_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub idempotency_cache_size: Option<String>,
    pub plugin_results_mib: Option<usize>,
    #[serde(default, deserialize_with = "size_text")]
    pub plugin_results_size: Option<String>,
    pub session_log_mib: Option<usize>,
    #[serde(default, deserialize_with = "size_text")]
    pub session_log_size: Option<String>,
    pub max_inflight_mib: Option<usize>,
    #[serde(default, deserialize_with = "size_text")]
    pub max_inflight_size: Option<String>,
    pub max_explanation_chars: Option<usize>,
    #[serde(default, deserialize_with = "crate::providers::config::duration_text")]
    pub drain_timeout: Option<String>,
    pub max_plugin_results: Option<usize>,
    /// Every `.wasm` file in this directory is loaded as a plugin.
    pub plugin_dir: Option<PathBuf>,
    /// Default limits for every plugin.
    pub plugin_defaults: Option<FileLimits>,
    /// Plugins listed one by one, each with optional limits.
    #[serde(default)]
    pub plugins: Vec<FilePlugin>,
    /// Cache directory (`""` disables caching).
    pub cache_dir: Option<PathBuf>,
    /// Result history on (default), off, or in a shared PostgreSQL
    /// database (`"postgres://…"`).
    pub history: Option<HistorySetting>,
    /// History database file (default `<cache_dir>/history.sqlite3`).
    pub history_path: Option<PathBuf>,
    pub history_max_rows: Option<u64>,
    pub history_max_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub history_max_size: Option<String>,
    /// Non-passing evaluations kept with their explanations and trace for
    /// `attest-engine view` (0: none).
    pub history_kept_evaluations: Option<u64>,
    /// Compressed MiB those may take (0: none).
    pub history_kept_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub history_kept_size: Option<String>,
    #[serde(default, deserialize_with = "crate::providers::config::duration_text")]
    pub history_max_age: Option<String>,
    pub dynamic_min_samples: Option<usize>,
    pub dynamic_window: Option<usize>,
    pub drift_alerts: Option<bool>,
    pub drift_webhook_url: Option<String>,
    /// `["junit=path", "json=path", "markdown=path"]`.
    #[serde(default)]
    pub reports: Vec<String>,
    pub budget_usd: Option<f64>,
    /// `[embedding]`: the layer 5 provider.
    pub embedding: Option<crate::providers::config::FileEmbedding>,
    /// `[judge]`: the layer 6 provider.
    pub judge: Option<crate::providers::config::FileJudge>,
    /// `[providers]`: concurrency, pacing, time-outs, short-circuit, cache.
    pub providers: Option<crate::providers::config::FileProviders>,
    /// `[prices."<model>"]`: USD per million tokens.
    pub prices: Option<std::collections::HashMap<String, crate::providers::Price>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    pub fuel: Option<u64>,
    pub memory_mib: Option<usize>,
    #[serde(default, deserialize_with = "size_text")]
    pub memory: Option<String>,
    #[serde(default, deserialize_with = "crate::providers::config::duration_text")]
    pub timeout: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePlugin {
    pub path: PathBuf,
    // The limits are spelled out rather than a flattened `FileLimits`: with
    // `flatten`, an unknown key's error could not list the valid ones.
    pub fuel: Option<u64>,
    pub memory_mib: Option<usize>,
    #[serde(default, deserialize_with = "size_text")]
    pub memory: Option<String>,
    #[serde(default, deserialize_with = "crate::providers::config::duration_text")]
    pub timeout: Option<String>,
    /// Capabilities granted to this plugin (`embed`, `judge`,
    /// `config-secret`); none by default.
    #[serde(default)]
    pub grants: Vec<String>,
    /// Values `config-secret` answers this plugin, by name.
    #[serde(default)]
    pub secrets: std::collections::BTreeMap<String, FileSecret>,
}

impl FilePlugin {
    fn limits(&self) -> FileLimits {
        FileLimits {
            fuel: self.fuel,
            memory_mib: self.memory_mib,
            memory: self.memory.clone(),
            timeout: self.timeout.clone(),
        }
    }
}

/// A secret mapped to a plugin: a literal value, or `{ env = "VAR" }` to
/// read it from the engine's environment at start-up (the plugin never
/// sees the environment itself).
#[derive(Clone)]
pub enum FileSecret {
    Value(String),
    Env { env: String },
}

/// The two forms by name: an untagged enum's error would name neither.
impl<'de> Deserialize<'de> for FileSecret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Form;
        const EXPECTED: &str = r#"a secret's value as a string ("…"), or { env = "VAR" } to read it from the engine's environment"#;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = FileSecret;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<FileSecret, E> {
                Ok(FileSecret::Value(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<FileSecret, A::Error> {
                let mut env = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "env" || env.is_some() {
                        return Err(serde::de::Error::custom(format!(
                            "unexpected key '{key}' in a secret; expected {EXPECTED}"
                        )));
                    }
                    env = Some(map.next_value::<String>()?);
                }
                env.map(|env| FileSecret::Env { env })
                    .ok_or_else(|| serde::de::Error::custom(format!("an empty table is not a secret; expected {EXPECTED}")))
            }
        }
        d.deserialize_any(Form)
    }
}

impl std::fmt::Debug for FileSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileSecret::Value(_) => f.write_str("Value(<redacted>)"),
            FileSecret::Env { env } => write!(f, "Env({env})"),
        }
    }
}

/// `[[plugins]] grants` and `secrets`, checked.
fn grants(p: &FilePlugin, env: &dyn Fn(&str) -> Option<String>) -> Result<crate::plugins::capabilities::Grants> {
    use crate::plugins::capabilities::Capability;
    let mut capabilities = Vec::new();
    for name in &p.grants {
        let c = Capability::parse(name).with_context(|| {
            let valid: Vec<&str> = Capability::ALL.iter().map(|c| c.name()).collect();
            format!("grants: unknown capability '{name}'; valid capabilities: {}", valid.join(", "))
        })?;
        if !capabilities.contains(&c) {
            capabilities.push(c);
        }
    }
    capabilities.sort();
    if !p.secrets.is_empty() && !capabilities.contains(&Capability::ConfigSecret) {
        bail!("secrets are mapped but not granted: add \"config-secret\" to grants, or remove secrets");
    }
    if p.path.as_os_str().is_empty() {
        bail!("path is empty: give the plugin's .wasm file");
    }
    let mut secrets = std::collections::BTreeMap::new();
    for (name, source) in &p.secrets {
        if name.trim().is_empty() {
            bail!("secrets: a secret needs a name (the name the plugin asks config-secret for)");
        }
        let value = match source {
            FileSecret::Value(v) => v.clone(),
            FileSecret::Env { env: var } => env(var)
                .with_context(|| format!("secrets.{name}: environment variable {var} is not set; set it, or give the value itself"))?,
        };
        secrets.insert(name.clone(), value);
    }
    Ok(crate::plugins::capabilities::Grants { capabilities, secrets })
}

/// Settings given on the command line (they win over everything).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config_path: Option<PathBuf>,
    pub log_level: Option<String>,
    pub eval_timeout: Option<String>,
    pub max_concurrent_requests: Option<usize>,
    pub strict_step_types: bool,
    /// `--plugin <file.wasm>`, repeatable.
    pub plugins: Vec<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    /// `--report kind=path`, repeatable.
    pub reports: Vec<String>,
    /// `--no-history`.
    pub no_history: bool,
    /// For `plugin check` and `plugin test`, which work on the one file they
    /// name: no plugin directory is read, whichever of the flag, the
    /// environment or the config file names one.
    pub skip_plugin_dir: bool,
}

/// The environment variables the engine reads, in one place for the docs.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("ATTEST_CONFIG", "path of the TOML config file (like --config)"),
    ("ATTEST_LOG_LEVEL", "debug | info | warn | error"),
    ("ATTEST_LOG_FORMAT", "json | text (default: text on a terminal, JSON elsewhere)"),
    ("ATTEST_EVAL_TIMEOUT", "per-request deadline, e.g. 30s, 1500ms, 2m"),
    ("ATTEST_MAX_CONCURRENT_REQUESTS", "requests evaluated at once (1-1024)"),
    ("ATTEST_STRICT_STEP_TYPES", "true to reject unknown step types"),
    ("ATTEST_PLUGIN_DIR", "directory whose .wasm files are loaded as plugins"),
    (
        "ATTEST_CACHE_DIR",
        "cache directory (compiled plugins, result history, provider cache and calibrations); default ~/.attest/cache",
    ),
    ("ATTEST_HISTORY", "false to switch the result history off"),
    (
        "ATTEST_HISTORY_URL",
        "postgres://user:password@host/db to keep the result history in a shared PostgreSQL database",
    ),
    ("ATTEST_DRIFT_ALERTS", "true to send drift_alert notifications on stdout"),
    ("ATTEST_DRIFT_WEBHOOK_URL", "POST drift alerts (JSON) to this http(s) URL"),
    ("ATTEST_EMBEDDING_PROVIDER", "auto | openai | local | off"),
    (
        "ATTEST_EMBEDDING_BASE_URL",
        "OpenAI-compatible embeddings API, e.g. http://localhost:11434/v1",
    ),
    ("ATTEST_EMBEDDING_API_KEY", "API key for the embeddings API"),
    ("ATTEST_EMBEDDING_MODEL", "default embedding model"),
    ("ATTEST_EMBEDDING_MODEL_DIR", "local sentence-transformers model directory"),
    ("ATTEST_JUDGE_PROVIDER", "openai | anthropic | off"),
    ("ATTEST_JUDGE_BASE_URL", "judge API base URL"),
    ("ATTEST_JUDGE_API_KEY", "judge API key"),
    ("ATTEST_JUDGE_MODEL", "default judge model"),
    ("ATTEST_JUDGE_SAMPLES", "judge samples per assertion (1-10)"),
    (
        "ATTEST_JUDGE_BIAS_PROBES",
        "bias probes for every judge assertion: verbosity,position,self_preference",
    ),
    ("ATTEST_OPENAI_API_KEY", "API key for OpenAI (embeddings and judge)"),
    ("ATTEST_ANTHROPIC_API_KEY", "API key for Anthropic (judge)"),
];

impl Config {
    /// Resolves the configuration from `overrides`, the environment (`env`)
    /// and the config file they name. Each setting is its default, then the
    /// file's, then the environment's, then the flag's: one stage each
    /// below, then the settings that combine several sources (plugins, the
    /// history, reports, providers), then the checks across settings.
    pub fn load(overrides: &Overrides, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let path = overrides.config_path.clone().or_else(|| env("ATTEST_CONFIG").map(PathBuf::from));
        let file = match &path {
            Some(p) => read_file(p)?,
            None => FileConfig::default(),
        };
        let src = |name: &str| match &path {
            Some(p) => format!("{name} in {}", p.display()),
            None => name.to_owned(),
        };
        // Paths in the file are relative to it.
        let base = path.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
        let mut c = Config::default();
        c.read_file(&file, &src)?;
        c.read_env(&env)?;
        c.read_flags(overrides)?;
        (c.plugin_defaults, c.plugins) = plugins(&file, overrides, &env, &base, &src)?;
        if let Some(dir) = env("ATTEST_CACHE_DIR").map(PathBuf::from).or(file.cache_dir.clone()) {
            c.cache_dir = (!dir.as_os_str().is_empty()).then_some(dir);
        }
        c.history = history(&file, overrides, &env, &base, c.cache_dir.as_deref(), &src)?;
        c.read_alerts(&file, &env)?;
        c.reports = reports(&file, overrides, &base, &src)?;
        if let Some(b) = file.budget_usd {
            if !(b.is_finite() && b >= 0.0) {
                bail!("budget_usd must be a non-negative number of US dollars, got {b}");
            }
            c.budget_usd = Some(b);
        }
        c.providers = crate::providers::config::ProvidersConfig::load(
            crate::providers::config::FileSections {
                embedding: file.embedding.as_ref(),
                judge: file.judge.as_ref(),
                providers: file.providers.as_ref(),
                prices: file.prices.as_ref(),
                base: &base,
                file: path.as_deref(),
            },
            c.cache_dir.as_deref(),
            &env,
        )?;
        c.check()?;
        Ok(c)
    }

    /// The file's scalar settings over the defaults.
    fn read_file(&mut self, file: &FileConfig, src: &dyn Fn(&str) -> String) -> Result<()> {
        if let Some(v) = &file.log_level {
            self.log_level = Level::parse(v).with_context(|| src("log_level"))?;
            self.log_level_chosen = true;
        }
        if let Some(v) = &file.eval_timeout {
            self.eval_timeout = parse_duration(v).with_context(|| src("eval_timeout"))?;
        }
        if let Some(v) = &file.drain_timeout {
            self.drain_timeout = parse_duration(v).with_context(|| src("drain_timeout"))?;
        }
        if let Some(v) = file.max_concurrent_requests {
            self.max_concurrent_requests = v;
        }
        self.strict_step_types = file.strict_step_types.unwrap_or(self.strict_step_types);
        let at_least_one = |key: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(anyhow::anyhow!(
                "{} must be at least 1, got 0; leave it out for the default, {default}",
                src(key)
            )),
            v => Ok(v.unwrap_or(default)),
        };
        self.idempotency_cache_entries = at_least_one(
            "idempotency_cache_entries",
            file.idempotency_cache_entries,
            self.idempotency_cache_entries,
        )?;
        self.compiled_cache_entries = at_least_one("compiled_cache_entries", file.compiled_cache_entries, self.compiled_cache_entries)?;
        self.max_plugin_results = at_least_one("max_plugin_results", file.max_plugin_results, self.max_plugin_results)?;
        let one = (1, MAX_MIB);
        self.compiled_cache_bytes = size(
            &file.compiled_cache_size,
            file.compiled_cache_mib,
            "compiled_cache",
            one,
            self.compiled_cache_bytes,
            &src,
        )?;
        self.schema_cache_bytes = size(
            &file.schema_cache_size,
            file.schema_cache_mib,
            "schema_cache",
            one,
            self.schema_cache_bytes,
            &src,
        )?;
        self.idempotency_cache_bytes = size(
            &file.idempotency_cache_size,
            file.idempotency_cache_mib,
            "idempotency_cache",
            one,
            self.idempotency_cache_bytes,
            &src,
        )?;
        let size_usize = |text: &Option<String>, mib: Option<usize>, key: &str, min: u64, default: usize| {
            size(text, mib.map(|m| m as u64), key, (min, MAX_MIB), default as u64, &src).map(|b| b as usize)
        };
        self.plugin_results_bytes = size_usize(
            &file.plugin_results_size,
            file.plugin_results_mib,
            "plugin_results",
            1,
            self.plugin_results_bytes,
        )?;
        self.session_log_bytes = size_usize(
            &file.session_log_size,
            file.session_log_mib,
            "session_log",
            1,
            self.session_log_bytes,
        )?;
        self.max_inflight_bytes = size_usize(
            &file.max_inflight_size,
            file.max_inflight_mib,
            "max_inflight",
            16,
            self.max_inflight_bytes,
        )?;
        self.max_explanation_chars = file.max_explanation_chars.unwrap_or(self.max_explanation_chars);
        Ok(())
    }

    /// `ATTEST_*` variables over the file.
    fn read_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        if let Some(v) = env("ATTEST_LOG_LEVEL") {
            self.log_level = Level::parse(&v).context("ATTEST_LOG_LEVEL")?;
            self.log_level_chosen = true;
        }
        if let Some(v) = env("ATTEST_EVAL_TIMEOUT") {
            self.eval_timeout = parse_duration(&v).context("ATTEST_EVAL_TIMEOUT")?;
        }
        if let Some(v) = env("ATTEST_MAX_CONCURRENT_REQUESTS") {
            self.max_concurrent_requests = v
                .trim()
                .parse()
                .with_context(|| format!("ATTEST_MAX_CONCURRENT_REQUESTS: '{v}' is not a whole number"))?;
        }
        if let Some(v) = env("ATTEST_STRICT_STEP_TYPES") {
            self.strict_step_types = parse_bool(&v).context("ATTEST_STRICT_STEP_TYPES")?;
        }
        Ok(())
    }

    /// Command-line flags over everything.
    fn read_flags(&mut self, overrides: &Overrides) -> Result<()> {
        if let Some(v) = &overrides.log_level {
            self.log_level = Level::parse(v).context("--log-level")?;
            self.log_level_chosen = true;
        }
        if let Some(v) = &overrides.eval_timeout {
            self.eval_timeout = parse_duration(v).context("--eval-timeout")?;
        }
        if let Some(v) = overrides.max_concurrent_requests {
            self.max_concurrent_requests = v;
        }
        self.strict_step_types |= overrides.strict_step_types;
        Ok(())
    }

    /// Dynamic thresholds and drift alerts.
    fn read_alerts(&mut self, file: &FileConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        self.dynamic_min_samples = file.dynamic_min_samples.unwrap_or(self.dynamic_min_samples);
        self.dynamic_window = file.dynamic_window.unwrap_or(self.dynamic_window);
        self.drift_alerts = match env("ATTEST_DRIFT_ALERTS") {
            Some(v) => parse_bool(&v).context("ATTEST_DRIFT_ALERTS")?,
            None => file.drift_alerts.unwrap_or(false),
        };
        self.drift_webhook_url = env("ATTEST_DRIFT_WEBHOOK_URL")
            .or(file.drift_webhook_url.clone())
            .filter(|u| !u.is_empty());
        if let Some(url) = &self.drift_webhook_url {
            crate::alerts::Webhook::new(url).context("drift_webhook_url")?;
        }
        Ok(())
    }

    /// What no single setting can check alone.
    fn check(&self) -> Result<()> {
        if self.dynamic_min_samples < 2 || self.dynamic_window < self.dynamic_min_samples {
            bail!(
                "dynamic_min_samples must be at least 2 and at most dynamic_window; got {} and {}",
                self.dynamic_min_samples,
                self.dynamic_window
            );
        }
        if self.history.as_ref().is_some_and(|h| h.max_rows == 0) {
            bail!("history_max_rows must be greater than zero (set history = false to switch history off)");
        }

        if !(1..=1024).contains(&self.max_concurrent_requests) {
            bail!(
                "max_concurrent_requests must be between 1 and 1024, got {}",
                self.max_concurrent_requests
            );
        }
        if self.eval_timeout.is_zero() {
            bail!("eval_timeout must be greater than zero");
        }
        if self.drain_timeout.is_zero() {
            bail!("drain_timeout must be greater than zero: it is how long shutdown waits for answers and the history to be written");
        }
        if self.max_explanation_chars < 64 {
            bail!("max_explanation_chars must be at least 64, got {}", self.max_explanation_chars);
        }
        Ok(())
    }
}

/// Plugin limits for a plugin no entry names, and the plugins to load: the
/// config file's list, then its directory (or the environment's, or the
/// flag's), then `--plugin` flags, each file once.
fn plugins(
    file: &FileConfig,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
    base: &Path,
    src: &dyn Fn(&str) -> String,
) -> Result<(crate::plugins::PluginLimits, Vec<PluginSpec>)> {
    let mut plugins = Vec::new();
    // Plugins: the config file's list, then its directory (or the
    // environment's, or the flag's), then --plugin flags.
    let defaults = limits(
        &crate::plugins::PluginLimits::default(),
        file.plugin_defaults.as_ref().unwrap_or(&FileLimits::default()),
    )
    .with_context(|| src("plugin_defaults"))?;
    for (i, p) in file.plugins.iter().enumerate() {
        plugins.push(PluginSpec {
            path: base.join(&p.path),
            limits: limits(&defaults, &p.limits()).with_context(|| src(&format!("plugins[{i}]")))?,
            explicit: true,
            grants: grants(p, env).with_context(|| src(&format!("plugins[{i}]")))?,
        });
    }
    let dir = overrides
        .plugin_dir
        .clone()
        .or_else(|| env("ATTEST_PLUGIN_DIR").map(PathBuf::from))
        .or_else(|| file.plugin_dir.as_ref().map(|d| base.join(d)));
    if let Some(dir) = dir.filter(|_| !overrides.skip_plugin_dir) {
        let files = crate::plugins::files_in(&dir).with_context(|| format!("cannot read plugin directory {}", dir.display()))?;
        plugins.extend(files.into_iter().map(|path| PluginSpec {
            path,
            limits: defaults.clone(),
            explicit: false,
            grants: Default::default(),
        }));
    }
    plugins.extend(overrides.plugins.iter().map(|path| PluginSpec {
        path: path.clone(),
        limits: defaults.clone(),
        explicit: true,
        grants: Default::default(),
    }));
    let plugins = once_per_file(plugins, file.plugins.len()).map_err(|e| anyhow::anyhow!(src(&e)))?;
    Ok((defaults, plugins))
}

/// The result history: on or off, where it lives, and its bounds.
fn history(
    file: &FileConfig,
    overrides: &Overrides,
    env: &dyn Fn(&str) -> Option<String>,
    base: &Path,
    cache_dir: Option<&Path>,
    src: &dyn Fn(&str) -> String,
) -> Result<Option<crate::history::HistoryConfig>> {
    let (file_on, file_url) = match &file.history {
        None => (true, None),
        Some(HistorySetting::On(on)) => (*on, None),
        Some(HistorySetting::Url(url)) => {
            if !crate::history::Location::is_postgres_url(url) {
                bail!(
                        "history must be true, false, or a PostgreSQL URL (postgres://user:password@host/db); the history file's path goes in history_path"
                    );
            }
            (true, Some(url.clone()))
        }
    };
    let history_on = match env("ATTEST_HISTORY") {
        Some(v) => parse_bool(&v).context("ATTEST_HISTORY")?,
        None => file_on,
    } && !overrides.no_history;
    let history_url = match env("ATTEST_HISTORY_URL").filter(|v| !v.is_empty()) {
        Some(url) if !crate::history::Location::is_postgres_url(&url) => {
            bail!("ATTEST_HISTORY_URL must be a PostgreSQL URL (postgres://user:password@host/db); for a file set history_path in the config file")
        }
        Some(url) => Some(url),
        None => file_url,
    };
    let history_location = match history_url {
        Some(url) => Some(crate::history::Location::Postgres(url)),
        None => file
            .history_path
            .as_ref()
            .map(|p| base.join(p))
            .or_else(|| cache_dir.map(|d| d.join("history.sqlite3")))
            .map(crate::history::Location::File),
    };
    let max_age = match &file.history_max_age {
        Some(v) => parse_duration(v).with_context(|| src("history_max_age"))?,
        None => Duration::from_secs(90 * 24 * 3600),
    };
    if max_age.is_zero() {
        bail!("history_max_age must be greater than zero (set history = false to switch history off)");
    }
    let max_bytes = size(
        &file.history_max_size,
        file.history_max_mib,
        "history_max",
        (1, MAX_MIB),
        DEFAULT_HISTORY_BYTES,
        &src,
    )?;
    let kept_evaluations = file.history_kept_evaluations;
    // 0 switches kept evaluations off, as `history_kept_evaluations = 0` does.
    let kept_bytes = match (&file.history_kept_size, file.history_kept_mib) {
        (None, Some(0)) => 0,
        (Some(t), None) if size_bytes(t).ok() == Some(0) => 0,
        (t, m) => size(t, m, "history_kept", (1, MAX_MIB), crate::history::DEFAULT_KEPT_BYTES, &src)?,
    };
    Ok(history_location
        .filter(|_| history_on)
        .map(|location| crate::history::HistoryConfig {
            location,
            max_rows: file.history_max_rows.unwrap_or(1_000_000),
            max_age,
            max_bytes,
            wait_when_behind: false,
            kept_evaluations: kept_evaluations.unwrap_or(crate::history::DEFAULT_KEPT_EVALUATIONS),
            kept_bytes,
        }))
}

/// Session reports: the file's, then `--report` flags; no two to one file.
fn reports(file: &FileConfig, overrides: &Overrides, base: &Path, src: &dyn Fn(&str) -> String) -> Result<Vec<crate::report::ReportSpec>> {
    let mut reports = Vec::new();
    for r in file.reports.iter() {
        reports.push(crate::report::ReportSpec::parse(r, base).with_context(|| src("reports"))?);
    }
    for r in &overrides.reports {
        reports.push(crate::report::ReportSpec::parse(r, Path::new("")).context("--report")?);
    }
    // Two reports to one file: the second would silently replace the first.
    for (i, r) in reports.iter().enumerate() {
        if let Some(other) = reports[..i].iter().find(|o| crate::report::same_file(&o.path, &r.path)) {
            bail!(
                "two reports are written to {}: give each report its own file (e.g. out/attest.xml and out/attest.json)",
                other.path.display()
            );
        }
    }
    Ok(reports)
}

/// `history` in the config file: a switch, or where a shared store lives.
#[derive(Debug, Clone)]
pub enum HistorySetting {
    On(bool),
    Url(String),
}

impl<'de> Deserialize<'de> for HistorySetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = HistorySetting;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false, or a PostgreSQL URL (\"postgres://user:password@host/db\")")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<HistorySetting, E> {
                Ok(HistorySetting::On(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HistorySetting, E> {
                Ok(HistorySetting::Url(v.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The result history's default byte bound (`history_max_mib`).
const DEFAULT_HISTORY_BYTES: u64 = 1 << 30;
/// Largest config file read, in bytes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 << 20;

fn read_file(path: &Path) -> Result<FileConfig> {
    let text = crate::eval_cmd::read_text(
        path,
        "config file",
        MAX_CONFIG_FILE_BYTES,
        "check that --config names the engine's TOML config file",
    )?;
    // The parser's own message names the line, the column and, for an
    // unknown key, the keys that table takes.
    toml::from_str(&text).map_err(|e| {
        // A JSON object here is most often a plugin's own config given to
        // the engine's --config.
        let hint = if text.trim_start().starts_with('{') {
            " (this looks like JSON: --config takes the engine's TOML config file; a plugin's config goes in `plugin test --plugin-config` or an assertion's `config`)"
        } else {
            ""
        };
        anyhow::anyhow!("invalid config file {}: {}{hint}", path.display(), plain_type_names(&e.to_string()))
    })
}

/// A deserializer's message with Rust's number type names said in words.
fn plain_type_names(message: &str) -> String {
    const WORDS: [(&str, &str); 10] = [
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected u16", "expected a whole number, 0 or more"),
        ("expected u8", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected isize", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ];
    WORDS.iter().fold(message.to_owned(), |m, (rust, words)| m.replace(rust, words))
}

/// `~/.attest/cache`, when the home directory exists: a service account's
/// home (`/nonexistent`, say) is not one to create. Without it there is no
/// default cache; `ATTEST_CACHE_DIR` or `cache_dir` still sets one.
fn default_cache_dir() -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME")?);
    home.is_dir().then(|| home.join(".attest").join("cache"))
}

/// What identifies a plugin file: its canonical path when it can be
/// resolved (so `w/p.wasm`, `./w/p.wasm` and a directory's listing of it are
/// one file), else the path as given (a missing file is refused when loaded).
pub fn plugin_file_key(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Each plugin file once. The first `entries` specs are the config file's
/// `[[plugins]]` entries, whose limits and grants win over the directory's
/// and the flags' naming the same file; two entries for one file are a
/// configuration error.
fn once_per_file(specs: Vec<PluginSpec>, entries: usize) -> std::result::Result<Vec<PluginSpec>, String> {
    let mut seen: std::collections::HashMap<PathBuf, usize> = std::collections::HashMap::new();
    let mut out: Vec<PluginSpec> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.into_iter().enumerate() {
        match seen.entry(plugin_file_key(&spec.path)) {
            std::collections::hash_map::Entry::Occupied(first) => {
                let first = *first.get();
                if i < entries {
                    return Err(format!(
                        "plugins[{i}] names the same file as plugins[{first}] ({}): give each plugin file one entry",
                        spec.path.display()
                    ));
                }
                out[first].explicit |= spec.explicit;
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(out.len());
                out.push(spec);
            }
        }
    }
    Ok(out)
}

/// Applies a file's limit overrides on top of `base`.
fn limits(base: &crate::plugins::PluginLimits, f: &FileLimits) -> Result<crate::plugins::PluginLimits> {
    let mut l = base.clone();
    if let Some(fuel) = f.fuel {
        if fuel == 0 {
            bail!("fuel must be greater than zero");
        }
        l.fuel = Some(fuel);
    }
    if f.memory.is_some() || f.memory_mib.is_some() {
        let bytes = size(
            &f.memory,
            f.memory_mib.map(|m| m as u64),
            "memory",
            (1, 1024),
            l.memory_bytes as u64,
            &|k| k.to_owned(),
        )?;
        l.memory_bytes = bytes as usize;
    }
    if let Some(t) = &f.timeout {
        l.timeout = parse_duration(t).context("timeout")?;
        if l.timeout < Duration::from_millis(1) {
            bail!("timeout must be at least 1ms, got {t:?} (plugin deadlines are counted in 5 ms ticks, e.g. timeout = \"2s\")");
        }
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugins_memory_is_a_size_and_memory_mib_still_counts_mib() {
        let base = crate::plugins::PluginLimits::default();
        let with = |memory: Option<&str>, memory_mib: Option<usize>| {
            let f = FileLimits {
                memory: memory.map(str::to_owned),
                memory_mib,
                ..FileLimits::default()
            };
            limits(&base, &f).map(|l| l.memory_bytes).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(with(Some("64MiB"), None), Ok(64 << 20));
        assert_eq!(with(None, Some(32)), Ok(32 << 20));
        assert_eq!(
            with(Some("2GiB"), None),
            Err("memory must be between 1MiB and 1024MiB, got 2GiB; leave it out for the default, 64MiB".into())
        );
        assert!(with(Some("8MiB"), Some(8))
            .unwrap_err()
            .contains("memory and memory_mib are both set; keep memory"));
    }
    use std::collections::HashMap;

    /// `text` written as the config file at `path`, loaded with `vars` as
    /// the environment; errors with their causes.
    fn load_file(path: &std::path::Path, text: &str, vars: &[(&str, &str)]) -> Result<Config, String> {
        std::fs::write(path, text).unwrap();
        let o = Overrides {
            config_path: Some(path.to_owned()),
            ..Overrides::default()
        };
        Config::load(&o, env(vars)).map_err(|e| format!("{e:#}"))
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn precedence_is_flags_then_env_then_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        std::fs::write(&path, "eval_timeout = \"5s\"\nmax_concurrent_requests = 8\nlog_level = \"debug\"\n").unwrap();
        let o = Overrides {
            config_path: Some(path),
            log_level: Some("error".into()),
            ..Overrides::default()
        };
        let c = Config::load(&o, env(&[("ATTEST_MAX_CONCURRENT_REQUESTS", "16")])).unwrap();
        assert_eq!(c.eval_timeout, Duration::from_secs(5));
        assert_eq!(c.max_concurrent_requests, 16);
        assert_eq!(c.log_level, Level::Error);
        assert!(c.log_level_chosen);
        let c = Config::load(&Overrides::default(), env(&[])).unwrap();
        assert!(!c.log_level_chosen, "the default is not a choice");
        let c = Config::load(&Overrides::default(), env(&[("ATTEST_LOG_LEVEL", "info")])).unwrap();
        assert!(c.log_level_chosen, "info asked for is a choice, though it is the default");
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        std::fs::write(&path, "eval_timout = \"5s\"\n").unwrap();
        let o = Overrides {
            config_path: Some(path),
            ..Overrides::default()
        };
        let e = format!("{:#}", Config::load(&o, env(&[])).unwrap_err());
        assert!(e.contains("eval_timout"), "{e}");
        assert!(Config::load(&Overrides::default(), env(&[("ATTEST_EVAL_TIMEOUT", "soon")])).is_err());
        assert!(Config::load(&Overrides::default(), env(&[("ATTEST_MAX_CONCURRENT_REQUESTS", "0")])).is_err());
        assert!(Config::load(&Overrides::default(), env(&[("ATTEST_LOG_LEVEL", "loud")])).is_err());
        std::fs::write(o.config_path.clone().unwrap(), "compiled_cache_mib = -1\n").unwrap();
        let e = format!("{:#}", Config::load(&o, env(&[])).unwrap_err());
        assert!(
            e.contains("compiled_cache_mib = -1") && e.contains("expected a whole number, 0 or more"),
            "{e}"
        );
        assert!(!e.contains("u64"), "{e}");
    }

    #[test]
    fn durations_may_be_bare_numbers_of_seconds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        std::fs::write(
            &path,
            "eval_timeout = 5\ndrain_timeout = 0.5\nhistory_max_age = \"2d\"\n[plugin_defaults]\ntimeout = 3\n[providers]\nattempt_timeout = 7\n",
        )
        .unwrap();
        let o = Overrides {
            config_path: Some(path.clone()),
            ..Overrides::default()
        };
        let c = Config::load(&o, env(&[])).unwrap();
        assert_eq!(c.eval_timeout, Duration::from_secs(5));
        assert_eq!(c.drain_timeout, Duration::from_millis(500));
        assert_eq!(c.plugin_defaults.timeout, Duration::from_secs(3));
        assert_eq!(c.providers.attempt_timeout, Duration::from_secs(7));
        std::fs::write(&path, "eval_timeout = true\n").unwrap();
        let e = format!("{:#}", Config::load(&o, env(&[])).unwrap_err());
        assert!(
            e.contains("a duration such as \"30s\"") && e.contains("or a number of seconds"),
            "{e}"
        );
    }

    #[test]
    fn sizes_of_zero_or_past_a_tebibyte_are_refused_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        let load = |text: &str| load_file(&path, text, &[]);
        for (text, needle) in [
            ("idempotency_cache_entries = 0", "idempotency_cache_entries in"),
            ("compiled_cache_entries = 0", "compiled_cache_entries in"),
            ("max_plugin_results = 0", "max_plugin_results in"),
            ("compiled_cache_mib = 0", "compiled_cache_mib in"),
            ("compiled_cache_mib = 9223372036854775807", "compiled_cache_mib in"),
            ("schema_cache_mib = 0", "schema_cache_mib in"),
            ("idempotency_cache_mib = 2000000", "idempotency_cache_mib in"),
            ("plugin_results_mib = 0", "plugin_results_mib in"),
            ("session_log_mib = 0", "session_log_mib in"),
            ("max_inflight_mib = 8", "max_inflight_mib in"),
            ("drain_timeout = \"0s\"", "drain_timeout must be greater than zero"),
            ("history_max_age = 0", "history_max_age must be greater than zero"),
        ] {
            let e = load(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.contains("must be"), "{text}: {e}");
        }
        let e = load("max_inflight_mib = 8").unwrap_err();
        assert!(
            e.contains("between 16MiB and 1TiB, got 8; leave it out for the default, 384MiB"),
            "{e}"
        );
        // Sizes with their units, the `_size` spelling of every `_mib` key.
        let c = load(
            "compiled_cache_size = \"256MiB\"\nschema_cache_size = \"1GB\"\nmax_inflight_size = \"0.5GiB\"\n\
             history_max_size = \"2GiB\"\nhistory_kept_size = \"0B\"",
        )
        .unwrap();
        assert_eq!(
            (c.compiled_cache_bytes, c.schema_cache_bytes, c.max_inflight_bytes),
            (256 << 20, 1_000_000_000, 512 << 20)
        );
        let h = c.history.expect("history is on by default");
        assert_eq!((h.max_bytes, h.kept_bytes), (2 << 30, 0));
        for (text, needle) in [
            (
                "compiled_cache_size = \"512\"",
                "\"512\" has no unit; write it with one, such as \"512MiB\"",
            ),
            ("compiled_cache_size = \"lots\"", "\"lots\" is not a size; write it with its unit"),
            ("compiled_cache_size = 512", "a size with its unit, such as \"256MiB\""),
            ("max_inflight_size = \"8MiB\"", "max_inflight_size in"),
            (
                "compiled_cache_size = \"1MiB\"\ncompiled_cache_mib = 1",
                "compiled_cache_mib are both set; keep compiled_cache_size",
            ),
        ] {
            let e = load(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
        let c = load("compiled_cache_mib = 2\nmax_inflight_mib = 16\nidempotency_cache_entries = 5\nschema_cache_mib = 3").unwrap();
        assert_eq!(
            (
                c.compiled_cache_bytes,
                c.max_inflight_bytes,
                c.idempotency_cache_entries,
                c.schema_cache_bytes
            ),
            (2 << 20, 16 << 20, 5, 3 << 20)
        );
    }

    #[test]
    fn the_history_is_a_file_a_shared_database_or_off() {
        use crate::history::Location;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        let load = |text: &str, vars: &[(&str, &str)]| load_file(&path, text, vars);
        let location = |c: Config| c.history.map(|h| h.location);
        let url = "postgres://attest:pw@db/attest";
        assert_eq!(
            location(load(&format!("history = \"{url}\""), &[]).unwrap()),
            Some(Location::Postgres(url.into()))
        );
        assert_eq!(
            location(load("history_path = \"h.sqlite3\"", &[("ATTEST_HISTORY_URL", url)]).unwrap()),
            Some(Location::Postgres(url.into())),
            "the variable wins over the file"
        );
        assert_eq!(
            location(load(&format!("history = \"{url}\""), &[("ATTEST_HISTORY", "false")]).unwrap()),
            None
        );
        assert_eq!(
            location(load("history = true\nhistory_path = \"h.sqlite3\"", &[]).unwrap()),
            Some(Location::File(dir.path().join("h.sqlite3")))
        );
        let e = load("history = \"~/h.sqlite3\"", &[]).unwrap_err();
        assert!(
            e.contains("history must be true, false, or a PostgreSQL URL") && e.contains("history_path"),
            "{e}"
        );
        let e = load("history = 3", &[]).unwrap_err();
        assert!(e.contains("true, false, or a PostgreSQL URL"), "{e}");
        let e = load("", &[("ATTEST_HISTORY_URL", "mysql://x")]).unwrap_err();
        assert!(e.contains("ATTEST_HISTORY_URL must be a PostgreSQL URL"), "{e}");
        // The password stays out of what is shown.
        assert_eq!(Location::Postgres(url.into()).to_string(), "postgres://attest:***@db/attest");
    }

    #[test]
    fn grants_and_secrets_are_checked_when_the_config_loads() {
        use crate::plugins::capabilities::Capability;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attest.toml");
        let load = |text: &str, vars: &[(&str, &str)]| load_file(&path, text, vars);
        let c = load(
            "[[plugins]]\npath = \"a.wasm\"\ngrants = [\"judge\", \"config-secret\", \"judge\"]\n[plugins.secrets]\nk = \"v\"\nt = { env = \"TOKEN\" }\n[[plugins]]\npath = \"b.wasm\"\n",
            &[("TOKEN", "tok")],
        )
        .unwrap();
        let g = &c.plugins[0].grants;
        assert_eq!(g.capabilities, [Capability::Judge, Capability::ConfigSecret]);
        assert_eq!(g.secrets.get("t").map(String::as_str), Some("tok"));
        assert!(!format!("{g:?}").contains("tok"), "secret values stay out of debug output");
        assert!(c.plugins[1].grants.capabilities.is_empty(), "nothing granted by default");

        let e = load("[[plugins]]\npath = \"a.wasm\"\ngrants = [\"embedd\"]\n", &[]).unwrap_err();
        assert!(
            e.contains("plugins[0]") && e.contains("unknown capability 'embedd'") && e.contains("embed, judge, config-secret"),
            "{e}"
        );
        let e = load("[[plugins]]\npath = \"a.wasm\"\n[plugins.secrets]\nk = \"v\"\n", &[]).unwrap_err();
        assert!(e.contains("add \"config-secret\" to grants"), "{e}");
        let e = load(
            "[[plugins]]\npath = \"a.wasm\"\ngrants = [\"config-secret\"]\n[plugins.secrets]\nt = { env = \"MISSING\" }\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("secrets.t: environment variable MISSING is not set"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        // Deadlines add these to now: anything past 100 years is refused, not a panic.
        for huge in ["18446744073709551615s", "9223372036854775807", "1e30", "200y"] {
            let e = format!("{:#}", parse_duration(huge).unwrap_err());
            assert!(e.contains("too long") || e.contains("too large"), "{huge}: {e}");
        }
        assert!(parse_duration("99y").is_ok());
    }
}
