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
use rayon::prelude::*;

/// A causal language model that extends a KV cache: ours, or a pretrained
/// one. Sampling needs nothing else.
pub trait CausalLm<B: Backend>: Sync {
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
pub trait ReplyRule: Sync {
    type State: Copy + PartialEq + Send;
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

/// Sample one reply per prompt, all rows at once: [`sample_queue`] with a
/// slot for every prompt. Row `r` draws from `rngs[r]` only, so a reply
/// does not depend on which other prompts shared its batch.
pub fn sample_batch<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompts: &[&[u32]],
    grammar: &R,
    temperature: impl Into<Sampling>,
    max_new_tokens: usize,
    rngs: &mut [SeedRng],
    device: &B::Device,
) -> Vec<Sampled> {
    sample_queue(model, prompts, grammar, temperature, max_new_tokens, rngs, device, prompts.len())
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
    if use_cache {
        return sample_batch(model, prompts, grammar, temperature, max_new_tokens, rngs, device);
    }
    let b = prompts.len();
    let sampling = temperature.into();
    assert_eq!(rngs.len(), b, "one random stream per prompt");
    assert!(prompts.iter().all(|p| !p.is_empty()), "every prompt has at least one token (the pre-fill)");
    let mut out: Vec<Sampled> = (0..b).map(|_| Sampled { tokens: vec![], logprobs: vec![], complete: false }).collect();
    if b == 0 || max_new_tokens == 0 {
        return out;
    }
    let Prefilled { mut ids, shared, pad, mut last } = prefill(model, prompts, device);
    let mut states = vec![grammar.start(); b];
    // The rows still writing, and `last[i]` is row `active[i]`'s logits.
    let mut active: Vec<usize> = (0..b).collect();
    loop {
        let fed = draw_step(&active, &last, grammar, sampling, (&mut states, rngs, &mut out));
        let still: Vec<usize> =
            (0..active.len()).filter(|&i| !out[active[i]].complete && out[active[i]].tokens.len() < max_new_tokens).collect();
        if still.is_empty() {
            return out;
        }
        active = still.iter().map(|&i| active[i]).collect();
        for (&r, &i) in active.iter().zip(&still) {
            ids[r].push(fed[i]);
        }
        let (n, len) = (active.len(), ids[active[0]].len());
        let mut whole = KvCache::new(model.n_layers());
        whole.pad_at(shared, active.iter().map(|&r| pad[r]).collect());
        let rows: Vec<i64> = active.iter().flat_map(|&r| ids[r].iter().copied()).collect();
        last = last_rows(model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(rows, [n, len]), device), &mut whole));
    }
}

/// One token for each row `active[i]` from its logits `last[i]`: drawn,
/// recorded in `out` with its log-probability, and the row's state
/// advanced (`complete` once the rule is done). Returns the tokens, to feed.
/// Rows draw in parallel (a vocabulary of tens of thousands is as many
/// `exp`s a row), each from its own stream, so the draws do not depend on
/// how the rows are shared out.
fn draw_step<R: ReplyRule>(
    active: &[usize],
    last: &[Vec<f32>],
    grammar: &R,
    sampling: Sampling,
    (states, rngs, out): (&mut [R::State], &mut [SeedRng], &mut [Sampled]),
) -> Vec<i64> {
    let mut slot = vec![None; out.len()];
    for (i, &r) in active.iter().enumerate() {
        slot[r] = Some(i);
    }
    let mut rows: Vec<_> =
        states.iter_mut().zip(rngs.iter_mut()).zip(out.iter_mut()).enumerate().filter_map(|(r, row)| slot[r].map(|i| (i, row))).collect();
    rows.sort_unstable_by_key(|&(i, _)| i);
    rows.into_par_iter()
        .map(|(i, ((state, rng), out))| {
            let dist = log_distribution(&last[i], grammar.allowed(*state), sampling.temperature);
            let token = draw(&narrowed(&dist, sampling), rng);
            out.tokens.push(token);
            out.logprobs.push(dist[token as usize]);
            *state = grammar.advance(*state, token);
            out.complete = grammar.is_done(*state);
            token as i64
        })
        .collect()
}

/// The prompts run through the model, ready to sample from.
struct Prefilled {
    /// Row by row: the shared prefix, padding, the row's own tokens (what
    /// the uncached path feeds whole at every step).
    ids: Vec<Vec<i64>>,
    /// Length of the prefix every prompt shares.
    shared: usize,
    /// Padding of each row, after the shared prefix.
    pad: Vec<usize>,
    /// The logits after each row's last prompt token, `[b][v]`.
    last: Vec<Vec<f32>>,
}

/// Prompts are prefilled as a tree of what they share: the prefix every
/// prompt shares (the system prompt, the instructions) once, then each
/// distinct prompt's own tokens ([`prefill_rows`]).
fn prefill<B: Backend, M: CausalLm<B>>(model: &M, prompts: &[&[u32]], device: &B::Device) -> Prefilled {
    let (shared, prefix) = shared_prefix(model, prompts, device);
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
    let (_, last) = prefill_rows(model, &prefix, shared, &rest, device);
    Prefilled { ids, shared, pad, last }
}

/// How many first tokens all `prompts` share (every prompt keeps at least
/// one of its own, whose logits start its reply), and their cache, run once.
fn shared_prefix<B: Backend, M: CausalLm<B>>(model: &M, prompts: &[&[u32]], device: &B::Device) -> (usize, KvCache<B>) {
    let shortest = prompts.iter().map(|p| p.len()).min().unwrap_or(1);
    let shared = (0..shortest - 1).take_while(|&i| prompts.iter().all(|p| p[i] == prompts[0][i])).count();
    let mut cache = KvCache::new(model.n_layers());
    if shared > 0 {
        let prefix: Vec<i64> = prompts[0][..shared].iter().map(|&x| x as i64).collect();
        model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(prefix, [1, shared]), device), &mut cache);
    }
    (shared, cache)
}

/// Rows that continue `prefix` (a cache of `shared` positions) with their
/// own tokens `rest`: each distinct continuation runs once, left-padded
/// after the prefix to the longest, however many rows ask for it (a
/// group's members all start from the same first prompt), and its cache
/// row is copied out to them. Returns the rows' cache and the logits after
/// each row's last token, `[rows][v]`.
fn prefill_rows<B: Backend, M: CausalLm<B>>(
    model: &M,
    prefix: &KvCache<B>,
    shared: usize,
    rest: &[&[u32]],
    device: &B::Device,
) -> (KvCache<B>, Vec<Vec<f32>>) {
    let longest = rest.iter().map(|p| p.len()).max().unwrap_or(0);
    // `distinct[u]` is the first row with the u-th distinct continuation;
    // row r reads cache row `of_row[r]`.
    let mut first_of: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
    let mut distinct = Vec::new();
    let of_row: Vec<usize> = rest
        .iter()
        .enumerate()
        .map(|(r, p)| {
            *first_of.entry(p).or_insert_with(|| {
                distinct.push(r);
                distinct.len() - 1
            })
        })
        .collect();
    let mut cache = prefix.repeat(distinct.len());
    cache.pad_at(shared, distinct.iter().map(|&r| longest - rest[r].len()).collect());
    let own: Vec<i64> =
        distinct.iter().flat_map(|&r| std::iter::repeat_n(0, longest - rest[r].len()).chain(rest[r].iter().map(|&x| x as i64))).collect();
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(own, [distinct.len(), longest]), device);
    let last = last_rows(model.last_logits_cached(input, &mut cache));
    if distinct.len() < rest.len() {
        cache.retain_rows(&of_row);
    }
    (cache, of_row.iter().map(|&u| last[u].clone()).collect())
}

/// Sample one reply per prompt with at most `slots` rows writing at once
/// (continuous batching). Prompts join in order as slots free up, a
/// quarter of the slots at a time: a finished reply leaves the batch and a
/// waiting prompt takes its place, so one long reply no longer keeps a
/// whole batch's worth of prompts waiting for it. The prefix every prompt
/// shares runs once for all of them. Row `r` draws from `rngs[r]` only, so
/// a reply depends neither on `slots` nor on which prompts shared its
/// batch.
///
/// It runs on a thread of the compute pool: each step is hundreds of small
/// parallel operations, and from a thread outside the pool every one of
/// them would be handed over and waited for (two thread wake-ups each, a
/// fixed cost per step that outweighs a small batch's arithmetic).
#[allow(clippy::too_many_arguments)]
pub fn sample_queue<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompts: &[&[u32]],
    grammar: &R,
    temperature: impl Into<Sampling>,
    max_new_tokens: usize,
    rngs: &mut [SeedRng],
    device: &B::Device,
    slots: usize,
) -> Vec<Sampled> {
    let sampling = temperature.into();
    rayon::scope(|_| queue_in_pool(model, prompts, grammar, sampling, max_new_tokens, rngs, device, slots))
}

/// [`sample_queue`], on a thread of the pool.
#[allow(clippy::too_many_arguments)]
fn queue_in_pool<B: Backend, M: CausalLm<B>, R: ReplyRule>(
    model: &M,
    prompts: &[&[u32]],
    grammar: &R,
    sampling: Sampling,
    max_new_tokens: usize,
    rngs: &mut [SeedRng],
    device: &B::Device,
    slots: usize,
) -> Vec<Sampled> {
    let (b, slots) = (prompts.len(), slots.max(1));
    assert_eq!(rngs.len(), b, "one random stream per prompt");
    assert!(prompts.iter().all(|p| !p.is_empty()), "every prompt has at least one token (the pre-fill)");
    let mut out: Vec<Sampled> = (0..b).map(|_| Sampled { tokens: vec![], logprobs: vec![], complete: false }).collect();
    if b == 0 || max_new_tokens == 0 {
        return out;
    }
    let (shared, prefix) = shared_prefix(model, prompts, device);
    let mut states = vec![grammar.start(); b];
    // The rows writing, their cache, and `last[i]`, row `active[i]`'s logits.
    let (mut active, mut cache, mut last) = (Vec::<usize>::new(), None::<KvCache<B>>, Vec::<Vec<f32>>::new());
    let mut waiting = 0..b;
    loop {
        let free = slots - active.len();
        if !waiting.is_empty() && (active.is_empty() || 4 * free >= slots) {
            let joining: Vec<usize> = waiting.by_ref().take(free).collect();
            let rest: Vec<&[u32]> = joining.iter().map(|&r| &prompts[r][shared..]).collect();
            let (joined, logits) = prefill_rows(model, &prefix, shared, &rest, device);
            cache = Some(match cache {
                Some(writing) => writing.append_rows(joined, shared),
                None => joined,
            });
            active.extend(joining);
            last.extend(logits);
        }
        if active.is_empty() {
            return out;
        }
        let mut fed = draw_step(&active, &last, grammar, sampling, (&mut states, rngs, &mut out));
        let still: Vec<usize> =
            (0..active.len()).filter(|&i| !out[active[i]].complete && out[active[i]].tokens.len() < max_new_tokens).collect();
        if still.is_empty() {
            (active, cache, last) = (Vec::new(), None, Vec::new());
            continue;
        }
        let cache = cache.as_mut().expect("rows are writing");
        if still.len() < active.len() {
            cache.retain_rows(&still);
            fed = still.iter().map(|&i| fed[i]).collect();
            active = still.iter().map(|&i| active[i]).collect();
        }
        let n = active.len();
        last = last_rows(model.last_logits_cached(Tensor::<B, 2, Int>::from_data(TensorData::new(fed, [n, 1]), device), cache));
    }
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
