//! Env-side metrics of a batch of trajectories: what the Echo-Trap view and
//! the baselines read.

use crate::trajectory::Trajectory;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutMetrics {
    pub trajectories: usize,
    pub success_rate: f64,
    pub return_mean: f64,
    pub return_std: f64,
    /// Mean over groups of the standard deviation of rewards within a group
    /// (0 when every group's samples agree: nothing to learn from).
    pub in_group_reward_std: f64,
    pub valid_action_ratio: f64,
    /// Share of replies in the expected format (`<think>…</think><answer>…</answer>`,
    /// or the answer alone with thinking off), whatever their actions.
    pub format_valid_ratio: f64,
    pub effective_action_ratio: f64,
    pub actions_mean: f64,
    pub turns_mean: f64,
    /// Mean reply length in the policy's tokens.
    pub response_tokens_mean: f64,
    /// Mean length of the thinking, in characters, over well-formed replies
    /// with thinking on (0 without): a collapsing policy's thoughts shrink
    /// or repeat.
    pub think_chars_mean: f64,
    /// Trajectories cut short by an env failure.
    pub failures: usize,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Population standard deviation.
pub fn std(xs: &[f64]) -> f64 {
    let m = mean(xs.iter().copied());
    mean(xs.iter().map(|x| (x - m) * (x - m))).sqrt()
}

pub fn summarize(ts: &[Trajectory]) -> RolloutMetrics {
    let returns: Vec<f64> = ts.iter().map(|t| t.reward).collect();
    let groups = ts.iter().map(|t| t.group).max().map_or(0, |g| g + 1);
    let group_std = (0..groups).map(|g| {
        let rs: Vec<f64> = ts.iter().filter(|t| t.group == g).map(|t| t.reward).collect();
        std(&rs)
    });
    let replies = ts.iter().flat_map(|t| t.segments.iter().filter(|s| !s.tokens.is_empty()));
    RolloutMetrics {
        trajectories: ts.len(),
        success_rate: mean(ts.iter().map(|t| t.success as u8 as f64)),
        return_mean: mean(returns.iter().copied()),
        return_std: std(&returns),
        in_group_reward_std: mean(group_std),
        valid_action_ratio: mean(ts.iter().map(|t| t.valid_action_ratio)),
        format_valid_ratio: mean(ts.iter().flat_map(|t| t.turns.iter().map(|turn| turn.parsed.answer.is_some() as u8 as f64))),
        effective_action_ratio: mean(ts.iter().map(|t| t.effective_action_ratio)),
        actions_mean: mean(ts.iter().map(|t| t.num_actions as f64)),
        turns_mean: mean(ts.iter().map(|t| t.turns.len() as f64)),
        response_tokens_mean: mean(replies.map(|s| s.tokens.len() as f64)),
        think_chars_mean: mean(
            ts.iter().flat_map(|t| t.turns.iter().filter_map(|turn| turn.parsed.think.as_ref().map(|k| k.chars().count() as f64))),
        ),
        failures: ts.iter().filter(|t| t.failure.is_some()).count(),
    }
}
