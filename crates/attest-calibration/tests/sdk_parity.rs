//! Parity with the attest-ai Python SDK (`attest.calibration`, 0.9.0).
//!
//! Writes label files and texts, runs the SDK's own loaders,
//! `compute_agreement` and `prompt_hash` on them in a Python venv, and
//! compares every record and statistic with this crate's result: floats by
//! their bit patterns, the `JudgeAgreement` JSON member by member.
//!
//! The venv is named by `ATTEST_SDK_VENV` (a relative path is taken from the
//! workspace root); without it the test prints SKIPPED and passes, so plain
//! `cargo test` works on machines without Python, unless
//! `ATTEST_TESTS_REQUIRE_ALL` is set, as in CI. scripts/test sets the venv.

use attest_calibration::{
    compute_agreement, load_labels, load_labels_csv, load_labels_jsonl, prompt_hash, AgreementError, JudgeAgreement, LabelField,
    LabeledRecord, LabelsError, LabelsFormat, RowProblem,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the SDK may take for the whole request (a few seconds normally).
const SDK_DEADLINE: Duration = Duration::from_secs(300);

/// Runs the SDK on a request; one process for the whole test.
const HARNESS: &str = r#"
import json, struct, sys
from pathlib import Path
import attest
from attest import calibration as cal
from attest._proto.types import JudgeAgreement

def bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]

def from_bits(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]

def failure(exc):
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}

def records(load, arg):
    try:
        recs = load(arg)
    except Exception as exc:
        return failure(exc), None
    out = [{
        "input": r.input if isinstance(r.input, str) else None,
        "human_label": bits(r.human_label),
        "judge_score": bits(r.judge_score),
        "judge_known": r.judge_known,
    } for r in recs]
    pairs = [cal.LabelPair(human=r.human_label, judge=r.judge_score) for r in recs if r.judge_known]
    return {"ok": out}, pairs

def agreement(pairs, threshold):
    try:
        r = cal.compute_agreement(pairs, threshold)
    except Exception as exc:
        return failure(exc)
    wire = JudgeAgreement(label_count=r.n, agreement=r.agreement, cohen_kappa=r.cohen_kappa, roc_auc=r.roc_auc).to_dict()
    wire = {k: ({"f64_bits": bits(v)} if isinstance(v, float) else v) for k, v in wire.items()}
    return {"ok": {
        "threshold": bits(r.threshold), "n": r.n, "agreement": bits(r.agreement),
        "cohen_kappa": bits(r.cohen_kappa), "roc_auc": bits(r.roc_auc), "judge_agreement": wire,
    }}

req = json.load(open(sys.argv[1], encoding="utf-8"))
out = {"version": attest.__version__, "files": [], "texts": [], "pair_sets": [], "prompts": []}
for f in req["files"]:
    recs, pairs = records(lambda p: cal.load_labels(Path(p)), f["path"])
    agreements = [agreement(pairs, from_bits(t)) for t in f["thresholds"]] if pairs is not None else []
    out["files"].append({"records": recs, "agreements": agreements})
for t in req["texts"]:
    load = cal.load_labels_csv if t["format"] == "csv" else cal.load_labels_jsonl
    out["texts"].append(records(load, t["text"])[0])
for s in req["pair_sets"]:
    pairs = [cal.LabelPair(human=from_bits(h), judge=from_bits(j)) for h, j in s["pairs"]]
    out["pair_sets"].append(agreement(pairs, from_bits(s["threshold"])))
out["prompts"] = [cal.prompt_hash(p) for p in req["prompts"]]
sys.stdout.write(json.dumps(out))
"#;

fn loud(message: &str) {
    // Written to the real stderr so it shows even when the test passes.
    let _ = writeln!(std::io::stderr(), "{message}");
}

fn sdk_python() -> Option<PathBuf> {
    let Some(venv) = std::env::var_os("ATTEST_SDK_VENV") else {
        return attest_test_support::missing(
            "ATTEST_SDK_VENV is not set (a venv with attest-ai==0.9.0), so nothing was compared with the SDK",
            "scripts/test makes target/e2e-venv and sets it",
        );
    };
    let venv = PathBuf::from(venv);
    let venv = if venv.is_absolute() {
        venv
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(venv)
    };
    let python = venv.join("bin/python");
    assert!(python.is_file(), "ATTEST_SDK_VENV is set but {} does not exist", python.display());
    Some(python)
}

fn run_sdk(python: &Path, dir: &Path, request: &Value) -> Value {
    let script = dir.join("harness.py");
    let request_path = dir.join("request.json");
    std::fs::write(&script, HARNESS).expect("write harness");
    std::fs::write(&request_path, serde_json::to_vec(request).expect("encode request")).expect("write request");
    let mut child = Command::new(python)
        // Isolated from the user's site and PYTHON* variables; UTF-8 mode so
        // the SDK reads label files as UTF-8 whatever the locale.
        .args(["-I", "-X", "utf8"])
        .arg(&script)
        .arg(&request_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the SDK's Python");
    // Read both pipes on threads so a full pipe cannot stall the child.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + SDK_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the SDK's Python") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the SDK's Python did not finish within {SDK_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_reader.join().expect("stdout reader");
    let stderr = err_reader.join().expect("stderr reader");
    assert!(status.success(), "SDK harness failed: {}", String::from_utf8_lossy(&stderr));
    let response: Value = serde_json::from_slice(&stdout).expect("SDK harness prints JSON");
    assert_eq!(response["version"], "0.9.0", "ATTEST_SDK_VENV must hold attest-ai 0.9.0");
    response
}

/// Counts what was compared, for the summary line.
#[derive(Default)]
struct Tally {
    files: usize,
    texts: usize,
    pair_sets: usize,
    fields: usize,
    /// Comparisons where both sides failed (the rest both succeeded).
    both_failed: usize,
}

fn bits(value: f64) -> u64 {
    value.to_bits()
}

fn sdk_bits(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("expected float bits, got {value}"))
}

/// The SDK's error line ("CSV line 3: ..." / "JSONL line 3: ...").
fn sdk_error_line(message: &str) -> Option<usize> {
    let rest = message.strip_prefix("CSV line ").or_else(|| message.strip_prefix("JSONL line "))?;
    rest.split(':').next()?.parse().ok()
}

/// Whether the SDK failure (exception type and message) is the same
/// mistake the Rust error reports, at the same line when the SDK names one.
fn same_failure(rust: &LabelsError, sdk: &Value) -> bool {
    let kind = sdk["type"].as_str().unwrap_or_default();
    let message = sdk["message"].as_str().unwrap_or_default();
    if let (Some(sdk_line), Some(rust_line)) = (sdk_error_line(message), rust.line()) {
        if sdk_line != rust_line {
            return false;
        }
    }
    let not_a_float = |field: LabelField| {
        message.contains(&format!("{field} not a float"))
            || (kind == "ValueError" && message.starts_with("could not convert string to float"))
    };
    match rust {
        LabelsError::Row { problem, .. } => match problem {
            RowProblem::BareCarriageReturn => kind == "Error" && message.contains("new-line character seen in unquoted field"),
            RowProblem::FieldTooLong { .. } => kind == "Error" && message.contains("field larger than field limit (131072)"),
            RowProblem::TooFewColumns { .. } => message.contains("want at least 2 columns"),
            RowProblem::NotANumber { field, .. } => not_a_float(*field),
            RowProblem::InvalidJson { .. } => {
                kind == "ValueError" && message.starts_with("JSONL line") && !message.contains("missing human_label")
            }
            RowProblem::MissingHumanLabel => message.ends_with("missing human_label"),
            RowProblem::NotAnObject { .. } => message.ends_with("missing human_label") || kind == "TypeError" || kind == "AttributeError",
            RowProblem::WrongType {
                field: LabelField::HumanLabel | LabelField::JudgeScore,
                ..
            } => kind == "TypeError",
            // The SDK accepts these; they are checked as deliberate differences.
            RowProblem::WrongType {
                field: LabelField::Input, ..
            }
            | RowProblem::NotFinite { .. } => false,
        },
        LabelsError::EmptyCsv => message == "empty CSV",
        LabelsError::NoLabeledRows { format } => message == format!("{format} contained no labeled rows"),
        _ => false,
    }
}

fn compare_records(what: &str, rust: &Result<Vec<LabeledRecord>, LabelsError>, sdk: &Value, tally: &mut Tally) {
    match (rust, sdk.get("ok")) {
        (Ok(records), Some(sdk_records)) => {
            let sdk_records = sdk_records.as_array().expect("records array");
            assert_eq!(records.len(), sdk_records.len(), "{what}: record count");
            for (i, (record, want)) in records.iter().zip(sdk_records).enumerate() {
                assert_eq!(want["input"].as_str(), Some(record.input.as_str()), "{what}: record {i} input");
                assert_eq!(
                    bits(record.human_label),
                    sdk_bits(&want["human_label"]),
                    "{what}: record {i} human_label"
                );
                assert_eq!(
                    Some(record.judge_score.is_some()),
                    want["judge_known"].as_bool(),
                    "{what}: record {i} judge_known"
                );
                // The SDK keeps 0.0 as the score of an unjudged row.
                assert_eq!(
                    bits(record.judge_score.unwrap_or(0.0)),
                    sdk_bits(&want["judge_score"]),
                    "{what}: record {i} judge_score"
                );
                tally.fields += 4;
            }
        }
        (Err(error), None) => {
            let sdk_error = &sdk["error"];
            assert!(
                same_failure(error, sdk_error),
                "{what}: Rust says {error:?} ({error}), SDK says {sdk_error}"
            );
            tally.fields += 1;
            tally.both_failed += 1;
        }
        (rust, _) => panic!("{what}: Rust gives {rust:?}, SDK gives {sdk}"),
    }
}

/// `JudgeAgreement` JSON with floats as bit patterns, comparable to the SDK's `to_dict()`.
fn wire_bits(agreement: &JudgeAgreement) -> Value {
    let wire = serde_json::to_value(agreement).expect("serialise");
    let map = wire
        .as_object()
        .expect("object")
        .iter()
        .map(|(key, value)| {
            let value = if value.is_f64() {
                json!({"f64_bits": value.as_f64().map(f64::to_bits)})
            } else {
                value.clone()
            };
            (key.clone(), value)
        })
        .collect();
    Value::Object(map)
}

fn compare_agreement(what: &str, rust: &Result<JudgeAgreement, AgreementError>, threshold: f64, sdk: &Value, tally: &mut Tally) {
    match (rust, sdk.get("ok")) {
        (Ok(got), Some(want)) => {
            assert_eq!(Some(got.label_count), want["n"].as_u64(), "{what}: label_count");
            assert_eq!(bits(threshold), sdk_bits(&want["threshold"]), "{what}: threshold");
            assert_eq!(
                bits(got.agreement),
                sdk_bits(&want["agreement"]),
                "{what}: agreement {}",
                got.agreement
            );
            assert_eq!(
                bits(got.cohen_kappa),
                sdk_bits(&want["cohen_kappa"]),
                "{what}: cohen_kappa {}",
                got.cohen_kappa
            );
            assert_eq!(bits(got.roc_auc), sdk_bits(&want["roc_auc"]), "{what}: roc_auc {}", got.roc_auc);
            assert_eq!(wire_bits(got), want["judge_agreement"], "{what}: JudgeAgreement JSON");
            tally.fields += 5 + want["judge_agreement"].as_object().map_or(0, |m| m.len());
        }
        (Err(error), None) => {
            let message = sdk["error"]["message"].as_str().unwrap_or_default();
            let same = match error {
                AgreementError::NoPairs => message == "no labeled pairs available",
                AgreementError::ThresholdOutOfRange { .. } => message == "threshold must be in (0, 1)",
                AgreementError::NonFiniteScore { .. } => false,
            };
            assert!(same, "{what}: Rust says {error}, SDK says {}", sdk["error"]);
            tally.fields += 1;
            tally.both_failed += 1;
        }
        (rust, _) => panic!("{what}: Rust gives {rust:?}, SDK gives {sdk}"),
    }
}

/// How a named file is expected to come out.
#[derive(Clone, Copy)]
enum Expect {
    /// Both load it; records and statistics are compared.
    Loads,
    /// Both reject it, for the same mistake at the same line.
    Rejected,
    /// The SDK accepts it; the engine rejects it on purpose at this line
    /// (see docs/calibration.md, "Differences from the SDK").
    EngineStricter { line: usize },
}

struct LabelFile {
    name: &'static str,
    text: String,
    expect: Expect,
}

fn label_files() -> Vec<LabelFile> {
    let file = |name, text: &str, expect| LabelFile {
        name,
        text: text.to_owned(),
        expect,
    };
    let loads = |name, text: &str| file(name, text, Expect::Loads);
    let rejected = |name, text: &str| file(name, text, Expect::Rejected);
    let mut realistic_csv = String::from("input,human_label,judge_score\r\n# exported from the review tool\r\n");
    let mut realistic_jsonl = String::new();
    for i in 0..60u32 {
        // A reproducible mix: humans split roughly in half, the judge mostly
        // agrees with a few confident mistakes and repeated (tied) scores.
        let human = [1.0, 0.0, 1.0, 0.5, 0.0, 0.8, 0.2][(i % 7) as usize];
        let judge = [0.91, 0.12, 0.67, 0.5, 0.45, 0.88, 0.7, 0.12, 0.33, 0.95, 0.5][(i % 11) as usize];
        let input = match i % 5 {
            0 => format!("\"Summarise ticket #{i}, politely\""),
            1 => format!("\"Réponse {i}: \"\"ok\"\"\""),
            2 => format!("\"multi-line\nanswer {i}\""),
            3 => format!("回答{i}"),
            _ => format!("plain {i}"),
        };
        if i % 13 == 12 {
            realistic_csv.push_str(&format!("{input}, {human} ,\r\n\r\n"));
            realistic_jsonl.push_str(&format!(
                "{{\"input\": \"row {i}\", \"human_label\": {human}, \"judge_score\": null}}\n\n"
            ));
        } else {
            realistic_csv.push_str(&format!("{input},{human},{judge}\r\n"));
            let judge_text = if i % 4 == 0 { format!("\"{judge}\"") } else { judge.to_string() };
            realistic_jsonl.push_str(&format!(
                "{{\"input\": \"row {i} \\u00e9\", \"human_label\": {human}, \"judge_score\": {judge_text}}}\n"
            ));
        }
    }
    realistic_jsonl.push_str("{}\n");

    vec![
        loads(
            "single_class.csv",
            "input,human_label,judge_score\na,1,0.9\nb,0.9,0.2\nc,1,0.5\nd,0.75,0.7\n",
        ),
        loads(
            "ties.jsonl",
            "{\"input\": \"a\", \"human_label\": 1, \"judge_score\": 0.5}\n\
             {\"input\": \"b\", \"human_label\": 0, \"judge_score\": 0.5}\n\
             {\"input\": \"c\", \"human_label\": 1, \"judge_score\": 0.8}\n\
             {\"input\": \"d\", \"human_label\": 0, \"judge_score\": 0.8}\n\
             {\"input\": \"e\", \"human_label\": 0, \"judge_score\": 0.2}\n\
             {\"input\": \"f\", \"human_label\": 1, \"judge_score\": 0.5}\n\
             {\"input\": \"g\", \"human_label\": 0, \"judge_score\": -0.0}\n\
             {\"input\": \"h\", \"human_label\": 1, \"judge_score\": 0}\n",
        ),
        loads("all_agree.csv", "q1,1,0.95\nq2,0,0.05\nq3,1,0.6\nq4,0,0.4\nq5,1,1\n"),
        loads(
            "all_disagree.jsonl",
            "{\"human_label\": 1, \"judge_score\": 0.1}\n{\"human_label\": 0, \"judge_score\": 0.9}\n\
             {\"human_label\": true, \"judge_score\": \"0.2\"}\n{\"human_label\": false, \"judge_score\": 0.7}\n",
        ),
        loads("realistic.csv", &realistic_csv),
        loads("realistic.jsonl", &realistic_jsonl),
        loads("one_pair.csv", "only,1,1\n"),
        loads("constant_judge.csv", "a,1,0.9\nb,0,0.9\nc,1,0.9\nd,0,0.8\ne,1,0.7\n"),
        loads("unjudged.csv", "input,human_label,judge_score\na,1,\nb,0\n"),
        // Malformed files: both sides fail, at the same line.
        rejected("bad_human.csv", "input,human_label\na,1\nb,0\nc,yes\n"),
        rejected("bad_judge.csv", "a,1,0.5\nb,1,0.5.1\n"),
        rejected("too_few_columns.csv", "a,1,0.5\n\n# note\nlonely\n"),
        rejected("empty.csv", ""),
        rejected("only_header.csv", "input,human_label,judge_score\n# nothing yet\n"),
        rejected(
            "missing_human.jsonl",
            "{\"human_label\": 1}\n{\"input\": \"x\", \"judge_score\": 1}\n",
        ),
        rejected("bad_json.jsonl", "{\"human_label\": 1}\n{\"human_label\": 1,}\n"),
        rejected("human_null.jsonl", "{\"human_label\": 1}\n{\"human_label\": null}\n"),
        rejected("human_text.jsonl", "{\"human_label\": \"high\"}\n"),
        rejected("not_objects.jsonl", "0\nnull\n[1, 2]\n"),
        rejected("only_empty.jsonl", "{}\n\n[]\n"),
        // Deliberate differences: values the SDK takes and the engine refuses.
        LabelFile {
            name: "nan_judge.csv",
            text: "a,1,0.5\nb,0,nan\n".into(),
            expect: Expect::EngineStricter { line: 2 },
        },
        LabelFile {
            name: "infinite_human.jsonl",
            text: "{\"human_label\": 1}\n{\"human_label\": \"inf\"}\n".into(),
            expect: Expect::EngineStricter { line: 2 },
        },
        LabelFile {
            name: "numeric_input.jsonl",
            text: "{\"input\": 7, \"human_label\": 1}\n".into(),
            expect: Expect::EngineStricter { line: 1 },
        },
    ]
}

/// Label texts for the loaders themselves (no file reading, so raw `\r`).
fn label_texts() -> Vec<(LabelsFormat, String)> {
    let mut texts = vec![
        (LabelsFormat::Csv, "a,1\nb,1\rc,0\n".to_owned()),
        (LabelsFormat::Csv, "a,1\r\nb,0,0.5\r".to_owned()),
        (LabelsFormat::Csv, format!("a,1\n\"{}\",1\n", "x".repeat(131_073))),
        (LabelsFormat::Csv, format!("{},1\n", "y".repeat(131_072))),
        (LabelsFormat::Csv, "\"unterminated,1\nnext,0".to_owned()),
        (LabelsFormat::Csv, "\ninput,human_label\na,1\n".to_owned()),
        (
            LabelsFormat::Jsonl,
            "{\"human_label\": 1}\u{2028}{\"human_label\": 0}\u{b}\n\"human_label\"".to_owned(),
        ),
    ];
    let mut rng = SplitMix(0x00c0_ffee);
    for _ in 0..400 {
        texts.push((LabelsFormat::Csv, random_csv(&mut rng)));
        texts.push((LabelsFormat::Jsonl, random_jsonl(&mut rng)));
    }
    texts
}

/// A small reproducible generator (SplitMix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn random_csv(rng: &mut SplitMix) -> String {
    const INPUTS: &[&str] = &[
        "a",
        "\"q, x\"",
        "\"he said \"\"hi\"\"\"",
        "# c",
        " #c",
        "",
        "\"#q\"",
        "日本",
        "x\"y",
        "\"ab\"c",
        "\u{1c}#s",
    ];
    const VALUES: &[&str] = &[
        "0",
        "1",
        "0.5",
        " 0.25 ",
        "1_0",
        ".5",
        "5.",
        "-0",
        "1e-3",
        "x",
        "",
        "\"0.75\"",
        "1__0",
        "0.1000000000000000055511151231257827",
        "+.5",
        "\u{a0}1",
        "\t0.3",
        "1\u{1c}",
        "high",
        "0.7",
        "0.2",
        "1E0",
    ];
    const VALID: &[&str] = &[
        "0", "1", "0.5", " 0.25 ", "1_0", ".5", "-0", "1e-3", "\"0.75\"", "0.7", "0.2", "\t0.3", "1\u{1c}",
    ];
    const ENDINGS: &[&str] = &["\n", "\n", "\r\n", "\r\n", "\n\n"];
    let mut text = String::new();
    if rng.below(3) == 0 {
        text.push_str("input,human_label,judge_score\n");
    }
    for _ in 0..rng.below(8) {
        match rng.below(12) {
            0 => text.push_str("# comment, with commas\n"),
            1 => text.push('\n'),
            _ => {
                text.push_str(rng.pick(INPUTS));
                // Mostly well-formed rows, so loads succeed often enough to
                // compare values, not only errors.
                let columns = if rng.below(6) == 0 { rng.below(5) } else { 2 + rng.below(2) };
                for _ in 1..columns {
                    text.push(',');
                    text.push_str(if rng.below(6) == 0 { rng.pick(VALUES) } else { rng.pick(VALID) });
                }
                text.push_str(rng.pick(ENDINGS));
            }
        }
    }
    if rng.below(4) == 0 {
        text.pop();
    }
    text
}

fn random_jsonl(rng: &mut SplitMix) -> String {
    const VALUES: &[&str] = &[
        "1",
        "0",
        "0.5",
        "-0",
        "-0.0",
        "1e-3",
        "1E2",
        "0.1000000000000000055511151231257827",
        "12345678901234567890",
        "true",
        "false",
        "null",
        "\"0.5\"",
        "\" 1_0 \"",
        "\"x\"",
        "\"\"",
        "[1]",
        "{}",
        "\"1\\u00a0\"",
        "0.7",
        "0.25",
    ];
    const VALID: &[&str] = &[
        "1",
        "0",
        "0.5",
        "-0",
        "-0.0",
        "1e-3",
        "12345678901234567890",
        "true",
        "\"0.5\"",
        "\" 1_0 \"",
        "0.7",
        "0.25",
    ];
    const INPUTS: &[&str] = &["\"a\"", "\"日本\"", "\"\"", "\"line\\nbreak\""];
    const LINES: &[&str] = &[
        "",
        "   ",
        "{}",
        "[]",
        "0",
        "null",
        "false",
        "\"\"",
        "{bad",
        "[1]",
        "1",
        "\"human_label\"",
        "true",
    ];
    const BREAKS: &[&str] = &["\n", "\n", "\r\n", "\u{2028}", "\u{b}", "\r"];
    let mut text = String::new();
    for _ in 0..rng.below(7) {
        if rng.below(10) == 0 {
            text.push_str(rng.pick(LINES));
        } else {
            let mut members = Vec::new();
            if rng.below(2) == 0 {
                members.push(format!("\"input\": {}", rng.pick(INPUTS)));
            }
            let value = |rng: &mut SplitMix| if rng.below(8) == 0 { rng.pick(VALUES) } else { rng.pick(VALID) };
            if rng.below(12) != 0 {
                members.push(format!("\"human_label\": {}", value(rng)));
            }
            if rng.below(3) != 0 {
                members.push(format!("\"judge_score\": {}", value(rng)));
            }
            if rng.below(6) == 0 {
                members.push(format!("\"human_label\": {}", value(rng)));
            }
            text.push_str(&format!("{{{}}}", members.join(", ")));
        }
        text.push_str(rng.pick(BREAKS));
    }
    text
}

/// Pair sets for `compute_agreement`: hand-picked edge cases, random sets
/// drawn from tie-heavy pools, and two large sets.
fn pair_sets() -> Vec<(Vec<(f64, f64)>, f64)> {
    let mut sets = vec![
        (vec![], 0.5),
        (vec![(1.0, 1.0)], 0.0),
        (vec![(1.0, 1.0)], 1.0),
        (vec![(1.0, 1.0)], 0.5),
        (vec![(0.0, 0.0), (0.0, 0.0)], 0.5),
        (vec![(0.5, 0.5), (0.49999999999999994, 0.5000000000000001)], 0.5),
        (vec![(1.0, 0.3), (0.0, 0.3), (1.0, 0.3), (0.0, 0.3), (1.0, 0.3)], 0.5),
        (vec![(1.0, 0.9), (0.0, 0.1), (1.0, 0.2), (0.0, 0.8)], 0.5),
        (vec![(1.5, -0.2), (-0.2, 1.5), (1.5, 1.5)], 0.5),
    ];
    let mut rng = SplitMix(0x0a11_ce00);
    const SCORES: &[f64] = &[
        0.0,
        -0.0,
        1.0,
        0.5,
        0.3,
        0.7,
        0.49999999999999994,
        0.5000000000000001,
        0.1,
        0.9,
        0.25,
        0.75,
        1.5,
        -0.2,
    ];
    const THRESHOLDS: &[f64] = &[0.5, 0.5, 0.3, 0.7, 0.1, 0.9, 0.25, 1e-9, 0.999999, 0.0, 1.0, -1.0];
    for _ in 0..600 {
        let n = rng.below(40);
        let narrow = rng.below(3) == 0;
        let pairs = (0..n)
            .map(|_| {
                let score = |rng: &mut SplitMix| {
                    if narrow {
                        rng.pick(&SCORES[..3])
                    } else if rng.below(3) == 0 {
                        rng.unit()
                    } else {
                        rng.pick(SCORES)
                    }
                };
                (score(&mut rng), score(&mut rng))
            })
            .collect();
        sets.push((pairs, rng.pick(THRESHOLDS)));
    }
    let uniform = (0..200_000).map(|_| (rng.unit(), rng.unit())).collect();
    sets.push((uniform, 0.5));
    let tied = (0..100_000)
        .map(|_| (rng.pick(&[0.0, 1.0, 0.6]), rng.pick(&[0.2, 0.5, 0.9])))
        .collect();
    sets.push((tied, 0.55));
    sets
}

const PROMPTS: &[&str] = &[
    "",
    "abc",
    "Rate the answer from 0 to 1 for factual accuracy.\n\nAnswer: {{output}}",
    "\u{e9}",
    "e\u{301}",
    "日本語のプロンプト",
    "🧪 judge ≥ 0.5?",
    "nul\u{0}inside",
    "crlf\r\nline ",
    " leading and trailing spaces ",
];

#[test]
fn sdk_parity() {
    let Some(python) = sdk_python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let files = label_files();
    let thresholds = [0.5, 0.25, 0.7, 0.9];
    let texts = label_texts();
    let sets = pair_sets();
    let long_prompt = "Judge carefully. ".repeat(2_000);
    let prompts: Vec<&str> = PROMPTS.iter().copied().chain([long_prompt.as_str()]).collect();

    let mut file_requests = Vec::new();
    for file in &files {
        let path = dir.path().join(file.name);
        std::fs::write(&path, &file.text).expect("write label file");
        // The SDK never returns from compute_agreement on a NaN judge score
        // (its tie loop stops advancing), so files it is expected to accept
        // but the engine refuses are only loaded.
        let file_thresholds: &[f64] = match file.expect {
            Expect::Loads => &thresholds,
            Expect::Rejected | Expect::EngineStricter { .. } => &[],
        };
        let file_thresholds: Vec<u64> = file_thresholds.iter().map(|t| t.to_bits()).collect();
        file_requests.push(json!({"path": path, "thresholds": file_thresholds}));
    }
    let request = json!({
        "files": file_requests,
        "texts": texts.iter().map(|(format, text)| json!({
            "format": if *format == LabelsFormat::Csv { "csv" } else { "jsonl" },
            "text": text,
        })).collect::<Vec<_>>(),
        "pair_sets": sets.iter().map(|(pairs, threshold)| json!({
            "pairs": pairs.iter().map(|(h, j)| [h.to_bits(), j.to_bits()]).collect::<Vec<_>>(),
            "threshold": threshold.to_bits(),
        })).collect::<Vec<_>>(),
        "prompts": prompts,
    });
    let sdk = run_sdk(&python, dir.path(), &request);
    let mut tally = Tally::default();

    for (file, sdk_file) in files.iter().zip(sdk["files"].as_array().expect("files")) {
        let what = file.name;
        let rust = load_labels(&dir.path().join(file.name));
        match file.expect {
            Expect::Loads | Expect::Rejected => {
                let sdk_loaded = sdk_file["records"].get("ok").is_some();
                assert_eq!(sdk_loaded, matches!(file.expect, Expect::Loads), "{what}: SDK gives {sdk_file}");
                compare_records(what, &rust, &sdk_file["records"], &mut tally);
                if let Ok(records) = &rust {
                    let pairs: Vec<_> = records.iter().filter_map(LabeledRecord::pair).collect();
                    for (threshold, sdk_agreement) in thresholds.iter().zip(sdk_file["agreements"].as_array().expect("agreements")) {
                        let what = format!("{what} at {threshold}");
                        compare_agreement(&what, &compute_agreement(&pairs, *threshold), *threshold, sdk_agreement, &mut tally);
                    }
                }
            }
            Expect::EngineStricter { line } => {
                assert!(
                    sdk_file["records"].get("ok").is_some(),
                    "{what}: the SDK should accept it: {sdk_file}"
                );
                let error = rust.expect_err(what);
                assert_eq!(error.line(), Some(line), "{what}: {error}");
                assert!(
                    matches!(
                        &error,
                        LabelsError::Row {
                            problem: RowProblem::NotFinite { .. }
                                | RowProblem::WrongType {
                                    field: LabelField::Input,
                                    ..
                                },
                            ..
                        }
                    ),
                    "{what}: {error:?}"
                );
            }
        }
        tally.files += 1;
    }

    for (i, ((format, text), sdk_text)) in texts.iter().zip(sdk["texts"].as_array().expect("texts")).enumerate() {
        let rust = match format {
            LabelsFormat::Csv => load_labels_csv(text),
            LabelsFormat::Jsonl => load_labels_jsonl(text),
        };
        let shown: String = text.chars().take(300).collect();
        compare_records(&format!("text {i} ({format}) {shown:?}"), &rust, sdk_text, &mut tally);
        tally.texts += 1;
    }

    for (i, ((pairs, threshold), sdk_set)) in sets.iter().zip(sdk["pair_sets"].as_array().expect("pair sets")).enumerate() {
        let pairs: Vec<_> = pairs
            .iter()
            .map(|&(human, judge)| attest_calibration::LabelPair { human, judge })
            .collect();
        let what = format!("pair set {i} (n={}, threshold {threshold})", pairs.len());
        compare_agreement(&what, &compute_agreement(&pairs, *threshold), *threshold, sdk_set, &mut tally);
        tally.pair_sets += 1;
    }

    let sdk_prompts = sdk["prompts"].as_array().expect("prompts");
    assert_eq!(sdk_prompts.len(), prompts.len());
    for (prompt, want) in prompts.iter().zip(sdk_prompts) {
        assert_eq!(Some(prompt_hash(prompt).as_str()), want.as_str(), "prompt_hash({prompt:?})");
        tally.fields += 1;
    }

    loud(&format!(
        "sdk_parity: compared {} label files, {} label texts, {} pair sets and {} prompt hashes with attest-ai 0.9.0: {} fields equal; {} comparisons were the same failure on both sides",
        tally.files,
        tally.texts,
        tally.pair_sets,
        prompts.len(),
        tally.fields,
        tally.both_failed
    ));
}
