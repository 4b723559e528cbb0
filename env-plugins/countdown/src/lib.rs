//! Countdown: reach a target with arithmetic on a few numbers, each used
//! exactly once (RAGEN's single-turn reasoning task). The action is text:
//! the expression itself.
//!
//! The reference draws puzzles from a data set (Countdown-Tasks-3to4) and
//! keeps those solvable with `+` and `-` alone; this plugin generates them
//! from the seed instead: 3 or 4 numbers in 1..=99 and a target in
//! 1..=100 that a `+`/`-` expression over all of them reaches (the
//! `operators` key widens that). The reward is the reference's
//! `compute_score` (see [`expr::score`]).

pub mod expr;
pub mod solver;

use ragen_env_sdk::{
    ActionSpace, Config, ConfigKey, EnvError, EnvSpec, Environment, Limits, Oracle, PluginInfo, SeedRng, StepInfo, StepOutcome,
};

/// The longest answer accepted, in bytes.
pub const MAX_ANSWER_BYTES: u32 = 256;

/// One puzzle: the numbers to use and the target to reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Puzzle {
    pub numbers: Vec<u64>,
    pub target: u64,
}

impl Puzzle {
    /// The observation, as the reference writes it.
    pub fn render(&self) -> String {
        let nums: Vec<String> = self.numbers.iter().map(u64::to_string).collect();
        format!("Target: {}, nums: [{}]", self.target, nums.join(", "))
    }
}

#[derive(Debug)]
pub struct Countdown {
    min_numbers: usize,
    max_numbers: usize,
    max_number: u64,
    max_target: u64,
    operators: Vec<char>,
    format_score: f64,
    puzzle: Puzzle,
}

impl Countdown {
    /// The puzzle `seed` gives under this configuration.
    pub fn puzzle(&self, seed: u64) -> Puzzle {
        let mut rng = SeedRng::new(seed);
        loop {
            let count = self.min_numbers + rng.below(self.max_numbers - self.min_numbers + 1);
            let numbers: Vec<u64> = (0..count).map(|_| 1 + rng.below(self.max_number as usize) as u64).collect();
            // A few expressions per draw of numbers before drawing again.
            for _ in 0..16 {
                if let Some(target) = self.random_value(&numbers, &mut rng)
                    && (1..=self.max_target).contains(&target)
                {
                    return Puzzle { numbers, target };
                }
            }
        }
    }

    /// The value of the numbers, in a random order, joined left to right by
    /// random operators; `None` when a division is not exact.
    fn random_value(&self, numbers: &[u64], rng: &mut SeedRng) -> Option<u64> {
        let mut order = numbers.to_vec();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut value = order[0] as i64;
        for &n in &order[1..] {
            let n = n as i64;
            value = match self.operators[rng.below(self.operators.len())] {
                '+' => value + n,
                '-' => value - n,
                '*' => value * n,
                _ if value % n == 0 => value / n,
                _ => return None,
            };
        }
        u64::try_from(value).ok()
    }

    /// The puzzle of the current episode.
    pub fn current(&self) -> &Puzzle {
        &self.puzzle
    }
}

impl Environment for Countdown {
    type Action = String;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "countdown".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Countdown: write an arithmetic expression that uses every given number once and equals the target (single turn, text answer).".into(),
            multi_turn: false,
            config_keys: vec![
                ConfigKey::new("min_numbers", 3, "fewest numbers in a puzzle (2..=6)"),
                ConfigKey::new("max_numbers", 4, "most numbers in a puzzle (2..=6, at least min_numbers)"),
                ConfigKey::new("max_number", 99, "largest number drawn (1..=1000)"),
                ConfigKey::new("max_target", 100, "largest target (1..=100000)"),
                ConfigKey::new("operators", "+-", "operators the generator reaches the target with (some of + - * /); answers may use all four"),
                ConfigKey::new("format_score", 0.1, "reward for an answer that uses the right numbers but misses the target"),
            ],
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        let min_numbers = config.int_in("min_numbers", 2usize, 6)?;
        let max_numbers = config.int_in("max_numbers", 2usize, 6)?;
        if max_numbers < min_numbers {
            return Err(EnvError::bad_value("max_numbers", format!("{max_numbers} is below min_numbers ({min_numbers})")));
        }
        let operators: Vec<char> = config.str("operators").chars().collect();
        if operators.is_empty() || operators.iter().any(|c| !"+-*/".contains(*c)) {
            return Err(EnvError::bad_value("operators", "use some of the characters + - * / (e.g. \"+-\" or \"+-*/\")"));
        }
        let mut env = Self {
            min_numbers,
            max_numbers,
            max_number: config.int_in("max_number", 1u64, 1000)?,
            max_target: config.int_in("max_target", 1u64, 100_000)?,
            operators,
            format_score: config.f64_in("format_score", 0.0, 1.0)?,
            puzzle: Puzzle { numbers: vec![], target: 0 },
        };
        env.puzzle = env.puzzle(0);
        Ok(env)
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec {
            instructions: "You are solving the Countdown puzzle. Use every number in nums exactly once, with + - * / and \
                           parentheses, to write an arithmetic expression that equals the target."
                .into(),
            legend: vec![],
            action_space: ActionSpace::Text {
                max_bytes: MAX_ANSWER_BYTES,
                form: "one arithmetic expression that uses each number exactly once, e.g. (3 + 5) * 2".into(),
            },
            limits: Limits { max_actions_per_episode: 1, max_actions_per_turn: 1, max_turns: 1, max_steps: 1 },
            metrics: vec![],
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        self.puzzle = self.puzzle(seed);
        Ok(self.render())
    }

    fn step(&mut self, answer: String) -> StepOutcome {
        let reward = expr::score(&answer, &self.puzzle.numbers, self.puzzle.target, self.format_score);
        let uses_numbers = {
            let (mut used, mut given) = (expr::numbers_in(&answer), self.puzzle.numbers.clone());
            used.sort_unstable();
            given.sort_unstable();
            used == given
        };
        StepOutcome {
            observation: self.render(),
            reward,
            done: true,
            info: StepInfo { success: reward == 1.0, action_is_valid: uses_numbers, action_is_effective: true, metrics: vec![] },
        }
    }

    fn render(&self) -> String {
        self.puzzle.render()
    }
}

/// An expression the exact search finds; `0` (well-formed, wrong) for a
/// puzzle without one.
impl Oracle for Countdown {
    fn best_actions(&self, _max_actions: u32) -> Vec<String> {
        vec![solver::solve(&self.puzzle.numbers, self.puzzle.target).unwrap_or_else(|| "0".into())]
    }
}

ragen_env_sdk::export_env!(Countdown, oracle);

#[cfg(test)]
mod tests;
