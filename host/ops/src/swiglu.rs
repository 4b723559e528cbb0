//! SwiGLU, the gated activation of the pretrained Llama and Qwen2 models'
//! MLPs, as one autodiff node with kernels of our own
//! ([`PointwiseBackend::swiglu`]).
//!
//! The gate `a` and the up projection `u` combine element-wise: composed
//! from Burn's operations, `silu(a) · u` is three autodiff nodes, each
//! writing an `[n, f]` tensor and keeping it for the backward pass. This
//! node keeps only `a` and `u`:
//!
//! ```text
//! y = silu(a) ∘ u,   silu(a) = a · σ(a)
//! du = g · a · σ(a),   da = g · u · σ(a) · (1 + a · (1 − σ(a)))
//! ```
//!
//! On flex the kernels are ours, with a branch-free sigmoid so that their
//! loops vectorise. Other backends (wgpu, CUDA, LibTorch) run the same
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
use crate::flex::{TASK_FLOATS, f32_tensor, f32_values};
use crate::simd::exp_neg;

/// SwiGLU's backward equations as tensor operations, for any backend:
/// `du = g·a·σ(a)`, `da = g·u·σ(a)·(1 + a·(1 − σ(a)))`.
pub(crate) fn backward_tensors<B: Backend>(a: Tensor<B, 2>, u: Tensor<B, 2>, grad: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let s = burn::tensor::activation::sigmoid(a.clone()); // σ(a)
    let du = grad.clone() * a.clone() * s.clone();
    let da = grad * u * s.clone() * ((s.neg() + 1.0) * a + 1.0);
    (da, du)
}

/// [`PointwiseBackend::swiglu`] on flex.
pub(crate) fn flex_forward(a: Tensor<Flex, 2>, u: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
    let dims = a.dims();
    let (a, u) = (f32_values(a), f32_values(u));
    let mut out = vec![0.0f32; a.len()];
    let simd = pulp::Arch::new();
    out.par_chunks_mut(TASK_FLOATS).zip(a.par_chunks(TASK_FLOATS).zip(u.par_chunks(TASK_FLOATS))).for_each(|(out, (a, u))| {
        simd.dispatch(SwigluKernel { a, u, g: None, out: [out, &mut []] });
    });
    f32_tensor(out, dims)
}

/// [`PointwiseBackend::swiglu_backward`] on flex.
pub(crate) fn flex_backward(a: Tensor<Flex, 2>, u: Tensor<Flex, 2>, grad: Tensor<Flex, 2>) -> (Tensor<Flex, 2>, Tensor<Flex, 2>) {
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

/// A task's elements for the SwiGLU kernels, dispatched as the `simd`
/// module describes: forward, `out[0] = silu(a)·u`; with `g`,
/// `out = [da, du]`.
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

/// The SwiGLU node: it keeps `a` and `u`.
#[derive(Debug)]
struct SwigluNode;

impl<B: PointwiseBackend> Backward<B, 2> for SwigluNode {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        n_ary(ops, grads, |(a, u): Self::State, grad: Tensor<B, 2>, _| {
            let (da, du) = B::swiglu_backward(tensor(a), tensor(u), grad);
            [Some(primitive(da)), Some(primitive(du))]
        });
    }
}

/// [`PointwiseBackend::swiglu`] under autodiff: the inner backend's forward
/// pass, recorded as a [`SwigluNode`].
pub(crate) fn node<B: PointwiseBackend, C: CheckpointStrategy>(
    a: Tensor<Autodiff<B, C>, 2>,
    u: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let (a, u) = (primitive(a), primitive(u));
    let inner = B::swiglu(tensor(a.primitive.clone()), tensor(u.primitive.clone()));
    let prep = SwigluNode.prepare::<C>([a.node.clone(), u.node.clone()]).compute_bound();
    record(prep, (a.primitive, u.primitive), primitive(inner))
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

    /// The SwiGLU node (flex's kernels both ways) against `silu(a)·u`
    /// differentiated op by op by Burn, and flex's backward kernel against
    /// the equations the other backends run, over more rows than one task
    /// holds.
    #[test]
    fn swiglu_node_matches_burn() {
        let device = Default::default();
        let [n, d] = [300, 72];
        let w = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let a = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 4.0), &device).require_grad();
        let u = Tensor::<Ad, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let ours = Ad::swiglu(a.clone(), u.clone());
        let burns = burn::tensor::activation::silu(a.clone()) * u.clone();
        close(values(ours.clone()), values(burns.clone()), 1e-5, "swiglu values");
        let (g1, g2) = ((ours * w.clone()).sum().backward(), (burns * w.clone()).sum().backward());
        close(values(a.grad(&g1).unwrap()), values(a.grad(&g2).unwrap()), 1e-5, "swiglu da");
        close(values(u.grad(&g1).unwrap()), values(u.grad(&g2).unwrap()), 1e-5, "swiglu du");

        // Flex's backward kernel against the equations the other backends run.
        let g = w.inner();
        let (da, du) = Flex::swiglu_backward(a.clone().inner(), u.clone().inner(), g.clone());
        let want = backward_tensors(a.inner(), u.inner(), g);
        close(values(da), values(want.0), 1e-5, "swiglu da, tensor equations");
        close(values(du), values(want.1), 1e-5, "swiglu du, tensor equations");
    }
}
