//! Sokoban: push every box onto a target (multi-turn, deterministic).
//!
//! Rooms are generated from the seed as in the reference (see [`generate`]),
//! or come from the user: one fixed `level` in the configured symbols, or a
//! Boxoban-style file of many `levels` (XSB notation) picked by seed.
//! Rewards are the reference's: -0.1 per step, +1 when a box reaches a
//! target, -1 when one leaves it, +10 when all are on targets.

pub mod generate;
pub mod room;
pub mod solver;
pub mod symbols;

use generate::MAX_BOXES;
use ragen_env_sdk::{ActionSpace, Config, ConfigKey, EnvError, EnvSpec, Environment, Limits, Oracle, PluginInfo, StepInfo, StepOutcome};
use room::{Dir, Room};
use symbols::Symbols;

pub const PENALTY_FOR_STEP: f64 = -0.1;
pub const REWARD_BOX_ON_TARGET: f64 = 1.0;
pub const PENALTY_BOX_OFF_TARGET: f64 = -1.0;
pub const REWARD_FINISHED: f64 = 10.0;

/// Where rooms come from.
#[derive(Clone, Debug)]
enum Source {
    Generated {
        width: usize,
        height: usize,
        num_boxes: usize,
        search_depth: u32,
    },
    /// One fixed level, the same on every reset.
    Fixed(Room),
    /// Many levels; reset(seed) plays level `seed % len`.
    Levels(Vec<Room>),
}

#[derive(Debug)]
pub struct Sokoban {
    source: Source,
    symbols: Symbols,
    max_steps: u32,
    room: Option<Room>,
    steps: u32,
    boxes_on_target: usize,
}

impl Sokoban {
    /// The current room (`None` before the first reset).
    pub fn room(&self) -> Option<&Room> {
        self.room.as_ref()
    }

    /// The room `reset(seed)` starts from, without touching an episode.
    pub fn initial_room(&self, seed: u64) -> Result<Room, EnvError> {
        match &self.source {
            Source::Generated { width, height, num_boxes, search_depth } => {
                generate::generate(seed, *width, *height, *num_boxes, *search_depth).map(|g| g.room).map_err(EnvError::failed)
            }
            Source::Fixed(room) => Ok(room.clone()),
            Source::Levels(levels) => Ok(levels[(seed % levels.len() as u64) as usize].clone()),
        }
    }
}

fn source(config: &Config, symbols: &Symbols) -> Result<Source, EnvError> {
    let level = config.str("level").trim_matches('\n');
    let levels = config.str("levels");
    if !level.is_empty() || !levels.trim().is_empty() {
        let key = if level.is_empty() { "levels" } else { "level" };
        for other in ["dim_x", "dim_y", "num_boxes", "search_depth"] {
            if config.is_given(other) {
                return Err(EnvError::bad_value(other, format!("cannot be combined with `{key}`, which fixes the room; drop one of them")));
            }
        }
        if !level.is_empty() && !levels.trim().is_empty() {
            return Err(EnvError::bad_value("levels", "cannot be combined with `level`; give one fixed level or a file of levels"));
        }
        let check = |room: &Room, what: &str| {
            if room.is_solved() { Err(EnvError::bad_value(key, format!("{what} has every box on a target already"))) } else { Ok(()) }
        };
        if !level.is_empty() {
            let room = symbols.parse_level(level).map_err(|e| EnvError::bad_value("level", e))?;
            check(&room, "the level")?;
            return Ok(Source::Fixed(room));
        }
        let rooms = symbols::parse_boxoban(levels).map_err(|e| EnvError::bad_value("levels", e))?;
        for (i, room) in rooms.iter().enumerate() {
            check(room, &format!("level {i}"))?;
        }
        return Ok(Source::Levels(rooms));
    }
    let width = config.int_in("dim_x", 4usize, 32)?;
    let height = config.int_in("dim_y", 4usize, 32)?;
    let interior = (width - 2) * (height - 2);
    let num_boxes = config.int_in("num_boxes", 1usize, MAX_BOXES)?;
    if num_boxes + 2 > interior {
        return Err(EnvError::bad_value(
            "num_boxes",
            format!(
                "{num_boxes} boxes do not fit in a {width}x{height} room: it has {interior} cells inside its walls, \
                 and the player plus the boxes need at least {} of them; use at most {} boxes or a larger room",
                num_boxes + 2,
                interior.saturating_sub(2)
            ),
        ));
    }
    let search_depth = config.int_in("search_depth", 1u32, 100_000)?;
    Ok(Source::Generated { width, height, num_boxes, search_depth })
}

impl Environment for Sokoban {
    type Action = u32;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "sokoban".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Sokoban: push every box onto a target; rooms generated from the seed or loaded as levels.".into(),
            multi_turn: true,
            config_keys: vec![
                ConfigKey::new("dim_x", 6, "room width in cells, walls included (4..=32)"),
                ConfigKey::new("dim_y", 6, "room height in cells, walls included (4..=32)"),
                ConfigKey::new("num_boxes", 1, "boxes (and targets) per room (1..=9)"),
                ConfigKey::new("max_steps", 100, "steps after which the episode ends unsolved"),
                ConfigKey::new("search_depth", 300, "depth of the generator's reverse-play search"),
                ConfigKey::new("symbols", Symbols::DEFAULT, "7 symbols: wall, floor, target, box, box on target, player, player on target"),
                ConfigKey::new("level", "", "a fixed level, rows separated by newlines, in `symbols`"),
                ConfigKey::new("levels", "", "a Boxoban-style file (XSB levels after `; N` lines); reset(seed) plays level seed % count"),
            ],
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        let symbols = Symbols::parse(config.str("symbols")).map_err(|e| EnvError::bad_value("symbols", e))?;
        let source = source(config, &symbols)?;
        let max_steps = config.int_in("max_steps", 1u32, 1_000_000)?;
        Ok(Self { source, symbols, max_steps, room: None, steps: 0, boxes_on_target: 0 })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec {
            instructions: "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. \
                When you are right next to a box, you can push it by moving in the same direction. \
                You cannot push a box through a wall, and you cannot pull a box. \
                The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>"
                .into(),
            legend: self.symbols.legend(),
            action_space: ActionSpace::Names(Dir::ALL.iter().map(|d| d.name().to_string()).collect()),
            limits: Limits { max_actions_per_episode: 10, max_actions_per_turn: 5, max_turns: 5, max_steps: self.max_steps },
            metrics: vec!["boxes_on_target".into()],
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        let room = self.initial_room(seed)?;
        self.boxes_on_target = room.boxes_on_target();
        self.steps = 0;
        self.room = Some(room);
        Ok(self.render())
    }

    fn step(&mut self, action: u32) -> StepOutcome {
        let room = self.room.as_mut().expect("CheckedEnv steps only after reset");
        self.steps += 1;
        let moved = room.push_move(Dir::from_action(action));
        let now = room.boxes_on_target();
        let mut reward = PENALTY_FOR_STEP;
        if now > self.boxes_on_target {
            reward += REWARD_BOX_ON_TARGET;
        } else if now < self.boxes_on_target {
            reward += PENALTY_BOX_OFF_TARGET;
        }
        let solved = room.is_solved();
        if solved {
            reward += REWARD_FINISHED;
        }
        self.boxes_on_target = now;
        StepOutcome {
            observation: self.render(),
            reward,
            done: solved || self.steps >= self.max_steps,
            info: StepInfo { success: solved, action_is_valid: true, action_is_effective: moved.player, metrics: vec![now as f64] },
        }
    }

    fn render(&self) -> String {
        self.room.as_ref().map(|r| self.symbols.render(r)).unwrap_or_default()
    }
}

/// States the oracle's breadth-first search may visit before it gives up.
pub const ORACLE_MAX_STATES: usize = 2_000_000;

/// The next moves of a shortest solution from the current room, found by
/// breadth-first search; `Up` when the room has none (a box pushed into a
/// corner) or the search gives up.
impl Oracle for Sokoban {
    fn best_actions(&self, max_actions: u32) -> Vec<u32> {
        let room = self.room.as_ref().expect("CheckedEnv asks the oracle only during an episode");
        let path = solver::solve(room, ORACLE_MAX_STATES).ok().flatten().filter(|p| !p.is_empty()).unwrap_or(vec![Dir::Up]);
        path.iter().take(max_actions as usize).map(|d| Dir::ALL.iter().position(|a| a == d).expect("a direction") as u32).collect()
    }
}

ragen_env_sdk::export_env!(Sokoban, oracle);

#[cfg(test)]
mod tests;
