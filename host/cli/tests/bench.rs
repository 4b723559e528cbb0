//! `ragen-host bench --json` reports sandboxed and native rates and their
//! ratio. The numbers are not asserted (shared machines are noisy); their
//! presence and consistency are.

mod common;

use common::{plugin, ragen_host, text};

#[test]
fn bench_reports_sandboxed_native_and_ratio() {
    let out = ragen_host(&["bench", plugin("sokoban").to_str().unwrap(), "--envs", "64", "--threads", "2", "--seconds", "0.4", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["name"], "sokoban");
    assert_eq!(v["envs"], 64);
    for side in ["sandboxed", "native"] {
        for rate in ["resets_per_sec", "steps_per_sec"] {
            assert!(v[side][rate].as_f64().unwrap() > 0.0, "{side}.{rate}: {v}");
        }
    }
    let ratio = v["ratio"]["steps_per_sec"].as_f64().unwrap();
    let expected = v["sandboxed"]["steps_per_sec"].as_f64().unwrap() / v["native"]["steps_per_sec"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9);
    assert_eq!(v["failures"], 0);
    assert_eq!(v["instances"], 2);
}
