//! What a spawned agent gets: a sanitized environment (an allowlist, the
//! model providers' settings, what the manifest and `--pass-env` add) and
//! its resource limits.

use super::*;

/// Environment variables a spawned agent inherits from the runtime; anything
/// else must be named in the manifest (`env:` or `pass_env:`), with
/// `--pass-env`, or with `--inherit-env`.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM",
];

/// The model providers' credentials and settings that agent frameworks
/// (the OpenAI and Anthropic SDKs, LangChain, PydanticAI, CrewAI, LiteLLM)
/// read from the environment by default, and the proxy and CA settings
/// their HTTP clients read: passed to every agent, so that a manifest
/// written for the reference runtime, which passes the whole environment,
/// runs unchanged. Names, or globs with `*`.
pub const ENV_PROVIDER_DEFAULTS: &[&str] = &[
    "OPENAI_*",
    "AZURE_OPENAI_*",
    "ANTHROPIC_*",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "COHERE_API_KEY",
    "CO_API_KEY",
    "TOGETHER_API_KEY",
    "FIREWORKS_API_KEY",
    "DEEPSEEK_API_KEY",
    "XAI_API_KEY",
    "OPENROUTER_API_KEY",
    "OLLAMA_HOST",
    "HF_TOKEN",
    "HUGGINGFACEHUB_API_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
];

/// Whether `name` matches `pattern`, a name or a glob whose `*` stands for
/// any run of characters.
pub fn env_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

impl AgentEnv {
    /// Whether the runtime's variable `name` goes to the agent.
    pub fn passes(&self, name: &str) -> bool {
        self.inherit
            || ENV_ALLOWLIST.contains(&name)
            || ENV_PROVIDER_DEFAULTS.iter().any(|p| env_matches(p, name))
            || self.pass.iter().any(|p| env_matches(p, name))
    }

    /// The runtime's variables that look like credentials or settings an
    /// agent may need (`*_API_KEY`, `*_TOKEN`, `*_BASE_URL`, …) and that
    /// were withheld from it: named when an agent fails.
    pub fn withheld(&self) -> Vec<String> {
        const LIKELY: [&str; 8] = [
            "*_API_KEY",
            "*_KEY",
            "*_TOKEN",
            "*_SECRET*",
            "*_BASE_URL",
            "*_URL",
            "*_ENDPOINT",
            "*_HOST",
        ];
        let mut names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| !self.passes(k) && !self.set.contains_key(k) && LIKELY.iter().any(|p| env_matches(p, k)))
            .collect();
        names.sort();
        names.truncate(10);
        names
    }
}

/// Whether `name` can name an environment variable: the environment is a
/// list of `NAME=value` C strings, so a name that is empty or holds `=` or a
/// NUL byte cannot be set (or would set another variable than the one
/// written). The message says what a valid name is.
pub fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        Err(
            "not a valid environment variable name: a name must not be empty and must not hold '=' or a NUL byte (e.g. OPENAI_API_KEY)"
                .into(),
        )
    } else {
        Ok(())
    }
}

/// What a spawned agent's environment is built from, and the limits it runs under.
#[derive(Debug, Clone, Default)]
pub struct AgentEnv {
    pub set: BTreeMap<String, String>,
    /// Names or globs of the runtime's variables to pass (`pass_env:`, `--pass-env`).
    pub pass: Vec<String>,
    /// Pass the runtime's whole environment (`--inherit-env`).
    pub inherit: bool,
    pub limits: AgentLimits,
}

/// Resource limits for each process of a spawned agent (Linux), set
/// before it starts and inherited by everything it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Bytes of data segment and private writable mappings, which is what
    /// allocating takes (`RLIMIT_DATA`: address space only reserved, as
    /// V8 and Go reserve it, does not count). `None`: no limit.
    pub memory_bytes: Option<u64>,
    /// Seconds of CPU (`RLIMIT_CPU`: SIGXCPU at the limit, SIGKILL a second
    /// later). `None`: none beyond the call and run timeouts.
    pub cpu_secs: Option<u64>,
}

impl AgentLimits {
    /// The default memory limit per agent process, in MiB.
    pub const DEFAULT_MEMORY_MIB: u64 = 4096;
}

impl Default for AgentLimits {
    fn default() -> AgentLimits {
        AgentLimits {
            memory_bytes: Some(AgentLimits::DEFAULT_MEMORY_MIB << 20),
            cpu_secs: None,
        }
    }
}
