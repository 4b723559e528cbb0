//! `ragen-host bench --json` reports sandboxed and native rates and their
//! ratio. The numbers are not asserted (shared machines are noisy); their
//! presence and consistency are.

use crate::common::{plugin, ragen_host, text};

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

#[test]
fn bench_policy_reports_training_and_sampling_speed() {
    let out = ragen_host(&["bench", "--policy", plugin("bandit").to_str().unwrap(), "--batch", "4", "--seconds", "0.4", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["train_tokens_per_s", "sample_tokens_per_s_cached", "sample_tokens_per_s_uncached", "sample_tokens_per_s_unbatched"] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    // The default prompt is the reference's: hundreds of bytes, far fewer
    // tokens once the tokenizer has the prompt's words.
    let tokens = v["prompt_tokens"].as_u64().unwrap();
    assert!((50..400).contains(&tokens), "{v}");
    assert_eq!(v["batch"], 4);

    let out = ragen_host(&["bench", "--policy", plugin("bandit").to_str().unwrap(), "--backend", "cuda"]);
    if !cfg!(feature = "cuda") {
        assert!(!out.status.success() && text(&out).contains("--features cuda"), "{}", text(&out));
    }
}
