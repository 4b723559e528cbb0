//! ragen-runtime: loads environment plugins (WebAssembly components that
//! implement `wit/env.wit`) into a wasmtime sandbox and drives them.
//!
//! * [`Plugin`] is a compiled plugin: checked once (is it a component? does
//!   it speak our contract version?), compiled once, instantiated many times.
//! * [`PluginInstance`] is one sandboxed instance holding any number of envs.
//! * [`CompileCache`] keeps compiled plugins on disk between processes
//!   (wasmtime's cache; see the `cache` module for its trust model).
//! * [`EnvPool`] runs many envs across worker threads with one batched API,
//!   autoreset, and fault containment (see the `pool` module docs).
//! * [`EnvProvider`] and [`Envs`] are that batched API wherever the envs
//!   run: in this process ([`LocalPlugin`]) or on a server (ragen-remote).
//! * [`ReportLimits::spec_problems`] and [`info_problems`](ReportLimits::info_problems)
//!   are the one checker of what a plugin says about itself: every
//!   [`Problem`] with a [`Severity`], errors refused at load (see the
//!   `spec_check` module docs, which also hold the action names' syntax).
//!
//! The guest gets no capabilities. WASI is linked so that runtimes which
//! call it in ordinary work (CPython, StarlingMonkey) run, but it grants
//! nothing: no files, no network, no environment, clocks that stand still,
//! fixed-seed randomness, and only stderr is kept, to quote in faults (see
//! the `wasi` module). Any other import traps if called.

mod bindings;
mod cache;
mod contract;
mod envs;
mod instance;
mod plugin;
mod pool;
mod reported;
mod sandbox;
mod shard;
mod spec_check;
mod wasi;
mod wire;

pub use bindings::exports::ragen::env::environment::{EnvSpec, PluginInfo, StepResult};
pub use bindings::ragen::env::types::{Action, ActionSpace, ConfigKey, EnvError, ErrorKind, LegendEntry, Limits, StepInfo, TextActions};
pub use cache::{CACHE_DIR_VAR, CompileCache, NO_CACHE_VAR};
pub use contract::{CONTRACT_PACKAGE, CONTRACT_VERSION, ContractVersion};
pub use envs::{EnvProvider, Envs, LocalPlugin};
pub use instance::{EnvHandle, PluginInstance};
pub use plugin::Plugin;
pub use pool::{EnvFailure, EnvPool, FailureKind, PoolConfig, PoolStats, PoolStep, Recoveries, next_seed};
pub use reported::ReportLimits;
pub use sandbox::{Fault, FaultKind, SandboxLimits};
pub use spec_check::{ACTION_SEPARATOR, Problem, RESERVED_IN_ACTION_NAMES, Severity, action_name_key};
pub use wire::{describe_from_json, describe_json};

/// wasmtime 48 has its own error type; this lifts it into `anyhow` so that
/// `.context(...)` can say which plugin and which call failed.
pub(crate) trait IntoAnyhow<T> {
    fn anyhow(self) -> anyhow::Result<T>;
}

impl<T> IntoAnyhow<T> for wasmtime::Result<T> {
    fn anyhow(self) -> anyhow::Result<T> {
        self.map_err(anyhow::Error::from)
    }
}
