//! Autoregressive sampling under the answer grammar, with a KV cache.
//!
//! Log-probabilities are those of the distribution actually sampled from:
//! logits divided by the temperature, disallowed tokens removed. The learner
//! recomputes them the same way ([`masked_logprobs`]), so the PPO ratio
//! starts at exactly 1.

use crate::grammar::{AnswerGrammar, GrammarState};
use crate::model::{KvCache, PolicyModel};
use burn::prelude::*;
use ragen_env_sdk::SeedRng;

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
    let scaled: Vec<f32> = logits.iter().zip(allowed).map(|(&l, &a)| if a { l / temperature } else { f32::NEG_INFINITY }).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + scaled.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    scaled.iter().map(|&x| x - lse).collect()
}

/// Sample a reply to `prompt` (which ends with the pre-fill) one token at
/// a time, feeding only the new token each step.
pub fn sample<B: Backend>(
    model: &PolicyModel<B>,
    prompt: &[u32],
    grammar: &AnswerGrammar,
    temperature: f32,
    max_new_tokens: usize,
    rng: &mut SeedRng,
    device: &B::Device,
) -> Sampled {
    let mut cache = KvCache::new(model.n_layers());
    let ids = |t: &[u32]| Tensor::<B, 2, Int>::from_data(TensorData::new(t.iter().map(|&x| x as i64).collect::<Vec<_>>(), [1, t.len()]), device);
    let (logits, _) = model.forward_cached(ids(prompt), &mut cache);
    let mut last = last_row(logits);
    let mut state = grammar.start();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while tokens.len() < max_new_tokens && state != GrammarState::Done {
        let dist = masked_log_distribution(&last, grammar.allowed(state), temperature);
        // Inverse-CDF draw over the allowed tokens.
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
        let token = pick.expect("the grammar always allows a token before it is done") as u32;
        tokens.push(token);
        logprobs.push(dist[token as usize]);
        state = grammar.advance(state, token).expect("sampled tokens are allowed");
        if state != GrammarState::Done && tokens.len() < max_new_tokens {
            let (logits, _) = model.forward_cached(ids(&[token]), &mut cache);
            last = last_row(logits);
        }
    }
    Sampled { tokens, logprobs, complete: state == GrammarState::Done }
}

/// The logits of the last position of a `[1, t, v]` tensor.
fn last_row<B: Backend>(logits: Tensor<B, 3>) -> Vec<f32> {
    let [_, t, v] = logits.dims();
    logits.narrow(1, t - 1, 1).reshape([v]).into_data().to_vec::<f32>().expect("f32 logits")
}

/// Recompute a reply's log-probabilities with one full forward pass over
/// `prompt + reply`, under the grammar's masks and the temperature.
pub fn masked_logprobs<B: Backend>(
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
