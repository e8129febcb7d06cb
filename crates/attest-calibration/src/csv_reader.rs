//! A CSV reader with the exact record-splitting rules of Python's
//! `csv.reader` in its default ("excel", non-strict) dialect over
//! `io.StringIO(text)`, which is how the SDK reads label files.
//!
//! The rules that matter for parity and that general CSV crates treat
//! differently: a quote only opens a quoted field at the very start of a
//! field; text after a closing quote is appended to the field; an
//! unterminated quote runs to the end of the text and is kept; a carriage
//! return in an unquoted field must be followed by a line feed; an empty
//! line is an empty record; a field holds at most 131072 characters.
//! The `csv` crate reads a lone `\r` as a record end, drops blank lines and
//! has no field limit, so it would number lines and reject files differently.

/// Python's default `csv.field_size_limit()`: the longest field, in characters.
pub(crate) const FIELD_LIMIT_CHARS: usize = 131_072;

/// One parsed record and the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub line: usize,
    pub fields: Vec<String>,
}

/// Why the text is not CSV Python's reader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CsvSyntax {
    /// A `\r` outside quotes followed by more text on the same line.
    BareCarriageReturn { line: usize },
    /// A field longer than [`FIELD_LIMIT_CHARS`].
    FieldTooLong { line: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    StartRecord,
    StartField,
    InField,
    InQuotedField,
    QuoteInQuotedField,
    EatCrnl,
}

/// A character of a line, or the end-of-line marker Python's reader feeds
/// after every line it reads.
#[derive(Clone, Copy)]
enum Input {
    Char(char),
    EndOfLine,
}

struct Reader {
    state: State,
    field: String,
    field_chars: usize,
    fields: Vec<String>,
    line: usize,
    record_line: usize,
}

impl Reader {
    fn save_field(&mut self) {
        self.fields.push(std::mem::take(&mut self.field));
        self.field_chars = 0;
    }

    fn add_char(&mut self, c: char) -> Result<(), CsvSyntax> {
        if self.field_chars >= FIELD_LIMIT_CHARS {
            return Err(CsvSyntax::FieldTooLong { line: self.line });
        }
        self.field.push(c);
        self.field_chars += 1;
        Ok(())
    }

    /// Ends the current line of fields: `EndOfLine` completes the record,
    /// a newline character first waits for the end of the line.
    fn end_line(&mut self, input: Input) {
        self.save_field();
        self.state = match input {
            Input::EndOfLine => State::StartRecord,
            Input::Char(_) => State::EatCrnl,
        };
    }

    fn process(&mut self, input: Input) -> Result<(), CsvSyntax> {
        let is_newline = matches!(input, Input::Char('\n' | '\r'));
        let is_end = matches!(input, Input::EndOfLine);
        match self.state {
            State::StartRecord if is_end => {}
            State::StartRecord if is_newline => self.state = State::EatCrnl,
            State::StartRecord | State::StartField => {
                self.state = State::StartField;
                match input {
                    _ if is_newline || is_end => self.end_line(input),
                    Input::Char('"') => self.state = State::InQuotedField,
                    Input::Char(',') => self.save_field(),
                    Input::Char(c) => {
                        self.add_char(c)?;
                        self.state = State::InField;
                    }
                    Input::EndOfLine => {}
                }
            }
            State::InField => match input {
                _ if is_newline || is_end => self.end_line(input),
                Input::Char(',') => {
                    self.save_field();
                    self.state = State::StartField;
                }
                Input::Char(c) => self.add_char(c)?,
                Input::EndOfLine => {}
            },
            State::InQuotedField => match input {
                Input::EndOfLine => {}
                Input::Char('"') => self.state = State::QuoteInQuotedField,
                Input::Char(c) => self.add_char(c)?,
            },
            State::QuoteInQuotedField => match input {
                Input::Char('"') => {
                    self.add_char('"')?;
                    self.state = State::InQuotedField;
                }
                Input::Char(',') => {
                    self.save_field();
                    self.state = State::StartField;
                }
                _ if is_newline || is_end => self.end_line(input),
                Input::Char(c) => {
                    self.add_char(c)?;
                    self.state = State::InField;
                }
                Input::EndOfLine => {}
            },
            State::EatCrnl => match input {
                _ if is_newline => {}
                Input::EndOfLine => self.state = State::StartRecord,
                Input::Char(_) => return Err(CsvSyntax::BareCarriageReturn { line: self.line }),
            },
        }
        Ok(())
    }
}

/// Splits `text` into records exactly as `list(csv.reader(io.StringIO(text)))`.
pub(crate) fn read_records(text: &str) -> Result<Vec<Record>, CsvSyntax> {
    let mut reader = Reader {
        state: State::StartRecord,
        field: String::new(),
        field_chars: 0,
        fields: Vec::new(),
        line: 1,
        record_line: 1,
    };
    let mut records = Vec::new();
    // `StringIO` yields lines that end after each `\n`; the reader processes
    // each line's characters, then the end-of-line marker.
    for (index, line) in text.split_inclusive('\n').enumerate() {
        reader.line = index + 1;
        if reader.state == State::StartRecord {
            reader.record_line = reader.line;
        }
        for c in line.chars() {
            reader.process(Input::Char(c))?;
        }
        reader.process(Input::EndOfLine)?;
        if reader.state == State::StartRecord {
            records.push(Record {
                line: reader.record_line,
                fields: std::mem::take(&mut reader.fields),
            });
        }
    }
    // Non-strict Python keeps an unterminated quoted field at end of text.
    if reader.state == State::InQuotedField {
        reader.save_field();
        records.push(Record {
            line: reader.record_line,
            fields: reader.fields,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(text: &str) -> Vec<Vec<String>> {
        read_records(text).expect("valid CSV").into_iter().map(|r| r.fields).collect()
    }

    #[test]
    fn python_reader_rules() {
        assert_eq!(rows("\"ab\"c,d\n"), [["abc", "d"]]);
        assert_eq!(rows("a\"b,c\n"), [["a\"b", "c"]]);
        assert_eq!(rows("\"x\n"), [["x\n"]]);
        assert_eq!(rows("a,\n"), [["a", ""]]);
        assert_eq!(rows("\"\"\n"), [[""]]);
        assert_eq!(rows("x,\"1\r\n"), [["x", "1\r\n"]]);
        assert_eq!(rows(" \"a\",1\n"), [[" \"a\"", "1"]]);
        assert_eq!(rows("a,b\r"), [["a", "b"]]);
        assert_eq!(rows("a\0b,1"), [["a\0b", "1"]]);
        assert_eq!(rows("\n\n"), [Vec::<String>::new(), Vec::new()]);
        assert_eq!(rows("\"q\"\"q\",2\r\n"), [["q\"q", "2"]]);
        assert!(rows("").is_empty());
    }

    #[test]
    fn records_know_their_first_line() {
        let records = read_records("a,1\n\"multi\nline\",2\nb,3").expect("valid CSV");
        let lines: Vec<usize> = records.iter().map(|r| r.line).collect();
        assert_eq!(lines, [1, 2, 4]);
    }

    #[test]
    fn bare_carriage_return_is_rejected_with_its_line() {
        assert_eq!(read_records("x,1\na,b\rc,d\n"), Err(CsvSyntax::BareCarriageReturn { line: 2 }));
    }

    #[test]
    fn field_limit_is_python_default() {
        let ok = format!("{},1\n", "a".repeat(FIELD_LIMIT_CHARS));
        assert_eq!(read_records(&ok).map(|r| r.len()), Ok(1));
        let long = format!("x,1\n{},1\n", "é".repeat(FIELD_LIMIT_CHARS + 1));
        assert_eq!(read_records(&long), Err(CsvSyntax::FieldTooLong { line: 2 }));
    }
}
