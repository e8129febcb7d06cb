//! Small text helpers for explanations and error messages: bounded quoting
//! of user-supplied values and compact number formatting, and a fast
//! form of the case-insensitive containment the content checks make. The engine and
//! plugins share them, so plugin explanations read like the engine's own
//! (`'value'` quoting, `…` where something was cut).
//!
//! Everything user-controlled that the engine echoes back goes through
//! [`clip`] or [`quote`], which is what keeps response lines far below the
//! 64 KiB limit of SDK readers.

use std::borrow::Cow;

/// Longest user value quoted inside an explanation or error message.
pub const MAX_QUOTED_CHARS: usize = 120;

/// Truncates `s` to at most `max` characters, marking the cut with `…`.
/// Bidirectional-text controls are made visible (`<U+202E>`), so that an
/// echoed value can never reorder how a report or terminal shows the text
/// around it.
pub fn clip(s: &str, max: usize) -> String {
    clipped(s, max).into_owned()
}

/// [`clip`], borrowing `s` when it needs no change.
fn clipped(s: &str, max: usize) -> Cow<'_, str> {
    // Every explanation passes through here: a string no longer in bytes
    // than `max` has no more than `max` characters, so nothing to count.
    let cut = match cut_at(s, max) {
        None => Cow::Borrowed(s),
        Some(keep) => Cow::Owned(format!("{}…", &s[..keep])),
    };
    match neutralise_bidi(&cut) {
        Cow::Owned(o) => Cow::Owned(o),
        Cow::Borrowed(_) => cut,
    }
}

/// Where to cut `s` so that it keeps `max - 1` characters and a `…`
/// (`None`: it has at most `max` characters).
fn cut_at(s: &str, max: usize) -> Option<usize> {
    if s.len() <= max {
        return None;
    }
    let (cut, _) = s.char_indices().nth(max)?;
    Some(s[..cut].char_indices().nth(max.saturating_sub(1)).map_or(cut, |(i, _)| i))
}

/// Where to cut `s` so that it keeps at most `max` bytes, on a character
/// boundary (`None`: it is no longer than that).
fn cut_bytes(s: &str, max: usize) -> Option<usize> {
    if s.len() <= max {
        return None;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Some(end)
}

/// `s` cut to at most `max` bytes on a character boundary, a `…` marking the
/// cut (so the result may be 3 bytes longer): for ids and values echoed in
/// log lines and headers, where the limit is in bytes.
pub fn clip_bytes(s: &str, max: usize) -> String {
    match cut_bytes(s, max) {
        None => s.to_owned(),
        Some(end) => format!("{}…", &s[..end]),
    }
}

/// [`clip_bytes`], saying how much was cut (`… (1200 more bytes)`): for
/// an agent's output in a report, where the reader wants to know how much
/// is missing.
pub fn clip_bytes_noting(s: &str, max: usize) -> String {
    match cut_bytes(s, max) {
        None => s.to_owned(),
        Some(end) => format!("{}… ({} more bytes)", &s[..end], s.len() - end),
    }
}

/// An error with the errors that caused it, outermost first, on one line:
/// an HTTP client error alone says "error sending request for url (...)",
/// and only its causes say the connection was refused or the name did not
/// resolve.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let part = c.to_string();
        // Some errors repeat their cause in their own message.
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}

/// Whether `c` changes the display order of surrounding text (the Unicode
/// bidi embedding, override and isolate controls, and the implicit marks).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// Whether `s` may hold a bidi control: every one of them is encoded in
/// UTF-8 with a lead byte of 0xE2 (U+2000..U+2FFF) or 0xD8 (U+061C), so
/// text without those bytes (all ASCII text, for one) is cleared by a
/// byte scan instead of decoding each character.
fn may_hold_bidi(s: &str) -> bool {
    !s.is_ascii() && s.bytes().any(|b| b == 0xE2 || b == 0xD8)
}

/// Replaces bidi controls with a visible `<U+XXXX>`; borrows when there are none.
pub fn neutralise_bidi(s: &str) -> Cow<'_, str> {
    if !may_hold_bidi(s) || !s.chars().any(is_bidi_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_bidi_control(c) {
            out.push_str(&format!("<U+{:04X}>", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Truncates `s` in place to at most `max` characters (with `…`), and
/// neutralises bidi controls as [`clip`] does.
pub fn clip_in_place(s: &mut String, max: usize) {
    if let Some(keep) = cut_at(s, max) {
        s.truncate(keep);
        s.push('…');
    }
    if let Cow::Owned(o) = neutralise_bidi(s) {
        *s = o;
    }
}

/// `'value'`, clipped.
pub fn quote(s: &str) -> String {
    // One allocation: every explanation quotes, plugins' included, where
    // allocating and formatting are slow.
    let shown = clipped(s, MAX_QUOTED_CHARS);
    let mut out = String::with_capacity(shown.len() + 2);
    out.push('\'');
    out.push_str(&shown);
    out.push('\'');
    out
}

/// `['a', 'b']`, each clipped, at most 20 items shown.
pub fn quote_list<S: AsRef<str>>(items: &[S]) -> String {
    const MAX_ITEMS: usize = 20;
    let mut out: Vec<String> = items.iter().take(MAX_ITEMS).map(|s| quote(s.as_ref())).collect();
    if items.len() > MAX_ITEMS {
        out.push(format!("… {} more", items.len() - MAX_ITEMS));
    }
    format!("[{}]", out.join(", "))
}

/// The length of `v`'s compact JSON text, counted without building it:
/// size limits on values are judged on this.
pub fn compact_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing to a counter cannot fail, and a `Value` always serialises.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

/// The JSON type of a value, for explanations: `a string`, `an object`, ….
pub fn kind_name(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value as messages describe it: its kind, and for a scalar its clipped
/// JSON text (`a string ("abc")`, `a number (3)`, `a boolean (true)`,
/// `null`, `an array`, `an object`, `an empty object`). The one describer
/// of the engine, its layers and the plugin SDK.
pub fn describe(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Object(m) if m.is_empty() => "an empty object".into(),
        Value::Array(_) | Value::Object(_) => kind_name(v).into(),
        other => format!("{} ({})", kind_name(other), clip(&other.to_string(), 60)),
    }
}

/// A value as it is written, for explanations that show it rather than
/// describe it: a string quoted (`'R-1'`), a number as people write it and
/// as the built-in layers show numbers (`80`, `0.0067`, see [`num`]),
/// anything else as compact JSON (`true`, `{"a":1}`); clipped. The one
/// renderer of the engine's layers and the plugins.
pub fn render(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::String(s) => quote(s),
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), num),
        other => clip(&other.to_string(), MAX_RENDERED_CHARS),
    }
}

/// Longest JSON text [`render`] shows, in characters.
const MAX_RENDERED_CHARS: usize = 120;

/// Formats a number the way people write it: `3`, `0.0067`, `1e-9`,
/// `1e308` (never hundreds of digits).
pub fn num(x: f64) -> String {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else if let Some(n) = serde_json::Number::from_f64(x) {
        // serde_json prints the shortest round-trip form, in exponent
        // notation when that is shorter; `1e308` reads better than `1e+308`.
        n.to_string().replacen("e+", "e", 1)
    } else {
        format!("{x}")
    }
}

/// Longest needle [`contains_ignore_case`] compares in place; longer ones
/// are lowercased and searched as `str::contains` does, which stays linear.
const MAX_IN_PLACE_NEEDLE: usize = 32;

/// `n` with its noun in the right number: "1 time", "3 times".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Whether `hay` contains `needle` with case ignored: exactly
/// `hay.to_lowercase().contains(&needle.to_lowercase())`, the comparison
/// the engine's case-insensitive checks make. When both are ASCII (where
/// lowercasing is byte by byte) and the needle is short, it compares in
/// place instead of allocating two lowercased copies, which matters most
/// inside a plugin, where allocation and lowercasing are slow.
///
/// An ASCII needle is looked for in place first, whatever the text: a match
/// there is made of ASCII characters, which lowercase one by one to the
/// lowercased needle, so it is also a match in the lowercased text. Only a
/// miss in a text that is not all ASCII needs the lowercased copies. A hit
/// then costs no pass over the whole text to check that it is ASCII.
pub fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    if needle.is_ascii() && needle.len() <= MAX_IN_PLACE_NEEDLE {
        if contains_ascii_ignore_case(hay.as_bytes(), needle.as_bytes()) {
            return true;
        }
        if hay.is_ascii() {
            return false;
        }
    }
    // Outside ASCII, lowercasing can change lengths and even turn a
    // non-ASCII character into an ASCII one (KELVIN SIGN into 'k').
    hay.to_lowercase().contains(&needle.to_lowercase())
}

/// The ASCII case of [`contains_ignore_case`]. Only the positions where the
/// needle's first byte occurs, in either case, are compared: `memchr` finds
/// them a word at a time (with SIMD where the target has it), where trying
/// every window costs a comparison per byte of the text (3–5 times slower
/// for short needles, docs/benchmarks.md). The worst case is unchanged:
/// at most one needle's length of comparisons per byte.
fn contains_ascii_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let Some(last_start) = hay.len().checked_sub(needle.len()) else {
        return false;
    };
    let starts = &hay[..=last_start];
    let rest_matches = |at: usize| hay[at + 1..at + needle.len()].eq_ignore_ascii_case(rest);
    let (lower, upper) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    if lower == upper {
        memchr::memchr_iter(first, starts).any(rest_matches)
    } else {
        memchr::memchr2_iter(lower, upper, starts).any(rest_matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_clips_cut_on_a_character_boundary_and_error_chains_read_outermost_first() {
        assert_eq!(clip_bytes("abcdef", 6), "abcdef");
        assert_eq!(clip_bytes("abcdef", 3), "abc…");
        // "é" is two bytes: a cut inside it moves back before it.
        assert_eq!(clip_bytes("aé", 2), "a…");
        assert_eq!(clip_bytes_noting("aébc", 2), "a… (4 more bytes)");
        let inner = std::io::Error::other("connection refused");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(error_chain(&outer), "sending failed: connection refused");
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("sending failed")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn contains_ignore_case_is_lowercased_contains() {
        let cases = [
            ("Your Refund is processed", "refund"),
            ("Your Refund is processed", "REFUND IS"),
            ("Your Refund is processed", "refunds"),
            ("abc", ""),
            ("", "a"),
            ("ab", "abc"),
            ("\u{212A}elvin", "kelvin"),
            ("kelvin", "\u{212A}ELVIN"),
            ("\u{130}stanbul", "i\u{307}stanbul"),
            ("Straße", "STRASSE"),
            ("ΣΊΣΥΦΟΣ", "σίσυφος"),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaB", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAb"),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaB", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAc"),
        ];
        for (hay, needle) in cases {
            assert_eq!(
                contains_ignore_case(hay, needle),
                hay.to_lowercase().contains(&needle.to_lowercase()),
                "{hay:?} / {needle:?}"
            );
        }
        assert!(contains_ignore_case("Your Refund", "rEfUnD"));
        assert!(
            contains_ignore_case("\u{212A}elvin", "kelvin"),
            "a non-ASCII letter that lowercases to ASCII"
        );
    }

    #[test]
    fn ascii_search_agrees_with_lowercased_contains_on_every_slice() {
        // Every substring of a mixed-case text, in three casings, and near
        // misses: first bytes that are letters, digits and punctuation,
        // matches at either end, and candidates that fail late.
        // The second text mixes in letters whose lowercase is ASCII (KELVIN
        // SIGN, DOTTED CAPITAL I) or longer (ẞ), next to ASCII matches.
        let hays = [
            "Refund $89.99 ok; REFUND-id rfd-001, refun. Order 3 business days",
            "Straße \u{212A}elvin: REFUND ok, \u{130}d rfd-001 Σ refun. ẞ 3 días",
        ];
        for hay in hays {
            let bounds: Vec<usize> = (0..=hay.len()).filter(|&i| hay.is_char_boundary(i)).collect();
            let mut needles: Vec<String> = Vec::new();
            for (i, &start) in bounds.iter().enumerate() {
                for &end in bounds[i..].iter().take_while(|&&end| end - start <= MAX_IN_PLACE_NEEDLE) {
                    let s = &hay[start..end];
                    needles.extend([s.to_owned(), s.to_uppercase(), s.to_lowercase()]);
                    needles.push(format!("{s}x"));
                    needles.push(format!("x{s}"));
                }
            }
            for needle in &needles {
                assert_eq!(
                    contains_ignore_case(hay, needle),
                    hay.to_lowercase().contains(&needle.to_lowercase()),
                    "{hay:?} / {needle:?}"
                );
            }
        }
        assert!(
            contains_ignore_case("Straße: REFUND", "refund"),
            "an ASCII hit in a text that is not all ASCII"
        );
        assert!(
            contains_ignore_case("Stra\u{212A}e", "strake"),
            "a hit only the lowercased text has"
        );
        assert!(!contains_ignore_case("Straße", "strasse"), "a miss in both");
    }

    #[test]
    fn render_shows_values_as_written_and_bounded() {
        use serde_json::json;
        assert_eq!(render(&json!("R-1")), "'R-1'");
        assert_eq!(render(&json!(0.0067)), "0.0067");
        assert_eq!(render(&json!(80.0)), "80", "as the built-in layers show numbers");
        assert_eq!(render(&json!(3)), "3");
        assert_eq!(render(&json!(true)), "true");
        assert_eq!(render(&json!(null)), "null");
        assert_eq!(render(&json!({"a": [1, 2]})), r#"{"a":[1,2]}"#);
        let long = json!(vec![1; 1000]);
        assert!(render(&long).chars().count() <= MAX_RENDERED_CHARS);
    }

    #[test]
    fn clip_counts_characters_not_bytes() {
        assert_eq!(clip("héllo", 10), "héllo");
        assert_eq!(clip("héllo", 3), "hé…");
        assert_eq!(clip("", 0), "");
        let mut s = String::from("ééééé");
        clip_in_place(&mut s, 2);
        assert_eq!(s, "é…");
    }

    #[test]
    fn bidi_controls_are_made_visible() {
        assert_eq!(clip("a\u{202E}b", 10), "a<U+202E>b");
        for c in ['\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}'] {
            assert_eq!(clip(&format!("é{c}"), 10), format!("é<U+{:04X}>", c as u32));
        }
        assert_eq!(
            clip("é\u{2014}ü", 10),
            "é\u{2014}ü",
            "other characters with the same lead bytes stay"
        );
        let mut s = String::from("x\u{2066}y");
        clip_in_place(&mut s, 50);
        assert_eq!(s, "x<U+2066>y");
    }

    #[test]
    fn quote_clips_like_clip() {
        assert_eq!(quote("a"), "'a'");
        assert_eq!(quote(""), "''");
        let long = "é".repeat(MAX_QUOTED_CHARS + 5);
        assert_eq!(quote(&long), format!("'{}'", clip(&long, MAX_QUOTED_CHARS)));
        let exact = "x".repeat(MAX_QUOTED_CHARS);
        assert_eq!(quote(&exact), format!("'{exact}'"));
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(1e308), "1e308");
        assert_eq!(num(-2.5e-9), "-2.5e-9");
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.0067), "0.0067");
        assert_eq!(num(-2.5), "-2.5");
    }

    #[test]
    fn lists_are_bounded() {
        let many: Vec<String> = (0..30).map(|i| i.to_string()).collect();
        assert!(quote_list(&many).ends_with("… 10 more]"));
        assert_eq!(quote_list(&["a", "b"]), "['a', 'b']");
    }
}
