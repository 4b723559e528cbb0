//! FrozenLake: walk from the start to the goal across a slippery lake
//! without falling into a hole (multi-turn, stochastic).
//!
//! As in the reference, a new map is generated from the seed on every reset
//! (or a fixed `map` is played), the intended move happens with probability
//! `success_rate` (1/3 by default; the rest split between the two
//! perpendicular moves), moving off the map leaves the player in place, and
//! reaching the goal pays 1.

pub mod lake;
pub mod values;

use lake::{Dir, Lake, Tile};
use ragen_env_sdk::{
    ActionSpace, Config, ConfigKey, EnvError, EnvSpec, Environment, LegendEntry, Limits, Oracle, PluginInfo, SeedRng, StepInfo, StepOutcome,
};
use values::Slip;

/// Map draws per reset before giving up (only reachable with tiny `p`).
const MAX_MAP_DRAWS: usize = 100_000;

#[derive(Debug)]
pub struct FrozenLake {
    size: usize,
    p: f64,
    slip: Slip,
    max_steps: u32,
    fixed: Option<Lake>,
    lake: Option<Lake>,
    player: usize,
    steps: u32,
    /// Slips are drawn from their own stream so map generation and
    /// dynamics never shift each other.
    dynamics: SeedRng,
}

impl FrozenLake {
    /// The current map (`None` before the first reset).
    pub fn lake(&self) -> Option<&Lake> {
        self.lake.as_ref()
    }

    pub fn player(&self) -> usize {
        self.player
    }

    /// How moves turn out under this configuration.
    pub fn slip(&self) -> Slip {
        self.slip
    }

    /// The map `reset(seed)` plays, without starting an episode.
    pub fn initial_lake(&self, seed: u64) -> Result<Lake, EnvError> {
        if let Some(fixed) = &self.fixed {
            return Ok(fixed.clone());
        }
        Lake::generate(&mut SeedRng::stream(seed, 0), self.size, self.p, MAX_MAP_DRAWS).ok_or_else(|| {
            EnvError::failed(format!(
                "no {0}x{0} map with a reachable goal in {MAX_MAP_DRAWS} draws at p = {1}; raise p",
                self.size, self.p
            ))
        })
    }

    fn symbol(&self, lake: &Lake, cell: usize) -> char {
        match (cell == self.player, lake.tile(cell)) {
            (true, Tile::Hole) => 'X',
            (true, Tile::Goal) => '√',
            (true, Tile::Frozen) => 'P',
            (false, Tile::Hole) => 'O',
            (false, Tile::Goal) => 'G',
            (false, Tile::Frozen) => '_',
        }
    }
}

impl Environment for FrozenLake {
    type Action = u32;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "frozenlake".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "FrozenLake: reach the goal across slippery ice without falling into a hole.".into(),
            multi_turn: true,
            config_keys: vec![
                ConfigKey::new("size", 4, "side of the square map (2..=16)"),
                ConfigKey::new("p", 0.8, "probability that a generated tile is frozen (not a hole)"),
                ConfigKey::new("is_slippery", true, "whether moves can slip sideways"),
                ConfigKey::new("success_rate", 1.0 / 3.0, "when slippery, probability the intended move happens"),
                ConfigKey::new("max_steps", 100, "steps after which the episode ends unsolved"),
                ConfigKey::new("map", "", "a fixed map in S/F/H/G letters, rows separated by newlines or `/`"),
            ],
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        let fixed = match config.str("map").trim() {
            "" => None,
            text => Some(Lake::parse(text).map_err(|e| EnvError::bad_value("map", e))?),
        };
        if fixed.is_some() {
            for key in ["size", "p"] {
                if config.is_given(key) {
                    return Err(EnvError::bad_value(key, "cannot be combined with `map`, which fixes the lake; drop one of them"));
                }
            }
        }
        let slippery = config.bool("is_slippery")?;
        let success_rate = config.f64_in("success_rate", 0.0, 1.0)?;
        Ok(Self {
            size: config.int_in("size", 2usize, 16)?,
            p: config.f64_in("p", 0.0, 1.0).and_then(|p| {
                if p > 0.0 { Ok(p) } else { Err(EnvError::bad_value("p", "0 makes every tile a hole; use a value in (0, 1]")) }
            })?,
            slip: Slip { success_rate: if slippery { success_rate } else { 1.0 } },
            max_steps: config.int_in("max_steps", 1u32, 1_000_000)?,
            fixed,
            lake: None,
            player: 0,
            steps: 0,
            dynamics: SeedRng::new(0),
        })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec {
            instructions: "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal. \
                The ice is slippery: you may move in a direction you did not intend. \
                The answer should be a sequence of actions, like <answer>Left || Up</answer>"
                .into(),
            legend: vec![
                LegendEntry::new('P', "player"),
                LegendEntry::new('_', "frozen"),
                LegendEntry::new('O', "hole"),
                LegendEntry::new('G', "goal"),
                LegendEntry::new('X', "player in hole"),
                LegendEntry::new('√', "player on goal"),
            ],
            action_space: ActionSpace::Names(Dir::ALL.iter().map(|d| d.name().to_string()).collect()),
            limits: Limits {
                max_actions_per_episode: MAX_ACTIONS_PER_EPISODE,
                max_actions_per_turn: 5,
                max_turns: 5,
                max_steps: self.max_steps,
            },
            metrics: vec!["slipped".into()],
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        let lake = self.initial_lake(seed)?;
        self.player = lake.start();
        self.lake = Some(lake);
        self.steps = 0;
        self.dynamics = SeedRng::stream(seed, 1);
        Ok(self.render())
    }

    fn step(&mut self, action: u32) -> StepOutcome {
        let lake = self.lake.as_ref().expect("CheckedEnv steps only after reset");
        let intended = Dir::ALL[action as usize];
        // Draw the direction taken from the slip distribution.
        let outcomes = self.slip.outcomes(intended);
        let mut u = self.dynamics.unit();
        let mut taken = outcomes[2].0;
        for (dir, p) in outcomes {
            if u < p {
                taken = dir;
                break;
            }
            u -= p;
        }
        let next = lake.moved(self.player, taken);
        let effective = next != self.player;
        self.player = next;
        self.steps += 1;
        let tile = lake.tile(next);
        let success = tile == Tile::Goal;
        StepOutcome {
            observation: self.render(),
            reward: if success { 1.0 } else { 0.0 },
            done: success || tile == Tile::Hole || self.steps >= self.max_steps,
            info: StepInfo {
                success,
                action_is_valid: true,
                action_is_effective: effective,
                metrics: vec![(taken != intended) as u8 as f64],
            },
        }
    }

    fn render(&self) -> String {
        let Some(lake) = &self.lake else { return String::new() };
        let n = lake.size();
        // One allocation: inside the sandbox each one costs far more than
        // the rendering itself (`√` is 3 bytes).
        let mut out = String::with_capacity(n * n + 2 + n);
        for cell in 0..n * n {
            if cell > 0 && cell % n == 0 {
                out.push('\n');
            }
            out.push(self.symbol(lake, cell));
        }
        out
    }
}

/// A first move from `cell` that reaches the goal with the best probability
/// `horizon` moves allow, as soon as possible: value iteration's move for
/// the shortest horizon that already attains that probability. (With the
/// full horizon every move that keeps the best probability ties, walking
/// into a wall among them while moves are to spare.)
fn fastest_best_move(lake: &Lake, slip: Slip, cell: usize, horizon: u32) -> Dir {
    let by_horizon: Vec<values::Values> = (1..=horizon).map(|h| values::value_iteration(lake, slip, h)).collect();
    let best = by_horizon.last().expect("a horizon of at least 1").value[cell];
    let fastest = by_horizon.iter().find(|v| v.value[cell] >= best - 1e-9).expect("the last horizon attains it");
    fastest.policy[cell]
}

/// The action budget the spec recommends (RAGEN's `max_actions_per_traj`).
const MAX_ACTIONS_PER_EPISODE: u32 = 10;

/// The move that most likely reaches the goal within the actions left (the
/// recommended budget or the step limit, whichever ends first), by value
/// iteration on the slippery lake. On a slippery lake that is one move,
/// since the plan after it depends on where the agent lands; without slips
/// the plan runs on, each move chosen for the horizon then left.
impl Oracle for FrozenLake {
    fn best_actions(&self, max_actions: u32) -> Vec<u32> {
        let lake = self.lake.as_ref().expect("CheckedEnv asks the oracle only during an episode");
        let left = MAX_ACTIONS_PER_EPISODE.min(self.max_steps).saturating_sub(self.steps).max(1);
        let moves = if self.slip.success_rate < 1.0 { 1 } else { max_actions.min(left).max(1) };
        let mut cell = self.player;
        let mut plan = Vec::with_capacity(moves as usize);
        for i in 0..moves {
            let dir = fastest_best_move(lake, self.slip, cell, left - i);
            plan.push(Dir::ALL.iter().position(|&d| d == dir).expect("a direction") as u32);
            cell = lake.moved(cell, dir);
            if lake.tile(cell) != Tile::Frozen {
                break;
            }
        }
        plan
    }
}

ragen_env_sdk::export_env!(FrozenLake, oracle);

#[cfg(test)]
mod tests;
