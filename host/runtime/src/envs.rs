//! One batched API over envs wherever they run.
//!
//! [`EnvProvider`] is where envs come from: a [`Plugin`] runs them in this
//! process ([`EnvPool`]); a remote server (the `ragen-remote` crate) runs
//! them behind a network connection. [`Envs`] is a batch of them, driven by
//! the same `reset(ids, seeds)` / `step(ids, actions)` calls either way, so
//! the agent loop, evaluation and training never ask which it is.
//!
//! Every env gets a result for every call, `Ok` or an [`EnvFailure`]; an
//! `Err` from a call itself means the whole batch is unusable (a dead
//! worker thread), not that one env failed.

use crate::pool::{EnvFailure, EnvPool, PoolConfig, PoolStats, PoolStep};
use crate::{Action, EnvSpec, Plugin, PluginInfo};
use anyhow::Result;
use std::sync::Arc;

/// A batch of envs, stepped together (see the module docs).
pub trait Envs: Send + Sync {
    fn num_envs(&self) -> usize;

    /// Reset `env_ids[i]` with `seeds[i]`; each first observation, in the
    /// order given.
    fn reset(&self, env_ids: &[usize], seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>>;

    /// Step `env_ids[i]` with `actions[i]`, in the order given.
    fn step(&self, env_ids: &[usize], actions: &[Action]) -> Result<Vec<Result<PoolStep, EnvFailure>>>;

    /// The env's own best next actions, at most `max_actions[i]` (see
    /// [`EnvPool::oracle`]); envs with no oracle fail each episode asked.
    fn oracle(&self, env_ids: &[usize], max_actions: &[u32]) -> Result<Vec<Result<Vec<Action>, EnvFailure>>>;

    /// Counts of what the envs' host recovered from, and how they are laid out.
    fn stats(&self) -> Result<PoolStats>;
}

/// Where envs come from (see the module docs).
pub trait EnvProvider: Send + Sync {
    /// What runs and reports call the source: a plugin's file, a server's URL.
    fn label(&self) -> String;

    /// Who the env is and what it looks like under `settings`.
    fn describe(&self, settings: &[(String, String)]) -> Result<(PluginInfo, EnvSpec)>;

    /// Whether [`Envs::oracle`] can answer.
    fn has_oracle(&self) -> Result<bool>;

    /// `config.num_envs` envs created with `config.settings`.
    fn open(&self, config: &PoolConfig) -> Result<Box<dyn Envs>>;

    /// The plugin itself, when the envs run in this process: what needs
    /// its instances (a native twin's bound, conformance checks) asks here.
    fn plugin(&self) -> Option<&Arc<Plugin>> {
        None
    }
}

impl Envs for EnvPool {
    fn num_envs(&self) -> usize {
        EnvPool::num_envs(self)
    }

    fn reset(&self, env_ids: &[usize], seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>> {
        EnvPool::reset(self, env_ids, seeds)
    }

    fn step(&self, env_ids: &[usize], actions: &[Action]) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        EnvPool::step(self, env_ids, actions)
    }

    fn oracle(&self, env_ids: &[usize], max_actions: &[u32]) -> Result<Vec<Result<Vec<Action>, EnvFailure>>> {
        EnvPool::oracle(self, env_ids, max_actions)
    }

    fn stats(&self) -> Result<PoolStats> {
        EnvPool::stats(self)
    }
}

/// A plugin's envs, run in this process by an [`EnvPool`].
///
/// # Examples
///
/// ```no_run
/// use ragen_runtime::{EnvProvider, LocalPlugin, Plugin, PoolConfig};
/// let provider = LocalPlugin::provider(Plugin::from_file("target/plugins/sokoban.wasm")?);
/// let envs = provider.open(&PoolConfig::new(4))?;
/// let first = envs.reset(&[0, 1, 2, 3], &[7, 7, 8, 8])?;
/// assert_eq!(first.len(), 4);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub struct LocalPlugin(Arc<Plugin>);

impl LocalPlugin {
    /// The plugin as an env source, shared.
    pub fn provider(plugin: impl Into<Arc<Plugin>>) -> Arc<dyn EnvProvider> {
        Arc::new(Self(plugin.into()))
    }
}

impl EnvProvider for LocalPlugin {
    fn label(&self) -> String {
        self.0.source().to_string()
    }

    fn describe(&self, settings: &[(String, String)]) -> Result<(PluginInfo, EnvSpec)> {
        self.0.describe(settings)
    }

    fn has_oracle(&self) -> Result<bool> {
        self.0.has_oracle()
    }

    fn open(&self, config: &PoolConfig) -> Result<Box<dyn Envs>> {
        Ok(Box::new(EnvPool::new(self.0.clone(), config)?))
    }

    fn plugin(&self) -> Option<&Arc<Plugin>> {
        Some(&self.0)
    }
}
