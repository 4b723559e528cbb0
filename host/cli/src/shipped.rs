//! The environments this build also carries compiled natively (Bandit,
//! Sokoban, FrozenLake, Countdown), and the extras that knowing an env's
//! rules buys: `bench`'s native baseline and `eval`'s optimal-policy bound.
//! (The env's own best play is the plugin's to give, through the
//! contract's `oracle`; this module only checks it in its tests.)
//!
//! The host's libraries (runtime, agent, learner, policy) know no env by
//! name; this module is the only place that does, and it never trusts a
//! name alone. A plugin is matched to its native twin only when the twin,
//! created with the same settings, has the same action names and starts
//! the first [`PROBE_SEEDS`] seeds in the same states. A plugin that merely
//! calls itself "sokoban" gets no native comparison and no bound, rather
//! than wrong ones.

use anyhow::{Result, anyhow};
use ragen_agent::LoopLimits;
use ragen_env_countdown::Countdown;
use ragen_env_frozenlake::FrozenLake;
use ragen_env_sdk::{CheckedEnv, EnvError, Environment};
use ragen_env_sokoban::Sokoban;
use ragen_runtime::{EnvHandle, PluginInstance};

/// Seeds whose first states must agree for a plugin to match its twin.
pub const PROBE_SEEDS: u64 = 4;

/// A native env known to behave exactly as the plugin it was matched to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Twin {
    Bandit,
    Sokoban,
    FrozenLake,
    Countdown,
}

fn err(e: EnvError) -> anyhow::Error {
    anyhow!("{}", e.message)
}

impl Twin {
    /// The native twin of the plugin instance's env `env` (already
    /// created with `settings`), if the plugin's name says it has one and
    /// its actions and first states prove it. Resets `env`.
    pub fn find(name: &str, inst: &mut PluginInstance, env: EnvHandle, settings: &[(String, String)]) -> Result<Option<Twin>> {
        let twin = match name {
            "bandit" => Twin::Bandit,
            "sokoban" => Twin::Sokoban,
            "frozenlake" => Twin::FrozenLake,
            "countdown" => Twin::Countdown,
            _ => return Ok(None),
        };
        let same = match twin {
            Twin::Bandit => same_as::<ragen_env_bandit::Bandit>(inst, env, settings)?,
            Twin::Sokoban => same_as::<Sokoban>(inst, env, settings)?,
            Twin::FrozenLake => same_as::<FrozenLake>(inst, env, settings)?,
            Twin::Countdown => same_as::<Countdown>(inst, env, settings)?,
        };
        Ok(same.then_some(twin))
    }

    /// Mean success of the best possible play over `seeds`, within the
    /// loop's action budget and the env's own step limit. The env is
    /// rebuilt natively from the same settings, so the initial states are
    /// exactly the plugin's.
    pub fn optimal_success(self, settings: &[(String, String)], seeds: &[u64], limits: LoopLimits, max_steps: u32) -> Result<f64> {
        let budget = limits.max_actions_per_traj.min(limits.max_turn * limits.max_actions_per_turn).min(max_steps);
        let per_seed: Vec<f64> = match self {
            Twin::Bandit => seeds.iter().map(|_| 1.0).collect(),
            Twin::Sokoban => {
                let env = CheckedEnv::<Sokoban>::create(settings).map_err(err)?;
                seeds
                    .iter()
                    .map(|&s| {
                        let room = env.inner().initial_room(s).map_err(err)?;
                        let path = ragen_env_sokoban::solver::solve(&room, 5_000_000).map_err(|e| anyhow!("solver: {e:?}"))?;
                        Ok(path.is_some_and(|p| p.len() as u32 <= budget) as u8 as f64)
                    })
                    .collect::<Result<_>>()?
            }
            Twin::FrozenLake => {
                let env = CheckedEnv::<FrozenLake>::create(settings).map_err(err)?;
                seeds
                    .iter()
                    .map(|&s| {
                        let lake = env.inner().initial_lake(s).map_err(err)?;
                        let values = ragen_env_frozenlake::values::value_iteration(&lake, env.inner().slip(), budget);
                        Ok(values.value[lake.start()])
                    })
                    .collect::<Result<_>>()?
            }
            Twin::Countdown => {
                let env = CheckedEnv::<Countdown>::create(settings).map_err(err)?;
                seeds
                    .iter()
                    .map(|&s| {
                        let p = env.inner().puzzle(s);
                        let solvable = budget >= 1 && ragen_env_countdown::solver::solve(&p.numbers, p.target).is_some();
                        Ok(solvable as u8 as f64)
                    })
                    .collect::<Result<_>>()?
            }
        };
        Ok(per_seed.iter().sum::<f64>() / per_seed.len().max(1) as f64)
    }

    /// `bench`'s native side: the same workload on the twin.
    pub fn bench_native(
        self,
        opts: &crate::commands::bench::Options,
        num_actions: usize,
        budget: std::time::Duration,
    ) -> Result<crate::commands::bench::Rates> {
        use crate::commands::bench::native;
        match self {
            Twin::Bandit => native::<ragen_env_bandit::Bandit>(opts, num_actions, budget),
            Twin::Sokoban => native::<Sokoban>(opts, num_actions, budget),
            Twin::FrozenLake => native::<FrozenLake>(opts, num_actions, budget),
            Twin::Countdown => Err(anyhow!("bench has no text-action workload; Countdown is timed by `validate`")),
        }
    }
}

/// Whether native `E` with `settings` has the plugin's action names and
/// starts the probe seeds in the plugin's states.
fn same_as<E: Environment>(inst: &mut PluginInstance, env: EnvHandle, settings: &[(String, String)]) -> Result<bool> {
    let Ok(mut native) = CheckedEnv::<E>::create(settings) else { return Ok(false) };
    if native.spec().action_space.as_names() != inst.spec(env)?.action_names() {
        return Ok(false);
    }
    for seed in 0..PROBE_SEEDS {
        let plugin = inst.reset(env, seed)?;
        if plugin.ok() != native.reset(seed).ok() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    //! Against the built plugins (`make plugins`), through the same loop
    //! `eval` uses.
    use super::*;
    use ragen_agent::policies::{OraclePolicy, RandomPolicy};
    use ragen_agent::{EVAL_SEED_START, PromptTemplates, RolloutConfig, RolloutRunner, summarize};
    use ragen_runtime::{EnvProvider, LocalPlugin, Plugin};
    use std::sync::Arc;

    fn plugin(name: &str) -> Arc<dyn EnvProvider> {
        LocalPlugin::provider(Plugin::from_file(ragen_test_fixtures::plugin(name)).unwrap())
    }

    fn runner(name: &str, groups: usize) -> RolloutRunner {
        let config = RolloutConfig { env_groups: groups, group_size: 1, ..RolloutConfig::default() };
        RolloutRunner::new(plugin(name), &[], config, PromptTemplates::default(), 2).unwrap()
    }

    fn twin(name: &str, claimed: &str) -> Option<Twin> {
        let plugin = plugin(name);
        let mut inst = plugin.plugin().expect("a plugin in process").instantiate().unwrap();
        let env = inst.create(&[]).unwrap().unwrap();
        Twin::find(claimed, &mut inst, env, &[]).unwrap()
    }

    #[test]
    fn a_plugin_is_matched_by_its_behaviour_not_its_name() {
        assert_eq!(twin("sokoban", "sokoban"), Some(Twin::Sokoban));
        assert_eq!(twin("frozenlake", "frozenlake"), Some(Twin::FrozenLake));
        assert_eq!(twin("bandit", "bandit"), Some(Twin::Bandit));
        // A plugin that calls itself by another shipped name is not taken for it.
        assert_eq!(twin("frozenlake", "sokoban"), None);
        assert_eq!(twin("bandit", "frozenlake"), None);
        assert_eq!(twin("sokoban", "corridor"), None);
    }

    #[test]
    fn the_sokoban_oracle_solves_every_room_whose_solution_fits_the_budget() {
        let r = runner("sokoban", 64);
        let seeds: Vec<u64> = (0..64).map(|i| EVAL_SEED_START + i).collect();
        let ts = r.run(&mut OraclePolicy, &seeds).unwrap();
        let env = CheckedEnv::<Sokoban>::with(&[]).unwrap();
        let budget = r.limits().max_actions_per_traj as usize;
        let mut fits = 0;
        for t in &ts {
            let room = env.inner().initial_room(t.seed).unwrap();
            let shortest = ragen_env_sokoban::solver::solve(&room, 1_000_000).unwrap().unwrap().len();
            if shortest <= budget {
                fits += 1;
                assert!(t.success, "seed {}: solution of {shortest} moves fits {budget} but was not found:\n{}", t.seed, t.transcript());
                assert_eq!(t.num_actions, shortest, "seed {}: the oracle takes the shortest path", t.seed);
                assert_eq!(t.penalty, 0.0);
            }
            assert!(t.failure.is_none());
        }
        assert!(fits >= 48, "only {fits} of 64 rooms fit the budget");
        let bound = Twin::Sokoban.optimal_success(&[], &seeds, r.limits(), 100).unwrap();
        assert_eq!(bound, fits as f64 / 64.0, "the bound counts the same rooms");
    }

    #[test]
    fn the_oracles_reach_the_optimal_bound() {
        let seeds: Vec<u64> = (0..256).map(|i| EVAL_SEED_START + i).collect();
        for (name, twin, slack) in
            [("bandit", Twin::Bandit, 0.0), ("countdown", Twin::Countdown, 0.0), ("frozenlake", Twin::FrozenLake, 0.1)]
        {
            // The bound plays FrozenLake seeing the state after every move,
            // which the loop allows with one action a turn (the FrozenLake
            // recipe's ten turns of one action): the slippery lake's oracle
            // gives one move a turn.
            let config = match name {
                "frozenlake" => RolloutConfig { max_turn: Some(10), max_actions_per_turn: Some(1), ..RolloutConfig::default() },
                _ => RolloutConfig::default(),
            };
            let config = RolloutConfig { env_groups: 256, group_size: 1, ..config };
            let r = RolloutRunner::new(plugin(name), &[], config, PromptTemplates::default(), 2).unwrap();
            let ts = r.run(&mut OraclePolicy, &seeds).unwrap();
            let m = summarize(&ts);
            let bound = twin.optimal_success(&[], &seeds, r.limits(), r.spec().limits.max_steps).unwrap();
            assert_eq!(m.failures, 0, "{name}: {:?}", ts.iter().find_map(|t| t.failure.clone()));
            assert_eq!(m.format_valid_ratio, 1.0, "{name}");
            // FrozenLake's bound is an expectation over slips: 256 episodes
            // land within a few standard errors (about 0.03) of it.
            assert!((m.success_rate - bound).abs() <= slack + 1e-9, "{name}: the oracle's {} against the bound {bound}", m.success_rate);
        }
    }

    #[test]
    fn random_baselines_stay_under_the_optimal_bound() {
        let seeds: Vec<u64> = (0..256).map(|i| EVAL_SEED_START + i).collect();
        for (name, twin) in [("bandit", Twin::Bandit), ("sokoban", Twin::Sokoban), ("frozenlake", Twin::FrozenLake)] {
            let r = runner(name, 256);
            let ts = r.run(&mut RandomPolicy::new(7), &seeds).unwrap();
            let m = summarize(&ts);
            let bound = twin.optimal_success(&[], &seeds, r.limits(), r.spec().limits.max_steps).unwrap();
            assert_eq!(m.trajectories, 256);
            assert_eq!(m.failures, 0);
            // Random replies are always well formed with known names.
            assert_eq!(m.valid_action_ratio, 1.0);
            assert!(ts.iter().all(|t| t.penalty == 0.0));
            assert!(m.success_rate <= bound + 1e-9, "{name}: random {} beats the optimal bound {bound}", m.success_rate);
            if name == "bandit" {
                assert!((m.success_rate - 0.5).abs() < 0.1, "bandit random success {}", m.success_rate);
                assert_eq!(bound, 1.0);
            }
        }
    }
}
