//! A plugin: checked and compiled once, instantiated many times.

use crate::IntoAnyhow;
use crate::bindings::exports::ragen::env::environment::{EnvSpec, PluginInfo};
use crate::bindings::exports::ragen::env::{batch, environment, oracle};
use crate::cache::CompileCache;
use crate::contract::{self, ContractVersion};
use crate::instance::PluginInstance;
use crate::sandbox::{self, SandboxLimits, StoreState};
use crate::wasi;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::OnceLock;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, Store};

/// A compiled environment plugin.
///
/// Compilation is the expensive part (tens of milliseconds); instantiation
/// from the pre-linked component is cheap, which is what lets a pool
/// replace a broken instance without recompiling. `Plugin` is `Send + Sync`:
/// share it between worker threads in an `Arc`.
///
/// # Examples
///
/// ```
/// use ragen_runtime::Plugin;
///
/// # let path = ragen_test_fixtures::plugin("bandit"); // `make plugins`
/// let plugin = Plugin::from_file(&path)?;
/// let mut inst = plugin.instantiate()?;
/// assert_eq!(inst.info()?.name, "bandit");
/// // Settings are `(key, value)` pairs; the plugin checks them.
/// let env = inst.create(&[])?.expect("the default settings are valid");
/// let spec = inst.spec(env)?;
/// let first = inst.reset(env, 7)?.expect("a healthy env resets");
/// let out = inst.step(env, 0)?.expect("action 0 exists");
/// println!("{first}\n{}: reward {}", spec.action_names()[0], out.reward);
/// // The Rust SDK exports the batched calls too.
/// assert!(plugin.has_batch());
/// # Ok::<(), anyhow::Error>(())
/// ```
pub struct Plugin {
    engine: Engine,
    pre: InstancePre<StoreState>,
    /// Where `environment`'s functions are, looked up once.
    environment: environment::GuestIndices,
    /// Where `batch`'s are, when the plugin exports it.
    batch: Option<batch::GuestIndices>,
    /// Where `oracle`'s are, when the plugin exports it.
    oracle: Option<oracle::GuestIndices>,
    /// The plugin's `has-oracle` answer, asked once.
    has_oracle: OnceLock<bool>,
    limits: SandboxLimits,
    contract_version: ContractVersion,
    imports: Vec<String>,
    size_bytes: usize,
    source: String,
    from_cache: bool,
}

impl Plugin {
    /// Load a `.wasm` component from disk with the default limits.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file_with(path, SandboxLimits::default())
    }

    /// Load a `.wasm` component from disk under `limits`.
    pub fn from_file_with(path: impl AsRef<Path>, limits: SandboxLimits) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("cannot read plugin `{}`", path.display()))?;
        Self::from_bytes(&bytes, &path.display().to_string(), limits)
    }

    /// Load a component from memory; `source` names it in error messages.
    /// Compiled code comes from, and goes to, the process's
    /// [`CompileCache`].
    pub fn from_bytes(bytes: &[u8], source: &str, limits: SandboxLimits) -> Result<Self> {
        Self::from_bytes_cached(bytes, source, limits, CompileCache::process_default())
    }

    /// [`from_bytes`](Self::from_bytes) with a chosen compile cache.
    pub fn from_bytes_cached(bytes: &[u8], source: &str, limits: SandboxLimits, cache: &CompileCache) -> Result<Self> {
        let fail = || format!("cannot load plugin `{source}`");
        contract::check_is_component(bytes).with_context(fail)?;

        let mut config = Config::new();
        config.wasm_component_model(true);
        // The time budget per call: the store's deadline is checked against
        // an epoch that a ticker thread advances.
        config.epoch_interruption(true);
        let cache = cache.wasmtime();
        config.cache(cache.clone());
        let engine = Engine::new(&config).anyhow().context("cannot create the wasmtime engine")?;
        let hits = cache.as_ref().map(|c| c.cache_hits());
        let component = Component::new(&engine, bytes).anyhow().with_context(fail)?;
        // Best effort: another load from the same directory at the same
        // moment in this process could count as this one's hit.
        let from_cache = cache.as_ref().zip(hits).is_some_and(|(c, before)| c.cache_hits() > before);

        let ty = component.component_type();
        let exports: Vec<String> = ty.exports(&engine).map(|(name, _)| name.to_string()).collect();
        let contract_version = contract::check_exports(exports.iter().map(String::as_str)).with_context(fail)?;
        let imports: Vec<String> = ty.imports(&engine).map(|(name, _)| name.to_string()).collect();

        // No capabilities: WASI answers but grants nothing (see `wasi`), and
        // any other import is bound to a function that traps if called.
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).anyhow().context("cannot link the sandbox's WASI")?;
        wasi::trap_unlinked_imports(&mut linker, &component, &engine).anyhow().with_context(fail)?;
        let pre = linker.instantiate_pre(&component).anyhow().with_context(fail)?;
        let environment = environment::GuestIndices::new(&pre).anyhow().with_context(fail)?;
        let batch = if contract::exports_batch(exports.iter().map(String::as_str)) {
            Some(batch::GuestIndices::new(&pre).anyhow().context("its `batch` export does not match wit/env.wit").with_context(fail)?)
        } else {
            None
        };
        let oracle = if contract::exports_oracle(exports.iter().map(String::as_str)) {
            Some(oracle::GuestIndices::new(&pre).anyhow().context("its `oracle` export does not match wit/env.wit").with_context(fail)?)
        } else {
            None
        };
        sandbox::start_epoch_ticker(&engine);

        Ok(Self {
            engine,
            pre,
            environment,
            batch,
            oracle,
            has_oracle: OnceLock::new(),
            limits,
            contract_version,
            imports,
            size_bytes: bytes.len(),
            source: source.to_string(),
            from_cache,
        })
    }

    /// A fresh, isolated instance: its own memory, its own envs.
    pub fn instantiate(&self) -> Result<PluginInstance> {
        let mut store = Store::new(&self.engine, StoreState::new(&self.limits));
        store.limiter(|state| &mut state.memory);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.limits.deadline_ticks());
        let fail = || format!("cannot instantiate plugin `{}`", self.source);
        let instance = self.pre.instantiate(&mut store).anyhow().with_context(fail)?;
        let environment = self.environment.load(&mut store, &instance).anyhow().with_context(fail)?;
        let batch = self.batch.as_ref().map(|b| b.load(&mut store, &instance)).transpose().anyhow().with_context(fail)?;
        let oracle = self.oracle.as_ref().map(|o| o.load(&mut store, &instance)).transpose().anyhow().with_context(fail)?;
        Ok(PluginInstance::new(store, environment, batch, oracle, self.limits.clone()))
    }

    /// What the plugin says about itself and about an env made with
    /// `settings`: its info and that env's spec, from a throwaway instance.
    /// Fails, naming the plugin, when it rejects the settings or faults.
    pub fn describe(&self, settings: &[(String, String)]) -> Result<(PluginInfo, EnvSpec)> {
        let mut inst = self.instantiate()?;
        let info = inst.info()?;
        let env = inst.create(settings)?.map_err(|e| anyhow::anyhow!("plugin `{}` rejected the settings: {}", self.source, e.message))?;
        Ok((info, inst.spec(env)?))
    }

    /// The limits every instance runs under.
    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// Whether the plugin exports the optional batched calls (`batch` in
    /// wit/env.wit); pools use them when it does.
    pub fn has_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// Whether the plugin has an oracle: it exports the optional `oracle`
    /// interface and its `has-oracle` says so (asked once, in a throwaway
    /// instance). Fails, naming the plugin, when that call faults.
    pub fn has_oracle(&self) -> Result<bool> {
        if self.oracle.is_none() {
            return Ok(false);
        }
        if let Some(&known) = self.has_oracle.get() {
            return Ok(known);
        }
        let answer = self.instantiate()?.has_oracle().with_context(|| format!("plugin `{}`: has-oracle", self.source))?;
        Ok(*self.has_oracle.get_or_init(|| answer))
    }

    /// The contract version the plugin was built against.
    pub fn contract_version(&self) -> ContractVersion {
        self.contract_version
    }

    /// Everything the component imports. WASI answers but grants nothing;
    /// anything else traps if called.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// Whether its compiled code came from the [`CompileCache`] rather than
    /// the compiler.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The name it was loaded under (a path or a label).
    pub fn source(&self) -> &str {
        &self.source
    }
}
