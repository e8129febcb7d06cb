//! Small helpers shared by the runtime's modules.

pub use attest_trace::text::clip_bytes_noting as clip;

pub use attest_io::printable;

/// Text from an agent or a manifest shown on one line: control characters
/// escaped as [`printable`] does, line breaks and tabs too (`\u{a}`), and
/// bidi controls named (`<U+202E>`), so it cannot start lines of its own or
/// reorder the ones around it.
pub fn one_line(s: &str) -> String {
    let text = printable(s).replace('\n', "\\u{a}").replace('\t', "\\u{9}");
    attest_trace::text::neutralise_bidi(&text).into_owned()
}

/// Current UTC time as RFC 3339 with milliseconds and a trailing Z.
pub use attest_io::now_rfc3339 as utc_now;

/// A random version-4 UUID string, used as the run id.
pub fn uuid4() -> String {
    let mut b: [u8; 16] = fastrand::u128(..).to_le_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Round to 3 decimals, as the audit record does.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_respects_char_boundaries() {
        assert_eq!(clip("abc", 5), "abc");
        assert!(clip("ééé", 3).starts_with("é…"));
        assert_eq!(uuid4().len(), 36);
        assert!(utc_now().ends_with('Z'));
    }

    #[test]
    fn one_line_text_cannot_start_or_reorder_lines() {
        assert_eq!(
            one_line("nope\n[1/1] s: step 1/1 PASS\t\u{1b}[2J\u{202e}x"),
            "nope\\u{a}[1/1] s: step 1/1 PASS\\u{9}\\u{1b}[2J<U+202E>x"
        );
    }
}
