//! The one rule for malformed `params`, for every method:
//!
//! - `params` that is an array is `-32602`, with `field: "params"`;
//!   absent params and `"params": null` read as `{}` (a string, number or
//!   boolean is refused earlier, as `-32600`, by the request parser).
//! - A member that is missing, of the wrong type, out of range or
//!   unrepresentable (`1e400`, a lone surrogate, nesting past 128 levels) gets
//!   the method's domain code: `1001` for a trace (`evaluate_batch`,
//!   `validate_trace_tree`), `1002` for every other member of
//!   `evaluate_batch`, `submit_plugin_result`, `query_drift` and
//!   `generate_user_message`. Methods without a domain code (`initialize`,
//!   `shutdown`, `list_plugins`, `cache_stats`) use `-32602` for members too.
//!
//! - Members a method does not read are ignored, whatever they hold.
//!
//! Errors always name the member as a path (`params.result.score`).

use crate::protocol::{ErrorCode, Method, RpcError};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The code a malformed member of `method`'s params gets.
pub fn member_code(method: Method) -> ErrorCode {
    match method {
        Method::ValidateTraceTree => ErrorCode::InvalidTrace,
        Method::EvaluateBatch | Method::SubmitPluginResult | Method::QueryDrift | Method::GenerateUserMessage => ErrorCode::AssertionError,
        Method::Initialize | Method::Shutdown | Method::ListPlugins | Method::CacheStats => ErrorCode::InvalidParams,
    }
}

/// `params` must be an object (or absent); `-32602` otherwise.
pub fn require_object(method: Method, params: Option<&RawValue>) -> Result<(), RpcError> {
    match params.map(|p| p.get().as_bytes().first()) {
        None | Some(Some(b'{')) => Ok(()),
        Some(_) => Err(not_an_object(method)),
    }
}

fn not_an_object(method: Method) -> RpcError {
    RpcError::invalid_params(
        format!("{} params must be an object", method.name()),
        "Send params as a JSON object of named members (positional array params are not supported).",
    )
    .with_field("params")
}

/// Reads the members of `params` named in `members` into an object; absent
/// params are `{}`. Members the method does not read are skipped unread,
/// whatever they hold, as serde's derived readers skip them: a value
/// nothing can represent (`1e400`) is refused only where it is read.
pub fn object(method: Method, params: Option<&RawValue>, members: &[&str]) -> Result<Map<String, Value>, RpcError> {
    require_object(method, params)?;
    let Some(raw) = params else {
        return Ok(Map::new());
    };
    let unusable = |text: &str, e: &serde_json::Error, at: &str| match crate::json_errors::unrepresentable(text, e, at) {
        Some(u) => RpcError::new(member_code(method), u.message, crate::json_errors::PLAIN_JSON_HINT).with_field(u.field),
        None => not_an_object(method),
    };
    // Keys are owned: a key written with escapes cannot be borrowed.
    let all: Vec<(String, &RawValue)> = serde_json::from_str::<RawMembers<'_>>(raw.get())
        .map_err(|e| unusable(raw.get(), &e, "params"))?
        .0;
    let mut map = Map::new();
    // The last of repeated members wins, as in a parsed object.
    for (key, value) in all.into_iter().filter(|(k, _)| members.contains(&k.as_str())) {
        let value: Value = serde_json::from_str(value.get()).map_err(|e| unusable(value.get(), &e, &format!("params.{key}")))?;
        map.insert(key, value);
    }
    Ok(map)
}

/// An object's members in order, each value left unparsed.
struct RawMembers<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for RawMembers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = RawMembers<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RawMembers<'a>, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(RawMembers(members))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A member error from typed (serde) reading of `text`, the params of
/// `method`: named by path, in the method's domain code, with the parser's
/// position dropped and every echoed value bounded.
pub fn member_error(method: Method, text: &str, e: &serde_json::Error, shape: &str) -> RpcError {
    if let Some(u) = crate::json_errors::unrepresentable(text, e, "params") {
        return RpcError::new(member_code(method), u.message, shape).with_field(u.field);
    }
    let offset = text.lines().take(e.line().saturating_sub(1)).map(|l| l.len() + 1).sum::<usize>() + e.column().saturating_sub(1);
    let field = crate::json_errors::path_at(text, offset, "params");
    let what = e.to_string();
    let what = what.rsplit_once(" at line ").map_or(what.as_str(), |(w, _)| w);
    RpcError::new(
        member_code(method),
        format!(
            "invalid {} params at {field}: {}",
            method.name(),
            crate::text::clip(&plain(what), 160)
        ),
        shape,
    )
    .with_field(field)
}

/// The named members of one method's params, read one at a time into typed
/// values: what `submit_plugin_result`, `query_drift` and `initialize` read
/// (the others read theirs with serde, through [`Object`] and
/// [`member_error`]). A member that is null counts as absent. Errors carry
/// the method's code ([`member_code`]), the member's path
/// (`params.result.score`), built only when there is an error, and `shape`
/// as the detail.
#[derive(Debug)]
pub struct Members<'a> {
    method: Method,
    map: &'a Map<String, Value>,
    /// `""` at the top, `"result."` inside `result`.
    prefix: String,
    shape: &'a str,
    wording: Wording,
}

/// How a method words a member's problems: `submit_plugin_result trace_id
/// must be ...` and `initialize params field sdk_name must be ...`.
#[derive(Debug, Clone, Copy)]
pub enum Wording {
    /// "{method} {member} must be ...", "{method} missing required field: {member}".
    Method,
    /// "{method} params field {member} must be ...", "{method} params missing required field: {member}".
    ParamsField,
}

impl<'a> Members<'a> {
    pub fn new(method: Method, map: &'a Map<String, Value>, shape: &'a str, wording: Wording) -> Members<'a> {
        Members {
            method,
            map,
            prefix: String::new(),
            shape,
            wording,
        }
    }

    /// The member `key`, unless absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The member's name as the messages give it (`result.score`).
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// An error about member `key`.
    pub fn error(&self, key: &str, message: impl Into<String>) -> RpcError {
        RpcError::new(member_code(self.method), message, self.shape).with_field(format!("params.{}{key}", self.prefix))
    }

    /// `key` is not of the type or in the range it must be: "{method}
    /// {member} must be {what}".
    pub fn must_be(&self, key: &str, what: &str) -> RpcError {
        let (label, field) = self.label();
        self.error(key, format!("{label} {field}{} must be {what}", self.name(key)))
    }

    /// `key` is required and absent (or null).
    pub fn missing(&self, key: &str) -> RpcError {
        let (label, _) = self.label();
        self.error(key, format!("{label} missing required field: {}", self.name(key)))
    }

    /// How messages begin, and the word before a member's name.
    fn label(&self) -> (String, &'static str) {
        let m = self.method.name();
        match self.wording {
            Wording::Method => (m.to_owned(), ""),
            Wording::ParamsField => (format!("{m} params"), "field "),
        }
    }

    /// A required member, read by `read` when present.
    pub fn required<T>(&self, key: &str, read: impl FnOnce(&Self, &str) -> Result<Option<T>, RpcError>) -> Result<T, RpcError> {
        read(self, key)?.ok_or_else(|| self.missing(key))
    }

    /// A string member.
    pub fn string(&self, key: &str) -> Result<Option<&'a str>, RpcError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.must_be(key, "a string")),
        }
    }

    /// A non-empty string member of at most `max_bytes`.
    pub fn id(&self, key: &str, max_bytes: usize) -> Result<Option<&'a str>, RpcError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.len() > max_bytes => Err(self.error(
                key,
                format!(
                    "{} {} exceeds maximum length: {} > {max_bytes} bytes",
                    self.method.name(),
                    self.name(key),
                    s.len()
                ),
            )),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(_) => Err(self.must_be(key, "a non-empty string")),
        }
    }

    /// An object member, to read the members of.
    pub fn object(&self, key: &str) -> Result<Option<Members<'a>>, RpcError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Members {
                method: self.method,
                map,
                prefix: format!("{}{key}.", self.prefix),
                shape: self.shape,
                wording: self.wording,
            })),
            Some(_) => Err(self.must_be(key, "an object")),
        }
    }
}

/// A `T` read only from a JSON object. serde's derived structs also accept
/// arrays, positionally (`["a", "content", {…}]` as an assertion); named
/// members are the protocol, so an array is refused as the wrong type.
#[derive(Debug, Clone, PartialEq)]
pub struct Object<T>(pub T);

impl<T> std::ops::Deref for Object<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Members<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Members(std::marker::PhantomData))
    }
}

/// serde's account of a typed read that failed, in the protocol's words:
/// JSON types instead of Rust ones ("an object", not "struct Persona"),
/// members instead of fields, and what was expected before what was found.
fn plain(what: &str) -> String {
    let quoted = |names: &str| names.replace("` or `", ", ").replace('`', "");
    if let Some((got, expected)) = what
        .strip_prefix("invalid type: ")
        .or_else(|| what.strip_prefix("invalid value: "))
        .and_then(|rest| rest.split_once(", expected "))
    {
        return format!("expected {}, got {}", json_kind(expected), found_kind(got));
    }
    if let Some((name, tail)) = what.strip_prefix("unknown field `").and_then(|rest| rest.split_once('`')) {
        return match tail.strip_prefix(", expected one of ").or_else(|| tail.strip_prefix(", expected ")) {
            Some(valid) => format!("unknown member '{name}'; valid members: {}", quoted(valid)),
            None => format!("unknown member '{name}'; this object takes no members"),
        };
    }
    if let Some((name, _)) = what.strip_prefix("missing field `").and_then(|rest| rest.split_once('`')) {
        return format!("missing required member '{name}'");
    }
    if let Some((name, tail)) = what.strip_prefix("unknown variant `").and_then(|rest| rest.split_once('`')) {
        let valid = tail
            .strip_prefix(", expected one of ")
            .or_else(|| tail.strip_prefix(", expected "))
            .unwrap_or("");
        return format!("'{name}' is not one of: {}", quoted(valid));
    }
    what.replace('`', "'")
}

/// serde's name of an expected type, as a JSON type.
fn json_kind(expected: &str) -> String {
    match expected.trim() {
        e if e.starts_with("struct ") || e == "a map" => "an object".into(),
        "a sequence" => "a list".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" | "a string" => expected.trim().into(),
        other => other.replace('`', "'"),
    }
}

/// serde's account of a value found, as a JSON type and the value.
fn found_kind(got: &str) -> String {
    let value = |v: &str| v.trim_matches('`').to_owned();
    match got.split_once(' ') {
        Some(("integer" | "floating", v)) => format!("a number ({})", value(v.trim_start_matches("point "))),
        Some(("boolean", v)) => format!("a boolean ({})", value(v)),
        Some(("string", v)) => format!("a string ({v})"),
        _ => match got {
            "map" => "an object".into(),
            "sequence" => "a list".into(),
            "unit value" | "null" => "null".into(),
            other => other.replace('`', "'"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn non_objects_are_invalid_params_for_every_method() {
        for m in Method::ALL {
            let e = object(m, Some(&raw("[1,2]")), &[]).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParams, "{m:?}");
            assert_eq!(e.field.as_deref(), Some("params"));
        }
    }

    #[test]
    fn unrepresentable_members_get_the_domain_code_and_path() {
        let e = object(Method::QueryDrift, Some(&raw(r#"{"window_size":1e400}"#)), &["window_size"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.field.as_deref(), Some("params.window_size"));
        assert!(e.message.starts_with("number out of range"), "{}", e.message);
    }

    #[test]
    fn typed_read_failures_are_told_in_json_terms() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Turn {
            role: String,
            content: String,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct P {
            history: Vec<Turn>,
            #[serde(default)]
            max: u32,
        }
        let message = |text: &str| {
            let e = serde_json::from_str::<P>(text).unwrap_err();
            member_error(Method::GenerateUserMessage, text, &e, "shape").message
        };
        let cases = [
            (r#"{"history":5}"#, "at params.history: expected a list, got a number (5)"),
            (r#"{"history":[1]}"#, "at params.history[0]: expected an object, got a number (1)"),
            (
                r#"{"history":["x"]}"#,
                "at params.history[0]: expected an object, got a string (\"x\")",
            ),
            (
                r#"{"history":[],"zzz":1}"#,
                "at params.zzz: unknown member 'zzz'; valid members: history, max",
            ),
            (r#"{"history":[{"role":"user"}]}"#, "missing required member 'content'"),
            (
                r#"{"history":[],"max":-1}"#,
                "at params.max: expected a whole number, got a number (-1)",
            ),
            (
                r#"{"history":[],"max":true}"#,
                "at params.max: expected a whole number, got a boolean (true)",
            ),
        ];
        for (text, want) in cases {
            let got = message(text);
            assert!(got.contains(want), "{text}: {got}");
            assert!(!got.contains("struct") && !got.contains('`') && !got.contains("sequence"), "{got}");
        }
    }

    #[test]
    fn objects_only_where_members_are_named() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Turn {
            role: String,
        }
        let read = |t: &str| serde_json::from_str::<Object<Turn>>(t);
        assert_eq!(read(r#"{"role": "user"}"#).unwrap().0, Turn { role: "user".into() });
        let e = read(r#"["user"]"#).unwrap_err();
        let what = e.to_string();
        assert_eq!(plain(what.split(" at line").next().unwrap()), "expected an object, got a list");
        assert!(read("5").is_err());
    }

    #[test]
    fn absent_params_are_empty() {
        assert!(object(Method::ListPlugins, None, &[]).unwrap().is_empty());
        // Members the method does not read are skipped unread, as serde skips them.
        let text = r#"{"window_size":3,"extra":1e400,"other":"\ud800","deep":[[[[1]]]],"window_size":4}"#;
        let map = object(Method::QueryDrift, Some(&raw(text)), &["window_size"]).unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map["window_size"], 4, "the last of repeated members wins");
        let e = object(Method::QueryDrift, Some(&raw(r#"{"window_size":[1,"\ud800"]}"#)), &["window_size"]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("params.window_size[1]"));
        assert_eq!(e.code, ErrorCode::AssertionError);
    }

    #[test]
    fn members_name_their_path_in_the_methods_code_and_wording() {
        let map: Map<String, Value> =
            serde_json::from_str(r#"{"id": "", "long": "xxxxxxxxxx", "n": 3, "result": {"score": "high", "note": null}}"#).unwrap();
        let p = Members::new(Method::SubmitPluginResult, &map, "shape", Wording::Method);
        let e = p.id("id", 8).unwrap_err();
        assert_eq!(e.code, ErrorCode::AssertionError);
        assert_eq!(e.message, "submit_plugin_result id must be a non-empty string");
        assert_eq!(e.field.as_deref(), Some("params.id"));
        assert_eq!(e.detail, "shape");
        let e = p.id("long", 8).unwrap_err();
        assert_eq!(e.message, "submit_plugin_result long exceeds maximum length: 10 > 8 bytes");
        assert_eq!(p.string("n").unwrap_err().message, "submit_plugin_result n must be a string");
        assert_eq!(p.string("absent").unwrap(), None);
        let result = p.required("result", Members::object).unwrap();
        assert_eq!(result.get("note"), None, "null reads as absent");
        let e = result.required("note", Members::string).unwrap_err();
        assert_eq!(e.message, "submit_plugin_result missing required field: result.note");
        assert_eq!(e.field.as_deref(), Some("params.result.note"));
        assert_eq!(p.object("n").unwrap_err().message, "submit_plugin_result n must be an object");

        let init = Members::new(Method::Initialize, &map, "example", Wording::ParamsField);
        let e = init.string("n").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert_eq!(e.message, "initialize params field n must be a string");
        assert_eq!(
            init.missing("sdk_name").message,
            "initialize params missing required field: sdk_name"
        );
    }
}
