//! Describing why JSON text that is *syntactically* valid still cannot become
//! a value: a number out of `f64` range (`1e400`), a lone surrogate escape
//! (`"\ud800"`), or nesting deeper than the parser's recursion limit.
//!
//! Request lines are first read as borrowed raw values, which only check
//! syntax; these problems surface later, when one member is parsed for real.
//! Users must then be told which member is at fault (`spec.value`,
//! `trace.steps[2].args`), not that "the line is not valid JSON", so this
//! module turns a `serde_json` error position back into a field path by
//! scanning the text up to that position.

use serde_json::error::Category;

/// What to do about an unrepresentable value: the `detail` of every such error.
pub const PLAIN_JSON_HINT: &str = "Send plain JSON: finite numbers within ±1.8e308, strings of valid Unicode (no lone \\ud800-\\udfff escapes), at most 128 levels of nesting.";

/// The JSON nesting depth `serde_json` refuses beyond (its recursion limit).
pub const MAX_NESTING: usize = 128;

/// What made a value unrepresentable, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrepresentable {
    /// Human sentence: `number out of range at spec.value`.
    pub message: String,
    /// The field path, starting with the caller's root (`spec.value`).
    pub field: String,
}

/// Describes `err`, raised while parsing `text` as a value rooted at `root`.
/// Returns `None` for ordinary type errors (a string where an object was
/// expected), which callers explain in their own terms.
pub fn unrepresentable(text: &str, err: &serde_json::Error, root: &str) -> Option<Unrepresentable> {
    let msg = err.to_string();
    let what = if msg.starts_with("number out of range") {
        "number out of range (beyond ±1.8e308)"
    } else if msg.contains("surrogate") || msg.contains("hex escape") || msg.contains("control character") {
        "string holds an invalid escape (a lone UTF-16 surrogate such as \\ud800, or a control character)"
    } else if msg.starts_with("recursion limit exceeded") {
        "nesting too deep"
    } else if matches!(err.classify(), Category::Syntax | Category::Eof) {
        "invalid JSON"
    } else {
        return None;
    };
    let offset = offset_of(text, err.line(), err.column());
    let field = path_at(text, offset, root);
    let message = if what == "nesting too deep" {
        format!("{what} at {field}: JSON may nest at most {MAX_NESTING} levels")
    } else {
        format!("{what} at {field}")
    };
    Some(Unrepresentable { message, field })
}

/// Byte offset of a 1-based (line, column) position; columns count bytes.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line.max(1) {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => break,
        }
    }
    (start + column.saturating_sub(1)).min(text.len())
}

enum Frame {
    /// Inside an object: the key of the member being read, if seen yet.
    Object(Option<String>),
    /// Inside an array: the index of the element being read.
    Array(usize),
}

/// The path of the member that encloses byte `offset` of `text`.
/// `text` must be syntactically valid JSON up to `offset` (or nearly: the
/// scan never fails, it only stops).
pub fn path_at(text: &str, offset: usize, root: &str) -> String {
    let bytes = text.as_bytes();
    let end = offset.min(bytes.len());
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    // In an object, the next string is a key after `{` or `,`.
    let mut expect_key = false;
    while i < end {
        match bytes[i] {
            b'{' => {
                stack.push(Frame::Object(None));
                expect_key = true;
            }
            b'[' => {
                stack.push(Frame::Array(0));
                expect_key = false;
            }
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
            }
            b',' => match stack.last_mut() {
                Some(Frame::Array(n)) => *n += 1,
                Some(Frame::Object(key)) => {
                    *key = None;
                    expect_key = true;
                }
                None => {}
            },
            b'"' => {
                // Read to the closing quote even past `end`: an error inside a
                // key (a lone surrogate) must still name the whole key.
                let (s, next) = read_string(bytes, i + 1, bytes.len());
                if expect_key {
                    if let Some(Frame::Object(key)) = stack.last_mut() {
                        *key = Some(s);
                    }
                    expect_key = false;
                }
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    // Deep paths are shown by their start: that is the member to fix.
    const SHOWN_FRAMES: usize = 12;
    let mut path = root.to_owned();
    for frame in stack.iter().take(SHOWN_FRAMES) {
        match frame {
            Frame::Object(Some(key)) => push_key(&mut path, key),
            Frame::Object(None) => {}
            Frame::Array(n) => path.push_str(&format!("[{n}]")),
        }
    }
    if stack.len() > SHOWN_FRAMES {
        path.push('…');
    }
    crate::text::clip(&path, 200)
}

/// `a.b`, or `a["odd key"]` when the key is not a plain identifier.
fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push_str(&format!("[{}]", serde_json::Value::String(crate::text::clip(key, 40))));
    }
}

/// Reads a string body starting after its opening quote; returns its text
/// (escapes kept as written: only used for naming keys) and the index after
/// the closing quote.
fn read_string(bytes: &[u8], mut i: usize, end: usize) -> (String, usize) {
    let start = i;
    while i < end {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return (String::from_utf8_lossy(&bytes[start..i]).into_owned(), i + 1),
            _ => i += 1,
        }
    }
    (String::from_utf8_lossy(&bytes[start..end.min(bytes.len())]).into_owned(), end)
}

/// The deepest JSON nesting of `text` (1 for a flat object), not counting
/// brackets inside strings. Used to explain a recursion-limit failure.
pub fn max_nesting(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            _ => {}
        }
        i += 1;
    }
    max
}

/// How many `key` members are open at once at the deepest point of `text`:
/// for a trace, how deep `sub_trace` objects nest. Counted by scanning, so
/// it works on text too deep for the parser.
pub fn max_key_nesting(text: &str, key: &str) -> usize {
    let bytes = text.as_bytes();
    // Per open container: whether it was opened as the value of `key`.
    let mut stack: Vec<bool> = Vec::new();
    let (mut open, mut max, mut i) = (0usize, 0usize, 0usize);
    let mut last_key_matched = false;
    let mut expect_key = false;
    let mut in_object: Vec<bool> = Vec::new();
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => {
                let is_key = last_key_matched;
                stack.push(is_key);
                in_object.push(bytes[i] == b'{');
                if is_key {
                    open += 1;
                    max = max.max(open);
                }
                last_key_matched = false;
                expect_key = bytes[i] == b'{';
            }
            b'}' | b']' => {
                if stack.pop() == Some(true) {
                    open -= 1;
                }
                in_object.pop();
                last_key_matched = false;
                expect_key = false;
            }
            b',' => {
                last_key_matched = false;
                expect_key = in_object.last() == Some(&true);
            }
            b'"' => {
                let (s, next) = read_string(bytes, i + 1, bytes.len());
                if expect_key {
                    last_key_matched = s == key;
                    expect_key = false;
                }
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn describe(text: &str) -> Option<Unrepresentable> {
        let err = serde_json::from_str::<Value>(text).unwrap_err();
        unrepresentable(text, &err, "spec")
    }

    #[test]
    fn names_the_member_of_an_out_of_range_number() {
        let u = describe(r#"{"check":"x","value":1e400}"#).unwrap();
        assert_eq!(u.field, "spec.value");
        assert!(u.message.starts_with("number out of range"), "{}", u.message);
    }

    #[test]
    fn names_array_elements_and_nested_keys() {
        let u = describe(r#"{"a":{"b":[1,2,{"c":"\ud800"}]}}"#).unwrap();
        assert_eq!(u.field, "spec.a.b[2].c");
        assert!(u.message.contains("surrogate"), "{}", u.message);
        // An invalid escape inside a key names the whole key.
        let text = r#"{"output":{"ab\udfffcd":1}}"#;
        let e = serde_json::from_str::<serde_json::Value>(text).unwrap_err();
        let u = unrepresentable(text, &e, "trace").unwrap();
        assert_eq!(u.field, r#"trace.output["ab\\udfffcd"]"#);
    }

    #[test]
    fn odd_keys_are_quoted() {
        let u = describe(r#"{"a b":1e999}"#).unwrap();
        assert_eq!(u.field, r#"spec["a b"]"#);
    }

    #[test]
    fn deep_nesting_is_named() {
        let text = format!("{{\"x\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        let u = describe(&text).unwrap();
        assert!(u.message.starts_with("nesting too deep"), "{}", u.message);
        assert_eq!(u.field, "spec.x[0][0][0][0][0][0][0][0][0][0][0]…");
        assert_eq!(max_nesting(&text), 201);
    }

    #[test]
    fn type_errors_are_left_to_the_caller() {
        let err = serde_json::from_str::<String>("3").unwrap_err();
        assert!(unrepresentable("3", &err, "spec").is_none());
    }

    #[test]
    fn counts_nested_keys() {
        let t = r#"{"steps":[{"sub_trace":{"steps":[{"sub_trace":{"s":"}{\"sub_trace\":{"}}]}}]}"#;
        assert_eq!(max_key_nesting(t, "sub_trace"), 2);
        assert_eq!(max_key_nesting(r#"{"a":1}"#, "sub_trace"), 0);
    }
}
