//! One sandboxed plugin instance and the envs living inside it.

use crate::bindings::EnvPlugin;
use crate::bindings::exports::ragen::env::environment::{EnvSpec, PluginInfo, StepResult};
use crate::bindings::ragen::env::types::EnvError;
use crate::sandbox::{Fault, FaultKind, SandboxLimits, StoreState, classify};
use wasmtime::Store;
use wasmtime::component::ResourceAny;

/// An env created inside a [`PluginInstance`]. Only valid with the instance
/// that created it.
#[derive(Clone, Copy, Debug)]
pub struct EnvHandle(ResourceAny);

/// One instance of a plugin: its own memory, its own envs.
///
/// Every call runs under the sandbox limits. A call returns `Err(Fault)` when
/// the guest trapped, ran out of time or hit the memory cap (the instance is
/// then unusable: every later call returns a fault too) and `Ok(Err(EnvError))`
/// when the plugin itself reported a problem (the instance is fine).
pub struct PluginInstance {
    store: Store<StoreState>,
    bindings: EnvPlugin,
    limits: SandboxLimits,
    broken: Option<Fault>,
}

impl PluginInstance {
    pub(crate) fn new(store: Store<StoreState>, bindings: EnvPlugin, limits: SandboxLimits) -> Self {
        Self { store, bindings, limits, broken: None }
    }

    /// Run one call under a fresh time budget and classify any failure.
    fn call<T>(&mut self, name: &str, f: impl FnOnce(&EnvPlugin, &mut Store<StoreState>) -> wasmtime::Result<T>) -> Result<T, Fault> {
        if let Some(fault) = &self.broken {
            return Err(Fault {
                kind: fault.kind,
                message: format!("{name}: the instance is unusable after an earlier fault ({})", fault.message),
            });
        }
        self.store.set_epoch_deadline(self.limits.deadline_ticks());
        f(&self.bindings, &mut self.store).map_err(|e| {
            let fault = classify(e, name, self.store.data(), &self.limits);
            self.broken = Some(fault.clone());
            fault
        })
    }

    /// Whether an earlier call faulted (the instance must be replaced).
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// The plugin's self-description, refused (a [`FaultKind::Contract`]
    /// fault) when it is outside [`SandboxLimits::report`].
    pub fn info(&mut self) -> Result<PluginInfo, Fault> {
        let info = self.call("info", |b, s| b.ragen_env_environment().call_info(s))?;
        self.limits.report.check_info(&info).map_err(|m| contract_fault("info", m))?;
        Ok(info)
    }

    pub fn create(&mut self, config: &[(String, String)]) -> Result<Result<EnvHandle, EnvError>, Fault> {
        self.call("create", |b, s| b.ragen_env_environment().env().call_create(s, config)).map(|r| r.map(EnvHandle))
    }

    /// The env's spec, refused (a [`FaultKind::Contract`] fault) when it is
    /// outside [`SandboxLimits::report`].
    pub fn spec(&mut self, env: EnvHandle) -> Result<EnvSpec, Fault> {
        let spec = self.call("spec", |b, s| b.ragen_env_environment().env().call_spec(s, env.0))?;
        self.limits.report.check_spec(&spec).map_err(|m| contract_fault("spec", m))?;
        Ok(spec)
    }

    pub fn reset(&mut self, env: EnvHandle, seed: u64) -> Result<Result<String, EnvError>, Fault> {
        self.call("reset", |b, s| b.ragen_env_environment().env().call_reset(s, env.0, seed))
    }

    pub fn step(&mut self, env: EnvHandle, action: u32) -> Result<Result<StepResult, EnvError>, Fault> {
        self.call("step", |b, s| b.ragen_env_environment().env().call_step(s, env.0, action))
    }

    pub fn render(&mut self, env: EnvHandle) -> Result<String, Fault> {
        self.call("render", |b, s| b.ragen_env_environment().env().call_render(s, env.0))
    }

    /// Destroy an env, freeing its memory inside the instance.
    pub fn drop_env(&mut self, env: EnvHandle) -> Result<(), Fault> {
        self.call("drop", |_, s| env.0.resource_drop(s))
    }

    /// Bytes of linear memory the instance holds now.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().memory.current
    }
}

fn contract_fault(call: &str, problem: String) -> Fault {
    Fault { kind: FaultKind::Contract, message: format!("{call}: {problem}") }
}

impl FaultKind {
    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Timeout => "timeout",
            FaultKind::MemoryCap => "memory-cap",
            FaultKind::Trap => "trap",
            FaultKind::Contract => "contract",
        }
    }
}
