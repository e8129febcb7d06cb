//! Layer 1: JSON Schema validation of a target.
//!
//! Draft 2020-12 is the default; drafts 4, 6, 7 and 2019-09 are chosen by
//! `$schema`. The protocol's spelling `https://json-schema.org/draft/2020-12`
//! (without `/schema`) is accepted as 2020-12. Schemas are compiled once and
//! cached by their canonical text; remote `$ref`s are never fetched.
//!
//! `pattern` and `patternProperties` use the same RE2 engine and the same
//! size bounds as `regex_match` (no lookaround, no backreferences), so a
//! schema cannot smuggle in a pattern that layer 4 would refuse. A
//! `pattern` is run by layer 4's own matcher, whose warm search caches are
//! bounded once for every regex (`content::KEPT_CACHE_BUDGET`), so a
//! compiled schema is weighed by its programs; a `patternProperties` key is
//! the schema crate's, weighed with a search cache per thread that runs it.

use super::content::{schema_pattern, Pattern, SchemaPatternError, REGEX_SIZE_LIMIT};
use super::{Evidence, Spec, SpecError, Verdict};
use crate::target::{Target, GRAMMAR_HINT};
use crate::text::clip;
use crate::trace::Trace;
use jsonschema::{Draft, Validator};
use quick_cache::sync::Cache;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// How many distinct compiled schemas are kept, and their estimated bytes.
/// Largest schema compiled, as compact JSON. Compiling takes some 180
/// times a schema's size in memory when it holds many small values (an
/// `enum` of objects), so a 10 MB one would take gigabytes.
pub const MAX_SCHEMA_BYTES: usize = 1024 * 1024;
const SCHEMA_CACHE_ENTRIES: usize = 1024;
/// The compiled-schema cache's byte bound unless configured
/// ([`set_cache_bytes`]).
pub const DEFAULT_SCHEMA_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// The bound the cache is made with (`schema_cache_mib`).
static SCHEMA_CACHE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(DEFAULT_SCHEMA_CACHE_BYTES);

/// Sets the compiled-schema cache's byte bound; effective when the cache is
/// first used, so the engine sets it at start-up. Whether it took effect.
pub fn set_cache_bytes(bytes: u64) -> bool {
    if CACHE.get().is_some() {
        return false;
    }
    SCHEMA_CACHE_BYTES.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
    true
}

fn cache_bytes() -> u64 {
    SCHEMA_CACHE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}
/// How many validation errors an explanation lists.
const MAX_REPORTED_ERRORS: usize = 3;
/// Values with fewer nodes than this, validated against schemas of at most
/// this many bytes, have their errors listed and counted; others get their
/// first error only (see [`errors_of`]).
const MAX_LISTED_NODES: usize = 10_000;
const MAX_LISTED_SCHEMA_BYTES: usize = 64 * 1024;

/// Why `value` fails `validator`, whose schema's text is `schema_bytes`
/// long, and whether that is every error (`true`) or the first one only.
///
/// Listing errors builds every one of them at once (the validator collects
/// them before handing any out), so a large array failing per item would
/// hold millions. A large value or schema gets its first error only, which
/// the validator finds without building the rest.
///
/// Both walks are bounded by [`EXPLAIN_STEPS`]: a schema that branches
/// recursively (`anyOf` arms that each `$ref` back) makes them exponential in
/// the value's depth, where `is_valid` is not (it remembers what it has
/// checked). Past the budget the errors are not listed (an empty list).
pub fn errors_of<'i>(validator: &'i Validator, value: &'i Value, schema_bytes: usize) -> (Vec<jsonschema::ValidationError<'i>>, bool) {
    if nodes_up_to(value, MAX_LISTED_NODES) < MAX_LISTED_NODES && schema_bytes <= MAX_LISTED_SCHEMA_BYTES {
        if let Some(all) = within_steps(EXPLAIN_STEPS, || validator.iter_errors(value).collect()) {
            return (all, true);
        }
    }
    let first = within_steps(EXPLAIN_STEPS, || validator.validate(value).err().into_iter().collect());
    (first.unwrap_or_default(), false)
}

/// Subschemas a validation may enter before it is stopped: `is_valid`, which
/// gives the verdict, and each walk that lists errors for the explanation.
/// A million steps take well under a second.
pub const VALIDATION_STEPS: u64 = 1_000_000;
const EXPLAIN_STEPS: u64 = 200_000;

/// The keyword every subschema of a compiled schema carries (see
/// [`instrument`]): it counts the subschemas a validation enters.
const STEP_KEYWORD: &str = "$attest-step";

thread_local! {
    /// Steps left to the validation running on this thread; unlimited
    /// outside [`within_steps`].
    static STEPS_LEFT: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Unwinds a validation out of the schema crate when its steps run out. It
/// goes through `resume_unwind`, which runs no panic hook: nothing is logged.
struct StepsSpent;

struct Step;

/// Steps between looks at the clock: a few microseconds of validation.
const STEPS_PER_CLOCK_LOOK: u64 = 4096;

impl Step {
    fn tick() {
        let left = STEPS_LEFT.with(|s| {
            let left = s.get().saturating_sub(1);
            s.set(left);
            left
        });
        // Past the request's deadline (or the drain's end) the validation
        // stops too, and the request is answered `3002` (see
        // `content::within_deadline`): a step budget bounds the work, the
        // clock bounds the wait.
        if left == 0 || (left.is_multiple_of(STEPS_PER_CLOCK_LOOK) && super::content::past_deadline(std::time::Instant::now())) {
            std::panic::resume_unwind(Box::new(StepsSpent));
        }
    }
}

impl<'i> jsonschema::Keyword<'i> for Step {
    fn validate(&self, _: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        Step::tick();
        Ok(())
    }

    fn is_valid(&self, _: &'i Value) -> bool {
        Step::tick();
        true
    }
}

/// Runs `f`, a validation with an instrumented validator, within `steps`;
/// `None` when they ran out.
pub fn within_steps<T>(steps: u64, f: impl FnOnce() -> T) -> Option<T> {
    let before = STEPS_LEFT.with(|s| s.replace(steps));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    STEPS_LEFT.with(|s| s.set(before));
    match result {
        Ok(v) => Some(v),
        Err(payload) if payload.is::<StepsSpent>() => None,
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// `schema` with [`STEP_KEYWORD`] in every subschema, so that a validation
/// counts each subschema it enters. Only the keywords that hold schemas are
/// followed: everything else (`const`, `enum`, `required`,
/// `dependentRequired`, annotations, unknown keywords) is data or names, and
/// is left as written.
fn instrument(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    for (k, v) in m.iter_mut() {
        match k.as_str() {
            "additionalProperties"
            | "additionalItems"
            | "contains"
            | "not"
            | "if"
            | "then"
            | "else"
            | "propertyNames"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "contentSchema" => instrument(v),
            "items" => match v {
                Value::Array(a) => a.iter_mut().for_each(instrument),
                other => instrument(other),
            },
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(a) = v {
                    a.iter_mut().for_each(instrument);
                }
            }
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" | "dependencies" => {
                if let Value::Object(named) = v {
                    // `dependencies` may also map a name to a list of names.
                    named.values_mut().for_each(instrument);
                }
            }
            _ => {}
        }
    }
    m.insert(STEP_KEYWORD.to_owned(), Value::Bool(true));
}

/// The nodes of `v` (itself, and every value inside it), counted up to `max`.
fn nodes_up_to(v: &Value, max: usize) -> usize {
    let mut count = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        count += 1;
        if count >= max {
            break;
        }
        // Never more than the nodes still to count: a large array is not copied.
        let room = max - count;
        match v {
            Value::Array(items) => stack.extend(items.iter().take(room)),
            Value::Object(m) => stack.extend(m.values().take(room)),
            _ => {}
        }
    }
    count
}

#[derive(Debug)]
pub struct SchemaCheck {
    target: Target,
    draft: &'static str,
    validator: Arc<Validator>,
    /// The schema as written, to quote a violated keyword's limit.
    schema: Arc<Value>,
    /// How many `pattern`s and `patternProperties` keys the schema holds,
    /// and their programs' bytes.
    patterns: Patterns,
    /// Length of the schema's canonical text.
    text_bytes: usize,
    /// Whether the schema refers to itself (`$ref` and kin): its
    /// validation can branch at every level of the data, up to the step
    /// budget, so it runs off the async workers (see `watchdog`).
    recursive: bool,
}

const DRAFTS: &[(&str, Draft, &str)] = &[
    ("json-schema.org/draft/2020-12/schema", Draft::Draft202012, "2020-12"),
    ("json-schema.org/draft/2020-12", Draft::Draft202012, "2020-12"),
    ("json-schema.org/draft/2019-09/schema", Draft::Draft201909, "2019-09"),
    ("json-schema.org/draft/2019-09", Draft::Draft201909, "2019-09"),
    ("json-schema.org/draft-07/schema", Draft::Draft7, "7"),
    ("json-schema.org/draft-06/schema", Draft::Draft6, "6"),
    ("json-schema.org/draft-04/schema", Draft::Draft4, "4"),
];

/// Picks the draft from `$schema` (absent: 2020-12). Scheme and a trailing
/// `#` are not significant.
fn draft_of(schema: &Value) -> Result<(Draft, &'static str), SpecError> {
    let Some(uri) = schema.get("$schema") else {
        return Ok((Draft::Draft202012, "2020-12"));
    };
    let Some(uri) = uri.as_str() else {
        return Err(SpecError::new(
            "spec.schema.$schema",
            "$schema must be a string",
            supported_drafts(),
        ));
    };
    let bare = uri.trim_end_matches('#').trim_end_matches('/');
    let bare = bare
        .strip_prefix("https://")
        .or_else(|| bare.strip_prefix("http://"))
        .unwrap_or(bare);
    DRAFTS.iter().find(|(u, _, _)| *u == bare).map(|(_, d, n)| (*d, *n)).ok_or_else(|| {
        SpecError::new(
            "spec.schema.$schema",
            format!("unsupported $schema '{}'", clip(uri, 120)),
            supported_drafts(),
        )
    })
}

fn supported_drafts() -> String {
    "Supported $schema values: https://json-schema.org/draft/2020-12/schema (default, also without /schema), https://json-schema.org/draft/2019-09/schema, http://json-schema.org/draft-07/schema#, http://json-schema.org/draft-06/schema#, http://json-schema.org/draft-04/schema#.".into()
}

/// Capacity of a schema pattern's lazy-DFA cache. Smaller than a
/// `regex_match`'s: schema patterns are short field formats, and each keeps
/// a cache per regex thread.
const SCHEMA_DFA_CACHE_BYTES: usize = 32 * 1024;
/// A schema pattern's search cache at its largest: forward and reverse lazy
/// DFAs and the rest of the engine's scratch state.
const SCHEMA_PATTERN_CACHE_BYTES: usize = 2 * SCHEMA_DFA_CACHE_BYTES + 32 * 1024;

/// The regexes a compiled schema holds.
#[derive(Clone, Copy, Debug, Default)]
struct Patterns {
    /// `pattern`s and `patternProperties` keys.
    count: usize,
    /// `patternProperties` keys, which the schema crate runs with a search
    /// cache of their own for each thread.
    property_keys: usize,
    /// Bytes their compiled programs hold.
    program_bytes: usize,
}

/// Bytes a compiled schema holds: its tree (a multiple of its text), its
/// patterns' programs as compiled, and for each `patternProperties` key a
/// search cache at its largest for each regex thread (the only threads that
/// run schema validations with patterns). A `pattern`'s warm caches are
/// bounded with every other regex's (`content::KEPT_CACHE_BUDGET`).
fn schema_bytes(text_bytes: usize, patterns: Patterns) -> u64 {
    let caches = (patterns.property_keys * crate::watchdog::THREADS * SCHEMA_PATTERN_CACHE_BYTES) as u64;
    (text_bytes as u64) * 8 + patterns.program_bytes as u64 + caches
}

#[derive(Clone)]
struct SchemaWeight;

/// A compiled schema: its validator and its patterns.
type Compiled = (Arc<Validator>, Patterns);

impl quick_cache::Weighter<String, Compiled> for SchemaWeight {
    fn weight(&self, key: &String, value: &Compiled) -> u64 {
        // At least an equal share, so the entry bound holds too.
        schema_bytes(key.len(), value.1).max(cache_bytes() / SCHEMA_CACHE_ENTRIES as u64)
    }
}

type SchemaCache = Cache<String, Compiled, SchemaWeight>;

static CACHE: OnceLock<SchemaCache> = OnceLock::new();

fn cache() -> &'static SchemaCache {
    CACHE.get_or_init(|| Cache::with_weighter(SCHEMA_CACHE_ENTRIES, cache_bytes(), SchemaWeight))
}

/// Whether `schema` holds a reference (`$ref`, `$dynamicRef`,
/// `$recursiveRef`) anywhere.
fn refers(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| matches!(k.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef") || refers(v)),
        Value::Array(a) => a.iter().any(refers),
        _ => false,
    }
}

/// Which keyword holds a regex.
#[derive(Clone, Copy)]
enum Held {
    Pattern,
    PropertyKey,
}

/// The regexes the schema holds, each `pattern` and each key of a
/// `patternProperties`, with where it is (`spec.schema.properties.id.pattern`).
/// With `names`, `schema` maps names to schemas (what `properties` or
/// `$defs` hold): its keys are names, not keywords.
fn patterns<'s>(schema: &'s Value, names: bool, at: &mut String, out: &mut Vec<(String, Held, &'s str)>) {
    match schema {
        Value::Object(m) => {
            for (k, v) in m {
                // Instances, not schemas: a "pattern" member in them is data.
                if !names && matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    continue;
                }
                let len = at.len();
                at.push('.');
                at.push_str(&clip(k, 64));
                match (names, k.as_str(), v) {
                    (false, "pattern", Value::String(p)) => out.push((at.clone(), Held::Pattern, p)),
                    (false, "patternProperties", Value::Object(p)) => {
                        out.extend(p.keys().map(|key| (at.clone(), Held::PropertyKey, key.as_str())))
                    }
                    _ => {}
                }
                let holds_names = !names
                    && matches!(
                        k.as_str(),
                        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
                    );
                patterns(v, holds_names, at, out);
                at.truncate(len);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                patterns(v, false, at, out);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

fn compile_schema(schema: &Value, draft: Draft) -> Result<(Compiled, usize), SpecError> {
    // Canonical text: serde_json maps are ordered, so key order does not matter.
    let key = format!("{draft:?}{schema}");
    let text_bytes = key.len();
    if let Some(hit) = cache().get(&key) {
        return Ok((hit, text_bytes));
    }
    if text_bytes > MAX_SCHEMA_BYTES {
        return Err(SpecError::new(
            "spec.schema",
            format!("schema too large: {text_bytes} bytes as compact JSON > {MAX_SCHEMA_BYTES}"),
            "Compiling a schema takes far more memory than its text. Shorten it: move a long enum into several assertions, or check membership with a content keyword_any.",
        ));
    }
    // Each within the bounds a `regex_match` keeps, checked before the
    // schema compiler, which would otherwise spend seconds on a huge one.
    let mut found = Vec::new();
    patterns(schema, false, &mut "spec.schema".to_owned(), &mut found);
    let mut counted = Patterns {
        count: found.len(),
        ..Patterns::default()
    };
    let mut compiled_patterns = HashMap::new();
    for (at, held, pattern) in &found {
        match held {
            Held::PropertyKey => {
                counted.property_keys += 1;
                counted.program_bytes += crate::layers::content::check_schema_pattern(at, pattern)?;
            }
            Held::Pattern if compiled_patterns.contains_key(*pattern) => {}
            // One that is not a regex is the schema compiler's to refuse
            // (`build` hands it the reason).
            Held::Pattern => {
                let compiled = match schema_pattern(at, pattern) {
                    Ok(p) => Ok(Arc::new(p)),
                    Err(SchemaPatternError::Refused(e)) => return Err(e),
                    Err(invalid) => Err(invalid),
                };
                if let Ok(p) = &compiled {
                    counted.program_bytes += p.program_bytes();
                }
                compiled_patterns.insert((*pattern).to_owned(), compiled);
            }
        }
    }
    let mut body = schema.clone();
    if let Some(m) = body.as_object_mut() {
        // The draft is already chosen; dropping `$schema` lets non-canonical spellings compile.
        m.remove("$schema");
    }
    let validator = build(&body, draft, compiled_patterns).map_err(|e| {
        SpecError::new(
            "spec.schema",
            format!("malformed JSON Schema: {}", clip(&e.to_string(), 300)),
            "Fix the schema so it is valid for its draft (remote $refs are not fetched; inline them under $defs). Patterns use RE2 syntax, as regex_match does: no lookaround or backreferences, and at most 1 MiB compiled.",
        )
    })?;
    let compiled = (Arc::new(validator), counted);
    cache().insert(key, compiled.clone());
    Ok((compiled, text_bytes))
}

/// A schema's `pattern`, matched by layer 4's engine (see
/// [`crate::layers::content::schema_pattern`]).
struct PatternKeyword(Arc<Pattern>);

impl<'i> jsonschema::Keyword<'i> for PatternKeyword {
    fn validate(&self, instance: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        if self.is_valid(instance) {
            return Ok(());
        }
        // As the schema crate words its own `pattern` failures.
        Err(jsonschema::ValidationError::custom(format!(
            "{instance} does not match \"{}\"",
            self.0.written
        )))
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        match instance {
            Value::String(text) => self.0.is_match(text),
            _ => true,
        }
    }
}

/// The one way the engine builds a JSON Schema validator (layer 1's
/// assertions, plugins' config schemas): RE2 patterns within `regex_match`'s
/// bounds, remote `$ref`s never fetched, and every subschema counting its
/// steps, so that [`within_steps`] bounds a validation whatever the schema.
pub fn validator(schema: &Value, draft: Draft) -> Result<Validator, jsonschema::ValidationError<'static>> {
    build(schema, draft, HashMap::new())
}

/// The schema's `pattern`s compiled (or why one is not a regex), by their
/// text as written.
type CompiledPatterns = HashMap<String, Result<Arc<Pattern>, SchemaPatternError>>;

/// [`validator`], with the schema's `pattern`s already compiled; any other
/// is compiled as the schema is.
fn build(schema: &Value, draft: Draft, compiled: CompiledPatterns) -> Result<Validator, jsonschema::ValidationError<'static>> {
    let mut body = schema.clone();
    instrument(&mut body);
    jsonschema::options()
        .with_draft(draft)
        .with_keyword(STEP_KEYWORD, |_, _, _| Ok(Box::new(Step)))
        .with_keyword("pattern", move |_, value, _| {
            let Value::String(written) = value else {
                return Err(jsonschema::ValidationError::schema("\"pattern\" must be a string"));
            };
            let pattern = match compiled.get(written) {
                Some(known) => known.clone(),
                None => schema_pattern("pattern", written).map(Arc::new),
            };
            match pattern {
                Ok(p) => Ok(Box::new(PatternKeyword(p))),
                Err(SchemaPatternError::Refused(e)) => Err(jsonschema::ValidationError::schema(e.message)),
                Err(SchemaPatternError::Invalid(why)) => Err(jsonschema::ValidationError::schema(why)),
            }
        })
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(SCHEMA_DFA_CACHE_BYTES),
        )
        .build(&body)
}

/// The first validation errors, each as `at <instance path>: <message>`.
/// Shared by schema assertions and plugin config checks.
pub fn describe_errors(errors: &[jsonschema::ValidationError<'_>]) -> Vec<String> {
    errors
        .iter()
        .take(MAX_REPORTED_ERRORS)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "(root)".to_owned() } else { at };
            format!("at {at}: {}", clip(&e.to_string(), 200))
        })
        .collect()
}

impl SchemaCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<SchemaCheck, SpecError> {
        let target_text = spec.str("target")?;
        let target = Target::parse(target_text).map_err(|e| SpecError::new("spec.target", e.message, GRAMMAR_HINT))?;
        let schema = spec.raw("schema").ok_or_else(|| {
            SpecError::new(
                "spec.schema",
                "spec missing required field: schema",
                "Set spec.schema to a JSON Schema object (draft 2020-12 unless $schema says otherwise).",
            )
        })?;
        if !schema.is_object() && !schema.is_boolean() {
            return Err(SpecError::new(
                "spec.schema",
                "spec.schema must be a JSON Schema object or boolean",
                "Set spec.schema to a JSON Schema object, e.g. {\"type\": \"object\", \"required\": [\"id\"]}.",
            ));
        }
        let (draft, draft_name) = draft_of(schema)?;
        let ((validator, patterns), text_bytes) = compile_schema(schema, draft)?;
        Ok(SchemaCheck {
            target,
            draft: draft_name,
            validator,
            recursive: refers(schema),
            schema: Arc::new(schema.clone()),
            patterns,
            text_bytes,
        })
    }

    /// Whether the schema refers to itself, so that one validation may take
    /// up to its step budget.
    pub fn is_recursive(&self) -> bool {
        self.recursive
    }

    /// Bytes of regex program a validation may walk per byte of input.
    pub fn scan_weight(&self) -> usize {
        self.patterns.count * (REGEX_SIZE_LIMIT / 4)
    }

    /// Whether the schema holds regexes the schema crate runs
    /// (`patternProperties` keys), each with a search cache per thread that
    /// ran it.
    pub fn has_pattern_properties(&self) -> bool {
        self.patterns.property_keys > 0
    }

    /// Estimated memory held, for cache accounting.
    pub fn memory_bytes(&self) -> usize {
        schema_bytes(self.text_bytes, self.patterns) as usize
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let t = self.target.as_str();
        let value = match self.target.resolve(trace) {
            Ok(v) => v,
            Err(missing) => {
                return Verdict::fail(format!("{t} could not be validated: {}.", missing.0)).with(
                    Evidence::new(format!("{t} present, matching the schema"), "not found")
                        .at(t)
                        .hint(format!("Make the agent produce {t}, or point spec.target at where the data is.")),
                )
            }
        };
        match within_steps(VALIDATION_STEPS, || self.validator.is_valid(&value)) {
            Some(true) => return Verdict::pass(format!("{t} matches schema (draft {}).", self.draft)),
            Some(false) => {}
            None => {
                return Verdict::fail(format!(
                    "{t} could not be validated: the schema entered {VALIDATION_STEPS} subschemas without an answer (a schema whose branches each refer back to it costs twice as much for every level of nesting)."
                ))
                .with(
                    Evidence::new(format!("{t} matching the schema"), "validation stopped at its step budget")
                        .at(t)
                        .hint("Give the recursive part of the schema one branch per level (anyOf/oneOf arms that each $ref back double the work at every level), or bound the depth of the data."),
                )
            }
        }
        let (errors, all) = errors_of(&self.validator, &value, self.text_bytes);
        if errors.is_empty() {
            return Verdict::fail(format!(
                "{t} failed schema validation (its errors are not listed: finding them would take more than {EXPLAIN_STEPS} steps of a schema that branches recursively)."
            ))
            .with(
                Evidence::new(format!("{t} matching the schema"), "does not match")
                    .at(t)
                    .hint("Validate the value against the schema locally to see where it fails, or give the recursive part of the schema one branch per level."),
            );
        }
        let more = match (all, errors.len().saturating_sub(MAX_REPORTED_ERRORS)) {
            (false, _) => " (further errors, if any, not listed: the value or the schema is large)".to_owned(),
            (true, 0) => String::new(),
            (true, n) => format!(" (and {n} more)"),
        };
        let shown = describe_errors(&errors);
        let verdict = Verdict::fail(format!("{t} failed schema validation: {}{more}.", shown.join("; ")));
        match errors.first() {
            Some(first) => verdict.with(violation(t, &self.schema, first)),
            None => verdict,
        }
    }
}

/// `pointer` (a JSON pointer into the value at `target`) in the target
/// path notation: `.name` for a key, `[n]` for an array index, and
/// `["key"]` for a key that is not a plain name.
fn dotted(target: &str, pointer: &str) -> String {
    let mut out = target.to_owned();
    for raw in pointer.split('/').skip(1) {
        let token = raw.replace("~1", "/").replace("~0", "~");
        if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{token}]"));
        } else if !token.is_empty() && token.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            out.push('.');
            out.push_str(&token);
        } else {
            out.push_str(&format!("[{}]", serde_json::Value::String(token)));
        }
    }
    out
}

/// The first violated keyword with its limit, and the offending value with its path.
fn violation(target: &str, schema: &Value, e: &jsonschema::ValidationError<'_>) -> Evidence {
    let keyword_path = e.schema_path().to_string();
    let keyword = keyword_path
        .rsplit('/')
        .find(|s| !s.is_empty() && s.parse::<usize>().is_err())
        .unwrap_or("schema");
    let instance_path = e.instance_path().to_string();
    // In the target's own notation (`output.structured.confidence`,
    // `output.items[0]`), not a JSON pointer glued onto it.
    let at = dotted(target, &instance_path);
    // The keyword's own value is its limit (`maximum: 1`, `required: [...]`);
    // keywords without one at that pointer are described by the message.
    let limit = match schema.pointer(&keyword_path) {
        Some(v) if !v.is_object() => clip(&v.to_string(), 160),
        _ => clip(&e.to_string(), 160),
    };
    Evidence::new(
        format!("{keyword}: {limit} (schema {keyword_path})"),
        format!("{at} = {}", clip(&e.instance().to_string(), 160)),
    )
    .at(at.clone())
    .hint(format!(
        "The value at {at} breaks the schema's `{keyword}` rule: fix what the agent produces there, or relax `{keyword}` in the schema if the value is acceptable."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use serde_json::value::RawValue;

    fn trace() -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t",
            "steps": [{"type": "tool_call", "name": "lookup", "result": {"status": "ok", "amount": 5}}],
            "output": {"message": "m", "structured": {"refund_id": "RFD-001", "confidence": 1.23}}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    fn compile(spec: Value) -> Result<SchemaCheck, SpecError> {
        SchemaCheck::compile(&Spec::new(Some(&spec), "schema").unwrap())
    }

    #[test]
    fn seed_spelling_of_2020_12_is_accepted() {
        let c = compile(json!({"target": "steps[?name=='lookup'].result", "schema": {
            "$schema": "https://json-schema.org/draft/2020-12", "type": "object", "required": ["status", "amount"]}}))
        .unwrap();
        let v = c.evaluate(&trace());
        assert!(v.passed, "{}", v.explanation);
    }

    /// A ~150-byte schema whose two `anyOf` arms both recurse, over an array
    /// nested 60 deep: `is_valid` answers (it remembers), and listing the
    /// errors, exponential in the depth, stops at its step budget.
    #[test]
    fn a_recursive_schema_bomb_stays_within_its_steps() {
        let bomb = json!({"$defs": {"a": {"anyOf": [
            {"type": "array", "items": {"$ref": "#/$defs/a"}},
            {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}
        ]}}, "$ref": "#/$defs/a"});
        let check = compile(json!({"target": "output.structured", "schema": bomb})).unwrap();
        for depth in [3, 60] {
            let mut value = json!(1);
            for _ in 0..depth {
                value = json!([value]);
            }
            let t = trace_with(value);
            let started = std::time::Instant::now();
            let v = check.evaluate(&t);
            assert!(!v.passed);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "depth {depth}: {:?}",
                started.elapsed()
            );
            if depth == 60 {
                assert!(v.explanation.contains("not listed"), "{}", v.explanation);
            } else {
                assert!(v.explanation.contains("is not valid under any of the"), "{}", v.explanation);
            }
        }
        // Data is not instrumented: a `const` object still compares as written.
        let exact = compile(json!({"target": "output.structured", "schema": {"const": {"a": 1}}})).unwrap();
        assert!(exact.evaluate(&trace_with(json!({"a": 1}))).passed);
    }

    fn trace_with(structured: Value) -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t", "output": {"message": "m", "structured": structured}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    #[test]
    fn a_large_value_gets_its_first_error_only() {
        let with_items = |n: usize| {
            let v = json!({"schema_version": 1, "trace_id": "t", "output": {"message": "m", "items": vec![0; n]}});
            parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
                .unwrap()
                .trace
        };
        let c = compile(json!({"target": "output.items", "schema": {"items": {"type": "string"}}})).unwrap();
        let v = c.evaluate(&with_items(10));
        assert!(v.explanation.ends_with(" (and 7 more)."), "{}", v.explanation);
        let v = c.evaluate(&with_items(20_000));
        assert!(
            v.explanation
                .starts_with("output.items failed schema validation: at /0: 0 is not of type"),
            "{}",
            v.explanation
        );
        assert!(
            v.explanation
                .ends_with(" (further errors, if any, not listed: the value or the schema is large)."),
            "{}",
            v.explanation
        );
        assert_eq!(v.evidence.unwrap().path.as_deref(), Some("output.items[0]"));
    }

    #[test]
    fn paths_are_shown_in_the_target_notation() {
        assert_eq!(dotted("output.structured", ""), "output.structured");
        assert_eq!(dotted("output.structured", "/confidence"), "output.structured.confidence");
        assert_eq!(dotted("output", "/items/0/name"), "output.items[0].name");
        assert_eq!(dotted("output", "/a b/x~1y"), r#"output["a b"]["x/y"]"#);
    }

    #[test]
    fn failure_names_the_path_and_value() {
        let c = compile(json!({"target": "output.structured", "schema": {
            "type": "object", "properties": {"confidence": {"type": "number", "maximum": 1.0}}}}))
        .unwrap();
        let v = c.evaluate(&trace());
        assert!(!v.passed);
        assert!(v.explanation.contains("/confidence"), "{}", v.explanation);
        assert!(v.explanation.contains("1.23"), "{}", v.explanation);
    }

    #[test]
    fn older_drafts_are_selected() {
        // Draft 4 uses boolean exclusiveMaximum; in 2020-12 the same schema is invalid.
        let schema =
            json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "maximum": 1, "exclusiveMaximum": true});
        let c = compile(json!({"target": "output.structured.confidence", "schema": schema})).unwrap();
        assert_eq!(c.draft, "4");
        assert!(!c.evaluate(&trace()).passed);
        for (uri, name) in [
            ("http://json-schema.org/draft-06/schema#", "6"),
            ("http://json-schema.org/draft-07/schema#", "7"),
            ("https://json-schema.org/draft/2019-09/schema", "2019-09"),
        ] {
            let c = compile(json!({"target": "output", "schema": {"$schema": uri}})).unwrap();
            assert_eq!(c.draft, name);
        }
    }

    #[test]
    fn bad_schemas_are_spec_errors() {
        let e = compile(json!({"target": "output", "schema": {"type": "not-a-valid-type"}})).unwrap_err();
        assert!(e.message.starts_with("malformed JSON Schema"), "{}", e.message);
        let e = compile(json!({"target": "output", "schema": {"$schema": "https://example.com/mine"}})).unwrap_err();
        assert!(e.message.starts_with("unsupported $schema"));
        let e = compile(json!({"target": "output", "schema": {"$ref": "https://example.com/remote.json"}})).unwrap_err();
        assert!(e.message.starts_with("malformed JSON Schema"), "{}", e.message);
        assert!(compile(json!({"target": "output"})).is_err());
        assert!(compile(json!({"target": "outptu", "schema": {}})).is_err());
    }

    #[test]
    fn a_schema_over_its_size_limit_is_refused_before_it_is_compiled() {
        let values: Vec<Value> = (0..120_000).map(|i| json!({"i": i})).collect();
        let e = compile(json!({"target": "output", "schema": {"enum": values}})).unwrap_err();
        assert_eq!(e.field, "spec.schema");
        assert!(e.message.starts_with("schema too large: "), "{}", e.message);
    }

    #[test]
    fn patterns_keep_the_bounds_of_regex_match() {
        // Too large compiled, and too long: refused before the schema is
        // compiled, naming where the pattern is.
        let e = compile(json!({"target": "output", "schema": {"properties": {"id": {"pattern": ".{5000}"}}}})).unwrap_err();
        assert_eq!(e.field, "spec.schema.properties.id.pattern");
        assert!(e.message.contains("is too large"), "{}", e.message);
        let e = compile(json!({"target": "output", "schema": {"items": [{"patternProperties": {"a".repeat(10_001): {}}}]}})).unwrap_err();
        assert_eq!(e.field, "spec.schema.items[0].patternProperties");
        assert!(e.message.contains("exceeds maximum length"), "{}", e.message);
        // A "pattern" member of an instance (an enum's, a default) is data,
        // but a property named like one of those is a schema.
        let data = json!({"pattern": "a".repeat(10_001)});
        assert!(compile(json!({"target": "output", "schema": {"enum": [data.clone()], "default": data}})).is_ok());
        let e = compile(json!({"target": "output", "schema": {"properties": {"enum": {"pattern": "a".repeat(10_001)}}}})).unwrap_err();
        assert_eq!(e.field, "spec.schema.properties.enum.pattern");
        // Within them, the schema compiler judges the syntax, as before.
        assert!(compile(json!({"target": "output", "schema": {"pattern": "^[A-Z]{3}-\\d{4}$"}})).is_ok());
        let e = compile(json!({"target": "output", "schema": {"pattern": "(unclosed"}})).unwrap_err();
        assert!(e.message.starts_with("malformed JSON Schema"), "{}", e.message);
        assert!(
            e.message.contains("'(unclosed' is not a valid regular expression: unclosed group"),
            "{}",
            e.message
        );
    }

    /// A `pattern` reads as ECMA-262 (`\d` is an ASCII digit, as the schema
    /// crate's own `pattern` reads it), searches anywhere in the string, and
    /// fails with the schema crate's wording; non-strings pass it.
    #[test]
    fn a_pattern_matches_as_ecma_262_reads_it() {
        let check = |schema: Value, structured: Value| {
            compile(json!({"target": "output.structured", "schema": schema}))
                .unwrap()
                .evaluate(&trace_with(structured))
        };
        let digits = json!({"properties": {"id": {"pattern": "^RFD-\\d{3}$"}}});
        assert!(check(digits.clone(), json!({"id": "RFD-123"})).passed);
        assert!(check(digits.clone(), json!({"id": 7})).passed);
        let v = check(digits.clone(), json!({"id": "RFD-١٢٣"}));
        assert!(!v.passed);
        assert!(
            v.explanation.contains("at /id: \"RFD-١٢٣\" does not match \"^RFD-\\d{3}$\""),
            "{}",
            v.explanation
        );
        assert!(check(json!({"pattern": "refund"}), json!("your refund is done")).passed);
        // Nested under a reference, and in an older draft.
        let nested = json!({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"id": {"pattern": "^X"}}, "items": {"$ref": "#/definitions/id"}});
        assert!(check(nested.clone(), json!(["X1", "X2"])).passed);
        assert!(!check(nested, json!(["X1", "Y2"])).passed);
    }

    /// What a compiled schema weighs: its `pattern`s by their programs (their
    /// search caches are bounded with every regex's), a `patternProperties`
    /// key with a search cache per regex thread.
    #[test]
    fn a_pattern_weighs_its_program_and_a_property_key_its_caches_too() {
        let pattern = compile(json!({"target": "output", "schema": {"properties": {"id": {"pattern": "^RFD-[0-9]{3}$"}}}})).unwrap();
        assert!(pattern.memory_bytes() < 64 * 1024, "{}", pattern.memory_bytes());
        let key = compile(json!({"target": "output", "schema": {"patternProperties": {"^RFD-[0-9]{3}$": {}}}})).unwrap();
        assert!(
            key.memory_bytes() >= crate::watchdog::THREADS * SCHEMA_PATTERN_CACHE_BYTES,
            "{}",
            key.memory_bytes()
        );
    }

    #[test]
    fn missing_target_data_fails_with_reason() {
        let c = compile(json!({"target": "steps[?name=='ship'].args", "schema": {}})).unwrap();
        let v = c.evaluate(&trace());
        assert!(!v.passed);
        assert!(v.explanation.contains("no step named 'ship'"), "{}", v.explanation);
    }
}
