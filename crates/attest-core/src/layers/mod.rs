//! Assertion layers: compiling a spec once into a typed check, and running
//! that check against a trace.
//!
//! Each layer lives in its own module and exposes `compile(&Spec)` and
//! `evaluate(&Trace) -> Verdict`. This module owns the list of assertion
//! types, verdicts and their evidence, and [`NativeCheck`]: the layers
//! evaluated here, without a sandbox or a model provider. Layers 5, 6 and 8
//! are compiled and run by the engine, which wraps a [`NativeCheck`] beside
//! its own checks.

pub mod constraint;
pub mod content;
pub mod judged;
pub mod paid;
pub mod schema;
pub mod spec;
pub mod trace;
pub mod trace_tree;

use crate::backends::{Backends, PaidCheck, PluginCheck, ProviderError};
use crate::drift::SpecDigest;
use crate::trace::Trace;
pub use judged::{BiasProbe, JudgeMetadata, Probe, PROBES};
use serde_json::Value;
pub use spec::{Spec, SpecError};

/// Every assertion type the protocol names, built or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssertionType {
    Schema,
    Constraint,
    Trace,
    Content,
    Embedding,
    LlmJudge,
    TraceTree,
    Plugin,
}

impl AssertionType {
    pub const ALL: [AssertionType; 8] = [
        AssertionType::Schema,
        AssertionType::Constraint,
        AssertionType::Trace,
        AssertionType::Content,
        AssertionType::Embedding,
        AssertionType::LlmJudge,
        AssertionType::TraceTree,
        AssertionType::Plugin,
    ];

    pub fn parse(s: &str) -> Option<AssertionType> {
        AssertionType::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            AssertionType::Schema => "schema",
            AssertionType::Constraint => "constraint",
            AssertionType::Trace => "trace",
            AssertionType::Content => "content",
            AssertionType::Embedding => "embedding",
            AssertionType::LlmJudge => "llm_judge",
            AssertionType::TraceTree => "trace_tree",
            AssertionType::Plugin => "plugin",
        }
    }

    /// Layer number (the protocol's layer table; `plugin` is layer 8).
    pub fn layer(self) -> u8 {
        match self {
            AssertionType::Schema => 1,
            AssertionType::Constraint => 2,
            AssertionType::Trace => 3,
            AssertionType::Content => 4,
            AssertionType::Embedding => 5,
            AssertionType::LlmJudge => 6,
            AssertionType::TraceTree => 7,
            AssertionType::Plugin => 8,
        }
    }

    /// Whether the layer calls a model provider (and may cost money).
    pub fn is_paid(self) -> bool {
        matches!(self, AssertionType::Embedding | AssertionType::LlmJudge)
    }

    /// Every type's name, for `detail` texts. All are evaluated; layers 5
    /// and 6 without a provider fail with `2001`, which says how to add one.
    pub fn names() -> String {
        AssertionType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }
}

/// The three outcomes of Attest protocol v1 §2.2 (shared with continuous evaluation).
pub use attest_trace::Status;

/// What a check concluded, before `soft` is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub passed: bool,
    pub score: f64,
    pub explanation: String,
    /// Failures that `soft: true` may not soften (`forbidden`).
    pub always_hard: bool,
    /// What the check wanted and found, built only where it helps (failures,
    /// paid layers): passes on the hot path allocate nothing for it.
    pub evidence: Option<Box<Evidence>>,
}

/// The concrete evidence behind a verdict, carried into the result's
/// `expected`, `actual`, `trace_node_path` and `suggested_action` fields.
/// Every string is clipped by the batch before it is sent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Evidence {
    pub expected: Option<String>,
    pub actual: Option<String>,
    /// Where in the trace the evidence sits (a target path, or an agent path
    /// such as `root > researcher > steps[2]`).
    pub path: Option<String>,
    /// One concrete sentence about what to change.
    pub hint: Option<String>,
    /// The judge's audit trail (layer 6 only).
    pub judge: Option<Box<JudgeMetadata>>,
}

impl Evidence {
    pub fn new(expected: impl Into<String>, actual: impl Into<String>) -> Evidence {
        Evidence {
            expected: Some(expected.into()),
            actual: Some(actual.into()),
            ..Evidence::default()
        }
    }

    pub fn at(mut self, path: impl Into<String>) -> Evidence {
        self.path = Some(path.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Evidence {
        self.hint = Some(hint.into());
        self
    }
}

impl Verdict {
    pub fn pass(explanation: String) -> Verdict {
        Verdict {
            passed: true,
            score: 1.0,
            explanation,
            always_hard: false,
            evidence: None,
        }
    }

    pub fn fail(explanation: String) -> Verdict {
        Verdict {
            passed: false,
            score: 0.0,
            explanation,
            always_hard: false,
            evidence: None,
        }
    }

    /// Attaches evidence (replacing any earlier).
    pub fn with(mut self, evidence: Evidence) -> Verdict {
        self.evidence = Some(Box::new(evidence));
        self
    }

    /// Attaches evidence built by `f`, only when the check failed.
    pub fn on_failure(self, f: impl FnOnce() -> Evidence) -> Verdict {
        if self.passed || self.evidence.is_some() {
            self
        } else {
            let e = f();
            self.with(e)
        }
    }

    pub fn from_bool(passed: bool, explanation: String) -> Verdict {
        if passed {
            Verdict::pass(explanation)
        } else {
            Verdict::fail(explanation)
        }
    }
}

/// A check of a layer evaluated natively: schema (1), constraint (2),
/// trace (3), content (4) and trace tree (7). Free, synchronous and
/// deterministic: the same trace always gets the same verdict.
#[derive(Debug)]
pub enum NativeCheck {
    Schema(schema::SchemaCheck),
    Constraint(constraint::ConstraintCheck),
    Trace(trace::TraceCheck),
    Content(content::ContentCheck),
    TraceTree(trace_tree::TraceTreeCheck),
}

impl NativeCheck {
    /// Compiles `spec` for a native assertion type; `None` for the types
    /// evaluated outside the core (embedding, llm_judge, plugin).
    pub fn compile(kind: AssertionType, spec: &Spec<'_>) -> Option<Result<NativeCheck, SpecError>> {
        Some(match kind {
            AssertionType::Schema => schema::SchemaCheck::compile(spec).map(NativeCheck::Schema),
            AssertionType::Constraint => constraint::ConstraintCheck::compile(spec).map(NativeCheck::Constraint),
            AssertionType::Trace => trace::TraceCheck::compile(spec).map(NativeCheck::Trace),
            AssertionType::Content => content::ContentCheck::compile(spec).map(NativeCheck::Content),
            AssertionType::TraceTree => trace_tree::TraceTreeCheck::compile(spec).map(NativeCheck::TraceTree),
            AssertionType::Embedding | AssertionType::LlmJudge | AssertionType::Plugin => return None,
        })
    }

    pub fn evaluate(&self, trace: &Trace) -> Verdict {
        match self {
            NativeCheck::Schema(c) => c.evaluate(trace),
            NativeCheck::Constraint(c) => c.evaluate(trace),
            NativeCheck::Trace(c) => c.evaluate(trace),
            NativeCheck::Content(c) => c.evaluate(trace),
            NativeCheck::TraceTree(c) => c.evaluate(trace),
        }
    }

    /// Bytes of compiled regex program a scan of the target may walk per
    /// byte of text (0 for checks without patterns). With the trace's size
    /// it bounds the check's running time.
    pub fn scan_weight(&self) -> usize {
        match self {
            NativeCheck::Content(c) => c.scan_weight(),
            NativeCheck::Schema(c) => c.scan_weight(),
            _ => 0,
        }
    }

    /// Whether evaluating this check must not happen on any thread that asks:
    /// schema validations with `patternProperties`, whose regexes (the
    /// schema crate's) keep a search cache for each thread that used them
    /// (see [`crate::watchdog`]). A `pattern` is layer 4's, whose caches are
    /// bounded however many threads use it.
    pub fn needs_regex_thread(&self) -> bool {
        matches!(self, NativeCheck::Schema(c) if c.has_pattern_properties())
    }

    /// Whether one evaluation may take up to a step budget of CPU (a schema
    /// that refers to itself): it runs on the regex threads from any
    /// thread, so that it never holds an async worker (see `watchdog`).
    pub fn may_run_long(&self) -> bool {
        matches!(self, NativeCheck::Schema(c) if c.is_recursive())
    }

    /// Estimated memory the compiled check holds beyond its own struct
    /// (compiled patterns and schemas), for cache accounting.
    pub fn memory_bytes(&self) -> usize {
        match self {
            NativeCheck::Content(c) => c.memory_bytes(),
            NativeCheck::Schema(c) => c.memory_bytes(),
            _ => 0,
        }
    }
}

/// A spec compiled into its typed check.
#[derive(Debug)]
pub enum Check {
    /// Layers 1-4 and 7, evaluated by the core.
    Native(NativeCheck),
    /// Answered by a WebAssembly plugin, one sandboxed call per plugin per
    /// trace (see [`crate::evaluator`]).
    Plugin(PluginCheck),
    /// Answered by a provider, asynchronously: embedding and llm_judge (see
    /// [`CompiledAssertion::evaluate_paid`]).
    Paid(Box<dyn PaidCheck>),
}

/// A compiled assertion: shareable across requests (see the batch cache).
#[derive(Debug)]
pub struct CompiledAssertion {
    pub kind: AssertionType,
    pub check: Check,
    pub soft: bool,
    /// `threshold: "dynamic"`: the status comes from the score's history.
    pub dynamic: bool,
    /// The assertion's identity across runs, before the trace's agent is mixed in.
    pub spec_digest: SpecDigest,
    /// Spec keys this assertion never reads (`None` when it reads them all).
    pub unread: Option<Box<UnreadKeys>>,
}

/// Keys of a spec that its assertion type and check never read: ignored on
/// the wire (specs are forward-compatible), refused in a rules file.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadKeys {
    /// The spec's keys that nothing read, in the spec's order.
    pub keys: Vec<String>,
    /// The keys this assertion reads, sorted: the valid choices.
    pub known: Vec<&'static str>,
}

impl CompiledAssertion {
    /// Compiles `spec` for an assertion of type `kind`; `backends` compile
    /// the types the core does not evaluate itself.
    pub fn compile(kind: AssertionType, spec: Option<&Value>, backends: &dyn Backends) -> Result<CompiledAssertion, SpecError> {
        let reader = Spec::new(spec, kind.name())?;
        let check = match NativeCheck::compile(kind, &reader) {
            Some(native) => Check::Native(native?),
            None if kind == AssertionType::Plugin => Check::Plugin(backends.compile_plugin(&reader)?),
            None => Check::Paid(backends.compile_paid(kind, &reader)?),
        };
        // Every type takes `threshold: "dynamic"`; only the paid layers read
        // a number there (their compile asks for it). A number on any other
        // type is ignored, so it is left unread, and a rules file refuses it.
        let dynamic = match reader.peek("threshold") {
            Some(Value::String(s)) if s == "dynamic" => reader.raw("threshold").is_some(),
            Some(Value::String(s)) => {
                return Err(SpecError::new(
                    "spec.threshold",
                    format!("threshold must be a number or \"dynamic\", got {}", crate::text::quote(s)),
                    "Use a number, or \"dynamic\" to judge the score against this assertion's history (see README, Result history).",
                ))
            }
            _ => false,
        };
        let soft = reader.bool_or("soft", false)?;
        Ok(CompiledAssertion {
            kind,
            check,
            soft,
            dynamic,
            spec_digest: SpecDigest::of(kind.name(), spec),
            unread: reader.unread_keys(),
        })
    }

    /// Bytes of compiled regex program a scan of the target may walk per
    /// byte of text (0 for checks without patterns). With the trace's size
    /// it bounds the check's running time.
    pub fn scan_weight(&self) -> usize {
        match &self.check {
            Check::Native(c) => c.scan_weight(),
            _ => 0,
        }
    }

    /// Whether evaluating this check must not happen on any thread that asks:
    /// schema validations with patterns, whose regex caches grow with the
    /// threads that use them (see `watchdog`).
    pub fn needs_regex_thread(&self) -> bool {
        matches!(&self.check, Check::Native(c) if c.needs_regex_thread())
    }

    /// See [`NativeCheck::may_run_long`].
    pub fn may_run_long(&self) -> bool {
        matches!(&self.check, Check::Native(c) if c.may_run_long())
    }

    /// Estimated memory this compiled assertion holds, for cache accounting.
    pub fn memory_bytes(&self) -> usize {
        const BASE: usize = 512;
        let unread = self.unread.as_ref().map_or(0, |u| {
            (u.keys.len() + u.known.len()) * 24 + u.keys.iter().map(String::len).sum::<usize>()
        });
        BASE + unread
            + match &self.check {
                Check::Native(c) => c.memory_bytes(),
                _ => 0,
            }
    }

    /// Evaluates a built-in check. Plugin checks are run per batch instead
    /// (see [`crate::evaluator`]) and classified with [`CompiledAssertion::classify`].
    pub fn evaluate(&self, trace: &Trace) -> (Status, Verdict) {
        let verdict = match &self.check {
            Check::Native(c) => c.evaluate(trace),
            Check::Plugin(c) => unreachable!("plugin {} checks are evaluated per batch", c.plugin.id()),
            Check::Paid(_) => unreachable!("paid checks are evaluated with evaluate_paid"),
        };
        self.classify(verdict)
    }

    /// Evaluates a paid check (layers 5 and 6) through its provider; returns
    /// the verdict and its cost in USD. Provider failures are errors, never
    /// verdicts: an unreachable judge says nothing about the agent.
    pub async fn evaluate_paid(&self, trace: &Trace, deadline: tokio::time::Instant) -> Result<(Verdict, f64), ProviderError> {
        match &self.check {
            Check::Paid(c) => c.evaluate(trace, deadline).await,
            _ => unreachable!("{} is not a paid check", self.kind.name()),
        }
    }

    /// Applies `soft` to a verdict.
    pub fn classify(&self, verdict: Verdict) -> (Status, Verdict) {
        let status = if verdict.passed {
            Status::Pass
        } else if self.soft && !verdict.always_hard {
            Status::SoftFail
        } else {
            Status::HardFail
        };
        (status, verdict)
    }
}
