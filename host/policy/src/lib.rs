//! ragen-policy: the policy trained from scratch, from the plugin's text
//! to the agent loop.
//!
//! * [`PluginTokenizer`] gives the format tags, the role headers, the
//!   plugin's action names and its legend symbols a token each, and falls
//!   back to bytes for anything else, so it can represent any text a plugin
//!   emits. It is built from the plugin's self-description alone.
//! * [`AnswerGrammar`] is the constrained-decoding automaton: which tokens
//!   keep a reply well-formed at each point (free thinking up to a budget,
//!   then `</think><answer>`, action names separated by ` || `, at most
//!   `max_actions`, then `</answer>`). Sampling and the learner's
//!   log-probabilities use the same masks.
//! * [`PolicyModel`] is a small decoder-only transformer with a value head,
//!   generic over the Burn backend; [`sample`] draws a reply under the
//!   grammar with a KV cache, and [`masked_logprobs`] recomputes its
//!   log-probabilities in one full pass, as the learner will.
//! * [`BurnPolicy`] puts the model behind the agent loop's `Policy` seam.
//! * [`PolicyNetwork`] is the learner's seam: any causal LM with a value head
//!   (ours, or a pretrained one) trains with the same learner.
//! * [`bench_policy`] measures the policy's training and sampling speed.
//!
//! The fused operations the model runs on (attention, layer norm, GELU,
//! rotary positions, the learner's token scores) are ragen-ops'.

mod bench;
mod grammar;
mod model;
mod network;
mod policy;
mod record;
mod sample;
mod tokenizer;

pub use bench::{PolicyBenchConfig, PolicyBenchReport, bench_policy, next_token_pass};
pub use grammar::{AnswerGrammar, GrammarState};
pub use model::{KvCache, LayerCache, PolicyModel, PolicyModelConfig, Rotation, inv_frequencies};
pub use network::PolicyNetwork;
pub use policy::{BurnPolicy, SamplingConfig};
pub use record::CheckpointRecorder;
pub use sample::{
    CausalLm, ReplyRule, Sampled, Sampling, masked_log_distribution, masked_logprobs, sample, sample_batch, sample_batch_with, sample_queue,
};
pub use tokenizer::PluginTokenizer;
