//! Layer 2: numeric comparisons on any numeric trace path.
//!
//! `field` uses the shared target grammar, so every metadata key,
//! `steps.length`, `steps[?type=='…'].length`, and paths such as
//! `output.structured.confidence` all work. `between` is inclusive. `eq`
//! tolerates a relative error of 1e-9 so that `0.1 + 0.2` equals `0.3`.

use super::{Evidence, Spec, SpecError, Verdict};
use crate::target::{Target, GRAMMAR_HINT};
use crate::text::clip;
use crate::text::num;
use crate::trace::Trace;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Comparison {
    Lt(f64),
    Lte(f64),
    Gt(f64),
    Gte(f64),
    Eq(f64),
    Between { min: f64, max: f64 },
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Lt,
    Lte,
    Gt,
    Gte,
    Eq,
    Between,
}

const OPERATORS: &[(&str, Op)] = &[
    ("lt", Op::Lt),
    ("lte", Op::Lte),
    ("gt", Op::Gt),
    ("gte", Op::Gte),
    ("eq", Op::Eq),
    ("between", Op::Between),
];

/// The operators that compare against a single `value` (all but `between`).
const THRESHOLD_OPERATORS: &[(&str, Op)] = &[("lt", Op::Lt), ("lte", Op::Lte), ("gt", Op::Gt), ("gte", Op::Gte), ("eq", Op::Eq)];

impl Comparison {
    /// Reads `operator` (lt, lte, gt, gte, eq) and a required numeric `value`,
    /// for checks where a range makes no sense (layer 7 aggregates).
    pub fn compile_threshold(spec: &Spec<'_>, why: &str) -> Result<Comparison, SpecError> {
        let op = spec.choice("operator", THRESHOLD_OPERATORS)?;
        Ok(Comparison::with_value(op, spec.f64("value", why)?))
    }

    /// A single-threshold comparison; `op` is never `Between`.
    fn with_value(op: Op, v: f64) -> Comparison {
        match op {
            Op::Lt => Comparison::Lt(v),
            Op::Lte => Comparison::Lte(v),
            Op::Gt => Comparison::Gt(v),
            Op::Gte => Comparison::Gte(v),
            Op::Eq => Comparison::Eq(v),
            // Both callers read `between` with its two bounds before getting here.
            Op::Between => unreachable!("between takes min and max, not a value"),
        }
    }

    pub fn holds(self, x: f64) -> bool {
        match self {
            Comparison::Lt(v) => x < v,
            Comparison::Lte(v) => x <= v,
            Comparison::Gt(v) => x > v,
            Comparison::Gte(v) => x >= v,
            Comparison::Eq(v) => (x - v).abs() <= 1e-9 * x.abs().max(v.abs()).max(1.0),
            Comparison::Between { min, max } => min <= x && x <= max,
        }
    }

    /// `lte 0.01`, `between [1, 2]`.
    pub fn describe(self) -> String {
        match self {
            Comparison::Lt(v) => format!("lt {}", num(v)),
            Comparison::Lte(v) => format!("lte {}", num(v)),
            Comparison::Gt(v) => format!("gt {}", num(v)),
            Comparison::Gte(v) => format!("gte {}", num(v)),
            Comparison::Eq(v) => format!("eq {}", num(v)),
            Comparison::Between { min, max } => format!("between [{}, {}]", num(min), num(max)),
        }
    }
}

#[derive(Debug)]
pub struct ConstraintCheck {
    field: Target,
    cmp: Comparison,
}

impl ConstraintCheck {
    pub fn compile(spec: &Spec<'_>) -> Result<ConstraintCheck, SpecError> {
        let field_text = spec.str("field")?;
        let field = Target::parse(field_text).map_err(|e| {
            SpecError::new(
                "spec.field",
                e.message.replacen("unsupported target", "unsupported field", 1),
                format!("Use metadata.<key> (e.g. metadata.cost_usd, metadata.total_tokens, metadata.latency_ms), steps.length, steps[?type=='tool_call'].length, or any numeric path. {GRAMMAR_HINT}"),
            )
        })?;
        let cmp = match spec.choice("operator", OPERATORS)? {
            Op::Between => {
                let min = spec.f64("min", "operator 'between' requires 'min' and 'max'")?;
                let max = spec.f64("max", "operator 'between' requires 'min' and 'max'")?;
                if min > max {
                    return Err(SpecError::new(
                        "spec.min",
                        format!("between bounds are reversed: min {} > max {}", num(min), num(max)),
                        "Set spec.min to the lower bound and spec.max to the upper bound (both inclusive).",
                    ));
                }
                Comparison::Between { min, max }
            }
            op => {
                let why = "every operator but 'between' compares against 'value'";
                Comparison::with_value(op, spec.f64("value", why)?)
            }
        };
        Ok(ConstraintCheck { field, cmp })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        let f = self.field.as_str();
        let expected = || format!("{f} {}", self.cmp.describe());
        let actual = match self.field.resolve(trace) {
            Err(missing) => {
                return Verdict::fail(format!("{f} is not set: {}.", missing.0)).with(Evidence::new(expected(), "not set").at(f).hint(
                    format!("Make the agent record {f} in its trace, or point spec.field at a field it sets."),
                ))
            }
            Ok(v) => match v.as_ref() {
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                other => {
                    let kind = super::spec::type_name(other);
                    return Verdict::fail(format!(
                        "{f} is {kind}, not a number; constraint {} cannot be checked.",
                        self.cmp.describe()
                    ))
                    .with(
                        Evidence::new(expected(), format!("{f} = {} ({kind})", clip(&other.to_string(), 120)))
                            .at(f)
                            .hint(format!("Record {f} as a number, or constrain a numeric field instead.")),
                    );
                }
            },
        };
        let ok = self.cmp.holds(actual);
        let verdict = if ok { "satisfied" } else { "not satisfied" };
        Verdict::from_bool(ok, format!("{f} = {}, constraint {} {verdict}.", num(actual), self.cmp.describe())).on_failure(|| {
            Evidence::new(expected(), format!("{f} = {}", num(actual)))
                .at(f)
                .hint(self.hint(f, actual))
        })
    }

    /// What to change when `actual` misses the bound.
    fn hint(&self, f: &str, actual: f64) -> String {
        let bound = match self.cmp {
            Comparison::Lt(v) | Comparison::Lte(v) | Comparison::Gt(v) | Comparison::Gte(v) | Comparison::Eq(v) => v,
            Comparison::Between { min, max } => {
                if actual < min {
                    min
                } else {
                    max
                }
            }
        };
        let direction = if actual > bound { "down" } else { "up" };
        format!(
            "{f} is {} and must be {}: bring it {direction} (by {}), or revise the bound if {} is acceptable.",
            num(actual),
            self.cmp.describe(),
            // The gap is a difference of floats: shown to 6 decimals, not as 0.0017000000000000001.
            num(((actual - bound).abs() * 1e6).round() / 1e6),
            num(actual)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_trace, Limits};
    use serde_json::json;
    use serde_json::value::RawValue;

    fn trace() -> Trace {
        let v = json!({"schema_version": 1, "trace_id": "t",
            "steps": [{"type": "llm_call", "name": "a"}, {"type": "tool_call", "name": "b"}, {"type": "tool_call", "name": "c"}],
            "output": {"message": "m", "structured": {"confidence": 0.3}},
            "metadata": {"cost_usd": 0.0067, "total_tokens": 1350, "model": "gpt"}});
        parse_trace(&RawValue::from_string(v.to_string()).unwrap(), &Limits::default())
            .unwrap()
            .trace
    }

    fn run(spec: Value) -> Verdict {
        ConstraintCheck::compile(&Spec::new(Some(&spec), "constraint").unwrap())
            .unwrap()
            .evaluate(&trace())
    }

    fn err(spec: Value) -> SpecError {
        ConstraintCheck::compile(&Spec::new(Some(&spec), "constraint").unwrap()).unwrap_err()
    }

    #[test]
    fn operators() {
        let cases = [
            ("lte", 0.01, true),
            ("lt", 0.0067, false),
            ("lte", 0.0067, true),
            ("gt", 0.0067, false),
            ("gte", 0.0067, true),
            ("eq", 0.0067, true),
            ("eq", 0.0068, false),
        ];
        for (op, value, expect) in cases {
            let v = run(json!({"field": "metadata.cost_usd", "operator": op, "value": value}));
            assert_eq!(v.passed, expect, "{op} {value}: {}", v.explanation);
        }
        assert_eq!(
            run(json!({"field": "metadata.cost_usd", "operator": "lte", "value": 0.01})).explanation,
            "metadata.cost_usd = 0.0067, constraint lte 0.01 satisfied."
        );
    }

    #[test]
    fn between_is_inclusive() {
        assert!(run(json!({"field": "metadata.total_tokens", "operator": "between", "min": 1350, "max": 1350})).passed);
        assert!(!run(json!({"field": "metadata.total_tokens", "operator": "between", "min": 1351, "max": 2000})).passed);
    }

    #[test]
    fn counts_and_paths() {
        assert!(run(json!({"field": "steps.length", "operator": "eq", "value": 3})).passed);
        assert!(run(json!({"field": "steps[?type=='tool_call'].length", "operator": "eq", "value": 2})).passed);
        assert!(run(json!({"field": "output.structured.confidence", "operator": "lt", "value": 0.5})).passed);
        assert!(run(json!({"field": "metadata.total_tokens", "operator": "eq", "value": 1350.0})).passed);
    }

    #[test]
    fn missing_or_non_numeric_values_fail_with_reason() {
        let v = run(json!({"field": "metadata.latency_ms", "operator": "lte", "value": 5}));
        assert!(!v.passed);
        assert!(v.explanation.starts_with("metadata.latency_ms is not set"), "{}", v.explanation);
        let v = run(json!({"field": "metadata.model", "operator": "lte", "value": 5}));
        assert!(v.explanation.contains("not a number"), "{}", v.explanation);
    }

    #[test]
    fn spec_errors() {
        assert!(err(json!({"field": "metadata.cost_usd", "operator": "approx", "value": 1}))
            .detail
            .contains("lt, lte, gt, gte, eq, between"));
        assert_eq!(err(json!({"field": "metadata.cost_usd", "operator": "lte"})).field, "spec.value");
        assert_eq!(
            err(json!({"field": "metadata.cost_usd", "operator": "between", "min": 1})).field,
            "spec.max"
        );
        assert_eq!(
            err(json!({"field": "metadata.cost_usd", "operator": "between", "min": 2, "max": 1})).field,
            "spec.min"
        );
        assert_eq!(err(json!({"field": "cost", "operator": "lt", "value": 1})).field, "spec.field");
        assert_eq!(
            err(json!({"field": "metadata.cost_usd", "operator": "lt", "value": "1"})).field,
            "spec.value"
        );
    }
}
