//! Host-side bindings generated from `wit/env.wit`, the single source of
//! the contract (the SDK generates its guest side from the same file).

wasmtime::component::bindgen!({
    world: "env-plugin",
    path: "../../wit",
    additional_derives: [PartialEq],
});
