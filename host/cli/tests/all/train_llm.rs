//! `ragen-host train --model`: a pretrained-format model (a tiny random
//! Llama written as a Hugging Face directory) trains with LoRA; its
//! checkpoint holds the adapters and the value head, pinned to the base
//! model's SHA-256; a resumed run continues exactly; another base file is
//! refused; `eval --checkpoint` plays it.

use crate::common::{plugin, ragen_host, scratch, text, without_timings};
use ragen_llm::Architecture;
use ragen_test_fixtures::tiny_llm::Tiny;
use safetensors::Dtype;

/// Vanilla StarPO (so the checkpoint carries the KL's reference too), LoRA
/// rank 8, one-token replies after `<answer>`.
const LORA: &str = r#"
steps = 4
val_episodes = 16
test_freq = 2
save_freq = 2
[lora]
rank = 8
alpha = 16.0
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
[sampling]
max_new_tokens = 1
[ppo]
lr = 0.02
"#;

#[test]
fn a_lora_run_checkpoints_its_adapters_resumes_exactly_and_refuses_another_base() {
    let dir = scratch("train-lora");
    let model = dir.join("tiny-llama");
    let _ = std::fs::remove_dir_all(&model);
    Tiny::with_words(Architecture::Llama, &["Phoenix</answer>", "Dragon</answer>"]).write_hf(&model, Dtype::F32);
    let config = dir.join("lora.toml");
    std::fs::write(&config, LORA).unwrap();
    let bandit = plugin("bandit");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
    let train = |out: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["train", "--env", bandit.to_str().unwrap(), "--model", model.to_str().unwrap(), "--algo", "starpo"];
        args.extend(["--config", config.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        args.extend(extra);
        let out = ragen_host(&args);
        assert!(out.status.success(), "{}", text(&out));
    };

    train(&a, &[]);
    let metrics_a = std::fs::read_to_string(a.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics_a.lines().count(), 4);
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(a.join("checkpoint/state.json")).unwrap()).unwrap();
    assert_eq!(state["base_model"]["sha256"].as_str().unwrap().len(), 64, "the base is pinned by its SHA-256: {state}");
    let adapters = std::fs::metadata(a.join("checkpoint/model.bin")).unwrap().len();
    let base = std::fs::metadata(model.join("model.safetensors")).unwrap().len();
    assert!(adapters * 2 < base, "the checkpoint holds the adapters and head ({adapters} bytes), not the model ({base} bytes)");
    let config_toml = std::fs::read_to_string(a.join("config.toml")).unwrap();
    assert!(config_toml.contains("model_path") && config_toml.contains("[lora]"), "{config_toml}");

    // Two steps, then resume to four: the same metrics as one straight run.
    train(&b, &["--steps", "2"]);
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.join("checkpoint/reference.bin").exists(), "the KL's reference adapters are saved");
    assert_eq!(
        without_timings(&std::fs::read_to_string(b.join("metrics.jsonl")).unwrap()),
        without_timings(&metrics_a),
        "a resumed LoRA run continues exactly"
    );

    // eval --checkpoint plays the trained adapters on the eval seeds.
    let out = ragen_host(&["eval", "--env", bandit.to_str().unwrap(), "--checkpoint", a.to_str().unwrap(), "--episodes", "16", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["checkpoint"].as_str().unwrap().contains("checkpoint"), "{v}");

    // Another model file where the base was: resuming is refused.
    let _ = std::fs::remove_dir_all(&model);
    Tiny::with_words(Architecture::Qwen2, &["Phoenix</answer>", "Dragon</answer>"]).write_hf(&model, Dtype::F32);
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "6"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("SHA-256") && text(&out).contains("resume with the model it was trained on"), "{}", text(&out));
}

/// Countdown's action is text: a pretrained model trains a step on it and
/// eval plays the checkpoint. (That a parsed answer reaches the env as its
/// action, and is scored, is `tests/tests/all/agent.rs`'s
/// `countdown_answers_reach_the_env_as_text`.)
const COUNTDOWN: &str = r#"
steps = 1
val_episodes = 8
test_freq = 1
[lora]
rank = 4
[rollout]
env_groups = 2
group_size = 4
enable_think = false
[sampling]
max_new_tokens = 2
"#;

#[test]
fn a_pretrained_model_trains_a_step_on_a_text_env() {
    let dir = scratch("train-countdown");
    let model = dir.join("tiny-llama");
    let _ = std::fs::remove_dir_all(&model);
    // Whole answers as single tokens, so the 3 new tokens can close the tag.
    Tiny::with_words(Architecture::Llama, &["1 + 2 + 3</answer>", "7 * 7</answer>"]).write_hf(&model, Dtype::F32);
    let config = dir.join("countdown.toml");
    std::fs::write(&config, COUNTDOWN).unwrap();
    let countdown = plugin("countdown");
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let args = ["train", "--env", countdown.to_str().unwrap(), "--model", model.to_str().unwrap(), "--config", config.to_str().unwrap()];
    let out = ragen_host(&[&args[..], &["--out", run.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let step: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!((step["step"].as_u64(), step["episodes"].as_u64(), step["failed_episodes"].as_u64()), (Some(0), Some(8), Some(0)), "{step}");
    // Two random tokens of an untrained model never close the answer tag:
    // every episode earns exactly the format penalty, and no action.
    assert_eq!((step["format_valid_ratio"].as_f64(), step["valid_action_ratio"].as_f64()), (Some(0.0), Some(0.0)), "{step}");
    assert!((step["return_mean"].as_f64().unwrap() + 0.1).abs() < 1e-9, "{step}");

    let out =
        ragen_host(&["eval", "--env", countdown.to_str().unwrap(), "--checkpoint", run.to_str().unwrap(), "--episodes", "8", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["optimal_success"], 1.0, "every generated puzzle is solvable: {v}");
}

#[test]
fn training_from_scratch_on_a_text_env_says_to_use_a_pretrained_model() {
    let run = scratch("train-countdown-scratch").join("run");
    let out = ragen_host(&["train", "--env", plugin("countdown").to_str().unwrap(), "--steps", "1", "--out", run.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("action is free text") && text(&out).contains("--model"), "{}", text(&out));
}
