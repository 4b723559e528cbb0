//! Zero-copy passage between flex tensors and the slices our CPU kernels
//! read and write.
//!
//! Going through `TensorData` costs a copy each way: `into_data` copies a
//! tensor another node still holds (every tensor an autodiff node keeps for
//! its backward pass), and `from_data` realigns the buffer it is given. A
//! kernel's inputs are borrowed in place instead, and its output `Vec<f32>`
//! becomes the tensor's storage as it is.

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::{Bytes, DType, TensorPrimitive};
use burn_flex::{FlexTensor, Layout};
use std::ops::Deref;

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
    let x = x.into_primitive().tensor();
    let x = if x.dtype() == DType::F32 { x.to_contiguous() } else { FlexTensor::from_data(x.into_data().convert::<f32>()) };
    F32Values(x)
}

/// A flex tensor of shape `dims` on `values` (row-major), without a copy.
pub(crate) fn f32_tensor<const D: usize>(values: Vec<f32>, dims: [usize; D]) -> Tensor<Flex, D> {
    assert_eq!(values.len(), dims.iter().product::<usize>(), "values for shape {dims:?}");
    let x = FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(dims.into()), DType::F32);
    Tensor::from_primitive(TensorPrimitive::Float(x))
}
