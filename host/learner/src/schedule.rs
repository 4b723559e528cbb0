//! A value over the training steps of a run: the learning rate, and the
//! entropy coefficient on a schedule of its own. A linear warm-up, then
//! constant, linear or cosine decay to `min_ratio · peak` at the last step,
//! as verl's `lr_scheduler_type`, `lr_warmup_steps` and `min_lr_ratio` (and
//! `entropy_coeff_scheduler_type`, `min_entropy_coeff_ratio`).
//!
//! The value changes once per training step (one rollout batch and its
//! update), not per optimizer step, as verl steps its scheduler once per
//! `update_policy`; every mini-batch of a step uses that step's value.
//!
//! # Examples
//!
//! ```
//! use ragen_learner::{Decay, Schedule};
//!
//! // A learning rate over 100 steps, 10 of warm-up, cosine down to a tenth.
//! let s = Schedule { peak: 1e-3, decay: Decay::Cosine, warmup_steps: 10, min_ratio: 0.1, total_steps: 100 };
//! assert!((s.at(0) - 1e-4).abs() < 1e-12); // warm-up: (0 + 1) / 10 of the peak
//! assert!((s.at(10) - 1e-3).abs() < 1e-12); // the peak, right after warm-up
//! assert!((s.at(99) - 1e-4).abs() < 1e-12); // the floor, at the last step
//! ```

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// How the value falls after warm-up (`ppo.lr_scheduler_type`,
/// `ppo.entropy_coeff_scheduler_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decay {
    /// The peak throughout (the reference's default).
    #[default]
    Constant,
    /// A straight line from the peak to the floor.
    Linear,
    /// Half a cosine from the peak to the floor.
    Cosine,
}

/// A value (the learning rate, the entropy coefficient) at every training
/// step of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// The value after warm-up (`ppo.lr`, `ppo.entropy_coeff`).
    pub peak: f64,
    pub decay: Decay,
    /// Steps of linear warm-up from `peak / warmup_steps` to `peak`; 0 starts at the peak.
    pub warmup_steps: u64,
    /// The value at the last step, as a share of the peak (decays only).
    pub min_ratio: f64,
    /// Steps in the run (the config's `steps`).
    pub total_steps: u64,
}

impl Schedule {
    /// A constant value.
    pub fn constant(value: f64) -> Self {
        Self { peak: value, decay: Decay::Constant, warmup_steps: 0, min_ratio: 0.0, total_steps: 1 }
    }

    /// Refuse settings that make no schedule: a floor outside `[0, 1]` or
    /// a warm-up as long as the run. `ratio_key` and `warmup_key` name the
    /// config keys that set them, for the message.
    pub fn check(&self, ratio_key: &str, warmup_key: &str) -> Result<()> {
        if !(0.0..=1.0).contains(&self.min_ratio) {
            bail!("ppo.{ratio_key} {}: use a share of the peak value in [0, 1]", self.min_ratio);
        }
        if self.warmup_steps >= self.total_steps && self.warmup_steps > 0 {
            bail!(
                "ppo.{warmup_key} {} is not below steps ({}): the run would end before the warm-up does; lower it",
                self.warmup_steps,
                self.total_steps
            );
        }
        Ok(())
    }

    /// The value at training step `step` (counted from 0).
    pub fn at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        // Progress through the decay: 0 right after warm-up, 1 at the last step.
        let span = self.total_steps.saturating_sub(self.warmup_steps + 1);
        let progress = if span == 0 { 1.0 } else { ((step - self.warmup_steps) as f64 / span as f64).min(1.0) };
        let floor = self.min_ratio;
        let share = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => 1.0 - (1.0 - floor) * progress,
            Decay::Cosine => floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        self.peak * share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn warm_up_then_each_decay_at_chosen_steps() {
        // 11 steps, 2 of warm-up: decay runs over steps 2..=10 (8 intervals).
        let s = |decay| Schedule { peak: 1.0, decay, warmup_steps: 2, min_ratio: 0.2, total_steps: 11 };
        for decay in [Decay::Constant, Decay::Linear, Decay::Cosine] {
            close(s(decay).at(0), 0.5);
            close(s(decay).at(1), 1.0);
            close(s(decay).at(2), 1.0);
        }
        close(s(Decay::Constant).at(10), 1.0);
        // Linear: halfway (step 6) is 1 − 0.8 · 0.5 = 0.6; the end is the floor.
        close(s(Decay::Linear).at(6), 0.6);
        close(s(Decay::Linear).at(10), 0.2);
        // Cosine: halfway is the mean of peak and floor; a quarter in
        // (step 4) is 0.2 + 0.8 · (1 + cos(π/4)) / 2.
        close(s(Decay::Cosine).at(6), 0.6);
        close(s(Decay::Cosine).at(4), 0.2 + 0.4 * (1.0 + std::f64::consts::FRAC_1_SQRT_2));
        close(s(Decay::Cosine).at(10), 0.2);
        // Past the end (a run extended on resume) it stays at the floor.
        close(s(Decay::Linear).at(50), 0.2);
        close(Schedule::constant(3e-4).at(7), 3e-4);
    }

    #[test]
    fn settings_that_make_no_schedule_are_named() {
        let ok = Schedule { peak: 1e-3, decay: Decay::Cosine, warmup_steps: 5, min_ratio: 0.0, total_steps: 10 };
        ok.check("min_lr_ratio", "lr_warmup_steps").unwrap();
        let err = |s: Schedule| s.check("min_lr_ratio", "lr_warmup_steps").unwrap_err().to_string();
        assert!(err(Schedule { warmup_steps: 10, ..ok }).contains("ppo.lr_warmup_steps 10"));
        assert!(err(Schedule { min_ratio: 1.5, ..ok }).contains("ppo.min_lr_ratio 1.5"));
        assert!(err(Schedule { min_ratio: -0.1, ..ok }).contains("min_lr_ratio"));
    }
}
