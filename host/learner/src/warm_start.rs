//! The warm start: supervised steps on demonstrations before reinforcement
//! learning, in the same run (`[warm_start]`).
//!
//! Demonstrations are played through a rollout runner with the run's own
//! prompts, context window and limits, so the model imitates exactly the
//! contexts RL will show it: the env's oracle on fresh seeds each step, or
//! the replies of recorded trajectories replayed on their seeds (their
//! outcome is this env's, not the file's). Each is re-encoded in the
//! model's tokens ([`Trajectory::retokenized`]) and the learner takes one
//! imitation update ([`Learner::imitate`](crate::Learner::imitate)) on
//! them.

use crate::config::TrainConfig;
use anyhow::{Context, Result, bail};
use ragen_agent::policies::{ORACLE_MISSING, OraclePolicy, ReplayPolicy};
use ragen_agent::{RolloutConfig, RolloutRunner, Trajectory, read_jsonl};
use ragen_runtime::{EnvProvider, next_seed};
use std::path::Path;
use std::sync::Arc;

/// Where a run's demonstrations come from.
enum Source {
    /// The env's own best play, on fresh seeds each step.
    Oracle,
    /// Recorded trajectories, `episodes` a step, in file order, round robin.
    Recorded(Vec<Trajectory>),
}

/// What a run keeps for its warm-start steps.
pub(crate) struct WarmStart {
    source: Source,
    /// One env per demonstration of a step.
    runner: RolloutRunner,
    episodes: usize,
    pub(crate) successful_only: bool,
}

impl WarmStart {
    /// The warm start `config` asks for, or `None` without one. Fails when
    /// the plugin has no oracle to play, or the file cannot be read or
    /// holds no trajectory.
    pub(crate) fn open(plugin: Arc<dyn EnvProvider>, config: &TrainConfig, threads: usize) -> Result<Option<Self>> {
        let w = &config.warm_start;
        if w.is_off() {
            return Ok(None);
        }
        let source = match w.demonstrations.as_str() {
            "oracle" if !plugin.has_oracle()? => bail!("warm_start.demonstrations = \"oracle\": {ORACLE_MISSING}"),
            "oracle" => Source::Oracle,
            path => Source::Recorded(read_recorded(Path::new(path))?),
        };
        let rollout = RolloutConfig { env_groups: w.episodes, group_size: 1, ..config.agent.rollout.clone() };
        let runner = RolloutRunner::new(plugin, &config.agent.env_settings(&[]), rollout, config.agent.prompt.clone(), threads)?;
        Ok(Some(Self { source, runner, episodes: w.episodes, successful_only: w.successful_only }))
    }

    /// The demonstrations of warm-start step `step` of a run seeded with
    /// `seed`, as played here (in the demonstrator's tokens).
    /// What the demonstrations' env pool recovered from so far.
    pub(crate) fn recoveries(&self) -> Result<ragen_runtime::Recoveries> {
        self.runner.recoveries()
    }

    pub(crate) fn play(&self, seed: u64, step: u64) -> Result<Vec<Trajectory>> {
        match &self.source {
            Source::Oracle => {
                let base = next_seed(seed ^ 0x05f7_0a7c ^ step.wrapping_mul(0x9E37_79B9));
                let seeds: Vec<u64> = (0..self.episodes as u64).map(|i| next_seed(base ^ i)).collect();
                self.runner.run(&mut OraclePolicy, &seeds)
            }
            Source::Recorded(all) => {
                let first = step as usize * self.episodes;
                let picked: Vec<&Trajectory> = (0..self.episodes.min(all.len())).map(|i| &all[(first + i) % all.len()]).collect();
                let seeds: Vec<u64> = picked.iter().map(|t| t.seed).collect();
                let mut replay = ReplayPolicy::new(&picked, self.runner.prefill())?;
                self.runner.run(&mut replay, &seeds)
            }
        }
    }
}

/// Every trajectory of a JSON-lines file.
fn read_recorded(path: &Path) -> Result<Vec<Trajectory>> {
    let file = std::fs::File::open(path).with_context(|| {
        format!("warm_start.demonstrations: cannot open `{}` (use \"oracle\" or a file that `eval --trajectories` wrote)", path.display())
    })?;
    let all = read_jsonl(&mut std::io::BufReader::new(file)).with_context(|| format!("cannot read `{}`", path.display()))?;
    if all.is_empty() {
        bail!("`{}` holds no trajectory to learn from", path.display());
    }
    Ok(all)
}
