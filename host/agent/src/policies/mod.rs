//! Policies that need no training: baselines, the env's own best play,
//! recorded replies, and test drivers for the loop.

mod oracle;
mod random;
mod replay;

pub use oracle::{ORACLE_MISSING, ORACLE_THOUGHT, OraclePolicy};
pub use random::{RANDOM_NEEDS_NAMES, RandomPolicy};
pub use replay::ReplayPolicy;

/// The reply a scripted policy sends to play `names`, after the pre-fill
/// (`<think>` or `<answer>`): well formed, with `thought` as its reasoning.
pub fn reply(prefill: &str, thought: &str, names: &[&str]) -> String {
    let answer = names.join(" || ");
    if prefill == "<think>" { format!("{thought}</think><answer>{answer}</answer>") } else { format!("{answer}</answer>") }
}
