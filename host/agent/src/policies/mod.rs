//! Policies that need no training: baselines and test drivers for the loop.

mod random;
mod sokoban_solver;

pub use random::RandomPolicy;
pub use sokoban_solver::SokobanSolverPolicy;

/// The reply text for `names`, after the pre-fill.
pub(crate) fn reply(prefill: &str, thought: &str, names: &[&str]) -> String {
    let answer = names.join(" || ");
    if prefill == "<think>" { format!("{thought}</think><answer>{answer}</answer>") } else { format!("{answer}</answer>") }
}
