//! `grounding`: is the answer supported by the retrieved documents? The
//! answer is split into sentences; each sentence and each document is
//! embedded by the engine (`models.embed`, the capability `embed`), and a
//! sentence counts as supported when some document is at least
//! `min_similarity` similar to it (cosine). The score is the supported
//! share of sentences; the assertion passes when it reaches `min_supported`.
//!
//! Embeddings go through the engine, so its provider (remote or the local
//! model), cache, cost accounting and budget apply; the operator grants
//! `embed` to this plugin in the engine's config file.

use attest_plugin_sdk::models::{self, Capability};
use attest_plugin_sdk::serde_json;
use attest_plugin_sdk::text::{clip, num, quote};
use attest_plugin_sdk::{json, resolve_or_fail, AssertionPlugin, PluginError, PluginInfo, Target, Trace, Verdict};
use serde::Deserialize;

pub struct Grounding;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_answer")]
    pub answer: Target,
    pub documents: Target,
    #[serde(default = "default_min_similarity")]
    pub min_similarity: f64,
    #[serde(default = "default_min_supported")]
    pub min_supported: f64,
}

fn default_answer() -> Target {
    Target::parse("output.message").expect("the default target parses")
}
fn default_min_similarity() -> f64 {
    0.6
}
fn default_min_supported() -> f64 {
    0.8
}

/// Sentences of the answer that are judged; the rest are not.
pub const MAX_SENTENCES: usize = 32;
/// Documents compared against; the rest are not.
pub const MAX_DOCUMENTS: usize = 32;
/// Longest sentence or document embedded, in characters (the engine takes
/// up to 32 KiB per text).
const MAX_TEXT_CHARS: usize = 8000;
/// Texts per `embed` call (the engine's limit).
const EMBED_BATCH: usize = 64;

/// The answer's sentences: split after `.`, `!` or `?` followed by
/// whitespace, and on line breaks; fragments without a letter are dropped.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            push_sentence(&mut out, &mut current);
            continue;
        }
        current.push(c);
        if matches!(c, '.' | '!' | '?') && chars.peek().is_none_or(|n| n.is_whitespace()) {
            push_sentence(&mut out, &mut current);
        }
    }
    push_sentence(&mut out, &mut current);
    out
}

fn push_sentence(out: &mut Vec<String>, current: &mut String) {
    let s = current.trim();
    if s.chars().any(char::is_alphabetic) {
        out.push(clip(s, MAX_TEXT_CHARS));
    }
    current.clear();
}

/// The documents' texts: a string is one document; a list gives one per
/// item; an object's string fields (`content`, `text`, …) are read in order.
pub fn documents(value: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    collect(value, &mut out, 0);
    out
}

fn collect(value: &serde_json::Value, out: &mut Vec<String>, depth: usize) {
    if out.len() >= MAX_DOCUMENTS || depth > 8 {
        return;
    }
    match value {
        serde_json::Value::String(s) if !s.trim().is_empty() => out.push(clip(s.trim(), MAX_TEXT_CHARS)),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, out, depth + 1)),
        serde_json::Value::Object(map) => {
            // One document per object: its text fields, joined.
            let text: Vec<&str> = map.values().filter_map(|v| v.as_str()).filter(|s| !s.trim().is_empty()).collect();
            if !text.is_empty() {
                out.push(clip(&text.join("\n"), MAX_TEXT_CHARS));
            } else {
                map.values().for_each(|v| collect(v, out, depth + 1));
            }
        }
        _ => {}
    }
}

/// Embeds `texts` in as many calls as the engine's per-call limit needs.
fn embed_all(texts: &[&str]) -> Result<Vec<Vec<f32>>, models::CapabilityError> {
    let mut vectors = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(EMBED_BATCH) {
        vectors.extend(models::embed(chunk)?);
    }
    Ok(vectors)
}

impl AssertionPlugin for Grounding {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo::new("grounding", env!("CARGO_PKG_VERSION"))
            .description(
                "Scores how well an answer is supported by the retrieved documents, sentence by sentence, with the engine's embeddings.",
            )
            .config_schema(include_str!("../config.schema.json"))
            .requests(Capability::Embed)
    }

    fn evaluate(trace: &Trace, config: &Config) -> Result<Verdict, PluginError> {
        let (a, d) = (&config.answer, &config.documents);
        let answer = resolve_or_fail!(a, trace);
        let docs_value = resolve_or_fail!(d, trace);
        let mut all = sentences(&json::text(&answer));
        let judged = all.len().min(MAX_SENTENCES);
        all.truncate(MAX_SENTENCES);
        let docs = documents(&docs_value);
        if all.is_empty() {
            return Ok(Verdict::fail(format!("{a} has no sentence to check against {d}.")));
        }
        if docs.is_empty() {
            return Ok(
                Verdict::fail(format!("{d} holds no document text, so nothing in {a} can be supported."))
                    .with_details(serde_json::json!({"expected": format!("document text at {d}"), "actual": "none", "path": d.as_str()})),
            );
        }
        let texts: Vec<&str> = all.iter().chain(docs.iter()).map(String::as_str).collect();
        let vectors = embed_all(&texts)?;
        let (sentence_vecs, doc_vecs) = vectors.split_at(all.len());
        let mut rows = Vec::with_capacity(all.len());
        let mut supported = 0usize;
        let mut weakest: Option<(usize, f64)> = None;
        for (i, s) in sentence_vecs.iter().enumerate() {
            let (best, sim) = doc_vecs
                .iter()
                .enumerate()
                .map(|(j, v)| (j, models::cosine(s, v)))
                .fold((0, f64::MIN), |acc, x| if x.1 > acc.1 { x } else { acc });
            let ok = sim >= config.min_similarity;
            supported += usize::from(ok);
            if weakest.is_none_or(|(_, w)| sim < w) {
                weakest = Some((i, sim));
            }
            rows.push(serde_json::json!({
                "sentence": clip(&all[i], 160),
                "best_document": best,
                "similarity": (sim * 1000.0).round() / 1000.0,
                "supported": ok,
            }));
        }
        let score = supported as f64 / judged as f64;
        let passed = score >= config.min_supported;
        let (wi, ws) = weakest.unwrap_or((0, 0.0));
        let mut explanation = format!(
            "{supported} of {judged} sentences of {a} are supported by {} (similarity ≥ {}); needed {}% supported.",
            if docs.len() == 1 {
                format!("the document at {d}")
            } else {
                format!("one of {} documents at {d}", docs.len())
            },
            num(config.min_similarity),
            num((config.min_supported * 100.0).round())
        );
        if !passed {
            explanation.push_str(&format!(
                " Least supported: {} (similarity {}).",
                quote(&clip(&all[wi], 120)),
                num((ws * 1000.0).round() / 1000.0)
            ));
        }
        Ok(Verdict::from_bool(passed, explanation)
            .with_score(score)
            .with_details(serde_json::json!({
                "expected": format!("≥ {}% of sentences supported", num((config.min_supported * 100.0).round())),
                "actual": format!("{supported} of {judged}"),
                "path": a.as_str(),
                "sentences": rows.into_iter().take(8).collect::<Vec<_>>(),
            })))
    }
}

attest_plugin_sdk::export_plugin!(Grounding);

#[cfg(test)]
mod tests {
    use super::*;
    use attest_plugin_sdk::serde_json::json;
    use attest_plugin_sdk::testing::{self, FakeHost};

    /// Word-bag vectors: sentences sharing words with a document are similar.
    fn bag(texts: &[&str]) -> Result<Vec<Vec<f32>>, models::CapabilityError> {
        const WORDS: [&str; 8] = ["refund", "days", "30", "receipt", "shipping", "free", "mars", "colony"];
        Ok(texts
            .iter()
            .map(|t| {
                let t = t.to_lowercase();
                WORDS.iter().map(|w| if t.contains(w) { 1.0 } else { 0.0 }).collect()
            })
            .collect())
    }

    fn trace(answer: &str) -> serde_json::Value {
        json!({"schema_version": 1, "trace_id": "t", "output": {"message": answer},
               "steps": [{"type": "retrieval", "name": "kb", "result": {"documents": [
                   {"id": "d1", "content": "Refunds are accepted within 30 days with a receipt."},
                   {"id": "d2", "content": "Shipping is free over $50."}]}}]})
    }

    const DOCS: &str = "steps[?name=='kb'].result.documents";

    #[test]
    fn describes_itself_and_requests_embed() {
        let schema = testing::check_info::<Grounding>();
        assert_eq!(schema["required"], json!(["documents"]));
        assert_eq!(Grounding::info().capabilities, vec![Capability::Embed]);
        for config in testing::readme_configs(include_str!("../README.md"), "grounding") {
            testing::validate_config::<Grounding>(&config).unwrap();
        }
    }

    #[test]
    fn supported_answers_pass_and_unsupported_sentences_fail() {
        let host = FakeHost::new().embed(bag);
        let good = testing::evaluate::<Grounding>(
            &trace("Refunds take 30 days with a receipt. Shipping is free."),
            &json!({"documents": DOCS}),
        )
        .unwrap();
        assert!(good.is_pass(), "{}", good.explanation());
        assert_eq!(good.score(), 1.0);
        let bad = testing::evaluate::<Grounding>(
            &trace("Refunds take 30 days with a receipt. We also run a Mars colony!"),
            &json!({"documents": DOCS}),
        )
        .unwrap();
        assert!(!bad.is_pass());
        assert_eq!(bad.score(), 0.5);
        assert!(
            bad.explanation().contains("Least supported: 'We also run a Mars colony!'"),
            "{}",
            bad.explanation()
        );
        assert_eq!(host.calls().len(), 2, "one embed call per evaluation");
    }

    #[test]
    fn missing_documents_fail_and_a_refused_embed_is_an_error() {
        let _host = FakeHost::new().embed(bag);
        let v = testing::evaluate::<Grounding>(&trace("Refunds."), &json!({"documents": "steps[?name=='none'].result"})).unwrap();
        assert!(
            !v.is_pass() && v.explanation().contains("could not be checked"),
            "{}",
            v.explanation()
        );
        drop(_host);
        let _none = FakeHost::new();
        let e = testing::evaluate::<Grounding>(&trace("Refunds take 30 days."), &json!({"documents": DOCS})).unwrap_err();
        assert!(
            matches!(e, PluginError::Internal(ref m) if m.contains("'embed' is not granted")),
            "{e:?}"
        );
    }

    #[test]
    fn sentences_split_on_terminators_and_lines() {
        assert_eq!(
            sentences("One. Two! Three?\nFour 3.5 five"),
            ["One.", "Two!", "Three?", "Four 3.5 five"]
        );
        assert!(sentences("... --- 42").is_empty());
        assert_eq!(documents(&json!(["a", {"content": "b", "n": 1}, 3, ""])), ["a", "b"]);
    }
}
