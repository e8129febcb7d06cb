//! Small text helpers for explanations: bounded quoting of values taken from
//! traces and configs, and compact number formatting.
//!
//! These mirror `engine/src/text.rs`, so plugin explanations read like the
//! engine's own (`'value'` quoting, `…` where something was cut).

/// Longest user value quoted inside an explanation.
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

/// `'value'`, clipped to [`MAX_QUOTED_CHARS`].
pub fn quote(s: &str) -> String {
    // One allocation: explanations quote on every call of most plugins.
    let (keep, cut) = match s.char_indices().nth(MAX_QUOTED_CHARS) {
        None => (s, false),
        Some((end, _)) => (
            &s[..s[..end].char_indices().nth(MAX_QUOTED_CHARS - 1).map_or(end, |(i, _)| i)],
            true,
        ),
    };
    let mut out = String::with_capacity(keep.len() + 5);
    out.push('\'');
    out.push_str(keep);
    if cut {
        out.push('…');
    }
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
