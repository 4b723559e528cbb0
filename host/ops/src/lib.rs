//! ragen-ops: the fused Burn operations every policy trains and samples
//! with, the one trained from scratch (ragen-policy) and the pretrained
//! ones (ragen-llm).
//!
//! Burn 0.21's autodiff backend differentiates attention, norms and the
//! learner's scores through their reference compositions: many nodes,
//! each writing and keeping a whole tensor. Here each operation is one
//! autodiff node that keeps only its inputs and has a fused backward pass,
//! and on flex (the CPU backend) our own kernels; the other backends (wgpu,
//! CUDA, LibTorch) run the same equations as tensor operations. The
//! backend traits say which operations a backend runs this way:
//!
//! * [`AttentionBackend`] (`attention`): causal self-attention on the
//!   projections' row layout, grouped-query heads, a padding mask, and KV
//!   cache buffers read and written in place ([`AttentionHeads`]).
//! * [`PointwiseBackend`] (`pointwise`): the trait for the element-wise and
//!   row-wise operations, one module each: layer norm (`layer_norm`) and
//!   GELU (`gelu`) for the from-scratch model, RMS norm (`rms_norm`),
//!   SwiGLU (`swiglu`) and rotary positions (`rotary`, an option of the
//!   from-scratch model too) for the pretrained Llama and Qwen2 models.
//! * [`ScoringBackend`] (`scoring`, with flex's row kernel in
//!   `score_rows`): [`token_scores`], the log-probabilities and entropies
//!   of the sampled tokens straight from the final hidden states and an
//!   [`OutputLayer`], never holding more than a chunk of logits.
//! * [`QuantizedBackend`] (`quantized`): a linear layer's product with
//!   weights kept quantized ([`QuantMatrix`]): for decoding a few rows at a
//!   time (flex's kernel), and at any number of rows, differentiable in
//!   its input, for a frozen base kept only quantized under LoRA.
//! * [`TrainBackend`]: what the learner trains on, an autodiff backend with
//!   all four whose inner backend has them too.
//!
//! And what they share:
//!
//! * [`concurrent_passes`] and [`sum_gradients`] (`passes`): the learner's
//!   passes run one per core on flex, their gradients added up.
//! * `autodiff`: recording a node and registering its gradients.
//! * `flex`: zero-copy passage between flex tensors and kernel slices, and
//!   the size of a parallel task.
//! * `simd`: the kernels' vector loads and stores, `exp`s and sums.

mod attention;
mod autodiff;
mod flex;
mod gelu;
mod layer_norm;
mod passes;
mod pointwise;
mod quantized;
mod rms_norm;
mod rotary;
mod score_rows;
mod scoring;
mod simd;
mod swiglu;

pub use attention::{AttentionBackend, AttentionHeads};
pub use passes::{concurrent_passes, sum_gradients};
pub use pointwise::PointwiseBackend;
pub use quantized::{BLOCK, BlockQ4, BlockQ8, MAX_QUANTIZED_ROWS, QuantBlocks, QuantMatrix, QuantizedBackend};
pub use scoring::{OutputLayer, ScoreOptions, ScoringBackend, TokenScores, token_scores};

use burn::tensor::backend::AutodiffBackend;

/// What the learner trains on: an autodiff backend with the fused
/// attention, pointwise and scoring nodes (and the quantized product),
/// whose inner backend (sampling and no-gradient
/// passes) has them too.
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: AttentionBackend + PointwiseBackend + ScoringBackend + QuantizedBackend>
    + AttentionBackend
    + PointwiseBackend
    + ScoringBackend
    + QuantizedBackend
{
}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + AttentionBackend + PointwiseBackend + ScoringBackend + QuantizedBackend,
    B::InnerBackend: AttentionBackend + PointwiseBackend + ScoringBackend + QuantizedBackend,
{
}
