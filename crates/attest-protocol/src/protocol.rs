//! JSON-RPC 2.0 envelopes: parsing one request object, the error codes of
//! Attest protocol v1 §5 and of JSON-RPC itself, and serialising responses.
//!
//! Request bodies are kept as borrowed [`RawValue`]s so that a method handler
//! parses its params exactly once, and so that the wire size of a trace can be
//! measured without re-serialising it.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// Ids longer than this are refused: echoing them could push a response past
/// the 64 KiB line limit of SDK readers.
pub const MAX_ID_BYTES: usize = 1024;

/// Bounds on the parts of an error response, in characters (at most 4
/// bytes each): together with the 1 KiB id they keep an error line far
/// below the 64 KiB limit whatever the request held.
pub const MAX_MESSAGE_CHARS: usize = 1024;
pub const MAX_DETAIL_CHARS: usize = 2048;
pub const MAX_ECHOED_ID_CHARS: usize = 300;

/// Every error code the engine emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    InternalError,
    InvalidTrace,
    AssertionError,
    ProviderError,
    EngineError,
    Timeout,
    SessionError,
}

impl ErrorCode {
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::InvalidTrace => 1001,
            ErrorCode::AssertionError => 1002,
            ErrorCode::ProviderError => 2001,
            ErrorCode::EngineError => 3001,
            ErrorCode::Timeout => 3002,
            ErrorCode::SessionError => 3003,
        }
    }

    /// The `data.error_type` name (Attest protocol v1 §5 table; JSON-RPC names for the rest).
    pub fn error_type(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "PARSE_ERROR",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::MethodNotFound => "METHOD_NOT_FOUND",
            ErrorCode::InvalidParams => "INVALID_PARAMS",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::InvalidTrace => "INVALID_TRACE",
            ErrorCode::AssertionError => "ASSERTION_ERROR",
            ErrorCode::ProviderError => "PROVIDER_ERROR",
            ErrorCode::EngineError => "ENGINE_ERROR",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::SessionError => "SESSION_ERROR",
        }
    }

    /// Attest protocol v1 §5: provider errors and timeouts may succeed on retry; nothing else will.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::ProviderError | ErrorCode::Timeout)
    }
}

/// A JSON-RPC error with the engine's structured `data` block.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: ErrorCode,
    pub message: String,
    pub detail: String,
    /// The assertion the error concerns (1002).
    pub assertion_id: Option<String>,
    /// The request field the error concerns, as a path (`trace.steps[2].name`).
    pub field: Option<String>,
    /// Overrides the code's usual `retryable`: a provider that is not
    /// configured is a 2001 that no retry can fix.
    pub retryable: Option<bool>,
}

impl RpcError {
    pub fn new(code: ErrorCode, message: impl Into<String>, detail: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            detail: detail.into(),
            assertion_id: None,
            field: None,
            retryable: None,
        }
    }

    pub fn not_retryable(mut self) -> Self {
        self.retryable = Some(false);
        self
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn with_assertion(mut self, assertion_id: impl Into<String>) -> Self {
        self.assertion_id = Some(assertion_id.into());
        self
    }

    pub fn session(message: impl Into<String>, detail: impl Into<String>) -> Self {
        RpcError::new(ErrorCode::SessionError, message, detail)
    }

    pub fn invalid_params(message: impl Into<String>, detail: impl Into<String>) -> Self {
        RpcError::new(ErrorCode::InvalidParams, message, detail)
    }
}

impl RpcError {
    /// The message as SDKs print it: what went wrong, then what to do about
    /// it and the valid choices, which `detail` holds. SDKs show `message`
    /// alone (attest-ai 0.9 prints nothing of `data`), so a fix left in
    /// `detail` would never reach the user. `detail` keeps the whole text.
    pub fn shown_message(&self) -> std::borrow::Cow<'_, str> {
        let fix = self.detail.trim();
        if fix.is_empty() || self.message.contains(fix) {
            return std::borrow::Cow::Borrowed(&self.message);
        }
        std::borrow::Cow::Owned(format!("{} — {fix}", self.message))
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code.code(), self.code.error_type(), self.message)
    }
}

impl Serialize for RpcError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Data<'a> {
            error_type: &'static str,
            retryable: bool,
            detail: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            assertion_id: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            field: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Wire<'a> {
            code: i64,
            message: &'a str,
            data: Data<'a>,
        }
        // Every part may echo the request: bound each here, in the one place
        // errors are written, so no error line can outgrow an SDK's reader.
        let message = crate::text::clip(&self.shown_message(), MAX_MESSAGE_CHARS);
        let detail = crate::text::clip(&self.detail, MAX_DETAIL_CHARS);
        let assertion_id = self.assertion_id.as_deref().map(|a| crate::text::clip(a, MAX_ECHOED_ID_CHARS));
        let field = self.field.as_deref().map(|f| crate::text::clip(f, MAX_ECHOED_ID_CHARS));
        Wire {
            code: self.code.code(),
            message: &message,
            data: Data {
                error_type: self.code.error_type(),
                retryable: self.retryable.unwrap_or_else(|| self.code.retryable()),
                detail: &detail,
                assertion_id: assertion_id.as_deref(),
                field: field.as_deref(),
            },
        }
        .serialize(s)
    }
}

/// The methods this engine knows. Parsing the name once gives handlers an enum
/// to match on and keeps the list of valid names in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Initialize,
    EvaluateBatch,
    SubmitPluginResult,
    Shutdown,
    QueryDrift,
    GenerateUserMessage,
    ListPlugins,
    ValidateTraceTree,
    CacheStats,
}

impl Method {
    pub const ALL: [Method; 9] = [
        Method::Initialize,
        Method::EvaluateBatch,
        Method::SubmitPluginResult,
        Method::Shutdown,
        Method::QueryDrift,
        Method::GenerateUserMessage,
        Method::ListPlugins,
        Method::ValidateTraceTree,
        Method::CacheStats,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::EvaluateBatch => "evaluate_batch",
            Method::SubmitPluginResult => "submit_plugin_result",
            Method::Shutdown => "shutdown",
            Method::QueryDrift => "query_drift",
            Method::GenerateUserMessage => "generate_user_message",
            Method::ListPlugins => "list_plugins",
            Method::ValidateTraceTree => "validate_trace_tree",
            Method::CacheStats => "cache_stats",
        }
    }

    pub fn parse(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One request object as found on the wire. Every member is kept raw so that
/// a malformed member produces a precise `-32600` instead of a parse failure.
#[derive(Deserialize)]
struct WireRequest<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    // `Some(raw)` even for an explicit `null`: only an absent id makes a notification.
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A well-formed request, ready for dispatch.
#[derive(Debug)]
pub struct Request<'a> {
    /// `None` for a notification.
    pub id: Option<&'a RawValue>,
    pub method: Result<Method, String>,
    pub params: Option<&'a RawValue>,
}

/// The id JSON-RPC prescribes when a request's own id cannot be determined.
pub fn null_id() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is valid JSON")
}

/// Why one request object could not become a [`Request`], with the id to
/// answer under (JSON `null` when the id itself could not be read).
pub struct Rejected {
    pub id: Box<RawValue>,
    pub error: RpcError,
}

/// Parses one request object from its text, in a single pass: invalid JSON
/// is `-32700`, valid JSON that is not a request object is `-32600`.
pub fn parse_request(text: &str) -> Result<Request<'_>, Rejected> {
    let reject = |id: Box<RawValue>, code: ErrorCode, message: &str, detail: String| Rejected {
        id,
        error: RpcError::new(code, message, detail),
    };
    // serde would read an array as positional struct fields: `["2.0",7,"shutdown"]`
    // must be refused, not run.
    if !text.starts_with('{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => reject(
                null_id(),
                ErrorCode::InvalidRequest,
                "invalid request: expected a JSON object",
                "Each line must hold one JSON-RPC 2.0 request object, or an array of request objects (a batch).".into(),
            ),
            Err(e) => reject(
                null_id(),
                ErrorCode::ParseError,
                "parse error: line is not valid JSON",
                format!("{e}. Send one compact JSON-RPC request per line."),
            ),
        });
    }
    let wire: WireRequest<'_> = match serde_json::from_str(text) {
        Ok(w) => w,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return Err(reject(
                null_id(),
                ErrorCode::ParseError,
                "parse error: line is not valid JSON",
                format!("{e}. Send one compact JSON-RPC request per line."),
            ))
        }
        Err(_) if !text.starts_with('{') => {
            return Err(reject(
                null_id(),
                ErrorCode::InvalidRequest,
                "invalid request: expected a JSON object",
                "Each line must hold one JSON-RPC 2.0 request object, or an array of them (a batch).".into(),
            ));
        }
        Err(e) => {
            return Err(reject(
                null_id(),
                ErrorCode::InvalidRequest,
                "invalid request: malformed request object",
                format!(
                "The request object could not be read: {e}. Send {{\"jsonrpc\":\"2.0\",\"id\":<id>,\"method\":<name>,\"params\":{{...}}}}."
            ),
            ))
        }
    };
    let reject = |id: Box<RawValue>, message: &str, detail: String| reject(id, ErrorCode::InvalidRequest, message, detail);
    let id = match wire.id {
        Some(id) if id.get().len() > MAX_ID_BYTES => {
            return Err(reject(
                null_id(),
                "invalid request: id too long",
                format!(
                    "The request id is {} bytes; ids are limited to {MAX_ID_BYTES} bytes. Use a short string or an integer.",
                    id.get().len()
                ),
            ))
        }
        other => other,
    };
    let answer_id = || id.map(|i| i.to_owned()).unwrap_or_else(null_id);
    match wire.jsonrpc.map(|v| v.get()) {
        Some("\"2.0\"") => {}
        Some(other) => {
            return Err(reject(
                answer_id(),
                "invalid request: jsonrpc must be \"2.0\"",
                format!(
                    "Got jsonrpc = {}. Set \"jsonrpc\":\"2.0\" on every request.",
                    crate::text::clip(other, 64)
                ),
            ))
        }
        None => {
            return Err(reject(
                answer_id(),
                "invalid request: missing jsonrpc member",
                "Set \"jsonrpc\":\"2.0\" on every request.".into(),
            ))
        }
    }
    let method = match wire.method {
        None => {
            return Err(reject(
                answer_id(),
                "invalid request: missing method",
                format!("Set \"method\" to one of: {}.", method_list()),
            ))
        }
        Some(m) => match serde_json::from_str::<String>(m.get()) {
            Ok(name) => Method::parse(&name).ok_or(name),
            Err(_) => {
                // A string serde cannot represent holds a lone surrogate escape.
                let (message, why) = if m.get().starts_with('"') {
                    (
                        "invalid request: method is not a valid string",
                        ": it holds an escape that is not a Unicode character (a lone surrogate such as \\ud800)",
                    )
                } else {
                    ("invalid request: method must be a string", "")
                };
                return Err(reject(
                    answer_id(),
                    message,
                    format!(
                        "Got method = {}{why}. Set \"method\" to one of: {}.",
                        crate::text::clip(m.get(), 64),
                        method_list()
                    ),
                ));
            }
        },
    };
    if let Some(p) = wire.params {
        let first = p.get().as_bytes().first();
        if !matches!(first, Some(b'{') | Some(b'[')) && p.get() != "null" {
            return Err(reject(
                answer_id(),
                "invalid request: params must be an object or an array",
                "JSON-RPC 2.0 params are structured values. Send \"params\":{...}.".into(),
            ));
        }
    }
    Ok(Request {
        id,
        method,
        params: wire.params.filter(|p| p.get() != "null"),
    })
}

/// Comma-separated method names, for `detail` texts.
pub fn method_list() -> String {
    Method::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
}

/// Reads back the id of a response line.
#[derive(Deserialize)]
pub struct ReplyId {
    pub id: Box<RawValue>,
}

/// The response line of a JSON-RPC batch: its members' responses, in
/// order, as one array.
pub fn batch_line(members: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(members.iter().map(|m| m.len() + 1).sum::<usize>() + 1);
    out.push(b'[');
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    out.push(b']');
    out
}

/// Serialises a success response line (without the trailing newline).
pub fn success_line<T: Serialize>(id: &RawValue, result: &T) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    struct Success<'a, T> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        result: &'a T,
    }
    serde_json::to_vec(&Success {
        jsonrpc: "2.0",
        id,
        result,
    })
}

/// Serialises an error response line (without the trailing newline).
pub fn error_line(id: &RawValue, error: &RpcError) -> Vec<u8> {
    #[derive(Serialize)]
    struct Failure<'a> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        error: &'a RpcError,
    }
    serde_json::to_vec(&Failure { jsonrpc: "2.0", id, error }).expect("error responses always serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_and_keeps_the_id_text() {
        let r = r#"{"jsonrpc":"2.0","id":1.50,"method":"shutdown","params":{}}"#;
        let req = parse_request(r).ok().unwrap();
        assert_eq!(req.id.unwrap().get(), "1.50");
        assert_eq!(req.method, Ok(Method::Shutdown));
    }

    #[test]
    fn null_id_is_not_a_notification() {
        let r = r#"{"jsonrpc":"2.0","id":null,"method":"shutdown"}"#;
        assert_eq!(parse_request(r).ok().unwrap().id.unwrap().get(), "null");
        let r = r#"{"jsonrpc":"2.0","method":"shutdown"}"#;
        assert!(parse_request(r).ok().unwrap().id.is_none());
    }

    #[test]
    fn unknown_method_is_kept_for_the_error() {
        let r = r#"{"jsonrpc":"2.0","id":"a","method":"frobnicate"}"#;
        assert_eq!(parse_request(r).ok().unwrap().method, Err("frobnicate".into()));
    }

    #[test]
    fn rejects_wrong_version_with_the_id() {
        let r = r#"{"jsonrpc":"1.0","id":7,"method":"shutdown"}"#;
        let rej = parse_request(r).err().unwrap();
        assert_eq!(rej.id.get(), "7");
        assert_eq!(rej.error.code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn rejects_non_string_method_and_scalar_params() {
        let r = r#"{"jsonrpc":"2.0","id":7,"method":5}"#;
        assert!(parse_request(r).is_err());
        let r = r#"{"jsonrpc":"2.0","id":7,"method":"shutdown","params":3}"#;
        assert!(parse_request(r).is_err());
        let r = r#"{"jsonrpc":"2.0","id":7,"method":"\ud800"}"#;
        let e = parse_request(r).err().unwrap().error;
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert!(
            e.message.contains("method is not a valid string") && e.detail.contains("lone surrogate"),
            "{e:?}"
        );
    }

    #[test]
    fn syntax_errors_are_parse_errors_and_other_json_is_invalid() {
        assert_eq!(parse_request("{\"jsonrpc\":").err().unwrap().error.code, ErrorCode::ParseError);
        assert_eq!(parse_request("{} x").err().unwrap().error.code, ErrorCode::ParseError);
        assert_eq!(parse_request("42").err().unwrap().error.code, ErrorCode::InvalidRequest);
        assert_eq!(parse_request("\"s\"").err().unwrap().error.code, ErrorCode::InvalidRequest);
        assert_eq!(parse_request("tru").err().unwrap().error.code, ErrorCode::ParseError);
    }

    #[test]
    fn arrays_are_not_positional_requests() {
        let rej = parse_request(r#"["2.0",7,"list_plugins"]"#).err().unwrap();
        assert_eq!(rej.error.code, ErrorCode::InvalidRequest);
        assert_eq!(rej.id.get(), "null");
    }

    #[test]
    fn error_line_has_structured_data() {
        let e = RpcError::new(ErrorCode::Timeout, "m", "d").with_field("trace");
        let line = String::from_utf8(error_line(&null_id(), &e)).unwrap();
        assert_eq!(
            line,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":3002,"message":"m — d","data":{"error_type":"TIMEOUT","retryable":true,"detail":"d","field":"trace"}}}"#
        );
    }
}
