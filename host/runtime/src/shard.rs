//! One plugin instance and the envs living in it, plus what the pool needs
//! to rebuild them: when the instance faults, a fresh one is made and every
//! other env's episode is replayed from its seed and actions. Plugins are
//! deterministic by contract, so the replay lands in exactly the same state
//! and those envs never notice.
//!
//! **Batched calls.** When the plugin exports `batch`, a worker's calls for
//! one shard go in at most two crossings: one `reset-many` (explicit resets
//! and autoresets) and one `step-many`. A fault inside a batched call breaks
//! the instance without saying which env caused it. The shard then rebuilds
//! the instance (every env replayed to where it stood before the batch; the
//! batch's results are discarded) and runs that batch's items again one call
//! at a time. Plugins are deterministic, so the env that faulted faults
//! again on its own call and fails alone, exactly as without batching, and
//! every other item gets the result its single call gives.
//!
//! A batched call has the time budget of one call, so a hang is caught as
//! quickly as without batching. A batch that runs out of time without a
//! hang (each step slow, but within its own budget) turns batching off for
//! that instance: from then on it gets one call per env, each with its own
//! budget, rather than a timeout and a replay on every batch. So does a
//! batch that returns more or fewer results than it was given envs: the
//! plugin's batched calls themselves are broken, and would be on every
//! batch.

use crate::bindings::exports::ragen::env::environment::StepResult;
use crate::bindings::ragen::env::types::{Action, ActionSpace, EnvError, ErrorKind};
use crate::instance::{EnvHandle, PluginInstance};
use crate::plugin::Plugin;
use crate::pool::{Call, EnvFailure, FailureKind, PoolStep, Recoveries};
use crate::sandbox::Fault;
use std::sync::Arc;

/// Where an env's episode stands, as the host remembers it.
#[derive(Clone, Debug)]
enum Episode {
    /// Never reset.
    Fresh,
    /// Running since `reset(seed)`, with these actions taken since.
    Running { seed: u64, actions: Vec<Action> },
    /// Ended with `done`.
    Over { seed: u64 },
    /// Ended by a failure, said in `why`; a reset starts over.
    Failed { seed: Option<u64>, why: String },
}

impl Episode {
    fn seed(&self) -> Option<u64> {
        match self {
            Episode::Fresh => None,
            Episode::Running { seed, .. } | Episode::Over { seed } => Some(*seed),
            Episode::Failed { seed, .. } => *seed,
        }
    }
}

struct Slot {
    /// The env's id in the pool.
    id: usize,
    /// `None` while the env could not be recreated after a fault.
    handle: Option<EnvHandle>,
    episode: Episode,
}

/// What a step call turns into under the episode rules.
enum Begin {
    /// Step the running episode from `seed` through `handle`.
    Step { seed: u64, handle: EnvHandle },
    /// Autoreset: start the next episode from this seed instead.
    Autoreset(u64),
}

pub(crate) struct Shard {
    plugin: Arc<Plugin>,
    settings: Arc<Vec<(String, String)>>,
    instance: PluginInstance,
    slots: Vec<Slot>,
    /// What this shard did to recover from faults.
    pub(crate) recoveries: Recoveries,
    /// Whether to use the plugin's batched calls (off for plugins without
    /// them, by configuration, or after a batch ran out of time or
    /// returned the wrong count of results).
    batched: bool,
    /// The envs' action space, read on the first oracle call to check the
    /// oracle's answers against.
    space: Option<ActionSpace>,
}

/// The seed an autoreset uses after an episode from `seed`: a splitmix64
/// step, so consecutive envs (seeded s, s+1, ...) do not replay each other's
/// episodes as they would with `seed + 1`.
pub fn next_seed(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Shard {
    /// A new instance holding one env per id. Errors if the plugin rejects
    /// the settings or faults while creating.
    pub(crate) fn new(plugin: Arc<Plugin>, settings: Arc<Vec<(String, String)>>, ids: &[usize], batched: bool) -> anyhow::Result<Self> {
        let mut instance = plugin.instantiate()?;
        let mut slots = Vec::with_capacity(ids.len());
        for &id in ids {
            let handle = instance.create(&settings)?.map_err(|e| anyhow::anyhow!("the plugin rejected the settings: {}", e.message))?;
            slots.push(Slot { id, handle: Some(handle), episode: Episode::Fresh });
        }
        let batched = batched && plugin.has_batch();
        Ok(Self { plugin, settings, instance, slots, recoveries: Recoveries::default(), batched, space: None })
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn batched(&self) -> bool {
        self.batched
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.instance.memory_bytes()
    }

    fn failure(&self, slot: usize, seed: Option<u64>, kind: FailureKind, message: String) -> EnvFailure {
        EnvFailure { plugin: self.plugin.source().to_string(), env: self.slots[slot].id, seed, kind, message }
    }

    fn env_error(&mut self, slot: usize, seed: Option<u64>, e: EnvError) -> EnvFailure {
        self.slots[slot].episode = Episode::Failed { seed, why: e.message.clone() };
        self.failure(slot, seed, FailureKind::Env(e.kind), e.message)
    }

    /// The instance faulted during a call for `slot`: fail that episode,
    /// then rebuild the instance with every other env restored.
    fn fault(&mut self, slot: usize, seed: Option<u64>, fault: Fault) -> EnvFailure {
        self.slots[slot].episode = Episode::Failed { seed, why: fault.message.clone() };
        let failure = self.failure(slot, seed, FailureKind::Fault(fault.kind), fault.message);
        self.recoveries.first.get_or_insert_with(|| failure.to_string());
        self.rebuild();
        failure
    }

    /// Check what the plugin returned against the contract and the limits.
    fn check_observation(&self, observation: &str) -> Result<(), String> {
        let cap = self.plugin.limits().max_observation_bytes;
        if observation.len() > cap {
            return Err(format!("observation of {} bytes exceeds the cap of {cap} bytes", observation.len()));
        }
        Ok(())
    }

    fn check_step(&self, r: &StepResult) -> Result<(), String> {
        if !r.reward.is_finite() {
            return Err(format!("reward is {}; rewards must be finite numbers", r.reward));
        }
        let max = self.plugin.limits().report.max_abs_reward;
        if r.reward.abs() > max {
            return Err(format!("reward is {:e}, beyond the limit of ±{max:e}; scale rewards to a sensible range", r.reward));
        }
        if let Some((i, v)) = r.info.metrics.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(format!("metric #{i} is {v}; metrics must be finite numbers"));
        }
        self.check_observation(&r.observation)
    }

    pub(crate) fn reset(&mut self, slot: usize, seed: u64) -> Result<String, EnvFailure> {
        let Some(handle) = self.slots[slot].handle else {
            return Err(self.unavailable(slot, Some(seed)));
        };
        match self.instance.reset(handle, seed) {
            Err(fault) => Err(self.fault(slot, Some(seed), fault)),
            Ok(r) => self.finish_reset(slot, seed, r),
        }
    }

    /// Record what a reset of `slot` to `seed` returned.
    fn finish_reset(&mut self, slot: usize, seed: u64, r: Result<String, EnvError>) -> Result<String, EnvFailure> {
        match r {
            Err(e) => Err(self.env_error(slot, Some(seed), e)),
            Ok(observation) => match self.check_observation(&observation) {
                Err(problem) => {
                    let why = format!("reset: {problem}");
                    self.slots[slot].episode = Episode::Failed { seed: Some(seed), why: why.clone() };
                    Err(self.failure(slot, Some(seed), FailureKind::InvalidOutput, why))
                }
                Ok(()) => {
                    self.slots[slot].episode = Episode::Running { seed, actions: Vec::new() };
                    Ok(observation)
                }
            },
        }
    }

    pub(crate) fn step(&mut self, slot: usize, action: Action, autoreset: bool) -> Result<PoolStep, EnvFailure> {
        let (seed, handle) = match self.begin_step(slot, autoreset)? {
            Begin::Step { seed, handle } => (seed, handle),
            Begin::Autoreset(next) => return self.reset(slot, next).map(|obs| PoolStep::autoreset(obs, next)),
        };
        match self.instance.step(handle, action.clone()) {
            Err(fault) => Err(self.fault(slot, Some(seed), fault)),
            Ok(r) => self.finish_step(slot, seed, action, r),
        }
    }

    /// Decide what a step on `slot` does under the episode rules.
    fn begin_step(&mut self, slot: usize, autoreset: bool) -> Result<Begin, EnvFailure> {
        // Copy out what decides the branch; cloning the episode would copy
        // its whole action history on every step.
        let seed = match self.slots[slot].episode {
            Episode::Running { seed, .. } => seed,
            Episode::Fresh => {
                let message = "step before the first reset; reset the env first".to_string();
                return Err(self.failure(slot, None, FailureKind::Env(crate::ErrorKind::NotStarted), message));
            }
            // Next-step autoreset: this call starts the next episode and
            // the action is not used.
            Episode::Over { seed } | Episode::Failed { seed: Some(seed), .. } if autoreset => return Ok(Begin::Autoreset(next_seed(seed))),
            Episode::Over { seed } => {
                let message = "the episode has ended; reset the env (or enable autoreset)".to_string();
                return Err(self.failure(slot, Some(seed), FailureKind::Env(crate::ErrorKind::EpisodeOver), message));
            }
            Episode::Failed { seed: Some(seed), ref why } => {
                let message = format!("the episode failed earlier ({why}); reset the env (or enable autoreset)");
                return Err(self.failure(slot, Some(seed), FailureKind::Env(crate::ErrorKind::EpisodeOver), message));
            }
            Episode::Failed { seed: None, ref why } => {
                let message = format!("the last reset failed ({why}); reset the env again");
                return Err(self.failure(slot, None, FailureKind::Env(crate::ErrorKind::NotStarted), message));
            }
        };
        match self.slots[slot].handle {
            Some(handle) => Ok(Begin::Step { seed, handle }),
            None => Err(self.unavailable(slot, Some(seed))),
        }
    }

    /// Record what `action` on `slot` (in the episode from `seed`) returned.
    fn finish_step(&mut self, slot: usize, seed: u64, action: Action, r: Result<StepResult, EnvError>) -> Result<PoolStep, EnvFailure> {
        let r = r.map_err(|e| self.env_error(slot, Some(seed), e))?;
        if let Err(problem) = self.check_step(&r) {
            let why = format!("step: {problem}");
            self.slots[slot].episode = Episode::Failed { seed: Some(seed), why: why.clone() };
            return Err(self.failure(slot, Some(seed), FailureKind::InvalidOutput, why));
        }
        if r.done {
            self.slots[slot].episode = Episode::Over { seed };
        } else if let Episode::Running { actions, .. } = &mut self.slots[slot].episode {
            actions.push(action);
        }
        Ok(PoolStep::from_result(r))
    }

    /// Run `calls` (caller's position, slot, call) on this shard: in at most
    /// two batched crossings when the plugin has them, else one call each.
    /// See the module docs for how a fault in a batch stays with its env.
    pub(crate) fn run(&mut self, calls: Vec<(usize, usize, Call)>, autoreset: bool) -> Vec<(usize, Result<PoolStep, EnvFailure>)> {
        if calls.len() < 2 || !self.batched || self.instance.is_broken() || self.repeats_a_slot(&calls) {
            return calls.into_iter().map(|(pos, slot, call)| (pos, self.run_one(slot, call, autoreset))).collect();
        }
        let mut out = Vec::with_capacity(calls.len());
        // (position, slot, seed, whether this is an autoreset)
        let mut resets: Vec<(usize, usize, u64, bool)> = Vec::new();
        // (position, slot, episode seed, action)
        let mut steps: Vec<(usize, usize, u64, Action)> = Vec::new();
        for (pos, slot, call) in calls {
            match call {
                Call::Reset(seed) => resets.push((pos, slot, seed, false)),
                Call::Step(action) => match self.begin_step(slot, autoreset) {
                    Err(failure) => out.push((pos, Err(failure))),
                    Ok(Begin::Autoreset(next)) => resets.push((pos, slot, next, true)),
                    Ok(Begin::Step { seed, .. }) => steps.push((pos, slot, seed, action)),
                },
            }
        }
        self.reset_batch(resets, &mut out);
        self.step_batch(steps, &mut out);
        out
    }

    /// A batched call faulted: restore the instance as it was before the
    /// batch, and stop batching if the batch merely ran out of time or
    /// broke the contract as a whole (a wrong count of results: a trap names
    /// no env either, but is an env's bug, which its own call isolates).
    fn batch_faulted(&mut self, call: &str, fault: &Fault) {
        self.recoveries.batch_faults += 1;
        self.recoveries.first.get_or_insert_with(|| format!("a batched {call} faulted ({}: {})", fault.kind.as_str(), fault.message));
        if matches!(fault.kind, crate::FaultKind::Timeout | crate::FaultKind::Contract) {
            self.batched = false;
            self.recoveries.batching_off += 1;
        }
        self.rebuild();
    }

    fn run_one(&mut self, slot: usize, call: Call, autoreset: bool) -> Result<PoolStep, EnvFailure> {
        match call {
            Call::Reset(seed) => self.reset(slot, seed).map(|obs| PoolStep::autoreset(obs, seed)),
            Call::Step(action) => self.step(slot, action, autoreset),
        }
    }

    /// Whether a slot appears twice: such a batch runs call by call, in order.
    fn repeats_a_slot(&self, calls: &[(usize, usize, Call)]) -> bool {
        let mut seen = vec![false; self.slots.len()];
        calls.iter().any(|&(_, slot, _)| std::mem::replace(&mut seen[slot], true))
    }

    fn reset_batch(&mut self, resets: Vec<(usize, usize, u64, bool)>, out: &mut Vec<(usize, Result<PoolStep, EnvFailure>)>) {
        // Envs left without a handle by an earlier failed rebuild go alone.
        let (ready, alone): (Vec<_>, Vec<_>) =
            resets.into_iter().partition(|r| self.slots[r.1].handle.is_some() && !self.instance.is_broken());
        let as_step = |obs: String, seed: u64| PoolStep::autoreset(obs, seed);
        for (pos, slot, seed, _) in alone {
            out.push((pos, self.reset(slot, seed).map(|obs| as_step(obs, seed))));
        }
        if ready.is_empty() {
            return;
        }
        let handles: Vec<EnvHandle> = ready.iter().map(|r| self.slots[r.1].handle.expect("partitioned")).collect();
        let seeds: Vec<u64> = ready.iter().map(|r| r.2).collect();
        match self.instance.reset_many(&handles, &seeds).expect("the shard checked for batch support") {
            Ok(results) => {
                for ((pos, slot, seed, _), r) in ready.into_iter().zip(results) {
                    out.push((pos, self.finish_reset(slot, seed, r).map(|obs| as_step(obs, seed))));
                }
            }
            Err(fault) => {
                // Rebuild to the state before the batch, then one by one.
                self.batch_faulted("reset-many", &fault);
                for (pos, slot, seed, _) in ready {
                    out.push((pos, self.reset(slot, seed).map(|obs| as_step(obs, seed))));
                }
            }
        }
    }

    fn step_batch(&mut self, steps: Vec<(usize, usize, u64, Action)>, out: &mut Vec<(usize, Result<PoolStep, EnvFailure>)>) {
        // Handles are read now: a rebuild during the resets replaced them.
        // Envs without one (a failed rebuild) go alone.
        let (ready, alone): (Vec<_>, Vec<_>) =
            steps.into_iter().partition(|s| self.slots[s.1].handle.is_some() && !self.instance.is_broken());
        for (pos, slot, _, action) in alone {
            out.push((pos, self.step(slot, action, false)));
        }
        if ready.is_empty() {
            return;
        }
        let handles: Vec<EnvHandle> = ready.iter().map(|s| self.slots[s.1].handle.expect("partitioned")).collect();
        let actions: Vec<Action> = ready.iter().map(|s| s.3.clone()).collect();
        match self.instance.step_many(&handles, &actions).expect("the shard checked for batch support") {
            Ok(results) => {
                for ((pos, slot, seed, action), r) in ready.into_iter().zip(results) {
                    out.push((pos, self.finish_step(slot, seed, action, r)));
                }
            }
            Err(fault) => {
                // Rebuild to the state before the batch, then one by one.
                self.batch_faulted("step-many", &fault);
                for (pos, slot, _, action) in ready {
                    out.push((pos, self.step(slot, action, false)));
                }
            }
        }
    }

    /// The oracle's next actions for `slot`'s running episode, checked
    /// against the action space; see [`EnvPool::oracle`](crate::EnvPool::oracle).
    pub(crate) fn oracle(&mut self, slot: usize, max_actions: u32) -> Result<Vec<Action>, EnvFailure> {
        let seed = match &self.slots[slot].episode {
            Episode::Running { seed, .. } => *seed,
            other => {
                let kind = if other.seed().is_some() { ErrorKind::EpisodeOver } else { ErrorKind::NotStarted };
                let message = "the oracle was asked outside a running episode; reset the env first".to_string();
                return Err(self.failure(slot, other.seed(), FailureKind::Env(kind), message));
            }
        };
        let Some(handle) = self.slots[slot].handle else {
            return Err(self.unavailable(slot, Some(seed)));
        };
        if self.space.is_none() {
            match self.instance.spec_unchecked(handle) {
                Ok(spec) => self.space = Some(spec.action_space),
                Err(fault) => return Err(self.fault(slot, Some(seed), fault)),
            }
        }
        match self.instance.best_actions(handle, max_actions) {
            None => {
                let message = "the plugin exports no oracle (`ragen:env/oracle` in wit/env.wit)".to_string();
                Err(self.failure(slot, Some(seed), FailureKind::Env(ErrorKind::Failed), message))
            }
            Some(Err(fault)) => Err(self.fault(slot, Some(seed), fault)),
            Some(Ok(Err(e))) => Err(self.env_error(slot, Some(seed), e)),
            Some(Ok(Ok(plan))) => match check_plan(&plan, max_actions, self.space.as_ref().expect("read above")) {
                Ok(()) => Ok(plan),
                Err(problem) => {
                    let why = format!("best-actions: {problem}");
                    self.slots[slot].episode = Episode::Failed { seed: Some(seed), why: why.clone() };
                    Err(self.failure(slot, Some(seed), FailureKind::InvalidOutput, why))
                }
            },
        }
    }

    fn unavailable(&mut self, slot: usize, seed: Option<u64>) -> EnvFailure {
        // Try again to bring the instance back (e.g. instantiation failed
        // last time under memory pressure).
        self.rebuild();
        let kind = FailureKind::Fault(crate::FaultKind::Trap);
        self.failure(slot, seed, kind, "the env could not be recreated after an earlier fault in its instance".into())
    }

    /// Replace the instance and restore every env: recreate it, and replay a
    /// running episode from its seed and actions. An env whose replay faults
    /// loses its episode and the rebuild starts over without it; each pass
    /// removes at least one episode, so this ends.
    fn rebuild(&mut self) {
        self.recoveries.rebuilt_instances += 1;
        'attempt: loop {
            let Ok(mut instance) = self.plugin.instantiate() else {
                for slot in &mut self.slots {
                    slot.handle = None;
                }
                return;
            };
            for i in 0..self.slots.len() {
                let handle = match instance.create(&self.settings) {
                    Ok(Ok(h)) => h,
                    // The same settings worked before: a plugin that faults on
                    // create now is broken everywhere; leave envs unavailable.
                    _ => {
                        for slot in &mut self.slots {
                            slot.handle = None;
                        }
                        self.instance = instance;
                        return;
                    }
                };
                self.slots[i].handle = Some(handle);
                let replayed = match &self.slots[i].episode {
                    Episode::Running { seed, actions } => {
                        self.recoveries.replayed_episodes += 1;
                        Self::replay(&mut instance, handle, *seed, actions)
                    }
                    // Over: recreate fresh but remember the seed, so
                    // autoreset continues the same schedule.
                    _ => Ok(()),
                };
                if let Err(why) = replayed {
                    let seed = self.slots[i].episode.seed();
                    let why = format!("its episode could not be replayed after another env of its instance faulted: {why}");
                    self.slots[i].episode = Episode::Failed { seed, why };
                    continue 'attempt;
                }
            }
            self.instance = instance;
            return;
        }
    }

    /// Reset `handle` to `seed` and take `actions` again; the error says
    /// which call went wrong and how.
    fn replay(instance: &mut PluginInstance, handle: EnvHandle, seed: u64, actions: &[Action]) -> Result<(), String> {
        match instance.reset(handle, seed) {
            Err(fault) => return Err(format!("reset(seed {seed}) faulted: {fault}")),
            Ok(Err(e)) => return Err(format!("reset(seed {seed}) failed: {}", e.message)),
            Ok(Ok(_)) => {}
        }
        for (n, a) in actions.iter().enumerate() {
            match instance.step(handle, a.clone()) {
                Err(fault) => return Err(format!("step {} (action {a}) faulted: {fault}", n + 1)),
                Ok(Err(e)) => return Err(format!("step {} (action {a}) failed: {}", n + 1, e.message)),
                Ok(Ok(_)) => {}
            }
        }
        Ok(())
    }
}

/// What the contract allows an oracle to answer: one action or more, at
/// most `max_actions`, each of the kind and size the action space declares.
fn check_plan(plan: &[Action], max_actions: u32, space: &ActionSpace) -> Result<(), String> {
    if plan.is_empty() {
        return Err("returned no action for a running episode; it must return at least one".into());
    }
    if plan.len() > max_actions.max(1) as usize {
        return Err(format!("returned {} actions, {max_actions} were asked for", plan.len()));
    }
    for action in plan {
        match (action, space) {
            (Action::Id(id), ActionSpace::Names(names)) if (*id as usize) < names.len() => {}
            (Action::Id(id), ActionSpace::Names(names)) => return Err(format!("action id {id} is past the {} action names", names.len())),
            (Action::Text(text), ActionSpace::Text(t)) if text.len() <= t.max_bytes as usize => {}
            (Action::Text(text), ActionSpace::Text(t)) => {
                return Err(format!("a text action of {} bytes, over the limit of {}", text.len(), t.max_bytes));
            }
            (Action::Id(_), ActionSpace::Text(_)) => return Err("an action id for an env whose actions are text".into()),
            (Action::Text(_), ActionSpace::Names(_)) => return Err("a text action for an env whose actions are names".into()),
        }
    }
    Ok(())
}
