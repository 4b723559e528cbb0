//! Cross-crate tests: the built plugins in the sandbox against the same envs natively, the pool, the agent loop and learning.
//!
//! One test binary for the crate (as wasmtime's `tests/all`): each binary
//! links wasmtime and Burn, so one link instead of many.

mod agent;
mod common;
mod hostile_props;
mod learning;
mod llm_learning;
mod plugins;
mod polyglot;
mod pool;
mod sandbox;
