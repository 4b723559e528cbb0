//! `metrics.jsonl`: one [`StepMetrics`] a line, appended as a run goes and
//! read back by resume, the progress display, the dashboard and `compare`
//! through the one reader here.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    /// A warm-start step: supervised imitation of demonstrations (whose
    /// success, return and format are this line's rollout figures;
    /// `policy_loss` is their mean −log p per reply token).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm_start: bool,
    pub success: f64,
    pub return_mean: f64,
    /// Mean in-group reward std before and after the variance filter.
    pub reward_std_before_filter: f64,
    pub reward_std_after_filter: f64,
    pub groups_kept: usize,
    pub entropy: f32,
    pub grad_norm: f32,
    /// The critic's gradient norm when it is a network of its own
    /// (`[critic]`; 0 otherwise: the value head's gradient is part of
    /// `grad_norm`).
    #[serde(default)]
    pub critic_grad_norm: f32,
    pub policy_loss: f32,
    pub value_loss: f32,
    pub clip_fraction: f32,
    pub approx_kl: f32,
    /// KL to the frozen initial policy (0 unless `kl_coef` is set).
    #[serde(default)]
    pub kl_to_reference: f32,
    /// Trajectories of the update longer than the model's context (only
    /// their last `max_seq_len` tokens were trained on); raise
    /// `model.max_seq_len` if this is often above 0.
    #[serde(default)]
    pub truncated_trajectories: usize,
    /// The auxiliary next-observation loss (0 when it is off).
    #[serde(default)]
    pub world_model_loss: f32,
    /// The learning rate of this step's update (the schedule's).
    #[serde(default)]
    pub lr: f64,
    /// Groups this step played: `env_groups`, or more with dynamic
    /// sampling.
    #[serde(default)]
    pub groups_played: usize,
    /// The entropy bonus's weight in this step's update (its schedule's).
    #[serde(default)]
    pub entropy_coef: f64,
    /// AdamW steps this step took (`ppo_epochs` x mini-batches).
    #[serde(default)]
    pub optimizer_steps: usize,
    /// Episodes of this step's rollouts that an env failure cut short
    /// (trap, timeout, invalid output, a failed reset...).
    #[serde(default)]
    pub failed_episodes: usize,
    /// Episodes this step played (failed ones included).
    #[serde(default)]
    pub episodes: usize,
    /// The first of those failures, as the pool reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// Plugin instances the env pools rebuilt during this step (after a
    /// fault; the other envs' episodes are replayed exactly, so results
    /// stay right, but a plugin that needs it should be seen).
    #[serde(default)]
    pub env_recoveries: usize,
    /// This step's recoveries in words (rebuilt instances, batched calls
    /// run again, replayed episodes, batching turned off) and the first
    /// cause since the run started; absent when nothing was recovered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<String>,
    pub response_tokens: f64,
    /// Share of replies in the expected format, whatever their actions.
    #[serde(default)]
    pub format_valid_ratio: f64,
    /// Mean thinking length in characters (well-formed replies, thinking on).
    #[serde(default)]
    pub think_chars: f64,
    /// Tokens the update read per epoch (prompts and replies, every row).
    #[serde(default)]
    pub update_tokens: usize,
    /// Tokens of the prompts the rollout's replies read (a prefix shared
    /// by several prompts counts in each) and of the replies it wrote: over
    /// `rollout_seconds`, its throughput.
    #[serde(default)]
    pub rollout_prompt_tokens: u64,
    #[serde(default)]
    pub rollout_reply_tokens: u64,
    pub valid_action_ratio: f64,
    pub effective_action_ratio: f64,
    /// Validation success (`val_episodes` fixed seeds from
    /// `VAL_SEED_START`, apart from the eval seeds), on test steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_success: Option<f64>,
    /// Wall-clock seconds of this step's rollouts and update (not part of
    /// what a resumed run must reproduce).
    #[serde(default)]
    pub rollout_seconds: f64,
    #[serde(default)]
    pub update_seconds: f64,
    /// Set when the update was skipped (e.g. a non-finite gradient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Set when the Echo-Trap alarm fired at this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_alarm: Option<String>,
    /// RAGEN-2's template-collapse view of this step's rollouts: the
    /// entropy of the first replies' answers and their mutual information
    /// with the first state, in nats (`RolloutMetrics::answer_mi`).
    #[serde(default)]
    pub answer_entropy: f64,
    #[serde(default)]
    pub answer_mi: f64,
    /// Set when those rollouts look like a template collapse: different
    /// states get the same answer and the task is not solved
    /// (`RolloutMetrics::template_collapse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_collapse: Option<String>,
    /// The manifest digest of the env plugin, when it came from an OCI
    /// registry (the run's `[plugin] digest`): every line names the exact
    /// plugin it was measured on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_digest: Option<String>,
}

/// Every step recorded in a `metrics.jsonl`, in file order.
///
/// A line that does not parse is an error naming the file and the line,
/// except a last line with no newline after it: that is a write a crash or
/// a full disk cut short, and its step was never checkpointed, so it is
/// dropped (resuming replays that step).
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    let torn = !text.is_empty() && !text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(m) => out.push(m),
            Err(_) if torn && i + 1 == lines.len() => break,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("`{}` line {} is damaged; remove that line (or the file) to go on without it", path.display(), i + 1)
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: u64) -> String {
        let m =
            StepMetrics { step, success: 0.5, return_mean: 0.1, groups_kept: 2, optimizer_steps: 1, episodes: 8, ..StepMetrics::default() };
        serde_json::to_string(&m).unwrap()
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_a_damaged_one_is_named() {
        let dir = std::env::temp_dir().join(format!("ragen-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        std::fs::write(&path, format!("{}\n{}\n{}", line(0), line(1), &line(2)[..20])).unwrap();
        let steps: Vec<u64> = read_metrics(&path).unwrap().iter().map(|m| m.step).collect();
        assert_eq!(steps, [0, 1]);
        std::fs::write(&path, format!("{}\nnot json\n{}\n", line(0), line(2))).unwrap();
        let err = format!("{:#}", read_metrics(&path).unwrap_err());
        assert!(err.contains("line 2 is damaged"), "{err}");
        assert!(format!("{:#}", read_metrics(&dir.join("none.jsonl")).unwrap_err()).contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
