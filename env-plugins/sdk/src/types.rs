//! Plain Rust mirrors of the WIT records.
//!
//! Environments are written against these, not against generated bindings,
//! so the same code compiles natively (tests, the native benchmark baseline)
//! and to a component (where `guest` converts them at the boundary).

use std::fmt;

/// A configuration key an environment accepts, with its default value
/// written as a user would pass it (`"6"`, `"0.8"`, `"true"`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigKey {
    pub name: String,
    pub default_value: String,
    pub description: String,
}

impl ConfigKey {
    pub fn new(name: &str, default_value: impl ToString, description: &str) -> Self {
        Self { name: name.to_string(), default_value: default_value.to_string(), description: description.to_string() }
    }
}

/// Who the plugin is; the same for every env it creates.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub multi_turn: bool,
    pub config_keys: Vec<ConfigKey>,
}

/// One symbol of the rendered state and its meaning.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendEntry {
    pub symbol: String,
    pub meaning: String,
}

impl LegendEntry {
    pub fn new(symbol: impl ToString, meaning: &str) -> Self {
        Self { symbol: symbol.to_string(), meaning: meaning.to_string() }
    }
}

/// What the plugin recommends to the agent loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_actions_per_episode: u32,
    pub max_actions_per_turn: u32,
    pub max_turns: u32,
    pub max_steps: u32,
}

/// The agent-facing description of one configured env.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvSpec {
    pub instructions: String,
    pub legend: Vec<LegendEntry>,
    /// Action names; an action's id is its index here.
    pub actions: Vec<String>,
    pub limits: Limits,
    /// Names of the numbers each step reports in `StepInfo::metrics`.
    pub metrics: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepInfo {
    pub success: bool,
    pub action_is_valid: bool,
    pub action_is_effective: bool,
    /// One value per name in `EnvSpec::metrics`, in that order.
    pub metrics: Vec<f64>,
}

/// What one `step` returns.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    pub observation: String,
    pub reward: f64,
    pub done: bool,
    pub info: StepInfo,
}

/// Why a call failed; mirrors the WIT `error-kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    UnknownKey,
    BadValue,
    BadAction,
    NotStarted,
    EpisodeOver,
    Failed,
}

/// A failure reported to the host; `message` names the problem and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    pub kind: ErrorKind,
    pub message: String,
}

impl EnvError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// A configuration value that is malformed or out of range; the message
    /// always starts with the key so a user can find it in their config.
    pub fn bad_value(key: &str, problem: impl fmt::Display) -> Self {
        Self::new(ErrorKind::BadValue, format!("config key `{key}`: {problem}"))
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Failed, message)
    }
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for EnvError {}
