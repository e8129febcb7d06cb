//! The ECP manifest: parsing the YAML file, expanding CSV/JSONL datasets into
//! steps and validating every grader once, so the runner only ever sees typed,
//! checked values. Errors name the scenario, step, grader and field and list
//! the valid choices.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Largest manifest or dataset file read into memory.
const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;

/// Which agent result field a text, judge or `attest` grader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    PublicOutput,
    EvaluationContext,
    /// Deprecated alias of `evaluation_context`.
    PrivateThought,
}

impl Field {
    pub const CHOICES: &'static str = "public_output, evaluation_context, private_thought";

    pub fn as_str(self) -> &'static str {
        match self {
            Field::PublicOutput => "public_output",
            Field::EvaluationContext => "evaluation_context",
            Field::PrivateThought => "private_thought",
        }
    }

    fn parse(s: &str) -> Option<Field> {
        match s {
            "public_output" => Some(Field::PublicOutput),
            "evaluation_context" => Some(Field::EvaluationContext),
            "private_thought" => Some(Field::PrivateThought),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextCondition {
    Contains,
    Equals,
    DoesNotContain,
    Regex,
}

impl TextCondition {
    pub const CHOICES: &'static str = "contains, equals, does_not_contain, regex";

    pub fn as_str(self) -> &'static str {
        match self {
            TextCondition::Contains => "contains",
            TextCondition::Equals => "equals",
            TextCondition::DoesNotContain => "does_not_contain",
            TextCondition::Regex => "regex",
        }
    }

    fn parse(s: &str) -> Option<TextCondition> {
        match s {
            "contains" => Some(TextCondition::Contains),
            "equals" => Some(TextCondition::Equals),
            "does_not_contain" => Some(TextCondition::DoesNotContain),
            "regex" => Some(TextCondition::Regex),
            _ => None,
        }
    }
}

/// What an `attest` grader turns into a trace: the current step alone, or
/// every step of the scenario so far (so `contains_in_order` can span turns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttestScope {
    Step,
    Transcript,
}

impl AttestScope {
    pub const CHOICES: &'static str = "step, transcript";
}

#[derive(Debug, Clone)]
pub enum Grader {
    TextMatch {
        field: Field,
        condition: TextCondition,
        /// Present for every condition but `regex`.
        value: Option<String>,
        /// Present for `regex`; compiled once here.
        pattern: Option<(String, fancy_regex::Regex)>,
    },
    LlmJudge {
        field: Field,
        prompt: String,
        assertion: Option<String>,
    },
    ToolUsage {
        tool_name: Option<String>,
        arguments: Map<String, Value>,
    },
    Attest {
        field: Field,
        scope: AttestScope,
        /// An Attest `evaluate_batch` assertion object (`type`, `spec`, ...).
        assertion: Value,
    },
}

impl Grader {
    pub fn type_name(&self) -> &'static str {
        match self {
            Grader::TextMatch { .. } => "text_match",
            Grader::LlmJudge { .. } => "llm_judge",
            Grader::ToolUsage { .. } => "tool_usage",
            Grader::Attest { .. } => "attest",
        }
    }

    /// The field name a check reports: `tool_calls` for tool usage.
    pub fn field_name(&self) -> &'static str {
        match self {
            Grader::TextMatch { field, .. } | Grader::LlmJudge { field, .. } | Grader::Attest { field, .. } => field.as_str(),
            Grader::ToolUsage { .. } => "tool_calls",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    pub input: String,
    pub graders: Vec<Grader>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub digest: String,
    pub name: String,
    pub target: String,
    pub require_capabilities: bool,
    /// Variables set in the agent's environment (extension: `env:`).
    pub env: BTreeMap<String, String>,
    /// Variables copied from the runtime's environment (extension: `pass_env:`).
    pub pass_env: Vec<String>,
    pub scenarios: Vec<Scenario>,
}

impl Manifest {
    /// Capabilities the manifest's graders need, with the grader that needs each.
    pub fn required_capabilities(&self) -> BTreeMap<&'static str, String> {
        let mut needed = BTreeMap::new();
        for grader in self.scenarios.iter().flat_map(|s| &s.steps).flat_map(|s| &s.graders) {
            match grader {
                Grader::ToolUsage { .. } => {
                    needed.entry("tool_calls").or_insert_with(|| "a tool_usage grader".to_string());
                }
                Grader::TextMatch { field, .. } | Grader::LlmJudge { field, .. } | Grader::Attest { field, .. }
                    if *field != Field::PublicOutput =>
                {
                    needed
                        .entry("evaluation_context")
                        .or_insert_with(|| format!("a {} grader on {}", grader.type_name(), field.as_str()));
                }
                _ => {}
            }
        }
        needed
    }

    pub fn step_count(&self) -> usize {
        self.scenarios.iter().map(|s| s.steps.len()).sum()
    }

    pub fn grader_count(&self) -> usize {
        self.scenarios.iter().flat_map(|s| &s.steps).map(|s| s.graders.len()).sum()
    }
}

/// Longest problem shown, in bytes.
const MAX_PROBLEM_BYTES: usize = 1024;

/// Every problem found in a manifest, each with its location.
#[derive(Debug)]
pub struct ManifestErrors {
    pub path: PathBuf,
    pub errors: Vec<String>,
}

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "manifest {} is invalid ({} problem(s)):", self.path.display(), self.errors.len())?;
        // A problem may quote the manifest's own text: shown on one line,
        // clipped, with control characters escaped.
        for e in &self.errors {
            writeln!(f, "  - {}", crate::util::one_line(&crate::util::clip(e, MAX_PROBLEM_BYTES)))?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestErrors {}

const ROOT_KEYS: &str = "manifest_version, name, target, require_capabilities, scenarios, env, pass_env";
const STEP_KEYS: &str = "input, constraints, graders";
const GRADER_KEYS: &str = "type, field, condition, value, pattern, prompt, assertion, tool_name, arguments, scope";
const GRADER_TYPES: &str = "text_match, llm_judge, tool_usage, attest";

/// A manifest's or a dataset's bytes, up to [`MAX_FILE_BYTES`], or what is
/// wrong with the file.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    attest_io::read_capped(path, MAX_FILE_BYTES).map_err(|e| format!("{} {e}", path.display()))
}

/// Load, expand and validate a manifest file.
pub fn load(path: &Path) -> Result<Manifest, ManifestErrors> {
    validate(path, None)
}

/// [`load`], with every `attest` grader's assertion also checked by
/// `host`'s evaluator, in the same pass, so that one run lists every problem
/// at its place. A dataset repeats its steps' graders, so an assertion
/// problem is listed once, at its first place.
pub fn load_checked(path: &Path, host: &dyn crate::host::GradingHost) -> Result<Manifest, ManifestErrors> {
    validate(path, Some(host))
}

fn validate(path: &Path, host: Option<&dyn crate::host::GradingHost>) -> Result<Manifest, ManifestErrors> {
    let fail = |e: String| ManifestErrors {
        path: path.to_path_buf(),
        errors: vec![e],
    };
    let bytes = read_bounded(path).map_err(fail)?;
    let digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
    let text = attest_io::utf8(bytes).map_err(|e| fail(format!("the file {e}")))?;
    let doc: Value = attest_yaml::load(&text).map_err(|e| fail(format!("not valid YAML: {e}")))?;
    let base_dir = path
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let mut v = Validator {
        errors: Vec::new(),
        host,
        assertion_problems: std::collections::HashSet::new(),
    };
    let manifest = v.manifest(&doc, path, &base_dir, digest);
    match manifest {
        Some(m) if v.errors.is_empty() => Ok(m),
        _ => Err(ManifestErrors {
            path: path.to_path_buf(),
            errors: v.errors,
        }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON values that read as "nothing" (Python's falsy values).
fn is_empty_json(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        // PyYAML values JSON cannot hold (see `attest_yaml::Special`).
        Value::Object(_) => match attest_yaml::special(v) {
            Some(attest_yaml::Special::Timestamp(_)) => "a YAML timestamp (quote it to use it as text)",
            Some(attest_yaml::Special::NonFinite(_)) => "an infinite or NaN float (quote it to use it as text)",
            None => "a mapping",
        },
    }
}

/// A scenario's `dataset` mapping, checked.
struct DatasetSpec {
    /// CSV (`type: csv`) rather than JSON Lines (`type: jsonl`).
    csv: bool,
    /// The file, relative to the manifest's directory.
    source: String,
    input_col: String,
    output_col: String,
}

struct Validator<'h> {
    errors: Vec<String>,
    /// Checks `attest` graders' assertions when given.
    host: Option<&'h dyn crate::host::GradingHost>,
    /// Assertion problems already listed.
    assertion_problems: std::collections::HashSet<String>,
}

impl Validator<'_> {
    fn err(&mut self, msg: String) {
        // Bounded: a pathological manifest does not produce unbounded output.
        if self.errors.len() < 200 {
            self.errors.push(msg);
        }
    }

    fn unknown_keys(&mut self, obj: &Map<String, Value>, allowed: &str, loc: &str) {
        let allowed_list: Vec<&str> = allowed.split(", ").collect();
        for key in obj.keys() {
            if !allowed_list.contains(&key.as_str()) {
                self.err(format!("{loc}: unknown field '{key}'; valid fields: {allowed}"));
            }
        }
    }

    fn string(&mut self, obj: &Map<String, Value>, key: &str, loc: &str, required: bool) -> Option<String> {
        match obj.get(key) {
            None | Some(Value::Null) => {
                if required {
                    self.err(format!("{loc}: field '{key}' is required"));
                }
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                self.err(format!("{loc}: field '{key}' must be a string, got {}", type_of(other)));
                None
            }
        }
    }

    fn manifest(&mut self, doc: &Value, path: &Path, base_dir: &Path, digest: String) -> Option<Manifest> {
        let Some(root) = doc.as_object() else {
            self.err(format!(
                "the top level must be a mapping with fields {ROOT_KEYS}, got {}",
                type_of(doc)
            ));
            return None;
        };
        self.unknown_keys(root, ROOT_KEYS, "manifest");
        match root.get("manifest_version") {
            Some(Value::String(s)) if s == "v1" => {}
            Some(other) => self.err(format!(
                "manifest: field 'manifest_version' must be \"v1\" (the only version), got {other}"
            )),
            None => self.err("manifest: field 'manifest_version' is required; valid choices: v1".into()),
        }
        let name = self.string(root, "name", "manifest", true);
        if name.as_deref() == Some("") {
            self.err("manifest: field 'name' must not be empty".into());
        }
        let target = self.string(root, "target", "manifest", true);
        if target.as_deref().is_some_and(|t| t.trim().is_empty()) {
            self.err("manifest: field 'target' must not be empty: give the agent command or its http(s):// endpoint".into());
        }
        let require_capabilities = match root.get("require_capabilities") {
            None | Some(Value::Null) => false,
            Some(v) => lax_bool(v).unwrap_or_else(|| {
                self.err(format!(
                    "manifest: field 'require_capabilities' must be true or false (or 1/0, \"yes\"/\"no\", \"on\"/\"off\"), got {}",
                    crate::util::clip(&v.to_string(), 100)
                ));
                false
            }),
        };
        let mut env = BTreeMap::new();
        match root.get("env") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    // Refused here, before any agent starts: a bad name would
                    // otherwise reach the agent as another variable (`A=B`
                    // sets `A`), and a NUL byte would fail every scenario at
                    // its start without naming the entry.
                    if let Err(why) = crate::transport::check_env_name(k) {
                        self.err(format!("manifest: env.{k}: {why}"));
                        continue;
                    }
                    let value = match v {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        other => {
                            self.err(format!("manifest: env '{k}' must be a string, got {}", type_of(other)));
                            continue;
                        }
                    };
                    if value.contains('\0') {
                        self.err(format!(
                            "manifest: env.{k}: the value holds a NUL byte, which an environment variable cannot carry"
                        ));
                        continue;
                    }
                    env.insert(k.clone(), value);
                }
            }
            Some(other) => self.err(format!(
                "manifest: field 'env' must be a mapping of NAME: value, got {}",
                type_of(other)
            )),
        }
        let mut pass_env = Vec::new();
        match root.get("pass_env") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for (i, v) in a.iter().enumerate() {
                    match v.as_str() {
                        Some(s) => match crate::transport::check_env_name(s) {
                            Ok(()) => pass_env.push(s.to_string()),
                            Err(why) => self.err(format!("manifest: pass_env[{i}] ({s:?}): {why}")),
                        },
                        None => self.err(format!("manifest: pass_env entries must be variable names, got {v}")),
                    }
                }
            }
            Some(other) => self.err(format!(
                "manifest: field 'pass_env' must be a list of variable names, got {}",
                type_of(other)
            )),
        }
        let mut scenarios = Vec::new();
        match root.get("scenarios") {
            Some(Value::Array(list)) => {
                for (i, s) in list.iter().enumerate() {
                    if let Some(s) = self.scenario(s, i + 1, base_dir) {
                        scenarios.push(s);
                    }
                }
            }
            Some(other) => self.err(format!("manifest: field 'scenarios' must be a list, got {}", type_of(other))),
            None => self.err("manifest: field 'scenarios' is required (a list of scenarios with steps or a dataset)".into()),
        }
        Some(Manifest {
            path: path.to_path_buf(),
            digest,
            name: name?,
            target: target?,
            require_capabilities,
            env,
            pass_env,
            scenarios,
        })
    }

    fn scenario(&mut self, v: &Value, index: usize, base_dir: &Path) -> Option<Scenario> {
        let loc0 = format!("scenario #{index}");
        let Some(obj) = v.as_object() else {
            self.err(format!(
                "{loc0}: must be a mapping with 'name' and 'steps' or 'dataset', got {}",
                type_of(v)
            ));
            return None;
        };
        let name = self.string(obj, "name", &loc0, true);
        let loc = match &name {
            Some(n) => format!("scenario '{n}' (#{index})"),
            None => loc0,
        };
        let mut steps = Vec::new();
        match obj.get("steps") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for (i, s) in list.iter().enumerate() {
                    if let Some(s) = self.step(s, &format!("{loc}, step {}", i + 1)) {
                        steps.push(s);
                    }
                }
            }
            Some(other) => self.err(format!("{loc}: field 'steps' must be a list, got {}", type_of(other))),
        }
        let has_steps = matches!(obj.get("steps"), Some(Value::Array(a)) if !a.is_empty());
        match obj.get("dataset") {
            None | Some(Value::Null) => {
                if !has_steps {
                    self.err(format!("{loc}: needs either 'steps' (a non-empty list) or 'dataset'"));
                }
            }
            Some(d) => {
                let loc = format!("{loc}, dataset");
                // The dataset's fields are checked either way, as the
                // reference's schema checks them; its file is read only when
                // there are no explicit steps, since explicit steps win over a
                // dataset there and a dataset that is not used is never opened.
                if let Some(spec) = self.dataset_spec(d, &loc) {
                    if !has_steps {
                        steps = self.dataset(&spec, &loc, base_dir);
                    }
                }
            }
        }
        Some(Scenario { name: name?, steps })
    }

    /// A scenario's `dataset` mapping, checked without reading its file.
    fn dataset_spec(&mut self, v: &Value, loc: &str) -> Option<DatasetSpec> {
        let Some(obj) = v.as_object() else {
            self.err(format!("{loc}: must be a mapping with 'type' and 'source', got {}", type_of(v)));
            return None;
        };
        let kind = self.string(obj, "type", loc, true);
        let source = self.string(obj, "source", loc, true);
        let input_col = self.string(obj, "input_column", loc, false).unwrap_or_else(|| "input".into());
        let output_col = self.string(obj, "output_column", loc, false).unwrap_or_else(|| "output".into());
        let (kind, source) = (kind?, source?);
        let csv = match kind.as_str() {
            "csv" => true,
            "jsonl" => false,
            _ => {
                self.err(format!("{loc}: field 'type' is '{kind}'; valid choices: csv, jsonl"));
                return None;
            }
        };
        Some(DatasetSpec {
            csv,
            source,
            input_col,
            output_col,
        })
    }

    /// The steps a dataset file expands to.
    fn dataset(&mut self, spec: &DatasetSpec, loc: &str, base_dir: &Path) -> Vec<Step> {
        let DatasetSpec {
            csv: is_csv,
            source,
            input_col,
            output_col,
        } = spec;
        let file = base_dir.join(source);
        let bytes = match read_bounded(&file) {
            Ok(b) => b,
            Err(e) => {
                self.err(format!("{loc}: dataset file {e}"));
                return Vec::new();
            }
        };
        let rows: Vec<(String, String)> = if *is_csv {
            let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(bytes.as_slice());
            let headers = match reader.headers() {
                Ok(h) => h.clone(),
                Err(e) => {
                    self.err(format!("{loc}: {}: not valid CSV: {e}", file.display()));
                    return Vec::new();
                }
            };
            // Of two columns with the same name, the last one's cell is the
            // value, as in Python's csv.DictReader (each later column
            // overwrites the row dict's entry). A UTF-8 BOM before the first
            // header is dropped by the csv reader (deliberately: the reference
            // keeps it in the first column's name, so that column is never
            // found; see docs/ecp.md).
            let col = |name: &str| (0..headers.len()).rev().find(|&i| headers.get(i) == Some(name));
            let (ic, oc) = (col(input_col), col(output_col));
            let mut rows = Vec::new();
            for (n, rec) in reader.records().enumerate() {
                match rec {
                    Ok(r) => {
                        let get = |c: Option<usize>| c.and_then(|c| r.get(c)).unwrap_or("").to_string();
                        rows.push((get(ic), get(oc)));
                    }
                    Err(e) => {
                        self.err(format!("{loc}: {} row {}: not valid CSV: {e}", file.display(), n + 2));
                        return Vec::new();
                    }
                }
            }
            rows
        } else {
            let text = String::from_utf8_lossy(&bytes);
            let mut rows = Vec::new();
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let lloc = format!("{loc}: {} line {}", file.display(), n + 1);
                let row: Value = match serde_json::from_str(line) {
                    Ok(v) => v,
                    Err(e) => {
                        self.err(format!("{lloc}: not valid JSON: {e}"));
                        continue;
                    }
                };
                let Some(obj) = row.as_object() else {
                    self.err(format!("{lloc}: each line must be a JSON object, got {}", type_of(&row)));
                    continue;
                };
                // An expected output that is absent or empty in any JSON way
                // (null, false, 0, "", [], {}) means "no grader", as in the
                // reference runtime; an input must be a string when present.
                let mut cell = |col: &str, empty_means_none: bool| match obj.get(col) {
                    None => Some(String::new()),
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(v) if empty_means_none && is_empty_json(v) => Some(String::new()),
                    Some(other) => {
                        self.err(format!("{lloc}: column '{col}' must be a string, got {}", type_of(other)));
                        None
                    }
                };
                if let (Some(i), Some(o)) = (cell(input_col, false), cell(output_col, true)) {
                    rows.push((i, o));
                }
            }
            rows
        };
        rows.into_iter()
            .map(|(input, output)| Step {
                input,
                // A row with an expected output is graded by exact equality.
                graders: if output.is_empty() {
                    Vec::new()
                } else {
                    vec![Grader::TextMatch {
                        field: Field::PublicOutput,
                        condition: TextCondition::Equals,
                        value: Some(output),
                        pattern: None,
                    }]
                },
            })
            .collect()
    }

    fn step(&mut self, v: &Value, loc: &str) -> Option<Step> {
        let Some(obj) = v.as_object() else {
            self.err(format!("{loc}: must be a mapping with 'input' and 'graders', got {}", type_of(v)));
            return None;
        };
        self.unknown_keys(obj, STEP_KEYS, loc);
        let input = self.string(obj, "input", loc, true);
        if let Some(c) = obj.get("constraints") {
            if !c.is_object() && !c.is_null() {
                self.err(format!("{loc}: field 'constraints' must be a mapping, got {}", type_of(c)));
            }
        }
        let mut graders = Vec::new();
        match obj.get("graders") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for (i, g) in list.iter().enumerate() {
                    if let Some(g) = self.grader(g, &format!("{loc}, grader {}", i + 1)) {
                        graders.push(g);
                    }
                }
            }
            Some(other) => self.err(format!("{loc}: field 'graders' must be a list, got {}", type_of(other))),
        }
        Some(Step { input: input?, graders })
    }

    fn grader(&mut self, v: &Value, loc: &str) -> Option<Grader> {
        let Some(obj) = v.as_object() else {
            self.err(format!(
                "{loc}: must be a mapping with a 'type' ({GRADER_TYPES}), got {}",
                type_of(v)
            ));
            return None;
        };
        self.unknown_keys(obj, GRADER_KEYS, loc);
        let kind = self.string(obj, "type", loc, false);
        let Some(kind) = kind else {
            self.err(format!("{loc}: field 'type' is required; valid choices: {GRADER_TYPES}"));
            return None;
        };
        let loc = format!("{loc} ({kind})");
        let loc = loc.as_str();
        let field = match obj.get("field") {
            None | Some(Value::Null) => Some(Field::PublicOutput),
            Some(Value::String(s)) => {
                let f = Field::parse(s);
                if f.is_none() {
                    self.err(format!("{loc}: field 'field' is '{s}'; valid choices: {}", Field::CHOICES));
                }
                f
            }
            Some(other) => {
                self.err(format!(
                    "{loc}: field 'field' must be a string; valid choices: {}, got {other}",
                    Field::CHOICES
                ));
                None
            }
        };
        let value = self.string(obj, "value", loc, false);
        let pattern = self.string(obj, "pattern", loc, false);
        let prompt = self.string(obj, "prompt", loc, false);
        let tool_name = self.string(obj, "tool_name", loc, false);
        let arguments = match obj.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                self.err(format!(
                    "{loc}: field 'arguments' must be a mapping of expected argument values, got {}",
                    type_of(other)
                ));
                Map::new()
            }
        };
        let condition_raw = self.string(obj, "condition", loc, false);
        if kind != "attest" {
            if obj.contains_key("scope") {
                self.err(format!("{loc}: field 'scope' only applies to attest graders"));
            }
            if let Some(a) = obj.get("assertion") {
                if !a.is_string() && !a.is_null() {
                    self.err(format!("{loc}: field 'assertion' must be a string, got {}", type_of(a)));
                }
            }
        }
        match kind.as_str() {
            "text_match" => {
                let Some(raw) = condition_raw else {
                    self.err(format!(
                        "{loc}: field 'condition' is required; valid choices: {}",
                        TextCondition::CHOICES
                    ));
                    return None;
                };
                let Some(condition) = TextCondition::parse(&raw) else {
                    self.err(format!(
                        "{loc}: field 'condition' is '{raw}'; valid choices: {}",
                        TextCondition::CHOICES
                    ));
                    return None;
                };
                let mut compiled = None;
                if condition == TextCondition::Regex {
                    match pattern.as_deref() {
                        None | Some("") => {
                            self.err(format!("{loc}: condition 'regex' requires a non-empty field 'pattern'"));
                            return None;
                        }
                        Some(p) => match crate::python_regex::python_regex(p)
                            .and_then(|rx| fancy_regex::Regex::new(&rx).map_err(|e| e.to_string()))
                        {
                            Ok(re) => compiled = Some((p.to_string(), re)),
                            Err(e) => {
                                self.err(format!("{loc}: field 'pattern' is not a valid regular expression: {e}"));
                                return None;
                            }
                        },
                    }
                } else if value.is_none() {
                    self.err(format!("{loc}: condition '{raw}' requires field 'value' (a string)"));
                    return None;
                }
                Some(Grader::TextMatch {
                    field: field?,
                    condition,
                    value,
                    pattern: compiled,
                })
            }
            "llm_judge" => {
                let Some(prompt) = prompt.filter(|p| !p.trim().is_empty()) else {
                    self.err(format!(
                        "{loc}: field 'prompt' is required and must not be blank: the criteria the judge applies"
                    ));
                    return None;
                };
                let assertion = obj.get("assertion").and_then(Value::as_str).map(str::to_string);
                Some(Grader::LlmJudge {
                    field: field?,
                    prompt,
                    assertion,
                })
            }
            "tool_usage" => Some(Grader::ToolUsage { tool_name, arguments }),
            "attest" => {
                let scope = match obj.get("scope") {
                    None | Some(Value::Null) => AttestScope::Step,
                    Some(Value::String(s)) if s == "step" => AttestScope::Step,
                    Some(Value::String(s)) if s == "transcript" => AttestScope::Transcript,
                    Some(other) => {
                        self.err(format!("{loc}: field 'scope' is {other}; valid choices: {}", AttestScope::CHOICES));
                        return None;
                    }
                };
                let assertion = match obj.get("assertion") {
                    Some(Value::Object(a)) => a,
                    Some(other) => {
                        self.err(format!(
                            "{loc}: field 'assertion' must be an evaluate_batch assertion mapping with 'type' and 'spec', got {}",
                            type_of(other)
                        ));
                        return None;
                    }
                    None => {
                        self.err(format!(
                            "{loc}: field 'assertion' is required: an evaluate_batch assertion mapping with 'type' and 'spec'"
                        ));
                        return None;
                    }
                };
                if !assertion.get("type").is_some_and(Value::is_string) {
                    self.err(format!(
                        "{loc}: assertion needs a string 'type'; valid choices: schema, constraint, trace, content, embedding, llm_judge, trace_tree, or a plugin type"
                    ));
                    return None;
                }
                if !assertion.get("spec").is_some_and(Value::is_object) {
                    self.err(format!("{loc}: assertion needs a 'spec' mapping"));
                    return None;
                }
                let assertion = assertion.clone();
                if let Some(host) = self.host {
                    // The runner names the assertion when the manifest does not.
                    let mut named = assertion.clone();
                    named.entry("assertion_id").or_insert_with(|| Value::from("ecp_check"));
                    if let Err(why) = host.check_attest(&Value::Object(named)) {
                        if self.assertion_problems.insert(why.clone()) {
                            self.err(format!("{loc}: field 'assertion': {why}"));
                        }
                    }
                }
                Some(Grader::Attest {
                    field: field?,
                    scope,
                    assertion: Value::Object(assertion),
                })
            }
            other => {
                self.err(format!("{loc}: unknown grader type '{other}'; valid choices: {GRADER_TYPES}"));
                None
            }
        }
    }
}

/// A boolean as the reference runtime's manifest model (pydantic, lax mode)
/// reads one: besides `true`/`false`, the numbers 1 and 0 and the strings
/// `1`/`0`, `true`/`false`, `t`/`f`, `yes`/`no`, `y`/`n`, `on`/`off` in any
/// case. A manifest written for it may say `require_capabilities: "true"`.
fn lax_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(1.0) => Some(true),
            Some(0.0) => Some(false),
            _ => None,
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
            "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(yaml: &str) -> Result<Manifest, ManifestErrors> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.yaml");
        std::fs::write(&p, yaml).unwrap();
        load(&p)
    }

    #[test]
    fn unknown_condition_names_location_and_choices() {
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - type: text_match\n            condition: startswith\n            value: x\n",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("scenario 'S' (#1), step 1, grader 1 (text_match)"), "{msg}");
        assert!(msg.contains("'startswith'") && msg.contains(TextCondition::CHOICES), "{msg}");
    }

    #[test]
    fn unknown_grader_type_and_field_are_listed() {
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - type: fuzzy\n          - type: llm_judge\n            field: thoughts\n            prompt: p\n",
        )
        .unwrap_err();
        assert_eq!(err.errors.len(), 2, "{err}");
        assert!(err.errors[0].contains(GRADER_TYPES));
        assert!(err.errors[1].contains("step 1, grader 2") && err.errors[1].contains(Field::CHOICES));
    }

    #[test]
    fn bad_regex_and_missing_fields_are_refused() {
        let err = load_str(
            "manifest_version: v2\nname: n\ntarget: t\nextra: 1\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - type: text_match\n            condition: regex\n            pattern: '('\n  - name: Empty\n",
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        assert!(all.contains("manifest_version"), "{all}");
        assert!(all.contains("unknown field 'extra'"), "{all}");
        assert!(all.contains("not a valid regular expression"), "{all}");
        assert!(all.contains("scenario 'Empty' (#2): needs either 'steps'"), "{all}");
    }

    #[test]
    fn attest_grader_requires_an_assertion_object() {
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - type: attest\n            scope: all\n            assertion: {type: content, spec: {}}\n          - type: attest\n            assertion: contains refund\n",
        )
        .unwrap_err();
        assert!(err.errors[0].contains(AttestScope::CHOICES), "{err}");
        assert!(err.errors[1].contains("evaluate_batch assertion mapping"), "{err}");
    }

    #[test]
    fn merge_keys_are_resolved() {
        let m = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nbase: &base\n  type: text_match\n  condition: contains\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - <<: *base\n            value: hello\n",
        );
        // `base` is not a manifest key: the merge itself must have worked for this to be the only error.
        let err = m.unwrap_err().to_string();
        assert!(err.contains("unknown field 'base'"), "{err}");
        assert!(!err.contains("'<<'") && !err.contains("'type' is required"), "{err}");
        let m = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - &g {type: text_match, condition: contains, value: x}\n          - <<: *g\n            value: hello\n",
        )
        .unwrap();
        assert_eq!(m.scenarios[0].steps[0].graders.len(), 2);
    }

    #[test]
    fn require_capabilities_reads_what_the_reference_model_reads() {
        let load = |v: &str| {
            load_str(&format!(
                "manifest_version: v1\nname: n\ntarget: t\nrequire_capabilities: {v}\nscenarios:\n  - name: S\n    steps: [{{input: hi}}]\n"
            ))
        };
        for (v, want) in [
            ("true", true),
            ("'true'", true),
            ("'Yes'", true),
            ("1", true),
            ("'off'", false),
            ("0", false),
            ("null", false),
        ] {
            assert_eq!(load(v).unwrap().require_capabilities, want, "{v}");
        }
        for bad in ["2", "'maybe'", "[true]"] {
            let e = load(bad).unwrap_err();
            assert!(e.to_string().contains("'require_capabilities' must be true or false"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_dataset_is_not_read_when_explicit_steps_are_given() {
        let m = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps: [{input: hi}]\n    dataset: {type: csv, source: not_there.csv}\n",
        )
        .unwrap();
        assert_eq!(m.scenarios[0].steps.len(), 1);
        // Its fields are still checked, as the reference's schema checks them.
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps: [{input: hi}]\n    dataset: {type: xml, source: not_there.xml}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("dataset: field 'type' is 'xml'"), "{err}");
        // Without steps, a missing file is a problem.
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps: []\n    dataset: {type: csv, source: not_there.csv}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("dataset file"), "{err}");
    }

    #[test]
    fn csv_duplicate_columns_read_the_last_and_a_bom_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.csv"), "\u{feff}input,output,input\nfirst,Echo,last\n").unwrap();
        let p = dir.path().join("m.yaml");
        std::fs::write(
            &p,
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: C\n    dataset: {type: csv, source: d.csv}\n",
        )
        .unwrap();
        let m = load(&p).unwrap();
        assert_eq!(
            m.scenarios[0].steps[0].input, "last",
            "csv.DictReader keeps the last column of a name"
        );
        std::fs::write(dir.path().join("d.csv"), "\u{feff}input,output\nhi,Echo\n").unwrap();
        assert_eq!(load(&p).unwrap().scenarios[0].steps[0].input, "hi");
    }

    #[test]
    fn env_and_pass_env_names_are_checked_at_load() {
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nenv: {\"A=B\": x, \"\": y, GOOD: \"a\\0b\", FINE: ok}\npass_env: [\"B=C\", \"\", HOME]\nscenarios:\n  - name: S\n    steps: [{input: hi}]\n",
        )
        .unwrap_err();
        let all = err.errors.join("\n");
        assert_eq!(err.errors.len(), 5, "{all}");
        assert!(all.contains("env.A=B: not a valid environment variable name"), "{all}");
        assert!(all.contains("env.: not a valid environment variable name"), "{all}");
        assert!(all.contains("env.GOOD: the value holds a NUL byte"), "{all}");
        assert!(all.contains("pass_env[0] (\"B=C\"): not a valid"), "{all}");
        assert!(all.contains("pass_env[1] (\"\"): not a valid"), "{all}");
        assert!(all.contains("must not be empty and must not hold '='"), "{all}");
    }

    #[test]
    fn datasets_expand_into_equality_steps() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.csv"), "question,answer\nhi,Echo: hi\nbye,\n").unwrap();
        std::fs::write(
            dir.path().join("d.jsonl"),
            "{\"input\": \"a\", \"output\": \"Echo: a\"}\n\n{\"input\": \"b\"}\n",
        )
        .unwrap();
        let p = dir.path().join("m.yaml");
        std::fs::write(
            &p,
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: C\n    dataset: {type: csv, source: d.csv, input_column: question, output_column: answer}\n  - name: J\n    dataset: {type: jsonl, source: d.jsonl}\n",
        )
        .unwrap();
        let m = load(&p).unwrap();
        assert_eq!(m.scenarios[0].steps.len(), 2);
        assert_eq!(m.scenarios[0].steps[0].graders.len(), 1);
        assert!(m.scenarios[0].steps[1].graders.is_empty());
        assert_eq!(m.scenarios[1].steps[0].input, "a");
        assert_eq!(m.scenarios[1].steps.len(), 2);
    }

    #[test]
    fn jsonl_outputs_that_are_empty_in_any_json_way_mean_no_grader() {
        let dir = tempfile::tempdir().unwrap();
        let rows = ["null", "false", "0", "\"\"", "[]", "{}"].map(|o| format!("{{\"input\": \"x\", \"output\": {o}}}\n"));
        std::fs::write(dir.path().join("d.jsonl"), rows.concat()).unwrap();
        std::fs::write(
            dir.path().join("bad.jsonl"),
            "{\"input\": null}\n{\"input\": \"x\", \"output\": 5}\n",
        )
        .unwrap();
        let manifest = |source: &str| {
            let p = dir.path().join("m.yaml");
            std::fs::write(
                &p,
                format!(
                    "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: J\n    dataset: {{type: jsonl, source: {source}}}\n"
                ),
            )
            .unwrap();
            load(&p)
        };
        let m = manifest("d.jsonl").unwrap();
        assert_eq!(m.scenarios[0].steps.len(), 6);
        assert!(m.scenarios[0].steps.iter().all(|s| s.graders.is_empty()));
        let err = manifest("bad.jsonl").unwrap_err().to_string();
        assert!(err.contains("line 1: column 'input' must be a string, got null"), "{err}");
        assert!(err.contains("line 2: column 'output' must be a string, got a number"), "{err}");
    }

    #[test]
    fn a_python_construct_rust_lacks_is_named_at_its_grader() {
        // The manifest names the construct at the grader.
        let err = load_str(
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n        graders:\n          - {type: text_match, condition: regex, pattern: '(?a)\\d+'}\n          - {type: text_match, condition: regex, pattern: '\\N{SPACE}'}\n",
        )
        .unwrap_err();
        assert_eq!(err.errors.len(), 1, "{err}");
        assert!(err.errors[0].contains("grader 2") && err.errors[0].contains("\\N{...}"), "{err}");
    }
}
