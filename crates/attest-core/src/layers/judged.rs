//! The vocabulary layer 6 shares with its providers and its results: the
//! judge's bias probes and the audit trail of one judgement.

use serde::Serialize;

/// A judge bias probe (README, Bias probes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The unprobed judgement.
    None,
    Verbosity,
    Position,
    SelfPreference,
}

pub const PROBES: &[(&str, Probe)] = &[
    ("verbosity", Probe::Verbosity),
    ("position", Probe::Position),
    ("self_preference", Probe::SelfPreference),
];

impl Probe {
    pub fn name(self) -> &'static str {
        match self {
            Probe::None => "",
            Probe::Verbosity => "verbosity",
            Probe::Position => "position",
            Probe::SelfPreference => "self_preference",
        }
    }

    pub fn parse(name: &str) -> Option<Probe> {
        PROBES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }
}

/// One bias probe's outcome: `delta` is the probed score minus the unprobed one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BiasProbe {
    pub name: &'static str,
    pub score: f64,
    pub delta: f64,
}

/// The audit trail of one judgement (layer 6; the result's `judge_metadata`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JudgeMetadata {
    pub model: String,
    pub rubric_name: String,
    pub rubric_version: String,
    pub prompt_hash: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sample_scores: Vec<f64>,
    pub score_mean: f64,
    pub score_stddev: f64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub high_variance: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bias_probes: Vec<BiasProbe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<attest_calibration::JudgeAgreement>,
}
