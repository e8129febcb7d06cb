//! `attest-engine calibrate`: run the configured LLM judge over a file of
//! human-labelled records and report how well it agrees with the humans.
//!
//! Labels are read with the SDK's own rules (`attest_calibration::load_labels`:
//! CSV or JSONL, `input` and `human_label` per record). Each record's `input`
//! is the text judged, as the agent output, with no user input or context.
//! Agreement, Cohen's kappa and ROC-AUC come from
//! `attest_calibration::compute_agreement`, so they equal the SDK's numbers.
//! With `--persist` the result is stored under (rubric, rubric version,
//! prompt hash) in the provider cache's database; later `llm_judge` results
//! with the same key carry it as `judge_metadata.calibration`.
//!
//! Exit codes: 0 on success, 2 when the labels, the rubric, the judge or
//! the cache cannot be used.

use crate::layers::llm_judge::{JudgeCheck, Shown};
use crate::layers::Spec;
use crate::session::Engine;
use crate::text::clip;
use anyhow::{bail, Context, Result};
use attest_calibration::{compute_agreement, load_labels, JudgeAgreement, LabelPair};
use futures_util::StreamExt as _;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// What is calibrated: the judge assertion as a spec would give it.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub rubric: &'a str,
    pub criteria: Option<&'a str>,
    pub threshold: f64,
}

/// What the command reports.
#[derive(Debug, Serialize)]
pub struct Calibration {
    pub rubric_name: String,
    pub rubric_version: String,
    pub prompt_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub criteria: Option<String>,
    pub model: String,
    pub threshold: f64,
    /// Whether both human classes are present: ROC-AUC is undefined (and
    /// reported as 0) otherwise.
    pub roc_auc_defined: bool,
    #[serde(flatten)]
    pub agreement: JudgeAgreement,
    /// Records that also carried a `judge_score` (ignored: the judge is re-run).
    pub prescored: usize,
    pub judge_cost_usd: f64,
    pub persisted: bool,
}

/// Runs the command; returns the process exit code.
pub fn run(engine: &Engine, labels: &Path, judged: Judged<'_>, persist: bool, format: Format, out: &mut impl Write) -> Result<i32> {
    let Judged {
        rubric,
        criteria,
        threshold,
    } = judged;
    // Blank criteria are no criteria, as in a spec.
    let criteria = criteria.filter(|c| !c.trim().is_empty());
    if !(threshold > 0.0 && threshold < 1.0) {
        bail!("--threshold must be strictly between 0 and 1, got {threshold}");
    }
    let records = load_labels(labels).map_err(|e| anyhow::anyhow!("{e}"))?;
    if records.is_empty() {
        bail!("{} holds no labelled records; each needs input and human_label", labels.display());
    }
    let mut spec = serde_json::json!({ "rubric": rubric });
    if let Some(criteria) = criteria {
        spec["criteria"] = criteria.into();
    }
    let check = Spec::new(Some(&spec), "llm_judge")
        .and_then(|s| JudgeCheck::compile(&s))
        // Calibration judges records, not assertions: no bias probes.
        .map(JudgeCheck::without_bias_probes)
        .map_err(|e| {
            let (option, field) = if e.field.ends_with("criteria") {
                ("--criteria", "spec.criteria")
            } else {
                ("--rubric", "spec.rubric")
            };
            // The spec's field names are what an assertion writer sees; here
            // the value came from the option.
            let said = |text: &str| text.replace(field, option);
            anyhow::anyhow!("{option}: {} ({})", said(&e.message), said(&e.detail))
        })?;
    let providers = &engine.providers;
    let judge = providers.judge().map_err(|e| match e {
        crate::providers::ProviderError::Unavailable { message, detail } => anyhow::anyhow!("{message}. {detail}"),
        other => anyhow::anyhow!("{other}"),
    })?;
    if persist && providers.cache.is_none() {
        bail!(
            "--persist needs the provider cache, which is off: enable it (cache = true under [providers], and a writable cache directory)"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let total = records.len();
    let progress_every = (total / 20).max(1);
    let mut pairs = Vec::with_capacity(total);
    let mut cost = 0.0;
    let mut model = String::new();
    let mut stderr = std::io::stderr();
    // Judged as many at once as the provider takes ([`records_at_once`]),
    // in order. Under a budget, calls start only while
    // what is spent and in flight (each priced like the dearest answer so
    // far) stays within it, so a run stops about where one at a time would.
    // Answers from the verdict cache and failed calls say nothing of the
    // price: until a call was paid for, calls go one at a time.
    let pace = Pace::default();
    let budget = engine.config.budget_usd;
    let calls = futures_util::stream::iter(records.iter().enumerate())
        .map(|(i, record)| {
            let (pace, check) = (&pace, &check);
            async move {
                if let Err(spent) = pace.admit(budget).await {
                    bail!(
                        "stopped after {i} of {total} records: the judge calls cost ${spent:.6}, reaching budget_usd ${}",
                        budget.unwrap_or_default()
                    );
                }
                let deadline = tokio::time::Instant::now() + engine.config.eval_timeout;
                let shown = Shown {
                    output: &record.input,
                    input: "",
                    context: "",
                };
                let judged = check.judge_material(providers, judge, &shown, deadline).await;
                pace.finished(judged.as_ref().ok().filter(|j| !j.cached || j.cost > 0.0).map(|j| j.cost));
                let judged = judged.map_err(|e| {
                    let hint = match e {
                        crate::providers::ProviderError::Timeout => "; raise --eval-timeout, or check that the judge provider answers",
                        _ => "; check the judge provider's settings ([judge] in the config, ATTEST_JUDGE_* variables)",
                    };
                    anyhow::anyhow!(
                        "record {} ({}): judge call failed: {}{hint}",
                        i + 1,
                        attest_io::printable(&clip(&record.input, 60)),
                        attest_io::printable(&e.to_string())
                    )
                })?;
                Ok::<_, anyhow::Error>((record, judged))
            }
        })
        .buffered(records_at_once(&engine.config.providers));
    let mut calls = std::pin::pin!(calls);
    let mut done = 0;
    while let Some(next) = runtime.block_on(calls.next()) {
        let (record, judged) = next?;
        done += 1;
        cost += judged.cost;
        model = judged.metadata.model.clone();
        pairs.push(LabelPair {
            human: record.human_label,
            judge: judged.verdict.score,
        });
        if total >= 10 && (done % progress_every == 0 || done == total) {
            let _ = writeln!(stderr, "calibrate: judged {done}/{total} records (${cost:.6} so far)");
        }
    }
    engine.add_cost(cost);
    let agreement = compute_agreement(&pairs, threshold).map_err(|e| anyhow::anyhow!("{e}"))?;
    let roc_auc_defined = pairs.iter().any(|p| p.human >= threshold) && pairs.iter().any(|p| p.human < threshold);
    let (rubric_name, rubric_version) = check.rubric_identity();
    let prompt_hash = attest_calibration::prompt_hash(&check.prompt_text());
    let mut persisted = false;
    if persist {
        let cache = providers.cache.as_ref().expect("checked above");
        persisted = runtime.block_on(cache.put_calibration(rubric_name, rubric_version, &prompt_hash, &agreement));
        if !persisted {
            bail!("could not store the calibration in the provider cache (see the log)");
        }
    }
    let result = Calibration {
        rubric_name: rubric_name.to_owned(),
        rubric_version: rubric_version.to_owned(),
        prompt_hash,
        criteria: criteria.map(str::to_owned),
        model,
        threshold,
        roc_auc_defined,
        agreement,
        prescored: records.iter().filter(|r| r.judge_score.is_some()).count(),
        judge_cost_usd: cost,
        persisted,
    };
    match format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&result)?)?,
        Format::Table => write_table(&result, out)?,
    }
    Ok(0)
}

/// Records judged at once. Each record's deadline runs from when it is
/// started, so no more start than the provider takes at once: its
/// `max_concurrency` calls, divided among each record's `[judge] samples`.
/// A paced provider (`requests_per_second`) starts calls at its own rate,
/// and records are judged one at a time, each deadline starting with it.
fn records_at_once(p: &crate::providers::config::ProvidersConfig) -> usize {
    if p.requests_per_second.is_some() {
        return 1;
    }
    (p.max_concurrency / p.judge_samples.max(1) as usize).max(1)
}

/// Which judge calls may start, under an optional budget. The runtime is
/// single-threaded, so plain cells suffice.
#[derive(Default)]
struct Pace {
    spent: std::cell::Cell<f64>,
    in_flight: std::cell::Cell<usize>,
    /// The dearest priced answer so far; `None` until one came back.
    dearest: std::cell::Cell<Option<f64>>,
    finished: tokio::sync::Notify,
}

impl Pace {
    /// Waits until a call may start; `Err(spent)` once the budget is reached.
    async fn admit(&self, budget: Option<f64>) -> Result<(), f64> {
        loop {
            let spent = self.spent.get();
            let room = match (budget, self.dearest.get()) {
                (None, _) => true,
                (Some(b), _) if spent >= b => return Err(spent),
                // Nothing known of prices yet: one call at a time.
                (Some(_), None) => self.in_flight.get() == 0,
                (Some(b), Some(dearest)) => self.in_flight.get() == 0 || spent + (self.in_flight.get() + 1) as f64 * dearest <= b,
            };
            if room {
                self.in_flight.set(self.in_flight.get() + 1);
                return Ok(());
            }
            self.finished.notified().await;
        }
    }

    /// A call ended: `priced` is what it cost when that says what a call
    /// costs (`None` for a cache hit or a failure).
    fn finished(&self, priced: Option<f64>) {
        self.in_flight.set(self.in_flight.get() - 1);
        if let Some(cost) = priced {
            self.spent.set(self.spent.get() + cost);
            self.dearest.set(Some(self.dearest.get().unwrap_or(0.0).max(cost)));
        }
        self.finished.notify_waiters();
    }
}

fn write_table(c: &Calibration, out: &mut impl Write) -> std::io::Result<()> {
    let a = &c.agreement;
    let auc = if !c.roc_auc_defined {
        "n/a (one human class)".to_owned()
    } else {
        format!("{:.3}", a.roc_auc)
    };
    let rows = [
        ("rubric", format!("{} @ {}", c.rubric_name, c.rubric_version)),
        ("prompt hash", c.prompt_hash.clone()),
        ("criteria", c.criteria.clone().unwrap_or_else(|| "none".into())),
        ("judge model", c.model.clone()),
        ("threshold", format!("{}", c.threshold)),
        ("labels", a.label_count.to_string()),
        ("agreement", format!("{:.3}", a.agreement)),
        ("cohen kappa", format!("{:.3}", a.cohen_kappa)),
        ("roc auc", auc),
        ("judge cost", format!("${:.6}", c.judge_cost_usd)),
        ("persisted", if c.persisted { "yes".into() } else { "no (use --persist)".into() }),
    ];
    for (k, v) in rows {
        writeln!(out, "{k:<12}  {v}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Pace;
    use std::time::Duration;

    /// Whether a call may start within a moment.
    async fn admitted(pace: &Pace, budget: Option<f64>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), pace.admit(budget))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    #[tokio::test]
    async fn under_a_budget_calls_go_one_at_a_time_until_one_was_paid_for() {
        let pace = Pace::default();
        let budget = Some(1.0);
        assert!(admitted(&pace, budget).await);
        // A cache hit and a failure say nothing of the price.
        pace.finished(None);
        assert!(admitted(&pace, budget).await);
        assert!(!admitted(&pace, budget).await, "a second call waits while nothing is priced");
        pace.finished(Some(0.25));
        // Spent 0.25; each call priced 0.25: three may be in flight.
        for _ in 0..3 {
            assert!(admitted(&pace, budget).await);
        }
        assert!(!admitted(&pace, budget).await, "a fourth would pass the budget");
        for _ in 0..3 {
            pace.finished(Some(0.25));
        }
        assert_eq!(pace.admit(budget).await, Err(1.0), "the budget is spent");
        // No budget, no pacing.
        let free = Pace::default();
        assert!(admitted(&free, None).await && admitted(&free, None).await);
    }
}
