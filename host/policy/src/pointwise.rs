//! Layer normalisation and GELU, each one autodiff node with a fused
//! backward pass.
//!
//! Burn 0.21's autodiff backend differentiates `LayerNorm` through its
//! reference composition: mean, centre, square, mean, add ε, square root,
//! divide, scale, shift. That is nine nodes, each writing an `[n, d]` tensor
//! and running a backward pass of its own, for an operation that reads each
//! row once. GELU is one node already, but flex computes its `erf` one
//! element at a time with libm (8% of a SimpleSokoban training step).
//!
//! [`PointwiseBackend::fused_layer_norm`] and [`PointwiseBackend::fused_gelu`] are one
//! node each instead. They keep only their inputs, and their backward passes
//! recompute what they need, row by row:
//!
//! ```text
//! layer norm   x̂ = (x − μ) · r,   r = 1/√(σ² + ε),   y = x̂ ∘ γ + β
//!              dβ = Σ_rows g,   dγ = Σ_rows g ∘ x̂
//!              dx = r · (ĝ − mean(ĝ) − x̂ · mean(ĝ ∘ x̂)),   ĝ = g ∘ γ
//! GELU         y = x · Φ(x),   Φ(x) = (1 + erf(x/√2)) / 2
//!              dx = g · (Φ(x) + x · φ(x)),   φ(x) = exp(−x²/2) / √(2π)
//! ```
//!
//! On flex the kernels are ours: plain loops over contiguous rows, compiled
//! for the CPU's vector instructions, `erf` from a rational approximation
//! (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7) that shares
//! its `exp(−x²/2)` with `φ`. Other backends (wgpu, CUDA, LibTorch) run the
//! same equations as tensor operations.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::{ActivationOps, FloatTensor, ModuleOps};
use rayon::prelude::*;

use crate::flex::{f32_tensor, f32_values};

/// A backend that runs layer normalisation and GELU as one differentiable
/// operation each, on rows `[n, d]`.
///
/// Every backend the host builds implements it: flex with its own kernels,
/// the others with the default methods.
pub trait PointwiseBackend: Backend {
    /// Each row of `x` `[n, d]` normalised to mean 0 and variance 1, then
    /// scaled by `gamma` `[d]` and shifted by `beta` `[d]`.
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let out = <Self as ModuleOps<Self>>::layer_norm(float(x), float(gamma), Some(float(beta)), epsilon);
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    /// The gradients `[dx [n, d], dγ [d], dβ [d]]` of
    /// [`PointwiseBackend::fused_layer_norm`] given its output's `grad` `[n, d]`.
    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>, Tensor<Self, 1>) {
        layer_norm_backward_tensors(x, gamma, grad, epsilon)
    }

    /// `x · Φ(x)` element-wise (the exact GELU, with `erf`).
    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        burn::tensor::activation::gelu(x)
    }

    /// The gradient of [`PointwiseBackend::fused_gelu`] given its output's `grad`.
    fn fused_gelu_backward(x: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        Tensor::from_primitive(TensorPrimitive::Float(<Self as ActivationOps<Self>>::gelu_backward(float(x), float(grad))))
    }

    /// Rotary positions on rows: in `x` `[n, heads·k]`, each head's channel
    /// pairs `(i, i + k/2)` rotated by the angle whose cosine and sine are
    /// `cos[r, i]` and `sin[r, i]` (`[n, k/2]`, one angle per row and pair).
    /// Its gradient is the same rotation with `−sin`.
    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        rotary_tensors(x, cos, sin)
    }

    /// Each row of `x` `[n, d]` divided by its root mean square
    /// `√(mean(x²) + ε)`, then scaled by `gamma` `[d]` (Llama's and Qwen2's
    /// norm).
    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let d = gamma.dims()[0];
        let r = (x.clone().square().mean_dim(1) + epsilon).sqrt().recip(); // [n, 1]
        x * r * gamma.reshape([1, d])
    }

    /// The gradients `(dx [n, d], dγ [d])` of [`PointwiseBackend::fused_rms_norm`]
    /// given its output's `grad` `[n, d]`.
    fn fused_rms_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        rms_norm_backward_tensors(x, gamma, grad, epsilon)
    }

    /// `silu(a) ∘ u` element-wise (`silu(a) = a·σ(a)`), `a` and `u` `[n, f]`:
    /// SwiGLU's gate and up projections combined.
    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        burn::tensor::activation::silu(a) * u
    }

    /// The gradients `(da, du)` of [`PointwiseBackend::swiglu`] given its
    /// output's `grad`.
    fn swiglu_backward(a: Tensor<Self, 2>, u: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        swiglu_backward_tensors(a, u, grad)
    }
}

/// SwiGLU's backward equations as tensor operations, for any backend:
/// `du = g·a·σ(a)`, `da = g·u·σ(a)·(1 + a·(1 − σ(a)))`.
fn swiglu_backward_tensors<B: Backend>(a: Tensor<B, 2>, u: Tensor<B, 2>, grad: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let s = burn::tensor::activation::sigmoid(a.clone()); // σ(a)
    let du = grad.clone() * a.clone() * s.clone();
    let da = grad * u * s.clone() * ((s.neg() + 1.0) * a + 1.0);
    (da, du)
}

/// The RMS norm's backward equations as tensor operations, for any backend:
/// `x̂ = x·r`, `ĝ = g∘γ`, `dγ = Σ_rows g∘x̂`, `dx = r·(ĝ − x̂·mean(ĝ∘x̂))`.
fn rms_norm_backward_tensors<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    grad: Tensor<B, 2>,
    epsilon: f64,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let d = x.dims()[1];
    let r = (x.clone().square().mean_dim(1) + epsilon).sqrt().recip(); // [n, 1]
    let normed = x * r.clone(); // x̂ [n, d]
    let dgamma = (grad.clone() * normed.clone()).sum_dim(0).reshape([d]);
    let g = grad * gamma.reshape([1, d]); // ĝ [n, d]
    let dx = (g.clone() - normed.clone() * (g * normed).mean_dim(1)) * r;
    (dx, dgamma)
}

/// [`PointwiseBackend::rotary`] as tensor operations, for any backend.
fn rotary_tensors<B: Backend>(x: Tensor<B, 2>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 2> {
    let [n, w] = x.dims();
    let half = cos.dims()[1];
    let x = x.reshape([n, w / (2 * half), 2, half]);
    let (x1, x2) = (x.clone().narrow(2, 0, 1), x.narrow(2, 1, 1)); // [n, heads, 1, k/2]
    let (cos, sin) = (cos.reshape([n, 1, 1, half]), sin.reshape([n, 1, 1, half]));
    Tensor::cat(vec![x1.clone() * cos.clone() - x2.clone() * sin.clone(), x1 * sin + x2 * cos], 2).reshape([n, w])
}

/// The layer norm's backward equations as tensor operations, for any backend.
fn layer_norm_backward_tensors<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    grad: Tensor<B, 2>,
    epsilon: f64,
) -> (Tensor<B, 2>, Tensor<B, 1>, Tensor<B, 1>) {
    let d = x.dims()[1];
    let mean = x.clone().mean_dim(1); // [n, 1]
    let centred = x - mean; // [n, d]
    let var = centred.clone().square().mean_dim(1); // [n, 1]
    let r = (var + epsilon).sqrt().recip(); // [n, 1]
    let normed = centred * r.clone(); // x̂ [n, d]
    let dbeta = grad.clone().sum_dim(0).reshape([d]);
    let dgamma = (grad.clone() * normed.clone()).sum_dim(0).reshape([d]);
    let g = grad * gamma.reshape([1, d]); // ĝ [n, d]
    let dx = (g.clone() - g.clone().mean_dim(1) - normed.clone() * (g * normed).mean_dim(1)) * r;
    (dx, dgamma, dbeta)
}

fn float<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

#[cfg(feature = "wgpu")]
impl PointwiseBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl PointwiseBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl PointwiseBackend for burn::backend::LibTorch {}

/// Floats per parallel task: enough that a task outweighs its scheduling,
/// few enough that a pass of a few thousand rows still splits over cores.
const TASK_FLOATS: usize = 16_384;

/// Whole rows `d` wide per parallel task, about [`TASK_FLOATS`].
pub(crate) fn rows_per_task(d: usize) -> usize {
    (TASK_FLOATS / d.max(1)).max(1)
}

impl PointwiseBackend for burn::backend::Flex {
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let [n, d] = x.dims();
        let (x, gamma, beta) = (f32_values(x), f32_values(gamma), f32_values(beta));
        let mut out = vec![0.0f32; n * d];
        let simd = pulp::Arch::new();
        let rows = rows_per_task(d) * d;
        out.par_chunks_mut(rows).zip(x.par_chunks(rows)).for_each(|(out, x)| {
            simd.dispatch(NormKernel::Forward { x, gamma: &gamma, beta: &beta, eps: epsilon as f32, out });
        });
        f32_tensor(out, [n, d])
    }

    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>, Tensor<Self, 1>) {
        let [n, d] = x.dims();
        let (x, gamma, grad) = (f32_values(x), f32_values(gamma), f32_values(grad));
        let mut dx = vec![0.0f32; n * d];
        let simd = pulp::Arch::new();
        let rows = rows_per_task(d) * d;
        // Each task sums its rows' dγ and dβ; the tasks' sums are added after.
        let partial: Vec<Vec<f32>> = dx
            .par_chunks_mut(rows)
            .zip(x.par_chunks(rows).zip(grad.par_chunks(rows)))
            .map(|(dx, (x, g))| {
                let mut sums = vec![0.0f32; 2 * d]; // [dγ, dβ]
                simd.dispatch(NormKernel::Backward { x, gamma: &gamma, g, eps: epsilon as f32, dx, sums: &mut sums });
                sums
            })
            .collect();
        let mut sums = vec![0.0f32; 2 * d];
        for part in &partial {
            sums.iter_mut().zip(part).for_each(|(s, p)| *s += p);
        }
        let dbeta = sums.split_off(d);
        (f32_tensor(dx, [n, d]), f32_tensor(sums, [d]), f32_tensor(dbeta, [d]))
    }

    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let dims = x.dims();
        let x = f32_values(x);
        let mut out = vec![0.0f32; x.len()];
        let simd = pulp::Arch::new();
        out.par_chunks_mut(TASK_FLOATS).zip(x.par_chunks(TASK_FLOATS)).for_each(|(out, x)| {
            simd.dispatch(GeluKernel { x, g: None, out });
        });
        f32_tensor(out, dims)
    }

    fn fused_gelu_backward(x: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let dims = x.dims();
        let (x, grad) = (f32_values(x), f32_values(grad));
        let mut dx = vec![0.0f32; x.len()];
        let simd = pulp::Arch::new();
        dx.par_chunks_mut(TASK_FLOATS).zip(x.par_chunks(TASK_FLOATS).zip(grad.par_chunks(TASK_FLOATS))).for_each(|(dx, (x, g))| {
            simd.dispatch(GeluKernel { x, g: Some(g), out: dx });
        });
        f32_tensor(dx, dims)
    }

    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let ([n, w], half) = (x.dims(), cos.dims()[1]);
        let (x, cos, sin) = (f32_values(x), f32_values(cos), f32_values(sin));
        let mut out = vec![0.0f32; n * w];
        let simd = pulp::Arch::new();
        let rows = rows_per_task(w);
        out.par_chunks_mut(rows * w)
            .zip(x.par_chunks(rows * w))
            .zip(cos.par_chunks(rows * half).zip(sin.par_chunks(rows * half)))
            .for_each(|((out, x), (cos, sin))| simd.dispatch(RotaryKernel { x, cos, sin, w, half, out }));
        f32_tensor(out, [n, w])
    }

    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let [n, d] = x.dims();
        let (x, gamma) = (f32_values(x), f32_values(gamma));
        let mut out = vec![0.0f32; n * d];
        let simd = pulp::Arch::new();
        let rows = rows_per_task(d) * d;
        out.par_chunks_mut(rows).zip(x.par_chunks(rows)).for_each(|(out, x)| {
            simd.dispatch(RmsKernel::Forward { x, gamma: &gamma, eps: epsilon as f32, out });
        });
        f32_tensor(out, [n, d])
    }

    fn fused_rms_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        let [n, d] = x.dims();
        let (x, gamma, grad) = (f32_values(x), f32_values(gamma), f32_values(grad));
        let mut dx = vec![0.0f32; n * d];
        let simd = pulp::Arch::new();
        let rows = rows_per_task(d) * d;
        // Each task sums its rows' dγ; the tasks' sums are added after.
        let partial: Vec<Vec<f32>> = dx
            .par_chunks_mut(rows)
            .zip(x.par_chunks(rows).zip(grad.par_chunks(rows)))
            .map(|(dx, (x, g))| {
                let mut dgamma = vec![0.0f32; d];
                simd.dispatch(RmsKernel::Backward { x, gamma: &gamma, g, eps: epsilon as f32, dx, dgamma: &mut dgamma });
                dgamma
            })
            .collect();
        let mut dgamma = vec![0.0f32; d];
        for part in &partial {
            dgamma.iter_mut().zip(part).for_each(|(s, p)| *s += p);
        }
        (f32_tensor(dx, [n, d]), f32_tensor(dgamma, [d]))
    }

    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let dims = a.dims();
        let (a, u) = (f32_values(a), f32_values(u));
        let mut out = vec![0.0f32; a.len()];
        let simd = pulp::Arch::new();
        out.par_chunks_mut(TASK_FLOATS).zip(a.par_chunks(TASK_FLOATS).zip(u.par_chunks(TASK_FLOATS))).for_each(|(out, (a, u))| {
            simd.dispatch(SwigluKernel { a, u, g: None, out: [out, &mut []] });
        });
        f32_tensor(out, dims)
    }

    fn swiglu_backward(a: Tensor<Self, 2>, u: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let dims = a.dims();
        let (a, u, grad) = (f32_values(a), f32_values(u), f32_values(grad));
        let (mut da, mut du) = (vec![0.0f32; a.len()], vec![0.0f32; a.len()]);
        let simd = pulp::Arch::new();
        let inputs = a.par_chunks(TASK_FLOATS).zip(u.par_chunks(TASK_FLOATS)).zip(grad.par_chunks(TASK_FLOATS));
        da.par_chunks_mut(TASK_FLOATS).zip(du.par_chunks_mut(TASK_FLOATS)).zip(inputs).for_each(|((da, du), ((a, u), g))| {
            simd.dispatch(SwigluKernel { a, u, g: Some(g), out: [da, du] });
        });
        (f32_tensor(da, dims), f32_tensor(du, dims))
    }
}

// The kernels below are plain loops over slices, every helper
// `inline(always)`: `pulp::Arch::dispatch` compiles `with_simd` inside a
// function with the CPU's best instruction set enabled (as in
// `attention`), where the binary itself targets baseline x86-64.

/// A task's rows for the layer norm kernels (`d` wide, as `gamma`).
enum NormKernel<'a> {
    Forward {
        x: &'a [f32],
        gamma: &'a [f32],
        beta: &'a [f32],
        eps: f32,
        out: &'a mut [f32],
    },
    /// `sums` `[2d]` receives this task's `[dγ, dβ]`.
    Backward {
        x: &'a [f32],
        gamma: &'a [f32],
        g: &'a [f32],
        eps: f32,
        dx: &'a mut [f32],
        sums: &'a mut [f32],
    },
}

/// A row's mean and `1/√(σ² + ε)`.
#[inline(always)]
fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = lane_sum(x.len(), |i| x[i]) / n;
    let var = lane_sum(x.len(), |i| (x[i] - mean) * (x[i] - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

impl pulp::WithSimd for NormKernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        match self {
            NormKernel::Forward { x, gamma, beta, eps, out } => {
                let d = gamma.len();
                for (x, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                    let (mean, r) = moments(x, eps);
                    for (((o, &v), &gm), &bt) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
                        *o = (v - mean) * r * gm + bt;
                    }
                }
            }
            NormKernel::Backward { x, gamma, g, eps, dx, sums } => {
                let d = gamma.len();
                let (dgamma, dbeta) = sums.split_at_mut(d);
                for ((x, g), dx) in x.chunks_exact(d).zip(g.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
                    let (mean, r) = moments(x, eps);
                    for i in 0..d {
                        dgamma[i] += g[i] * (x[i] - mean) * r;
                        dbeta[i] += g[i];
                    }
                    let mean_g = lane_sum(d, |i| g[i] * gamma[i]) / d as f32;
                    let mean_gx = lane_sum(d, |i| g[i] * gamma[i] * (x[i] - mean) * r) / d as f32;
                    for i in 0..d {
                        let normed = (x[i] - mean) * r;
                        dx[i] = r * (g[i] * gamma[i] - mean_g - normed * mean_gx);
                    }
                }
            }
        }
    }
}

/// A task's rows for the RMS norm kernels (`d` wide, as `gamma`).
enum RmsKernel<'a> {
    Forward {
        x: &'a [f32],
        gamma: &'a [f32],
        eps: f32,
        out: &'a mut [f32],
    },
    /// `dgamma` `[d]` receives this task's `dγ`.
    Backward {
        x: &'a [f32],
        gamma: &'a [f32],
        g: &'a [f32],
        eps: f32,
        dx: &'a mut [f32],
        dgamma: &'a mut [f32],
    },
}

impl pulp::WithSimd for RmsKernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let inverse_rms = |x: &[f32], eps: f32| 1.0 / (lane_sum(x.len(), |i| x[i] * x[i]) / x.len() as f32 + eps).sqrt();
        match self {
            RmsKernel::Forward { x, gamma, eps, out } => {
                let d = gamma.len();
                for (x, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                    let r = inverse_rms(x, eps);
                    for ((o, &v), &gm) in out.iter_mut().zip(x).zip(gamma) {
                        *o = v * r * gm;
                    }
                }
            }
            RmsKernel::Backward { x, gamma, g, eps, dx, dgamma } => {
                let d = gamma.len();
                for ((x, g), dx) in x.chunks_exact(d).zip(g.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
                    let r = inverse_rms(x, eps);
                    for ((dg, &gi), &xi) in dgamma.iter_mut().zip(g).zip(x) {
                        *dg += gi * xi * r;
                    }
                    let mean_gx = lane_sum(d, |i| g[i] * gamma[i] * x[i] * r) / d as f32;
                    for i in 0..d {
                        dx[i] = r * (g[i] * gamma[i] - x[i] * r * mean_gx);
                    }
                }
            }
        }
    }
}

/// A task's elements for the SwiGLU kernels: forward, `out[0] = silu(a)·u`;
/// with `g`, `out = [da, du]`.
struct SwigluKernel<'a> {
    a: &'a [f32],
    u: &'a [f32],
    g: Option<&'a [f32]>,
    out: [&'a mut [f32]; 2],
}

/// `σ(a)` from `e^(−|a|)`, which [`exp_neg`] computes without overflow.
#[inline(always)]
fn sigmoid(a: f32) -> f32 {
    let e = exp_neg(-a.abs());
    let s = 1.0 / (1.0 + e);
    if a >= 0.0 { s } else { e * s }
}

impl pulp::WithSimd for SwigluKernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Self { a, u, g, out: [first, second] } = self;
        match g {
            None => {
                for ((o, &a), &u) in first.iter_mut().zip(a).zip(u) {
                    *o = a * sigmoid(a) * u;
                }
            }
            Some(g) => {
                for ((((da, du), &a), &u), &g) in first.iter_mut().zip(second.iter_mut()).zip(a).zip(u).zip(g) {
                    let s = sigmoid(a);
                    *du = g * a * s;
                    *da = g * u * s * (1.0 + a * (1.0 - s));
                }
            }
        }
    }
}

/// A task's rows for the rotary kernel: `x` and `out` `w` wide, `cos` and
/// `sin` `half` wide.
struct RotaryKernel<'a> {
    x: &'a [f32],
    cos: &'a [f32],
    sin: &'a [f32],
    w: usize,
    half: usize,
    out: &'a mut [f32],
}

impl pulp::WithSimd for RotaryKernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Self { x, cos, sin, w, half, out } = self;
        let rows = out.chunks_exact_mut(w).zip(x.chunks_exact(w)).zip(cos.chunks_exact(half).zip(sin.chunks_exact(half)));
        for ((out, x), (cos, sin)) in rows {
            for (out, x) in out.chunks_exact_mut(2 * half).zip(x.chunks_exact(2 * half)) {
                let ((o1, o2), (x1, x2)) = (out.split_at_mut(half), x.split_at(half));
                for ((((o1, o2), (&a, &b)), &c), &s) in o1.iter_mut().zip(o2).zip(x1.iter().zip(x2)).zip(cos).zip(sin) {
                    *o1 = a * c - b * s;
                    *o2 = a * s + b * c;
                }
            }
        }
    }
}

/// GELU over a slice: its values, or with `g` its gradient.
struct GeluKernel<'a> {
    x: &'a [f32],
    g: Option<&'a [f32]>,
    out: &'a mut [f32],
}

impl pulp::WithSimd for GeluKernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        match self.g {
            None => {
                for (o, &x) in self.out.iter_mut().zip(self.x) {
                    *o = x * normal_cdf_pdf(x).0;
                }
            }
            Some(g) => {
                for ((o, &x), &g) in self.out.iter_mut().zip(self.x).zip(g) {
                    let (cdf, pdf) = normal_cdf_pdf(x);
                    *o = g * (cdf + x * pdf);
                }
            }
        }
    }
}

/// `(Φ(x), φ(x))`, the standard normal's distribution and density, without
/// branches or library calls so that a loop over them vectorises:
/// `Φ(x) = (1 + erf(x/√2))/2` with Abramowitz and Stegun's 7.1.26,
/// `erf(z) = 1 − t(a₁ + t(a₂ + t(a₃ + t(a₄ + t a₅)))) e^(−z²)`,
/// `t = 1/(1 + p|z|)`, whose `e^(−z²) = e^(−x²/2)` is also `φ`'s.
#[inline(always)]
pub(crate) fn normal_cdf_pdf(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152, 1.061_405_4];
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let e = exp_neg(-0.5 * x * x);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let erf = (1.0 - poly * e).copysign(x);
    (0.5 * (1.0 + erf), INV_SQRT_2PI * e)
}

/// `eᵞ` for `y ≤ 0` (0 below −87), to a few units in the last place:
/// `y = n ln 2 + r` with `|r| ≤ ln 2 / 2`, `eʳ` by its Taylor series to
/// degree 6 (relative error 1.2e-7), `2ⁿ` written into the exponent bits.
/// No float-to-integer cast (Rust's saturates, with a branch that stops
/// vectorisation): `y log₂e + 1.5·2²³` holds `n` in its low mantissa bits.
#[inline(always)]
fn exp_neg(y: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let y = y.max(-87.0);
    let shifted = y * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (y - n * 0.693_145_75) - n * 1.428_606_8e-6; // ln 2 in two parts
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits()); // n, two's complement
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// `Σ f(i)` for `i < n`, in eight interleaved partial sums: a float sum in
/// one accumulator is a chain the compiler may not reorder, eight of them
/// are one vector register.
#[inline(always)]
fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane += f(i + l);
        }
    }
    lanes.iter().sum::<f32>() + (whole..n).map(f).sum::<f32>()
}

/// The layer norm node of the autodiff graph: it keeps `x`, `γ` and `ε`.
#[derive(Debug)]
struct LayerNormNode;

impl<B: PointwiseBackend> Backward<B, 3> for LayerNormNode {
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, gamma, epsilon) = ops.state;
        let (dx, dgamma, dbeta) = B::fused_layer_norm_backward(
            Tensor::from_primitive(TensorPrimitive::Float(x)),
            Tensor::from_primitive(TensorPrimitive::Float(gamma)),
            Tensor::from_primitive(TensorPrimitive::Float(grad)),
            epsilon,
        );
        let [node_x, node_gamma, node_beta] = ops.parents;
        for (node, part) in [(node_x, float(dx)), (node_gamma, float(dgamma)), (node_beta, float(dbeta))] {
            if let Some(node) = node {
                grads.register::<B>(node.id, part);
            }
        }
    }
}

/// The GELU node: it keeps `x`.
#[derive(Debug)]
struct GeluNode;

impl<B: PointwiseBackend> Backward<B, 1> for GeluNode {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let x = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(ops.state));
            let dx = B::fused_gelu_backward(x, Tensor::from_primitive(TensorPrimitive::Float(grad)));
            grads.register::<B>(node.id, float(dx));
        }
    }
}

/// The RMS norm node: it keeps `x`, `γ` and `ε`.
#[derive(Debug)]
struct RmsNormNode;

impl<B: PointwiseBackend> Backward<B, 2> for RmsNormNode {
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, gamma, epsilon) = ops.state;
        let (dx, dgamma) = B::fused_rms_norm_backward(
            Tensor::from_primitive(TensorPrimitive::Float(x)),
            Tensor::from_primitive(TensorPrimitive::Float(gamma)),
            Tensor::from_primitive(TensorPrimitive::Float(grad)),
            epsilon,
        );
        let [node_x, node_gamma] = ops.parents;
        for (node, part) in [(node_x, float(dx)), (node_gamma, float(dgamma))] {
            if let Some(node) = node {
                grads.register::<B>(node.id, part);
            }
        }
    }
}

/// The SwiGLU node: it keeps `a` and `u`.
#[derive(Debug)]
struct SwigluNode;

impl<B: PointwiseBackend> Backward<B, 2> for SwigluNode {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (a, u) = ops.state;
        let tensor = |x| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x));
        let (da, du) = B::swiglu_backward(tensor(a), tensor(u), tensor(grad));
        let [node_a, node_u] = ops.parents;
        for (node, part) in [(node_a, float(da)), (node_u, float(du))] {
            if let Some(node) = node {
                grads.register::<B>(node.id, part);
            }
        }
    }
}

/// The rotary node: it keeps the angles' cosines and sines (constants).
#[derive(Debug)]
struct RotaryNode;

impl<B: PointwiseBackend> Backward<B, 1> for RotaryNode {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let (cos, sin) = ops.state;
            let tensor = |x| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x));
            // The inverse rotation: the same angles, negated.
            let dx = B::rotary(tensor(grad), tensor(cos), -tensor(sin));
            grads.register::<B>(node.id, float(dx));
        }
    }
}

impl<B: PointwiseBackend, C: CheckpointStrategy> PointwiseBackend for Autodiff<B, C> {
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let (x, gamma, beta) = (float(x), float(gamma), float(beta));
        let inner = |x: &FloatTensor<B>| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x.clone()));
        let vector = |x: &FloatTensor<B>| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x.clone()));
        let forward = || float(B::fused_layer_norm(inner(&x.primitive), vector(&gamma.primitive), vector(&beta.primitive), epsilon));
        let out = match LayerNormNode.prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((x.primitive, gamma.primitive, epsilon), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let x = float(x);
        let forward = || float(B::fused_gelu(Tensor::from_primitive(TensorPrimitive::Float(x.primitive.clone()))));
        let out = match GeluNode.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish(x.primitive, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let x = float(x);
        let (cos, sin) = (float(cos.inner()), float(sin.inner()));
        let tensor = |x: &FloatTensor<B>| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x.clone()));
        let forward = || float(B::rotary(tensor(&x.primitive), tensor(&cos), tensor(&sin)));
        let out = match RotaryNode.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((cos, sin), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let (x, gamma) = (float(x), float(gamma));
        let inner = |x: &FloatTensor<B>| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x.clone()));
        let vector = |x: &FloatTensor<B>| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x.clone()));
        let forward = || float(B::fused_rms_norm(inner(&x.primitive), vector(&gamma.primitive), epsilon));
        let out = match RmsNormNode.prepare::<C>([x.node.clone(), gamma.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((x.primitive, gamma.primitive, epsilon), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let (a, u) = (float(a), float(u));
        let inner = |x: &FloatTensor<B>| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x.clone()));
        let forward = || float(B::swiglu(inner(&a.primitive), inner(&u.primitive)));
        let out = match SwigluNode.prepare::<C>([a.node.clone(), u.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = forward();
                prep.finish((a.primitive, u.primitive), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward()),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::LayerNormConfig;
    use burn::tensor::Distribution;

    type Ad = Autodiff<Flex>;

    fn close(a: Vec<f32>, b: Vec<f32>, tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst <= tol, "{what}: largest difference {worst} > {tol}");
    }

    fn values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
        x.into_data().convert::<f32>().into_vec().unwrap()
    }

    #[test]
    fn normal_cdf_and_pdf_match_libm() {
        for i in -2000..=2000 {
            let x = i as f32 / 200.0; // −10 … 10
            let (cdf, pdf) = normal_cdf_pdf(x);
            let want_cdf = 0.5 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2));
            let want_pdf = (-0.5 * (x as f64).powi(2)).exp() / (2.0 * std::f64::consts::PI).sqrt();
            assert!((cdf as f64 - want_cdf).abs() < 3e-7, "Φ({x}) = {cdf}, want {want_cdf}");
            // Relative: f32's rounding of −x²/2 grows with its size.
            let tol = 2e-7 * (1.0 + 0.5 * (x as f64).powi(2)) * want_pdf + 1e-30;
            assert!((pdf as f64 - want_pdf).abs() <= tol, "φ({x}) = {pdf}, want {want_pdf}");
        }
    }

    /// The node's values and all three gradients against Burn's own layer
    /// norm (its composition, differentiated op by op), with a non-trivial
    /// γ and β and a loss that weighs every output differently.
    #[test]
    fn layer_norm_node_matches_burn() {
        let device = Default::default();
        let [n, d] = [37, 24];
        let mut norm = LayerNormConfig::new(d).init::<Ad>(&device);
        norm.gamma = norm.gamma.map(|g| g.random_like(Distribution::Normal(1.0, 0.5)).require_grad());
        norm.beta = norm.beta.map(|b| b.map(|b| b.random_like(Distribution::Normal(0.0, 0.5)).require_grad()));
        let x = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.3, 2.0), &device).require_grad();
        let weights = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let beta = norm.beta.as_ref().unwrap();

        let ours = Ad::fused_layer_norm(x.clone(), norm.gamma.val(), beta.val(), 1e-5);
        let burns = norm.forward(x.clone());
        close(values(ours.clone()), values(burns.clone()), 1e-5, "values");
        let g1 = (ours * weights.clone()).sum().backward();
        let g2 = (burns * weights).sum().backward();
        let grad = |t: &Tensor<Ad, 2>, g| values(t.grad(g).unwrap());
        let grad1 = |t: &Tensor<Ad, 1>, g| values(t.grad(g).unwrap());
        close(grad(&x, &g1), grad(&x, &g2), 1e-4, "dx");
        close(grad1(&norm.gamma.val(), &g1), grad1(&norm.gamma.val(), &g2), 1e-4, "dγ");
        close(grad1(&beta.val(), &g1), grad1(&beta.val(), &g2), 1e-4, "dβ");
    }

    /// Flex's kernels against the default methods' tensor equations, on
    /// more rows than one task holds.
    #[test]
    fn flex_kernels_match_the_tensor_equations() {
        let device = Default::default();
        let [n, d] = [1000, 40];
        let x = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(-0.2, 1.5), &device);
        let gamma = Tensor::<Flex, 1>::random([d], Distribution::Normal(1.0, 0.3), &device);
        let beta = Tensor::<Flex, 1>::random([d], Distribution::Normal(0.0, 0.3), &device);
        let g = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let burns = <Flex as ModuleOps<Flex>>::layer_norm(float(x.clone()), float(gamma.clone()), Some(float(beta.clone())), 1e-5);
        let burns = Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(burns));
        close(values(Flex::fused_layer_norm(x.clone(), gamma.clone(), beta, 1e-5)), values(burns), 1e-5, "norm");
        let (dx, dgamma, dbeta) = Flex::fused_layer_norm_backward(x.clone(), gamma.clone(), g.clone(), 1e-5);
        let want = layer_norm_backward_tensors(x.clone(), gamma, g.clone(), 1e-5);
        close(values(dx), values(want.0), 1e-4, "dx");
        close(values(dgamma), values(want.1), 1e-3, "dγ");
        close(values(dbeta), values(want.2), 1e-3, "dβ");
        close(values(Flex::fused_gelu(x.clone())), values(burn::tensor::activation::gelu(x.clone())), 1e-6, "gelu");
        let want = <Flex as ActivationOps<Flex>>::gelu_backward(float(x.clone()), float(g.clone()));
        let want = Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(want));
        close(values(Flex::fused_gelu_backward(x, g)), values(want), 2e-6, "gelu'");
    }

    /// The rotary node (flex's kernel forward, the inverse rotation
    /// backward) against the tensor equations differentiated by Burn, over
    /// more rows than one task holds; and one pair by hand.
    #[test]
    fn rotary_node_matches_the_tensor_equations() {
        let device = Default::default();
        let [n, heads, half] = [400, 3, 16];
        let x = Tensor::<Ad, 2>::random([n, heads * 2 * half], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let angles = Tensor::<Ad, 2>::random([n, half], Distribution::Uniform(-3.0, 3.0), &device);
        let (cos, sin) = (angles.clone().cos(), angles.sin());
        let w = Tensor::<Ad, 2>::random([n, heads * 2 * half], Distribution::Normal(0.0, 1.0), &device);
        let ours = Ad::rotary(x.clone(), cos.clone(), sin.clone());
        let reference = rotary_tensors(x.clone(), cos, sin);
        close(values(ours.clone()), values(reference.clone()), 1e-6, "values");
        let (g1, g2) = ((ours * w.clone()).sum().backward(), (reference * w).sum().backward());
        close(values(x.grad(&g1).unwrap()), values(x.grad(&g2).unwrap()), 1e-6, "dx");
        // Head width 2: channel 0 pairs with channel 1; a quarter turn takes
        // (1, 2) to (−2, 1).
        let one = |v: Vec<f32>, dims: [usize; 2]| Tensor::<Flex, 2>::from_data(TensorData::new(v, dims), &device);
        let turned = Flex::rotary(one(vec![1.0, 2.0], [1, 2]), one(vec![0.0], [1, 1]), one(vec![1.0], [1, 1]));
        close(values(turned), vec![-2.0, 1.0], 0.0, "a quarter turn");
    }

    /// The RMS norm and SwiGLU nodes (flex's kernels both ways) against
    /// Burn's own `RmsNorm` and `silu(a)·u` differentiated op by op, over
    /// more rows than one task holds.
    #[test]
    fn rms_norm_and_swiglu_nodes_match_burn() {
        let device = Default::default();
        let [n, d] = [300, 72];
        let mut norm = burn::nn::RmsNormConfig::new(d).with_epsilon(1e-5).init::<Ad>(&device);
        norm.gamma = norm.gamma.map(|g| g.random_like(Distribution::Normal(1.0, 0.5)).require_grad());
        let x = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.3, 2.0), &device).require_grad();
        let w = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let ours = Ad::fused_rms_norm(x.clone(), norm.gamma.val(), 1e-5);
        let burns = norm.forward(x.clone());
        close(values(ours.clone()), values(burns.clone()), 1e-5, "rms values");
        let (g1, g2) = ((ours * w.clone()).sum().backward(), (burns * w.clone()).sum().backward());
        close(values(x.grad(&g1).unwrap()), values(x.grad(&g2).unwrap()), 1e-4, "rms dx");
        close(values(norm.gamma.val().grad(&g1).unwrap()), values(norm.gamma.val().grad(&g2).unwrap()), 1e-3, "rms dγ");

        let a = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 4.0), &device).require_grad();
        let u = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let ours = Ad::swiglu(a.clone(), u.clone());
        let burns = burn::tensor::activation::silu(a.clone()) * u.clone();
        close(values(ours.clone()), values(burns.clone()), 1e-5, "swiglu values");
        let (g1, g2) = ((ours * w.clone()).sum().backward(), (burns * w.clone()).sum().backward());
        close(values(a.grad(&g1).unwrap()), values(a.grad(&g2).unwrap()), 1e-5, "swiglu da");
        close(values(u.grad(&g1).unwrap()), values(u.grad(&g2).unwrap()), 1e-5, "swiglu du");

        // Flex's backward kernels against the equations the other backends run.
        let g = w.clone().inner();
        let (dx, dgamma) = Flex::fused_rms_norm_backward(x.clone().inner(), norm.gamma.val().inner(), g.clone(), 1e-5);
        let want = rms_norm_backward_tensors(x.clone().inner(), norm.gamma.val().inner(), g.clone(), 1e-5);
        close(values(dx), values(want.0), 1e-4, "rms dx, tensor equations");
        close(values(dgamma), values(want.1), 1e-3, "rms dγ, tensor equations");
        let (da, du) = Flex::swiglu_backward(a.clone().inner(), u.clone().inner(), g.clone());
        let want = swiglu_backward_tensors(a.clone().inner(), u.clone().inner(), g);
        close(values(da), values(want.0), 1e-5, "swiglu da, tensor equations");
        close(values(du), values(want.1), 1e-5, "swiglu du, tensor equations");
    }

    /// The GELU node's gradient is the kernel's.
    #[test]
    fn gelu_node_gradient() {
        let device = Default::default();
        let x = Tensor::<Ad, 2>::random([64, 33], Distribution::Normal(0.0, 3.0), &device).require_grad();
        let w = Tensor::<Ad, 2>::random([64, 33], Distribution::Normal(0.0, 1.0), &device);
        let ours = (Ad::fused_gelu(x.clone()) * w.clone()).sum().backward();
        let burns = (burn::tensor::activation::gelu(x.clone()) * w).sum().backward();
        close(values(x.grad(&ours).unwrap()), values(x.grad(&burns).unwrap()), 2e-6, "dx");
    }
}
