//! The built plugins, loaded, for the e2e tests (paths: `ragen-test-fixtures`).

#![allow(dead_code)]

use ragen_runtime::{Plugin, SandboxLimits};
pub use ragen_test_fixtures::{example, plugin, test_plugin};
use std::path::Path;
use std::sync::Arc;

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
