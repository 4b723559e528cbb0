//! Helpers shared by the CLI tests: find the built plugins, run the binary.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default))
}

/// A shipped plugin (`make plugins`).
pub fn plugin(name: &str) -> PathBuf {
    let path = dir("RAGEN_PLUGIN_DIR", "../../target/plugins").join(format!("{name}.wasm"));
    assert!(path.exists(), "{} is missing: run `make plugins` first", path.display());
    path
}

/// A plugin built by a toolchain `make plugins` may have had to skip (the
/// Python and JavaScript ones): `None`, with a note, when it is missing, so
/// a machine without Python or Node still passes the rest. Under CI
/// (`CI=true`), where `.ci/run` installs those toolchains, missing is a
/// failure.
pub fn optional(kind: &str, name: &str) -> Option<PathBuf> {
    let path = match kind {
        "plugin" => dir("RAGEN_PLUGIN_DIR", "../../target/plugins"),
        _ => dir("RAGEN_EXAMPLE_DIR", "../../target/examples"),
    }
    .join(format!("{name}.wasm"));
    if path.exists() {
        return Some(path);
    }
    let why = format!("{} is missing: `make plugins` skipped it (see its warning: no Python or Node toolchain?)", path.display());
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    None
}

/// A deliberately broken plugin (`make test-plugins`).
pub fn faulty(fault: &str) -> PathBuf {
    let path = dir("RAGEN_TEST_PLUGIN_DIR", "../../target/test-plugins").join(format!("{fault}.wasm"));
    assert!(path.exists(), "{} is missing: run `make test-plugins` first", path.display());
    path
}

/// A scratch directory for files a test writes.
pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn ragen_host(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ragen-host")).args(args).stdin(Stdio::null()).output().unwrap()
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `ragen-host play ARGS`, typing `keys` at it; whether it exited cleanly,
/// and everything it showed.
pub fn play(args: &[&str], keys: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
        .arg("play")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(keys.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
