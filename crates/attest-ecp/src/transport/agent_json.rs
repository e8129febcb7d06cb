//! Reading what an agent writes as JSON, as leniently as Python's `json`
//! module does (`NaN`, `Infinity`, lone surrogates), and within a bound on
//! how many containers a text may open.

use super::*;

/// An agent's JSON text as a value. Python's `json` module, which agents
/// built on `ecp-sdk` write with, escapes a lone UTF-16 surrogate (`\ud800`)
/// where text holds one; such escapes are read as U+FFFD instead of refusing
/// the whole answer. Nesting deeper than 128 levels is refused, with a
/// message that says so.
pub fn agent_json(text: &str) -> Result<Value, AgentJsonError> {
    // An answer may parse into some 50 times its size when it is all tiny
    // objects (1.3 million tool calls in a 16 MiB line, say): count them first.
    let max = (text.len() / MIN_BYTES_PER_CONTAINER).max(MIN_CONTAINERS) as u64;
    if attest_io::json_containers(text.as_bytes(), max).is_err() {
        return Err(AgentJsonError::TooManyContainers(max));
    }
    parse_agent_json(text).map_err(AgentJsonError::Json)
}

/// Why an agent's JSON text was not read.
#[derive(Debug)]
pub enum AgentJsonError {
    Json(serde_json::Error),
    TooManyContainers(u64),
}

impl std::fmt::Display for AgentJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentJsonError::Json(e) => write!(f, "{e}"),
            AgentJsonError::TooManyContainers(max) => write!(
                f,
                "it holds more than {max} JSON objects and arrays (one per {MIN_BYTES_PER_CONTAINER} bytes of text at most); answer with fewer, larger items"
            ),
        }
    }
}

/// Answers average at least this many bytes of text per object or array.
const MIN_BYTES_PER_CONTAINER: usize = 16;

/// However short an answer, this many objects and arrays are allowed.
const MIN_CONTAINERS: usize = 4096;

/// An agent's JSON, read as Python's `json` module (which `ecp-sdk` uses)
/// writes it: a lone surrogate escape becomes U+FFFD, and the non-finite
/// numbers `NaN`, `Infinity` and `-Infinity`, which JSON has no spelling
/// for, become `null`.
fn parse_agent_json(text: &str) -> serde_json::Result<Value> {
    match serde_json::from_str(text) {
        Err(e) if e.is_syntax() => {
            let surrogates = replace_lone_surrogates(text);
            let non_finite = replace_non_finite(surrogates.as_deref().unwrap_or(text));
            match non_finite.or(surrogates) {
                Some(fixed) => serde_json::from_str(&fixed),
                None => Err(e),
            }
        }
        other => other,
    }
}

/// `text` with each `NaN`, `Infinity` and `-Infinity` outside strings
/// replaced by `null`; `None` when it has none.
fn replace_non_finite(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied, mut in_string) = (0, 0, false);
    while i < b.len() {
        match b[i] {
            b'\\' if in_string => i += 2,
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'N' | b'I' | b'-' if !in_string => {
                let word = ["NaN", "Infinity", "-Infinity"].into_iter().find(|w| text[i..].starts_with(w));
                // A whole token: not the start of a longer word.
                let whole = word.filter(|w| !b.get(i + w.len()).is_some_and(|c| c.is_ascii_alphanumeric()));
                match whole {
                    Some(w) => {
                        out.push_str(&text[copied..i]);
                        out.push_str("null");
                        i += w.len();
                        copied = i;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// `text` with each `\uXXXX` escape of a lone surrogate replaced by
/// `\ufffd`; `None` when it has none.
fn replace_lone_surrogates(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let unit = |i: usize| -> Option<u16> {
        (b.get(i) == Some(&b'\\') && b.get(i + 1) == Some(&b'u'))
            .then(|| text.get(i + 2..i + 6).and_then(|h| u16::from_str_radix(h, 16).ok()))
            .flatten()
    };
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        match unit(i) {
            Some(0xD800..=0xDBFF) if matches!(unit(i + 6), Some(0xDC00..=0xDFFF)) => i += 12,
            Some(0xD800..=0xDFFF) => {
                out.push_str(&text[copied..i]);
                out.push_str("\\ufffd");
                i += 6;
                copied = i;
            }
            Some(_) => i += 6,
            // Any other escape is two characters: `\\` must not make the
            // next backslash look like the start of an escape.
            None => i += 2,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}
