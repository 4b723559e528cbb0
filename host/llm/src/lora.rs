//! LoRA (Hu et al., 2021): a frozen weight `W` plus a trainable low-rank
//! update, `y = x·W + (α / r)·x·A·B`, with `A` `[in, r]` and `B` `[r, out]`.
//!
//! Why our own: Burn 0.21 has no LoRA. The adapters are a module of their
//! own ([`Adapters`]) beside the base model, not a wrapper around each
//! `Linear`, so that a checkpoint can record them (and the value head)
//! alone: megabytes, not the model. `B` starts at zero, so an adapted model
//! computes exactly what its base computes until the first update, and the
//! base without its adapters is the frozen reference for StarPO's KL term
//! (no second copy of the model is kept).
//!
//! Shapes: `n` rows of activations, `i` input width, `o` output width,
//! `r` rank.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use serde::{Deserialize, Serialize};

/// The linear layers of a decoder layer an adapter can sit on, named as
/// PEFT's `target_modules` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl Target {
    /// Every linear layer of the decoder (PEFT's `all-linear`, which RAGEN
    /// uses; the output layer is not among them).
    pub const ALL: [Target; 7] =
        [Target::QProj, Target::KProj, Target::VProj, Target::OProj, Target::GateProj, Target::UpProj, Target::DownProj];
}

/// `[lora]` of a run: RAGEN's `lora.rank` (0: off, the whole model trains)
/// and `lora.alpha`, the layers adapted (all linear layers by default), and
/// whether the frozen base is kept only quantized (QLoRA's idea).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    pub target_modules: Vec<Target>,
    /// Keep the base's projections only as the file stores them (4 or 8
    /// bits) instead of also in `f32`: less memory, and each product with
    /// more rows than the decoding kernel takes dequantizes its matrix
    /// for the call (see `Llm::with_lora`). Off by default: on a small
    /// model the time costs more than the memory saves
    /// (`docs/results.md`).
    pub quantized_base: bool,
}

impl Default for LoraConfig {
    /// RAGEN's defaults: rank 0 (off: the whole model trains), alpha 16,
    /// all linear layers; the base kept in `f32` too.
    fn default() -> Self {
        Self { rank: 0, alpha: 16.0, target_modules: Target::ALL.to_vec(), quantized_base: false }
    }
}

impl LoraConfig {
    /// Adapters of `rank` with `alpha` on every linear layer.
    pub fn new(rank: usize, alpha: f64) -> Self {
        Self { rank, alpha, ..Self::default() }
    }

    pub fn is_on(&self) -> bool {
        self.rank > 0 && !self.target_modules.is_empty()
    }
}

/// One adapter: `(α / r)·x·A·B`.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `[i, r]`, initialised as PEFT does (Kaiming-uniform, bound `1/√i`).
    pub a: Param<Tensor<B, 2>>,
    /// `[r, o]`, zero at the start.
    pub b: Param<Tensor<B, 2>>,
    /// `α / r`.
    #[module(skip)]
    pub scale: f64,
}

impl<B: Backend> Lora<B> {
    pub fn new(inputs: usize, outputs: usize, config: &LoraConfig, device: &B::Device) -> Self {
        let bound = 1.0 / (inputs as f64).sqrt();
        Self {
            a: Param::from_tensor(Tensor::random([inputs, config.rank], Distribution::Uniform(-bound, bound), device)),
            b: Param::from_tensor(Tensor::zeros([config.rank, outputs], device)),
            scale: config.alpha / config.rank as f64,
        }
    }

    /// `x` `[n, i]` to the update `[n, o]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.matmul(self.a.val()).matmul(self.b.val()) * self.scale
    }
}

/// The adapters of one decoder layer; `None` where the layer is not a
/// target.
#[derive(Module, Debug)]
pub struct LayerAdapters<B: Backend> {
    pub q: Option<Lora<B>>,
    pub k: Option<Lora<B>>,
    pub v: Option<Lora<B>>,
    pub o: Option<Lora<B>>,
    pub gate: Option<Lora<B>>,
    pub up: Option<Lora<B>>,
    pub down: Option<Lora<B>>,
}

/// The widths a layer's adapters need: model `d`, query heads·head width
/// `q`, key/value heads·head width `kv`, MLP `f`.
#[derive(Clone, Copy, Debug)]
pub struct LayerWidths {
    pub d: usize,
    pub q: usize,
    pub kv: usize,
    pub f: usize,
}

impl<B: Backend> LayerAdapters<B> {
    pub fn new(w: LayerWidths, config: &LoraConfig, device: &B::Device) -> Self {
        let on = |t: Target, i: usize, o: usize| config.target_modules.contains(&t).then(|| Lora::new(i, o, config, device));
        Self {
            q: on(Target::QProj, w.d, w.q),
            k: on(Target::KProj, w.d, w.kv),
            v: on(Target::VProj, w.d, w.kv),
            o: on(Target::OProj, w.q, w.d),
            gate: on(Target::GateProj, w.d, w.f),
            up: on(Target::UpProj, w.d, w.f),
            down: on(Target::DownProj, w.f, w.d),
        }
    }
}

/// What trains besides a frozen base: the value head, and the adapters
/// when LoRA is on (one entry per decoder layer; empty when it is off).
#[derive(Module, Debug)]
pub struct Tuned<B: Backend> {
    pub value_head: burn::nn::Linear<B>,
    pub adapters: Vec<LayerAdapters<B>>,
}
