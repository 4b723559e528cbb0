//! Loading without a download: a tiny random Llama and a tiny random Qwen2
//! are written here in both formats (a GGUF file as llama.cpp lays it out,
//! q/k rows permuted; a Hugging Face directory with config.json,
//! model.safetensors, tokenizer.json and tokenizer_config.json), loaded
//! through the real code paths, and must compute the same thing. Damaged
//! files must be refused with an error that names the file, the tensor and
//! the fix.

use burn::backend::Flex;
use burn::prelude::*;
use ragen_agent::Tokenizer;
use ragen_llm::gguf::{TensorType, Value};
use ragen_llm::{Architecture, Pretrained};
use ragen_rng::SeedRng;
use ragen_test_fixtures::tiny_llm::{Tiny, vocabulary};
use safetensors::Dtype;
use serde_json::json;
use std::path::{Path, PathBuf};

type B = Flex;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ragen-llm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const TEXT: &str = "<|im_start|>user\nthe 12 boxes: the   thé\n<|im_end|>";

/// Logits `[t, v]` of `TEXT` under the model at `path`, flattened.
fn logits(path: &Path) -> (Vec<u32>, Vec<f32>) {
    let model = Pretrained::<B>::load(path, &Default::default()).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let ids = model.tokenizer.encode(TEXT);
    assert_eq!(model.tokenizer.decode(&ids), TEXT, "the tokenizer round-trips");
    let input: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let (logits, values) = model.model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, ids.len()]), &Default::default()));
    assert_eq!(values.dims(), [1, ids.len()]);
    (ids, logits.into_data().to_vec::<f32>().unwrap())
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn both_formats_agree(arch: Architecture) {
    let tiny = Tiny::new(arch);
    let dir = scratch(&format!("{arch:?}"));
    tiny.write_hf(&dir.join("hf"), Dtype::F32);
    tiny.write_hf(&dir.join("hf-bf16"), Dtype::BF16);
    std::fs::write(dir.join("f32.gguf"), tiny.gguf(TensorType::F32, TensorType::F32).to_bytes()).unwrap();
    std::fs::write(dir.join("quant.gguf"), tiny.gguf(TensorType::Q8_0, TensorType::Q4_1).to_bytes()).unwrap();
    let (ids, reference) = logits(&dir.join("hf"));
    assert!(ids.contains(&(tiny_special("<|im_start|>"))), "special tokens are single tokens: {ids:?}");
    let (gguf_ids, exact) = logits(&dir.join("f32.gguf"));
    assert_eq!(gguf_ids, ids, "the tokenizer rebuilt from GGUF metadata splits text as tokenizer.json does");
    assert!(max_gap(&reference, &exact) < 1e-5, "{arch:?}: F32 GGUF vs safetensors: {}", max_gap(&reference, &exact));
    let (_, bf16) = logits(&dir.join("hf-bf16"));
    assert!(max_gap(&reference, &bf16) < 0.05, "{arch:?}: bf16: {}", max_gap(&reference, &bf16));
    let (_, quantised) = logits(&dir.join("quant.gguf"));
    let gap = max_gap(&reference, &quantised);
    assert!(gap < 0.15, "{arch:?}: Q8_0/Q4_1 GGUF vs safetensors differ by {gap} of the logits' scale");
    assert!(gap > 1e-4, "{arch:?}: quantisation should change the logits a little");
}

fn tiny_special(text: &str) -> u32 {
    vocabulary().0.iter().position(|t| t == text).unwrap() as u32
}

#[test]
fn a_tiny_llama_loads_the_same_from_gguf_and_safetensors() {
    both_formats_agree(Architecture::Llama);
}

#[test]
fn a_tiny_qwen2_loads_the_same_from_gguf_and_safetensors() {
    both_formats_agree(Architecture::Qwen2);
}

#[test]
fn the_config_comes_from_the_file() {
    let tiny = Tiny::new(Architecture::Qwen2);
    let dir = scratch("config");
    std::fs::write(dir.join("m.gguf"), tiny.gguf(TensorType::F16, TensorType::F16).to_bytes()).unwrap();
    let m = Pretrained::<B>::load(&dir.join("m.gguf"), &Default::default()).unwrap();
    let c = &m.config;
    assert_eq!((c.architecture, c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim), (Architecture::Qwen2, 2, 64, 4, 1, 16));
    assert!(c.attention_bias && !c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(m.tokenizer.eos.text, "<|im_end|>");
}

/// The error for a damaged `file`, as a person reads it.
fn refusal(file: &Path) -> String {
    match Pretrained::<B>::load(file, &Default::default()) {
        Ok(_) => panic!("{} loaded", file.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn damaged_files_are_refused_with_the_file_the_tensor_and_the_fix() {
    let tiny = Tiny::new(Architecture::Llama);
    let dir = scratch("damaged");
    let good = tiny.gguf(TensorType::Q8_0, TensorType::Q4_1).to_bytes();

    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &good[..good.len() - 100]).unwrap();
    let e = refusal(&truncated);
    assert!(e.contains("truncated.gguf") && e.contains("truncated") && e.contains("download it again"), "{e}");

    let header_cut = dir.join("header.gguf");
    std::fs::write(&header_cut, &good[..300]).unwrap();
    let e = refusal(&header_cut);
    assert!(e.contains("header.gguf") && e.contains("truncated"), "{e}");

    let magic = dir.join("magic.gguf");
    std::fs::write(&magic, b"PK\x03\x04 not a model at all").unwrap();
    let e = refusal(&magic);
    assert!(e.contains("magic.gguf") && e.contains("magic") && e.contains("Hugging Face model directory"), "{e}");

    let mut w = tiny.gguf(TensorType::Q8_0, TensorType::Q4_1);
    w.remove_tensor("blk.1.ffn_up.weight");
    let missing = dir.join("missing.gguf");
    std::fs::write(&missing, w.to_bytes()).unwrap();
    let e = refusal(&missing);
    assert!(e.contains("missing.gguf") && e.contains("blk.1.ffn_up.weight") && e.contains("missing"), "{e}");

    let mut w = tiny.gguf(TensorType::Q8_0, TensorType::Q4_1);
    w.retype_tensor("blk.0.ffn_gate.weight", 6); // Q5_0
    let unsupported = dir.join("q5.gguf");
    std::fs::write(&unsupported, w.to_bytes()).unwrap();
    let e = refusal(&unsupported);
    assert!(e.contains("q5.gguf") && e.contains("blk.0.ffn_gate.weight") && e.contains("Q5_0") && e.contains("llama-quantize"), "{e}");

    let mut w = tiny.gguf(TensorType::Q8_0, TensorType::Q4_1);
    w.meta("llama.vocab_size", Value::U64(300));
    let vocab = dir.join("vocab.gguf");
    std::fs::write(&vocab, w.to_bytes()).unwrap();
    let e = refusal(&vocab);
    assert!(e.contains("vocab.gguf") && e.contains("token_embd.weight") && e.contains("vocabulary"), "{e}");

    let hf = dir.join("hf");
    tiny.write_hf(&hf, Dtype::F32);
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = json!(200);
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let e = refusal(&hf);
    assert!(e.contains("embed_tokens") && e.contains("vocabulary"), "{e}");

    let nothing = dir.join("nothing-here");
    let e = refusal(&nothing);
    assert!(e.contains("nothing-here") && e.contains("make model"), "{e}");
}

/// Batched sampling (shared prefix, padded rows, one new token at a time
/// through the KV cache, grouped-query decoding) must draw from exactly the
/// distribution a full forward pass over prompt and reply gives.
fn sampling_matches_a_full_pass(arch: Architecture) {
    use ragen_llm::StopRule;
    let tiny = Tiny::new(arch);
    let dir = scratch(&format!("sampling-{arch:?}"));
    tiny.write_hf(&dir, Dtype::F32);
    let m = Pretrained::<B>::load(&dir, &Default::default()).unwrap();
    let device = Default::default();
    let prompts: Vec<Vec<u32>> = ["the the", "the 12 boxes, then the", "the x"].iter().map(|p| m.tokenizer.encode(p)).collect();
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut rngs: Vec<SeedRng> = (0..3).map(|r| SeedRng::stream(5, r)).collect();
    let out = ragen_policy::sample_batch(&m.model, &refs, &StopRule::never(), 1.0, 12, &mut rngs, &device);
    for (prompt, s) in prompts.iter().zip(&out) {
        assert_eq!(s.tokens.len(), 12);
        let all: Vec<i64> = prompt.iter().chain(&s.tokens).map(|&x| x as i64).collect();
        let n = all.len();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(all, [1, n]), &device);
        let (logits, _) = m.model.forward(ids.clone());
        let logp = burn::tensor::activation::log_softmax(logits, 2).into_data().to_vec::<f32>().unwrap();
        let v = m.config.vocab_size;
        // The learner's path: the output layer at the reply's positions only.
        let at: Vec<i64> = (0..s.tokens.len()).map(|i| (prompt.len() + i - 1) as i64).collect();
        let at = Tensor::<B, 1, Int>::from_data(TensorData::new(at, [s.tokens.len()]), &device);
        let (picked, _) = ragen_policy::PolicyNetwork::logits_at_and_values(&m.model, ids, at);
        let picked = burn::tensor::activation::log_softmax(picked, 1).into_data().to_vec::<f32>().unwrap();
        for (i, (&tok, &lp)) in s.tokens.iter().zip(&s.logprobs).enumerate() {
            let full = logp[(prompt.len() + i - 1) * v + tok as usize];
            assert!((full - lp).abs() < 1e-4, "{arch:?} token {i}: sampled log-prob {lp}, full pass {full}");
            assert!((picked[i * v + tok as usize] - full).abs() < 1e-5, "{arch:?} token {i}: logits at chosen positions");
        }
    }
}

#[test]
fn batched_sampling_of_a_tiny_llama_matches_a_full_pass() {
    sampling_matches_a_full_pass(Architecture::Llama);
}

#[test]
fn batched_sampling_of_a_tiny_qwen2_matches_a_full_pass() {
    sampling_matches_a_full_pass(Architecture::Qwen2);
}

#[test]
fn a_model_too_big_for_this_machine_is_refused_before_its_weights_are_read() {
    // Llama 3.1 405B's shape: about 1.6 TB as f32, more than any machine
    // running these tests has free. The directory holds its config.json
    // alone, so an error about the size (not about missing weights) shows
    // the check ran first.
    let dir = scratch("too-big");
    let config = json!({
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 16384, "intermediate_size": 53248,
        "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": false,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = match Pretrained::<B>::load(&dir, &Default::default()) {
        Ok(_) => panic!("a 405B model loaded"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("405.") && err.contains("billion parameters"), "names the size: {err}");
    assert!(err.contains("GiB of memory is free") && err.contains("pick a smaller model"), "says what to do: {err}");
}
