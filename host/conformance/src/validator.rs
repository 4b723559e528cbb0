//! What the checks share: the plugin and its description, the run's
//! budget, fresh instances and envs, pseudo-random actions drawn from a
//! seed, played episodes, and faults turned into what to fix.

use crate::{Described, Options, metadata_check};
use ragen_rng::SeedRng;
use ragen_runtime::{Action, ActionSpace, EnvHandle, EnvSpec, Fault, FaultKind, Plugin, PluginInfo, PluginInstance, Problem, StepResult};
use std::time::Instant;

/// An action as a report shows it: an id, or text cut to 20 characters.
pub(crate) fn short(action: &Action) -> String {
    match action {
        Action::Id(id) => format!("id {id}"),
        Action::Text(t) if t.chars().count() > 20 => format!("text of {} bytes", t.len()),
        Action::Text(t) => format!("text {t:?}"),
    }
}

/// What to do about a fault, for the plugin author.
fn fix_for(fault: &Fault) -> &'static str {
    match fault.kind {
        FaultKind::Timeout => "fix: a call must return promptly; look for an endless loop (or raise --call-timeout-ms if it is only slow)",
        FaultKind::MemoryCap => "fix: memory grows without bound; look for a leak or unbounded buffer (or raise --memory-mib)",
        FaultKind::Trap if fault.message.contains("overflowed its stack") => "fix: bound the recursion, or turn it into a loop",
        FaultKind::Trap => "fix: the plugin panicked or hit `unreachable`; return an env-error result instead of trapping",
        FaultKind::Contract if fault.message.contains(" results for ") => {
            "fix: a batched call must return exactly one result per env it was given, in the order given"
        }
        FaultKind::Contract => "fix: keep the plugin's self-description within the host's limits (see `ReportLimits`)",
    }
}

pub(crate) fn faulted(context: &str, fault: &Fault) -> String {
    format!("{context}: {} ({})", fault.message, fix_for(fault))
}

/// The `metadata` check: its verdict, every problem the spec checker
/// found, and, when it passed, what the other checks play by.
pub(crate) fn describe(plugin: &Plugin, opts: &Options) -> (Result<String, String>, Vec<Problem>, Option<Described>) {
    let (info, spec) = match reported(plugin, opts) {
        Ok(reported) => reported,
        Err(why) => return (Err(why), Vec::new(), None),
    };
    let (verdict, problems) = metadata_check(&plugin.limits().report, &info, &spec);
    let described = verdict.is_ok().then(|| Described {
        space: spec.action_space,
        num_metrics: spec.metrics.len(),
        max_steps: spec.limits.max_steps.max(1),
        max_actions_per_episode: spec.limits.max_actions_per_episode.max(1),
        max_actions_per_turn: spec.limits.max_actions_per_turn.max(1),
    });
    (verdict, problems, described)
}

/// The plugin's info and an env's spec as it gave them, before the
/// runtime's checker (which would refuse one with an error): the suite
/// lists every problem at once, errors and warnings.
fn reported(plugin: &Plugin, opts: &Options) -> Result<(PluginInfo, EnvSpec), String> {
    let mut inst = plugin.instantiate().map_err(|e| format!("cannot instantiate: {e:#}"))?;
    let info = inst.info_unchecked().map_err(|f| faulted("info", &f))?;
    let env = inst
        .create(&opts.settings)
        .map_err(|f| faulted("create", &f))?
        .map_err(|e| format!("create with the given settings failed: {}", e.message))?;
    let spec = inst.spec_unchecked(env).map_err(|f| faulted("spec", &f))?;
    Ok((info, spec))
}

/// One played step, kept to compare runs.
#[derive(PartialEq)]
pub(crate) struct Record {
    pub(crate) observation: String,
    pub(crate) reward_bits: u64,
    done: bool,
    flags: (bool, bool, bool),
}

impl From<&StepResult> for Record {
    fn from(r: &StepResult) -> Self {
        Record {
            observation: r.observation.clone(),
            reward_bits: r.reward.to_bits(),
            done: r.done,
            flags: (r.info.success, r.info.action_is_valid, r.info.action_is_effective),
        }
    }
}

/// An episode as played: the first observation, each step, and every
/// reward and metric value in order.
pub(crate) type Played = (String, Vec<Record>, Vec<f64>);

/// Characters random text actions are drawn from: what an expression or an
/// answer is made of, plus the answer format's reserved marks and
/// multi-byte characters, which a text env must take without trapping.
const TEXT_ALPHABET: &[char] =
    &['0', '1', '2', '3', '7', '9', '+', '-', '*', '/', '(', ')', ' ', '.', '=', 'x', 'A', '<', '|', '\n', 'é', '√'];

/// The suite's state: the plugin, its description, and the budget.
pub(crate) struct Validator<'a> {
    pub(crate) plugin: &'a Plugin,
    pub(crate) opts: &'a Options,
    /// Seeds to play: [`Options::seeds`], at least 2.
    pub(crate) seeds: u64,
    /// When [`Options::budget`] runs out.
    deadline: Instant,
    /// The env's action space, as its spec declares it.
    pub(crate) space: ActionSpace,
    pub(crate) num_metrics: usize,
    pub(crate) max_steps: u32,
    pub(crate) max_actions_per_episode: u32,
    pub(crate) max_actions_per_turn: u32,
}

impl<'a> Validator<'a> {
    pub(crate) fn new(plugin: &'a Plugin, opts: &'a Options, deadline: Instant, described: Described) -> Self {
        let Described { space, num_metrics, max_steps, max_actions_per_episode, max_actions_per_turn } = described;
        Self {
            plugin,
            opts,
            seeds: opts.seeds.max(2),
            deadline,
            space,
            num_metrics,
            max_steps,
            max_actions_per_episode,
            max_actions_per_turn,
        }
    }
}

impl Validator<'_> {
    /// A pseudo-random action: an id, or text of up to 24 bytes.
    pub(crate) fn random_action(&self, rng: &mut SeedRng) -> Action {
        match &self.space {
            ActionSpace::Names(names) => Action::Id(rng.below(names.len()) as u32),
            ActionSpace::Text(t) => {
                let mut text = String::new();
                let len = rng.below(25);
                while text.len() < len {
                    let c = TEXT_ALPHABET[rng.below(TEXT_ALPHABET.len())];
                    if text.len() + c.len_utf8() > t.max_bytes as usize {
                        break;
                    }
                    text.push(c);
                }
                Action::Text(text)
            }
        }
    }

    /// Actions outside the space, each of which must be a bad-action error.
    pub(crate) fn bad_actions(&self) -> Vec<Action> {
        match &self.space {
            ActionSpace::Names(names) => vec![Action::Id(names.len() as u32), Action::Id(u32::MAX), Action::Text("0".into())],
            ActionSpace::Text(t) => vec![Action::Text("1".repeat(t.max_bytes as usize + 1)), Action::Id(0)],
        }
    }

    /// A valid action, for the rules checks.
    pub(crate) fn any_action(&self) -> Action {
        self.random_action(&mut SeedRng::new(0))
    }

    /// `Err` once the run's budget is spent: every loop that calls the
    /// plugin asks before each call.
    pub(crate) fn in_budget(&self) -> Result<(), String> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        Err(format!(
            "the validate budget of {} s ran out: the plugin is slow (time its reset and step), or give it longer with --budget SECONDS",
            self.opts.budget.as_secs_f64()
        ))
    }

    pub(crate) fn fresh(&self) -> Result<PluginInstance, String> {
        self.plugin.instantiate().map_err(|e| format!("cannot instantiate: {e:#}"))
    }

    /// A fresh instance with one env created from the settings.
    pub(crate) fn env(&self) -> Result<(PluginInstance, EnvHandle), String> {
        let mut inst = self.fresh()?;
        let env = self.create(&mut inst)?;
        Ok((inst, env))
    }

    /// One more env in `inst`, created from the settings.
    pub(crate) fn create(&self, inst: &mut PluginInstance) -> Result<EnvHandle, String> {
        inst.create(&self.opts.settings)
            .map_err(|f| faulted("create", &f))?
            .map_err(|e| format!("create with the given settings failed: {}", e.message))
    }

    /// Reset `env` to `seed`, for the checks that only need it done.
    pub(crate) fn reset(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64) -> Result<String, String> {
        inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset(seed {seed}) failed: {}", e.message))
    }

    /// Play one episode from `seed` with actions drawn from the seed.
    pub(crate) fn episode(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64) -> Result<Played, String> {
        self.episode_with(inst, env, seed, seed ^ 0x5eed)
    }

    /// One episode of `seed` with pseudo-random actions drawn from `action_seed`.
    pub(crate) fn episode_with(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64, action_seed: u64) -> Result<Played, String> {
        self.in_budget()?;
        let first = inst
            .reset(env, seed)
            .map_err(|f| faulted(&format!("reset(seed {seed})"), &f))?
            .map_err(|e| format!("reset(seed {seed}) failed: {}", e.message))?;
        let mut actions = SeedRng::new(action_seed);
        let (mut records, mut numbers) = (Vec::new(), Vec::new());
        for t in 0..self.max_steps.min(200) {
            self.in_budget()?;
            let a = self.random_action(&mut actions);
            let r = inst
                .step(env, a.clone())
                .map_err(|f| faulted(&format!("step {t} of seed {seed}"), &f))?
                .map_err(|e| format!("step {t} of seed {seed} (action {a}) failed: {}", e.message))?;
            numbers.push(r.reward);
            if r.info.metrics.len() != self.num_metrics {
                return Err(format!(
                    "step {t} of seed {seed} reported {} metric values but the spec names {} (fix: report one value per name in spec.metrics)",
                    r.info.metrics.len(),
                    self.num_metrics
                ));
            }
            numbers.extend(r.info.metrics.iter().copied());
            records.push(Record::from(&r));
            if r.done {
                break;
            }
        }
        Ok((first, records, numbers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_batched_result_and_a_refused_description_get_their_own_fix() {
        let contract = |message: &str| Fault { kind: FaultKind::Contract, message: message.into() };
        assert!(fix_for(&contract("step-batch: returned 3 results for 8 envs")).contains("one result per env"));
        assert!(fix_for(&contract("spec: the action list is empty")).contains("ReportLimits"));
    }
}
