//! The decoder of the Llama and Qwen2 families in Burn: RMSNorm, rotary
//! positions with the model's θ, grouped-query attention and a SwiGLU MLP,
//! plus a value head on the last hidden state for the critic.
//!
//! Shapes are named in comments: `b` batch, `t` new positions, `p`
//! positions seen so far (cache included), `d` model width, `h` query heads,
//! `g` key/value heads, `k` head width, `f` MLP width, `v` vocabulary.

use crate::config::LlmConfig;
use crate::lora::{LayerAdapters, LayerWidths, Lora, LoraConfig, Tuned};
use burn::module::Param;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use ragen_ops::{AttentionBackend, AttentionHeads, OutputLayer, PointwiseBackend, QuantMatrix, QuantizedBackend};
use ragen_policy::CheckpointRecorder;
use ragen_policy::{CausalLm, KvCache, LayerCache, PolicyNetwork, Rotation};
use std::path::Path;
use std::sync::Arc;

/// A pretrained causal language model with a value head.
#[derive(Module, Debug)]
pub struct Llm<B: Backend> {
    /// `None` when the embedding is tied to the output layer: token `i`'s
    /// embedding is then column `i` of `lm_head`'s weight `[d, v]`, one
    /// parameter for both, laid out for the (far larger) output product.
    pub(crate) embed: Option<Embedding<B>>,
    pub(crate) layers: Vec<DecoderLayer<B>>,
    pub(crate) norm: RmsNorm<B>,
    pub(crate) lm_head: Linear<B>,
    /// `lm_head`'s weight as the file stores it, quantized (see
    /// [`Llm::quantized_bytes`]).
    #[module(skip)]
    pub(crate) lm_head_quantized: Option<Arc<QuantMatrix>>,
    /// The value head, and the LoRA adapters when they are on: what trains
    /// while the rest is frozen (see [`Llm::with_lora`]).
    pub tuned: Tuned<B>,
    /// Rotary frequencies, one per channel pair of a head (from the
    /// config, not a weight: not saved with the record).
    #[module(skip)]
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) max_seq_len: usize,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub(crate) attn_norm: RmsNorm<B>,
    pub(crate) q: Linear<B>,
    pub(crate) k: Linear<B>,
    pub(crate) v: Linear<B>,
    pub(crate) o: Linear<B>,
    pub(crate) mlp_norm: RmsNorm<B>,
    pub(crate) gate: Linear<B>,
    pub(crate) up: Linear<B>,
    pub(crate) down: Linear<B>,
    /// The projections' weights as the file stores them, quantized.
    #[module(skip)]
    pub(crate) quantized: Option<Arc<LayerQuantized>>,
}

/// A decoder layer's projections kept quantized, each `[out, in]` (one
/// output per row), for decoding a few rows at a time: each is read at its
/// stored size instead of as `f32` ([`ragen_ops::QuantizedBackend`]). The
/// projections that read the same input are stacked, so that one product
/// (one pass over the input, one parallel call) gives their outputs side
/// by side. Only while the base is frozen: [`Llm::with_lora`] without
/// LoRA (the whole model trains) and loading a whole model's weights drop
/// them; with LoRA, on a backend that trains on them, they are all that is
/// kept of the base's projections (QLoRA).
#[derive(Debug, Default)]
pub struct LayerQuantized {
    /// q, k and v stacked: `[h·k + 2·g·k, d]`.
    pub qkv: Option<Arc<QuantMatrix>>,
    pub o: Option<Arc<QuantMatrix>>,
    /// gate and up stacked: `[2f, d]`.
    pub gate_up: Option<Arc<QuantMatrix>>,
    pub down: Option<Arc<QuantMatrix>>,
}

impl LayerQuantized {
    pub(crate) fn bytes(&self) -> usize {
        [&self.qkv, &self.o, &self.gate_up, &self.down].iter().filter_map(|w| w.as_deref()).map(QuantMatrix::bytes).sum()
    }
}

impl LlmConfig {
    /// A randomly initialised model of this shape (the loaders replace
    /// every weight; the value head keeps this small initialisation).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llm<B> {
        let (d, k) = (self.hidden_size, self.head_dim);
        let linear = |i: usize, o: usize, bias: bool| LinearConfig::new(i, o).with_bias(bias).init(device);
        let norm = || RmsNormConfig::new(d).with_epsilon(self.rms_norm_eps).init(device);
        let layers = (0..self.n_layers)
            .map(|_| DecoderLayer {
                attn_norm: norm(),
                q: linear(d, self.n_heads * k, self.attention_bias),
                k: linear(d, self.n_kv_heads * k, self.attention_bias),
                v: linear(d, self.n_kv_heads * k, self.attention_bias),
                o: linear(self.n_heads * k, d, false),
                mlp_norm: norm(),
                gate: linear(d, self.intermediate_size, false),
                up: linear(d, self.intermediate_size, false),
                down: linear(self.intermediate_size, d, false),
                quantized: None,
            })
            .collect();
        Llm {
            embed: (!self.tie_word_embeddings).then(|| EmbeddingConfig::new(self.vocab_size, d).init(device)),
            layers,
            norm: norm(),
            lm_head: linear(d, self.vocab_size, false),
            lm_head_quantized: None,
            tuned: Tuned { value_head: small_value_head(d, device), adapters: Vec::new() },
            inv_freq: self.inv_frequencies(),
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: k,
            max_seq_len: self.max_position_embeddings,
        }
    }
}

/// The critic's head starts near zero (weights `N(0, 0.01²)`, bias 0), so
/// early values do not swamp the advantages. Drawn from the backend's
/// seeded generator, as every other initial weight.
fn small_value_head<B: Backend>(d: usize, device: &B::Device) -> Linear<B> {
    let weight = Tensor::random([d, 1], burn::tensor::Distribution::Normal(0.0, 0.01), device);
    Linear { weight: Param::from_tensor(weight), bias: Some(Param::from_tensor(Tensor::zeros([1], device))) }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> Llm<B> {
    pub fn vocab_size(&self) -> usize {
        self.lm_head.weight.dims()[1]
    }

    /// Tokens `[b, t]` to their embeddings `[b, t, d]`.
    fn embed_tokens(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        match &self.embed {
            Some(embed) => embed.forward(tokens),
            None => {
                let [b, t] = tokens.dims();
                let columns = self.lm_head.weight.val().select(1, tokens.reshape([b * t])); // [d, b·t]
                let d = columns.dims()[0];
                columns.transpose().reshape([b, t, d])
            }
        }
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The model with LoRA adapters on `config`'s target layers (`B` = 0,
    /// so it computes what it did) and everything else frozen but the value
    /// head. With LoRA off the whole model trains, so its quantized
    /// copies (which would go stale) are dropped. With LoRA on and
    /// `quantized_base`, on a backend that trains on quantized weights
    /// ([`QuantizedBackend::trains_on_quantized`]), the `f32` copies of the
    /// projections kept quantized are dropped instead (QLoRA): the frozen
    /// base is read at its stored size, in training too.
    pub fn with_lora(mut self, config: &LoraConfig) -> Self {
        if !config.is_on() {
            return self.without_quantized();
        }
        let device = self.lm_head.weight.device();
        let k = self.head_dim;
        let widths = LayerWidths {
            d: self.lm_head.weight.dims()[0],
            q: self.n_heads * k,
            kv: self.n_kv_heads * k,
            f: self.layers.first().map_or(0, |l| l.gate.weight.dims()[1]),
        };
        if config.quantized_base && B::trains_on_quantized() {
            self.layers.iter_mut().for_each(DecoderLayer::drop_f32_covered);
        }
        self.embed = self.embed.map(Module::no_grad);
        self.layers = self.layers.into_iter().map(Module::no_grad).collect();
        self.norm = self.norm.no_grad();
        self.lm_head = self.lm_head.no_grad();
        self.tuned.adapters = (0..self.layers.len()).map(|_| LayerAdapters::new(widths, config, &device)).collect();
        self
    }

    /// The model without its quantized weights: every product reads the
    /// `f32` ones (the reference path), as it must once they train.
    pub fn without_quantized(mut self) -> Self {
        self.lm_head_quantized = None;
        for layer in &mut self.layers {
            layer.quantized = None;
        }
        self
    }

    /// Whether the frozen base's projections are kept only quantized
    /// (QLoRA, see [`Llm::with_lora`]).
    pub fn base_is_quantized_only(&self) -> bool {
        self.layers.iter().any(|l| dropped(&l.q) || dropped(&l.o) || dropped(&l.gate) || dropped(&l.down))
    }

    /// Bytes of the quantized weights decoding reads instead of the `f32`
    /// ones, `None` when there are none (a model stored as floats, or
    /// training all its weights).
    pub fn quantized_bytes(&self) -> Option<usize> {
        let layers: usize = self.layers.iter().filter_map(|l| l.quantized.as_ref()).map(|q| q.bytes()).sum();
        let total = layers + self.lm_head_quantized.as_ref().map_or(0, |w| w.bytes());
        (total > 0).then_some(total)
    }

    /// Whether LoRA adapters are on (then only they and the value head
    /// train, and only they are checkpointed).
    pub fn has_adapters(&self) -> bool {
        !self.tuned.adapters.is_empty()
    }

    /// The whole sequence at once: tokens `[b, t]` to logits `[b, t, v]` and
    /// values `[b, t]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let mut cache = KvCache::new(self.layers.len());
        self.forward_cached(tokens, &mut cache)
    }

    /// The next `t` tokens after what `cache` holds: logits `[b, t, v]` and
    /// values `[b, t]`.
    pub fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        let x = self.hidden_cached(tokens, cache); // [b·t, d]
        let logits = self.output(x.clone()); // [b·t, v]
        let values = self.tuned.value_head.forward(x); // [b·t, 1]
        (logits.reshape([b, t, self.vocab_size()]), values.reshape([b, t]))
    }

    /// The whole sequence at once, with final hidden states only at the
    /// flat positions `at` `[n]` (position `i` of row `r` is `r·t + i`):
    /// hidden states `[n, d]` and values `[b, t]`. With a vocabulary of
    /// tens of thousands the output layer is most of a small model's work
    /// and memory; the learner runs it only where it scores tokens, a chunk
    /// at a time.
    pub fn hidden_at(&self, tokens: Tensor<B, 2, Int>, at: Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        let x = self.hidden_cached(tokens, &mut KvCache::new(self.layers.len())); // [b·t, d]
        let values = self.tuned.value_head.forward(x.clone()).reshape([b, t]); // [b, t]
        (x.select(0, at), values) // [n, d], [b, t]
    }

    /// [`Llm::hidden_at`] for rows that all begin with `prefix` `[s]`:
    /// `tokens` `[b, t]` follow it, `at` and the values `[b, t]` index
    /// them. The prefix runs once, and its keys and values serve every row
    /// (through autodiff, their gradients add up over the rows).
    pub fn hidden_at_after(
        &self,
        prefix: Tensor<B, 1, Int>,
        tokens: Tensor<B, 2, Int>,
        at: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let ([b, t], s) = (tokens.dims(), prefix.dims()[0]);
        let mut cache = KvCache::new(self.layers.len());
        // Only the prefix's keys and values are kept; its hidden states are not read.
        self.hidden_cached(prefix.reshape([1, s]), &mut cache);
        let mut cache = cache.repeat(b);
        let x = self.hidden_cached(tokens, &mut cache); // [b·t, d]
        let values = self.tuned.value_head.forward(x.clone()).reshape([b, t]); // [b, t]
        (x.select(0, at), values) // [n, d], [b, t]
    }

    /// The last position's logits `[b, v]` only: the output layer (the
    /// largest matrix of a small model) runs on `b` rows, not `b·t`.
    pub fn last_logits_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 2> {
        let [b, t] = tokens.dims();
        let x = self.hidden_cached(tokens, cache); // [b·t, d]
        let d = x.dims()[1];
        let last = x.reshape([b, t, d]).narrow(1, t - 1, 1).reshape([b, d]);
        self.output(last)
    }

    /// The output layer: hidden states `[n, d]` to logits `[n, v]`.
    fn output(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        project(&self.lm_head, self.lm_head_quantized.as_ref(), None, x)
    }

    /// The final hidden states `[b·t, d]`, normalised. Activations stay 2-D
    /// (`b·t` rows) through every linear layer, so each is one matrix
    /// product, not one per row of the batch.
    fn hidden_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 2> {
        let [b, t] = tokens.dims();
        assert!(
            cache.len() + t <= self.max_seq_len,
            "a sequence of {} tokens is longer than the model's context of {}",
            cache.len() + t,
            self.max_seq_len
        );
        let device = tokens.device();
        let (positions, padding) = cache.positions_and_padding(b, t, &device);
        let rotation = Rotation::new(&positions, [b, t], &self.inv_freq, &device);
        let x = self.embed_tokens(tokens); // [b, t, d]
        let d = x.dims()[2];
        let mut x = x.reshape([b * t, d]);
        let shape = Heads { b, t, h: self.n_heads, g: self.n_kv_heads, k: self.head_dim };
        for (i, (layer, layer_cache)) in self.layers.iter().zip(cache.layers_mut()).enumerate() {
            x = layer.forward(x, self.tuned.adapters.get(i), layer_cache, padding.clone(), &rotation, shape);
        }
        cache.advance(t);
        rms(&self.norm, x)
    }
}

/// `x` `[n, d]` through `norm`, as one autodiff node
/// ([`PointwiseBackend::fused_rms_norm`]; Burn's `RmsNorm` is six).
fn rms<B: PointwiseBackend>(norm: &RmsNorm<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    B::fused_rms_norm(x, norm.gamma.val(), norm.epsilon)
}

/// Whether `linear`'s `f32` weight was dropped for its quantized copy: it
/// is then `[0, o]`, which keeps the layer's width and makes any product
/// by it fail loudly.
fn dropped<B: Backend>(linear: &Linear<B>) -> bool {
    linear.weight.dims()[0] == 0
}

/// `x` `[n, i]` through one of the base's linear layers (`x·W + bias`,
/// `[n, o]`): by its quantized weight where there is one and the backend
/// multiplies by it (always, when the `f32` weight was dropped), else by
/// its `f32` weight; plus the LoRA adapter's update when there is one.
fn project<B: QuantizedBackend>(
    linear: &Linear<B>,
    quantized: Option<&Arc<QuantMatrix>>,
    lora: Option<&Lora<B>>,
    x: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let [y] = project_stacked([linear], quantized, [lora], x);
    y
}

/// [`project`] for linear layers that read the same `x` `[n, i]`, their
/// quantized weights stacked in `stacked` (as [`QuantMatrix::stack`]):
/// one product, split into each layer's outputs `[n, oⱼ]`.
fn project_stacked<B: QuantizedBackend, const N: usize>(
    linears: [&Linear<B>; N],
    stacked: Option<&Arc<QuantMatrix>>,
    loras: [Option<&Lora<B>>; N],
    x: Tensor<B, 2>,
) -> [Tensor<B, 2>; N] {
    let product = stacked.and_then(|w| B::quantized_linear(x.clone(), w)); // [n, Σ oⱼ]
    let mut at = 0;
    std::array::from_fn(|j| {
        let linear = linears[j];
        let width = linear.weight.dims()[1];
        let rows = at..at + width;
        at += width;
        let part = match (&product, stacked) {
            (Some(y), _) => Some(y.clone().narrow(1, rows.start, width)),
            // Without the f32 weight, each part is its own product (so that
            // autodiff has no split to undo).
            (None, Some(w)) if dropped(linear) => Some(B::quantized_linear_rows(x.clone(), w, rows)),
            (None, _) => None,
        };
        let base = match part {
            Some(part) => match &linear.bias {
                Some(bias) => part + bias.val().unsqueeze(),
                None => part,
            },
            None => linear.forward(x.clone()),
        };
        match loras[j] {
            Some(lora) => base + lora.forward(x.clone()),
            None => base,
        }
    })
}

/// The attention's shape: batch `b`, new positions `t`, query heads `h`,
/// key/value heads `g`, head width `k`.
#[derive(Clone, Copy, Debug)]
struct Heads {
    b: usize,
    t: usize,
    h: usize,
    g: usize,
    k: usize,
}

impl<B: Backend> DecoderLayer<B> {
    /// Drops the `f32` weights of the projections that are kept quantized
    /// (their biases stay): each becomes `[0, o]` ([`dropped`]).
    fn drop_f32_covered(&mut self) {
        let Some(quantized) = self.quantized.clone() else { return };
        let drop = |linear: &mut Linear<B>| {
            let [_, o] = linear.weight.dims();
            linear.weight = Param::from_tensor(Tensor::zeros([0, o], &linear.weight.device()));
        };
        if quantized.qkv.is_some() {
            [&mut self.q, &mut self.k, &mut self.v].into_iter().for_each(drop);
        }
        if quantized.o.is_some() {
            drop(&mut self.o);
        }
        if quantized.gate_up.is_some() {
            [&mut self.gate, &mut self.up].into_iter().for_each(drop);
        }
        if quantized.down.is_some() {
            drop(&mut self.down);
        }
    }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> DecoderLayer<B> {
    /// x `[b·t, d]`; the cache holds keys and values `[b, P, g·k]`, already
    /// rotated; `padding` `[b, t, p]` hides padded keys; `lora` adds its
    /// adapters' updates to the projections. Heads stay side by side, as the
    /// projections write them, all the way through attention.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        lora: Option<&LayerAdapters<B>>,
        cache: LayerCache<'_, B>,
        padding: Option<Tensor<B, 3, Bool>>,
        rotation: &Rotation<B>,
        s: Heads,
    ) -> Tensor<B, 2> {
        let Heads { b, t, h, g, k } = s;
        let quantized = self.quantized.as_deref();
        let w = |pick: fn(&LayerQuantized) -> &Option<Arc<QuantMatrix>>| quantized.and_then(|q| pick(q).as_ref());
        let lora = |pick: fn(&LayerAdapters<B>) -> &Option<Lora<B>>| lora.and_then(|a| pick(a).as_ref());
        let normed = rms(&self.attn_norm, x.clone());
        let [q, k_new, v_new] =
            project_stacked([&self.q, &self.k, &self.v], w(|q| &q.qkv), [lora(|a| &a.q), lora(|a| &a.k), lora(|a| &a.v)], normed);
        let q = rotation.apply(q).reshape([b, t, h * k]);
        let k_new = rotation.apply(k_new).reshape([b, t, g * k]);
        let v_new = v_new.reshape([b, t, g * k]);
        let (keys, values, p) = cache.append(k_new, v_new); // [b, P, g·k], p filled
        let attended = B::causal_attention(q, keys, values, padding, AttentionHeads::grouped(h, g), p); // [b, t, h·k]
        let x = x + project(&self.o, w(|q| &q.o), lora(|a| &a.o), attended.reshape([b * t, h * k]));
        let normed = rms(&self.mlp_norm, x.clone());
        let [gate, up] = project_stacked([&self.gate, &self.up], w(|q| &q.gate_up), [lora(|a| &a.gate), lora(|a| &a.up)], normed); // [b·t, f] each
        let mlp = project(&self.down, w(|q| &q.down), lora(|a| &a.down), B::swiglu(gate, up)); // [b·t, d]
        x + mlp
    }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> CausalLm<B> for Llm<B> {
    fn n_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        Llm::forward_cached(self, tokens, cache)
    }

    fn last_logits_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 2> {
        Llm::last_logits_cached(self, tokens, cache)
    }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> PolicyNetwork<B> for Llm<B> {
    fn hidden_at_and_values(&self, tokens: Tensor<B, 2, Int>, at: Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        self.hidden_at(tokens, at)
    }

    fn hidden_at_and_values_after(
        &self,
        prefix: Tensor<B, 1, Int>,
        tokens: Tensor<B, 2, Int>,
        at: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        self.hidden_at_after(prefix, tokens, at)
    }

    fn output_layer(&self) -> OutputLayer<B> {
        OutputLayer::of(&self.lm_head)
    }

    /// A pass's activations kept for the backward pass dominate (the
    /// logits are scored a chunk at a time): about `12·d + 5·f` floats per
    /// token and layer for the norms, projections, rotary positions, gated
    /// MLP and residuals. Keep a pass to 512 Mi floats (2 GiB) of those,
    /// and attention scores `[b, h, l, l]` (which backends without our
    /// attention kernel materialise) to 64 Mi.
    fn rows_per_pass(&self, len: usize) -> usize {
        let scores = self.n_heads * len * len;
        let d = self.lm_head.weight.dims()[0];
        let f = self.layers.first().map_or(0, |l| l.gate.weight.dims()[1]);
        let activations = len * self.layers.len() * (12 * d + 5 * f);
        ((64 << 20) / scores.max(1)).min((512 << 20) / activations.max(1)).max(1)
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// With LoRA, the adapters and the value head alone (the base is the
    /// model file, pinned by the checkpoint); without, the whole model.
    fn save_weights(&self, file: &Path) -> anyhow::Result<()> {
        let recorder = CheckpointRecorder;
        let saved = if self.has_adapters() {
            self.tuned.clone().save_file(file.to_path_buf(), &recorder)
        } else {
            self.clone().save_file(file.to_path_buf(), &recorder)
        };
        saved.map_err(|e| anyhow::anyhow!("cannot write `{}`: {e}", file.display()))
    }

    fn load_weights(mut self, file: &Path, device: &B::Device) -> anyhow::Result<Self> {
        let recorder = CheckpointRecorder;
        let failed = |e| anyhow::anyhow!("cannot read `{}`: {e} (was it written with the same model and LoRA settings?)", file.display());
        if self.has_adapters() {
            self.tuned = self.tuned.load_file(file.to_path_buf(), &recorder, device).map_err(failed)?;
            Ok(self)
        } else {
            // The whole model's weights replace the file's: its quantized copies no longer hold them.
            self.without_quantized().load_file(file.to_path_buf(), &recorder, device).map_err(failed)
        }
    }
}
