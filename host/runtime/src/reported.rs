//! Bounds on what a plugin reports about itself. A plugin is a stranger's
//! code: every count it declares is something a consumer may allocate by
//! (a sampler's action table, a prompt, a tokenizer's vocabulary), and every
//! limit is a loop bound. [`PluginInstance::info`](crate::PluginInstance::info)
//! and [`spec`](crate::PluginInstance::spec) refuse an answer outside these
//! bounds, so no consumer has to check again. The rules themselves, these
//! bounds and the rest, are the spec checker's (the `spec_check` module);
//! here is the verdict the host loads by.

use crate::spec_check::Problem;
use crate::{EnvSpec, PluginInfo};

/// The largest self-description the host accepts. The defaults are far
/// above what any text environment needs and far below what would hurt.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportLimits {
    /// Bytes of any one name, version, description, action name, legend
    /// entry, metric name or config key field.
    pub max_text_bytes: usize,
    /// Bytes of the instructions.
    pub max_instructions_bytes: usize,
    /// Actions in the action list (at least one is required).
    pub max_actions: usize,
    /// Config keys, legend entries and metrics, each.
    pub max_entries: usize,
    /// Largest `max-bytes` of a text action space.
    pub max_text_action_bytes: u32,
    /// Highest accepted `max-turns`.
    pub max_turns: u32,
    /// Highest accepted `max-actions-per-turn`.
    pub max_actions_per_turn: u32,
    /// Highest accepted `max-actions-per-episode` and `max-steps`.
    pub max_actions_per_episode: u32,
    /// Largest reward magnitude of one step: beyond it, sums over a batch
    /// stop being meaningful (1e308 is finite; two of them are not).
    pub max_abs_reward: f64,
}

impl Default for ReportLimits {
    fn default() -> Self {
        Self {
            max_text_bytes: 1 << 10,
            max_instructions_bytes: 16 << 10,
            max_actions: 256,
            max_entries: 64,
            max_text_action_bytes: 64 << 10,
            max_turns: 1_000,
            max_actions_per_turn: 64,
            max_actions_per_episode: 100_000,
            max_abs_reward: 1e9,
        }
    }
}

impl ReportLimits {
    /// `info()`'s answer as the host takes it: `Err` naming every
    /// [`Severity::Error`](crate::Severity::Error) that
    /// [`info_problems`](Self::info_problems) finds (warnings load).
    pub fn check_info(&self, info: &PluginInfo) -> Result<(), String> {
        refusal(self.info_problems(info))
    }

    /// `spec()`'s answer as the host takes it: `Err` naming every
    /// [`Severity::Error`](crate::Severity::Error) that
    /// [`spec_problems`](Self::spec_problems) finds (warnings load).
    pub fn check_spec(&self, spec: &EnvSpec) -> Result<(), String> {
        refusal(self.spec_problems(spec))
    }
}

/// The errors among `problems`, joined, or `Ok` when there are none.
fn refusal(problems: Vec<Problem>) -> Result<(), String> {
    let errors: Vec<String> = problems.into_iter().filter(Problem::is_error).map(|p| p.message).collect();
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}
