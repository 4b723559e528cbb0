//! The optimal policy's success on given seeds, where a solver exists, so a
//! learned success rate can be read against its ceiling.

use crate::rollout::LoopLimits;
use anyhow::{Result, anyhow};
use ragen_env_frozenlake::FrozenLake;
use ragen_env_frozenlake::values::value_iteration;
use ragen_env_sdk::CheckedEnv;
use ragen_env_sokoban::Sokoban;
use ragen_env_sokoban::solver;

/// Mean success of the best possible play over `seeds`, within the loop's
/// action budget (and the env's own step limit). `None` for plugins we have
/// no solver for. The env is rebuilt natively from the same settings, so the
/// initial states are exactly the plugin's.
pub fn optimal_success(
    plugin_name: &str,
    settings: &[(String, String)],
    seeds: &[u64],
    limits: LoopLimits,
    max_steps: u32,
) -> Result<Option<f64>> {
    let budget = limits.max_actions_per_traj.min(limits.max_turn * limits.max_actions_per_turn).min(max_steps);
    let err = |e: ragen_env_sdk::EnvError| anyhow!("{}", e.message);
    let per_seed: Vec<f64> = match plugin_name {
        "bandit" => seeds.iter().map(|_| 1.0).collect(),
        "sokoban" => {
            let env = CheckedEnv::<Sokoban>::create(settings).map_err(err)?;
            seeds
                .iter()
                .map(|&s| {
                    let room = env.inner().initial_room(s).map_err(err)?;
                    let path = solver::solve(&room, 5_000_000).map_err(|e| anyhow!("solver: {e:?}"))?;
                    Ok(path.is_some_and(|p| p.len() as u32 <= budget) as u8 as f64)
                })
                .collect::<Result<_>>()?
        }
        "frozenlake" => {
            let env = CheckedEnv::<FrozenLake>::create(settings).map_err(err)?;
            seeds
                .iter()
                .map(|&s| {
                    let lake = env.inner().initial_lake(s).map_err(err)?;
                    Ok(value_iteration(&lake, env.inner().slip(), budget).value[lake.start()])
                })
                .collect::<Result<_>>()?
        }
        _ => return Ok(None),
    };
    Ok(Some(per_seed.iter().sum::<f64>() / per_seed.len().max(1) as f64))
}
