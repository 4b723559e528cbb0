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
//!
//! The Burn model that samples under these masks is the next piece.

mod grammar;
mod tokenizer;

pub use grammar::{AnswerGrammar, GrammarState};
pub use tokenizer::PluginTokenizer;
