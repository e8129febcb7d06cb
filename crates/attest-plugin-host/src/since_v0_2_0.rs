//! `attest:plugin@0.2.0`, frozen in `wit/since_v0.2.0/`: its bindings, its
//! imports on a linker (logging, and the capabilities `models.embed`,
//! `models.judge` and `secrets.config-secret`, served by
//! [`crate::capabilities`]), and how its plugins' answers are lifted.
//!
//! What a plugin passes to a capability is copied out of its memory within
//! the capability's limits (a list is counted before its items are read, a
//! string read only up to its limit), so an oversized request costs the
//! engine nothing before it is refused as `over-limit`.

use super::capabilities::{self, CallError, Capability, JudgeRequest};
use super::sandbox::{BoundedText, CappedList, Fault, Info, LogLevel, State, MAX_INFO_BYTES, MAX_SCHEMA_BYTES};
use wasmtime::component::{ComponentExportIndex, ComponentType, HasSelf, Instance, InstancePre, Lift, Linker};
use wasmtime::{Store, StoreContextMut};

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.2.0",
    world: "assertion-plugin",
});

use attest::plugin::models::Judgement as WitJudgement;
use attest::plugin::types::{Capability as WitCapability, CapabilityError, Denial};

/// The contract version this module was frozen at.
pub const MIN_VERSION: (u64, u64, u64) = (0, 2, 0);

const MODELS: &str = "attest:plugin/models@0.2.0";
const SECRETS: &str = "attest:plugin/secrets@0.2.0";

/// Links this version's imports: `host.log` through its bindings, the
/// capabilities by hand (for their bounded arguments).
pub fn add_to_linker(linker: &mut Linker<State>) -> anyhow::Result<()> {
    attest::plugin::host::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    super::sandbox::link_log(linker, "attest:plugin/host@0.2.0", log_level)?;
    let mut models = linker.instance(MODELS)?;
    models.func_wrap(
        "embed",
        |mut cx: StoreContextMut<'_, State>, (texts,): (Texts,)| -> wasmtime::Result<(Result<Vec<Vec<f32>>, CapabilityError>,)> {
            let asked = texts.asked();
            let result = cx
                .data_mut()
                .capability_call(Capability::Embed, |c| c.embed(texts.into_texts(), asked));
            Ok((result.map_err(wit_error),))
        },
    )?;
    models.func_wrap(
        "judge",
        |mut cx: StoreContextMut<'_, State>,
         (request,): (RawJudgeRequest,)|
         -> wasmtime::Result<(Result<WitJudgement, CapabilityError>,)> {
            let asked = format!("{} bytes of content, {} examples", request.content.len, request.examples.len());
            let result = cx
                .data_mut()
                .capability_call(Capability::Judge, |c| c.judge(request.into_request(), asked));
            Ok((result
                .map(|j| WitJudgement {
                    score: j.score,
                    reasoning: j.reasoning,
                })
                .map_err(wit_error),))
        },
    )?;
    let mut secrets = linker.instance(SECRETS)?;
    secrets.func_wrap(
        "config-secret",
        |mut cx: StoreContextMut<'_, State>,
         (name,): (BoundedText<{ capabilities::MAX_SECRET_NAME_BYTES }>,)|
         -> wasmtime::Result<(Result<Option<String>, CapabilityError>,)> {
            let name = if name.len > capabilities::MAX_SECRET_NAME_BYTES {
                Err(CallError::OverLimit(format!(
                    "a secret name of {} bytes; names are at most {} bytes",
                    name.len,
                    capabilities::MAX_SECRET_NAME_BYTES
                )))
            } else {
                Ok(name.text)
            };
            let result = cx
                .data_mut()
                .capability_call(Capability::ConfigSecret, |c| c.config_secret(name.as_deref().map_err(Clone::clone)));
            Ok((result.map_err(wit_error),))
        },
    )?;
    Ok(())
}

impl attest::plugin::host::Host for State {
    // Linked by hand instead (`sandbox::link_log`), to cut long lines while they are copied.
    fn log(&mut self, level: attest::plugin::host::LogLevel, message: String) {
        self.write_log(log_level(level), &message);
    }
}

fn log_level(level: attest::plugin::host::LogLevel) -> LogLevel {
    use attest::plugin::host::LogLevel as Level;
    match level {
        Level::Debug => LogLevel::Debug,
        Level::Info => LogLevel::Info,
        Level::Warn => LogLevel::Warn,
        Level::Error => LogLevel::Error,
    }
}

/// Checks that a linked component exports this world's functions with this
/// world's types.
pub fn check_exports(pre: &InstancePre<State>) -> anyhow::Result<()> {
    AssertionPluginPre::new(pre.clone())?;
    Ok(())
}

fn wit_capability(c: Capability) -> WitCapability {
    match c {
        Capability::Embed => WitCapability::Embed,
        Capability::Judge => WitCapability::Judge,
        Capability::ConfigSecret => WitCapability::ConfigSecret,
    }
}

fn wit_error(e: CallError) -> CapabilityError {
    match e {
        CallError::NotGranted { capability, message } => CapabilityError::NotGranted(Denial {
            capability: wit_capability(capability),
            config_key: capabilities::GRANTS_KEY.to_owned(),
            message,
        }),
        CallError::BudgetExhausted(m) => CapabilityError::BudgetExhausted(m),
        CallError::OverLimit(m) => CapabilityError::OverLimit(m),
        CallError::Unavailable(m) => CapabilityError::Unavailable(m),
    }
}

/// `embed`'s texts, counted and each read up to its limit.
type Texts = CappedList<BoundedText<{ capabilities::MAX_EMBED_TEXT_BYTES }>, { capabilities::MAX_EMBED_TEXTS }>;

impl Texts {
    /// What was passed, in a few words.
    fn asked(&self) -> String {
        match self {
            CappedList::Items(items) => format!(
                "{} text{}, {} bytes",
                items.len(),
                if items.len() == 1 { "" } else { "s" },
                items.iter().map(|t| t.len).sum::<usize>()
            ),
            CappedList::TooMany(n) => format!("{n} texts"),
        }
    }

    fn into_texts(self) -> Result<Vec<String>, CallError> {
        let texts = self.items().map_err(|n| {
            CallError::OverLimit(format!(
                "embed was given {n} texts; one call takes at most {}: embed them in several calls",
                capabilities::MAX_EMBED_TEXTS
            ))
        })?;
        texts
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.len > capabilities::MAX_EMBED_TEXT_BYTES {
                    Err(CallError::OverLimit(format!(
                        "text {i} given to embed is {} bytes; the limit is {} bytes ({} KiB): split or clip it",
                        t.len,
                        capabilities::MAX_EMBED_TEXT_BYTES,
                        capabilities::MAX_EMBED_TEXT_BYTES / 1024
                    )))
                } else {
                    Ok(t.text)
                }
            })
            .collect()
    }
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawExample {
    content: BoundedText<{ capabilities::MAX_EXAMPLE_BYTES }>,
    score: f64,
    reasoning: BoundedText<{ capabilities::MAX_EXAMPLE_BYTES }>,
}

/// `judge-request`, copied within the judge's limits.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawJudgeRequest {
    rubric: BoundedText<{ capabilities::MAX_JUDGE_TEXT_BYTES }>,
    content: BoundedText<{ capabilities::MAX_JUDGE_TEXT_BYTES }>,
    context: Option<BoundedText<{ capabilities::MAX_JUDGE_TEXT_BYTES }>>,
    examples: CappedList<RawExample, { capabilities::MAX_JUDGE_EXAMPLES }>,
}

impl RawJudgeRequest {
    fn into_request(self) -> Result<JudgeRequest, CallError> {
        let too_long = |what: &str, len: usize, max: usize| {
            CallError::OverLimit(format!("the judge request's {what} is {len} bytes; the limit is {max} bytes"))
        };
        let text = |what: &str, t: BoundedText<{ capabilities::MAX_JUDGE_TEXT_BYTES }>| {
            if t.len > capabilities::MAX_JUDGE_TEXT_BYTES {
                Err(too_long(what, t.len, capabilities::MAX_JUDGE_TEXT_BYTES))
            } else {
                Ok(t.text)
            }
        };
        let examples = self.examples.items().map_err(|n| {
            CallError::OverLimit(format!(
                "the judge request has {n} examples; the limit is {}",
                capabilities::MAX_JUDGE_EXAMPLES
            ))
        })?;
        let examples = examples
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let max = capabilities::MAX_EXAMPLE_BYTES;
                if e.content.len > max || e.reasoning.len > max {
                    return Err(too_long(&format!("example {i}"), e.content.len.max(e.reasoning.len), max));
                }
                if !e.score.is_finite() || !(0.0..=1.0).contains(&e.score) {
                    return Err(CallError::OverLimit(format!(
                        "the judge request's example {i} has score {}; scores are from 0.0 to 1.0",
                        e.score
                    )));
                }
                Ok(capabilities::Example {
                    content: e.content.text,
                    score: e.score,
                    reasoning: e.reasoning.text,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(JudgeRequest {
            rubric: text("rubric", self.rubric)?,
            content: text("content", self.content)?,
            context: self.context.map(|c| text("context", c)).transpose()?,
            examples,
        })
    }
}

/// `capability`; its values are made by the lift, never by name.
#[derive(ComponentType, Lift, Clone, Copy)]
#[component(enum)]
#[repr(u8)]
#[allow(dead_code)]
enum RawCapability {
    #[component(name = "embed")]
    Embed,
    #[component(name = "judge")]
    Judge,
    #[component(name = "config-secret")]
    ConfigSecret,
}

/// Most capabilities a `plugin-info` may list (each at most once counts).
const MAX_LISTED_CAPABILITIES: usize = 16;

/// `plugin-info`, copied within bounds.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawInfo {
    id: BoundedText<MAX_INFO_BYTES>,
    version: BoundedText<MAX_INFO_BYTES>,
    description: BoundedText<MAX_INFO_BYTES>,
    #[component(name = "config-schema")]
    config_schema: BoundedText<MAX_SCHEMA_BYTES>,
    capabilities: CappedList<RawCapability, MAX_LISTED_CAPABILITIES>,
}

/// Calls `describe`.
pub fn describe(store: &mut Store<State>, instance: &Instance, export: &ComponentExportIndex) -> wasmtime::Result<Result<Info, Fault>> {
    let func = instance.get_typed_func::<(), (RawInfo,)>(&mut *store, export)?;
    let (raw,) = func.call(&mut *store, ())?;
    let Ok(listed) = raw.capabilities.items() else {
        return Ok(Err(Fault::TooLarge(format!(
            "lists more than {MAX_LISTED_CAPABILITIES} capabilities; there are {}: list each one once",
            Capability::ALL.len()
        ))));
    };
    let mut capabilities: Vec<Capability> = listed
        .into_iter()
        .map(|c| match c {
            RawCapability::Embed => Capability::Embed,
            RawCapability::Judge => Capability::Judge,
            RawCapability::ConfigSecret => Capability::ConfigSecret,
        })
        .collect();
    capabilities.sort();
    capabilities.dedup();
    let info = Info::bounded(raw.id, raw.version, raw.description, raw.config_schema);
    Ok(info.map(|info| Info { capabilities, ..info }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_released_contract_is_unchanged() {
        super::super::since_v0_1_0::tests::assert_frozen(
            "since_v0.2.0",
            &[(
                "attest-plugin.wit",
                "6068600bc991a477d88e4fb493bda543f046eacf81af924689038ef086b99df9",
            )],
        );
    }
}
