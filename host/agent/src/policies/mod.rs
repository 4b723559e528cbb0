//! Policies that need no training: baselines and test drivers for the loop.

mod oracle;
mod random;

pub use oracle::{ORACLE_MISSING, ORACLE_THOUGHT, OraclePolicy};
pub use random::{RANDOM_NEEDS_NAMES, RandomPolicy};

/// The reply a scripted policy sends to play `names`, after the pre-fill
/// (`<think>` or `<answer>`): well formed, with `thought` as its reasoning.
pub fn reply(prefill: &str, thought: &str, names: &[&str]) -> String {
    let answer = names.join(" || ");
    if prefill == "<think>" { format!("{thought}</think><answer>{answer}</answer>") } else { format!("{answer}</answer>") }
}
