//! A pretrained model end to end through the command line: `chat` talks,
//! `eval --model` plays an env with free-text replies, a bad model file is
//! refused with its name.

use crate::common::{model, plugin, ragen_host, scratch, text};

#[test]
fn chat_answers_greedily_through_the_chat_template() {
    let out = ragen_host(&[
        "chat",
        "--model",
        model().to_str().unwrap(),
        "--temperature",
        "0",
        "--max-new-tokens",
        "24",
        "What is the capital of France? Answer in one sentence.",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(reply.contains("Paris"), "{reply}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("Llama, 30 layers, width 576, 9 heads (3 key/value), vocabulary 49152"), "{log}");
}

#[test]
fn eval_plays_bandit_with_the_model_and_keeps_its_tokens() {
    let file = scratch("pretrained").join("bandit.jsonl");
    let out = ragen_host(&[
        "eval",
        "--env",
        plugin("bandit").to_str().unwrap(),
        "--model",
        model().to_str().unwrap(),
        "--episodes",
        "4",
        "--max-new-tokens",
        "32",
        "--json",
        "--trajectories",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policy"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(v["episodes"], 4);
    let format = v["format_valid_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&format), "{v}");
    let tokens = v["response_tokens_mean"].as_f64().unwrap();
    assert!(tokens > 0.0 && tokens <= 32.0, "{v}");
    let lines = std::fs::read_to_string(&file).unwrap();
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    let reply = &first["segments"][2];
    assert_eq!(reply["role"], "assistant");
    assert_eq!(reply["prefill"], "<think>");
    assert_eq!(reply["tokens"].as_array().unwrap().len(), reply["logprobs"].as_array().unwrap().len());
    assert!(reply["logprobs"].as_array().unwrap().iter().all(|p| p.as_f64().unwrap() <= 0.0));
}

#[test]
fn a_file_that_is_not_a_model_is_refused_by_name() {
    let bad = scratch("pretrained").join("not-a-model.gguf");
    std::fs::write(&bad, b"hello, not a model").unwrap();
    let out = ragen_host(&["chat", "--model", bad.to_str().unwrap(), "hi"]);
    assert!(!out.status.success());
    let err = text(&out);
    assert!(err.contains("not-a-model.gguf") && err.contains("magic"), "{err}");
}
