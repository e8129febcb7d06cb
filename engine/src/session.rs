//! The engine's shared state: session lifecycle, capability negotiation and
//! the counters `shutdown` reports.
//!
//! States: `Uninitialized` → `initialize` → `Ready` → `shutdown` →
//! `Draining` → `Done`. Every method but `initialize` needs `Ready`.

use crate::batch::BatchCaches;
use crate::config::Config;
use crate::history::History;
use crate::params::{Members, Wording};
use crate::plugins::PluginHost;
use crate::protocol::{Method, RpcError};
use crate::providers::Providers;
use crate::sinks::Sinks;
use crate::trace::Limits;
use crate::ENGINE_VERSION;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The protocol version this engine speaks; it also accepts `CURRENT - 1`.
pub const PROTOCOL_VERSION: i64 = 1;
pub const OLDEST_PROTOCOL_VERSION: i64 = PROTOCOL_VERSION - 1;

/// What this build really supports. `soft_failures`: `soft: true` yields
/// `soft_fail` on every layer-1–4 check that allows it.
/// `multi_agent`/`layer_7`/`trace_tree`: `trace_tree` assertions over
/// sub-traces (Attest protocol v1 names the first, its layer table the second, and
/// other engines advertise the third; the SDK may ask for any of them).
/// `plugins`/`layer_8`: WebAssembly assertion plugins run inside the engine,
/// and `submit_plugin_result` is validated and recorded.
pub const CAPABILITIES: &[&str] = &[
    "layers_1_4",
    "soft_failures",
    "multi_agent",
    "layer_7",
    "trace_tree",
    "plugins",
    "layer_8",
];
/// Advertised when the result history is open: `query_drift` and
/// `threshold: "dynamic"` use it.
pub const HISTORY_CAPABILITY: &str = "continuous_eval";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Uninitialized = 0,
    Ready = 1,
    Draining = 2,
    Done = 3,
}

pub struct Engine {
    pub config: Config,
    pub limits: Limits,
    state: AtomicU8,
    sessions: AtomicU64,
    /// Requests admitted and not yet answered (`shutdown` waits for the others).
    inflight: Arc<AtomicUsize>,
    /// Admission order of input lines.
    admitted: AtomicU64,
    /// Admission number of the `shutdown` request; later requests are refused.
    shutdown_seq: AtomicU64,
    /// Whether that request's drain has begun (a JSON-RPC batch can hold
    /// two `shutdown`s under one admission number).
    shutdown_began: std::sync::atomic::AtomicBool,
    pub caches: BatchCaches,
    /// WebAssembly assertion plugins (layer 8).
    pub plugins: PluginHost,
    /// Where evaluations are recorded: the `request_id` cache, history,
    /// the session log, the evaluated count and spending.
    pub sinks: Sinks,
    /// Cancelled when `shutdown` begins: the engine stops reading input.
    pub draining: CancellationToken,
    /// Requests read and not yet answered, for a drain that gives up on them.
    pub unanswered: crate::unanswered::Unanswered,
    /// Embedding and judge providers (layers 5 and 6).
    pub providers: Arc<Providers>,
}

#[derive(Debug, Serialize)]
pub struct InitializeResult {
    pub engine_version: &'static str,
    pub protocol_version: i64,
    pub capabilities: Vec<&'static str>,
    pub missing: Vec<String>,
    pub compatible: bool,
    pub encoding: &'static str,
    pub max_concurrent_requests: usize,
    pub max_trace_size_bytes: usize,
    pub max_steps_per_trace: usize,
}

#[derive(Debug, Serialize)]
pub struct ShutdownResult {
    pub sessions_completed: u64,
    pub assertions_evaluated: u64,
}

impl Engine {
    /// An engine with no plugins loaded.
    pub fn new(config: Config) -> Engine {
        Engine::with_plugins(config, PluginHost::default())
    }

    pub fn with_plugins(config: Config, plugins: PluginHost) -> Engine {
        // The schema cache is the process's: the first engine's setting holds.
        if !crate::layers::schema::set_cache_bytes(config.schema_cache_bytes) {
            tracing::debug!("the compiled-schema cache was made already; schema_cache_mib applies to the next process");
        }
        let limits = Limits {
            strict_step_types: config.strict_step_types,
            ..Limits::default()
        };
        let history = config.history.as_ref().and_then(|h| match History::open(h) {
            Ok(history) => {
                tracing::info!(store = %h.location, "result history open");
                Some(history)
            }
            Err(e) => {
                tracing::error!(store = %h.location, error = %format!("{e:#}"), "cannot open the result history; query_drift and dynamic thresholds are unavailable");
                None
            }
        });
        let webhook = config
            .drift_webhook_url
            .as_deref()
            .and_then(|url| match crate::alerts::Webhook::new(url) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!(error = %e, "drift webhook disabled");
                    None
                }
            });
        let providers = Arc::new(Providers::new(&config.providers).with_budget(config.budget_usd));
        plugins.connect_models(Arc::new(crate::plugin_models::ProviderModels(providers.clone())));
        Engine {
            providers,
            sinks: Sinks::new(&config, history, webhook),
            caches: BatchCaches::new(&config),
            plugins,
            limits,
            config,
            state: AtomicU8::new(State::Uninitialized as u8),
            sessions: AtomicU64::new(0),
            inflight: Arc::new(AtomicUsize::new(0)),
            admitted: AtomicU64::new(0),
            shutdown_seq: AtomicU64::new(u64::MAX),
            shutdown_began: std::sync::atomic::AtomicBool::new(false),
            draining: CancellationToken::new(),
            unanswered: Default::default(),
        }
    }

    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            0 => State::Uninitialized,
            1 => State::Ready,
            2 => State::Draining,
            _ => State::Done,
        }
    }

    /// Adds what a paid call outside a batch cost to the session's spending.
    pub fn add_cost(&self, usd: f64) {
        self.sinks.add_cost(usd);
    }

    /// What paid assertions have cost this session, in USD.
    pub fn cost_spent(&self) -> f64 {
        self.sinks.cost_spent()
    }

    /// Admits one input line: it gets the next sequence number and counts as
    /// in flight until the admission drops. Whether a request came before or
    /// after `shutdown` is decided by this order, not by when its task runs.
    pub fn admit(&self) -> Admission {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        Admission {
            seq: self.admitted.fetch_add(1, Ordering::AcqRel),
            inflight: self.inflight.clone(),
        }
    }

    /// Session errors for a method (admitted as number `seq`) called in the wrong state.
    pub fn require_ready(&self, method: Method, seq: u64) -> Result<(), RpcError> {
        match self.state() {
            State::Ready => Ok(()),
            State::Draining | State::Done if seq < self.shutdown_seq.load(Ordering::Acquire) => Ok(()),
            State::Uninitialized => Err(RpcError::session(
                format!("{} called before initialize", method.name()),
                format!(
                    "Call initialize first to establish a session before sending {} requests.",
                    method.name()
                ),
            )),
            State::Draining | State::Done => Err(RpcError::session(
                format!("{} called after shutdown", method.name()),
                "The engine is shutting down and accepts no new work. Start a new engine process.",
            )),
        }
    }

    /// End of the session (shutdown, end of input, signal, or the end of an
    /// `eval` run): writes queued history and the configured reports.
    /// Returns whether every report was written (problems are logged).
    pub fn finish(&self) -> bool {
        if let Some(h) = &self.sinks.history {
            h.flush(std::time::Instant::now() + self.config.drain_timeout);
            // Rows still queued when the flush gave up are lost with the process.
            let lost = h.dropped_rows() + h.queued_rows() as u64;
            if lost > 0 {
                tracing::warn!(
                    dropped_rows = h.dropped_rows(),
                    still_queued = h.queued_rows(),
                    "about {lost} results were not recorded in history"
                );
            }
        }
        if !self.config.reports.is_empty() {
            let now = time::OffsetDateTime::now_utc()
                .replace_nanosecond(0)
                .ok()
                .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
                .unwrap_or_default();
            let mut report = crate::report::Report::build(
                &self.sinks.session_log.batches(),
                &self.sinks.plugin_results.all(),
                self.config.budget_usd,
                now,
            );
            report.add_omitted(&self.sinks.session_log.omitted());
            (report.errors, report.error_count) = self.sinks.session_log.errors();
            return crate::report::write_all(&self.config.reports, &report);
        }
        true
    }

    /// What this engine process supports, as `initialize` reports it.
    pub fn capabilities(&self) -> Vec<&'static str> {
        let mut caps = CAPABILITIES.to_vec();
        if self.sinks.history.is_some() {
            caps.push(HISTORY_CAPABILITY);
        }
        // Paid layers are advertised only with a provider to answer them.
        let (embedding, judge) = (self.providers.has_embedder(), self.providers.has_judge());
        if embedding {
            caps.push("embedding");
        }
        if judge {
            caps.push("llm_judge");
            // `generate_user_message` (simulated users, with injected
            // faults) is written by the judge provider.
            caps.push("simulation");
        }
        if embedding && judge {
            caps.push("layers_5_6");
        }
        caps
    }

    pub fn initialize(&self, params: Option<&RawValue>) -> Result<InitializeResult, RpcError> {
        // A second initialize is a session error whatever its params hold:
        // the SDK's problem is the call, not what came with it.
        if self.state() != State::Uninitialized {
            return Err(already_initialized());
        }
        let p = InitializeParams::parse(params)?;
        if p.protocol_version > PROTOCOL_VERSION || p.protocol_version < OLDEST_PROTOCOL_VERSION {
            let newer = p.protocol_version > PROTOCOL_VERSION;
            return Err(RpcError::session(
                format!(
                    "protocol version {} {}; engine supports versions {OLDEST_PROTOCOL_VERSION} and {PROTOCOL_VERSION}",
                    p.protocol_version,
                    if newer { "not supported" } else { "is too old" }
                ),
                if newer {
                    format!("Upgrade the engine binary or downgrade the SDK protocol_version to {PROTOCOL_VERSION}.")
                } else {
                    format!("Upgrade the SDK to one that speaks protocol_version {PROTOCOL_VERSION}.")
                },
            )
            .with_field("params.protocol_version"));
        }
        if self
            .state
            .compare_exchange(State::Uninitialized as u8, State::Ready as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another initialize won the race since the check above.
            return Err(already_initialized());
        }
        self.sessions.fetch_add(1, Ordering::Relaxed);
        // Echoed back: each name and the list are bounded, with a marker
        // entry for what was left out.
        const MAX_LISTED: usize = 64;
        let capabilities = self.capabilities();
        let unknown: Vec<&String> = p
            .required_capabilities
            .iter()
            .filter(|c| !capabilities.contains(&c.as_str()))
            .collect();
        let mut missing: Vec<String> = unknown.iter().take(MAX_LISTED).map(|c| crate::text::clip(c, 64)).collect();
        if unknown.len() > MAX_LISTED {
            missing.push(format!("… and {} more", unknown.len() - MAX_LISTED));
        }
        tracing::info!(sdk_name = %p.sdk_name, sdk_version = %p.sdk_version, protocol_version = p.protocol_version, missing = missing.len(), "session initialized");
        self.sinks.label_run(format!(
            "{} {}",
            crate::text::clip(&p.sdk_name, 64),
            crate::text::clip(&p.sdk_version, 32)
        ));
        Ok(InitializeResult {
            engine_version: ENGINE_VERSION,
            protocol_version: PROTOCOL_VERSION,
            capabilities: self.capabilities(),
            compatible: unknown.is_empty(),
            missing,
            encoding: "json",
            max_concurrent_requests: self.config.max_concurrent_requests,
            max_trace_size_bytes: self.limits.max_trace_bytes,
            max_steps_per_trace: self.limits.max_steps,
        })
    }

    /// Marks the request admitted as number `seq` as the session's
    /// `shutdown`, when the server reads it rather than when its task runs:
    /// requests admitted after it are refused with `3003` however their
    /// tasks are scheduled, and those admitted before it still run. Does
    /// nothing before `initialize` (that `shutdown` is refused).
    pub fn begin_shutdown(&self, seq: u64) {
        if self.state() == State::Uninitialized {
            return;
        }
        // The cut-off before the state, so requests admitted before this
        // one are never refused.
        self.shutdown_seq.fetch_min(seq, Ordering::AcqRel);
        let _ = self
            .state
            .compare_exchange(State::Ready as u8, State::Draining as u8, Ordering::AcqRel, Ordering::Acquire);
    }

    /// `shutdown`: stop accepting work, wait for the other in-flight
    /// requests (at most the drain timeout), then report.
    pub async fn shutdown(&self, seq: u64) -> Result<ShutdownResult, RpcError> {
        if self.state() == State::Uninitialized {
            return self
                .require_ready(Method::Shutdown, seq)
                .map(|_| unreachable!("uninitialized is never ready"));
        }
        // Already marked when the server read it; not when it came in a
        // JSON-RPC batch.
        self.begin_shutdown(seq);
        if self.shutdown_seq.load(Ordering::Acquire) != seq || self.shutdown_began.swap(true, Ordering::AcqRel) {
            return Err(RpcError::session(
                "shutdown called after shutdown",
                "The engine is already shutting down; send shutdown once.",
            ));
        }
        self.draining.cancel();
        let drained = self.wait_for_others(self.config.drain_timeout).await;
        if !drained {
            tracing::warn!(
                inflight = self.inflight.load(Ordering::Acquire),
                "drain timeout reached; shutting down anyway"
            );
        }
        self.state.store(State::Done as u8, Ordering::Release);
        Ok(self.stats())
    }

    pub fn stats(&self) -> ShutdownResult {
        ShutdownResult {
            sessions_completed: self.sessions.load(Ordering::Relaxed),
            assertions_evaluated: self.sinks.evaluated(),
        }
    }

    /// Waits until the calling request is the only one in flight.
    async fn wait_for_others(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.inflight.load(Ordering::Acquire) > 1 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

fn already_initialized() -> RpcError {
    RpcError::session(
        "initialize called on already-initialized session",
        "Send initialize once per engine process. To start a new session, shut this engine down and spawn a new one.",
    )
}

/// One admitted input line (see [`Engine::admit`]).
pub struct Admission {
    pub seq: u64,
    inflight: Arc<AtomicUsize>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct InitializeParams {
    sdk_name: String,
    sdk_version: String,
    protocol_version: i64,
    required_capabilities: Vec<String>,
}

impl InitializeParams {
    fn parse(params: Option<&RawValue>) -> Result<InitializeParams, RpcError> {
        let example = "Send {\"sdk_name\":\"attest-python\",\"sdk_version\":\"0.9.0\",\"protocol_version\":1,\"required_capabilities\":[\"layers_1_4\"],\"preferred_encoding\":\"json\"}.";
        let map: Map<String, Value> = crate::params::object(
            Method::Initialize,
            params,
            &[
                "sdk_name",
                "sdk_version",
                "protocol_version",
                "required_capabilities",
                "preferred_encoding",
            ],
        )?;
        let p = Members::new(Method::Initialize, &map, example, Wording::ParamsField);
        let sdk_name = p.required("sdk_name", Members::string)?.to_owned();
        let sdk_version = p.required("sdk_version", Members::string)?.to_owned();
        let protocol_version = match p.get("protocol_version") {
            None => return Err(p.missing("protocol_version")),
            Some(v) => v
                .as_i64()
                .filter(|_| v.is_i64() || v.is_u64())
                .ok_or_else(|| p.must_be("protocol_version", "an integer"))?,
        };
        let required_capabilities = match p.get("required_capabilities") {
            None => return Err(p.missing("required_capabilities")),
            Some(Value::Array(items)) => items
                .iter()
                .map(|c| {
                    c.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| p.must_be("required_capabilities", "a list of strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(p.must_be("required_capabilities", "a list of strings")),
        };
        p.string("preferred_encoding")
            .map_err(|_| p.must_be("preferred_encoding", "a string (\"json\")"))?;
        Ok(InitializeParams {
            sdk_name,
            sdk_version,
            protocol_version,
            required_capabilities,
        })
    }
}

/// The engine compiles plugin and paid assertions for the core with its
/// plugin host and providers.
impl attest_core::backends::Backends for Engine {
    fn compile_plugin(&self, spec: &crate::layers::Spec<'_>) -> Result<attest_core::backends::PluginCheck, crate::layers::SpecError> {
        crate::plugins::check::compile(spec, &self.plugins)
    }

    fn compile_paid(
        &self,
        kind: crate::layers::AssertionType,
        spec: &crate::layers::Spec<'_>,
    ) -> Result<Box<dyn attest_core::backends::PaidCheck>, crate::layers::SpecError> {
        crate::providers::compile_paid(kind, spec, &self.providers)
    }
}
