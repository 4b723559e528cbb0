//! The `ragen-host` binary's tests, one module per command or concern.
//!
//! One test binary for the crate (as wasmtime's `tests/all`): each binary
//! links wasmtime and Burn, so one link instead of many.

mod bench;
mod common;
mod eval;
mod hostile;
mod inspect;
mod logging;
mod oci;
mod play;
mod polyglot;
mod pretrained;
mod remote;
mod serve;
mod spec_fuzz;
mod train;
mod train_llm;
mod validate;
