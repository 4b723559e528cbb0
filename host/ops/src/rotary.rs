//! Rotary positions (RoPE), as the pretrained Llama and Qwen2 models use
//! them and the policy trained from scratch may (its `rotary` setting), as
//! one autodiff node on rows ([`PointwiseBackend::rotary`]).
//!
//! Each head's channel pairs `(i, i + k/2)` turn by an angle per row and
//! pair. As tensor operations on head views split off the projections, the
//! rotation read strided memory and was several autodiff nodes; here it
//! works on the rows `[n, heads·k]` as the projections lay them out
//! (docs/results.md, "Attention on the projections' layout, and a cache
//! written in place"). Its gradient is the same
//! rotation with the angles negated, so the node keeps only the angles'
//! cosines and sines (constants, no gradient):
//!
//! ```text
//! y₁ = x₁ cos − x₂ sin,   y₂ = x₁ sin + x₂ cos
//! dx = rotary(g, cos, −sin)
//! ```
//!
//! On flex the kernel is ours; other backends (wgpu, CUDA, LibTorch) run
//! the same rotation as tensor operations.

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
use crate::flex::{f32_tensor, f32_values, rows_per_task};

/// [`PointwiseBackend::rotary`] as tensor operations, for any backend.
pub(crate) fn forward_tensors<B: Backend>(x: Tensor<B, 2>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 2> {
    let [n, w] = x.dims();
    let half = cos.dims()[1];
    let x = x.reshape([n, w / (2 * half), 2, half]);
    let (x1, x2) = (x.clone().narrow(2, 0, 1), x.narrow(2, 1, 1)); // [n, heads, 1, k/2]
    let (cos, sin) = (cos.reshape([n, 1, 1, half]), sin.reshape([n, 1, 1, half]));
    Tensor::cat(vec![x1.clone() * cos.clone() - x2.clone() * sin.clone(), x1 * sin + x2 * cos], 2).reshape([n, w])
}

/// [`PointwiseBackend::rotary`] on flex.
pub(crate) fn flex_forward(x: Tensor<Flex, 2>, cos: Tensor<Flex, 2>, sin: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
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

/// A task's rows for the rotary kernel, dispatched as the `simd` module
/// describes: `x` and `out` `w` wide, `cos` and `sin` `half` wide.
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

/// The rotary node: it keeps the angles' cosines and sines (constants).
#[derive(Debug)]
struct RotaryNode;

impl<B: PointwiseBackend> Backward<B, 1> for RotaryNode {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary(ops, grads, |(cos, sin): Self::State, grad: Tensor<B, 2>| {
            // The inverse rotation: the same angles, negated.
            B::rotary(grad, tensor(cos), tensor::<B, 2>(sin).neg())
        });
    }
}

/// [`PointwiseBackend::rotary`] under autodiff: the inner backend's forward
/// pass, recorded as a [`RotaryNode`] (only `x` is an input; the angles
/// are constants).
pub(crate) fn node<B: PointwiseBackend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 2>,
    cos: Tensor<Autodiff<B, C>, 2>,
    sin: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let x = primitive(x);
    let (cos, sin) = (primitive(cos.inner()), primitive(sin.inner()));
    let inner = B::rotary(tensor(x.primitive.clone()), tensor(cos.clone()), tensor(sin.clone()));
    record(RotaryNode.prepare::<C>([x.node.clone()]).compute_bound(), (cos, sin), primitive(inner))
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
        let reference = forward_tensors(x.clone(), cos, sin);
        close(values(ours.clone()), values(reference.clone()), 1e-6, "values");
        let (g1, g2) = ((ours * w.clone()).sum().backward(), (reference * w).sum().backward());
        close(values(x.grad(&g1).unwrap()), values(x.grad(&g2).unwrap()), 1e-6, "dx");
        // Head width 2: channel 0 pairs with channel 1; a quarter turn takes
        // (1, 2) to (−2, 1).
        let one = |v: Vec<f32>, dims: [usize; 2]| Tensor::<Flex, 2>::from_data(TensorData::new(v, dims), &device);
        let turned = Flex::rotary(one(vec![1.0, 2.0], [1, 2]), one(vec![0.0], [1, 1]), one(vec![1.0], [1, 1]));
        close(values(turned), vec![-2.0, 1.0], 0.0, "a quarter turn");
    }
}
