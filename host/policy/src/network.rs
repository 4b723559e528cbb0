//! The seam between the learner and the network it trains.
//!
//! The learner needs only this: run a batch of token sequences through a
//! causal language model with a value head, and be a Burn module (so it can
//! be optimised, checkpointed and copied as a frozen reference). Our
//! from-scratch [`PolicyModel`](crate::PolicyModel) implements it; a
//! pretrained Hugging Face model (Qwen2.5: safetensors weights, a
//! `tokenizer.json`, a value head added on top) implements the same trait,
//! plus the agent loop's `Policy` for sampling, and drops in without
//! touching the learner.

use crate::CheckpointRecorder;
use anyhow::{Context, Result};
use burn::prelude::*;
use std::path::Path;

use ragen_ops::{AttentionBackend, OutputLayer, PointwiseBackend};

/// A causal language model with a value head, as the learner sees it.
pub trait PolicyNetwork<B: Backend>: Module<B> {
    /// Tokens `[b, l]` to the final hidden states at the flat positions
    /// `at` `[n]` (position `i` of row `r` is `r·l + i`; it predicts token
    /// `i + 1`), `[n, d]`, and values at every position, `[b, l]`. Rows may
    /// be right-padded: position `i` must not depend on anything after it.
    ///
    /// Only the positions asked for: the learner scores the agent's tokens,
    /// a small share of a conversation, and the output layer over the whole
    /// vocabulary at every position would be most of the work. The learner
    /// runs the output layer itself, through
    /// [`token_scores`](ragen_ops::token_scores), a chunk of positions at a time.
    fn hidden_at_and_values(&self, tokens: Tensor<B, 2, Int>, at: Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 2>);

    /// [`PolicyNetwork::hidden_at_and_values`] for rows that all begin
    /// with the same `prefix` `[s]`: `tokens` `[b, l]` are what follows it
    /// in each row, and `at` and the values `[b, l]` index those (position
    /// `i` of row `r` is `r·l + i`). Every prompt of a step starts with the
    /// same instructions; a network with a KV cache runs them once and lets
    /// every row attend to their keys and values (the prefix's gradient is
    /// then the sum over the rows). By default the prefix is prepended to
    /// each row, which computes the same thing the long way.
    fn hidden_at_and_values_after(
        &self,
        prefix: Tensor<B, 1, Int>,
        tokens: Tensor<B, 2, Int>,
        at: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let ([b, l], s) = (tokens.dims(), prefix.dims()[0]);
        let whole = Tensor::cat(vec![prefix.reshape([1, s]).repeat_dim(0, b), tokens], 1); // [b, s + l]
        // Flat position r·l + i moves to r·(s + l) + s + i.
        let at = at.clone() + (at.div_scalar(l as i64) + 1) * s as i64;
        let (hidden, values) = self.hidden_at_and_values(whole, at);
        (hidden, values.narrow(1, s, l))
    }

    /// The output layer: hidden states `[n, d]` to next-token logits `[n, v]`.
    fn output_layer(&self) -> OutputLayer<B>;

    /// Next-token logits `[n, v]` at the flat positions `at` and values
    /// `[b, l]`: [`PolicyNetwork::hidden_at_and_values`] through
    /// [`PolicyNetwork::output_layer`].
    fn logits_at_and_values(&self, tokens: Tensor<B, 2, Int>, at: Tensor<B, 1, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let (hidden, values) = self.hidden_at_and_values(tokens, at);
        (self.output_layer().logits(hidden), values)
    }

    /// How many sequences of `len` tokens one pass should hold at most, to
    /// keep memory in bounds (the learner splits its batch accordingly).
    fn rows_per_pass(&self, len: usize) -> usize;

    /// The longest sequence it can read; the learner keeps the last this
    /// many tokens of a longer conversation.
    fn max_seq_len(&self) -> usize;

    /// Write the weights that training changes to `file` (Burn's binary
    /// record; the recorder adds its extension). All of them by default; a
    /// network with a frozen base (LoRA) writes only what trains, and its
    /// checkpoint pins the base by hash instead.
    fn save_weights(&self, file: &Path) -> Result<()> {
        let recorder = CheckpointRecorder;
        self.clone().save_file(file.to_path_buf(), &recorder).with_context(|| format!("cannot write `{}`", file.display()))
    }

    /// Read what [`PolicyNetwork::save_weights`] wrote into this network
    /// (of the same shape).
    fn load_weights(self, file: &Path, device: &B::Device) -> Result<Self> {
        let recorder = CheckpointRecorder;
        self.load_file(file.to_path_buf(), &recorder, device).map_err(|e| anyhow::anyhow!("cannot read `{}`: {e}", file.display()))
    }
}

impl<B: AttentionBackend + PointwiseBackend> PolicyNetwork<B> for crate::PolicyModel<B> {
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

    /// Backends without our attention kernel materialise the scores
    /// `[b, h, l, l]`; keep them to 4 Mi floats (16 MiB), which also keeps
    /// them in cache on a CPU. Flex does not materialise them, but passes of
    /// up to 100 rows were measured slower there (SimpleSokoban's update;
    /// docs/notebook.md), so the bound holds for every backend.
    fn rows_per_pass(&self, len: usize) -> usize {
        ((4 << 20) / (self.n_heads() * len * len).max(1)).max(1)
    }

    fn max_seq_len(&self) -> usize {
        crate::PolicyModel::max_seq_len(self)
    }
}
