//! The Burn model behind the agent loop's `Policy` seam.

use crate::grammar::AnswerGrammar;
use crate::model::PolicyModel;
use crate::sample::sample_batch;
use crate::tokenizer::PluginTokenizer;
use anyhow::Result;
use burn::prelude::*;
use ragen_agent::{Context, Policy, Response, Role, Tokenizer, Usage};
use ragen_ops::{AttentionBackend, PointwiseBackend};
use ragen_rng::SeedRng;

/// Sampling settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// 1.0 for training rollouts, 0.5 for evaluation (the reference's values).
    pub temperature: f32,
    /// Thinking tokens before `</think>` is forced.
    pub think_budget: u32,
}

/// A [`PolicyModel`] that writes replies under the answer grammar.
///
/// Contexts are laid out as the trajectory's token view lays them out (role
/// header, then text, per message; then the assistant header and the
/// pre-fill), so the learner sees exactly the sequence that was sampled
/// from. A context longer than the model's window keeps its most recent
/// tokens.
pub struct BurnPolicy<B: Backend> {
    pub model: PolicyModel<B>,
    tokenizer: PluginTokenizer,
    grammar: AnswerGrammar,
    config: SamplingConfig,
    seed: u64,
    /// Replies drawn so far; reply `n` draws from stream `n` of `seed`.
    drawn: u64,
    usage: Usage,
    device: B::Device,
}

/// Attention scores one prefill may hold at once (`b · h · t²` floats):
/// 64 Mi floats, 256 MiB. Longer prompts go in smaller batches.
const PREFILL_SCORES: usize = 64 << 20;
/// At most this many replies are sampled together.
const MAX_BATCH: usize = 256;

impl<B: Backend> BurnPolicy<B> {
    pub fn new(
        model: PolicyModel<B>,
        tokenizer: PluginTokenizer,
        enable_think: bool,
        max_actions_per_turn: u32,
        config: SamplingConfig,
        seed: u64,
        device: B::Device,
    ) -> Self {
        let grammar = AnswerGrammar::new(&tokenizer, enable_think, config.think_budget, max_actions_per_turn);
        Self { model, tokenizer, grammar, config, seed, drawn: 0, usage: Usage::default(), device }
    }

    pub fn grammar(&self) -> &AnswerGrammar {
        &self.grammar
    }

    pub fn plugin_tokenizer(&self) -> &PluginTokenizer {
        &self.tokenizer
    }

    /// The prompt tokens for one context.
    pub fn prompt_tokens(&self, c: &Context<'_>) -> Vec<u32> {
        let mut ids = Vec::new();
        for m in &c.messages {
            ids.extend(self.tokenizer.role_header(m.role));
            ids.extend(self.tokenizer.encode(m.text));
        }
        ids.extend(self.tokenizer.role_header(Role::Assistant));
        ids.extend(self.tokenizer.encode(c.prefill));
        // Leave room for the longest reply.
        let window = self.model.max_seq_len().saturating_sub(self.grammar.max_reply_tokens()).max(1);
        if ids.len() > window {
            ids.drain(..ids.len() - window);
        }
        ids
    }
}

impl<B: AttentionBackend + PointwiseBackend> Policy for BurnPolicy<B> {
    fn name(&self) -> &str {
        "burn-transformer"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        let budget = self.grammar.max_reply_tokens();
        let prompts: Vec<Vec<u32>> = contexts.iter().map(|c| self.prompt_tokens(c)).collect();
        let mut rngs: Vec<Option<SeedRng>> = (0..contexts.len() as u64).map(|i| Some(SeedRng::stream(self.seed, self.drawn + i))).collect();
        self.drawn += contexts.len() as u64;
        // Similar lengths share a batch, so little of it is padding.
        let mut order: Vec<usize> = (0..prompts.len()).collect();
        order.sort_by_key(|&i| prompts[i].len());
        let mut replies: Vec<Option<Response>> = vec![None; prompts.len()];
        let heads = self.model.n_heads();
        let mut rest = &order[..];
        while !rest.is_empty() {
            let mut n = 1;
            while n < rest.len().min(MAX_BATCH) {
                let len = prompts[rest[n]].len() + budget;
                if (n + 1) * heads * len * len > PREFILL_SCORES {
                    break;
                }
                n += 1;
            }
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let batch: Vec<&[u32]> = chunk.iter().map(|&i| prompts[i].as_slice()).collect();
            let mut batch_rngs: Vec<SeedRng> = chunk.iter().map(|&i| rngs[i].take().expect("each row once")).collect();
            let sampled = sample_batch(&self.model, &batch, &self.grammar, self.config.temperature, budget, &mut batch_rngs, &self.device);
            self.usage.add(batch.iter().copied(), sampled.iter().map(|s| s.tokens.as_slice()));
            for (&i, s) in chunk.iter().zip(sampled) {
                replies[i] = Some(Response { text: self.tokenizer.decode(&s.tokens), tokens: s.tokens, logprobs: s.logprobs });
            }
        }
        Ok(replies.into_iter().map(|r| r.expect("every context sampled")).collect())
    }
}
