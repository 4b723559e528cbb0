//! The Burn model behind the agent loop's `Policy` seam.

use crate::grammar::AnswerGrammar;
use crate::model::PolicyModel;
use crate::sample::sample;
use crate::tokenizer::PluginTokenizer;
use anyhow::Result;
use burn::prelude::*;
use ragen_agent::{Context, Policy, Response, Role, Tokenizer};
use ragen_env_sdk::SeedRng;

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
    rng: SeedRng,
    device: B::Device,
}

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
        Self { model, tokenizer, grammar, config, rng: SeedRng::new(seed), device }
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

impl<B: Backend> Policy for BurnPolicy<B> {
    fn name(&self) -> &str {
        "burn-transformer"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        let budget = self.grammar.max_reply_tokens();
        Ok(contexts
            .iter()
            .map(|c| {
                let prompt = self.prompt_tokens(c);
                let s = sample(&self.model, &prompt, &self.grammar, self.config.temperature, budget, &mut self.rng, &self.device);
                Response { text: self.tokenizer.decode(&s.tokens), tokens: s.tokens, logprobs: s.logprobs }
            })
            .collect())
    }
}
