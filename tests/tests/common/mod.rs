//! Finding the built plugins, shared by the e2e tests.

#![allow(dead_code)]

use ragen_runtime::{Plugin, SandboxLimits};
use std::path::PathBuf;
use std::sync::Arc;

/// `$var` if set, else `default` relative to this crate.
fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default))
}

/// A shipped plugin's file (`make plugins`).
pub fn plugin_path(name: &str) -> PathBuf {
    let path = dir("RAGEN_PLUGIN_DIR", "../target/plugins").join(format!("{name}.wasm"));
    assert!(path.exists(), "{} is missing: run `make plugins` first (or set RAGEN_PLUGIN_DIR)", path.display());
    path
}

/// A shipped plugin, loaded with the default limits.
pub fn shipped(name: &str) -> Arc<Plugin> {
    Arc::new(Plugin::from_file(plugin_path(name)).unwrap_or_else(|e| panic!("{name}: {e:#}")))
}

/// A deliberately broken plugin (`make test-plugins`), under `limits`.
pub fn faulty(fault: &str, limits: SandboxLimits) -> Arc<Plugin> {
    let path = dir("RAGEN_TEST_PLUGIN_DIR", "../target/test-plugins").join(format!("{fault}.wasm"));
    assert!(path.exists(), "{} is missing: run `make test-plugins` first", path.display());
    Arc::new(Plugin::from_file_with(&path, limits).unwrap_or_else(|e| panic!("{fault}: {e:#}")))
}

/// A plugin or example that `make plugins` builds only when the Python or
/// JavaScript toolchain installed: `None`, with a note, when it is missing;
/// a failure under CI (`CI=true`), where `.ci/run` installs both.
pub fn optional(kind: &str, name: &str) -> Option<Arc<Plugin>> {
    let path = match kind {
        "plugin" => dir("RAGEN_PLUGIN_DIR", "../target/plugins"),
        _ => dir("RAGEN_EXAMPLE_DIR", "../target/examples"),
    }
    .join(format!("{name}.wasm"));
    if !path.exists() {
        let why = format!("{} is missing: `make plugins` skipped it (see its warning: no Python or Node toolchain?)", path.display());
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Arc::new(Plugin::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"))))
}
