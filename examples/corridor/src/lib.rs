//! Corridor: walk right to the exit before the steps run out.
//! A complete plugin in well under 100 lines, to copy from.

use ragen_env_sdk::*;

#[derive(Debug)]
pub struct Corridor {
    length: usize,
    player: usize,
    steps: u32,
}

impl Environment for Corridor {
    type Action = u32;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "corridor".into(),
            version: "0.1.0".into(),
            description: "Walk right along a corridor to reach the exit.".into(),
            multi_turn: true,
            config_keys: vec![ConfigKey::new("length", 5, "cells in the corridor (2..=50)")],
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        Ok(Self { length: config.int_in("length", 2, 50)?, player: 0, steps: 0 })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec {
            instructions: "You are in a corridor. Reach the exit E.".into(),
            legend: vec![LegendEntry::new('P', "you"), LegendEntry::new('_', "floor"), LegendEntry::new('E', "exit")],
            action_space: ActionSpace::names(&["Left", "Right"]),
            limits: Limits { max_actions_per_episode: 20, max_actions_per_turn: 5, max_turns: 5, max_steps: 20 },
            metrics: vec![],
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        // Start somewhere left of the exit, chosen by the seed. (A real env
        // draws from `SeedRng::new(seed)`; plain arithmetic keeps this one
        // identical to its Python and JavaScript twins in examples/.)
        self.player = (seed % (self.length as u64 - 1)) as usize;
        self.steps = 0;
        Ok(self.render())
    }

    fn step(&mut self, action: u32) -> StepOutcome {
        let before = self.player;
        self.player = match action {
            0 => self.player.saturating_sub(1),
            _ => (self.player + 1).min(self.length - 1),
        };
        self.steps += 1;
        let success = self.player == self.length - 1;
        StepOutcome {
            observation: self.render(),
            reward: if success { 1.0 } else { 0.0 },
            done: success || self.steps >= 20,
            info: StepInfo { success, action_is_valid: true, action_is_effective: self.player != before, metrics: vec![] },
        }
    }

    fn render(&self) -> String {
        (0..self.length)
            .map(|i| {
                if i == self.player {
                    'P'
                } else if i == self.length - 1 {
                    'E'
                } else {
                    '_'
                }
            })
            .collect()
    }
}

export_env!(Corridor);
