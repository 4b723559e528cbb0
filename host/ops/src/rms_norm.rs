//! RMS normalisation, the norm of the pretrained Llama and Qwen2 models, as
//! one autodiff node with a fused backward pass
//! ([`PointwiseBackend::fused_rms_norm`]).
//!
//! Burn's `RmsNorm` is six autodiff nodes (square, mean, add ε, square
//! root, divide, scale), each writing an `[n, d]` tensor and keeping it for
//! the backward pass. This node keeps only `x` and `γ`, and its backward
//! pass recomputes what it needs, row by row:
//!
//! ```text
//! r = 1/√(mean(x²) + ε),   x̂ = x · r,   y = x̂ ∘ γ
//! dγ = Σ_rows g ∘ x̂,   dx = r · (ĝ − x̂ · mean(ĝ ∘ x̂)),   ĝ = g ∘ γ
//! ```
//!
//! On flex the kernels are ours: plain loops over contiguous rows with
//! eight-lane sums. Other backends (wgpu, CUDA, LibTorch) run the same
//! equations as tensor operations.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use rayon::prelude::*;

use crate::PointwiseBackend;
use crate::autodiff::{n_ary, primitive, record, tensor};
use crate::flex::{f32_tensor, f32_values, rows_per_task};
use crate::simd::lane_sum;

/// [`PointwiseBackend::fused_rms_norm`] as tensor operations, for any backend.
pub(crate) fn forward_tensors<B: Backend>(x: Tensor<B, 2>, gamma: Tensor<B, 1>, epsilon: f64) -> Tensor<B, 2> {
    let d = gamma.dims()[0];
    let r = (x.clone().square().mean_dim(1) + epsilon).sqrt().recip(); // [n, 1]
    x * r * gamma.reshape([1, d])
}

/// The RMS norm's backward equations as tensor operations, for any backend:
/// `x̂ = x·r`, `ĝ = g∘γ`, `dγ = Σ_rows g∘x̂`, `dx = r·(ĝ − x̂·mean(ĝ∘x̂))`.
pub(crate) fn backward_tensors<B: Backend>(
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

/// [`PointwiseBackend::fused_rms_norm`] on flex.
pub(crate) fn flex_forward(x: Tensor<Flex, 2>, gamma: Tensor<Flex, 1>, epsilon: f64) -> Tensor<Flex, 2> {
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

/// [`PointwiseBackend::fused_rms_norm_backward`] on flex.
pub(crate) fn flex_backward(
    x: Tensor<Flex, 2>,
    gamma: Tensor<Flex, 1>,
    grad: Tensor<Flex, 2>,
    epsilon: f64,
) -> (Tensor<Flex, 2>, Tensor<Flex, 1>) {
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

/// A task's rows for the RMS norm kernels (`d` wide, as `gamma`),
/// dispatched as the `simd` module describes.
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

/// The RMS norm node: it keeps `x`, `γ` and `ε`.
#[derive(Debug)]
struct RmsNormNode;

impl<B: PointwiseBackend> Backward<B, 2> for RmsNormNode {
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        n_ary(ops, grads, |(x, gamma, epsilon): Self::State, grad: Tensor<B, 2>, _| {
            let (dx, dgamma) = B::fused_rms_norm_backward(tensor(x), tensor(gamma), grad, epsilon);
            [Some(primitive(dx)), Some(primitive(dgamma))]
        });
    }
}

/// [`PointwiseBackend::fused_rms_norm`] under autodiff: the inner backend's
/// forward pass, recorded as an [`RmsNormNode`].
pub(crate) fn node<B: PointwiseBackend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 2>,
    gamma: Tensor<Autodiff<B, C>, 1>,
    epsilon: f64,
) -> Tensor<Autodiff<B, C>, 2> {
    let (x, gamma) = (primitive(x), primitive(gamma));
    let inner = B::fused_rms_norm(tensor(x.primitive.clone()), tensor(gamma.primitive.clone()), epsilon);
    let prep = RmsNormNode.prepare::<C>([x.node.clone(), gamma.node.clone()]).compute_bound();
    record(prep, (x.primitive, gamma.primitive, epsilon), primitive(inner))
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// The RMS norm node (flex's kernels both ways) against Burn's own
    /// `RmsNorm` differentiated op by op, and flex's backward kernel
    /// against the equations the other backends run, over more rows than
    /// one task holds.
    #[test]
    fn rms_norm_node_matches_burn() {
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

        // Flex's backward kernel against the equations the other backends run.
        let g = w.inner();
        let (dx, dgamma) = Flex::fused_rms_norm_backward(x.clone().inner(), norm.gamma.val().inner(), g.clone(), 1e-5);
        let want = backward_tensors(x.inner(), norm.gamma.val().inner(), g, 1e-5);
        close(values(dx), values(want.0), 1e-4, "rms dx, tensor equations");
        close(values(dgamma), values(want.1), 1e-3, "rms dγ, tensor equations");
    }
}
