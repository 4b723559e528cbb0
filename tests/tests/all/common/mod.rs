//! The built plugins, loaded, for the e2e tests (paths: `ragen-test-fixtures`).

#![allow(dead_code)]

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::{Backend, Tensor};
use ragen_policy::{PolicyModel, PolicyModelConfig};
use ragen_runtime::{Plugin, SandboxLimits};
pub use ragen_test_fixtures::{example, plugin, test_plugin};
use std::path::Path;
use std::sync::{Arc, Mutex};

fn load(path: &Path, limits: SandboxLimits) -> Arc<Plugin> {
    Arc::new(Plugin::from_file_with(path, limits).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

/// A shipped plugin (`make plugins`), loaded with the default limits.
pub fn shipped(name: &str) -> Arc<Plugin> {
    load(&plugin(name), SandboxLimits::default())
}

/// An authoring example (`make plugins`), loaded with the default limits.
pub fn loaded_example(name: &str) -> Arc<Plugin> {
    load(&example(name), SandboxLimits::default())
}

/// A deliberately broken plugin (`make test-plugins`), under `limits`.
pub fn faulty(fault: &str, limits: SandboxLimits) -> Arc<Plugin> {
    load(&test_plugin(fault), limits)
}

/// Held while a test draws weights: Burn draws from one generator for the
/// whole process, and tests run beside each other.
static DRAWS: Mutex<()> = Mutex::new(());

/// Runs `draw` right after seeding Burn's generator with `seed`, with no
/// other test drawing in between, so the weights it draws are the same on
/// every run. Every draw of weights in these tests goes through here.
pub fn seeded<T>(seed: u64, draw: impl FnOnce() -> T) -> T {
    let _alone = DRAWS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    <burn::backend::Flex as Backend>::seed(&Default::default(), seed);
    draw()
}

/// A model from scratch, its weights drawn from `seed` now: Burn draws a
/// parameter at its first read, and each clone of an unread parameter
/// would draw its own.
pub fn scratch_model<B: Backend>(config: &PolicyModelConfig, seed: u64) -> PolicyModel<B> {
    struct ReadAll;
    impl<B: Backend> ModuleVisitor<B> for ReadAll {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    seeded(seed, || {
        let model = config.init::<B>(&Default::default());
        model.visit(&mut ReadAll);
        model
    })
}
