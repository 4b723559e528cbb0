//! One sandboxed plugin instance and the envs living inside it.

use crate::bindings::EnvPlugin;
use crate::bindings::exports::ragen::env::environment::{EnvSpec, PluginInfo, StepResult};
use crate::bindings::ragen::env::types::EnvError;
use anyhow::Result;
use wasmtime::Store;
use wasmtime::component::ResourceAny;

/// An env created inside a [`PluginInstance`]. Only valid with the instance
/// that created it.
#[derive(Clone, Copy, Debug)]
pub struct EnvHandle(ResourceAny);

/// One instance of a plugin. Calls return `Err` when the guest traps (the
/// instance must then be discarded) and `Ok(Err(EnvError))` when the plugin
/// itself reports a problem (the instance is fine).
pub struct PluginInstance {
    store: Store<()>,
    bindings: EnvPlugin,
}

impl PluginInstance {
    pub(crate) fn new(store: Store<()>, bindings: EnvPlugin) -> Self {
        Self { store, bindings }
    }

    pub fn info(&mut self) -> Result<PluginInfo> {
        Ok(self.bindings.ragen_env_environment().call_info(&mut self.store)?)
    }

    pub fn create(&mut self, config: &[(String, String)]) -> Result<Result<EnvHandle, EnvError>> {
        let env = self.bindings.ragen_env_environment().env();
        Ok(env.call_create(&mut self.store, config)?.map(EnvHandle))
    }

    pub fn spec(&mut self, env: EnvHandle) -> Result<EnvSpec> {
        Ok(self.bindings.ragen_env_environment().env().call_spec(&mut self.store, env.0)?)
    }

    pub fn reset(&mut self, env: EnvHandle, seed: u64) -> Result<Result<String, EnvError>> {
        Ok(self.bindings.ragen_env_environment().env().call_reset(&mut self.store, env.0, seed)?)
    }

    pub fn step(&mut self, env: EnvHandle, action: u32) -> Result<Result<StepResult, EnvError>> {
        Ok(self.bindings.ragen_env_environment().env().call_step(&mut self.store, env.0, action)?)
    }

    pub fn render(&mut self, env: EnvHandle) -> Result<String> {
        Ok(self.bindings.ragen_env_environment().env().call_render(&mut self.store, env.0)?)
    }

    /// Destroy an env, freeing its memory inside the instance.
    pub fn drop_env(&mut self, env: EnvHandle) -> Result<()> {
        Ok(env.0.resource_drop(&mut self.store)?)
    }
}
