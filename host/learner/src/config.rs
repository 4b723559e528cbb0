//! A training run's configuration: a preset (`algo`) and every key of it
//! overridable, named as in RAGEN where one exists.

use crate::advantages::{Anchor, Estimator, Gigpo};
use crate::filter::{FilterStrategy, RolloutFilter};
use crate::loss::{Clip, LossAgg};
use crate::overlong::Overlong;
use crate::schedule::{Decay, Schedule};
use crate::update::UpdateConfig;
use anyhow::{Context, Result};
use ragen_agent::AgentConfig;
use ragen_llm::LoraConfig;
use ragen_policy::PolicyModelConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The three algorithms the paper compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algo {
    /// PPO with a critic, decoupled clip 0.2/0.28, no KL, top-25% variance filter.
    StarpoS,
    /// Vanilla StarPO: PPO with a critic, symmetric clip 0.2, KL 0.001, no filter.
    Starpo,
    /// Critic-free GRPO (StarPO's other variant), symmetric clip, no filter.
    Grpo,
}

/// How the model knows where a token sits (`[model] positions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// An embedding per absolute position.
    Learned,
    /// RoPE ([`PolicyModelConfig::rotary`]).
    Rotary,
}

/// `[model]` in a config file: the keys of Burn's own [`PolicyModelConfig`],
/// each optional (absent takes that config's default), unknown keys
/// refused. `vocab_size` is not a key: the tokenizer built from the plugin
/// decides it. `positions = "rotary" | "learned"` stands for its `rotary`.
mod model_keys {
    use super::Positions;
    use ragen_policy::PolicyModelConfig;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Keys {
        d_model: Option<usize>,
        n_layers: Option<usize>,
        n_heads: Option<usize>,
        mlp_ratio: Option<usize>,
        max_seq_len: Option<usize>,
        positions: Option<Positions>,
    }

    pub fn serialize<S: Serializer>(c: &PolicyModelConfig, s: S) -> Result<S::Ok, S::Error> {
        Keys {
            d_model: Some(c.d_model),
            n_layers: Some(c.n_layers),
            n_heads: Some(c.n_heads),
            mlp_ratio: Some(c.mlp_ratio),
            max_seq_len: Some(c.max_seq_len),
            positions: Some(if c.rotary { Positions::Rotary } else { Positions::Learned }),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PolicyModelConfig, D::Error> {
        let k = Keys::deserialize(d)?;
        let base = PolicyModelConfig::new(0);
        Ok(PolicyModelConfig {
            vocab_size: 0,
            d_model: k.d_model.unwrap_or(base.d_model),
            n_layers: k.n_layers.unwrap_or(base.n_layers),
            n_heads: k.n_heads.unwrap_or(base.n_heads),
            mlp_ratio: k.mlp_ratio.unwrap_or(base.mlp_ratio),
            max_seq_len: k.max_seq_len.unwrap_or(base.max_seq_len),
            rotary: k.positions.map_or(base.rotary, |p| p == Positions::Rotary),
        })
    }
}

/// `[sampling]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSection {
    /// Rollout temperature (the reference's 1.0).
    pub temperature: f64,
    /// Validation temperature (the reference's 0.5).
    pub val_temperature: f64,
    /// Thinking tokens before `</think>` is forced (the from-scratch
    /// model's grammar; a pretrained model thinks freely).
    pub think_budget: u32,
    /// The longest reply of a pretrained model, in tokens (RAGEN's
    /// per-turn response length); a reply cut here has no `</answer>` and
    /// pays the format penalty.
    pub max_new_tokens: usize,
    /// Replies a pretrained model writes at once (larger batches read the
    /// weights fewer times per token). When one finishes, a waiting prompt
    /// takes its slot; the prefix all of a turn's prompts share, and a
    /// group's identical first prompts, are read once.
    pub batch: usize,
}

impl Default for SamplingSection {
    fn default() -> Self {
        Self { temperature: 1.0, val_temperature: 0.5, think_budget: 16, max_new_tokens: 200, batch: 64 }
    }
}

/// `[ppo]`: overrides of the preset, key by key (absent = the preset's).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoSection {
    /// `gae` (the preset's, with a critic), `grpo`, `dr_grpo`, `rloo`,
    /// `reinforce_plus_plus` or `gigpo`; see the advantages module.
    pub adv_estimator: Option<String>,
    /// GiGPO's weight of the step-level advantage (verl-agent's
    /// `step_advantage_w`, 1).
    pub step_advantage_w: Option<f32>,
    /// GiGPO's normalisation: `mean_norm` (the default) or `mean_std_norm`.
    pub gigpo_mode: Option<String>,
    /// What makes GiGPO's anchor states equal: `observation` (the default,
    /// verl-agent's) or `observation_and_time` (and the actions taken
    /// before it).
    pub gigpo_anchor: Option<String>,
    /// DAPO's dynamic sampling (verl's `filter_groups`): drop groups whose
    /// rewards are all equal and play more groups until `env_groups`
    /// informative ones are in hand (off by default).
    pub dynamic_sampling: Option<bool>,
    /// With dynamic sampling, the most batches of `env_groups` groups a
    /// step plays (verl's name; 4 by default).
    pub max_num_gen_batches: Option<usize>,
    /// DAPO's overlong shaping: the last tokens before
    /// `sampling.max_new_tokens` over which a reply's penalty grows
    /// (verl's `overlong_buffer.len`; absent: off). See the overlong module.
    pub overlong_buffer_len: Option<usize>,
    /// The overlong penalty at the limit (verl's
    /// `overlong_buffer.penalty_factor`; 1 by default).
    pub overlong_penalty_factor: Option<f64>,
    /// How the policy's per-token terms add up over a mini-batch:
    /// `token-mean` (the default), `seq-mean-token-sum` or
    /// `seq-mean-token-mean` (verl's names).
    pub loss_agg_mode: Option<String>,
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    pub entropy_coeff: Option<f64>,
    pub kl_coef: Option<f64>,
    pub value_coef: Option<f64>,
    pub cliprange_value: Option<f64>,
    pub gamma: Option<f32>,
    pub lam: Option<f32>,
    pub grad_clip: Option<f64>,
    pub lr: Option<f64>,
    /// `constant` (default), `linear` or `cosine` decay after warm-up.
    pub lr_scheduler_type: Option<Decay>,
    /// Training steps of linear warm-up (0 by default).
    pub lr_warmup_steps: Option<u64>,
    /// Where a decay ends, as a share of `lr` (0 by default).
    pub min_lr_ratio: Option<f64>,
    /// How `entropy_coeff` changes over the run: `constant` (default),
    /// `linear` or `cosine` decay to `min_entropy_coeff_ratio ·
    /// entropy_coeff` at the last step (exploration first, then less).
    pub entropy_coeff_scheduler_type: Option<Decay>,
    /// Where the entropy coefficient's decay ends, as a share of it (0).
    pub min_entropy_coeff_ratio: Option<f64>,
    pub weight_decay: Option<f32>,
    /// The share of groups `top_k` keeps (StarPO-S: 0.25); RAGEN's older
    /// name for `rollout_filter_value`.
    pub rollout_filter_ratio: Option<f64>,
    /// Which groups the rollout filter keeps: `top_k` (the preset's),
    /// `top_k_abs`, `top_p` (RAGEN-2's, at 0.9) or `min_p`; see the filter
    /// module for each rule.
    pub rollout_filter_strategy: Option<String>,
    /// The strategy's value (absent: `rollout_filter_ratio`, else the
    /// preset's share).
    pub rollout_filter_value: Option<f64>,
    /// `largest` (the default: the most uncertain groups) or `smallest`.
    pub rollout_filter_type: Option<String>,
    /// Whether groups whose rewards are all equal may be kept (true).
    pub rollout_filter_include_zero: Option<bool>,
    /// `top_p`'s shares: `linear` (default) or `softmax`.
    pub rollout_filter_top_p_prob_mode: Option<String>,
    /// Slack on `top_p`'s linear target (0.01).
    pub rollout_filter_selection_eps: Option<f64>,
    /// Weight of the auxiliary next-observation loss (0: off, as in the
    /// reference).
    pub world_model_coef: Option<f64>,
    /// Passes over each (filtered) batch; 1 by default.
    pub ppo_epochs: Option<usize>,
    /// Sequences per optimizer step (a trajectory each, or with
    /// `max_context_window` a reply each); 0 (the default) takes the whole
    /// batch in one step.
    pub ppo_mini_batch_size: Option<usize>,
}

/// `[critic]`: a value network of its own, trained apart from the policy
/// on the value loss alone, as the reference's critic is, in place of the
/// value head on the policy's trunk. Why: a shared trunk must serve both
/// objectives, and `value_coef` trades one off against the other (0.5
/// drowns the policy's gradient on Sokoban, 0.02 leaves FrozenLake's
/// values poor); apart, each gets its full weight. It costs a second
/// network's passes in every update, so its shape can be smaller than the
/// policy's: each shape key absent takes `[model]`'s. An empty `[critic]`
/// table is a critic of the policy's shape and rate.
/// `[warm_start]`: supervised steps on demonstrations before the `steps`
/// of reinforcement learning, in the same run (the same learner, LoRA
/// adapters and optimiser carry over; RL starts exactly where the warm
/// start ended). Absent or `steps = 0`: no warm start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmStartSection {
    /// Imitation steps, before the run's `steps` of reinforcement learning.
    pub steps: u64,
    /// Where demonstrations come from: `"oracle"`, the env's own best play
    /// (the plugin must export the contract's oracle), or a JSON-lines
    /// file of trajectories (`ragen-host eval --trajectories`,
    /// `ragen_envs.Rollouts`), whose replies are replayed through this
    /// run's env and prompts.
    pub demonstrations: String,
    /// Demonstrations per step.
    pub episodes: usize,
    /// The imitation rate (absent: `ppo.lr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Imitate only the demonstrations that succeeded.
    pub successful_only: bool,
    /// Passes over each step's demonstrations.
    pub epochs: usize,
    /// Sequences per AdamW step (a reply each with `max_context_window`,
    /// else a trajectory); 0 takes the whole step in one. Supervised
    /// learning gains from many small steps, where RL's one step per batch
    /// keeps its ratios honest.
    pub mini_batch_size: usize,
}

impl Default for WarmStartSection {
    fn default() -> Self {
        Self { steps: 0, demonstrations: "oracle".into(), episodes: 32, lr: None, successful_only: true, epochs: 1, mini_batch_size: 8 }
    }
}

impl WarmStartSection {
    pub fn is_off(&self) -> bool {
        self.steps == 0
    }
}

impl PpoSection {
    /// The rollout filter these keys describe over the preset's share of
    /// groups (`preset`, kept by `top_k`).
    fn rollout_filter(&self, preset: f64) -> Result<RolloutFilter> {
        let strategy = FilterStrategy::parse(
            self.rollout_filter_strategy.as_deref().unwrap_or("top_k"),
            self.rollout_filter_top_p_prob_mode.as_deref().unwrap_or("linear"),
        )?;
        let value = self.rollout_filter_value.or(self.rollout_filter_ratio).unwrap_or(preset);
        let (low, high, what) = match strategy {
            FilterStrategy::TopK => (0.0, 1.0, "a share of the groups in (0, 1]"),
            FilterStrategy::TopKAbs => (0.0, f64::INFINITY, "a count of groups, at least 1"),
            FilterStrategy::TopP { .. } => (0.0, f64::INFINITY, "a share of the groups' total score in (0, 1] (1 keeps everything)"),
            FilterStrategy::MinP => (0.0, 1.0, "a fraction of the best group's score in (0, 1]"),
        };
        if !(value > low && value <= high) {
            anyhow::bail!("ppo.rollout_filter_value {value} for {strategy:?}: use {what}");
        }
        let largest = match self.rollout_filter_type.as_deref().unwrap_or("largest") {
            "largest" => true,
            "smallest" => false,
            other => anyhow::bail!("ppo.rollout_filter_type `{other}`: use \"largest\" or \"smallest\""),
        };
        let eps = self.rollout_filter_selection_eps.unwrap_or(0.01);
        if !(eps >= 0.0 && eps.is_finite()) {
            anyhow::bail!("ppo.rollout_filter_selection_eps {eps}: use a small non-negative slack such as 0.01");
        }
        let include_zero = self.rollout_filter_include_zero.unwrap_or(true);
        Ok(RolloutFilter { strategy, value, largest, include_zero, eps })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticSection {
    /// Peak learning rate (verl's `critic.optim.lr`); the policy's
    /// schedule scales it step by step. Absent: the policy's `lr`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub d_model: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_layers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_heads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlp_ratio: Option<usize>,
}

impl CriticSection {
    /// The critic's transformer: `policy`'s shape with this section's keys
    /// over it (the same vocabulary, context and positions).
    pub fn model(&self, policy: &PolicyModelConfig) -> PolicyModelConfig {
        PolicyModelConfig {
            d_model: self.d_model.unwrap_or(policy.d_model),
            n_layers: self.n_layers.unwrap_or(policy.n_layers),
            n_heads: self.n_heads.unwrap_or(policy.n_heads),
            mlp_ratio: self.mlp_ratio.unwrap_or(policy.mlp_ratio),
            ..policy.clone()
        }
    }
}

/// `[plugin]`: the env plugin a run trained on, so the run names it
/// exactly and `--resume` can take the same one (or say that a tag moved).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginRecord {
    /// What `--env` said: a file path, `oci://registry/ns/name:tag`, or a
    /// server's `ws://host:port`.
    pub source: Option<String>,
    /// For a plugin pulled from a registry: the manifest digest
    /// (`sha256:…`) the reference resolved to, which pins it
    /// (`oci://…@digest`).
    pub digest: Option<String>,
    /// The digest of the `.wasm` bytes themselves.
    pub wasm_digest: Option<String>,
    /// Who signed it, when a trust policy required a signature: the
    /// verifying key's `sha256:` fingerprint.
    pub signed_by: Option<String>,
    /// For envs on a server (`ws://…`): the env it said it serves, as
    /// `name version`.
    pub served: Option<String>,
}

impl PluginRecord {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub algo: Algo,
    pub seed: u64,
    /// Training steps (one rollout batch and one update each).
    pub steps: u64,
    /// Validate every this many steps (and at the last).
    pub test_freq: u64,
    /// Checkpoint every this many steps (and at the last, and on Ctrl-C).
    pub save_freq: u64,
    /// Validation episodes, one per seed from 123.
    pub val_episodes: usize,
    /// The run stops (with a checkpoint) when more than this share of a
    /// step's episodes fail in the env: a faulting plugin, not a policy
    /// problem. 1.0 never stops.
    pub max_failed_share: f64,
    /// A pretrained model to train (a GGUF file or a Hugging Face
    /// directory, RAGEN's `model_path`); absent: the from-scratch
    /// transformer of `[model]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_path: Option<PathBuf>,
    /// `[lora]`: adapters on the pretrained model (rank 0: the whole model
    /// trains).
    pub lora: LoraConfig,
    /// `[plugin]`: which env plugin the run trained on, written by `train`
    /// (a config given to a new run needs none).
    #[serde(skip_serializing_if = "PluginRecord::is_empty")]
    pub plugin: PluginRecord,
    #[serde(flatten)]
    pub agent: AgentConfig,
    /// `[model]`: the policy transformer's shape (see [`model_keys`] for
    /// how the file names it); its vocabulary is the tokenizer's.
    #[serde(with = "model_keys")]
    pub model: PolicyModelConfig,
    pub sampling: SamplingSection,
    pub ppo: PpoSection,
    /// `[critic]`: present, the critic is a network of its own; absent, a
    /// value head on the policy's trunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticSection>,
    #[serde(skip_serializing_if = "WarmStartSection::is_off")]
    pub warm_start: WarmStartSection,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            algo: Algo::StarpoS,
            seed: 0,
            steps: 200,
            test_freq: 10,
            save_freq: 10,
            val_episodes: 256,
            max_failed_share: 0.5,
            model_path: None,
            lora: LoraConfig::default(),
            plugin: PluginRecord::default(),
            agent: AgentConfig::default(),
            model: PolicyModelConfig::new(0),
            sampling: SamplingSection::default(),
            ppo: PpoSection::default(),
            critic: None,
            warm_start: WarmStartSection::default(),
        }
    }
}

/// What the update and the filter run with, after the preset and overrides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    pub update: UpdateConfig,
    /// The warm start's imitation rate.
    pub warm_lr: f64,
    /// The learning rate per training step (`update.lr` is its peak).
    pub schedule: Schedule,
    /// The entropy coefficient per training step (`update.entropy_coef`
    /// is its start).
    pub entropy_schedule: Schedule,
    /// With dynamic sampling on, the most batches of groups a step plays.
    pub dynamic_sampling: Option<usize>,
    /// DAPO's overlong shaping of the training rollouts' rewards, when on.
    pub overlong: Option<Overlong>,
    pub filter: RolloutFilter,
    /// With a `[critic]` network: its learning rate as a multiple of the
    /// policy's, at every step of the schedule.
    pub critic_lr_scale: Option<f64>,
}

impl TrainConfig {
    /// Every step of the run: the warm start's, then reinforcement
    /// learning's.
    pub fn total_steps(&self) -> u64 {
        self.warm_start.steps + self.steps
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config `{}`", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config `{}` is not valid", path.display()))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the config serialises")
    }

    /// The preset, then every override given.
    pub fn resolve(&self) -> Result<Resolved> {
        let mut u = UpdateConfig::default();
        let (mut kl, mut filter) = (0.0, 0.25);
        match self.algo {
            Algo::StarpoS => {}
            Algo::Starpo => {
                u.clip = Clip { low: 0.2, high: 0.2 };
                kl = 0.001;
                filter = 1.0;
            }
            Algo::Grpo => {
                u.estimator = Estimator::Grpo;
                u.clip = Clip { low: 0.2, high: 0.2 };
                filter = 1.0;
            }
        }
        let p = &self.ppo;
        if let Some(e) = &p.adv_estimator {
            u.estimator = Estimator::parse(e)?;
        }
        match &mut u.estimator {
            Estimator::Gigpo(g) => {
                g.step_weight = p.step_advantage_w.unwrap_or(g.step_weight);
                if let Some(mode) = &p.gigpo_mode {
                    g.std_norm = Gigpo::parse_mode(mode)?;
                }
                if let Some(anchor) = &p.gigpo_anchor {
                    g.anchor = Anchor::parse(anchor)?;
                }
            }
            _ if p.step_advantage_w.is_some() || p.gigpo_mode.is_some() || p.gigpo_anchor.is_some() => {
                anyhow::bail!(
                    "ppo.step_advantage_w, gigpo_mode and gigpo_anchor set GiGPO's advantages: add adv_estimator = \"gigpo\", or remove them"
                )
            }
            _ => {}
        }
        u.clip.low = p.clip_ratio_low.unwrap_or(u.clip.low);
        u.clip.high = p.clip_ratio_high.unwrap_or(u.clip.high);
        u.entropy_coef = p.entropy_coeff.unwrap_or(u.entropy_coef);
        u.value_coef = p.value_coef.unwrap_or(u.value_coef);
        u.value_clip = p.cliprange_value.unwrap_or(u.value_clip);
        u.gamma = p.gamma.unwrap_or(u.gamma);
        u.lambda = p.lam.unwrap_or(u.lambda);
        u.max_grad_norm = p.grad_clip.unwrap_or(u.max_grad_norm);
        u.lr = p.lr.unwrap_or(u.lr);
        u.weight_decay = p.weight_decay.unwrap_or(u.weight_decay);
        u.temperature = self.sampling.temperature;
        u.epochs = p.ppo_epochs.unwrap_or(u.epochs);
        u.world_model_coef = p.world_model_coef.unwrap_or(u.world_model_coef);
        u.mini_batch_size = p.ppo_mini_batch_size.unwrap_or(u.mini_batch_size);
        if let Some(mode) = &p.loss_agg_mode {
            u.loss_agg = LossAgg::parse(mode)?;
        }
        if u.epochs == 0 {
            anyhow::bail!("ppo.ppo_epochs 0: use at least 1 pass over each batch");
        }
        if !(0.0..=1.0).contains(&self.max_failed_share) {
            anyhow::bail!("max_failed_share {}: use a share in [0, 1] (0.5 by default; 1 never stops)", self.max_failed_share);
        }
        let kl_coef = p.kl_coef.unwrap_or(kl);
        let filter = p.rollout_filter(filter)?;
        if !(kl_coef >= 0.0 && kl_coef.is_finite()) {
            anyhow::bail!("ppo.kl_coef {kl_coef}: use 0 (StarPO-S: no reference model) or a small positive weight such as 0.001");
        }
        u.kl_coef = kl_coef;
        if !(u.lr > 0.0 && u.lr.is_finite()) {
            anyhow::bail!("ppo.lr {}: use a positive learning rate such as 1e-3 (from scratch) or 1e-6 (a pretrained model)", u.lr);
        }
        let schedule = Schedule {
            peak: u.lr,
            decay: p.lr_scheduler_type.unwrap_or_default(),
            warmup_steps: p.lr_warmup_steps.unwrap_or(0),
            min_ratio: p.min_lr_ratio.unwrap_or(0.0),
            total_steps: self.steps,
        };
        schedule.check("min_lr_ratio", "lr_warmup_steps")?;
        let entropy_schedule = Schedule {
            peak: u.entropy_coef,
            decay: p.entropy_coeff_scheduler_type.unwrap_or_default(),
            warmup_steps: 0,
            min_ratio: p.min_entropy_coeff_ratio.unwrap_or(0.0),
            total_steps: self.steps,
        };
        entropy_schedule.check("min_entropy_coeff_ratio", "")?;
        let critic_lr_scale = self.critic_lr_scale(&u)?;
        let warm_lr = self.warm_start.lr.unwrap_or(u.lr);
        if !(warm_lr > 0.0 && warm_lr.is_finite()) {
            anyhow::bail!("warm_start.lr {warm_lr}: use a positive rate (absent: ppo.lr, {})", u.lr);
        }
        if !self.warm_start.is_off() && self.warm_start.episodes == 0 {
            anyhow::bail!("warm_start.episodes 0: use at least 1 demonstration per step");
        }
        if self.warm_start.epochs == 0 {
            anyhow::bail!("warm_start.epochs 0: use at least 1 pass over each step's demonstrations");
        }
        let dynamic_sampling = match (p.dynamic_sampling.unwrap_or(false), p.max_num_gen_batches) {
            (true, Some(0)) => anyhow::bail!("ppo.max_num_gen_batches 0: use at least 1 batch of groups a step (4 by default)"),
            (true, max) => Some(max.unwrap_or(4)),
            (false, Some(_)) => anyhow::bail!("ppo.max_num_gen_batches bounds dynamic sampling: add dynamic_sampling = true, or remove it"),
            (false, None) => None,
        };
        let overlong = self.overlong(p)?;
        Ok(Resolved { warm_lr, update: u, schedule, entropy_schedule, dynamic_sampling, overlong, filter, critic_lr_scale })
    }

    /// DAPO's overlong shaping from `ppo.overlong_buffer_len` and
    /// `ppo.overlong_penalty_factor`, against `sampling.max_new_tokens`.
    fn overlong(&self, p: &PpoSection) -> Result<Option<Overlong>> {
        let max_tokens = self.sampling.max_new_tokens;
        let Some(buffer_len) = p.overlong_buffer_len else {
            if p.overlong_penalty_factor.is_some() {
                anyhow::bail!("ppo.overlong_penalty_factor sizes DAPO's overlong penalty: add ppo.overlong_buffer_len, or remove it");
            }
            return Ok(None);
        };
        if buffer_len == 0 || buffer_len >= max_tokens {
            anyhow::bail!(
                "ppo.overlong_buffer_len {buffer_len}: use 1 to {} tokens, the end of a reply of at most sampling.max_new_tokens = {max_tokens} where the penalty grows",
                max_tokens.saturating_sub(1)
            );
        }
        let penalty_factor = p.overlong_penalty_factor.unwrap_or(1.0);
        if !(penalty_factor >= 0.0 && penalty_factor.is_finite()) {
            anyhow::bail!("ppo.overlong_penalty_factor {penalty_factor}: use a penalty of 0 or more, such as 1 (DAPO's)");
        }
        Ok(Some(Overlong { max_tokens, buffer_len, penalty_factor }))
    }

    /// The `[critic]` network's rate relative to the policy's, after
    /// checking that the estimator has a use for a critic.
    fn critic_lr_scale(&self, u: &UpdateConfig) -> Result<Option<f64>> {
        let Some(critic) = &self.critic else { return Ok(None) };
        if !u.estimator.uses_critic() {
            anyhow::bail!(
                "a [critic] section trains a value network, and only GAE's advantages use one: remove [critic], \
                 or use adv_estimator = \"gae\" (PPO)"
            );
        }
        let lr = critic.lr.unwrap_or(u.lr);
        if !(lr > 0.0 && lr.is_finite()) {
            anyhow::bail!("critic.lr {lr}: use a positive rate (absent: the policy's lr, {})", u.lr);
        }
        Ok(Some(lr / u.lr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_overrides() {
        let s = TrainConfig::default().resolve().unwrap();
        assert_eq!((s.update.clip.low, s.update.clip.high, s.filter.value), (0.2, 0.28, 0.25));
        let g: TrainConfig = toml::from_str("algo = \"grpo\"\n[ppo]\nclip_ratio_high = 0.3\n").unwrap();
        let g = g.resolve().unwrap();
        assert_eq!(g.update.estimator, Estimator::Grpo);
        assert_eq!((g.update.clip.high, g.filter.value), (0.3, 1.0));
        let more: TrainConfig =
            toml::from_str("[ppo]\nppo_epochs = 3\nppo_mini_batch_size = 8\nworld_model_coef = 0.5\n[model]\npositions = \"rotary\"\n")
                .unwrap();
        let r = more.resolve().unwrap();
        assert_eq!((r.update.epochs, r.update.mini_batch_size, r.update.world_model_coef), (3, 8, 0.5));
        assert!(more.model.rotary);
        // `[model]` is Burn's config: absent keys take its defaults, unknown
        // keys are named.
        let d = PolicyModelConfig::new(0);
        assert_eq!(TrainConfig::default().model, d);
        let m: TrainConfig = toml::from_str("[model]\nd_model = 32\n").unwrap();
        assert_eq!((m.model.d_model, m.model.n_layers, m.model.max_seq_len, m.model.rotary), (32, d.n_layers, d.max_seq_len, false));
        assert!(toml::from_str::<TrainConfig>("[model]\nd_modl = 32\n").unwrap_err().to_string().contains("d_modl"));
        assert_eq!((s.update.epochs, s.update.mini_batch_size, s.update.world_model_coef), (1, 0, 0.0), "the reference's defaults");
        let zero: TrainConfig = toml::from_str("[ppo]\nppo_epochs = 0\n").unwrap();
        assert!(zero.resolve().unwrap_err().to_string().contains("ppo_epochs"));
        assert!(toml::from_str::<TrainConfig>("[model]\npositions = \"absolute\"\n").unwrap_err().to_string().contains("absolute"));
        let gigpo: TrainConfig =
            toml::from_str("[ppo]\nadv_estimator = \"gigpo\"\nstep_advantage_w = 0.5\ngigpo_mode = \"mean_std_norm\"\n").unwrap();
        assert_eq!(
            gigpo.resolve().unwrap().update.estimator,
            Estimator::Gigpo(Gigpo { step_weight: 0.5, std_norm: true, anchor: Anchor::Observation })
        );
        let timed: TrainConfig = toml::from_str("[ppo]\nadv_estimator = \"gigpo\"\ngigpo_anchor = \"observation_and_time\"\n").unwrap();
        assert_eq!(
            timed.resolve().unwrap().update.estimator,
            Estimator::Gigpo(Gigpo { anchor: Anchor::ObservationAndTime, ..Gigpo::default() })
        );
        let stray: TrainConfig = toml::from_str("[ppo]\ngigpo_anchor = \"observation\"\n").unwrap();
        assert!(stray.resolve().unwrap_err().to_string().contains("adv_estimator = \"gigpo\""));
        let stray: TrainConfig = toml::from_str("[ppo]\nadv_estimator = \"grpo\"\nstep_advantage_w = 0.5\n").unwrap();
        assert!(stray.resolve().unwrap_err().to_string().contains("adv_estimator = \"gigpo\""));
        let bad: TrainConfig = toml::from_str("[ppo]\nadv_estimator = \"vtrace\"\n").unwrap();
        assert!(bad.resolve().unwrap_err().to_string().contains("adv_estimator"));
        assert!(toml::from_str::<TrainConfig>("stepz = 3").unwrap_err().to_string().contains("stepz"));
    }

    #[test]
    fn vanilla_starpo_keeps_a_kl_term_and_a_bad_weight_is_named() {
        let v: TrainConfig = toml::from_str("algo = \"starpo\"\n").unwrap();
        let v = v.resolve().unwrap();
        assert_eq!((v.update.kl_coef, v.update.clip.high, v.filter.value), (0.001, 0.2, 1.0));
        assert_eq!(TrainConfig::default().resolve().unwrap().update.kl_coef, 0.0);
        let bad: TrainConfig = toml::from_str("[ppo]\nkl_coef = -1.0\n").unwrap();
        assert!(bad.resolve().unwrap_err().to_string().contains("kl_coef"));
    }

    #[test]
    fn a_schedule_reads_from_ppo_and_bad_settings_are_named() {
        let c: TrainConfig =
            toml::from_str("steps = 20\n[ppo]\nlr = 0.01\nlr_scheduler_type = \"linear\"\nlr_warmup_steps = 4\nmin_lr_ratio = 0.5\n")
                .unwrap();
        let s = c.resolve().unwrap().schedule;
        assert_eq!((s.decay, s.warmup_steps, s.min_ratio, s.total_steps), (Decay::Linear, 4, 0.5, 20));
        assert!((s.at(0) - 0.0025).abs() < 1e-12 && (s.at(19) - 0.005).abs() < 1e-12);
        assert_eq!(TrainConfig::default().resolve().unwrap().schedule.decay, Decay::Constant);
        let long: TrainConfig = toml::from_str("steps = 3\n[ppo]\nlr_warmup_steps = 3\n").unwrap();
        assert!(long.resolve().unwrap_err().to_string().contains("lr_warmup_steps"));
        assert!(toml::from_str::<TrainConfig>("[ppo]\nlr_scheduler_type = \"step\"\n").unwrap_err().to_string().contains("step"));
        // The entropy coefficient's own schedule: from 0.01 down to 0.002.
        let e: TrainConfig = toml::from_str(
            "steps = 11\n[ppo]\nentropy_coeff = 0.01\nentropy_coeff_scheduler_type = \"linear\"\nmin_entropy_coeff_ratio = 0.2\n",
        )
        .unwrap();
        let e = e.resolve().unwrap().entropy_schedule;
        assert!((e.at(0) - 0.01).abs() < 1e-12 && (e.at(5) - 0.006).abs() < 1e-12 && (e.at(10) - 0.002).abs() < 1e-12);
        let bad: TrainConfig = toml::from_str("[ppo]\nmin_entropy_coeff_ratio = 2.0\n").unwrap();
        assert!(bad.resolve().unwrap_err().to_string().contains("min_entropy_coeff_ratio"));
        // DAPO's overlong shaping, against the reply limit.
        let o: TrainConfig = toml::from_str("[sampling]\nmax_new_tokens = 100\n[ppo]\noverlong_buffer_len = 20\n").unwrap();
        assert_eq!(o.resolve().unwrap().overlong, Some(Overlong { max_tokens: 100, buffer_len: 20, penalty_factor: 1.0 }));
        assert_eq!(TrainConfig::default().resolve().unwrap().overlong, None);
        for bad in ["overlong_buffer_len = 100", "overlong_buffer_len = 0", "overlong_penalty_factor = 0.5"] {
            let c: TrainConfig = toml::from_str(&format!("[sampling]\nmax_new_tokens = 100\n[ppo]\n{bad}\n")).unwrap();
            assert!(c.resolve().unwrap_err().to_string().contains("overlong"), "{bad}");
        }
        for lr in ["0.0", "-1e-3", "nan"] {
            let bad: TrainConfig = toml::from_str(&format!("[ppo]\nlr = {lr}\n")).unwrap();
            assert!(bad.resolve().unwrap_err().to_string().contains("ppo.lr"), "lr = {lr}");
        }
    }

    #[test]
    fn a_critic_section_gives_the_critic_a_network_and_a_rate_of_its_own() {
        assert_eq!(TrainConfig::default().resolve().unwrap().critic_lr_scale, None, "a value head on the trunk by default");
        let c: TrainConfig =
            toml::from_str("[ppo]\nlr = 0.002\n[model]\nd_model = 64\nn_layers = 3\n[critic]\nd_model = 32\nlr = 0.004\n").unwrap();
        let critic = c.critic.as_ref().unwrap().model(&c.model);
        assert_eq!((critic.d_model, critic.n_layers, critic.max_seq_len), (32, 3, c.model.max_seq_len), "unset keys are the policy's");
        assert_eq!(c.resolve().unwrap().critic_lr_scale, Some(2.0));
        let empty: TrainConfig = toml::from_str("[critic]\n").unwrap();
        assert_eq!(empty.critic.as_ref().unwrap().model(&empty.model), empty.model);
        assert_eq!(empty.resolve().unwrap().critic_lr_scale, Some(1.0), "the policy's rate");
        assert_eq!(toml::from_str::<TrainConfig>(&c.to_toml()).unwrap(), c, "written with the run's config");
        let grpo: TrainConfig = toml::from_str("algo = \"grpo\"\n[critic]\n").unwrap();
        assert!(grpo.resolve().unwrap_err().to_string().contains("remove [critic]"));
        let bad: TrainConfig = toml::from_str("[critic]\nlr = 0.0\n").unwrap();
        assert!(bad.resolve().unwrap_err().to_string().contains("critic.lr"));
        assert!(toml::from_str::<TrainConfig>("[critic]\nwidth = 3\n").unwrap_err().to_string().contains("width"));
    }

    #[test]
    fn the_written_config_reads_back() {
        let c: TrainConfig = toml::from_str("steps = 7\n[rollout]\ngroup_size = 4\n[env]\ndim_x = 8\n").unwrap();
        assert_eq!(toml::from_str::<TrainConfig>(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn ragen_2s_filter_keys_pick_a_strategy() {
        let keys = "[ppo]\nrollout_filter_strategy = \"top_p\"\nrollout_filter_value = 0.9\n\
                    rollout_filter_top_p_prob_mode = \"softmax\"\nrollout_filter_include_zero = false\n";
        let f = toml::from_str::<TrainConfig>(keys).unwrap().resolve().unwrap().filter;
        assert_eq!(
            f,
            RolloutFilter { strategy: FilterStrategy::TopP { softmax: true }, value: 0.9, largest: true, include_zero: false, eps: 0.01 }
        );
        let ratio = toml::from_str::<TrainConfig>("[ppo]\nrollout_filter_ratio = 0.5\n").unwrap().resolve().unwrap().filter;
        assert_eq!(ratio, RolloutFilter::top_share(0.5), "the paper's key still sets top_k's share");
        let refused = |text: &str| toml::from_str::<TrainConfig>(text).unwrap().resolve().unwrap_err().to_string();
        assert!(refused("[ppo]\nrollout_filter_strategy = \"top-p\"\n").contains("use \"top_k\""));
        assert!(refused("[ppo]\nrollout_filter_ratio = 1.5\n").contains("a share of the groups in (0, 1]"));
        assert!(refused("[ppo]\nrollout_filter_type = \"big\"\n").contains("\"largest\" or \"smallest\""));
    }
}

/// Fuzzing the config: a TOML file is text someone else wrote, so any mix
/// of keys and values parses and resolves, or is refused with an error,
/// never a panic (`make fuzz` runs it longer).
#[cfg(test)]
mod fuzz {
    use super::TrainConfig;
    use proptest::prelude::*;

    /// `[section] key`s a config may set, the numeric and named ones.
    const KEYS: &[(&str, &str)] = &[
        ("", "steps"),
        ("", "test_freq"),
        ("", "save_freq"),
        ("", "val_episodes"),
        ("", "max_failed_share"),
        ("", "seed"),
        ("rollout", "env_groups"),
        ("rollout", "group_size"),
        ("rollout", "max_turn"),
        ("rollout", "max_context_window"),
        ("sampling", "temperature"),
        ("sampling", "max_new_tokens"),
        ("sampling", "batch"),
        ("ppo", "adv_estimator"),
        ("ppo", "step_advantage_w"),
        ("ppo", "gigpo_mode"),
        ("ppo", "gigpo_anchor"),
        ("ppo", "dynamic_sampling"),
        ("ppo", "max_num_gen_batches"),
        ("ppo", "overlong_buffer_len"),
        ("ppo", "overlong_penalty_factor"),
        ("ppo", "loss_agg_mode"),
        ("ppo", "clip_ratio_low"),
        ("ppo", "clip_ratio_high"),
        ("ppo", "entropy_coeff"),
        ("ppo", "kl_coef"),
        ("ppo", "gamma"),
        ("ppo", "lam"),
        ("ppo", "grad_clip"),
        ("ppo", "lr"),
        ("ppo", "lr_scheduler_type"),
        ("ppo", "lr_warmup_steps"),
        ("ppo", "min_lr_ratio"),
        ("ppo", "entropy_coeff_scheduler_type"),
        ("ppo", "min_entropy_coeff_ratio"),
        ("ppo", "rollout_filter_ratio"),
        ("ppo", "rollout_filter_strategy"),
        ("ppo", "rollout_filter_value"),
        ("ppo", "rollout_filter_type"),
        ("ppo", "rollout_filter_top_p_prob_mode"),
        ("ppo", "ppo_epochs"),
        ("ppo", "ppo_mini_batch_size"),
        ("warm_start", "steps"),
        ("warm_start", "episodes"),
        ("warm_start", "epochs"),
        ("warm_start", "mini_batch_size"),
        ("warm_start", "lr"),
        ("model", "d_model"),
        ("model", "n_layers"),
        ("model", "n_heads"),
        ("lora", "rank"),
        ("lora", "alpha"),
    ];

    /// TOML values at and past every sensible bound, and of the wrong type.
    const VALUES: &[&str] = &[
        "0",
        "1",
        "2",
        "-1",
        "64",
        "9223372036854775807",
        "-9223372036854775808",
        "0.0",
        "0.5",
        "1.0",
        "1.5",
        "-0.5",
        "1e308",
        "1e-300",
        "nan",
        "inf",
        "-inf",
        "true",
        "\"x\"",
        "\"grpo\"",
        "\"gigpo\"",
        "\"top_p\"",
        "\"cosine\"",
        "\"seq-mean-token-sum\"",
        "\"observation_and_time\"",
        "[]",
    ];

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_config_resolves_or_is_refused_never_panics(
            settings in prop::collection::vec((prop::sample::select(KEYS), prop::sample::select(VALUES)), 1..8)
        ) {
            // Top-level keys first, then one table per section, as TOML wants.
            let mut text = String::new();
            for ((_, key), value) in settings.iter().filter(|((section, _), _)| section.is_empty()) {
                text += &format!("{key} = {value}\n");
            }
            for section in ["rollout", "sampling", "ppo", "warm_start", "model", "lora"] {
                let lines: Vec<String> =
                    settings.iter().filter(|((s, _), _)| *s == section).map(|((_, key), value)| format!("{key} = {value}\n")).collect();
                if !lines.is_empty() {
                    text += &format!("[{section}]\n{}", lines.concat());
                }
            }
            if let Ok(config) = toml::from_str::<TrainConfig>(&text) {
                let _ = config.resolve();
            }
        }
    }
}
