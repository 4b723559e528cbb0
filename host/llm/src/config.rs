//! A pretrained model's hyper-parameters, read from its file: GGUF metadata
//! or a Hugging Face `config.json`. Nothing here is known per model; the two
//! families differ only in what their files say (Qwen2 has biases on q, k
//! and v; either may tie the output layer to the embedding).

use crate::gguf::{Gguf, Value};
use anyhow::{Context, Result, bail, ensure};
use burn::prelude::*;
use serde_json::Value as Json;

/// Which family's tensor names and conventions a file follows.
#[derive(Config, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM, TinyLlama, Mistral-style dense models.
    Llama,
    /// Qwen2 and Qwen2.5.
    Qwen2,
}

/// The decoder's shape. `LlmConfig::init` builds a randomly initialised
/// model of it (the loading tests use that); loaders fill the weights.
#[derive(Config, Debug, PartialEq)]
pub struct LlmConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// The longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// The output layer is the embedding matrix (SmolLM2, Qwen2.5-0.5B).
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub attention_bias: bool,
    /// Per-frequency divisors of the rotary frequencies (Llama 3.1+'s
    /// long-context scaling), one per pair of head channels; `None` for
    /// plain RoPE.
    pub rope_freq_divisors: Option<Vec<f32>>,
}

impl LlmConfig {
    /// Parameters in the network (without the value head).
    pub fn parameter_count(&self) -> usize {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        let (q, kv) = (self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim);
        let bias = if self.attention_bias { q + 2 * kv } else { 0 };
        let layer = d * (q + 2 * kv) + bias + q * d + 3 * d * f + 2 * d;
        let output = if self.tie_word_embeddings { 0 } else { self.vocab_size * d };
        self.vocab_size * d + self.n_layers * layer + d + output
    }

    /// [`parameter_count`](Self::parameter_count) without overflow: `None`
    /// when the shape's arithmetic does not fit in 64 bits.
    fn checked_parameter_count(&self) -> Option<u64> {
        let (d, f) = (self.hidden_size as u64, self.intermediate_size as u64);
        let q = (self.n_heads as u64).checked_mul(self.head_dim as u64)?;
        let kv = (self.n_kv_heads as u64).checked_mul(self.head_dim as u64)?;
        let qkv = q.checked_add(kv.checked_mul(2)?)?;
        let layer = d.checked_mul(qkv)?.checked_add(qkv)?.checked_add(q.checked_mul(d)?)?.checked_add(d.checked_mul(f)?.checked_mul(3)?)?;
        let embedding = (self.vocab_size as u64).checked_mul(d)?;
        embedding.checked_mul(2)?.checked_add((self.n_layers as u64).checked_mul(layer.checked_add(d.checked_mul(2)?)?)?)
    }

    /// Refuse a shape no model has: the file is damaged or not a model.
    /// Every number is read from a file someone else wrote, and everything
    /// after this allocates by them.
    fn check(self) -> Result<Self> {
        let bounded = [
            ("vocabulary size", self.vocab_size, 1 << 24),
            ("hidden size", self.hidden_size, 1 << 17),
            ("feed-forward size", self.intermediate_size, 1 << 20),
            ("layer count", self.n_layers, 1 << 12),
            ("attention head count", self.n_heads, 1 << 12),
            ("key/value head count", self.n_kv_heads, 1 << 12),
            ("head width", self.head_dim, 1 << 12),
            ("context length", self.max_position_embeddings, 1 << 26),
        ];
        for (what, value, most) in bounded {
            ensure!((1..=most).contains(&value), "the model's {what} is {value}, outside 1 to {most}: the file is damaged or not a model");
        }
        ensure!(
            self.rope_theta.is_finite() && self.rope_theta > 0.0,
            "the rotary base is {}, not a positive number: the file is damaged",
            self.rope_theta
        );
        ensure!(
            self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0,
            "the norm epsilon is {}, not a small positive number: the file is damaged",
            self.rms_norm_eps
        );
        ensure!(
            self.checked_parameter_count().is_some_and(|n| n <= 1 << 40),
            "a model of this shape would have over 10^12 parameters: the file is damaged or not a model ({self:?})"
        );
        ensure!(
            self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads),
            "{} attention heads cannot share {} key/value heads evenly",
            self.n_heads,
            self.n_kv_heads
        );
        ensure!(self.head_dim.is_multiple_of(2), "rotary positions need an even head width, not {}", self.head_dim);
        if let Some(divisors) = &self.rope_freq_divisors {
            ensure!(
                divisors.len() == self.head_dim / 2,
                "{} rotary frequency factors for a head width of {}",
                divisors.len(),
                self.head_dim
            );
        }
        Ok(self)
    }

    /// From a GGUF file's `general.architecture` and `{arch}.*` metadata;
    /// which tensors exist decides tying and biases.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let arch = gguf.get("general.architecture").and_then(Value::as_str).context("metadata general.architecture is missing")?;
        let architecture = match arch {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => bail!("architecture {other:?} is not supported (llama and qwen2 are)"),
        };
        let key = |name: &str| format!("{arch}.{name}");
        let int = |name: &str| -> Result<usize> {
            gguf.get(&key(name)).and_then(Value::as_u64).map(|v| v as usize).with_context(|| format!("metadata {} is missing", key(name)))
        };
        let float = |name: &str, default: f64| gguf.get(&key(name)).and_then(Value::as_f64).unwrap_or(default);
        let hidden_size = int("embedding_length")?;
        let n_heads = int("attention.head_count")?;
        let tokens = gguf.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(<[Value]>::len);
        let vocab_size =
            int("vocab_size").ok().or(tokens).context("neither metadata vocab_size nor tokenizer.ggml.tokens gives the vocabulary")?;
        let rope_freq_divisors =
            if gguf.tensors.contains_key("rope_freqs.weight") { Some(gguf.tensor_f32("rope_freqs.weight")?) } else { None };
        Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: int("feed_forward_length")?,
            n_layers: int("block_count")?,
            n_heads,
            n_kv_heads: int("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: int("attention.key_length").unwrap_or(hidden_size / n_heads.max(1)),
            rope_theta: float("rope.freq_base", 10_000.0),
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-5),
            max_position_embeddings: int("context_length")?,
            tie_word_embeddings: !gguf.tensors.contains_key("output.weight"),
            attention_bias: gguf.tensors.contains_key("blk.0.attn_q.bias"),
            rope_freq_divisors,
        }
        .check()
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf_json(json: &Json) -> Result<Self> {
        let model_type = json["model_type"].as_str().context("config.json has no model_type")?;
        let architecture = match model_type {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => bail!("model_type {other:?} is not supported (llama and qwen2 are)"),
        };
        let int = |name: &str| json[name].as_u64().map(|v| v as usize).with_context(|| format!("config.json has no {name}"));
        let hidden_size = int("hidden_size")?;
        let n_heads = int("num_attention_heads")?;
        let head_dim = int("head_dim").unwrap_or(hidden_size / n_heads.max(1));
        // transformers 5 moves rope_theta and rope_scaling under rope_parameters.
        let rope = if json["rope_parameters"].is_object() { &json["rope_parameters"] } else { &json["rope_scaling"] };
        let rope_theta = json["rope_theta"].as_f64().or(rope["rope_theta"].as_f64()).unwrap_or(10_000.0);
        let rope_freq_divisors = match rope["rope_type"].as_str().or(rope["type"].as_str()) {
            None | Some("default") => None,
            Some("llama3") => Some(llama3_divisors(rope, head_dim, rope_theta)?),
            Some(other) => bail!("rope scaling {other:?} is not supported (llama3 is)"),
        };
        Self {
            architecture,
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            n_layers: int("num_hidden_layers")?,
            n_heads,
            n_kv_heads: int("num_key_value_heads").unwrap_or(n_heads),
            head_dim,
            rope_theta,
            rms_norm_eps: json["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            max_position_embeddings: int("max_position_embeddings")?,
            tie_word_embeddings: json["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: architecture == Architecture::Qwen2 || json["attention_bias"].as_bool().unwrap_or(false),
            rope_freq_divisors,
        }
        .check()
    }

    /// The rotary frequencies `θ^(-2i/k)` for each channel pair `i`, divided
    /// by the model's per-frequency factors if it has them.
    pub fn inv_frequencies(&self) -> Vec<f32> {
        let k = self.head_dim;
        (0..k / 2)
            .map(|i| {
                let f = (self.rope_theta.powf(-(2.0 * i as f64) / k as f64)) as f32;
                self.rope_freq_divisors.as_ref().map_or(f, |d| f / d[i])
            })
            .collect()
    }
}

/// Llama 3.1's long-context rotary scaling as divisors: low frequencies are
/// divided by `factor`, high ones kept, and the band between blended.
fn llama3_divisors(rope: &Json, head_dim: usize, theta: f64) -> Result<Vec<f32>> {
    let get = |name: &str| rope[name].as_f64().with_context(|| format!("config.json's llama3 rope scaling has no {name}"));
    let (factor, low, high, original) =
        (get("factor")?, get("low_freq_factor")?, get("high_freq_factor")?, get("original_max_position_embeddings")?);
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    Ok((0..head_dim / 2)
        .map(|i| {
            let freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let scaled = if wavelen < high_wavelen {
                freq
            } else if wavelen > low_wavelen {
                freq / factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 - smooth) * freq / factor + smooth * freq
            };
            (freq / scaled) as f32
        })
        .collect())
}
