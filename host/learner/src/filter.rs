//! StarPO-S's variance filter: train only on the groups (prompts) where the
//! policy is still uncertain.

/// Ranks groups by the standard deviation of their trajectory rewards and
/// keeps the top `ratio` of them (at least one). A group whose samples all
/// earned the same reward teaches nothing and is dropped first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RolloutFilter {
    /// Share of groups kept (`rollout_filter_ratio`, 0.25 in StarPO-S; 1.0
    /// keeps everything, as vanilla StarPO does).
    pub ratio: f64,
}

impl RolloutFilter {
    /// The kept groups' indices, ascending. `group_rewards[g]` holds group
    /// `g`'s trajectory rewards. Ties in std keep the lower group index, so
    /// the choice is deterministic.
    pub fn keep(&self, group_rewards: &[Vec<f32>]) -> Vec<usize> {
        let n = group_rewards.len();
        if n == 0 {
            return vec![];
        }
        let k = ((self.ratio * n as f64) as usize).clamp(1, n);
        let mut ranked: Vec<(usize, f32)> = group_rewards.iter().enumerate().map(|(g, r)| (g, std(r))).collect();
        // Highest std first; the sort is stable, so equal stds keep index order.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut kept: Vec<usize> = ranked.into_iter().take(k).map(|(g, _)| g).collect();
        kept.sort_unstable();
        kept
    }
}

/// Bessel-corrected standard deviation (torch's default, which the
/// reference uses); 0 for fewer than two values.
pub fn std(xs: &[f32]) -> f32 {
    if xs.len() < 2 {
        return 0.0;
    }
    let n = xs.len() as f32;
    let mean = xs.iter().sum::<f32>() / n;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / (n - 1.0)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_exactly_the_top_quarter_by_reward_std() {
        // 8 groups; stds: g3 and g6 are the two largest.
        let groups: Vec<Vec<f32>> = vec![
            vec![1.0, 1.0, 1.0, 1.0], // 0
            vec![0.0, 0.1, 0.0, 0.1], // small
            vec![0.0, 0.0, 0.0, 0.0], // 0
            vec![0.0, 10.0, 0.0, 10.0],
            vec![1.0, 2.0, 1.0, 2.0],
            vec![0.0, 0.0, 0.0, 0.5],
            vec![-5.0, 5.0, -5.0, 5.0],
            vec![3.0, 3.0, 3.0, 3.1],
        ];
        assert_eq!(RolloutFilter { ratio: 0.25 }.keep(&groups), [3, 6]);
        assert_eq!(RolloutFilter { ratio: 0.5 }.keep(&groups), [3, 4, 5, 6]);
        assert_eq!(RolloutFilter { ratio: 1.0 }.keep(&groups).len(), 8);
    }

    #[test]
    fn at_least_one_group_and_ties_keep_the_lower_index() {
        let flat = vec![vec![1.0, 1.0]; 4];
        assert_eq!(RolloutFilter { ratio: 0.1 }.keep(&flat), [0]);
        assert_eq!(RolloutFilter { ratio: 0.5 }.keep(&flat), [0, 1]);
    }

    #[test]
    fn std_is_bessel_corrected() {
        assert!((std(&[1.0, 3.0]) - 2f32.sqrt()).abs() < 1e-6);
        assert_eq!(std(&[4.0]), 0.0);
    }
}
