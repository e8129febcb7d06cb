//! The number syntax the SDK accepts for label values: Python's `float(str)`
//! and the whitespace rules of `str.strip()`.
//!
//! Rust's `f64::from_str` and Python's `float()` both round correctly, so once
//! a string is known to be valid Python syntax, handing the underscore-free
//! form to Rust yields the bit-identical value. What differs is the syntax
//! each accepts (underscores, whitespace, `1.e5`), which this module owns.

/// Whitespace as Python's `str.isspace` / `str.strip()` see it: Unicode
/// `White_Space` plus the ASCII information separators U+001C..U+001F.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str.strip()` with no arguments.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// `str.lstrip()` with no arguments.
pub(crate) fn py_lstrip(s: &str) -> &str {
    s.trim_start_matches(is_py_space)
}

/// Whitespace `float()` itself ignores around a number: the six ASCII
/// spaces of C's `isspace` and every non-ASCII Unicode space, but not
/// U+001C..U+001F (which `str.strip()` does remove).
fn is_float_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ') || (!c.is_ascii() && c.is_whitespace())
}

/// Parses `text` the way Python's `float(text)` does, or returns `None`
/// where Python raises `ValueError`.
///
/// One deliberate gap: Python also reads non-ASCII decimal digits (for
/// example Arabic-Indic `١`); they are rejected here.
pub(crate) fn parse_py_float(text: &str) -> Option<f64> {
    let body = text.trim_matches(is_float_space);
    if body.is_empty() || !body.is_ascii() {
        return None;
    }
    let cleaned = remove_underscores(body)?;
    if !valid_syntax(&cleaned) {
        return None;
    }
    cleaned.parse::<f64>().ok()
}

/// Python allows `_` only between two ASCII digits (`1_000.5`, `1e1_0`).
fn remove_underscores(body: &str) -> Option<String> {
    let bytes = body.as_bytes();
    let mut out = String::with_capacity(body.len());
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            let before = i.checked_sub(1).map(|j| bytes[j]);
            let after = bytes.get(i + 1).copied();
            if !(before.is_some_and(|c| c.is_ascii_digit()) && after.is_some_and(|c| c.is_ascii_digit())) {
                return None;
            }
        } else {
            out.push(char::from(b));
        }
    }
    Some(out)
}

/// `[sign] (inf | infinity | nan | digits[.digits] | .digits) [exponent]`,
/// with `inf`/`nan` in any letter case and no exponent after them.
fn valid_syntax(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = unsigned.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return true;
    }
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    let all_digits = |p: &str| p.bytes().all(|c| c.is_ascii_digit());
    let mantissa_ok = all_digits(int_part) && all_digits(frac_part) && !(int_part.is_empty() && frac_part.is_empty());
    let exponent_ok = match exponent {
        None => true,
        Some(e) => {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            !digits.is_empty() && all_digits(digits)
        }
    };
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_python_float_accepts() {
        let cases: &[(&str, f64)] = &[
            ("0.5", 0.5),
            (" 1\u{b}", 1.0),
            ("1\u{a0}", 1.0),
            ("1_0", 10.0),
            ("1.e5", 100000.0),
            (".5", 0.5),
            ("5.", 5.0),
            ("+.5", 0.5),
            ("1e1_0", 1e10),
            ("1.5e+05", 150000.0),
            ("-0", -0.0),
            ("0.1000000000000000055511151231257827", 0.1),
        ];
        for &(text, want) in cases {
            let got = parse_py_float(text).unwrap_or_else(|| panic!("{text:?} should parse"));
            assert_eq!(got.to_bits(), want.to_bits(), "{text:?}");
        }
        assert!(parse_py_float("iNfInItY").is_some_and(|v| v == f64::INFINITY));
        assert!(parse_py_float("-nan").is_some_and(f64::is_nan));
    }

    #[test]
    fn rejects_what_python_float_rejects() {
        for text in [
            "", " ", "1\u{1c}", "1e", "_1", "1_", "1__0", "1_.5", "1._5", "1e_5", "nan(1)", "0x10", ".", "e5", "+-1", "1\0", "in_f", "1 2",
            "abc", "١",
        ] {
            assert_eq!(parse_py_float(text), None, "{text:?}");
        }
    }

    #[test]
    fn strip_matches_python_whitespace() {
        assert_eq!(py_strip("\u{1c} a \u{3000}"), "a");
        assert_eq!(py_lstrip("\u{85}# x"), "# x");
        assert!(!is_py_space('\u{180e}'));
    }
}
