//! ragen-agent: the multi-turn agent loop (RAGEN's env-state and context
//! managers). It turns observations into the agent's context
//! ([`PromptBuilder`]), the agent's text into actions ([`ResponseParser`]),
//! plays grouped rollouts through the env pool ([`RolloutRunner`]) and
//! records everything the learner needs ([`Trajectory`]). Any [`Policy`]
//! that turns a prompt into text plugs in.

pub mod config;
pub mod metrics;
pub mod parse;
pub mod policies;
pub mod policy;
pub mod prompt;
pub mod rollout;
pub mod trajectory;

pub use config::{AgentConfig, SandboxSection};
pub use metrics::{RolloutMetrics, summarize};
pub use parse::{Parsed, ResponseParser};
pub use policy::{ByteTokenizer, Context, Message, Policy, Response, Tokenizer};
pub use prompt::{PromptBuilder, PromptTemplates, Role};
pub use rollout::{LoopLimits, RolloutConfig, RolloutRunner};
pub use trajectory::{Segment, TokenView, Trajectory, Turn, read_jsonl, visible, write_jsonl};

/// Validation seeds start here, as in the reference.
pub const EVAL_SEED_START: u64 = 123;
