//! StarPO-S's variance filter and RAGEN-2's adaptive selection: train only
//! on the groups (prompts) where the policy is still uncertain.
//!
//! Each group is scored by the standard deviation of its trajectory
//! rewards (RAGEN's `reward_variance` metric, which is the std). Groups
//! are ranked by score, highest first (`largest`, the default) or lowest
//! first (`smallest`); ties keep the lower group index, so the choice is
//! deterministic. The strategies, as the reference implements them:
//!
//! * `top_k`: the first `max(1, ⌊value · groups⌋)` groups: StarPO-S keeps
//!   the top 25% (`value` 0.25, the paper's `rollout_filter_ratio`).
//! * `top_k_abs`: the first `max(1, ⌊value⌋)` groups.
//! * `top_p` (RAGEN-2, at 0.9): enough of the ranked groups to hold the
//!   share `value` of the total score. In the `linear` mode, groups are
//!   added while their sum is below `value · Σ scores − eps`, never adding a
//!   score of 0; nothing is kept when the sum cannot reach it (every group
//!   flat), and everything when `value` ≥ 1. In the `softmax` mode the
//!   shares are `softmax(scores)` and the smallest prefix whose mass reaches
//!   `value` is kept.
//! * `min_p`: every group scoring at least `value · max score` (`smallest`:
//!   at most `min score / value`).
//!
//! With `include_zero` off, groups that scored 0 (every sample earned the
//! same reward, so the group teaches nothing) are dropped before any
//! strategy runs. An empty selection skips the step's update.

use anyhow::{Result, bail};

/// Which groups a strategy keeps (`rollout_filter_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterStrategy {
    TopK,
    TopKAbs,
    /// `softmax` false: the `linear` share of the total score.
    TopP {
        softmax: bool,
    },
    MinP,
}

impl FilterStrategy {
    /// A strategy from its reference name and `rollout_filter_top_p_prob_mode`.
    pub fn parse(name: &str, prob_mode: &str) -> Result<Self> {
        let softmax = match prob_mode {
            "linear" => false,
            "softmax" => true,
            other => bail!("ppo.rollout_filter_top_p_prob_mode `{other}`: use \"linear\" or \"softmax\""),
        };
        Ok(match name {
            "top_k" => Self::TopK,
            "top_k_abs" => Self::TopKAbs,
            "top_p" => Self::TopP { softmax },
            "min_p" => Self::MinP,
            other => bail!("ppo.rollout_filter_strategy `{other}`: use \"top_k\", \"top_k_abs\", \"top_p\" or \"min_p\""),
        })
    }
}

/// The rollout filter's settings; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RolloutFilter {
    pub strategy: FilterStrategy,
    /// `rollout_filter_value` (`rollout_filter_ratio` for `top_k`): a
    /// share of the groups, a count, a share of the score, or a fraction of
    /// the best score, by strategy.
    pub value: f64,
    /// Rank the highest scores first (`rollout_filter_type = "largest"`).
    pub largest: bool,
    /// Let groups that scored 0 be selected (`rollout_filter_include_zero`).
    pub include_zero: bool,
    /// Slack on `top_p`'s linear target (`rollout_filter_selection_eps`).
    pub eps: f64,
}

impl RolloutFilter {
    /// StarPO-S's filter: the top `ratio` of the groups by reward std
    /// (at least one); 1.0 keeps everything.
    pub fn top_share(ratio: f64) -> Self {
        Self { strategy: FilterStrategy::TopK, value: ratio, largest: true, include_zero: true, eps: 0.01 }
    }

    /// Whether it keeps every group whatever their rewards.
    pub fn keeps_all(&self) -> bool {
        self.include_zero && self.value >= 1.0 && matches!(self.strategy, FilterStrategy::TopK | FilterStrategy::TopP { .. })
    }

    /// The kept groups' indices, ascending. `group_rewards[g]` holds group
    /// `g`'s trajectory rewards.
    pub fn keep(&self, group_rewards: &[Vec<f32>]) -> Vec<usize> {
        let scores: Vec<f64> = group_rewards.iter().map(|r| std(r) as f64).collect();
        self.keep_scores(&scores)
    }

    /// [`keep`](Self::keep) on the groups' scores.
    pub fn keep_scores(&self, scores: &[f64]) -> Vec<usize> {
        let candidates: Vec<usize> = (0..scores.len()).filter(|&g| self.include_zero || scores[g].abs() > 1e-10).collect();
        if candidates.is_empty() {
            return vec![];
        }
        // Ranked: best first under the type, ties by index (a stable sort).
        let mut ranked = candidates.clone();
        ranked.sort_by(|&a, &b| if self.largest { scores[b].total_cmp(&scores[a]) } else { scores[a].total_cmp(&scores[b]) });
        let mut kept: Vec<usize> = match self.strategy {
            FilterStrategy::TopK => ranked.into_iter().take(top_k(self.value * scores.len() as f64, candidates.len())).collect(),
            FilterStrategy::TopKAbs => ranked.into_iter().take(top_k(self.value, candidates.len())).collect(),
            FilterStrategy::TopP { softmax: false } => self.top_p_linear(scores, ranked),
            FilterStrategy::TopP { softmax: true } => self.top_p_softmax(scores, ranked),
            FilterStrategy::MinP => self.min_p(scores, candidates),
        };
        kept.sort_unstable();
        kept
    }

    /// Ranked groups while their scores sum below `value · Σ − eps`.
    fn top_p_linear(&self, scores: &[f64], ranked: Vec<usize>) -> Vec<usize> {
        if self.value >= 1.0 {
            return ranked;
        }
        // The reference ranks by the type but sums the scores as they are.
        let total: f64 = ranked.iter().map(|&g| scores[g]).sum();
        let target = self.value * total - self.eps;
        let (mut sum, mut count) = (0.0, 0);
        for &g in &ranked {
            if sum >= target || scores[g] <= 0.0 {
                break;
            }
            sum += scores[g];
            count += 1;
        }
        if sum >= target { ranked.into_iter().take(count).collect() } else { vec![] }
    }

    /// The shortest ranked prefix whose softmax mass reaches `value`.
    fn top_p_softmax(&self, scores: &[f64], ranked: Vec<usize>) -> Vec<usize> {
        let sign = if self.largest { 1.0 } else { -1.0 };
        let max = ranked.iter().map(|&g| sign * scores[g]).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = ranked.iter().map(|&g| (sign * scores[g] - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut mass = 0.0;
        let mut count = ranked.len();
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= self.value {
                count = i + 1;
                break;
            }
        }
        ranked.into_iter().take(count).collect()
    }

    /// Groups within `value` of the best score, as a fraction of it.
    fn min_p(&self, scores: &[f64], candidates: Vec<usize>) -> Vec<usize> {
        let best = candidates.iter().map(|&g| scores[g]);
        if self.largest {
            let max = best.fold(f64::NEG_INFINITY, f64::max);
            candidates.into_iter().filter(|&g| scores[g] >= self.value * max - 1e-10).collect()
        } else {
            let min = best.fold(f64::INFINITY, f64::min);
            candidates.into_iter().filter(|&g| scores[g] <= min / (self.value + 1e-10) + 1e-10).collect()
        }
    }
}

/// `⌊k⌋` groups, at least one, at most the `available` ones.
fn top_k(k: f64, available: usize) -> usize {
    (k.max(0.0) as usize).min(available).max(1)
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

    fn filter(strategy: FilterStrategy, value: f64) -> RolloutFilter {
        RolloutFilter { strategy, value, ..RolloutFilter::top_share(1.0) }
    }

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
        assert_eq!(RolloutFilter::top_share(0.25).keep(&groups), [3, 6]);
        assert_eq!(RolloutFilter::top_share(0.5).keep(&groups), [3, 4, 5, 6]);
        assert_eq!(RolloutFilter::top_share(1.0).keep(&groups).len(), 8);
    }

    #[test]
    fn at_least_one_group_and_ties_keep_the_lower_index() {
        let flat = vec![vec![1.0, 1.0]; 4];
        assert_eq!(RolloutFilter::top_share(0.1).keep(&flat), [0]);
        assert_eq!(RolloutFilter::top_share(0.5).keep(&flat), [0, 1]);
    }

    #[test]
    fn top_k_abs_keeps_a_count() {
        let scores = [0.5, 3.0, 1.0, 2.0];
        assert_eq!(filter(FilterStrategy::TopKAbs, 2.0).keep_scores(&scores), [1, 3]);
        assert_eq!(filter(FilterStrategy::TopKAbs, 0.0).keep_scores(&scores), [1], "at least one");
        assert_eq!(filter(FilterStrategy::TopKAbs, 9.0).keep_scores(&scores).len(), 4, "at most all");
        let smallest = RolloutFilter { largest: false, ..filter(FilterStrategy::TopKAbs, 2.0) };
        assert_eq!(smallest.keep_scores(&scores), [0, 2]);
    }

    #[test]
    fn top_p_linear_keeps_the_share_of_the_total_score() {
        // Total 10; 0.6 of it less eps is 5.99: 4 + 3 reach it, 4 alone does not.
        let scores = [4.0, 3.0, 2.0, 1.0];
        let linear = filter(FilterStrategy::TopP { softmax: false }, 0.6);
        assert_eq!(linear.keep_scores(&scores), [0, 1]);
        assert_eq!(RolloutFilter { value: 0.3, ..linear }.keep_scores(&scores), [0]);
        assert_eq!(RolloutFilter { value: 1.0, ..linear }.keep_scores(&scores).len(), 4, "1.0 keeps everything");
        // Flat groups hold no score to reach: nothing is kept.
        assert!(linear.keep_scores(&[0.0, 0.0, 0.0]).is_empty());
        // A zero score is never added; 0.9 of [5, 0, 0] is reached by the first.
        assert_eq!(RolloutFilter { value: 0.9, ..linear }.keep_scores(&[5.0, 0.0, 0.0]), [0]);
    }

    #[test]
    fn top_p_softmax_keeps_the_shortest_prefix_holding_the_mass() {
        let softmax = filter(FilterStrategy::TopP { softmax: true }, 0.6);
        // Equal scores: a third each, so two groups hold 0.6.
        assert_eq!(softmax.keep_scores(&[1.0, 1.0, 1.0]), [0, 1]);
        // One dominant score holds nearly all the mass.
        assert_eq!(softmax.keep_scores(&[0.0, 10.0, 0.0]), [1]);
    }

    #[test]
    fn min_p_keeps_the_groups_near_the_best() {
        let scores = [1.0, 4.0, 2.0, 3.0];
        assert_eq!(filter(FilterStrategy::MinP, 0.5).keep_scores(&scores), [1, 2, 3]);
        assert_eq!(filter(FilterStrategy::MinP, 1.0).keep_scores(&scores), [1]);
        let smallest = RolloutFilter { largest: false, ..filter(FilterStrategy::MinP, 0.5) };
        assert_eq!(smallest.keep_scores(&[1.0, 4.0, 1.9, 3.0]), [0, 2], "at most the lowest over 0.5");
        // As in the reference, the bound is min / (value + 1e-10): exactly 2 is just outside.
        assert_eq!(smallest.keep_scores(&scores), [0]);
    }

    #[test]
    fn without_zero_groups_nothing_flat_is_kept() {
        let scores = [0.0, 2.0, 0.0, 1.0];
        let excluding = RolloutFilter { include_zero: false, ..RolloutFilter::top_share(1.0) };
        assert_eq!(excluding.keep_scores(&scores), [1, 3]);
        assert!(excluding.keep_scores(&[0.0, 0.0]).is_empty());
        assert_eq!(RolloutFilter::top_share(1.0).keep_scores(&[0.0, 0.0]), [0, 1]);
        assert!(RolloutFilter::top_share(1.0).keeps_all() && !excluding.keeps_all());
    }

    #[test]
    fn strategies_are_read_by_their_reference_names() {
        assert_eq!(FilterStrategy::parse("top_p", "softmax").unwrap(), FilterStrategy::TopP { softmax: true });
        assert_eq!(FilterStrategy::parse("min_p", "linear").unwrap(), FilterStrategy::MinP);
        let err = FilterStrategy::parse("top-p", "linear").unwrap_err().to_string();
        assert!(err.contains("use \"top_k\", \"top_k_abs\", \"top_p\" or \"min_p\""), "{err}");
    }

    #[test]
    fn std_is_bessel_corrected() {
        assert!((std(&[1.0, 3.0]) - 2f32.sqrt()).abs() < 1e-6);
        assert_eq!(std(&[4.0]), 0.0);
    }
}
