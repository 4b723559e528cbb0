//! Grouped multi-turn rollouts: `env_groups` prompts x `group_size` samples,
//! every env of a group reset from the same seed, so the spread of a
//! group's rewards measures the policy's uncertainty on one state.

use crate::parse::ResponseParser;
use crate::policy::{Context, Message, Policy, Response};
use crate::prompt::{PromptBuilder, PromptTemplates, Role};
use crate::trajectory::{Segment, Trajectory, Turn, visible};
use anyhow::{Result, bail};
use ragen_runtime::{Action, EnvProvider, EnvSpec, Envs, PluginInfo, PoolConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The agent loop's settings, named as in RAGEN. The three limits default
/// to what the plugin recommends (`env-spec.limits`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Prompts (initial states) per batch.
    pub env_groups: usize,
    /// Samples per prompt; all share the prompt's seed.
    pub group_size: usize,
    pub max_turn: Option<u32>,
    pub max_actions_per_turn: Option<u32>,
    pub max_actions_per_traj: Option<u32>,
    /// Added to a trajectory's reward for each reply that was malformed or
    /// named an unknown action.
    pub format_penalty: f64,
    /// `<think>…</think><answer>…</answer>` (true) or `<answer>…</answer>`.
    pub enable_think: bool,
    /// Turns of the conversation the policy reads before each reply,
    /// the current one included; absent reads them all (the reference).
    /// With a window the task (instructions, legend, actions) moves into
    /// the system message so that every context keeps it. For envs whose
    /// state is all in the rendering (Sokoban, FrozenLake), `1` keeps
    /// contexts short and puts the grid at the same place every turn,
    /// which a model trained from scratch reads far more easily.
    pub max_context_window: Option<u32>,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            env_groups: 8,
            group_size: 16,
            max_turn: None,
            max_actions_per_turn: None,
            max_actions_per_traj: None,
            format_penalty: -0.1,
            enable_think: true,
            max_context_window: None,
        }
    }
}

/// The limits in force, after the plugin's recommendations fill the gaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LoopLimits {
    pub max_turn: u32,
    pub max_actions_per_turn: u32,
    pub max_actions_per_traj: u32,
}

impl RolloutConfig {
    pub fn limits(&self, spec: &EnvSpec) -> LoopLimits {
        LoopLimits {
            max_turn: self.max_turn.unwrap_or(spec.limits.max_turns).max(1),
            max_actions_per_turn: self.max_actions_per_turn.unwrap_or(spec.limits.max_actions_per_turn).max(1),
            max_actions_per_traj: self.max_actions_per_traj.unwrap_or(spec.limits.max_actions_per_episode).max(1),
        }
    }
}

/// Runs rollouts of one env source through its own batch of envs (a
/// plugin's pool in this process, or a server's envs).
pub struct RolloutRunner {
    pool: Box<dyn Envs>,
    info: PluginInfo,
    spec: EnvSpec,
    config: RolloutConfig,
    limits: LoopLimits,
    prompts: PromptBuilder,
    parser: ResponseParser,
}

/// One env's episode while it is being played.
#[derive(Default)]
struct Live {
    segments: Vec<Segment>,
    observation: String,
    turns: Vec<Turn>,
    used: u32,
    done: bool,
    success: bool,
    failure: Option<String>,
    failure_kind: Option<String>,
}

impl RolloutRunner {
    /// A pool of `env_groups * group_size` envs created with `settings`.
    pub fn new(
        envs: Arc<dyn EnvProvider>,
        settings: &[(String, String)],
        config: RolloutConfig,
        templates: PromptTemplates,
        threads: usize,
    ) -> Result<Self> {
        if config.env_groups == 0 || config.group_size == 0 {
            bail!("env_groups and group_size must be at least 1");
        }
        if config.max_context_window == Some(0) {
            bail!("max_context_window 0: use at least 1 (the current turn), or leave it out to keep the whole conversation");
        }
        let (info, spec) = envs.describe(settings)?;
        let limits = config.limits(&spec);
        let pool_config =
            PoolConfig { threads, settings: settings.to_vec(), autoreset: false, ..PoolConfig::new(config.env_groups * config.group_size) };
        let pool = envs.open(&pool_config)?;
        let prompts = PromptBuilder::new(templates, &spec, config.enable_think, limits.max_actions_per_turn)
            .with_task_in_system(config.max_context_window.is_some());
        let parser = ResponseParser::for_spec(&spec, config.enable_think, limits.max_actions_per_turn as usize);
        Ok(Self { pool, info, spec, config, limits, prompts, parser })
    }

    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    pub fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    pub fn config(&self) -> &RolloutConfig {
        &self.config
    }

    /// What the runner's env pool did to recover from the plugin's faults
    /// since it started (rebuilt instances, replayed episodes, batching
    /// turned off): a run reports it so that recovery is never silent.
    pub fn recoveries(&self) -> Result<ragen_runtime::Recoveries> {
        Ok(self.pool.stats()?.recoveries)
    }

    pub fn limits(&self) -> LoopLimits {
        self.limits
    }

    /// What every reply starts with (`<think>` or `<answer>`).
    pub fn prefill(&self) -> &'static str {
        self.prompts.prefill()
    }

    /// Play one batch: group `g` is reset from `group_seeds[g]` (at most
    /// `env_groups` groups). Returns `group_seeds.len() * group_size`
    /// trajectories, group by group.
    ///
    /// Each turn: every live env's context goes to the policy in one call
    /// ([`Self::ask`]); the replies are parsed into action plans
    /// ([`Self::plan`]); the k-th actions of all plans run in one pool call,
    /// k = 0, 1, … ([`Self::execute`]); and each env still going gets its
    /// next user message.
    pub fn run(&self, policy: &mut dyn Policy, group_seeds: &[u64]) -> Result<Vec<Trajectory>> {
        let gs = self.config.group_size;
        if group_seeds.len() > self.config.env_groups {
            bail!("{} groups asked for, the runner holds {}", group_seeds.len(), self.config.env_groups);
        }
        let lim = self.limits;
        let seeds: Vec<u64> = (0..group_seeds.len() * gs).map(|i| group_seeds[i / gs]).collect();
        let mut live = self.start(&seeds)?;
        for turn in 1..=lim.max_turn {
            let mut active: Vec<usize> = (0..live.len()).filter(|&i| live[i].can_act(lim)).collect();
            let advice = if policy.wants_oracle() { Some(self.consult_oracle(&mut live, &mut active)?) } else { None };
            if active.is_empty() {
                break;
            }
            let responses = self.ask(policy, &live, &active, advice.as_deref())?;
            let (plans, mut turns) = self.plan(&mut live, &active, responses);
            self.execute(&mut live, &active, &plans, &mut turns)?;
            for (k, &i) in active.iter().enumerate() {
                let l = &mut live[i];
                if l.can_act(lim) && turn < lim.max_turn {
                    let left = lim.max_actions_per_traj - l.used;
                    let t = &turns[k];
                    let no_effect = t.executed.len() - t.effective;
                    l.segments.push(user(self.prompts.next_user(t.reward, no_effect, turn + 1, &l.observation, left)));
                }
            }
            for (turn, &i) in turns.into_iter().zip(&active) {
                live[i].turns.push(turn);
            }
        }
        Ok(live.into_iter().enumerate().map(|(i, l)| l.finish(i, gs, seeds[i], self.config.max_context_window)).collect())
    }

    /// Reset every env from its seed; an env whose reset fails starts (and
    /// ends) with that failure.
    fn start(&self, seeds: &[u64]) -> Result<Vec<Live>> {
        let ids: Vec<usize> = (0..seeds.len()).collect();
        let system = Segment { role: Role::System, text: self.prompts.system(), prefill: String::new(), tokens: vec![], logprobs: vec![] };
        let first = |obs: &str| vec![system.clone(), user(self.prompts.first_user(obs, self.limits.max_actions_per_traj))];
        let live = self
            .pool
            .reset(&ids, seeds)?
            .into_iter()
            .map(|r| match r {
                Ok(obs) => Live { segments: first(&obs), observation: obs, ..Live::default() },
                Err(f) => Live::default().failed(f.kind_name(), f.to_string()),
            })
            .collect();
        Ok(self.check_groups_agree(live, seeds))
    }

    /// Members of a group share a seed, so their first states must agree: a
    /// cheap determinism check on every batch. A member that disagrees with
    /// its group's first healthy member fails, saying why (state hidden
    /// across resets, or randomness not drawn from the seed).
    fn check_groups_agree(&self, mut live: Vec<Live>, seeds: &[u64]) -> Vec<Live> {
        let gs = self.config.group_size;
        for start in (0..live.len()).step_by(gs) {
            let group = start..(start + gs).min(live.len());
            let Some(first) = group.clone().find(|&i| live[i].failure.is_none()) else { continue };
            for i in group {
                if live[i].failure.is_none() && live[i].observation != live[first].observation {
                    let message = format!(
                        "env {i}, seed {}: reset gave a different first state than env {first} with the same seed; \
                         an environment's state must come from its seed alone (state kept across resets?)",
                        seeds[i]
                    );
                    live[i].fail("nondeterministic".into(), message);
                }
            }
        }
        live
    }

    /// How many actions env `i` may usefully take this turn.
    fn turn_budget(&self, live: &Live) -> u32 {
        self.limits.max_actions_per_turn.min(self.limits.max_actions_per_traj - live.used)
    }

    /// The env's oracle answer for each `active` env, in order. An env
    /// whose oracle fails ends its episode with that failure and leaves
    /// `active`.
    fn consult_oracle(&self, live: &mut [Live], active: &mut Vec<usize>) -> Result<Vec<Vec<Action>>> {
        let budgets: Vec<u32> = active.iter().map(|&i| self.turn_budget(&live[i])).collect();
        let answers = self.pool.oracle(active, &budgets)?;
        let mut plans = Vec::with_capacity(active.len());
        let mut kept = Vec::with_capacity(active.len());
        for (&i, answer) in active.iter().zip(answers) {
            match answer {
                Ok(plan) => {
                    plans.push(plan);
                    kept.push(i);
                }
                Err(f) => live[i].fail(f.kind_name(), f.to_string()),
            }
        }
        *active = kept;
        Ok(plans)
    }

    /// The policy's replies to the contexts of the `active` envs, one each;
    /// `advice[k]` is the oracle's answer for `active[k]` when the policy
    /// asked for it.
    fn ask(&self, policy: &mut dyn Policy, live: &[Live], active: &[usize], advice: Option<&[Vec<Action>]>) -> Result<Vec<Response>> {
        let contexts: Vec<Context<'_>> = active
            .iter()
            .enumerate()
            .map(|(k, &i)| Context {
                env: i,
                messages: visible(&live[i].segments, self.config.max_context_window)
                    .map(|s| Message { role: s.role, text: &s.text })
                    .collect(),
                prefill: self.prompts.prefill(),
                observation: &live[i].observation,
                actions: self.spec.action_names(),
                max_actions: self.turn_budget(&live[i]),
                oracle: advice.map(|a| a[k].as_slice()),
            })
            .collect();
        let responses = policy.respond(&contexts)?;
        if responses.len() != active.len() {
            bail!("policy `{}` returned {} responses for {} contexts", policy.name(), responses.len(), active.len());
        }
        Ok(responses)
    }

    /// Record each reply in its conversation and parse it into the actions
    /// to run (cut to the trajectory's remaining budget) and a new turn.
    fn plan(&self, live: &mut [Live], active: &[usize], responses: Vec<Response>) -> (Vec<Vec<Action>>, Vec<Turn>) {
        let mut plans = Vec::with_capacity(active.len());
        let mut turns: Vec<Turn> = Vec::with_capacity(active.len());
        for (&i, response) in active.iter().zip(responses) {
            let full = format!("{}{}", self.prompts.prefill(), response.text);
            let parsed = self.parser.parse(&full);
            let budget = (self.limits.max_actions_per_traj - live[i].used) as usize;
            let asked = parsed.actions.iter().map(|&id| Action::Id(id)).chain(parsed.text.clone().map(Action::Text));
            plans.push(asked.take(budget).collect::<Vec<Action>>());
            let penalty = if parsed.penalised { self.config.format_penalty } else { 0.0 };
            let observation = live[i].observation.clone();
            turns.push(Turn { observation, parsed, executed: vec![], effective: 0, reward: 0.0, penalty, done: false });
            live[i].segments.push(Segment {
                role: Role::Assistant,
                text: full,
                prefill: self.prompts.prefill().to_string(),
                tokens: response.tokens,
                logprobs: response.logprobs,
            });
        }
        (plans, turns)
    }

    /// Run the plans: the k-th actions of all envs in one pool call, k = 0,
    /// 1, …; each env's turn stops at its first `done` or failure.
    fn execute(&self, live: &mut [Live], active: &[usize], plans: &[Vec<Action>], turns: &mut [Turn]) -> Result<()> {
        for step in 0..self.limits.max_actions_per_turn as usize {
            let batch: Vec<usize> =
                (0..active.len()).filter(|&k| plans[k].len() > step && !turns[k].done && live[active[k]].failure.is_none()).collect();
            if batch.is_empty() {
                break;
            }
            let env_ids: Vec<usize> = batch.iter().map(|&k| active[k]).collect();
            let actions: Vec<Action> = batch.iter().map(|&k| plans[k][step].clone()).collect();
            for (j, result) in self.pool.step(&env_ids, &actions)?.into_iter().enumerate() {
                let (k, i) = (batch[j], env_ids[j]);
                match result {
                    Ok(s) => {
                        let t = &mut turns[k];
                        t.reward += s.reward;
                        t.effective += s.info.action_is_effective as usize;
                        t.executed.push(match &actions[j] {
                            Action::Id(id) => self.spec.action_names()[*id as usize].clone(),
                            Action::Text(text) => text.clone(),
                        });
                        t.done = s.done;
                        live[i].used += 1;
                        live[i].observation = s.observation;
                        if s.done {
                            live[i].done = true;
                            live[i].success = s.info.success;
                        }
                    }
                    Err(f) => live[i].fail(f.kind_name(), f.to_string()),
                }
            }
        }
        Ok(())
    }
}

impl Live {
    /// Record that the env failed (`kind`: `trap`, `nondeterministic`, ...)
    /// and end the episode.
    fn fail(&mut self, kind: String, message: String) {
        self.done = true;
        self.failure = Some(message);
        self.failure_kind = Some(kind);
    }

    /// [`Live::fail`], by value.
    fn failed(mut self, kind: String, message: String) -> Self {
        self.fail(kind, message);
        self
    }

    /// Still playing: not done, not failed, with actions left.
    fn can_act(&self, lim: LoopLimits) -> bool {
        !self.done && self.failure.is_none() && self.used < lim.max_actions_per_traj
    }

    /// The finished episode of env `env` as a trajectory, with its totals.
    fn finish(self, env: usize, group_size: usize, seed: u64, context_window: Option<u32>) -> Trajectory {
        let env_reward: f64 = self.turns.iter().map(|t| t.reward).sum();
        let penalty: f64 = self.turns.iter().map(|t| t.penalty).sum();
        let proposed: usize = self.turns.iter().map(|t| t.parsed.proposed).sum();
        let valid: usize = self.turns.iter().map(|t| t.parsed.valid()).sum();
        let executed: usize = self.turns.iter().map(|t| t.executed.len()).sum();
        let effective: usize = self.turns.iter().map(|t| t.effective).sum();
        Trajectory {
            group: env / group_size,
            seed,
            env,
            segments: self.segments,
            turns: self.turns,
            reward: env_reward + penalty,
            penalty,
            success: self.success,
            num_actions: executed,
            valid_action_ratio: ratio(valid, proposed),
            effective_action_ratio: ratio(effective, executed),
            failure: self.failure,
            failure_kind: self.failure_kind,
            context_window,
        }
    }
}

fn user(text: String) -> Segment {
    Segment { role: Role::User, text, prefill: String::new(), tokens: vec![], logprobs: vec![] }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
