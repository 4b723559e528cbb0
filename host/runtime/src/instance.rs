//! One sandboxed plugin instance and the envs living inside it.

use crate::bindings::exports::ragen::env::batch::Guest as Batch;
use crate::bindings::exports::ragen::env::environment::{EnvSpec, Guest as Environment, PluginInfo, StepResult};
use crate::bindings::exports::ragen::env::oracle::Guest as Oracle;
use crate::bindings::ragen::env::types::{Action, EnvError};
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
    environment: Environment,
    /// The batched calls, when the plugin exports them.
    batch: Option<Batch>,
    /// The env's own best play, when the plugin exports it.
    oracle: Option<Oracle>,
    limits: SandboxLimits,
    broken: Option<Fault>,
}

/// Per-item results of a batched call.
type Many<T> = Vec<Result<T, EnvError>>;

impl PluginInstance {
    pub(crate) fn new(
        store: Store<StoreState>,
        environment: Environment,
        batch: Option<Batch>,
        oracle: Option<Oracle>,
        limits: SandboxLimits,
    ) -> Self {
        Self { store, environment, batch, oracle, limits, broken: None }
    }

    /// Run one call under a fresh time budget and classify any failure.
    fn call<T>(&mut self, name: &str, f: impl FnOnce(&Environment, &mut Store<StoreState>) -> wasmtime::Result<T>) -> Result<T, Fault> {
        self.call_with(name, |s| f(&s.environment, &mut s.store))
    }

    /// [`call`](Self::call) with the whole instance at hand. A batched call
    /// gets the budget of one call, not one per item: a hang inside a batch
    /// is caught as quickly as anywhere else (the shard then retries the
    /// batch one call at a time; see the `shard` module).
    fn call_with<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> wasmtime::Result<T>) -> Result<T, Fault> {
        if let Some(fault) = &self.broken {
            return Err(Fault {
                kind: fault.kind,
                message: format!("{name}: the instance is unusable after an earlier fault ({})", fault.message),
            });
        }
        self.store.set_epoch_deadline(self.limits.deadline_ticks());
        f(self).map_err(|e| {
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
    /// fault) when the spec checker finds an error in it under
    /// [`SandboxLimits::report`].
    pub fn info(&mut self) -> Result<PluginInfo, Fault> {
        let info = self.info_unchecked()?;
        self.limits.report.check_info(&info).map_err(|m| contract_fault("info", m))?;
        Ok(info)
    }

    /// [`info`](Self::info)'s answer as the plugin gave it, errors and all:
    /// for a conformance tool that lists every problem at once
    /// ([`ReportLimits::info_problems`](crate::ReportLimits::info_problems)).
    /// Anything that uses the answer calls [`info`](Self::info).
    pub fn info_unchecked(&mut self) -> Result<PluginInfo, Fault> {
        self.call("info", |b, s| b.call_info(s))
    }

    pub fn create(&mut self, config: &[(String, String)]) -> Result<Result<EnvHandle, EnvError>, Fault> {
        self.call("create", |b, s| b.env().call_create(s, config)).map(|r| r.map(EnvHandle))
    }

    /// The env's spec, refused (a [`FaultKind::Contract`] fault) when the
    /// spec checker finds an error in it under [`SandboxLimits::report`].
    pub fn spec(&mut self, env: EnvHandle) -> Result<EnvSpec, Fault> {
        let spec = self.spec_unchecked(env)?;
        self.limits.report.check_spec(&spec).map_err(|m| contract_fault("spec", m))?;
        Ok(spec)
    }

    /// [`spec`](Self::spec)'s answer as the plugin gave it, errors and all:
    /// for a conformance tool that lists every problem at once
    /// ([`ReportLimits::spec_problems`](crate::ReportLimits::spec_problems)).
    /// Anything that uses the answer calls [`spec`](Self::spec).
    pub fn spec_unchecked(&mut self, env: EnvHandle) -> Result<EnvSpec, Fault> {
        self.call("spec", |b, s| b.env().call_spec(s, env.0))
    }

    pub fn reset(&mut self, env: EnvHandle, seed: u64) -> Result<Result<String, EnvError>, Fault> {
        self.call("reset", |b, s| b.env().call_reset(s, env.0, seed))
    }

    /// Take one action: an id (`inst.step(env, 2)`) or text
    /// (`inst.step(env, "(3 + 5) * 2")`).
    pub fn step(&mut self, env: EnvHandle, action: impl Into<Action>) -> Result<Result<StepResult, EnvError>, Fault> {
        let action = action.into();
        self.call("step", |b, s| b.env().call_step(s, env.0, &action))
    }

    /// Whether the plugin exports the batched calls.
    pub fn has_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// `reset(seeds[i])` on `envs[i]` in one crossing of the sandbox, or
    /// `None` when the plugin has no batched calls. A fault breaks the
    /// instance, as with any call; which env caused it is then unknown.
    pub fn reset_many(&mut self, envs: &[EnvHandle], seeds: &[u64]) -> Option<Result<Many<String>, Fault>> {
        assert_eq!(envs.len(), seeds.len(), "reset_many: one seed per env");
        self.batch.as_ref()?;
        let handles: Vec<ResourceAny> = envs.iter().map(|e| e.0).collect();
        Some(self.call_many("reset-many", envs.len(), |s| {
            let batch = s.batch.as_ref().expect("checked above");
            batch.call_reset_many(&mut s.store, &handles, seeds)
        }))
    }

    /// `step(actions[i])` on `envs[i]` in one crossing; see
    /// [`reset_many`](Self::reset_many).
    pub fn step_many(&mut self, envs: &[EnvHandle], actions: &[Action]) -> Option<Result<Many<StepResult>, Fault>> {
        assert_eq!(envs.len(), actions.len(), "step_many: one action per env");
        self.batch.as_ref()?;
        let handles: Vec<ResourceAny> = envs.iter().map(|e| e.0).collect();
        Some(self.call_many("step-many", envs.len(), |s| {
            let batch = s.batch.as_ref().expect("checked above");
            batch.call_step_many(&mut s.store, &handles, actions)
        }))
    }

    /// A batched call, whose answer must have one item per env: a plugin
    /// that returns another count breaks the contract.
    fn call_many<T>(&mut self, name: &str, items: usize, f: impl FnOnce(&mut Self) -> wasmtime::Result<Many<T>>) -> Result<Many<T>, Fault> {
        let out = self.call_with(name, f)?;
        if out.len() != items {
            let fault = contract_fault(name, format!("returned {} results for {items} envs", out.len()));
            self.broken = Some(fault.clone());
            return Err(fault);
        }
        Ok(out)
    }

    /// The plugin's `has-oracle` answer; false when it does not export the
    /// oracle at all.
    pub fn has_oracle(&mut self) -> Result<bool, Fault> {
        if self.oracle.is_none() {
            return Ok(false);
        }
        self.call_with("has-oracle", |s| s.oracle.as_ref().expect("checked above").call_has_oracle(&mut s.store))
    }

    /// The oracle's next actions for `env` (at most `max_actions`), or
    /// `None` when the plugin does not export the oracle. The answer is as
    /// the plugin gave it: [`EnvPool::oracle`](crate::EnvPool::oracle)
    /// checks it against the action space.
    pub fn best_actions(&mut self, env: EnvHandle, max_actions: u32) -> Option<Result<Result<Vec<Action>, EnvError>, Fault>> {
        self.oracle.as_ref()?;
        Some(
            self.call_with("best-actions", |s| {
                s.oracle.as_ref().expect("checked above").call_best_actions(&mut s.store, env.0, max_actions)
            }),
        )
    }

    pub fn render(&mut self, env: EnvHandle) -> Result<String, Fault> {
        self.call("render", |b, s| b.env().call_render(s, env.0))
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
