//! `ragen-host eval`: play a policy on fixed seeds (256 from 123, one sample
//! each, as the reference evaluates) and report success against the
//! optimal policy's ceiling.

use crate::args::{Generation, Settings, default_threads};
use crate::oci::PluginSource;
use crate::output::{errln, print_report};
use crate::shipped::Twin;
use anyhow::{Context, Result, bail};
use ragen_agent::policies::{ORACLE_MISSING, OraclePolicy, RandomPolicy};
use ragen_agent::{AgentConfig, LoopLimits, LossBins, Policy, RolloutConfig, RolloutRunner, Trajectory, summarize, write_jsonl};
use ragen_runtime::EnvProvider;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Play a policy on fixed seeds (default: 256 seeds from 123, one
/// episode each, as the reference evaluates) and report success, return,
/// valid- and effective-action ratios, and the optimal policy's success
/// on the same seeds where this build knows the env (Sokoban: BFS;
/// FrozenLake: value iteration; Countdown: exact search; Bandit: always the
/// better arm).
#[derive(clap::Args)]
pub struct EvalCommand {
    /// The environment: a plugin's .wasm file,
    /// oci://registry/namespace/name:tag (or @sha256:…), or an OpenEnv
    /// server's ws://host:port (several joined by commas share the
    /// episodes; docs/remote.md). With
    /// --checkpoint it defaults to the plugin the run trained on (pinned
    /// by its digest when it came from a registry).
    #[arg(long, required_unless_present = "checkpoint")]
    env: Option<PluginSource>,
    /// `random` (uniform well-formed answers; envs with action names
    /// only) or `oracle` (the env's own best play, for plugins that export
    /// the contract's optional oracle, as the shipped ones do); ignored
    /// with --checkpoint or --model.
    #[arg(long, default_value = "random")]
    policy: String,
    /// Evaluate the policy trained in this run directory (at its
    /// validation temperature unless --temperature is given): its
    /// checkpoint-best/ (the best validation success) when it has one, else
    /// its latest checkpoint/. Name a checkpoint folder inside the run to
    /// pick one.
    #[arg(long, value_name = "DIR", conflicts_with = "model")]
    checkpoint: Option<PathBuf>,
    /// Evaluate a pretrained model: a GGUF file or a Hugging Face
    /// directory (`make model` fetches SmolLM2-135M-Instruct into
    /// target/models/). Its replies are free text, parsed as the
    /// reference parses them.
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    #[command(flatten)]
    generation: Generation,
    /// Turn thinking off: the reply is pre-filled with `<answer>` and
    /// the prompt asks for the answer only.
    #[arg(long)]
    no_think: bool,
    #[arg(long, default_value_t = 256)]
    episodes: usize,
    /// The first evaluation seed.
    #[arg(long, default_value_t = ragen_agent::EVAL_SEED_START)]
    seed_start: u64,
    /// Seed of the policy's own randomness.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A TOML file with [rollout], [prompt] and [env] sections (a training
    /// config works too: its other sections are ignored here).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Write every trajectory (full text, tokens, rewards) as JSON lines.
    #[arg(long, value_name = "FILE.jsonl")]
    trajectories: Option<PathBuf>,
    /// Worker threads for the env pool (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    settings: Settings,
}

impl EvalCommand {
    /// The agent config from --config or the checkpoint's run, then the
    /// evaluation.
    pub fn execute(self, access: &crate::oci::Access) -> Result<ExitCode> {
        let run = match &self.checkpoint {
            Some(path) => Some(ragen_learner::TrainConfig::load(&ragen_learner::find_checkpoint(path)?.0.config())?),
            None => None,
        };
        let (mut config, sampling) = match (&self.config, &run) {
            // A training config is a superset: its [rollout], [prompt], [env]
            // and a pretrained model's [sampling] apply.
            (Some(path), _) => {
                let c = ragen_learner::TrainConfig::load(path)?;
                (c.agent, Some(c.sampling))
            }
            // A trained policy is evaluated under the prompts and settings it trained with.
            (None, Some(run)) => (run.agent.clone(), None),
            (None, None) => (AgentConfig::default(), None),
        };
        let env = match (self.env, &run) {
            (Some(env), _) => env,
            (None, Some(run)) => PluginSource::of_run(&run.plugin)?,
            (None, None) => bail!("name the env with --env (a .wasm file, oci://… or a server's ws://host:port)"),
        };
        if self.no_think {
            config.rollout.enable_think = false;
        }
        let model = match self.model {
            Some(path) => {
                Some(ModelOptions { path, backend: self.generation.backend, sampling: self.generation.sampling(sampling.as_ref())? })
            }
            None => None,
        };
        let temperature = match &self.checkpoint {
            Some(_) => self.generation.checkpoint_temperature()?,
            None => None,
        };
        let opts = Options {
            env: env.provider(access, config.sandbox.limits()?)?,
            policy: self.policy,
            checkpoint: self.checkpoint,
            temperature,
            model,
            episodes: self.episodes,
            seed_start: self.seed_start,
            seed: self.seed,
            config,
            settings: self.settings.parse()?,
            threads: default_threads(self.threads),
            trajectories: self.trajectories,
        };
        print_report(&eval(opts)?, self.json, Report::to_text)?;
        Ok(ExitCode::SUCCESS)
    }
}

pub struct Options {
    /// Where the envs run: a plugin here, or a server.
    pub env: Arc<dyn EnvProvider>,
    pub policy: String,
    pub checkpoint: Option<PathBuf>,
    /// The trained policy's sampling temperature (`None`: its run's
    /// validation temperature).
    pub temperature: Option<f32>,
    /// A pretrained model plays instead (a GGUF file or a Hugging Face
    /// directory).
    pub model: Option<ModelOptions>,
    pub episodes: usize,
    pub seed_start: u64,
    pub seed: u64,
    pub config: AgentConfig,
    pub settings: Vec<(String, String)>,
    pub threads: usize,
    pub trajectories: Option<PathBuf>,
}

/// A pretrained model as the policy.
pub struct ModelOptions {
    pub path: PathBuf,
    pub backend: crate::backend::BackendChoice,
    pub sampling: ragen_llm::LlmSampling,
}

#[derive(Serialize)]
pub struct Report {
    pub plugin: String,
    pub policy: String,
    /// The checkpoint a trained policy was read from, with its step and
    /// validation success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    pub episodes: usize,
    pub seed_start: u64,
    pub limits: LoopLimits,
    pub success_rate: f64,
    pub return_mean: f64,
    pub return_std: f64,
    pub valid_action_ratio: f64,
    /// Share of replies in the expected format.
    pub format_valid_ratio: f64,
    /// Mean reply length in the policy's tokens.
    pub response_tokens_mean: f64,
    pub effective_action_ratio: f64,
    pub actions_mean: f64,
    pub turns_mean: f64,
    /// Success of the best possible play on the same seeds within the same
    /// action budget; `null` where no solver exists (the plugin has no
    /// native twin in this build: see `shipped`).
    pub optimal_success: Option<f64>,
    /// How the episodes that did not succeed (and no env failure cut
    /// short) ended: stuck, oscillating or other.
    pub lost: LossBins,
    pub failures: usize,
    /// Every episode an env failure cut short.
    pub failed: Vec<FailedEpisode>,
    /// What the env pool did to recover from the plugin's faults (the
    /// other episodes are replayed exactly, so the results stand).
    pub recoveries: ragen_runtime::Recoveries,
    #[serde(skip)]
    pub sample: Vec<Trajectory>,
}

/// One episode an env failure cut short.
#[derive(Serialize)]
pub struct FailedEpisode {
    pub env: usize,
    pub seed: u64,
    /// `trap`, `timeout`, `memory-cap`, `contract`, `invalid output`,
    /// `nondeterministic`, or the env error's kind.
    pub kind: String,
    pub message: String,
}

/// The policy the options name: a pretrained model, a trained checkpoint
/// (with which checkpoint it read), or a scripted policy.
fn make_policy(opts: &Options, plugin: &dyn EnvProvider, runner: &RolloutRunner) -> Result<(Box<dyn Policy>, Option<String>)> {
    if let Some(model) = &opts.model {
        let sampling = model.sampling;
        let seed = opts.seed;
        return crate::backend::with_backend!(inference model.backend, B, device => {
            let pretrained = crate::term::with_spinner(&format!("loading {}", model.path.display()), || {
                ragen_llm::Pretrained::<B>::load(&model.path, &device)
            })?;
            errln!("{}", super::chat::describe(&pretrained));
            Ok((Box::new(ragen_llm::LlmPolicy::new(pretrained, sampling, seed)) as Box<dyn Policy>, None))
        });
    }
    Ok(match (&opts.checkpoint, opts.policy.as_str()) {
        (Some(run), _) => {
            type B = burn::backend::Autodiff<burn::backend::Flex>;
            let (policy, _, read) = ragen_learner::load_trained::<B>(run, runner.spec(), Default::default(), opts.seed, opts.temperature)?;
            (policy, Some(read.to_string()))
        }
        (None, "random") if runner.spec().takes_text() => bail!("--policy random: {}", ragen_agent::policies::RANDOM_NEEDS_NAMES),
        (None, "random") => (Box::new(RandomPolicy::new(opts.seed)), None),
        (None, "oracle") if !plugin.has_oracle()? => bail!("--policy oracle: {ORACLE_MISSING}"),
        (None, "oracle") => (Box::new(OraclePolicy), None),
        (None, other) => bail!("unknown policy `{other}`; use `random` or `oracle`, --checkpoint DIR or --model PATH"),
    })
}

pub fn eval(opts: Options) -> Result<Report> {
    if opts.episodes == 0 {
        bail!("--episodes must be at least 1");
    }
    let settings = opts.config.env_settings(&opts.settings);
    // A plugin run here may have a native twin that bounds the best play.
    let twin = match opts.env.plugin() {
        Some(plugin) => {
            let mut inst = plugin.instantiate()?;
            let info = inst.info()?;
            match inst.create(&settings)? {
                Ok(env) => Twin::find(&info.name, &mut inst, env, &settings)?,
                Err(_) => None, // the runner below names the rejected settings
            }
        }
        None => None,
    };
    // Evaluation: one sample per seed.
    let rollout = RolloutConfig { env_groups: opts.episodes, group_size: 1, ..opts.config.rollout.clone() };
    let runner = RolloutRunner::new(opts.env.clone(), &settings, rollout, opts.config.prompt.clone(), opts.threads)?;
    let (mut policy, checkpoint) = make_policy(&opts, opts.env.as_ref(), &runner)?;
    let seeds: Vec<u64> = (0..opts.episodes as u64).map(|i| opts.seed_start + i).collect();
    let ts = runner.run(policy.as_mut(), &seeds)?;
    if let Some(path) = &opts.trajectories {
        write_trajectories(path, &ts)?;
    }
    let m = summarize(&ts);
    let limits = runner.limits();
    let bound = match twin {
        Some(twin) => Some(twin.optimal_success(&settings, &seeds, limits, runner.spec().limits.max_steps)?),
        None => None,
    };
    Ok(Report {
        plugin: runner.info().name.clone(),
        policy: policy.name().to_string(),
        checkpoint,
        episodes: opts.episodes,
        seed_start: opts.seed_start,
        limits,
        success_rate: m.success_rate,
        return_mean: m.return_mean,
        return_std: m.return_std,
        valid_action_ratio: m.valid_action_ratio,
        format_valid_ratio: m.format_valid_ratio,
        response_tokens_mean: m.response_tokens_mean,
        effective_action_ratio: m.effective_action_ratio,
        actions_mean: m.actions_mean,
        turns_mean: m.turns_mean,
        optimal_success: bound,
        lost: LossBins::of(&ts),
        failures: m.failures,
        failed: ts
            .iter()
            .filter_map(|t| {
                let message = t.failure.clone()?;
                Some(FailedEpisode { env: t.env, seed: t.seed, kind: t.failure_kind.clone().unwrap_or_default(), message })
            })
            .collect(),
        recoveries: runner.recoveries()?,
        sample: ts.into_iter().take(2).collect(),
    })
}

fn write_trajectories(path: &Path, ts: &[Trajectory]) -> Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("cannot create `{}`", path.display()))?);
    write_jsonl(&mut file, ts).with_context(|| format!("cannot write `{}`", path.display()))
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "eval {} with policy {}: {} episodes, seeds {}..{}\n",
            self.plugin,
            self.policy,
            self.episodes,
            self.seed_start,
            self.seed_start + self.episodes as u64
        );
        if let Some(c) = &self.checkpoint {
            s += &format!("  checkpoint   {}\n", crate::term::escape(c));
        }
        s += &format!("  success      {:.1}%", 100.0 * self.success_rate);
        match self.optimal_success {
            Some(b) => s += &format!("   (optimal play: {:.1}% within {} actions)\n", 100.0 * b, self.limits.max_actions_per_traj),
            None => s += "\n",
        }
        s += &format!("  return       {:.3} ± {:.3}\n", self.return_mean, self.return_std);
        s += &format!("  valid        {:.1}% of proposed actions\n", 100.0 * self.valid_action_ratio);
        s += &format!(
            "  format       {:.1}% of replies well-formed, {:.1} tokens a reply\n",
            100.0 * self.format_valid_ratio,
            self.response_tokens_mean
        );
        s += &format!("  effective    {:.1}% of executed actions\n", 100.0 * self.effective_action_ratio);
        s += &format!("  per episode  {:.2} actions in {:.2} turns\n", self.actions_mean, self.turns_mean);
        let LossBins { stuck, oscillating, other } = self.lost;
        if stuck + oscillating + other > 0 {
            s += &format!(
                "  lost         {} episodes: {stuck} stuck (the last three turns changed nothing), {oscillating} oscillating (A, B, A, B), {other} other\n",
                stuck + oscillating + other
            );
        }
        if self.failures > 0 {
            s += &format!("  failures     {} episodes cut short by env failures; the first:\n", self.failures);
            for f in self.failed.iter().take(3) {
                s += &format!("    seed {} ({}): {}\n", f.seed, f.kind, f.message);
            }
        }
        if self.recoveries.any() {
            s += &format!("  recovered    {}\n", self.recoveries);
        }
        if let Some(t) = self.sample.first() {
            s += &format!("\nA sample episode (seed {}):\n{}", t.seed, t.transcript());
        }
        s
    }
}
