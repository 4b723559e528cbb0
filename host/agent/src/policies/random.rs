//! Uniformly random well-formed answers: the baseline learning is judged
//! against.

use crate::policy::{ByteTokenizer, Context, Policy, Response, Tokenizer};
use anyhow::Result;
use ragen_rng::SeedRng;

/// Picks how many actions (1..=max) and then each action uniformly. Its
/// log-probability for a reply is that of the choice; it sits on the first
/// token, the rest of the reply following deterministically.
pub struct RandomPolicy {
    rng: SeedRng,
}

impl RandomPolicy {
    pub fn new(seed: u64) -> Self {
        Self { rng: SeedRng::new(seed) }
    }
}

/// Why the random policy cannot play a text env, and what to use instead.
pub const RANDOM_NEEDS_NAMES: &str = "the random policy picks action names, and this env's action is free text \
     (there is no uniform distribution over all text); evaluate a model instead (--model PATH), or the env's own \
     best play (--policy oracle) where the plugin has an oracle";

impl Policy for RandomPolicy {
    fn name(&self) -> &str {
        "random"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        if contexts.iter().any(|c| c.actions.is_empty()) {
            anyhow::bail!(RANDOM_NEEDS_NAMES);
        }
        Ok(contexts
            .iter()
            .map(|c| {
                let max = c.max_actions.max(1) as usize;
                let n = 1 + self.rng.below(max);
                let names: Vec<&str> = (0..n).map(|_| c.actions[self.rng.below(c.actions.len())].as_str()).collect();
                let text = super::reply(c.prefill, "I will pick at random.", &names);
                let tokens = ByteTokenizer.encode(&text);
                let logp = -((max as f64).ln() + n as f64 * (c.actions.len() as f64).ln());
                let mut logprobs = vec![0.0; tokens.len()];
                logprobs[0] = logp as f32;
                Response { text, tokens, logprobs }
            })
            .collect())
    }
}
