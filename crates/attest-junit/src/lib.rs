//! The one JUnit XML model and writer: the engine's session report
//! (`--report junit=PATH`) and the ECP runtime's (`ecp run --junit`) are
//! both built as a [`Report`] and written by [`Report::to_xml`], so the two
//! agree on layout, escaping and what a CI tool can count.
//!
//! The layout is the one CI tools read (Jenkins, GitLab, GitHub's test
//! reporters): `<testsuites>` with totals, a `<testsuite>` per group with its
//! own counts, a `<testcase>` per check whose child says how it ended
//! (`<failure>`, `<error>`, `<skipped>`, nothing when it passed), then what
//! it printed (`<system-out>`). Text XML 1.0 cannot carry (control
//! characters, U+FFFE, U+FFFF) becomes U+FFFD ([`attest_io::xml_text`]);
//! the rest is escaped, in attributes and text alike.

#![forbid(unsafe_code)]

use std::fmt::Write;

/// The whole file: totals, then the suites in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub name: String,
    /// Totals as the producer counts them: a suite may stand for more
    /// results than it lists (results omitted for size, say).
    pub counts: Counts,
    pub seconds: f64,
    pub suites: Vec<Suite>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tests: u64,
    pub failures: u64,
    pub errors: u64,
    pub skipped: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Suite {
    pub name: String,
    /// The suite's position, for tools that want an `id`.
    pub id: Option<usize>,
    pub counts: Counts,
    pub seconds: f64,
    /// When it ran, ISO 8601 without a zone (as the JUnit schema has it).
    pub timestamp: Option<String>,
    pub properties: Vec<(String, String)>,
    pub cases: Vec<Case>,
    /// Written when `Some`, even empty: some readers expect the elements.
    pub system_out: Option<String>,
    pub system_err: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Case {
    pub name: String,
    pub classname: String,
    pub seconds: f64,
    pub outcome: Outcome,
    pub system_out: Option<String>,
}

/// How a test case ended.
#[derive(Debug, Clone, Default)]
pub enum Outcome {
    #[default]
    Passed,
    /// A check that did not hold.
    Failure {
        message: String,
        kind: String,
        text: String,
    },
    /// A case that could not be run to a verdict; `text` may be absent.
    Error {
        message: String,
        kind: String,
        text: Option<String>,
    },
    Skipped {
        message: String,
    },
}

/// Escaped text XML can carry.
fn esc(s: &str) -> String {
    quick_xml::escape::escape(attest_io::xml_text(s)).into_owned()
}

fn secs(s: f64) -> String {
    format!("{s:.3}")
}

impl Counts {
    fn attributes(&self) -> String {
        format!(
            "tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\"",
            self.tests, self.failures, self.errors, self.skipped
        )
    }
}

impl Report {
    /// The report as a JUnit XML document, ending with a line break.
    pub fn to_xml(&self) -> String {
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuites name=\"{}\" {} time=\"{}\">",
            esc(&self.name),
            self.counts.attributes(),
            secs(self.seconds)
        );
        for s in &self.suites {
            s.write(&mut x);
        }
        x.push_str("</testsuites>\n");
        x
    }
}

impl Suite {
    fn write(&self, x: &mut String) {
        let _ = write!(x, "  <testsuite name=\"{}\"", esc(&self.name));
        if let Some(id) = self.id {
            let _ = write!(x, " id=\"{id}\"");
        }
        let _ = write!(x, " {} time=\"{}\"", self.counts.attributes(), secs(self.seconds));
        if let Some(t) = &self.timestamp {
            let _ = write!(x, " timestamp=\"{}\"", esc(t));
        }
        x.push_str(">\n");
        if !self.properties.is_empty() {
            x.push_str("    <properties>\n");
            for (name, value) in &self.properties {
                let _ = writeln!(x, "      <property name=\"{}\" value=\"{}\"/>", esc(name), esc(value));
            }
            x.push_str("    </properties>\n");
        }
        for c in &self.cases {
            c.write(x);
        }
        if let Some(out) = &self.system_out {
            let _ = writeln!(x, "    <system-out>{}</system-out>", esc(out));
        }
        if let Some(err) = &self.system_err {
            let _ = writeln!(x, "    <system-err>{}</system-err>", esc(err));
        }
        x.push_str("  </testsuite>\n");
    }
}

impl Case {
    fn write(&self, x: &mut String) {
        let _ = write!(
            x,
            "    <testcase name=\"{}\" classname=\"{}\" time=\"{}\"",
            esc(&self.name),
            esc(&self.classname),
            secs(self.seconds)
        );
        if matches!(self.outcome, Outcome::Passed) && self.system_out.is_none() {
            x.push_str("/>\n");
            return;
        }
        x.push_str(">\n");
        match &self.outcome {
            Outcome::Passed => {}
            Outcome::Failure { message, kind, text } => {
                let _ = writeln!(
                    x,
                    "      <failure message=\"{}\" type=\"{}\">{}</failure>",
                    esc(message),
                    esc(kind),
                    esc(text)
                );
            }
            Outcome::Error { message, kind, text } => {
                let _ = write!(x, "      <error message=\"{}\" type=\"{}\"", esc(message), esc(kind));
                match text {
                    Some(t) => {
                        let _ = writeln!(x, ">{}</error>", esc(t));
                    }
                    None => x.push_str("/>\n"),
                }
            }
            Outcome::Skipped { message } => {
                let _ = writeln!(x, "      <skipped message=\"{}\"/>", esc(message));
            }
        }
        if let Some(out) = &self.system_out {
            let _ = writeln!(x, "      <system-out>{}</system-out>", esc(out));
        }
        x.push_str("    </testcase>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_written_and_text_is_escaped_and_xml_safe() {
        let case = |name: &str, outcome| Case {
            name: name.into(),
            classname: "c".into(),
            seconds: 0.0015,
            outcome,
            system_out: None,
        };
        let report = Report {
            name: "r<&>".into(),
            counts: Counts {
                tests: 4,
                failures: 1,
                errors: 1,
                skipped: 1,
            },
            seconds: 1.0,
            suites: vec![Suite {
                name: "s".into(),
                id: Some(0),
                counts: Counts {
                    tests: 4,
                    failures: 1,
                    errors: 1,
                    skipped: 1,
                },
                timestamp: Some("2026-12-07T10:00:00".into()),
                properties: vec![("k".into(), "v\"".into())],
                cases: vec![
                    case("ok", Outcome::Passed),
                    Case {
                        system_out: Some("said \u{1}hi".into()),
                        ..case(
                            "bad",
                            Outcome::Failure {
                                message: "m".into(),
                                kind: "hard_fail".into(),
                                text: "a ]]> b".into(),
                            },
                        )
                    },
                    case(
                        "broke",
                        Outcome::Error {
                            message: "e".into(),
                            kind: "timeout".into(),
                            text: None,
                        },
                    ),
                    case("skip", Outcome::Skipped { message: "later".into() }),
                ],
                system_out: None,
                system_err: Some(String::new()),
                seconds: 1.0,
            }],
        };
        assert_eq!(
            report.to_xml(),
            r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="r&lt;&amp;&gt;" tests="4" failures="1" errors="1" skipped="1" time="1.000">
  <testsuite name="s" id="0" tests="4" failures="1" errors="1" skipped="1" time="1.000" timestamp="2026-12-07T10:00:00">
    <properties>
      <property name="k" value="v&quot;"/>
    </properties>
    <testcase name="ok" classname="c" time="0.002"/>
    <testcase name="bad" classname="c" time="0.002">
      <failure message="m" type="hard_fail">a ]]&gt; b</failure>
      <system-out>said �hi</system-out>
    </testcase>
    <testcase name="broke" classname="c" time="0.002">
      <error message="e" type="timeout"/>
    </testcase>
    <testcase name="skip" classname="c" time="0.002">
      <skipped message="later"/>
    </testcase>
    <system-err></system-err>
  </testsuite>
</testsuites>
"#
        );
    }
}
