//! A training run: rollouts, the variance filter, updates, validation,
//! metrics and checkpoints, resumable exactly.
//!
//! Everything random derives from `(seed, step)`: the group seeds of step
//! `s`, the policy's sampling stream at step `s`, the validation sampling.
//! So a run resumed from the checkpoint of step `s` continues as if it had
//! never stopped, and the same config and seed give the same metrics on the
//! same backend.

use crate::config::TrainConfig;
use crate::filter::{RolloutFilter, std};
use crate::update::{Learner, UpdateStats};
use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use ragen_agent::{RolloutConfig, RolloutRunner, Trajectory, summarize};
use ragen_policy::{AnswerGrammar, BurnPolicy, PluginTokenizer, PolicyModelConfig, SamplingConfig};
use ragen_runtime::{Plugin, next_seed};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    pub success: f64,
    pub return_mean: f64,
    /// Mean in-group reward std before and after the variance filter.
    pub reward_std_before_filter: f64,
    pub reward_std_after_filter: f64,
    pub groups_kept: usize,
    pub entropy: f32,
    pub grad_norm: f32,
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
    /// AdamW steps this step took (`ppo_epochs` x mini-batches).
    #[serde(default)]
    pub optimizer_steps: usize,
    pub response_tokens: f64,
    pub valid_action_ratio: f64,
    pub effective_action_ratio: f64,
    /// Validation success (256 fixed seeds from 123 by default), on test steps.
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
}

/// What the checkpoint remembers besides the weights.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CheckpointState {
    /// Steps completed.
    step: u64,
}

/// Files of a run directory.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn config(&self) -> PathBuf {
        self.0.join("config.toml")
    }
    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.jsonl")
    }
    pub fn checkpoint(&self) -> PathBuf {
        self.0.join("checkpoint")
    }
}

/// The group seeds of a step: a deterministic stream from the run seed.
fn group_seeds(seed: u64, step: u64, groups: usize) -> Vec<u64> {
    (0..groups as u64).map(|g| next_seed(next_seed(seed ^ step.wrapping_mul(0x9E37_79B9)) ^ g)).collect()
}

/// Warns when reward spread and entropy fall together while success drops:
/// the Echo Trap's early signature.
#[derive(Default)]
struct CollapseAlarm {
    history: Vec<(f64, f32, f64)>,
}

impl CollapseAlarm {
    const WINDOW: usize = 5;

    fn check(&mut self, reward_std: f64, entropy: f32, success: f64) -> Option<String> {
        self.history.push((reward_std, entropy, success));
        let n = self.history.len();
        if n < 2 * Self::WINDOW {
            return None;
        }
        let mean = |r: std::ops::Range<usize>, f: &dyn Fn(&(f64, f32, f64)) -> f64| {
            self.history[r.clone()].iter().map(f).sum::<f64>() / r.len() as f64
        };
        let (old, new) = (n - 2 * Self::WINDOW..n - Self::WINDOW, n - Self::WINDOW..n);
        let std_drop = mean(new.clone(), &|h| h.0) < 0.7 * mean(old.clone(), &|h| h.0);
        let ent_drop = mean(new.clone(), &|h| h.1 as f64) < 0.7 * mean(old.clone(), &|h| h.1 as f64);
        let success_drop = mean(new, &|h| h.2) < mean(old, &|h| h.2) - 0.05;
        (std_drop && ent_drop && success_drop).then(|| {
            "reward std and entropy fell by over 30% in 5 steps while success dropped: the Echo Trap; \
             consider a lower lr, a smaller rollout_filter_ratio or an earlier checkpoint"
                .to_string()
        })
    }
}

/// Train `plugin` with `config` into `out`, starting at the checkpoint there
/// if `resume`. `on_step` sees every step's metrics (for a progress bar);
/// `stop` ends the run after the current step, with a checkpoint.
pub fn train<B: AutodiffBackend>(
    plugin: Arc<Plugin>,
    config: &TrainConfig,
    out: &Path,
    resume: bool,
    device: B::Device,
    stop: &AtomicBool,
    mut on_step: impl FnMut(&StepMetrics),
) -> Result<Vec<StepMetrics>> {
    let resolved = config.resolve()?;
    let dir = RunDir(out.to_path_buf());
    std::fs::create_dir_all(out).with_context(|| format!("cannot create the run directory `{}`", out.display()))?;
    let settings = config.agent.env_settings(&[]);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let runner = RolloutRunner::new(plugin.clone(), &settings, config.agent.rollout.clone(), config.agent.prompt.clone(), threads)?;
    let val_rollout = RolloutConfig { env_groups: config.val_episodes.max(1), group_size: 1, ..config.agent.rollout.clone() };
    let val_runner = RolloutRunner::new(plugin, &settings, val_rollout, config.agent.prompt.clone(), threads)?;
    let limits = runner.limits();
    let think = config.agent.rollout.enable_think;
    B::seed(&device, config.seed);
    let (mut learner, tokenizer) = build_learner::<B>(config, runner.spec(), device.clone())?;

    let mut history: Vec<StepMetrics> = Vec::new();
    let mut start = 0;
    if resume {
        let state: CheckpointState = serde_json::from_str(
            &std::fs::read_to_string(dir.checkpoint().join("state.json"))
                .with_context(|| format!("no checkpoint to resume in `{}`", out.display()))?,
        )
        .context("the checkpoint's state.json is damaged")?;
        learner.load(&dir.checkpoint())?;
        start = state.step;
        // Keep the metrics of the steps the checkpoint covers.
        if let Ok(text) = std::fs::read_to_string(dir.metrics()) {
            history = text.lines().filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok()).filter(|m| m.step < start).collect();
        }
    }
    std::fs::write(dir.config(), config.to_toml()).context("cannot write config.toml")?;
    let mut metrics_file = std::fs::File::create(dir.metrics()).context("cannot write metrics.jsonl")?;
    for m in &history {
        writeln!(metrics_file, "{}", serde_json::to_string(m)?)?;
    }

    let filter = RolloutFilter { ratio: resolved.rollout_filter_ratio };
    let mut alarm = CollapseAlarm::default();
    for m in &history {
        alarm.check(m.reward_std_before_filter, m.entropy, m.success);
    }
    let sampling = SamplingConfig { temperature: config.sampling.temperature as f32, think_budget: config.sampling.think_budget };
    let mut skipped_in_a_row = 0;
    for step in start..config.steps {
        let seed = next_seed(config.seed ^ (step << 32));
        let mut policy =
            BurnPolicy::new(learner.policy_model(), tokenizer.clone(), think, limits.max_actions_per_turn, sampling, seed, device.clone());
        let groups = group_seeds(config.seed, step, config.agent.rollout.env_groups);
        let clock = std::time::Instant::now();
        let ts = runner.run(&mut policy, &groups)?;
        let rollout_seconds = clock.elapsed().as_secs_f64();
        let before = summarize(&ts);

        let group_rewards: Vec<Vec<f32>> =
            (0..groups.len()).map(|g| ts.iter().filter(|t| t.group == g).map(|t| t.reward as f32).collect()).collect();
        let kept = filter.keep(&group_rewards);
        let batch: Vec<&Trajectory> = ts.iter().filter(|t| kept.contains(&t.group)).collect();
        let std_after = kept.iter().map(|&g| std(&group_rewards[g]) as f64).sum::<f64>() / kept.len().max(1) as f64;
        let std_before = group_rewards.iter().map(|r| std(r) as f64).sum::<f64>() / group_rewards.len().max(1) as f64;

        let clock = std::time::Instant::now();
        let update = learner.update(&batch, &tokenizer);
        let update_seconds = clock.elapsed().as_secs_f64();
        let (stats, skipped) = match update {
            Ok(s) => {
                skipped_in_a_row = 0;
                (s, None)
            }
            Err(e) => {
                skipped_in_a_row += 1;
                (UpdateStats::default(), Some(format!("{e:#}")))
            }
        };

        let last = step + 1 == config.steps;
        let val_success = if (step + 1) % config.test_freq.max(1) == 0 || last || step == 0 {
            let val_sampling = SamplingConfig { temperature: config.sampling.val_temperature as f32, ..sampling };
            let mut val_policy = BurnPolicy::new(
                learner.policy_model(),
                tokenizer.clone(),
                think,
                limits.max_actions_per_turn,
                val_sampling,
                seed ^ 1,
                device.clone(),
            );
            let seeds: Vec<u64> = (0..config.val_episodes.max(1) as u64).map(|i| ragen_agent::EVAL_SEED_START + i).collect();
            Some(summarize(&val_runner.run(&mut val_policy, &seeds)?).success_rate)
        } else {
            None
        };

        let mut m = StepMetrics {
            step,
            success: before.success_rate,
            return_mean: before.return_mean,
            reward_std_before_filter: std_before,
            reward_std_after_filter: std_after,
            groups_kept: kept.len(),
            entropy: stats.entropy,
            grad_norm: stats.grad_norm,
            policy_loss: stats.policy_loss,
            value_loss: stats.value_loss,
            clip_fraction: stats.clip_fraction,
            approx_kl: stats.approx_kl,
            kl_to_reference: stats.kl_to_reference,
            truncated_trajectories: stats.truncated,
            optimizer_steps: stats.optimizer_steps,
            world_model_loss: stats.world_model_loss,
            response_tokens: before.response_tokens_mean,
            valid_action_ratio: before.valid_action_ratio,
            effective_action_ratio: before.effective_action_ratio,
            val_success,
            rollout_seconds,
            update_seconds,
            skipped,
            collapse_alarm: None,
        };
        m.collapse_alarm = alarm.check(m.reward_std_before_filter, m.entropy, m.success);
        writeln!(metrics_file, "{}", serde_json::to_string(&m)?).context("cannot append to metrics.jsonl")?;
        metrics_file.flush()?;
        on_step(&m);
        history.push(m);

        let stopping = stop.load(Ordering::SeqCst);
        if (step + 1) % config.save_freq.max(1) == 0 || last || stopping {
            save_checkpoint(&learner, &dir, step + 1)?;
        }
        if stopping {
            break;
        }
        if skipped_in_a_row >= 3 {
            save_checkpoint(&learner, &dir, step + 1)?;
            bail!(
                "three updates in a row were skipped ({}); the run stopped with a checkpoint of the last good model in `{}`",
                history.last().and_then(|m| m.skipped.clone()).unwrap_or_default(),
                dir.checkpoint().display()
            );
        }
    }
    Ok(history)
}

/// Write the checkpoint beside the old one, then swap, so a crash or a full
/// disk mid-write never leaves a damaged checkpoint in place.
fn save_checkpoint<B: AutodiffBackend>(learner: &Learner<B>, dir: &RunDir, step: u64) -> Result<()> {
    let target = dir.checkpoint();
    let tmp = dir.0.join("checkpoint.tmp");
    let old = dir.0.join("checkpoint.old");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).context("cannot create checkpoint.tmp")?;
    learner.save(&tmp)?;
    std::fs::write(tmp.join("state.json"), serde_json::to_string(&CheckpointState { step })?).context("cannot write state.json")?;
    let _ = std::fs::remove_dir_all(&old);
    if target.exists() {
        std::fs::rename(&target, &old).context("cannot move the previous checkpoint aside")?;
    }
    std::fs::rename(&tmp, &target).context("cannot put the new checkpoint in place")?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// The tokenizer, grammar, model and learner a config describes for an env
/// (freshly initialised; training and evaluation share this).
pub fn build_learner<B: AutodiffBackend>(
    config: &TrainConfig,
    spec: &ragen_runtime::EnvSpec,
    device: B::Device,
) -> Result<(Learner<B>, PluginTokenizer)> {
    let resolved = config.resolve()?;
    let tokenizer = PluginTokenizer::with_text(spec, &config.agent.prompt.texts());
    let limits = config.agent.rollout.limits(spec);
    let grammar =
        AnswerGrammar::new(&tokenizer, config.agent.rollout.enable_think, config.sampling.think_budget, limits.max_actions_per_turn);
    let m = &config.model;
    let model = PolicyModelConfig::new(tokenizer.vocab_size())
        .with_d_model(m.d_model)
        .with_n_layers(m.n_layers)
        .with_n_heads(m.n_heads)
        .with_max_seq_len(m.max_seq_len)
        .with_rotary(m.positions == crate::config::Positions::Rotary)
        .init::<B>(&device);
    Ok((Learner::new(model, grammar, resolved.update, device), tokenizer))
}

/// Load a trained policy from a run directory for evaluation.
pub fn load_policy<B: AutodiffBackend>(
    run: &Path,
    spec: &ragen_runtime::EnvSpec,
    device: B::Device,
) -> Result<(TrainConfig, Learner<B>, PluginTokenizer)> {
    let dir = RunDir(run.to_path_buf());
    let config = TrainConfig::load(&dir.config())?;
    let (mut learner, tokenizer) = build_learner::<B>(&config, spec, device)?;
    learner.load(&dir.checkpoint())?;
    Ok((config, learner, tokenizer))
}
