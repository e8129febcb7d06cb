//! Provider settings: the `[embedding]`, `[judge]`, `[providers]` and
//! `[prices]` sections of the config file and their environment variables.
//! Environment wins over the file.

use super::{JudgeKind, Price};
use crate::text::clip;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_EMBEDDING_MODEL: &str = "text-embedding-3-small";
pub const DEFAULT_OPENAI_JUDGE_MODEL: &str = "gpt-4.1";
pub const DEFAULT_ANTHROPIC_JUDGE_MODEL: &str = "claude-sonnet-4-5";
/// The slowest pacing `[providers] requests_per_second` may ask for.
pub const MIN_REQUESTS_PER_SECOND: f64 = 0.001;
/// The fastest: beyond it pacing is no pacing.
pub const MAX_REQUESTS_PER_SECOND: f64 = 1_000_000.0;

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEmbedding {
    pub provider: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub model: Option<String>,
    pub model_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileJudge {
    pub provider: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub model: Option<String>,
    pub samples: Option<u32>,
    /// Bias probes run on every judge assertion that names none itself.
    pub bias_probes: Option<Vec<String>>,
    pub structured_output: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileProviders {
    pub max_concurrency: Option<usize>,
    pub requests_per_second: Option<f64>,
    #[serde(default, deserialize_with = "duration_text")]
    pub attempt_timeout: Option<String>,
    pub short_circuit: Option<bool>,
    pub cache: Option<bool>,
    pub cache_max_entries: Option<u64>,
    pub cache_max_mib: Option<u64>,
    #[serde(default, deserialize_with = "size_text")]
    pub cache_max_size: Option<String>,
}

/// Where embeddings come from.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingSource {
    /// An OpenAI-compatible `/embeddings` endpoint.
    Remote {
        base_url: String,
        api_key: Option<String>,
        model: String,
    },
    /// A sentence-transformers model directory, run in-process.
    Local { dir: PathBuf },
    /// Neither: the text says why, and how to enable one.
    Off { why: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct JudgeConfig {
    pub kind: JudgeKind,
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    /// Verdicts asked for as a JSON schema (OpenAI-compatible) or a tool
    /// call (Anthropic); when off, only the nonce-tagged reply contract.
    pub structured_output: bool,
}

#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    pub embedding: EmbeddingSource,
    pub judge: Option<JudgeConfig>,
    /// `samples` when a judge assertion does not say.
    pub judge_samples: u32,
    /// Bias probes for judge assertions that name none (`[judge] bias_probes`).
    pub judge_bias_probes: Vec<attest_core::layers::Probe>,
    /// Provider HTTP calls in flight at once, across all requests.
    pub max_concurrency: usize,
    /// Provider calls started per second (`None`: unpaced).
    pub requests_per_second: Option<f64>,
    /// One HTTP attempt's time limit (the request deadline still applies).
    pub attempt_timeout: Duration,
    /// Skip paid layers when a layer 1–4 assertion of the batch hard-fails.
    pub short_circuit: bool,
    /// The persistent cache (`None`: off).
    pub cache_path: Option<PathBuf>,
    /// Rows and stored bytes (vectors, verdict texts, keys) per cache table.
    pub cache_bounds: crate::cache::Bounds,
    /// USD per million tokens, by model name.
    pub prices: HashMap<String, Price>,
}

impl Default for ProvidersConfig {
    /// Nothing configured: no judge, no embedder, no cache.
    fn default() -> Self {
        ProvidersConfig {
            embedding: EmbeddingSource::Off {
                why: "no embedding provider is configured".into(),
            },
            judge: None,
            judge_samples: 1,
            judge_bias_probes: Vec::new(),
            max_concurrency: 16,
            requests_per_second: None,
            attempt_timeout: Duration::from_secs(20),
            short_circuit: true,
            cache_path: None,
            cache_bounds: crate::cache::Bounds {
                max_entries: 100_000,
                max_bytes: DEFAULT_CACHE_MIB << 20,
            },
            prices: HashMap::new(),
        }
    }
}

/// Default bytes per provider cache table, in MiB.
pub const DEFAULT_CACHE_MIB: u64 = 512;

/// The largest `samples` a judge assertion may ask for.
pub const MAX_SAMPLES: u32 = 10;

/// Default prices (USD per million input / output tokens), as published by
/// the providers when this table was written; override them in `[prices]`.
const DEFAULT_PRICES: &[(&str, f64, f64)] = &[
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4.1-mini", 0.4, 1.6),
    ("gpt-4.1-nano", 0.1, 0.4),
    ("gpt-4o", 2.5, 10.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("text-embedding-3-small", 0.02, 0.0),
    ("text-embedding-3-large", 0.13, 0.0),
    ("claude-sonnet-4-5", 3.0, 15.0),
    ("claude-haiku-4-5", 1.0, 5.0),
];

/// The default local model directory: `~/.attest/models/all-MiniLM-L6-v2`.
pub fn default_model_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".attest").join("models").join("all-MiniLM-L6-v2"))
}

/// The file's sections, as read by [`crate::config`].
pub struct FileSections<'a> {
    pub embedding: Option<&'a FileEmbedding>,
    pub judge: Option<&'a FileJudge>,
    pub providers: Option<&'a FileProviders>,
    pub prices: Option<&'a HashMap<String, Price>>,
    /// The config file's directory, for relative paths.
    pub base: &'a Path,
    /// The config file, named in errors about its values.
    pub file: Option<&'a Path>,
}

impl FileSections<'_> {
    /// How an error names a setting read from the file: `[judge] samples in
    /// /etc/attest.toml`.
    fn key(&self, key: &str) -> String {
        match self.file {
            Some(p) => format!("{key} in {}", p.display()),
            None => key.to_owned(),
        }
    }

    /// A setting taken from the environment variable `var` when `env` has
    /// it, else from the file: the value and how an error names it.
    fn pick(&self, env: impl Fn(&str) -> Option<String>, var: &str, key: &str, from_file: Option<String>) -> (Option<String>, String) {
        match env(var) {
            Some(v) => (Some(v), var.to_owned()),
            None => (from_file, self.key(key)),
        }
    }
}

impl ProvidersConfig {
    /// Each provider setting from its `ATTEST_*` variable when set, else
    /// from the config file's section, else its default; a function per
    /// section below.
    pub fn load(file: FileSections<'_>, cache_dir: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Result<ProvidersConfig> {
        let e = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let fp = file.providers.cloned().unwrap_or_default();
        let openai_key = e("ATTEST_OPENAI_API_KEY");
        let embedding = embedding(&file, &e, openai_key.clone())?;
        let judge = judge(&file, &e, openai_key)?;
        let judge_samples = judge_samples(&file, &e)?;
        let judge_bias_probes = judge_bias_probes(&file, &e)?;
        let max_concurrency = fp.max_concurrency.unwrap_or(16);
        if !(1..=1024).contains(&max_concurrency) {
            bail!(
                "{}: must be between 1 and 1024, got {max_concurrency}",
                file.key("[providers] max_concurrency")
            );
        }
        if let Some(r) = fp.requests_per_second {
            // Below one request per 1,000 s a request could not be paced
            // within any deadline.
            if !(r.is_finite() && (MIN_REQUESTS_PER_SECOND..=MAX_REQUESTS_PER_SECOND).contains(&r)) {
                bail!(
                    "{}: must be between {MIN_REQUESTS_PER_SECOND} and {MAX_REQUESTS_PER_SECOND}, got {r}",
                    file.key("[providers] requests_per_second")
                );
            }
        }
        let attempt_timeout = match &fp.attempt_timeout {
            Some(t) => parse_duration(t).with_context(|| file.key("[providers] attempt_timeout"))?,
            None => Duration::from_secs(20),
        };
        if attempt_timeout.is_zero() {
            bail!("{}: must be greater than zero", file.key("[providers] attempt_timeout"));
        }
        let cache_max_entries = fp.cache_max_entries.unwrap_or(100_000);
        if cache_max_entries == 0 {
            bail!(
                "{}: must be greater than zero (set cache = false in [providers] to switch the cache off)",
                file.key("[providers] cache_max_entries")
            );
        }
        let cache_max_mib = cache_max_mib(&file, &fp)?;
        let prices = prices(&file)?;
        Ok(ProvidersConfig {
            embedding,
            judge,
            judge_samples,
            judge_bias_probes,
            max_concurrency,
            requests_per_second: fp.requests_per_second,
            attempt_timeout,
            short_circuit: fp.short_circuit.unwrap_or(true),
            cache_path: cache_dir.filter(|_| fp.cache.unwrap_or(true)).map(|d| d.join("providers.sqlite3")),
            cache_bounds: crate::cache::Bounds {
                max_entries: cache_max_entries,
                max_bytes: cache_max_mib << 20,
            },
            prices,
        })
    }
}

/// The environment as the providers read it: a variable set to blanks is unset.
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// `[embedding]`: the layer 5 provider.
fn embedding(file: &FileSections<'_>, e: Env<'_>, openai_key: Option<String>) -> Result<EmbeddingSource> {
    let fe = file.embedding.cloned().unwrap_or_default();
    let (provider, provider_origin) = file.pick(e, "ATTEST_EMBEDDING_PROVIDER", "[embedding] provider", fe.provider);
    let provider = provider.unwrap_or_else(|| "auto".into());
    let (base_url, base_url_origin) = file.pick(e, "ATTEST_EMBEDDING_BASE_URL", "[embedding] base_url", fe.base_url);
    let api_key = e("ATTEST_EMBEDDING_API_KEY").or(fe.api_key).or_else(|| openai_key.clone());
    let model = e("ATTEST_EMBEDDING_MODEL").or(fe.model);
    let dir = e("ATTEST_EMBEDDING_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| fe.model_dir.map(|d| file.base.join(d)))
        .or_else(default_model_dir);
    let remote = |base_url: Option<String>| -> Result<EmbeddingSource> {
        Ok(EmbeddingSource::Remote {
            base_url: check_url(base_url.as_deref().unwrap_or(OPENAI_BASE_URL), &base_url_origin)?,
            api_key: api_key.clone(),
            model: model.clone().unwrap_or_else(|| DEFAULT_EMBEDDING_MODEL.into()),
        })
    };
    let local = |dir: Option<PathBuf>| match dir {
        Some(dir) => {
            let missing = super::local::missing_files(&dir);
            if missing.is_empty() {
                EmbeddingSource::Local { dir }
            } else {
                EmbeddingSource::Off {
                    why: format!("no local embedding model at {} (missing {})", dir.display(), missing.join(", ")),
                }
            }
        }
        None => EmbeddingSource::Off {
            why: "no local model directory (HOME is not set)".into(),
        },
    };
    Ok(match provider.trim().to_ascii_lowercase().as_str() {
        "auto" if base_url.is_some() || api_key.is_some() => remote(base_url)?,
        "auto" => local(dir),
        "openai" => remote(base_url)?,
        "local" => local(dir),
        "off" => EmbeddingSource::Off {
            why: "embeddings are switched off (embedding provider = \"off\")".into(),
        },
        other => bail!(
            "{provider_origin}: unknown embedding provider '{}'; use auto, openai, local or off",
            clip(other, 60)
        ),
    })
}

/// `[judge]`: the layer 6 provider, if any.
fn judge(file: &FileSections<'_>, e: Env<'_>, openai_key: Option<String>) -> Result<Option<JudgeConfig>> {
    let fj = file.judge.cloned().unwrap_or_default();
    let (provider, provider_origin) = file.pick(e, "ATTEST_JUDGE_PROVIDER", "[judge] provider", fj.provider);
    let (base_url, base_url_origin) = file.pick(e, "ATTEST_JUDGE_BASE_URL", "[judge] base_url", fj.base_url);
    let api_key = e("ATTEST_JUDGE_API_KEY").or(fj.api_key);
    let anthropic_key = e("ATTEST_ANTHROPIC_API_KEY");
    let kind = match provider.as_deref().map(|p| p.trim().to_ascii_lowercase()) {
        Some(p) if p == "openai" => Some(JudgeKind::OpenAi),
        Some(p) if p == "anthropic" => Some(JudgeKind::Anthropic),
        Some(p) if p == "off" => None,
        Some(other) => bail!(
            "{provider_origin}: unknown judge provider '{}'; use openai, anthropic or off",
            clip(&other, 60)
        ),
        None if base_url.is_some() || api_key.is_some() || openai_key.is_some() => Some(JudgeKind::OpenAi),
        None if anthropic_key.is_some() => Some(JudgeKind::Anthropic),
        None => None,
    };
    Ok(match kind {
        Some(kind) => {
            let (default_url, default_model, fallback_key) = match kind {
                JudgeKind::OpenAi => (OPENAI_BASE_URL, DEFAULT_OPENAI_JUDGE_MODEL, openai_key),
                JudgeKind::Anthropic => (ANTHROPIC_BASE_URL, DEFAULT_ANTHROPIC_JUDGE_MODEL, anthropic_key),
            };
            Some(JudgeConfig {
                kind,
                base_url: check_url(base_url.as_deref().unwrap_or(default_url), &base_url_origin)?,
                api_key: api_key.or(fallback_key),
                model: e("ATTEST_JUDGE_MODEL").or(fj.model).unwrap_or_else(|| default_model.into()),
                structured_output: match e("ATTEST_JUDGE_STRUCTURED_OUTPUT") {
                    Some(v) => parse_bool(&v).context("ATTEST_JUDGE_STRUCTURED_OUTPUT")?,
                    None => fj.structured_output.unwrap_or(true),
                },
            })
        }
        None => None,
    })
}

/// `[judge] samples`.
fn judge_samples(file: &FileSections<'_>, e: Env<'_>) -> Result<u32> {
    let fj = file.judge.cloned().unwrap_or_default();
    let (judge_samples, samples_origin) = match e("ATTEST_JUDGE_SAMPLES") {
        Some(v) => (
            v.trim().parse().with_context(|| {
                format!(
                    "ATTEST_JUDGE_SAMPLES: '{}' is not a whole number; give 1 to {MAX_SAMPLES}",
                    clip(&v, 60)
                )
            })?,
            "ATTEST_JUDGE_SAMPLES".to_owned(),
        ),
        None => (fj.samples.unwrap_or(1), file.key("[judge] samples")),
    };
    if !(1..=MAX_SAMPLES).contains(&judge_samples) {
        bail!("{samples_origin}: judge samples must be between 1 and {MAX_SAMPLES}, got {judge_samples}");
    }
    Ok(judge_samples)
}

/// `[judge] bias_probes`, each once.
fn judge_bias_probes(file: &FileSections<'_>, e: Env<'_>) -> Result<Vec<attest_core::layers::Probe>> {
    let fj = file.judge.cloned().unwrap_or_default();
    let (probe_names, probes_origin): (Vec<String>, String) = match e("ATTEST_JUDGE_BIAS_PROBES") {
        Some(v) => (
            v.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect(),
            "ATTEST_JUDGE_BIAS_PROBES".to_owned(),
        ),
        None => (fj.bias_probes.unwrap_or_default(), file.key("[judge] bias_probes")),
    };
    let mut judge_bias_probes = Vec::new();
    for name in &probe_names {
        let Some(p) = attest_core::layers::Probe::parse(name) else {
            bail!(
                "{probes_origin}: unknown judge bias probe '{}'; use any of verbosity, position, self_preference",
                clip(name, 60)
            );
        };
        if !judge_bias_probes.contains(&p) {
            judge_bias_probes.push(p);
        }
    }
    Ok(judge_bias_probes)
}

/// `[providers] cache_max_size` (or the older `cache_max_mib`), in MiB.
fn cache_max_mib(file: &FileSections<'_>, fp: &FileProviders) -> Result<u64> {
    let src = |name: &str| file.key(&format!("[providers] {name}"));
    let bytes = size(
        &fp.cache_max_size,
        fp.cache_max_mib,
        "cache_max",
        (1, MAX_MIB),
        DEFAULT_CACHE_MIB << 20,
        &src,
    )
    .map_err(|e| anyhow::anyhow!("{e:#} (set cache = false in [providers] to switch the cache off)"))?;
    Ok(bytes >> 20)
}

/// The built-in prices, with the file's `[prices]` over them.
fn prices(file: &FileSections<'_>) -> Result<HashMap<String, Price>> {
    let mut prices: HashMap<String, Price> = DEFAULT_PRICES
        .iter()
        .map(|(m, i, o)| {
            (
                m.to_string(),
                Price {
                    input_per_mtok: *i,
                    output_per_mtok: *o,
                },
            )
        })
        .collect();
    for (model, p) in file.prices.into_iter().flatten() {
        if !(p.input_per_mtok.is_finite() && p.input_per_mtok >= 0.0 && p.output_per_mtok.is_finite() && p.output_per_mtok >= 0.0) {
            bail!(
                "{}: prices must be non-negative numbers",
                file.key(&format!("[prices] \"{}\"", clip(model, 60)))
            );
        }
        prices.insert(model.clone(), *p);
    }
    Ok(prices)
}

fn check_url(url: &str, what: &str) -> Result<String> {
    let shown = clip(url, 200);
    let parsed = reqwest::Url::parse(url).with_context(|| format!("{what}: '{shown}' is not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("{what}: '{shown}' must be an http or https URL");
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// The longest duration any setting takes: a deadline is `now` plus a
/// duration, and sums of durations must not overflow either.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `30s`, `1500ms`, `2m`, or a bare number of seconds; at most
/// [`MAX_DURATION`] (100 years).
/// A switch from the environment: `1`/`true`/`yes`/`on` or
/// `0`/`false`/`no`/`off` (any case; empty is off).
pub fn parse_bool(s: &str) -> anyhow::Result<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        other => bail!("'{}' is not a boolean; use true or false", clip(other, 60)),
    }
}

pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let d = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX),
        _ => humantime::parse_duration(s)
            .with_context(|| format!("'{s}' is not a duration; use e.g. 30s, 1500ms, 2m or a number of seconds"))?,
    };
    if d > MAX_DURATION {
        anyhow::bail!(
            "'{s}' is too long: durations are at most 100 years ({}s); use e.g. 30s, 1500ms or 2m",
            MAX_DURATION.as_secs()
        );
    }
    Ok(d)
}

/// A duration as a config file may write it: text (`"30s"`) or a bare
/// number of seconds (`30`, `0.5`), kept as text for [`parse_duration`].
/// For `#[serde(default, deserialize_with = "duration_text")]` fields.
pub fn duration_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<String>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a duration such as \"30s\", \"1500ms\", \"2m\", or a number of seconds")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
    }
    d.deserialize_any(Visitor)
}

/// A size as a config file writes it: text with its unit (`"256MiB"`,
/// `"1GB"`), kept as text for [`size_bytes`]. For `#[serde(default,
/// deserialize_with = "size_text")]` fields.
pub fn size_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<String>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size with its unit, such as \"256MiB\" or \"1GB\"")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
    }
    d.deserialize_any(Visitor)
}

/// Largest size a key may take (1 TiB): larger ones are refused, not wrapped.
pub const MAX_MIB: u64 = 1 << 20;

/// A size key: `<key>_size` with its unit (`"256MiB"`), or the older
/// `<key>_mib` as a whole number of MiB; between `min_mib` and `max_mib`
/// MiB. Neither: `default` bytes. `src` names a key where the user set it.
/// The engine's settings and `[providers]` read sizes this one way.
pub fn size(
    text: &Option<String>,
    mib: Option<u64>,
    key: &str,
    (min_mib, max_mib): (u64, u64),
    default: u64,
    src: &dyn Fn(&str) -> String,
) -> Result<u64> {
    let max = if max_mib == MAX_MIB {
        "1TiB".to_owned()
    } else {
        format!("{max_mib}MiB")
    };
    let range = |shown: String, bytes: u64, name: &str| {
        if (min_mib << 20..=max_mib << 20).contains(&bytes) {
            Ok(bytes)
        } else {
            bail!(
                "{} must be between {min_mib}MiB and {max}, got {shown}; leave it out for the default, {}MiB",
                src(name),
                default >> 20
            )
        }
    };
    // A plugin's `memory` has no `_size`: it is the limit itself.
    let name = if key == "memory" { key.to_owned() } else { format!("{key}_size") };
    match (text, mib) {
        (Some(_), Some(_)) => bail!("{} and {key}_mib are both set; keep {name} (e.g. {name} = \"256MiB\")", src(&name)),
        (Some(t), None) => range(t.clone(), size_bytes(t).with_context(|| src(&name))?, &name),
        (None, Some(m)) => range(format!("{m}"), m.saturating_mul(1 << 20), &format!("{key}_mib")),
        (None, None) => Ok(default),
    }
}

/// Bytes of a size written with its unit (KiB and the like are 1024s, KB
/// and the like 1000s). A bare number is refused: which unit it meant
/// cannot be told.
pub fn size_bytes(s: &str) -> Result<u64> {
    if s.trim().parse::<f64>().is_ok() {
        bail!("{s:?} has no unit; write it with one, such as \"{}MiB\" or \"1GB\"", s.trim());
    }
    attest_io::size_with_unit(s, 1).with_context(|| format!("{s:?} is not a size; write it with its unit, such as \"256MiB\" or \"1GB\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<ProvidersConfig> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let sections = FileSections {
            embedding: None,
            judge: None,
            providers: None,
            prices: None,
            base: Path::new(""),
            file: None,
        };
        ProvidersConfig::load(sections, None, &move |k| m.get(k).cloned())
    }

    #[test]
    fn pacing_is_refused_outside_its_range() {
        for rate in [1e-300, 1e-19, 0.0, -1.0, f64::NAN, 1e7] {
            let providers = FileProviders {
                requests_per_second: Some(rate),
                ..FileProviders::default()
            };
            let sections = FileSections {
                embedding: None,
                judge: None,
                providers: Some(&providers),
                prices: None,
                base: Path::new(""),
                file: None,
            };
            let e = ProvidersConfig::load(sections, None, &|_| None).unwrap_err().to_string();
            assert!(
                e.contains("[providers] requests_per_second: must be between 0.001 and 1000000"),
                "{rate}: {e}"
            );
        }
    }

    #[test]
    fn nothing_configured_means_no_judge_and_no_remote_embedder() {
        let c = load(&[("ATTEST_EMBEDDING_MODEL_DIR", "/nonexistent/model")]).unwrap();
        assert!(c.judge.is_none());
        match c.embedding {
            EmbeddingSource::Off { why } => assert!(why.contains("/nonexistent/model"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_base_url_enables_an_openai_compatible_provider() {
        let c = load(&[
            ("ATTEST_JUDGE_BASE_URL", "http://127.0.0.1:11434/v1/"),
            ("ATTEST_EMBEDDING_BASE_URL", "http://127.0.0.1:11434/v1"),
            ("ATTEST_EMBEDDING_MODEL", "nomic-embed-text"),
        ])
        .unwrap();
        let j = c.judge.unwrap();
        assert_eq!(
            (j.kind, j.base_url.as_str(), j.model.as_str()),
            (JudgeKind::OpenAi, "http://127.0.0.1:11434/v1", "gpt-4.1")
        );
        assert_eq!(
            c.embedding,
            EmbeddingSource::Remote {
                base_url: "http://127.0.0.1:11434/v1".into(),
                api_key: None,
                model: "nomic-embed-text".into()
            }
        );
    }

    #[test]
    fn anthropic_key_selects_the_anthropic_judge() {
        let c = load(&[("ATTEST_ANTHROPIC_API_KEY", "k")]).unwrap();
        let j = c.judge.unwrap();
        assert_eq!((j.kind, j.api_key.as_deref()), (JudgeKind::Anthropic, Some("k")));
    }

    #[test]
    fn bad_values_are_errors_naming_where_the_value_came_from() {
        for (var, value, want) in [
            (
                "ATTEST_JUDGE_PROVIDER",
                "gemini",
                "unknown judge provider 'gemini'; use openai, anthropic or off",
            ),
            (
                "ATTEST_EMBEDDING_PROVIDER",
                "onnx",
                "unknown embedding provider 'onnx'; use auto, openai, local or off",
            ),
            ("ATTEST_JUDGE_BASE_URL", "ftp://x", "'ftp://x' must be an http or https URL"),
            ("ATTEST_EMBEDDING_BASE_URL", "not a url", "'not a url' is not a URL"),
            ("ATTEST_JUDGE_SAMPLES", "0", "judge samples must be between 1 and 10, got 0"),
            ("ATTEST_JUDGE_SAMPLES", "11", "judge samples must be between 1 and 10, got 11"),
            ("ATTEST_JUDGE_SAMPLES", "many", "'many' is not a whole number; give 1 to 10"),
            ("ATTEST_JUDGE_BIAS_PROBES", "position,tone", "unknown judge bias probe 'tone'"),
        ] {
            let e = format!("{:#}", load(&[(var, value)]).unwrap_err());
            assert!(e.starts_with(&format!("{var}: ")) && e.contains(want), "{var}={value}: {e}");
        }
        // The same settings from the file name the file's key and the file.
        let judge = FileJudge {
            provider: Some("gemini".into()),
            ..FileJudge::default()
        };
        let sections = FileSections {
            embedding: None,
            judge: Some(&judge),
            providers: None,
            prices: None,
            base: Path::new("/etc"),
            file: Some(Path::new("/etc/attest.toml")),
        };
        let e = ProvidersConfig::load(sections, None, &|_| None).unwrap_err().to_string();
        assert!(
            e.starts_with("[judge] provider in /etc/attest.toml: unknown judge provider 'gemini'"),
            "{e}"
        );
    }

    #[test]
    fn cache_bounds_of_zero_are_refused_by_name() {
        let load_providers = |p: FileProviders| {
            let sections = FileSections {
                embedding: None,
                judge: None,
                providers: Some(&p),
                prices: None,
                base: Path::new(""),
                file: None,
            };
            ProvidersConfig::load(sections, None, &|_| None)
        };
        let ok = load_providers(FileProviders::default()).unwrap();
        assert_eq!((ok.cache_bounds.max_entries, ok.cache_bounds.max_bytes), (100_000, 512 << 20));
        for (p, key) in [
            (
                FileProviders {
                    cache_max_mib: Some(0),
                    ..Default::default()
                },
                "[providers] cache_max_mib must be between 1MiB and 1TiB",
            ),
            (
                FileProviders {
                    cache_max_mib: Some(u64::MAX),
                    ..Default::default()
                },
                "[providers] cache_max_mib must be between 1MiB and 1TiB",
            ),
            (
                FileProviders {
                    cache_max_entries: Some(0),
                    ..Default::default()
                },
                "[providers] cache_max_entries: must be greater than zero",
            ),
        ] {
            let e = load_providers(p).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("set cache = false in [providers]"), "{e}");
        }
        let sized = |text: &str| FileProviders {
            cache_max_size: Some(text.to_owned()),
            ..Default::default()
        };
        let ok = load_providers(sized("2GiB")).unwrap();
        assert_eq!(ok.cache_bounds.max_bytes, 2 << 30);
        let e = format!("{:#}", load_providers(sized("512")).unwrap_err());
        assert!(e.contains("[providers] cache_max_size") && e.contains("\"512\" has no unit"), "{e}");
        let e = load_providers(sized("100KiB")).unwrap_err().to_string();
        assert!(e.contains("must be between 1MiB and 1TiB, got 100KiB"), "{e}");
    }
}
