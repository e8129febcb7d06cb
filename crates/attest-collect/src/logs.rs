//! OTLP logs (`POST /v1/logs`, and the gRPC `LogsService`): the GenAI
//! events instrumentations send as log records instead of span attributes
//! (`opentelemetry-instrumentation-openai-v2` with message capture set to
//! `event_only` or `span_and_event`: `gen_ai.user.message`, `gen_ai.choice`,
//! `gen_ai.client.inference.operation.details`, ...).
//!
//! A GenAI event is joined to the span it names (its trace and span id) and
//! read there as one of the span's events. Nothing else of a log request is
//! stored: records that are no GenAI event, or that name no span, are
//! counted (`attest_collect_log_records_ignored_total`) and let go.
//!
//! On their way, events travel through the assembler as spans of their own
//! ([`Span::log_event`]), so that the trace's settle time, byte and span
//! bounds and late-arrival rules hold for them as for spans; the
//! conversion moves them onto their span.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse};
use prost::Message;
use serde_json::{Map, Value};

use crate::otlp::{
    any_to_json, attributes_to_json, hex, json_size, BadPayload, Encoding, Span, SpanEvent, DECODED_PER_REQUEST_BYTE, SPAN_BYTES,
};

/// What one log request holds for the assembler.
#[derive(Debug, Default)]
pub struct DecodedLogs {
    /// GenAI events, each as a span carrying it (see the module docs).
    pub events: Vec<Span>,
    /// Records that are no GenAI event or name no span.
    pub ignored: u64,
}

/// Whether a log record's event name is a GenAI event.
fn is_genai(name: &str) -> bool {
    name.starts_with("gen_ai.")
}

pub fn decode(body: &[u8], encoding: Encoding, max_request_bytes: usize) -> Result<DecodedLogs, BadPayload> {
    let budget = (max_request_bytes as u64).saturating_mul(DECODED_PER_REQUEST_BYTE);
    let fits = match encoding {
        Encoding::Protobuf => crate::elements::protobuf_logs(body, budget).is_ok(),
        Encoding::Json => crate::elements::json(body, budget / 128).is_ok(),
    };
    if !fits {
        return Err(BadPayload(format!(
            "the request's log records, attributes and values would decode to more than {} MiB ({DECODED_PER_REQUEST_BYTE} × --max-request-bytes): send smaller batches",
            budget >> 20
        )));
    }
    let request = match encoding {
        Encoding::Protobuf => crate::otlp::decode_clipping::<ExportLogsServiceRequest>(body, true)
            .map_err(|e| BadPayload(format!("body is not an OTLP ExportLogsServiceRequest protobuf: {e}")))?,
        Encoding::Json => serde_json::from_slice::<ExportLogsServiceRequest>(body).map_err(|e| {
            BadPayload(format!(
                "body is not an OTLP/JSON ExportLogsServiceRequest: {}",
                crate::bounded(&e.to_string(), 200)
            ))
        })?,
    };
    Ok(flatten(request))
}

fn flatten(request: ExportLogsServiceRequest) -> DecodedLogs {
    let mut out = DecodedLogs::default();
    let mut n = 0u64;
    for resource_logs in request.resource_logs {
        let resource = Arc::new(resource_logs.resource.map(|r| attributes_to_json(r.attributes)).unwrap_or_default());
        for scope_logs in resource_logs.scope_logs {
            let scope: Arc<str> = scope_logs.scope.map(|s| s.name).unwrap_or_default().into();
            for record in scope_logs.log_records {
                let mut attributes = attributes_to_json(record.attributes);
                let name = if record.event_name.is_empty() {
                    attributes.get("event.name").and_then(Value::as_str).unwrap_or("").to_owned()
                } else {
                    record.event_name.clone()
                };
                let joinable = record.trace_id.len() == 16
                    && record.span_id.len() == 8
                    && record.trace_id.iter().any(|b| *b != 0)
                    && record.span_id.iter().any(|b| *b != 0);
                if !is_genai(&name) || !joinable {
                    out.ignored += 1;
                    continue;
                }
                if record.body.is_some() {
                    attributes.insert("body".into(), any_to_json(record.body));
                }
                let span_id = hex(&record.span_id);
                let time = if record.time_unix_nano != 0 {
                    record.time_unix_nano
                } else {
                    record.observed_time_unix_nano
                };
                n += 1;
                let size = SPAN_BYTES + name.len() + json_size(&attributes);
                out.events.push(Span {
                    trace_id: hex(&record.trace_id),
                    // Unique per record and stable across an exporter's
                    // retries, so a record sent twice is kept once.
                    span_id: format!("{span_id}/log/{time}/{n}"),
                    parent_span_id: Some(span_id),
                    parent_is_remote: false,
                    name: name.clone(),
                    start_unix_nanos: time,
                    end_unix_nanos: time,
                    attributes: Map::new(),
                    events: vec![SpanEvent { name, attributes }],
                    resource: resource.clone(),
                    scope: scope.clone(),
                    log_event: true,
                    is_error: false,
                    size_bytes: size,
                });
            }
        }
    }
    out
}

/// Moves the GenAI events that came as log records onto the spans they
/// name, in time order after the span's own events. `None` when the trace
/// has none (nothing to copy); events whose span never came are dropped.
pub fn join(spans: &[Span]) -> Option<Vec<Span>> {
    if !spans.iter().any(|s| s.log_event) {
        return None;
    }
    let mut out: Vec<Span> = spans.iter().filter(|s| !s.log_event).cloned().collect();
    let index: std::collections::HashMap<String, usize> = out.iter().enumerate().map(|(i, s)| (s.span_id.clone(), i)).collect();
    let mut events: Vec<&Span> = spans.iter().filter(|s| s.log_event).collect();
    events.sort_by_key(|s| s.start_unix_nanos);
    for e in events {
        if let Some(&i) = e.parent_span_id.as_ref().and_then(|p| index.get(p)) {
            out[i].events.extend(e.events.iter().cloned());
        }
    }
    Some(out)
}

/// Body of a success (or partial success) response in the request's encoding.
pub fn success_body(encoding: Encoding, rejected: u64, message: Option<String>) -> Vec<u8> {
    let response = ExportLogsServiceResponse {
        partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: rejected as i64,
            error_message: message.unwrap_or_default(),
        }),
    };
    match encoding {
        Encoding::Protobuf => response.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec()),
    }
}
