//! LoRA on a tiny random Llama: with `B` = 0 the adapted model computes
//! exactly what its base computes, the adapters' gradients are the
//! derivatives of the loss (checked against central differences), and on a
//! quantized file the base is kept only quantized (QLoRA) with the same
//! values and gradients as on its `f32` copies.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Param};
use burn::prelude::*;
use ragen_llm::gguf::TensorType;
use ragen_llm::{Architecture, Llm, LoraConfig, Pretrained};
use ragen_test_fixtures::tiny_llm::Tiny;
use safetensors::Dtype;
use std::path::PathBuf;

type B = Flex;
type A = Autodiff<Flex>;

fn tiny_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ragen-lora-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Tiny::new(Architecture::Llama).write_hf(&dir, Dtype::F32);
    dir
}

fn tokens<Bk: Backend>() -> Tensor<Bk, 2, Int> {
    let ids: Vec<i64> = (0..2 * 12).map(|i| (i * 37 % 250) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [2, 12]), &Default::default())
}

#[test]
fn lora_with_b_zero_gives_exactly_the_base_models_logits() {
    let dir = tiny_dir("exact");
    let base = Pretrained::<B>::load(&dir, &Default::default()).unwrap().model;
    let (logits, values) = base.forward(tokens());
    let adapted = base.with_lora(&LoraConfig::new(4, 8.0));
    assert!(adapted.has_adapters());
    let (logits_lora, values_lora) = adapted.forward(tokens());
    assert_eq!(logits.into_data().to_vec::<f32>().unwrap(), logits_lora.into_data().to_vec::<f32>().unwrap(), "bit for bit");
    assert_eq!(values.into_data().to_vec::<f32>().unwrap(), values_lora.into_data().to_vec::<f32>().unwrap());
}

/// A smooth scalar of the logits: their mean against fixed weights.
fn loss<Bk: ragen_ops::AttentionBackend + ragen_ops::PointwiseBackend + ragen_ops::QuantizedBackend>(model: &Llm<Bk>) -> Tensor<Bk, 1> {
    let (logits, values) = model.forward(tokens());
    let [b, t, v] = logits.dims();
    let w: Vec<f32> = (0..b * t * v).map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5).collect();
    let w = Tensor::<Bk, 3>::from_data(TensorData::new(w, [b, t, v]), &Default::default());
    (logits * w).mean() + values.mean()
}

/// `B` of the first layer's q adapter (and `A` if `which` is "a"), as a
/// flat vector.
fn adapter_values<Bk: Backend>(model: &Llm<Bk>, which: &str) -> Vec<f32> {
    let q = model.tuned.adapters[0].q.as_ref().unwrap();
    let p = if which == "a" { q.a.val() } else { q.b.val() };
    p.into_data().to_vec::<f32>().unwrap()
}

/// The model with entry `i` of the first layer's q adapter's `which`
/// matrix moved by `delta`.
fn nudged<Bk: Backend>(mut model: Llm<Bk>, which: &str, i: usize, delta: f32) -> Llm<Bk> {
    let q = model.tuned.adapters[0].q.as_mut().unwrap();
    let p = if which == "a" { &mut q.a } else { &mut q.b };
    let dims = p.dims();
    let mut values = p.val().into_data().to_vec::<f32>().unwrap();
    values[i] += delta;
    *p = Param::from_tensor(Tensor::from_data(TensorData::new(values, dims), &Default::default()));
    model
}

#[test]
fn lora_gradients_agree_with_finite_differences() {
    let dir = tiny_dir("fd");
    <A as Backend>::seed(&Default::default(), 3);
    let model = Pretrained::<A>::load(&dir, &Default::default()).unwrap().model.with_lora(&LoraConfig::new(4, 8.0));
    // B away from zero, so that A's gradient is not zero too.
    let mut model = model;
    for i in 0..adapter_values(&model, "b").len() {
        model = nudged(model, "b", i, 0.05 * ((i % 7) as f32 - 3.0));
    }
    let grads = loss(&model).backward();
    let q = model.tuned.adapters[0].q.as_ref().unwrap();
    let analytic = |which: &str| {
        let p = if which == "a" { q.a.val() } else { q.b.val() };
        p.grad(&grads).expect("the adapters are trained").into_data().to_vec::<f32>().unwrap()
    };
    let frozen = model.valid();
    let eps = 1e-2;
    for which in ["a", "b"] {
        let g = analytic(which);
        let n = g.len();
        for i in [0, n / 3, n / 2, n - 1] {
            let up = loss(&nudged(frozen.clone(), which, i, eps)).into_scalar();
            let down = loss(&nudged(frozen.clone(), which, i, -eps)).into_scalar();
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                (numeric - g[i]).abs() <= 2e-4 + 0.03 * g[i].abs(),
                "d loss / d {which}[{i}]: autodiff {} against central difference {numeric}",
                g[i]
            );
        }
        assert!(g.iter().any(|x| x.abs() > 1e-5), "{which} gets a gradient");
    }
}

/// The tiny Llama as a GGUF file with quantized matrices (8-bit attention,
/// 4-bit MLP), in its own directory.
fn quantized_gguf(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ragen-qlora-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tiny.gguf");
    std::fs::write(&file, Tiny::new(Architecture::Llama).gguf(TensorType::Q8_0, TensorType::Q4_1).to_bytes()).unwrap();
    file
}

fn gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// QLoRA: LoRA with `quantized_base` on a quantized file drops the `f32`
/// copies of the base's projections, and the model computes what the same adapters compute on
/// those `f32` copies, with the same adapter gradients (the dequantized
/// matrix is the `f32` one; only the order of the sums differs).
#[test]
fn qlora_keeps_the_base_only_quantized_and_trains_as_on_its_f32_copies() {
    let file = quantized_gguf("same");
    let lora = LoraConfig { quantized_base: true, ..LoraConfig::new(4, 8.0) };
    let load = || Pretrained::<A>::load(&file, &Default::default()).unwrap().model;
    let reference = load().without_quantized().with_lora(&lora);
    let mut qlora = load().with_lora(&lora);
    assert!(qlora.base_is_quantized_only(), "`quantized_base` keeps the base quantized only");
    assert!(!reference.base_is_quantized_only());
    assert!(!load().with_lora(&LoraConfig::new(4, 8.0)).base_is_quantized_only(), "by default the f32 base stays");
    let dropped = reference.num_params() - qlora.num_params();
    assert!(dropped >= 2 * (3 * 64 * 96 + 64 * 64), "the projections' f32 copies are gone: {dropped} parameters fewer");
    // The same adapters on both, with B away from zero.
    qlora.tuned = reference.tuned.clone();
    let (mut qlora, mut reference) = (qlora, reference);
    for i in 0..adapter_values(&reference, "b").len() {
        let delta = 0.05 * ((i % 7) as f32 - 3.0);
        reference = nudged(reference, "b", i, delta);
        qlora = nudged(qlora, "b", i, delta);
    }
    let values = |m: &Llm<A>| m.forward(tokens()).0.into_data().to_vec::<f32>().unwrap();
    let worst = gap(&values(&qlora), &values(&reference));
    assert!(worst < 1e-4, "logits differ by {worst}");
    let (gq, gr) = (loss(&qlora).backward(), loss(&reference).backward());
    for which in ["a", "b"] {
        let grad = |m: &Llm<A>, g: &<A as burn::tensor::backend::AutodiffBackend>::Gradients| {
            let q = m.tuned.adapters[0].q.as_ref().unwrap();
            let p = if which == "a" { q.a.val() } else { q.b.val() };
            p.grad(g).expect("the adapters train").into_data().to_vec::<f32>().unwrap()
        };
        let (a, b) = (grad(&qlora, &gq), grad(&reference, &gr));
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0 && gap(&a, &b) <= 1e-4 * scale.max(1.0), "{which}'s gradient differs by {} (scale {scale})", gap(&a, &b));
    }
    // Sampling on the inner backend reads the quantized base too.
    let inner = qlora.valid();
    assert!(inner.base_is_quantized_only());
    let (logits, _) = inner.forward(tokens());
    assert!(logits.into_data().to_vec::<f32>().unwrap().iter().all(|x| x.is_finite()));
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}
