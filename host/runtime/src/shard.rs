//! One plugin instance and the envs living in it, plus what the pool needs
//! to rebuild them: when the instance faults, a fresh one is made and every
//! other env's episode is replayed from its seed and actions. Plugins are
//! deterministic by contract, so the replay lands in exactly the same state
//! and those envs never notice.

use crate::bindings::exports::ragen::env::environment::StepResult;
use crate::bindings::ragen::env::types::EnvError;
use crate::instance::{EnvHandle, PluginInstance};
use crate::plugin::Plugin;
use crate::pool::{EnvFailure, FailureKind, PoolStep};
use crate::sandbox::Fault;
use std::sync::Arc;

/// Where an env's episode stands, as the host remembers it.
#[derive(Clone, Debug)]
enum Episode {
    /// Never reset.
    Fresh,
    /// Running since `reset(seed)`, with these actions taken since.
    Running { seed: u64, actions: Vec<u32> },
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

pub(crate) struct Shard {
    plugin: Arc<Plugin>,
    settings: Arc<Vec<(String, String)>>,
    instance: PluginInstance,
    slots: Vec<Slot>,
    /// Instances replaced after a fault.
    pub(crate) restarts: usize,
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
    pub(crate) fn new(plugin: Arc<Plugin>, settings: Arc<Vec<(String, String)>>, ids: &[usize]) -> anyhow::Result<Self> {
        let mut instance = plugin.instantiate()?;
        let mut slots = Vec::with_capacity(ids.len());
        for &id in ids {
            let handle = instance.create(&settings)?.map_err(|e| anyhow::anyhow!("the plugin rejected the settings: {}", e.message))?;
            slots.push(Slot { id, handle: Some(handle), episode: Episode::Fresh });
        }
        Ok(Self { plugin, settings, instance, slots, restarts: 0 })
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
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
            Ok(Err(e)) => Err(self.env_error(slot, Some(seed), e)),
            Ok(Ok(observation)) => match self.check_observation(&observation) {
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

    pub(crate) fn step(&mut self, slot: usize, action: u32, autoreset: bool) -> Result<PoolStep, EnvFailure> {
        // Copy out what decides the branch; cloning the episode would copy
        // its whole action history on every step.
        let seed = match self.slots[slot].episode {
            Episode::Running { seed, .. } => seed,
            Episode::Fresh => {
                let message = "step before the first reset; reset the env first".to_string();
                return Err(self.failure(slot, None, FailureKind::Env(crate::ErrorKind::NotStarted), message));
            }
            Episode::Over { seed } | Episode::Failed { seed: Some(seed), .. } if autoreset => {
                // Next-step autoreset: this call starts the next episode and
                // the action is not used.
                let next = next_seed(seed);
                let observation = self.reset(slot, next)?;
                return Ok(PoolStep::autoreset(observation, next));
            }
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
        let Some(handle) = self.slots[slot].handle else {
            return Err(self.unavailable(slot, Some(seed)));
        };
        match self.instance.step(handle, action) {
            Err(fault) => Err(self.fault(slot, Some(seed), fault)),
            Ok(Err(e)) => Err(self.env_error(slot, Some(seed), e)),
            Ok(Ok(r)) => {
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
        self.restarts += 1;
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
                    Episode::Running { seed, actions } => Self::replay(&mut instance, handle, *seed, actions),
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
    fn replay(instance: &mut PluginInstance, handle: EnvHandle, seed: u64, actions: &[u32]) -> Result<(), String> {
        match instance.reset(handle, seed) {
            Err(fault) => return Err(format!("reset(seed {seed}) faulted: {fault}")),
            Ok(Err(e)) => return Err(format!("reset(seed {seed}) failed: {}", e.message)),
            Ok(Ok(_)) => {}
        }
        for (n, &a) in actions.iter().enumerate() {
            match instance.step(handle, a) {
                Err(fault) => return Err(format!("step {} (action {a}) faulted: {fault}", n + 1)),
                Ok(Err(e)) => return Err(format!("step {} (action {a}) failed: {}", n + 1, e.message)),
                Ok(Ok(_)) => {}
            }
        }
        Ok(())
    }
}
