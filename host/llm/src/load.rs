//! Weights from a file into an [`Llm`]: one list of the weights a decoder
//! needs, and per format the name each has in the file.
//!
//! Both formats store a matrix as `[out, in]` rows; Burn's `Linear` holds
//! `[in, out]`, so matrices are transposed once here. GGUF files converted
//! by llama.cpp store the q and k projections of Llama models with their
//! rows permuted for ggml's interleaved rotary layout; that permutation is
//! undone so both formats give the same model.

use crate::config::{Architecture, LlmConfig};
use crate::gguf::Gguf;
use crate::model::{LayerQuantized, Llm};
use anyhow::{Context, Result, bail, ensure};
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::prelude::*;
use ragen_ops::QuantMatrix;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A weight of the decoder, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    Embedding,
    FinalNorm,
    Output,
    Layer(usize, Part),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    MlpNorm,
    Gate,
    Up,
    Down,
}

/// Where weights come from: a name per weight, and the values.
pub trait WeightSource {
    /// The weight's name in the file.
    fn name(&self, weight: Weight) -> String;
    /// Whether the file has it.
    fn has(&self, weight: Weight) -> bool;
    /// The values, row-major, and the shape.
    fn read(&self, weight: Weight) -> Result<(Vec<usize>, Vec<f32>)>;
    /// The file, for error messages.
    fn origin(&self) -> &Path;
    /// The weight kept as the file stores it, when that is quantized
    /// (`[rows, cols]` as [`WeightSource::read`] gives it); `None` for
    /// weights stored as floats.
    fn quantized(&self, weight: Weight) -> Result<Option<QuantMatrix>> {
        let _ = weight;
        Ok(None)
    }
}

/// A GGUF file as a weight source.
pub struct GgufWeights<'a> {
    pub gguf: &'a Gguf,
    pub config: &'a LlmConfig,
}

impl GgufWeights<'_> {
    /// The heads whose rows llama.cpp's conversion permuted (a Llama
    /// model's query and key projections), to be put back.
    fn permuted_heads(&self, weight: Weight) -> Option<usize> {
        if self.config.architecture != Architecture::Llama {
            return None;
        }
        match weight {
            Weight::Layer(_, Part::Q) => Some(self.config.n_heads),
            Weight::Layer(_, Part::K) => Some(self.config.n_kv_heads),
            _ => None,
        }
    }
}

impl WeightSource for GgufWeights<'_> {
    fn name(&self, weight: Weight) -> String {
        match weight {
            Weight::Embedding => "token_embd.weight".into(),
            Weight::FinalNorm => "output_norm.weight".into(),
            Weight::Output => "output.weight".into(),
            Weight::Layer(i, part) => {
                let p = match part {
                    Part::AttnNorm => "attn_norm.weight",
                    Part::Q => "attn_q.weight",
                    Part::K => "attn_k.weight",
                    Part::V => "attn_v.weight",
                    Part::O => "attn_output.weight",
                    Part::QBias => "attn_q.bias",
                    Part::KBias => "attn_k.bias",
                    Part::VBias => "attn_v.bias",
                    Part::MlpNorm => "ffn_norm.weight",
                    Part::Gate => "ffn_gate.weight",
                    Part::Up => "ffn_up.weight",
                    Part::Down => "ffn_down.weight",
                };
                format!("blk.{i}.{p}")
            }
        }
    }

    fn has(&self, weight: Weight) -> bool {
        self.gguf.tensors.contains_key(&self.name(weight))
    }

    fn read(&self, weight: Weight) -> Result<(Vec<usize>, Vec<f32>)> {
        let name = self.name(weight);
        let values = self.gguf.tensor_f32(&name)?;
        let shape = self.gguf.tensors[&name].shape();
        match self.permuted_heads(weight) {
            Some(heads) if shape.len() == 2 => Ok((shape.clone(), unpermute_rows(&values, heads, shape[0], shape[1]))),
            _ => Ok((shape, values)),
        }
    }

    fn origin(&self) -> &Path {
        &self.gguf.path
    }

    fn quantized(&self, weight: Weight) -> Result<Option<QuantMatrix>> {
        let Some(matrix) = self.gguf.tensor_quantized(&self.name(weight))? else { return Ok(None) };
        Ok(Some(match self.permuted_heads(weight) {
            Some(heads) => matrix.select_rows(&unpermuted_order(heads, matrix.rows())),
            None => matrix,
        }))
    }
}

/// Undo llama.cpp's `permute`: within each head, rows were reordered from
/// "first half, second half" (Hugging Face's rotate-half pairs `(i, i+k/2)`)
/// to interleaved pairs `(2i, 2i+1)`. Row `2i + j` of a converted head is
/// original row `j·k/2 + i`.
fn unpermute_rows(values: &[f32], heads: usize, rows: usize, cols: usize) -> Vec<f32> {
    unpermuted_order(heads, rows).iter().flat_map(|&from| &values[from * cols..(from + 1) * cols]).copied().collect()
}

/// The rows' order that undoes the conversion's permutation: row `to` of
/// the result is row `order[to]` of the file's. Within each head of `k`
/// rows, the file interleaves the two halves (`2i + j`), Hugging Face keeps
/// them apart (`j·k/2 + i`).
fn unpermuted_order(heads: usize, rows: usize) -> Vec<usize> {
    let k = rows / heads;
    let mut order = vec![0; rows];
    for h in 0..heads {
        for i in 0..k / 2 {
            for j in 0..2 {
                order[h * k + j * (k / 2) + i] = h * k + 2 * i + j;
            }
        }
    }
    order
}

/// A Hugging Face model directory's safetensors files as a weight source.
pub struct SafetensorsWeights {
    dir: PathBuf,
    /// Each shard's bytes.
    shards: Vec<(PathBuf, Vec<u8>)>,
    /// Tensor name to shard index.
    index: BTreeMap<String, usize>,
}

impl SafetensorsWeights {
    /// `model.safetensors`, or the shards `model.safetensors.index.json`
    /// lists.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_file = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_file.exists() {
            let text = std::fs::read_to_string(&index_file).with_context(|| format!("cannot read {}", index_file.display()))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index_file.display()))?;
            let map = json["weight_map"].as_object().with_context(|| format!("{} has no weight_map", index_file.display()))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let single = dir.join("model.safetensors");
            ensure!(
                single.exists(),
                "{} has neither model.safetensors nor model.safetensors.index.json: a Hugging Face model directory needs its weights",
                dir.display()
            );
            vec![single]
        };
        let mut shards = Vec::new();
        let mut index = BTreeMap::new();
        for file in files {
            let bytes = std::fs::read(&file).with_context(|| format!("cannot read the weights file {}", file.display()))?;
            let names: Vec<String> = SafeTensors::deserialize(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file ({e}): download it again", file.display()))?
                .names()
                .into_iter()
                .map(str::to_string)
                .collect();
            for name in names {
                index.insert(name, shards.len());
            }
            shards.push((file, bytes));
        }
        Ok(Self { dir: dir.to_path_buf(), shards, index })
    }
}

impl WeightSource for SafetensorsWeights {
    fn name(&self, weight: Weight) -> String {
        match weight {
            Weight::Embedding => "model.embed_tokens.weight".into(),
            Weight::FinalNorm => "model.norm.weight".into(),
            Weight::Output => "lm_head.weight".into(),
            Weight::Layer(i, part) => {
                let p = match part {
                    Part::AttnNorm => "input_layernorm.weight",
                    Part::Q => "self_attn.q_proj.weight",
                    Part::K => "self_attn.k_proj.weight",
                    Part::V => "self_attn.v_proj.weight",
                    Part::O => "self_attn.o_proj.weight",
                    Part::QBias => "self_attn.q_proj.bias",
                    Part::KBias => "self_attn.k_proj.bias",
                    Part::VBias => "self_attn.v_proj.bias",
                    Part::MlpNorm => "post_attention_layernorm.weight",
                    Part::Gate => "mlp.gate_proj.weight",
                    Part::Up => "mlp.up_proj.weight",
                    Part::Down => "mlp.down_proj.weight",
                };
                format!("model.layers.{i}.{p}")
            }
        }
    }

    fn has(&self, weight: Weight) -> bool {
        self.index.contains_key(&self.name(weight))
    }

    fn read(&self, weight: Weight) -> Result<(Vec<usize>, Vec<f32>)> {
        let name = self.name(weight);
        let &shard = self.index.get(&name).with_context(|| {
            format!(
                "tensor {name:?} is missing from the safetensors files in {}: the model is incomplete; download it again",
                self.dir.display()
            )
        })?;
        let (file, bytes) = &self.shards[shard];
        let tensors = SafeTensors::deserialize(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let view = tensors.tensor(&name).map_err(|e| anyhow::anyhow!("{}: tensor {name:?}: {e}", file.display()))?;
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))).collect(),
            Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => bail!("tensor {name:?} in {} is {other:?}; f32, f16 and bf16 are read", file.display()),
        };
        Ok((view.shape().to_vec(), values))
    }

    fn origin(&self) -> &Path {
        &self.dir
    }
}

/// Build the model of `config` from `source`'s weights.
pub fn build<B: Backend>(config: &LlmConfig, source: &dyn WeightSource, device: &B::Device) -> Result<Llm<B>> {
    let mut model = config.init::<B>(device);
    let (d, k, f) = (config.hidden_size, config.head_dim, config.intermediate_size);
    let (q, kv) = (config.n_heads * k, config.n_kv_heads * k);
    let embedding = read(source, Weight::Embedding, &[config.vocab_size, d])?;
    let output = if config.tie_word_embeddings { embedding.clone() } else { read(source, Weight::Output, &[config.vocab_size, d])? };
    model.lm_head = linear(output, [config.vocab_size, d], None, device);
    if let Some(embed) = &mut model.embed {
        *embed = Embedding { weight: Param::from_tensor(Tensor::from_data(TensorData::new(embedding, [config.vocab_size, d]), device)) };
    }
    model.norm = norm(read(source, Weight::FinalNorm, &[d])?, config.rms_norm_eps, device);
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let w = |part: Part, shape: &[usize]| read(source, Weight::Layer(i, part), shape);
        let bias = |part: Part, len: usize| -> Result<Option<Vec<f32>>> {
            if config.attention_bias { Ok(Some(read(source, Weight::Layer(i, part), &[len])?)) } else { Ok(None) }
        };
        layer.attn_norm = norm(w(Part::AttnNorm, &[d])?, config.rms_norm_eps, device);
        layer.q = linear(w(Part::Q, &[q, d])?, [q, d], bias(Part::QBias, q)?, device);
        layer.k = linear(w(Part::K, &[kv, d])?, [kv, d], bias(Part::KBias, kv)?, device);
        layer.v = linear(w(Part::V, &[kv, d])?, [kv, d], bias(Part::VBias, kv)?, device);
        layer.o = linear(w(Part::O, &[d, q])?, [d, q], None, device);
        layer.mlp_norm = norm(w(Part::MlpNorm, &[d])?, config.rms_norm_eps, device);
        layer.gate = linear(w(Part::Gate, &[f, d])?, [f, d], None, device);
        layer.up = linear(w(Part::Up, &[f, d])?, [f, d], None, device);
        layer.down = linear(w(Part::Down, &[d, f])?, [d, f], None, device);
    }
    attach_quantized(&mut model, config, source)?;
    Ok(model)
}

/// The linear weights that `source` stores quantized, kept so beside their
/// `f32` copies: decoding reads them at their stored size (the `f32`
/// copies still serve long inputs and gradients).
fn attach_quantized<B: Backend>(model: &mut Llm<B>, config: &LlmConfig, source: &dyn WeightSource) -> Result<()> {
    let output = if config.tie_word_embeddings { Weight::Embedding } else { Weight::Output };
    model.lm_head_quantized = source.quantized(output)?.map(Arc::new);
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let w = |part: Part| source.quantized(Weight::Layer(i, part));
        // Stacked only when every part is quantized alike; else those stay `f32`.
        let stack = |parts: &[Part]| -> Result<Option<Arc<QuantMatrix>>> {
            let kept = parts.iter().map(|&p| w(p)).collect::<Result<Option<Vec<_>>>>()?;
            Ok(kept.and_then(|kept| QuantMatrix::stack(&kept.iter().collect::<Vec<_>>())).map(Arc::new))
        };
        let quantized = LayerQuantized {
            qkv: stack(&[Part::Q, Part::K, Part::V])?,
            o: w(Part::O)?.map(Arc::new),
            gate_up: stack(&[Part::Gate, Part::Up])?,
            down: w(Part::Down)?.map(Arc::new),
        };
        layer.quantized = (quantized.bytes() > 0).then(|| Arc::new(quantized));
    }
    Ok(())
}

/// A weight, checked against the shape the config implies.
fn read(source: &dyn WeightSource, weight: Weight, shape: &[usize]) -> Result<Vec<f32>> {
    let name = source.name(weight);
    ensure!(
        source.has(weight),
        "tensor {name:?} is missing from {}: the file is not a complete model of its architecture; download or convert it again",
        source.origin().display()
    );
    let (found, values) = source.read(weight)?;
    if found != shape {
        let hint = if weight == Weight::Embedding || weight == Weight::Output {
            "the vocabulary in the metadata does not match the embedding's rows"
        } else {
            "the file's metadata describes another shape than its tensors have"
        };
        bail!("tensor {name:?} in {} has shape {found:?}, but the model's config needs {shape:?}: {hint}", source.origin().display());
    }
    if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
        bail!("tensor {name:?} in {} holds a non-finite value at index {bad}: the file is damaged", source.origin().display());
    }
    Ok(values)
}

/// A `[out, in]` matrix (and bias) as Burn's `[in, out]` linear layer.
fn linear<B: Backend>(values: Vec<f32>, [out, inp]: [usize; 2], bias: Option<Vec<f32>>, device: &B::Device) -> Linear<B> {
    let mut transposed = vec![0f32; values.len()];
    for (r, row) in values.chunks_exact(inp).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            transposed[c * out + r] = x;
        }
    }
    Linear {
        weight: Param::from_tensor(Tensor::from_data(TensorData::new(transposed, [inp, out]), device)),
        bias: bias.map(|b| Param::from_tensor(Tensor::from_data(TensorData::new(b, [out]), device))),
    }
}

fn norm<B: Backend>(gamma: Vec<f32>, epsilon: f64, device: &B::Device) -> RmsNorm<B> {
    let d = gamma.len();
    RmsNorm { gamma: Param::from_tensor(Tensor::from_data(TensorData::new(gamma, [d]), device)), epsilon }
}
