//! A training run: rollouts, the variance filter, updates, validation,
//! metrics and checkpoints (their format is [`crate::checkpoint`]'s),
//! resumable exactly.
//!
//! Everything random derives from `(seed, step)`: the group seeds of step
//! `s`, the policy's sampling stream at step `s`, the validation sampling.
//! So a run resumed from the checkpoint of step `s` continues as if it had
//! never stopped, and the same config and seed give the same metrics on the
//! same backend.

use crate::checkpoint::{self, BaseModel, CheckpointState, RunDir};
use crate::config::TrainConfig;
use crate::filter::{RolloutFilter, std};
use crate::metrics::{StepMetrics, read_metrics};
use crate::overlong::Overlong;
use crate::schedule::Schedule;
use crate::trainee::{Chat, Scratch, Trainee};
use crate::update::{Learner, Passes, UpdateStats};
use crate::warm_start::WarmStart;
use anyhow::{Context, Result, bail};
use ragen_agent::{Policy, RolloutConfig, RolloutMetrics, RolloutRunner, Trajectory, Usage, summarize};
use ragen_ops::TrainBackend;
use ragen_policy::PluginTokenizer;
use ragen_runtime::{EnvProvider, EnvSpec, Recoveries, next_seed};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Train on the envs of `plugin` (a plugin in this process or a server) with `config` into `out`, starting at the checkpoint there
/// if `resume`: the from-scratch transformer, or the pretrained model that
/// `model_path` names. `on_step` sees every step's metrics (for a progress
/// bar); `stop` ends the run after the current step, with a checkpoint.
pub fn train<B: TrainBackend>(
    plugin: Arc<dyn EnvProvider>,
    config: &TrainConfig,
    out: &Path,
    resume: bool,
    device: B::Device,
    stop: &AtomicBool,
    on_step: impl FnMut(&StepMetrics),
) -> Result<Vec<StepMetrics>> {
    match &config.model_path {
        None => {
            let run = Run::open(plugin, config, out, device, None, |spec, device| Scratch::build::<B>(config, spec, device))?;
            drive(run, resume, stop, on_step)
        }
        Some(path) => {
            let base = BaseModel::of(path)?;
            let run = Run::open(plugin, config, out, device, Some(base), |_, device| Chat::build::<B>(config, path, device))?;
            drive(run, resume, stop, on_step)
        }
    }
}

/// The steps of a run, from the start or its checkpoint, to the end or a stop.
fn drive<B: TrainBackend, T: Trainee<B>>(
    mut run: Run<'_, B, T>,
    resume: bool,
    stop: &AtomicBool,
    mut on_step: impl FnMut(&StepMetrics),
) -> Result<Vec<StepMetrics>> {
    let config = run.config;
    let start = if resume { run.resume()? } else { 0 };
    run.start_metrics_file()?;
    let mut skipped_in_a_row = 0;
    for step in start..config.total_steps() {
        let m = run.step(step)?;
        skipped_in_a_row = if m.skipped.is_some() { skipped_in_a_row + 1 } else { 0 };
        on_step(&m);
        let skipped = m.skipped.clone();
        let failing = (m.failed_episodes as f64 > config.max_failed_share * m.episodes as f64).then(|| {
            format!(
                "{} of {} episodes failed at step {step}, over max_failed_share = {}; the first: {}",
                m.failed_episodes,
                m.episodes,
                config.max_failed_share,
                m.first_failure.clone().unwrap_or_default()
            )
        });
        if let Some(v) = m.val_success
            && run.best.is_none_or(|best| v > best)
        {
            run.best = Some(v);
            checkpoint::save(&run.learner, &run.dir.best(), &run.state(step + 1, Some(v)))?;
        }
        run.history.push(m);

        let stopping = stop.load(Ordering::SeqCst);
        let last = step + 1 == config.total_steps();
        if (step + 1) % config.save_freq.max(1) == 0 || last || stopping || skipped_in_a_row >= 3 || failing.is_some() {
            checkpoint::save(&run.learner, &run.dir.checkpoint(), &run.state(step + 1, None))?;
        }
        if let Some(why) = failing {
            bail!(
                "{why}\nthe environment is failing, not the policy: check it with `ragen-host validate`; \
                 the run stopped with a checkpoint in `{}` (raise max_failed_share to train through failures)",
                run.dir.checkpoint().display()
            );
        }
        if stopping {
            break;
        }
        if skipped_in_a_row >= 3 {
            bail!(
                "three updates in a row were skipped ({}); the run stopped with a checkpoint of the last good model in `{}`",
                skipped.unwrap_or_default(),
                run.dir.checkpoint().display()
            );
        }
    }
    Ok(run.history)
}

/// What an RL step played: its trajectories, the rollout's token counts,
/// each group's rewards (indexed by the trajectories' `group`), and the
/// groups the variance filter chooses from.
struct Played {
    trajectories: Vec<Trajectory>,
    usage: Usage,
    group_rewards: Vec<Vec<f32>>,
    candidates: Vec<usize>,
}

/// A run in progress: what [`train`] keeps between steps.
struct Run<'c, B: TrainBackend, T: Trainee<B>> {
    config: &'c TrainConfig,
    dir: RunDir,
    /// Holds `dir` for this run (see [`RunDir::lock`]).
    _lock: std::fs::File,
    runner: RolloutRunner,
    val_runner: RolloutRunner,
    /// The warm start's demonstrations, when the config has one.
    warm: Option<WarmStart>,
    /// The warm start's imitation rate.
    warm_lr: f64,
    learner: Learner<B, T::Net>,
    trainee: T,
    /// The pretrained model it builds on, pinned by hash.
    base: Option<BaseModel>,
    filter: RolloutFilter,
    schedule: Schedule,
    entropy_schedule: Schedule,
    /// With DAPO's dynamic sampling: the most batches of groups a step
    /// plays to fill its batch with informative groups.
    dynamic_sampling: Option<usize>,
    overlong: Option<Overlong>,
    /// What the env pools had recovered from at the end of the last step.
    recovered: Recoveries,
    /// The best validation success so far (what `checkpoint-best/` holds).
    best: Option<f64>,
    alarm: CollapseAlarm,
    history: Vec<StepMetrics>,
    metrics_file: Option<std::fs::File>,
    device: B::Device,
}

impl<'c, B: TrainBackend, T: Trainee<B>> Run<'c, B, T> {
    /// The run directory, the training and validation rollout runners, and
    /// the trainee and its learner from `build`, seeded from the config.
    fn open(
        plugin: Arc<dyn EnvProvider>,
        config: &'c TrainConfig,
        out: &Path,
        device: B::Device,
        base: Option<BaseModel>,
        build: impl FnOnce(&EnvSpec, B::Device) -> Result<(T, Learner<B, T::Net>)>,
    ) -> Result<Self> {
        let resolved = config.resolve()?;
        std::fs::create_dir_all(out).with_context(|| format!("cannot create the run directory `{}`", out.display()))?;
        let lock = RunDir(out.to_path_buf()).lock()?;
        let settings = config.agent.env_settings(&[]);
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let rollout = &config.agent.rollout;
        let runner = RolloutRunner::new(plugin.clone(), &settings, rollout.clone(), config.agent.prompt.clone(), threads)?;
        let warm = WarmStart::open(plugin.clone(), config, threads)?;
        let val_rollout = RolloutConfig { env_groups: config.val_episodes.max(1), group_size: 1, ..rollout.clone() };
        let val_runner = RolloutRunner::new(plugin, &settings, val_rollout, config.agent.prompt.clone(), threads)?;
        B::seed(&device, config.seed);
        let (trainee, learner) = build(runner.spec(), device.clone())?;
        Ok(Self {
            config,
            dir: RunDir(out.to_path_buf()),
            _lock: lock,
            runner,
            val_runner,
            warm,
            warm_lr: resolved.warm_lr,
            learner,
            trainee,
            base,
            filter: resolved.filter,
            schedule: resolved.schedule,
            entropy_schedule: resolved.entropy_schedule,
            dynamic_sampling: resolved.dynamic_sampling,
            overlong: resolved.overlong,
            recovered: Recoveries::default(),
            best: None,
            alarm: CollapseAlarm::default(),
            history: Vec::new(),
            metrics_file: None,
            device,
        })
    }

    /// Load the checkpoint and the metrics of the steps it covers; returns
    /// the first step still to run.
    fn resume(&mut self) -> Result<u64> {
        let resumed = checkpoint::resume(&self.dir, &mut self.learner, self.base.as_ref())?;
        self.best = resumed.best;
        if self.dir.metrics().exists() {
            self.history = read_metrics(&self.dir.metrics())?.into_iter().filter(|m| m.step < resumed.step).collect();
        }
        for m in &self.history {
            self.alarm.check(m.reward_std_before_filter, m.entropy, m.success);
        }
        Ok(resumed.step)
    }

    /// Write `config.toml`, and `metrics.jsonl` anew with the steps already
    /// run (a resumed run's).
    fn start_metrics_file(&mut self) -> Result<()> {
        std::fs::write(self.dir.config(), self.config.to_toml()).context("cannot write config.toml")?;
        let lines = self.history.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        self.metrics_file = Some(self.dir.restart_metrics(&lines)?);
        Ok(())
    }

    /// One step (a warm-start step while the warm start lasts, then
    /// reinforcement learning), validation when due, the collapse alarm,
    /// and its line of `metrics.jsonl`.
    fn step(&mut self, step: u64) -> Result<StepMetrics> {
        let config = self.config;
        let warm_steps = config.warm_start.steps;
        let mut m = if step < warm_steps { self.warm_step(step)? } else { self.rl_step(step, step - warm_steps)? };
        let due = (step + 1).is_multiple_of(config.test_freq.max(1)) || step + 1 == config.total_steps() || step == 0;
        // The warm start's last step is validated too: the warm start
        // alone, against which RL's own gain is read.
        if due || step + 1 == warm_steps {
            m.val_success = Some(self.validate()?);
        }
        if !m.warm_start {
            m.collapse_alarm = self.alarm.check(m.reward_std_before_filter, m.entropy, m.success);
        }
        // The pools' counts since the last step's reading (nothing runs
        // them between steps).
        let now = self.recoveries()?;
        let recovered = now.since(&self.recovered);
        self.recovered = now;
        m.env_recoveries = recovered.rebuilt_instances;
        m.recovered = recovered.any().then(|| recovered.to_string());
        let file = self.metrics_file.as_mut().expect("the metrics file is open");
        // On disk before the step is reported: a crash or a power cut
        // loses no line that was shown.
        writeln!(file, "{}", serde_json::to_string(&m)?).context("cannot append to metrics.jsonl")?;
        file.sync_data().context("cannot append to metrics.jsonl")?;
        Ok(m)
    }

    /// What the run's env pools (training, validation, demonstrations)
    /// recovered from since the run started.
    fn recoveries(&self) -> Result<Recoveries> {
        let mut all = self.runner.recoveries()?;
        all.add(&self.val_runner.recoveries()?);
        if let Some(warm) = &self.warm {
            all.add(&warm.recoveries()?);
        }
        Ok(all)
    }

    /// A step of reinforcement learning (the `rl_step`-th): rollouts, the
    /// variance filter and the StarPO update.
    fn rl_step(&mut self, step: u64, rl_step: u64) -> Result<StepMetrics> {
        let clock = std::time::Instant::now();
        let Played { trajectories: ts, usage, group_rewards, candidates } = self.play(step)?;
        let rollout_seconds = clock.elapsed().as_secs_f64();

        let candidate_rewards: Vec<Vec<f32>> = candidates.iter().map(|&g| group_rewards[g].clone()).collect();
        let kept: Vec<usize> = self.filter.keep(&candidate_rewards).into_iter().map(|i| candidates[i]).collect();
        let batch: Vec<&Trajectory> = ts.iter().filter(|t| kept.contains(&t.group)).collect();
        let std_after = kept.iter().map(|&g| std(&group_rewards[g]) as f64).sum::<f64>() / kept.len().max(1) as f64;
        let std_before = group_rewards.iter().map(|r| std(r) as f64).sum::<f64>() / group_rewards.len().max(1) as f64;

        let lr = self.schedule.at(rl_step);
        self.learner.set_lr(lr);
        let entropy_coef = self.entropy_schedule.at(rl_step);
        self.learner.set_entropy_coef(entropy_coef);
        let clock = std::time::Instant::now();
        let (stats, skipped) = match self.learner.update(&batch, self.trainee.tokenizer()) {
            Ok(s) => (s, None),
            Err(e) => (UpdateStats::default(), Some(format!("{e:#}"))),
        };
        let seconds = [rollout_seconds, clock.elapsed().as_secs_f64()];
        Ok(StepMetrics {
            reward_std_before_filter: std_before,
            reward_std_after_filter: std_after,
            groups_kept: kept.len(),
            skipped,
            rollout_prompt_tokens: usage.prompt_tokens,
            rollout_reply_tokens: usage.reply_tokens,
            groups_played: group_rewards.len(),
            entropy_coef,
            ..self.step_metrics(step, &ts, &stats, lr, seconds)
        })
    }

    /// The rollouts of RL step `step` and the groups the variance filter
    /// chooses from. Without dynamic sampling: one batch of `env_groups`
    /// groups, every one a candidate. With it (DAPO): groups whose rewards
    /// are all equal teach nothing, so further batches of `env_groups` new
    /// groups are played, up to `max_num_gen_batches` in all, until
    /// `env_groups` groups with some spread are in hand; those (the first
    /// `env_groups` of them) are the candidates. Groups are numbered across
    /// batches, and every trajectory played counts in the step's success
    /// and rewards. With DAPO's overlong shaping on, the rewards are the
    /// shaped ones from here on.
    fn play(&self, step: u64) -> Result<Played> {
        let config = self.config;
        let n = config.agent.rollout.env_groups;
        let group_size = config.agent.rollout.group_size;
        let mut policy = self.policy(config.sampling.temperature, next_seed(config.seed ^ (step << 32)));
        let informative = |rewards: &Vec<f32>| std(rewards) > 0.0;
        let (mut trajectories, mut group_rewards) = (Vec::new(), Vec::new());
        for b in 0..self.dynamic_sampling.unwrap_or(1) {
            // Seeds depend on the group's index alone, so batch `b` plays
            // groups `b·n ..` of the step's sequence: new rooms each time.
            let seeds = group_seeds(config.seed, step, n * (b + 1));
            let mut batch = self.runner.run(policy.as_mut(), &seeds[n * b..])?;
            if let Some(overlong) = &self.overlong {
                batch.iter_mut().for_each(|t| overlong.shape(t));
            }
            group_rewards.extend((0..n).map(|g| batch.iter().filter(|t| t.group == g).map(|t| t.reward as f32).collect()));
            trajectories.extend(batch.into_iter().map(|mut t| {
                t.group += n * b;
                t.env += n * group_size * b;
                t
            }));
            if group_rewards.iter().filter(|r| informative(r)).count() >= n {
                break;
            }
        }
        let candidates = match self.dynamic_sampling {
            None => (0..n).collect(),
            Some(_) => (0..group_rewards.len()).filter(|&g| informative(&group_rewards[g])).take(n).collect(),
        };
        Ok(Played { trajectories, usage: policy.usage(), group_rewards, candidates })
    }

    /// A warm-start step: this step's demonstrations, re-encoded in the
    /// model's tokens, and one imitation update on those kept (the
    /// successful ones, unless `successful_only` is off). `groups_kept`
    /// counts the demonstrations imitated.
    fn warm_step(&mut self, step: u64) -> Result<StepMetrics> {
        let warm = self.warm.as_ref().expect("a run with warm-start steps has a warm start");
        let passes = Passes { epochs: self.config.warm_start.epochs, mini_batch_size: self.config.warm_start.mini_batch_size };
        let clock = std::time::Instant::now();
        let ts = warm.play(self.config.seed, step)?;
        let rollout_seconds = clock.elapsed().as_secs_f64();
        // In the model's tokens, so the line's reply lengths are too.
        let tokenizer = self.trainee.tokenizer();
        let ts: Vec<Trajectory> = ts.iter().map(|t| t.retokenized(tokenizer)).collect();
        let batch: Vec<&Trajectory> = ts.iter().filter(|t| t.failure.is_none() && (t.success || !warm.successful_only)).collect();
        self.learner.set_lr(self.warm_lr);
        let clock = std::time::Instant::now();
        let kept = batch.len();
        let (stats, skipped) = match batch.is_empty() {
            true => (UpdateStats::default(), Some("no demonstration of this step succeeded; nothing to imitate".to_string())),
            false => match self.learner.imitate(&batch, tokenizer, passes) {
                Ok(s) => (s, None),
                Err(e) => (UpdateStats::default(), Some(format!("{e:#}"))),
            },
        };
        let seconds = [rollout_seconds, clock.elapsed().as_secs_f64()];
        Ok(StepMetrics {
            warm_start: true,
            groups_kept: kept,
            skipped,
            template_collapse: None,
            ..self.step_metrics(step, &ts, &stats, self.warm_lr, seconds)
        })
    }

    /// The metrics every step reports: its rollouts' figures, the update's
    /// statistics, the rate, and `[rollout, update]` seconds.
    fn step_metrics(&self, step: u64, ts: &[Trajectory], stats: &UpdateStats, lr: f64, seconds: [f64; 2]) -> StepMetrics {
        let before: RolloutMetrics = summarize(ts);
        StepMetrics {
            step,
            success: before.success_rate,
            return_mean: before.return_mean,
            entropy: stats.entropy,
            grad_norm: stats.grad_norm,
            critic_grad_norm: stats.critic_grad_norm,
            policy_loss: stats.policy_loss,
            value_loss: stats.value_loss,
            clip_fraction: stats.clip_fraction,
            approx_kl: stats.approx_kl,
            kl_to_reference: stats.kl_to_reference,
            truncated_trajectories: stats.truncated,
            optimizer_steps: stats.optimizer_steps,
            lr,
            world_model_loss: stats.world_model_loss,
            failed_episodes: before.failures,
            episodes: ts.len(),
            first_failure: ts.iter().find_map(|t| t.failure.clone()),
            response_tokens: before.response_tokens_mean,
            format_valid_ratio: before.format_valid_ratio,
            think_chars: before.think_chars_mean,
            update_tokens: stats.row_tokens,
            valid_action_ratio: before.valid_action_ratio,
            effective_action_ratio: before.effective_action_ratio,
            rollout_seconds: seconds[0],
            update_seconds: seconds[1],
            plugin_digest: self.config.plugin.digest.clone(),
            answer_entropy: before.answer_entropy,
            answer_mi: before.answer_mi,
            template_collapse: before.template_collapse(),
            ..StepMetrics::default()
        }
    }

    /// The policy the learner's current model gives, sampling at
    /// `temperature` from `seed`.
    fn policy(&self, temperature: f64, seed: u64) -> Box<dyn Policy + '_> {
        self.trainee.policy(self.learner.policy_model(), temperature as f32, seed, &self.device)
    }

    /// What a checkpoint after `step` steps records besides the weights.
    fn state(&self, step: u64, val_success: Option<f64>) -> CheckpointState {
        CheckpointState { step, val_success, base_model: self.base.clone(), files: Default::default() }
    }

    /// Success on the validation seeds (from `VAL_SEED_START`, apart from
    /// the eval seeds), at the validation temperature. Every validation draws with the
    /// same sampling seed (the run's), so checkpoints are compared on the
    /// same envs and the same random numbers, and `ragen-host eval
    /// --checkpoint DIR --seed-start 1000000 --episodes <val_episodes>
    /// --seed <seed>` replays one exactly.
    fn validate(&self) -> Result<f64> {
        let mut policy = self.policy(self.config.sampling.val_temperature, self.config.seed);
        let seeds = ragen_agent::validation_seeds(self.config.val_episodes.max(1));
        Ok(summarize(&self.val_runner.run(policy.as_mut(), &seeds)?).success_rate)
    }
}

/// The tokenizer, grammar, model and learner a config describes for an env
/// (freshly initialised; training and evaluation share this).
pub fn build_learner<B: TrainBackend>(
    config: &TrainConfig,
    spec: &ragen_runtime::EnvSpec,
    device: B::Device,
) -> Result<(Learner<B>, PluginTokenizer)> {
    let (scratch, learner) = Scratch::build::<B>(config, spec, device)?;
    Ok((learner, scratch.tokenizer))
}
