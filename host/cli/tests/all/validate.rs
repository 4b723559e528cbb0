//! `ragen-host validate` passes the shipped plugins and fails broken ones
//! with a message naming the problem, without hanging or crashing.

use crate::common::{faulty, plugin, ragen_host, scratch, text};
use std::time::{Duration, Instant};

#[test]
fn the_shipped_plugins_pass() {
    for name in ["bandit", "sokoban", "frozenlake", "countdown"] {
        let out = ragen_host(&["validate", plugin(name).to_str().unwrap()]);
        let report = text(&out);
        assert!(out.status.success(), "{name}:\n{report}");
        assert!(report.contains("PASS: all 11 checks passed"), "{report}");
        assert!(report.contains("resets/s") && report.contains("steps/s"), "{report}");
        assert!(report.contains("reset-many and step-many match single calls"), "{report}");
        // Every shipped plugin has an oracle, and it beats random play.
        assert!(report.contains("answers within the rules"), "{name}:\n{report}");
    }
}

#[test]
fn a_text_env_is_validated_with_text_actions() {
    let out = ragen_host(&["validate", plugin("countdown").to_str().unwrap()]);
    let report = text(&out);
    assert!(report.contains("text actions of up to 256 bytes"), "{report}");
    // Text over max-bytes, and an id, must both be bad actions.
    assert!(report.contains("text of 257 bytes, id 0 rejected with bad-action"), "{report}");
}

#[test]
fn a_plugin_built_against_contract_0_1_is_refused_with_the_rebuild_steps() {
    // The Rust corridor example as `make plugins` built it before 0.2
    // (tests/fixtures/contract-0.1/README.md).
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/contract-0.1/corridor.wasm");
    let report = fails_with(&file, "built against ragen:env@0.1.0, but this host speaks ragen:env@0.2.0");
    assert!(report.contains("rebuild the plugin") && report.contains("type Action = u32") && report.contains("action_space"), "{report}");
}

/// Validate a broken plugin with tight limits; it must fail with `expect`
/// in the report, quickly.
fn fails_with(file: &std::path::Path, expect: &str) -> String {
    let started = Instant::now();
    let out = ragen_host(&["validate", file.to_str().unwrap(), "--call-timeout-ms", "200", "--memory-mib", "32"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}: expected exit code 1:\n{report}", file.display());
    assert!(report.contains(expect), "{}: expected `{expect}` in:\n{report}", file.display());
    assert!(started.elapsed() < Duration::from_secs(60), "validate took {:?}", started.elapsed());
    report
}

#[test]
fn an_endless_loop_in_step_fails() {
    fails_with(&faulty("loop-in-step"), "did not return within the time budget of 200 ms");
}

#[test]
fn unbounded_memory_growth_fails() {
    fails_with(&faulty("grow-memory"), "past the cap of 32 MiB");
}

#[test]
fn a_trap_in_reset_fails() {
    let report = fails_with(&faulty("trap-in-reset"), "reset(seed 3): reset: the plugin panicked");
    assert!(report.contains("return an env-error result instead of trapping"), "{report}");
    // The panic message reaches the author through the sandbox's stderr.
    assert!(report.contains("deliberate trap in reset (seed 3)"), "{report}");
    assert!(!report.contains("RUST_BACKTRACE"), "{report}");
}

#[test]
fn an_oracle_that_loses_to_random_play_is_reported_as_lying() {
    let report = fails_with(&faulty("lying-oracle"), "the oracle lies");
    assert!(report.contains("succeeded on 0 of 16 seeds"), "{report}");
    // The rest of the plugin is sound: only the oracle check fails.
    assert!(report.contains("FAIL: 1 of 11 checks failed"), "{report}");
}

#[test]
fn a_nan_reward_fails() {
    fails_with(&faulty("nan-reward"), "seed 3: a reward or metric is NaN");
}

#[test]
fn a_core_module_is_not_a_component() {
    let file = scratch("validate").join("core-module.wasm");
    // The smallest valid core WebAssembly module.
    std::fs::write(&file, b"\0asm\x01\0\0\0").unwrap();
    fails_with(&file, "this is a core WebAssembly module, not a component");
}

#[test]
fn another_major_version_of_the_contract_is_refused() {
    // A real component whose contract version reads 1.0.0: the shipped
    // Sokoban with its interface names rewritten (same length, so the binary
    // stays well-formed).
    let mut bytes = std::fs::read(plugin("sokoban")).unwrap();
    let mut patched = 0;
    for (from, to) in
        [(&b"ragen:env/environment@0.2.0"[..], &b"ragen:env/environment@1.0.0"[..]), (b"ragen:env/types@0.2.0", b"ragen:env/types@1.0.0")]
    {
        let mut i = 0;
        while let Some(pos) = bytes[i..].windows(from.len()).position(|w| w == from) {
            bytes[i + pos..i + pos + from.len()].copy_from_slice(to);
            i += pos + from.len();
            patched += 1;
        }
    }
    assert!(patched >= 2, "expected to rewrite the contract names");
    let file = scratch("validate").join("sokoban-v1.wasm");
    std::fs::write(&file, bytes).unwrap();
    let report = fails_with(&file, "built against ragen:env@1.0.0, but this host speaks ragen:env@0.2.0");
    assert!(report.contains("rebuild the plugin"), "{report}");
}
