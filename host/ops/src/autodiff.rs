//! What every fused operation's autodiff node does the same way: record
//! itself in the graph, hand the output's gradient to its backward
//! equations, and register the gradients they return with the inputs that
//! want them; and the passage between Burn's tensors and the float
//! primitives its autodiff API speaks.
//!
//! Burn 0.21's own nodes do this with `unary` and `binary` in
//! burn-autodiff's `ops/backward.rs`, on primitives. Ours work on tensors
//! (the backend traits' methods take and return them), and [`n_ary`]
//! serves any number of inputs, gradients of different ranks, and inputs
//! whose gradient is not wanted at all.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, ComputePropertyDone, Ops, OpsKind, OpsPrep};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::FloatTensor;

/// `x` as a float tensor of rank `D`.
pub(crate) fn tensor<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// `x`'s float primitive (dequantised, were it quantised).
pub(crate) fn primitive<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// Ends a node's forward pass: `out`, computed from the inputs `prep` was
/// prepared on, becomes the node's output, and the node keeps `state` for
/// its backward pass only when some input wants a gradient (otherwise
/// `state` is dropped here).
pub(crate) fn record<B, C, Op, const N: usize, const D: usize>(
    prep: OpsPrep<Op, B, Op::State, C, N, ComputePropertyDone>,
    state: Op::State,
    out: FloatTensor<B>,
) -> Tensor<Autodiff<B, C>, D>
where
    B: Backend,
    C: CheckpointStrategy,
    Op: Backward<B, N>,
{
    let out = match prep.stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    tensor(out)
}

/// A one-input node's backward pass: when its input wants a gradient,
/// `func` computes it from the node's state and the gradient of its output.
/// Burn's `unary`, on tensors.
pub(crate) fn unary<B: Backend, S, const D: usize>(
    ops: Ops<S, 1>,
    grads: &mut Gradients,
    func: impl FnOnce(S, Tensor<B, D>) -> Tensor<B, D>,
) {
    let grad = grads.consume::<B>(&ops.node);
    let [parent] = ops.parents;
    if let Some(node) = parent {
        let part = func(ops.state, tensor::<B, D>(grad));
        grads.register::<B>(node.id, primitive(part));
    }
}

/// A node's backward pass over `N` inputs: `func` gets the node's state,
/// the gradient of its output and which inputs want a gradient, and
/// returns each input's gradient (as a primitive: they may differ in
/// rank), in the order of the inputs; those present and wanted are
/// registered. `func` may return fewer than `N` (the inputs past them get
/// none) or compute gradients nobody wants (they are dropped).
pub(crate) fn n_ary<B, S, I, const N: usize, const D: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    func: impl FnOnce(S, Tensor<B, D>, [bool; N]) -> I,
) where
    B: Backend,
    I: IntoIterator<Item = Option<FloatTensor<B>>>,
{
    let grad = tensor::<B, D>(grads.consume::<B>(&ops.node));
    let wanted = ops.parents.each_ref().map(Option::is_some);
    let parts = func(ops.state, grad, wanted);
    for (parent, part) in ops.parents.into_iter().zip(parts) {
        if let (Some(node), Some(part)) = (parent, part) {
            grads.register::<B>(node.id, part);
        }
    }
}
