//! Helpers shared by the CLI tests: the built plugins (`ragen-test-fixtures`), running the binary.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A shipped plugin (`make plugins`).
pub fn plugin(name: &str) -> PathBuf {
    ragen_test_fixtures::plugin(name)
}

/// An authoring example (`make plugins`).
pub fn example(name: &str) -> PathBuf {
    ragen_test_fixtures::example(name)
}

/// A deliberately broken plugin (`make test-plugins`).
pub fn faulty(fault: &str) -> PathBuf {
    ragen_test_fixtures::test_plugin(fault)
}

/// The default pretrained model (`make model`).
pub fn model() -> PathBuf {
    ragen_test_fixtures::default_model()
}

/// A scratch directory for files a test writes.
pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The Python of a test virtualenv `target/NAME-venv`, which `make
/// MAKE_TARGET` installs from `tests/NAME/requirements.txt`.
pub fn venv_python(name: &str, make_target: &str) -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(format!("target/{name}-venv/bin/python"));
    assert!(python.exists(), "{} is missing: run `make {make_target}` (pinned in tests/{name}/requirements.txt)", python.display());
    python
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

/// Every metric of every line but the wall-clock timings.
pub fn without_timings(metrics: &str) -> Vec<serde_json::Value> {
    metrics
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let m = v.as_object_mut().unwrap();
            assert!(m.remove("rollout_seconds").is_some() && m.remove("update_seconds").is_some());
            v
        })
        .collect()
}
