//! ragen-llm: pretrained language models as policies.
//!
//! * [`Pretrained::load`] reads a model from its file: a GGUF file
//!   ([`gguf`]: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors,
//!   dequantised at load) or a Hugging Face directory (`config.json`,
//!   `*.safetensors`, `tokenizer.json`, `tokenizer_config.json`). Every
//!   hyper-parameter comes from the file ([`LlmConfig`]).
//! * [`Llm`] is the Llama / Qwen2 decoder in Burn, with a value head; it
//!   implements the learner's `PolicyNetwork` and sampling's `CausalLm`.
//! * [`LlmTokenizer`] is the model's byte-level BPE; [`ChatTemplate`] its
//!   Jinja chat template, rendered as Hugging Face renders it.
//! * [`LlmPolicy`] puts them behind the agent loop's `Policy` seam: the
//!   conversation goes through the chat template, the reply follows the
//!   pre-fill, and sampling stops at the end-of-turn token or `</answer>`.
//! * [`bench_llm`] is what `ragen-host bench --policy --model` measures.
//!
//! # Examples
//!
//! ```no_run
//! use burn::backend::Flex;
//! use ragen_llm::{ChatMessage, Pretrained};
//! use ragen_agent::Role;
//!
//! let model = Pretrained::<Flex>::load("target/models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &Default::default())?;
//! let prompt = model.template.render(&[ChatMessage::new(Role::User, "Say hi.")], true)?;
//! println!("{}", model.complete(&prompt, 16)?);
//! # anyhow::Ok(())
//! ```

pub mod bench;
pub mod chat;
pub mod config;
pub mod gguf;
pub mod load;
pub mod lora;
pub mod model;
pub mod policy;
pub mod tokenizer;

pub use bench::{LlmBenchConfig, LlmBenchReport, bench_llm};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, LlmConfig};
pub use lora::{LoraConfig, Target};
pub use model::Llm;
pub use policy::{ChatTokenizer, LlmPolicy, LlmSampling, StopRule};
pub use tokenizer::LlmTokenizer;

use anyhow::{Context, Result, bail, ensure};
use burn::prelude::*;
use ragen_agent::Tokenizer;
use std::path::{Path, PathBuf};

/// A model, its tokenizer and its chat template, from one file or
/// directory.
pub struct Pretrained<B: Backend> {
    pub model: Llm<B>,
    pub tokenizer: LlmTokenizer,
    pub template: ChatTemplate,
    pub config: LlmConfig,
    /// Where it was read from.
    pub path: PathBuf,
    pub device: B::Device,
}

impl<B: ragen_ops::AttentionBackend + ragen_ops::PointwiseBackend + ragen_ops::QuantizedBackend> Pretrained<B> {
    /// A GGUF file, or a Hugging Face model directory.
    pub fn load(path: &Path, device: &B::Device) -> Result<Self> {
        if path.is_dir() {
            Self::load_hf_dir(path, device)
        } else if path.exists() {
            Self::load_gguf(path, device)
        } else {
            bail!(
                "the model {} does not exist: pass a .gguf file or a Hugging Face model directory (run `make model` for the default one)",
                path.display()
            )
        }
    }

    fn load_gguf(path: &Path, device: &B::Device) -> Result<Self> {
        let gguf = gguf::Gguf::open(path)?;
        let config = LlmConfig::from_gguf(&gguf).with_context(|| format!("{} does not describe a model we can load", path.display()))?;
        check_memory(&config, path)?;
        let tokenizer = LlmTokenizer::from_gguf(&gguf)?;
        let source = gguf.get("tokenizer.chat_template").and_then(gguf::Value::as_str).with_context(|| {
            format!("{} has no chat template (tokenizer.chat_template): use an instruction-tuned model's file", path.display())
        })?;
        let template = template_for(source, &tokenizer)?;
        let model = load::build(&config, &load::GgufWeights { gguf: &gguf, config: &config }, device)
            .with_context(|| format!("cannot load the weights of {}", path.display()))?;
        Self { model, tokenizer, template, config, path: path.to_path_buf(), device: device.clone() }.checked()
    }

    fn load_hf_dir(dir: &Path, device: &B::Device) -> Result<Self> {
        let config_file = dir.join("config.json");
        let text = std::fs::read_to_string(&config_file)
            .with_context(|| format!("cannot read {}: a Hugging Face model directory needs its config.json", config_file.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", config_file.display()))?;
        let config =
            LlmConfig::from_hf_json(&json).with_context(|| format!("{} does not describe a model we can load", config_file.display()))?;
        check_memory(&config, dir)?;
        let tokenizer = LlmTokenizer::from_hf_dir(dir)?;
        let template = template_for(&hf_chat_template(dir)?, &tokenizer)?;
        let weights = load::SafetensorsWeights::open(dir)?;
        let model = load::build(&config, &weights, device).with_context(|| format!("cannot load the weights in {}", dir.display()))?;
        Self { model, tokenizer, template, config, path: dir.to_path_buf(), device: device.clone() }.checked()
    }

    /// The tokenizer must not name tokens the embedding has no row for.
    fn checked(self) -> Result<Self> {
        ensure!(
            self.tokenizer.vocab_size() <= self.config.vocab_size,
            "the tokenizer of {} has {} tokens but the embedding has {} rows: the tokenizer belongs to another model",
            self.path.display(),
            self.tokenizer.vocab_size(),
            self.config.vocab_size
        );
        Ok(self)
    }

    /// Its tokenizer and chat template, for prompts that leave room for
    /// replies of `max_new_tokens`.
    pub fn chat_tokenizer(&self, max_new_tokens: usize) -> ChatTokenizer {
        ChatTokenizer {
            tokenizer: self.tokenizer.clone(),
            template: self.template.clone(),
            max_prompt: self.model.max_seq_len_for_prompts(max_new_tokens),
        }
    }

    /// Greedy continuation of `text` (which may hold special tokens), up to
    /// `max_new_tokens` or the end-of-turn token.
    pub fn complete(&self, text: &str, max_new_tokens: usize) -> Result<String> {
        let ids = self.tokenizer.encode(text);
        let out = policy::greedy(&self.model, &ids, self.tokenizer.eos.id, max_new_tokens, &self.device);
        Ok(self.tokenizer.decode(&out))
    }
}

/// The template, with the tokenizer's BOS and EOS in scope.
fn template_for(source: &str, tokenizer: &LlmTokenizer) -> Result<ChatTemplate> {
    let bos = tokenizer.bos.as_ref().map_or("", |s| s.text.as_str());
    ChatTemplate::new(source, bos, &tokenizer.eos.text)
}

/// `chat_template.jinja`, or `chat_template` in `tokenizer_config.json`
/// (a string, or a list of named templates of which "default" is used).
fn hf_chat_template(dir: &Path) -> Result<String> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja).with_context(|| format!("cannot read {}", jinja.display()));
    }
    let file = dir.join("tokenizer_config.json");
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))?;
    match &json["chat_template"] {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string)
            .with_context(|| format!("{} lists chat templates but none named \"default\"", file.display())),
        _ => bail!("{} has no chat_template (and there is no chat_template.jinja): use an instruction-tuned model", dir.display()),
    }
}

/// Refuse a model whose `f32` weights would not fit in the memory this
/// machine has free, before reading it.
fn check_memory(config: &LlmConfig, path: &Path) -> Result<()> {
    let need = config.parameter_count() as u64 * 4;
    let Some(free) = available_memory() else { return Ok(()) };
    ensure!(
        need < free,
        "{} has {:.2} billion parameters, {:.1} GiB as f32, but only {:.1} GiB of memory is free: pick a smaller model",
        path.display(),
        config.parameter_count() as f64 / 1e9,
        need as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    );
    Ok(())
}

/// `MemAvailable` from `/proc/meminfo`, where there is one.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The SHA-256 of a file, in hex (to pin a model a run was made with).
pub fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
