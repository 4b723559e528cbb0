//! Layer normalisation, the policy trained from scratch's norm, as one
//! autodiff node with a fused backward pass
//! ([`PointwiseBackend::fused_layer_norm`]).
//!
//! Burn 0.21's autodiff backend differentiates `LayerNorm` through its
//! reference composition: mean, centre, square, mean, add ε, square root,
//! divide, scale, shift. That is nine nodes, each writing an `[n, d]` tensor
//! and running a backward pass of its own, for an operation that reads each
//! row once. The node keeps only its inputs, and its backward pass
//! recomputes what it needs, row by row:
//!
//! ```text
//! x̂ = (x − μ) · r,   r = 1/√(σ² + ε),   y = x̂ ∘ γ + β
//! dβ = Σ_rows g,   dγ = Σ_rows g ∘ x̂
//! dx = r · (ĝ − mean(ĝ) − x̂ · mean(ĝ ∘ x̂)),   ĝ = g ∘ γ
//! ```
//!
//! On flex the kernels are ours: plain loops over contiguous rows with
//! eight-lane sums. Other backends (wgpu, CUDA, LibTorch) run Burn's layer
//! norm forward and the same equations as tensor operations backward.

use burn::backend::Autodiff;
use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use rayon::prelude::*;

use crate::PointwiseBackend;
use crate::autodiff::{n_ary, primitive, record, tensor};
use crate::flex::{f32_tensor, f32_values, rows_per_task};
use crate::simd::lane_sum;

/// The layer norm's backward equations as tensor operations, for any backend.
pub(crate) fn backward_tensors<B: Backend>(
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

/// [`PointwiseBackend::fused_layer_norm`] on flex.
pub(crate) fn flex_forward(x: Tensor<Flex, 2>, gamma: Tensor<Flex, 1>, beta: Tensor<Flex, 1>, epsilon: f64) -> Tensor<Flex, 2> {
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

/// [`PointwiseBackend::fused_layer_norm_backward`] on flex.
pub(crate) fn flex_backward(
    x: Tensor<Flex, 2>,
    gamma: Tensor<Flex, 1>,
    grad: Tensor<Flex, 2>,
    epsilon: f64,
) -> (Tensor<Flex, 2>, Tensor<Flex, 1>, Tensor<Flex, 1>) {
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

/// A task's rows for the layer norm kernels (`d` wide, as `gamma`),
/// dispatched as the `simd` module describes.
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

/// The layer norm node of the autodiff graph: it keeps `x`, `γ` and `ε`.
#[derive(Debug)]
struct LayerNormNode;

impl<B: PointwiseBackend> Backward<B, 3> for LayerNormNode {
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        n_ary(ops, grads, |(x, gamma, epsilon): Self::State, grad: Tensor<B, 2>, _| {
            let (dx, dgamma, dbeta) = B::fused_layer_norm_backward(tensor(x), tensor(gamma), grad, epsilon);
            [Some(primitive(dx)), Some(primitive(dgamma)), Some(primitive(dbeta))]
        });
    }
}

/// [`PointwiseBackend::fused_layer_norm`] under autodiff: the inner
/// backend's forward pass, recorded as a [`LayerNormNode`].
pub(crate) fn node<B: PointwiseBackend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 2>,
    gamma: Tensor<Autodiff<B, C>, 1>,
    beta: Tensor<Autodiff<B, C>, 1>,
    epsilon: f64,
) -> Tensor<Autodiff<B, C>, 2> {
    let (x, gamma, beta) = (primitive(x), primitive(gamma), primitive(beta));
    let inner = B::fused_layer_norm(tensor(x.primitive.clone()), tensor(gamma.primitive.clone()), tensor(beta.primitive.clone()), epsilon);
    let prep = LayerNormNode.prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()]).compute_bound();
    record(prep, (x.primitive, gamma.primitive, epsilon), primitive(inner))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::LayerNormConfig;
    use burn::tensor::Distribution;
    use burn::tensor::ops::ModuleOps;

    type Ad = Autodiff<Flex>;

    fn close(a: Vec<f32>, b: Vec<f32>, tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst <= tol, "{what}: largest difference {worst} > {tol}");
    }

    fn values<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
        x.into_data().convert::<f32>().into_vec().unwrap()
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

    /// Flex's kernels against Burn's layer norm and the default methods'
    /// tensor equations, on more rows than one task holds.
    #[test]
    fn flex_kernels_match_the_tensor_equations() {
        let device = Default::default();
        let [n, d] = [1000, 40];
        let x = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(-0.2, 1.5), &device);
        let gamma = Tensor::<Flex, 1>::random([d], Distribution::Normal(1.0, 0.3), &device);
        let beta = Tensor::<Flex, 1>::random([d], Distribution::Normal(0.0, 0.3), &device);
        let g = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let burns =
            <Flex as ModuleOps<Flex>>::layer_norm(primitive(x.clone()), primitive(gamma.clone()), Some(primitive(beta.clone())), 1e-5);
        close(values(Flex::fused_layer_norm(x.clone(), gamma.clone(), beta, 1e-5)), values(tensor::<Flex, 2>(burns)), 1e-5, "norm");
        let (dx, dgamma, dbeta) = Flex::fused_layer_norm_backward(x.clone(), gamma.clone(), g.clone(), 1e-5);
        let want = backward_tensors(x, gamma, g, 1e-5);
        close(values(dx), values(want.0), 1e-4, "dx");
        close(values(dgamma), values(want.1), 1e-3, "dγ");
        close(values(dbeta), values(want.2), 1e-3, "dβ");
    }
}
