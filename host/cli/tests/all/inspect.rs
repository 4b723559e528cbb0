//! `ragen-host inspect`, run as a user runs it.

use crate::common::{plugin, ragen_host, scratch};
use std::path::PathBuf;

#[test]
fn inspect_json_describes_the_plugin() {
    let path = plugin("sokoban");
    let out = ragen_host(&["inspect", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["name"], "sokoban");
    assert_eq!(v["version"], "0.1.0");
    assert_eq!(v["contract"], "ragen:env@0.2.0");
    assert_eq!(v["batched"], true);
    assert_eq!(v["oracle"], true);
    assert_eq!(v["env"]["actions"], serde_json::json!(["Up", "Down", "Left", "Right"]));
    assert_eq!(v["env"]["legend"][0]["symbol"], "#");
    let keys: Vec<&str> = v["config_keys"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert!(keys.contains(&"num_boxes") && keys.contains(&"symbols"), "{keys:?}");
}

#[test]
fn inspect_applies_settings() {
    let path = plugin("bandit");
    let out = ragen_host(&["inspect", path.to_str().unwrap(), "--json", "--set", "lo_arm_name=Trader", "--set", "hi_arm_name=Librarian"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["env"]["actions"], serde_json::json!(["Trader", "Librarian"]));
    assert_eq!(v["multi_turn"], false);
}

#[test]
fn inspect_explains_what_is_wrong() {
    let path = plugin("sokoban");
    let bad_key = ragen_host(&["inspect", path.to_str().unwrap(), "--set", "room=9"]);
    assert!(!bad_key.status.success());
    let err = String::from_utf8_lossy(&bad_key.stderr);
    assert!(err.contains("unknown config key `room`") && err.contains("dim_x"), "{err}");

    let not_wasm = ragen_host(&["inspect", env!("CARGO_MANIFEST_DIR")]);
    assert!(!not_wasm.status.success());

    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let text = ragen_host(&["inspect", manifest.to_str().unwrap()]);
    assert!(!text.status.success());
    assert!(String::from_utf8_lossy(&text.stderr).contains("not a WebAssembly file"));

    let malformed = ragen_host(&["inspect", path.to_str().unwrap(), "--set", "dim_x"]);
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("expected KEY=VALUE"));
}

#[test]
fn the_second_load_comes_from_the_compile_cache() {
    // The first load compiles and keeps the code; the next process reuses
    // it; `--no-cache` and RAGEN_NO_CACHE compile afresh.
    let cache = scratch("compile-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let path = plugin("sokoban");
    let compiled = |extra: &[&str], vars: &[(&str, &std::path::Path)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ragen-host"))
            .args(["inspect", path.to_str().unwrap(), "--json"])
            .args(extra)
            .env_remove("RAGEN_NO_CACHE")
            .env("RAGEN_CACHE_DIR", &cache)
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["compiled"].as_str().unwrap().to_string()
    };
    assert_eq!(compiled(&[], &[]), "compiled");
    assert!(std::fs::read_dir(&cache).unwrap().next().is_some(), "the compiled code was kept in {}", cache.display());
    assert_eq!(compiled(&[], &[]), "cache");
    assert_eq!(compiled(&["--no-cache"], &[]), "compiled, cache off");
    assert_eq!(compiled(&[], &[("RAGEN_NO_CACHE", std::path::Path::new("1"))]), "compiled, cache off");
}

#[test]
fn inspect_describes_a_text_action_space() {
    let out = ragen_host(&["inspect", plugin("countdown").to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["env"]["actions"], serde_json::json!([]));
    assert_eq!(v["env"]["text_action"]["max_bytes"], 256);
    assert!(v["env"]["text_action"]["form"].as_str().unwrap().contains("expression"));
    let out = ragen_host(&["inspect", plugin("countdown").to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("actions       text of up to 256 bytes: one arithmetic expression"), "{shown}");
}
