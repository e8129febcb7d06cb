//! Reports of a run: the JSON report and audit record (shaped like the
//! reference runtime's, validating against its report and audit schemas), a
//! self-contained HTML page, and JUnit XML (one testsuite per scenario, one
//! testcase per step).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::manifest::Manifest;
use crate::runner::{RunOutcome, ScenarioRecord, StepRecord, StepStatus};
use crate::util::{clip, round3};

/// Longest text from an agent shown per field in the HTML and JUnit reports.
const MAX_SHOWN: usize = 64 * 1024;

fn step_exit_reason(s: &StepRecord) -> &'static str {
    if s.status == StepStatus::Skipped {
        "skipped"
    } else {
        s.exit_reason.as_str()
    }
}

fn step_json(s: &StepRecord) -> Value {
    let mut v = json!({
        "input": s.input,
        "output": s.output,
        "evaluation_context": s.evaluation_context,
        "tool_calls": s.tool_calls,
        "logs": s.logs,
        "checks": s.checks,
        "status": s.status.as_str(),
        "exit_reason": step_exit_reason(s),
        "duration_ms": s.duration_ms,
        "usage": s.usage,
        "error": s.error,
    });
    if let Some(a) = s.agent_status {
        v["agent_status"] = json!(a.as_str());
    }
    v
}

fn scenario_json(s: &ScenarioRecord) -> Value {
    json!({
        "name": s.name,
        "status": s.status.as_str(),
        "exit_reason": s.exit_reason.as_str(),
        "steps": s.steps.iter().map(step_json).collect::<Vec<_>>(),
        "stderr": s.stderr,
    })
}

const USAGE_FIELDS: [&str; 3] = ["input_tokens", "output_tokens", "total_tokens"];

fn merge_usage<'a>(records: impl Iterator<Item = Option<&'a Map<String, Value>>>) -> Value {
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for r in records.flatten() {
        for f in USAGE_FIELDS {
            if let Some(n) = r.get(f).and_then(Value::as_u64) {
                let t = totals.entry(f).or_default();
                *t = t.saturating_add(n);
            }
        }
    }
    if totals.is_empty() {
        return Value::Null;
    }
    if !totals.contains_key("total_tokens") {
        if let (Some(i), Some(o)) = (totals.get("input_tokens"), totals.get("output_tokens")) {
            let t = i.saturating_add(*o);
            totals.insert("total_tokens", t);
        }
    }
    json!(totals)
}

fn latency(durations: &mut [f64]) -> Value {
    if durations.is_empty() {
        return json!({"total_ms": 0.0, "mean_ms": 0.0, "max_ms": 0.0, "p95_ms": 0.0});
    }
    durations.sort_by(f64::total_cmp);
    let n = durations.len();
    // Nearest-rank 95th percentile.
    let rank = (95 * n).div_ceil(100).max(1);
    let total: f64 = durations.iter().sum();
    json!({"total_ms": round3(total), "mean_ms": round3(total / n as f64), "max_ms": round3(durations[n - 1]), "p95_ms": round3(durations[rank - 1])})
}

/// The audit record (`--audit-out`, and `audit` inside the JSON report).
pub fn audit(outcome: &RunOutcome, manifest: &Manifest) -> Value {
    let mut durations = Vec::new();
    let mut usages = Vec::new();
    let (mut planned, mut executed, mut failed, mut skipped, mut cp, mut ct) = (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
    let scenarios: Vec<Value> = outcome
        .scenarios
        .iter()
        .map(|s| {
            let mut sd = 0.0;
            let steps: Vec<Value> = s
                .steps
                .iter()
                .enumerate()
                .map(|(i, st)| {
                    let passed = st.checks.iter().filter(|c| c.passed).count();
                    planned += 1;
                    ct += st.checks.len();
                    cp += passed;
                    sd += st.duration_ms;
                    match st.status {
                        StepStatus::Ok => {
                            executed += 1;
                            durations.push(st.duration_ms);
                            usages.push(st.usage.as_ref());
                        }
                        StepStatus::Skipped => skipped += 1,
                        StepStatus::Failed => failed += 1,
                    }
                    json!({
                        "index": i + 1,
                        "input": st.input,
                        "status": st.status.as_str(),
                        "exit_reason": step_exit_reason(st),
                        "duration_ms": round3(st.duration_ms),
                        "usage": st.usage,
                        "tool_calls": st.tool_calls.len(),
                        "checks_passed": passed,
                        "checks_total": st.checks.len(),
                        "error": st.error,
                    })
                })
                .collect();
            json!({"name": s.name, "status": s.status.as_str(), "exit_reason": s.exit_reason.as_str(), "duration_ms": round3(sd), "steps": steps})
        })
        .collect();
    let agent = match &outcome.agent {
        Some(a) => json!({"name": a.name, "protocol_version": a.protocol_version, "capabilities": a.capabilities}),
        None => json!({}),
    };
    json!({
        "audit_version": "1",
        "run_id": outcome.run_id,
        "started_at": outcome.started_at,
        "finished_at": outcome.finished_at,
        "duration_ms": round3(outcome.duration_ms),
        "exit_reason": outcome.exit_reason.as_str(),
        "runtime": {"name": "attest-engine ecp", "version": env!("CARGO_PKG_VERSION"), "platform": std::env::consts::OS},
        "manifest": {"path": manifest.path.display().to_string(), "name": manifest.name, "digest": manifest.digest, "target": manifest.target},
        "agent": agent,
        "limits": {"rpc_timeout_s": outcome.rpc_timeout_s, "max_duration_s": outcome.max_duration_s},
        "totals": {
            "scenarios": outcome.scenarios.len(),
            "steps_planned": planned,
            "steps_executed": executed,
            "steps_failed": failed,
            "steps_skipped": skipped,
            "checks_passed": cp,
            "checks_total": ct,
            "checks_failed": ct - cp,
        },
        "latency": latency(&mut durations),
        "usage": merge_usage(usages.into_iter()),
        "scenarios": scenarios,
    })
}

/// The JSON report (`--json`, `--json-out`).
pub fn json_report(outcome: &RunOutcome, manifest: &Manifest) -> Value {
    let (passed, total) = outcome.tally();
    json!({
        "manifest": manifest.path.display().to_string(),
        "passed": passed,
        "total": total,
        "failed": total - passed,
        "exit_reason": outcome.exit_reason.as_str(),
        "scenarios": outcome.scenarios.iter().map(scenario_json).collect::<Vec<_>>(),
        "audit": audit(outcome, manifest),
    })
}

fn pre(text: &str) -> String {
    format!("<pre>{}</pre>", esc(&crate::util::printable(&clip(text, MAX_SHOWN))))
}

/// Text from a manifest or an agent as HTML: control characters escaped
/// (`\u{1b}`), bidi controls named, the noncharacters HTML refuses
/// replaced, and markup escaped.
fn esc(s: &str) -> String {
    let shown = attest_trace::text::neutralise_bidi(&crate::util::printable(s)).into_owned();
    html_escape::encode_text(&attest_io::xml_text(&shown)).into_owned()
}

/// A self-contained HTML page: inline CSS, no scripts, no network.
pub fn html(outcome: &RunOutcome, manifest: &Manifest) -> String {
    let (passed, total) = outcome.tally();
    let mut h = String::with_capacity(16 * 1024);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ECP report: ");
    h.push_str(&esc(&manifest.name));
    h.push_str(
        "</title><style>body{font-family:system-ui,sans-serif;max-width:70rem;margin:0 auto;padding:1rem;background:#f6f6f8;color:#222}\
         .scenario{background:#fff;border-radius:6px;padding:1rem;margin:1rem 0;box-shadow:0 1px 3px #0002}\
         .step{border-top:1px solid #ddd;padding-top:.5rem;margin-top:.5rem}pre{background:#f0f0f0;padding:.5rem;white-space:pre-wrap;overflow-wrap:anywhere;max-height:40rem;overflow:auto}\
         .pass{color:#176f2c;font-weight:bold}.fail{color:#b3261e;font-weight:bold}.muted{color:#666;font-size:.9em}\
         h1,h2,h3,p,code,summary{overflow-wrap:anywhere}\
         table{border-collapse:collapse;width:100%;table-layout:fixed}td,th{padding:.2rem .6rem;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
         th:nth-child(1),th:nth-child(4){width:5rem}th:nth-child(2),th:nth-child(3){width:9rem}</style></head><body>\n",
    );
    h.push_str(&format!(
        "<h1>ECP report: {}</h1><p class=\"muted\">Target <code>{}</code> · run {} · started {} · {:.0} ms · exit reason <b>{}</b></p>\n",
        esc(&manifest.name),
        esc(&manifest.target),
        esc(&outcome.run_id),
        esc(&outcome.started_at),
        outcome.duration_ms,
        outcome.exit_reason.as_str()
    ));
    h.push_str(&format!(
        "<p><span class=\"{}\">{passed}/{total} checks passed</span></p>\n",
        if passed == total { "pass" } else { "fail" }
    ));
    // Scenarios with a failed check first, where a reader looks; each group
    // keeps the manifest's order.
    let failed = |s: &&crate::runner::ScenarioRecord| s.steps.iter().flat_map(|st| &st.checks).any(|c| !c.passed);
    let ordered = outcome
        .scenarios
        .iter()
        .filter(failed)
        .chain(outcome.scenarios.iter().filter(|s| !failed(s)));
    for s in ordered {
        let sp = s.steps.iter().flat_map(|st| &st.checks).filter(|c| c.passed).count();
        let stot: usize = s.steps.iter().map(|st| st.checks.len()).sum();
        h.push_str(&format!(
            "<section class=\"scenario\"><h2>{}</h2><p class=\"muted\">status {} · exit reason {} · {sp}/{stot} checks · {:.0} ms</p>\n",
            esc(&s.name),
            s.status.as_str(),
            s.exit_reason.as_str(),
            s.wall_ms
        ));
        for (i, st) in s.steps.iter().enumerate() {
            h.push_str(&format!(
                "<div class=\"step\"><h3>Step {} <span class=\"muted\">{} · {:.1} ms{}</span></h3>",
                i + 1,
                st.status.as_str(),
                st.duration_ms,
                st.agent_status.map(|a| format!(" · agent {}", a.as_str())).unwrap_or_default()
            ));
            h.push_str("<b>Input</b>");
            h.push_str(&pre(&st.input));
            if let Some(o) = &st.output {
                h.push_str("<b>Output</b>");
                h.push_str(&pre(o));
            }
            if let Some(ec) = &st.evaluation_context {
                h.push_str("<b>Evaluation context</b>");
                h.push_str(&pre(ec));
            }
            if !st.tool_calls.is_empty() {
                h.push_str("<b>Tool calls</b>");
                h.push_str(&pre(&serde_json::to_string_pretty(&st.tool_calls).unwrap_or_default()));
            }
            if let Some(e) = &st.error {
                h.push_str("<b>Error</b>");
                h.push_str(&pre(e));
            }
            h.push_str("<table><tr><th>Verdict</th><th>Check</th><th>Field</th><th>Score</th><th>Reason</th></tr>");
            for c in &st.checks {
                h.push_str(&format!(
                    "<tr><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    if c.passed { "pass" } else { "fail" },
                    if c.passed { "PASS" } else { "FAIL" },
                    esc(&c.kind),
                    esc(&c.field),
                    c.score,
                    esc(&clip(&c.reasoning, MAX_SHOWN))
                ));
            }
            h.push_str("</table></div>\n");
        }
        if !s.stderr.trim().is_empty() {
            h.push_str("<details><summary>Agent stderr</summary>");
            h.push_str(&pre(&s.stderr));
            h.push_str("</details>");
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body></html>\n");
    h
}

/// JUnit XML: one testsuite per scenario, one testcase per step.
pub fn junit(outcome: &RunOutcome, manifest: &Manifest) -> anyhow::Result<String> {
    use attest_junit::{Case, Counts, Outcome, Suite};
    // A test case is a step, at every level: a step fails when any of its
    // checks does, and is an error when the agent could not answer it.
    let count = |s: &crate::runner::ScenarioRecord, f: &dyn Fn(&crate::runner::StepRecord) -> bool| {
        s.steps.iter().filter(|st| f(st)).count() as u64
    };
    let mut totals = Counts::default();
    let mut suites = Vec::with_capacity(outcome.scenarios.len());
    for s in &outcome.scenarios {
        let counts = Counts {
            tests: s.steps.len() as u64,
            failures: count(s, &|st| st.status == StepStatus::Ok && st.checks.iter().any(|c| !c.passed)),
            errors: count(s, &|st| st.status == StepStatus::Failed),
            skipped: count(s, &|st| st.status == StepStatus::Skipped),
        };
        totals.tests += counts.tests;
        totals.failures += counts.failures;
        totals.errors += counts.errors;
        totals.skipped += counts.skipped;
        let cases = s
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let failed: Vec<String> = st
                    .checks
                    .iter()
                    .filter(|c| !c.passed)
                    .map(|c| format!("{} on {}: {}", c.kind, c.field, c.reasoning))
                    .collect();
                let outcome = match st.status {
                    StepStatus::Skipped => Outcome::Skipped {
                        message: clip(st.error.as_deref().unwrap_or("skipped"), 1000),
                    },
                    StepStatus::Failed => Outcome::Error {
                        message: clip(st.error.as_deref().unwrap_or(""), 1000),
                        kind: st.exit_reason.as_str().to_owned(),
                        text: None,
                    },
                    StepStatus::Ok if !failed.is_empty() => Outcome::Failure {
                        message: format!("{} of {} check(s) failed", failed.len(), st.checks.len()),
                        kind: "check_failed".into(),
                        text: clip(&failed.join("\n"), MAX_SHOWN),
                    },
                    StepStatus::Ok => Outcome::Passed,
                };
                Case {
                    name: format!("step {}: {}", i + 1, clip(&st.input, 120)),
                    classname: format!("{}.{}", manifest.name, s.name),
                    seconds: st.duration_ms / 1000.0,
                    outcome,
                    system_out: st.output.as_deref().map(|o| clip(o, MAX_SHOWN)),
                }
            })
            .collect();
        suites.push(Suite {
            name: s.name.clone(),
            counts,
            seconds: s.wall_ms / 1000.0,
            cases,
            system_err: (!s.stderr.trim().is_empty()).then(|| s.stderr.clone()),
            ..Suite::default()
        });
    }
    Ok(attest_junit::Report {
        name: manifest.name.clone(),
        counts: totals,
        seconds: outcome.duration_ms / 1000.0,
        suites,
    }
    .to_xml())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ExitReason;

    #[test]
    fn usage_sums_saturate() {
        let usage = merge_usage(
            [json!({"input_tokens": u64::MAX}), json!({"input_tokens": 5, "output_tokens": 1})]
                .iter()
                .map(|v| v.as_object()),
        );
        assert_eq!(usage["input_tokens"], u64::MAX);
        assert_eq!(usage["total_tokens"], u64::MAX);
    }

    #[test]
    fn latency_uses_nearest_rank() {
        let mut d: Vec<f64> = (1..=20).map(f64::from).collect();
        let l = latency(&mut d);
        assert_eq!(l["p95_ms"], 19.0);
        assert_eq!(l["max_ms"], 20.0);
        assert_eq!(latency(&mut [])["mean_ms"], 0.0);
    }

    #[test]
    fn usage_is_summed() {
        let a = json!({"input_tokens": 2, "output_tokens": 3}).as_object().unwrap().clone();
        let b = json!({"input_tokens": 1}).as_object().unwrap().clone();
        assert_eq!(
            merge_usage([Some(&a), None, Some(&b)].into_iter()),
            json!({"input_tokens": 3, "output_tokens": 3, "total_tokens": 6})
        );
        assert_eq!(merge_usage([None].into_iter()), Value::Null);
    }

    fn step(status: StepStatus, passed: &[bool], error: Option<&str>) -> crate::runner::StepRecord {
        crate::runner::StepRecord {
            input: "say \u{1b}[1mhi".into(),
            output: Some("\u{1b}[31mred\u{1b}[0m".into()),
            evaluation_context: None,
            tool_calls: Vec::new(),
            logs: None,
            checks: passed
                .iter()
                .map(|&passed| crate::host::CheckResult {
                    kind: "text_match".into(),
                    field: "public_output".into(),
                    passed,
                    score: f64::from(u8::from(passed)),
                    reasoning: "because \u{7}".into(),
                    status: None,
                })
                .collect(),
            status,
            exit_reason: if status == StepStatus::Failed {
                ExitReason::AgentError
            } else {
                ExitReason::Ok
            },
            duration_ms: 1.0,
            usage: None,
            error: error.map(str::to_owned),
            agent_status: None,
        }
    }

    #[test]
    fn junit_and_html_count_steps_at_every_level_and_carry_no_control_characters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        std::fs::write(
            &path,
            "manifest_version: v1\nname: n\ntarget: t\nscenarios:\n  - name: S\n    steps:\n      - input: hi\n",
        )
        .unwrap();
        let manifest = crate::manifest::load(&path).unwrap();
        let scenario = |name: &str, steps| crate::runner::ScenarioRecord {
            name: name.into(),
            status: StepStatus::Ok,
            exit_reason: ExitReason::Ok,
            steps,
            stderr: String::new(),
            wall_ms: 1.0,
        };
        let mut outcome = crate::runner::RunOutcome {
            run_id: "r".into(),
            scenarios: vec![
                scenario(
                    "first",
                    vec![
                        step(StepStatus::Ok, &[true, false, false], None),
                        step(StepStatus::Failed, &[], Some("\u{1b}[31mmodel failed\u{1b}[0m")),
                    ],
                ),
                scenario(
                    "sec\u{1b}ond",
                    vec![step(StepStatus::Ok, &[true], None), step(StepStatus::Skipped, &[], None)],
                ),
            ],
            exit_reason: ExitReason::AgentError,
            agent: None,
            started_at: String::new(),
            finished_at: String::new(),
            duration_ms: 1.0,
            rpc_timeout_s: 1.0,
            max_duration_s: None,
        };
        let xml = junit(&outcome, &manifest).unwrap();
        assert!(!xml.chars().any(|c| c.is_control() && !"\n\r\t".contains(c)), "{xml}");
        assert!(xml.contains("message=\"\u{FFFD}[31mmodel failed\u{FFFD}[0m\""), "{xml}");
        assert!(
            xml.contains(r#"<testsuites name="n" tests="4" failures="1" errors="1" skipped="1""#),
            "{xml}"
        );
        assert!(
            xml.contains(r#"<testsuite name="first" tests="2" failures="1" errors="1" skipped="0""#),
            "{xml}"
        );
        assert!(
            xml.contains("<testsuite name=\"sec\u{FFFD}ond\" tests=\"2\" failures=\"0\" errors=\"0\" skipped=\"1\""),
            "{xml}"
        );
        // The HTML report escapes the same text everywhere: headings and
        // reasons as well as the quoted output.
        let page = html(&outcome, &manifest);
        assert!(!page.chars().any(|c| c.is_control() && !"\n\r\t".contains(c)), "{page}");
        assert!(page.contains("<h2>sec\\u{1b}ond</h2>"), "{page}");
        assert!(page.contains("<td>because \\u{7}</td>"), "{page}");
        // Failures first, whatever the manifest's order.
        outcome.scenarios.reverse();
        let page = html(&outcome, &manifest);
        let (failing, passing) = (page.find("<h2>first</h2>").unwrap(), page.find("<h2>sec").unwrap());
        assert!(failing < passing, "the failing scenario is listed first");
    }
}
