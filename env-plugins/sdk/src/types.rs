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

/// How the agent acts on an env; mirrors the WIT `action-space`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionSpace {
    /// Pick one of these names; an action's id is its index here. The
    /// env's [`Environment::Action`](crate::Environment::Action) is `u32`.
    Names(Vec<String>),
    /// Free text of at most `max_bytes` bytes (UTF-8), in the `form` the
    /// prompt describes. The env's `Action` is `String`.
    Text { max_bytes: u32, form: String },
}

impl ActionSpace {
    /// A names space from string slices.
    pub fn names(names: &[&str]) -> Self {
        Self::Names(names.iter().map(|n| n.to_string()).collect())
    }

    /// The names, or an empty slice for text.
    pub fn as_names(&self) -> &[String] {
        match self {
            Self::Names(names) => names,
            Self::Text { .. } => &[],
        }
    }
}

/// One action as the host sends it; mirrors the WIT `action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// An index into [`ActionSpace::Names`].
    Id(u32),
    /// The text of an [`ActionSpace::Text`] action.
    Text(String),
}

impl From<u32> for Action {
    fn from(id: u32) -> Self {
        Self::Id(id)
    }
}

impl From<&str> for Action {
    fn from(text: &str) -> Self {
        Self::Text(text.to_string())
    }
}

impl From<String> for Action {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

/// The Rust type an env's actions arrive as: `u32` for a names space,
/// `String` for text. [`CheckedEnv`](crate::CheckedEnv) turns the host's
/// [`Action`] into it after checking it against the declared space, so an
/// env's `step` only ever sees a valid action.
pub trait ActionKind: Sized {
    /// Whether `space` is the kind of space this type serves.
    fn serves(space: &ActionSpace) -> bool;

    /// Check `action` against `space` and convert it; the error names the
    /// problem (`bad-action`).
    fn accept(action: Action, space: &ActionSpace) -> Result<Self, EnvError>;

    /// The action as the contract sends it (an oracle's answer).
    fn into_action(self) -> Action;
}

impl ActionKind for u32 {
    fn serves(space: &ActionSpace) -> bool {
        matches!(space, ActionSpace::Names(_))
    }

    fn into_action(self) -> Action {
        Action::Id(self)
    }

    fn accept(action: Action, space: &ActionSpace) -> Result<Self, EnvError> {
        let n = space.as_names().len();
        match action {
            Action::Id(id) if (id as usize) < n => Ok(id),
            Action::Id(id) => {
                Err(EnvError::new(ErrorKind::BadAction, format!("action id {id} is out of range; this env has {n} actions (ids 0..{n})")))
            }
            Action::Text(_) => {
                Err(EnvError::new(ErrorKind::BadAction, format!("this env takes an action id (0..{n}), not text; send `action::id`")))
            }
        }
    }
}

impl ActionKind for String {
    fn serves(space: &ActionSpace) -> bool {
        matches!(space, ActionSpace::Text { .. })
    }

    fn into_action(self) -> Action {
        Action::Text(self)
    }

    fn accept(action: Action, space: &ActionSpace) -> Result<Self, EnvError> {
        let max = match space {
            ActionSpace::Text { max_bytes, .. } => *max_bytes as usize,
            ActionSpace::Names(_) => 0,
        };
        match action {
            Action::Text(text) if text.len() <= max => Ok(text),
            Action::Text(text) => {
                Err(EnvError::new(ErrorKind::BadAction, format!("the action is {} bytes long; this env accepts at most {max}", text.len())))
            }
            Action::Id(id) => {
                Err(EnvError::new(ErrorKind::BadAction, format!("this env takes a text action, not an id ({id}); send `action::text`")))
            }
        }
    }
}

/// The agent-facing description of one configured env.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvSpec {
    pub instructions: String,
    pub legend: Vec<LegendEntry>,
    /// Names to pick from, or free text.
    pub action_space: ActionSpace,
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
