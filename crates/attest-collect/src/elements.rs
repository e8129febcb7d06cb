//! Counting the elements of an export request before it is decoded.
//!
//! Decoding turns each element (a span, an event, a link, an attribute, an
//! attribute value) into structs of some 50–300 bytes, whatever its size on
//! the wire. An empty span event is two bytes of protobuf, and three of
//! JSON: a 32 MiB body of them would decode into more than a gigabyte. The
//! request size limit alone cannot bound that, so the receiver estimates
//! what a request decodes to first, with this walk over the encoding, and
//! refuses one that would decode to more than it may hold.
//!
//! The protobuf walk follows the message fields of `ExportTraceServiceRequest`
//! that hold elements, and skips everything else. It never decodes: a
//! malformed body simply stops the count, and the decoder reports the error.

/// Messages of the OTLP trace request that hold elements.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Request,
    ResourceSpans,
    Resource,
    ScopeSpans,
    Scope,
    Span,
    Event,
    Link,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    LogsRequest,
    ResourceLogs,
    ScopeLogs,
    LogRecord,
}

impl Kind {
    /// Roughly what one message of this kind holds once decoded and
    /// flattened into spans, beyond the text it carries.
    fn decoded_bytes(self) -> u64 {
        match self {
            Kind::Span | Kind::LogRecord => 320,
            Kind::Event | Kind::Link | Kind::KeyValue => 128,
            Kind::AnyValue => 64,
            _ => 96,
        }
    }

    /// The message kind of field `field` of this message, when it is one the walk follows.
    fn child(self, field: u32) -> Option<Kind> {
        use Kind::*;
        Some(match (self, field) {
            (Request, 1) => ResourceSpans,
            (ResourceSpans, 1) => Resource,
            (ResourceSpans, 2) => ScopeSpans,
            (Resource, 1) | (Scope, 3) | (Span, 9) | (Event, 3) | (Link, 4) | (KeyValueList, 1) => KeyValue,
            (ScopeSpans, 1) => Scope,
            (ScopeSpans, 2) => Span,
            (Span, 11) => Event,
            (Span, 13) => Link,
            (KeyValue, 2) | (ArrayValue, 1) | (LogRecord, 5) => AnyValue,
            (LogsRequest, 1) => ResourceLogs,
            (ResourceLogs, 1) => Resource,
            (ResourceLogs, 2) => ScopeLogs,
            (ScopeLogs, 1) => Scope,
            (ScopeLogs, 2) => LogRecord,
            (LogRecord, 6) => KeyValue,
            (AnyValue, 5) => ArrayValue,
            (AnyValue, 6) => KeyValueList,
            _ => return None,
        })
    }
}

/// Deeper nesting is refused by the decoder (its recursion limit is 100),
/// so the walk need not follow it.
const MAX_DEPTH: usize = 100;

/// Past the limit: the walk stopped there.
#[derive(Debug, PartialEq, Eq)]
pub struct TooMany;

/// Estimates what a protobuf `ExportTraceServiceRequest` decodes to beyond
/// its text, in bytes, up to `max`: each message it holds counts what a
/// message of its kind holds once decoded.
pub fn protobuf(body: &[u8], max: u64) -> Result<u64, TooMany> {
    let mut count = 0;
    walk(body, Kind::Request, 0, &mut count, max)?;
    Ok(count)
}

/// The same estimate for a protobuf `ExportLogsServiceRequest`.
pub fn protobuf_logs(body: &[u8], max: u64) -> Result<u64, TooMany> {
    let mut count = 0;
    walk(body, Kind::LogsRequest, 0, &mut count, max)?;
    Ok(count)
}

fn walk(mut buf: &[u8], kind: Kind, depth: usize, count: &mut u64, max: u64) -> Result<(), TooMany> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    while !buf.is_empty() {
        let Ok((field, wire)) = decode_key(&mut buf) else { return Ok(()) };
        let skip = match wire {
            WireType::Varint => {
                if decode_varint(&mut buf).is_err() {
                    return Ok(());
                }
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let Ok(len) = decode_varint(&mut buf) else { return Ok(()) };
                let Some(len) = usize::try_from(len).ok().filter(|&l| l <= buf.len()) else {
                    return Ok(());
                };
                let (inner, rest) = buf.split_at(len);
                buf = rest;
                if let Some(child) = kind.child(field).filter(|_| depth < MAX_DEPTH) {
                    *count += child.decoded_bytes();
                    if *count > max {
                        return Err(TooMany);
                    }
                    walk(inner, child, depth + 1, count, max)?;
                }
                0
            }
            // Groups: not in the OTLP schema; the decoder refuses them.
            WireType::StartGroup | WireType::EndGroup => return Ok(()),
        };
        if skip > buf.len() {
            return Ok(());
        }
        buf = &buf[skip..];
    }
    Ok(())
}

/// Attribute values nested deeper than this (lists in lists, maps in maps)
/// are clipped: the decoder's recursion limit (100 messages, three per level
/// of `kvlist_value`) would otherwise refuse the whole request for one
/// attribute, and no check reads that deep.
pub const MAX_VALUE_DEPTH: usize = 16;

/// What a value nested past [`MAX_VALUE_DEPTH`] becomes.
pub const CLIPPED_VALUE: &str = "[clipped: nested deeper than 16 levels]";

/// `body`, a protobuf `ExportTraceServiceRequest` (`logs`: an
/// `ExportLogsServiceRequest`), with every attribute value nested deeper
/// than [`MAX_VALUE_DEPTH`] replaced by the string [`CLIPPED_VALUE`];
/// `None` when nothing was that deep. Messages of the request's own shape
/// are encoded again (their lengths may change); unknown fields and scalars
/// are copied as they came.
pub fn clip_deep_values(body: &[u8], logs: bool) -> Option<Vec<u8>> {
    let mut clipped = false;
    let kind = if logs { Kind::LogsRequest } else { Kind::Request };
    let out = rewrite(body, kind, 0, &mut clipped);
    clipped.then_some(out)
}

fn rewrite(mut buf: &[u8], kind: Kind, values: usize, clipped: &mut bool) -> Vec<u8> {
    use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
    if matches!(kind, Kind::AnyValue) && values > MAX_VALUE_DEPTH {
        *clipped = true;
        let mut out = Vec::with_capacity(CLIPPED_VALUE.len() + 2);
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(CLIPPED_VALUE.len() as u64, &mut out);
        out.extend_from_slice(CLIPPED_VALUE.as_bytes());
        return out;
    }
    let values = values + usize::from(matches!(kind, Kind::AnyValue));
    let mut out = Vec::with_capacity(buf.len());
    while !buf.is_empty() {
        let start = buf;
        let Ok((field, wire)) = decode_key(&mut buf) else { break };
        match wire {
            WireType::LengthDelimited => {
                let Ok(len) = decode_varint(&mut buf) else { break };
                let Some(len) = usize::try_from(len).ok().filter(|&l| l <= buf.len()) else {
                    break;
                };
                let (inner, rest) = buf.split_at(len);
                buf = rest;
                match kind.child(field) {
                    Some(child) => {
                        let inner = rewrite(inner, child, values, clipped);
                        encode_key(field, WireType::LengthDelimited, &mut out);
                        encode_varint(inner.len() as u64, &mut out);
                        out.extend_from_slice(&inner);
                    }
                    None => out.extend_from_slice(&start[..start.len() - buf.len()]),
                }
                continue;
            }
            WireType::Varint => {
                if decode_varint(&mut buf).is_err() {
                    break;
                }
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if wire == WireType::SixtyFourBit { 8 } else { 4 };
                if n > buf.len() {
                    break;
                }
                buf = &buf[n..];
            }
            WireType::StartGroup | WireType::EndGroup => break,
        }
        out.extend_from_slice(&start[..start.len() - buf.len()]);
    }
    // A malformed tail is kept as it came, for the decoder to name.
    out.extend_from_slice(buf);
    out
}

/// Counts the objects and arrays in a JSON body (each span, event, link,
/// attribute and value is one), up to `max`.
pub fn json(body: &[u8], max: u64) -> Result<u64, TooMany> {
    attest_io::json_containers(body, max).map_err(|_| TooMany)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{span::Event, ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn attribute(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    #[test]
    fn protobuf_counts_spans_events_attributes_and_values() {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "s".into(),
            attributes: vec![
                attribute("a", any_value::Value::StringValue("x".into())),
                attribute(
                    "list",
                    any_value::Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(any_value::Value::IntValue(1)),
                        }],
                    }),
                ),
            ],
            events: vec![Event::default(), Event::default()],
            ..Default::default()
        };
        let body = request(vec![span]).encode_to_vec();
        // resource_spans, scope_spans (96 each), the span (320), 2 × (key-value
        // 128, value 64), the array (96), its one value (64), 2 events (128 each).
        assert_eq!(protobuf(&body, 10_000), Ok(96 + 96 + 320 + 2 * (128 + 64) + 96 + 64 + 2 * 128));
        assert_eq!(protobuf(&body, 1_000), Err(TooMany));
    }

    #[test]
    fn empty_events_count_however_small_they_are() {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            events: vec![Event::default(); 10_000],
            ..Default::default()
        };
        let body = request(vec![span]).encode_to_vec();
        assert!(body.len() < 25_000, "{}", body.len());
        assert_eq!(protobuf(&body, 1_000_000), Err(TooMany));
        assert_eq!(protobuf(&body, 2_000_000), Ok(96 + 96 + 320 + 10_000 * 128));
    }

    #[test]
    fn malformed_protobuf_stops_the_count_without_failing() {
        assert_eq!(protobuf(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], 10), Ok(0));
        assert_eq!(protobuf(&[0xff], 10), Ok(0));
        assert_eq!(protobuf(b"", 10), Ok(0));
    }

    #[test]
    fn values_nested_past_the_limit_are_clipped_and_the_rest_kept() {
        let mut deep = AnyValue {
            value: Some(any_value::Value::StringValue("bottom".into())),
        };
        for _ in 0..40 {
            deep = AnyValue {
                value: Some(any_value::Value::KvlistValue(
                    opentelemetry_proto::tonic::common::v1::KeyValueList {
                        values: vec![KeyValue {
                            key: "k".into(),
                            value: Some(deep),
                            ..Default::default()
                        }],
                    },
                )),
            };
        }
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "deep".into(),
            attributes: vec![
                KeyValue {
                    key: "deep".into(),
                    value: Some(deep),
                    ..Default::default()
                },
                attribute("plain", any_value::Value::StringValue("kept".into())),
            ],
            ..Default::default()
        };
        let body = request(vec![span]).encode_to_vec();
        assert!(
            ExportTraceServiceRequest::decode(body.as_slice()).is_err(),
            "too deep for the decoder"
        );
        let clipped = clip_deep_values(&body, false).expect("something was clipped");
        let decoded = ExportTraceServiceRequest::decode(clipped.as_slice()).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.name, "deep");
        assert_eq!(
            span.attributes[1].value,
            Some(AnyValue {
                value: Some(any_value::Value::StringValue("kept".into()))
            })
        );
        assert!(format!("{:?}", span.attributes[0]).contains(CLIPPED_VALUE));
        // A shallow request is left alone.
        assert_eq!(clip_deep_values(&request(vec![Span::default()]).encode_to_vec(), false), None);
    }

    #[test]
    fn json_counts_objects_and_arrays_outside_strings() {
        let body = br#"{"resourceSpans": [{"name": "{[not these]}", "escaped": "\"{", "events": [{}, {}]}]}"#;
        assert_eq!(json(body, 100), Ok(6));
        assert_eq!(json(body, 5), Err(TooMany));
    }
}
