//! `step-value`: compares the value at one target with the value at another
//! target, or with a literal. For example, the refund issued equals the
//! order amount looked up:
//!
//! ```json
//! {"left": "steps[?name=='process_refund'].args.amount",
//!  "right": "steps[?name=='lookup_order'].result.amount", "tolerance": 0.01}
//! ```
//!
//! `eq`/`ne` compare any JSON values (numbers by value, within `tolerance`,
//! at any depth); `lt`/`lte`/`gt`/`gte` compare numbers. This module owns the
//! config, the comparison and the verdict.

use attest_plugin_sdk::text::{clip, num, render};
use attest_plugin_sdk::{json, resolve_or_fail, AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json as j, Value};
use std::borrow::Cow;

pub struct StepValue;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub left: Target,
    #[serde(default)]
    pub right: Option<Target>,
    /// `Some(Value::Null)` when the config says `"value": null`.
    #[serde(default, deserialize_with = "present")]
    pub value: Option<Value>,
    #[serde(default)]
    pub op: Op,
    #[serde(default)]
    pub tolerance: f64,
}

/// Tells `"value": null` (compare with null) apart from an absent key.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    #[default]
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Eq => "eq",
            Op::Ne => "ne",
            Op::Lt => "lt",
            Op::Lte => "lte",
            Op::Gt => "gt",
            Op::Gte => "gte",
        }
    }

    /// `less than`, `at most`, … for ordering operators.
    fn words(self) -> &'static str {
        match self {
            Op::Lt => "less than",
            Op::Lte => "at most",
            Op::Gt => "greater than",
            Op::Gte => "at least",
            Op::Eq => "equal to",
            Op::Ne => "different from",
        }
    }

    fn is_order(self) -> bool {
        matches!(self, Op::Lt | Op::Lte | Op::Gt | Op::Gte)
    }

    fn holds(self, l: f64, r: f64) -> bool {
        match self {
            Op::Lt => l < r,
            Op::Lte => l <= r,
            Op::Gt => l > r,
            Op::Gte => l >= r,
            Op::Eq | Op::Ne => unreachable!("eq and ne are compared as JSON"),
        }
    }
}

/// One side of the comparison: its label and its value.
struct Side<'t> {
    /// The target as written, or `None` for a literal.
    label: Option<&'t str>,
    value: Cow<'t, Value>,
}

impl Side<'_> {
    /// `steps[…].amount = 42` for a target, `42` for a literal.
    fn show(&self) -> String {
        match self.label {
            Some(label) => format!("{label} = {}", render(&self.value)),
            None => render(&self.value),
        }
    }
}

/// A value for details: itself when small, else a clipped text.
fn detail(v: &Value) -> Value {
    let text = v.to_string();
    if text.len() <= 1000 {
        v.clone()
    } else {
        Value::String(clip(&text, 1000))
    }
}

impl AssertionPlugin for StepValue {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("step-value", env!("CARGO_PKG_VERSION"))
            .description("Compares the value at one target with another target's value or a literal: deep equality with a numeric tolerance, or numeric order.")
            .config_schema(include_str!("../config.schema.json"))
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let tolerance = config.tolerance;
        if !(tolerance >= 0.0 && tolerance.is_finite()) {
            return Err(PluginError::invalid_config(format!(
                "tolerance must be a finite number >= 0, got {}",
                num(tolerance)
            )));
        }
        if config.op.is_order() && tolerance > 0.0 {
            return Err(PluginError::invalid_config(format!(
                "tolerance applies to eq and ne only, not to {}",
                config.op.name()
            )));
        }
        let left = Side {
            label: Some(config.left.as_str()),
            value: resolve_or_fail!(config.left, trace),
        };
        let right = match (&config.right, &config.value) {
            (Some(t), None) => Side {
                label: Some(t.as_str()),
                value: resolve_or_fail!(t, trace),
            },
            (None, Some(v)) => Side {
                label: None,
                value: Cow::Borrowed(v),
            },
            _ => {
                return Err(PluginError::invalid_config(
                    "give either right (a target) or value (a literal), not both",
                ))
            }
        };
        let (l, r) = (left.value.as_ref(), right.value.as_ref());
        let difference = match (l.as_f64(), r.as_f64()) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        let details = j!({
            "op": config.op,
            "tolerance": tolerance,
            "left": {"target": config.left.as_str(), "value": detail(l)},
            "right": match right.label {
                Some(label) => j!({"target": label, "value": detail(r)}),
                None => j!({"value": detail(r)}),
            },
            "difference": difference,
        });
        let within = if tolerance > 0.0 {
            format!(" (tolerance {})", num(tolerance))
        } else {
            String::new()
        };
        let verdict = match config.op {
            Op::Eq | Op::Ne => {
                let equal = json::equal(l, r, tolerance);
                let gap = match difference {
                    Some(d) if !equal => format!(", a difference of {}", num(d.abs())),
                    _ => String::new(),
                };
                match (config.op, equal) {
                    (Op::Eq, true) => Verdict::pass(format!("{} equals {}{within}.", left.show(), right.show())),
                    (Op::Eq, false) => Verdict::fail(format!("{} does not equal {}{gap}{within}.", left.show(), right.show())),
                    (_, false) => Verdict::pass(format!("{} differs from {}{gap}{within}.", left.show(), right.show())),
                    (_, true) => Verdict::fail(format!("{} equals {}{within}, but they must differ.", left.show(), right.show())),
                }
            }
            op => match (l.as_f64(), r.as_f64()) {
                (Some(a), Some(b)) => {
                    let holds = op.holds(a, b);
                    let not = if holds { "" } else { "not " };
                    Verdict::from_bool(holds, format!("{} is {not}{} {}.", left.show(), op.words(), right.show()))
                }
                _ => {
                    let (side, v) = if l.as_f64().is_none() { (&left, l) } else { (&right, r) };
                    Verdict::fail(format!(
                        "{} is {}, not a number, so {} cannot be checked.",
                        side.label.unwrap_or("value"),
                        json::type_name(v),
                        op.name()
                    ))
                }
            },
        };
        Ok(verdict.with_details(details))
    }
}

attest_plugin_sdk::export_plugin!(StepValue);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::testing::{check_info, evaluate, readme_configs, validate_config};
    use attest_plugin_sdk::Status;
    use serde_json::json;

    const LOOKUP: &str = "steps[?name=='lookup_order'].result.amount";
    const REFUND: &str = "steps[?name=='process_refund'].args.amount";

    fn trace(refund: Value) -> Value {
        json!({"schema_version": 1, "trace_id": "t",
            "steps": [
                {"type": "tool_call", "name": "lookup_order", "args": {"id": "A1"}, "result": {"amount": 42.5, "currency": "EUR", "items": ["a", "b"]}},
                {"type": "tool_call", "name": "process_refund", "args": {"amount": refund, "currency": "EUR", "items": ["a", "b"]}}
            ],
            "output": {"message": "Refunded."},
            "metadata": {"total_tokens": 1350}})
    }

    fn run(refund: Value, config: Value) -> Verdict {
        evaluate::<StepValue>(&trace(refund), &config).unwrap()
    }

    #[test]
    fn readme_examples_are_valid() {
        let configs = readme_configs(include_str!("../README.md"), "step-value");
        assert!(configs.len() >= 2, "README examples: {configs:?}");
        for c in configs {
            validate_config::<StepValue>(&c).unwrap_or_else(|e| panic!("{c}: {e:?}"));
            if let Err(PluginError::InvalidConfig(m)) = evaluate::<StepValue>(&trace(json!(1)), &c) {
                panic!("{c}: {m}");
            }
        }
    }

    #[test]
    fn info_and_schema() {
        check_info::<StepValue>();
        for good in [
            json!({"left": LOOKUP, "right": REFUND}),
            json!({"left": LOOKUP, "value": null, "op": "ne"}),
            json!({"left": LOOKUP, "right": REFUND, "tolerance": 0.01}),
            json!({"left": LOOKUP, "value": 10, "op": "gt", "tolerance": 0}),
        ] {
            validate_config::<StepValue>(&good).unwrap_or_else(|e| panic!("{good}: {e:?}"));
        }
        for bad in [
            json!({"left": LOOKUP}),
            json!({"left": LOOKUP, "right": REFUND, "value": 1}),
            json!({"left": LOOKUP, "value": 1, "tolerance": -1}),
            json!({"left": LOOKUP, "value": 1, "op": "lt", "tolerance": 0.5}),
            json!({"left": LOOKUP, "value": 1, "op": "approx"}),
        ] {
            assert!(validate_config::<StepValue>(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn equal_across_steps() {
        let v = run(json!(42.5), json!({"left": REFUND, "right": LOOKUP}));
        assert!(v.is_pass(), "{}", v.explanation());
        assert_eq!(v.explanation(), format!("{REFUND} = 42.5 equals {LOOKUP} = 42.5."));
        assert_eq!(v.details_value().unwrap()["difference"], 0.0);
    }

    #[test]
    fn tolerance() {
        let v = run(json!(42.49), json!({"left": REFUND, "right": LOOKUP, "tolerance": 0.01}));
        assert!(v.is_pass(), "{}", v.explanation());
        assert!(v.explanation().ends_with("(tolerance 0.01)."));
        let v = run(json!(40), json!({"left": REFUND, "right": LOOKUP, "tolerance": 0.01}));
        assert_eq!(v.status(), Status::Fail);
        assert_eq!(
            v.explanation(),
            format!("{REFUND} = 40 does not equal {LOOKUP} = 42.5, a difference of 2.5 (tolerance 0.01).")
        );
    }

    #[test]
    fn structures_and_literals() {
        assert!(run(
            json!(1),
            json!({"left": "steps[?name=='process_refund'].args.items", "right": "steps[?name=='lookup_order'].result.items"})
        )
        .is_pass());
        let v = run(
            json!(1),
            json!({"left": "steps[?name=='process_refund'].args.currency", "value": "USD"}),
        );
        assert_eq!(
            v.explanation(),
            "steps[?name=='process_refund'].args.currency = 'EUR' does not equal 'USD'."
        );
        assert!(
            run(json!(1), json!({"left": "metadata.total_tokens", "value": 1350.0})).is_pass(),
            "1350 equals 1350.0"
        );
    }

    #[test]
    fn ne() {
        let v = run(json!(40), json!({"left": REFUND, "right": LOOKUP, "op": "ne"}));
        assert!(v.is_pass());
        assert_eq!(
            v.explanation(),
            format!("{REFUND} = 40 differs from {LOOKUP} = 42.5, a difference of 2.5.")
        );
        let v = run(json!(42.5), json!({"left": REFUND, "right": LOOKUP, "op": "ne"}));
        assert_eq!(v.status(), Status::Fail);
        assert!(v.explanation().ends_with("but they must differ."));
    }

    #[test]
    fn ordering() {
        let v = run(json!(40), json!({"left": REFUND, "right": LOOKUP, "op": "lte"}));
        assert_eq!(v.explanation(), format!("{REFUND} = 40 is at most {LOOKUP} = 42.5."));
        assert!(v.is_pass());
        let v = run(json!(50), json!({"left": REFUND, "right": LOOKUP, "op": "lte"}));
        assert_eq!(v.explanation(), format!("{REFUND} = 50 is not at most {LOOKUP} = 42.5."));
        assert_eq!(v.status(), Status::Fail);
        assert!(run(json!(1), json!({"left": "steps.length", "value": 2, "op": "gte"})).is_pass());
        let v = run(json!("lots"), json!({"left": REFUND, "value": 2, "op": "gt"}));
        assert_eq!(
            v.explanation(),
            format!("{REFUND} is a string, not a number, so gt cannot be checked.")
        );
    }

    #[test]
    fn missing_sides_fail_with_reason() {
        let v = run(json!(1), json!({"left": "steps[?name=='ship'].args.amount", "right": LOOKUP}));
        assert_eq!(v.status(), Status::Fail);
        assert_eq!(
            v.explanation(),
            "steps[?name=='ship'].args.amount could not be checked: no step named 'ship' (steps: ['lookup_order', 'process_refund'])."
        );
        let v = run(
            json!(1),
            json!({"left": REFUND, "right": "steps[?name=='lookup_order'].result.total"}),
        );
        assert!(v.explanation().contains("field 'total' not found"), "{}", v.explanation());
    }

    #[test]
    fn config_errors() {
        for (config, expect) in [
            (json!({"left": REFUND}), "give either right"),
            (json!({"left": REFUND, "right": LOOKUP, "value": 1}), "give either right"),
            (
                json!({"left": REFUND, "value": 1, "op": "lt", "tolerance": 1}),
                "tolerance applies to eq and ne only",
            ),
            (
                json!({"left": REFUND, "value": 1, "tolerance": -1}),
                "tolerance must be a finite number >= 0",
            ),
            (json!({"left": "steps.amount", "value": 1}), "unsupported target 'steps.amount'"),
        ] {
            match evaluate::<StepValue>(&trace(json!(1)), &config) {
                Err(PluginError::InvalidConfig(m)) => assert!(m.contains(expect), "{config}: {m}"),
                other => panic!("{config}: {other:?}"),
            }
        }
    }
}
