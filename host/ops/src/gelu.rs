//! GELU, the policy trained from scratch's activation, as one autodiff node
//! with kernels of our own ([`PointwiseBackend::fused_gelu`]).
//!
//! Burn 0.21 has GELU as one node already, but flex computes its `erf` one
//! element at a time with libm, a sizeable share of a training step
//! (docs/results.md, "Layer norm and GELU as one node each"). The node keeps
//! only `x`:
//!
//! ```text
//! y = x · Φ(x),   Φ(x) = (1 + erf(x/√2)) / 2
//! dx = g · (Φ(x) + x · φ(x)),   φ(x) = exp(−x²/2) / √(2π)
//! ```
//!
//! On flex the kernels are ours: plain loops compiled for the CPU's vector
//! instructions, `erf` from a rational approximation (Abramowitz and Stegun
//! 7.1.26, absolute error below 1.5e-7) that shares its `exp(−x²/2)` with
//! `φ`. Other backends (wgpu, CUDA, LibTorch) run Burn's GELU and its
//! gradient.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use rayon::prelude::*;

use crate::PointwiseBackend;
use crate::autodiff::{primitive, record, tensor, unary};
use crate::flex::{TASK_FLOATS, f32_tensor, f32_values};
use crate::simd::exp_neg;

/// [`PointwiseBackend::fused_gelu`] on flex.
pub(crate) fn flex_forward(x: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
    let dims = x.dims();
    let x = f32_values(x);
    let mut out = vec![0.0f32; x.len()];
    let simd = pulp::Arch::new();
    out.par_chunks_mut(TASK_FLOATS).zip(x.par_chunks(TASK_FLOATS)).for_each(|(out, x)| {
        simd.dispatch(GeluKernel { x, g: None, out });
    });
    f32_tensor(out, dims)
}

/// [`PointwiseBackend::fused_gelu_backward`] on flex.
pub(crate) fn flex_backward(x: Tensor<Flex, 2>, grad: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
    let dims = x.dims();
    let (x, grad) = (f32_values(x), f32_values(grad));
    let mut dx = vec![0.0f32; x.len()];
    let simd = pulp::Arch::new();
    dx.par_chunks_mut(TASK_FLOATS).zip(x.par_chunks(TASK_FLOATS).zip(grad.par_chunks(TASK_FLOATS))).for_each(|(dx, (x, g))| {
        simd.dispatch(GeluKernel { x, g: Some(g), out: dx });
    });
    f32_tensor(dx, dims)
}

/// GELU over a slice: its values, or with `g` its gradient; dispatched as
/// the `simd` module describes.
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
fn normal_cdf_pdf(x: f32) -> (f32, f32) {
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

/// The GELU node: it keeps `x`.
#[derive(Debug)]
struct GeluNode;

impl<B: PointwiseBackend> Backward<B, 1> for GeluNode {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary(ops, grads, |x: FloatTensor<B>, grad: Tensor<B, 2>| B::fused_gelu_backward(tensor(x), grad));
    }
}

/// [`PointwiseBackend::fused_gelu`] under autodiff: the inner backend's
/// forward pass, recorded as a [`GeluNode`].
pub(crate) fn node<B: PointwiseBackend, C: CheckpointStrategy>(x: Tensor<Autodiff<B, C>, 2>) -> Tensor<Autodiff<B, C>, 2> {
    let x = primitive(x);
    let inner = B::fused_gelu(tensor(x.primitive.clone()));
    record(GeluNode.prepare::<C>([x.node.clone()]).compute_bound(), x.primitive, primitive(inner))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use burn::tensor::ops::ActivationOps;

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

    /// Flex's kernels against Burn's GELU and its gradient, on more rows
    /// than one task holds.
    #[test]
    fn flex_kernels_match_burns_gelu() {
        let device = Default::default();
        let [n, d] = [1000, 40];
        let x = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(-0.2, 1.5), &device);
        let g = Tensor::<Flex, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        close(values(Flex::fused_gelu(x.clone())), values(burn::tensor::activation::gelu(x.clone())), 1e-6, "gelu");
        let want = <Flex as ActivationOps<Flex>>::gelu_backward(primitive(x.clone()), primitive(g.clone()));
        close(values(Flex::fused_gelu_backward(x, g)), values(tensor::<Flex, 2>(want)), 2e-6, "gelu'");
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
