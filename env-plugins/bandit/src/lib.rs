//! Bandit: a single-turn, two-armed bandit whose arm names hint at their
//! payoffs (RAGEN's risk-sensitivity probe).
//!
//! The low-risk arm pays `lo_arm_score` (0.1) always; the high-risk arm pays
//! `hi_arm_hiscore` (1.0) with probability `hi_arm_hiscore_prob` (0.25), else
//! `hi_arm_loscore` (0.0). The order in which the arms are shown is shuffled
//! on every reset. `success` means the arm with the higher expected payoff
//! was chosen.

use ragen_env_sdk::{
    ActionSpace, Config, ConfigKey, EnvError, EnvSpec, Environment, Limits, Oracle, PluginInfo, SeedRng, StepInfo, StepOutcome,
};

/// Which of the two configured arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    Low,
    High,
}

#[derive(Debug)]
pub struct Bandit {
    lo_name: String,
    hi_name: String,
    lo_score: f64,
    hi_loscore: f64,
    hi_hiscore: f64,
    hi_prob: f64,
    /// Arms in the order shown this episode.
    shown: [Arm; 2],
    rng: SeedRng,
    observation: String,
}

impl Bandit {
    fn name(&self, arm: Arm) -> &str {
        match arm {
            Arm::Low => &self.lo_name,
            Arm::High => &self.hi_name,
        }
    }

    /// Expected payoff of an arm.
    pub fn mean(&self, arm: Arm) -> f64 {
        match arm {
            Arm::Low => self.lo_score,
            Arm::High => self.hi_prob * self.hi_hiscore + (1.0 - self.hi_prob) * self.hi_loscore,
        }
    }

    /// The arm with the higher expected payoff (the high-risk arm on a tie).
    pub fn best_arm(&self) -> Arm {
        if self.mean(Arm::Low) > self.mean(Arm::High) { Arm::Low } else { Arm::High }
    }

    /// The arms in the order this episode shows them.
    pub fn shown_order(&self) -> [Arm; 2] {
        self.shown
    }

    /// Action id → arm: ids follow the configured order (low, high).
    pub fn arm_of(action: u32) -> Arm {
        if action == 0 { Arm::Low } else { Arm::High }
    }
}

impl Environment for Bandit {
    type Action = u32;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "bandit".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Two-armed bandit: pick the arm whose name suggests the better payoff (single turn).".into(),
            multi_turn: false,
            config_keys: vec![
                ConfigKey::new("lo_arm_name", "Phoenix", "name of the low-risk arm (action id 0)"),
                ConfigKey::new("hi_arm_name", "Dragon", "name of the high-risk arm (action id 1)"),
                ConfigKey::new("lo_arm_score", 0.1, "what the low-risk arm always pays"),
                ConfigKey::new("hi_arm_loscore", 0.0, "what the high-risk arm pays when it misses"),
                ConfigKey::new("hi_arm_hiscore", 1.0, "what the high-risk arm pays when it hits"),
                ConfigKey::new("hi_arm_hiscore_prob", 0.25, "probability that the high-risk arm hits"),
            ],
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        let lo_name = config.name("lo_arm_name")?;
        let hi_name = config.name("hi_arm_name")?;
        for (key, name) in [("lo_arm_name", &lo_name), ("hi_arm_name", &hi_name)] {
            if name.contains("||") || name.contains('<') || name.contains('>') {
                return Err(EnvError::bad_value(key, format!("`{name}` may not contain `||`, `<` or `>`")));
            }
        }
        if lo_name.eq_ignore_ascii_case(&hi_name) {
            return Err(EnvError::bad_value(
                "hi_arm_name",
                format!("`{hi_name}` is the same as lo_arm_name; actions are matched case-insensitively, so give two different names"),
            ));
        }
        Ok(Self {
            lo_name,
            hi_name,
            lo_score: config.f64("lo_arm_score")?,
            hi_loscore: config.f64("hi_arm_loscore")?,
            hi_hiscore: config.f64("hi_arm_hiscore")?,
            hi_prob: config.f64_in("hi_arm_hiscore_prob", 0.0, 1.0)?,
            shown: [Arm::Low, Arm::High],
            rng: SeedRng::new(0),
            observation: String::new(),
        })
    }

    fn spec(&self) -> EnvSpec {
        let (a, b) = (&self.lo_name, &self.hi_name);
        EnvSpec {
            instructions: format!(
                "You are playing a bandit game. Goal: maximize your total reward by choosing which arm to pull.\n\
                 Game rules:\n\
                 1. There are 2 arms, named {a} and {b}.\n\
                 2. Each arm has its own reward distribution, related to its name.\n\
                 3. Analyze the symbolic meaning of each arm's name to guess how its reward distribution might behave.\n\
                 4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher \
                 rewards on average? Choose between {a} and {b}, and answer like <answer> {a} </answer> or <answer> {b} </answer>."
            ),
            legend: vec![],
            action_space: ActionSpace::Names(vec![a.clone(), b.clone()]),
            limits: Limits { max_actions_per_episode: 1, max_actions_per_turn: 1, max_turns: 1, max_steps: 1 },
            metrics: vec![],
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        self.rng = SeedRng::new(seed);
        self.shown = if self.rng.chance(0.5) { [Arm::Low, Arm::High] } else { [Arm::High, Arm::Low] };
        self.observation = format!("Machines: {}, {}. Choose one of them.", self.name(self.shown[0]), self.name(self.shown[1]));
        Ok(self.observation.clone())
    }

    fn step(&mut self, action: u32) -> StepOutcome {
        let arm = Self::arm_of(action);
        let reward = match arm {
            Arm::Low => self.lo_score,
            Arm::High if self.rng.chance(self.hi_prob) => self.hi_hiscore,
            Arm::High => self.hi_loscore,
        };
        // `{:?}` prints 1.0 as "1.0", as the reference's Python does.
        self.observation = format!("{}: {reward:?} points", self.name(arm));
        StepOutcome {
            observation: self.observation.clone(),
            reward,
            done: true,
            info: StepInfo { success: arm == self.best_arm(), action_is_valid: true, action_is_effective: true, metrics: vec![] },
        }
    }

    fn render(&self) -> String {
        self.observation.clone()
    }
}

/// The arm with the higher expected reward (action ids are fixed per arm,
/// whatever order the prompt shows them in).
impl Oracle for Bandit {
    fn best_actions(&self, _max_actions: u32) -> Vec<u32> {
        vec![match self.best_arm() {
            Arm::Low => 0,
            Arm::High => 1,
        }]
    }
}

ragen_env_sdk::export_env!(Bandit, oracle);

#[cfg(test)]
mod tests;
