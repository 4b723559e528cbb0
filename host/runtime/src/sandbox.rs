//! The sandbox's limits: a time budget per call (epoch interruption), a
//! memory cap per instance (a `ResourceLimiter`) and a cap on observation
//! size, and how a failed call is classified so the caller can say why.

use crate::reported::ReportLimits;
use crate::wasi::GuestWasi;
use std::fmt;
use std::time::Duration;
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::{WasiCtxView, WasiView};

/// Limits applied to every instance of a plugin. The defaults are generous
/// for text environments and still stop a runaway plugin quickly.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxLimits {
    /// Wall-clock budget for one call into the plugin (rounded up to the
    /// epoch tick of 10 ms).
    pub call_timeout: Duration,
    /// Most linear memory one instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Largest observation accepted, in bytes; a longer one fails the episode.
    pub max_observation_bytes: usize,
    /// What the plugin may report about itself and its steps.
    pub report: ReportLimits,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(2),
            memory_bytes: 256 << 20,
            max_observation_bytes: 64 << 10,
            report: ReportLimits::default(),
        }
    }
}

/// How often the engine's epoch advances; the granularity of `call_timeout`.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

impl SandboxLimits {
    /// The call budget in epoch ticks (at least one).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        (self.call_timeout.as_millis() as u64).div_ceil(EPOCH_TICK.as_millis() as u64).max(1)
    }
}

/// Advance `engine`'s epoch every [`EPOCH_TICK`] for as long as the engine
/// lives. One thread per loaded plugin; it holds only a weak reference, so
/// dropping the plugin ends it.
pub(crate) fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("ragen-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("cannot spawn the epoch ticker thread");
}

/// Per-store state: the memory cap and whether it was hit, and the
/// instance's deny-all WASI.
pub(crate) struct StoreState {
    pub(crate) memory: MemoryCap,
    pub(crate) wasi: GuestWasi,
}

impl StoreState {
    pub(crate) fn new(limits: &SandboxLimits) -> Self {
        Self { memory: MemoryCap::new(limits.memory_bytes), wasi: GuestWasi::new() }
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.wasi.view()
    }
}

pub(crate) struct MemoryCap {
    cap: usize,
    /// Linear memory held now (the last size granted).
    pub(crate) current: usize,
    /// The size the guest last asked for beyond the cap.
    pub(crate) exceeded: Option<usize>,
}

impl MemoryCap {
    pub(crate) fn new(cap: usize) -> Self {
        Self { cap, current: 0, exceeded: None }
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.exceeded = Some(desired);
            // A trap, not a failed `memory.grow`: a guest that cannot get memory
            // would abort anyway, and a trap lets the host say why.
            wasmtime::bail!("memory cap exceeded: the plugin asked for {} MiB, the cap is {} MiB", desired >> 20, self.cap >> 20);
        }
        self.current = desired;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// Why a call into a plugin did not return normally. After any fault the
/// instance is unusable and must be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The call ran past `call_timeout` (an infinite loop, or far too slow).
    Timeout,
    /// The instance tried to grow its memory past `memory_bytes`.
    MemoryCap,
    /// The guest trapped (a panic, `unreachable`, a bad memory access...).
    Trap,
    /// The call returned, but its answer breaks the contract or the
    /// [`ReportLimits`] (an empty action list, a limit of 0, a 50 MB
    /// description). The instance itself is still usable.
    Contract,
}

/// A call that trapped, timed out or hit the memory cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub message: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Fault {}

/// Turn a wasmtime error from a call named `call` into a [`Fault`].
pub(crate) fn classify(error: wasmtime::Error, call: &str, state: &StoreState, limits: &SandboxLimits) -> Fault {
    if let Some(desired) = state.memory.exceeded {
        return Fault {
            kind: FaultKind::MemoryCap,
            message: format!(
                "{call}: the plugin tried to grow its memory to {:.1} MiB, past the cap of {} MiB",
                desired as f64 / (1 << 20) as f64,
                limits.memory_bytes >> 20
            ),
        };
    }
    if matches!(error.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) {
        return Fault {
            kind: FaultKind::Timeout,
            message: format!("{call}: did not return within the time budget of {} ms (an endless loop?)", limits.call_timeout.as_millis()),
        };
    }
    let mut message = format!("{call}: {}", describe_trap(&error));
    if let Some(said) = state.wasi.stderr_tail(STDERR_QUOTE_BYTES) {
        // Rust's hint about RUST_BACKTRACE cannot be acted on in a sandbox.
        let said: Vec<&str> = said.lines().filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE")).collect();
        message.push_str(&format!("; the plugin's stderr ends with: {}", said.join(" | ")));
    }
    Fault { kind: FaultKind::Trap, message }
}

/// Innermost frames that, all in one function, mark an out-of-bounds
/// trap as a stack overflow.
const RECURSION_FRAMES: usize = 8;

/// A stack overflow, named as such. Wasm's own call stack running out
/// traps as "call stack exhausted"; a Rust (or C) plugin's shadow stack in
/// linear memory running out shows up as an out-of-bounds access, with
/// the recursing function on top of the backtrace frame after frame. Said
/// plainly, the author looks for the recursion instead of a bad pointer.
fn stack_overflow(root: &str, frames: &[&str]) -> Option<String> {
    let top = frames.first()?;
    let recursing = frames.len() >= RECURSION_FRAMES && frames[..RECURSION_FRAMES].iter().all(|f| f == top);
    if root.contains("call stack exhausted") {
        return Some(format!("the plugin overflowed its stack ({root}) in `{top}`; look for unbounded recursion"));
    }
    (recursing && root.contains("out of bounds")).then(|| {
        format!("the plugin overflowed its stack: `{top}` calls itself over and over ({root}); bound the recursion or make it a loop")
    })
}

/// How much of the plugin's stderr a fault message quotes.
const STDERR_QUOTE_BYTES: usize = 600;

/// One line a plugin author can act on. A Rust panic shows up as a trap
/// inside the standard library's panic machinery, whose root cause
/// (`unreachable`) would mislead; name the panic instead. Its message is on
/// stderr, which the caller quotes.
fn describe_trap(error: &wasmtime::Error) -> String {
    let full = format!("{error:?}");
    if full.contains("panicking") || full.contains("panic_fmt") || full.contains("rust_panic") {
        return "the plugin panicked".to_string();
    }
    let root = error.root_cause().to_string();
    let all_frames: Vec<&str> = full.lines().filter_map(|l| l.split_once(" - ").map(|(_, f)| f.trim())).collect();
    if let Some(overflow) = stack_overflow(&root, &all_frames) {
        return overflow;
    }
    let frames: Vec<&str> = all_frames.iter().copied().filter(|f| !f.starts_with("<unknown>")).take(3).collect();
    if frames.is_empty() {
        format!("the plugin trapped: {root}")
    } else {
        format!("the plugin trapped: {root} (in {})", frames.join(" < "))
    }
}
