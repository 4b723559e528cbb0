//! The policy network: a small decoder-only transformer language model with
//! a value head, generic over the Burn backend.
//!
//! Shapes are named in comments: `b` batch, `t` new positions, `p` positions
//! seen so far (cache included), `d` model width, `h` heads, `k` head width,
//! `v` vocabulary.
//!
//! The critic shares the trunk and adds one linear value head. RAGEN trains
//! a separate critic model; on 2 CPU cores a second transformer would double
//! the cost of every update for a model this small, and a shared trunk with
//! its own head (and its own loss weight) is the usual from-scratch PPO
//! design. The learner sees the model only through the policy seam, so a
//! separate critic can be swapped in without touching it.

use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use ragen_ops::{AttentionBackend, AttentionHeads, PointwiseBackend};

/// The layer norms' ε (Burn's default), which the fused node is handed.
const NORM_EPSILON: f64 = 1e-5;

/// The policy transformer's shape. A training config's `[model]` section
/// is this config (less `vocab_size`, which the tokenizer decides).
#[derive(Config, Debug, PartialEq)]
pub struct PolicyModelConfig {
    pub vocab_size: usize,
    #[config(default = 64)]
    pub d_model: usize,
    #[config(default = 2)]
    pub n_layers: usize,
    #[config(default = 4)]
    pub n_heads: usize,
    /// Hidden width of each MLP, as a multiple of `d_model`.
    #[config(default = 4)]
    pub mlp_ratio: usize,
    /// Longest context (prompt plus reply) the model reads.
    #[config(default = 2048)]
    pub max_seq_len: usize,
    /// Rotary positions (RoPE) instead of a learned position embedding.
    /// Attention then depends on how far apart two tokens are, not where
    /// they sit, so "the cell above" or "the same cell in the last state"
    /// is one offset wherever the grid lands in the conversation.
    #[config(default = false)]
    pub rotary: bool,
}

impl PolicyModelConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> PolicyModel<B> {
        assert!(self.d_model.is_multiple_of(self.n_heads), "d_model ({}) must be a multiple of n_heads ({})", self.d_model, self.n_heads);
        let d = self.d_model;
        let blocks = (0..self.n_layers)
            .map(|_| Block {
                attn_norm: LayerNormConfig::new(d).with_epsilon(NORM_EPSILON).init(device),
                qkv: LinearConfig::new(d, 3 * d).init(device),
                proj: LinearConfig::new(d, d).init(device),
                mlp_norm: LayerNormConfig::new(d).with_epsilon(NORM_EPSILON).init(device),
                up: LinearConfig::new(d, self.mlp_ratio * d).init(device),
                down: LinearConfig::new(self.mlp_ratio * d, d).init(device),
                n_heads: self.n_heads,
            })
            .collect();
        PolicyModel {
            token_embedding: EmbeddingConfig::new(self.vocab_size, d).init(device),
            position_embedding: (!self.rotary).then(|| EmbeddingConfig::new(self.max_seq_len, d).init(device)),
            blocks,
            norm: LayerNormConfig::new(d).with_epsilon(NORM_EPSILON).init(device),
            lm_head: LinearConfig::new(d, self.vocab_size).init(device),
            value_head: LinearConfig::new(d, 1).init(device),
            max_seq_len: self.max_seq_len,
        }
    }
}

#[derive(Module, Debug)]
pub struct PolicyModel<B: Backend> {
    token_embedding: Embedding<B>,
    /// Learned absolute positions; `None` with rotary positions.
    position_embedding: Option<Embedding<B>>,
    blocks: Vec<Block<B>>,
    norm: LayerNorm<B>,
    pub(crate) lm_head: Linear<B>,
    value_head: Linear<B>,
    max_seq_len: usize,
}

/// Pre-norm transformer block: causal self-attention, then an MLP.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    attn_norm: LayerNorm<B>,
    qkv: Linear<B>,
    proj: Linear<B>,
    mlp_norm: LayerNorm<B>,
    up: Linear<B>,
    down: Linear<B>,
    n_heads: usize,
}

/// Keys and values of the positions seen so far, per layer, so sampling
/// feeds one new token per step instead of the whole sequence.
///
/// A batch of prompts of different lengths is padded so that every row ends
/// at the same position and the rows grow together. Prompts that share a
/// prefix (the system prompt, the instructions) have it computed once and
/// copied to every row ([`KvCache::repeat`]), and each row's padding sits
/// between that prefix and the rest of its prompt: `gaps[r] = (start, len)`.
/// Padding is invisible: no other position attends to it, and positions
/// are counted as if it were not there, so a padded row computes what it
/// would alone.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    /// Per layer: keys and values `[b, P, w]` in the model's row layout
    /// (`w` = key/value heads × head width), the first `len` of the `P`
    /// rows filled; the rest is room for the next positions.
    layers: Vec<Option<(Tensor<B, 3>, Tensor<B, 3>)>>,
    len: usize,
    /// Padding per row, `(first position, count)`; empty means none.
    gaps: Vec<(usize, usize)>,
}

impl<B: Backend> KvCache<B> {
    pub fn new(n_layers: usize) -> Self {
        Self { layers: vec![None; n_layers], len: 0, gaps: Vec::new() }
    }

    /// Positions `start..start + pad[r]` of row `r` are padding (the tokens
    /// fed there are ignored). One gap per row.
    pub fn pad_at(&mut self, start: usize, pad: Vec<usize>) {
        assert!(self.gaps.is_empty(), "one gap per row");
        if pad.iter().any(|&z| z > 0) {
            self.gaps = pad.into_iter().map(|z| (start, z)).collect();
        }
    }

    /// This cache (of one row) copied into `b` rows, for prompts that all
    /// start with what it holds.
    pub fn repeat(&self, b: usize) -> Self {
        let layers =
            self.layers.iter().map(|l| l.as_ref().map(|(k, v)| (k.clone().repeat_dim(0, b), v.clone().repeat_dim(0, b)))).collect();
        Self { layers, len: self.len, gaps: Vec::new() }
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each layer's keys and values, for a model's forward pass to extend.
    pub fn layers_mut(&mut self) -> impl Iterator<Item = LayerCache<'_, B>> {
        let len = self.len;
        self.layers.iter_mut().map(move |slot| LayerCache { slot, len })
    }

    /// Keep only rows `keep` (indices into the current rows, in order), as
    /// when finished replies leave a sampling batch; an index given twice
    /// copies its row (as when several rows continue one prompt).
    pub fn retain_rows(&mut self, keep: &[usize]) {
        let Some(device) = self.layers.iter().flatten().next().map(|(k, _)| k.device()) else { return };
        let index =
            Tensor::<B, 1, Int>::from_data(TensorData::new(keep.iter().map(|&i| i as i64).collect::<Vec<_>>(), [keep.len()]), &device);
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.clone().select(0, index.clone());
            *v = v.clone().select(0, index.clone());
        }
        if !self.gaps.is_empty() {
            self.gaps = keep.iter().map(|&i| self.gaps[i]).collect();
        }
    }

    /// The rows of `self`, then those of `other`: two batches laid out
    /// alike (a shared prefix of `at` positions, each row's padding right
    /// after it), as when waiting prompts join a batch that is already
    /// writing (continuous batching). The shorter batch gets that much more
    /// padding at `at`, so both end at the same position.
    pub fn append_rows(self, other: Self, at: usize) -> Self {
        let len = self.len.max(other.len);
        let (mut layers, mut gaps) = self.widened(len, at);
        let (other_layers, other_gaps) = other.widened(len, at);
        for (mine, theirs) in layers.iter_mut().zip(other_layers) {
            *mine = match (mine.take(), theirs) {
                (Some((k, v)), Some((k2, v2))) => Some((Tensor::cat(vec![k, k2], 0), Tensor::cat(vec![v, v2], 0))),
                (mine, theirs) => mine.or(theirs),
            };
        }
        gaps.extend(other_gaps);
        if gaps.iter().all(|&(_, z)| z == 0) {
            gaps.clear();
        }
        Self { layers, len, gaps }
    }

    /// The buffers cut to their filled rows and widened to `len` positions
    /// by padding at `at`, with each row's gap.
    #[allow(clippy::type_complexity)]
    fn widened(self, len: usize, at: usize) -> (Vec<Option<(Tensor<B, 3>, Tensor<B, 3>)>>, Vec<(usize, usize)>) {
        let extra = len - self.len;
        let rows = self.layers.iter().flatten().next().map_or(0, |(k, _)| k.dims()[0]);
        let widen = |x: Tensor<B, 3>| {
            let [b, _, w] = x.dims();
            if extra == 0 {
                return x.narrow(1, 0, len);
            }
            let pad = Tensor::zeros([b, extra, w], &x.device());
            let before = (at > 0).then(|| x.clone().narrow(1, 0, at));
            Tensor::cat(before.into_iter().chain([pad, x.narrow(1, at, self.len - at)]).collect(), 1)
        };
        let layers = self.layers.into_iter().map(|l| l.map(|(k, v)| (widen(k), widen(v)))).collect();
        let gaps = if self.gaps.is_empty() { vec![(at, 0); rows] } else { self.gaps };
        let gaps = gaps
            .into_iter()
            .map(|(start, z)| {
                assert!(z == 0 || start == at, "padding sits right after the shared prefix");
                (at, z + extra)
            })
            .collect();
        (layers, gaps)
    }

    /// Record that `t` more positions are cached.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// For `t` new positions of `b` rows after what is cached: each one's
    /// position (`[b, t]` row-major, padding not counted) and, if any row
    /// is padded, the mask `[b, t, p]` that is true where a query may not
    /// see a key.
    pub fn positions_and_padding(&self, b: usize, t: usize, device: &B::Device) -> (Vec<i64>, Option<Tensor<B, 3, Bool>>) {
        let (offset, p) = (self.len, self.len + t);
        if self.gaps.is_empty() {
            return ((0..b).flat_map(|_| offset as i64..p as i64).collect(), None);
        }
        assert_eq!(self.gaps.len(), b, "one gap per row");
        let position = |(start, len): (usize, usize), i: usize| {
            if i < start { i } else { i.saturating_sub(len).max(start) }
        };
        let positions: Vec<i64> = self.gaps.iter().flat_map(|&g| (offset..p).map(move |i| position(g, i) as i64)).collect();
        // Row r's padding is hidden, except from itself, so that no query
        // is left with nothing to attend to.
        let hidden: Vec<bool> = self
            .gaps
            .iter()
            .flat_map(|&(start, len)| (offset..p).flat_map(move |i| (0..p).map(move |j| j >= start && j < start + len && j != i)))
            .collect();
        (positions, Some(Tensor::<B, 3, Bool>::from_data(TensorData::new(hidden, [b, t, p]), device)))
    }
}

/// Spare rows a cache buffer gets when it grows: sampling then writes that
/// many positions in place before the next copy.
const SPARE_ROWS: usize = 32;

/// One layer's keys and values in a [`KvCache`], for a forward pass to
/// extend.
pub struct LayerCache<'a, B: Backend> {
    slot: &'a mut Option<(Tensor<B, 3>, Tensor<B, 3>)>,
    len: usize,
}

impl<B: AttentionBackend> LayerCache<'_, B> {
    /// Appends the `t` new positions' keys and values `[b, t, w]`; returns
    /// the buffers `[b, P, w]` and how many of their rows are filled
    /// (`len + t`, the attention's `keys`).
    ///
    /// Sampling adds a position or a few per step. Concatenating would copy
    /// the whole cache every step (for a 30-layer model over 64 rows of 400
    /// positions, a gigabyte a step); instead the buffers keep
    /// [`SPARE_ROWS`] of room, and a write into a buffer nobody else holds
    /// happens in place ([`AttentionBackend::write_rows`]).
    pub fn append(self, keys: Tensor<B, 3>, values: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 3>, usize) {
        let (len, t) = (self.len, keys.dims()[1]);
        let (keys, values) = match self.slot.take() {
            // The first pass (a prompt, or a training pass) keeps its keys as they are.
            None => (keys, values),
            Some((kc, vc)) => (extend(kc, keys, len), extend(vc, values, len)),
        };
        *self.slot = Some((keys.clone(), values.clone()));
        (keys, values, len + t)
    }
}

/// `buffer` `[b, P, w]` with `new` `[b, t, w]` at rows `len..len + t`: in
/// place while there is room, else in a new buffer with spare rows.
fn extend<B: AttentionBackend>(buffer: Tensor<B, 3>, new: Tensor<B, 3>, len: usize) -> Tensor<B, 3> {
    let ([b, room, w], t) = (buffer.dims(), new.dims()[1]);
    if len + t <= room {
        B::write_rows(buffer, len, new)
    } else {
        let spare = Tensor::zeros([b, SPARE_ROWS, w], &new.device());
        Tensor::cat(vec![buffer.narrow(1, 0, len), new, spare], 1)
    }
}

impl<B: Backend> PolicyModel<B> {
    pub fn n_layers(&self) -> usize {
        self.blocks.len()
    }

    pub fn n_heads(&self) -> usize {
        self.blocks.first().map_or(1, |b| b.n_heads)
    }

    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Tokens the model reads and predicts.
    pub fn vocab_size(&self) -> usize {
        self.token_embedding.weight.dims()[0]
    }

    fn head_width(&self) -> usize {
        self.token_embedding.weight.dims()[1] / self.n_heads()
    }
}

impl<B: AttentionBackend + PointwiseBackend> PolicyModel<B> {
    /// The whole sequence at once: tokens `[b, t]` to logits `[b, t, v]` and
    /// values `[b, t]`. Position `i`'s logits predict token `i + 1`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        let x = self.hidden(tokens, None); // [b, t, d]
        (self.lm_head.forward(x.clone()), self.value_head.forward(x).reshape([b, t]))
    }

    /// The next `t` tokens after what `cache` holds; returns their logits
    /// and values and extends the cache.
    pub fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        let x = self.hidden_cached(tokens, cache); // [b, t, d]
        let logits = self.lm_head.forward(x.clone()); // [b, t, v]
        let values = self.value_head.forward(x).reshape([b, t]); // [b, t]
        (logits, values)
    }

    /// The whole sequence at once, with final hidden states only at the
    /// flat positions `at` `[n]` (position `i` of row `r` is `r·t + i`):
    /// hidden states `[n, d]` and values `[b, t]`. The learner scores a few
    /// positions of each sequence (the agent's tokens), so the output layer
    /// and its gradient skip the rest.
    pub fn hidden_at(&self, tokens: Tensor<B, 2, Int>, at: Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        let x = self.hidden(tokens, None); // [b, t, d]
        let d = x.dims()[2];
        let x = x.reshape([b * t, d]);
        let values = self.value_head.forward(x.clone()).reshape([b, t]); // [b, t]
        (x.select(0, at), values) // [n, d], [b, t]
    }

    /// [`PolicyModel::hidden_at`] for rows that all begin with `prefix`
    /// `[s]`: `tokens` `[b, t]` follow it, `at` and the values `[b, t]`
    /// index them. The prefix runs once and its keys and values serve
    /// every row.
    pub fn hidden_at_after(
        &self,
        prefix: Tensor<B, 1, Int>,
        tokens: Tensor<B, 2, Int>,
        at: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let ([b, t], s) = (tokens.dims(), prefix.dims()[0]);
        let mut cache = KvCache::new(self.blocks.len());
        // Only the prefix's keys and values are kept; its hidden states are not read.
        self.hidden_cached(prefix.reshape([1, s]), &mut cache);
        let mut cache = cache.repeat(b);
        let x = self.hidden_cached(tokens, &mut cache); // [b, t, d]
        let d = x.dims()[2];
        let x = x.reshape([b * t, d]);
        let values = self.value_head.forward(x.clone()).reshape([b, t]); // [b, t]
        (x.select(0, at), values) // [n, d], [b, t]
    }

    /// The final hidden states `[b, t, d]`, normalised, of the next `t`
    /// tokens after what `cache` holds; extends the cache.
    fn hidden_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        self.hidden(tokens, Some(cache))
    }

    /// [`PolicyModel::hidden_cached`], or with `cache` `None`, a whole
    /// sequence whose keys and values nobody keeps (a training or scoring
    /// pass), which lets attention run on the packed projections.
    fn hidden(&self, tokens: Tensor<B, 2, Int>, cache: Option<&mut KvCache<B>>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let keep = cache.is_some();
        let mut scratch = KvCache::new(self.blocks.len());
        let cache = cache.unwrap_or(&mut scratch);
        let offset = cache.len;
        assert!(
            offset + t <= self.max_seq_len,
            "sequence of {} tokens exceeds max_seq_len {}; raise it in the model config",
            offset + t,
            self.max_seq_len
        );
        let device = tokens.device();
        let (positions, padding) = cache.positions_and_padding(b, t, &device);
        // [b, t, d]
        let mut x = self.token_embedding.forward(tokens);
        let rotation = match &self.position_embedding {
            Some(embedding) => {
                x = x + embedding.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(positions, [b, t]), &device));
                None
            }
            None => Some(Rotation::new(&positions, [b, t], &inv_frequencies(self.head_width(), 10_000.0), &device)),
        };
        for (block, layer_cache) in self.blocks.iter().zip(cache.layers_mut()) {
            x = block.forward(x, keep.then_some(layer_cache), padding.clone(), rotation.as_ref());
        }
        cache.advance(t);
        let d = x.dims()[2];
        norm(&self.norm, x.reshape([b * t, d])).reshape([b, t, d])
    }
}

impl<B: AttentionBackend + PointwiseBackend> Block<B> {
    /// x `[b, t, d]`, the next `t` positions after the cache's `p - t`
    /// (`cache` `None`: no cache, and none to keep);
    /// `padding` `[b, t, p]` is true where a query may not see a key
    /// (besides the future, which is always hidden).
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        padding: Option<Tensor<B, 3, Bool>>,
        rotation: Option<&Rotation<B>>,
    ) -> Tensor<B, 3> {
        // The position-wise layers run on rows `[b·t, d]`: a linear layer
        // on `[b, t, d]` is a batched product whose weight gradient is `b`
        // products of `[d, t]` by `[t, o]` summed afterwards, where rows
        // make it one product.
        let [b, t, d] = x.dims();
        let x = x.reshape([b * t, d]);
        let qkv = self.qkv.forward(norm(&self.attn_norm, x.clone())).reshape([b, t, 3 * d]);
        let attended = match (cache, padding, rotation) {
            // A whole sequence: one fused node on the projections as they are.
            (None, None, None) => B::packed_causal_attention(qkv, self.n_heads), // [b, t, d]
            (cache, padding, rotation) => self.attend(qkv, cache, padding, rotation),
        };
        let x = x + self.proj.forward(attended.reshape([b * t, d])); // [b·t, d]
        let mlp = self.down.forward(B::fused_gelu(self.up.forward(norm(&self.mlp_norm, x.clone()))));
        (x + mlp).reshape([b, t, d])
    }

    /// Attention with rotary positions, the cache and padding: `qkv`
    /// `[b, t, 3d]` to `[b, t, d]`, heads side by side throughout.
    fn attend(
        &self,
        qkv: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        padding: Option<Tensor<B, 3, Bool>>,
        rotation: Option<&Rotation<B>>,
    ) -> Tensor<B, 3> {
        let [b, t, d3] = qkv.dims();
        let d = d3 / 3;
        let part = |i: usize| qkv.clone().narrow(2, i * d, d); // [b, t, d]
        // Keys are cached already rotated: a key's rotation depends only on
        // its own position.
        let rotate = |x: Tensor<B, 3>| match rotation {
            Some(r) => r.apply(x.reshape([b * t, d])).reshape([b, t, d]),
            None => x,
        };
        let (q, k_new, v_new) = (rotate(part(0)), rotate(part(1)), part(2));
        let (keys, values, p) = match cache {
            Some(cache) => cache.append(k_new, v_new),
            None => (k_new, v_new, t),
        };
        // Causal from the bottom-right corner: new position i (absolute
        // p - t + i) sees keys up to itself. One fused node under autodiff
        // (see `attention`).
        B::causal_attention(q, keys, values, padding, AttentionHeads::multi(self.n_heads), p) // [b, t, d]
    }
}

/// `x` `[n, d]` through `layer`, as one autodiff node ([`PointwiseBackend`]).
fn norm<B: PointwiseBackend>(layer: &LayerNorm<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let beta = layer.beta.as_ref().expect("the policy's layer norms have a bias").val();
    B::fused_layer_norm(x, layer.gamma.val(), beta, NORM_EPSILON)
}

/// The rotary frequencies `theta^(-2i/k)` of a head `k` channels wide.
pub fn inv_frequencies(k: usize, theta: f64) -> Vec<f32> {
    (0..k / 2).map(|i| theta.powf(-(2.0 * i as f64) / k as f64) as f32).collect()
}

/// Rotary position embedding (RoPE) for the `t` new positions of a batch:
/// each pair of a head's channels `(i, i + k/2)` is rotated by the angle
/// `position · inv_freq[i]` (`inv_freq[i] = θ^(-2i/k)`; θ = 10 000 in our
/// model, the model file's value in a pretrained one), so a query-key
/// product depends on the two positions only through their difference.
/// This is the "rotate half" layout of Hugging Face's Llama and Qwen2.
pub struct Rotation<B: Backend> {
    /// `[b·t, k/2]` each.
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl<B: Backend> Rotation<B> {
    /// `positions` `[b, t]` row-major; one frequency per channel pair.
    pub fn new(positions: &[i64], [b, t]: [usize; 2], inv_freq: &[f32], device: &B::Device) -> Self {
        let half = inv_freq.len();
        let angles: Vec<f32> = positions.iter().flat_map(|&p| inv_freq.iter().map(move |f| p as f32 * f)).collect();
        let cos = angles.iter().map(|a| a.cos()).collect::<Vec<_>>();
        let sin = angles.iter().map(|a| a.sin()).collect::<Vec<_>>();
        let tensor = |v: Vec<f32>| Tensor::<B, 2>::from_data(TensorData::new(v, [b * t, half]), device);
        Self { cos: tensor(cos), sin: tensor(sin) }
    }
}

impl<B: PointwiseBackend> Rotation<B> {
    /// x `[b·t, heads·k]` (rows in the order of the positions given to
    /// [`Rotation::new`]), every head rotated: one node
    /// ([`PointwiseBackend::rotary`]).
    pub fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::rotary(x, self.cos.clone(), self.sin.clone())
    }
}
