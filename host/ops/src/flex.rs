//! What our flex (CPU) kernels share: zero-copy passage between flex
//! tensors and the slices the kernels read and write, and the size of
//! their parallel tasks.
//!
//! Going through `TensorData` costs a copy each way: `into_data` copies a
//! tensor another node still holds (every tensor an autodiff node keeps for
//! its backward pass), and `from_data` realigns the buffer it is given. A
//! kernel's inputs are borrowed in place instead, and its output `Vec<f32>`
//! becomes the tensor's storage as it is.

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::{Bytes, DType};
use burn_flex::{FlexTensor, Layout};
use std::ops::Deref;

use crate::autodiff::{primitive, tensor};

/// Floats per parallel task: enough that a task outweighs its scheduling,
/// few enough that a pass of a few thousand rows still splits over cores.
pub(crate) const TASK_FLOATS: usize = 16_384;

/// Whole rows `d` wide per parallel task, about [`TASK_FLOATS`].
pub(crate) fn rows_per_task(d: usize) -> usize {
    (TASK_FLOATS / d.max(1)).max(1)
}

/// A flex tensor's values as a contiguous `[f32]`, row-major.
pub(crate) struct F32Values(FlexTensor);

impl Deref for F32Values {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        self.0.as_slice::<f32>().expect("a contiguous f32 tensor")
    }
}

/// `x`'s values, borrowed when `x` is contiguous f32 (the usual case),
/// copied into order (and converted) otherwise.
pub(crate) fn f32_values<const D: usize>(x: Tensor<Flex, D>) -> F32Values {
    let x = primitive(x);
    let x = if x.dtype() == DType::F32 { x.to_contiguous() } else { FlexTensor::from_data(x.into_data().convert::<f32>()) };
    F32Values(x)
}

/// A flex tensor of shape `dims` on `values` (row-major), without a copy.
pub(crate) fn f32_tensor<const D: usize>(values: Vec<f32>, dims: [usize; D]) -> Tensor<Flex, D> {
    assert_eq!(values.len(), dims.iter().product::<usize>(), "values for shape {dims:?}");
    let x = FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(dims.into()), DType::F32);
    tensor(x)
}
