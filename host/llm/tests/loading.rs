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
use ragen_env_sdk::SeedRng;
use ragen_llm::gguf::{GgufWriter, TensorType, Value};
use ragen_llm::{Architecture, Pretrained};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;
use std::path::{Path, PathBuf};

type B = Flex;

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's map from bytes to printable characters (byte-level BPE's alphabet).
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable.contains(&b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// The vocabulary: 256 byte tokens, three merges, three special tokens.
fn vocabulary() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    let merges = vec!["Ġ t".to_string(), "h e".to_string(), "Ġt he".to_string()];
    tokens.extend(["Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    (tokens, merges)
}

/// One tiny model's shape and random weights, named as Hugging Face names
/// them, each `[out, in]` row-major.
struct Tiny {
    arch: Architecture,
    vocab: usize,
    d: usize,
    f: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    theta: f64,
    tied: bool,
    weights: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Tiny {
    fn new(arch: Architecture) -> Self {
        let (vocab, tied, heads, kv_heads, theta) = match arch {
            Architecture::Llama => (262, true, 4, 2, 10_000.0),
            // The embedding has rows beyond the tokenizer's, as Qwen's do.
            Architecture::Qwen2 => (264, false, 4, 1, 1_000_000.0),
        };
        let mut t = Tiny { arch, vocab, d: 64, f: 96, layers: 2, heads, kv_heads, theta, tied, weights: vec![] };
        let mut rng = SeedRng::new(if tied { 1 } else { 2 });
        let (d, f, k) = (t.d, t.f, t.d / heads);
        let mut add = |name: String, shape: Vec<usize>, scale: f32| {
            let n = shape.iter().product();
            let values = (0..n).map(|_| (rng.unit() as f32 * 2.0 - 1.0) * scale).collect();
            t.weights.push((name, shape, values));
        };
        add("model.embed_tokens.weight".into(), vec![vocab, d], 1.0);
        if !tied {
            add("lm_head.weight".into(), vec![vocab, d], 0.2);
        }
        add("model.norm.weight".into(), vec![d], 1.0);
        for i in 0..2 {
            let p = |n: &str| format!("model.layers.{i}.{n}");
            add(p("input_layernorm.weight"), vec![d], 1.0);
            add(p("post_attention_layernorm.weight"), vec![d], 1.0);
            add(p("self_attn.q_proj.weight"), vec![heads * k, d], 0.3);
            add(p("self_attn.k_proj.weight"), vec![kv_heads * k, d], 0.3);
            add(p("self_attn.v_proj.weight"), vec![kv_heads * k, d], 0.3);
            add(p("self_attn.o_proj.weight"), vec![d, heads * k], 0.2);
            add(p("mlp.gate_proj.weight"), vec![f, d], 0.2);
            add(p("mlp.up_proj.weight"), vec![f, d], 0.2);
            add(p("mlp.down_proj.weight"), vec![d, f], 0.2);
            if arch == Architecture::Qwen2 {
                add(p("self_attn.q_proj.bias"), vec![heads * k], 0.5);
                add(p("self_attn.k_proj.bias"), vec![kv_heads * k], 0.5);
                add(p("self_attn.v_proj.bias"), vec![kv_heads * k], 0.5);
            }
        }
        t
    }

    fn arch_name(&self) -> &'static str {
        match self.arch {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }

    fn pre_tokenizer(&self) -> serde_json::Value {
        match self.arch {
            Architecture::Llama => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}),
            Architecture::Qwen2 => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}),
        }
    }

    /// A Hugging Face directory, weights as f32 or bf16.
    fn write_hf(&self, dir: &Path, dtype: Dtype) {
        std::fs::create_dir_all(dir).unwrap();
        let config = json!({
            "model_type": self.arch_name(), "vocab_size": self.vocab, "hidden_size": self.d, "intermediate_size": self.f,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-5, "rope_theta": self.theta, "max_position_embeddings": 256, "tie_word_embeddings": self.tied,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let bytes: Vec<Vec<u8>> = self
            .weights
            .iter()
            .map(|(_, _, v)| match dtype {
                Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Dtype::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
                other => panic!("{other:?}"),
            })
            .collect();
        let views =
            self.weights.iter().zip(&bytes).map(|((name, shape, _), b)| (name.clone(), TensorView::new(dtype, shape.clone(), b).unwrap()));
        std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
        let (tokens, merges) = vocabulary();
        let specials = tokens.len() - 3;
        let added: Vec<_> = (specials..tokens.len())
            .map(|i| json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
            .collect();
        let vocab: serde_json::Map<String, serde_json::Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
            "pre_tokenizer": self.pre_tokenizer(), "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = json!({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }

    /// A GGUF file as llama.cpp's converter writes it: its tensor names,
    /// q/k rows of Llama permuted, matrices as `matrices`, norms in F32.
    fn gguf(&self, matrices: TensorType, mlp: TensorType) -> GgufWriter {
        let arch = self.arch_name();
        let (tokens, merges) = vocabulary();
        let specials = tokens.len() - 3;
        let types: Vec<Value> = (0..tokens.len()).map(|i| Value::I64(if i >= specials { 3 } else { 1 })).collect();
        let mut w = GgufWriter::new();
        w.meta("general.architecture", Value::Str(arch.into()))
            .meta(&format!("{arch}.block_count"), Value::U64(self.layers as u64))
            .meta(&format!("{arch}.context_length"), Value::U64(256))
            .meta(&format!("{arch}.embedding_length"), Value::U64(self.d as u64))
            .meta(&format!("{arch}.feed_forward_length"), Value::U64(self.f as u64))
            .meta(&format!("{arch}.attention.head_count"), Value::U64(self.heads as u64))
            .meta(&format!("{arch}.attention.head_count_kv"), Value::U64(self.kv_heads as u64))
            .meta(&format!("{arch}.rope.freq_base"), Value::F64(self.theta))
            .meta(&format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F64(1e-5))
            .meta(&format!("{arch}.vocab_size"), Value::U64(self.vocab as u64))
            .meta("tokenizer.ggml.model", Value::Str("gpt2".into()))
            .meta("tokenizer.ggml.pre", Value::Str(if self.arch == Architecture::Llama { "smollm" } else { "qwen2" }.into()))
            .meta("tokenizer.ggml.tokens", Value::Array(tokens.into_iter().map(Value::Str).collect()))
            .meta("tokenizer.ggml.token_type", Value::Array(types))
            .meta("tokenizer.ggml.merges", Value::Array(merges.into_iter().map(Value::Str).collect()))
            .meta("tokenizer.ggml.eos_token_id", Value::U64(specials as u64 + 2))
            .meta("tokenizer.ggml.padding_token_id", Value::U64(specials as u64))
            .meta("tokenizer.chat_template", Value::Str(CHATML.into()));
        for (name, shape, values) in &self.weights {
            let (gguf_name, kind) = gguf_name(name, shape, matrices, mlp);
            let k = self.d / self.heads;
            let values = match () {
                _ if self.arch == Architecture::Llama && name.ends_with("q_proj.weight") => permute(values, self.heads, k),
                _ if self.arch == Architecture::Llama && name.ends_with("k_proj.weight") => permute(values, self.kv_heads, k),
                _ => values.clone(),
            };
            w.tensor(&gguf_name, shape, kind, &values).unwrap();
        }
        w
    }
}

/// llama.cpp's `permute`: within each head, row `j·k/2 + i` goes to `2i + j`.
fn permute(values: &[f32], heads: usize, k: usize) -> Vec<f32> {
    let cols = values.len() / (heads * k);
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for i in 0..k / 2 {
            for j in 0..2 {
                let (from, to) = (h * k + j * (k / 2) + i, h * k + 2 * i + j);
                out[to * cols..(to + 1) * cols].copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// A Hugging Face name's GGUF name and storage type.
fn gguf_name(name: &str, shape: &[usize], matrices: TensorType, mlp: TensorType) -> (String, TensorType) {
    let kind = if shape.len() == 1 {
        TensorType::F32
    } else if name.contains("mlp.") {
        mlp
    } else {
        matrices
    };
    let renamed = match name {
        "model.embed_tokens.weight" => "token_embd.weight".to_string(),
        "lm_head.weight" => "output.weight".to_string(),
        "model.norm.weight" => "output_norm.weight".to_string(),
        _ => {
            let rest = name.strip_prefix("model.layers.").unwrap();
            let (i, part) = rest.split_once('.').unwrap();
            let part = match part {
                "input_layernorm.weight" => "attn_norm.weight",
                "post_attention_layernorm.weight" => "ffn_norm.weight",
                "self_attn.q_proj.weight" => "attn_q.weight",
                "self_attn.k_proj.weight" => "attn_k.weight",
                "self_attn.v_proj.weight" => "attn_v.weight",
                "self_attn.o_proj.weight" => "attn_output.weight",
                "self_attn.q_proj.bias" => "attn_q.bias",
                "self_attn.k_proj.bias" => "attn_k.bias",
                "self_attn.v_proj.bias" => "attn_v.bias",
                "mlp.gate_proj.weight" => "ffn_gate.weight",
                "mlp.up_proj.weight" => "ffn_up.weight",
                "mlp.down_proj.weight" => "ffn_down.weight",
                other => panic!("{other}"),
            };
            format!("blk.{i}.{part}")
        }
    };
    (renamed, kind)
}

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
