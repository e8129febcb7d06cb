//! Python `re` patterns, as ECP manifests write them, in the Rust regex
//! syntax fancy-regex reads, with the same meaning (see [`python_regex`]).

/// Rewrite the pieces of Python `re` syntax whose meaning differs in Rust
/// regex syntax, so a pattern matches what it matches in the reference
/// runtime: `$` (without the multiline flag) also matches before a final
/// newline, `\Z` is the very end, `(?P=name)` is a named back-reference,
/// `\101` and `\0` are octal character escapes, and the ASCII flag (`(?a)`,
/// or scoped `(?a:...)`) makes `\d`, `\w`, `\s`, `\b` and their negations
/// ASCII-only. Python syntax with no Rust equivalent is refused, naming it.
pub fn python_regex(pattern: &str) -> Result<String, String> {
    // Inline flags such as `(?m)`, `(?im)`, `(?m:...)` or `(?m-i:...)` turn
    // multiline on (`(?-m:...)` turns it off, so only what precedes `-` counts).
    let multiline = pattern.match_indices("(?").any(|(i, _)| {
        let flags: String = pattern[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || *c == '-')
            .collect();
        let on = flags.split('-').next().unwrap_or("");
        on.contains('m') && matches!(pattern[i + 2 + flags.len()..].chars().next(), Some(')' | ':'))
    });
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    // Whether the ASCII flag is on here, and what it was outside each open group.
    let mut ascii = false;
    let mut groups: Vec<bool> = Vec::new();
    // Python takes global flags (`(?i)`) only before anything else: whether
    // only such flags (and, once `x` is on, whitespace) have come so far.
    let mut at_start = true;
    let mut verbose = false;
    while let Some(c) = chars.next() {
        let flags_only = at_start;
        at_start = false;
        match c {
            '\\' => {
                match chars.next() {
                    Some('Z') if !in_class => out.push_str("\\z"),
                    Some('N') if chars.peek() == Some(&'{') => return Err(
                        "the named character escape \\N{...} is not supported: write the character itself, or \\x{...} with its code point"
                            .into(),
                    ),
                    Some(d @ '0'..='9') => {
                        let octal = |c: Option<&char>| c.is_some_and(|c| ('0'..='7').contains(c));
                        let mut digits = String::from(d);
                        // Python's rules: `\0` takes up to two more octal digits;
                        // outside a class, any other digit is a group reference
                        // unless three octal digits make a character; inside one,
                        // `\1`-`\7` take up to two more octal digits.
                        let is_octal = if d == '0' || in_class {
                            if d == '8' || d == '9' {
                                return Err(format!("bad escape \\{d} inside a character class"));
                            }
                            while digits.len() < 3 && octal(chars.peek()) {
                                digits.extend(chars.next());
                            }
                            true
                        } else {
                            let mut ahead = chars.clone();
                            d <= '7' && octal(ahead.next().as_ref()) && octal(ahead.next().as_ref())
                        };
                        if is_octal {
                            while digits.len() < 3 && octal(chars.peek()) {
                                digits.extend(chars.next());
                            }
                            let code = u32::from_str_radix(&digits, 8).unwrap_or(u32::MAX);
                            if code > 0o377 {
                                return Err(format!("octal escape \\{digits} is outside the range 0-0o377"));
                            }
                            out.push_str(&format!("\\x{{{code:02X}}}"));
                        } else {
                            out.push('\\');
                            out.push(d);
                        }
                    }
                    Some(k @ ('d' | 'D' | 'w' | 'W' | 's' | 'S' | 'b' | 'B')) if ascii => {
                        // In a class these become several characters, which a
                        // `-` beside them would join into a range; Python
                        // refuses a range with a class escape as an end.
                        // A `-` right after a completed range (`a-z-`) is a literal.
                        let after_range = out.chars().rev().nth(2) == Some('-');
                        let dash_before = out.ends_with('-') && !after_range && !["\\-", "[-", "[^-"].iter().any(|e| out.ends_with(e));
                        let dash_after = chars.peek() == Some(&'-') && chars.clone().nth(1) != Some(']');
                        if in_class && k != 'b' && (dash_before || dash_after) {
                            return Err(format!("bad character range: \\{k} cannot be an end of a range"));
                        }
                        out.push_str(ascii_escape(k, in_class))
                    }
                    Some(n) => {
                        out.push('\\');
                        out.push(n);
                    }
                    None => out.push('\\'),
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push(c);
                // A `]` right after `[` or `[^` is a literal in both syntaxes.
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap_or('^'));
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(c);
            }
            // Inside a class, Python reads `[` (as in `[[:digit:]]`) and the
            // doubled `&&`, `~~` and `--` as literal characters, where Rust
            // starts a nested or POSIX class, or a set operation.
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            '-' if in_class && chars.peek() == Some(&'-') => {
                out.push_str("-\\-");
                chars.next();
            }
            '$' if !in_class && !multiline => out.push_str("(?=\\n?\\z)"),
            '(' if !in_class && chars.peek() == Some(&'?') => {
                let rest: String = chars.clone().take(3).collect();
                let ahead: String = chars.clone().skip(1).take_while(|c| c.is_ascii_alphabetic() || *c == '-').collect();
                let closer = chars.clone().nth(1 + ahead.chars().count());
                if rest.starts_with("?#") {
                    // A comment: Python ignores it (Rust has none), also
                    // between global flags.
                    chars.by_ref().take_while(|c| *c != ')').for_each(drop);
                    at_start = flags_only;
                } else if rest == "?P=" {
                    chars.nth(2);
                    let name: String = chars.by_ref().take_while(|c| *c != ')').collect();
                    out.push_str(&format!("\\k<{name}>"));
                } else if !ahead.is_empty() && matches!(closer, Some(')' | ':')) {
                    // Inline flags. Rust has no `a` (ASCII) flag: it is
                    // applied here, to the escapes it changes.
                    chars.nth(ahead.chars().count());
                    let (on, off) = ahead.split_once('-').unwrap_or((&ahead, ""));
                    if off.contains('a') {
                        return Err("bad inline flags: the ASCII flag (a) cannot be turned off".into());
                    }
                    let rust_flags: String = ahead.chars().filter(|c| *c != 'a').collect();
                    let sets_ascii = on.contains('a');
                    if closer == Some(')') {
                        // A global flag: Python allows it only at the start,
                        // so it holds for the whole pattern.
                        if !flags_only {
                            return Err(
                                "global flags not at the start of the expression: put (?flags) first, or scope them as (?flags:...)".into(),
                            );
                        }
                        if !off.is_empty() || ahead.contains('-') {
                            return Err("bad inline flags: flags can be turned off (-) only in a scoped group (?flags-flags:...)".into());
                        }
                        at_start = true;
                        verbose |= on.contains('x');
                        ascii |= sets_ascii;
                        if !rust_flags.is_empty() && rust_flags != "-" {
                            out.push_str(&format!("(?{rust_flags})"));
                        }
                    } else {
                        groups.push(ascii);
                        ascii |= sets_ascii;
                        let rust_flags = if rust_flags == "-" { String::new() } else { rust_flags };
                        out.push_str(&format!("(?{rust_flags}:"));
                    }
                    chars.next();
                } else {
                    groups.push(ascii);
                    out.push(c);
                }
            }
            '(' if !in_class => {
                groups.push(ascii);
                out.push(c);
            }
            ')' if !in_class => {
                if let Some(outer) = groups.pop() {
                    ascii = outer;
                }
                out.push(c);
            }
            _ => {
                // Whitespace between global flags is ignored in verbose mode.
                at_start = flags_only && verbose && c.is_whitespace();
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// What `\d`, `\w`, `\s`, `\b` and their negations mean under Python's ASCII
/// flag, written in Rust syntax; inside a character class (where `\b` is a
/// backspace in both syntaxes) the negations are nested classes.
fn ascii_escape(kind: char, in_class: bool) -> &'static str {
    match (kind, in_class) {
        ('d', false) => "[0-9]",
        ('d', true) => "0-9",
        ('D', _) => "[^0-9]",
        ('w', false) => "[0-9A-Za-z_]",
        ('w', true) => "0-9A-Za-z_",
        ('W', _) => "[^0-9A-Za-z_]",
        ('s', false) => "[ \\t\\n\\r\\x0B\\x0C]",
        ('s', true) => " \\t\\n\\r\\x0B\\x0C",
        ('S', _) => "[^ \\t\\n\\r\\x0B\\x0C]",
        // fancy-regex has no ASCII word boundary (`(?-u:\b)`): look around.
        ('b', false) => "(?:(?<=[0-9A-Za-z_])(?![0-9A-Za-z_])|(?<![0-9A-Za-z_])(?=[0-9A-Za-z_]))",
        ('B', false) => "(?:(?<=[0-9A-Za-z_])(?=[0-9A-Za-z_])|(?<![0-9A-Za-z_])(?![0-9A-Za-z_]))",
        ('b', true) => "\\x08",
        _ => "\\B",
    }
}

#[cfg(test)]
mod tests {
    use super::python_regex;

    #[test]
    fn python_regex_semantics() {
        let m = |p: &str, t: &str| fancy_regex::Regex::new(&python_regex(p).unwrap()).unwrap().is_match(t).unwrap();
        assert!(m("line$", "a line\n"), "$ before a final newline");
        assert!(!m("line$", "a line\n\n"));
        assert!(!m("line\\Z", "a line\n"));
        assert!(m("(?m)^b$", "a\nb\nc"));
        assert!(m("[$]", "cost $5"), "a $ in a class is literal");
        assert!(m("[]a]", "]"));
        assert!(m("(?P<q>['\"]).*(?P=q)", "say 'hi'"));
        assert!(m("\\$\\d", "$5"));
        // `[` and doubled set operators inside a class are literals in Python.
        assert!(!m("[[:digit:]] items", "Echo: 5 items a1"));
        assert!(m("[[:digit:]]", "x:]"));
        assert!(!m("[a-z&&[^e]]1", "Echo: 5 items a1"));
        assert!(m("[a-z&&[^e]]1", "&]1"));
        assert!(m("^[~~]$", "~"));
        assert!(m("^[+--]$", ","), "a range ending in -");
    }

    #[test]
    fn python_ascii_flag_octal_escapes_and_unsupported_constructs() {
        let m = |p: &str, t: &str| fancy_regex::Regex::new(&python_regex(p).unwrap()).unwrap().is_match(t).unwrap();
        // `(?a)`: \d, \w, \s and \b are ASCII-only, as in Python.
        assert!(m("(?a)\\d+", "AB 12"));
        assert!(!m("(?a)\\d", "٣"), "an Arabic-Indic digit is not an ASCII digit");
        assert!(m("\\d", "٣"));
        assert!(!m("(?a)^\\w+$", "café"));
        assert!(m("(?a)^\\W$", "é"));
        assert!(m("(?a)^[\\w-]+$", "a-b_1"));
        assert!(!m("(?a)^[\\w-]+$", "é"));
        assert!(m("(?a)^[\\D]+$", "é"));
        assert!(m("(?ai)^K$", "k"));
        assert!(m("(?a)\\bb", "éb"), "é is not a word character under (?a)");
        assert!(!m("\\bb", "éb"));
        // Scoped: ASCII inside the group only.
        assert!(m("(?a:\\d)\\d", "1٣"));
        assert!(!m("(?a:\\d)\\d", "٣1"));
        // Octal escapes; a lone digit is still a group reference.
        assert!(m("\\101", "AB"));
        assert!(m("^\\0$", "\0"));
        assert!(m("[\\101-\\103]", "B"));
        assert!(m("(a)\\1", "aa"));
        assert!(python_regex("\\477").unwrap_err().contains("octal escape \\477"));
        // What Python refuses is refused, not read as something else: a range
        // with a class escape as an end, global flags after the start, a
        // global flag turned off.
        for bad in ["(?a)[\\s-x]", "(?a)[\\w-z]", "(?a)[%-\\d]", "(?a)[\\W-z]"] {
            assert!(python_regex(bad).unwrap_err().contains("bad character range"), "{bad}");
        }
        for bad in ["x(?a)\\d", "((?a)\\d)\\d", "(?a:(?i)x)", "x|(?i)y"] {
            assert!(python_regex(bad).unwrap_err().contains("global flags not at the start"), "{bad}");
        }
        assert!(python_regex("(?m-i)x").unwrap_err().contains("only in a scoped group"));
        // A `-` after a completed range is a literal; comments are ignored.
        assert!(m("(?a)^[a-z-\\d]+$", "a-1"));
        assert!(m("(?a)^[0-9-\\w]+$", "x-9"));
        assert!(m("(?#a comment)(?i)^x$", "X"));
        assert!(m("a(?# not matched )b", "ab"));
        // Several global flags may open a pattern, with whitespace between
        // them once verbose mode is on.
        assert!(m("(?i)(?a)^\\w$", "K"));
        assert!(m("(?x) (?i) a b", "AB"));
        // `(?m-i:...)` turns multiline on, so `$` ends a line there.
        assert!(m("(?m-i:a$)", "a\nb"));
        let e = python_regex("echo\\N{SPACE}A").unwrap_err();
        assert!(e.contains("\\N{...}") && e.contains("not supported"), "{e}");
    }
}
