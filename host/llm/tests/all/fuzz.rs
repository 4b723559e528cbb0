//! Fuzzing the model files: a model is bytes someone else wrote, so every
//! damaged GGUF file or Hugging Face directory must load or be refused
//! with an error, never panic and never allocate by a number it read.
//! proptest drives it (cargo-fuzz needs a nightly toolchain; proptest runs
//! on stable and shrinks a failure to a small case). Each property starts
//! from a valid tiny model and damages it: bytes overwritten in the
//! header, little-endian integers planted where lengths and counts live,
//! the file cut short; `config.json` keys set to zeros, negatives, huge
//! numbers and wrong types; `tokenizer.json` with pieces cut out. Chat
//! templates are assembled from pieces of Jinja, matched or not.
//!
//! `make test` runs a short pass (the cases below, plus every failure
//! proptest saved under `proptest-regressions/`, re-run first); `make
//! fuzz` runs longer passes (`PROPTEST_CASES`). A crash found is fixed and
//! its case stays as a regression test.

use burn::backend::Flex;
use proptest::prelude::*;
use proptest::test_runner::Config;
use ragen_agent::Tokenizer;
use ragen_llm::gguf::TensorType;
use ragen_llm::{Architecture, ChatMessage, Pretrained};
use ragen_test_fixtures::tiny_llm::Tiny;
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

type B = Flex;

/// Cases per property: `PROPTEST_CASES` when set (`make fuzz`), else a
/// short pass for `make test`.
fn config(short: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(short);
    Config {
        cases,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ragen-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A valid tiny GGUF (quantized matrices, so the quantized readers run).
fn gguf_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| Tiny::new(Architecture::Llama).gguf(TensorType::Q8_0, TensorType::Q4_1).to_bytes())
}

/// Load what is at `path`; when it loads, use it a little (tokenize,
/// render the chat template), as every command does first.
fn load(path: &Path) {
    if let Ok(model) = Pretrained::<B>::load(path, &Default::default()) {
        let ids = model.tokenizer.encode("<|im_start|>user\nhi<|im_end|>");
        let _ = model.tokenizer.decode(&ids);
        let _ = model.template.render(&[ChatMessage::new(ragen_agent::Role::User, "hi")], true);
    }
}

/// One damage to a byte string.
#[derive(Clone, Debug)]
enum Damage {
    /// Overwrite the byte at this share of the header (or the file).
    Byte { at: f64, value: u8, anywhere: bool },
    /// Plant a little-endian integer where a length or count may live.
    Integer { at: f64, value: u64 },
    /// Cut the file to this share of its length.
    Cut { at: f64 },
}

fn damage() -> impl Strategy<Value = Damage> {
    let number = prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(u32::MAX as u64), Just(1 << 40), any::<u64>(), 0..300u64];
    prop_oneof![
        6 => (0.0..1.0f64, any::<u8>(), prop::bool::weighted(0.2)).prop_map(|(at, value, anywhere)| Damage::Byte { at, value, anywhere }),
        4 => (0.0..1.0f64, number).prop_map(|(at, value)| Damage::Integer { at, value }),
        1 => (0.0..1.0f64).prop_map(|at| Damage::Cut { at }),
    ]
}

/// `bytes` with `damages` applied; `header` is how many leading bytes hold
/// the structure (metadata and tensor descriptions), where damage matters.
fn damaged(bytes: &[u8], header: usize, damages: &[Damage]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let pick = |at: f64, n: usize| ((at * n as f64) as usize).min(n.saturating_sub(1));
    for d in damages {
        match *d {
            Damage::Byte { at, value, anywhere } => {
                let n = if anywhere { out.len() } else { header.min(out.len()) };
                if n > 0 {
                    let i = pick(at, n);
                    out[i] = value;
                }
            }
            Damage::Integer { at, value } => {
                let n = header.min(out.len()).saturating_sub(8);
                if n > 0 {
                    let i = pick(at, n);
                    out[i..i + 8].copy_from_slice(&value.to_le_bytes());
                }
            }
            Damage::Cut { at } => out.truncate(pick(at, out.len() + 1)),
        }
    }
    out
}

/// Where a GGUF's tensor data starts: everything before is structure
/// (metadata and the tensor table), where damage matters most.
fn gguf_header_len(bytes: &[u8]) -> usize {
    static LEN: OnceLock<usize> = OnceLock::new();
    *LEN.get_or_init(|| {
        let file = scratch("gguf-valid").join("model.gguf");
        std::fs::write(&file, bytes).unwrap();
        ragen_llm::gguf::Gguf::open(&file).expect("the valid tiny GGUF parses").data_start()
    })
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn a_damaged_gguf_file_is_refused_or_loads_never_panics(damages in prop::collection::vec(damage(), 1..6)) {
        let bytes = gguf_bytes();
        let file = scratch("gguf").join("model.gguf");
        std::fs::write(&file, damaged(bytes, gguf_header_len(bytes), &damages)).unwrap();
        load(&file);
    }
}

/// A value for a `config.json` key: zeros, negatives, huge numbers,
/// fractions, wrong types.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(3)),
        Just(json!(1u64 << 40)),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!(f64::MIN_POSITIVE)),
        Just(json!("64")),
        Just(json!(null)),
        Just(json!([1, 2])),
        Just(json!(true)),
    ]
}

const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "architectures",
    "model_type",
    "torch_dtype",
];

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn a_damaged_hugging_face_config_is_refused_or_loads_never_panics(
        edits in prop::collection::vec((prop::sample::select(CONFIG_KEYS), json_value()), 1..4),
        cut in prop::option::weighted(0.3, (0.0..1.0f64, 1..200usize)),
    ) {
        let dir = scratch("hf");
        let _ = std::fs::remove_dir_all(dir.join("model"));
        let model = dir.join("model");
        Tiny::new(Architecture::Qwen2).write_hf(&model, Dtype::F32);
        let path = model.join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for (key, value) in &edits {
            config[*key] = value.clone();
        }
        std::fs::write(&path, config.to_string()).unwrap();
        // Sometimes tokenizer.json loses a piece as well.
        if let Some((at, len)) = cut {
            let tokenizer = model.join("tokenizer.json");
            let mut text = std::fs::read(&tokenizer).unwrap();
            let start = ((at * text.len() as f64) as usize).min(text.len());
            let end = (start + len).min(text.len());
            text.drain(start..end);
            std::fs::write(&tokenizer, text).unwrap();
        }
        load(&model);
    }
}

/// A chat template assembled from Jinja: leaves are text and the
/// expressions chat templates use (and some that fail), nodes are loops,
/// conditions and macros around them; mostly well-nested, sometimes with a
/// stray tag, so both rendering and refusing are exercised.
fn jinja() -> impl Strategy<Value = String> {
    let leaves = [
        "text ",
        "\n",
        "{{ messages | length }}",
        "{{ m['content'] }}",
        "{{ m.role | upper }}",
        "{{ bos_token ~ eos_token }}",
        "{{ messages[0]['content'].strip().split(' ') }}",
        "{{ 'ab' * 3 }}",
        "{{ raise_exception('no') }}",
        "{{ 1 / 0 }}",
        "{{ m | tojson }}",
        "{{ loop.index }}",
        "{% set ns = namespace(a='x') %}{% set ns.a = ns.a ~ ns.a %}{{ ns.a }}",
        "{{ f(1) }}",
        "{% endfor %}",
        "{{",
    ];
    let leaf = prop::sample::select(leaves.to_vec()).prop_map(str::to_string);
    leaf.prop_recursive(4, 32, 4, |inner| {
        let body = prop::collection::vec(inner, 1..4).prop_map(|b| b.concat());
        prop_oneof![
            body.clone().prop_map(|b| format!("{{% for m in messages %}}{b}{{% endfor %}}")),
            body.clone().prop_map(|b| format!("{{% for i in range(1000) %}}{b}{{% endfor %}}")),
            body.clone().prop_map(|b| format!("{{% if add_generation_prompt %}}{b}{{% else %}}x{{% endif %}}")),
            body.clone().prop_map(|b| format!("{{% macro f(n) %}}{b}{{{{ f(n) }}}}{{% endmacro %}}")),
            body,
        ]
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn any_chat_template_compiles_and_renders_or_is_refused_never_panics(source in jinja()) {
        if let Ok(template) = ragen_llm::chat::ChatTemplate::new(&source, "<s>", "</s>") {
            let messages = [ChatMessage::new(ragen_agent::Role::System, "be brief"), ChatMessage::new(ragen_agent::Role::User, "hi there")];
            if let Ok(text) = template.render(&messages, true) {
                prop_assert!(text.len() <= ragen_llm::chat::output_limit(&messages));
            }
        }
    }
}
