//! The sandbox plugins run in: a wasmtime engine, one linker per supported
//! contract version ([`ApiVersion`], each with a bindings module such as
//! [`super::since_v0_1_0`]), and a fresh, limited store for every call.
//!
//! Deny by default:
//! - no filesystem, network, environment, arguments or stdin (WASI is linked
//!   only so that components from other toolchains can instantiate; its
//!   context grants nothing). stdout is discarded; the end of stderr is
//!   kept for the call, only to explain a trap ([`StderrTail`]);
//! - CPU: an epoch deadline per call, and for plugins configured with a
//!   `fuel` budget, fuel metering on top (a deterministic instruction count,
//!   costing the guest 20% or more of its speed, so it is opt-in; such plugins run in a
//!   second engine that compiles the metering in);
//! - memory: a cap per instance (growth beyond it traps), bounded tables and
//!   instances, and a bounded wasm stack. Accesses are kept inside the
//!   instance's memory by guard pages (a 4 GiB reservation per memory, so no
//!   32-bit address can leave it), not by checks in the compiled code.
//!
//! Every call instantiates afresh from a pre-instantiated component on the
//! pooling allocator, so no state survives from one call to the next and a
//! trapped instance is simply dropped. The store around those instances may
//! serve a few consecutive calls of one plugin on one thread ([`KeptStore`]):
//! making and dropping a store, and registering the component's modules in
//! it, is then paid once for several calls.

use super::PluginLimits;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext};
use wasmtime::component::{Component, ComponentExportIndex, ComponentType, Lift, Linker, Resource, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, StoreContextMut, StoreLimits, StoreLimitsBuilder, Trap, ValRaw};
use wasmtime_wasi::p2::{DynPollable, Pollable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::stderr_tail::StderrTail;

use super::capabilities::{CallContext, CallError, Capability};

/// The contract versions this engine serves, each with its own bindings
/// module and linker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    V0_1_0,
    V0_2_0,
}

impl ApiVersion {
    /// Every version, newest first.
    pub const ALL: [ApiVersion; 2] = [ApiVersion::V0_2_0, ApiVersion::V0_1_0];

    /// The version its module was frozen at (`wit/since_vX.Y.Z/`).
    pub fn min_version(self) -> (u64, u64, u64) {
        match self {
            ApiVersion::V0_1_0 => super::since_v0_1_0::MIN_VERSION,
            ApiVersion::V0_2_0 => super::since_v0_2_0::MIN_VERSION,
        }
    }

    fn add_to_linker(self, linker: &mut Linker<State>) -> anyhow::Result<()> {
        match self {
            ApiVersion::V0_1_0 => super::since_v0_1_0::add_to_linker(linker),
            ApiVersion::V0_2_0 => super::since_v0_2_0::add_to_linker(linker),
        }
    }

    fn check_exports(self, pre: &wasmtime::component::InstancePre<State>) -> anyhow::Result<()> {
        match self {
            ApiVersion::V0_1_0 => super::since_v0_1_0::check_exports(pre),
            ApiVersion::V0_2_0 => super::since_v0_2_0::check_exports(pre),
        }
    }

    /// The version that serves a plugin built against `version`: the same
    /// major (for 0.x, the same minor), and no newer than the version its
    /// module was frozen at.
    pub fn serving(version: &str) -> Option<ApiVersion> {
        let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
        let want = (parts.next()??, parts.next()??, parts.next()??);
        if parts.next().is_some() {
            return None;
        }
        ApiVersion::ALL.into_iter().find(|v| {
            let have = v.min_version();
            let same_line = if have.0 == 0 {
                want.0 == 0 && want.1 == have.1
            } else {
                want.0 == have.0
            };
            same_line && want <= have
        })
    }
}

/// The contract versions this engine serves, newest first, as text.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["0.2.0", "0.1.0"];

/// What a plugin concluded about one assertion (every contract version has
/// the same three, by the same names).
#[derive(ComponentType, Lift, Debug, Clone, Copy, PartialEq, Eq)]
#[component(enum)]
#[repr(u8)]
pub enum Status {
    #[component(name = "pass")]
    Pass,
    #[component(name = "fail")]
    Fail,
    #[component(name = "hard-fail")]
    HardFail,
}

/// A plugin's verdict, bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status: Status,
    pub score: f64,
    pub explanation: String,
    pub details: Option<String>,
}

/// Why a plugin could not reach a verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginError {
    InvalidConfig(String),
    UnsupportedTrace(String),
    Internal(String),
}

/// What `describe()` answered, bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub id: String,
    pub version: String,
    pub description: String,
    pub config_schema: String,
    /// Requested (0.2.0 and later; none before).
    pub capabilities: Vec<Capability>,
}

impl Info {
    /// The fields every version's `plugin-info` has, refused when the
    /// schema is over its limit and clipped otherwise.
    pub(super) fn bounded(
        id: BoundedText<MAX_INFO_BYTES>,
        version: BoundedText<MAX_INFO_BYTES>,
        description: BoundedText<MAX_INFO_BYTES>,
        config_schema: BoundedText<MAX_SCHEMA_BYTES>,
    ) -> Result<Info, Fault> {
        if config_schema.len > MAX_SCHEMA_BYTES {
            return Err(Fault::TooLarge(format!(
                "declares a config schema of {} bytes; the limit is {MAX_SCHEMA_BYTES} bytes ({} KiB): describe the config more compactly",
                config_schema.len,
                MAX_SCHEMA_BYTES / 1024
            )));
        }
        Ok(Info {
            config_schema: config_schema.text,
            id: crate::text::clip(&id.text, MAX_INFO_CHARS),
            version: crate::text::clip(&version.text, MAX_INFO_CHARS),
            description: crate::text::clip(&description.text, MAX_INFO_CHARS),
            capabilities: Vec::new(),
        })
    }
}

/// How often the epoch advances; timeouts are rounded up to it.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Linear memory kept mapped between calls in a pooled slot (docs/benchmarks.md).
const KEEP_RESIDENT_BYTES: usize = 1 << 20;
/// Address space each pooled memory slot reserves: a 32-bit guest address
/// can then never leave the slot, so accesses need no explicit checks.
const RESERVATION_BYTES: u64 = 4 << 30;
/// Guard region after each slot's reservation.
const GUARD_BYTES: u64 = 32 << 20;
/// Linear memories in the pool (every instance alive at once, kept stores
/// included). With the above, about 4 TiB of address space per sandbox.
const POOL_MEMORIES: u32 = 1024;
/// Largest memory any plugin may be configured for (the pool's `max_memory_size`).
pub const MAX_MEMORY_BYTES: usize = 1 << 30;

/// Longest explanation or error message kept from a verdict, in characters;
/// the batch clips further to `max_explanation_chars`.
pub const MAX_VERDICT_TEXT_CHARS: usize = 16 * 1024;
/// Largest `details` JSON kept from a verdict; larger ones are replaced by a
/// note giving their size.
pub const MAX_DETAILS_BYTES: usize = 4096;
/// Largest config schema a plugin may declare.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Longest id, version or description kept from `describe()`, in characters.
pub const MAX_INFO_CHARS: usize = 1000;
/// Log output one call may write: lines, and bytes over all its lines.
pub const LOG_LINES_PER_CALL: u32 = 100;
pub const LOG_BYTES_PER_CALL: usize = 64 * 1024;
/// Randomness WASI plugins read: a fixed cycle, so verdicts are repeatable.
const FIXED_RANDOM: [u8; 32] = *b"attest-plugins-fixed-randomness!";

/// Per-store state: the plugin's id (for its logs), its limits, its log
/// budget, and a WASI context that grants nothing.
pub struct State {
    plugin_id: Arc<str>,
    limiter: Limiter,
    log: LogBudget,
    /// Built on the first WASI call: most plugins never make one, and
    /// building it costs on every call.
    wasi: Option<WasiCtx>,
    /// The end of what the call wrote to stderr (WASI plugins only), to
    /// explain a trap.
    stderr: Option<StderrTail>,
    /// The call's last error-level log line (a Rust plugin's panic message),
    /// kept even past the log budget, to explain a trap.
    last_error: Option<String>,
    table: ResourceTable,
    /// Origin of the monotonic clock WASI plugins read.
    started: std::time::Instant,
    /// What the call may use beyond logging; `None` for plugins that
    /// request no capability (every call of theirs is refused).
    capabilities: Option<Box<CallContext>>,
    /// What the store's earlier calls left alive, counted against the
    /// process-wide totals for as long as the store lives.
    held: Held,
}

/// What is left of a call's log budget, and what was dropped past it.
struct LogBudget {
    lines: u32,
    bytes: usize,
    dropped: u64,
}

impl LogBudget {
    fn new() -> LogBudget {
        LogBudget {
            lines: LOG_LINES_PER_CALL,
            bytes: LOG_BYTES_PER_CALL,
            dropped: 0,
        }
    }
}

impl State {
    /// The state of a store for one call.
    fn new(plugin_id: &Arc<str>, limits: &PluginLimits) -> State {
        State {
            plugin_id: plugin_id.clone(),
            limiter: Limiter {
                inner: store_limits(limits),
                refused: false,
                held_bytes: 0,
            },
            log: LogBudget::new(),
            wasi: None,
            stderr: None,
            last_error: None,
            table: ResourceTable::new(),
            started: std::time::Instant::now(),
            capabilities: None,
            held: Held::default(),
        }
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let stderr = &mut self.stderr;
        let ctx = self.wasi.get_or_insert_with(|| {
            let mut wasi = WasiCtx::builder();
            // No stdin, no files, no network; stdout is discarded, and the
            // end of stderr is kept to explain a trap.
            wasi.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
            wasi.stderr(stderr.get_or_insert_with(StderrTail::default).clone());
            // Verdicts must not depend on when or where a plugin runs: the
            // wall clock stands at the Unix epoch and randomness is a fixed
            // sequence. The monotonic clock stays real: it only measures.
            wasi.wall_clock(EpochClock);
            wasi.monotonic_clock(CallClock(self.started));
            wasi.secure_random(wasmtime_wasi::Deterministic::new(FIXED_RANDOM.to_vec()));
            wasi.insecure_random(wasmtime_wasi::Deterministic::new(FIXED_RANDOM.to_vec()));
            wasi.insecure_random_seed(0);
            wasi.build()
        });
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

/// A wall clock that always reads 1970-01-01T00:00:00Z.
struct EpochClock;

impl wasmtime_wasi::HostWallClock for EpochClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The monotonic clock: nanoseconds since the store was made.
struct CallClock(std::time::Instant);

impl wasmtime_wasi::HostMonotonicClock for CallClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Log levels of `host.log`, as every contract version has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// Links `host.log` of the contract version whose interface is `interface`
/// over its bindings' own: the message is copied out of the plugin's memory
/// only up to [`LOG_LINE_BYTES`] bytes. `L` is that version's log level.
pub(super) fn link_log<L>(linker: &mut wasmtime::component::Linker<State>, interface: &str, level: fn(L) -> LogLevel) -> anyhow::Result<()>
where
    L: wasmtime::component::ComponentType + wasmtime::component::Lift + Send + Sync + 'static,
{
    linker.allow_shadowing(true);
    let linked = linker.instance(interface).and_then(|mut host| {
        host.func_wrap(
            "log",
            move |mut cx: wasmtime::StoreContextMut<'_, State>, (l, message): (L, BoundedText<LOG_LINE_BYTES>)| -> wasmtime::Result<()> {
                cx.data_mut().write_log(level(l), &message.text);
                Ok(())
            },
        )
    });
    linker.allow_shadowing(false);
    linked?;
    Ok(())
}

/// Longest log line kept, in characters.
pub const LOG_LINE_CHARS: usize = 2000;
/// Most bytes of a log line copied out of a plugin's memory: the
/// [`LOG_LINE_CHARS`] characters kept, at four bytes each at most. A longer
/// line is cut while it is copied, so a plugin logging lines of megabytes
/// costs the engine no more than this per line.
pub const LOG_LINE_BYTES: usize = LOG_LINE_CHARS * 4;

impl State {
    /// Serves a capability call, or refuses it when the plugin requested no
    /// capability at all.
    pub fn capability_call<T>(
        &mut self,
        capability: Capability,
        call: impl FnOnce(&mut CallContext) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        match self.capabilities.as_deref_mut() {
            Some(cx) => call(cx),
            None => Err(super::capabilities::not_granted(&self.plugin_id, capability, false)),
        }
    }

    /// `host.log`: the line goes to the engine's log, attributed to the
    /// plugin, while the call's log budget lasts.
    pub fn write_log(&mut self, level: LogLevel, message: &str) {
        let message = crate::text::clip(message, LOG_LINE_CHARS);
        // Logs name a secret, never show it.
        let message = match self.capabilities.as_deref() {
            Some(cx) => masked(message, &cx.secrets),
            None => message,
        };
        if level == LogLevel::Error {
            self.last_error = Some(crate::text::clip(&message, LAST_WORDS_CHARS));
        }
        let budget = &mut self.log;
        if budget.lines == 0 || budget.bytes < message.len() {
            budget.lines = 0;
            budget.dropped += 1;
            return;
        }
        budget.lines -= 1;
        budget.bytes -= message.len();
        let plugin = &*self.plugin_id;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

/// A call the sandbox refuses to serve; it traps the call and is named in
/// the assertion's explanation.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A pollable that is ready at once: a zero-length timer.
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// WASI timers, served without waiting: a zero-length timer (a readiness
/// check) is ready at once; a plugin that asks to wait is stopped, because a
/// wait in the host would not be cut short by the call's deadline.
fn timer(table: &mut ResourceTable, nanos: u64, call: &str) -> wasmtime::Result<Resource<DynPollable>> {
    if nanos > 0 {
        return Err(wasmtime::Error::new(Refused(format!(
            "called {call} to wait {} ms; plugins may not wait (a call has a deadline, not a clock to sleep on)",
            nanos / 1_000_000
        ))));
    }
    let ready = table.push(Ready)?;
    wasmtime_wasi::p2::subscribe(table, ready)
}

/// The monotonic-clock interface the WASI linker provides, whose timers
/// [`timer`] replaces.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

fn link_timers(linker: &mut Linker<State>) -> anyhow::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut cx: StoreContextMut<'_, State>, (nanos,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Ok((timer(
                &mut cx.data_mut().table,
                nanos,
                "wasi:clocks/monotonic-clock.subscribe-duration",
            )?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut cx: StoreContextMut<'_, State>, (when,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            let state = cx.data_mut();
            let now = wasmtime_wasi::HostMonotonicClock::now(&CallClock(state.started));
            let nanos = when.saturating_sub(now);
            Ok((timer(&mut state.table, nanos, "wasi:clocks/monotonic-clock.subscribe-instant")?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// [`StoreLimits`] that remembers whether it refused to grow memory, so an
/// out-of-memory trap can be named as such.
struct Limiter {
    inner: StoreLimits,
    refused: bool,
    /// Linear memory the store's instances hold, over all its calls.
    held_bytes: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let ok = self.inner.memory_growing(current, desired, maximum);
        match ok {
            Ok(true) => self.held_bytes = self.held_bytes.saturating_add(desired.saturating_sub(current)),
            _ => self.refused = true,
        }
        ok
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    // Forwarded so that `trap_on_grow_failure` also covers growth the
    // limiter allowed but wasmtime could not make (past a declared maximum).
    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }
    fn tables(&self) -> usize {
        self.inner.tables()
    }
    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// A wasmtime engine (with its epoch ticker) and one linker per contract
/// version.
pub struct Sandbox {
    engine: Engine,
    linkers: Vec<(ApiVersion, Linker<State>)>,
}

/// A component linked once, ready to be instantiated for each call.
pub struct Prepared {
    /// Unique in the process: what a [`KeptStore`] was made for.
    id: u64,
    api: ApiVersion,
    pre: wasmtime::component::InstancePre<State>,
    describe: ComponentExportIndex,
    evaluate: ComponentExportIndex,
    /// Whether it imports WASI; such calls run on a thread of their own
    /// (see [`outside_async_runtime`]).
    uses_wasi: bool,
    /// Whether it imports the host's `log`, which the Rust SDK's panic hook
    /// needs: without it a panic traps with no message anywhere.
    imports_log: bool,
    /// Whether its store may be kept between calls ([`KeptStore`]).
    keepable: bool,
}

/// What `evaluate` answered: one result per config, or a wrong count (the
/// results are then not copied at all).
pub enum Answer {
    Results(Vec<Result<Verdict, PluginError>>),
    WrongCount(usize),
}

/// Why a call produced no usable answer; each names its cause for the user.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    OutOfFuel {
        fuel: u64,
    },
    Timeout {
        after: Duration,
        /// Stopped by the request's deadline, which came before the
        /// plugin's own timeout.
        by_request: bool,
    },
    OutOfMemory {
        limit: usize,
    },
    /// A host call the sandbox does not serve (a wait on a timer).
    Refused(String),
    /// An answer larger than the engine accepts.
    TooLarge(String),
    Trap(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::OutOfFuel { fuel } => write!(f, "exceeded its CPU budget ({fuel} fuel per call)"),
            Fault::Timeout { after, by_request: false } => write!(f, "timed out after {} ms", after.as_millis()),
            Fault::Timeout { after, by_request: true } if after.is_zero() => write!(
                f,
                "was not run: the request's deadline (the engine's evaluation timeout, --eval-timeout) had passed"
            ),
            Fault::Timeout { after, by_request: true } => write!(
                f,
                "was stopped after {} ms, at the request's deadline (the engine's evaluation timeout, --eval-timeout), before its own timeout",
                after.as_millis()
            ),
            Fault::OutOfMemory { limit } => write!(f, "exceeded its memory limit ({} MiB)", limit / (1024 * 1024)),
            Fault::Refused(what) => write!(f, "was stopped: it {what}"),
            Fault::TooLarge(what) => write!(f, "{what}"),
            Fault::Trap(what) => write!(f, "trapped: {what}"),
        }
    }
}

impl Sandbox {
    /// The process-wide sandbox for plugins with (`metered`) or without a
    /// fuel budget. Fuel metering is compiled into the code, so the two kinds
    /// need separate engines; each is created on first use and shared by
    /// every plugin of its kind (compiled artefacts, pooling allocator).
    pub fn get(metered: bool) -> anyhow::Result<&'static Sandbox> {
        static PLAIN: OnceLock<Result<Sandbox, String>> = OnceLock::new();
        static METERED: OnceLock<Result<Sandbox, String>> = OnceLock::new();
        let cell = if metered { &METERED } else { &PLAIN };
        cell.get_or_init(|| Sandbox::new(metered).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("cannot start the plugin sandbox: {e}"))
    }

    fn new(metered: bool) -> anyhow::Result<Sandbox> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(metered);
        config.epoch_interruption(true);
        config.max_wasm_stack(512 * 1024);
        // Bounds checks by guard pages and signal handlers, wasmtime's
        // default, which keeps its Spectre mitigations on heap accesses. Their
        // price is an mprotect whenever a call grows memory, and another when
        // the slot is reset; in a multi-threaded process each is a TLB
        // shootdown across cores. The SDK's allocator (`attest_plugin_sdk::heap`)
        // starts with a static segment so that most calls never grow memory,
        // which makes this cheaper per call than explicit bounds checks
        // (docs/benchmarks.md, "Guard pages").
        config.signals_based_traps(true);
        config.memory_guard_size(GUARD_BYTES);
        config.memory_reservation(RESERVATION_BYTES);
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_component_instances(256);
        pool.total_core_instances(2048);
        pool.total_memories(POOL_MEMORIES);
        pool.total_tables(2048);
        pool.max_core_instances_per_component(64);
        pool.max_memories_per_component(16);
        pool.max_tables_per_component(64);
        pool.max_memory_size(MAX_MEMORY_BYTES);
        pool.table_elements(100_000);
        pool.max_component_instance_size(1 << 20);
        pool.max_core_instance_size(1 << 20);
        // Reset the first pages of a slot with memset and keep them mapped:
        // returning them with madvise costs page faults and TLB shootdowns on
        // every call, which measured as most of a small plugin's call time.
        pool.linear_memory_keep_resident(KEEP_RESIDENT_BYTES);
        pool.table_keep_resident(64 * 1024);
        // Where the kernel supports it, reset only the pages a call dirtied.
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        // For profiling plugins: `perf` then names the guest's functions
        // (docs/benchmarks.md, "Where a plugin call's time goes"); wasmtime
        // writes the map to /tmp/perf-<pid>.map.
        if std::env::var_os("ATTEST_PLUGIN_PERF_MAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(|e| {
            // The pool reserves address space, not memory; what refuses it
            // is almost always a virtual-memory limit on the process.
            anyhow::anyhow!(
                "{e:#} (the plugin pool reserves about {} GiB of address space, not memory: lift the process's virtual-memory limit, `ulimit -v`, to load plugins)",
                (u64::from(POOL_MEMORIES) * (RESERVATION_BYTES + GUARD_BYTES)) >> 30
            )
        })?;
        let mut linkers = Vec::new();
        for api in ApiVersion::ALL {
            let mut linker = Linker::new(&engine);
            api.add_to_linker(&mut linker)?;
            // WASI is linked so components from other toolchains (Python,
            // JS) instantiate; the context built per call grants no capability.
            wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
            link_timers(&mut linker)?;
            linkers.push((api, linker));
        }
        let ticker = engine.weak();
        std::thread::Builder::new().name("attest-epoch".into()).spawn(move || {
            // The epoch counts wall-clock ticks since the start, not sleeps:
            // a sleep overruns (much more on a busy machine), and deadlines
            // counted in sleeps ran late by as much (5 s answered at 8.7 s).
            let start = std::time::Instant::now();
            let mut ticks: u64 = 0;
            while let Some(engine) = ticker.upgrade() {
                let due = (start.elapsed().as_nanos() / EPOCH_TICK.as_nanos()) as u64;
                while ticks < due {
                    engine.increment_epoch();
                    ticks += 1;
                }
                drop(engine);
                let next = start + Duration::from_nanos((EPOCH_TICK.as_nanos() as u64).saturating_mul(ticks + 1));
                std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
            }
        })?;
        Ok(Sandbox { engine, linkers })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The WIT versions a component was built against, from its import
    /// names (`attest:plugin/host@0.1.0`, `attest:plugin/types@0.1.0`),
    /// sorted and each once: one for a well-built plugin.
    pub fn api_versions(&self, component: &Component) -> Vec<String> {
        let ty = component.component_type();
        let mut versions: Vec<String> = ty
            .imports(&self.engine)
            .filter_map(|(name, _)| name.strip_prefix("attest:plugin/"))
            .filter_map(|rest| rest.split_once('@').map(|(_, v)| v.to_owned()))
            .collect();
        versions.sort_unstable();
        versions.dedup();
        versions
    }

    /// Links a component once, so that each call only instantiates, and
    /// checks that it exports `describe` and `evaluate` with the types of the
    /// assertion-plugin world.
    pub fn prepare(&self, component: &Component, api: ApiVersion) -> anyhow::Result<Prepared> {
        let linker = self
            .linkers
            .iter()
            .find_map(|(v, l)| (*v == api).then_some(l))
            .ok_or_else(|| anyhow::anyhow!("no linker for {api:?}"))?;
        let pre = linker.instantiate_pre(component)?;
        api.check_exports(&pre)?;
        let export = |name: &str| {
            component
                .get_export_index(None, name)
                .ok_or_else(|| anyhow::anyhow!("the component exports no `{name}` function"))
        };
        let ty = component.component_type();
        let imports: Vec<&str> = ty.imports(&self.engine).map(|(name, _)| name).collect();
        let uses_wasi = imports.iter().any(|name| name.starts_with("wasi:"));
        let imports_log = imports.iter().any(|name| name.starts_with("attest:plugin/host@"));
        // Idle instances of a kept store hold pool slots. Only components as
        // small as a Rust plugin's (one memory; the plugin's table and the
        // shim's) are kept, so the idle ones cannot use up the pool's
        // memories or tables; WASI components run each call on a thread of
        // its own and have nothing to keep a store on.
        let keepable = !uses_wasi
            && component
                .resources_required()
                .is_some_and(|r| r.num_memories <= 1 && r.num_tables <= 2);
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Ok(Prepared {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            api,
            describe: export("describe")?,
            evaluate: export("evaluate")?,
            pre,
            uses_wasi,
            imports_log,
            keepable,
        })
    }

    /// A fresh store, armed for one call.
    fn store(&self, plugin_id: &Arc<str>, limits: &PluginLimits, time: CallTime) -> Store<State> {
        let mut store = Store::new(&self.engine, State::new(plugin_id, limits));
        store.limiter(|s| &mut s.limiter);
        arm(&mut store, limits, time);
        store
    }

    /// The store this thread kept for `plugin`, made ready for its next
    /// call, or a fresh one.
    fn store_for_call(&self, plugin: &Prepared, plugin_id: &Arc<str>, limits: &PluginLimits, time: CallTime) -> Store<State> {
        let kept = KEPT_STORE.with(|k| k.borrow_mut().take());
        match kept.and_then(|k| k.take_for(plugin.id)) {
            Some(mut store) => {
                // The call's state is made anew, so nothing a call may have
                // changed is missed; only what the store holds for its
                // earlier calls carries over.
                let state = store.data_mut();
                let earlier = std::mem::replace(state, State::new(plugin_id, limits));
                state.held = earlier.held;
                state.limiter.held_bytes = earlier.limiter.held_bytes;
                arm(&mut store, limits, time);
                store
            }
            None => self.store(plugin_id, limits, time),
        }
    }

    /// `describe()` in a fresh instance. Its strings are read in place and
    /// only copied once they are known to be small enough.
    pub fn describe(&self, plugin: &Prepared, plugin_id: &Arc<str>, limits: &PluginLimits) -> Result<Info, Fault> {
        let time = CallTime::own(limits.timeout);
        self.on_call_thread(plugin, || {
            let mut store = self.store(plugin_id, limits, time);
            let result = describe_in(&mut store, plugin);
            finish(&store);
            result.map_err(|e| classify(e, &store, plugin, limits, time))?
        })
    }

    /// `evaluate()` in a fresh instance. The result list is counted before
    /// anything is copied out of the plugin's memory, and each string is
    /// clipped (details over their limit replaced) as it is copied.
    /// `capabilities` is what the call may use beyond logging; it comes back
    /// with what the call used. The call runs for at most `time`.
    #[allow(clippy::too_many_arguments)]
    pub fn evaluate(
        &self,
        plugin: &Prepared,
        plugin_id: &Arc<str>,
        limits: &PluginLimits,
        time: CallTime,
        trace: &str,
        configs: &[&str],
        capabilities: Option<Box<CallContext>>,
    ) -> (Result<Answer, Fault>, Option<Box<CallContext>>) {
        if time.limit.is_zero() {
            // Nothing is left of the request's deadline: not started at all.
            return (Err(time.fault()), capabilities);
        }
        let answer = self.on_call_thread(plugin, || {
            let mut store = if plugin.keepable {
                self.store_for_call(plugin, plugin_id, limits, time)
            } else {
                self.store(plugin_id, limits, time)
            };
            store.data_mut().capabilities = capabilities;
            let result = evaluate_in(&mut store, plugin, trace, configs);
            finish(&store);
            let result = result.map_err(|e| classify(e, &store, plugin, limits, time));
            let capabilities = store.data_mut().capabilities.take();
            // A store whose call failed is dropped: a trap, a timeout or a
            // refused host call may leave it mid-way through anything.
            if result.is_ok() && plugin.keepable {
                KeptStore::keep(plugin.id, store);
            }
            Ok((result, capabilities))
        });
        answer.unwrap_or_else(|fault| (Err(fault), None))
    }

    /// Runs a call where its host calls can be served: plugins that import
    /// WASI run on a thread of their own, the others on the caller's.
    fn on_call_thread<R: Send>(&self, plugin: &Prepared, call: impl FnOnce() -> Result<R, Fault> + Send) -> Result<R, Fault> {
        if plugin.uses_wasi {
            outside_async_runtime(call)
        } else {
            call()
        }
    }
}

/// How long one call may run: the plugin's own timeout, or what is left
/// of the request's deadline when that comes first.
#[derive(Debug, Clone, Copy)]
pub struct CallTime {
    limit: Duration,
    by_request: bool,
}

impl CallTime {
    /// The plugin's own timeout alone (loading, `describe`).
    pub fn own(timeout: Duration) -> CallTime {
        CallTime {
            limit: timeout,
            by_request: false,
        }
    }

    /// The plugin's timeout, cut to the request's `deadline`.
    pub fn within(timeout: Duration, deadline: std::time::Instant) -> CallTime {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        CallTime {
            limit: timeout.min(left),
            by_request: left < timeout,
        }
    }

    fn fault(self) -> Fault {
        Fault::Timeout {
            after: self.limit,
            by_request: self.by_request,
        }
    }
}

/// The limits of one call's instance.
fn store_limits(limits: &PluginLimits) -> StoreLimits {
    // The counts are per store, and a kept store holds the instances of
    // up to `CALLS_PER_STORE` calls; the pool bounds each component alone.
    let calls = CALLS_PER_STORE;
    StoreLimitsBuilder::new()
        .memory_size(limits.memory_bytes)
        .table_elements(100_000)
        .instances(64 * calls)
        .tables(64 * calls)
        .memories(16 * calls)
        .trap_on_grow_failure(true)
        .build()
}

/// Sets a call's CPU limits: its fuel, and its deadline from now.
fn arm(store: &mut Store<State>, limits: &PluginLimits, time: CallTime) {
    if let Some(fuel) = limits.fuel {
        store.set_fuel(fuel).expect("plugins with a fuel budget run in the metered sandbox");
    }
    // The epoch last advanced up to a tick ago, so N ticks from now end
    // between N - 1 and N ticks of wall time.
    let mut ticks = time.limit.as_millis().div_ceil(EPOCH_TICK.as_millis()).max(1) as u64;
    if time.by_request {
        // Cut short by the request's deadline, the call must end after it,
        // never a tick before: the request is then answered as timed out
        // (3002), whichever tick the deadline fell in.
        ticks += 1;
    }
    store.set_epoch_deadline(ticks);
}

/// Calls one store serves, each in a fresh instance, before it is dropped
/// (which returns all their slots to the pool at once).
const CALLS_PER_STORE: usize = 8;
/// Linear memory a kept store's instances may hold; a store holding more
/// is dropped after its call.
const KEPT_STORE_BYTES: usize = 16 << 20;
/// Instances of earlier calls, and their memory, that stores may hold over
/// all threads, whether the store is idle or serving its next call. The
/// pool's slots must stay free for calls in flight: each held instance is
/// one memory and at most two tables (only such components are kept), and
/// at most 64 core instances, so 16 of them hold at most half the pool's
/// 2,048 core instances and a sliver of its memories and tables.
const HELD_INSTANCES_TOTAL: usize = 16;
const HELD_BYTES_TOTAL: usize = 64 << 20;

static HELD_INSTANCES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HELD_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The instances and memory a store holds for calls that have finished,
/// counted in [`HELD_INSTANCES`] and [`HELD_BYTES`] until the store (whose
/// state this is part of) is dropped.
#[derive(Default)]
struct Held {
    instances: usize,
    bytes: usize,
}

impl Held {
    /// Counts a finished call's instance, and the store's memory now
    /// `bytes` in all, as held. False when that takes the process past a
    /// total: the store must then be dropped, which gives it all back.
    fn hold(&mut self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let more = bytes.saturating_sub(self.bytes);
        // Counted first, so that two threads cannot both pass the check.
        let instances = HELD_INSTANCES.fetch_add(1, Relaxed) + 1;
        let total_bytes = HELD_BYTES.fetch_add(more, Relaxed) + more;
        self.instances += 1;
        self.bytes += more;
        instances <= HELD_INSTANCES_TOTAL && total_bytes <= HELD_BYTES_TOTAL
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        HELD_INSTANCES.fetch_sub(self.instances, Relaxed);
        HELD_BYTES.fetch_sub(self.bytes, Relaxed);
    }
}

thread_local! {
    /// The store the last call on this thread left, for its plugin's next call.
    static KEPT_STORE: std::cell::RefCell<Option<KeptStore>> = const { std::cell::RefCell::new(None) };
}

/// A store kept between two calls of one plugin on one thread. Each call
/// still gets a fresh instance of its own, so no guest state is shared:
/// what the calls share is the store (its state is reset per call, see
/// [`Sandbox::store_for_call`]), and the instances of earlier calls stay
/// alive, unused, until the store is dropped. That is bounded per store by
/// [`CALLS_PER_STORE`] and [`KEPT_STORE_BYTES`], and over all threads by
/// [`HELD_INSTANCES_TOTAL`] and [`HELD_BYTES_TOTAL`] ([`Held`]).
struct KeptStore {
    plugin: u64,
    store: Store<State>,
}

impl KeptStore {
    /// Keeps `store`, whose call has just finished, on this thread for
    /// `plugin`'s next call when it may serve another and the totals allow;
    /// otherwise drops it.
    fn keep(plugin: u64, mut store: Store<State>) {
        let state = store.data_mut();
        let bytes = state.limiter.held_bytes;
        // The calls it has served: those it holds instances for, and this one.
        let calls = state.held.instances + 1;
        if calls >= CALLS_PER_STORE || bytes > KEPT_STORE_BYTES || !state.held.hold(bytes) {
            return;
        }
        // A store kept for another plugin is replaced (and dropped) here.
        KEPT_STORE.with(|k| *k.borrow_mut() = Some(KeptStore { plugin, store }));
    }

    /// The store, if it was kept for `plugin`; a store kept for another
    /// plugin is dropped.
    fn take_for(self, plugin: u64) -> Option<Store<State>> {
        (self.plugin == plugin).then_some(self.store)
    }
}

/// WASI's synchronous host calls (stream writes, polls) run their work on an
/// async runtime of their own, which cannot be started on a thread that is
/// already driving the engine's. A plain thread per call of a WASI plugin
/// costs some microseconds; such plugins (Python, JavaScript) take a
/// millisecond or more per call anyway.
fn outside_async_runtime<R: Send>(call: impl FnOnce() -> Result<R, Fault> + Send) -> Result<R, Fault> {
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("attest-plugin-call".into())
            .spawn_scoped(scope, call)
        {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(Fault::Trap("the engine failed while serving one of its host calls".into()))),
            Err(e) => Err(Fault::Trap(format!("the engine could not start a thread for the call: {e}"))),
        }
    })
}

/// Reports what a call's log budget dropped.
fn finish(store: &Store<State>) {
    let state = store.data();
    if state.log.dropped > 0 {
        tracing::warn!(
            plugin = %state.plugin_id,
            dropped = state.log.dropped,
            "plugin log lines over the per-call budget ({LOG_LINES_PER_CALL} lines, {LOG_BYTES_PER_CALL} bytes) were dropped"
        );
    }
}

// ---- Lifting with bounds
//
// What a plugin returns is copied out of its memory by the canonical ABI's
// "lift". The types below take part in that lift (they implement wasmtime's
// `Lift` by hand) so that nothing is copied beyond what the engine keeps:
// a result list is copied only when it has exactly one item per config, and
// a string only up to its limit.

thread_local! {
    /// Results the `evaluate` call running on this thread must return: the
    /// number of its configs. The lift runs on the calling thread, inside
    /// the call.
    pub(super) static EXPECTED_RESULTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A `list<T>` copied only when it has the expected number of items
/// ([`EXPECTED_RESULTS`]); otherwise only its length is read.
pub(super) enum CountedList<T> {
    Items(Vec<T>),
    WrongCount(usize),
}

// SAFETY: the same canonical-ABI representation as `[T]` (a pointer and a
// length), checked by the same typecheck.
unsafe impl<T: ComponentType> ComponentType for CountedList<T> {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <[T] as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: delegates to `Vec<T>`'s lift, whose representation is the same.
unsafe impl<T: Lift> Lift for CountedList<T> {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &[ValRaw; 2]) -> wasmtime::Result<Self> {
        let len = src[1].get_u32() as usize;
        if len != EXPECTED_RESULTS.with(|e| e.get()) {
            return Ok(CountedList::WrongCount(len));
        }
        Ok(CountedList::Items(<Vec<T> as Lift>::linear_lift_from_flat(cx, ty, src)?))
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let len = u32_at(bytes, 4)? as usize;
        if len != EXPECTED_RESULTS.with(|e| e.get()) {
            return Ok(CountedList::WrongCount(len));
        }
        Ok(CountedList::Items(<Vec<T> as Lift>::linear_lift_from_memory(cx, ty, bytes)?))
    }
}

fn u32_at(bytes: &[u8], at: usize) -> wasmtime::Result<u32> {
    match bytes.get(at..at + 4) {
        Some(b) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(wasmtime::Error::msg("pointer pair out of bounds")),
    }
}

/// A `list<T>` copied only when it has at most `MAX` items; otherwise only
/// its length is read.
pub(super) enum CappedList<T, const MAX: usize> {
    Items(Vec<T>),
    TooMany(usize),
}

impl<T, const MAX: usize> CappedList<T, MAX> {
    /// How many items the list had.
    pub(super) fn len(&self) -> usize {
        match self {
            CappedList::Items(items) => items.len(),
            CappedList::TooMany(n) => *n,
        }
    }

    /// The items, or how many there were when too many.
    pub(super) fn items(self) -> Result<Vec<T>, usize> {
        match self {
            CappedList::Items(items) => Ok(items),
            CappedList::TooMany(n) => Err(n),
        }
    }
}

// SAFETY: the same canonical-ABI representation as `[T]` (a pointer and a
// length), checked by the same typecheck.
unsafe impl<T: ComponentType, const MAX: usize> ComponentType for CappedList<T, MAX> {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <[T] as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: delegates to `Vec<T>`'s lift, whose representation is the same.
unsafe impl<T: Lift, const MAX: usize> Lift for CappedList<T, MAX> {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &[ValRaw; 2]) -> wasmtime::Result<Self> {
        let len = src[1].get_u32() as usize;
        if len > MAX {
            return Ok(CappedList::TooMany(len));
        }
        Ok(CappedList::Items(<Vec<T> as Lift>::linear_lift_from_flat(cx, ty, src)?))
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let len = u32_at(bytes, 4)? as usize;
        if len > MAX {
            return Ok(CappedList::TooMany(len));
        }
        Ok(CappedList::Items(<Vec<T> as Lift>::linear_lift_from_memory(cx, ty, bytes)?))
    }
}

/// A `string` copied only up to `MAX` bytes, with its full length.
pub(super) struct BoundedText<const MAX: usize> {
    /// At most `MAX` bytes, cut at a character boundary.
    pub(super) text: String,
    /// The string's length in the plugin's memory, in bytes.
    pub(super) len: usize,
}

impl<const MAX: usize> BoundedText<MAX> {
    fn lift(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        ptr: u32,
        len: u32,
        flat: Option<&[ValRaw; 2]>,
        bytes: Option<&[u8]>,
    ) -> wasmtime::Result<Self> {
        use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
        if !matches!(cx.options().string_encoding, StringEncoding::Utf8) {
            // UTF-16 strings are transcoded by wasmtime, in full.
            let text = match (flat, bytes) {
                (Some(src), _) => <String as Lift>::linear_lift_from_flat(cx, ty, src)?,
                (_, Some(b)) => <String as Lift>::linear_lift_from_memory(cx, ty, b)?,
                _ => String::new(),
            };
            let len = text.len();
            let mut text = text;
            if len > MAX {
                let mut cut = MAX;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            return Ok(BoundedText { text, len });
        }
        let (ptr, len) = (ptr as usize, len as usize);
        let memory = cx.memory();
        let Some(whole) = ptr.checked_add(len).and_then(|end| memory.get(ptr..end)) else {
            return Err(wasmtime::Error::msg("string pointer/length out of bounds of memory"));
        };
        let kept = &whole[..len.min(MAX)];
        let text = match std::str::from_utf8(kept) {
            Ok(t) => t,
            // Cut inside a character: keep what comes before it.
            Err(e) if len > MAX && e.error_len().is_none() => std::str::from_utf8(&kept[..e.valid_up_to()]).unwrap_or_default(),
            Err(e) => return Err(wasmtime::Error::msg(format!("string is not valid UTF-8: {e}"))),
        };
        Ok(BoundedText {
            text: text.to_owned(),
            len,
        })
    }
}

// SAFETY: the same canonical-ABI representation as `string` (a pointer and
// a length), checked by the same typecheck.
unsafe impl<const MAX: usize> ComponentType for BoundedText<MAX> {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <str as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads only within the plugin's memory, bounds-checked above.
unsafe impl<const MAX: usize> Lift for BoundedText<MAX> {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &[ValRaw; 2]) -> wasmtime::Result<Self> {
        Self::lift(cx, ty, src[0].get_u32(), src[1].get_u32(), Some(src), None)
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        Self::lift(cx, ty, u32_at(bytes, 0)?, u32_at(bytes, 4)?, None, Some(bytes))
    }
}

/// Longest explanation or error message copied, in bytes (then clipped to
/// [`MAX_VERDICT_TEXT_CHARS`]).
pub(super) const MAX_VERDICT_TEXT_BYTES: usize = 4 * MAX_VERDICT_TEXT_CHARS;
/// Longest id, version or description copied, in bytes.
pub(super) const MAX_INFO_BYTES: usize = 4 * MAX_INFO_CHARS;

fn describe_in(store: &mut Store<State>, plugin: &Prepared) -> wasmtime::Result<Result<Info, Fault>> {
    let instance = plugin.pre.instantiate(&mut *store)?;
    match plugin.api {
        ApiVersion::V0_1_0 => super::since_v0_1_0::describe(store, &instance, &plugin.describe),
        ApiVersion::V0_2_0 => super::since_v0_2_0::describe(store, &instance, &plugin.describe),
    }
}

/// `verdict`, copied within bounds (the same record in every version).
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawVerdict {
    status: Status,
    score: f64,
    explanation: BoundedText<MAX_VERDICT_TEXT_BYTES>,
    details: Option<BoundedText<MAX_DETAILS_BYTES>>,
}

/// `plugin-error`, copied within bounds (the same variant in every version).
#[derive(ComponentType, Lift)]
#[component(variant)]
enum RawError {
    #[component(name = "invalid-config")]
    InvalidConfig(BoundedText<MAX_VERDICT_TEXT_BYTES>),
    #[component(name = "unsupported-trace")]
    UnsupportedTrace(BoundedText<MAX_VERDICT_TEXT_BYTES>),
    #[component(name = "internal")]
    Internal(BoundedText<MAX_VERDICT_TEXT_BYTES>),
}

/// Calls `evaluate`, whose signature every version shares; a wrong number
/// of results is answered as such, and none of them is copied.
fn evaluate_in(store: &mut Store<State>, plugin: &Prepared, trace: &str, configs: &[&str]) -> wasmtime::Result<Answer> {
    type Results = CountedList<Result<RawVerdict, RawError>>;
    let instance = plugin.pre.instantiate(&mut *store)?;
    let func = instance.get_typed_func::<(&str, &[&str]), (Results,)>(&mut *store, &plugin.evaluate)?;
    EXPECTED_RESULTS.with(|e| e.set(configs.len()));
    let (list,) = func.call(&mut *store, (trace, configs))?;
    let items = match list {
        CountedList::Items(items) => items,
        CountedList::WrongCount(n) => return Ok(Answer::WrongCount(n)),
    };
    // Clipped in place: the text was just copied out of the plugin's memory.
    let text = |t: BoundedText<MAX_VERDICT_TEXT_BYTES>| {
        let mut text = t.text;
        crate::text::clip_in_place(&mut text, MAX_VERDICT_TEXT_CHARS);
        text
    };
    Ok(Answer::Results(
        items
            .into_iter()
            .map(|item| match item {
                Ok(v) => Ok(Verdict {
                    status: v.status,
                    score: v.score,
                    explanation: text(v.explanation),
                    details: v.details.map(|d| {
                        if d.len > MAX_DETAILS_BYTES {
                            serde_json::json!({"omitted": format!("details were {} bytes; the limit is {MAX_DETAILS_BYTES}", d.len)})
                                .to_string()
                        } else {
                            d.text
                        }
                    }),
                }),
                Err(RawError::InvalidConfig(m)) => Err(PluginError::InvalidConfig(text(m))),
                Err(RawError::UnsupportedTrace(m)) => Err(PluginError::UnsupportedTrace(text(m))),
                Err(RawError::Internal(m)) => Err(PluginError::Internal(text(m))),
            })
            .collect(),
    ))
}

/// Names what went wrong in a failed call.
fn classify(e: wasmtime::Error, store: &Store<State>, plugin: &Prepared, limits: &PluginLimits, time: CallTime) -> Fault {
    if store.data().limiter.refused {
        return Fault::OutOfMemory {
            limit: limits.memory_bytes,
        };
    }
    if let Some(refused) = e.downcast_ref::<Refused>() {
        return Fault::Refused(refused.0.clone());
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Fault::OutOfFuel {
            fuel: limits.fuel.unwrap_or_default(),
        },
        Some(Trap::Interrupt) => time.fault(),
        Some(trap) => {
            let said = last_words(store.data());
            if said.is_empty() && *trap == Trap::UnreachableCodeReached && !plugin.imports_log && !plugin.uses_wasi {
                // How a Rust panic ends; say why its message is nowhere to be seen.
                Fault::Trap(format!(
                    "{trap} (how a panic ends; this plugin imports no host `log`, so no panic message was logged: \
                     a Rust plugin logs its panics unless it sets `REPORT_PANICS = false`)"
                ))
            } else {
                Fault::Trap(format!("{trap}{said}"))
            }
        }
        // Not a trap (a WASI `exit`): what the plugin said last may still say why.
        None => Fault::Trap(format!("{}{}", crate::text::clip(&format!("{e:#}"), 300), last_words(store.data()))),
    }
}

/// Longest stderr or log text a trap's explanation quotes, in characters.
const LAST_WORDS_CHARS: usize = 600;

/// What the plugin said just before it trapped, for the trap's explanation:
/// the end of its stderr (a Python exception's traceback), or else its last
/// error-level log line (a Rust panic message). Empty when it said nothing.
/// The text is the plugin's own, headed for results, reports and history,
/// so secret values granted to the call are masked, it is put on one line
/// with control characters escaped, and only its last [`LAST_WORDS_CHARS`]
/// characters are kept: the end of a traceback says what went wrong.
fn last_words(state: &State) -> String {
    let (label, text, cut) = match (state.stderr.as_ref().and_then(StderrTail::written), &state.last_error) {
        (Some(written), _) => ("the end of its stderr", written.text, written.cut),
        (None, Some(line)) => ("its last error log", line.clone(), false),
        (None, None) => return String::new(),
    };
    let text = match state.capabilities.as_deref() {
        Some(cx) => masked(text, &cx.secrets),
        None => text,
    };
    let line = one_line(&text);
    let chars = line.chars().count();
    let end: String = line.chars().skip(chars.saturating_sub(LAST_WORDS_CHARS)).collect();
    let cut = if cut || chars > LAST_WORDS_CHARS { "…" } else { "" };
    format!("; {label}: \"{cut}{}\"", crate::text::neutralise_bidi(&end))
}

/// `text` with every secret value granted to the call masked ([`crate::capabilities::mask`]).
fn masked(text: String, secrets: &std::collections::BTreeMap<String, String>) -> String {
    match crate::capabilities::mask(&text, secrets) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(m) => m,
    }
}

/// `text` on one line: line breaks become ` | `, tabs spaces, and other
/// control characters are escaped ([`attest_io::printable`]), so a quote
/// cannot break a table row or a report.
fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    attest_io::printable(&lines.join(" | ").replace('\t', " ")).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_words_are_one_masked_line_ending_with_what_went_wrong() {
        let mut state = State::new(&Arc::from("p"), &PluginLimits::default());
        assert_eq!(last_words(&state), "", "nothing said");
        state.last_error = Some("panicked: at src/lib.rs:3:9:\nindex out of bounds".into());
        assert_eq!(
            last_words(&state),
            "; its last error log: \"panicked: at src/lib.rs:3:9: | index out of bounds\""
        );
        let tail = StderrTail::default();
        state.stderr = Some(tail.clone());
        assert!(last_words(&state).contains("its last error log"), "an empty stderr says nothing");
        let traceback = format!("Traceback:\r\n{}\n\tline 2\n\x1b[31mValueError: x\x1b[0m\n", "frame ".repeat(200));
        wasmtime_wasi::p2::OutputStream::write(&mut tail.clone(), traceback.into_bytes().into()).unwrap();
        let said = last_words(&state);
        assert!(
            said.starts_with("; the end of its stderr: \"…") && said.contains("frame frame"),
            "{said}"
        );
        assert!(said.ends_with(" | line 2 | \\u{1b}[31mValueError: x\\u{1b}[0m\""), "{said}");
        assert!(!said.contains('\n') && !said.contains('\r') && !said.contains('\x1b'), "{said}");
        assert!(said.chars().count() < LAST_WORDS_CHARS + 40, "{said}");
        let secrets = std::collections::BTreeMap::from([("token".to_owned(), "s3cret".to_owned()), ("empty".to_owned(), String::new())]);
        assert_eq!(
            masked("token=s3cret, again s3cret".into(), &secrets),
            "token=[secret 'token'], again [secret 'token']"
        );
    }

    #[test]
    fn version_policy() {
        assert_eq!(ApiVersion::serving("0.1.0"), Some(ApiVersion::V0_1_0));
        assert_eq!(ApiVersion::serving("0.2.0"), Some(ApiVersion::V0_2_0), "both served side by side");
        assert_eq!(ApiVersion::serving("0.3.0"), None, "a newer minor is not served");
        assert_eq!(ApiVersion::serving("0.1.1"), None, "a newer patch is not served");
        assert_eq!(ApiVersion::serving("0.2.1"), None, "a newer patch is not served");
        assert_eq!(ApiVersion::serving("0.0.9"), None, "another 0.x minor is not served");
        assert_eq!(ApiVersion::serving("9.0.0"), None);
        assert_eq!(ApiVersion::serving("garbage"), None);
        assert_eq!(ApiVersion::serving("0.1.0.1"), None);
    }

    #[test]
    fn every_version_is_listed_as_text() {
        let text: Vec<String> = ApiVersion::ALL
            .iter()
            .map(|v| {
                let (a, b, c) = v.min_version();
                format!("{a}.{b}.{c}")
            })
            .collect();
        assert_eq!(text, SUPPORTED_API_VERSIONS);
    }

    /// The kept-store tests change process-wide totals; one at a time.
    static TOTALS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The plugin this thread's kept store is for, and the calls it holds
    /// instances for.
    fn kept_here() -> Option<(u64, usize)> {
        KEPT_STORE.with(|k| k.borrow().as_ref().map(|k| (k.plugin, k.store.data().held.instances)))
    }

    fn take_kept(plugin: u64) -> Option<Store<State>> {
        KEPT_STORE.with(|k| k.borrow_mut().take()).unwrap().take_for(plugin)
    }

    #[test]
    fn a_kept_store_serves_only_its_plugin_and_only_a_few_calls() {
        let _one_at_a_time = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
        use std::sync::atomic::Ordering::Relaxed;
        let sandbox = Sandbox::get(false).unwrap();
        let id: Arc<str> = "p".into();
        let limits = PluginLimits::default();

        KeptStore::keep(7, sandbox.store(&id, &limits, CallTime::own(limits.timeout)));
        assert_eq!(kept_here(), Some((7, 1)));
        assert!(HELD_INSTANCES.load(Relaxed) >= 1, "a kept store counts against the totals");
        // Another plugin's call takes the store off the thread and drops it.
        assert!(take_kept(8).is_none());
        assert_eq!(kept_here(), None);

        // Its own plugin's call gets it back, with its count of calls,
        // and it stays counted while it serves that call.
        let before = HELD_INSTANCES.load(Relaxed);
        KeptStore::keep(7, sandbox.store(&id, &limits, CallTime::own(limits.timeout)));
        let store = take_kept(7).unwrap();
        KeptStore::keep(7, store);
        assert_eq!(kept_here(), Some((7, 2)));
        let mut store = take_kept(7).unwrap();
        assert_eq!(HELD_INSTANCES.load(Relaxed), before + 2);
        assert_eq!(store.data().held.instances, 2);

        // A store that has served its calls, or holds too much memory, is
        // not kept.
        for calls in 3..CALLS_PER_STORE {
            KeptStore::keep(7, store);
            assert_eq!(kept_here(), Some((7, calls)));
            store = take_kept(7).unwrap();
        }
        KeptStore::keep(7, store);
        assert_eq!(kept_here(), None);
        let mut big = sandbox.store(&id, &limits, CallTime::own(limits.timeout));
        big.data_mut().limiter.held_bytes = KEPT_STORE_BYTES + 1;
        KeptStore::keep(7, big);
        assert_eq!(kept_here(), None);
    }

    #[test]
    fn kept_stores_stay_within_the_totals() {
        let _one_at_a_time = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
        use std::sync::atomic::Ordering::Relaxed;
        let sandbox = Sandbox::get(false).unwrap();
        let id: Arc<str> = "p".into();
        let limits = PluginLimits::default();
        // As if other threads held every instance the totals allow.
        HELD_INSTANCES.fetch_add(HELD_INSTANCES_TOTAL, Relaxed);
        let before = HELD_INSTANCES.load(Relaxed);
        KeptStore::keep(9, sandbox.store(&id, &limits, CallTime::own(limits.timeout)));
        let kept = kept_here();
        let after = HELD_INSTANCES.load(Relaxed);
        HELD_INSTANCES.fetch_sub(HELD_INSTANCES_TOTAL, Relaxed);
        assert_eq!(kept, None, "over the total, the store is dropped");
        assert_eq!(after, before, "and what it counted is given back");
    }
}
