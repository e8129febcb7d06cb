//! Decoding OTLP/HTTP trace export requests (protobuf or JSON, optionally
//! gzip-compressed) into flat [`Span`]s, and encoding the responses the OTLP
//! specification prescribes. The protobuf and JSON types come from the
//! `opentelemetry-proto` crate; nothing here parses the wire format by hand.

use std::io::Read;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use serde_json::{Map, Value};

/// Request body encodings the receiver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    /// From a `Content-Type` header; `None` for anything else.
    pub fn from_content_type(content_type: &str) -> Option<Encoding> {
        let mime = content_type.split(';').next().unwrap_or("").trim();
        match mime.to_ascii_lowercase().as_str() {
            "application/x-protobuf" | "application/protobuf" => Some(Encoding::Protobuf),
            "application/json" => Some(Encoding::Json),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// A span event (older GenAI conventions carry prompts and completions in events).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub name: String,
    pub attributes: Map<String, Value>,
}

/// One span, flattened out of the OTLP resource/scope nesting.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Lower-case hex, 32 characters.
    pub trace_id: String,
    /// Lower-case hex, 16 characters.
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Map<String, Value>,
    pub events: Vec<SpanEvent>,
    /// Resource attributes (`service.name`, ...), shared by the spans of one resource.
    pub resource: Arc<Map<String, Value>>,
    pub is_error: bool,
    /// Approximate memory held, used for the assembler's byte bounds.
    pub size_bytes: usize,
}

impl Span {
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    pub fn duration_ms(&self) -> u64 {
        self.end_unix_nanos.saturating_sub(self.start_unix_nanos) / 1_000_000
    }
}

/// The request could not be read at all (answered with 400).
#[derive(Debug, Clone, PartialEq)]
pub struct BadPayload(pub String);

impl std::fmt::Display for BadPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Spans decoded from one request, plus those refused individually (partial success).
#[derive(Debug, Default)]
pub struct Decoded {
    pub spans: Vec<Span>,
    pub rejected: u64,
    pub reject_reason: Option<String>,
}

/// What a request may decode to, per byte of `--max-request-bytes`: ordinary
/// spans decode to 1–4 times their wire size, float arrays (embeddings) to
/// about 6; an empty span event, two bytes of protobuf, to some 60.
pub const DECODED_PER_REQUEST_BYTE: u64 = 8;

/// Undoes `Content-Encoding: gzip`, refusing bodies that inflate past `max_bytes`.
pub fn decompress(body: &[u8], content_encoding: Option<&str>, max_bytes: usize) -> Result<Vec<u8>, BadPayload> {
    match content_encoding.map(|e| e.trim().to_ascii_lowercase()) {
        None => Ok(body.to_vec()),
        Some(e) if e.is_empty() || e == "identity" => Ok(body.to_vec()),
        Some(e) if e == "gzip" => {
            let mut out = Vec::new();
            let mut reader = flate2::read::GzDecoder::new(body).take(max_bytes as u64 + 1);
            reader
                .read_to_end(&mut out)
                .map_err(|e| BadPayload(format!("gzip body could not be inflated: {e}")))?;
            if out.len() > max_bytes {
                return Err(BadPayload(format!(
                    "gzip body inflates past the {max_bytes}-byte request limit; send smaller batches"
                )));
            }
            Ok(out)
        }
        Some(other) => Err(BadPayload(format!(
            "Content-Encoding '{}' is not supported; valid choices: gzip, identity",
            crate::bounded(&other, 64)
        ))),
    }
}

/// Decodes an `ExportTraceServiceRequest` body.
/// Decodes a request of a receiver whose `--max-request-bytes` is
/// `max_request_bytes`, refusing one that would decode to more memory than
/// [`DECODED_PER_REQUEST_BYTE`] times that (see [`crate::elements`]).
pub fn decode(body: &[u8], encoding: Encoding, max_request_bytes: usize) -> Result<Decoded, BadPayload> {
    let budget = (max_request_bytes as u64).saturating_mul(DECODED_PER_REQUEST_BYTE);
    let fits = match encoding {
        Encoding::Protobuf => crate::elements::protobuf(body, budget).is_ok(),
        // A JSON object or array decodes to one message, some 100 bytes.
        Encoding::Json => crate::elements::json(body, budget / 128).is_ok(),
    };
    if !fits {
        return Err(BadPayload(format!(
            "the request's spans, events, links, attributes and values would decode to more than {} MiB ({DECODED_PER_REQUEST_BYTE} × --max-request-bytes): they are too many for its size; send smaller batches",
            budget >> 20
        )));
    }
    let request = match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(body)
            .map_err(|e| BadPayload(format!("body is not an OTLP ExportTraceServiceRequest protobuf: {e}")))?,
        Encoding::Json => decode_json(body)?,
    };
    Ok(flatten(request))
}

/// OTLP/JSON: an object (serde would also take a list of its fields). Ids
/// that are not hex strings fail the typed decoding; such a request is
/// decoded again with those ids blanked, so that only their spans are
/// rejected (as for ids of a wrong length) and the rest of the request is
/// kept.
fn decode_json(body: &[u8]) -> Result<ExportTraceServiceRequest, BadPayload> {
    let not_otlp = |e: serde_json::Error| {
        BadPayload(format!(
            "body is not OTLP/JSON ExportTraceServiceRequest: {}",
            crate::bounded(&e.to_string(), 300)
        ))
    };
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BadPayload(
            "body is not OTLP/JSON ExportTraceServiceRequest: it must be a JSON object ({\"resourceSpans\": [...]})".into(),
        ));
    }
    let typed_error = match serde_json::from_slice::<ExportTraceServiceRequest>(body) {
        Ok(request) => return Ok(request),
        Err(e) => e,
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return Err(not_otlp(typed_error));
    };
    if !blank_bad_ids(&mut value) {
        return Err(not_otlp(typed_error));
    }
    serde_json::from_value(value).map_err(|_| not_otlp(typed_error))
}

/// Replaces span ids that are not hex strings with ones the span checks
/// reject: an empty trace or span id, a one-byte parent span id (an empty
/// parent would make the span a root). Returns whether any was replaced.
fn blank_bad_ids(request: &mut Value) -> bool {
    let is_hex = |v: &Value| match v {
        Value::String(s) => s.len() % 2 == 0 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        Value::Null => true,
        _ => false,
    };
    let mut replaced = false;
    for resource in field_items(request, "resourceSpans", "resource_spans") {
        for scope in field_items(resource, "scopeSpans", "scope_spans") {
            for span in field_items(scope, "spans", "spans") {
                let Some(span) = span.as_object_mut() else { continue };
                for (camel, snake, blank) in [
                    ("traceId", "trace_id", ""),
                    ("spanId", "span_id", ""),
                    ("parentSpanId", "parent_span_id", "00"),
                ] {
                    for key in [camel, snake] {
                        if let Some(id) = span.get_mut(key) {
                            if !is_hex(id) {
                                *id = Value::String(blank.into());
                                replaced = true;
                            }
                        }
                    }
                }
            }
        }
    }
    replaced
}

/// The items of the list `v.<camel>` (or `v.<snake>`), if it is one.
fn field_items<'a>(v: &'a mut Value, camel: &str, snake: &str) -> impl Iterator<Item = &'a mut Value> {
    let list = match v.as_object_mut() {
        Some(o) => {
            let key = if o.contains_key(camel) { camel } else { snake };
            o.get_mut(key).and_then(Value::as_array_mut)
        }
        None => None,
    };
    list.into_iter().flatten()
}

fn flatten(request: ExportTraceServiceRequest) -> Decoded {
    let mut out = Decoded::default();
    for resource_spans in request.resource_spans {
        let resource = Arc::new(
            resource_spans
                .resource
                .map(|r| attributes_to_json(r.attributes))
                .unwrap_or_default(),
        );
        // Spans share their resource; each trace that holds one of them
        // counts its size once.
        let resource_bytes = json_size(&resource);
        let mut traces_counted: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                if span.trace_id.len() != 16 || span.trace_id.iter().all(|b| *b == 0) {
                    out.rejected += 1;
                    out.reject_reason = Some("span with an invalid trace id (must be 16 bytes, not all zero)".into());
                    continue;
                }
                if span.span_id.len() != 8 || span.span_id.iter().all(|b| *b == 0) {
                    out.rejected += 1;
                    out.reject_reason = Some("span with an invalid span id (must be 8 bytes, not all zero)".into());
                    continue;
                }
                let parent_span_id = match span.parent_span_id.len() {
                    0 => None,
                    8 if span.parent_span_id.iter().all(|b| *b == 0) => None,
                    8 => Some(hex(&span.parent_span_id)),
                    _ => {
                        out.rejected += 1;
                        out.reject_reason = Some("span with an invalid parent span id (must be 8 bytes or empty)".into());
                        continue;
                    }
                };
                let attributes = attributes_to_json(span.attributes);
                let events: Vec<SpanEvent> = span
                    .events
                    .into_iter()
                    .map(|e| SpanEvent {
                        name: e.name,
                        attributes: attributes_to_json(e.attributes),
                    })
                    .collect();
                let resource_share = if traces_counted.insert(span.trace_id.clone()) {
                    resource_bytes
                } else {
                    0
                };
                let size_bytes = 256
                    + span.name.len()
                    + json_size(&attributes)
                    + events
                        .iter()
                        .map(|e| EVENT_BYTES + e.name.len() + json_size(&e.attributes))
                        .sum::<usize>()
                    + resource_share;
                let is_error = span.status.as_ref().map(|s| s.code == 2).unwrap_or(false);
                out.spans.push(Span {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id,
                    name: span.name,
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    attributes,
                    events,
                    resource: resource.clone(),
                    is_error,
                    size_bytes,
                });
            }
        }
    }
    out
}

/// Memory a span event holds besides its name and attributes.
const EVENT_BYTES: usize = 64;
/// Memory an attribute holds besides its key's and value's text: its slot
/// in the map's nodes (the key's header and the value), allocator rounding.
const ENTRY_BYTES: usize = 64;
/// Memory an array element holds besides its text.
const ELEMENT_BYTES: usize = 32;

/// Estimated memory of decoded attributes, for the assembler's byte limits.
fn json_size(map: &Map<String, Value>) -> usize {
    map.iter().map(|(k, v)| k.len() + value_size(v) + ENTRY_BYTES).sum()
}

/// What a value holds outside the slot that holds it.
fn value_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(|e| value_size(e) + ELEMENT_BYTES).sum::<usize>(),
        Value::Object(o) => json_size(o),
        _ => 0,
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

pub(crate) fn attributes_to_json(attributes: Vec<KeyValue>) -> Map<String, Value> {
    attributes.into_iter().map(|kv| (kv.key, any_to_json(kv.value))).collect()
}

fn any_to_json(value: Option<AnyValue>) -> Value {
    match value.and_then(|v| v.value) {
        None => Value::Null,
        Some(any_value::Value::StringValue(s)) => Value::String(s),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(b),
        Some(any_value::Value::IntValue(i)) => Value::from(i),
        Some(any_value::Value::DoubleValue(d)) => serde_json::Number::from_f64(d).map(Value::Number).unwrap_or(Value::Null),
        Some(any_value::Value::ArrayValue(a)) => Value::Array(a.values.into_iter().map(|v| any_to_json(Some(v))).collect()),
        Some(any_value::Value::KvlistValue(kv)) => Value::Object(attributes_to_json(kv.values)),
        Some(any_value::Value::BytesValue(b)) => Value::String(hex(&b)),
        Some(_) => Value::Null,
    }
}

/// `google.rpc.Status`, the body OTLP/HTTP prescribes for errors (protobuf encoding).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// Body of a success (or partial success) response in the request's encoding.
pub fn success_body(encoding: Encoding, rejected: u64, message: Option<String>) -> Vec<u8> {
    let response = ExportTraceServiceResponse {
        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: rejected as i64,
            error_message: message.unwrap_or_default(),
        }),
    };
    match encoding {
        Encoding::Protobuf => response.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// Body of an error response (`google.rpc.Status`) in the request's encoding.
pub fn error_body(encoding: Encoding, grpc_code: i32, message: &str) -> Vec<u8> {
    match encoding {
        Encoding::Protobuf => RpcStatus {
            code: grpc_code,
            message: message.to_string(),
        }
        .encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&serde_json::json!({"code": grpc_code, "message": message})).unwrap_or_default(),
    }
}
