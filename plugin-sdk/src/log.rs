//! Logging through the host's `log` import (WIT `host.log`).
//!
//! On wasm32 a line goes to the engine's log, attributed to the plugin. In
//! native builds (plain `cargo test`) there is no host: calling the generated
//! import there would hit `unreachable!()`, so lines are recorded in a
//! thread-local buffer instead, which [`crate::testing::take_logs`] drains.

/// Severity of a log line (WIT `log-level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// Writes a line to the engine's log. The engine decides what to keep
/// (level filter, rate and size limits), so this never fails.
pub fn log(level: LogLevel, message: &str) {
    imp::log(level, message);
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::LogLevel;
    use crate::__bindings::attest::plugin::host;

    pub fn log(level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Debug => host::LogLevel::Debug,
            LogLevel::Info => host::LogLevel::Info,
            LogLevel::Warn => host::LogLevel::Warn,
            LogLevel::Error => host::LogLevel::Error,
        };
        host::log(level, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    use super::LogLevel;
    use std::cell::RefCell;

    thread_local! {
        // Per thread, so parallel tests each see only their own lines.
        static RECORDED: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
    }

    pub fn log(level: LogLevel, message: &str) {
        RECORDED.with(|r| r.borrow_mut().push((level, message.to_owned())));
    }

    pub fn take() -> Vec<(LogLevel, String)> {
        RECORDED.with(|r| std::mem::take(&mut *r.borrow_mut()))
    }
}
