//! Advantage estimators, and the choice between them.
//!
//! [`Estimator`] is the one place that knows which estimators exist: adding
//! one means a variant, its name in [`Estimator::parse`], and its arm in
//! [`Estimator::estimate`], all in this file.

use anyhow::{Result, bail};

/// Where advantages come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    /// PPO with the critic: GAE over agent tokens.
    Gae,
    /// GRPO: group-normalised trajectory rewards, no critic.
    Grpo,
}

/// What an estimator reads of one sequence of the batch. A trajectory is one
/// sequence, or with a context window one per reply; a trajectory's
/// sequences are adjacent and share `trajectory`.
#[derive(Clone, Copy, Debug)]
pub struct SequenceInput<'a> {
    /// Which trajectory of the batch the sequence belongs to.
    pub trajectory: usize,
    /// The trajectory's group (members share a seed).
    pub group: usize,
    /// The trajectory's reward (format penalties included).
    pub reward: f32,
    /// The critic's values at the sequence's agent tokens, before the update.
    pub values: &'a [f32],
}

impl Estimator {
    /// The config name (`ppo.adv_estimator`) of an estimator.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "gae" => Self::Gae,
            "grpo" => Self::Grpo,
            other => bail!("ppo.adv_estimator `{other}`: use `gae` (PPO with a critic) or `grpo`"),
        })
    }

    /// Whether the critic's value loss is part of the objective.
    pub fn uses_critic(self) -> bool {
        match self {
            Self::Gae => true,
            Self::Grpo => false,
        }
    }

    /// Advantages and returns per agent token of each sequence.
    ///
    /// GAE's advantages are whitened over the batch's agent tokens, as
    /// verl does; GRPO's are not (they are normalised within groups
    /// already, and verl leaves them so). Returns are never whitened: they
    /// are the critic's regression target.
    pub fn estimate(self, sequences: &[SequenceInput<'_>], gamma: f32, lambda: f32) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let (mut advantages, mut returns) = (Vec::with_capacity(sequences.len()), Vec::with_capacity(sequences.len()));
        let trajectories = sequences.chunk_by(|a, b| a.trajectory == b.trajectory);
        match self {
            Self::Gae => {
                // Over all of a trajectory's agent tokens, across its
                // sequences, with the reward on the last one.
                for trajectory in trajectories {
                    let values: Vec<f32> = trajectory.iter().flat_map(|s| s.values.iter().copied()).collect();
                    let mut rewards = vec![0.0; values.len()];
                    if let Some(last) = rewards.last_mut() {
                        *last = trajectory[0].reward;
                    }
                    let (a, ret) = gae(&rewards, &values, gamma, lambda);
                    let mut at = 0;
                    for s in trajectory {
                        advantages.push(a[at..at + s.values.len()].to_vec());
                        returns.push(ret[at..at + s.values.len()].to_vec());
                        at += s.values.len();
                    }
                }
                whiten(&mut advantages);
            }
            Self::Grpo => {
                // Group statistics count each trajectory once, however many
                // sequences (replies, under a context window) it was cut
                // into; every sequence then takes its trajectory's value.
                let trajectories: Vec<&[SequenceInput<'_>]> = trajectories.collect();
                let rewards: Vec<f32> = trajectories.iter().map(|t| t[0].reward).collect();
                let groups: Vec<usize> = trajectories.iter().map(|t| t[0].group).collect();
                for (a, trajectory) in grpo(&rewards, &groups, 1e-6).into_iter().zip(trajectories) {
                    for s in trajectory {
                        advantages.push(vec![a; s.values.len()]);
                        returns.push(vec![s.reward; s.values.len()]);
                    }
                }
            }
        }
        (advantages, returns)
    }
}

/// Shift and scale every token's advantage to mean 0 and std 1 over the
/// batch.
fn whiten(advantages: &mut [Vec<f32>]) {
    let n = advantages.iter().map(Vec::len).sum::<usize>() as f32;
    if n == 0.0 {
        return;
    }
    let mean = advantages.iter().flatten().sum::<f32>() / n;
    let std = (advantages.iter().flatten().map(|a| (a - mean).powi(2)).sum::<f32>() / n).sqrt();
    for a in advantages.iter_mut().flatten() {
        *a = (*a - mean) / (std + 1e-8);
    }
}

/// Generalised advantage estimation over one trajectory's agent tokens.
///
/// `rewards[t]` is the reward after token `t` (StarPO puts the whole
/// trajectory reward on the last agent token, zero elsewhere) and
/// `values[t]` the critic's estimate before it; the value after the last
/// token is 0 (the episode is over). Returns `(advantages, returns)` with
/// `returns = advantages + values`, the critic's regression target.
///
/// `δ_t = r_t + γ V_{t+1} − V_t`, `A_t = δ_t + γλ A_{t+1}`.
/// With γ = λ = 1 (the reference's defaults) `A_t = R − V_t`.
pub fn gae(rewards: &[f32], values: &[f32], gamma: f32, lambda: f32) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(rewards.len(), values.len(), "one reward and one value per token");
    let n = rewards.len();
    let mut advantages = vec![0.0; n];
    let mut next_advantage = 0.0;
    for t in (0..n).rev() {
        let next_value = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next_value - values[t];
        next_advantage = delta + gamma * lambda * next_advantage;
        advantages[t] = next_advantage;
    }
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    (advantages, returns)
}

/// GRPO's group-normalised outcome advantages: each trajectory's reward
/// minus its group's mean, over the group's standard deviation (Bessel-
/// corrected, as in verl, plus `eps`). A group of one gets advantage equal
/// to its reward (mean 0, std 1, as verl does). `groups[i]` names the group
/// of `rewards[i]`.
pub fn grpo(rewards: &[f32], groups: &[usize], eps: f32) -> Vec<f32> {
    assert_eq!(rewards.len(), groups.len());
    let mut out = vec![0.0; rewards.len()];
    let max_group = groups.iter().copied().max().map_or(0, |g| g + 1);
    for g in 0..max_group {
        let members: Vec<usize> = (0..rewards.len()).filter(|&i| groups[i] == g).collect();
        let (mean, std) = if members.len() < 2 {
            (0.0, 1.0)
        } else {
            let n = members.len() as f32;
            let mean = members.iter().map(|&i| rewards[i]).sum::<f32>() / n;
            let var = members.iter().map(|&i| (rewards[i] - mean).powi(2)).sum::<f32>() / (n - 1.0);
            (mean, var.sqrt())
        };
        for &i in &members {
            out[i] = (rewards[i] - mean) / (std + eps);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn gae_with_gamma_and_lambda_one_is_reward_minus_value() {
        let (adv, ret) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.2, 0.4], 1.0, 1.0);
        close(&adv, &[0.5, 0.8, 0.6]);
        close(&ret, &[1.0, 1.0, 1.0]);
    }

    #[test]
    fn gae_by_hand_with_discounting() {
        // γ = 0.9, λ = 0.5, rewards [0, 2], values [1, 0.5]:
        // δ1 = 2 + 0 − 0.5 = 1.5;           A1 = 1.5
        // δ0 = 0 + 0.9·0.5 − 1 = −0.55;     A0 = −0.55 + 0.45·1.5 = 0.125
        let (adv, ret) = gae(&[0.0, 2.0], &[1.0, 0.5], 0.9, 0.5);
        close(&adv, &[0.125, 1.5]);
        close(&ret, &[1.125, 2.0]);
    }

    #[test]
    fn grpo_normalises_within_groups() {
        // Group 0: rewards 1, 3 (mean 2, sample std √2); group 1: 5, 5, 5 (std 0).
        let adv = grpo(&[1.0, 3.0, 5.0, 5.0, 5.0], &[0, 0, 1, 1, 1], 1e-6);
        let s = 2f32.sqrt() + 1e-6;
        close(&adv, &[-1.0 / s, 1.0 / s, 0.0, 0.0, 0.0]);
        // A group of one keeps its reward.
        close(&grpo(&[0.7], &[0], 1e-6), &[0.7 / (1.0 + 1e-6)]);
    }

    #[test]
    fn gae_runs_across_a_trajectorys_sequences_and_the_result_is_whitened() {
        // Trajectory 0 read two windows (values 0.5 | 0.2, 0.4), trajectory 1 one.
        let seqs = [
            SequenceInput { trajectory: 0, group: 0, reward: 1.0, values: &[0.5] },
            SequenceInput { trajectory: 0, group: 0, reward: 1.0, values: &[0.2, 0.4] },
            SequenceInput { trajectory: 1, group: 0, reward: 0.0, values: &[0.3] },
        ];
        let (adv, ret) = Estimator::Gae.estimate(&seqs, 1.0, 1.0);
        // Raw advantages R − V: [0.5 | 0.8, 0.6 | −0.3]; returns R.
        assert_eq!(ret, vec![vec![1.0], vec![1.0, 1.0], vec![0.0]]);
        let raw = [0.5f32, 0.8, 0.6, -0.3];
        let mean = raw.iter().sum::<f32>() / 4.0;
        let std = (raw.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / 4.0).sqrt();
        let flat: Vec<f32> = adv.concat();
        close(&flat, &raw.map(|a| (a - mean) / (std + 1e-8)));
        assert!(Estimator::Gae.uses_critic() && !Estimator::Grpo.uses_critic());
        assert!(Estimator::parse("vtrace").unwrap_err().to_string().contains("gae"));
        assert_eq!(Estimator::parse("grpo").unwrap(), Estimator::Grpo);
    }

    #[test]
    fn grpo_counts_each_trajectory_once_under_a_context_window_and_is_not_whitened_again() {
        // Group 0: trajectory 0 (reward 1) was cut into three replies,
        // trajectory 1 (reward 0) into one. Per trajectory: mean 0.5,
        // sample std √0.5, so advantages ±0.5/√0.5 = ±√0.5. Counted per
        // reply (the old bug) the mean would be 0.75.
        // Group 1: trajectories 2 and 3 both reward 2: advantage 0.
        let v = [0.0f32; 2];
        let seq = |trajectory, group, reward| SequenceInput { trajectory, group, reward, values: &v };
        let seqs = [seq(0, 0, 1.0), seq(0, 0, 1.0), seq(0, 0, 1.0), seq(1, 0, 0.0), seq(2, 1, 2.0), seq(3, 1, 2.0)];
        let (adv, ret) = Estimator::Grpo.estimate(&seqs, 1.0, 1.0);
        let a = 0.5 / (0.5f32.sqrt() + 1e-6);
        let expected = [a, a, a, -a, 0.0, 0.0];
        for (got, want) in adv.iter().zip(expected) {
            close(got, &[want, want]);
        }
        // Returns are the rewards (no critic reads them).
        assert_eq!(ret[3], vec![0.0, 0.0]);
        assert_eq!(ret[4], vec![2.0, 2.0]);
    }
}
