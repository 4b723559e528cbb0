//! Advantage estimators.

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
}
