//! Human-label files: CSV and JSONL loaders that accept exactly the rows,
//! columns, keys and value spellings the attest-ai SDK's loaders accept,
//! and reject bad rows with the line and field to fix.
//!
//! CSV: columns by position, `input,human_label[,judge_score]`; further
//! columns are ignored. The first row is a header when its second column is
//! not a number. Blank rows and rows whose first field starts with `#`
//! (after leading whitespace) are skipped. An empty `judge_score` means
//! "not judged yet".
//!
//! JSONL: one object per line with keys `human_label` (required), `input`
//! (default `""`) and `judge_score` (absent or `null`: not judged yet).
//! Blank lines and lines holding an empty or false-like JSON value (`{}`,
//! `[]`, `""`, `0`, `false`, `null`) are skipped. Lines are split where
//! Python's `str.splitlines` splits them.
//!
//! Values: numbers; in JSONL also `true`/`false` (1 and 0) and strings
//! holding a number. Number text follows Python's `float()`: surrounding
//! whitespace, a sign, `1_000`-style underscores, `.5`, `5.`, exponents.
//!
//! Where this deliberately differs from the SDK (it accepts these, the
//! engine rejects them with an error naming the line and field): NaN and
//! infinite values; non-ASCII digits; a non-string `input`; in JSONL, the
//! non-standard `NaN`/`Infinity` literals and strings with lone surrogate
//! escapes. Line numbers count physical lines, where the SDK counts CSV
//! records (they differ only after a quoted field spanning lines).

use crate::agreement::LabelPair;
use crate::csv_reader::{self, CsvSyntax, FIELD_LIMIT_CHARS};
use crate::pyfloat::{parse_py_float, py_lstrip, py_strip};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Largest labels file [`load_labels`] reads: 256 MiB.
pub const MAX_LABELS_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Longest excerpt of a bad value echoed in an error message, in characters.
const ECHO_CHARS: usize = 40;

/// One labelled example from a labels file.
#[derive(Debug, Clone, PartialEq)]
pub struct LabeledRecord {
    /// The judged input, as written in the file.
    pub input: String,
    /// The human's score.
    pub human_label: f64,
    /// The judge's score, if the file already has one.
    pub judge_score: Option<f64>,
}

impl LabeledRecord {
    /// The (human, judge) pair, or `None` when the row has no judge score yet.
    pub fn pair(&self) -> Option<LabelPair> {
        self.judge_score.map(|judge| LabelPair {
            human: self.human_label,
            judge,
        })
    }
}

/// The two label-file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelsFormat {
    Csv,
    Jsonl,
}

impl fmt::Display for LabelsFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LabelsFormat::Csv => "CSV",
            LabelsFormat::Jsonl => "JSONL",
        })
    }
}

/// A column (CSV) or key (JSONL) of a labels row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelField {
    Input,
    HumanLabel,
    JudgeScore,
}

impl fmt::Display for LabelField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LabelField::Input => "input",
            LabelField::HumanLabel => "human_label",
            LabelField::JudgeScore => "judge_score",
        })
    }
}

/// What is wrong with one row of a labels file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowProblem {
    /// CSV: a `\r` outside quotes with more text after it on the same line.
    BareCarriageReturn,
    /// CSV: a field longer than the SDK's CSV field limit.
    FieldTooLong { limit_chars: usize },
    /// CSV: fewer than the two required columns.
    TooFewColumns { found: usize },
    /// A value that is not number text (bounded excerpt of it).
    NotANumber { field: LabelField, value: String },
    /// A number that is NaN or infinite (bounded excerpt of its text).
    NotFinite { field: LabelField, value: String },
    /// JSONL: a value of the wrong JSON type (`found` names the type).
    WrongType { field: LabelField, found: &'static str },
    /// JSONL: the line is not JSON.
    InvalidJson { message: String },
    /// JSONL: the line is JSON but not an object.
    NotAnObject { found: &'static str },
    /// JSONL: the object has no `human_label`.
    MissingHumanLabel,
}

impl fmt::Display for RowProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowProblem::BareCarriageReturn => {
                f.write_str("a carriage return (\\r) is followed by more text on the same line; end lines with \\n or \\r\\n")
            }
            RowProblem::FieldTooLong { limit_chars } => write!(
                f,
                "a field is longer than {limit_chars} characters, the CSV limit; shorten it or use a JSONL labels file"
            ),
            RowProblem::TooFewColumns { found } => write!(
                f,
                "want at least 2 columns (input, human_label), found {found}; quote an input that contains commas"
            ),
            RowProblem::NotANumber { field, value } => {
                write!(f, "{field} {value:?} is not a number; write a decimal such as 0.8")
            }
            RowProblem::NotFinite { field, value } => write!(
                f,
                "{field} is {value:?}; labels and scores must be finite numbers, normally in [0, 1]"
            ),
            RowProblem::WrongType {
                field: LabelField::Input,
                found,
            } => write!(f, "input is {found}; write the input as a JSON string"),
            RowProblem::WrongType { field, found } => {
                write!(f, "{field} is {found}; write a number such as 0.8")
            }
            RowProblem::InvalidJson { message } => write!(
                f,
                "not valid JSON ({message}); write one object per line, such as \
                 {{\"input\": \"...\", \"human_label\": 1, \"judge_score\": 0.8}}"
            ),
            RowProblem::NotAnObject { found } => write!(
                f,
                "expected a JSON object, found {found}; write one object per line, such as \
                 {{\"input\": \"...\", \"human_label\": 1}}"
            ),
            RowProblem::MissingHumanLabel => f.write_str("missing human_label; every object needs a numeric \"human_label\""),
        }
    }
}

/// Why a labels file could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelsError {
    /// A row is malformed; `line` is 1-based.
    Row {
        format: LabelsFormat,
        line: usize,
        problem: RowProblem,
    },
    /// The CSV text has no rows at all.
    EmptyCsv,
    /// Every row was blank, a comment, a header or a skipped value.
    NoLabeledRows { format: LabelsFormat },
    /// A file read as CSV that holds a JSON list: labels in JSON are one
    /// object per line.
    JsonList { path: PathBuf },
    /// The file could not be read.
    Read { path: PathBuf, message: String },
    /// The file is larger than [`MAX_LABELS_FILE_BYTES`].
    TooLarge { path: PathBuf, limit_bytes: u64 },
    /// The file is not UTF-8 text; `line` is where the first bad byte is.
    NotUtf8 { path: PathBuf, line: usize },
}

impl LabelsError {
    /// The 1-based line a row error points at.
    pub fn line(&self) -> Option<usize> {
        match self {
            LabelsError::Row { line, .. } | LabelsError::NotUtf8 { line, .. } => Some(*line),
            _ => None,
        }
    }
}

impl fmt::Display for LabelsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelsError::Row { format, line, problem } => write!(f, "{format} line {line}: {problem}"),
            LabelsError::EmptyCsv => f.write_str("empty CSV: write one row per example as input,human_label[,judge_score]"),
            LabelsError::NoLabeledRows { format } => write!(
                f,
                "{format} contained no labeled rows (only blank lines, comments or a header); add one row per example"
            ),
            LabelsError::JsonList { path } => write!(
                f,
                "labels file {} holds a JSON list; write one object per line instead, such as \
                 {{\"input\": \"...\", \"human_label\": 1}}, in a .jsonl file",
                path.display()
            ),
            LabelsError::Read { path, message } => write!(f, "cannot read labels file {}: {message}", path.display()),
            LabelsError::TooLarge { path, limit_bytes } => write!(
                f,
                "labels file {} is larger than {}; split it into smaller files",
                path.display(),
                attest_io::Size(*limit_bytes)
            ),
            LabelsError::NotUtf8 { path, line } => write!(
                f,
                "labels file {} is not UTF-8 text (first bad byte on line {line}); save it as UTF-8",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LabelsError {}

/// A bounded, single-line excerpt of user text for error messages.
fn excerpt(text: &str) -> String {
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(ECHO_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

fn row_error(format: LabelsFormat, line: usize, problem: RowProblem) -> LabelsError {
    LabelsError::Row { format, line, problem }
}

/// Number text to a finite value, or the row problem to report.
fn number_from_text(text: &str, field: LabelField) -> Result<f64, RowProblem> {
    match parse_py_float(text) {
        None => Err(RowProblem::NotANumber {
            field,
            value: excerpt(text),
        }),
        Some(value) if !value.is_finite() => Err(RowProblem::NotFinite {
            field,
            value: excerpt(text),
        }),
        Some(value) => Ok(value),
    }
}

/// Loads CSV label text, as the SDK's `load_labels_csv` does.
pub fn load_labels_csv(text: &str) -> Result<Vec<LabeledRecord>, LabelsError> {
    const CSV: LabelsFormat = LabelsFormat::Csv;
    // The whole text is split into records first, so a syntax error anywhere
    // is reported before any bad value, as in the SDK.
    let records = csv_reader::read_records(text).map_err(|syntax| match syntax {
        CsvSyntax::BareCarriageReturn { line } => row_error(CSV, line, RowProblem::BareCarriageReturn),
        CsvSyntax::FieldTooLong { line } => row_error(
            CSV,
            line,
            RowProblem::FieldTooLong {
                limit_chars: FIELD_LIMIT_CHARS,
            },
        ),
    })?;
    let Some(first) = records.first() else {
        return Err(LabelsError::EmptyCsv);
    };
    let has_header = first.fields.len() >= 2 && parse_py_float(py_strip(&first.fields[1])).is_none();

    let mut out = Vec::new();
    for record in &records[usize::from(has_header)..] {
        let fields = &record.fields;
        let Some(input) = fields.first() else {
            continue;
        };
        if py_lstrip(input).starts_with('#') {
            continue;
        }
        let at = |problem| row_error(CSV, record.line, problem);
        if fields.len() < 2 {
            return Err(at(RowProblem::TooFewColumns { found: fields.len() }));
        }
        let human_label = number_from_text(py_strip(&fields[1]), LabelField::HumanLabel).map_err(at)?;
        let judge_score = match fields.get(2).map(|f| py_strip(f)) {
            Some(text) if !text.is_empty() => Some(number_from_text(text, LabelField::JudgeScore).map_err(at)?),
            _ => None,
        };
        out.push(LabeledRecord {
            input: input.clone(),
            human_label,
            judge_score,
        });
    }
    if out.is_empty() {
        return Err(LabelsError::NoLabeledRows { format: CSV });
    }
    Ok(out)
}

/// Python's `str.splitlines()`: breaks at `\n`, `\r\n`, `\r`, `\v`, `\f`,
/// U+001C..U+001E, U+0085, U+2028 and U+2029; no empty last line.
fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        lines.push(&text[start..at]);
        let mut end = at + c.len_utf8();
        if c == '\r' {
            if let Some(&(next_at, '\n')) = chars.peek() {
                chars.next();
                end = next_at + 1;
            }
        }
        start = end;
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// The JSON type of a raw value, named as in error messages.
fn json_kind(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// A JSON number from its source text, rounded as Python's `json` module
/// rounds it: integers are Python ints (so `-0` is plain zero), others floats.
fn json_number(text: &str) -> Option<f64> {
    let value: f64 = text.parse().ok()?;
    let is_integer = !text.contains(['.', 'e', 'E']);
    Some(if is_integer && value == 0.0 { 0.0 } else { value })
}

/// Python's truthiness of a parsed JSON value: empty containers and
/// strings, zero, `false` and `null` are false.
fn json_truthy(raw: &RawValue) -> bool {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => serde_json::from_str::<HashMap<String, &RawValue>>(text)
            .map(|m| !m.is_empty())
            .unwrap_or(true),
        Some(b'[') => serde_json::from_str::<Vec<&RawValue>>(text).map(|v| !v.is_empty()).unwrap_or(true),
        Some(b'"') => text != "\"\"",
        Some(b't') => true,
        Some(b'f' | b'n') => false,
        _ => json_number(text).is_none_or(|v| v != 0.0),
    }
}

/// A label value the way the SDK's `float(value)` coerces it.
fn json_label_value(raw: &RawValue, field: LabelField) -> Result<f64, RowProblem> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => {
            let string: String = serde_json::from_str(text).map_err(|e| RowProblem::InvalidJson { message: e.to_string() })?;
            number_from_text(&string, field)
        }
        Some(b't') => Ok(1.0),
        Some(b'f') => Ok(0.0),
        Some(b'{' | b'[' | b'n') => Err(RowProblem::WrongType {
            field,
            found: json_kind(raw),
        }),
        _ => match json_number(text) {
            Some(value) if value.is_finite() => Ok(value),
            _ => Err(RowProblem::NotFinite {
                field,
                value: excerpt(text),
            }),
        },
    }
}

fn jsonl_record(line: &str) -> Result<Option<LabeledRecord>, RowProblem> {
    let invalid = |e: serde_json::Error| RowProblem::InvalidJson {
        message: excerpt(&e.to_string()),
    };
    let raw: &RawValue = serde_json::from_str(line).map_err(invalid)?;
    if !json_truthy(raw) {
        return Ok(None);
    }
    if !raw.get().starts_with('{') {
        return Err(RowProblem::NotAnObject { found: json_kind(raw) });
    }
    // Later duplicates of a key win, as in Python's json module.
    let object: HashMap<String, &RawValue> = serde_json::from_str(raw.get()).map_err(invalid)?;
    let human = object.get("human_label").ok_or(RowProblem::MissingHumanLabel)?;
    let human_label = json_label_value(human, LabelField::HumanLabel)?;
    let input = match object.get("input") {
        None => String::new(),
        Some(raw) if raw.get().starts_with('"') => serde_json::from_str(raw.get()).map_err(invalid)?,
        Some(raw) => {
            return Err(RowProblem::WrongType {
                field: LabelField::Input,
                found: json_kind(raw),
            })
        }
    };
    let judge_score = match object.get("judge_score") {
        Some(raw) if raw.get() != "null" => Some(json_label_value(raw, LabelField::JudgeScore)?),
        _ => None,
    };
    Ok(Some(LabeledRecord {
        input,
        human_label,
        judge_score,
    }))
}

/// Loads JSONL label text, as the SDK's `load_labels_jsonl` does.
pub fn load_labels_jsonl(text: &str) -> Result<Vec<LabeledRecord>, LabelsError> {
    let mut out = Vec::new();
    for (index, raw_line) in py_splitlines(text).into_iter().enumerate() {
        let stripped = py_strip(raw_line);
        if stripped.is_empty() {
            continue;
        }
        match jsonl_record(stripped) {
            Ok(Some(record)) => out.push(record),
            Ok(None) => {}
            Err(problem) => return Err(row_error(LabelsFormat::Jsonl, index + 1, problem)),
        }
    }
    if out.is_empty() {
        return Err(LabelsError::NoLabeledRows {
            format: LabelsFormat::Jsonl,
        });
    }
    Ok(out)
}

/// Which loader a file gets: by extension (`.jsonl`/`.ndjson`, `.csv`, any
/// letter case), else JSONL when the text starts with `{`, else CSV.
pub fn detect_format(path: &Path, text: &str) -> LabelsFormat {
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_lowercase);
    match extension.as_deref() {
        Some("jsonl" | "ndjson") => LabelsFormat::Jsonl,
        Some("csv") => LabelsFormat::Csv,
        _ if py_lstrip(text).starts_with('{') => LabelsFormat::Jsonl,
        _ => LabelsFormat::Csv,
    }
}

/// Reads and loads a labels file as the SDK's `load_labels` does: UTF-8
/// text with `\r\n` and lone `\r` read as `\n`, format per [`detect_format`].
pub fn load_labels(path: &Path) -> Result<Vec<LabeledRecord>, LabelsError> {
    let text = attest_io::read_capped_text(path, MAX_LABELS_FILE_BYTES).map_err(|e| match e {
        attest_io::ReadError::Io(e) => LabelsError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
        attest_io::ReadError::TooLarge { limit, .. } => LabelsError::TooLarge {
            path: path.to_path_buf(),
            limit_bytes: limit,
        },
        attest_io::ReadError::NotUtf8 { line } => LabelsError::NotUtf8 {
            path: path.to_path_buf(),
            line,
        },
    })?;
    let text = universal_newlines(text);
    match detect_format(path, &text) {
        LabelsFormat::Jsonl => load_labels_jsonl(&text),
        // Read as CSV, a JSON list is a column of brackets and fragments:
        // say what it is rather than what CSV made of it.
        LabelsFormat::Csv => load_labels_csv(&text).map_err(|e| {
            let list = text.trim_start().starts_with('[') && serde_json::from_str::<Vec<serde_json::Value>>(&text).is_ok();
            if list {
                LabelsError::JsonList { path: path.to_path_buf() }
            } else {
                e
            }
        }),
    }
}

/// Python's text-mode reading: `\r\n` and lone `\r` become `\n`.
fn universal_newlines(text: String) -> String {
    if !text.contains('\r') {
        return text;
    }
    text.replace("\r\n", "\n").replace('\r', "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(input: &str, human_label: f64, judge_score: Option<f64>) -> LabeledRecord {
        LabeledRecord {
            input: input.to_owned(),
            human_label,
            judge_score,
        }
    }

    fn problem(result: Result<Vec<LabeledRecord>, LabelsError>) -> (usize, RowProblem) {
        match result {
            Err(LabelsError::Row { line, problem, .. }) => (line, problem),
            other => panic!("expected a row error, got {other:?}"),
        }
    }

    #[test]
    fn csv_bad_rows_name_line_and_field() {
        let (line, p) = problem(load_labels_csv("input,human_label\na,1\nb\n"));
        assert_eq!((line, p), (3, RowProblem::TooFewColumns { found: 1 }));
        let (line, p) = problem(load_labels_csv("a,1,0.5\nb,high,0.5\n"));
        assert_eq!(
            (line, p),
            (
                2,
                RowProblem::NotANumber {
                    field: LabelField::HumanLabel,
                    value: "high".into()
                }
            )
        );
        let (line, p) = problem(load_labels_csv("a,1,0.5\nb,1,nan\n"));
        assert_eq!(
            (line, p),
            (
                2,
                RowProblem::NotFinite {
                    field: LabelField::JudgeScore,
                    value: "nan".into()
                }
            )
        );
        let err = load_labels_csv("a,1,0.5\nb,1,x\n").expect_err("bad judge score");
        assert!(
            err.to_string().starts_with("CSV line 2: judge_score \"x\" is not a number"),
            "{err}"
        );
        // A syntax error later in the file wins over an earlier bad value.
        let (line, p) = problem(load_labels_csv("a,x\nb,1\rc\n"));
        assert_eq!((line, p), (2, RowProblem::BareCarriageReturn));
    }

    #[test]
    fn csv_errors_for_empty_and_unlabelled_text() {
        assert_eq!(load_labels_csv(""), Err(LabelsError::EmptyCsv));
        for text in ["\n", "input,human_label\n", "# only a comment\n\n", "input,human_label,judge_score"] {
            assert_eq!(
                load_labels_csv(text),
                Err(LabelsError::NoLabeledRows { format: LabelsFormat::Csv }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn csv_header_comments_and_coercions() {
        let text = "text,score\n  # comment,1\n\n\"a, quoted\", 1_0 ,\nb,0.25, .5 \n\"#c\",1\nd,-0,1e-1,extra\n";
        let got = load_labels_csv(text).expect("valid");
        assert_eq!(
            got,
            [
                record("a, quoted", 10.0, None),
                record("b", 0.25, Some(0.5)),
                record("d", -0.0, Some(0.1)),
            ]
        );
        assert!(got[2].human_label.is_sign_negative());
        // No header when the first row's second column is a number.
        assert_eq!(load_labels_csv("x,1\n").expect("valid"), [record("x", 1.0, None)]);
        // A blank first row means no header detection at all.
        let (line, _) = problem(load_labels_csv("\ninput,human_label\n"));
        assert_eq!(line, 2);
    }

    #[test]
    fn jsonl_coercions_and_skips() {
        let text = "{\"input\": \"a\", \"human_label\": 1, \"judge_score\": 0.75}\n\n{}\r\n0\nnull\n[]\n\"\"\nfalse\n\
                    {\"human_label\": \"0.5\", \"judge_score\": null}\u{2028}{\"human_label\": true, \"judge_score\": false}\n\
                    {\"human_label\": -0, \"judge_score\": -0.0, \"human_label\": 0.3}\n";
        let got = load_labels_jsonl(text).expect("valid");
        assert_eq!(
            got,
            [
                record("a", 1.0, Some(0.75)),
                record("", 0.5, None),
                record("", 1.0, Some(0.0)),
                record("", 0.3, Some(-0.0)),
            ]
        );
        assert!(got[3].judge_score.is_some_and(f64::is_sign_negative));
        assert_eq!(
            load_labels_jsonl("{\"human_label\": -0}").expect("valid")[0].human_label.to_bits(),
            0
        );
    }

    #[test]
    fn jsonl_bad_rows_name_line_and_field() {
        let cases: &[(&str, usize, RowProblem)] = &[
            ("{\"input\": \"a\"}", 1, RowProblem::MissingHumanLabel),
            (
                "{\"human_label\": 1}\n{\"human_label\": null}",
                2,
                RowProblem::WrongType {
                    field: LabelField::HumanLabel,
                    found: "null",
                },
            ),
            (
                "{\"human_label\": \"yes\"}",
                1,
                RowProblem::NotANumber {
                    field: LabelField::HumanLabel,
                    value: "yes".into(),
                },
            ),
            (
                "{\"human_label\": 1, \"judge_score\": [1]}",
                1,
                RowProblem::WrongType {
                    field: LabelField::JudgeScore,
                    found: "an array",
                },
            ),
            (
                "{\"human_label\": 1e999}",
                1,
                RowProblem::NotFinite {
                    field: LabelField::HumanLabel,
                    value: "1e999".into(),
                },
            ),
            (
                "{\"human_label\": 1, \"input\": 7}",
                1,
                RowProblem::WrongType {
                    field: LabelField::Input,
                    found: "a number",
                },
            ),
            ("\n[1]", 2, RowProblem::NotAnObject { found: "an array" }),
        ];
        for (text, want_line, want) in cases {
            let (line, got) = problem(load_labels_jsonl(text));
            assert_eq!((line, &got), (*want_line, want), "{text:?}");
        }
        let (line, got) = problem(load_labels_jsonl("{\"human_label\": 1}\n{\"human_label\": NaN}"));
        assert_eq!(line, 2);
        assert!(matches!(got, RowProblem::InvalidJson { .. }), "{got:?}");
        // Rust strings cannot hold a lone surrogate: refused where it is read.
        let (line, got) = problem(load_labels_jsonl("{\"human_label\": 1, \"input\": \"\\ud800\"}"));
        assert_eq!(line, 1);
        assert!(matches!(got, RowProblem::InvalidJson { .. }), "{got:?}");
        assert!(load_labels_jsonl("{\"human_label\": 1, \"note\": \"\\ud800\"}").is_ok());
        assert_eq!(
            load_labels_jsonl("\n {} \n"),
            Err(LabelsError::NoLabeledRows {
                format: LabelsFormat::Jsonl
            })
        );
    }

    #[test]
    fn echoed_values_are_bounded() {
        let long = "x".repeat(10_000);
        let err = load_labels_csv(&format!("a,{long}\n")).expect_err("not a number");
        assert!(err.to_string().len() < 300, "{err}");
    }

    #[test]
    fn splitlines_matches_python() {
        assert_eq!(py_splitlines("a\u{b}b\u{1c}c\u{2028}d\u{85}e\r\nf"), ["a", "b", "c", "d", "e", "f"]);
        assert_eq!(py_splitlines("a\n\nb\r\r\n"), ["a", "", "b", ""]);
        assert!(py_splitlines("").is_empty());
    }

    #[test]
    fn load_labels_dispatches_and_translates_newlines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let csv = dir.path().join("labels.CSV");
        std::fs::write(&csv, "a,1\rb,0,0.5\r\n").expect("write");
        assert_eq!(
            load_labels(&csv).expect("valid"),
            [record("a", 1.0, None), record("b", 0.0, Some(0.5))]
        );
        let sniffed = dir.path().join("labels.txt");
        std::fs::write(&sniffed, "  {\"human_label\": 1}\n").expect("write");
        assert_eq!(load_labels(&sniffed).expect("valid"), [record("", 1.0, None)]);
        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, b"a,1\nb,\xff\n").expect("write");
        assert!(matches!(load_labels(&bad), Err(LabelsError::NotUtf8 { line: 2, .. })));
        let missing = dir.path().join("missing.csv");
        assert!(matches!(load_labels(&missing), Err(LabelsError::Read { .. })));
        // A JSON list is named as one, not reported as what CSV made of it.
        for name in ["labels.json", "labels.csv"] {
            let list = dir.path().join(name);
            std::fs::write(&list, "[{\"input\": \"GOOD\", \"human_label\": 1}]\n").expect("write");
            let e = load_labels(&list).expect_err("a list is not labels");
            assert!(matches!(e, LabelsError::JsonList { .. }), "{name}: {e:?}");
            assert!(e.to_string().contains("one object per line"), "{e}");
        }
    }
}
