//! Drift: an assertion's identity across runs, statistics over its recent
//! scores, and the judgement of `threshold: "dynamic"`.
//!
//! Rows are keyed by a stable fingerprint of the assertion (type, canonical
//! spec without `soft`/`threshold`, and the trace's agent id), because SDKs
//! generate a fresh random `assertion_id` every run. Storing the scores is
//! the result history's job (`attest-history`); this module is the arithmetic.

use attest_trace::Status;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// An assertion's type and canonical spec, hashed once when it is compiled.
/// `soft` and `threshold` change how a score is judged, not the score, so
/// changing them keeps the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecDigest([u8; 32]);

impl SpecDigest {
    pub fn of(kind: &str, spec: Option<&serde_json::Value>) -> SpecDigest {
        let mut canonical = String::new();
        match spec {
            Some(serde_json::Value::Object(map)) => {
                let trimmed: serde_json::Map<String, serde_json::Value> = map
                    .iter()
                    .filter(|(k, _)| *k != "soft" && *k != "threshold")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                canonical_value(&serde_json::Value::Object(trimmed), &mut canonical);
            }
            Some(v) => canonical_value(v, &mut canonical),
            None => {}
        }
        let mut h = Sha256::new();
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(canonical.as_bytes());
        SpecDigest(h.finalize().into())
    }

    /// Results an SDK submitted for a plugin it ran itself (no agent).
    pub fn submitted(plugin_name: &str) -> SpecDigest {
        SpecDigest::of("plugin_result", Some(&serde_json::Value::String(plugin_name.to_owned())))
    }
}

/// A stable identity for an assertion across runs: its spec digest and the
/// trace's agent id. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    pub fn new(spec: &SpecDigest, agent_id: Option<&str>) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(spec.0);
        h.update(agent_id.unwrap_or_default().as_bytes());
        let digest = h.finalize();
        let mut out = [0; 16];
        out.copy_from_slice(&digest[..16]);
        Fingerprint(out)
    }

    /// The fingerprint of an assertion's type and spec, for a trace's agent.
    pub fn of(kind: &str, spec: Option<&serde_json::Value>, agent_id: Option<&str>) -> Fingerprint {
        Fingerprint::new(&SpecDigest::of(kind, spec), agent_id)
    }

    /// Identity of results an SDK submitted for a plugin it ran itself.
    pub fn submitted(plugin_name: &str) -> Fingerprint {
        Fingerprint::new(&SpecDigest::submitted(plugin_name), None)
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn parse(hex: &str) -> Option<Fingerprint> {
        // from_str_radix alone would accept a leading '+' in each pair.
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Fingerprint(out))
    }
}

/// JSON with object keys sorted at every level.
fn canonical_value(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                canonical_value(&map[k.as_str()], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_value(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `query_drift`'s `report`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftReport {
    pub assertion_id: String,
    pub fingerprint: Option<String>,
    pub mean: f64,
    pub stddev: f64,
    pub count: u64,
    pub latest_score: f64,
    pub deviation: f64,
    pub status: DriftStatus,
    pub window_size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftStatus {
    Ok,
    DriftDetected,
    NoData,
}

/// Population mean and standard deviation.
pub fn mean_stddev(scores: &[f64]) -> (f64, f64) {
    if scores.is_empty() {
        return (0.0, 0.0);
    }
    let n = scores.len() as f64;
    let mean = scores.iter().sum::<f64>() / n;
    let var = scores.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

impl DriftReport {
    /// Statistics over `scores`, most recent first. Drift: the latest score is
    /// more than one standard deviation below the window's mean.
    pub fn from_window(assertion_id: String, fingerprint: Option<Fingerprint>, scores: &[f64], window_size: u64) -> DriftReport {
        let (mean, stddev) = mean_stddev(scores);
        let latest = scores.first().copied().unwrap_or(0.0);
        let status = if scores.is_empty() {
            DriftStatus::NoData
        } else if stddev > 0.0 && latest < mean - stddev {
            DriftStatus::DriftDetected
        } else {
            DriftStatus::Ok
        };
        DriftReport {
            assertion_id,
            fingerprint: fingerprint.map(|f| f.hex()),
            mean,
            stddev,
            count: scores.len() as u64,
            latest_score: latest,
            deviation: if scores.is_empty() { 0.0 } else { latest - mean },
            status,
            window_size,
        }
    }
}

/// Scores at or above this pass the static band of a dynamic threshold.
pub const BAND_PASS: f64 = 0.8;
/// Scores at or above this (and below [`BAND_PASS`]) soft-fail it.
pub const BAND_SOFT: f64 = 0.5;

/// Judges `score` for an assertion with `threshold: "dynamic"`.
/// `history`: its earlier scores, newest first (`None`: history is off).
/// Returns the status and a sentence saying which rule applied.
pub fn dynamic_status(score: f64, history: Option<&[f64]>, min_samples: usize, soft: bool) -> (Status, String) {
    match history {
        Some(scores) if scores.len() >= min_samples => {
            let (mean, stddev) = mean_stddev(scores);
            let floor = mean - 2.0 * stddev;
            let status = if score >= floor {
                Status::Pass
            } else if soft {
                Status::SoftFail
            } else {
                Status::HardFail
            };
            let why = format!(
                "Dynamic threshold from history: score {score:.4} vs mean {mean:.4} - 2 x stddev {stddev:.4} = {floor:.4} over the last {} scores: {}.",
                scores.len(),
                status.as_str()
            );
            (status, why)
        }
        _ => {
            let status = if score >= BAND_PASS {
                Status::Pass
            } else if score >= BAND_SOFT {
                Status::SoftFail
            } else {
                Status::HardFail
            };
            let reason = match history {
                Some(scores) => format!("{} of the {min_samples} earlier scores needed are in history", scores.len()),
                None => "result history is off".to_owned(),
            };
            let why = format!(
                "Dynamic threshold, static band ({reason}): score {score:.4}; >= {BAND_PASS} passes, >= {BAND_SOFT} soft-fails, lower hard-fails: {}.",
                status.as_str()
            );
            (status, why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_ignore_key_order_soft_and_threshold_but_not_agent_or_values() {
        let a = Fingerprint::of(
            "content",
            Some(&json!({"check": "contains", "value": "x", "soft": true})),
            Some("bot"),
        );
        let b = Fingerprint::of(
            "content",
            Some(&json!({"soft": false, "threshold": 0.5, "value": "x", "check": "contains"})),
            Some("bot"),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            Fingerprint::of("content", Some(&json!({"check": "contains", "value": "y"})), Some("bot"))
        );
        assert_ne!(
            a,
            Fingerprint::of("content", Some(&json!({"check": "contains", "value": "x"})), Some("other"))
        );
        assert_ne!(
            a,
            Fingerprint::of("schema", Some(&json!({"check": "contains", "value": "x"})), Some("bot"))
        );
        assert_eq!(Fingerprint::parse(&a.hex()), Some(a));
        assert_eq!(Fingerprint::parse("zz"), None);
    }

    #[test]
    fn dynamic_threshold_uses_the_static_band_until_enough_history() {
        use Status;
        let few = [0.9; 9];
        assert_eq!(dynamic_status(0.85, Some(&few), 10, false).0, Status::Pass);
        assert_eq!(dynamic_status(0.6, Some(&few), 10, false).0, Status::SoftFail);
        let (s, why) = dynamic_status(0.3, Some(&few), 10, false);
        assert_eq!(s, Status::HardFail);
        assert!(why.contains("static band (9 of the 10 earlier scores needed"), "{why}");
        assert!(dynamic_status(0.9, None, 10, false).1.contains("history is off"));
        // Ten scores: mean 0.5, population stddev 0.1 -> floor 0.3.
        let ten = [0.4, 0.6, 0.4, 0.6, 0.4, 0.6, 0.4, 0.6, 0.4, 0.6];
        let (s, why) = dynamic_status(0.31, Some(&ten), 10, false);
        assert_eq!(s, Status::Pass, "0.31 is below the static band but within 2 sigma: {why}");
        assert!(why.contains("= 0.3000 over the last 10 scores"), "{why}");
        assert_eq!(dynamic_status(0.29, Some(&ten), 10, false).0, Status::HardFail);
        assert_eq!(dynamic_status(0.29, Some(&ten), 10, true).0, Status::SoftFail);
    }

    #[test]
    fn drift_statistics_are_over_the_window_newest_first() {
        // Newest first: 0.2 then 0.9 0.9 0.9; mean 0.725, population σ ≈ 0.3031.
        let r = DriftReport::from_window("a".into(), None, &[0.2, 0.9, 0.9, 0.9], 4);
        assert!((r.mean - 0.725).abs() < 1e-12);
        assert!((r.stddev - 0.303_108_891_324_553_7).abs() < 1e-12, "{}", r.stddev);
        assert_eq!((r.count, r.latest_score, r.status), (4, 0.2, DriftStatus::DriftDetected));
        assert!((r.deviation + 0.525).abs() < 1e-12);
        assert_eq!(DriftReport::from_window("a".into(), None, &[1.0, 1.0], 4).status, DriftStatus::Ok);
        assert_eq!(DriftReport::from_window("a".into(), None, &[], 4).status, DriftStatus::NoData);
    }
}
