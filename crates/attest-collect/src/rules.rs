//! The rules file: which traces get which assertions, how many of them are
//! sampled, and what paid layers may spend. Parsed once at start-up; any
//! error refuses the whole file, naming the rule, the field and the valid
//! choices.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::convert::MatchContext;
use crate::{CompiledRule, TraceEvaluator};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    rules: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    name: String,
    #[serde(rename = "match", default)]
    matcher: MatchSpec,
    #[serde(default = "one")]
    sample_rate: f64,
    #[serde(default)]
    budget: Option<BudgetSpec>,
    assertions: Vec<Value>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchSpec {
    agent_id: Option<ValueMatchSpec>,
    root_span: Option<ValueMatchSpec>,
    #[serde(default)]
    attributes: HashMap<String, ValueMatchSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "must be a string, {equals: <string>} or {regex: <pattern>}")]
enum ValueMatchSpec {
    Equals(String),
    Op(OpSpec),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpSpec {
    equals: Option<String>,
    regex: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Paid model calls (judge, embedding) allowed per rolling minute.
    pub judge_calls_per_minute: Option<u32>,
    /// USD allowed per UTC day.
    pub usd_per_day: Option<f64>,
}

/// How one value is matched.
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Equals(String),
    Regex(Regex),
}

impl ValueMatch {
    pub fn matches(&self, v: &str) -> bool {
        match self {
            ValueMatch::Equals(e) => e == v,
            ValueMatch::Regex(r) => r.is_match(v),
        }
    }
}

/// A compiled rule.
pub struct Rule {
    pub name: String,
    pub agent_id: Option<ValueMatch>,
    pub root_span: Option<ValueMatch>,
    pub attributes: Vec<(String, ValueMatch)>,
    pub sample_rate: f64,
    pub suite: Arc<dyn CompiledRule>,
    pub budget: Option<Budget>,
}

impl Rule {
    pub fn matches(&self, ctx: &MatchContext) -> bool {
        let field = |m: &Option<ValueMatch>, v: &Option<String>| match m {
            None => true,
            Some(m) => v.as_deref().map(|v| m.matches(v)).unwrap_or(false),
        };
        field(&self.agent_id, &ctx.agent_id)
            && field(&self.root_span, &ctx.root_span_name)
            && self
                .attributes
                .iter()
                .all(|(k, m)| ctx.attributes.get(k).map(|v| m.matches(v)).unwrap_or(false))
    }
}

/// Deterministic sampling: the same trace id gets the same decision on every
/// node and on every redelivery.
pub fn sampled(trace_id: &str, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 {
        return false;
    }
    let digest = Sha256::digest(trace_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let x = u64::from_be_bytes(first) as f64 / (u64::MAX as f64 + 1.0);
    x < rate
}

/// Per-rule spending limits for paid layers, kept as reservations: before a
/// rule runs on a trace, its paid calls take their place in the minute's
/// count and its worst-case cost is reserved against the day's; when the
/// evaluation ends the reservation is settled with what it really cost. An
/// evaluation is admitted while what the day spent and holds reserved is
/// under `usd_per_day`, so however many traces run at once, a day never
/// passes it by more than one evaluation's worst case.
pub struct Budget {
    spec: BudgetSpec,
    state: Mutex<BudgetState>,
}

struct BudgetState {
    calls: VecDeque<(Instant, u32)>,
    day: u64,
    usd_today: f64,
    /// Worst cases of evaluations in flight, by the day they were reserved on.
    reserved: f64,
}

/// One evaluation's place in a [`Budget`]. Dropped unsettled (the
/// evaluation failed or was abandoned, and its calls may have been billed),
/// it is counted at its worst case.
pub struct BudgetHold<'a> {
    budget: &'a Budget,
    day: u64,
    worst: f64,
    settled: bool,
}

impl Budget {
    fn new(spec: BudgetSpec) -> Self {
        Budget {
            spec,
            state: Mutex::new(BudgetState {
                calls: VecDeque::new(),
                day: 0,
                usd_today: 0.0,
                reserved: 0.0,
            }),
        }
    }

    fn today() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() / 86_400)
            .unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `calls` paid calls and `worst_usd`; `None` when the minute's
    /// calls or the day's dollars are spent or held.
    pub fn try_reserve(&self, calls: u32, worst_usd: f64) -> Option<BudgetHold<'_>> {
        let mut s = self.lock();
        let now = Instant::now();
        while s
            .calls
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_secs(60))
        {
            s.calls.pop_front();
        }
        let day = Self::today();
        if s.day != day {
            s.day = day;
            s.usd_today = 0.0;
            s.reserved = 0.0;
        }
        if calls > 0 {
            if let Some(limit) = self.spec.usd_per_day {
                if s.usd_today + s.reserved >= limit {
                    return None;
                }
            }
            if let Some(limit) = self.spec.judge_calls_per_minute {
                let used: u32 = s.calls.iter().map(|(_, c)| *c).sum();
                if used + calls > limit {
                    return None;
                }
            }
            s.calls.push_back((now, calls));
        }
        let worst = worst_usd.max(0.0);
        s.reserved += worst;
        Some(BudgetHold {
            budget: self,
            day,
            worst,
            settled: false,
        })
    }

    /// USD spent today by settled evaluations, and USD held by those in flight.
    pub fn today_usd(&self) -> (f64, f64) {
        let s = self.lock();
        (s.usd_today, s.reserved)
    }

    fn release(&self, day: u64, worst: f64, cost: f64) {
        let mut s = self.lock();
        // A reservation of a day that has ended belongs to no budget now.
        if s.day == day {
            s.reserved = (s.reserved - worst).max(0.0);
            s.usd_today += cost;
        }
    }
}

impl BudgetHold<'_> {
    /// The evaluation ended: what it cost replaces what was reserved.
    pub fn settle(mut self, cost_usd: f64) {
        self.settled = true;
        self.budget.release(self.day, self.worst, cost_usd.max(0.0));
    }
}

impl Drop for BudgetHold<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.budget.release(self.day, self.worst, self.worst);
        }
    }
}

/// All rules of a file, in file order.
pub struct RuleSet {
    pub rules: Vec<Rule>,
    /// The rules file's version: a digest of what it holds, carried by every
    /// work message so that a worker never scores a trace by rules other
    /// than those that selected it.
    pub version: String,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.rules.iter().map(|r| &r.name)).finish()
    }
}

/// A refused rules file.
#[derive(Debug)]
pub struct RulesFileError(pub String);

impl std::fmt::Display for RulesFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RulesFileError {}

/// Longest rule name, in bytes. The engine stores a rule's results in its
/// history under `<rule>/<assertion_id>`, and `query_drift` takes names of
/// at most [`MAX_RESULT_NAME_BYTES`]: a longer name would store results no
/// query can reach. 128 leaves the other half for assertion ids.
pub const MAX_RULE_NAME_BYTES: usize = 128;

/// Longest `<rule>/<assertion_id>`, in bytes: the engine's assertion id limit
/// (`attest_core::suite::MAX_ASSERTION_ID_BYTES`), which `query_drift`
/// applies to the names it looks up.
pub const MAX_RESULT_NAME_BYTES: usize = 256;

const RULE_FIELDS: &str = "name, match, sample_rate, budget, assertions";

impl RuleSet {
    pub fn load(path: &Path, evaluator: &dyn TraceEvaluator) -> Result<RuleSet, RulesFileError> {
        let text = crate::read_capped(path).map_err(|e| RulesFileError(format!("rules file {} {e}", path.display())))?;
        let is_json = path.extension().is_some_and(|e| e == "json");
        Self::parse(&text, is_json, evaluator).map_err(|e| RulesFileError(format!("rules file {}: {}", path.display(), e.0)))
    }

    /// Parses a rules file (YAML, or JSON when `is_json`) and compiles each rule's assertions.
    pub fn parse(text: &str, is_json: bool, evaluator: &dyn TraceEvaluator) -> Result<RuleSet, RulesFileError> {
        let value: Value = if is_json {
            if let Some(dup) = crate::first_misread_value(&mut serde_json::Deserializer::from_str(text)) {
                return Err(RulesFileError(dup));
            }
            serde_json::from_str(text).map_err(|e| RulesFileError(format!("not valid JSON: {e}")))?
        } else {
            crate::parse_yaml(text).map_err(|e| RulesFileError(format!("not valid YAML: {e}")))?
        };
        let version = {
            let digest = Sha256::digest(value.to_string().as_bytes());
            digest[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let file: FileSpec = serde_json::from_value(value)
            .map_err(|e| RulesFileError(format!("{e}; the top level must be an object with one key, `rules`, a list")))?;
        if file.rules.is_empty() {
            return Err(RulesFileError("`rules` is empty: add at least one rule".into()));
        }
        let mut rules = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, raw) in file.rules.into_iter().enumerate() {
            let label = raw
                .get("name")
                .and_then(Value::as_str)
                .map(|n| format!("rule #{} '{}'", i + 1, crate::bounded(n, 80)))
                .unwrap_or_else(|| format!("rule #{}", i + 1));
            // The path names the field a wrong type or value is in
            // (`budget.judge_calls_per_minute`), not only what was expected.
            let spec: RuleSpec = serde_path_to_error::deserialize(raw).map_err(|e| {
                let at = match e.path().to_string() {
                    p if p == "." => String::new(),
                    p => format!("{p}: "),
                };
                RulesFileError(format!("{label}: {at}{} (rule fields: {RULE_FIELDS}; match fields: agent_id, root_span, attributes; a matcher is a string or {{equals: ..}} / {{regex: ..}}; budget fields: judge_calls_per_minute, usd_per_day)", e.inner()))
            })?;
            let err = |field: &str, msg: String| RulesFileError(format!("{label}: {field}: {msg}"));
            if spec.name.trim().is_empty() {
                return Err(err("name", "must not be empty".into()));
            }
            if spec.name.len() > MAX_RULE_NAME_BYTES {
                return Err(err(
                    "name",
                    format!(
                        "is {} bytes, more than the {MAX_RULE_NAME_BYTES} allowed: results are stored as `<rule>/<assertion_id>`, which query_drift looks up only up to {MAX_RESULT_NAME_BYTES} bytes; shorten the name",
                        spec.name.len()
                    ),
                ));
            }
            for (j, a) in spec.assertions.iter().enumerate() {
                let Some(id) = a.get("assertion_id").and_then(Value::as_str) else {
                    continue;
                };
                let len = spec.name.len() + 1 + id.len();
                if len > MAX_RESULT_NAME_BYTES {
                    return Err(err(
                        &format!("assertions[{j}].assertion_id"),
                        format!(
                            "`<rule>/<assertion_id>` is {len} bytes, more than the {MAX_RESULT_NAME_BYTES} query_drift accepts: shorten the assertion id or the rule name"
                        ),
                    ));
                }
            }
            if !seen.insert(spec.name.clone()) {
                return Err(err(
                    "name",
                    "another rule has the same name; names key the results and must be unique".into(),
                ));
            }
            if !(0.0..=1.0).contains(&spec.sample_rate) || spec.sample_rate.is_nan() {
                return Err(err("sample_rate", format!("{} is outside 0.0..=1.0", spec.sample_rate)));
            }
            if spec.assertions.is_empty() {
                return Err(err(
                    "assertions",
                    "is empty: list at least one evaluate_batch assertion object".into(),
                ));
            }
            if let Some(b) = &spec.budget {
                if b.usd_per_day.is_some_and(|u| u.is_nan() || u < 0.0) {
                    return Err(err("budget.usd_per_day", "must be a number >= 0".into()));
                }
            }
            let compile = |field: &str, m: Option<ValueMatchSpec>| -> Result<Option<ValueMatch>, RulesFileError> {
                match m {
                    None => Ok(None),
                    Some(ValueMatchSpec::Equals(s)) => Ok(Some(ValueMatch::Equals(s))),
                    Some(ValueMatchSpec::Op(OpSpec {
                        equals: Some(s),
                        regex: None,
                    })) => Ok(Some(ValueMatch::Equals(s))),
                    Some(ValueMatchSpec::Op(OpSpec {
                        equals: None,
                        regex: Some(r),
                    })) => Regex::new(&r)
                        .map(|r| Some(ValueMatch::Regex(r)))
                        .map_err(|e| err(field, format!("invalid regex: {e}"))),
                    Some(_) => Err(err(field, "give exactly one of `equals` or `regex`".into())),
                }
            };
            let agent_id = compile("match.agent_id", spec.matcher.agent_id)?;
            let root_span = compile("match.root_span", spec.matcher.root_span)?;
            let mut attributes = Vec::new();
            let mut keys: Vec<_> = spec.matcher.attributes.into_iter().collect();
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, m) in keys {
                let field = format!("match.attributes.{k}");
                if let Some(m) = compile(&field, Some(m))? {
                    attributes.push((k, m));
                }
            }
            let suite = evaluator.compile(&spec.name, &spec.assertions).map_err(|e| {
                err(&e.field, {
                    let mut m = e.message.clone();
                    if !e.valid_choices.is_empty() {
                        m.push_str(&format!(" (valid choices: {})", e.valid_choices.join(", ")));
                    }
                    m
                })
            })?;
            rules.push(Rule {
                name: spec.name,
                agent_id,
                root_span,
                attributes,
                sample_rate: spec.sample_rate,
                suite,
                budget: spec.budget.map(Budget::new),
            });
        }
        Ok(RuleSet { rules, version })
    }

    pub fn get(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AssertionOutcome, BoxFuture, RuleError, RuleFailure};

    struct Any;
    struct Noop;
    impl CompiledRule for Noop {
        fn evaluate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<AssertionOutcome>, RuleFailure>> {
            Box::pin(async { Ok(vec![]) })
        }
    }
    impl TraceEvaluator for Any {
        fn compile(&self, _: &str, a: &[Value]) -> Result<Arc<dyn CompiledRule>, RuleError> {
            if a[0]["type"] == "bogus" {
                return Err(RuleError {
                    field: "assertions[0].type".into(),
                    message: "unknown type 'bogus'".into(),
                    valid_choices: vec!["trace".into()],
                });
            }
            Ok(Arc::new(Noop))
        }
    }

    fn parse(y: &str) -> Result<RuleSet, String> {
        RuleSet::parse(y, false, &Any).map_err(|e| e.0)
    }

    #[test]
    fn matching_and_sampling() {
        let set = parse("rules:\n- name: r\n  match: {agent_id: a, root_span: {regex: '^invoke'}, attributes: {service.name: svc}}\n  sample_rate: 0.5\n  assertions: [{type: trace}]\n").unwrap();
        let r = &set.rules[0];
        let mut ctx = MatchContext {
            agent_id: Some("a".into()),
            root_span_name: Some("invoke_agent a".into()),
            attributes: Default::default(),
        };
        assert!(!r.matches(&ctx), "attribute missing");
        ctx.attributes.insert("service.name".into(), "svc".into());
        assert!(r.matches(&ctx));
        ctx.agent_id = Some("b".into());
        assert!(!r.matches(&ctx));
        let hits = (0..10_000).filter(|i| sampled(&format!("{i:032x}"), 0.5)).count();
        assert!((4_500..5_500).contains(&hits), "{hits}");
        assert_eq!(sampled("abc", 0.3), sampled("abc", 0.3));
    }

    #[test]
    fn errors_name_rule_field_and_choices() {
        let e = parse("rules:\n- name: r1\n  smaple_rate: 1\n  assertions: [{type: trace}]\n").unwrap_err();
        assert!(
            e.contains("rule #1 'r1'") && e.contains("smaple_rate") && e.contains("sample_rate"),
            "{e}"
        );
        let e = parse("rules:\n- name: r1\n  assertions: [{type: bogus}]\n").unwrap_err();
        assert!(e.contains("assertions[0].type") && e.contains("valid choices: trace"), "{e}");
        let e = parse("rules:\n- name: r1\n  match: {agent_id: {regex: '('}}\n  assertions: [{type: trace}]\n").unwrap_err();
        assert!(e.contains("match.agent_id") && e.contains("regex"), "{e}");
        let e = parse("rules:\n- name: r1\n  sample_rate: 2\n  assertions: [{type: trace}]\n").unwrap_err();
        assert!(e.contains("sample_rate"), "{e}");
        let e = parse("rules:\n- {name: a, assertions: [{type: t}]}\n- {name: a, assertions: [{type: t}]}\n").unwrap_err();
        assert!(e.contains("unique"), "{e}");
        let e = parse("rulez: []").unwrap_err();
        assert!(e.contains("rulez"), "{e}");
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_its_path() {
        let yaml = "rules:\n  - name: dup-demo\n    assertions:\n      - {type: trace}\n      - type: content\n        spec: {target: output.message, check: contains, value: refund, check: not_contains}\n";
        let e = parse(yaml).unwrap_err();
        assert!(
            e.starts_with("not valid YAML: rules[0].assertions[1].spec: duplicate key 'check': ") && e.contains(" at line 6 column "),
            "{e}"
        );
        let e = parse("rules:\n- name: a\n  name: b\n  assertions: [{type: trace}]\n").unwrap_err();
        assert!(e.contains("rules[0]: duplicate key 'name'"), "{e}");
        let e = parse("rules: []\nrules: []\n").unwrap_err();
        assert!(e.contains("the top level: duplicate key 'rules'"), "{e}");
        // Keys that only share a long prefix are two keys.
        let long = "k".repeat(100);
        assert!(crate::parse_yaml::<serde_json::Value>(&format!("{long}a: 1\n{long}b: 2\n")).is_ok());
        // The same text in two spellings is one key once read.
        let e = parse("rules:\n- name: a\n  assertions: [{type: trace, 1: x, '1': y}]\n").unwrap_err();
        assert!(e.contains("rules[0].assertions[0]: duplicate key '1'"), "{e}");
        let json = r#"{"rules": [{"name": "a", "name": "b", "assertions": [{"type": "trace"}]}]}"#;
        let e = RuleSet::parse(json, true, &Any).map_err(|e| e.0).unwrap_err();
        assert!(e.contains("rules[0]: duplicate key 'name'") && e.contains("line 1"), "{e}");
        // Equal keys in different mappings, anchors and aliases are fine.
        parse("rules:\n- name: a\n  match: &m {agent_id: x}\n  assertions: [{type: trace, name: a}]\n- {name: b, match: *m, assertions: [{type: trace}]}\n").unwrap();
        // A file that does not parse keeps the parser's own message.
        let e = parse("rules: [").unwrap_err();
        assert!(e.contains("not valid YAML") && !e.contains("duplicate"), "{e}");
    }

    #[test]
    fn rule_names_stay_short_enough_for_query_drift() {
        let ok = "r".repeat(MAX_RULE_NAME_BYTES);
        parse(&format!("rules:\n- name: {ok}\n  assertions: [{{type: trace}}]\n")).unwrap();
        let long = "r".repeat(MAX_RULE_NAME_BYTES + 1);
        let e = parse(&format!("rules:\n- name: {long}\n  assertions: [{{type: trace}}]\n")).unwrap_err();
        assert!(
            e.contains(": name: is 129 bytes, more than the 128 allowed") && e.contains("query_drift"),
            "{e}"
        );
        // `<rule>/<assertion_id>` must fit in 256 bytes as a whole.
        let id = "a".repeat(MAX_RESULT_NAME_BYTES - MAX_RULE_NAME_BYTES - 1);
        parse(&format!(
            "rules:\n- name: {ok}\n  assertions: [{{type: trace, assertion_id: {id}}}]\n"
        ))
        .unwrap();
        let e = parse(&format!(
            "rules:\n- name: {ok}\n  assertions: [{{type: trace, assertion_id: {id}x}}]\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("assertions[0].assertion_id: `<rule>/<assertion_id>` is 257 bytes"),
            "{e}"
        );
    }

    #[test]
    fn budget_limits_calls_per_minute_and_usd_per_day() {
        let b = Budget::new(BudgetSpec {
            judge_calls_per_minute: Some(3),
            usd_per_day: Some(1.0),
        });
        let first = b.try_reserve(2, 0.0);
        assert!(first.is_some());
        assert!(b.try_reserve(2, 0.0).is_none());
        assert!(b.try_reserve(1, 0.0).is_some());
        assert!(b.try_reserve(0, 0.0).is_some(), "free suites are never limited");
        let b = Budget::new(BudgetSpec {
            judge_calls_per_minute: None,
            usd_per_day: Some(1.0),
        });
        b.try_reserve(1, 0.5).unwrap().settle(1.5);
        assert!(b.try_reserve(1, 0.5).is_none());
    }

    #[test]
    fn evaluations_in_flight_hold_their_worst_case() {
        let b = Budget::new(BudgetSpec {
            judge_calls_per_minute: None,
            usd_per_day: Some(1.0),
        });
        // Admitted while spent + held < 1.0: 0, 0.3, 0.6, 0.9 held.
        let held: Vec<_> = (0..10).map_while(|_| b.try_reserve(1, 0.3)).collect();
        assert_eq!(held.len(), 4, "the day can pass its budget by one worst case at most");
        let mut held = held.into_iter();
        held.next().unwrap().settle(0.1);
        held.next().unwrap().settle(0.1);
        assert_eq!(b.today_usd().0, 0.2);
        // A failed evaluation may have been billed: counted at its worst.
        drop(held.next());
        assert!((b.today_usd().0 - 0.5).abs() < 1e-9);
        assert!((b.today_usd().1 - 0.3).abs() < 1e-9);
        drop(held);
        assert!(b.try_reserve(1, 0.3).is_some());
    }
}
