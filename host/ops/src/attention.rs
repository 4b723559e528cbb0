//! Causal self-attention with a fused backward pass, on the layout the
//! projections around it read and write.
//!
//! Burn 0.21's autodiff backend differentiates attention by running its
//! reference composition (`attention_fallback`): the scores `[b, h, t, p]`
//! go through a dozen element-wise operations (scale, masks, max, shift,
//! exp, sum, divide), each of which reads and writes the whole score tensor
//! and records a node whose backward does as much again: on a CPU, the
//! larger part of a training pass.
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
//! The operands stay in the projections' row layout, heads side by side
//! (`[b, t, h·k]`), and keys and values may have fewer heads than queries
//! (grouped-query attention, as Llama and Qwen2 use). The usual split into
//! `[b, h, t, k]`, a copy of each head per query head and a merge back are
//! copies that each cost a pass over memory (and, under autodiff, a
//! backward pass), a sizeable share of a pretrained model's prefill. The
//! keys and values may also be a KV cache's buffers with room for more
//! positions than are filled, which the kernel reads in place.
//!
//! On flex our kernel does this a block of 8 queries at a time, without
//! materialising any `[t, p]` tensor and skipping the causally hidden half;
//! one task serves a key/value head and the query heads that read it. Each
//! product (scores, probabilities times values, and the backward pass's
//! five) keeps a block of outputs in vector registers while the shared
//! dimension goes by, as a matrix-product microkernel does: a row at a
//! time, every multiply-add would also load and store its accumulator
//! (docs/results.md, "Attention in blocks, and a pass per core"). Other
//! backends (wgpu, CUDA, LibTorch) run the same equations as tensor
//! operations, which is still far fewer passes than the fallback's graph.
//! [`AttentionBackend::packed_causal_attention`] is the same node on the
//! `qkv` projection as it comes out of one linear layer, `[b, t, 3d]`.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::{AttentionModuleOptions, BoolTensor, FloatTensor};
use rayon::prelude::*;

use crate::autodiff::{n_ary, primitive, record, tensor, unary};
use crate::flex::{f32_tensor, f32_values};
use crate::simd::{LANES, axpy, dot, exp, load, max_lane, store};

/// How many heads an attention call has: `query` heads read `key_value`
/// heads, each key/value head serving `query / key_value` consecutive query
/// heads (grouped-query attention; equal counts are multi-head attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionHeads {
    pub query: usize,
    pub key_value: usize,
}

impl AttentionHeads {
    /// Grouped-query attention; `query` must be a multiple of `key_value`.
    pub fn grouped(query: usize, key_value: usize) -> Self {
        assert!(key_value > 0 && query.is_multiple_of(key_value), "{query} query heads cannot share {key_value} key/value heads evenly");
        Self { query, key_value }
    }

    /// Multi-head attention: every query head has its own keys and values.
    pub fn multi(heads: usize) -> Self {
        Self::grouped(heads, heads)
    }
}

/// A backend that runs causal attention as one differentiable operation.
///
/// Every backend the host builds implements it: flex with its own backward
/// kernel, the others with the default methods.
pub trait AttentionBackend: Backend {
    /// `softmax(q kᵀ/√k, hiding masked and future keys) v` on row layouts:
    /// queries `q` `[b, t, h·k]`; keys `k` and values `v` `[b, P, g·k]`, of
    /// which the first `keys` rows (`t ≤ keys ≤ P`) are filled (a cache may
    /// have room for more); `mask` `[b, t, keys]` true where a query may not
    /// see a key. Causal from the bottom-right corner: query `i` sits at
    /// absolute position `keys − t + i` and sees keys up to it. Returns
    /// `[b, t, h·k]`, heads side by side.
    fn causal_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        mask: Option<Tensor<Self, 3, Bool>>,
        heads: AttentionHeads,
        keys: usize,
    ) -> Tensor<Self, 3> {
        tensor_attention(q, k, v, mask, heads, keys)
    }

    /// The gradients `[dq, dk, dv]` of [`AttentionBackend::causal_attention`]
    /// given the gradient `grad` `[b, t, h·k]` of its output; `dk` and `dv`
    /// are `[b, P, g·k]`, zero beyond the first `keys` rows.
    fn causal_attention_backward(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        mask: Option<Tensor<Self, 3, Bool>>,
        heads: AttentionHeads,
        keys: usize,
        grad: Tensor<Self, 3>,
    ) -> [Tensor<Self, 3>; 3] {
        attention_backward_tensors(q, k, v, mask, heads, keys, grad)
    }

    /// `buffer` `[b, P, w]` with `rows` `[b, t, w]` written at rows
    /// `at..at + t` (a KV cache's next positions). Flex writes in place when
    /// nobody else holds the buffer: Burn 0.21's flex `slice_assign` keeps a
    /// second handle on its input past its copy-on-write check, so it
    /// copies the whole buffer on every call.
    fn write_rows(buffer: Tensor<Self, 3>, at: usize, rows: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let ([b, _, w], t) = (buffer.dims(), rows.dims()[1]);
        buffer.slice_assign([0..b, at..at + t, 0..w], rows)
    }

    /// Causal self-attention over packed projections, without a cache or
    /// a mask: `qkv` `[b, t, 3d]` holds the queries, keys and values side by
    /// side, each `heads` heads of `d / heads` channels; returns `[b, t, d]`.
    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let [q, k, v] = split_packed(qkv);
        let t = q.dims()[1];
        Self::causal_attention(q, k, v, None, AttentionHeads::multi(heads), t)
    }

    /// The gradient `[b, t, 3d]` of [`AttentionBackend::packed_causal_attention`]
    /// with respect to `qkv`, given its output's `grad` `[b, t, d]`.
    fn packed_causal_attention_backward(qkv: Tensor<Self, 3>, heads: usize, grad: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let [q, k, v] = split_packed(qkv);
        let t = q.dims()[1];
        Tensor::cat(Self::causal_attention_backward(q, k, v, None, AttentionHeads::multi(heads), t, grad).to_vec(), 2)
    }
}

/// [`AttentionBackend::causal_attention`] through Burn's own attention (the
/// reference composition under autodiff, a fused kernel on most backends),
/// heads split off and keys shared out as it expects.
fn tensor_attention<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    mask: Option<Tensor<B, 3, Bool>>,
    heads: AttentionHeads,
    keys: usize,
) -> Tensor<B, 3> {
    let [b, t, _] = q.dims();
    let (h, g) = (heads.query, heads.key_value);
    let (k, v) = (k.narrow(1, 0, keys), v.narrow(1, 0, keys));
    let mask = mask.map(|m| m.unsqueeze_dim::<4>(1).expand([b, h, t, keys]));
    let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
    merge_heads(attention(to_heads(q, h), share(to_heads(k, g), h), share(to_heads(v, g), h), mask, None, options))
}

/// `[b, t, 3d]` to queries, keys and values `[b, t, d]`.
fn split_packed<B: Backend>(qkv: Tensor<B, 3>) -> [Tensor<B, 3>; 3] {
    let d = qkv.dims()[2] / 3;
    [0, 1, 2].map(|i| qkv.clone().narrow(2, i * d, d))
}

/// `[b, n, heads·k]` to `[b, heads, n, k]`.
fn to_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, n, w] = x.dims();
    x.reshape([b, n, heads, w / heads]).swap_dims(1, 2)
}

/// `[b, h, n, k]` to `[b, n, h·k]`.
fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, n, k] = x.dims();
    x.swap_dims(1, 2).reshape([b, n, h * k])
}

/// Keys or values `[b, g, p, k]` repeated for the query heads each serves:
/// `[b, h, p, k]`.
fn share<B: Backend>(x: Tensor<B, 4>, h: usize) -> Tensor<B, 4> {
    let [b, g, p, k] = x.dims();
    if g == h { x } else { x.unsqueeze_dim::<5>(2).expand([b, g, h / g, p, k]).reshape([b, h, p, k]) }
}

/// The backward equations as tensor operations, for any backend.
fn attention_backward_tensors<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    mask: Option<Tensor<B, 3, Bool>>,
    heads: AttentionHeads,
    keys: usize,
    grad: Tensor<B, 3>,
) -> [Tensor<B, 3>; 3] {
    let [b, t, hk] = q.dims();
    let [_, room, _] = k.dims();
    let (h, g, kd) = (heads.query, heads.key_value, hk / heads.query);
    let p = keys;
    let scale = 1.0 / (kd as f64).sqrt();
    let device = q.device();
    let future: Vec<bool> = (0..t).flat_map(|i| (0..p).map(move |j| j > p - t + i)).collect();
    let mut hidden = Tensor::<B, 2, Bool>::from_data(TensorData::new(future, [t, p]), &device).reshape([1, 1, t, p]).expand([b, h, t, p]);
    if let Some(mask) = mask {
        hidden = hidden.bool_or(mask.unsqueeze_dim::<4>(1).expand([b, h, t, p]));
    }
    let (q, grad) = (to_heads(q, h), to_heads(grad, h)); // [b, h, t, k]
    let k = share(to_heads(k.narrow(1, 0, p), g), h); // [b, h, p, k]
    let v = share(to_heads(v.narrow(1, 0, p), g), h);
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)) * scale; // [b, h, t, p]
    let probs = softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3); // [b, h, t, p]
    let dv = probs.clone().swap_dims(2, 3).matmul(grad.clone()); // [b, h, p, k]
    let dp = grad.matmul(v.swap_dims(2, 3)); // [b, h, t, p]
    let delta = (probs.clone() * dp.clone()).sum_dim(3); // [b, h, t, 1]
    let ds = probs * (dp - delta) * scale; // [b, h, t, p]
    let dq = ds.clone().matmul(k); // [b, h, t, k]
    let dk = ds.swap_dims(2, 3).matmul(q); // [b, h, p, k]
    // A key/value head's gradient sums its query heads'; rows past `keys`
    // (a cache's spare room) get none.
    let unshare = |x: Tensor<B, 4>| {
        let x = merge_heads(x.reshape([b, g, h / g, p, kd]).sum_dim(2).reshape([b, g, p, kd])); // [b, p, g·k]
        if room > p { Tensor::cat(vec![x, Tensor::zeros([b, room - p, g * kd], &device)], 1) } else { x }
    };
    [merge_heads(dq), unshare(dk), unshare(dv)]
}

impl AttentionBackend for burn::backend::Flex {
    fn causal_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        mask: Option<Tensor<Self, 3, Bool>>,
        heads: AttentionHeads,
        keys: usize,
    ) -> Tensor<Self, 3> {
        let shape = Shape::rows(&q, &k, heads, keys);
        let mask = mask.map(bools);
        let out = shape.forward(&f32_values(q), &f32_values(k), &f32_values(v), mask.as_deref());
        f32_tensor(out, [shape.b, shape.t, shape.h * shape.kd])
    }

    fn causal_attention_backward(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        mask: Option<Tensor<Self, 3, Bool>>,
        heads: AttentionHeads,
        keys: usize,
        grad: Tensor<Self, 3>,
    ) -> [Tensor<Self, 3>; 3] {
        let shape = Shape::rows(&q, &k, heads, keys);
        let (q_dims, k_dims) = (q.dims(), k.dims());
        let mask = mask.map(bools);
        let pieces = shape.backward(&f32_values(q), &f32_values(k), &f32_values(v), &f32_values(grad), mask.as_deref());
        let gradient = |part: usize, dims: [usize; 3]| {
            let mut x = vec![0.0; dims.iter().product()];
            shape.scatter_gradient(&pieces, part, &mut x);
            f32_tensor(x, dims)
        };
        [gradient(0, q_dims), gradient(1, k_dims), gradient(2, k_dims)]
    }

    fn write_rows(buffer: Tensor<Self, 3>, at: usize, rows: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let ([b, room, w], t) = (buffer.dims(), rows.dims()[1]);
        let mut x = primitive(buffer);
        let whole = x.dtype() == burn::tensor::DType::F32 && x.layout().is_contiguous() && x.layout().start_offset() == 0;
        match x.try_storage_mut::<f32>().filter(|s| whole && s.len() == b * room * w) {
            Some(storage) => {
                let rows = f32_values(rows);
                for (bi, new) in rows.chunks_exact(t * w).enumerate() {
                    storage[(bi * room + at) * w..][..t * w].copy_from_slice(new);
                }
                tensor(x)
            }
            None => tensor::<Self, 3>(x).slice_assign([0..b, at..at + t, 0..w], rows),
        }
    }

    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let shape = Shape::packed(&qkv, heads);
        let qkv = f32_values(qkv);
        let out = shape.forward(&qkv, &qkv, &qkv, None);
        f32_tensor(out, [shape.b, shape.t, shape.h * shape.kd])
    }

    fn packed_causal_attention_backward(qkv: Tensor<Self, 3>, heads: usize, grad: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let shape = Shape::packed(&qkv, heads);
        let dims = qkv.dims();
        let qkv = f32_values(qkv);
        let pieces = shape.backward(&qkv, &qkv, &qkv, &f32_values(grad), None);
        let mut dqkv = vec![0.0; dims.iter().product()];
        for part in 0..3 {
            shape.scatter_gradient(&pieces, part, &mut dqkv);
        }
        f32_tensor(dqkv, dims)
    }
}

fn bools<B: Backend>(x: Tensor<B, 3, Bool>) -> Vec<bool> {
    x.into_data().into_vec::<bool>().expect("a boolean attention mask")
}

#[cfg(feature = "wgpu")]
impl AttentionBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl AttentionBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl AttentionBackend for burn::backend::LibTorch {}

/// The attention node of the autodiff graph: it keeps `q`, `k`, `v`, the
/// mask and the shape, and hands the output's gradient to the inner
/// backend's backward.
#[derive(Debug)]
struct CausalAttention;

type AttentionState<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, Option<BoolTensor<B>>, AttentionHeads, usize);

impl<B: AttentionBackend> Backward<B, 3> for CausalAttention {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        n_ary(ops, grads, |(q, k, v, mask, heads, keys): AttentionState<B>, grad: Tensor<B, 3>, _| {
            let mask = mask.map(Tensor::<B, 3, Bool>::from_primitive);
            B::causal_attention_backward(tensor(q), tensor(k), tensor(v), mask, heads, keys, grad).map(|part| Some(primitive(part)))
        });
    }
}

impl<B: AttentionBackend, C: CheckpointStrategy> AttentionBackend for Autodiff<B, C> {
    fn causal_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        mask: Option<Tensor<Self, 3, Bool>>,
        heads: AttentionHeads,
        keys: usize,
    ) -> Tensor<Self, 3> {
        let (q, k, v) = (primitive(q), primitive(k), primitive(v));
        let mask: Option<BoolTensor<B>> = mask.map(|m| m.into_primitive());
        let inner = |x: &FloatTensor<B>| tensor::<B, 3>(x.clone());
        let inner_mask = mask.clone().map(Tensor::<B, 3, Bool>::from_primitive);
        let out = primitive(B::causal_attention(inner(&q.primitive), inner(&k.primitive), inner(&v.primitive), inner_mask, heads, keys));
        let prep = CausalAttention.prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()]).compute_bound();
        record(prep, (q.primitive, k.primitive, v.primitive, mask, heads, keys), out)
    }

    fn packed_causal_attention(qkv: Tensor<Self, 3>, heads: usize) -> Tensor<Self, 3> {
        let qkv = primitive(qkv);
        let out = primitive(B::packed_causal_attention(tensor(qkv.primitive.clone()), heads));
        record(PackedAttention.prepare::<C>([qkv.node.clone()]).compute_bound(), (qkv.primitive, heads), out)
    }
}

/// The packed attention node: it keeps `qkv` and the head count.
#[derive(Debug)]
struct PackedAttention;

impl<B: AttentionBackend> Backward<B, 1> for PackedAttention {
    type State = (FloatTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary(ops, grads, |(qkv, heads): (FloatTensor<B>, usize), grad: Tensor<B, 3>| {
            B::packed_causal_attention_backward(tensor(qkv), heads, grad)
        });
    }
}

/// Where one operand's heads lie in its buffer: head `hi` of batch entry
/// `bi`'s row `i` is the `k` floats from `bi·batch + i·width + offset + hi·k`.
#[derive(Clone, Copy)]
struct Operand {
    batch: usize,
    width: usize,
    offset: usize,
}

impl Operand {
    /// `[b, rows, width]`, heads from column 0.
    fn rows(rows: usize, width: usize) -> Self {
        Self { batch: rows * width, width, offset: 0 }
    }

    /// Heads `h0..h0 + heads` of rows `0..n` of batch entry `bi`, `kd`
    /// channels each, into `[heads, rows, width]` zero-padded blocks
    /// (`pad = [rows, width]`, at least `[n, kd]`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn gather(self, x: &[f32], kd: usize, bi: usize, h0: usize, heads: usize, n: usize, [rows, width]: [usize; 2]) -> Vec<f32> {
        let mut out = vec![0.0; heads * rows * width];
        for (j, head) in out.chunks_exact_mut(rows * width).enumerate() {
            for (i, row) in head.chunks_exact_mut(width).take(n).enumerate() {
                let at = bi * self.batch + i * self.width + self.offset + (h0 + j) * kd;
                row[..kd].copy_from_slice(&x[at..at + kd]);
            }
        }
        out
    }

    /// Head `hi` of rows `0..n` of batch entry `bi`, transposed and
    /// zero-padded to `columns` (at least `n`): `[kd, columns]`.
    #[inline(always)]
    fn gather_transposed(self, x: &[f32], kd: usize, bi: usize, hi: usize, n: usize, columns: usize) -> Vec<f32> {
        let mut out = vec![0.0; kd * columns];
        for i in 0..n {
            let at = bi * self.batch + i * self.width + self.offset + hi * kd;
            for (c, &value) in x[at..at + kd].iter().enumerate() {
                out[c * columns + i] = value;
            }
        }
        out
    }

    /// The inverse of [`Operand::gather`] without padding: `piece`
    /// `[heads, n, kd]` written into `x`.
    fn scatter(self, x: &mut [f32], kd: usize, bi: usize, h0: usize, n: usize, piece: &[f32]) {
        for (j, head) in piece.chunks_exact(n * kd).enumerate() {
            for (i, row) in head.chunks_exact(kd).enumerate() {
                let at = bi * self.batch + i * self.width + self.offset + (h0 + j) * kd;
                x[at..at + kd].copy_from_slice(row);
            }
        }
    }
}

/// Sizes of one attention call (batch, query heads, key/value heads, new
/// positions, visible keys, head width) and where its operands lie.
#[derive(Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    g: usize,
    t: usize,
    p: usize,
    kd: usize,
    q: Operand,
    k: Operand,
    v: Operand,
}

/// Up to this many new positions, the forward pass reads keys and values
/// row by row in place ([`Shape::head_forward_rows`]); beyond, the blocked
/// kernels' copies pay for themselves.
const ROW_WISE_QUERIES: usize = 8;

/// One task's gradients: `dq` of its query heads `[h/g, t, k]`, `dk` and
/// `dv` of its key/value head `[p, k]`.
type Pieces = [Vec<f32>; 3];

/// One task's key/value head, copied once for all its query heads: the
/// keys transposed `[k, pp]` (scores are rows times its columns), and the
/// rows `[pp, kp]` that probabilities weigh. `pp` and `kp` are `p` and `k`
/// rounded up to [`LANES`], the padding zero. (Keys, in score rows, and
/// channels, in head rows, go in blocks of [`LANES`].)
struct KeyValues {
    keys_t: Vec<f32>,
    values: Vec<f32>,
}

// The kernels are plain loops over slices and fixed-size arrays, every
// helper `inline(always)`, dispatched by `pulp` as the `simd` module
// describes. Each output element is summed in an order fixed by the code,
// whatever the block sizes, so every instruction set gives the same result.

impl Shape {
    /// Queries `[b, t, h·k]`, keys and values `[b, P, g·k]`, `keys` of the
    /// `P` rows filled.
    fn rows<B: Backend>(q: &Tensor<B, 3>, k: &Tensor<B, 3>, heads: AttentionHeads, keys: usize) -> Self {
        let ([b, t, hk], [_, room, gk]) = (q.dims(), k.dims());
        let (h, g) = (heads.query, heads.key_value);
        let kd = hk / h;
        assert!(hk == h * kd && gk == g * kd, "queries [{b}, {t}, {hk}] and keys [{b}, {room}, {gk}] for {h} and {g} heads");
        assert!(t <= keys && keys <= room, "{t} queries over {keys} of {room} keys");
        let kv = Operand::rows(room, gk);
        Self { b, h, g, t, p: keys, kd, q: Operand::rows(t, hk), k: kv, v: kv }
    }

    /// Packed `qkv` `[b, t, 3d]`.
    fn packed<B: Backend>(qkv: &Tensor<B, 3>, heads: usize) -> Self {
        let [b, t, d3] = qkv.dims();
        let d = d3 / 3;
        let part = |i: usize| Operand { batch: t * d3, width: d3, offset: i * d };
        Self { b, h: heads, g: heads, t, p: t, kd: d / heads, q: part(0), k: part(1), v: part(2) }
    }

    /// The output's (and its gradient's) layout, `[b, t, h·k]`.
    fn out(self) -> Operand {
        Operand::rows(self.t, self.h * self.kd)
    }

    /// Keys and head width rounded up to [`LANES`]: `[pp, kp]`.
    fn padded(self) -> [usize; 2] {
        [self.p.next_multiple_of(LANES), self.kd.next_multiple_of(LANES)]
    }

    /// Batch entry `bi`'s mask `[t, p]`.
    fn mask_of(self, mask: Option<&[bool]>, bi: usize) -> Option<&[bool]> {
        mask.map(|m| &m[bi * self.t * self.p..(bi + 1) * self.t * self.p])
    }

    /// The output `[b, t, h·k]`: one task per (batch entry, key/value head).
    fn forward(self, q: &[f32], k: &[f32], v: &[f32], mask: Option<&[bool]>) -> Vec<f32> {
        let Shape { b, h, g, t, kd, .. } = self;
        let simd = pulp::Arch::new();
        let pieces: Vec<Vec<f32>> = (0..b * g)
            .into_par_iter()
            .map(|task| {
                let mut out = vec![0.0; h / g * t * kd];
                let inputs = [q, k, v, &[]];
                simd.dispatch(Kernel { shape: self, task, inputs, mask: self.mask_of(mask, task / g), out: Out::Forward(&mut out) });
                out
            })
            .collect();
        let mut out = vec![0.0; b * t * h * kd];
        for (task, piece) in pieces.iter().enumerate() {
            self.out().scatter(&mut out, kd, task / g, task % g * (h / g), t, piece);
        }
        out
    }

    /// Each task's `[dq, dk, dv]` (see [`Pieces`]), given the output's
    /// `grad` `[b, t, h·k]`.
    fn backward(self, q: &[f32], k: &[f32], v: &[f32], grad: &[f32], mask: Option<&[bool]>) -> Vec<Pieces> {
        let Shape { b, h, g, t, p, kd, .. } = self;
        let simd = pulp::Arch::new();
        (0..b * g)
            .into_par_iter()
            .map(|task| {
                let [mut dq, mut dk, mut dv] = [h / g * t * kd, p * kd, p * kd].map(|n| vec![0.0; n]);
                let out = Out::Backward([&mut dq, &mut dk, &mut dv]);
                simd.dispatch(Kernel { shape: self, task, inputs: [q, k, v, grad], mask: self.mask_of(mask, task / g), out });
                [dq, dk, dv]
            })
            .collect()
    }

    /// Writes part `part` (0 `dq`, 1 `dk`, 2 `dv`) of every task's pieces
    /// into `x`, laid out as that operand is.
    fn scatter_gradient(self, pieces: &[Pieces], part: usize, x: &mut [f32]) {
        let Shape { h, g, t, p, kd, .. } = self;
        for (task, piece) in pieces.iter().enumerate() {
            let (bi, gi) = (task / g, task % g);
            match part {
                0 => self.q.scatter(x, kd, bi, gi * (h / g), t, &piece[0]),
                1 => self.k.scatter(x, kd, bi, gi, p, &piece[1]),
                _ => self.v.scatter(x, kd, bi, gi, p, &piece[2]),
            }
        }
    }

    /// Query `i`'s scaled scores over the `visible` keys it sees, the
    /// start of `row` (whose length is a multiple of [`LANES`]), turned into
    /// probabilities in place, masked keys and the rest of `row` at 0;
    /// returns `visible`, or 0 when the mask hides every key.
    #[inline(always)]
    fn softmax<S: pulp::Simd>(self, simd: S, i: usize, mask: Option<&[bool]>, row: &mut [f32], visible: usize) -> usize {
        if let Some(mask) = mask {
            for (s, &hidden) in row.iter_mut().zip(&mask[i * self.p..i * self.p + visible]) {
                if hidden {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        row[visible..].fill(f32::NEG_INFINITY);
        let (row, _) = S::as_mut_simd_f32s(row);
        let max = max_lane(simd, row);
        if max == f32::NEG_INFINITY {
            row.fill(simd.splat_f32s(0.0));
            return 0;
        }
        let (max, mut total) = (simd.splat_f32s(max), simd.splat_f32s(0.0));
        for x in row.iter_mut() {
            *x = exp(simd, simd.sub_f32s(*x, max));
            total = simd.add_f32s(total, *x);
        }
        let inverse = simd.splat_f32s(1.0 / simd.reduce_sum_f32s(total));
        for x in row.iter_mut() {
            *x = simd.mul_f32s(*x, inverse);
        }
        visible
    }

    /// One query head's few queries `q` `[t, k]` against keys and values
    /// read in place, row by row, without the blocked kernels' copies,
    /// which for one new position would cost as much as the attention
    /// itself. `at(j)` is where key/value row `j` starts.
    #[inline(always)]
    fn head_forward_rows<S: pulp::Simd>(
        self,
        simd: S,
        q: &[f32],
        [k, v]: [&[f32]; 2],
        at: impl Fn(Operand, usize) -> usize,
        mask: Option<&[bool]>,
        out: &mut [f32],
    ) {
        let Shape { t, p, kd, .. } = self;
        let scale = 1.0 / (kd as f32).sqrt();
        let mut probs = vec![0.0f32; self.padded()[0]];
        for (i, (qi, out)) in q.chunks_exact(kd).zip(out.chunks_exact_mut(kd)).enumerate() {
            let visible = p - t + i + 1;
            for (j, s) in probs[..visible].iter_mut().enumerate() {
                let key = at(self.k, j);
                *s = dot(qi, &k[key..key + kd]) * scale;
            }
            let visible = self.softmax(simd, i, mask, &mut probs[..visible.next_multiple_of(LANES)], visible);
            out.fill(0.0);
            for (j, &pj) in probs[..visible].iter().enumerate() {
                let value = at(self.v, j);
                axpy(out, pj, &v[value..value + kd]);
            }
        }
    }

    /// The probabilities of queries `i0..i0 + R` (their rows of `q`
    /// `[.., kp]`) into `probs` `[R, pp]`, over the first `n` keys, which it
    /// returns: the last query's visible keys rounded up to [`LANES`]. Keys
    /// a query does not see, and rows past `t`, are 0.
    #[inline(always)]
    fn block_probs<S: pulp::Simd>(self, simd: S, i0: usize, q: &[f32], keys_t: &[f32], mask: Option<&[bool]>, probs: &mut [f32]) -> usize {
        let Shape { t, p, kd, .. } = self;
        let [pp, kp] = self.padded();
        let n = (p - t + (i0 + R).min(t)).next_multiple_of(LANES);
        rows_times_columns(simd, &q[i0 * kp..], kp, kd, keys_t, pp, n, 1.0 / (kd as f32).sqrt(), probs);
        for (r, row) in probs.chunks_exact_mut(pp).enumerate() {
            let i = i0 + r;
            if i < t {
                self.softmax(simd, i, mask, &mut row[..n], p - t + i + 1);
            } else {
                row[..n].fill(0.0);
            }
        }
        n
    }

    /// One query head, `R` queries at a time: `out` `[t, k]` from its
    /// queries `q` `[t↑R, kp]` (`t` rounded up to `R`, zero-padded).
    #[inline(always)]
    fn head_forward<S: pulp::Simd>(self, simd: S, q: &[f32], kv: &KeyValues, mask: Option<&[bool]>, out: &mut [f32]) {
        let Shape { t, kd, .. } = self;
        let [pp, kp] = self.padded();
        let (mut probs, mut block) = (vec![0.0f32; R * pp], vec![0.0f32; R * kp]);
        for i0 in (0..t).step_by(R) {
            let n = self.block_probs(simd, i0, q, &kv.keys_t, mask, &mut probs);
            weights_times_rows(simd, &probs, pp, &kv.values, kp, n, &mut block); // O = P v
            for (r, row) in block.chunks_exact(kp).take(t - i0).enumerate() {
                out[(i0 + r) * kd..][..kd].copy_from_slice(&row[..kd]);
            }
        }
    }

    /// One query head, `R` queries at a time: its probabilities
    /// recomputed, then `dq` `[t, k]` written and the key/value head's
    /// `dk`, `dv` `[pp, kp]` accumulated. `q` and `grad` are `[t↑R, kp]`;
    /// `kv` holds keys as rows and values transposed (the backward pass
    /// multiplies by `k` and `vᵀ` where the forward one had `kᵀ` and `v`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn head_backward<S: pulp::Simd>(
        self,
        simd: S,
        [q, grad]: [&[f32]; 2],
        [kv, vk]: [&KeyValues; 2],
        mask: Option<&[bool]>,
        dq: &mut [f32],
        [dk, dv]: [&mut [f32]; 2],
    ) {
        let Shape { t, kd, .. } = self;
        let [pp, kp] = self.padded();
        let scale = 1.0 / (kd as f32).sqrt();
        let (mut probs, mut ds, mut block) = (vec![0.0f32; R * pp], vec![0.0f32; R * pp], vec![0.0f32; R * kp]);
        for i0 in (0..t).step_by(R) {
            let n = self.block_probs(simd, i0, q, &kv.keys_t, mask, &mut probs);
            // dP = dO vᵀ; dS = P ∘ (dP − rowsum(P ∘ dP)) · s.
            rows_times_columns(simd, &grad[i0 * kp..], kp, kd, &vk.keys_t, pp, n, 1.0, &mut ds);
            for (p_row, ds_row) in probs.chunks_exact(pp).zip(ds.chunks_exact_mut(pp)) {
                let (p_row, ds_row) = (&p_row[..n], &mut ds_row[..n]);
                let delta = dot(p_row, ds_row);
                for (d, &pj) in ds_row.iter_mut().zip(p_row) {
                    *d = pj * (*d - delta) * scale;
                }
            }
            weights_times_rows(simd, &ds, pp, &vk.values, kp, n, &mut block); // dq = dS k
            for (r, row) in block.chunks_exact(kp).take(t - i0).enumerate() {
                dq[(i0 + r) * kd..][..kd].copy_from_slice(&row[..kd]);
            }
            add_columns_times_rows(simd, &ds, pp, &q[i0 * kp..], kp, n, dk); // dk += dSᵀ q
            add_columns_times_rows(simd, &probs, pp, &grad[i0 * kp..], kp, n, dv); // dv += Pᵀ dO
        }
    }

    /// Key/value head `gi` of batch entry `bi`: `transposed` from `x` (as
    /// `op` lays it out), `rows` from `y`.
    #[inline(always)]
    fn key_values(self, bi: usize, gi: usize, [transposed, rows]: [(Operand, &[f32]); 2]) -> KeyValues {
        let Shape { p, kd, .. } = self;
        let [pp, kp] = self.padded();
        KeyValues {
            keys_t: transposed.0.gather_transposed(transposed.1, kd, bi, gi, p, pp),
            values: rows.0.gather(rows.1, kd, bi, gi, 1, p, [pp, kp]),
        }
    }

    /// One task: key/value head `task % g` of batch entry `task / g`, and
    /// the `h / g` query heads that read it, `R` queries at a time. Its
    /// keys and values are copied once for all of them.
    #[inline(always)]
    fn task<S: pulp::Simd>(self, simd: S, task: usize, [q, k, v, grad]: [&[f32]; 4], mask: Option<&[bool]>, out: Out<'_>) {
        let Shape { h, g, t, p, kd, .. } = self;
        let (bi, gi, r) = (task / g, task % g, h / g);
        let [pp, kp] = self.padded();
        let padded = [t.next_multiple_of(R), kp];
        match out {
            Out::Forward(out) if t <= ROW_WISE_QUERIES => {
                let queries = self.q.gather(q, kd, bi, gi * r, r, t, [t, kd]); // [r, t, k]
                let at = |op: Operand, j: usize| bi * op.batch + j * op.width + op.offset + gi * kd;
                for (q, out) in queries.chunks_exact(t * kd).zip(out.chunks_exact_mut(t * kd)) {
                    self.head_forward_rows(simd, q, [k, v], at, mask, out);
                }
            }
            Out::Forward(out) => {
                let queries = self.q.gather(q, kd, bi, gi * r, r, t, padded); // [r, t↑R, kp]
                let kv = self.key_values(bi, gi, [(self.k, k), (self.v, v)]);
                for (q, out) in queries.chunks_exact(padded[0] * kp).zip(out.chunks_exact_mut(t * kd)) {
                    self.head_forward(simd, q, &kv, mask, out);
                }
            }
            Out::Backward([dq, dk, dv]) => {
                let queries = self.q.gather(q, kd, bi, gi * r, r, t, padded);
                let grads = self.out().gather(grad, kd, bi, gi * r, r, t, padded);
                let kv = self.key_values(bi, gi, [(self.k, k), (self.v, v)]);
                let vk = self.key_values(bi, gi, [(self.v, v), (self.k, k)]);
                let (mut dk_rows, mut dv_rows) = (vec![0.0f32; pp * kp], vec![0.0f32; pp * kp]);
                let heads = queries.chunks_exact(padded[0] * kp).zip(grads.chunks_exact(padded[0] * kp));
                for ((q, g), dq) in heads.zip(dq.chunks_exact_mut(t * kd)) {
                    self.head_backward(simd, [q, g], [&kv, &vk], mask, dq, [&mut dk_rows, &mut dv_rows]);
                }
                for (to, from) in [(dk, &dk_rows), (dv, &dv_rows)] {
                    for (to, from) in to.chunks_exact_mut(kd).zip(from.chunks_exact(kp)).take(p) {
                        to.copy_from_slice(&from[..kd]);
                    }
                }
            }
        }
    }
}

/// Queries per block in the blocked kernels: eight accumulators of one
/// vector each (16 floats on AVX-512, 8 on AVX2), enough to keep the
/// multiply-add units busy and few enough to stay in registers.
const R: usize = 8;

/// `out[r][j] = s · Σ_c a[r][c]·bt[c][j]` for the `R` rows of `a` (`kd`
/// channels, rows `stride` apart) and the first `n` columns (a multiple of
/// [`LANES`]) of `bt` `[kd, columns]`; `out` is `[R, columns]`. Scores are
/// queries times transposed keys. Each block of `R` vectors of outputs
/// stays in registers while the channels go by.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rows_times_columns<S: pulp::Simd>(
    simd: S,
    a: &[f32],
    stride: usize,
    kd: usize,
    bt: &[f32],
    columns: usize,
    n: usize,
    s: f32,
    out: &mut [f32],
) {
    let lanes = size_of::<S::f32s>() / 4;
    let a: [&[f32]; R] = std::array::from_fn(|r| &a[r * stride..r * stride + kd]);
    for j0 in (0..n).step_by(lanes) {
        let mut acc = [simd.splat_f32s(0.0); R];
        for c in 0..kd {
            let b = load::<S>(bt, c * columns + j0);
            for (acc, a) in acc.iter_mut().zip(&a) {
                *acc = simd.mul_add_f32s(simd.splat_f32s(a[c]), b, *acc);
            }
        }
        for (r, acc) in acc.into_iter().enumerate() {
            store::<S>(out, r * columns + j0, simd.mul_f32s(acc, simd.splat_f32s(s)));
        }
    }
}

/// `out[r] = Σ_{j<n} w[r][j]·x[j]` for weights `w` `[R, columns]` and rows
/// `x` `[n.., width]` (`width` a multiple of [`LANES`]); `out` is
/// `[R, width]`. Probabilities times values, or `dS` times keys.
#[inline(always)]
fn weights_times_rows<S: pulp::Simd>(simd: S, w: &[f32], columns: usize, x: &[f32], width: usize, n: usize, out: &mut [f32]) {
    let lanes = size_of::<S::f32s>() / 4;
    let w: [&[f32]; R] = std::array::from_fn(|r| &w[r * columns..r * columns + n]);
    for c0 in (0..width).step_by(lanes) {
        let mut acc = [simd.splat_f32s(0.0); R];
        for j in 0..n {
            let row = load::<S>(x, j * width + c0);
            for (acc, w) in acc.iter_mut().zip(&w) {
                *acc = simd.mul_add_f32s(simd.splat_f32s(w[j]), row, *acc);
            }
        }
        for (r, acc) in acc.into_iter().enumerate() {
            store::<S>(out, r * width + c0, acc);
        }
    }
}

/// `y[j] += Σ_r w[r][j]·x[r]` for `j < n`: weights `w` `[R, columns]`
/// transposed times rows `x` `[R, width]`, added to `y` `[n.., width]`.
/// `dk += dSᵀ q` and `dv += Pᵀ dO`; each `y` row is read and written once
/// per block of `R` queries.
#[inline(always)]
fn add_columns_times_rows<S: pulp::Simd>(simd: S, w: &[f32], columns: usize, x: &[f32], width: usize, n: usize, y: &mut [f32]) {
    let lanes = size_of::<S::f32s>() / 4;
    let w: [&[f32]; R] = std::array::from_fn(|r| &w[r * columns..r * columns + n]);
    for c0 in (0..width).step_by(lanes) {
        let xs: [S::f32s; R] = std::array::from_fn(|r| load::<S>(x, r * width + c0));
        for j in 0..n {
            let mut acc = load::<S>(y, j * width + c0);
            for (w, &x) in w.iter().zip(&xs) {
                acc = simd.mul_add_f32s(simd.splat_f32s(w[j]), x, acc);
            }
            store::<S>(y, j * width + c0, acc);
        }
    }
}

/// One task's kernel for `pulp::Arch::dispatch`, which compiles `with_simd`
/// inside a function built for the chosen instruction set; the kernels,
/// `inline(always)`, are compiled into it. (A closure handed to `dispatch`
/// was compiled on its own, for baseline x86-64.)
struct Kernel<'a> {
    shape: Shape,
    task: usize,
    /// `[q, k, v, grad]`, whole buffers (`grad` empty going forward).
    inputs: [&'a [f32]; 4],
    /// This batch entry's mask `[t, p]`.
    mask: Option<&'a [bool]>,
    out: Out<'a>,
}

/// What a [`Kernel`] computes: its query heads' output, or its [`Pieces`].
enum Out<'a> {
    Forward(&'a mut [f32]),
    Backward([&'a mut [f32]; 3]),
}

impl pulp::WithSimd for Kernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        self.shape.task(simd, self.task, self.inputs, self.mask, self.out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Ad = Autodiff<Flex>;

    fn random(shape: [usize; 3], seed: u64) -> Tensor<Ad, 3> {
        let mut rng = ragen_rng::SeedRng::stream(seed, 0);
        let n = shape.iter().product();
        let xs: Vec<f32> = (0..n).map(|_| rng.below(2001) as f32 / 1000.0 - 1.0).collect();
        Tensor::from_data(TensorData::new(xs, shape), &Default::default())
    }

    fn close(a: Tensor<Flex, 3>, b: Tensor<Flex, 3>, what: &str) {
        assert_eq!(a.dims(), b.dims(), "{what}: shapes");
        let (a, b) = (a.into_data().into_vec::<f32>().unwrap(), b.into_data().into_vec::<f32>().unwrap());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{what}: largest difference {worst}");
    }

    /// Batch, new positions, query heads, key/value heads, head width, key
    /// rows in the buffers, and how many of them are filled.
    #[derive(Clone, Copy)]
    struct Case {
        b: usize,
        t: usize,
        h: usize,
        g: usize,
        kd: usize,
        room: usize,
        keys: usize,
    }

    /// Output and gradients of Σ out ∘ w through Burn's own attention (the
    /// fallback graph, heads split and shared out) or through our node.
    fn gradients(fused: bool, c: Case, mask: Option<Tensor<Ad, 3, Bool>>) -> Vec<Tensor<Flex, 3>> {
        let q = random([c.b, c.t, c.h * c.kd], 1).require_grad();
        let k = random([c.b, c.room, c.g * c.kd], 2).require_grad();
        let v = random([c.b, c.room, c.g * c.kd], 3).require_grad();
        let w = random([c.b, c.t, c.h * c.kd], 4);
        let heads = AttentionHeads::grouped(c.h, c.g);
        let out = if fused {
            Ad::causal_attention(q.clone(), k.clone(), v.clone(), mask, heads, c.keys)
        } else {
            tensor_attention(q.clone(), k.clone(), v.clone(), mask, heads, c.keys)
        };
        let grads = (out.clone() * w).sum().backward();
        vec![out.inner(), q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()]
    }

    fn agree(c: Case, mask: impl Fn() -> Option<Tensor<Ad, 3, Bool>>) {
        let ours = gradients(true, c, mask());
        let burns = gradients(false, c, mask());
        for ((a, b), what) in ours.into_iter().zip(burns).zip(["output", "dq", "dk", "dv"]) {
            close(a, b, what);
        }
    }

    #[test]
    fn the_fused_node_matches_burns_attention_and_its_gradients() {
        agree(Case { b: 2, t: 7, h: 3, g: 3, kd: 4, room: 7, keys: 7 }, || None);
        // More keys than queries (a cache before the new positions).
        agree(Case { b: 1, t: 3, h: 2, g: 2, kd: 8, room: 9, keys: 9 }, || None);
        // More queries than the row-wise path takes: the blocked kernels.
        agree(Case { b: 2, t: ROW_WISE_QUERIES + 4, h: 4, g: 2, kd: 4, room: 15, keys: 14 }, || None);
        // Several blocks of queries and of keys, a last block of each cut
        // short, and a head width past one vector but not a multiple of it.
        agree(Case { b: 2, t: 37, h: 4, g: 2, kd: 20, room: 45, keys: 41 }, || None);
    }

    #[test]
    fn cache_rows_are_written_where_asked_and_a_shared_buffer_is_left_alone() {
        let buffer = random([2, 6, 3], 13).inner();
        let rows = random([2, 2, 3], 14).inner();
        let want = buffer.clone().slice_assign([0..2, 3..5, 0..3], rows.clone());
        // `buffer` is still held here, so the write must not touch it.
        let held = buffer.clone();
        close(Flex::write_rows(buffer, 3, rows.clone()), want.clone(), "written, shared");
        close(held.clone(), random([2, 6, 3], 13).inner(), "the other holder's copy");
        // Held by nobody else: written in place, with the same result.
        close(Flex::write_rows(held, 3, rows), want, "written in place");
    }

    #[test]
    fn grouped_heads_and_a_cache_with_room_to_spare_read_and_train_the_right_keys() {
        // Four query heads on two key/value heads; six of ten key rows
        // filled. The spare rows get no gradient.
        agree(Case { b: 2, t: 3, h: 4, g: 2, kd: 4, room: 10, keys: 6 }, || None);
        // One new position, as sampling feeds them.
        agree(Case { b: 3, t: 1, h: 6, g: 2, kd: 8, room: 12, keys: 5 }, || None);
    }

    #[test]
    fn a_padding_mask_hides_keys_in_the_backward_pass_too() {
        let c = Case { b: 2, t: 5, h: 4, g: 2, kd: 4, room: 7, keys: 5 };
        let hidden: Vec<bool> = (0..c.b * c.t * c.keys).map(|i| i % c.keys == 1 && i / (c.t * c.keys) == 1).collect();
        agree(c, || Some(Tensor::from_data(TensorData::new(hidden.clone(), [c.b, c.t, c.keys]), &Default::default())));
        // Left padding, as a batch of prompts of different lengths has it,
        // with enough queries for the blocked kernels.
        let c = Case { b: 2, t: 21, h: 2, g: 1, kd: 16, room: 30, keys: 26 };
        let hidden: Vec<bool> = (0..c.b * c.t * c.keys).map(|i| i % c.keys < 3 && i / (c.t * c.keys) == 1).collect();
        agree(c, || Some(Tensor::from_data(TensorData::new(hidden.clone(), [c.b, c.t, c.keys]), &Default::default())));
    }

    /// Output and gradient of Σ out ∘ w for packed `qkv` `[b, t, 3d]`,
    /// through the fused packed node or through Burn's attention.
    fn packed_gradients(fused: bool, [b, t, d, heads]: [usize; 4]) -> [Tensor<Flex, 3>; 2] {
        let qkv = random([b, t, 3 * d], 9).require_grad();
        let w = random([b, t, d], 10);
        let out = if fused {
            Ad::packed_causal_attention(qkv.clone(), heads)
        } else {
            let [q, k, v] = split_packed(qkv.clone());
            tensor_attention(q, k, v, None, AttentionHeads::multi(heads), t)
        };
        let grads = (out.clone() * w).sum().backward();
        [out.inner(), qkv.grad(&grads).unwrap()]
    }

    #[test]
    fn packed_projections_give_what_attention_head_by_head_gives() {
        let shape = [3, 9, 12, 3];
        let [out, dqkv] = packed_gradients(true, shape);
        let [reference_out, reference_dqkv] = packed_gradients(false, shape);
        close(out, reference_out, "output");
        close(dqkv, reference_dqkv, "d qkv");
        // The default methods (what wgpu, CUDA and LibTorch run) agree too.
        let qkv = random([3, 9, 36], 11).inner();
        let grad = random([3, 9, 12], 12).inner();
        let kernel = Flex::packed_causal_attention_backward(qkv.clone(), 3, grad.clone());
        let [q, k, v] = split_packed(qkv);
        let tensors = Tensor::cat(attention_backward_tensors(q, k, v, None, AttentionHeads::multi(3), 9, grad).to_vec(), 2);
        close(kernel, tensors, "d qkv, tensor equations");
    }

    #[test]
    fn the_tensor_equations_match_the_flex_kernel() {
        let c = Case { b: 2, t: 6, h: 4, g: 2, kd: 4, room: 11, keys: 8 };
        let inner = |x: Tensor<Ad, 3>| x.inner();
        let (q, k, v, g) = (
            inner(random([c.b, c.t, c.h * c.kd], 5)),
            inner(random([c.b, c.room, c.g * c.kd], 6)),
            inner(random([c.b, c.room, c.g * c.kd], 7)),
            inner(random([c.b, c.t, c.h * c.kd], 8)),
        );
        let heads = AttentionHeads::grouped(c.h, c.g);
        let kernel = Flex::causal_attention_backward(q.clone(), k.clone(), v.clone(), None, heads, c.keys, g.clone());
        let tensors = attention_backward_tensors(q, k, v, None, heads, c.keys, g);
        for ((a, b), what) in kernel.into_iter().zip(tensors).zip(["dq", "dk", "dv"]) {
            close(a, b, what);
        }
    }
}
