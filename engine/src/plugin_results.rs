//! `submit_plugin_result`: results an SDK computed itself (Attest protocol v1 §2.4),
//! validated and recorded against their trace.
//!
//! Records are kept in memory, newest last, up to a configured number and
//! a configured number of bytes; the oldest are dropped first and counted.
//! Each record is itself bounded: ids of at most 256 bytes, an explanation
//! clipped to 4,096 characters, metadata of at most 16 KiB.

use crate::layers::Status;
use crate::params::{Members, Wording};
use crate::protocol::{Method, RpcError};
use crate::text::clip;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginResult {
    pub trace_id: String,
    pub plugin_name: String,
    pub assertion_id: String,
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

pub struct PluginResults {
    max: usize,
    max_bytes: usize,
    items: Mutex<Store>,
}

#[derive(Default)]
struct Store {
    items: VecDeque<(PluginResult, usize)>,
    bytes: usize,
    dropped: u64,
}

/// Longest id accepted (`trace_id`, `plugin_name`, `assertion_id`), as in `evaluate_batch`.
pub const MAX_ID_BYTES: usize = 256;
/// Largest `result.metadata`, serialised.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

impl PluginResult {
    /// Bytes the record holds in memory, roughly.
    fn size(&self) -> usize {
        let metadata = self.metadata.as_ref().map_or(0, |m| 2 * m.to_string().len());
        128 + self.trace_id.len() + self.plugin_name.len() + self.assertion_id.len() + self.explanation.len() + metadata
    }
}

#[derive(Debug, Serialize)]
pub struct Accepted {
    pub accepted: bool,
}

impl PluginResults {
    pub fn new(max: usize, max_bytes: usize) -> PluginResults {
        PluginResults {
            max: max.max(1),
            max_bytes: max_bytes.max(1),
            items: Mutex::new(Store::default()),
        }
    }

    pub fn record(&self, r: PluginResult) {
        let size = r.size();
        let mut store = self.items.lock().unwrap_or_else(|e| e.into_inner());
        while !store.items.is_empty() && (store.items.len() >= self.max || store.bytes + size > self.max_bytes) {
            if let Some((_, old)) = store.items.pop_front() {
                store.bytes -= old;
            }
            store.dropped += 1;
            if store.dropped.is_power_of_two() {
                tracing::warn!(
                    max = self.max,
                    max_bytes = self.max_bytes,
                    dropped = store.dropped,
                    "plugin result store full; dropped the oldest results"
                );
            }
        }
        store.bytes += size;
        store.items.push_back((r, size));
    }

    /// Every recorded result for `trace_id`, oldest first.
    pub fn for_trace(&self, trace_id: &str) -> Vec<PluginResult> {
        let store = self.items.lock().unwrap_or_else(|e| e.into_inner());
        store
            .items
            .iter()
            .map(|(r, _)| r)
            .filter(|r| r.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Every recorded result, oldest first.
    pub fn all(&self) -> Vec<PluginResult> {
        let store = self.items.lock().unwrap_or_else(|e| e.into_inner());
        store.items.iter().map(|(r, _)| r.clone()).collect()
    }

    /// Results dropped to stay within the bounds.
    pub fn dropped(&self) -> u64 {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).dropped
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

const SHAPE: &str = "Send {\"trace_id\": str, \"plugin_name\": str, \"assertion_id\": str, \"result\": {\"status\": \"pass\"|\"soft_fail\"|\"hard_fail\", \"score\": 0.0-1.0, \"explanation\": str, \"metadata\"?: object}}.";

/// Validates `submit_plugin_result` params into a record.
pub fn parse(params: Option<&RawValue>) -> Result<PluginResult, RpcError> {
    let map: Map<String, Value> = crate::params::object(
        Method::SubmitPluginResult,
        params,
        &["trace_id", "plugin_name", "assertion_id", "result"],
    )?;
    let p = Members::new(Method::SubmitPluginResult, &map, SHAPE, Wording::Method);
    // Blank ids would name nothing in a report.
    let id = |key: &str| match p.required(key, |m, k| m.id(k, MAX_ID_BYTES))? {
        s if s.trim().is_empty() => Err(p.must_be(key, "a non-empty string")),
        s => Ok(s.to_owned()),
    };
    let trace_id = id("trace_id")?;
    let plugin_name = id("plugin_name")?;
    let assertion_id = id("assertion_id")?;
    let result = p.required("result", Members::object)?;
    const STATUSES: &str = "one of pass, soft_fail, hard_fail";
    let status = match result.get("status") {
        None => return Err(result.missing("status")),
        Some(Value::String(s)) => Status::parse(s).ok_or_else(|| {
            result.error(
                "status",
                format!("submit_plugin_result result.status '{}' is not {STATUSES}", clip(s, 60)),
            )
        })?,
        Some(_) => return Err(result.must_be("status", STATUSES)),
    };
    let score = match result.get("score") {
        None => return Err(result.missing("score")),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|x| (0.0..=1.0).contains(x))
            .ok_or_else(|| result.error("score", format!("submit_plugin_result result.score {n} is outside [0, 1]")))?,
        Some(_) => return Err(result.must_be("score", "a number in [0, 1]")),
    };
    let explanation = clip(result.required("explanation", Members::string)?, 4096);
    let metadata = match result.get("metadata") {
        None => None,
        Some(m @ Value::Object(_)) => {
            let size = m.to_string().len();
            if size > MAX_METADATA_BYTES {
                return Err(result.error(
                    "metadata",
                    format!("submit_plugin_result result.metadata is too large: {size} > {MAX_METADATA_BYTES} bytes"),
                ));
            }
            Some(m.clone())
        }
        Some(_) => return Err(result.must_be("metadata", "an object")),
    };
    Ok(PluginResult {
        trace_id,
        plugin_name,
        assertion_id,
        status,
        score,
        explanation,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ErrorCode;
    use serde_json::json;

    fn p(v: Value) -> Result<PluginResult, RpcError> {
        let raw = RawValue::from_string(v.to_string()).unwrap();
        parse(Some(&raw))
    }

    fn good() -> Value {
        json!({"trace_id": "t", "plugin_name": "safety", "assertion_id": "a1",
               "result": {"status": "pass", "score": 0.88, "explanation": "ok", "metadata": {"v": 1}, "cost": 0.0}})
    }

    #[test]
    fn accepts_the_spec_example() {
        let r = p(good()).unwrap();
        assert_eq!(r.status, Status::Pass);
        assert_eq!(r.score, 0.88);
    }

    #[test]
    fn rejects_bad_fields_by_name() {
        let cases = [
            ("/result/status", json!("passed"), "params.result.status"),
            ("/result/score", json!(1.5), "params.result.score"),
            ("/result/score", json!("high"), "params.result.score"),
            ("/trace_id", json!(""), "params.trace_id"),
            ("/result/explanation", json!(null), "params.result.explanation"),
            ("/result/metadata", json!([1]), "params.result.metadata"),
        ];
        for (ptr, value, field) in cases {
            let mut v = good();
            *v.pointer_mut(ptr).unwrap() = value;
            let e = p(v).unwrap_err();
            assert_eq!(e.code, ErrorCode::AssertionError);
            assert_eq!(e.field.as_deref(), Some(field), "{}", e.message);
        }
        assert!(p(json!({"bad": true})).is_err());
    }

    #[test]
    fn store_is_bounded_and_queryable() {
        let store = PluginResults::new(2, usize::MAX);
        for id in ["a", "b", "c"] {
            let mut r = p(good()).unwrap();
            r.assertion_id = id.into();
            store.record(r);
        }
        let kept: Vec<String> = store.for_trace("t").into_iter().map(|r| r.assertion_id).collect();
        assert_eq!(kept, ["b", "c"]);
    }
}
