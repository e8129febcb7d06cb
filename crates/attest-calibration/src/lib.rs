//! LLM-judge calibration: how well a judge agrees with human labels.
//!
//! This crate owns the statistics (agreement, Cohen's kappa, ROC-AUC), the
//! CSV/JSONL human-label formats and the prompt hash that keys stored
//! calibration results. Every result equals what the attest-ai Python SDK
//! (`attest.calibration`) computes on the same input, so reports from the
//! engine and from the SDK agree; the few deliberate differences (bad values
//! the SDK accepts and the engine rejects) are listed in `labels` and in
//! docs/calibration.md.

#![forbid(unsafe_code)]

mod agreement;
mod csv_reader;
mod labels;
mod pyfloat;

pub use agreement::{compute_agreement, AgreementError, JudgeAgreement, LabelPair, PairScore};
pub use labels::{
    detect_format, load_labels, load_labels_csv, load_labels_jsonl, LabelField, LabeledRecord, LabelsError, LabelsFormat, RowProblem,
    MAX_LABELS_FILE_BYTES,
};

use sha2::{Digest, Sha256};
use std::fmt::Write;

/// The judge prompt's identity: the first 8 bytes of the SHA-256 of its
/// UTF-8 bytes, as 16 lowercase hex digits. The text is hashed exactly as
/// given (no trimming, no Unicode normalisation), as the SDK does.
pub fn prompt_hash(prompt: &str) -> String {
    let digest = Sha256::digest(prompt.as_bytes());
    digest[..8].iter().fold(String::with_capacity(16), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_hash_is_a_sha256_prefix() {
        // SHA-256("") = e3b0c44298fc1c14...
        assert_eq!(prompt_hash(""), "e3b0c44298fc1c14");
        // SHA-256("abc") = ba7816bf8f01cfea...
        assert_eq!(prompt_hash("abc"), "ba7816bf8f01cfea");
        // Composed and decomposed "é" are different prompts.
        assert_ne!(prompt_hash("\u{e9}"), prompt_hash("e\u{301}"));
    }
}
