//! Host-side bindings generated from `wit/env.wit`, the single source of
//! the contract (the SDK generates its guest side from the same file).
//!
//! They are generated for the `env-plugin-full` world, but a plugin need
//! not export `batch` or `oracle`: [`Plugin`](crate::Plugin) loads each
//! interface on its own and treats those two as optional.

wasmtime::component::bindgen!({
    world: "env-plugin-full",
    path: "../../wit",
    additional_derives: [PartialEq],
});

use ragen::env::types::{Action, ActionSpace, EnvSpec};

impl EnvSpec {
    /// The action names, or an empty slice when actions are text.
    pub fn action_names(&self) -> &[String] {
        match &self.action_space {
            ActionSpace::Names(names) => names,
            ActionSpace::Text(_) => &[],
        }
    }

    /// Whether the agent answers in free text rather than with names.
    pub fn takes_text(&self) -> bool {
        matches!(self.action_space, ActionSpace::Text(_))
    }
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

impl std::fmt::Display for Action {
    /// An id as its number, text quoted (`17`, `"(3 + 5) * 2"`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Id(id) => write!(f, "{id}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}
