//! Every assertion layer, under one path: the core's (`attest-core`: the
//! native layers, verdicts, the compiled assertion), the providers' layers 5
//! and 6 (`attest-providers`) and the plugin host's layer 8
//! (`attest-plugin-host`).

pub use attest_core::layers::*;
pub use attest_plugin_host::check as plugin;
pub use attest_providers::{embedding, llm_judge};
