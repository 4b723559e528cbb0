//! Causal self-attention with a fused backward pass.
//!
//! Burn 0.21's autodiff backend differentiates attention by running its
//! reference composition (`attention_fallback`): the scores `[b, h, t, p]`
//! go through a dozen element-wise operations (scale, masks, max, shift,
//! exp, sum, divide), each of which reads and writes the whole score tensor
//! and records a node whose backward does as much again. For the policy's
//! shapes (32 rows of 314 tokens, 4 heads) that is 50 MB per operation and
//! the larger part of a training pass on a CPU.
//!
//! [`AttentionBackend::causal_attention`] is one autodiff node instead. Its
//! forward pass is one fused kernel (ours on flex, the backend's own
//! elsewhere), and it keeps only `q`, `k` and `v`. Its backward pass,
//! [`AttentionBackend::causal_attention_backward`], recomputes the
//! probabilities and returns `dq`, `dk` and `dv` at once:
//!
//! ```text
//! P  = softmax(q kᵀ · s + masks)          s = 1/√k
//! dv = Pᵀ dO
//! dP = dO vᵀ
//! dS = P ∘ (dP − rowsum(dO ∘ O)) · s      (rowsum(dO ∘ O) = rowsum(P ∘ dP))
//! dq = dS k,   dk = dSᵀ q
//! ```
//!
//! On flex a row-at-a-time kernel does this without materialising any
//! `[t, p]` tensor and skips the causally hidden half; other backends (wgpu,
//! CUDA, LibTorch) run the same equations as tensor operations, which is
//! still far fewer passes than the fallback's graph.
//! [`AttentionBackend::packed_causal_attention`] is the same node on the
//! `qkv` projection as it comes out of the linear layer, `[b, t, 3d]`, for a
//! whole-sequence pass: no head is split off, transposed or merged back.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::activation::softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::module::attention;
use burn::tensor::ops::{AttentionModuleOptions, BoolTensor, FloatTensor};
use rayon::prelude::*;

use crate::flex::{f32_tensor, f32_values};
use crate::{PointwiseBackend, ScoringBackend};

/// A backend that runs causal attention as one differentiable operation.
///
/// Every backend the host builds implements it: flex with its own backward
/// kernel, the others with the default methods.
pub trait AttentionBackend: Backend {
    /// `softmax(q kᵀ/√k, hiding masked and future keys) v`: q `[b, h, t, k]`,
    /// keys and values `[b, h, p, k]` (`p ≥ t`), `mask` `[b, h, t, p]` true
    /// where a query may not see a key. Causal from the bottom-right corner:
    /// query `i` sits at absolute position `p − t + i` and sees keys up to
    /// it. Returns `[b, h, t, k]`.
    fn causal_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
    ) -> Tensor<Self, 4> {
        burn_attention(q, k, v, mask)
    }

    /// The gradients `[dq, dk, dv]` of [`AttentionBackend::causal_attention`]
    /// given the gradient `grad` `[b, h, t, k]` of its output.
    fn causal_attention_backward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        attention_backward_tensors(q, k, v, mask, grad)
    }

    /// Causal self-attention over packed projections, without a cache or
    /// a mask: `qkv` `[b, t, 3d]` holds the queries, keys and values side by
    /// side, each `heads` heads of `d / heads` channels; returns `[b, t, d]`,
    /// heads side by side. This is the layout the projections around
    /// attention read and write, so no head is split off, transposed or
    /// merged back (copies, each with a backward pass of its own).
    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let [q, k, v] = split_heads(qkv, heads);
        merge_heads(Self::causal_attention(q, k, v, None))
    }

    /// The gradient `[b, t, 3d]` of [`AttentionBackend::packed_causal_attention`]
    /// with respect to `qkv`, given its output's `grad` `[b, t, d]`.
    fn packed_causal_attention_backward(qkv: Tensor<Self, 3>, heads: usize, grad: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let [q, k, v] = split_heads(qkv, heads);
        let [b, t, d] = grad.dims();
        let grad = grad.reshape([b, t, heads, d / heads]).swap_dims(1, 2);
        Tensor::cat(Self::causal_attention_backward(q, k, v, None, grad).map(merge_heads).to_vec(), 2)
    }
}

/// Burn's own causal attention (the reference composition under autodiff,
/// a fused kernel on most backends).
fn burn_attention<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: Option<Tensor<B, 4, Bool>>) -> Tensor<B, 4> {
    let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
    attention(q, k, v, mask, None, options)
}

/// `[b, t, 3d]` to queries, keys and values `[b, h, t, d/h]`.
fn split_heads<B: Backend>(qkv: Tensor<B, 3>, heads: usize) -> [Tensor<B, 4>; 3] {
    let [b, t, d3] = qkv.dims();
    let d = d3 / 3;
    [0, 1, 2].map(|i| qkv.clone().narrow(2, i * d, d).reshape([b, t, heads, d / heads]).swap_dims(1, 2))
}

/// `[b, h, t, k]` to `[b, t, h·k]`.
fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, t, k] = x.dims();
    x.swap_dims(1, 2).reshape([b, t, h * k])
}

/// What the learner trains on: an autodiff backend with the fused attention,
/// layer norm, GELU and scoring nodes, whose inner backend (sampling and no-gradient passes)
/// has them too.
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: AttentionBackend + PointwiseBackend + ScoringBackend> + AttentionBackend + PointwiseBackend + ScoringBackend
{
}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + AttentionBackend + PointwiseBackend + ScoringBackend,
    B::InnerBackend: AttentionBackend + PointwiseBackend + ScoringBackend,
{
}

/// The backward equations as tensor operations, for any backend.
fn attention_backward_tensors<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    grad: Tensor<B, 4>,
) -> [Tensor<B, 4>; 3] {
    let [b, h, t, kd] = q.dims();
    let p = k.dims()[2];
    let scale = 1.0 / (kd as f64).sqrt();
    let device = q.device();
    let future: Vec<bool> = (0..t).flat_map(|i| (0..p).map(move |j| j > p - t + i)).collect();
    let mut hidden = Tensor::<B, 2, Bool>::from_data(TensorData::new(future, [t, p]), &device).reshape([1, 1, t, p]).expand([b, h, t, p]);
    if let Some(mask) = mask {
        hidden = hidden.bool_or(mask);
    }
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)) * scale; // [b, h, t, p]
    let probs = softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3); // [b, h, t, p]
    let dv = probs.clone().swap_dims(2, 3).matmul(grad.clone()); // [b, h, p, k]
    let dp = grad.matmul(v.swap_dims(2, 3)); // [b, h, t, p]
    let delta = (probs.clone() * dp.clone()).sum_dim(3); // [b, h, t, 1]
    let ds = probs * (dp - delta) * scale; // [b, h, t, p]
    let dq = ds.clone().matmul(k); // [b, h, t, k]
    let dk = ds.swap_dims(2, 3).matmul(q); // [b, h, p, k]
    [dq, dk, dv]
}

impl AttentionBackend for burn::backend::Flex {
    fn causal_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
    ) -> Tensor<Self, 4> {
        let shape = Shape::of(&q, &k);
        if shape.t < 8 {
            // Sampling's few new positions over a long cache: flex's kernel
            // reads the cache in place, where ours would copy it first.
            return burn_attention(q, k, v, mask);
        }
        let mask = mask.map(bools);
        let out = shape.forward(&f32_values(q), &f32_values(k), &f32_values(v), mask.as_deref());
        f32_tensor(out, [shape.b, shape.h, shape.t, shape.kd])
    }

    fn causal_attention_backward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        let shape = Shape::of(&q, &k);
        let Shape { b, h, t, p, kd } = shape;
        let mask = mask.map(bools);
        let [dq, dk, dv] = shape.backward(&f32_values(q), &f32_values(k), &f32_values(v), &f32_values(grad), mask.as_deref());
        let tensor = |x: Vec<f32>, rows: usize| f32_tensor(x, [b, h, rows, kd]);
        [tensor(dq, t), tensor(dk, p), tensor(dv, p)]
    }

    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let shape = Shape::packed(&qkv, heads);
        let out = shape.packed_forward(&f32_values(qkv));
        f32_tensor(out, [shape.b, shape.t, shape.h * shape.kd])
    }

    fn packed_causal_attention_backward(qkv: Tensor<Self, 3>, heads: usize, grad: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let shape = Shape::packed(&qkv, heads);
        let dqkv = shape.packed_backward(&f32_values(qkv), &f32_values(grad));
        f32_tensor(dqkv, [shape.b, shape.t, 3 * shape.h * shape.kd])
    }
}

fn bools<B: Backend>(x: Tensor<B, 4, Bool>) -> Vec<bool> {
    x.into_data().into_vec::<bool>().expect("a boolean attention mask")
}

#[cfg(feature = "wgpu")]
impl AttentionBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl AttentionBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl AttentionBackend for burn::backend::LibTorch {}

/// The attention node of the autodiff graph: it keeps `q`, `k`, `v` and the
/// mask, and hands the output's gradient to the inner backend's backward.
#[derive(Debug)]
struct CausalAttention;

type AttentionState<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, Option<BoolTensor<B>>);

impl<B: AttentionBackend> Backward<B, 3> for CausalAttention {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (q, k, v, mask) = ops.state;
        let float = |x| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(x));
        let mask = mask.map(Tensor::<B, 4, Bool>::from_primitive);
        let parts = B::causal_attention_backward(float(q), float(k), float(v), mask, float(grad));
        for (parent, part) in ops.parents.into_iter().zip(parts) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, part.into_primitive().tensor());
            }
        }
    }
}

impl<B: AttentionBackend, C: CheckpointStrategy> AttentionBackend for Autodiff<B, C> {
    fn causal_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
    ) -> Tensor<Self, 4> {
        let (q, k, v) = (q.into_primitive().tensor(), k.into_primitive().tensor(), v.into_primitive().tensor());
        let mask: Option<BoolTensor<B>> = mask.map(|m| m.into_primitive());
        let forward = || {
            let float = |x: &FloatTensor<B>| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(x.clone()));
            let mask = mask.clone().map(Tensor::<B, 4, Bool>::from_primitive);
            B::causal_attention(float(&q.primitive), float(&k.primitive), float(&v.primitive), mask).into_primitive().tensor()
        };
        let out = match CausalAttention.prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((q.primitive, k.primitive, v.primitive, mask), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let qkv = qkv.into_primitive().tensor();
        let float = |x: &FloatTensor<B>| Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(x.clone()));
        let forward = || B::packed_causal_attention(float(&qkv.primitive), heads).into_primitive().tensor();
        let out = match PackedAttention.prepare::<C>([qkv.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((qkv.primitive, heads), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

/// The packed attention node: it keeps `qkv` and the head count.
#[derive(Debug)]
struct PackedAttention;

impl<B: AttentionBackend> Backward<B, 1> for PackedAttention {
    type State = (FloatTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (qkv, heads) = ops.state;
        let float = |x| Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(x));
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let dqkv = B::packed_causal_attention_backward(float(qkv), heads, float(grad));
            grads.register::<B>(node.id, dqkv.into_primitive().tensor());
        }
    }
}

/// Sizes of one attention call: batch, heads, queries, keys, head width.
#[derive(Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    t: usize,
    p: usize,
    kd: usize,
}

// The kernels are plain loops over slices, every helper `inline(always)`:
// `pulp::Arch::dispatch` compiles them inside a function with the CPU's best
// instruction set enabled (AVX2 and FMA, or AVX-512) and picks it at run
// time, where the binary itself targets baseline x86-64.

/// One (row, head)'s slices: queries (or their gradients) `[t, k]`, keys
/// and values (or theirs) `[p, k]`, the mask `[t, p]`.
type Head<'a> = [&'a [f32]; 4];

impl Shape {
    fn of<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>) -> Self {
        let [b, h, t, kd] = q.dims();
        Self { b, h, t, p: k.dims()[2], kd }
    }

    fn packed<B: Backend>(qkv: &Tensor<B, 3>, heads: usize) -> Self {
        let [b, t, d3] = qkv.dims();
        Self { b, h: heads, t, p: t, kd: d3 / 3 / heads }
    }

    /// Head `hi`'s channels of each of `rows` rows `width` wide, starting
    /// at column `at`: `[t, k]` contiguous.
    fn gather(self, rows: &[f32], width: usize, at: usize) -> Vec<f32> {
        rows.chunks_exact(width).flat_map(|row| &row[at..at + self.kd]).copied().collect()
    }

    /// The output `[b, t, d]` of packed `qkv` `[b, t, 3d]`: one task per
    /// (row, head) on its own copy of its head, then the heads side by side.
    fn packed_forward(self, qkv: &[f32]) -> Vec<f32> {
        let Shape { b, h, t, kd, .. } = self;
        let d = h * kd;
        let simd = pulp::Arch::new();
        let heads: Vec<Vec<f32>> = (0..b * h)
            .into_par_iter()
            .map(|bh| {
                let (rows, hi) = (&qkv[bh / h * t * 3 * d..(bh / h + 1) * t * 3 * d], bh % h);
                let [q, k, v] = [0, 1, 2].map(|part| self.gather(rows, 3 * d, part * d + hi * kd));
                let mut out = vec![0.0; t * kd];
                simd.dispatch(Kernel { shape: self, head: [&q, &k, &v, &[]], mask: None, out: Out::Forward(&mut out) });
                out
            })
            .collect();
        let mut out = vec![0.0; b * t * d];
        for (bh, head) in heads.iter().enumerate() {
            let (bi, hi) = (bh / h, bh % h);
            for (i, row) in head.chunks_exact(kd).enumerate() {
                out[(bi * t + i) * d + hi * kd..][..kd].copy_from_slice(row);
            }
        }
        out
    }

    /// `d qkv` `[b, t, 3d]` from packed `qkv` and the output's `grad`
    /// `[b, t, d]`, as [`Shape::packed_forward`] splits the work.
    fn packed_backward(self, qkv: &[f32], grad: &[f32]) -> Vec<f32> {
        let Shape { b, h, t, kd, .. } = self;
        let d = h * kd;
        let simd = pulp::Arch::new();
        let heads: Vec<[Vec<f32>; 3]> = (0..b * h)
            .into_par_iter()
            .map(|bh| {
                let (bi, hi) = (bh / h, bh % h);
                let rows = &qkv[bi * t * 3 * d..(bi + 1) * t * 3 * d];
                let [q, k, v] = [0, 1, 2].map(|part| self.gather(rows, 3 * d, part * d + hi * kd));
                let g = self.gather(&grad[bi * t * d..(bi + 1) * t * d], d, hi * kd);
                let [mut dq, mut dk, mut dv] = [0, 1, 2].map(|_| vec![0.0; t * kd]);
                let out = Out::Backward([&mut dq, &mut dk, &mut dv]);
                simd.dispatch(Kernel { shape: self, head: [&q, &k, &v, &g], mask: None, out });
                [dq, dk, dv]
            })
            .collect();
        let mut dqkv = vec![0.0; b * t * 3 * d];
        for (bh, parts) in heads.iter().enumerate() {
            let (bi, hi) = (bh / h, bh % h);
            for (part, x) in parts.iter().enumerate() {
                for (i, row) in x.chunks_exact(kd).enumerate() {
                    dqkv[(bi * t + i) * 3 * d + part * d + hi * kd..][..kd].copy_from_slice(row);
                }
            }
        }
        dqkv
    }

    /// This (row, head)'s part of `[q, k, v, grad]` and of the mask.
    fn head<'a>(self, bh: usize, [q, k, v, grad]: Head<'a>, mask: Option<&'a [bool]>) -> (Head<'a>, Option<&'a [bool]>) {
        let Shape { t, p, kd, .. } = self;
        let (queries, keys) = (bh * t * kd..(bh + 1) * t * kd, bh * p * kd..(bh + 1) * p * kd);
        let grad = if grad.is_empty() { grad } else { &grad[queries.clone()] };
        ([&q[queries], &k[keys.clone()], &v[keys], grad], mask.map(|m| &m[bh * t * p..(bh + 1) * t * p]))
    }

    /// The output `[b, h, t, k]`: one task per (row, head).
    fn forward(self, q: &[f32], k: &[f32], v: &[f32], mask: Option<&[bool]>) -> Vec<f32> {
        let Shape { b, h, t, kd, .. } = self;
        let mut out = vec![0.0; b * h * t * kd];
        let simd = pulp::Arch::new();
        out.par_chunks_mut(t * kd).enumerate().for_each(|(bh, out)| {
            let (head, mask) = self.head(bh, [q, k, v, &[]], mask);
            simd.dispatch(Kernel { shape: self, head, mask, out: Out::Forward(out) });
        });
        out
    }

    /// `[dq, dk, dv]` from row-major `q`, `grad` `[b, h, t, k]` and `k`, `v`
    /// `[b, h, p, k]`: one task per (row, head).
    fn backward(self, q: &[f32], k: &[f32], v: &[f32], grad: &[f32], mask: Option<&[bool]>) -> [Vec<f32>; 3] {
        let Shape { b, h, t, p, kd } = self;
        let (mut dq, mut dk, mut dv) = (vec![0.0; b * h * t * kd], vec![0.0; b * h * p * kd], vec![0.0; b * h * p * kd]);
        let simd = pulp::Arch::new();
        dq.par_chunks_mut(t * kd).zip(dk.par_chunks_mut(p * kd)).zip(dv.par_chunks_mut(p * kd)).enumerate().for_each(
            |(bh, ((dq, dk), dv))| {
                let (head, mask) = self.head(bh, [q, k, v, grad], mask);
                simd.dispatch(Kernel { shape: self, head, mask, out: Out::Backward([dq, dk, dv]) });
            },
        );
        [dq, dk, dv]
    }

    /// Query `i`'s probabilities over the keys it sees into `probs`, from
    /// its query `qi` and the keys transposed, `kt` `[k, p]`. Only the first
    /// `visible` entries are written (later keys are in its future);
    /// returns `visible`, or 0 when the mask hides every key.
    #[inline(always)]
    fn row_probs(self, i: usize, qi: &[f32], kt: &[f32], mask: Option<&[bool]>, probs: &mut [f32]) -> usize {
        let Shape { t, p, kd, .. } = self;
        let scale = 1.0 / (kd as f32).sqrt();
        let visible = p - t + i + 1;
        let scores = &mut probs[..visible];
        scores.fill(0.0);
        for (c, &x) in qi.iter().enumerate() {
            axpy(scores, x * scale, &kt[c * p..c * p + visible]);
        }
        if let Some(mask) = mask {
            for (s, &hidden) in scores.iter_mut().zip(&mask[i * p..i * p + visible]) {
                if hidden {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        if max == f32::NEG_INFINITY {
            return 0;
        }
        for s in scores.iter_mut() {
            *s = exp(*s - max);
        }
        let inverse = 1.0 / sum(scores);
        for s in scores.iter_mut() {
            *s *= inverse;
        }
        visible
    }

    /// One (row, head): `out[i] = Σ_j P_ij v_j`.
    #[inline(always)]
    fn head_forward(self, [q, k, v, _]: Head<'_>, mask: Option<&[bool]>, out: &mut [f32]) {
        let Shape { t, p, kd, .. } = self;
        let (kt, vt) = (transpose(k, p, kd), transpose(v, p, kd));
        let mut probs = vec![0.0f32; p];
        for i in 0..t {
            let visible = self.row_probs(i, &q[i * kd..(i + 1) * kd], &kt, mask, &mut probs);
            for (c, o) in out[i * kd..(i + 1) * kd].iter_mut().enumerate() {
                *o = dot(&probs[..visible], &vt[c * p..c * p + visible]);
            }
        }
    }

    /// One (row, head): its queries' probabilities recomputed, then the
    /// three gradients accumulated over the visible keys. Keys, values and
    /// their gradients are held transposed, `[k, p]`, so that every inner
    /// loop runs along the keys.
    #[inline(always)]
    fn head_backward(self, [q, k, v, grad]: Head<'_>, mask: Option<&[bool]>, [dq, dk, dv]: [&mut [f32]; 3]) {
        let Shape { t, p, kd, .. } = self;
        let scale = 1.0 / (kd as f32).sqrt();
        let (kt, vt) = (transpose(k, p, kd), transpose(v, p, kd));
        let (mut dkt, mut dvt) = (vec![0.0f32; kd * p], vec![0.0f32; kd * p]);
        let (mut probs, mut ds) = (vec![0.0f32; p], vec![0.0f32; p]);
        for i in 0..t {
            let (qi, gi) = (&q[i * kd..(i + 1) * kd], &grad[i * kd..(i + 1) * kd]);
            let visible = self.row_probs(i, qi, &kt, mask, &mut probs);
            let (probs, ds) = (&probs[..visible], &mut ds[..visible]);
            // dP = dO vᵀ; dS = P ∘ (dP − rowsum(P ∘ dP)) · s.
            ds.fill(0.0);
            for (c, &g) in gi.iter().enumerate() {
                axpy(ds, g, &vt[c * p..c * p + visible]);
            }
            let delta = dot(probs, ds);
            for (d, &pj) in ds.iter_mut().zip(probs) {
                *d = pj * (*d - delta) * scale;
            }
            for c in 0..kd {
                let keys = c * p..c * p + visible;
                dq[i * kd + c] = dot(ds, &kt[keys.clone()]);
                axpy(&mut dkt[keys.clone()], qi[c], ds);
                axpy(&mut dvt[keys], gi[c], probs);
            }
        }
        dk.copy_from_slice(&transpose(&dkt, kd, p));
        dv.copy_from_slice(&transpose(&dvt, kd, p));
    }
}

/// One (row, head)'s kernel for `pulp::Arch::dispatch`, which compiles
/// `with_simd` inside a function built for the chosen instruction set; the
/// kernels, `inline(always)`, are compiled into it. (A closure handed to
/// `dispatch` was compiled on its own, for baseline x86-64.)
struct Kernel<'a> {
    shape: Shape,
    head: Head<'a>,
    mask: Option<&'a [bool]>,
    out: Out<'a>,
}

/// What a [`Kernel`] computes: the output, or `[dq, dk, dv]`.
enum Out<'a> {
    Forward(&'a mut [f32]),
    Backward([&'a mut [f32]; 3]),
}

impl pulp::WithSimd for Kernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        match self.out {
            Out::Forward(out) => self.shape.head_forward(self.head, self.mask, out),
            Out::Backward(grads) => self.shape.head_backward(self.head, self.mask, grads),
        }
    }
}

/// `[rows, cols]` row-major to `[cols, rows]`.
#[inline(always)]
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (r, row) in x.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// Σ aᵢ·bᵢ, in eight independent partial sums (which vectorise; one
/// running sum would not, float addition not being associative). The
/// order is fixed by the code, so every instruction set gets the same result.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Σ xᵢ, as [`dot`] sums.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let x8 = x.chunks_exact(8);
    let tail: f32 = x8.remainder().iter().sum();
    for x in x8 {
        for (l, x) in lanes.iter_mut().zip(x) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += a·x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `eˣ` for `x ≤ 0` (softmax's shifted scores), in straight-line
/// arithmetic that vectorises, where libm's `expf` is a call per element:
/// `eˣ = 2ⁿ·eʳ` with `n = round(x·log₂e)` and `eʳ` by Cephes' degree-6
/// polynomial on `|r| ≤ ln2/2`; relative error below 2e-7. Below −87 (and
/// for −∞, a hidden key) it is 0.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    let xc = x.max(-87.0);
    let shifted = xc * std::f32::consts::LOG2_E + ROUND; // its low bits hold n
    let n = shifted - ROUND;
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4; // x − n·ln2, in two parts
    let poly =
        ((((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_66) * r + 0.5) * r + 1.0) * r
            + 1.0;
    // 2ⁿ from n's bits, without a float-to-integer conversion (Rust's
    // saturating `as` would keep the loop from vectorising).
    let two_n = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { poly * two_n }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Ad = Autodiff<Flex>;

    fn random(shape: [usize; 4], seed: u64) -> Tensor<Ad, 4> {
        let mut rng = ragen_env_sdk::SeedRng::stream(seed, 0);
        let n = shape.iter().product();
        let xs: Vec<f32> = (0..n).map(|_| rng.below(2001) as f32 / 1000.0 - 1.0).collect();
        Tensor::from_data(TensorData::new(xs, shape), &Default::default())
    }

    fn close(a: Tensor<Flex, 4>, b: Tensor<Flex, 4>, what: &str) {
        let (a, b) = (a.into_data().into_vec::<f32>().unwrap(), b.into_data().into_vec::<f32>().unwrap());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{what}: largest difference {worst}");
    }

    /// Gradients of Σ out ∘ w through Burn's own attention (the fallback
    /// graph) and through ours.
    fn gradients(fused: bool, [b, h, t, p, kd]: [usize; 5], mask: Option<Tensor<Ad, 4, Bool>>) -> Vec<Tensor<Flex, 4>> {
        let q = random([b, h, t, kd], 1).require_grad();
        let k = random([b, h, p, kd], 2).require_grad();
        let v = random([b, h, p, kd], 3).require_grad();
        let w = random([b, h, t, kd], 4);
        let out = if fused {
            Ad::causal_attention(q.clone(), k.clone(), v.clone(), mask)
        } else {
            let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
            attention(q.clone(), k.clone(), v.clone(), mask, None, options)
        };
        let grads = (out.clone() * w).sum().backward();
        vec![out.inner(), q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()]
    }

    fn agree(shape: [usize; 5], mask: impl Fn() -> Option<Tensor<Ad, 4, Bool>>) {
        let ours = gradients(true, shape, mask());
        let burns = gradients(false, shape, mask());
        for ((a, b), what) in ours.into_iter().zip(burns).zip(["output", "dq", "dk", "dv"]) {
            close(a, b, what);
        }
    }

    #[test]
    fn the_fused_node_matches_burns_attention_and_its_gradients() {
        agree([2, 3, 7, 7, 4], || None);
        // More keys than queries (a cache before the new positions).
        agree([1, 2, 3, 9, 8], || None);
    }

    #[test]
    fn a_padding_mask_hides_keys_in_the_backward_pass_too() {
        let [b, h, t, p] = [2, 2, 5, 5];
        let hidden: Vec<bool> = (0..b * h * t * p).map(|i| i % p == 1 && i / (h * t * p) == 1).collect();
        agree([b, h, t, p, 4], || Some(Tensor::from_data(TensorData::new(hidden.clone(), [b, h, t, p]), &Default::default())));
    }

    /// Output and gradient of Σ out ∘ w for packed `qkv` `[b, t, 3d]`,
    /// through the fused packed node or through Burn's attention head by head.
    fn packed_gradients(fused: bool, [b, t, d, heads]: [usize; 4]) -> [Tensor<Flex, 3>; 2] {
        let qkv = random([b, t, 3 * d, 1], 9).reshape([b, t, 3 * d]).require_grad();
        let w = random([b, t, d, 1], 10).reshape([b, t, d]);
        let out = if fused {
            Ad::packed_causal_attention(qkv.clone(), heads)
        } else {
            let [q, k, v] = split_heads(qkv.clone(), heads);
            let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
            merge_heads(attention(q, k, v, None, None, options))
        };
        let grads = (out.clone() * w).sum().backward();
        [out.inner(), qkv.grad(&grads).unwrap()]
    }

    #[test]
    fn packed_projections_give_what_attention_head_by_head_gives() {
        let shape = [3, 9, 12, 3];
        let [out, dqkv] = packed_gradients(true, shape);
        let [reference_out, reference_dqkv] = packed_gradients(false, shape);
        close(out.unsqueeze(), reference_out.unsqueeze(), "output");
        close(dqkv.unsqueeze(), reference_dqkv.unsqueeze(), "d qkv");
        // The default methods (what wgpu, CUDA and LibTorch run) agree too.
        let qkv = random([3, 9, 36, 1], 11).inner().reshape([3, 9, 36]);
        let grad = random([3, 9, 12, 1], 12).inner().reshape([3, 9, 12]);
        let kernel = Flex::packed_causal_attention_backward(qkv.clone(), 3, grad.clone());
        let [q, k, v] = split_heads(qkv, 3);
        let g = grad.reshape([3, 9, 3, 4]).swap_dims(1, 2);
        let tensors = Tensor::cat(attention_backward_tensors(q, k, v, None, g).map(merge_heads).to_vec(), 2);
        close(kernel.unsqueeze(), tensors.unsqueeze(), "d qkv, tensor equations");
    }

    #[test]
    fn the_polynomial_exp_is_within_a_few_ulps_of_libms() {
        for i in 0..=100_000 {
            let x = -87.0 * i as f32 / 100_000.0;
            let (ours, libm) = (exp(x), x.exp());
            assert!((ours - libm).abs() <= 3e-7 * libm, "exp({x}) = {ours}, libm {libm}");
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
    }

    #[test]
    fn the_tensor_equations_match_the_flex_kernel() {
        let [b, h, t, p, kd] = [2, 2, 6, 8, 4];
        let inner = |x: Tensor<Ad, 4>| x.inner();
        let (q, k, v, g) = (
            inner(random([b, h, t, kd], 5)),
            inner(random([b, h, p, kd], 6)),
            inner(random([b, h, p, kd], 7)),
            inner(random([b, h, t, kd], 8)),
        );
        let kernel = Flex::causal_attention_backward(q.clone(), k.clone(), v.clone(), None, g.clone());
        let tensors = attention_backward_tensors(q, k, v, None, g);
        for ((a, b), what) in kernel.into_iter().zip(tensors).zip(["dq", "dk", "dv"]) {
            close(a, b, what);
        }
    }
}
