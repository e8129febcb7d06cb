//! Trace validation, exactly Attest protocol v1 §7: the same limits, the same messages and
//! the same order, stopping at the first failure:
//!
//! 1. top-level JSON parse (the trace must be an object);
//! 2. `schema_version`;
//! 3. required fields (`trace_id`, `output`);
//! 4. size and count limits (wire size, step count, `output.message` length);
//! 5. field type and format (`agent_id`, `steps`, `metadata`, `metadata.timestamp`,
//!    `parent_trace_id`);
//! 6. step-level rules (object, `type`, `name`, `result` payload size);
//! 7. sub-trace depth.
//!
//! Sub-traces are then validated with rules 2–6 in step order, and finally
//! the tree as a whole (rule 8, see [`super::tree::check_tree`]): each
//! sub-trace's `parent_trace_id`, when set, names its parent's `trace_id`,
//! and no `trace_id` appears twice. Every error is a `1001 INVALID_TRACE`
//! with an actionable `detail` and the offending field.

use super::{StepType, Trace};
use crate::text::{clip, quote};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The schema versions the engine accepts: current and previous (Attest protocol v1 §7 table).
pub const CURRENT_SCHEMA_VERSION: i64 = 1;
pub const OLDEST_SCHEMA_VERSION: i64 = 0;

/// Longest `trace_id`, `parent_trace_id` or `agent_id` accepted, in bytes.
/// Ids are stored with every history row and written into log lines and
/// messages, so an unbounded one would make each of those unbounded too.
pub const MAX_ID_BYTES: usize = 1024;

/// Size and count limits. The defaults are Attest protocol v1 §7's; they are also what
/// `initialize` advertises.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_trace_bytes: usize,
    pub max_steps: usize,
    pub max_output_chars: usize,
    pub max_step_result_bytes: usize,
    pub max_depth: usize,
    /// Reject unknown step types instead of tolerating them (Attest protocol v1 §7 "strict mode").
    pub strict_step_types: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_trace_bytes: 10_485_760,
            max_steps: 10_000,
            max_output_chars: 500_000,
            max_step_result_bytes: 1_048_576,
            max_depth: 5,
            strict_step_types: false,
        }
    }
}

/// A validated trace plus the non-fatal findings worth logging.
#[derive(Debug)]
pub struct Parsed {
    pub trace: Trace,
    pub warnings: Vec<String>,
}

/// Why a trace was refused: the member at fault (`trace.steps[2].type`),
/// what is wrong with it, and what to do. It becomes error 1001 on the wire
/// (in the engine's `errors.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceError {
    pub field: String,
    pub message: String,
    pub detail: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.field)
    }
}

impl std::error::Error for TraceError {}

/// A trace of `bytes` over [`Limits::max_trace_bytes`], at `path`. Front
/// doors whose input is not already bounded by a line (`eval`'s files) check
/// this before parsing, so an oversized trace costs no parse.
pub fn too_large(bytes: usize, limits: &Limits, path: &str) -> TraceError {
    invalid(
        format!("trace exceeds max size: {bytes} > {} bytes", limits.max_trace_bytes),
        format!(
            "Reduce trace size by filtering steps or truncating tool results. Max allowed: {} bytes ({} MB).",
            limits.max_trace_bytes,
            limits.max_trace_bytes / (1024 * 1024)
        ),
        path.to_owned(),
    )
}

fn invalid(message: impl Into<String>, detail: impl Into<String>, field: impl Into<String>) -> TraceError {
    TraceError {
        field: field.into(),
        message: message.into(),
        detail: detail.into(),
    }
}

/// Where in the tree a trace sits, for messages and field paths.
struct Level<'a> {
    /// `trace` or `trace.steps[1].sub_trace`.
    path: String,
    /// Empty for the root, else ` (in sub_trace of step 'x' at depth N)`.
    suffix: String,
    obj: &'a Map<String, Value>,
}

/// Parses and validates the `trace` member of an `evaluate_batch` request.
/// `raw` is the trace exactly as it appeared on the wire, so its length is
/// the wire size the limit applies to.
pub fn parse_trace(raw: &RawValue, limits: &Limits) -> Result<Parsed, TraceError> {
    let parsed = parse_trace_levels(raw, limits)?;
    // 8. Tree integrity, on the typed tree: the links are easier to follow
    // there, and the check returns at once for traces without sub-traces.
    super::tree::check_tree(&parsed.trace).map_err(|e| invalid(e.message, e.detail, e.field))?;
    Ok(parsed)
}

/// The 1001 for a trace whose text holds a value nothing can represent.
/// Nesting beyond the parser's limit is almost always sub-traces nested far
/// too deep, which rule 7 names in its own words.
pub fn unrepresentable_trace(text: &str, u: crate::json_errors::Unrepresentable, max_depth: usize) -> TraceError {
    if u.message.starts_with("nesting too deep") {
        let depth = crate::json_errors::max_key_nesting(text, "sub_trace");
        if depth > max_depth {
            return invalid(
                format!("trace nesting depth {depth} exceeds maximum {max_depth}"),
                format!(
                    "Sub-agent traces may nest at most {max_depth} levels below the root trace. Flatten deep delegation chains or submit the deepest sub-traces as separate traces."
                ),
                "trace.steps",
            );
        }
    }
    invalid(u.message, crate::json_errors::PLAIN_JSON_HINT, u.field)
}

/// Rules 1–7: every level of the tree, but not the links between levels
/// (`validate_trace_tree` reports those instead of refusing the trace).
pub fn parse_trace_levels(raw: &RawValue, limits: &Limits) -> Result<Parsed, TraceError> {
    // 1. Top-level parse.
    let value: Value = serde_json::from_str(raw.get()).map_err(|e| match crate::json_errors::unrepresentable(raw.get(), &e, "trace") {
        Some(u) => unrepresentable_trace(raw.get(), u, limits.max_depth),
        None => invalid(
            format!("trace is not valid JSON: {}", clip(&e.to_string(), 200)),
            "Send the trace as a JSON object.",
            "trace",
        ),
    })?;
    let Value::Object(obj) = value else {
        return Err(invalid(
            format!("trace must be a JSON object, got {}", kind_of(&value)),
            "Send the trace as a JSON object with schema_version, trace_id, output and optional steps/metadata (spec §3).",
            "trace",
        ));
    };
    let mut warnings = Vec::new();
    let root = Level {
        path: "trace".into(),
        suffix: String::new(),
        obj: &obj,
    };
    check_level(&root, Some(raw.get().len()), limits, &mut warnings)?;
    // 7. Depth of the whole tree.
    let depth = tree_depth(&obj);
    if depth > limits.max_depth {
        return Err(invalid(
            format!("trace nesting depth {depth} exceeds maximum {}", limits.max_depth),
            format!(
                "Sub-agent traces may nest at most {} levels below the root trace. Flatten deep delegation chains or submit the deepest sub-traces as separate traces.",
                limits.max_depth
            ),
            "trace.steps",
        ));
    }
    check_sub_traces(&root, 1, limits, &mut warnings)?;
    Ok(Parsed {
        trace: Trace::from_validated(obj),
        warnings,
    })
}

fn check_sub_traces(level: &Level<'_>, depth: usize, limits: &Limits, warnings: &mut Vec<String>) -> Result<(), TraceError> {
    let Some(Value::Array(steps)) = level.obj.get("steps") else {
        return Ok(());
    };
    for (i, step) in steps.iter().enumerate() {
        let Some(Value::Object(sub)) = step.get("sub_trace") else {
            continue;
        };
        let name = step.get("name").and_then(Value::as_str).unwrap_or_default();
        let child = Level {
            path: format!("{}.steps[{i}].sub_trace", level.path),
            suffix: format!(" (in sub_trace of step {} at depth {depth})", quote(name)),
            obj: sub,
        };
        check_level(&child, None, limits, warnings)?;
        check_sub_traces(&child, depth + 1, limits, warnings)?;
    }
    Ok(())
}

/// Rules 2–6 for one trace of the tree. `wire_bytes` is known for the root only;
/// sub-traces are part of it.
fn check_level(level: &Level<'_>, wire_bytes: Option<usize>, limits: &Limits, warnings: &mut Vec<String>) -> Result<(), TraceError> {
    let obj = level.obj;
    let (path, sfx) = (level.path.as_str(), level.suffix.as_str());

    // 2. schema_version.
    match obj.get("schema_version") {
        None | Some(Value::Null) => {
            return Err(invalid(
                format!("trace missing required field: schema_version{sfx}"),
                format!("Set schema_version to {CURRENT_SCHEMA_VERSION} (current) or {OLDEST_SCHEMA_VERSION} (previous, deprecated)."),
                format!("{path}.schema_version"),
            ))
        }
        Some(v) => {
            match v.as_i64().filter(|_| v.is_i64() || v.is_u64()) {
                None => {
                    return Err(invalid(
                        format!("trace schema_version must be an integer, got {}{sfx}", describe(v)),
                        format!("Set schema_version to the integer {CURRENT_SCHEMA_VERSION}."),
                        format!("{path}.schema_version"),
                    ))
                }
                Some(n) if !(OLDEST_SCHEMA_VERSION..=CURRENT_SCHEMA_VERSION).contains(&n) => {
                    let detail = if n > CURRENT_SCHEMA_VERSION {
                        format!("Version {n} is newer than this engine understands. Upgrade attest-engine, or emit schema_version {CURRENT_SCHEMA_VERSION}.")
                    } else {
                        format!("Version {n} is no longer supported. Migrate the trace to schema_version {CURRENT_SCHEMA_VERSION} (spec §3) and upgrade the SDK that produced it.")
                    };
                    return Err(invalid(
                    format!("unsupported schema_version {n}; engine supports versions {OLDEST_SCHEMA_VERSION} to {CURRENT_SCHEMA_VERSION}{sfx}"),
                    detail,
                    format!("{path}.schema_version"),
                ));
                }
                Some(n) if n < CURRENT_SCHEMA_VERSION => warnings.push(format!(
                    "{path} uses deprecated schema_version {n}; migrate to {CURRENT_SCHEMA_VERSION}"
                )),
                Some(_) => {}
            }
        }
    }

    // 3. Required fields.
    match obj.get("trace_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => check_id_len(s, "trace_id", path, sfx)?,
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid(
                format!("trace missing required field: trace_id{sfx}"),
                "Every trace must include a non-empty trace_id string.",
                format!("{path}.trace_id"),
            ))
        }
        Some(other) => {
            return Err(invalid(
                format!("trace trace_id must be a string, got {}{sfx}", describe(other)),
                "Every trace must include a non-empty trace_id string.",
                format!("{path}.trace_id"),
            ))
        }
    }
    match obj.get("output") {
        None => {
            return Err(invalid(
                format!("trace missing required field: output{sfx}"),
                "Every trace must include an output object with at least one field, e.g. {\"message\": \"...\"}.",
                format!("{path}.output"),
            ))
        }
        Some(Value::Object(m)) if !m.is_empty() => {}
        Some(other) => {
            return Err(invalid(
                format!("trace output must be a non-empty JSON object, got {}{sfx}", describe(other)),
                "Set output to an object with at least one field, e.g. {\"message\": \"...\"}; wrap non-object outputs as {\"result\": <value>}.",
                format!("{path}.output"),
            ))
        }
    }

    // 4. Size and count limits.
    if let Some(bytes) = wire_bytes {
        if bytes > limits.max_trace_bytes {
            return Err(too_large(bytes, limits, path));
        }
    }
    if let Some(Value::Array(steps)) = obj.get("steps") {
        if steps.len() > limits.max_steps {
            return Err(invalid(
                format!("trace exceeds max steps: {} > {}{sfx}", steps.len(), limits.max_steps),
                format!(
                    "A trace may hold at most {} steps. Split long sessions into several traces or drop repetitive steps.",
                    limits.max_steps
                ),
                format!("{path}.steps"),
            ));
        }
    }
    if let Some(Value::String(msg)) = obj.get("output").and_then(|o| o.get("message")) {
        // Byte length bounds the character count from above: count only when it could matter.
        if msg.len() > limits.max_output_chars {
            let chars = msg.chars().count();
            if chars > limits.max_output_chars {
                return Err(invalid(
                    format!("output.message length {chars} exceeds {} characters{sfx}", limits.max_output_chars),
                    format!(
                        "Truncate output.message to at most {} characters before submitting; move bulky data into output.structured or step results.",
                        limits.max_output_chars
                    ),
                    format!("{path}.output.message"),
                ));
            }
        }
    }

    // 5. Field types and formats.
    check_optional_id(obj, "agent_id", path, sfx)?;
    match obj.get("steps") {
        None | Some(Value::Null) | Some(Value::Array(_)) => {}
        Some(other) => {
            return Err(invalid(
                format!("trace steps must be an array, got {}{sfx}", describe(other)),
                "Send steps as an array of step objects (it may be empty).",
                format!("{path}.steps"),
            ))
        }
    }
    match obj.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(meta)) => check_metadata(meta, path, sfx)?,
        Some(other) => {
            return Err(invalid(
                format!("trace metadata must be an object, got {}{sfx}", describe(other)),
                "Send metadata as an object, e.g. {\"total_tokens\": 1350, \"cost_usd\": 0.0067, \"latency_ms\": 4200}.",
                format!("{path}.metadata"),
            ))
        }
    }
    match obj.get("parent_trace_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if !s.trim().is_empty() => check_id_len(s, "parent_trace_id", path, sfx)?,
        Some(other) => {
            return Err(invalid(
                format!(
                    "trace parent_trace_id must be a non-empty string or null, got {}{sfx}",
                    describe(other)
                ),
                "Set parent_trace_id to the parent trace's trace_id, or to null (or omit it) for a root trace.",
                format!("{path}.parent_trace_id"),
            ))
        }
    }

    // 6. Step-level rules.
    if let Some(Value::Array(steps)) = obj.get("steps") {
        let check_payload = wire_bytes.is_none_or(|b| b > limits.max_step_result_bytes);
        for (i, step) in steps.iter().enumerate() {
            check_step(i, step, path, sfx, limits, check_payload)?;
        }
    }
    Ok(())
}

fn check_step(i: usize, step: &Value, path: &str, sfx: &str, limits: &Limits, check_payload: bool) -> Result<(), TraceError> {
    let field = format!("{path}.steps[{i}]");
    let Value::Object(s) = step else {
        return Err(invalid(
            format!("trace step {i} must be an object, got {}{sfx}", describe(step)),
            "Each step is an object with at least type and name.",
            field,
        ));
    };
    let name = match s.get("name") {
        Some(Value::String(n)) if !n.trim().is_empty() => n.as_str(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid(
                format!("trace step {i} missing required field: name{sfx}"),
                "Every step needs a non-empty name (the tool, model or agent it represents); trace assertions match on it.",
                format!("{field}.name"),
            ))
        }
        Some(other) => {
            return Err(invalid(
                format!("trace step {i} name must be a string, got {}{sfx}", describe(other)),
                "Every step needs a non-empty name string.",
                format!("{field}.name"),
            ))
        }
    };
    let valid_types = StepType::KNOWN.join(", ");
    match s.get("type") {
        Some(Value::String(t)) => {
            if limits.strict_step_types && !StepType::KNOWN.contains(&t.as_str()) {
                return Err(invalid(
                    format!("trace step {} has invalid type {}{sfx}", quote(name), quote(t)),
                    format!("Valid step types: {valid_types}. The engine runs in strict mode (strict_step_types = true); turn it off to tolerate unknown types."),
                    format!("{field}.type"),
                ));
            }
        }
        None | Some(Value::Null) => {
            return Err(invalid(
                format!("trace step {} missing required field: type{sfx}", quote(name)),
                format!("Set the step type to one of: {valid_types}."),
                format!("{field}.type"),
            ))
        }
        Some(other) => {
            return Err(invalid(
                format!("trace step {} type must be a string, got {}{sfx}", quote(name), describe(other)),
                format!("Set the step type to one of: {valid_types}."),
                format!("{field}.type"),
            ))
        }
    }
    if check_payload {
        if let Some(result) = s.get("result") {
            let bytes = attest_trace::text::compact_len(result);
            if bytes > limits.max_step_result_bytes {
                return Err(invalid(
                    format!(
                        "trace step {} result exceeds {} bytes (actual: {bytes} bytes){sfx}",
                        quote(name),
                        limits.max_step_result_bytes
                    ),
                    format!(
                        "Truncate the 'result' field for step {} before submitting. Consider filtering large arrays or binary data from tool results.",
                        quote(name)
                    ),
                    format!("{field}.result"),
                ));
            }
        }
    }
    for key in ["started_at_ms", "ended_at_ms"] {
        match s.get(key) {
            None | Some(Value::Null) | Some(Value::Number(_)) => {}
            Some(other) => {
                return Err(invalid(
                    format!(
                        "trace step {} {key} must be a number of milliseconds, got {}{sfx}",
                        quote(name),
                        describe(other)
                    ),
                    format!("Set {key} to a Unix time in milliseconds, or omit it."),
                    format!("{field}.{key}"),
                ))
            }
        }
    }
    check_optional_id(s, "agent_id", &field, sfx)?;
    match s.get("sub_trace") {
        None | Some(Value::Null) => {}
        Some(Value::Object(_)) if s.get("type").and_then(Value::as_str) == Some("agent_call") => {}
        Some(Value::Object(_)) => {
            return Err(invalid(
                format!("trace step {} carries a sub_trace but is not an agent_call{sfx}", quote(name)),
                "Only agent_call steps may carry a sub_trace. Set the step type to agent_call, or move the sub-trace out.",
                format!("{field}.sub_trace"),
            ))
        }
        Some(other) => {
            return Err(invalid(
                format!(
                    "trace step {} sub_trace must be a trace object, got {}{sfx}",
                    quote(name),
                    describe(other)
                ),
                "Set sub_trace to the sub-agent's full trace object (spec §3.3), or omit it.",
                format!("{field}.sub_trace"),
            ))
        }
    }
    Ok(())
}

/// Known numeric metadata must be numbers so constraint checks compare like
/// with like; `timestamp` must be RFC 3339.
fn check_metadata(meta: &Map<String, Value>, path: &str, sfx: &str) -> Result<(), TraceError> {
    for key in ["total_tokens", "cost_usd", "latency_ms"] {
        match meta.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_f64().is_some_and(|x| x >= 0.0) => {}
            Some(other) => {
                return Err(invalid(
                    format!("trace metadata.{key} must be a non-negative number, got {}{sfx}", describe(other)),
                    format!("Send metadata.{key} as a JSON number (not a string), or omit it."),
                    format!("{path}.metadata.{key}"),
                ))
            }
        }
    }
    check_optional_string(meta, "model", &format!("{path}.metadata"), sfx)?;
    match meta.get("timestamp") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(ts)) if OffsetDateTime::parse(ts, &Rfc3339).is_ok() => Ok(()),
        Some(other) => Err(invalid(
            format!("trace metadata.timestamp must be RFC 3339, got {}{sfx}", describe(other)),
            "Use an RFC 3339 timestamp with a time zone, e.g. \"2026-02-18T10:30:00Z\" or \"2026-02-18T10:30:00.123+01:00\".",
            format!("{path}.metadata.timestamp"),
        )),
    }
}

fn check_id_len(id: &str, key: &str, path: &str, sfx: &str) -> Result<(), TraceError> {
    if id.len() <= MAX_ID_BYTES {
        return Ok(());
    }
    Err(invalid(
        format!("{path}.{key} is {} bytes, more than the {MAX_ID_BYTES} allowed{sfx}", id.len()),
        format!("Use a short identifier (at most {MAX_ID_BYTES} bytes), such as trc_<uuid> for a trace or the agent's name; put long descriptions in metadata."),
        format!("{path}.{key}"),
    ))
}

/// An optional string that is an id: bounded like the required ones.
fn check_optional_id(obj: &Map<String, Value>, key: &str, path: &str, sfx: &str) -> Result<(), TraceError> {
    check_optional_string(obj, key, path, sfx)?;
    match obj.get(key) {
        Some(Value::String(id)) => check_id_len(id, key, path, sfx),
        _ => Ok(()),
    }
}

fn check_optional_string(obj: &Map<String, Value>, key: &str, path: &str, sfx: &str) -> Result<(), TraceError> {
    match obj.get(key) {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(invalid(
            format!("{path}.{key} must be a string, got {}{sfx}", describe(other)),
            format!("Send {key} as a string, or omit it."),
            format!("{path}.{key}"),
        )),
    }
}

/// Depth of the sub-trace tree below `obj` (root = 0). The recursion is
/// bounded: serde_json refuses JSON nested more than 128 levels.
fn tree_depth(obj: &Map<String, Value>) -> usize {
    let Some(Value::Array(steps)) = obj.get("steps") else {
        return 0;
    };
    steps
        .iter()
        .filter_map(|s| match s.get("sub_trace") {
            Some(Value::Object(sub)) => Some(1 + tree_depth(sub)),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

use crate::text::{describe, kind_name as kind_of};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<Parsed, TraceError> {
        check_with(v, &Limits::default())
    }

    fn check_with(v: Value, limits: &Limits) -> Result<Parsed, TraceError> {
        let raw = RawValue::from_string(v.to_string()).unwrap();
        parse_trace(&raw, limits)
    }

    fn base() -> Value {
        json!({"schema_version": 1, "trace_id": "t1", "output": {"message": "hi"}, "steps": []})
    }

    fn msg(v: Value) -> String {
        check(v).unwrap_err().message
    }

    #[test]
    fn accepts_a_minimal_trace() {
        let p = check(base()).unwrap();
        assert_eq!(p.trace.trace_id, "t1");
        assert!(p.warnings.is_empty());
    }

    #[test]
    fn schema_version_rules() {
        let mut v = base();
        v["schema_version"] = json!(0);
        assert_eq!(check(v).unwrap().warnings.len(), 1);
        for bad in [json!(2), json!(-1)] {
            let mut v = base();
            v["schema_version"] = bad;
            assert!(msg(v).starts_with("unsupported schema_version"));
        }
        let mut v = base();
        v["schema_version"] = json!("1");
        assert!(msg(v).contains("must be an integer"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("schema_version");
        assert_eq!(msg(v), "trace missing required field: schema_version");
    }

    #[test]
    fn schema_version_is_checked_before_required_fields() {
        let v = json!({"schema_version": 9});
        assert!(msg(v).starts_with("unsupported schema_version 9"));
    }

    #[test]
    fn required_fields() {
        let mut v = base();
        v["trace_id"] = json!("   ");
        assert_eq!(msg(v), "trace missing required field: trace_id");
        let mut v = base();
        v.as_object_mut().unwrap().remove("output");
        assert_eq!(msg(v), "trace missing required field: output");
        let mut v = base();
        v["output"] = json!({});
        assert!(msg(v).starts_with("trace output must be a non-empty JSON object"));
    }

    #[test]
    fn ids_are_bounded_at_every_level() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let exact = "x".repeat(MAX_ID_BYTES);
        for (at, field) in [
            ("/trace_id", "trace.trace_id"),
            ("/agent_id", "trace.agent_id"),
            ("/parent_trace_id", "trace.parent_trace_id"),
            ("/steps/0/agent_id", "trace.steps[0].agent_id"),
            ("/steps/0/sub_trace/trace_id", "trace.steps[0].sub_trace.trace_id"),
        ] {
            let with = |id: &str| {
                let mut v = base();
                v["steps"] = json!([{"type": "agent_call", "name": "a",
                    "sub_trace": {"schema_version": 1, "trace_id": "s", "output": {"m": 1}}}]);
                let (parent, key) = at.rsplit_once('/').unwrap();
                let parent = if parent.is_empty() {
                    &mut v
                } else {
                    v.pointer_mut(parent).unwrap()
                };
                parent[key] = json!(id);
                v
            };
            let e = check(with(&long)).unwrap_err();
            assert_eq!(e.field, field);
            assert!(
                e.message
                    .contains(&format!("is {} bytes, more than the {MAX_ID_BYTES} allowed", MAX_ID_BYTES + 1)),
                "{}",
                e.message
            );
            assert!(e.message.len() < 200 && e.detail.contains("short identifier"), "{e:?}");
            // At the limit it passes (a root with a parent_trace_id is still a root).
            check(with(&exact)).unwrap();
        }
    }

    #[test]
    fn size_is_measured_on_the_wire() {
        let limits = Limits {
            max_trace_bytes: 100,
            ..Limits::default()
        };
        let padded = format!(r#"{{"schema_version":1,"trace_id":"t","output":{{"m":1}}{}}}"#, " ".repeat(100));
        let raw = RawValue::from_string(padded).unwrap();
        let e = parse_trace(&raw, &limits).unwrap_err();
        assert!(e.message.starts_with("trace exceeds max size: "), "{}", e.message);
    }

    #[test]
    fn step_count_and_output_length() {
        let limits = Limits {
            max_steps: 2,
            max_output_chars: 3,
            ..Limits::default()
        };
        let mut v = base();
        v["steps"] = json!([{"type":"tool_call","name":"a"},{"type":"tool_call","name":"a"},{"type":"tool_call","name":"a"}]);
        assert_eq!(check_with(v, &limits).unwrap_err().message, "trace exceeds max steps: 3 > 2");
        let mut v = base();
        v["output"]["message"] = json!("ééée");
        assert_eq!(
            check_with(v, &limits).unwrap_err().message,
            "output.message length 4 exceeds 3 characters"
        );
    }

    #[test]
    fn formats() {
        let mut v = base();
        v["metadata"] = json!({"timestamp": "yesterday"});
        assert!(msg(v).starts_with("trace metadata.timestamp must be RFC 3339"));
        let mut v = base();
        v["metadata"] = json!({"timestamp": "2026-02-18T10:30:00Z", "cost_usd": "0.1"});
        assert!(msg(v).contains("metadata.cost_usd must be a non-negative number"));
        let mut v = base();
        v["parent_trace_id"] = json!("");
        assert!(msg(v).contains("parent_trace_id must be a non-empty string or null"));
        let mut v = base();
        v["parent_trace_id"] = json!(null);
        assert!(check(v).is_ok());
    }

    #[test]
    fn step_rules() {
        let mut v = base();
        v["steps"] = json!([{"type": "tool_call", "name": ""}]);
        assert_eq!(msg(v), "trace step 0 missing required field: name");
        let mut v = base();
        v["steps"] = json!([{"type": "banana", "name": "x"}]);
        assert!(check(v.clone()).is_ok(), "lax mode tolerates unknown types");
        let strict = Limits {
            strict_step_types: true,
            ..Limits::default()
        };
        assert_eq!(
            check_with(v, &strict).unwrap_err().message,
            "trace step 'x' has invalid type 'banana'"
        );
        let limits = Limits {
            max_step_result_bytes: 10,
            ..Limits::default()
        };
        let mut v = base();
        v["steps"] = json!([{"type": "tool_call", "name": "big", "result": {"data": "0123456789"}}]);
        assert_eq!(
            check_with(v, &limits).unwrap_err().message,
            "trace step 'big' result exceeds 10 bytes (actual: 21 bytes)"
        );
    }

    fn nested(depth: usize) -> Value {
        let mut t = base();
        for d in 0..depth {
            let mut parent = base();
            parent["trace_id"] = json!(format!("p{d}"));
            parent["steps"] = json!([{"type": "agent_call", "name": "sub", "sub_trace": t}]);
            t = parent;
        }
        t
    }

    #[test]
    fn depth_limit_is_five_levels_below_the_root() {
        assert!(check(nested(5)).is_ok());
        assert_eq!(msg(nested(6)), "trace nesting depth 6 exceeds maximum 5");
        assert_eq!(
            msg(nested(9)),
            "trace nesting depth 9 exceeds maximum 5",
            "the actual depth is reported"
        );
    }

    #[test]
    fn sub_traces_are_validated_with_location() {
        let mut v = base();
        v["steps"] = json!([{"type": "agent_call", "name": "helper", "sub_trace": {"schema_version": 1, "trace_id": "s"}}]);
        let e = check(v).unwrap_err();
        assert_eq!(
            e.message,
            "trace missing required field: output (in sub_trace of step 'helper' at depth 1)"
        );
        assert_eq!(e.field, "trace.steps[0].sub_trace.output");
    }

    #[test]
    fn tree_links_and_ids_are_checked_after_the_levels() {
        let mut v = base();
        v["steps"] = json!([{"type": "agent_call", "name": "helper",
            "sub_trace": {"schema_version": 1, "trace_id": "s", "parent_trace_id": "other", "output": {"m": 1}}}]);
        let e = check(v.clone()).unwrap_err();
        assert_eq!(
            e.message,
            "sub_trace 's' has parent_trace_id 'other' but its parent's trace_id is 't1'"
        );
        assert_eq!(e.field, "trace.steps[0].sub_trace.parent_trace_id");
        v["steps"][0]["sub_trace"]["parent_trace_id"] = json!("t1");
        assert!(check(v.clone()).is_ok());
        v["steps"][0]["sub_trace"]["trace_id"] = json!("t1");
        let e = check(v).unwrap_err();
        assert_eq!(e.message, "duplicate trace_id 't1' in the tree (cycle or copy)");
        assert_eq!(e.field, "trace.steps[0].sub_trace.trace_id");
        let mut v = base();
        v["steps"] = json!([{"type": "agent_call", "name": "untraced"}]);
        assert!(check(v).is_ok(), "an agent_call without sub_trace is a call, not an error");
    }

    #[test]
    fn builds_typed_steps() {
        let mut v = base();
        v["steps"] = json!([{"type": "retrieval", "name": "kb", "args": {"q": 1}, "result": null}]);
        let t = check(v).unwrap().trace;
        assert_eq!(t.steps[0].kind, StepType::Retrieval);
        assert!(t.steps[0].result.is_none());
        assert_eq!(t.steps[0].args, Some(json!({"q": 1})));
    }
}
