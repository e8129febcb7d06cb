//! A BERT encoder's forward pass, written for one thing: sentence embeddings
//! on a CPU, one pass at a time per thread.
//!
//! A general tensor library pays, on every pass, for what this model never
//! needs: a fresh buffer per operation (the kernel zeroing pages was a tenth
//! of the pass), element-wise operations as separate sweeps, a scalar `erf`
//! and `exp`, and padding every text of a batch to the longest. Here:
//! - the texts of a call are packed end to end, so the dense layers multiply
//!   every token of every text at once with no padding, and attention runs
//!   per text, where no mask is needed;
//! - Q, K and V are one matrix product;
//! - bias, residual, GELU and softmax are fused into one sweep each, with
//!   vectorised `erf` and `exp` (AVX2+FMA when the CPU has it, chosen at run
//!   time);
//! - activations live in buffers each inference thread keeps, bounded by
//!   [`MAX_PACKED_TOKENS`].
//!
//! Matrix products go through `gemm`, single-threaded: the engine runs one
//! pass per core (local.rs), and a pool inside each pass only spins.
//! Scores agree with the reference implementation to 1e-6 (tests below, and
//! `scripts/bench_embeddings.py` against ONNX Runtime).

use anyhow::{bail, Context, Result};
use std::cell::RefCell;
use std::path::Path;

/// Most tokens one packed pass holds (the texts of a call are split across
/// passes beyond it): bounds each inference thread's buffers to about
/// 16 MiB for MiniLM.
pub const MAX_PACKED_TOKENS: usize = 1024;

/// The fields of `config.json` the pass needs.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    #[serde(default = "layer_norm_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "gelu")]
    pub hidden_act: String,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn two() -> usize {
    2
}
fn layer_norm_eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}
fn absolute() -> String {
    "absolute".into()
}

struct Linear {
    /// `out × inp`, row-major, as PyTorch stores it.
    weight: Vec<f32>,
    bias: Vec<f32>,
    inp: usize,
    out: usize,
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

struct Layer {
    /// Q, K and V stacked: `3·hidden × hidden`.
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    intermediate: Linear,
    output: Linear,
    output_norm: Norm,
}

pub struct Bert {
    hidden: usize,
    heads: usize,
    eps: f32,
    max_positions: usize,
    vocab: usize,
    type_vocab: usize,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
}

/// One text, tokenised.
pub struct Sequence<'a> {
    pub ids: &'a [u32],
    pub type_ids: &'a [u32],
}

/// The weights file, read whole and handed out tensor by tensor.
struct Weights<'a> {
    tensors: safetensors::SafeTensors<'a>,
    /// `"bert."` when the weights come from a model with a head.
    prefix: &'static str,
}

impl Weights<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .tensors
            .tensor(&full)
            .with_context(|| format!("model.safetensors has no tensor {full}"))?;
        if t.dtype() != safetensors::Dtype::F32 {
            bail!("tensor {full} is {:?}; this runtime reads F32 weights", t.dtype());
        }
        if t.shape() != shape {
            bail!("tensor {full} has shape {:?}, config.json implies {shape:?}", t.shape());
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            weight: self.get(&format!("{name}.weight"), &[out, inp])?,
            bias: self.get(&format!("{name}.bias"), &[out])?,
            inp,
            out,
        })
    }

    fn norm(&self, name: &str, dim: usize) -> Result<Norm> {
        Ok(Norm {
            gamma: self.get(&format!("{name}.weight"), &[dim])?,
            beta: self.get(&format!("{name}.bias"), &[dim])?,
        })
    }
}

impl Bert {
    pub fn load(config: &Config, weights_file: &Path) -> Result<Bert> {
        if config.hidden_act != "gelu" {
            bail!(
                "config.json's hidden_act is {:?}; this runtime runs BERT models with the exact \"gelu\"",
                config.hidden_act
            );
        }
        if config.position_embedding_type != "absolute" {
            bail!(
                "config.json's position_embedding_type is {:?}; this runtime runs \"absolute\"",
                config.position_embedding_type
            );
        }
        let (h, i) = (config.hidden_size, config.intermediate_size);
        if config.num_attention_heads == 0 || h % config.num_attention_heads != 0 {
            bail!(
                "config.json's hidden_size {h} is not a multiple of num_attention_heads {}",
                config.num_attention_heads
            );
        }
        let bytes = std::fs::read(weights_file).with_context(|| format!("cannot read {}", weights_file.display()))?;
        let tensors = safetensors::SafeTensors::deserialize(&bytes).context("model.safetensors is not a safetensors file")?;
        let prefix = if tensors.tensor("embeddings.word_embeddings.weight").is_ok() {
            ""
        } else {
            "bert."
        };
        let w = Weights { tensors, prefix };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let at = |s: &str| format!("encoder.layer.{l}.{s}");
            let (q, k, v) = (
                w.linear(&at("attention.self.query"), h, h)?,
                w.linear(&at("attention.self.key"), h, h)?,
                w.linear(&at("attention.self.value"), h, h)?,
            );
            let qkv = Linear {
                weight: [q.weight, k.weight, v.weight].concat(),
                bias: [q.bias, k.bias, v.bias].concat(),
                inp: h,
                out: 3 * h,
            };
            layers.push(Layer {
                qkv,
                attention_out: w.linear(&at("attention.output.dense"), h, h)?,
                attention_norm: w.norm(&at("attention.output.LayerNorm"), h)?,
                intermediate: w.linear(&at("intermediate.dense"), i, h)?,
                output: w.linear(&at("output.dense"), h, i)?,
                output_norm: w.norm(&at("output.LayerNorm"), h)?,
            });
        }
        Ok(Bert {
            hidden: h,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps as f32,
            max_positions: config.max_position_embeddings,
            vocab: config.vocab_size,
            type_vocab: config.type_vocab_size,
            word: w.get("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            position: w.get("embeddings.position_embeddings.weight", &[config.max_position_embeddings, h])?,
            token_type: w.get("embeddings.token_type_embeddings.weight", &[config.type_vocab_size, h])?,
            embedding_norm: w.norm("embeddings.LayerNorm", h)?,
            layers,
        })
    }

    /// The attention-masked mean of the last hidden states of each text,
    /// L2-normalised (sentence-transformers' pooling and `Normalize`).
    pub fn embed(&self, sequences: &[Sequence]) -> Result<Vec<Vec<f32>>> {
        for s in sequences {
            if s.ids.len() != s.type_ids.len() {
                bail!("token and type ids differ in length");
            }
            if s.ids.len() > self.max_positions.min(MAX_PACKED_TOKENS) {
                bail!(
                    "a text of {} tokens is longer than the model's {} positions",
                    s.ids.len(),
                    self.max_positions
                );
            }
            if let Some(id) = s.ids.iter().find(|&&id| id as usize >= self.vocab) {
                bail!("token id {id} is outside the model's vocabulary of {}", self.vocab);
            }
            if let Some(t) = s.type_ids.iter().find(|&&t| t as usize >= self.type_vocab) {
                bail!("token type {t} is outside the model's {} types", self.type_vocab);
            }
        }
        let mut out = Vec::with_capacity(sequences.len());
        let mut start = 0;
        while start < sequences.len() {
            // As many texts as fit one packed pass (at least one).
            let mut end = start + 1;
            let mut tokens = sequences[start].ids.len();
            while end < sequences.len() && tokens + sequences[end].ids.len() <= MAX_PACKED_TOKENS {
                tokens += sequences[end].ids.len();
                end += 1;
            }
            SCRATCH.with(|s| self.pass(&sequences[start..end], &mut s.borrow_mut(), &mut out));
            start = end;
        }
        Ok(out)
    }

    fn pass(&self, seqs: &[Sequence], s: &mut Scratch, out: &mut Vec<Vec<f32>>) {
        let h = self.hidden;
        let tokens: usize = seqs.iter().map(|q| q.ids.len()).sum();
        let inter = self.layers.first().map_or(0, |l| l.intermediate.out);
        // Attention runs one text at a time: its scores need the longest
        // text squared, not the whole pass's tokens squared.
        let longest = seqs.iter().map(|q| q.ids.len()).max().unwrap_or(0);
        s.fit(tokens, longest, h, inter);
        let Scratch {
            hidden,
            qkv,
            context,
            attended,
            wide,
            scores,
        } = s;
        let hidden = &mut hidden[..tokens * h];

        let mut row = 0;
        for q in seqs {
            for (p, (&id, &ty)) in q.ids.iter().zip(q.type_ids).enumerate() {
                let dst = &mut hidden[row * h..(row + 1) * h];
                let (w, pe, te) = (
                    &self.word[id as usize * h..][..h],
                    &self.position[p * h..][..h],
                    &self.token_type[ty as usize * h..][..h],
                );
                for j in 0..h {
                    dst[j] = w[j] + pe[j] + te[j];
                }
                row += 1;
            }
        }
        kernels::layer_norm(hidden, None, h, &self.embedding_norm.gamma, &self.embedding_norm.beta, self.eps);

        let head = h / self.heads;
        let scale = 1.0 / (head as f32).sqrt();
        for layer in &self.layers {
            let qkv = &mut qkv[..tokens * 3 * h];
            linear(&layer.qkv, hidden, tokens, qkv);
            let context = &mut context[..tokens * h];
            let mut offset = 0;
            for q in seqs {
                let len = q.ids.len();
                let scores = &mut scores[..len * len];
                for hd in 0..self.heads {
                    let base = offset * 3 * h + hd * head;
                    // scores = scale · Q Kᵀ over this text's tokens.
                    // SAFETY: every index the product reads lies in `qkv`
                    // (rows offset..offset+len, columns of this head's Q and
                    // K) and every one it writes in `scores` (len × len).
                    unsafe {
                        gemm::gemm(
                            len,
                            len,
                            head,
                            scores.as_mut_ptr(),
                            1,
                            len as isize,
                            false,
                            qkv.as_ptr().add(base),
                            1,
                            3 * h as isize,
                            qkv.as_ptr().add(base + h),
                            3 * h as isize,
                            1,
                            0.0,
                            scale,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        );
                    }
                    for r in scores.chunks_exact_mut(len) {
                        kernels::softmax(r);
                    }
                    // context = scores · V, into this head's columns.
                    // SAFETY: reads `scores` (len × len) and this head's V
                    // columns of rows offset..offset+len of `qkv`; writes
                    // this head's columns of the same rows of `context`.
                    unsafe {
                        gemm::gemm(
                            len,
                            head,
                            len,
                            context.as_mut_ptr().add(offset * h + hd * head),
                            1,
                            h as isize,
                            false,
                            scores.as_ptr(),
                            1,
                            len as isize,
                            qkv.as_ptr().add(base + 2 * h),
                            1,
                            3 * h as isize,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        );
                    }
                }
                offset += len;
            }
            let attended = &mut attended[..tokens * h];
            linear(&layer.attention_out, context, tokens, attended);
            kernels::layer_norm(
                attended,
                Some(&*hidden),
                h,
                &layer.attention_norm.gamma,
                &layer.attention_norm.beta,
                self.eps,
            );
            let wide = &mut wide[..tokens * inter];
            linear(&layer.intermediate, attended, tokens, wide);
            kernels::gelu(wide);
            linear(&layer.output, wide, tokens, hidden);
            kernels::layer_norm(
                hidden,
                Some(&*attended),
                h,
                &layer.output_norm.gamma,
                &layer.output_norm.beta,
                self.eps,
            );
        }

        let mut row = 0;
        for q in seqs {
            let len = q.ids.len();
            let mut mean = vec![0f32; h];
            for t in 0..len {
                for (m, x) in mean.iter_mut().zip(&hidden[(row + t) * h..][..h]) {
                    *m += x;
                }
            }
            row += len;
            let count = (len as f32).max(1e-9);
            mean.iter_mut().for_each(|m| *m /= count);
            let norm = mean.iter().map(|m| m * m).sum::<f32>().sqrt().max(1e-12);
            mean.iter_mut().for_each(|m| *m /= norm);
            out.push(mean);
        }
    }
}

/// `y = x·Wᵀ + b` for `rows` rows.
fn linear(l: &Linear, x: &[f32], rows: usize, y: &mut [f32]) {
    assert!(x.len() >= rows * l.inp && y.len() >= rows * l.out);
    for r in y[..rows * l.out].chunks_exact_mut(l.out) {
        r.copy_from_slice(&l.bias);
    }
    // SAFETY: the assertion above keeps every read of `x` (rows × inp,
    // row-major) and write of `y` (rows × out) in bounds; the weight is
    // read transposed in place (out × inp, row-major).
    unsafe {
        gemm::gemm(
            rows,
            l.out,
            l.inp,
            y.as_mut_ptr(),
            1,
            l.out as isize,
            true,
            x.as_ptr(),
            1,
            l.inp as isize,
            l.weight.as_ptr(),
            l.inp as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The activations of one pass, kept by each inference thread so that a
/// pass reuses the pages of the last instead of faulting in fresh ones.
#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    attended: Vec<f32>,
    wide: Vec<f32>,
    scores: Vec<f32>,
}

impl Scratch {
    fn fit(&mut self, tokens: usize, longest: usize, hidden: usize, inter: usize) {
        let grow = |v: &mut Vec<f32>, n: usize| {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        };
        grow(&mut self.hidden, tokens * hidden);
        grow(&mut self.qkv, tokens * 3 * hidden);
        grow(&mut self.context, tokens * hidden);
        grow(&mut self.attended, tokens * hidden);
        grow(&mut self.wide, tokens * inter);
        grow(&mut self.scores, longest * longest);
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// The element-wise sweeps, each compiled twice: for the baseline CPU and
/// with AVX2+FMA, picked once per call by what the CPU has.
mod kernels {
    macro_rules! dispatch {
        ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $body:block)*) => {$(
            $(#[$doc])*
            pub fn $name($($arg: $ty),*) {
                #[inline(always)]
                fn imp($($arg: $ty),*) $body
                #[cfg(target_arch = "x86_64")]
                {
                    #[target_feature(enable = "avx2,fma")]
                    fn avx2($($arg: $ty),*) {
                        imp($($arg),*)
                    }
                    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                        // SAFETY: the CPU has the features `avx2` was compiled for.
                        return unsafe { avx2($($arg),*) };
                    }
                }
                imp($($arg),*)
            }
        )*};
    }

    /// `xs` folded into eight independent accumulators: a float reduction
    /// the compiler may not reorder, written so that it vectorises.
    #[inline(always)]
    fn lanes(xs: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> [f32; 8] {
        let mut acc = [init; 8];
        let chunks = xs.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for i in 0..8 {
                acc[i] = f(acc[i], c[i]);
            }
        }
        for (i, &x) in tail.iter().enumerate() {
            acc[i] = f(acc[i], x);
        }
        acc
    }

    #[inline(always)]
    fn sum(xs: &[f32]) -> f32 {
        lanes(xs, 0.0, |a, x| a + x).iter().sum()
    }

    dispatch! {
        /// `x · Φ(x)` with the exact normal CDF, as BERT was trained.
        fn gelu(xs: &mut [f32]) {
            for x in xs.iter_mut() {
                *x = 0.5 * *x * (1.0 + super::erf(*x * std::f32::consts::FRAC_1_SQRT_2));
            }
        }

        /// Softmax of one row, in place.
        fn softmax(xs: &mut [f32]) {
            let max = lanes(xs, f32::NEG_INFINITY, |m, x| m.max(x)).into_iter().fold(f32::NEG_INFINITY, f32::max);
            for x in xs.iter_mut() {
                *x = super::exp(*x - max);
            }
            let inv = 1.0 / sum(xs);
            xs.iter_mut().for_each(|x| *x *= inv);
        }

        /// Each row of `xs` (plus the same row of `residual`) normalised to
        /// zero mean and unit variance, then scaled and shifted.
        fn layer_norm(xs: &mut [f32], residual: Option<&[f32]>, dim: usize, gamma: &[f32], beta: &[f32], eps: f32) {
            for (r, row) in xs.chunks_exact_mut(dim).enumerate() {
                if let Some(res) = residual {
                    for (x, y) in row.iter_mut().zip(&res[r * dim..(r + 1) * dim]) {
                        *x += y;
                    }
                }
                let mean = sum(row) / dim as f32;
                let var = lanes(row, 0.0, |a, x| a + (x - mean) * (x - mean)).iter().sum::<f32>() / dim as f32;
                let inv = 1.0 / (var + eps).sqrt();
                for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                    *x = (*x - mean) * inv * g + b;
                }
            }
        }
    }
}

/// `erf` in single precision, branch-free so that it vectorises: a rational
/// approximation on [-4, 4] (outside it erf is ±1 in f32), within 2 ulp of
/// the correctly rounded value on the range that matters.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    p *= x;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    p / q
}

/// `exp` in single precision, branch-free: 2ⁿ·eʳ with |r| ≤ ln2/2 and a
/// degree-7 polynomial for eʳ, within 2 ulp; inputs below -87 give ~1e-38
/// rather than denormals.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // Adding 1.5·2²³ rounds to the nearest integer and leaves it in the
    // low bits of the sum: no float-to-int conversion, which would not
    // vectorise (Rust's `as` saturates).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.0 / 5040.0_f32;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let two_n = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    p * f32::from_bits(two_n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: erf in double precision.
    fn libm_erf(x: f32) -> f64 {
        libm::erf(x as f64)
    }

    #[test]
    fn erf_is_within_a_few_ulp() {
        let mut worst = 0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let err = (erf(x) as f64 - libm_erf(x)).abs();
            worst = worst.max(err);
            x += 1e-4;
        }
        assert!(worst < 5e-7, "erf is off by {worst}");
    }

    #[test]
    fn exp_is_within_a_few_ulp() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!((got - want).abs() / want < 4e-7, "exp({x}) = {got}, want {want}");
            x += 1e-3;
        }
    }

    #[test]
    fn kernels_agree_with_their_definitions() {
        let mut xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
        let want: Vec<f64> = xs
            .iter()
            .map(|&x| 0.5 * x as f64 * (1.0 + libm_erf(x / std::f32::consts::SQRT_2)))
            .collect();
        kernels::gelu(&mut xs);
        for (g, w) in xs.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-5, "gelu {g} against {w}");
        }
        let mut row = vec![1.0f32, 2.0, 3.0, -100.0];
        kernels::softmax(&mut row);
        let z: f64 = [1f64, 2.0, 3.0, -100.0].iter().map(|x| x.exp()).sum();
        for (g, x) in row.iter().zip([1f64, 2.0, 3.0, -100.0]) {
            assert!((*g as f64 - x.exp() / z).abs() < 1e-7);
        }
        let mut xs = vec![1.0f32, 2.0, 3.0, 4.0];
        kernels::layer_norm(&mut xs, Some(&[1.0, 1.0, 1.0, 1.0]), 4, &[1.0; 4], &[0.5; 4], 1e-12);
        let sd = 1.25f32.sqrt();
        for (g, w) in xs.iter().zip([-1.5 / sd + 0.5, -0.5 / sd + 0.5, 0.5 / sd + 0.5, 1.5 / sd + 0.5]) {
            assert!((g - w).abs() < 1e-6, "{g} against {w}");
        }
    }
}
