//! A counter env that misbehaves on purpose, on seeds that are 3 mod 4,
//! in the way its enabled feature says. Built once per fault by
//! `make test-plugins`.

use ragen_env_sdk::*;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// Resets this instance has seen (`hidden-state` leaks it into the state).
static RESETS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub struct Faulty {
    seed: u64,
    count: u64,
    steps: u32,
    /// The `configurable` build's settings.
    knobs: Knobs,
}

/// What the `configurable` build reports, from its settings.
#[derive(Debug, Default)]
struct Knobs {
    actions: usize,
    text: String,
    repeat: usize,
    reward: f64,
    metric: f64,
    limits: (u32, u32, u32),
}

impl Knobs {
    fn from(config: &Config) -> Result<Self, EnvError> {
        Ok(Self {
            actions: config.int_in("actions", 0, 10_000)?,
            text: config.str("text").to_string(),
            repeat: config.int_in("repeat", 0, 100_000)?,
            reward: config.parse("reward", "a number")?,
            metric: config.parse("metric", "a number")?,
            limits: (
                config.parse("max_turns", "a u32")?,
                config.parse("max_actions_per_turn", "a u32")?,
                config.parse("max_steps", "a u32")?,
            ),
        })
    }
}

fn strikes(seed: u64) -> bool {
    seed % 4 == 3
}

impl Environment for Faulty {
    type Action = u32;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "faulty".into(),
            version: "0.1.0".into(),
            description: if cfg!(feature = "escape-codes") {
                "A counter\x1b[2J\x1b]0;pwned\x07 that misbehaves on purpose (tests only).".into()
            } else {
                "A counter that misbehaves on purpose (tests only).".into()
            },
            multi_turn: true,
            config_keys: if cfg!(feature = "configurable") {
                vec![
                    ConfigKey::new("start", 0, "initial count"),
                    ConfigKey::new("actions", 2, "how many actions"),
                    ConfigKey::new("text", "", "appended to instructions, action names and observations"),
                    ConfigKey::new("repeat", 1, "copies of the instructions"),
                    ConfigKey::new("reward", 1.0, "the reward of every step"),
                    ConfigKey::new("metric", 0.0, "the value of the one metric"),
                    ConfigKey::new("max_turns", 1, "limits.max-turns"),
                    ConfigKey::new("max_actions_per_turn", 5, "limits.max-actions-per-turn"),
                    ConfigKey::new("max_steps", 5, "limits.max-steps and max-actions-per-episode"),
                ]
            } else {
                vec![ConfigKey::new("start", 0, "initial count")]
            },
        }
    }

    fn new(config: &Config) -> Result<Self, EnvError> {
        let knobs = if cfg!(feature = "configurable") { Knobs::from(config)? } else { Knobs::default() };
        Ok(Self { seed: 0, count: config.int_in("start", 0, 1000)?, steps: 0, knobs })
    }

    fn spec(&self) -> EnvSpec {
        let mut spec = EnvSpec {
            instructions: "Count up.".into(),
            legend: vec![],
            action_space: ActionSpace::names(&["Inc", "Stay"]),
            limits: Limits { max_actions_per_episode: 5, max_actions_per_turn: 5, max_turns: 1, max_steps: 5 },
            metrics: vec![],
        };
        if cfg!(feature = "configurable") {
            let k = &self.knobs;
            spec.instructions = format!("Count up.{}", k.text).repeat(k.repeat);
            spec.action_space = ActionSpace::Names((0..k.actions).map(|i| format!("A{i}{}", k.text)).collect());
            spec.limits = Limits {
                max_turns: k.limits.0,
                max_actions_per_turn: k.limits.1,
                max_steps: k.limits.2,
                max_actions_per_episode: k.limits.2,
            };
            spec.metrics = vec![format!("m{}", k.text)];
        }
        if cfg!(feature = "empty-actions") {
            spec.action_space = ActionSpace::Names(vec![]);
        }
        if cfg!(feature = "huge-limits") {
            spec.limits =
                Limits { max_actions_per_episode: u32::MAX, max_actions_per_turn: u32::MAX, max_turns: u32::MAX, max_steps: u32::MAX };
        }
        if cfg!(feature = "metadata-bomb") {
            spec.action_space = ActionSpace::Names((0..200_000).map(|i| format!("A{i}")).collect());
            spec.instructions = "Count up. ".repeat(500_000);
        }
        if cfg!(feature = "escape-codes") {
            spec.action_space = ActionSpace::names(&["Inc", "Stay\x1b[31m"]);
        }
        spec
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        if cfg!(feature = "trap-in-reset") && strikes(seed) {
            panic!("deliberate trap in reset (seed {seed})");
        }
        if cfg!(feature = "slow-reset") {
            // No clock in the sandbox: burn time instead.
            let mut x = 0u64;
            for i in 0..150_000_000u64 {
                x = black_box(x ^ i);
            }
            black_box(x);
        }
        if cfg!(feature = "fail-every-reset") {
            return Err(EnvError::failed(format!("deliberate failure of every reset (seed {seed})")));
        }
        let earlier = RESETS.fetch_add(1, Ordering::Relaxed);
        (self.seed, self.count, self.steps) = (seed, seed % 10, 0);
        if cfg!(feature = "hidden-state") {
            self.count += earlier;
        }
        if cfg!(feature = "reach-outside") && strikes(seed) {
            return Ok(reach_outside());
        }
        Ok(self.render())
    }

    fn step(&mut self, action: u32) -> StepOutcome {
        if strikes(self.seed) {
            if cfg!(feature = "loop-in-step") {
                let mut i = 0u64;
                loop {
                    i = black_box(i.wrapping_add(1));
                }
            }
            if cfg!(feature = "reach-outside") {
                // Waits on a clock that stands still: must trap, not hang.
                std::thread::sleep(std::time::Duration::from_secs(30));
            }
            if cfg!(feature = "stack-overflow") {
                black_box(recurse(black_box(1)));
            }
            if cfg!(feature = "grow-memory") {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
        }
        self.count += (action == 0) as u64;
        self.steps += 1;
        let reward = match () {
            _ if cfg!(feature = "configurable") => self.knobs.reward,
            _ if cfg!(feature = "nan-reward") && strikes(self.seed) => f64::NAN,
            _ if cfg!(feature = "huge-reward") && strikes(self.seed) => 1e308,
            _ => 1.0,
        };
        StepOutcome {
            observation: self.render(),
            reward,
            done: self.steps >= 5,
            info: StepInfo {
                success: self.steps >= 5 && (!cfg!(feature = "lying-oracle") || self.count > self.seed % 10),
                action_is_valid: true,
                action_is_effective: action == 0,
                metrics: if cfg!(feature = "configurable") { vec![self.knobs.metric] } else { vec![] },
            },
        }
    }

    fn render(&self) -> String {
        if cfg!(feature = "huge-observation") {
            return "#".repeat(1 << 20);
        }
        if cfg!(feature = "configurable") {
            return format!("count: {} (seed {}){}", self.count, self.seed, self.knobs.text);
        }
        if cfg!(feature = "escape-codes") {
            return format!("count: {}\x1b]0;pwned\x07\x1b[2J (seed {})", self.count, self.seed);
        }
        format!("count: {} (seed {})", self.count, self.seed)
    }
}

/// Claims `Stay` is best; it never wins (see the `lying-oracle` feature).
#[cfg(feature = "lying-oracle")]
impl Oracle for Faulty {
    fn best_actions(&self, _max_actions: u32) -> Vec<u32> {
        vec![1]
    }
}

#[cfg(feature = "lying-oracle")]
export_env!(Faulty, oracle);
#[cfg(not(feature = "lying-oracle"))]
export_env!(Faulty);

/// Recursion without end, each frame holding some stack.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    let pad = black_box([depth; 64]);
    recurse(depth + 1).wrapping_add(pad[(depth % 64) as usize])
}

/// Everything a plugin might try to learn from outside, as one line the
/// host's tests read: whether files and the network were reachable, how many
/// environment variables there were, the clock, and a hash keyed by WASI's
/// randomness (the same in every instance if that randomness is fixed).
fn reach_outside() -> String {
    use std::hash::BuildHasher;
    let files = std::fs::read_dir("/").is_ok() || std::fs::read("/etc/hostname").is_ok();
    let net = std::net::TcpStream::connect("127.0.0.1:9").is_ok();
    let env = std::env::vars().count();
    let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(u64::MAX);

    format!("files:{files} net:{net} env:{env} time:{time} hash:{}", std::collections::hash_map::RandomState::new().hash_one("ragen"))
}
