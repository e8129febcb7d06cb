//! A strict RFC 8259 scanner that works on raw line bytes.
//!
//! The fuzzer cannot model requests with `serde_json::Value`: the inputs it
//! cares most about (`1e400`, lone surrogates such as `"\ud800"`, nesting
//! thousands of levels deep) are valid JSON text that `serde_json` refuses or
//! cannot represent. This scanner accepts exactly the RFC grammar, never
//! recurses (so any depth is fine), and hands back the raw text of top-level
//! members so that ids can be compared byte for byte, as the engine echoes them.

use std::ops::Range;

/// What a scan noticed that may legitimately hit a parser's implementation
/// limits (RFC 8259 §9), so that a peer may refuse it with a parse error.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Edges {
    /// Deepest nesting of arrays and objects (a scalar is depth 0).
    pub depth: usize,
    /// A `\uD800`–`\uDFFF` escape that is not part of a valid pair.
    pub lone_surrogate: bool,
    /// A number whose magnitude does not fit in an `f64`.
    pub huge_number: bool,
}

impl Edges {
    /// Nesting deeper than this, or the other edges, may be refused by a
    /// conforming parser (serde_json stops at 128 levels).
    pub const DEEP: usize = 100;

    pub fn is_edgy(&self) -> bool {
        self.depth > Self::DEEP || self.lone_surrogate || self.huge_number
    }
}

/// The kind of a JSON value, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    Literal,
}

/// A whole line that holds exactly one JSON value.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub kind: Kind,
    /// The value without surrounding whitespace.
    pub span: Range<usize>,
    pub edges: Edges,
}

/// JSON's own whitespace: anything else (`\x0b`, `\x0c`, NBSP, U+2028…) is not.
pub fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_json_ws(b[i]) {
        i += 1;
    }
    i
}

/// Scans a whole line: one JSON value with optional JSON whitespace around it.
/// `None` when the line is not UTF-8 or not a single JSON value.
pub fn scan_line(b: &[u8]) -> Option<Scanned> {
    std::str::from_utf8(b).ok()?;
    let start = ws(b, 0);
    let mut edges = Edges::default();
    let end = skip_value(b, start, &mut edges)?;
    if ws(b, end) != b.len() {
        return None;
    }
    let kind = match b[start] {
        b'{' => Kind::Object,
        b'[' => Kind::Array,
        b'"' => Kind::String,
        b't' | b'f' | b'n' => Kind::Literal,
        _ => Kind::Number,
    };
    Some(Scanned {
        kind,
        span: start..end,
        edges,
    })
}

/// Skips one value starting at `i` (no leading whitespace); returns its end.
/// Iterative, so nesting depth costs heap, not stack.
pub fn skip_value(b: &[u8], mut i: usize, edges: &mut Edges) -> Option<usize> {
    let mut stack: Vec<u8> = Vec::new();
    loop {
        i = ws(b, i);
        // A value is expected at `i`.
        match *b.get(i)? {
            b'{' => {
                i = ws(b, i + 1);
                if b.get(i) == Some(&b'}') {
                    edges.depth = edges.depth.max(stack.len() + 1);
                    i += 1;
                } else {
                    stack.push(b'{');
                    edges.depth = edges.depth.max(stack.len());
                    i = skip_string(b, i, edges)?;
                    i = ws(b, i);
                    if b.get(i) != Some(&b':') {
                        return None;
                    }
                    i += 1;
                    continue;
                }
            }
            b'[' => {
                i = ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    edges.depth = edges.depth.max(stack.len() + 1);
                    i += 1;
                } else {
                    stack.push(b'[');
                    edges.depth = edges.depth.max(stack.len());
                    continue;
                }
            }
            b'"' => i = skip_string(b, i, edges)?,
            b't' => i = literal(b, i, b"true")?,
            b'f' => i = literal(b, i, b"false")?,
            b'n' => i = literal(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = skip_number(b, i, edges)?,
            _ => return None,
        }
        // A value ended: close containers until one continues.
        loop {
            let Some(&top) = stack.last() else { return Some(i) };
            i = ws(b, i);
            match (top, b.get(i)) {
                (b'{', Some(b',')) => {
                    i = ws(b, i + 1);
                    i = skip_string(b, i, edges)?;
                    i = ws(b, i);
                    if b.get(i) != Some(&b':') {
                        return None;
                    }
                    i += 1;
                    break;
                }
                (b'[', Some(b',')) => {
                    i += 1;
                    break;
                }
                (b'{', Some(b'}')) | (b'[', Some(b']')) => {
                    stack.pop();
                    i += 1;
                }
                _ => return None,
            }
        }
    }
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    b.get(i..i + word.len()).filter(|s| *s == word).map(|_| i + word.len())
}

fn hex4(b: &[u8], i: usize) -> Option<u16> {
    let s = std::str::from_utf8(b.get(i..i + 4)?).ok()?;
    if !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(s, 16).ok()
}

/// Skips a string at `i` (which must be `"`), checking escapes and noting lone surrogates.
fn skip_string(b: &[u8], i: usize, edges: &mut Edges) -> Option<usize> {
    decode_string(b, i, edges).map(|(end, _)| end)
}

/// Decodes the string at `i`; lone surrogates become U+FFFD.
pub fn decode_string(b: &[u8], mut i: usize, edges: &mut Edges) -> Option<(usize, String)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    i += 1;
    let mut out = Vec::new();
    let mut pending_high: Option<u16> = None;
    loop {
        let c = *b.get(i)?;
        // A high surrogate must be followed at once by a `\u` escape.
        if (c != b'\\' || b.get(i + 1) != Some(&b'u')) && pending_high.take().is_some() {
            edges.lone_surrogate = true;
            out.extend_from_slice("\u{fffd}".as_bytes());
        }
        match c {
            b'"' => {
                let s = String::from_utf8(out).ok()?;
                return Some((i + 1, s));
            }
            0..=0x1f => return None,
            b'\\' => {
                let e = *b.get(i + 1)?;
                let plain = match e {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        let u = hex4(b, i + 2)?;
                        i += 6;
                        match u {
                            0xD800..=0xDBFF => {
                                if pending_high.replace(u).is_some() {
                                    edges.lone_surrogate = true;
                                    out.extend_from_slice("\u{fffd}".as_bytes());
                                }
                            }
                            0xDC00..=0xDFFF => match pending_high.take() {
                                Some(h) => {
                                    let cp = 0x10000 + ((u32::from(h) - 0xD800) << 10) + (u32::from(u) - 0xDC00);
                                    let ch = char::from_u32(cp)?;
                                    out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                                }
                                None => {
                                    edges.lone_surrogate = true;
                                    out.extend_from_slice("\u{fffd}".as_bytes());
                                }
                            },
                            _ => {
                                if pending_high.take().is_some() {
                                    edges.lone_surrogate = true;
                                    out.extend_from_slice("\u{fffd}".as_bytes());
                                }
                                let ch = char::from_u32(u32::from(u))?;
                                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                            }
                        }
                        continue;
                    }
                    _ => return None,
                };
                out.push(plain);
                i += 2;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
}

fn skip_number(b: &[u8], start: usize, edges: &mut Edges) -> Option<usize> {
    let mut i = start;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    if matches!(b.get(i), Some(b'e') | Some(b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+') | Some(b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    let text = std::str::from_utf8(&b[start..i]).ok()?;
    if text.parse::<f64>().map_or(true, |f| f.is_infinite()) {
        edges.huge_number = true;
    }
    Some(i)
}

/// The members of the object at `span`: decoded key and raw value span.
pub fn object_members(b: &[u8], span: Range<usize>) -> Option<Vec<(String, Range<usize>)>> {
    let mut out = Vec::new();
    let mut edges = Edges::default();
    let mut i = ws(b, span.start + 1);
    if b.get(i) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let (after_key, key) = decode_string(b, i, &mut edges)?;
        i = ws(b, after_key);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let vstart = ws(b, i + 1);
        let vend = skip_value(b, vstart, &mut edges)?;
        out.push((key, vstart..vend));
        i = ws(b, vend);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b'}' => return Some(out),
            _ => return None,
        }
    }
}

/// The element spans of the array at `span`.
pub fn array_elements(b: &[u8], span: Range<usize>) -> Option<Vec<Range<usize>>> {
    let mut out = Vec::new();
    let mut edges = Edges::default();
    let mut i = ws(b, span.start + 1);
    if b.get(i) == Some(&b']') {
        return Some(out);
    }
    loop {
        let end = skip_value(b, i, &mut edges)?;
        out.push(i..end);
        i = ws(b, end);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b']' => return Some(out),
            _ => return None,
        }
    }
}

/// The edges of the value at `span` on its own.
pub fn edges_of(b: &[u8], span: Range<usize>) -> Edges {
    let mut edges = Edges::default();
    let _ = skip_value(b, span.start, &mut edges);
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_rfc_json_serde_refuses() {
        let s = scan_line(br#"{"a":1e400,"b":"\ud800","c":-0.0}"#).unwrap();
        assert_eq!(s.kind, Kind::Object);
        assert!(s.edges.huge_number && s.edges.lone_surrogate);
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan_line(deep.as_bytes()).unwrap().edges.depth, 100_000);
    }

    #[test]
    fn refuses_what_is_not_json() {
        for bad in [
            &b"\x0b{}"[..],
            b"{} x",
            b"{\"a\":}",
            b"[1,]",
            b"\xff",
            b"01",
            b"\"\x01\"",
            b"",
            b"\xc2\xa0{}",
        ] {
            assert!(scan_line(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(scan_line(b" \t{}\r").is_some());
    }

    #[test]
    fn members_keep_raw_text_and_decode_keys() {
        let line = br#"{"\u0069d" : 1.50, "x":[1, {"y":2}]}"#;
        let s = scan_line(line).unwrap();
        let m = object_members(line, s.span).unwrap();
        assert_eq!(m[0].0, "id");
        assert_eq!(&line[m[0].1.clone()], b"1.50");
        assert_eq!(&line[m[1].1.clone()], br#"[1, {"y":2}]"#);
        let line = br#"[1, [2], {"a":3}]"#;
        let e = array_elements(line, 0..line.len()).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(&line[e[1].clone()], b"[2]");
    }
}
