//! The Rust authoring kit for ragen-rs environment plugins.
//!
//! Write an environment as a plain Rust type implementing [`Environment`],
//! then export it as a WebAssembly component with one line,
//! `export_env!(MyEnv)`, and build with
//! `cargo build --target wasm32-wasip2 --profile plugin`.
//!
//! # Examples
//!
//! A coin to guess, whole: the plugin is this file in a `cdylib` crate.
//! Natively, [`CheckedEnv`] drives it as the host would.
//!
//! ```
//! use ragen_env_sdk::*;
//!
//! pub struct Coin {
//!     heads: bool,
//! }
//!
//! impl Environment for Coin {
//!     // Actions are picked from names, by index.
//!     type Action = u32;
//!
//!     fn info() -> PluginInfo {
//!         PluginInfo {
//!             name: "coin".into(),
//!             version: "0.1.0".into(),
//!             description: "Guess the side of a coin.".into(),
//!             multi_turn: false,
//!             config_keys: vec![],
//!         }
//!     }
//!     fn new(_: &Config) -> Result<Self, EnvError> {
//!         Ok(Self { heads: false })
//!     }
//!     fn spec(&self) -> EnvSpec {
//!         EnvSpec {
//!             instructions: "Guess how the coin landed.".into(),
//!             legend: vec![],
//!             action_space: ActionSpace::names(&["Heads", "Tails"]),
//!             limits: Limits { max_actions_per_episode: 1, max_actions_per_turn: 1, max_turns: 1, max_steps: 1 },
//!             metrics: vec![],
//!         }
//!     }
//!     fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
//!         // All randomness comes from the seed: same seed, same episode.
//!         self.heads = SeedRng::new(seed).below(2) == 0;
//!         Ok(self.render())
//!     }
//!     fn step(&mut self, action: u32) -> StepOutcome {
//!         let success = (action == 0) == self.heads;
//!         StepOutcome {
//!             observation: if self.heads { "heads" } else { "tails" }.into(),
//!             reward: if success { 1.0 } else { 0.0 },
//!             done: true,
//!             info: StepInfo { success, action_is_valid: true, action_is_effective: true, metrics: vec![] },
//!         }
//!     }
//!     fn render(&self) -> String {
//!         "a coin under a cup".into()
//!     }
//! }
//!
//! // The component's exports on wasm32; nothing natively.
//! export_env!(Coin);
//!
//! let mut env = CheckedEnv::<Coin>::create(&[]).unwrap();
//! assert_eq!(env.reset(7).unwrap(), "a coin under a cup");
//! let outcome = env.step(0).unwrap();
//! assert!(outcome.done);
//! // The contract's rules are the SDK's: no step after the episode ended.
//! assert!(env.step(0).is_err());
//! ```
//! The same code compiles natively (the macro expands to nothing off wasm),
//! so unit tests and the host's native benchmark baseline run the exact code
//! the plugin runs. Contract rules that every environment shares (unknown
//! config keys, action ids out of range, `step` before `reset` or after the
//! episode ended) are enforced once, in [`CheckedEnv`], not by each env.
//!
//! An env whose action is free text (Countdown's arithmetic expression)
//! declares [`ActionSpace::Text`] and sets `type Action = String`.
//!
//! The export includes the contract's optional `batch` interface (many envs
//! of one instance reset or stepped in one call), so every Rust plugin gets
//! batched stepping for free. An env that knows its best play implements
//! [`Oracle`] and is exported with `export_env!(MyEnv, oracle)`.

pub mod config;
pub mod types;

mod checked;

pub use checked::CheckedEnv;
pub use config::Config;
pub use ragen_rng::SeedRng;
pub use types::*;

/// An environment, written as plain Rust.
///
/// The SDK calls these through [`CheckedEnv`], which guarantees that `step`
/// is only called after `reset`, never after the episode has ended, and only
/// with an action inside `spec().action_space`.
pub trait Environment: Sized + 'static {
    /// What a step receives: `u32` (an index into [`ActionSpace::Names`]) or
    /// `String` (the text of an [`ActionSpace::Text`] action).
    type Action: ActionKind;

    /// Describe the plugin: name, version, description, config keys.
    fn info() -> PluginInfo;

    /// Build an env from its configuration (every declared key resolved to
    /// a value; unknown keys were already rejected). Invalid values are
    /// errors that name the key, e.g. via [`Config::int_in`].
    fn new(config: &Config) -> Result<Self, EnvError>;

    /// The agent-facing description under this configuration.
    fn spec(&self) -> EnvSpec;

    /// Start an episode from `seed`; returns the first observation.
    fn reset(&mut self, seed: u64) -> Result<String, EnvError>;

    /// Apply one valid action to a running episode.
    fn step(&mut self, action: Self::Action) -> StepOutcome;

    /// The current state as text.
    fn render(&self) -> String;
}

/// An environment's own best play: the contract's optional `oracle`
/// interface. Export it with `export_env!(MyEnv, oracle)`.
///
/// The host plays it as a reference policy (`eval --policy oracle`) and
/// records it as demonstrations for a supervised warm start; `validate`
/// checks that it wins more often than random play.
pub trait Oracle: Environment {
    /// The best next actions from the current state of a running episode,
    /// first to last, at most `max_actions` (at least 1) of them; never
    /// empty. An env whose next state is random returns one. Where no
    /// action leads to success, any legal action.
    fn best_actions(&self, max_actions: u32) -> Vec<Self::Action>;
}

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __guest;

// Lets the generated bindings (which name this crate by its path) resolve
// from inside the crate itself as well as from plugins.
extern crate self as ragen_env_sdk;

/// Export an [`Environment`] as the plugin's component.
///
/// Put it once at the crate root of a `cdylib`. On non-wasm targets it
/// expands to nothing, so the crate still builds and tests natively.
/// `export_env!(MyEnv, oracle)` also exports the env's [`Oracle`].
#[macro_export]
macro_rules! export_env {
    ($env:ty) => {
        $crate::export_env!(@common $env);

        #[cfg(target_arch = "wasm32")]
        impl $crate::__guest::exports::ragen::env::oracle::Guest for __RagenEnvPlugin {
            fn has_oracle() -> bool {
                false
            }

            fn best_actions(
                _env: $crate::__guest::exports::ragen::env::environment::EnvBorrow<'_>,
                _max_actions: u32,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::__guest::ragen::env::types::Action>, $crate::__guest::ragen::env::types::EnvError>
            {
                ::std::result::Result::Err($crate::__guest::no_oracle())
            }
        }
    };
    ($env:ty, oracle) => {
        $crate::export_env!(@common $env);

        #[cfg(target_arch = "wasm32")]
        impl $crate::__guest::exports::ragen::env::oracle::Guest for __RagenEnvPlugin {
            fn has_oracle() -> bool {
                true
            }

            fn best_actions(
                env: $crate::__guest::exports::ragen::env::environment::EnvBorrow<'_>,
                max_actions: u32,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::__guest::ragen::env::types::Action>, $crate::__guest::ragen::env::types::EnvError>
            {
                $crate::__guest::best_actions::<$env>(env, max_actions)
            }
        }
    };
    (@common $env:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        pub struct __RagenEnvPlugin;

        #[cfg(target_arch = "wasm32")]
        impl $crate::__guest::exports::ragen::env::environment::Guest for __RagenEnvPlugin {
            type Env = $crate::__guest::GuestEnv<$env>;

            fn info() -> $crate::__guest::exports::ragen::env::environment::PluginInfo {
                $crate::__guest::info::<$env>()
            }
        }

        #[cfg(target_arch = "wasm32")]
        impl $crate::__guest::exports::ragen::env::batch::Guest for __RagenEnvPlugin {
            fn reset_many(
                envs: ::std::vec::Vec<$crate::__guest::exports::ragen::env::environment::EnvBorrow<'_>>,
                seeds: ::std::vec::Vec<u64>,
            ) -> ::std::vec::Vec<::std::result::Result<::std::string::String, $crate::__guest::ragen::env::types::EnvError>> {
                $crate::__guest::reset_many::<$env>(envs, seeds)
            }

            fn step_many(
                envs: ::std::vec::Vec<$crate::__guest::exports::ragen::env::environment::EnvBorrow<'_>>,
                actions: ::std::vec::Vec<$crate::__guest::ragen::env::types::Action>,
            ) -> ::std::vec::Vec<
                ::std::result::Result<$crate::__guest::ragen::env::types::StepResult, $crate::__guest::ragen::env::types::EnvError>,
            > {
                $crate::__guest::step_many::<$env>(envs, actions)
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::__guest::__export_env_plugin!(__RagenEnvPlugin with_types_in $crate::__guest);
    };
}
