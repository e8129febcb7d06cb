//! Results the viewer shows from files rather than the history: `collect`'s
//! `--results-jsonl` lines, session JSON reports (`--report json=…`) and
//! ECP JSON reports (`ecp run --json-out`).
//!
//! Each file becomes the history's own rows, at the times the file gives,
//! under a run of its own, and is written into a private copy of the
//! history (or a new store) that the viewer then reads like any other. The
//! names match what the engine records live (`rule/assertion` for collect,
//! `ecp/scenario/stepN/i-type` for ECP), so a result read from a file sits
//! beside the same check's recorded history.

use anyhow::{bail, Context as _};
use attest_history::{Detail, History, HistoryConfig, Kept, Location, Row, Rows, Run, RunKind, SpecDigest};
use attest_trace::Status;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest file read, as for every other results file the engine reads.
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// Results read from all files together.
pub const MAX_RESULTS: usize = 1_000_000;

/// What was read, for the line the viewer prints.
pub struct Imported {
    pub results: usize,
    pub files: Vec<String>,
}

/// Copies `history` (a file, or the newest [`MAX_RESULTS`] results of a
/// PostgreSQL store) into `into` and adds the results of `files`.
pub fn import(history: Option<&Location>, files: &[PathBuf], into: &Path) -> anyhow::Result<Imported> {
    let mut described = Vec::new();
    let mut from_store = Vec::new();
    let mut total = 0;
    match history {
        Some(Location::File(h)) if h.is_file() => {
            attest_history::copy_file_store(h, into).with_context(|| format!("cannot read the history {}", h.display()))?
        }
        Some(Location::File(_)) | None => {}
        Some(Location::Postgres(url)) => {
            let (rows, held) = attest_history::newest_postgres_rows(url, MAX_RESULTS as u64)?;
            total = rows.iter().map(|b| b.rows.len()).sum();
            described.push(if held as usize > total {
                format!("the newest {total} of {held} results of {}", Location::Postgres(url.clone()))
            } else {
                format!("{total} results of {}", Location::Postgres(url.clone()))
            });
            from_store = rows;
        }
    }
    let store = History::open(&HistoryConfig {
        location: Location::File(into.to_owned()),
        max_rows: u64::MAX,
        max_age: Duration::from_secs(100 * 365 * 24 * 3600),
        max_bytes: u64::MAX,
        wait_when_behind: true,
        kept_evaluations: attest_history::DEFAULT_KEPT_EVALUATIONS,
        kept_bytes: attest_history::DEFAULT_KEPT_BYTES,
    })?;
    for chunk in from_store.chunks(512) {
        store.record_committed(chunk.to_vec(), Instant::now() + Duration::from_secs(60))?;
    }
    for file in files {
        let (batches, kind) = read(file, MAX_RESULTS - total)?;
        let n: usize = batches.iter().map(|b| b.rows.len()).sum();
        total += n;
        described.push(format!("{} ({kind}, {n} results)", file.display()));
        for chunk in batches.chunks(512) {
            store.record_committed(chunk.to_vec(), Instant::now() + Duration::from_secs(60))?;
        }
    }
    Ok(Imported {
        results: total,
        files: described,
    })
}

/// The batches `file` holds and what kind of file it is; at most `room`
/// results.
fn read(file: &Path, room: usize) -> anyhow::Result<(Vec<Rows>, &'static str)> {
    let shown = file.display();
    let bytes = attest_io::read_capped(file, MAX_FILE_BYTES).map_err(|e| anyhow::anyhow!("--results {shown}: {e}"))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| anyhow::anyhow!("--results {shown}: not UTF-8 text ({e})"))?;
    let mut out = Imports {
        batches: Vec::new(),
        room,
        file,
    };
    // A report is one JSON object; a results file is one object per line.
    let whole = serde_json::from_str::<Value>(text).ok().filter(Value::is_object);
    let kind = match whole {
        Some(v) if v.get("scenarios").is_some_and(Value::is_array) => {
            ecp_report(&v, &mut out)?;
            "ECP report"
        }
        Some(v) if v.get("traces").is_some_and(Value::is_array) => {
            session_report(&v, &mut out)?;
            "session report"
        }
        // One line of results reads as one object too.
        _ => {
            results_jsonl(text, &mut out)?;
            "collect results"
        }
    };
    Ok((out.batches, kind))
}

struct Imports<'a> {
    batches: Vec<Rows>,
    room: usize,
    file: &'a Path,
}

impl Imports<'_> {
    fn push(&mut self, rows: Rows) -> anyhow::Result<()> {
        if rows.rows.len() > self.room {
            bail!(
                "--results {}: more than {MAX_RESULTS} results in all; view fewer files at once",
                self.file.display()
            );
        }
        self.room -= rows.rows.len();
        self.batches.push(rows);
        Ok(())
    }

    fn run(&self, key: String, kind: RunKind, label: String) -> Arc<Run> {
        Arc::new(Run { key, kind, label })
    }
}

/// A batch of results of one trace, keeping the explanations of a batch
/// with a non-passing result as the engine does live.
fn batch(trace_id: String, agent_id: Option<String>, rows: Vec<(Row, Detail)>, run: &Arc<Run>, at: Option<i64>) -> Rows {
    let kept = rows.iter().any(|(r, _)| r.status != Status::Pass).then(|| {
        Box::new(Kept {
            trace: None,
            details: rows.iter().map(|(_, d)| d.clone()).collect(),
        })
    });
    Rows {
        trace_id,
        agent_id,
        rows: rows.into_iter().map(|(r, _)| r).collect(),
        keyed: false,
        run: Some(run.clone()),
        kept,
        recorded_at_ms: at,
    }
}

fn row(name: String, kind: &str, status: Status, score: f64, cost: f64) -> Row {
    Row {
        spec: SpecDigest::submitted(&name),
        assertion_id: name,
        assertion_type: attest_history::assertion_type_name(kind),
        status,
        score: if score.is_finite() { score.clamp(0.0, 1.0) } else { 0.0 },
        cost: if cost.is_finite() { cost.max(0.0) } else { 0.0 },
    }
}

/// Unix ms of an RFC 3339 time.
fn time_ms(text: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as i64)
}

/// One line of `collect --results-jsonl`.
#[derive(Deserialize)]
struct ResultLine {
    trace_id: String,
    rule: String,
    assertion_id: String,
    #[serde(rename = "type")]
    kind: String,
    status: Status,
    score: f64,
    #[serde(default)]
    explanation: String,
    #[serde(default)]
    cost_usd: f64,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    evaluated_at: Option<String>,
}

/// The results of one trace, read so far.
struct Evaluation {
    trace_id: String,
    agent_id: Option<String>,
    at: Option<i64>,
    rows: Vec<(Row, Detail)>,
}

fn results_jsonl(text: &str, out: &mut Imports) -> anyhow::Result<()> {
    let file = out.file.display().to_string();
    let run = out.run(format!("results {file}"), RunKind::Collect, format!("results {file}"));
    // Consecutive lines of one trace are one evaluation, as collect writes them.
    let mut current: Option<Evaluation> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: ResultLine = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "--results {file}: line {}: not a result line of collect --results-jsonl ({e}); each line needs trace_id, rule, assertion_id, type, status and score; a session report is one object with \"traces\", an ECP report one with \"scenarios\"",
                n + 1
            )
        })?;
        let name = format!("{}/{}", r.rule, r.assertion_id);
        let entry = (
            row(name, &r.kind, r.status, r.score, r.cost_usd),
            Detail {
                explanation: r.explanation,
                ..Detail::default()
            },
        );
        match &mut current {
            Some(e) if e.trace_id == r.trace_id && e.agent_id == r.agent_id => e.rows.push(entry),
            _ => {
                if let Some(e) = current.take() {
                    out.push(batch(e.trace_id, e.agent_id, e.rows, &run, e.at))?;
                }
                current = Some(Evaluation {
                    at: r.evaluated_at.as_deref().and_then(time_ms),
                    trace_id: r.trace_id,
                    agent_id: r.agent_id,
                    rows: vec![entry],
                });
            }
        }
    }
    if let Some(e) = current {
        out.push(batch(e.trace_id, e.agent_id, e.rows, &run, e.at))?;
    }
    Ok(())
}

/// A result of a session report (`--report json=…`).
#[derive(Deserialize)]
struct ReportedResult {
    assertion_id: String,
    #[serde(rename = "type")]
    kind: String,
    status: Status,
    score: f64,
    #[serde(default)]
    explanation: String,
    #[serde(default)]
    cost: f64,
    expected: Option<String>,
    actual: Option<String>,
    suggested_action: Option<String>,
}

#[derive(Deserialize)]
struct ReportedTrace {
    trace_id: String,
    agent_id: Option<String>,
    results: Vec<ReportedResult>,
}

fn session_report(v: &Value, out: &mut Imports) -> anyhow::Result<()> {
    let file = out.file.display().to_string();
    let generated = v.get("generated_at").and_then(Value::as_str).unwrap_or("");
    let at = time_ms(generated);
    let run = out.run(
        format!("report {file} {generated}"),
        RunKind::Session,
        format!(
            "report {file}{}",
            if generated.is_empty() {
                String::new()
            } else {
                format!(" ({generated})")
            }
        ),
    );
    let traces: Vec<ReportedTrace> = serde_json::from_value(v["traces"].clone())
        .map_err(|e| anyhow::anyhow!("--results {file}: its \"traces\" are not a session report's ({e})"))?;
    for t in traces {
        let rows = t
            .results
            .into_iter()
            .map(|r| {
                (
                    row(r.assertion_id, &r.kind, r.status, r.score, r.cost),
                    Detail {
                        explanation: r.explanation,
                        expected: r.expected,
                        actual: r.actual,
                        hint: r.suggested_action,
                        ..Detail::default()
                    },
                )
            })
            .collect::<Vec<_>>();
        if !rows.is_empty() {
            out.push(batch(t.trace_id, t.agent_id, rows, &run, at))?;
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct EcpCheck {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    field: String,
    passed: bool,
    score: f64,
    #[serde(default)]
    reasoning: String,
    status: Option<Status>,
}

#[derive(Deserialize)]
struct EcpStep {
    #[serde(default)]
    checks: Vec<EcpCheck>,
}

#[derive(Deserialize)]
struct EcpScenario {
    name: String,
    steps: Vec<EcpStep>,
}

fn ecp_report(v: &Value, out: &mut Imports) -> anyhow::Result<()> {
    let file = out.file.display().to_string();
    let audit = &v["audit"];
    let run_id = audit["run_id"].as_str().unwrap_or(&file).to_owned();
    let at = audit["started_at"].as_str().and_then(time_ms);
    let manifest = audit["manifest"]["name"]
        .as_str()
        .or_else(|| v["manifest"].as_str())
        .unwrap_or("manifest");
    let run = out.run(format!("ecp {run_id}"), RunKind::Ecp, format!("ecp run {manifest} ({file})"));
    let scenarios: Vec<EcpScenario> = serde_json::from_value(v["scenarios"].clone())
        .map_err(|e| anyhow::anyhow!("--results {file}: its \"scenarios\" are not an ECP report's ({e})"))?;
    for s in scenarios {
        for (i, step) in s.steps.into_iter().enumerate() {
            let step_no = i + 1;
            let rows = step
                .checks
                .into_iter()
                .enumerate()
                .map(|(j, c)| {
                    let status = c.status.unwrap_or(if c.passed { Status::Pass } else { Status::HardFail });
                    (
                        row(format!("ecp/{}/step{step_no}/{j}-{}", s.name, c.kind), "ecp", status, c.score, 0.0),
                        Detail {
                            explanation: c.reasoning,
                            trace_node_path: (!c.field.is_empty()).then_some(c.field),
                            ..Detail::default()
                        },
                    )
                })
                .collect::<Vec<_>>();
            if !rows.is_empty() {
                out.push(batch(format!("{run_id}/{}/{step_no}", s.name), None, rows, &run, at))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn each_kind_of_file_becomes_rows_at_its_own_time() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = file(
            dir.path(),
            "r.jsonl",
            "{\"trace_id\":\"t1\",\"rule\":\"r\",\"assertion_id\":\"a\",\"type\":\"content\",\"status\":\"pass\",\"score\":1.0,\"explanation\":\"ok\",\"cost_usd\":0.0,\"duration_ms\":1,\"agent_id\":\"bot\",\"evaluated_at\":\"2026-01-02T03:04:05.000Z\",\"delivery\":1}\n\
             {\"trace_id\":\"t1\",\"rule\":\"r\",\"assertion_id\":\"b\",\"type\":\"llm_judge\",\"status\":\"hard_fail\",\"score\":0.2,\"explanation\":\"rude\",\"cost_usd\":0.01,\"duration_ms\":1,\"agent_id\":\"bot\",\"evaluated_at\":\"2026-01-02T03:04:05.000Z\",\"delivery\":1}\n\
             {\"trace_id\":\"t2\",\"rule\":\"r\",\"assertion_id\":\"a\",\"type\":\"content\",\"status\":\"pass\",\"score\":1.0,\"explanation\":\"ok\",\"cost_usd\":0.0,\"duration_ms\":1,\"agent_id\":\"bot\",\"evaluated_at\":\"2026-01-03T00:00:00Z\",\"delivery\":1}\n",
        );
        let (rows, kind) = read(&jsonl, MAX_RESULTS).unwrap();
        assert_eq!(kind, "collect results");
        assert_eq!(rows.len(), 2, "one batch per trace");
        assert_eq!(rows[0].rows.len(), 2);
        assert_eq!(rows[0].rows[1].assertion_id, "r/b");
        assert_eq!(rows[0].recorded_at_ms, Some(1_767_323_045_000));
        assert!(rows[0].kept.is_some() && rows[1].kept.is_none());

        let session = file(
            dir.path(),
            "s.json",
            r#"{"engine_version":"0.1.0","generated_at":"2026-01-02T03:04:05Z","traces":[{"trace_id":"t","agent_id":null,"results":[{"assertion_id":"x","type":"schema","layer":1,"status":"soft_fail","score":0.5,"explanation":"half","cost":0.0,"duration_ms":1,"source":"batch","expected":"e","actual":"a","suggested_action":"h"}]}]}"#,
        );
        let (rows, kind) = read(&session, MAX_RESULTS).unwrap();
        assert_eq!(kind, "session report");
        let kept = rows[0].kept.as_ref().unwrap();
        assert_eq!(
            (kept.details[0].expected.as_deref(), kept.details[0].hint.as_deref()),
            (Some("e"), Some("h"))
        );
        assert_eq!(rows[0].rows[0].status, Status::SoftFail);

        let ecp = file(
            dir.path(),
            "e.json",
            r#"{"manifest":"m.yaml","scenarios":[{"name":"Refund","steps":[{"checks":[{"type":"text_match","field":"public_output","passed":false,"score":0.0,"reasoning":"no refund"}]}]}],"audit":{"run_id":"run-1","started_at":"2026-01-02T03:04:05.123Z","manifest":{"name":"support"}}}"#,
        );
        let (rows, kind) = read(&ecp, MAX_RESULTS).unwrap();
        assert_eq!(kind, "ECP report");
        assert_eq!(rows[0].rows[0].assertion_id, "ecp/Refund/step1/0-text_match");
        assert_eq!(rows[0].rows[0].status, Status::HardFail);
        assert_eq!(rows[0].run.as_ref().unwrap().label, format!("ecp run support ({})", ecp.display()));
    }

    #[test]
    fn a_file_of_another_shape_is_refused_naming_what_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let bad = file(dir.path(), "x.jsonl", "{\"trace_id\":\"t\"}\n");
        let e = read(&bad, MAX_RESULTS).err().unwrap().to_string();
        assert!(e.contains("line 1") && e.contains("needs trace_id, rule, assertion_id"), "{e}");
        let other = file(dir.path(), "o.json", "{\"a\": 1}");
        let e = read(&other, MAX_RESULTS).err().unwrap().to_string();
        assert!(e.contains("a session report is one object with \"traces\""), "{e}");
        let one = file(
            dir.path(),
            "one.jsonl",
            "{\"trace_id\":\"t\",\"rule\":\"r\",\"assertion_id\":\"a\",\"type\":\"trace\",\"status\":\"pass\",\"score\":1}\n",
        );
        assert_eq!(read(&one, 1).unwrap().0.len(), 1);
        let e = read(&one, 0).err().unwrap().to_string();
        assert!(e.contains("more than 1000000 results in all"), "{e}");
    }
}
