//! `ragen-host chat`: load a pretrained model and print its reply to one
//! prompt, so a user can check that a model file loads and talks before
//! training or evaluating with it.

use crate::args::Generation;
use crate::output::errln;
use anyhow::Result;
use ragen_agent::{Role, Tokenizer};
use ragen_llm::{ChatMessage, Pretrained, StopRule};
use ragen_policy::Sampling;
use ragen_rng::SeedRng;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Load a pretrained model (a GGUF file or a Hugging Face directory)
/// and print its reply to one prompt, rendered with the model's chat
/// template: a check that a model loads and talks. Example:
/// `ragen-host chat --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf "What is 2+2?"`.
#[derive(clap::Args)]
pub struct ChatCommand {
    /// A GGUF file or a Hugging Face model directory.
    #[arg(long, value_name = "PATH")]
    model: PathBuf,
    /// The user's message.
    prompt: String,
    /// A system message before it.
    #[arg(long)]
    system: Option<String>,
    /// Feed the prompt as it is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Seed of the sampling (with --temperature above 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    generation: Generation,
}

impl ChatCommand {
    pub fn execute(self) -> Result<ExitCode> {
        let g = self.generation.sampling(None)?;
        let backend = self.generation.backend;
        let Self { model, prompt, system, raw, seed, .. } = self;
        let opts = Options { model, prompt, system, raw, max_new_tokens: g.max_new_tokens, sampling: g.sampling, seed };
        crate::backend::with_backend!(inference backend, B, device => chat::<B>(opts, device)?);
        Ok(ExitCode::SUCCESS)
    }
}

pub struct Options {
    pub model: PathBuf,
    pub prompt: String,
    pub system: Option<String>,
    /// Feed the prompt as it is, without the chat template.
    pub raw: bool,
    pub max_new_tokens: usize,
    /// 0 decodes greedily.
    pub sampling: Sampling,
    pub seed: u64,
}

/// Load the model, describe it on stderr, print the reply on stdout.
pub fn chat<B: ragen_ops::AttentionBackend + ragen_ops::PointwiseBackend + ragen_ops::QuantizedBackend>(
    opts: Options,
    device: B::Device,
) -> Result<()> {
    let started = Instant::now();
    let m = crate::term::with_spinner(&format!("loading {}", opts.model.display()), || Pretrained::<B>::load(&opts.model, &device))?;
    errln!("{} (loaded in {:.1} s)", describe(&m), started.elapsed().as_secs_f64());
    let text = if opts.raw {
        opts.prompt.clone()
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &opts.system {
            messages.push(ChatMessage::new(Role::System, system.as_str()));
        }
        messages.push(ChatMessage::new(Role::User, opts.prompt.as_str()));
        m.template.render(&messages, true)?
    };
    let prompt = m.tokenizer.encode(&text);
    let started = Instant::now();
    let reply = if opts.sampling.temperature <= 0.0 {
        ragen_llm::policy::greedy(&m.model, &prompt, m.tokenizer.eos.id, opts.max_new_tokens, &device)
    } else {
        let rule = StopRule::new(&m.tokenizer, "");
        let mut rng = SeedRng::new(opts.seed);
        ragen_policy::sample(&m.model, &prompt, &rule, opts.sampling, opts.max_new_tokens, &mut rng, &device).tokens
    };
    let seconds = started.elapsed().as_secs_f64();
    let shown = reply.strip_suffix(&[m.tokenizer.eos.id]).unwrap_or(&reply);
    crate::output::print(&format!("{}\n", crate::term::escape(&m.tokenizer.decode(shown))))?;
    errln!(
        "{} prompt tokens, {} new tokens in {seconds:.1} s ({:.1} tokens/s)",
        prompt.len(),
        reply.len(),
        reply.len() as f64 / seconds.max(1e-9)
    );
    Ok(())
}

/// One line about a loaded model: its file, family and shape.
pub fn describe<B: ragen_ops::AttentionBackend + ragen_ops::PointwiseBackend + ragen_ops::QuantizedBackend>(m: &Pretrained<B>) -> String {
    let c = &m.config;
    format!(
        "{}: {:?}, {} layers, width {}, {} heads ({} key/value), vocabulary {}, {:.1} M parameters, context {}",
        m.path.display(),
        c.architecture,
        c.n_layers,
        c.hidden_size,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        c.parameter_count() as f64 / 1e6,
        c.max_position_embeddings
    )
}
