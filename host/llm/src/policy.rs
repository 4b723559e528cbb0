//! A pretrained model behind the agent loop's `Policy` seam.
//!
//! The conversation is rendered by the model's chat template with the
//! generation prompt, the pre-fill (`<think>` or `<answer>`) follows it, and
//! the reply is sampled free, as in the paper: no grammar constrains it, a
//! malformed reply costs the format penalty. A reply ends at the model's
//! end-of-turn token, once `</answer>` has been written, or at the token
//! limit.

use crate::chat::ChatMessage;
use crate::model::Llm;
use crate::tokenizer::LlmTokenizer;
use crate::{ChatTemplate, Pretrained};
use anyhow::Result;
use burn::prelude::*;
use ragen_agent::{Context, Message, Policy, Response, Tokenizer, Usage};
use ragen_ops::{AttentionBackend, PointwiseBackend, QuantizedBackend};
use ragen_policy::{KvCache, ReplyRule, Sampling, sample_queue};
use ragen_rng::SeedRng;

/// Free text that ends at an end-of-turn token or after a stop string.
#[derive(Clone, Debug)]
pub struct StopRule {
    /// Tokens that end the reply (included in it).
    stop_tokens: Vec<u32>,
    /// The reply ends once its text contains this.
    stop_text: Vec<u8>,
    /// Each token's bytes.
    token_bytes: Vec<Vec<u8>>,
}

/// The last bytes of the reply so far (enough to see the stop text arrive
/// across token boundaries), or done.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StopState {
    tail: [u8; 16],
    len: u8,
    done: bool,
}

impl StopRule {
    pub fn new(tokenizer: &LlmTokenizer, stop_text: &str) -> Self {
        assert!(stop_text.len() <= 16, "stop text of at most 16 bytes");
        let token_bytes = tokenizer.token_texts().into_iter().map(String::into_bytes).collect();
        Self { stop_tokens: vec![tokenizer.eos.id], stop_text: stop_text.as_bytes().to_vec(), token_bytes }
    }

    /// Never stops: replies run to the token limit (for benchmarks).
    pub fn never() -> Self {
        Self { stop_tokens: vec![], stop_text: vec![], token_bytes: vec![] }
    }
}

impl ReplyRule for StopRule {
    type State = StopState;

    fn start(&self) -> StopState {
        StopState { tail: [0; 16], len: 0, done: false }
    }

    fn allowed(&self, _: StopState) -> Option<&[bool]> {
        None
    }

    fn advance(&self, state: StopState, token: u32) -> StopState {
        if self.stop_tokens.contains(&token) {
            return StopState { done: true, ..state };
        }
        let mut seen = state.tail[..state.len as usize].to_vec();
        seen.extend(self.token_bytes.get(token as usize).map_or(&[][..], Vec::as_slice));
        let done = !self.stop_text.is_empty() && seen.windows(self.stop_text.len()).any(|w| w == self.stop_text);
        let keep = &seen[seen.len().saturating_sub(16)..];
        let mut tail = [0; 16];
        tail[..keep.len()].copy_from_slice(keep);
        StopState { tail, len: keep.len() as u8, done }
    }

    fn is_done(&self, state: StopState) -> bool {
        state.done
    }
}

/// How replies are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlmSampling {
    pub sampling: Sampling,
    /// The longest reply, in tokens.
    pub max_new_tokens: usize,
    /// Replies written at once: when one finishes, a waiting prompt takes
    /// its slot (continuous batching).
    pub batch: usize,
}

impl Default for LlmSampling {
    fn default() -> Self {
        Self { sampling: Sampling { temperature: 1.0, top_k: 0, top_p: 1.0 }, max_new_tokens: 200, batch: 16 }
    }
}

/// The model's tokenizer and chat template: how the agent loop's
/// conversations become the model's tokens, for sampling and, the same
/// way, for the learner ([`Tokenizer::chat_prompt`]).
#[derive(Clone, Debug)]
pub struct ChatTokenizer {
    pub tokenizer: LlmTokenizer,
    pub template: ChatTemplate,
    /// The longest prompt, in tokens: a longer one keeps its last tokens.
    pub max_prompt: usize,
}

impl ChatTokenizer {
    /// The chat template's rendering of `messages` with the generation
    /// prompt, then the pre-fill, cut to its last `max_prompt` tokens.
    pub fn prompt(&self, messages: &[Message<'_>], prefill: &str) -> Result<Vec<u32>> {
        let messages: Vec<ChatMessage> = messages.iter().map(|m| ChatMessage::new(m.role, m.text)).collect();
        let text = self.template.render(&messages, true)? + prefill;
        let mut ids = self.tokenizer.encode(&text);
        if ids.len() > self.max_prompt {
            ids.drain(..ids.len() - self.max_prompt);
        }
        Ok(ids)
    }
}

impl Tokenizer for ChatTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text)
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids)
    }

    /// # Panics
    /// If the template cannot render a conversation it rendered when the
    /// replies were sampled (it is a pure function of the messages).
    fn chat_prompt(&self, messages: &[Message<'_>], prefill: &str) -> Option<Vec<u32>> {
        Some(self.prompt(messages, prefill).expect("the chat template rendered this conversation when it was sampled"))
    }
}

/// A pretrained model writing the agent's replies.
pub struct LlmPolicy<B: Backend> {
    pub pretrained: Pretrained<B>,
    chat: ChatTokenizer,
    rule: StopRule,
    config: LlmSampling,
    seed: u64,
    /// Replies drawn so far; reply `n` draws from stream `n` of `seed`.
    drawn: u64,
    usage: Usage,
    name: String,
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> LlmPolicy<B> {
    pub fn new(pretrained: Pretrained<B>, config: LlmSampling, seed: u64) -> Self {
        let rule = StopRule::new(&pretrained.tokenizer, "</answer>");
        let name = pretrained.path.file_name().map_or_else(|| "pretrained".into(), |n| n.to_string_lossy().into_owned());
        let chat = pretrained.chat_tokenizer(config.max_new_tokens);
        Self { pretrained, chat, rule, config, seed, drawn: 0, usage: Usage::default(), name }
    }

    /// The prompt tokens for one context: the chat template's rendering of
    /// its messages with the generation prompt, then the pre-fill. A prompt
    /// longer than the model's context keeps its last tokens.
    pub fn prompt_tokens(&self, c: &Context<'_>) -> Result<Vec<u32>> {
        self.chat.prompt(&c.messages, c.prefill)
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.pretrained.template
    }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> Policy for LlmPolicy<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.chat
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        let prompts: Vec<Vec<u32>> = contexts.iter().map(|c| self.prompt_tokens(c)).collect::<Result<_>>()?;
        let mut rngs: Vec<Option<SeedRng>> = (0..contexts.len() as u64).map(|i| Some(SeedRng::stream(self.seed, self.drawn + i))).collect();
        self.drawn += contexts.len() as u64;
        // Prompts join the batch in order of length, so those writing
        // together carry little padding; `batch` of them write at once.
        let mut order: Vec<usize> = (0..prompts.len()).collect();
        order.sort_by_key(|&i| prompts[i].len());
        let queue: Vec<&[u32]> = order.iter().map(|&i| prompts[i].as_slice()).collect();
        let mut queue_rngs: Vec<SeedRng> = order.iter().map(|&i| rngs[i].take().expect("each row once")).collect();
        let (p, c) = (&self.pretrained, &self.config);
        let sampled = sample_queue(&p.model, &queue, &self.rule, c.sampling, c.max_new_tokens, &mut queue_rngs, &p.device, c.batch);
        self.usage.add(queue.iter().copied(), sampled.iter().map(|s| s.tokens.as_slice()));
        let eos = p.tokenizer.eos.id;
        let mut replies: Vec<Option<Response>> = vec![None; prompts.len()];
        for (&i, s) in order.iter().zip(sampled) {
            let shown = s.tokens.strip_suffix(&[eos]).unwrap_or(&s.tokens);
            replies[i] = Some(Response { text: p.tokenizer.decode(shown), tokens: s.tokens, logprobs: s.logprobs });
        }
        Ok(replies.into_iter().map(|r| r.expect("every context sampled")).collect())
    }
}

impl<B: AttentionBackend + PointwiseBackend + QuantizedBackend> Llm<B> {
    /// The longest prompt that leaves room for a reply of `reply` tokens.
    pub fn max_seq_len_for_prompts(&self, reply: usize) -> usize {
        self.max_seq_len.saturating_sub(reply).max(1)
    }
}

/// Greedy decoding of one prompt: the most likely token each step, until
/// `eos` (included) or `max_new_tokens`.
pub fn greedy<B: AttentionBackend + PointwiseBackend + QuantizedBackend>(
    model: &Llm<B>,
    prompt: &[u32],
    eos: u32,
    max_new_tokens: usize,
    device: &B::Device,
) -> Vec<u32> {
    let mut cache = KvCache::new(model.n_layers());
    let ids: Vec<i64> = prompt.iter().map(|&x| x as i64).collect();
    let mut input = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, prompt.len()]), device);
    let mut out = Vec::new();
    for _ in 0..max_new_tokens {
        let last = model.last_logits_cached(input, &mut cache).into_data().to_vec::<f32>().expect("f32 logits");
        let next = last.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as u32;
        out.push(next);
        if next == eos {
            break;
        }
        input = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![next as i64], [1, 1]), device);
    }
    out
}
