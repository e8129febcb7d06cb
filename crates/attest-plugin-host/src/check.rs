//! Layer 8: assertions answered by a WebAssembly plugin.
//!
//! The spec is `{"plugin_id": str, "config"?: object, "soft"?: bool}` (the
//! shape `attest-ai`'s `expect(...).plugin(...)` emits). The plugin is looked
//! up and the config checked against the plugin's declared schema when the
//! assertion is compiled, so an unknown id or a bad config is a `1002`
//! before anything runs. The core's evaluator batches the calls: one
//! sandboxed call per plugin per trace.

use crate::PluginHost;
use attest_core::backends::PluginCheck;
use attest_core::layers::spec::type_name;
use attest_core::layers::{Spec, SpecError};
use attest_core::text::quote;
use serde_json::Value;

/// Compiles a `plugin` assertion against the loaded plugins.
pub fn compile(spec: &Spec<'_>, host: &PluginHost) -> Result<PluginCheck, SpecError> {
    let id = spec.str("plugin_id")?;
    let plugin = host.get(id).ok_or_else(|| unknown_plugin(id, host))?;
    let mut config = match spec.raw("config") {
        None => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(SpecError::new(
                "spec.config",
                format!("spec.config must be an object, got {}", type_name(other)),
                format!("Set spec.config to an object matching the config schema of plugin {}.", quote(id)),
            ))
        }
    };
    plugin.check_config(&config).map_err(|problems| {
        SpecError::new(
            "spec.config",
            format!("config for plugin {} does not match its schema: {problems}", quote(id)),
            format!(
                "Plugin {} expects a config matching: {}",
                quote(id),
                crate::text::clip(&plugin.config_schema.to_string(), 600)
            ),
        )
    })?;
    crate::config::check_targets(&plugin.config_schema, &config).map_err(|bad| {
        SpecError::new(
            format!("spec.config.{}", bad.field),
            format!(
                "config for plugin {}: {} is not a valid target: {}",
                quote(id),
                bad.field,
                bad.message
            ),
            crate::config::BadTarget::hint(),
        )
    })?;
    let filled = crate::config::apply_defaults(&plugin.config_schema, &mut config);
    if filled && !plugin.default_problems.is_empty() {
        // A default the schema itself refuses would reach the plugin as if
        // the user had sent it; say whose value it is. (Only such plugins
        // pay for validating the config a second time.)
        plugin.check_config(&config).map_err(|problems| {
            SpecError::new(
                "spec.config",
                format!(
                    "plugin {}'s config schema fills in a default that the schema itself refuses: {problems}",
                    quote(id)
                ),
                format!(
                    "Set that field in spec.config yourself, and tell the plugin's author: `attest-engine plugin check {}` shows the problem.",
                    crate::text::clip(&plugin.path.display().to_string(), 200)
                ),
            )
        })?;
    }
    Ok(PluginCheck {
        plugin: plugin.clone(),
        config: config.to_string(),
    })
}

/// Why `id` names no loaded plugin: refused at start-up (its id claimed
/// twice), or not loaded at all, with what is available and what failed.
fn unknown_plugin(id: &str, host: &PluginHost) -> SpecError {
    let claimed = format!("plugin id {} is claimed", quote(id));
    if let Some(refused) = host.failures().iter().find(|f| f.error.starts_with(&claimed)) {
        return SpecError::new(
            "spec.plugin_id",
            format!("plugin {} was refused at start-up", quote(id)),
            crate::text::clip(&refused.error, 600),
        );
    }
    let mut detail = if host.ids().is_empty() {
        "No plugins are loaded. Start the engine with --plugin <file.wasm>, plugin_dir or [[plugins]] in the config file (see docs/plugins.md).".to_owned()
    } else {
        format!(
            "Available plugins: {}. list_plugins shows each plugin's config schema.",
            host.ids().join(", ")
        )
    };
    // One failure inline: `eval` and `plugin test` have no list_plugins,
    // and a typo in a path is the usual reason. The file named like the id
    // (`tool-args.wasm` for `tool-args`) is the likely one; else the first.
    let failures = host.failures();
    let named_like = failures
        .iter()
        .find(|f| f.path.file_stem().is_some_and(|stem| stem.eq_ignore_ascii_case(id)));
    if let Some(shown) = named_like.or(failures.first()) {
        let which = if named_like.is_some() {
            "the one named like it"
        } else {
            "the first"
        };
        detail.push_str(&format!(
            " {} plugin file(s) failed to load, {which} {}: {}; list_plugins shows each and why (`failed`).",
            failures.len(),
            quote(&shown.path.display().to_string()),
            crate::text::clip(&shown.error, 300)
        ));
    }
    SpecError::new("spec.plugin_id", format!("unknown plugin {}", quote(id)), detail)
}
