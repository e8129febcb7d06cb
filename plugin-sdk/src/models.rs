//! Capabilities: embeddings, an LLM judge and operator secrets, served by
//! the engine (WIT `models` and `secrets`, `attest:plugin@0.2.0`).
//!
//! A plugin requests what it uses in [`PluginInfo::requests`](crate::PluginInfo::requests);
//! the operator grants it per plugin in the engine's config file, and
//! nothing is granted by default. A call the operator did not grant answers
//! [`CapabilityError::NotGranted`], naming the config key that grants it.
//!
//! The engine's provider cache, retries, deadline and session budget apply
//! to every call, and what `embed` and `judge` cost is added to the
//! assertion's cost. In native builds (plain `cargo test`) there is no
//! engine: [`crate::testing`] installs fakes for these calls.

use std::fmt;

/// A host ability beyond logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    /// [`embed`].
    Embed,
    /// [`judge`].
    Judge,
    /// [`config_secret`].
    ConfigSecret,
}

impl Capability {
    pub fn name(self) -> &'static str {
        match self {
            Capability::Embed => "embed",
            Capability::Judge => "judge",
            Capability::ConfigSecret => "config-secret",
        }
    }
}

/// Why a capability call gave no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum CapabilityError {
    /// The operator did not grant it; `config_key` says where to.
    NotGranted {
        capability: Capability,
        config_key: String,
        message: String,
    },
    /// The session's cost budget is spent.
    BudgetExhausted(String),
    /// The input is over the engine's limits, or too many calls were made.
    OverLimit(String),
    /// No provider is configured, or it failed or timed out.
    Unavailable(String),
}

impl fmt::Display for CapabilityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapabilityError::NotGranted { message, .. } => f.write_str(message),
            CapabilityError::BudgetExhausted(m) => write!(f, "budget exhausted: {m}"),
            CapabilityError::OverLimit(m) => write!(f, "over limit: {m}"),
            CapabilityError::Unavailable(m) => write!(f, "unavailable: {m}"),
        }
    }
}

impl std::error::Error for CapabilityError {}

/// A failed capability call is a plugin error (`internal`), so `?` works in
/// `evaluate`; the engine shows its message in the assertion's explanation.
impl From<CapabilityError> for crate::PluginError {
    fn from(e: CapabilityError) -> crate::PluginError {
        crate::PluginError::internal(e.to_string())
    }
}

/// A scored example shown to the judge.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub content: String,
    /// From 0.0 to 1.0.
    pub score: f64,
    pub reasoning: String,
}

/// What to ask the judge.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgeRequest {
    /// What a good answer looks like, in the team's words.
    pub rubric: String,
    /// The text to judge (the engine marks it as data, never instructions).
    pub content: String,
    /// Material the content may be checked against.
    pub context: Option<String>,
    pub examples: Vec<Example>,
}

impl JudgeRequest {
    pub fn new(rubric: impl Into<String>, content: impl Into<String>) -> JudgeRequest {
        JudgeRequest {
            rubric: rubric.into(),
            content: content.into(),
            ..JudgeRequest::default()
        }
    }

    pub fn context(mut self, context: impl Into<String>) -> JudgeRequest {
        self.context = Some(context.into());
        self
    }

    pub fn example(mut self, content: impl Into<String>, score: f64, reasoning: impl Into<String>) -> JudgeRequest {
        self.examples.push(Example {
            content: content.into(),
            score,
            reasoning: reasoning.into(),
        });
        self
    }
}

/// The judge's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// From 0.0 to 1.0.
    pub score: f64,
    pub reasoning: String,
}

/// One embedding per text, in order (at most 64 texts of 32 KiB per call).
pub fn embed(texts: &[&str]) -> Result<Vec<Vec<f32>>, CapabilityError> {
    imp::embed(texts)
}

/// Asks the engine's LLM judge.
pub fn judge(request: &JudgeRequest) -> Result<Judgement, CapabilityError> {
    imp::judge(request)
}

/// The value the operator mapped to `name` for this plugin, if any.
pub fn config_secret(name: &str) -> Result<Option<String>, CapabilityError> {
    imp::config_secret(name)
}

/// Cosine similarity of two vectors (0 when either is all zeros or their
/// lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::*;
    use crate::__bindings::attest::plugin::{models, secrets, types};

    fn from_wit(e: types::CapabilityError) -> CapabilityError {
        match e {
            types::CapabilityError::NotGranted(d) => CapabilityError::NotGranted {
                capability: match d.capability {
                    types::Capability::Embed => Capability::Embed,
                    types::Capability::Judge => Capability::Judge,
                    types::Capability::ConfigSecret => Capability::ConfigSecret,
                },
                config_key: d.config_key,
                message: d.message,
            },
            types::CapabilityError::BudgetExhausted(m) => CapabilityError::BudgetExhausted(m),
            types::CapabilityError::OverLimit(m) => CapabilityError::OverLimit(m),
            types::CapabilityError::Unavailable(m) => CapabilityError::Unavailable(m),
        }
    }

    pub fn embed(texts: &[&str]) -> Result<Vec<Vec<f32>>, CapabilityError> {
        let owned: Vec<String> = texts.iter().map(|t| (*t).to_owned()).collect();
        models::embed(&owned).map_err(from_wit)
    }

    pub fn judge(request: &JudgeRequest) -> Result<Judgement, CapabilityError> {
        let request = models::JudgeRequest {
            rubric: request.rubric.clone(),
            content: request.content.clone(),
            context: request.context.clone(),
            examples: request
                .examples
                .iter()
                .map(|e| models::Example {
                    content: e.content.clone(),
                    score: e.score,
                    reasoning: e.reasoning.clone(),
                })
                .collect(),
        };
        models::judge(&request)
            .map(|j| Judgement {
                score: j.score,
                reasoning: j.reasoning,
            })
            .map_err(from_wit)
    }

    pub fn config_secret(name: &str) -> Result<Option<String>, CapabilityError> {
        secrets::config_secret(name).map_err(from_wit)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    //! Natively there is no engine: calls go to the fakes a test installed
    //! (per thread, see [`crate::testing::FakeHost`]), and are refused as
    //! not granted when none is.
    use super::*;
    use std::cell::RefCell;

    type Embedder = Box<dyn FnMut(&[&str]) -> Result<Vec<Vec<f32>>, CapabilityError>>;
    type Judge = Box<dyn FnMut(&JudgeRequest) -> Result<Judgement, CapabilityError>>;

    #[derive(Default)]
    pub struct Fakes {
        pub embed: Option<Embedder>,
        pub judge: Option<Judge>,
        pub secrets: Option<Vec<(String, String)>>,
        pub calls: Vec<Capability>,
    }

    thread_local! {
        pub static FAKES: RefCell<Fakes> = RefCell::new(Fakes::default());
    }

    fn refused(capability: Capability) -> CapabilityError {
        CapabilityError::NotGranted {
            capability,
            config_key: "plugins[].grants".to_owned(),
            message: format!(
                "capability '{}' is not granted (in a native test, install a fake with attest_plugin_sdk::testing::FakeHost)",
                capability.name()
            ),
        }
    }

    pub fn embed(texts: &[&str]) -> Result<Vec<Vec<f32>>, CapabilityError> {
        FAKES.with(|f| {
            let mut f = f.borrow_mut();
            f.calls.push(Capability::Embed);
            match f.embed.as_mut() {
                Some(embed) => embed(texts),
                None => Err(refused(Capability::Embed)),
            }
        })
    }

    pub fn judge(request: &JudgeRequest) -> Result<Judgement, CapabilityError> {
        FAKES.with(|f| {
            let mut f = f.borrow_mut();
            f.calls.push(Capability::Judge);
            match f.judge.as_mut() {
                Some(judge) => judge(request),
                None => Err(refused(Capability::Judge)),
            }
        })
    }

    pub fn config_secret(name: &str) -> Result<Option<String>, CapabilityError> {
        FAKES.with(|f| {
            let mut f = f.borrow_mut();
            f.calls.push(Capability::ConfigSecret);
            match &f.secrets {
                Some(secrets) => Ok(secrets.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())),
                None => Err(refused(Capability::ConfigSecret)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_known_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    }

    #[test]
    fn without_fakes_every_call_is_refused_as_not_granted() {
        assert!(matches!(
            embed(&["x"]),
            Err(CapabilityError::NotGranted {
                capability: Capability::Embed,
                ..
            })
        ));
        let e = judge(&JudgeRequest::new("r", "c")).unwrap_err();
        assert!(e.to_string().contains("'judge' is not granted"), "{e}");
        let as_plugin_error: crate::PluginError = e.into();
        assert!(matches!(as_plugin_error, crate::PluginError::Internal(_)));
    }
}
