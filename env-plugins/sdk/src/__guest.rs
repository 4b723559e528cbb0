//! The component side: WIT bindings and the conversions between them and
//! the SDK's plain types. Only compiled for wasm targets.

use crate::types as t;
use crate::{CheckedEnv, Environment, Oracle};
use std::cell::RefCell;

wit_bindgen::generate!({
    world: "env-plugin-full",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "__export_env_plugin",
    default_bindings_module: "ragen_env_sdk::__guest",
    runtime_path: "ragen_env_sdk::__guest::rt",
});

#[doc(hidden)]
pub use wit_bindgen::rt;

use exports::ragen::env::environment as wit;
use ragen::env::types as wt;

/// The resource behind each WIT `env` handle. Resource methods take `&self`
/// (the host may hold several borrows), so the env sits in a `RefCell`; the
/// component model never re-enters an instance, so a borrow never overlaps.
pub struct GuestEnv<E>(RefCell<CheckedEnv<E>>);

pub fn info<E: Environment>() -> wit::PluginInfo {
    let i = E::info();
    wit::PluginInfo {
        name: i.name,
        version: i.version,
        description: i.description,
        multi_turn: i.multi_turn,
        config_keys: i
            .config_keys
            .into_iter()
            .map(|k| wt::ConfigKey { name: k.name, default_value: k.default_value, description: k.description })
            .collect(),
    }
}

fn error(e: t::EnvError) -> wt::EnvError {
    let kind = match e.kind {
        t::ErrorKind::UnknownKey => wt::ErrorKind::UnknownKey,
        t::ErrorKind::BadValue => wt::ErrorKind::BadValue,
        t::ErrorKind::BadAction => wt::ErrorKind::BadAction,
        t::ErrorKind::NotStarted => wt::ErrorKind::NotStarted,
        t::ErrorKind::EpisodeOver => wt::ErrorKind::EpisodeOver,
        t::ErrorKind::Failed => wt::ErrorKind::Failed,
    };
    wt::EnvError { kind, message: e.message }
}

fn outcome(o: t::StepOutcome) -> wt::StepResult {
    wt::StepResult {
        observation: o.observation,
        reward: o.reward,
        done: o.done,
        info: wt::StepInfo {
            success: o.info.success,
            action_is_valid: o.info.action_is_valid,
            action_is_effective: o.info.action_is_effective,
            metrics: o.info.metrics,
        },
    }
}

impl<E: Environment> wit::GuestEnv for GuestEnv<E> {
    fn create(config: Vec<(String, String)>) -> Result<wit::Env, wt::EnvError> {
        let env = CheckedEnv::<E>::create(&config).map_err(error)?;
        Ok(wit::Env::new(GuestEnv(RefCell::new(env))))
    }

    fn spec(&self) -> wt::EnvSpec {
        let s = self.0.borrow().spec();
        wt::EnvSpec {
            instructions: s.instructions,
            legend: s.legend.into_iter().map(|l| wt::LegendEntry { symbol: l.symbol, meaning: l.meaning }).collect(),
            action_space: match s.action_space {
                t::ActionSpace::Names(names) => wt::ActionSpace::Names(names),
                t::ActionSpace::Text { max_bytes, form } => wt::ActionSpace::Text(wt::TextActions { max_bytes, form }),
            },
            limits: wt::Limits {
                max_actions_per_episode: s.limits.max_actions_per_episode,
                max_actions_per_turn: s.limits.max_actions_per_turn,
                max_turns: s.limits.max_turns,
                max_steps: s.limits.max_steps,
            },
            metrics: s.metrics,
        }
    }

    fn reset(&self, seed: u64) -> Result<String, wt::EnvError> {
        self.0.borrow_mut().reset(seed).map_err(error)
    }

    fn step(&self, action: wt::Action) -> Result<wt::StepResult, wt::EnvError> {
        self.0.borrow_mut().step(from_wire(action)).map(outcome).map_err(error)
    }

    fn render(&self) -> String {
        self.0.borrow().render()
    }
}

fn from_wire(action: wt::Action) -> t::Action {
    match action {
        wt::Action::Id(id) => t::Action::Id(id),
        wt::Action::Text(text) => t::Action::Text(text),
    }
}

/// The `batch` interface's `reset-many`: each item exactly as `reset`.
pub fn reset_many<E: Environment>(envs: Vec<wit::EnvBorrow<'_>>, seeds: Vec<u64>) -> Vec<Result<String, wt::EnvError>> {
    envs.iter().zip(seeds).map(|(env, seed)| env.get::<GuestEnv<E>>().0.borrow_mut().reset(seed).map_err(error)).collect()
}

/// The `batch` interface's `step-many`: each item exactly as `step`.
pub fn step_many<E: Environment>(envs: Vec<wit::EnvBorrow<'_>>, actions: Vec<wt::Action>) -> Vec<Result<wt::StepResult, wt::EnvError>> {
    envs.iter()
        .zip(actions)
        .map(|(env, action)| env.get::<GuestEnv<E>>().0.borrow_mut().step(from_wire(action)).map(outcome).map_err(error))
        .collect()
}

fn to_wire(action: t::Action) -> wt::Action {
    match action {
        t::Action::Id(id) => wt::Action::Id(id),
        t::Action::Text(text) => wt::Action::Text(text),
    }
}

/// The `oracle` interface's `best-actions`, through the episode rules.
pub fn best_actions<E: Oracle>(env: wit::EnvBorrow<'_>, max_actions: u32) -> Result<Vec<wt::Action>, wt::EnvError> {
    let plan = env.get::<GuestEnv<E>>().0.borrow().best_actions(max_actions).map_err(error)?;
    Ok(plan.into_iter().map(to_wire).collect())
}

/// What `best-actions` answers for a plugin exported without an oracle
/// (its `has-oracle` says false, so a host never asks).
pub fn no_oracle() -> wt::EnvError {
    error(t::EnvError::failed("this plugin has no oracle (`has-oracle` is false)"))
}
