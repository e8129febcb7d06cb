//! The sandbox plugins run in: a wasmtime engine, one linker per supported
//! WIT version, and a fresh, limited store for every call.
//!
//! Deny by default:
//! - no filesystem, network, environment, arguments or stdio (WASI is linked
//!   only so that components from other toolchains can instantiate; its
//!   context grants nothing);
//! - CPU: an epoch deadline per call, and for plugins configured with a
//!   `fuel` budget, fuel metering on top (a deterministic instruction count,
//!   costing the guest 20% or more of its speed, so it is opt-in; such plugins run in a
//!   second engine that compiles the metering in);
//! - memory: a cap per instance (growth beyond it traps), bounded tables and
//!   instances, and a bounded wasm stack. Accesses are bounds-checked in the
//!   compiled code rather than by guard pages.
//!
//! Every call instantiates afresh from a pre-instantiated component on the
//! pooling allocator, so no state survives from one call to the next and a
//! trapped instance is simply dropped.

use super::PluginLimits;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "assertion-plugin",
});

// The world `use`s these types, so the bindings re-export them at the root.
pub use attest::plugin::types::Status;

/// The WIT package versions this engine serves, newest first.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["0.1.0"];

/// How often the epoch advances; timeouts are rounded up to it.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Linear memory kept mapped between calls in a pooled slot (docs/benchmarks.md).
const KEEP_RESIDENT_BYTES: usize = 1 << 20;
/// Largest memory any plugin may be configured for (pooling slots are sized for it).
pub const MAX_MEMORY_BYTES: usize = 1 << 30;

/// Per-store state: the plugin's id (for its logs), its limits, and a WASI
/// context that grants nothing.
pub struct State {
    plugin_id: Arc<str>,
    limiter: Limiter,
    /// Built on the first WASI call: most plugins never make one, and
    /// building it (seeding its random generators) costs on every call.
    wasi: Option<WasiCtx>,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let ctx = self.wasi.get_or_insert_with(|| {
            let mut wasi = WasiCtx::builder();
            wasi.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
            wasi.build()
        });
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

impl attest::plugin::host::Host for State {
    fn log(&mut self, level: attest::plugin::host::LogLevel, message: String) {
        use attest::plugin::host::LogLevel;
        let message = crate::text::clip(&message, 2000);
        let plugin = &*self.plugin_id;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl attest::plugin::types::Host for State {}

/// [`StoreLimits`] that remembers whether it refused to grow memory, so an
/// out-of-memory trap can be named as such.
struct Limiter {
    inner: StoreLimits,
    refused: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let ok = self.inner.memory_growing(current, desired, maximum);
        if !matches!(ok, Ok(true)) {
            self.refused = true;
        }
        ok
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
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

/// A wasmtime engine (with its epoch ticker) and its linker.
pub struct Sandbox {
    engine: Engine,
    linker: Linker<State>,
}

/// Why a call produced no usable answer; each names its cause for the user.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    OutOfFuel { fuel: u64 },
    Timeout { after: Duration },
    OutOfMemory { limit: usize },
    Trap(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::OutOfFuel { fuel } => write!(f, "exceeded its CPU budget ({fuel} fuel per call)"),
            Fault::Timeout { after } => write!(f, "timed out after {} ms", after.as_millis()),
            Fault::OutOfMemory { limit } => write!(f, "exceeded its memory limit ({} MiB)", limit / (1024 * 1024)),
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
        // Explicit bounds checks instead of guard pages and signal handlers.
        // With virtual-memory bounds checks, every call that grows memory
        // mprotects the new pages, and the next instantiation of the slot
        // mprotects them back; in a multi-threaded process each mprotect is
        // a TLB shootdown across cores. That was 30% of a small plugin's call
        // time; explicit checks cost the guest far less (docs/benchmarks.md).
        // Trade-off: wasmtime then compiles without Spectre mitigations on
        // heap and table accesses (it requires them off). Bounds are still
        // checked on every access; only speculative out-of-bounds reads are
        // not prevented (docs/plugins.md, "The sandbox").
        config.signals_based_traps(false);
        config.memory_guard_size(0);
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_component_instances(256);
        pool.total_core_instances(2048);
        pool.total_memories(1024);
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
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        AssertionPlugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        // WASI is linked so components from other toolchains (Python, JS)
        // instantiate; the context built per call grants no capability.
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        let ticker = engine.weak();
        std::thread::Builder::new().name("attest-epoch".into()).spawn(move || {
            while let Some(engine) = ticker.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
        Ok(Sandbox { engine, linker })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The WIT version a component was built against, from its import names
    /// (`attest:plugin/host@0.1.0`, `attest:plugin/types@0.1.0`).
    pub fn api_version(&self, component: &Component) -> Option<String> {
        let ty = component.component_type();
        let versions: Vec<String> = ty
            .imports(&self.engine)
            .filter_map(|(name, _)| name.strip_prefix("attest:plugin/"))
            .filter_map(|rest| rest.split_once('@').map(|(_, v)| v.to_owned()))
            .collect();
        versions.into_iter().next()
    }

    /// Whether the engine serves `version`: the same major, and for 0.x the
    /// same minor, no newer than what the engine knows.
    pub fn serves(version: &str) -> bool {
        let parse = |v: &str| -> Option<(u64, u64, u64)> {
            let mut it = v.split('.').map(|p| p.parse::<u64>().ok());
            Some((it.next()??, it.next()??, it.next()??))
        };
        let Some(want) = parse(version) else { return false };
        SUPPORTED_API_VERSIONS.iter().filter_map(|s| parse(s)).any(|have| {
            let same_line = if have.0 == 0 {
                want.0 == 0 && want.1 == have.1
            } else {
                want.0 == have.0
            };
            same_line && want <= have
        })
    }

    /// Links a component once, so that each call only instantiates.
    pub fn prepare(&self, component: &Component) -> anyhow::Result<AssertionPluginPre<State>> {
        let pre = self.linker.instantiate_pre(component)?;
        Ok(AssertionPluginPre::new(pre)?)
    }

    fn store(&self, plugin_id: &Arc<str>, limits: &PluginLimits) -> Store<State> {
        let inner = StoreLimitsBuilder::new()
            .memory_size(limits.memory_bytes)
            .table_elements(100_000)
            .instances(64)
            .tables(64)
            .memories(16)
            .trap_on_grow_failure(true)
            .build();
        let state = State {
            plugin_id: plugin_id.clone(),
            limiter: Limiter { inner, refused: false },
            wasi: None,
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        if let Some(fuel) = limits.fuel {
            store.set_fuel(fuel).expect("plugins with a fuel budget run in the metered sandbox");
        }
        let ticks = limits.timeout.as_millis().div_ceil(EPOCH_TICK.as_millis()).max(1) as u64;
        store.set_epoch_deadline(ticks);
        store
    }

    /// `describe()` in a fresh instance.
    pub fn describe(&self, pre: &AssertionPluginPre<State>, plugin_id: &Arc<str>, limits: &PluginLimits) -> Result<PluginInfo, Fault> {
        let mut store = self.store(plugin_id, limits);
        let result = pre.instantiate(&mut store).and_then(|p| p.call_describe(&mut store));
        result.map_err(|e| classify(e, &store, limits))
    }

    /// `evaluate()` in a fresh instance.
    pub fn evaluate(
        &self,
        pre: &AssertionPluginPre<State>,
        plugin_id: &Arc<str>,
        limits: &PluginLimits,
        trace: &str,
        configs: &[String],
    ) -> Result<Vec<Result<Verdict, PluginError>>, Fault> {
        let mut store = self.store(plugin_id, limits);
        let result = pre
            .instantiate(&mut store)
            .and_then(|p| p.call_evaluate(&mut store, trace, configs));
        result.map_err(|e| classify(e, &store, limits))
    }
}

/// Names what went wrong in a failed call.
fn classify(e: wasmtime::Error, store: &Store<State>, limits: &PluginLimits) -> Fault {
    if store.data().limiter.refused {
        return Fault::OutOfMemory {
            limit: limits.memory_bytes,
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Fault::OutOfFuel {
            fuel: limits.fuel.unwrap_or_default(),
        },
        Some(Trap::Interrupt) => Fault::Timeout { after: limits.timeout },
        Some(trap) => Fault::Trap(trap.to_string()),
        None => Fault::Trap(crate::text::clip(&format!("{e:#}"), 300)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_policy() {
        assert!(Sandbox::serves("0.1.0"));
        assert!(!Sandbox::serves("0.2.0"), "a newer minor is not served");
        assert!(!Sandbox::serves("9.0.0"));
        assert!(!Sandbox::serves("garbage"));
    }
}
