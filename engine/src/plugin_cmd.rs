//! `attest-engine plugin check` and `plugin test`: one plugin file, loaded
//! alone with the limits and grants the config file gives it, described
//! (`check`) or run against traces (`test`). `plugin new` is in
//! [`crate::plugin_new`].

use std::path::Path;
use std::process::ExitCode;

use crate::config::{plugin_file_key, Config};
use crate::eval_cmd::{self, Format};
use crate::logging;
use crate::plugins::cache::ArtefactCache;
use crate::plugins::capabilities::Capability;
use crate::plugins::sandbox::SUPPORTED_API_VERSIONS;
use crate::plugins::{PluginHost, PluginSpec};
use crate::session::Engine;

/// Loads `file` alone, with the limits and grants the config gives it (plus
/// `extra` grants), through the compiled-artefact cache. `inspect`: use the
/// cache without writing to it (`plugin check` leaves the engine's cache as
/// it was; `plugin test` runs the plugin as the engine would, and fills it).
fn load_one_plugin(config: &Config, file: &Path, extra: &[Capability], inspect: bool) -> PluginHost {
    let key = plugin_file_key(file);
    let entry = config.plugins.iter().find(|p| plugin_file_key(&p.path) == key);
    // Only the config file's `[[plugins]]` entries are listed here: for a
    // plugin subcommand no plugin directory is read and `--plugin` is refused.
    if entry.is_none() && !config.plugins.is_empty() {
        // Entries are matched by file, not by plugin id: a copy of the
        // plugin elsewhere gets none of its entry's grants, which would
        // otherwise show only as a not-granted call.
        let named: Vec<String> = config.plugins.iter().take(5).map(|p| p.path.display().to_string()).collect();
        eprintln!(
            "attest-engine plugin: warning: no [[plugins]] entry of the config file names {} (entries are matched by file: {}{}), so it gets the default limits and no grants",
            file.display(),
            named.join(", "),
            if config.plugins.len() > 5 { ", …" } else { "" }
        );
    }
    let (limits, mut grants) = entry.map_or_else(
        || (config.plugin_defaults.clone(), Default::default()),
        |p| (p.limits.clone(), p.grants.clone()),
    );
    for c in extra {
        if !grants.allows(*c) {
            grants.capabilities.push(*c);
        }
    }
    grants.capabilities.sort();
    let spec = PluginSpec {
        path: file.to_owned(),
        limits,
        explicit: true,
        grants,
    };
    let dir = config.cache_dir.as_ref().map(|d| d.join("plugins"));
    let (cache, command) = if inspect {
        (ArtefactCache::read_only(dir), "attest-engine plugin check")
    } else {
        (ArtefactCache::new(dir), "attest-engine plugin test")
    };
    // A compile takes seconds a person would otherwise wait through in
    // silence; `-q` (errors only) keeps it quiet.
    let quiet = config.log_level_chosen && config.log_level == logging::Level::Error;
    let cache = if quiet { cache } else { cache.with_progress(command) };
    PluginHost::load_with(std::slice::from_ref(&spec), &cache)
}

/// The parser's message, with what a `\u` escape error usually means: the
/// parser reports a lone surrogate as a bad or unfinished escape.
fn json_problem(e: &serde_json::Error) -> String {
    let message = e.to_string();
    if message.contains("escape") {
        format!("{message} (a \\u escape must be a Unicode character; a lone surrogate such as \\ud800 is not one)")
    } else {
        message
    }
}

/// `attest-engine plugin test <file> --trace <t> [--plugin-config <c> | --plugin-config-json <json>]`.
pub fn test(
    mut config: Config,
    file: &Path,
    trace: &Path,
    config_file: Option<&Path>,
    config_json: Option<&str>,
    grants: &[Capability],
    format: Format,
) -> ExitCode {
    // Both inputs are read before the plugin loads: a mistake in either is
    // reported at once, not after a compile.
    let plugin_config = match (config_file, config_json) {
        (Some(path), _) => eval_cmd::read_text(
            path,
            "plugin config file (--plugin-config)",
            // What a request line leaves beside its trace: no config sent
            // over the protocol can be larger.
            crate::server::LINE_HEADROOM_BYTES as u64,
            "check that --plugin-config names one config object as JSON; over the protocol a request holds at most this much beside its trace",
        )
        .map_err(|e| format!("{e:#}"))
        .and_then(|text| {
            serde_json::from_str(&text).map_err(|e| {
                format!(
                    "plugin config file (--plugin-config) {} is not valid JSON: {}",
                    path.display(),
                    json_problem(&e)
                )
            })
        }),
        (None, Some(text)) => {
            serde_json::from_str(text).map_err(|e| format!("--plugin-config-json is not valid JSON: {}", json_problem(&e)))
        }
        (None, None) => Ok(serde_json::json!({})),
    };
    let inputs = plugin_config.and_then(|c| eval_cmd::TraceFile::read(trace).map(|t| (c, t)).map_err(|e| format!("{e:#}")));
    let (plugin_config, traces) = match inputs {
        Ok(inputs) => inputs,
        Err(e) => {
            eprintln!("attest-engine plugin test: {e}");
            return ExitCode::from(2);
        }
    };
    let host = load_one_plugin(&config, file, grants, false);
    let Some(id) = host.ids().first().cloned() else {
        let why = host.failures().first().map_or("unknown error", |f| f.error.as_str());
        eprintln!("attest-engine plugin test: refused: {}: {why}", file.display());
        return ExitCode::from(2);
    };
    if let Some(p) = host.get(&id) {
        let requested = p.capability_listing().requested;
        for c in grants.iter().filter(|c| !requested.contains(c)) {
            eprintln!(
                "attest-engine plugin test: --grant {}: {} does not request it (it requests {}), so the grant changes nothing",
                c.name(),
                p.id,
                capability_names(&requested)
            );
        }
    }
    // A trial run: nothing goes to the result history.
    config.history = None;
    config.plugins.clear();
    let engine = Engine::with_plugins(config, host);
    match eval_cmd::run_plugin(&engine, &id, plugin_config, &traces, format, &mut std::io::stdout().lock()) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("attest-engine plugin test: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Capabilities as `plugin check` and `plugin test` list them: `none`, or their names.
fn capability_names(cs: &[Capability]) -> String {
    if cs.is_empty() {
        "none".to_owned()
    } else {
        cs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
    }
}

/// `attest-engine plugin check <file>`.
pub fn check(config: &Config, file: &Path) -> ExitCode {
    let host = load_one_plugin(config, file, &[], true);
    match host.ids().first().and_then(|id| host.get(id)) {
        Some(p) => {
            println!("plugin:       {} {}", p.id, p.version);
            println!("description:  {}", p.description);
            println!("file:         {}", p.path.display());
            println!(
                "api version:  attest:plugin@{} (engine serves {})",
                p.api_version,
                SUPPORTED_API_VERSIONS.join(", ")
            );
            let cpu = match p.limits.fuel {
                Some(fuel) => format!("{fuel} fuel per call"),
                None => "no fuel metering (the deadline bounds CPU)".to_owned(),
            };
            println!(
                "limits:       {cpu}, {} MiB memory, {} ms per call",
                p.limits.memory_bytes / (1024 * 1024),
                p.limits.timeout.as_millis()
            );
            println!("loaded from:  {} in {:.1} ms", p.source, p.load_ms);
            let listing = p.capability_listing();
            println!(
                "capabilities: requested {}; granted {}",
                capability_names(&listing.requested),
                capability_names(&listing.granted)
            );
            let ungranted: Vec<Capability> = listing.requested.iter().copied().filter(|c| !listing.granted.contains(c)).collect();
            if !ungranted.is_empty() {
                println!(
                    "              not granted: {} (calls answer not-granted; grant with grants = [...] in the plugin's [[plugins]] entry)",
                    capability_names(&ungranted)
                );
            }
            if !listing.secrets.is_empty() {
                println!("secrets:      {}", listing.secrets.join(", "));
            }
            println!(
                "config schema:\n{}",
                serde_json::to_string_pretty(&p.config_schema).unwrap_or_default()
            );
            let bad = &p.default_problems;
            if bad.is_empty() {
                return ExitCode::SUCCESS;
            }
            // The plugin loads, but every assertion that leaves such a field
            // out is refused: a problem for the author to fix before shipping.
            println!(
                "problem:      the schema's default for a field does not match the schema itself ({}); an assertion that leaves the field out is refused with 1002",
                bad.join("; ")
            );
            ExitCode::from(1)
        }
        None => {
            let why = host.failures().first().map_or("unknown error", |f| f.error.as_str());
            println!("refused: {}: {why}", file.display());
            ExitCode::from(1)
        }
    }
}
