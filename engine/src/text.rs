//! Small text helpers for explanations and error messages: bounded quoting
//! of user-supplied values and compact number formatting.
//!
//! Everything user-controlled that is echoed back goes through [`clip`] or
//! [`quote`], which is what keeps response lines far below the 64 KiB limit
//! of SDK readers.

/// Longest user value quoted inside an explanation or error message.
pub const MAX_QUOTED_CHARS: usize = 120;

/// Truncates `s` to at most `max` characters, marking the cut with `…`.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((cut, _)) => {
            let keep = s[..cut].char_indices().nth(max.saturating_sub(1)).map_or(cut, |(i, _)| i);
            format!("{}…", &s[..keep])
        }
    }
}

/// Truncates `s` in place to at most `max` characters (with `…`).
pub fn clip_in_place(s: &mut String, max: usize) {
    if let Some((cut, _)) = s.char_indices().nth(max) {
        let keep = s[..cut].char_indices().nth(max.saturating_sub(1)).map_or(cut, |(i, _)| i);
        s.truncate(keep);
        s.push('…');
    }
}

/// `'value'`, clipped.
pub fn quote(s: &str) -> String {
    format!("'{}'", clip(s, MAX_QUOTED_CHARS))
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

/// Formats a number the way people write it: `3`, `0.0067`, `1e-9`.
pub fn num(x: f64) -> String {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn numbers_are_compact() {
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
