//! The curated phrase lists and the text normalization both they and the
//! scanned text go through.
//!
//! Normalization makes one phrase cover its spelling variants: lower case,
//! straight apostrophes, single spaces, and contractions expanded
//! (`I can't` = `I cannot` = `I can not`; `I'm` = `I am`). Matching is on
//! whole words: `I refuse to` matches `I refuse to answer` but not
//! `Hi refuse to`, nor `I refuse tonight`.

/// Phrases that say the assistant will not or cannot do what was asked.
/// Written naturally; [`normalize`] is applied before matching.
pub const REFUSALS: &[&str] = &[
    "I can't help with",
    "I can't help you with",
    "I can't assist",
    "I can't do that",
    "I can't provide",
    "I can't share",
    "I can't comply",
    "I can't fulfill",
    "I can't fulfil",
    "I can't answer that",
    "I can't support that",
    "I can't create",
    "I can't generate",
    "I can't give you",
    "I can't engage",
    "I won't be able to",
    "I won't help",
    "I won't provide",
    "I'm unable to",
    "I'm not able to",
    "I'm not allowed to",
    "I'm not permitted to",
    "I'm not comfortable",
    "I don't feel comfortable",
    "I'm not in a position to",
    "I must decline",
    "I have to decline",
    "I need to decline",
    "I'll have to decline",
    "I'll pass on",
    "I refuse to",
    "I'm afraid I can't",
    "that's not something I can help with",
    "not something I'm able to",
    "against my guidelines",
    "against my policies",
    "against my programming",
    "violates my guidelines",
    "goes against my",
    "as an AI language model",
    "as an AI, I can't",
    "I'm just an AI",
];

/// Bare apologies: counted only with `count_apologies`, since an apology is
/// often followed by the answer ("Sorry for the wait, here it is").
pub const APOLOGIES: &[&str] = &[
    "I'm sorry",
    "I apologize",
    "I apologise",
    "my apologies",
    "sorry, but",
    "sorry for the inconvenience",
];

/// Lower case, straight apostrophes, single spaces, contractions expanded.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        let c = match c {
            '\u{2018}' | '\u{2019}' | '\u{02BC}' | '`' | '\u{00B4}' => '\'',
            c if c.is_whitespace() => ' ',
            c => c,
        };
        if c == ' ' {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(' ');
        }
        space = false;
        out.extend(c.to_lowercase());
    }
    expand_contractions(&out)
}

/// Contraction expansion on already lower-cased text. Specific forms first
/// (`can't`, `won't`), then the general `n't`.
fn expand_contractions(s: &str) -> String {
    const SPECIFIC: &[(&str, &str)] = &[
        ("can't", "cannot"),
        ("can not", "cannot"),
        ("won't", "will not"),
        ("shan't", "shall not"),
        ("i'm", "i am"),
        ("that's", "that is"),
        ("it's", "it is"),
    ];
    const SUFFIXES: &[(&str, &str)] = &[
        ("n't", " not"),
        ("'re", " are"),
        ("'ve", " have"),
        ("'ll", " will"),
        ("'d", " would"),
    ];
    let mut s = s.to_owned();
    for (from, to) in SPECIFIC {
        if s.contains(from) {
            s = replace_words(&s, from, to);
        }
    }
    for (from, to) in SUFFIXES {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

/// Replaces whole-word occurrences of `from` only (`i'm` but not `wi'm`).
fn replace_words(s: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (i, _) in s.match_indices(from) {
        if i < last {
            continue;
        }
        if is_boundary(s, i, i + from.len()) {
            out.push_str(&s[last..i]);
            out.push_str(to);
            last = i + from.len();
        }
    }
    out.push_str(&s[last..]);
    out
}

/// Whether `s[start..end]` is not glued to a letter or digit on either side.
pub fn is_boundary(s: &str, start: usize, end: usize) -> bool {
    let before = s[..start].chars().next_back();
    let after = s[end..].chars().next();
    !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
}

/// The byte offset of the first whole-word occurrence of `phrase` in `text`
/// (both normalized).
pub fn find(text: &str, phrase: &str) -> Option<usize> {
    if phrase.is_empty() {
        return None;
    }
    text.match_indices(phrase)
        .map(|(i, _)| i)
        .find(|&i| is_boundary(text, i, i + phrase.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_unifies_spellings() {
        assert_eq!(normalize("I  CAN\u{2019}T\n help"), "i cannot help");
        assert_eq!(normalize("I can not help"), "i cannot help");
        assert_eq!(
            normalize("I'm unable; I won't; we'd; they're; don't"),
            "i am unable; i will not; we would; they are; do not"
        );
        assert_eq!(normalize("  leading and trailing  "), "leading and trailing");
    }

    #[test]
    fn whole_words_only() {
        assert_eq!(find("i refuse to go", "i refuse to"), Some(0));
        assert_eq!(find("hi refuse to", "i refuse to"), None);
        assert_eq!(find("x; i cannot help with that", "i cannot help with"), Some(3));
        assert_eq!(find("anything", ""), None);
    }

    #[test]
    fn curated_lists_are_normalized_distinct_phrases() {
        let mut seen = std::collections::HashSet::new();
        for p in REFUSALS.iter().chain(APOLOGIES) {
            let n = normalize(p);
            assert!(!n.is_empty() && n.split(' ').count() >= 2, "{p} should be a phrase");
            assert!(seen.insert(n.clone()), "{p} duplicates another phrase once normalized ({n})");
        }
    }
}
