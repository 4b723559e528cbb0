//! [`PointwiseBackend`]: the element-wise and row-wise operations, each one
//! autodiff node with a fused backward pass. Layer norm and GELU serve the
//! policy trained from scratch; RMS norm and SwiGLU the pretrained Llama and
//! Qwen2 models; rotary positions both (the from-scratch model when its
//! `rotary` setting asks for them).
//!
//! This file holds the trait and its implementations only. Each operation's
//! equations, flex kernels, autodiff node and tests are in a module of its
//! own (`layer_norm`, `gelu`, `rms_norm`, `swiglu`, `rotary`), to which the
//! flex and autodiff implementations hand each method. The default methods
//! are what every other backend (wgpu, CUDA, LibTorch) runs: Burn's own
//! operations or the same equations as tensor operations.

use burn::backend::Autodiff;
use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::prelude::*;
use burn::tensor::ops::{ActivationOps, ModuleOps};

use crate::autodiff::{primitive, tensor};
use crate::{gelu, layer_norm, rms_norm, rotary, swiglu};

/// A backend that runs layer normalisation, GELU, rotary positions, RMS
/// normalisation and SwiGLU as one differentiable operation each, on rows
/// `[n, d]`.
///
/// Every backend the host builds implements it: flex with its own kernels,
/// the others with the default methods.
pub trait PointwiseBackend: Backend {
    /// Each row of `x` `[n, d]` normalised to mean 0 and variance 1, then
    /// scaled by `gamma` `[d]` and shifted by `beta` `[d]`.
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        tensor(<Self as ModuleOps<Self>>::layer_norm(primitive(x), primitive(gamma), Some(primitive(beta)), epsilon))
    }

    /// The gradients `[dx [n, d], dγ [d], dβ [d]]` of
    /// [`PointwiseBackend::fused_layer_norm`] given its output's `grad` `[n, d]`.
    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>, Tensor<Self, 1>) {
        layer_norm::backward_tensors(x, gamma, grad, epsilon)
    }

    /// `x · Φ(x)` element-wise (the exact GELU, with `erf`).
    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        burn::tensor::activation::gelu(x)
    }

    /// The gradient of [`PointwiseBackend::fused_gelu`] given its output's `grad`.
    fn fused_gelu_backward(x: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        tensor(<Self as ActivationOps<Self>>::gelu_backward(primitive(x), primitive(grad)))
    }

    /// Rotary positions on rows: in `x` `[n, heads·k]`, each head's channel
    /// pairs `(i, i + k/2)` rotated by the angle whose cosine and sine are
    /// `cos[r, i]` and `sin[r, i]` (`[n, k/2]`, one angle per row and pair).
    /// Its gradient is the same rotation with `−sin`.
    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        rotary::forward_tensors(x, cos, sin)
    }

    /// Each row of `x` `[n, d]` divided by its root mean square
    /// `√(mean(x²) + ε)`, then scaled by `gamma` `[d]` (Llama's and Qwen2's
    /// norm).
    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        rms_norm::forward_tensors(x, gamma, epsilon)
    }

    /// The gradients `(dx [n, d], dγ [d])` of [`PointwiseBackend::fused_rms_norm`]
    /// given its output's `grad` `[n, d]`.
    fn fused_rms_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        rms_norm::backward_tensors(x, gamma, grad, epsilon)
    }

    /// `silu(a) ∘ u` element-wise (`silu(a) = a·σ(a)`), `a` and `u` `[n, f]`:
    /// SwiGLU's gate and up projections combined.
    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        burn::tensor::activation::silu(a) * u
    }

    /// The gradients `(da, du)` of [`PointwiseBackend::swiglu`] given its
    /// output's `grad`.
    fn swiglu_backward(a: Tensor<Self, 2>, u: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        swiglu::backward_tensors(a, u, grad)
    }
}

#[cfg(feature = "wgpu")]
impl PointwiseBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl PointwiseBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl PointwiseBackend for burn::backend::LibTorch {}

impl PointwiseBackend for Flex {
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        layer_norm::flex_forward(x, gamma, beta, epsilon)
    }

    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>, Tensor<Self, 1>) {
        layer_norm::flex_backward(x, gamma, grad, epsilon)
    }

    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        gelu::flex_forward(x)
    }

    fn fused_gelu_backward(x: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        gelu::flex_backward(x, grad)
    }

    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        rotary::flex_forward(x, cos, sin)
    }

    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        rms_norm::flex_forward(x, gamma, epsilon)
    }

    fn fused_rms_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        rms_norm::flex_backward(x, gamma, grad, epsilon)
    }

    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        swiglu::flex_forward(a, u)
    }

    fn swiglu_backward(a: Tensor<Self, 2>, u: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        swiglu::flex_backward(a, u, grad)
    }
}

/// Each forward method is its operation's node; the backward methods keep
/// their defaults, as the nodes call the inner backend's.
impl<B: PointwiseBackend, C: CheckpointStrategy> PointwiseBackend for Autodiff<B, C> {
    fn fused_layer_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, beta: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        layer_norm::node(x, gamma, beta, epsilon)
    }

    fn fused_gelu(x: Tensor<Self, 2>) -> Tensor<Self, 2> {
        gelu::node(x)
    }

    fn rotary(x: Tensor<Self, 2>, cos: Tensor<Self, 2>, sin: Tensor<Self, 2>) -> Tensor<Self, 2> {
        rotary::node(x, cos, sin)
    }

    fn fused_rms_norm(x: Tensor<Self, 2>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        rms_norm::node(x, gamma, epsilon)
    }

    fn swiglu(a: Tensor<Self, 2>, u: Tensor<Self, 2>) -> Tensor<Self, 2> {
        swiglu::node(a, u)
    }
}
