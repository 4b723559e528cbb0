//! Autoregressive sampling under the answer grammar, with a KV cache.
//!
//! Log-probabilities are those of the distribution actually sampled from:
//! logits divided by the temperature, disallowed tokens removed. The learner
//! recomputes them the same way ([`masked_logprobs`]), so the PPO ratio
//! starts at exactly 1.

use crate::grammar::{AnswerGrammar, GrammarState};
use crate::model::{KvCache, PolicyModel};
use burn::prelude::*;
use ragen_ops::{AttentionBackend, PointwiseBackend};
use ragen_rng::SeedRng;

/// A causal language model that extends a KV cache: ours, or a pretrained
/// one. Sampling needs nothing else.
pub trait CausalLm<B: Backend> {
    fn n_layers(&self) -> usize;
    /// The next `t` tokens `[b, t]` after what `cache` holds: their logits
    /// `[b, t, v]` and values `[b, t]`; the cache is extended.
    fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> (Tensor<B, 3>, Tensor<B, 2>);

    /// [`CausalLm::forward_cached`], returning only the last position's
    /// logits `[b, v]`, which is all sampling reads. A model with a large
    /// vocabulary skips its output layer at every other position.
    fn last_logits_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 2> {
        let (logits, _) = self.forward_cached(tokens, cache);
        let [b, t, v] = logits.dims();
        logits.narrow(1, t - 1, 1).reshape([b, v])
    }
}

impl<B: AttentionBackend + PointwiseBackend> CausalLm<B> for PolicyModel<B> {
    fn n_layers(&self) -> usize {
        PolicyModel::n_layers(self)
    }

    fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> (Tensor<B, 3>, Tensor<B, 2>) {
        PolicyModel::forward_cached(self, tokens, cache)
    }
}

/// What a reply may contain next, and when it is done: the answer grammar
/// (constrained decoding), or free text that stops at a stop sequence.
pub trait ReplyRule {
    type State: Copy + PartialEq;
    fn start(&self) -> Self::State;
    /// The tokens allowed next; `None` allows every token.
    fn allowed(&self, state: Self::State) -> Option<&[bool]>;
    fn advance(&self, state: Self::State, token: u32) -> Self::State;
    fn is_done(&self, state: Self::State) -> bool;
}

impl ReplyRule for AnswerGrammar {
    type State = GrammarState;

    fn start(&self) -> GrammarState {
        AnswerGrammar::start(self)
    }

    fn allowed(&self, state: GrammarState) -> Option<&[bool]> {
        Some(AnswerGrammar::allowed(self, state))
    }

    fn advance(&self, state: GrammarState, token: u32) -> GrammarState {
        AnswerGrammar::advance(self, state, token).expect("sampled tokens are allowed")
    }

    fn is_done(&self, state: GrammarState) -> bool {
        state == GrammarState::Done
    }
}

/// How the next token is drawn from the logits. Log-probabilities are
/// always those of `softmax(logits / temperature)` over the allowed tokens,
/// which is what the learner recomputes; `top_k` and `top_p` only narrow
/// which tokens can be drawn (keep them off, 0 and 1.0, for training
/// rollouts, so that the recorded distribution is the one sampled from).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Draw among the `top_k` most likely tokens; 0 is off.
    pub top_k: usize,
    /// Draw among the most likely tokens whose probabilities add up to
    /// `top_p`; 1.0 is off.
    pub top_p: f32,
}

impl From<f32> for Sampling {
    fn from(temperature: f32) -> Self {
        Self { temperature, top_k: 0, top_p: 1.0 }
    }
}

/// One sampled reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// False when `max_new_tokens` ran out before the reply was complete.
    pub complete: bool,
}

/// Log-probability of every allowed token: `logits / temperature`, masked,
/// log-normalised. Disallowed tokens get `-inf`.
pub fn masked_log_distribution(logits: &[f32], allowed: &[bool], temperature: f32) -> Vec<f32> {
    log_distribution(logits, Some(allowed), temperature)
}

/// [`masked_log_distribution`], with `None` allowing every token.
/// Temperature 0 is the limit: all mass on the most likely allowed token
/// (the first of a tie), so greedy decoding is one more temperature.
fn log_distribution(logits: &[f32], allowed: Option<&[bool]>, temperature: f32) -> Vec<f32> {
    if temperature == 0.0 {
        let ok = |i: usize| allowed.is_none_or(|a| a[i]);
        let best = (0..logits.len()).filter(|&i| ok(i)).reduce(|j, i| if logits[i] > logits[j] { i } else { j });
        return (0..logits.len()).map(|i| if Some(i) == best { 0.0 } else { f32::NEG_INFINITY }).collect();
    }
    let scaled: Vec<f32> = match allowed {
        Some(allowed) => logits.iter().zip(allowed).map(|(&l, &a)| if a { l / temperature } else { f32::NEG_INFINITY }).collect(),
        None => logits.iter().map(|&l| l / temperature).collect(),
    };
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + scaled.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    scaled.iter().map(|&x| x - lse).collect()
}

/// Sample a reply to `prompt` (which ends with the pre-fill) one token at
/// a time, feeding only the new token each step.
pub fn sample<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompt: &[u32],
    grammar: &R,
    temperature: impl Into<Sampling>,
    max_new_tokens: usize,
    rng: &mut SeedRng,
    device: &B::Device,
) -> Sampled {
    sample_batch(model, &[prompt], grammar, temperature, max_new_tokens, std::slice::from_mut(rng), device).pop().expect("one row")
}

/// Sample one reply per prompt, all rows at once: the prefix all prompts
/// share runs once, each row's remaining tokens are padded (after that
/// prefix) to a common length and run in one pass, then every unfinished
/// row gets one new token per step. Row `r` draws from
/// `rngs[r]` only, so a reply does not depend on which other prompts shared
/// its batch.
pub fn sample_batch<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompts: &[&[u32]],
    grammar: &R,
    temperature: impl Into<Sampling>,
    max_new_tokens: usize,
    rngs: &mut [SeedRng],
    device: &B::Device,
) -> Vec<Sampled> {
    sample_batch_with(model, prompts, grammar, temperature, max_new_tokens, rngs, device, true)
}

/// [`sample_batch`], or with `use_cache` false, the same draws made by
/// running the whole sequence through the model at every step (what the KV
/// cache saves; the policy benchmark measures it).
#[allow(clippy::too_many_arguments)]
pub fn sample_batch_with<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompts: &[&[u32]],
    grammar: &R,
    temperature: impl Into<Sampling>,
    max_new_tokens: usize,
    rngs: &mut [SeedRng],
    device: &B::Device,
    use_cache: bool,
) -> Vec<Sampled> {
    let b = prompts.len();
    let sampling = temperature.into();
    assert_eq!(rngs.len(), b, "one random stream per prompt");
    assert!(prompts.iter().all(|p| !p.is_empty()), "every prompt has at least one token (the pre-fill)");
    let Prefilled { mut ids, shared, pad, mut cache, mut last } = prefill(model, prompts, device);
    let mut states = vec![grammar.start(); b];
    let mut out: Vec<Sampled> = (0..b).map(|_| Sampled { tokens: vec![], logprobs: vec![], complete: false }).collect();
    // The rows still writing, and `last[i]` is row `active[i]`'s logits.
    let mut active: Vec<usize> = (0..b).collect();
    for step in 0..max_new_tokens {
        let mut fed = Vec::with_capacity(active.len());
        for (i, &r) in active.iter().enumerate() {
            let dist = log_distribution(&last[i], grammar.allowed(states[r]), sampling.temperature);
            let token = draw(&narrowed(&dist, sampling), &mut rngs[r]);
            out[r].tokens.push(token);
            out[r].logprobs.push(dist[token as usize]);
            states[r] = grammar.advance(states[r], token);
            fed.push(token as i64);
        }
        // A finished row leaves the batch (and the cache), so one long reply
        // does not make every other row compute to the token limit.
        let still: Vec<usize> = (0..active.len()).filter(|&i| !grammar.is_done(states[active[i]])).collect();
        if still.is_empty() || step + 1 == max_new_tokens {
            break;
        }
        if still.len() < active.len() {
            cache.retain_rows(&still);
            fed = still.iter().map(|&i| fed[i]).collect();
            active = still.iter().map(|&i| active[i]).collect();
        }
        let n = active.len();
        let logits = if use_cache {
            model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(fed, [n, 1]), device), &mut cache)
        } else {
            for (&r, &token) in active.iter().zip(&fed) {
                ids[r].push(token);
            }
            let len = ids[active[0]].len();
            let mut whole = KvCache::new(model.n_layers());
            whole.pad_at(shared, active.iter().map(|&r| pad[r]).collect());
            let rows: Vec<i64> = active.iter().flat_map(|&r| ids[r].iter().copied()).collect();
            model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(rows, [n, len]), device), &mut whole)
        };
        last = last_rows(logits);
    }
    for (o, s) in out.iter_mut().zip(&states) {
        o.complete = grammar.is_done(*s);
    }
    out
}

/// The prompts run through the model, ready to sample from.
struct Prefilled<B: Backend> {
    /// Row by row: the shared prefix, padding, the row's own tokens (what
    /// the uncached path feeds whole at every step).
    ids: Vec<Vec<i64>>,
    /// Length of the prefix every prompt shares.
    shared: usize,
    /// Padding of each row, after the shared prefix.
    pad: Vec<usize>,
    cache: KvCache<B>,
    /// The logits after each row's last prompt token, `[b][v]`.
    last: Vec<Vec<f32>>,
}

/// The prefix every prompt shares (the system prompt, the instructions, a
/// group's whole first turn) is computed once and its cache repeated per
/// row; then each row's own tokens, left-padded after the prefix to the
/// longest. Every row keeps at least one token of its own, whose logits
/// start its reply.
fn prefill<B: Backend, M: CausalLm<B>>(model: &M, prompts: &[&[u32]], device: &B::Device) -> Prefilled<B> {
    let b = prompts.len();
    let shortest = prompts.iter().map(|p| p.len()).min().unwrap_or(1);
    let shared = (0..shortest - 1).take_while(|&i| prompts.iter().all(|p| p[i] == prompts[0][i])).count();
    let rest: Vec<&[u32]> = prompts.iter().map(|p| &p[shared..]).collect();
    let longest = rest.iter().map(|p| p.len()).max().unwrap_or(0);
    let pad: Vec<usize> = rest.iter().map(|p| longest - p.len()).collect();
    let ids: Vec<Vec<i64>> = rest
        .iter()
        .map(|p| {
            prompts[0][..shared]
                .iter()
                .map(|&x| x as i64)
                .chain(std::iter::repeat_n(0, longest - p.len()))
                .chain(p.iter().map(|&x| x as i64))
                .collect()
        })
        .collect();
    let mut cache = KvCache::new(model.n_layers());
    if shared > 0 {
        let prefix: Vec<i64> = prompts[0][..shared].iter().map(|&x| x as i64).collect();
        model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(prefix, [1, shared]), device), &mut cache);
    }
    let mut cache = cache.repeat(b);
    cache.pad_at(shared, pad.clone());
    let own: Vec<i64> = ids.iter().flat_map(|row| row[shared..].iter().copied()).collect();
    let logits = model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(own, [b, longest]), device), &mut cache);
    Prefilled { ids, shared, pad, cache, last: last_rows(logits) }
}

/// `dist` with everything outside the top-k and the top-p nucleus removed
/// (and renormalised); `dist` itself when both are off.
fn narrowed(dist: &[f32], sampling: Sampling) -> std::borrow::Cow<'_, [f32]> {
    if sampling.top_k == 0 && sampling.top_p >= 1.0 {
        return std::borrow::Cow::Borrowed(dist);
    }
    let mut order: Vec<usize> = (0..dist.len()).filter(|&i| dist[i] > f32::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| dist[b].total_cmp(&dist[a]).then(a.cmp(&b)));
    if sampling.top_k > 0 {
        order.truncate(sampling.top_k);
    }
    let mut mass = 0.0;
    let keep = order
        .iter()
        .take_while(|&&i| {
            let inside = mass < sampling.top_p;
            mass += dist[i].exp();
            inside
        })
        .count()
        .max(1);
    order.truncate(keep);
    let total: f32 = order.iter().map(|&i| dist[i].exp()).sum();
    let mut out = vec![f32::NEG_INFINITY; dist.len()];
    for &i in &order {
        out[i] = dist[i] - total.ln();
    }
    std::borrow::Cow::Owned(out)
}

/// Inverse-CDF draw over the allowed tokens of a log-distribution.
fn draw(dist: &[f32], rng: &mut SeedRng) -> u32 {
    let mut u = rng.unit() as f32;
    let mut pick = None;
    for (i, &lp) in dist.iter().enumerate() {
        if lp == f32::NEG_INFINITY {
            continue;
        }
        pick = Some(i);
        u -= lp.exp();
        if u <= 0.0 {
            break;
        }
    }
    pick.expect("a reply rule always allows a token before it is done") as u32
}

/// Each row of last-position logits `[b, v]`.
fn last_rows<B: Backend>(logits: Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [_, v] = logits.dims();
    let flat = logits.into_data().to_vec::<f32>().expect("f32 logits");
    flat.chunks(v).map(<[f32]>::to_vec).collect()
}

/// Recompute a reply's log-probabilities with one full forward pass over
/// `prompt + reply`, under the grammar's masks and the temperature.
pub fn masked_logprobs<B: AttentionBackend + PointwiseBackend>(
    model: &PolicyModel<B>,
    prompt: &[u32],
    reply: &[u32],
    grammar: &AnswerGrammar,
    temperature: f32,
    device: &B::Device,
) -> Result<Vec<f32>, String> {
    let states = grammar.states(reply)?;
    let all: Vec<i64> = prompt.iter().chain(reply).map(|&x| x as i64).collect();
    let n = all.len();
    let (logits, _) = model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(all, [1, n]), device));
    let v = logits.dims()[2];
    let flat = logits.reshape([n * v]).into_data().to_vec::<f32>().expect("f32 logits");
    Ok(reply
        .iter()
        .enumerate()
        .map(|(i, &tok)| {
            // Token prompt.len() + i is predicted at position prompt.len() + i - 1.
            let row = &flat[(prompt.len() + i - 1) * v..(prompt.len() + i) * v];
            masked_log_distribution(row, grammar.allowed(states[i]), temperature)[tok as usize]
        })
        .collect())
}
