//! The seam between the agent loop and whatever writes the replies.
//!
//! The loop speaks text: a policy gets each env's conversation so far and
//! returns the reply that follows the pre-fill. It also returns the reply's
//! tokens under its own tokenizer, with the log-probability of each, because
//! the learner must train on exactly the tokens that were sampled (decoding
//! and re-encoding text need not give them back). A from-scratch Burn model,
//! a pretrained Hugging Face model and the scripted policies below all fit.

use crate::prompt::Role;
use anyhow::Result;
use ragen_runtime::Action;

/// Text to token ids and back.
pub trait Tokenizer: Send + Sync {
    fn encode(&self, text: &str) -> Vec<u32>;
    fn decode(&self, ids: &[u32]) -> String;
    /// The tokens that open a message from `role` in this tokenizer's chat
    /// format.
    fn role_header(&self, role: Role) -> Vec<u32> {
        let name = match role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        self.encode(&format!("<|{name}|>\n"))
    }

    /// The exact tokens a chat model reads before its reply: `messages`
    /// rendered by its chat template with the generation prompt, then the
    /// pre-fill. `None` (the default) for tokenizers without a template,
    /// whose conversations are laid out as role headers and texts.
    fn chat_prompt(&self, _messages: &[Message<'_>], _prefill: &str) -> Option<Vec<u32>> {
        None
    }
}

/// One byte per token: can represent any text; the scripted policies use it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Message<'a> {
    pub role: Role,
    pub text: &'a str,
}

/// What a policy sees for one env this turn.
#[derive(Clone, Debug)]
pub struct Context<'a> {
    /// Which env of the rollout this is, the same on every turn, so a
    /// policy can keep per-env state (a trainer's token ids, a cache).
    pub env: usize,
    /// The conversation so far, ending with the user's turn message.
    pub messages: Vec<Message<'a>>,
    /// The reply starts with this (`<think>` or `<answer>`); the policy
    /// writes what follows.
    pub prefill: &'a str,
    /// The env's current observation (also inside the last message), for
    /// policies that read the state rather than the prompt.
    pub observation: &'a str,
    /// The env's action names.
    pub actions: &'a [String],
    /// How many actions the reply may usefully contain this turn.
    pub max_actions: u32,
    /// The env's own best next actions (at most `max_actions`), for a
    /// policy that asks for them ([`Policy::wants_oracle`]); `None` for
    /// every other policy.
    pub oracle: Option<&'a [Action]>,
}

/// A policy's reply to one context.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The text after the pre-fill.
    pub text: String,
    /// `text` as the policy's tokens, and each token's log-probability
    /// under the policy when it was sampled.
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// Turns contexts into replies, a batch at a time.
pub trait Policy {
    /// A short name for logs and reports.
    fn name(&self) -> &str;
    fn tokenizer(&self) -> &dyn Tokenizer;
    /// One response per context, in order.
    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>>;

    /// Whether each context should carry the env's oracle answer
    /// ([`Context::oracle`]); the loop then asks the plugin's oracle
    /// before every reply, and an env whose oracle fails ends its episode
    /// with that failure.
    fn wants_oracle(&self) -> bool {
        false
    }

    /// The tokens a model has read and written so far, for the rollout's
    /// throughput; zero for a policy that is not a model.
    fn usage(&self) -> Usage {
        Usage::default()
    }
}

/// What a model policy has read and written: every prompt's tokens as it
/// saw them (a shared prefix counted once per prompt, as a user reads a
/// rate), and the tokens of its replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub reply_tokens: u64,
}

impl Usage {
    /// Count one batch of prompts and replies.
    pub fn add<'a>(&mut self, prompts: impl IntoIterator<Item = &'a [u32]>, replies: impl IntoIterator<Item = &'a [u32]>) {
        self.prompt_tokens += prompts.into_iter().map(|p| p.len() as u64).sum::<u64>();
        self.reply_tokens += replies.into_iter().map(|r| r.len() as u64).sum::<u64>();
    }
}
