//! The learner's token scores, straight from the final hidden states, a
//! chunk of rows at a time.
//!
//! For each scored position the learner needs two numbers: the
//! log-probability of the token that was sampled there, and the entropy of
//! the distribution it was sampled from. Composed from tensor operations
//! (output layer, temperature, grammar mask, log-softmax, gather,
//! `exp · log`), the autodiff graph keeps half a dozen `[n, v]` tensors for
//! the backward pass, where `n` is the pass's scored tokens and `v` the
//! vocabulary: with a pretrained model's 49k (SmolLM2) or 152k (Qwen2.5)
//! entries that is gigabytes, most of a pass's memory.
//!
//! [`ScoringBackend::token_scores`] is one autodiff node instead. It keeps
//! its inputs only (the hidden states `[n, d]`, the output layer, the taken
//! tokens and the mask), computes the logits `chunk_rows` rows at a time
//! and keeps `[n, 2]` of results. Its backward pass recomputes each chunk's
//! logits and returns the gradients of the hidden states and of the output
//! layer:
//!
//! ```text
//! z = (h W + b) / T, masked     lp = log_softmax(z)     p = exp(lp)
//! score = lp[y]                 H = −Σ p·lp
//! dz = g_score · (onehot(y) − p) − g_H · p ∘ (lp + H)
//! dh = (dz / T) Wᵀ,   dW = hᵀ (dz / T),   db = Σ_rows dz / T
//! ```
//!
//! so no more than one chunk's `[chunk_rows, v]` is alive in either
//! direction. When the output layer is frozen (LoRA), its gradient is not
//! computed at all.
//!
//! What a chunk's rows go through between the logits and the scores (or
//! back to the logits' gradient) is [`ScoringBackend::row_scores`] and
//! [`ScoringBackend::row_scores_backward`]: tensor operations on every
//! backend but flex, where it is one kernel (`score_rows`) that reads each
//! row once.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use burn::tensor::activation::log_softmax;
use burn::tensor::ops::FloatTensor;

use crate::autodiff::{n_ary, primitive, record, tensor};
use crate::flex::{F32Values, f32_tensor, f32_values};
use crate::score_rows;

/// How many floats one chunk's logits may hold: 16 Mi (64 MiB), whatever
/// the vocabulary (341 rows of SmolLM2's 49,152, 110 of Qwen2.5's 151,936;
/// every row of a plugin tokenizer's few hundred). Smaller chunks cost
/// time: each adds a `[d, v]` product and sum to the weight's gradient.
const CHUNK_FLOATS: usize = 16 << 20;

/// An output layer as the scores read it: `logits = x W + b`.
#[derive(Clone, Debug)]
pub struct OutputLayer<B: Backend> {
    /// `[d, v]`.
    pub weight: Tensor<B, 2>,
    /// `[v]`, where the layer has one.
    pub bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> OutputLayer<B> {
    /// The weight and bias of `linear`, tracked as the module's parameters.
    pub fn of(linear: &Linear<B>) -> Self {
        Self { weight: linear.weight.val(), bias: linear.bias.as_ref().map(Param::val) }
    }

    /// Logits `[n, v]` of hidden states `[n, d]`.
    pub fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = x.matmul(self.weight.clone());
        match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze(),
            None => y,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.weight.dims()[1]
    }
}

/// The distribution scored: logits over `temperature`, and how many rows
/// of logits are computed at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreOptions {
    pub temperature: f64,
    pub chunk_rows: usize,
}

impl ScoreOptions {
    /// Chunks of at most 16 Mi logits for a vocabulary of `vocab`.
    pub fn new(temperature: f64, vocab: usize) -> Self {
        Self { temperature, chunk_rows: (CHUNK_FLOATS / vocab.max(1)).max(1) }
    }
}

/// The log-probability of each taken token and the entropy of the
/// distribution it was taken from, `[n]` each.
pub struct TokenScores<B: Backend> {
    pub logp: Tensor<B, 1>,
    pub entropy: Tensor<B, 1>,
}

/// [`ScoringBackend::token_scores`], split into its two columns.
///
/// # Examples
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::prelude::*;
/// use ragen_ops::{OutputLayer, ScoreOptions, token_scores};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// // Two positions, width 2, a vocabulary of 3; the second token is masked out.
/// let hidden = Tensor::<B, 2>::from_floats([[1.0, 0.0], [0.0, 1.0]], &device).require_grad();
/// let head = OutputLayer { weight: Tensor::<B, 2>::from_floats([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]], &device), bias: None };
/// let taken = Tensor::<B, 1, Int>::from_ints([2, 0], &device);
/// let allowed = Tensor::<B, 2, Bool>::from_bool(TensorData::from([[true, false, true], [true, false, true]]), &device);
/// let s = token_scores(hidden.clone(), head, taken, Some(allowed), ScoreOptions::new(1.0, 3));
/// // Row 0: logits (1, −, 2), so log p(2) = −log(1 + e⁻¹).
/// let logp: Vec<f32> = s.logp.clone().into_data().to_vec().unwrap();
/// assert!((logp[0] + (1.0f32 + (-1.0f32).exp()).ln()).abs() < 1e-6);
/// // Row 1: logits (0, −, 0), two equally likely tokens.
/// let entropy: Vec<f32> = s.entropy.into_data().to_vec().unwrap();
/// assert!((entropy[1] - 2f32.ln()).abs() < 1e-6);
/// let grads = s.logp.sum().backward();
/// assert_eq!(hidden.grad(&grads).unwrap().dims(), [2, 2]);
/// ```
pub fn token_scores<B: ScoringBackend>(
    hidden: Tensor<B, 2>,
    head: OutputLayer<B>,
    taken: Tensor<B, 1, Int>,
    allowed: Option<Tensor<B, 2, Bool>>,
    options: ScoreOptions,
) -> TokenScores<B> {
    let n = hidden.dims()[0];
    let scores = B::token_scores(hidden, head, taken, allowed, options); // [n, 2]
    TokenScores { logp: scores.clone().narrow(1, 0, 1).reshape([n]), entropy: scores.narrow(1, 1, 1).reshape([n]) }
}

/// A backend that scores tokens as one differentiable operation.
///
/// Every backend the host builds implements it: the default methods are
/// the chunked equations as tensor operations; the autodiff backend wraps
/// them in one node.
pub trait ScoringBackend: Backend {
    /// Hidden states `[n, d]` through `head`, over `options.temperature`,
    /// with the tokens `allowed` `[n, v]` forbids (where given) pushed to
    /// −1e9: returns `[n, 2]`, the log-probability of `taken` `[n]` and the
    /// entropy of the distribution, per row.
    fn token_scores(
        hidden: Tensor<Self, 2>,
        head: OutputLayer<Self>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        options: ScoreOptions,
    ) -> Tensor<Self, 2> {
        let n = hidden.dims()[0];
        let parts = chunks(n, options.chunk_rows)
            .map(|(at, c)| {
                let logits = head.logits(hidden.clone().narrow(0, at, c)); // [c, v]
                Self::row_scores(logits, taken.clone().narrow(0, at, c), narrow_rows(&allowed, at, c), options.temperature) // [c, 2]
            })
            .collect();
        Tensor::cat(parts, 0)
    }

    /// The scores `[c, 2]` of one chunk of `logits` `[c, v]`: per row, the
    /// log-probability of `taken` `[c]` and the entropy, under the
    /// temperature and the mask `allowed` `[c, v]` (where given).
    fn row_scores(
        logits: Tensor<Self, 2>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        temperature: f64,
    ) -> Tensor<Self, 2> {
        row_scores_tensors(logits, taken, allowed, temperature)
    }

    /// The gradient `[c, v]` of the logits given `grad` `[c, 2]` of
    /// [`ScoringBackend::row_scores`]'s output: the module doc's `dz / T`.
    fn row_scores_backward(
        logits: Tensor<Self, 2>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        temperature: f64,
        grad: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        row_scores_backward_tensors(logits, taken, allowed, temperature, grad)
    }

    /// How many of the learner's passes (each over a few rows, with its
    /// own backward pass) run at once: 1, except on flex, where
    /// [`concurrent_passes`](crate::concurrent_passes) runs one per core.
    fn passes_at_once() -> usize {
        1
    }
}

impl ScoringBackend for burn::backend::Flex {
    fn row_scores(
        logits: Tensor<Self, 2>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        temperature: f64,
    ) -> Tensor<Self, 2> {
        let c = logits.dims()[0];
        f32_tensor(score_rows::forward(FlexRows::new(logits, taken, allowed, temperature).rows()), [c, 2])
    }

    fn row_scores_backward(
        logits: Tensor<Self, 2>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        temperature: f64,
        grad: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        let dims = logits.dims();
        f32_tensor(score_rows::backward(FlexRows::new(logits, taken, allowed, temperature).rows(), &f32_values(grad)), dims)
    }

    fn passes_at_once() -> usize {
        rayon::current_num_threads()
    }
}

/// A chunk's inputs as the flex kernel reads them: the logits borrowed,
/// the taken tokens and the mask copied out.
struct FlexRows {
    logits: F32Values,
    v: usize,
    taken: Vec<i64>,
    allowed: Option<Vec<bool>>,
    temperature: f32,
}

impl FlexRows {
    fn new(
        logits: Tensor<burn::backend::Flex, 2>,
        taken: Tensor<burn::backend::Flex, 1, Int>,
        allowed: Option<Tensor<burn::backend::Flex, 2, Bool>>,
        temperature: f64,
    ) -> Self {
        let v = logits.dims()[1];
        let taken = taken.into_data().iter::<i64>().collect();
        let allowed = allowed.map(|a| a.into_data().into_vec::<bool>().expect("a boolean mask"));
        Self { logits: f32_values(logits), v, taken, allowed, temperature: temperature as f32 }
    }

    fn rows(&self) -> score_rows::Rows<'_> {
        score_rows::Rows {
            logits: &self.logits,
            v: self.v,
            taken: &self.taken,
            allowed: self.allowed.as_deref(),
            temperature: self.temperature,
        }
    }
}
#[cfg(feature = "wgpu")]
impl ScoringBackend for burn::backend::Wgpu {}
#[cfg(feature = "cuda")]
impl ScoringBackend for burn::backend::Cuda {}
#[cfg(feature = "libtorch")]
impl ScoringBackend for burn::backend::LibTorch {}

/// `(first row, rows)` of each chunk of `n` rows.
fn chunks(n: usize, rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(rows.max(1)).map(move |at| (at, rows.max(1).min(n - at)))
}

fn narrow_rows<B: Backend>(mask: &Option<Tensor<B, 2, Bool>>, at: usize, rows: usize) -> Option<Tensor<B, 2, Bool>> {
    mask.as_ref().map(|m| m.clone().narrow(0, at, rows))
}

/// [`ScoringBackend::row_scores`] as tensor operations.
fn row_scores_tensors<B: Backend>(
    logits: Tensor<B, 2>,
    taken: Tensor<B, 1, Int>,
    allowed: Option<Tensor<B, 2, Bool>>,
    temperature: f64,
) -> Tensor<B, 2> {
    let c = logits.dims()[0];
    let logp = log_probs(logits, allowed, temperature); // [c, v]
    let chosen = logp.clone().gather(1, taken.reshape([c, 1])); // [c, 1]
    let entropy = (logp.clone().exp() * logp).sum_dim(1).neg(); // [c, 1]
    Tensor::cat(vec![chosen, entropy], 1)
}

/// [`ScoringBackend::row_scores_backward`] as tensor operations.
fn row_scores_backward_tensors<B: Backend>(
    logits: Tensor<B, 2>,
    taken: Tensor<B, 1, Int>,
    allowed: Option<Tensor<B, 2, Bool>>,
    temperature: f64,
    grad: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let c = logits.dims()[0];
    let lp = log_probs(logits, allowed, temperature); // [c, v]
    let p = lp.clone().exp();
    let entropy = (p.clone() * lp.clone()).sum_dim(1).neg(); // [c, 1]
    let (g_score, g_entropy) = (grad.clone().narrow(1, 0, 1), grad.narrow(1, 1, 1)); // [c, 1] each
    // Forbidden tokens have p = exp(−1e9 − lse) = 0 exactly, so their
    // dz is 0 without a mask, as the mask's own gradient would make it.
    let dz = (p * (g_score.clone() + g_entropy * (lp + entropy))).neg().scatter(1, taken.reshape([c, 1]), g_score, IndexingUpdateOp::Add);
    dz / temperature
}

/// Log-probabilities `[c, v]` of `logits` `[c, v]` over the temperature,
/// forbidden tokens at −1e9 (not −∞, so that `p·log p` stays 0 for them
/// instead of NaN).
fn log_probs<B: Backend>(logits: Tensor<B, 2>, allowed: Option<Tensor<B, 2, Bool>>, temperature: f64) -> Tensor<B, 2> {
    let z = logits / temperature;
    let z = match allowed {
        Some(allowed) => z.mask_fill(allowed.bool_not(), -1.0e9),
        None => z,
    };
    log_softmax(z, 1)
}

/// Which of the node's inputs want a gradient: hidden, weight, bias.
#[derive(Clone, Copy, Debug)]
struct Wanted {
    hidden: bool,
    weight: bool,
    bias: bool,
}

/// The gradients of the hidden states `[n, d]`, the weight `[d, v]` and
/// the bias `[v]` (those `wanted`), given `grad` `[n, 2]` of the scores:
/// the module doc's equations, one chunk of logits at a time.
fn token_scores_backward<B: ScoringBackend>(inputs: ScoreInputs<B>, grad: Tensor<B, 2>, wanted: Wanted) -> ScoreGrads<B> {
    let ScoreInputs { hidden, head, taken, allowed, options } = inputs;
    let n = hidden.dims()[0];
    let v = head.vocab_size();
    let mut dh = Vec::new();
    let (mut dw, mut db): (Option<Tensor<B, 2>>, Option<Tensor<B, 1>>) = (None, None);
    for (at, c) in chunks(n, options.chunk_rows) {
        let h = hidden.clone().narrow(0, at, c); // [c, d]
        let logits = head.logits(h.clone()); // [c, v]
        let (taken, allowed, g) = (taken.clone().narrow(0, at, c), narrow_rows(&allowed, at, c), grad.clone().narrow(0, at, c));
        let dlogits = B::row_scores_backward(logits, taken, allowed, options.temperature, g); // [c, v]
        if wanted.hidden {
            dh.push(dlogits.clone().matmul(head.weight.clone().transpose())); // [c, d]
        }
        // Summed over chunks; the first chunk's part is the sum so far.
        if wanted.weight {
            let part = h.transpose().matmul(dlogits.clone()); // [d, v]
            dw = Some(dw.map_or(part.clone(), |sum| sum + part));
        }
        if wanted.bias {
            let part = dlogits.sum_dim(0).reshape([v]);
            db = Some(db.map_or(part.clone(), |sum| sum + part));
        }
    }
    ScoreGrads { hidden: wanted.hidden.then(|| Tensor::cat(dh, 0)), weight: dw, bias: db }
}

/// The gradients [`token_scores_backward`] was asked for.
struct ScoreGrads<B: Backend> {
    hidden: Option<Tensor<B, 2>>,
    weight: Option<Tensor<B, 2>>,
    bias: Option<Tensor<B, 1>>,
}

/// What the node keeps for its backward pass: its inputs, no logits.
#[derive(Clone, Debug)]
struct ScoreInputs<B: Backend> {
    hidden: Tensor<B, 2>,
    head: OutputLayer<B>,
    taken: Tensor<B, 1, Int>,
    allowed: Option<Tensor<B, 2, Bool>>,
    options: ScoreOptions,
}

/// The scoring node, over the hidden states and the weight (`N` = 2) or
/// the bias too (`N` = 3).
#[derive(Debug)]
struct TokenScoresNode<const N: usize>;

impl<B: ScoringBackend, const N: usize> Backward<B, N> for TokenScoresNode<N> {
    type State = ScoreInputs<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        n_ary(ops, grads, |inputs: ScoreInputs<B>, grad: Tensor<B, 2>, parents: [bool; N]| {
            let wanted = Wanted { hidden: parents[0], weight: parents[1], bias: N == 3 && parents[N - 1] };
            let g = token_scores_backward(inputs, grad, wanted);
            // Without a bias (`N` = 2) the third part is `None` and has no parent to go to.
            [g.hidden.map(primitive), g.weight.map(primitive), g.bias.map(primitive)]
        });
    }
}

impl<B: ScoringBackend, C: CheckpointStrategy> ScoringBackend for Autodiff<B, C> {
    fn token_scores(
        hidden: Tensor<Self, 2>,
        head: OutputLayer<Self>,
        taken: Tensor<Self, 1, Int>,
        allowed: Option<Tensor<Self, 2, Bool>>,
        options: ScoreOptions,
    ) -> Tensor<Self, 2> {
        let hidden = primitive(hidden);
        let weight = primitive(head.weight);
        let bias = head.bias.map(primitive);
        let inner = |x: &FloatTensor<B>| tensor::<B, 2>(x.clone());
        let inputs = ScoreInputs::<B> {
            hidden: inner(&hidden.primitive),
            head: OutputLayer { weight: inner(&weight.primitive), bias: bias.as_ref().map(|b| tensor::<B, 1>(b.primitive.clone())) },
            taken: Tensor::from_primitive(taken.into_primitive()),
            allowed: allowed.map(|a| Tensor::from_primitive(a.into_primitive())),
            options,
        };
        let i = &inputs;
        let out = primitive(B::token_scores(i.hidden.clone(), i.head.clone(), i.taken.clone(), i.allowed.clone(), i.options));
        match &bias {
            None => record(TokenScoresNode::<2>.prepare::<C>([hidden.node.clone(), weight.node.clone()]).compute_bound(), inputs, out),
            Some(b) => {
                let nodes = [hidden.node.clone(), weight.node.clone(), b.node.clone()];
                record(TokenScoresNode::<3>.prepare::<C>(nodes).compute_bound(), inputs, out)
            }
        }
    }

    fn passes_at_once() -> usize {
        B::passes_at_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use ragen_rng::SeedRng;

    type A = Autodiff<Flex>;

    const N: usize = 7;
    const D: usize = 5;
    const V: usize = 11;

    /// Random inputs: hidden `[N, D]`, weight `[D, V]`, bias `[V]`, taken
    /// tokens, a mask that allows each taken token and about 2/3 of the
    /// others, and weights for the two scores in the loss.
    struct Case {
        hidden: Vec<f32>,
        weight: Vec<f32>,
        bias: Vec<f32>,
        taken: Vec<i64>,
        allowed: Vec<bool>,
        loss_weights: Vec<f32>,
    }

    impl Case {
        fn new(seed: u64) -> Self {
            let mut rng = SeedRng::new(seed);
            let mut floats = |k: usize, scale: f64| (0..k).map(|_| ((rng.unit() * 2.0 - 1.0) * scale) as f32).collect::<Vec<f32>>();
            let (hidden, weight, bias, loss_weights) = (floats(N * D, 2.0), floats(D * V, 1.0), floats(V, 0.5), floats(2 * N, 1.0));
            let mut rng = SeedRng::new(seed + 1);
            let taken: Vec<i64> = (0..N).map(|_| rng.below(V) as i64).collect();
            let allowed = (0..N * V).map(|i| taken[i / V] == (i % V) as i64 || rng.chance(0.67)).collect();
            Self { hidden, weight, bias, taken, allowed, loss_weights }
        }
    }

    /// Forward values and the gradients of hidden, weight and bias of
    /// `Σ a·score + Σ b·entropy`.
    struct Outcome {
        scores: Vec<f32>,
        grads: [Option<Vec<f32>>; 3],
    }

    fn run(
        case: &Case,
        with_bias: bool,
        weight_trains: bool,
        scores: impl Fn(Tensor<A, 2>, OutputLayer<A>, Tensor<A, 1, Int>, Tensor<A, 2, Bool>) -> Tensor<A, 2>,
    ) -> Outcome {
        let device = Default::default();
        let hidden = Tensor::<A, 2>::from_data(TensorData::new(case.hidden.clone(), [N, D]), &device).require_grad();
        let mut weight = Tensor::<A, 2>::from_data(TensorData::new(case.weight.clone(), [D, V]), &device);
        if weight_trains {
            weight = weight.require_grad();
        }
        let bias = with_bias.then(|| Tensor::<A, 1>::from_data(TensorData::new(case.bias.clone(), [V]), &device).require_grad());
        let taken = Tensor::<A, 1, Int>::from_data(TensorData::new(case.taken.clone(), [N]), &device);
        let allowed = Tensor::<A, 2, Bool>::from_data(TensorData::new(case.allowed.clone(), [N, V]), &device);
        let out = scores(hidden.clone(), OutputLayer { weight: weight.clone(), bias: bias.clone() }, taken, allowed); // [N, 2]
        let a = Tensor::<A, 2>::from_data(TensorData::new(case.loss_weights.clone(), [N, 2]), &device);
        let grads = (out.clone() * a).sum().backward();
        let vec = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
        Outcome {
            scores: out.into_data().to_vec().unwrap(),
            grads: [
                hidden.grad(&grads).map(vec),
                weight.grad(&grads).map(vec),
                bias.and_then(|b| b.grad(&grads)).map(|g| g.into_data().to_vec().unwrap()),
            ],
        }
    }

    /// The composition the node replaces: all logits at once, every step a
    /// node of Burn's autodiff.
    fn unchunked(
        hidden: Tensor<A, 2>,
        head: OutputLayer<A>,
        taken: Tensor<A, 1, Int>,
        allowed: Tensor<A, 2, Bool>,
        t: f64,
    ) -> Tensor<A, 2> {
        let logp = log_softmax((head.logits(hidden) / t).mask_fill(allowed.bool_not(), -1.0e9), 1); // [N, V]
        let chosen = logp.clone().gather(1, taken.reshape([N, 1]));
        let entropy = (logp.clone().exp() * logp).sum_dim(1).neg();
        Tensor::cat(vec![chosen, entropy], 1)
    }

    fn assert_close(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}[{i}]: {x} against {y}");
        }
    }

    fn assert_same(chunked: &Outcome, reference: &Outcome) {
        assert_close("scores", &chunked.scores, &reference.scores);
        for (name, (a, b)) in ["d hidden", "d weight", "d bias"].iter().zip(chunked.grads.iter().zip(&reference.grads)) {
            match (a, b) {
                (Some(a), Some(b)) => assert_close(name, a, b),
                (None, None) => {}
                _ => panic!("{name}: present in one and not the other"),
            }
        }
    }

    #[test]
    fn chunked_scores_and_gradients_equal_the_unchunked_ones() {
        for (seed, temperature) in [(1, 1.0), (2, 0.7), (3, 1.5)] {
            let case = Case::new(seed);
            let reference = run(&case, true, true, |h, head, taken, allowed| unchunked(h, head, taken, allowed, temperature));
            assert!(reference.grads.iter().all(Option::is_some));
            for chunk_rows in [1, 3, N, 100] {
                let options = ScoreOptions { temperature, chunk_rows };
                let chunked = run(&case, true, true, |h, head, taken, allowed| A::token_scores(h, head, taken, Some(allowed), options));
                assert_same(&chunked, &reference);
            }
        }
    }

    #[test]
    fn a_frozen_output_layer_without_bias_gets_no_gradient() {
        let case = Case::new(4);
        let reference = run(&case, false, false, |h, head, taken, allowed| unchunked(h, head, taken, allowed, 1.0));
        let chunked = run(&case, false, false, |h, head, taken, allowed| {
            A::token_scores(h, head, taken, Some(allowed), ScoreOptions { temperature: 1.0, chunk_rows: 2 })
        });
        assert!(chunked.grads[0].is_some() && chunked.grads[1].is_none() && chunked.grads[2].is_none());
        assert_same(&chunked, &reference);
    }

    #[test]
    fn the_inner_backend_scores_as_the_node_does() {
        let case = Case::new(5);
        let device = Default::default();
        let head = OutputLayer::<Flex> {
            weight: Tensor::from_data(TensorData::new(case.weight.clone(), [D, V]), &device),
            bias: Some(Tensor::from_data(TensorData::new(case.bias.clone(), [V]), &device)),
        };
        let hidden = Tensor::<Flex, 2>::from_data(TensorData::new(case.hidden.clone(), [N, D]), &device);
        let taken = Tensor::<Flex, 1, Int>::from_data(TensorData::new(case.taken.clone(), [N]), &device);
        let inner = Flex::token_scores(hidden, head, taken, None, ScoreOptions { temperature: 1.0, chunk_rows: 3 });
        let node = run(&case, true, true, |h, head, taken, _| A::token_scores(h, head, taken, None, ScoreOptions::new(1.0, V)));
        assert_close("scores", &inner.into_data().to_vec::<f32>().unwrap(), &node.scores);
    }

    /// Flex's kernel against the tensor operations, on what the small
    /// cases do not reach: a vocabulary not a multiple of the vector width,
    /// large logits, a forbidden taken token, a row with every token
    /// forbidden, and a temperature below 1.
    #[test]
    fn the_flex_kernel_scores_as_the_tensor_operations_do() {
        let (c, v) = (6, 37);
        let mut rng = SeedRng::new(9);
        let logits: Vec<f32> = (0..c * v).map(|_| ((rng.unit() * 2.0 - 1.0) * 40.0) as f32).collect();
        let taken: Vec<i64> = (0..c).map(|_| rng.below(v) as i64).collect();
        let mut allowed: Vec<bool> = (0..c * v).map(|i| taken[i / v] == (i % v) as i64 || rng.chance(0.5)).collect();
        allowed[v + taken[1] as usize] = false; // row 1: the taken token is forbidden
        allowed[2 * v..3 * v].fill(false); // row 2: every token is
        let grad: Vec<f32> = (0..2 * c).map(|_| (rng.unit() * 2.0 - 1.0) as f32).collect();
        let device = Default::default();
        let logits = Tensor::<Flex, 2>::from_data(TensorData::new(logits, [c, v]), &device);
        let taken = Tensor::<Flex, 1, Int>::from_data(TensorData::new(taken, [c]), &device);
        let grad = Tensor::<Flex, 2>::from_data(TensorData::new(grad, [c, 2]), &device);
        let vec = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
        for mask in [None, Some(allowed)] {
            let allowed = mask.map(|m| Tensor::<Flex, 2, Bool>::from_data(TensorData::new(m, [c, v]), &device));
            let (l, t, a, g) = (logits.clone(), taken.clone(), allowed.clone(), grad.clone());
            let kernel = vec(Flex::row_scores(l.clone(), t.clone(), a.clone(), 0.7));
            let tensors = vec(row_scores_tensors(l.clone(), t.clone(), a.clone(), 0.7));
            assert_close("scores", &kernel, &tensors);
            let kernel = vec(Flex::row_scores_backward(l.clone(), t.clone(), a.clone(), 0.7, g.clone()));
            let tensors = vec(row_scores_backward_tensors(l, t, a, 0.7, g));
            assert!(kernel.iter().all(|x| x.is_finite()));
            assert_close("d logits", &kernel, &tensors);
        }
    }

    #[test]
    fn entropy_counts_only_allowed_tokens() {
        let device = Default::default();
        // Identity hidden states read the weight's rows as logits.
        let hidden = Tensor::<Flex, 2>::from_floats([[1.0, 0.0], [0.0, 1.0]], &device);
        let weight = Tensor::<Flex, 2>::from_floats([[0.0, 0.0, 0.0, 9.0], [1.0, 1.0, 1.0, 1.0]], &device);
        let allowed = Tensor::<Flex, 2, Bool>::from_data([[true, true, true, false], [true, true, true, true]], &device);
        let taken = Tensor::<Flex, 1, Int>::from_ints([0, 3], &device);
        let s = token_scores(hidden, OutputLayer { weight, bias: None }, taken, Some(allowed), ScoreOptions::new(1.0, 4));
        let h = s.entropy.into_data().to_vec::<f32>().unwrap();
        let logp = s.logp.into_data().to_vec::<f32>().unwrap();
        assert!((h[0] - 3f32.ln()).abs() < 1e-6 && (h[1] - 4f32.ln()).abs() < 1e-6, "{h:?}");
        assert!((logp[0] + 3f32.ln()).abs() < 1e-6 && (logp[1] + 4f32.ln()).abs() < 1e-6, "{logp:?}");
    }
}
