//! Finding personal data in text: e-mail addresses, phone numbers, payment
//! card numbers and IBANs, each with a masked form safe to report.
//!
//! The scanners are hand-written rather than regexes: the rules need checks
//! a regex cannot express anyway (Luhn, IBAN mod-97, group shapes), and the
//! component stays small. Every scanner is linear in the text length.
//!
//! Rules (also in the README):
//! - **email**: `local@domain.tld`, local part of `A-Z a-z 0-9 . _ % + -`,
//!   domain labels of letters, digits and `-`, a top-level domain of at least
//!   two letters.
//! - **card**: 13 to 19 digits, contiguous or grouped by single spaces or
//!   dashes (groups of 3 to 6), passing the Luhn check, not all one digit.
//! - **phone**: `+` followed by 8 to 15 digits (grouping free), or 9 to 12
//!   digits in at least three groups (first group 1 to 4 digits, the others
//!   2 to 4) separated by spaces, dashes, dots or parentheses, such as
//!   `(555) 123-4567`, `555.123.4567` or `06 12 34 56 78`. A plain run of
//!   digits without `+` or grouping is not a phone number (it is more often
//!   an id or a timestamp); dotted quads that are IPv4 addresses, dates
//!   (`2024-01-15 10`) and times (`… 10:30`) are skipped.
//! - **iban**: a country code (two letters), two check digits and 11 to 30
//!   more letters or digits (15 to 34 in all), contiguous or in groups of
//!   four separated by single spaces, passing the ISO 13616 mod-97 check.
//!
//! A number must stand alone: digits or letters directly before or after it
//! (as in `ID4111111111111111`) make it part of a larger token, not a match.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A kind of personal data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Email,
    Phone,
    Card,
    Iban,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::Card => "card",
            Kind::Iban => "iban",
        }
    }

    /// What the kind is called in an explanation.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Email => "email address",
            Kind::Phone => "phone number",
            Kind::Card => "card number",
            Kind::Iban => "IBAN",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One match: where it is and what it says (unmasked; never report `text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: Kind,
    /// Byte offset in the scanned text.
    pub start: usize,
    pub text: String,
}

impl Finding {
    /// Byte offset just past the match.
    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }

    /// The match with most of it hidden, safe for explanations and logs.
    pub fn masked(&self) -> String {
        match self.kind {
            Kind::Email => mask_email(&self.text),
            Kind::Phone => mask_alnum(&self.text, 0, 2),
            Kind::Card => mask_alnum(&self.text, 0, 4),
            Kind::Iban => mask_alnum(&self.text, 2, 4),
        }
    }

    /// The form allowlist entries are compared in: lower-case for e-mail,
    /// digits for phones and cards, upper-case letters and digits for IBANs.
    pub fn normalized(&self) -> String {
        normalize(self.kind, &self.text)
    }
}

/// See [`Finding::normalized`].
pub fn normalize(kind: Kind, s: &str) -> String {
    match kind {
        Kind::Email => s.trim().to_lowercase(),
        Kind::Phone | Kind::Card => s.chars().filter(char::is_ascii_digit).collect(),
        Kind::Iban => s
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_uppercase())
            .collect(),
    }
}

/// All matches of the given kinds, in text order.
pub fn scan(text: &str, kinds: &[Kind]) -> Vec<Finding> {
    let mut found = Vec::new();
    if kinds.contains(&Kind::Email) {
        emails(text, &mut found);
    }
    if kinds.contains(&Kind::Phone) || kinds.contains(&Kind::Card) {
        numbers(text, kinds.contains(&Kind::Phone), kinds.contains(&Kind::Card), &mut found);
    }
    if kinds.contains(&Kind::Iban) {
        let mut iban = Vec::new();
        ibans(text, &mut iban);
        // The digit groups inside an IBAN can look like a phone number; the
        // IBAN is the better reading.
        found.retain(|f| !iban.iter().any(|i| f.start < i.end() && i.start < f.end()));
        found.extend(iban);
    }
    found.sort_by_key(|f| f.start);
    found
}

fn is_local_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn is_domain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')
}

fn emails(text: &str, out: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('@') {
        let mut start = at;
        while start > 0 && is_local_byte(bytes[start - 1]) {
            start -= 1;
        }
        // A local part neither starts nor ends with a dot.
        while start < at && bytes[start] == b'.' {
            start += 1;
        }
        let mut end = at + 1;
        while end < bytes.len() && is_domain_byte(bytes[end]) {
            end += 1;
        }
        // Sentence punctuation after an address is not part of it.
        while end > at + 1 && matches!(bytes[end - 1], b'.' | b'-') {
            end -= 1;
        }
        let (local, domain) = (&text[start..at], &text[at + 1..end]);
        if local.is_empty() || local.ends_with('.') || !valid_domain(domain) {
            continue;
        }
        out.push(Finding {
            kind: Kind::Email,
            start,
            text: text[start..end].to_owned(),
        });
    }
}

fn valid_domain(domain: &str) -> bool {
    let labels: Vec<&str> = domain.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-'))
        && labels
            .last()
            .is_some_and(|tld| tld.len() >= 2 && tld.bytes().all(|b| b.is_ascii_alphabetic()))
}

/// A run of digit groups: the raw text and the shape needed to classify it.
struct NumberSpan<'a> {
    start: usize,
    text: &'a str,
    digits: String,
    groups: Vec<usize>,
    plus: bool,
    parens: bool,
    /// Every separator character used between groups.
    separators: Vec<u8>,
}

fn is_separator(b: u8) -> bool {
    matches!(b, b' ' | b'-' | b'.' | b'(' | b')')
}

/// Finds standalone digit runs (with `+`, grouping and parentheses) and
/// classifies each as a card, a phone number or neither.
fn numbers(text: &str, phones: bool, cards: bool, out: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let starts = b.is_ascii_digit() || ((b == b'+' || b == b'(') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit));
        let glued = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'+');
        if !starts || glued {
            i += 1;
            continue;
        }
        let span = number_span(text, i);
        let end = span.start + span.text.len();
        // A letter or digit right after the run makes it part of a token,
        // and `:` plus a digit makes it a date and time (`2024-01-15 10:30`).
        let glued_after = match bytes.get(end) {
            Some(b) if b.is_ascii_alphanumeric() || *b == b'@' => true,
            Some(b':') => bytes.get(end + 1).is_some_and(u8::is_ascii_digit),
            _ => false,
        };
        let standalone = !glued_after;
        if standalone {
            let kind = if cards && is_card(&span) {
                Some(Kind::Card)
            } else if phones && is_phone(&span) {
                Some(Kind::Phone)
            } else {
                None
            };
            if let Some(kind) = kind {
                out.push(Finding {
                    kind,
                    start: span.start,
                    text: span.text.to_owned(),
                });
            }
        }
        i = end.max(i + 1);
    }
}

fn number_span(text: &str, start: usize) -> NumberSpan<'_> {
    let bytes = text.as_bytes();
    let mut span = NumberSpan {
        start,
        text: "",
        digits: String::new(),
        groups: Vec::new(),
        plus: false,
        parens: false,
        separators: Vec::new(),
    };
    let mut i = start;
    if bytes[i] == b'+' {
        span.plus = true;
        i += 1;
    }
    let mut end = i;
    loop {
        // One digit group.
        if i < bytes.len() && bytes[i] == b'(' {
            span.parens = true;
            i += 1;
        }
        let digits_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == digits_start {
            break;
        }
        span.digits.push_str(&text[digits_start..i]);
        span.groups.push(i - digits_start);
        end = i;
        // Up to two separator characters (`) ` or ` (`) before the next group.
        let sep_start = i;
        while i < bytes.len() && i - sep_start < 2 && is_separator(bytes[i]) && bytes[i] != b'(' {
            i += 1;
        }
        if i < bytes.len() && bytes[i] == b'(' && i - sep_start < 2 && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
            // `(` opens the next group; the loop consumes it.
        } else if !(i > sep_start && i < bytes.len() && bytes[i].is_ascii_digit()) {
            break;
        }
        span.separators.extend_from_slice(&bytes[sep_start..i]);
    }
    // A group opened with `(` keeps its `)`.
    if end < bytes.len() && bytes[end] == b')' && text[start..end].contains('(') {
        end += 1;
    }
    span.text = &text[start..end];
    span
}

fn is_card(s: &NumberSpan<'_>) -> bool {
    let n = s.digits.len();
    (13..=19).contains(&n)
        && !s.plus
        && !s.parens
        && s.separators.iter().all(|b| matches!(b, b' ' | b'-'))
        && (s.groups.len() == 1 || s.groups.iter().all(|g| (3..=6).contains(g)))
        && s.digits.bytes().any(|d| d != s.digits.as_bytes()[0])
        && luhn(&s.digits)
}

fn is_phone(s: &NumberSpan<'_>) -> bool {
    let n = s.digits.len();
    if s.plus {
        return (8..=15).contains(&n);
    }
    if !(9..=12).contains(&n) || s.groups.len() < 3 {
        return false;
    }
    let shaped = (1..=4).contains(&s.groups[0]) && s.groups[1..].iter().all(|g| (2..=4).contains(g));
    // `2024-01-15 10` is a date (and an hour), not a phone number.
    let date_like = s.groups.starts_with(&[4, 2, 2]);
    shaped && !date_like && !is_ipv4(s)
}

fn is_ipv4(s: &NumberSpan<'_>) -> bool {
    s.groups.len() == 4
        && s.separators.iter().all(|b| *b == b'.')
        && s.text.split('.').all(|part| part.parse::<u16>().is_ok_and(|v| v <= 255))
}

/// The Luhn checksum of a string of ASCII digits.
pub fn luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            if i % 2 == 1 {
                let dd = d * 2;
                if dd > 9 {
                    dd - 9
                } else {
                    dd
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

fn ibans(text: &str, out: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 4 <= bytes.len() {
        let head = &bytes[i..i + 4];
        let candidate = head[0].is_ascii_alphabetic()
            && head[1].is_ascii_alphabetic()
            && head[2].is_ascii_digit()
            && head[3].is_ascii_digit()
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric());
        if candidate {
            if let Some(end) = iban_at(bytes, i) {
                out.push(Finding {
                    kind: Kind::Iban,
                    start: i,
                    text: text[i..end].to_owned(),
                });
                i = end;
                continue;
            }
        }
        i += 1;
    }
}

/// The end of a valid IBAN starting at `start`, if there is one.
fn iban_at(bytes: &[u8], start: usize) -> Option<usize> {
    let alnum_run = |from: usize| bytes[from..].iter().take_while(|b| b.is_ascii_alphanumeric()).count();
    let first = alnum_run(start);
    // Contiguous form.
    if (15..=34).contains(&first) && !bytes.get(start + first).is_some_and(|b| b.is_ascii_alphanumeric()) {
        let end = start + first;
        return mod97_ok(&bytes[start..end]).then_some(end);
    }
    if first != 4 {
        return None;
    }
    // Grouped form: groups of four separated by single spaces, the last one
    // 1 to 4 characters. Text after an IBAN may look like one more group
    // (`… 3000 is mine`), so every group boundary is a candidate end, longest
    // first.
    let mut ends = vec![start + 4];
    let mut pos = start + 4;
    while pos + 1 < bytes.len() && bytes[pos] == b' ' {
        let len = alnum_run(pos + 1);
        if len == 0 || len > 4 {
            break;
        }
        pos += 1 + len;
        ends.push(pos);
        if len < 4 {
            break;
        }
    }
    ends.into_iter().rev().find(|&end| {
        let compact: Vec<u8> = bytes[start..end].iter().copied().filter(|b| *b != b' ').collect();
        (15..=34).contains(&compact.len()) && mod97_ok(&compact)
    })
}

/// ISO 13616: move the first four characters to the end, read letters as
/// 10..35, and the number must be 1 modulo 97.
fn mod97_ok(iban: &[u8]) -> bool {
    if !iban[..2].iter().all(u8::is_ascii_alphabetic) || !iban[2..4].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut rem: u32 = 0;
    for &b in iban[4..].iter().chain(&iban[..4]) {
        let v = match b {
            b'0'..=b'9' => u32::from(b - b'0'),
            b'a'..=b'z' => u32::from(b - b'a') + 10,
            b'A'..=b'Z' => u32::from(b - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 { (rem * 100 + v) % 97 } else { (rem * 10 + v) % 97 };
    }
    rem == 1
}

fn mask_email(s: &str) -> String {
    match s.split_once('@') {
        Some((local, domain)) => {
            let first = local.chars().next().unwrap_or('*');
            format!("{first}***@{domain}")
        }
        None => "***".to_owned(),
    }
}

/// Replaces letters and digits with `*`, except the first `keep_head` and
/// the last `keep_tail` of them; punctuation and spacing stay.
fn mask_alnum(s: &str, keep_head: usize, keep_tail: usize) -> String {
    let total = s.chars().filter(char::is_ascii_alphanumeric).count();
    let mut seen = 0;
    s.chars()
        .map(|c| {
            if !c.is_ascii_alphanumeric() {
                return c;
            }
            seen += 1;
            if seen <= keep_head || seen > total.saturating_sub(keep_tail) {
                c
            } else {
                '*'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Kind; 4] = [Kind::Email, Kind::Phone, Kind::Card, Kind::Iban];

    fn found(text: &str) -> Vec<(Kind, String)> {
        scan(text, &ALL).into_iter().map(|f| (f.kind, f.text)).collect()
    }

    fn one(text: &str) -> (Kind, String) {
        let f = found(text);
        assert_eq!(f.len(), 1, "{text:?}: {f:?}");
        f.into_iter().next().unwrap()
    }

    #[test]
    fn emails() {
        assert_eq!(
            one("mail jane.doe+x@mail.example.co.uk."),
            (Kind::Email, "jane.doe+x@mail.example.co.uk".into())
        );
        assert_eq!(one("<a@b.io>"), (Kind::Email, "a@b.io".into()));
        for not in [
            "user@localhost",
            "@example.com",
            "a@b.c",
            "a@-x.com",
            "version 1.2@3",
            "foo@bar.123",
        ] {
            assert!(found(not).is_empty(), "{not}: {:?}", found(not));
        }
    }

    #[test]
    fn cards_need_luhn() {
        assert_eq!(one("card 4111 1111 1111 1111, exp"), (Kind::Card, "4111 1111 1111 1111".into()));
        assert_eq!(one("4111-1111-1111-1111"), (Kind::Card, "4111-1111-1111-1111".into()));
        assert_eq!(one("4111 1111 1111 1111 (visa)"), (Kind::Card, "4111 1111 1111 1111".into()));
        assert_eq!(one("amex 378282246310005"), (Kind::Card, "378282246310005".into()));
        assert_eq!(one("amex 3782 822463 10005"), (Kind::Card, "3782 822463 10005".into()));
        assert!(found("4111 1111 1111 1112").is_empty(), "Luhn fails");
        assert!(found("0000 0000 0000 0000").is_empty(), "all one digit");
        assert!(found("ID4111111111111111").is_empty(), "glued to a word");
        assert!(found("4111111111111111x").is_empty(), "glued to a word");
    }

    #[test]
    fn phones() {
        assert_eq!(one("call (555) 123-4567 now"), (Kind::Phone, "(555) 123-4567".into()));
        assert_eq!(one("call 555.123.4567"), (Kind::Phone, "555.123.4567".into()));
        assert_eq!(one("+1 555 123 4567"), (Kind::Phone, "+1 555 123 4567".into()));
        assert_eq!(one("+442071838750"), (Kind::Phone, "+442071838750".into()));
        assert_eq!(one("tel 06 12 34 56 78."), (Kind::Phone, "06 12 34 56 78".into()));
        assert_eq!(one("1-800-555-0199"), (Kind::Phone, "1-800-555-0199".into()));
        for not in [
            "order 5551234567",
            "ts 1700000000000",
            "on 2024-01-15",
            "at 2024-01-15 10:30:00",
            "at 2024.01.15 10 12",
            "pi 3.14159265358979",
            "host 192.168.100.200",
            "+12345",
            "costs 1,234,567.89",
            "12:30:45",
        ] {
            assert!(found(not).is_empty(), "{not}: {:?}", found(not));
        }
    }

    #[test]
    fn ibans() {
        assert_eq!(
            one("IBAN DE89 3704 0044 0532 0130 00 please"),
            (Kind::Iban, "DE89 3704 0044 0532 0130 00".into())
        );
        assert_eq!(one("GB82WEST12345698765432"), (Kind::Iban, "GB82WEST12345698765432".into()));
        assert_eq!(
            one("to GB82 WEST 1234 5698 7654 32 ok"),
            (Kind::Iban, "GB82 WEST 1234 5698 7654 32".into())
        );
        assert!(found("DE89 3704 0044 0532 0130 01").is_empty(), "mod-97 fails");
        assert!(found("AB12 is not an IBAN").is_empty());
        assert_eq!(
            one("NL91 ABNA 0417 1643 00 and more"),
            (Kind::Iban, "NL91 ABNA 0417 1643 00".into())
        );
        // The last group is four long and the next word looks like a group.
        assert_eq!(one("BE68 5390 0754 7034 and"), (Kind::Iban, "BE68 5390 0754 7034".into()));
        assert_eq!(one("iban: be68539007547034."), (Kind::Iban, "be68539007547034".into()));
        assert_eq!(
            one("FR14 2004 1010 0505 0001 3M02 606 ok"),
            (Kind::Iban, "FR14 2004 1010 0505 0001 3M02 606".into())
        );
    }

    #[test]
    fn kinds_filter_and_order() {
        let text = "a@b.io then 4111 1111 1111 1111 then +1 555 123 4567";
        let kinds: Vec<Kind> = scan(text, &ALL).iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![Kind::Email, Kind::Card, Kind::Phone]);
        assert_eq!(scan(text, &[Kind::Phone]).len(), 1);
        assert!(scan(text, &[Kind::Iban]).is_empty());
    }

    #[test]
    fn masking_keeps_only_a_hint() {
        let m = |kind, text: &str| {
            Finding {
                kind,
                start: 0,
                text: text.into(),
            }
            .masked()
        };
        assert_eq!(m(Kind::Email, "jane.doe@example.com"), "j***@example.com");
        assert_eq!(m(Kind::Card, "4111 1111 1111 1111"), "**** **** **** 1111");
        assert_eq!(m(Kind::Phone, "(555) 123-4567"), "(***) ***-**67");
        assert_eq!(m(Kind::Iban, "DE89 3704 0044 0532 0130 00"), "DE** **** **** **** **30 00");
    }

    #[test]
    fn normalization_for_allowlists() {
        assert_eq!(normalize(Kind::Email, " Support@Example.COM "), "support@example.com");
        assert_eq!(normalize(Kind::Phone, "+1 (555) 123-4567"), "15551234567");
        assert_eq!(normalize(Kind::Iban, "de89 3704"), "DE893704");
    }

    #[test]
    fn luhn_reference_values() {
        assert!(luhn("79927398713"));
        assert!(!luhn("79927398710"));
        assert!(luhn("4111111111111111"));
    }
}
