//! Capabilities: what a plugin may ask of the engine beyond logging
//! (`attest:plugin@0.2.0` and later), who grants them, and how each call is
//! served, bounded and accounted for.
//!
//! - A plugin *requests* capabilities in `describe()`; the operator *grants*
//!   them per plugin in the config file (`[[plugins]] grants = [...]`).
//!   Nothing is granted by default, and only what is both requested and
//!   granted is usable. A refused call is a typed `not-granted` error naming
//!   the capability and the config key that grants it: the plugin still
//!   loads, and decides what to make of the refusal.
//! - `embed` and `judge` go to the engine's providers (through [`Models`],
//!   which the engine implements), so the provider cache, retries, time-outs
//!   and prices apply. Their cost is added to the assertion's `cost`, and a
//!   call is refused once the session's budget is spent.
//! - A call waits on its own runtime (so it works whatever the caller's
//!   runtime is), for no longer than the plugin call's deadline: the time
//!   counts against the plugin, and a waiting plugin burns no fuel.
//! - `config-secret` answers only values the operator mapped to the plugin.

use attest_core::backends::{BoxFuture, ProviderError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A host ability beyond logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    Embed,
    Judge,
    ConfigSecret,
}

impl Capability {
    pub const ALL: [Capability; 3] = [Capability::Embed, Capability::Judge, Capability::ConfigSecret];

    /// The name plugins request and operators grant it by.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Embed => "embed",
            Capability::Judge => "judge",
            Capability::ConfigSecret => "config-secret",
        }
    }

    pub fn parse(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether calls cost money and go to a provider.
    pub fn is_model(self) -> bool {
        matches!(self, Capability::Embed | Capability::Judge)
    }
}

/// The config key that grants capabilities to a plugin.
pub const GRANTS_KEY: &str = "plugins[].grants";
/// The config key that maps secrets to a plugin.
pub const SECRETS_KEY: &str = "plugins[].secrets";

/// What the operator granted one plugin. Secret values are never logged,
/// listed or serialised; only their names are.
#[derive(Clone, Default, PartialEq)]
pub struct Grants {
    pub capabilities: Vec<Capability>,
    pub secrets: BTreeMap<String, String>,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grants")
            .field("capabilities", &self.capabilities)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Grants {
    pub fn allows(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }
}

/// Largest number of texts one `embed` call may carry.
pub const MAX_EMBED_TEXTS: usize = 64;
/// Longest text `embed` accepts, in bytes.
pub const MAX_EMBED_TEXT_BYTES: usize = 32 * 1024;
/// Longest rubric, content or context a `judge` call may carry, in bytes.
pub const MAX_JUDGE_TEXT_BYTES: usize = 32 * 1024;
/// Most few-shot examples one `judge` call may carry.
pub const MAX_JUDGE_EXAMPLES: usize = 16;
/// Longest example content or reasoning, in bytes.
pub const MAX_EXAMPLE_BYTES: usize = 4 * 1024;
/// `text` with every secret value in `secrets` replaced by `[secret 'name']`.
/// Every string a plugin hands out (its verdicts' explanations and details,
/// its log lines, its last words before a trap) passes through here: a
/// plugin that prints, returns or panics with a secret it was given must not
/// hand it on to whoever reads results, reports or logs. Longer values are
/// replaced first, so a secret that contains another is masked whole.
pub fn mask<'t>(text: &'t str, secrets: &BTreeMap<String, String>) -> std::borrow::Cow<'t, str> {
    let mut found: Vec<(&String, &String)> = secrets.iter().filter(|(_, v)| !v.is_empty() && text.contains(v.as_str())).collect();
    if found.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    found.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
    let mut out = text.to_owned();
    for (name, value) in found {
        out = out.replace(value.as_str(), &format!("[secret {}]", crate::text::quote(name)));
    }
    std::borrow::Cow::Owned(out)
}

/// [`mask`] over every string of a JSON value, keys included.
pub fn mask_json(value: &mut serde_json::Value, secrets: &BTreeMap<String, String>) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(m) = mask(s, secrets) {
                *s = m;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_json(v, secrets)),
        Value::Object(map) => {
            let entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            for (k, mut v) in entries {
                mask_json(&mut v, secrets);
                map.insert(mask(&k, secrets).into_owned(), v);
            }
        }
        _ => {}
    }
}

/// Longest secret name, in bytes.
pub const MAX_SECRET_NAME_BYTES: usize = 256;
/// Model calls (`embed` and `judge`) one plugin call may make: a plugin
/// stuck in a loop spends at most this many before it is refused.
pub const MAX_MODEL_CALLS: u32 = 32;
/// Capability calls remembered per plugin call, for `plugin test`.
pub const MAX_RECORDED_CALLS: usize = 64;

/// A judge request, as a plugin sent it (within the limits above).
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeRequest {
    pub rubric: String,
    pub content: String,
    pub context: Option<String>,
    pub examples: Vec<Example>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub content: String,
    pub score: f64,
    pub reasoning: String,
}

/// What a judge concluded, and what asking cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub score: f64,
    pub reasoning: String,
    pub cost: f64,
    pub cached: bool,
}

/// Embeddings, and what they cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub cost: f64,
}

/// The engine's models, as plugins reach them. The engine implements this
/// over its providers; the futures own what they need (they run on the
/// capability runtime, not the caller's).
pub trait Models: Send + Sync {
    fn embed(&self, texts: Vec<String>, deadline: tokio::time::Instant) -> BoxFuture<'static, Result<Embeddings, ProviderError>>;
    fn judge(&self, request: JudgeRequest, deadline: tokio::time::Instant) -> BoxFuture<'static, Result<Judgement, ProviderError>>;
}

/// Why a capability call gave no answer (the WIT `capability-error`).
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    NotGranted { capability: Capability, message: String },
    BudgetExhausted(String),
    OverLimit(String),
    Unavailable(String),
}

impl CallError {
    fn kind(&self) -> &'static str {
        match self {
            CallError::NotGranted { .. } => "not-granted",
            CallError::BudgetExhausted(_) => "budget-exhausted",
            CallError::OverLimit(_) => "over-limit",
            CallError::Unavailable(_) => "unavailable",
        }
    }

    fn message(&self) -> &str {
        match self {
            CallError::NotGranted { message, .. }
            | CallError::BudgetExhausted(message)
            | CallError::OverLimit(message)
            | CallError::Unavailable(message) => message,
        }
    }
}

/// The refusal of a capability the plugin may not use.
pub fn not_granted(plugin_id: &str, capability: Capability, requested: bool) -> CallError {
    let name = capability.name();
    let message = if requested {
        format!(
            "capability '{name}' is not granted to plugin '{plugin_id}': the operator grants it with grants = [\"{name}\"] in the plugin's [[plugins]] entry of the engine's config file ({GRANTS_KEY}); `attest-engine plugin test` also takes --grant {name}"
        )
    } else {
        format!(
            "capability '{name}' was not requested by plugin '{plugin_id}': list it in describe()'s capabilities, and have the operator grant it with grants = [\"{name}\"] in the plugin's [[plugins]] entry ({GRANTS_KEY})"
        )
    };
    CallError::NotGranted { capability, message }
}

/// One capability call, as `plugin test` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    pub capability: Capability,
    /// What was asked, in a few words (`3 texts`, `secret 'api_key'`).
    pub asked: String,
    /// `ok`, or the error's kind.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub ms: f64,
    pub cost: f64,
}

/// What one plugin call may use, and what it has used: built for each call
/// of a plugin holding a grant, and read back when the call ends.
pub struct CallContext {
    pub plugin_id: Arc<str>,
    /// Requested and granted.
    pub usable: Vec<Capability>,
    /// Requested (for the refusal's wording).
    pub requested: Vec<Capability>,
    pub secrets: Arc<BTreeMap<String, String>>,
    pub models: Option<Arc<dyn Models>>,
    /// The plugin call's deadline: no capability call waits past it.
    pub deadline: Instant,
    /// USD this call may still spend (`None`: no budget).
    pub budget_left: Option<f64>,
    /// USD spent by this call's model calls.
    pub spent: f64,
    pub model_calls: u32,
    /// Set when a model call was refused because the budget is spent.
    pub budget_refusal: Option<String>,
    pub records: Vec<CallRecord>,
    /// Calls beyond [`MAX_RECORDED_CALLS`].
    pub unrecorded: usize,
}

impl CallContext {
    fn check(&self, capability: Capability) -> Result<(), CallError> {
        if self.usable.contains(&capability) {
            Ok(())
        } else {
            Err(not_granted(&self.plugin_id, capability, self.requested.contains(&capability)))
        }
    }

    /// Refuses a model call that would go over the call limit or the budget.
    fn admit_model_call(&mut self) -> Result<(), CallError> {
        if self.model_calls >= MAX_MODEL_CALLS {
            return Err(CallError::OverLimit(format!(
                "plugin '{}' made {MAX_MODEL_CALLS} model calls (embed, judge) in one evaluation; that is the limit",
                self.plugin_id
            )));
        }
        if let Some(left) = self.budget_left {
            if self.spent >= left {
                let why = format!(
                    "the session's cost budget is spent (${:.6} left when the plugin was called, ${:.6} spent since): raise budget_usd in the engine's config file or start a new session",
                    left.max(0.0),
                    self.spent
                );
                self.budget_refusal = Some(why.clone());
                return Err(CallError::BudgetExhausted(why));
            }
        }
        self.model_calls += 1;
        Ok(())
    }

    fn record(&mut self, capability: Capability, asked: String, outcome: &Result<f64, CallError>, started: Instant) {
        if self.records.len() >= MAX_RECORDED_CALLS {
            self.unrecorded += 1;
            return;
        }
        let (outcome, error, cost) = match outcome {
            Ok(cost) => ("ok".to_owned(), None, *cost),
            Err(e) => (e.kind().to_owned(), Some(crate::text::clip(e.message(), 300)), 0.0),
        };
        self.records.push(CallRecord {
            capability,
            asked,
            outcome,
            error,
            ms: started.elapsed().as_secs_f64() * 1000.0,
            cost,
        });
    }

    /// `models.embed`: `texts` as lifted from the plugin, or why they were
    /// not (over the limits; `asked` then says what was passed). A grant is
    /// checked before anything else, so an ungranted call is always
    /// `not-granted`.
    pub fn embed(&mut self, texts: Result<Vec<String>, CallError>, asked: String) -> Result<Vec<Vec<f32>>, CallError> {
        let started = Instant::now();
        let result = self.embed_inner(texts);
        let cost = result.as_ref().map(|e| e.cost).map_err(Clone::clone);
        self.record(Capability::Embed, asked, &cost, started);
        result.map(|e| e.vectors)
    }

    fn embed_inner(&mut self, texts: Result<Vec<String>, CallError>) -> Result<Embeddings, CallError> {
        self.check(Capability::Embed)?;
        let texts = texts?;
        self.admit_model_call()?;
        let models = self.models()?;
        let n = texts.len();
        let embedded = self.wait(move |deadline| models.embed(texts, deadline))?;
        if embedded.vectors.len() != n {
            return Err(CallError::Unavailable(format!(
                "the embedding provider answered {} vectors for {n} texts",
                embedded.vectors.len()
            )));
        }
        self.spent += embedded.cost;
        Ok(embedded)
    }

    /// `models.judge`, as [`CallContext::embed`].
    pub fn judge(&mut self, request: Result<JudgeRequest, CallError>, asked: String) -> Result<Judgement, CallError> {
        let started = Instant::now();
        let result = self.judge_inner(request);
        let cost = result.as_ref().map(|j| j.cost).map_err(Clone::clone);
        self.record(Capability::Judge, asked, &cost, started);
        result
    }

    fn judge_inner(&mut self, request: Result<JudgeRequest, CallError>) -> Result<Judgement, CallError> {
        self.check(Capability::Judge)?;
        let request = request?;
        self.admit_model_call()?;
        let models = self.models()?;
        let judged = self.wait(move |deadline| models.judge(request, deadline))?;
        self.spent += judged.cost;
        Ok(judged)
    }

    /// `secrets.config-secret`, as [`CallContext::embed`].
    pub fn config_secret(&mut self, name: Result<&str, CallError>) -> Result<Option<String>, CallError> {
        let started = Instant::now();
        let result = self
            .check(Capability::ConfigSecret)
            .and_then(|()| Ok(self.secrets.get(name.clone()?).cloned()));
        let name = name.unwrap_or("(over the limit)");
        let cost = result.as_ref().map(|_| 0.0).map_err(Clone::clone);
        // Only a call that was served looked the name up; a refused one
        // shows its refusal beside it, as other calls' errors do.
        let asked = match &result {
            Ok(Some(_)) => format!("secret {} (found)", crate::text::quote(name)),
            Ok(None) => format!("secret {} (not mapped)", crate::text::quote(name)),
            Err(_) => format!("secret {}", crate::text::quote(name)),
        };
        self.record(Capability::ConfigSecret, asked, &cost, started);
        result
    }

    fn models(&self) -> Result<Arc<dyn Models>, CallError> {
        self.models
            .clone()
            .ok_or_else(|| CallError::Unavailable("this engine has no model providers connected to plugins".into()))
    }

    /// Runs a provider future on the capability runtime and waits for it, no
    /// longer than the plugin call's deadline.
    fn wait<T: Send + 'static>(
        &self,
        ask: impl FnOnce(tokio::time::Instant) -> BoxFuture<'static, Result<T, ProviderError>>,
    ) -> Result<T, CallError> {
        let now = Instant::now();
        let Some(left) = self.deadline.checked_duration_since(now).filter(|d| !d.is_zero()) else {
            return Err(CallError::Unavailable("the plugin's deadline has passed".into()));
        };
        let runtime = runtime().map_err(|e| CallError::Unavailable(e.clone()))?;
        let deadline = tokio::time::Instant::now() + left;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let future = ask(deadline);
        let task = runtime.spawn(async move {
            let answer = tokio::time::timeout_at(deadline, future)
                .await
                .unwrap_or(Err(ProviderError::Timeout));
            let _ = tx.send(answer);
        });
        // The runtime's own timer ends the future at the deadline; the grace
        // period only covers its scheduling.
        let answer = rx.recv_timeout(left + Duration::from_millis(50));
        task.abort();
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(ProviderError::Timeout)) | Err(_) => Err(CallError::Unavailable(format!(
                "the provider did not answer within the plugin's deadline ({} ms left when asked)",
                left.as_millis()
            ))),
            Ok(Err(ProviderError::Unavailable { message, detail })) => Err(CallError::Unavailable(format!("{message}. {detail}"))),
            Ok(Err(e @ ProviderError::BudgetSpent { .. })) => Err(CallError::BudgetExhausted(e.to_string())),
            Ok(Err(e)) => Err(CallError::Unavailable(e.to_string())),
        }
    }
}

/// The runtime capability calls run on: the caller is a plugin call, which
/// holds its thread (and may be inside a current-thread runtime that could
/// not make progress while it waits).
fn runtime() -> Result<&'static tokio::runtime::Runtime, &'static String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("attest-plugin-models")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the runtime for plugin model calls: {e}"))
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_by_name_in_text_and_json() {
        let secrets = BTreeMap::from([
            ("token".to_owned(), "s3cret".to_owned()),
            ("long".to_owned(), "s3cret-and-more".to_owned()),
            ("empty".to_owned(), String::new()),
        ]);
        assert_eq!(mask("a s3cret-and-more b s3cret", &secrets), "a [secret 'long'] b [secret 'token']");
        assert!(matches!(mask("nothing here", &secrets), std::borrow::Cow::Borrowed(_)));
        let mut v = serde_json::json!({"s3cret": ["x s3cret", {"k": "s3cret"}], "n": 1});
        mask_json(&mut v, &secrets);
        assert_eq!(
            v,
            serde_json::json!({"[secret 'token']": ["x [secret 'token']", {"k": "[secret 'token']"}], "n": 1})
        );
    }

    struct Fixed {
        cost: f64,
        delay: Duration,
    }

    impl Models for Fixed {
        fn embed(&self, texts: Vec<String>, _deadline: tokio::time::Instant) -> BoxFuture<'static, Result<Embeddings, ProviderError>> {
            let (cost, delay) = (self.cost, self.delay);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(Embeddings {
                    vectors: texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect(),
                    cost,
                })
            })
        }

        fn judge(&self, request: JudgeRequest, _deadline: tokio::time::Instant) -> BoxFuture<'static, Result<Judgement, ProviderError>> {
            let cost = self.cost;
            Box::pin(async move {
                Ok(Judgement {
                    score: if request.content.contains("good") { 0.9 } else { 0.1 },
                    reasoning: "fixed".into(),
                    cost,
                    cached: false,
                })
            })
        }
    }

    fn context(usable: &[Capability], budget_left: Option<f64>, models: Fixed) -> CallContext {
        CallContext {
            plugin_id: Arc::from("p"),
            usable: usable.to_vec(),
            requested: Capability::ALL.to_vec(),
            secrets: Arc::new(BTreeMap::from([("token".to_owned(), "s3cret".to_owned())])),
            models: Some(Arc::new(models)),
            deadline: Instant::now() + Duration::from_secs(5),
            budget_left,
            spent: 0.0,
            model_calls: 0,
            budget_refusal: None,
            records: Vec::new(),
            unrecorded: 0,
        }
    }

    fn free() -> Fixed {
        Fixed {
            cost: 0.0,
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn ungranted_calls_name_the_capability_and_the_key() {
        let mut cx = context(&[], None, free());
        let err = cx
            .embed(Err(CallError::OverLimit("too many".into())), "9999 texts".into())
            .unwrap_err();
        let CallError::NotGranted { capability, message } = err else {
            panic!("{err:?}")
        };
        assert_eq!(capability, Capability::Embed);
        assert!(
            message.contains("grants = [\"embed\"]") && message.contains(GRANTS_KEY),
            "{message}"
        );
        assert!(matches!(cx.config_secret(Ok("token")), Err(CallError::NotGranted { .. })));
        assert_eq!(cx.records.len(), 2);
        assert_eq!(cx.records[0].outcome, "not-granted");
    }

    #[test]
    fn granted_calls_are_served_and_costed() {
        let mut cx = context(
            &Capability::ALL,
            None,
            Fixed {
                cost: 0.01,
                delay: Duration::ZERO,
            },
        );
        assert_eq!(
            cx.embed(Ok(vec!["ab".into(), "c".into()]), "2 texts".into()).unwrap(),
            vec![vec![2.0, 1.0], vec![1.0, 1.0]]
        );
        assert_eq!(cx.judge(Ok(request("good")), String::new()).unwrap().score, 0.9);
        assert_eq!(cx.config_secret(Ok("token")).unwrap().as_deref(), Some("s3cret"));
        assert_eq!(cx.config_secret(Ok("other")).unwrap(), None);
        let over = cx.embed(Err(CallError::OverLimit("too many".into())), "9999 texts".into());
        assert!(matches!(over, Err(CallError::OverLimit(_))), "granted: the limit speaks");
        assert_eq!(cx.records.last().unwrap().outcome, "over-limit");
        assert!((cx.spent - 0.02).abs() < 1e-12);
        assert_eq!(cx.records.iter().map(|r| r.outcome.as_str()).take(4).collect::<Vec<_>>(), ["ok"; 4]);
        assert!(!format!("{:?}", cx.records).contains("s3cret"), "secret values are never recorded");
    }

    fn request(content: &str) -> JudgeRequest {
        JudgeRequest {
            rubric: "r".into(),
            content: content.into(),
            context: None,
            examples: vec![],
        }
    }

    #[test]
    fn model_calls_stop_at_the_budget_and_at_the_call_limit() {
        let mut cx = context(
            &Capability::ALL,
            Some(0.015),
            Fixed {
                cost: 0.01,
                delay: Duration::ZERO,
            },
        );
        assert!(cx.judge(Ok(request("good")), String::new()).is_ok());
        assert!(
            cx.judge(Ok(request("good")), String::new()).is_ok(),
            "0.01 spent of 0.015: admitted"
        );
        assert!(matches!(
            cx.judge(Ok(request("good")), String::new()),
            Err(CallError::BudgetExhausted(_))
        ));
        assert!(cx.budget_refusal.is_some());

        let mut cx = context(&Capability::ALL, None, free());
        for _ in 0..MAX_MODEL_CALLS {
            cx.embed(Ok(vec!["x".into()]), String::new()).unwrap();
        }
        assert!(matches!(
            cx.embed(Ok(vec!["x".into()]), String::new()),
            Err(CallError::OverLimit(_))
        ));
    }

    #[test]
    fn a_slow_provider_is_cut_at_the_plugin_deadline() {
        let mut cx = context(
            &Capability::ALL,
            None,
            Fixed {
                cost: 0.0,
                delay: Duration::from_secs(30),
            },
        );
        cx.deadline = Instant::now() + Duration::from_millis(100);
        let t0 = Instant::now();
        let err = cx.embed(Ok(vec!["x".into()]), String::new()).unwrap_err();
        assert!(matches!(err, CallError::Unavailable(ref m) if m.contains("deadline")), "{err:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
