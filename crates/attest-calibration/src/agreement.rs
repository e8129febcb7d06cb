//! Agreement between an LLM judge and human labels: percent agreement,
//! Cohen's kappa and ROC-AUC over (human, judge) score pairs.
//!
//! The arithmetic mirrors the attest-ai SDK's `compute_agreement` operation
//! by operation, so both sides produce bit-identical floats:
//! counts are exact integers, every integer ratio is rounded once (as
//! Python's `int / int` is, see [`exact_ratio`]), and the remaining float
//! operations run in the SDK's order.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One labelled example: the human's score and the judge's score, both
/// normally in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LabelPair {
    pub human: f64,
    pub judge: f64,
}

/// Calibration summary of a judge configuration, in the wire shape of the
/// SDK's `JudgeAgreement` (the `calibration` member of judge metadata).
///
/// `roc_auc` is `0.0` when it is undefined (only one human class present)
/// and is then left out of the JSON, as the SDK does; a missing member reads
/// back as `0.0`. A judge that ranks every negative above every positive also
/// has an AUC of exactly `0.0`, which the format cannot tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JudgeAgreement {
    /// Number of pairs the statistics were computed over.
    #[serde(default)]
    pub label_count: u64,
    /// Fraction of pairs where judge and human fall on the same side of the threshold.
    #[serde(default)]
    pub agreement: f64,
    /// Cohen's kappa; `0.0` when chance agreement is 1 (both raters constant and equal).
    #[serde(default)]
    pub cohen_kappa: f64,
    /// Mann-Whitney ROC-AUC of the judge score against the binarised human label.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub roc_auc: f64,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// Which score of a pair is meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairScore {
    Human,
    Judge,
}

impl PairScore {
    fn as_str(self) -> &'static str {
        match self {
            PairScore::Human => "human",
            PairScore::Judge => "judge",
        }
    }
}

/// Why agreement could not be computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AgreementError {
    /// No pairs were given.
    NoPairs,
    /// The threshold is not strictly between 0 and 1 (or is NaN).
    ThresholdOutOfRange { threshold: f64 },
    /// A score is NaN or infinite.
    NonFiniteScore { index: usize, score: PairScore, value: f64 },
}

impl fmt::Display for AgreementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgreementError::NoPairs => {
                write!(f, "no labeled pairs available: give at least one (human, judge) pair")
            }
            AgreementError::ThresholdOutOfRange { threshold } => {
                write!(f, "threshold must be in (0, 1), got {threshold}: pick a value such as 0.5")
            }
            AgreementError::NonFiniteScore { index, score, value } => write!(
                f,
                "pair {index}: {} score is {value}; scores must be finite numbers, normally in [0, 1]",
                score.as_str()
            ),
        }
    }
}

impl std::error::Error for AgreementError {}

/// Computes agreement, Cohen's kappa and ROC-AUC of `pairs`, each score
/// binarised as positive when `>= threshold`.
///
/// Matches the SDK's `compute_agreement` bit for bit, including its
/// conventions: kappa is `0.0` when chance agreement is 1, ROC-AUC is `0.0`
/// when all humans fall in one class, tied judge scores share their mean
/// rank. Unlike the SDK, a NaN threshold and non-finite scores are rejected:
/// for a NaN threshold the SDK returns all-zero statistics, and for a NaN
/// judge score with both human classes present it never returns (its tie
/// loop stops advancing).
pub fn compute_agreement(pairs: &[LabelPair], threshold: f64) -> Result<JudgeAgreement, AgreementError> {
    if pairs.is_empty() {
        return Err(AgreementError::NoPairs);
    }
    if !(threshold > 0.0 && threshold < 1.0) {
        return Err(AgreementError::ThresholdOutOfRange { threshold });
    }
    for (index, pair) in pairs.iter().enumerate() {
        for (score, value) in [(PairScore::Human, pair.human), (PairScore::Judge, pair.judge)] {
            if !value.is_finite() {
                return Err(AgreementError::NonFiniteScore { index, score, value });
            }
        }
    }

    let n = pairs.len() as u128;
    let mut human_pos: u128 = 0;
    let mut judge_pos: u128 = 0;
    let mut agree: u128 = 0;
    for pair in pairs {
        let human = pair.human >= threshold;
        let judge = pair.judge >= threshold;
        human_pos += u128::from(human);
        judge_pos += u128::from(judge);
        agree += u128::from(human == judge);
    }
    let human_neg = n - human_pos;
    let judge_neg = n - judge_pos;

    let agreement = exact_ratio(agree, n);
    let expected = exact_ratio(human_pos * judge_pos + human_neg * judge_neg, n * n);
    let cohen_kappa = if expected < 1.0 {
        (agreement - expected) / (1.0 - expected)
    } else {
        0.0
    };

    Ok(JudgeAgreement {
        label_count: pairs.len() as u64,
        agreement,
        cohen_kappa,
        roc_auc: roc_auc(pairs, threshold),
    })
}

/// Mann-Whitney ROC-AUC with mid-ranks for tied judge scores; `0.0` when
/// only one human class is present.
fn roc_auc(pairs: &[LabelPair], threshold: f64) -> f64 {
    let mut rows: Vec<(f64, bool)> = pairs.iter().map(|p| (p.judge, p.human >= threshold)).collect();
    let pos = rows.iter().filter(|(_, positive)| *positive).count() as u128;
    let neg = rows.len() as u128 - pos;
    if pos == 0 || neg == 0 {
        return 0.0;
    }
    // Scores are finite here; total_cmp only separates -0.0 from 0.0, which
    // stay adjacent and are grouped as equal below, as Python groups them.
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut rank_sum_pos = 0.0_f64;
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        while end < rows.len() && rows[end].0 == rows[start].0 {
            end += 1;
        }
        // Ranks are 1-based: the group spans ranks start+1 ..= end.
        let mean_rank = exact_ratio((start + end + 1) as u128, 2);
        for row in &rows[start..end] {
            if row.1 {
                rank_sum_pos += mean_rank;
            }
        }
        start = end;
    }

    let u = rank_sum_pos - exact_ratio(pos * (pos + 1), 2);
    let auc = u / (pos * neg) as f64;
    if auc.is_finite() {
        auc
    } else {
        0.0
    }
}

/// `num / den` rounded once to the nearest `f64` (ties to even), as Python's
/// true division of two integers is. Converting both to `f64` first would
/// round up to three times once either exceeds 2^53 (from about 95 million
/// pairs on, for `n * n`).
pub(crate) fn exact_ratio(num: u128, den: u128) -> f64 {
    debug_assert!(den > 0);
    const EXACT: u128 = 1 << 53;
    if num <= EXACT && den <= EXACT {
        return num as f64 / den as f64;
    }
    if num == 0 {
        return 0.0;
    }
    // Long division producing 54 quotient bits (53 significant + 1 rounding)
    // after scaling so the first quotient bit is 1; the remainder is sticky.
    let mut scale: i32 = 0;
    let (mut rem, mut den_scaled) = (num, den);
    // Bring rem / den_scaled into [1, 2). No step overflows u128: a slice of
    // 16-byte pairs has fewer than 2^60 elements, so operands are below
    // 2^120 and the doubled remainders below stay under 2^122.
    while rem < den_scaled {
        rem <<= 1;
        scale -= 1;
    }
    while rem >= den_scaled << 1 {
        den_scaled <<= 1;
        scale += 1;
    }
    let mut quotient: u64 = 0;
    for _ in 0..54 {
        quotient <<= 1;
        if rem >= den_scaled {
            quotient |= 1;
            rem -= den_scaled;
        }
        rem <<= 1;
    }
    let sticky = rem != 0;
    let round_bit = quotient & 1 == 1;
    let mut mantissa = quotient >> 1;
    if round_bit && (sticky || mantissa & 1 == 1) {
        mantissa += 1;
    }
    // mantissa has 53 bits (or 2^53 after rounding up): value = mantissa * 2^(scale - 52).
    mantissa as f64 * power_of_two(scale - 52)
}

/// `2^exp` for exponents in the normal range, built from its bit pattern.
fn power_of_two(exp: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&exp));
    f64::from_bits(((1023 + exp) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(raw: &[(f64, f64)]) -> Vec<LabelPair> {
        raw.iter().map(|&(human, judge)| LabelPair { human, judge }).collect()
    }

    #[test]
    fn bad_input_is_rejected_first() {
        assert_eq!(compute_agreement(&[], 0.5), Err(AgreementError::NoPairs));
        assert_eq!(compute_agreement(&[], f64::NAN), Err(AgreementError::NoPairs));
        let one = pairs(&[(1.0, 1.0)]);
        for threshold in [0.0, 1.0, -0.5, 2.0, f64::INFINITY] {
            assert_eq!(
                compute_agreement(&one, threshold),
                Err(AgreementError::ThresholdOutOfRange { threshold })
            );
        }
        assert!(matches!(
            compute_agreement(&one, f64::NAN),
            Err(AgreementError::ThresholdOutOfRange { threshold }) if threshold.is_nan()
        ));
        let bad = pairs(&[(1.0, 1.0), (0.2, f64::INFINITY)]);
        assert_eq!(
            compute_agreement(&bad, 0.5),
            Err(AgreementError::NonFiniteScore {
                index: 1,
                score: PairScore::Judge,
                value: f64::INFINITY
            })
        );
        let message = AgreementError::ThresholdOutOfRange { threshold: 1.0 }.to_string();
        assert!(message.contains("(0, 1)"), "{message}");
    }

    #[test]
    fn perfect_judge() {
        let got = compute_agreement(&pairs(&[(1.0, 0.9), (0.0, 0.1), (1.0, 0.8), (0.0, 0.3)]), 0.5).expect("valid");
        assert_eq!(
            got,
            JudgeAgreement {
                label_count: 4,
                agreement: 1.0,
                cohen_kappa: 1.0,
                roc_auc: 1.0
            }
        );
    }

    #[test]
    fn mixed_judge_keeps_the_sdk_rounding() {
        // Values from attest-ai 0.9.0 on the same pairs; kappa is not 1/3
        // because (2/3 - 1/2) / (1 - 1/2) rounds in doubles.
        let got = compute_agreement(
            &pairs(&[(1.0, 0.9), (0.0, 0.1), (1.0, 0.4), (0.0, 0.6), (1.0, 0.8), (0.0, 0.3)]),
            0.5,
        )
        .expect("valid");
        assert_eq!(got.label_count, 6);
        assert_eq!(got.agreement, 0.6666666666666666);
        assert_eq!(got.cohen_kappa, 0.33333333333333326);
        assert_eq!(got.roc_auc, 0.8888888888888888);
        assert_eq!(
            serde_json::to_string(&got).expect("serialise"),
            r#"{"label_count":6,"agreement":0.6666666666666666,"cohen_kappa":0.33333333333333326,"roc_auc":0.8888888888888888}"#
        );
    }

    #[test]
    fn inverted_judge_disagrees_everywhere() {
        let got = compute_agreement(&pairs(&[(1.0, 0.1), (0.0, 0.9), (1.0, 0.2), (0.0, 0.7)]), 0.5).expect("valid");
        assert_eq!(got.agreement, 0.0);
        assert_eq!(got.cohen_kappa, -1.0);
        assert_eq!(got.roc_auc, 0.0);
        assert_eq!(
            serde_json::to_value(got).expect("serialise"),
            serde_json::json!({"label_count": 4, "agreement": 0.0, "cohen_kappa": -1.0})
        );
    }

    #[test]
    fn single_class_has_no_auc_and_zero_kappa() {
        let got = compute_agreement(&pairs(&[(0.9, 0.8), (0.7, 0.6), (1.0, 0.95)]), 0.5).expect("valid");
        assert_eq!(got.agreement, 1.0);
        assert_eq!(got.cohen_kappa, 0.0, "chance agreement is 1");
        assert_eq!(got.roc_auc, 0.0);
    }

    #[test]
    fn ties_share_mean_ranks() {
        // Judge scores all equal: every positive/negative comparison is a tie.
        let got = compute_agreement(&pairs(&[(1.0, 0.5), (0.0, 0.5), (1.0, 0.5), (0.0, 0.5)]), 0.5).expect("valid");
        assert_eq!(got.roc_auc, 0.5);
        // -0.0 and 0.0 are one tie group.
        let got = compute_agreement(&pairs(&[(1.0, 0.0), (0.0, -0.0), (1.0, 0.9)]), 0.5).expect("valid");
        assert_eq!(got.roc_auc, 0.75);
    }

    #[test]
    fn judge_agreement_reads_missing_members_as_zero() {
        let got: JudgeAgreement = serde_json::from_str(r#"{"label_count": 3, "agreement": 0.5}"#).expect("parse");
        assert_eq!(got.cohen_kappa, 0.0);
        assert_eq!(got.roc_auc, 0.0);
    }

    #[test]
    fn exact_ratio_rounds_once() {
        for (num, den) in [(1u128, 3u128), (2, 3), (7, 10), (123_456_789, 987_654_321), (0, 5), (5, 5)] {
            assert_eq!(exact_ratio(num, den).to_bits(), (num as f64 / den as f64).to_bits());
        }
        // Beyond 2^53 converting each operand first can round differently;
        // expected values are Python's `a / b` on these integers.
        let python: [(u128, u128, f64); 3] = [
            (1006642152510490784245, 1168305260038376058917, 0.8616259696352175),
            (574042296803287381052, 1689138587812685849472, 0.3398432200561064),
            (929357882944010505243, 2074787419275481998664, 0.44792920677557574),
        ];
        for (num, den, want) in python {
            assert_ne!((num as f64 / den as f64).to_bits(), want.to_bits(), "case must need exact division");
            assert_eq!(exact_ratio(num, den).to_bits(), want.to_bits());
        }
        let big = 1u128 << 60;
        assert_eq!(exact_ratio(big * 3, big * 4), 0.75);
        assert_eq!(exact_ratio(big, big), 1.0);
        // (2^54 + 1) / 2 = 2^53 + 0.5: a tie, rounds to even 2^53.
        assert_eq!(exact_ratio((1 << 54) + 1, 2), 2f64.powi(53));
        // (2^54 + 3) / 2 = 2^53 + 1.5: rounds up to 2^53 + 2.
        assert_eq!(exact_ratio((1 << 54) + 3, 2), 2f64.powi(53) + 2.0);
    }
}
