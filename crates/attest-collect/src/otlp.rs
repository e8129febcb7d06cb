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
    /// The exporter says the parent lives in another process (OTLP span
    /// `flags`: `CONTEXT_HAS_IS_REMOTE` and `IS_REMOTE` both set): a service
    /// called with a W3C `traceparent`. Such a span is its process's local
    /// root, and the trace's root when the parent's spans never come here.
    pub parent_is_remote: bool,
    pub name: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Map<String, Value>,
    pub events: Vec<SpanEvent>,
    /// Resource attributes (`service.name`, ...), shared by the spans of one resource.
    pub resource: Arc<Map<String, Value>>,
    /// The instrumentation scope's name (`openinference.instrumentation.langchain`,
    /// ...): how a framework's spans are recognised without the user naming it.
    pub scope: Arc<str>,
    /// Not a span: a GenAI event sent as an OTLP log record, on its way to
    /// the span it belongs to (`parent_span_id`), whose events it joins
    /// when the trace is converted ([`crate::logs`]).
    pub log_event: bool,
    pub is_error: bool,
    /// Approximate memory held, used for the assembler's byte bounds.
    pub size_bytes: usize,
}

impl Span {
    /// Whether this span can be its trace's root: it has no parent, or its
    /// parent is in another process (see [`Span::parent_is_remote`]).
    pub fn is_local_root(&self) -> bool {
        self.parent_span_id.is_none() || self.parent_is_remote
    }

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
            // A gzip body may hold several members back to back (RFC 1952
            // §2.2; `cat a.gz b.gz`): every one is inflated, since a
            // decoder that stops after the first would drop the rest of
            // the request while answering 200.
            let mut reader = flate2::read::MultiGzDecoder::new(body).take(max_bytes as u64 + 1);
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
        Encoding::Protobuf => decode_clipping::<ExportTraceServiceRequest>(body, false)
            .map_err(|e| BadPayload(format!("body is not an OTLP ExportTraceServiceRequest protobuf: {e}")))?,
        Encoding::Json => decode_json(body)?,
    };
    Ok(flatten(request))
}

/// Decodes a protobuf request; one the decoder refuses for nesting (an
/// attribute value deeper than its recursion limit) is decoded again with
/// such values clipped ([`crate::elements::clip_deep_values`]), so that one
/// attribute does not cost the whole batch.
pub(crate) fn decode_clipping<T: Message + Default>(body: &[u8], logs: bool) -> Result<T, prost::DecodeError> {
    match T::decode(body) {
        Err(e) if e.to_string().contains("recursion limit") => match crate::elements::clip_deep_values(body, logs) {
            Some(clipped) => T::decode(clipped.as_slice()),
            None => Err(e),
        },
        other => other,
    }
}

/// OTLP/JSON: an object (serde would also take a list of its fields).
///
/// The typed decoding of `opentelemetry-proto` is stricter than the proto3
/// JSON mapping OTLP/JSON is defined by, so a request it refuses is parsed
/// again as plain JSON, brought to the shape it expects
/// ([`normalise_proto3_json`]), and decoded once more. Ids that are not hex
/// strings are blanked on the way, so that only their spans are rejected
/// (as for ids of a wrong length) and the rest of the request is kept.
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
    let typed = serde_json::from_slice::<ExportTraceServiceRequest>(body);
    // The typed decoding passes over fields it does not know, so fields
    // under their proto names (`resource_spans`, `parent_span_id`) would be
    // lost without a word: such a request is read again, as are those it
    // refuses.
    if typed.is_ok() && !has_proto_name_key(body) {
        return typed.map_err(not_otlp);
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return typed.map_err(not_otlp);
    };
    let normalised =
        normalise_proto3_json(&mut value).map_err(|e| BadPayload(format!("body is not OTLP/JSON ExportTraceServiceRequest: {e}")))?;
    let blanked = blank_bad_ids(&mut value);
    if !normalised && !blanked {
        return typed.map_err(not_otlp);
    }
    serde_json::from_value(value).map_err(not_otlp)
}

/// Whether a JSON text has an object key in lower snake case (`"trace_id":`),
/// which OTLP/JSON's lowerCamelCase names never are: one pass over the bytes,
/// string by string, without parsing.
fn has_proto_name_key(json: &[u8]) -> bool {
    let mut i = 0;
    while let Some(open) = json[i..].iter().position(|b| *b == b'"') {
        let mut j = i + open + 1;
        let (mut snake, mut plain) = (false, true);
        while let Some(&b) = json.get(j) {
            match b {
                b'"' => break,
                b'\\' => {
                    plain = false;
                    j += 1;
                }
                b'_' => snake = true,
                b'a'..=b'z' | b'0'..=b'9' => {}
                _ => plain = false,
            }
            j += 1;
        }
        let after = json.get(j + 1..).unwrap_or_default();
        if snake && plain && after.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b':') {
            return true;
        }
        i = j + 1;
        if i >= json.len() {
            break;
        }
    }
    false
}

/// `span_id` as the proto3 JSON mapping's lowerCamelCase name, `spanId`.
fn lower_camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// Gives every key-value pair of a list that left its `key` out (the
/// default, empty) an empty one. Returns whether any was missing.
fn fill_empty_keys(list: Option<&mut Value>) -> bool {
    let mut filled = false;
    for kv in list.and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(kv) = kv.as_object_mut().filter(|kv| !kv.contains_key("key")) {
            kv.insert("key".into(), Value::String(String::new()));
            filled = true;
        }
    }
    filled
}

/// The number of an enum value the proto3 JSON mapping may give by name.
fn enum_number(field: &str, name: &str) -> Option<i64> {
    const SPAN_KINDS: [&str; 6] = [
        "SPAN_KIND_UNSPECIFIED",
        "SPAN_KIND_INTERNAL",
        "SPAN_KIND_SERVER",
        "SPAN_KIND_CLIENT",
        "SPAN_KIND_PRODUCER",
        "SPAN_KIND_CONSUMER",
    ];
    const STATUS_CODES: [&str; 3] = ["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"];
    let names: &[&str] = match field {
        "kind" => &SPAN_KINDS,
        "code" => &STATUS_CODES,
        _ => return None,
    };
    names.iter().position(|n| *n == name).map(|i| i as i64)
}

/// Rewrites what the proto3 JSON mapping allows and the typed decoding does
/// not take. Returns whether anything changed.
///
/// - `null` for any field means the field's default (proto3 JSON): the
///   entry is removed (`"parentSpanId": null`, `"events": null`, ...).
/// - `{"arrayValue": {}}` and `{"kvlistValue": {}}` are an empty list: the
///   omitted `values` is added.
/// - `doubleValue` may be a string: `"1.5"` becomes the number, and the
///   non-finite `"NaN"`, `"Infinity"` and `"-Infinity"`, which JSON numbers
///   (and so Attest traces) cannot hold, become a `stringValue` with that
///   text, as the protobuf path does ([`any_to_json`]).
/// - Field names may be the proto's own (`trace_id`): they become the
///   lowerCamelCase ones (`traceId`).
/// - Enums may be given by name (`"kind": "SPAN_KIND_SERVER"`,
///   `"code": "STATUS_CODE_ERROR"`): they become their numbers.
/// - An attribute whose key is empty may leave `key` out, as a default.
///
/// Object keys in OTLP/JSON are always field names (attribute keys are the
/// `key` field's values), so the rewrite applies at every level. The value
/// came from `serde_json`, which stops nesting at 128 levels, so the
/// recursion is bounded.
fn normalise_proto3_json(v: &mut Value) -> Result<bool, String> {
    let mut changed = false;
    match v {
        Value::Array(items) => {
            for item in items {
                changed |= normalise_proto3_json(item)?;
            }
        }
        Value::Object(fields) => {
            let before = fields.len();
            fields.retain(|_, value| !value.is_null());
            changed |= fields.len() != before;
            if fields.keys().any(|k| k.contains('_')) {
                let mut renamed = serde_json::Map::new();
                for (k, v) in std::mem::take(fields) {
                    let name = if k.contains('_') { lower_camel_case(&k) } else { k.clone() };
                    if renamed.insert(name.clone(), v).is_some() {
                        return Err(format!(
                            "the field {} is given twice, under its proto name and its JSON name",
                            crate::bounded(&name, 100)
                        ));
                    }
                }
                *fields = renamed;
                changed = true;
            }
            for field in ["kind", "code"] {
                if let Some(number) = fields.get(field).and_then(Value::as_str).and_then(|n| enum_number(field, n)) {
                    fields.insert(field.into(), Value::from(number));
                    changed = true;
                }
            }
            changed |= fill_empty_keys(fields.get_mut("attributes"));
            changed |= fill_empty_keys(fields.get_mut("kvlistValue").and_then(|l| l.get_mut("values")));
            for list in ["arrayValue", "kvlistValue"] {
                if let Some(Value::Object(inner)) = fields.get_mut(list) {
                    if !inner.contains_key("values") {
                        inner.insert("values".into(), Value::Array(Vec::new()));
                        changed = true;
                    }
                }
            }
            for (field, range) in INTEGER_FIELDS {
                if let Some(number) = fields.get(field).and_then(|v| integral(v, range)) {
                    fields.insert(field.into(), number);
                    changed = true;
                }
            }
            if let Some(Value::String(text)) = fields.get("doubleValue") {
                // The proto3 JSON mapping's spellings only: the three special
                // values, or a JSON number in a string. Rust's float parser
                // would also take `inf`, `+1.5`, padding, and an overflow
                // such as `1e400` (as infinity).
                let replacement = match text.as_str() {
                    "NaN" | "Infinity" | "-Infinity" => Some(("stringValue", Value::String(text.clone()))),
                    _ if text.trim() != text => None,
                    _ => serde_json::from_str::<serde_json::Number>(text)
                        .ok()
                        .filter(|n| n.as_f64().is_some_and(f64::is_finite))
                        .map(|n| ("doubleValue", Value::Number(n))),
                };
                if let Some((key, value)) = replacement {
                    fields.remove("doubleValue");
                    fields.insert(key.into(), value);
                    changed = true;
                }
            }
            for value in fields.values_mut() {
                changed |= normalise_proto3_json(value)?;
            }
        }
        _ => {}
    }
    Ok(changed)
}

/// Integer fields of a trace export and the range of their proto type.
/// The proto3 JSON mapping lets any of them be a JSON number or a string,
/// in exponent notation too (`"3"`, `1.7e18`), where the typed decoding
/// takes 32-bit ones as numbers only and no integer in exponent notation.
const INTEGER_FIELDS: [(&str, (f64, f64)); 8] = [
    ("droppedAttributesCount", U32),
    ("droppedEventsCount", U32),
    ("droppedLinksCount", U32),
    ("flags", U32),
    ("startTimeUnixNano", U64),
    ("endTimeUnixNano", U64),
    ("timeUnixNano", U64),
    ("intValue", I64),
];
// Each range runs from its least value up to, not including, a power of
// two, which f64 holds exactly (the greatest values themselves it may not).
const U32: (f64, f64) = (0.0, 4_294_967_296.0);
const U64: (f64, f64) = (0.0, 18_446_744_073_709_551_616.0);
const I64: (f64, f64) = (-9_223_372_036_854_775_808.0, 9_223_372_036_854_775_808.0);

/// `v` as a plain JSON integer, when it is an integer within `range` in a
/// spelling the typed decoding does not take (a string, or a number with a
/// fraction or an exponent); `None` when it needs no change, or is not one
/// (the typed decoding then says what is wrong with it).
fn integral(v: &Value, (min, max): (f64, f64)) -> Option<Value> {
    let n = match v {
        Value::Number(n) if n.is_f64() => n.clone(),
        // The mapping's spellings only: no padding or sign prefix, as for doubles.
        Value::String(s) if s.trim() == s && !s.starts_with('+') => serde_json::from_str::<serde_json::Number>(s).ok()?,
        _ => return None,
    };
    if let Some(i) = n.as_u64().filter(|&i| (i as f64) < max) {
        return Some(Value::from(i));
    }
    if let Some(i) = n.as_i64().filter(|&i| i as f64 >= min && (i as f64) < max) {
        return Some(Value::from(i));
    }
    let f = n.as_f64()?;
    if !(f.is_finite() && f.fract() == 0.0 && f >= min && f < max) {
        return None;
    }
    Some(if f < 0.0 { Value::from(f as i64) } else { Value::from(f as u64) })
}

/// The proto3 JSON spelling of a non-finite double.
fn non_finite_text(d: f64) -> &'static str {
    if d.is_nan() {
        "NaN"
    } else if d > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
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
            let scope: Arc<str> = scope_spans.scope.map(|s| s.name).unwrap_or_default().into();
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
                let size_bytes = SPAN_BYTES
                    + span.name.len()
                    + json_size(&attributes)
                    + events
                        .iter()
                        .map(|e| EVENT_BYTES + e.name.len() + json_size(&e.attributes))
                        .sum::<usize>()
                    + resource_share;
                let is_error = span.status.as_ref().map(|s| s.code == 2).unwrap_or(false);
                // Only a parent the flags call remote makes a local root:
                // without CONTEXT_HAS_IS_REMOTE the exporter did not say.
                let parent_is_remote =
                    parent_span_id.is_some() && span.flags & FLAGS_HAS_IS_REMOTE != 0 && span.flags & FLAGS_IS_REMOTE != 0;
                out.spans.push(Span {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id,
                    parent_is_remote,
                    name: span.name,
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    attributes,
                    events,
                    resource: resource.clone(),
                    scope: scope.clone(),
                    log_event: false,
                    is_error,
                    size_bytes,
                });
            }
        }
    }
    out
}

/// OTLP span `flags`: whether the exporter knows if the parent is remote
/// (`SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`)...
const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
/// ... and that it is (`SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`).
const FLAGS_IS_REMOTE: u32 = 0x200;

// What decoded spans hold, as measured (docs/continuous.md, "Trace
// assembly"): the process's resident memory grew by about 1,950 bytes per
// one-span trace with 3 small attributes, and by about 105 more per further
// attribute. The figures below come within 10 % of that, erring high.

/// Memory a span holds besides its name and attributes: its record in the
/// trace's list (grown by doubling), its ids as text, its entry in the
/// trace's set of span ids (duplicate detection).
pub const SPAN_BYTES: usize = 512;
/// Memory a span event holds besides its name and attributes.
const EVENT_BYTES: usize = 128;
/// Memory a non-empty attribute map holds before its entries: its first
/// B-tree node, allocated whole (room for 11 entries) with the first one.
const MAP_BYTES: usize = 640;
/// Memory an attribute holds besides its key's and value's text: its slot
/// in the map's nodes, the key's and the value's allocations (each at least
/// 32 bytes with the allocator's header and rounding).
const ENTRY_BYTES: usize = 112;
/// Memory an array element holds besides its text.
const ELEMENT_BYTES: usize = 32;

/// Estimated memory of decoded attributes, for the assembler's byte limits.
pub(crate) fn json_size(map: &Map<String, Value>) -> usize {
    if map.is_empty() {
        return 0;
    }
    MAP_BYTES + map.iter().map(|(k, v)| k.len() + value_size(v) + ENTRY_BYTES).sum::<usize>()
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

pub(crate) fn attributes_to_json(attributes: Vec<KeyValue>) -> Map<String, Value> {
    attributes.into_iter().map(|kv| (kv.key, any_to_json(kv.value))).collect()
}

pub(crate) fn any_to_json(value: Option<AnyValue>) -> Value {
    match value.and_then(|v| v.value) {
        None => Value::Null,
        Some(any_value::Value::StringValue(s)) => Value::String(s),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(b),
        Some(any_value::Value::IntValue(i)) => Value::from(i),
        // JSON numbers cannot be NaN or infinite: those keep their proto3
        // JSON text, as in OTLP/JSON requests ([`normalise_proto3_json`]).
        Some(any_value::Value::DoubleValue(d)) => serde_json::Number::from_f64(d)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(non_finite_text(d).into())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as OtlpSpan};
    use std::io::Write;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn request(spans: Vec<OtlpSpan>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource::default()),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn otlp_span(id: u8, parent: Option<u8>, flags: u32) -> OtlpSpan {
        OtlpSpan {
            trace_id: vec![7; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            flags,
            name: format!("s{id}"),
            ..Default::default()
        }
    }

    #[test]
    fn proto3_json_forms_are_accepted() {
        // What protobuf's own JSON mapping writes, and nulls for defaults.
        let body = br#"{"resourceSpans":[{"resource":null,"scopeSpans":[{"scope":null,"spans":[
            {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parentSpanId":null,
             "name":"s","events":null,"links":null,"status":null,"attributes":[
                {"key":"empty_list","value":{"arrayValue":{}}},
                {"key":"empty_map","value":{"kvlistValue":{}}},
                {"key":"nan","value":{"doubleValue":"NaN"}},
                {"key":"inf","value":{"doubleValue":"Infinity"}},
                {"key":"neg_inf","value":{"doubleValue":"-Infinity"}},
                {"key":"text_number","value":{"doubleValue":"1.5"}},
                {"key":"nested","value":{"arrayValue":{"values":[{"kvlistValue":{}},{"doubleValue":"NaN"}]}}}
            ]}]}]}]}"#;
        let decoded = decode(body, Encoding::Json, 1 << 20).unwrap();
        assert_eq!((decoded.spans.len(), decoded.rejected), (1, 0));
        let span = &decoded.spans[0];
        assert_eq!(span.parent_span_id, None);
        let attr = |k: &str| span.attributes[k].clone();
        assert_eq!(attr("empty_list"), serde_json::json!([]));
        assert_eq!(attr("empty_map"), serde_json::json!({}));
        assert_eq!(attr("nan"), "NaN");
        assert_eq!(attr("inf"), "Infinity");
        assert_eq!(attr("neg_inf"), "-Infinity");
        assert_eq!(attr("text_number"), 1.5);
        assert_eq!(attr("nested"), serde_json::json!([{}, "NaN"]));
        // The protobuf path spells non-finite doubles the same way.
        let mut s = otlp_span(1, None, 0);
        s.attributes = vec![kv("nan", any_value::Value::DoubleValue(f64::NAN))];
        let decoded = decode(&request(vec![s]).encode_to_vec(), Encoding::Protobuf, 1 << 20).unwrap();
        assert_eq!(decoded.spans[0].attributes["nan"], "NaN");
        // What is not OTLP is still refused.
        // The proto field names, enum names, and a key left out as empty.
        let body = br#"{"resource_spans":[{"scope_spans":[{"spans":[
            {"trace_id":"5b8efff798038103d269b633813fc60c","span_id":"eee19b7ec3c1b174","name":"s",
             "kind":"SPAN_KIND_SERVER","status":{"code":"STATUS_CODE_ERROR"},"start_time_unix_nano":"5",
             "attributes":[{"key":"a","value":{"int_value":"7"}},{"value":{"string_value":"no key"}},
                           {"key":"m","value":{"kvlist_value":{"values":[{"value":{"bool_value":true}}]}}}]}]}]}]}"#;
        let decoded = decode(body, Encoding::Json, 1 << 20).unwrap();
        assert_eq!((decoded.spans.len(), decoded.rejected), (1, 0));
        let span = &decoded.spans[0];
        assert_eq!(span.start_unix_nanos, 5);
        assert_eq!(span.attributes["a"], 7);
        assert_eq!(span.attributes[""], "no key");
        assert_eq!(span.attributes["m"], serde_json::json!({"": true}));
        // A request with no spans in either spelling is still a success,
        // also when a value (not a key) is written like a proto name.
        assert_eq!(decode(b"{}", Encoding::Json, 1 << 20).unwrap().spans.len(), 0);
        let named = br#"{"resourceSpans":[],"note":"resource_spans", "x_y" : 1}"#;
        assert_eq!(decode(named, Encoding::Json, 1 << 20).unwrap().spans.len(), 0);
        assert!(decode(br#"{"resource_spans":"x"}"#, Encoding::Json, 1 << 20).is_err());
        // The spellings mixed, and one field given in both.
        let mixed = br#"{"resourceSpans":[{"scope_spans":[{"spans":[
            {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parent_span_id":"aaaaaaaaaaaaaaaa","name":"s"}]}]}]}"#;
        let decoded = decode(mixed, Encoding::Json, 1 << 20).unwrap();
        assert_eq!(decoded.spans[0].parent_span_id.as_deref(), Some("aaaaaaaaaaaaaaaa"));
        let twice = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[
            {"traceId":"5b8efff798038103d269b633813fc60c","trace_id":"5b8efff798038103d269b633813fc60d","spanId":"eee19b7ec3c1b174"}]}]}]}"#;
        let e = decode(twice, Encoding::Json, 1 << 20).unwrap_err();
        assert!(e.0.contains("traceId is given twice"), "{}", e.0);
        // So are spellings the proto3 mapping does not have, which a float
        // parser would take (an overflow as infinity).
        for spelling in ["many", "inf", "nan", "+1.5", " 1.5 ", "1e400", ""] {
            let bad = format!(
                r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","attributes":[{{"key":"d","value":{{"doubleValue":"{spelling}"}}}}]}}]}}]}}]}}"#
            );
            assert!(decode(bad.as_bytes(), Encoding::Json, 1 << 20).is_err(), "{spelling:?}");
        }
    }

    #[test]
    fn integers_in_any_spelling_of_the_json_mapping_are_read() {
        let body = |fields: &str, attr: &str| {
            format!(
                r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"s",{fields},"attributes":[{{"key":"n","value":{{"intValue":{attr}}}}}]}}]}}]}}]}}"#
            )
        };
        let good = body(
            r#""startTimeUnixNano":1.7e18,"endTimeUnixNano":"1700000000000000001","droppedAttributesCount":"3","flags":"768""#,
            r#""-5""#,
        );
        let d = decode(good.as_bytes(), Encoding::Json, 1 << 20).unwrap();
        let span = &d.spans[0];
        assert_eq!(
            (span.start_unix_nanos, span.end_unix_nanos),
            (1_700_000_000_000_000_000, 1_700_000_000_000_000_001)
        );
        assert_eq!(span.attributes["n"], -5);
        let d = decode(body(r#""startTimeUnixNano":"1e3""#, "7.0").as_bytes(), Encoding::Json, 1 << 20).unwrap();
        assert_eq!((d.spans[0].start_unix_nanos, &d.spans[0].attributes["n"]), (1000, &Value::from(7)));
        // Not integers, or out of range: refused as before, by the typed decoding.
        for (fields, attr) in [
            (r#""droppedAttributesCount":"1.5""#, "1"),
            (r#""droppedAttributesCount":"4294967296""#, "1"),
            (r#""flags":"-1""#, "1"),
            (r#""flags":" 3""#, "1"),
            (r#""startTimeUnixNano":-1e3"#, "1"),
            (r#""startTimeUnixNano":1.8446744073709552e19"#, "1"),
            (r#""flags":4294967296.0"#, "1"),
            (r#""flags":1"#, r#""1e300""#),
        ] {
            let e = decode(body(fields, attr).as_bytes(), Encoding::Json, 1 << 20);
            assert!(e.is_err(), "{fields} {attr}: {:?}", e.map(|d| d.spans.len()));
        }
    }

    #[test]
    fn every_member_of_a_gzip_body_is_inflated() {
        let gz = |data: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let body = request(vec![otlp_span(1, None, 0), otlp_span(2, Some(1), 0)]).encode_to_vec();
        let (head, tail) = body.split_at(body.len() / 2);
        let two_members = [gz(head), gz(tail)].concat();
        let raw = decompress(&two_members, Some("gzip"), 1 << 20).unwrap();
        assert_eq!(raw, body);
        assert_eq!(decode(&raw, Encoding::Protobuf, 1 << 20).unwrap().spans.len(), 2);
        // The size bound holds across members.
        let e = decompress(&two_members, Some("gzip"), body.len() - 1).unwrap_err();
        assert!(e.0.contains("inflates past"), "{e}");
    }

    #[test]
    fn the_remote_parent_flag_is_read_only_when_the_exporter_sets_it() {
        let spans = vec![
            // What the OpenTelemetry SDKs send for a span whose parent came in a traceparent.
            otlp_span(1, Some(9), FLAGS_HAS_IS_REMOTE | FLAGS_IS_REMOTE | 0x01),
            // Local parent, said so.
            otlp_span(2, Some(1), FLAGS_HAS_IS_REMOTE | 0x01),
            // IS_REMOTE without CONTEXT_HAS_IS_REMOTE means nothing.
            otlp_span(3, Some(1), FLAGS_IS_REMOTE),
            // No parent: a root, not a remote one.
            otlp_span(4, None, FLAGS_HAS_IS_REMOTE | FLAGS_IS_REMOTE),
        ];
        let decoded = decode(&request(spans).encode_to_vec(), Encoding::Protobuf, 1 << 20).unwrap();
        let remote: Vec<_> = decoded.spans.iter().map(|s| s.parent_is_remote).collect();
        assert_eq!(remote, [true, false, false, false]);
        let roots: Vec<_> = decoded.spans.iter().map(Span::is_local_root).collect();
        assert_eq!(roots, [true, false, false, true]);
    }

    #[test]
    fn the_memory_estimate_is_not_below_what_was_measured() {
        // Measured (docs/continuous.md): about 1,950 bytes of resident memory
        // per one-span trace with 3 small attributes, about 105 more per
        // further attribute.
        let span_with = |attrs: usize| {
            let mut s = otlp_span(1, Some(2), 0);
            s.name = "chat".into();
            s.attributes = vec![kv("gen_ai.operation.name", any_value::Value::StringValue("chat".into()))];
            s.attributes
                .extend((0..attrs - 1).map(|j| kv(&format!("k{j}"), any_value::Value::StringValue("v".into()))));
            let decoded = decode(&request(vec![s]).encode_to_vec(), Encoding::Protobuf, 1 << 20).unwrap();
            decoded.spans[0].size_bytes + crate::assemble::TRACE_BYTES
        };
        assert!(span_with(3) >= 1_950, "{}", span_with(3));
        assert!(span_with(21) - span_with(3) >= 18 * 105, "{}", span_with(21) - span_with(3));
    }
}
