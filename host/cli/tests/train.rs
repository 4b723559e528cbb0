//! `ragen-host train`: a short Bandit run leaves its config, metrics and
//! checkpoint; a resumed run continues it exactly; `eval --checkpoint`
//! reads it back.

mod common;

use common::{plugin, ragen_host, scratch, text};

const SMALL: &str = r#"
steps = 6
val_episodes = 16
test_freq = 3
save_freq = 2
[rollout]
env_groups = 4
group_size = 8
enable_think = false
[prompt]
system = ""
intro = "{actions}\n"
legend = ""
turn = "{state}\n"
format_answer = ""
[model]
d_model = 32
n_layers = 1
n_heads = 2
max_seq_len = 256
[ppo]
lr = 0.003
"#;

#[test]
fn a_run_leaves_metrics_and_a_checkpoint_and_resumes_exactly() {
    let dir = scratch("train");
    let config = dir.join("small.toml");
    std::fs::write(&config, SMALL).unwrap();
    let bandit = plugin("bandit");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);

    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--out", a.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics_a = std::fs::read_to_string(a.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics_a.lines().count(), 6);
    let first: serde_json::Value = serde_json::from_str(metrics_a.lines().next().unwrap()).unwrap();
    for key in ["success", "return_mean", "reward_std_before_filter", "reward_std_after_filter", "entropy", "grad_norm", "clip_fraction", "approx_kl", "response_tokens", "valid_action_ratio"] {
        assert!(first[key].is_number(), "metrics.jsonl lacks `{key}`: {first}");
    }
    assert!(metrics_a.lines().filter(|l| l.contains("val_success")).count() >= 2, "validation every test_freq steps");
    assert!(a.join("config.toml").exists() && a.join("checkpoint/state.json").exists());
    let png = std::fs::read(a.join("dashboard.png")).expect("a dashboard is drawn");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "dashboard.png is a real picture");

    // Three steps, then resume to six: the same metrics as one straight run.
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--steps", "3", "--out", b.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "6"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(b.join("metrics.jsonl")).unwrap(), metrics_a, "a resumed run continues exactly");

    let out = ragen_host(&["eval", "--env", bandit.to_str().unwrap(), "--checkpoint", a.to_str().unwrap(), "--episodes", "32", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policy"], "burn-transformer");
    assert!(v["success_rate"].as_f64().unwrap() >= 0.0);
}

#[test]
fn train_explains_bad_input() {
    let bandit = plugin("bandit");
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--backend", "cuda", "--out", "/nonexistent/x"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("backend `cuda`"), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", "/nonexistent/run"]);
    assert!(text(&out).contains("--resume needs a run directory"), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--algo", "ppo2"]);
    assert!(text(&out).contains("use starpo-s, starpo or grpo"), "{}", text(&out));
}
