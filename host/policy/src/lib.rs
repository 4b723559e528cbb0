//! ragen-policy: the text side of a policy trained from scratch.
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
//! * [`AttentionBackend`] and [`PointwiseBackend`] make causal attention,
//!   layer normalisation and GELU one autodiff node each, with fused
//!   backward passes and flex kernels of our own.
//! * [`token_scores`] gives the learner the log-probabilities and entropies
//!   of the sampled tokens from the final hidden states, as one autodiff
//!   node that never holds more than a chunk of logits.
//! * [`concurrent_passes`] runs the learner's passes one per core on flex.
//! * [`PolicyNetwork`] is the learner's seam: any causal LM with a value head
//!   (ours, or a pretrained one later) trains with the same learner.

mod agent;
mod attention;
mod bench;
mod flex;
mod grammar;
mod model;
mod network;
mod passes;
mod pointwise;
mod sample;
mod score_rows;
mod scoring;
mod tokenizer;

pub use agent::{BurnPolicy, SamplingConfig};
pub use attention::{AttentionBackend, AttentionHeads, TrainBackend};
pub use bench::{PolicyBenchConfig, PolicyBenchReport, bench_policy, next_token_pass};
pub use grammar::{AnswerGrammar, GrammarState};
pub use model::{KvCache, LayerCache, PolicyModel, PolicyModelConfig, Rotation, inv_frequencies};
pub use network::PolicyNetwork;
pub use passes::{concurrent_passes, sum_gradients};
pub use pointwise::PointwiseBackend;
pub use sample::{
    CausalLm, ReplyRule, Sampled, Sampling, masked_log_distribution, masked_logprobs, sample, sample_batch, sample_batch_with,
};
pub use scoring::{OutputLayer, ScoreOptions, ScoringBackend, TokenScores, token_scores};
pub use tokenizer::PluginTokenizer;
