//! The WASI a plugin sees: every interface linked, nothing granted.
//!
//! A Rust plugin needs no WASI at all, but the runtimes that other languages
//! bring call it during ordinary work: CPython (componentize-py) reads its
//! environment variables and the clock when it starts, StarlingMonkey
//! (componentize-js) reads the clocks and fills a random pool for
//! `Math.random`. Binding those imports to traps, as the host first did,
//! shuts out every plugin not written in Rust.
//!
//! So each instance gets a WASI context that answers every call and grants
//! nothing, with everything that could differ between runs pinned down:
//!
//! * no files (no preopened directory), no network (TCP, UDP and name
//!   lookup refused), no environment variables, no arguments, empty stdin;
//! * the clocks stand still (the wall clock reads the Unix epoch, the
//!   monotonic clock reads 0), and sleeping traps at once instead of
//!   blocking the worker thread, where the call's time budget could not
//!   stop it;
//! * randomness comes from a fixed-seed ChaCha8 stream, fresh per instance,
//!   so a plugin that leans on `random()` instead of its seed still replays
//!   the same way (and the pool's replay after a fault stays exact);
//! * stdout is discarded and stderr is kept, up to [`STDERR_BYTES`], so a
//!   fault can quote what the plugin said last (a Rust panic message, a
//!   Python traceback).

use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use std::time::Duration;
use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceTable, ResourceType};
use wasmtime_wasi::p2::pipe::{MemoryOutputPipe, SinkOutputStream};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How much of a plugin's stderr is kept; later writes fail.
pub(crate) const STDERR_BYTES: usize = 64 << 10;

/// The seed of every instance's WASI randomness. Fixed on purpose: an env's
/// randomness should come from the seed `reset` receives, and where it does
/// not, it should at least be the same on every run.
const WASI_RANDOM_SEED: u64 = 0x5241_4745_4e2d_7273; // "RAGEN-rs"

/// One instance's WASI state.
pub(crate) struct GuestWasi {
    ctx: WasiCtx,
    table: ResourceTable,
    stderr: MemoryOutputPipe,
}

impl GuestWasi {
    pub(crate) fn new() -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_BYTES);
        let ctx = WasiCtxBuilder::new()
            .stdout(SinkOutputStream)
            .stderr(stderr.clone())
            .wall_clock(StillClock)
            .monotonic_clock(StillClock)
            .secure_random(ChaCha8Rng::seed_from_u64(WASI_RANDOM_SEED))
            .insecure_random(ChaCha8Rng::seed_from_u64(!WASI_RANDOM_SEED))
            .insecure_random_seed(u128::from(WASI_RANDOM_SEED))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self { ctx, table: ResourceTable::new(), stderr }
    }

    /// The last `max` bytes the plugin wrote to stderr, trimmed, as text.
    pub(crate) fn stderr_tail(&self, max: usize) -> Option<String> {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(max)..]).trim().to_string();
        (!text.is_empty()).then_some(text)
    }

    pub(crate) fn view(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.ctx, table: &mut self.table }
    }
}

/// Link WASI 0.2 into `linker`, with the sleeping calls replaced by traps.
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    // A guest that sleeps would block the worker thread in the host, where
    // the epoch deadline cannot interrupt it. Time stands still here anyway,
    // so there is nothing to wait for: say so instead of hanging.
    linker.allow_shadowing(true);
    let mut clock = linker.instance("wasi:clocks/monotonic-clock@0.2.12")?;
    for name in ["subscribe-duration", "subscribe-instant"] {
        clock.func_new(name, move |_, _, _, _| {
            wasmtime::bail!(
                "the plugin tried to sleep (monotonic-clock.{name}); time stands still in the sandbox, \
                 so an environment must not wait on it"
            )
        })?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// The WASI 0.2 packages [`add_to_linker`] provides (any 0.2.x minor).
const LINKED_WASI: [&str; 6] = ["wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:cli/", "wasi:filesystem/", "wasi:sockets/"];

fn is_linked_wasi(import: &str) -> bool {
    LINKED_WASI.iter().any(|p| import.starts_with(p)) && import.contains("@0.2.")
}

/// Bind every import of `component` that [`add_to_linker`] does not provide
/// (`wasi:http`, say, which StarlingMonkey links for `fetch`) to functions
/// that trap if called, so such a plugin loads and only fails if it really
/// reaches for the capability.
///
/// wasmtime's own `define_unknown_imports_as_traps` does not do here: it
/// re-opens instances by exact name, so a plugin importing WASI 0.2.9 gets
/// a trapping 0.2.9 instance that shadows the linked 0.2.12 one, and it
/// defines a fresh resource for every resource an instance merely re-uses
/// (`pollable` in `monotonic-clock`), which then fails the type check.
pub(crate) fn trap_unlinked_imports<T: 'static>(linker: &mut Linker<T>, component: &Component, engine: &Engine) -> wasmtime::Result<()> {
    // Resource types the component has already met in an earlier import: a
    // later instance that names one of them re-uses it and needs nothing.
    let mut seen: Vec<ResourceType> = Vec::new();
    for (name, import) in component.component_type().imports(engine) {
        match import.ty {
            ComponentItem::ComponentInstance(instance) => {
                let exports: Vec<(&str, ComponentItem)> = instance.exports(engine).map(|(n, e)| (n, e.ty)).collect();
                if !is_linked_wasi(name) {
                    let mut stub = linker.instance(name)?;
                    for (export, item) in &exports {
                        match item {
                            ComponentItem::ComponentFunc(_) => {
                                let what = format!("{name}#{export}");
                                stub.func_new(export, move |_, _, _, _| {
                                    wasmtime::bail!("the sandbox grants no `{what}` (the plugin called it)")
                                })?;
                            }
                            ComponentItem::Resource(ty) if !seen.contains(ty) => {
                                stub.resource(export, ResourceType::host::<Unlinked>(), |_, _| Ok(()))?;
                            }
                            _ => {}
                        }
                    }
                }
                seen.extend(exports.iter().filter_map(|(_, item)| match item {
                    ComponentItem::Resource(ty) => Some(*ty),
                    _ => None,
                }));
            }
            ComponentItem::ComponentFunc(_) => {
                let what = name.to_string();
                linker.root().func_new(name, move |_, _, _, _| wasmtime::bail!("the sandbox grants no `{what}` (the plugin called it)"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The type of every resource of an unlinked import: none can be made.
struct Unlinked;

/// A clock that never moves: reads are the same on every run.
struct StillClock;

impl HostWallClock for StillClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for StillClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Config, Store};

    /// A component importing a function of an interface the host does not
    /// link, and one at the root, and exporting functions that call them.
    const CALLS_UNLINKED: &str = r#"
        (component
          (import "test:unlinked/thing" (instance $thing (export "poke" (func))))
          (import "prod" (func $prod))
          (core func $poke (canon lower (func $thing "poke")))
          (core func $prod (canon lower (func $prod)))
          (core module $m
            (import "host" "poke" (func $poke))
            (import "host" "prod" (func $prod))
            (func (export "run-poke") (call $poke))
            (func (export "run-prod") (call $prod))
            (func (export "idle")))
          (core instance $host (export "poke" (func $poke)) (export "prod" (func $prod)))
          (core instance $i (instantiate $m (with "host" (instance $host))))
          (func (export "run-poke") (canon lift (core func $i "run-poke")))
          (func (export "run-prod") (canon lift (core func $i "run-prod")))
          (func (export "idle") (canon lift (core func $i "idle"))))
    "#;

    #[test]
    fn an_unlinked_import_loads_and_traps_only_when_called() {
        let mut config = Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config).unwrap();
        let component = Component::new(&engine, wat::parse_str(CALLS_UNLINKED).unwrap()).unwrap();
        let mut linker = Linker::<()>::new(&engine);
        trap_unlinked_imports(&mut linker, &component, &engine).unwrap();
        let fresh = || {
            let mut store = Store::new(&engine, ());
            let instance = linker.instantiate(&mut store, &component).unwrap();
            (store, instance)
        };

        // Not calling the import is fine.
        let (mut store, instance) = fresh();
        let idle = instance.get_typed_func::<(), ()>(&mut store, "idle").unwrap();
        idle.call(&mut store, ()).unwrap();

        // A trap poisons its instance: a fresh one per call.
        for (export, what) in [("run-poke", "test:unlinked/thing#poke"), ("run-prod", "prod")] {
            let (mut store, instance) = fresh();
            let run = instance.get_typed_func::<(), ()>(&mut store, export).unwrap();
            let err = format!("{:?}", run.call(&mut store, ()).unwrap_err());
            assert!(err.contains(&format!("the sandbox grants no `{what}` (the plugin called it)")), "{export}: {err}");
        }
    }
}
