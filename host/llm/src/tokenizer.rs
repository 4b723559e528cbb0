//! The model's own tokenizer: byte-level BPE from a Hugging Face
//! `tokenizer.json`, or rebuilt from a GGUF file's `tokenizer.ggml.*`
//! metadata, with its special tokens.
//!
//! A GGUF file keeps the vocabulary, the merges and each token's type, but
//! not the pre-tokenizer (how text is split before BPE runs); it names it
//! in `tokenizer.ggml.pre`, as llama.cpp does. The splits of the families we
//! load are written out below, as in the models' own `tokenizer.json`.

use crate::gguf::{Gguf, Value};
use anyhow::{Context, Result, bail};
use ragen_agent::Tokenizer as _;
use serde_json::{Value as Json, json};
use std::path::Path;

/// A token and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Special {
    pub id: u32,
    pub text: String,
}

/// A model's tokenizer.
#[derive(Clone)]
pub struct LlmTokenizer {
    inner: tokenizers::Tokenizer,
    pub bos: Option<Special>,
    /// The end of a reply (`<|im_end|>` for ChatML models).
    pub eos: Special,
    pub pad: Option<Special>,
}

impl std::fmt::Debug for LlmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmTokenizer").field("vocab", &self.vocab_size()).field("eos", &self.eos).finish()
    }
}

/// GPT-2's split, as the `ByteLevel` pre-tokenizer applies it.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2's split: single digits, letters with one leading non-letter.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split: digits in runs of up to three.
const LLAMA3_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn split(pattern: &str) -> Json {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false})
}

fn byte_level(use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// The pre-tokenizer a GGUF's `tokenizer.ggml.pre` names, and whether BPE
/// may take a whole word from the vocabulary before merging (`ignore_merges`,
/// Llama 3's setting).
fn pre_tokenizer(pre: &str) -> Result<(Json, bool)> {
    Ok(match pre {
        "smollm" | "starcoder" | "refact" => {
            (json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}), false)
        }
        "qwen2" | "deepseek-r1-qwen" => (json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}), false),
        "llama3" | "llama-bpe" | "llama-v3" | "smaug-bpe" => {
            (json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}), true)
        }
        "default" | "gpt2" | "gpt-2" => (json!({"type": "Sequence", "pretokenizers": [split(GPT2_SPLIT), byte_level(false)]}), false),
        other => bail!(
            "the GGUF's tokenizer.ggml.pre is {other:?}, a pre-tokenizer we do not know (smollm, qwen2, llama-bpe and gpt2 are known): \
             use the model's Hugging Face directory, whose tokenizer.json says how it splits text"
        ),
    })
}

/// A `tokenizers` tokenizer from the text of a `tokenizer.json`. The text
/// comes from a file someone else wrote, and the `tokenizers` crate panics
/// on some damaged files instead of returning an error (its decoder
/// deserialisation unwraps), so the JSON is checked first and a panic
/// inside the crate is turned into an error.
fn build_tokenizer(text: &str) -> Result<tokenizers::Tokenizer, String> {
    serde_json::from_str::<Json>(text).map_err(|e| format!("not valid JSON: {e}"))?;
    match std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>()) {
        Ok(parsed) => parsed.map_err(|e| e.to_string()),
        Err(_) => Err("the tokenizers crate could not read it (it panicked): the file is damaged".into()),
    }
}

impl LlmTokenizer {
    /// From a Hugging Face directory: `tokenizer.json`, with the special
    /// tokens named in `tokenizer_config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let file = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!("cannot read the tokenizer {}: the model directory needs the model's tokenizer.json", file.display())
        })?;
        let inner = build_tokenizer(&text).map_err(|e| {
            anyhow::anyhow!("cannot load the tokenizer {} ({e}): the model directory needs the model's tokenizer.json", file.display())
        })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let named = |key: &str| -> Option<String> {
            match &config[key] {
                Json::String(s) => Some(s.clone()),
                Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
                _ => None,
            }
        };
        let special = |text: Option<String>| text.and_then(|t| inner.token_to_id(&t).map(|id| Special { id, text: t }));
        let eos = special(named("eos_token")).context("tokenizer_config.json names no eos_token that tokenizer.json knows")?;
        Ok(Self { bos: special(named("bos_token")), pad: special(named("pad_token")), eos, inner })
    }

    /// From a GGUF file's `tokenizer.ggml.*` metadata (model `gpt2`:
    /// byte-level BPE).
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let get = |key: &str| gguf.get(key).with_context(|| format!("{} has no {key}: it carries no tokenizer", gguf.path.display()));
        let model = get("tokenizer.ggml.model")?.as_str().unwrap_or_default();
        if model != "gpt2" {
            bail!("the GGUF's tokenizer is {model:?}; byte-level BPE (\"gpt2\", as Llama 3, SmolLM and Qwen2 use) is supported");
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            get(key)?
                .as_array()
                .with_context(|| format!("{key} is not a list"))?
                .iter()
                .map(|v| v.as_str().map(str::to_string).with_context(|| format!("{key} holds a non-string")))
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = gguf
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let pre = gguf.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
        let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre)?;
        let vocab: serde_json::Map<String, Json> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
        // Control (3) and user-defined (4) tokens are matched whole, before BPE.
        let added: Vec<Json> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == 3 || **t == 4)
            .map(|(i, &t)| {
                json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": t == 3})
            })
            .collect();
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges
            }
        });
        let inner = build_tokenizer(&spec.to_string())
            .map_err(|e| anyhow::anyhow!("the tokenizer in {} cannot be rebuilt: {e}", gguf.path.display()))?;
        let special = |key: &str| -> Option<Special> {
            let id = gguf.get(key).and_then(Value::as_u64)? as u32;
            Some(Special { id, text: tokens.get(id as usize)?.clone() })
        };
        let eos =
            special("tokenizer.ggml.eos_token_id").context("the GGUF names no end-of-sequence token (tokenizer.ggml.eos_token_id)")?;
        Ok(Self { bos: special("tokenizer.ggml.bos_token_id"), pad: special("tokenizer.ggml.padding_token_id"), eos, inner })
    }

    /// Tokens in the vocabulary, special ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Each token's bytes as text (replacement characters where a token is
    /// part of a multi-byte character), for stop-sequence checks.
    pub fn token_texts(&self) -> Vec<String> {
        (0..self.vocab_size() as u32).map(|id| self.decode(&[id])).collect()
    }
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

impl ragen_agent::Tokenizer for LlmTokenizer {
    /// Special tokens in the text (`<|im_start|>`) become their ids.
    fn encode(&self, text: &str) -> Vec<u32> {
        self.inner.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }
}
