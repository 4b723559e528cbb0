//! The measurements behind `ragen-host bench --policy`: the policy's own
//! speed on whatever backend it runs, training throughput (forward plus
//! backward) and sampling throughput with and without the KV cache, on
//! prompts of a given length. They say where a training step's time goes.
//!
//! Public API because a shipped command is built on it: the CLI makes the
//! prompts from a plugin, calls [`bench_policy`] and prints its
//! [`PolicyBenchReport`] (as text, or as JSON with `--json`).
//! [`next_token_pass`] is public for the other bench command, `bench
//! --policy --model` (`ragen-llm`'s), which times a pretrained model's
//! training passes the same way; the PyTorch twins in `scripts/reference/`
//! time the same shapes.

use crate::grammar::AnswerGrammar;
use crate::model::PolicyModel;
use crate::network::PolicyNetwork;
use crate::sample::sample_batch_with;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use ragen_ops::{ScoreOptions, TrainBackend, concurrent_passes, sum_gradients, token_scores};
use ragen_rng::SeedRng;
use serde::Serialize;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct PolicyBenchConfig {
    /// Prompts as the policy sees them (each ends with the pre-fill), one
    /// per row of a batch: sequences per forward/backward pass and replies
    /// per sampling batch.
    pub prompts: Vec<Vec<u32>>,
    /// Each measurement repeats for at least this long.
    pub min_time: Duration,
}

/// Tokens per second.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyBenchReport {
    /// The model's vocabulary (the tokenizer the plugin's words built), for
    /// a twin elsewhere (`scripts/reference/policy_bench.py --vocab`).
    pub vocab: usize,
    pub prompt_tokens: usize,
    pub batch: usize,
    /// Forward and backward over `batch` sequences of prompt-plus-reply length.
    pub train_tokens_per_s: f64,
    /// New tokens per second sampling `batch` replies at once, KV cache on.
    pub sample_tokens_per_s_cached: f64,
    /// The same draws recomputing the whole sequence at every new token.
    pub sample_tokens_per_s_uncached: f64,
    /// One reply at a time with the KV cache: what batching buys.
    pub sample_tokens_per_s_unbatched: f64,
    pub reply_tokens: usize,
}

/// Repeat `f` (which returns the tokens it handled) for `min_time`.
fn rate(min_time: Duration, mut f: impl FnMut() -> usize) -> f64 {
    f(); // warm-up: allocations, kernel compilation on GPU backends
    let (start, mut tokens, mut runs) = (Instant::now(), 0usize, 0);
    while runs < 2 || start.elapsed() < min_time {
        tokens += f();
        runs += 1;
    }
    tokens as f64 / start.elapsed().as_secs_f64()
}

/// Measure `model` (an autodiff model, for the backward pass) under `grammar`.
pub fn bench_policy<B: TrainBackend>(
    model: &PolicyModel<B>,
    grammar: &AnswerGrammar,
    config: &PolicyBenchConfig,
    device: &B::Device,
) -> PolicyBenchReport {
    let inference = model.clone().valid();
    let budget = grammar.max_reply_tokens();
    let b = config.prompts.len();
    assert!(b > 0, "at least one prompt");
    let mut stream = 0;
    let mut next_row = 0;
    let mut draw = |rows: usize, use_cache: bool| {
        let prompts: Vec<&[u32]> = (0..rows)
            .map(|_| {
                next_row += 1;
                config.prompts[next_row % b].as_slice()
            })
            .collect();
        let mut rngs: Vec<SeedRng> = (0..rows)
            .map(|_| {
                stream += 1;
                SeedRng::stream(7, stream)
            })
            .collect();
        let out = sample_batch_with(&inference, &prompts, grammar, 1.0, budget, &mut rngs, device, use_cache);
        out.iter().map(|s| s.tokens.len()).sum::<usize>()
    };
    let cached = rate(config.min_time, || draw(b, true));
    let uncached = rate(config.min_time, || draw(b, false));
    let unbatched = rate(config.min_time, || draw(1, true));

    let longest = config.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let len = (longest + budget).min(model.max_seq_len());
    let ids: Vec<i64> = config.prompts.iter().flat_map(|p| p.iter().map(|&t| t as i64).chain(std::iter::repeat(0)).take(len)).collect();
    let train = rate(config.min_time, || next_token_pass(model, &ids, [b, len], device));
    PolicyBenchReport {
        vocab: model.vocab_size(),
        prompt_tokens: longest,
        batch: b,
        train_tokens_per_s: train,
        sample_tokens_per_s_cached: cached,
        sample_tokens_per_s_uncached: uncached,
        sample_tokens_per_s_unbatched: unbatched,
        reply_tokens: budget,
    }
}

/// One training step's passes as the benches time them, returning the
/// tokens they handled: over `ids` `[rows, len]` (row-major), split into as
/// many passes as the backend runs at once ([`concurrent_passes`]),
/// the learner's scoring at every position but each row's last (the hidden
/// states there, then the next token's log-probability through the output
/// layer as one node), the loss `−mean(log p) + mean(values)` (each pass
/// weighing its share of the rows, so the sum is the whole batch's), the
/// backward passes and the sum of their gradients. The PyTorch twins
/// (`scripts/reference/`) take the cross-entropy of the shifted logits in
/// one pass.
pub fn next_token_pass<B, N>(model: &N, ids: &[i64], [rows, len]: [usize; 2], device: &B::Device) -> usize
where
    B: TrainBackend,
    N: PolicyNetwork<B> + AutodiffModule<B>,
{
    let per_pass = rows.div_ceil(B::passes_at_once().clamp(1, rows.max(1)));
    let parts: Vec<&[i64]> = ids.chunks(per_pass * len).collect();
    let grads = concurrent_passes(model, parts, |m: &N, part: &[i64]| {
        let share = part.len() as f64 / ids.len() as f64;
        let loss = next_token_loss(m, part, [part.len() / len, len], device) * share;
        GradientsParams::from_grads(loss.backward(), m)
    });
    sum_gradients(model, grads);
    rows * len
}

/// [`next_token_pass`]'s loss on one pass's rows, `[1]`.
pub(crate) fn next_token_loss<B: TrainBackend, N: PolicyNetwork<B>>(
    model: &N,
    ids: &[i64],
    [rows, len]: [usize; 2],
    device: &B::Device,
) -> Tensor<B, 1> {
    let at: Vec<i64> = (0..rows).flat_map(|row| (0..len - 1).map(move |i| (row * len + i) as i64)).collect();
    let next: Vec<i64> = at.iter().map(|&i| ids[i as usize + 1]).collect();
    let n = at.len();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.to_vec(), [rows, len]), device);
    let at = Tensor::<B, 1, Int>::from_data(TensorData::new(at, [n]), device);
    let (hidden, values) = model.hidden_at_and_values(tokens, at); // [n, d], [rows, len]
    let taken = Tensor::<B, 1, Int>::from_data(TensorData::new(next, [n]), device);
    let head = model.output_layer();
    let options = ScoreOptions::new(1.0, head.vocab_size());
    let scores = token_scores(hidden, head, taken, None, options);
    scores.logp.mean().neg() + values.mean()
}

impl PolicyBenchReport {
    pub fn to_text(&self) -> String {
        format!(
            "policy: prompts up to {} tokens, replies up to {} tokens, batch {}, vocabulary {}\n\
             train (forward + backward)   {:>10.0} tokens/s\n\
             sample, KV cache, batched    {:>10.0} tokens/s\n\
             sample, no cache, batched    {:>10.0} tokens/s  (cache speed-up {:.1}x)\n\
             sample, KV cache, one by one {:>10.0} tokens/s  (batching speed-up {:.1}x)\n",
            self.prompt_tokens,
            self.reply_tokens,
            self.batch,
            self.vocab,
            self.train_tokens_per_s,
            self.sample_tokens_per_s_cached,
            self.sample_tokens_per_s_uncached,
            self.sample_tokens_per_s_cached / self.sample_tokens_per_s_uncached,
            self.sample_tokens_per_s_unbatched,
            self.sample_tokens_per_s_cached / self.sample_tokens_per_s_unbatched,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyModelConfig;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use ragen_ops::ScoringBackend;

    type Ad = Autodiff<Flex>;

    /// Every parameter's gradient, in the model's order.
    fn flat(model: &crate::PolicyModel<Ad>, grads: &GradientsParams) -> Vec<f32> {
        struct Collect<'a>(&'a GradientsParams, Vec<f32>);
        impl burn::module::ModuleVisitor<Ad> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<Ad, D>>) {
                let g = self.0.get::<Flex, D>(param.id).expect("every parameter has a gradient");
                self.1.extend(g.into_data().to_vec::<f32>().unwrap());
            }
        }
        let mut c = Collect(grads, vec![]);
        model.visit(&mut c);
        c.1
    }

    /// The gradients of the mean loss over `rows` rows of `ids`, in
    /// `parts` passes run [`concurrent_passes`] on two threads.
    fn gradients(model: &crate::PolicyModel<Ad>, ids: &[i64], [rows, len]: [usize; 2], parts: usize) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        pool.install(|| {
            assert_eq!(<Ad as ScoringBackend>::passes_at_once(), 2);
            let work: Vec<&[i64]> = ids.chunks(rows.div_ceil(parts) * len).collect();
            let grads = concurrent_passes(model, work, |m: &crate::PolicyModel<Ad>, part: &[i64]| {
                let share = part.len() as f64 / ids.len() as f64;
                let loss = next_token_loss(m, part, [part.len() / len, len], &Default::default()) * share;
                GradientsParams::from_grads(loss.backward(), m)
            });
            flat(model, &sum_gradients(model, grads))
        })
    }

    #[test]
    fn passes_at_once_add_up_to_the_gradients_of_one_pass() {
        let device = Default::default();
        let model = PolicyModelConfig::new(23).with_d_model(16).with_n_heads(2).with_max_seq_len(32).init::<Ad>(&device);
        let [rows, len] = [5, 12];
        let ids: Vec<i64> = (0..rows * len).map(|i| (i * 7 % 23) as i64).collect();
        let one = gradients(&model, &ids, [rows, len], 1);
        let three = gradients(&model, &ids, [rows, len], 3);
        assert_eq!(one.len(), three.len());
        let scale = one.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0);
        for (i, (a, b)) in one.iter().zip(&three).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "gradient {i}: {a} in one pass, {b} in three at once");
        }
        // The same passes give the same bits, whichever thread ran which.
        assert_eq!(three, gradients(&model, &ids, [rows, len], 3));
    }
}
