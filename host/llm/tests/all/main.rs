//! Pretrained models: loading, GGUF, LoRA and SmolLM2 against the reference fixtures.
//!
//! One test binary for the crate (as wasmtime's `tests/all`): each binary
//! links wasmtime and Burn, so one link instead of many.

mod fuzz;
mod gguf;
mod loading;
mod lora;
mod smollm2;
