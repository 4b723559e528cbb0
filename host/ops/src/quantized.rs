//! Weights kept quantized ([`QuantizedBackend`]): a linear layer's matrix
//! in blocks of 32 small integers with a scale (and an offset), multiplied
//! without ever being widened to `f32` in memory.
//!
//! Why: decoding a token at a small batch reads every weight once and does
//! little arithmetic with each, so its speed is the memory's bandwidth
//! divided by the model's size in bytes. A 4-bit model widened to `f32`
//! at load is 6-7 times as many bytes to read per token. Kept quantized,
//! a product reads 0.75 bytes per weight (4-bit) or 1.125 (8-bit).
//!
//! How: each row of the activations `x` is itself quantized, to 16 bits
//! per block of 32 (scale `dₓ = max|x|/32767`), so that a block's dot
//! product is an integer sum, `Σ qᵢ·q′ᵢ`, on the CPU's integer
//! multiply-adds (`madd`: 16 products a cycle); one scale product per
//! block then brings it back to `f32`:
//!
//! ```text
//! w = d·q + m  (4-bit, q ∈ 0..16)      w = d·q  (8-bit, q ∈ −127..128)
//! x ≈ dₓ·q′,  sₓ = Σ x  (exact)
//! Σ w·x ≈ d·dₓ·Σ q·q′ + m·sₓ
//! ```
//!
//! Why 16 bits, where llama.cpp rounds activations to 8: a small model's
//! activations have outlier channels, and one outlier in a block leaves the
//! other 31 values a few steps of 8 bits. On SmolLM2-135M that moved the
//! logits by more than a logit and changed the most likely token at one
//! position in ten; with 16 bits the quantized path follows the `f32` one
//! closely enough to sample rollouts for a learner that scores them in
//! `f32` (`docs/results.md`). Widening the weights to 16 bits costs a
//! conversion per block, shared by every activation row.
//!
//! Every ggml type we read maps onto the two block kinds without loss but
//! Q6_K's (see `ragen-llm`'s loader). The error against the `f32` product is
//! the activations' rounding, at most `dₓ/2` per element; the tests bound
//! it.
//!
//! The kernel serves a few rows at a time (decoding), where bandwidth
//! rules; with many rows (a prompt's prefill, training) arithmetic does,
//! and the `f32` matrix product, which blocks for the caches, is faster:
//! [`QuantizedBackend::quantized_linear`] declines those, and the model
//! uses its `f32` weights. Where it has dropped them (a frozen base under
//! LoRA, QLoRA's idea), [`QuantizedBackend::quantized_linear_rows`]
//! dequantizes the matrix for the one product instead, and differentiates
//! through it. Other backends than flex decline the kernel and keep their
//! `f32` weights.

use burn::backend::Autodiff;
use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::prelude::*;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

use crate::autodiff::{primitive, record, tensor, unary};
use crate::flex::{f32_tensor, f32_values};

/// Values per block, for both kinds.
pub const BLOCK: usize = 32;

/// 32 weights at 4 bits: `wᵢ = d·qᵢ + m`, `qᵢ` the low nibble of `qs[i]`
/// for `i < 16` and the high nibble of `qs[i − 16]` after (ggml's Q4_0 and
/// Q4_1 layout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4 {
    pub d: f32,
    pub m: f32,
    pub qs: [u8; 16],
}

/// 32 weights at 8 bits: `wᵢ = d·qᵢ` (ggml's Q8_0, with an `f32` scale).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// A matrix's blocks, row after row.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantBlocks {
    Q4(Vec<BlockQ4>),
    Q8(Vec<BlockQ8>),
}

/// A `[rows, cols]` matrix stored as blocks of [`BLOCK`] values along each
/// row: for a linear layer, one row per output (ggml's layout), so that an
/// output is one row's dot product with the input.
#[derive(Clone, PartialEq)]
pub struct QuantMatrix {
    rows: usize,
    cols: usize,
    blocks: QuantBlocks,
}

impl QuantMatrix {
    /// The matrix of `blocks`, `cols / BLOCK` per row.
    ///
    /// # Panics
    /// When `cols` is not a multiple of [`BLOCK`] or the blocks do not fill
    /// `rows` rows.
    pub fn new(rows: usize, cols: usize, blocks: QuantBlocks) -> Self {
        assert!(cols.is_multiple_of(BLOCK), "{cols} columns are not whole blocks of {BLOCK}");
        let n = match &blocks {
            QuantBlocks::Q4(b) => b.len(),
            QuantBlocks::Q8(b) => b.len(),
        };
        assert_eq!(n, rows * cols / BLOCK, "blocks for a [{rows}, {cols}] matrix");
        Self { rows, cols, blocks }
    }

    /// `values` `[rows, cols]` (row-major) rounded to 8 bits per value, a
    /// scale per block of 32 (`d = max|w|/127`): for weights that come in
    /// a format the kernel has no block kind for.
    pub fn quantize_q8(values: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(values.len(), rows * cols, "values for a [{rows}, {cols}] matrix");
        let blocks = values
            .chunks_exact(BLOCK)
            .map(|v| {
                let amax = v.iter().fold(0f32, |a, &x| a.max(x.abs()));
                let d = amax / 127.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                BlockQ8 { d, qs: std::array::from_fn(|i| (v[i] * inv).round() as i8) }
            })
            .collect();
        Self::new(rows, cols, QuantBlocks::Q8(blocks))
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the blocks take in memory.
    pub fn bytes(&self) -> usize {
        match &self.blocks {
            QuantBlocks::Q4(b) => size_of_val(b.as_slice()),
            QuantBlocks::Q8(b) => size_of_val(b.as_slice()),
        }
    }

    /// The matrix with its rows in `order`: row `i` of the result is row
    /// `order[i]` of this one.
    pub fn select_rows(&self, order: &[usize]) -> Self {
        let per = self.cols / BLOCK;
        let pick = |i: usize| order[i / per] * per + i % per;
        let blocks = match &self.blocks {
            QuantBlocks::Q4(b) => QuantBlocks::Q4((0..order.len() * per).map(|i| b[pick(i)]).collect()),
            QuantBlocks::Q8(b) => QuantBlocks::Q8((0..order.len() * per).map(|i| b[pick(i)]).collect()),
        };
        Self::new(order.len(), self.cols, blocks)
    }

    /// The rows of `parts` one after another (`[Σ rows, cols]`), so that
    /// one product gives all their outputs side by side; `None` when they
    /// differ in width or block kind.
    pub fn stack(parts: &[&QuantMatrix]) -> Option<Self> {
        let first = parts.first()?;
        // Every part's blocks, when `pick` finds them all of one kind.
        fn concat<T: Copy>(parts: &[&QuantMatrix], pick: impl Fn(&QuantBlocks) -> Option<&[T]>) -> Option<Vec<T>> {
            Some(parts.iter().map(|p| pick(&p.blocks)).collect::<Option<Vec<_>>>()?.concat())
        }
        let blocks = match &first.blocks {
            QuantBlocks::Q4(_) => QuantBlocks::Q4(concat(parts, |b| if let QuantBlocks::Q4(b) = b { Some(b) } else { None })?),
            QuantBlocks::Q8(_) => QuantBlocks::Q8(concat(parts, |b| if let QuantBlocks::Q8(b) = b { Some(b) } else { None })?),
        };
        parts.iter().all(|p| p.cols == first.cols).then(|| Self::new(parts.iter().map(|p| p.rows).sum(), first.cols, blocks))
    }

    /// Rows `rows` transposed, `[cols, rows.len()]` row-major, as `f32`: a
    /// linear layer's weight in Burn's layout (`[in, out]`). One parallel
    /// task per block column, writing its 32 rows of the result.
    pub fn dequantize_transposed(&self, rows: Range<usize>) -> Vec<f32> {
        let (n, per) = (rows.len(), self.cols / BLOCK);
        let mut out = vec![0f32; n * self.cols];
        out.par_chunks_mut(BLOCK * n).enumerate().for_each(|(c, out)| {
            for (j, r) in rows.clone().enumerate() {
                for (i, value) in self.block_values(r * per + c).into_iter().enumerate() {
                    out[i * n + j] = value;
                }
            }
        });
        out
    }

    /// Every value as `f32`, row-major `[rows, cols]` (blocks in parallel).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        out.par_chunks_mut(BLOCK).enumerate().for_each(|(i, out)| out.copy_from_slice(&self.block_values(i)));
        out
    }

    /// Block `i`'s 32 values as `f32` (blocks counted row after row).
    fn block_values(&self, i: usize) -> [f32; BLOCK] {
        match &self.blocks {
            QuantBlocks::Q4(b) => {
                let b = &b[i];
                std::array::from_fn(|j| b.d * nibble(&b.qs, j) as f32 + b.m)
            }
            QuantBlocks::Q8(b) => {
                let b = &b[i];
                std::array::from_fn(|j| b.d * b.qs[j] as f32)
            }
        }
    }
}

/// The shape and kind, not the (many) blocks.
impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.blocks {
            QuantBlocks::Q4(_) => "4-bit",
            QuantBlocks::Q8(_) => "8-bit",
        };
        write!(f, "QuantMatrix([{}, {}], {kind})", self.rows, self.cols)
    }
}

/// Value `i` of a 4-bit block's packed nibbles.
fn nibble(qs: &[u8; 16], i: usize) -> u8 {
    if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 }
}

/// A backend that multiplies by a [`QuantMatrix`] as it is stored.
///
/// Every backend the host builds implements it. Two uses:
///
/// * decoding a few rows ([`QuantizedBackend::quantized_linear`]): only
///   flex multiplies, the others decline and the caller uses its `f32`
///   weights;
/// * a base kept only quantized while LoRA adapters train on it (QLoRA,
///   [`QuantizedBackend::trains_on_quantized`]): every product by a frozen
///   weight goes through [`QuantizedBackend::quantized_linear_rows`], at
///   any number of activation rows, differentiable in its input (an
///   autodiff node whose backward pass is
///   [`QuantizedBackend::quantized_linear_backward`]).
pub trait QuantizedBackend: Backend {
    /// `x` `[n, cols]` times `wᵀ`: `[n, rows]`, as a linear layer whose
    /// weight `w` is (one output per row), without its bias. `None` when
    /// this backend declines (the caller multiplies by the `f32` weights
    /// instead).
    fn quantized_linear(x: Tensor<Self, 2>, w: &QuantMatrix) -> Option<Tensor<Self, 2>> {
        let _ = (x, w);
        None
    }

    /// `x` `[n, cols]` times the transpose of `w`'s rows `rows`:
    /// `[n, rows.len()]` at any `n`, never declining (a stacked matrix's
    /// part is one layer's product, so that autodiff splits no tensor).
    /// [`QuantizedBackend::quantized_linear`] where it serves (the whole
    /// matrix), else the product by the dequantized rows, which live only
    /// for the call. Under autodiff, `x`'s gradient flows (`w` is frozen).
    fn quantized_linear_rows(x: Tensor<Self, 2>, w: &Arc<QuantMatrix>, rows: Range<usize>) -> Tensor<Self, 2> {
        let whole = rows == (0..w.rows);
        whole.then(|| Self::quantized_linear(x.clone(), w)).flatten().unwrap_or_else(|| dense_rows(x, w, rows))
    }

    /// `g` `[n, rows.len()]` times `w`'s rows `rows`: `[n, cols]`, the
    /// gradient of [`QuantizedBackend::quantized_linear_rows`]'s input
    /// given its output's, `g`.
    fn quantized_linear_backward(g: Tensor<Self, 2>, w: &QuantMatrix, rows: Range<usize>) -> Tensor<Self, 2> {
        let device = g.device();
        g.matmul(transposed::<Self>(w, rows, &device).transpose())
    }

    /// Whether a LoRA run on this backend keeps its frozen base only
    /// quantized, dropping the `f32` copies (QLoRA): where dequantizing a
    /// matrix per product costs little beside the product. Not on GPUs,
    /// where the dequantized matrix would cross to the device each time.
    fn trains_on_quantized() -> bool {
        false
    }
}

/// `x` `[n, cols]` times the transpose of `w`'s rows `rows`, dequantized
/// for this product only: `[n, rows.len()]`, as exact as the `f32` product.
fn dense_rows<B: Backend>(x: Tensor<B, 2>, w: &QuantMatrix, rows: Range<usize>) -> Tensor<B, 2> {
    let device = x.device();
    x.matmul(transposed::<B>(w, rows, &device))
}

/// `wᵀ` `[cols, rows]` dequantized, as a tensor on `device`: the layout
/// of Burn's linear weights, so that the products run as the `f32`
/// model's do.
fn transposed<B: Backend>(w: &QuantMatrix, rows: Range<usize>, device: &B::Device) -> Tensor<B, 2> {
    let n = rows.len();
    Tensor::from_data(TensorData::new(w.dequantize_transposed(rows), [w.cols, n]), device)
}

#[cfg(feature = "wgpu")]
impl QuantizedBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl QuantizedBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl QuantizedBackend for burn::backend::LibTorch {}

/// Decoding declines (a sampler runs on the inner backend); the product at
/// any number of rows is one autodiff node that keeps only the matrix
/// (shared, not copied) for its backward pass, its forward pass the
/// dequantized product (never the kernel's rounded activations).
impl<B: QuantizedBackend, C: CheckpointStrategy> QuantizedBackend for Autodiff<B, C> {
    fn quantized_linear_rows(x: Tensor<Self, 2>, w: &Arc<QuantMatrix>, rows: Range<usize>) -> Tensor<Self, 2> {
        let x = primitive(x);
        // The dequantized product, not the kernel: the values autodiff differentiates are exactly the f32 ones.
        let inner = dense_rows(tensor::<B, 2>(x.primitive.clone()), w, rows.clone());
        let prep = QuantizedLinearNode.prepare::<C>([x.node.clone()]).compute_bound();
        record(prep, (w.clone(), rows), primitive(inner))
    }

    fn trains_on_quantized() -> bool {
        B::trains_on_quantized()
    }
}

/// The product by some rows of a frozen quantized matrix: it keeps the
/// matrix and the rows, and its input's gradient is `g·w[rows]`.
#[derive(Debug)]
struct QuantizedLinearNode;

impl<B: QuantizedBackend> Backward<B, 1> for QuantizedLinearNode {
    type State = (Arc<QuantMatrix>, Range<usize>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary(ops, grads, |(w, rows): Self::State, grad: Tensor<B, 2>| B::quantized_linear_backward(grad, &w, rows));
    }
}

/// The most rows flex multiplies quantized: beyond it the `f32` matrix
/// product is faster (measured in `docs/results.md`).
pub const MAX_QUANTIZED_ROWS: usize = 16;

impl QuantizedBackend for Flex {
    fn quantized_linear(x: Tensor<Self, 2>, w: &QuantMatrix) -> Option<Tensor<Self, 2>> {
        let [n, cols] = x.dims();
        if n > MAX_QUANTIZED_ROWS || cols != w.cols {
            return None;
        }
        let x = f32_values(x);
        Some(f32_tensor(matmul(&x, n, w), [n, w.rows]))
    }

    fn trains_on_quantized() -> bool {
        true
    }
}

/// A block of one activation row: `xᵢ ≈ d·qᵢ`, and `s = Σ xᵢ` exactly
/// (for the 4-bit blocks' offsets).
#[derive(Clone, Copy)]
struct XBlock {
    d: f32,
    s: f32,
    qs: [i16; BLOCK],
}

/// The largest magnitude of an activation's 16-bit integer.
const X_MAX: f32 = 32767.0;

/// `x` `[n, cols]`'s blocks, row after row. A row holding a NaN or an
/// infinity gets NaN scales, so that its outputs are NaN as the `f32`
/// product's would be, not finite numbers from wrapped integers.
fn quantize_rows(x: &[f32]) -> Vec<XBlock> {
    x.chunks_exact(BLOCK)
        .map(|v| {
            let amax = v.iter().fold(0f32, |a, &x| a.max(x.abs()));
            let s: f32 = v.iter().sum();
            if !amax.is_finite() || !s.is_finite() {
                return XBlock { d: f32::NAN, s: f32::NAN, qs: [0; BLOCK] };
            }
            let d = amax / X_MAX;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            XBlock { d, s, qs: std::array::from_fn(|i| (v[i] * inv).round() as i16) }
        })
        .collect()
}

/// Output rows of `w` per parallel task: enough blocks that a task
/// outweighs its scheduling.
fn rows_per_task(w: &QuantMatrix) -> usize {
    (2048 / (w.cols / BLOCK).max(1)).max(1)
}

/// `x` `[n, cols]` times `wᵀ`: `[n, rows]`, row-major.
fn matmul(x: &[f32], n: usize, w: &QuantMatrix) -> Vec<f32> {
    let xq = quantize_rows(x);
    let per = w.cols / BLOCK;
    let task = rows_per_task(w);
    // Outputs transposed, [rows, n], so that each task writes one slice.
    let mut out_t = vec![0f32; w.rows * n];
    out_t.par_chunks_mut(task * n).enumerate().for_each(|(t, out)| {
        let rows = t * task * per..(t * task + out.len() / n) * per;
        match &w.blocks {
            QuantBlocks::Q4(b) => run(Task { w: &b[rows], x: &xq, per, out }),
            QuantBlocks::Q8(b) => run(Task { w: &b[rows], x: &xq, per, out }),
        }
    });
    if n == 1 {
        return out_t;
    }
    let mut out = vec![0f32; w.rows * n];
    for (r, row) in out_t.chunks_exact(n).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            out[i * w.rows + r] = v;
        }
    }
    out
}

/// One output row's sums against each activation row, kept as the eight
/// lanes of an AVX2 register: lane `j` gathers the products of values
/// `2j, 2j + 1, 16 + 2j, 17 + 2j` of every block (where `madd` puts them),
/// each block's integer sum scaled by `d·dₓ` with one fused multiply-add.
/// The portable kernel keeps the same lanes in the same order, so both
/// give the same bits.
type Lanes = [f32; 8];

/// Sums the lanes, then adds the offsets' sum: the same order everywhere.
#[inline(always)]
fn finish(lanes: Lanes, offset: f32) -> f32 {
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])) + offset
}

/// Some output rows of a matrix against every activation row: `out`
/// `[rows, n]`.
struct Task<'a, W> {
    w: &'a [W],
    x: &'a [XBlock],
    per: usize,
    out: &'a mut [f32],
}

impl<W> Task<'_, W> {
    fn n(&self) -> usize {
        self.x.len() / self.per
    }
}

/// The portable kernel, dispatched as the `simd` module describes, for
/// CPUs without AVX2.
impl pulp::WithSimd for Task<'_, BlockQ4> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let n = self.n();
        for (row, out) in self.w.chunks_exact(self.per).zip(self.out.chunks_exact_mut(n)) {
            for (i, o) in out.iter_mut().enumerate() {
                let (mut lanes, mut offset) = (Lanes::default(), 0f32);
                for (wb, xb) in row.iter().zip(&self.x[i * self.per..]) {
                    let q: [i16; BLOCK] = std::array::from_fn(|l| nibble(&wb.qs, l) as i16);
                    add_block(&mut lanes, wb.d * xb.d, &q, &xb.qs);
                    offset += wb.m * xb.s;
                }
                *o = finish(lanes, offset);
            }
        }
    }
}

impl pulp::WithSimd for Task<'_, BlockQ8> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let n = self.n();
        for (row, out) in self.w.chunks_exact(self.per).zip(self.out.chunks_exact_mut(n)) {
            for (i, o) in out.iter_mut().enumerate() {
                let mut lanes = Lanes::default();
                for (wb, xb) in row.iter().zip(&self.x[i * self.per..]) {
                    let q: [i16; BLOCK] = wb.qs.map(i16::from);
                    add_block(&mut lanes, wb.d * xb.d, &q, &xb.qs);
                }
                *o = finish(lanes, 0.0);
            }
        }
    }
}

/// One block into the lanes: `lanes[j] += scale · Σ aₗ·bₗ` over `l` in
/// `2j, 2j + 1, 16 + 2j, 17 + 2j`, the sum exact in integers (at most
/// `4·128·32767` in magnitude), the update one rounding.
#[inline(always)]
fn add_block(lanes: &mut Lanes, scale: f32, a: &[i16; BLOCK], b: &[i16; BLOCK]) {
    for (j, lane) in lanes.iter_mut().enumerate() {
        let sum: i32 = [2 * j, 2 * j + 1, 16 + 2 * j, 17 + 2 * j].iter().map(|&l| a[l] as i32 * b[l] as i32).sum();
        *lane = scale.mul_add(sum as f32, *lane);
    }
}

/// The AVX2 kernels: a block's weights widened to 16 bits once, then 32
/// products per activation row in two integer multiply-adds (`madd`).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BLOCK, BlockQ4, BlockQ8, Lanes, Task, finish};
    use core::arch::x86_64::{__m128i, __m256, __m256i};
    use pulp::x86::V3;

    /// A task on AVX2.
    pub(super) struct Avx2<'a, W>(pub V3, pub Task<'a, W>);

    /// `lanes += scale · (w·x in the lanes' order)`: `w` a block's values
    /// `0..16` and `16..32` as 16-bit integers, `x` the activations'.
    #[inline(always)]
    fn add_block(v: V3, lanes: __m256, scale: f32, w: [__m256i; 2], x: &[i16; BLOCK]) -> __m256 {
        let x: [__m256i; 2] = pulp::cast(*x);
        let sums = v.avx2._mm256_add_epi32(v.avx2._mm256_madd_epi16(w[0], x[0]), v.avx2._mm256_madd_epi16(w[1], x[1])); // 8 × i32
        v.fma._mm256_fmadd_ps(v.avx._mm256_set1_ps(scale), v.avx._mm256_cvtepi32_ps(sums), lanes)
    }

    /// Rows of activations handled together: each one's sums stay in
    /// registers (a longer array would live in memory, and every block's
    /// update would wait on a store and a load).
    const GROUP: usize = 4;

    /// One output row against activation rows `x` (`N` of them, blocks
    /// `per` apart), each row's sum into `out`.
    #[inline(always)]
    fn q4_row<const N: usize>(v: V3, row: &[BlockQ4], x: &[super::XBlock], per: usize, out: &mut [f32]) {
        let low = v.sse2._mm_set1_epi8(0x0F);
        let mut lanes = [v.avx._mm256_setzero_ps(); N];
        let mut offsets = [0f32; N];
        for (b, wb) in row.iter().enumerate() {
            let packed: __m128i = pulp::cast(wb.qs);
            let first = v.sse2._mm_and_si128(packed, low); // values 0..16
            let second = v.sse2._mm_and_si128(v.sse2._mm_srli_epi16::<4>(packed), low); // values 16..32
            let q = [v.avx2._mm256_cvtepu8_epi16(first), v.avx2._mm256_cvtepu8_epi16(second)];
            for i in 0..N {
                let xb = &x[i * per + b];
                lanes[i] = add_block(v, lanes[i], wb.d * xb.d, q, &xb.qs);
                offsets[i] += wb.m * xb.s;
            }
        }
        for i in 0..N {
            out[i] = finish(pulp::cast::<__m256, Lanes>(lanes[i]), offsets[i]);
        }
    }

    /// [`q4_row`] for an 8-bit matrix.
    #[inline(always)]
    fn q8_row<const N: usize>(v: V3, row: &[BlockQ8], x: &[super::XBlock], per: usize, out: &mut [f32]) {
        let mut lanes = [v.avx._mm256_setzero_ps(); N];
        for (b, wb) in row.iter().enumerate() {
            let halves: [__m128i; 2] = pulp::cast::<[i8; BLOCK], _>(wb.qs);
            let q = [v.avx2._mm256_cvtepi8_epi16(halves[0]), v.avx2._mm256_cvtepi8_epi16(halves[1])];
            for i in 0..N {
                let xb = &x[i * per + b];
                lanes[i] = add_block(v, lanes[i], wb.d * xb.d, q, &xb.qs);
            }
        }
        for i in 0..N {
            out[i] = finish(pulp::cast::<__m256, Lanes>(lanes[i]), 0.0);
        }
    }

    /// Each output row against the activation rows, [`GROUP`] at a time.
    macro_rules! rows_in_groups {
        ($v:expr, $task:expr, $row_fn:ident) => {{
            let task = $task;
            let (n, per) = (task.n(), task.per);
            for (row, out) in task.w.chunks_exact(per).zip(task.out.chunks_exact_mut(n)) {
                for (g, out) in out.chunks_mut(GROUP).enumerate() {
                    let x = &task.x[g * GROUP * per..];
                    match out.len() {
                        1 => $row_fn::<1>($v, row, x, per, out),
                        2 => $row_fn::<2>($v, row, x, per, out),
                        3 => $row_fn::<3>($v, row, x, per, out),
                        _ => $row_fn::<GROUP>($v, row, x, per, out),
                    }
                }
            }
        }};
    }

    impl pulp::WithSimd for Avx2<'_, BlockQ4> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            rows_in_groups!(self.0, self.1, q4_row)
        }
    }

    impl pulp::WithSimd for Avx2<'_, BlockQ8> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) {
            rows_in_groups!(self.0, self.1, q8_row)
        }
    }
}

/// Runs a task on AVX2 where the CPU has it (a `V3` exists only then),
/// else the portable kernel.
#[cfg(target_arch = "x86_64")]
fn run<'a, W>(task: Task<'a, W>)
where
    Task<'a, W>: pulp::WithSimd<Output = ()>,
    avx2::Avx2<'a, W>: pulp::WithSimd<Output = ()>,
{
    use pulp::Simd;
    match pulp::x86::V3::try_new() {
        Some(v3) => Simd::vectorize(v3, avx2::Avx2(v3, task)),
        None => pulp::Arch::new().dispatch(task),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn run<'a, W>(task: Task<'a, W>)
where
    Task<'a, W>: pulp::WithSimd<Output = ()>,
{
    pulp::Arch::new().dispatch(task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragen_rng::SeedRng;

    fn uniform(rng: &mut SeedRng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * scale).collect()
    }

    fn q4_matrix(rng: &mut SeedRng, rows: usize, cols: usize) -> QuantMatrix {
        let blocks = (0..rows * cols / BLOCK)
            .map(|_| BlockQ4 {
                d: 0.01 + (rng.next_u64() % 100) as f32 * 1e-4,
                m: -0.08 + (rng.next_u64() % 100) as f32 * 1e-4,
                qs: std::array::from_fn(|_| (rng.next_u64() % 256) as u8),
            })
            .collect();
        QuantMatrix::new(rows, cols, QuantBlocks::Q4(blocks))
    }

    /// `x · wᵀ` in `f64` on the dequantized weights: the reference.
    fn reference(x: &[f32], n: usize, w: &QuantMatrix) -> Vec<f64> {
        let dense = w.dequantize();
        let mut out = vec![0f64; n * w.rows];
        for i in 0..n {
            for r in 0..w.rows {
                out[i * w.rows + r] = (0..w.cols).map(|c| x[i * w.cols + c] as f64 * dense[r * w.cols + c] as f64).sum();
            }
        }
        out
    }

    /// The product's error is the activations' rounding alone: at most
    /// `dₓ/2` per element, times the weight, summed.
    fn check_against_reference(w: &QuantMatrix, n: usize, seed: u64) {
        let mut rng = SeedRng::new(seed);
        let x = uniform(&mut rng, n * w.cols, 3.0);
        let got = Flex::quantized_linear(f32_tensor(x.clone(), [n, w.cols]), w).expect("flex multiplies few rows");
        assert_eq!(got.dims(), [n, w.rows]);
        let got = got.into_data().to_vec::<f32>().unwrap();
        let want = reference(&x, n, w);
        let dense = w.dequantize();
        let xq = quantize_rows(&x);
        for i in 0..n {
            for r in 0..w.rows {
                // Σ over blocks of (dₓ/2)·Σ|w|, plus f32 rounding.
                let bound: f64 = (0..w.cols / BLOCK)
                    .map(|b| {
                        let dx = xq[i * w.cols / BLOCK + b].d as f64;
                        let wsum: f64 = dense[r * w.cols + b * BLOCK..][..BLOCK].iter().map(|v| v.abs() as f64).sum();
                        dx / 2.0 * wsum
                    })
                    .sum::<f64>()
                    + 1e-4 * want[i * w.rows + r].abs()
                    + 1e-5;
                let err = (got[i * w.rows + r] as f64 - want[i * w.rows + r]).abs();
                assert!(
                    err <= bound,
                    "row {i}, output {r}: {} against {} (error {err} over the bound {bound})",
                    got[i * w.rows + r],
                    want[i * w.rows + r]
                );
            }
        }
    }

    #[test]
    fn four_bit_products_match_the_dequantized_weights() {
        let mut rng = SeedRng::new(1);
        let w = q4_matrix(&mut rng, 70, 96);
        for n in [1, 3, MAX_QUANTIZED_ROWS] {
            check_against_reference(&w, n, n as u64);
        }
    }

    #[test]
    fn eight_bit_products_match_the_dequantized_weights() {
        let mut rng = SeedRng::new(2);
        let dense = uniform(&mut rng, 130 * 64, 0.5);
        let w = QuantMatrix::quantize_q8(&dense, 130, 64);
        // Requantizing is within half a step of each block's scale.
        for (b, (got, want)) in w.dequantize().chunks(BLOCK).zip(dense.chunks(BLOCK)).enumerate() {
            let amax = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
            for (g, v) in got.iter().zip(want) {
                assert!((g - v).abs() <= amax / 127.0 / 2.0 + 1e-7, "block {b}: {g} against {v}");
            }
        }
        for n in [1, 5] {
            check_against_reference(&w, n, 10 + n as u64);
        }
    }

    #[test]
    fn stacked_matrices_give_their_products_side_by_side() {
        let mut rng = SeedRng::new(6);
        let (a, b) = (q4_matrix(&mut rng, 3, 64), q4_matrix(&mut rng, 5, 64));
        let stacked = QuantMatrix::stack(&[&a, &b]).expect("same width and kind");
        assert_eq!(stacked.rows(), 8);
        let x = f32_tensor(uniform(&mut rng, 2 * 64, 1.0), [2, 64]);
        let both = Flex::quantized_linear(x.clone(), &stacked).unwrap();
        let apart = Tensor::cat(vec![Flex::quantized_linear(x.clone(), &a).unwrap(), Flex::quantized_linear(x, &b).unwrap()], 1);
        assert_eq!(both.into_data().to_vec::<f32>().unwrap(), apart.into_data().to_vec::<f32>().unwrap());
        let eight = QuantMatrix::quantize_q8(&[0.5; 64], 1, 64);
        assert!(QuantMatrix::stack(&[&a, &eight]).is_none(), "4-bit and 8-bit blocks do not stack");
        assert!(QuantMatrix::stack(&[&a, &q4_matrix(&mut rng, 1, 32)]).is_none(), "widths differ");
    }

    #[test]
    fn rows_are_selected_whole() {
        let mut rng = SeedRng::new(3);
        let w = q4_matrix(&mut rng, 4, 64);
        let picked = w.select_rows(&[2, 0]);
        let (all, some) = (w.dequantize(), picked.dequantize());
        assert_eq!(some[..64], all[128..192]);
        assert_eq!(some[64..], all[..64]);
    }

    #[test]
    fn a_non_finite_input_gives_nan_not_a_number() {
        let mut rng = SeedRng::new(4);
        let w = q4_matrix(&mut rng, 8, 32);
        let mut x = vec![0.5f32; 64];
        x[40] = f32::INFINITY;
        let out = Flex::quantized_linear(f32_tensor(x, [2, 32]), &w).unwrap().into_data().to_vec::<f32>().unwrap();
        assert!(out[..8].iter().all(|v| v.is_finite()), "the finite row stays finite");
        assert!(out[8..].iter().all(|v| v.is_nan()), "the row with an infinity is NaN: {:?}", &out[8..]);
    }

    #[test]
    fn many_rows_and_other_backends_decline() {
        let mut rng = SeedRng::new(5);
        let w = q4_matrix(&mut rng, 8, 32);
        let x = f32_tensor(vec![0.0; (MAX_QUANTIZED_ROWS + 1) * 32], [MAX_QUANTIZED_ROWS + 1, 32]);
        assert!(Flex::quantized_linear(x, &w).is_none());
        let x = Tensor::<Autodiff<Flex>, 2>::zeros([1, 32], &Default::default());
        assert!(Autodiff::<Flex>::quantized_linear(x, &w).is_none());
    }

    /// At any number of activation rows, for the whole matrix or some of
    /// its rows, the product is the dequantized matrix's, and under
    /// autodiff its input's gradient is the one Burn computes through that
    /// matrix in `f32` (the matrix is frozen: no gradient of its own).
    #[test]
    fn products_at_any_row_count_differentiate_like_the_dequantized_matrix() {
        type Ad = Autodiff<Flex>;
        fn values<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
            t.into_data().to_vec::<f32>().unwrap()
        }
        let device = Default::default();
        let mut rng = SeedRng::new(11);
        let w = Arc::new(q4_matrix(&mut rng, 48, 96));
        let dense = Tensor::<Ad, 2>::from_data(TensorData::new(w.dequantize(), [48, 96]), &device);
        for (n, rows) in [(3, 0..48), (MAX_QUANTIZED_ROWS + 1, 0..48), (70, 0..48), (3, 10..30), (70, 40..48)] {
            let m = rows.len();
            let x = Tensor::<Ad, 2>::from_data(TensorData::new(uniform(&mut rng, n * 96, 2.0), [n, 96]), &device).require_grad();
            let g = Tensor::<Ad, 2>::from_data(TensorData::new(uniform(&mut rng, n * m, 1.0), [n, m]), &device);
            let ours = Ad::quantized_linear_rows(x.clone(), &w, rows.clone());
            let burns = x.clone().matmul(dense.clone().narrow(0, rows.start, m).transpose());
            let gap = |a: Vec<f32>, b: &[f32]| a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            let want = values(burns.clone());
            // Under autodiff, always the dequantized product.
            let worst = gap(values(ours.clone()), &want);
            assert!(worst <= 1e-5, "{n} rows x {rows:?}: product off by {worst}");
            // The inner backend's takes the kernel for few rows of the whole
            // matrix: the activations' rounding.
            let inner = Flex::quantized_linear_rows(x.clone().inner(), &w, rows.clone());
            let tolerance = if n <= MAX_QUANTIZED_ROWS && m == 48 { 2e-3 } else { 1e-5 };
            let worst = gap(values(inner), &want);
            assert!(worst <= tolerance, "{n} rows x {rows:?}: the inner product off by {worst}");
            let (ga, gb) = ((ours * g.clone()).sum().backward(), (burns * g).sum().backward());
            let (ga, gb) = (values(x.grad(&ga).unwrap()), values(x.grad(&gb).unwrap()));
            let worst = ga.iter().zip(&gb).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-5, "{n} rows x {rows:?}: input gradient off by {worst}");
        }
        assert!(Ad::trains_on_quantized() && Flex::trains_on_quantized());
    }
}
