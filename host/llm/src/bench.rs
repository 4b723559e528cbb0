//! The measurements behind `ragen-host bench --policy --model`: a
//! pretrained model's speed and memory on one machine (prefill, batched
//! KV-cache sampling and training forward+backward, in tokens per second,
//! and the process's peak resident memory).
//! `scripts/reference/llm_bench.py` measures PyTorch `transformers` on the
//! same shapes, for the ratio.
//!
//! Public API because a shipped command is built on it: the CLI makes the
//! prompts from a plugin through the model's chat template, calls
//! [`bench_llm`] and prints its [`LlmBenchReport`] (as text, or as JSON
//! with `--json`).

use crate::model::Llm;
use crate::policy::StopRule;
use burn::module::AutodiffModule;
use burn::prelude::*;
use ragen_policy::{Sampling, sample_batch};
use ragen_rng::SeedRng;
use serde::Serialize;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct LlmBenchConfig {
    /// One prompt per row of the prefill and sampling batches.
    pub prompts: Vec<Vec<u32>>,
    /// New tokens per sampled reply (no stop token ends one early).
    pub new_tokens: usize,
    /// Training passes: `train_rows` sequences of `train_len` tokens.
    pub train_rows: usize,
    pub train_len: usize,
    /// Each measurement repeats for at least this long.
    pub min_time: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct LlmBenchReport {
    pub batch: usize,
    pub prompt_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub new_tokens: usize,
    /// New tokens per second, all rows together, KV cache on, the
    /// prompts' prefill included.
    pub sample_tokens_per_s: f64,
    /// New tokens per second once the prompts are in the cache: the time
    /// of a call for `new_tokens` less that of a call for one (the prefill
    /// and first draw); what `llama-batched-bench` calls S_TG.
    pub generation_tokens_per_s: f64,
    /// Bytes of quantized weights decoding reads (`None`: it reads `f32`).
    pub quantized_weight_bytes: Option<usize>,
    pub train_rows: usize,
    pub train_len: usize,
    /// What trains: `full` (every weight), `lora-f32-base` or
    /// `lora-quantized-base` (QLoRA: the frozen base kept only quantized).
    pub trains: &'static str,
    pub train_tokens_per_s: f64,
    /// Peak resident memory of the process (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
}

/// Repeat `f` (which returns the tokens it handled) for `min_time`, after
/// one warm-up run.
fn rate(min_time: Duration, mut f: impl FnMut() -> usize) -> f64 {
    f();
    let (start, mut tokens, mut runs) = (Instant::now(), 0usize, 0);
    while runs < 2 || start.elapsed() < min_time {
        tokens += f();
        runs += 1;
    }
    tokens as f64 / start.elapsed().as_secs_f64()
}

/// Measure `model` (an autodiff model, for the backward pass; prefill and
/// sampling run on its inner backend, as inference does).
pub fn bench_llm<B: ragen_ops::TrainBackend>(model: &Llm<B>, config: &LlmBenchConfig, device: &B::Device) -> LlmBenchReport {
    let inference = model.clone().valid();
    let inner_device = device.clone();
    let b = config.prompts.len();
    assert!(b > 0, "at least one prompt");
    let longest = config.prompts.iter().map(Vec::len).max().unwrap_or(0);
    // Prefill as sampling runs it: every prompt padded on the right to the
    // longest, one pass, logits at the last position only.
    let ids: Vec<i64> = config.prompts.iter().flat_map(|p| p.iter().map(|&t| t as i64).chain(std::iter::repeat(0)).take(longest)).collect();
    // On a thread of the compute pool, as sampling runs it.
    let prefill = rate(config.min_time, || {
        let tokens = Tensor::<B::InnerBackend, 2, Int>::from_data(TensorData::new(ids.clone(), [b, longest]), &inner_device);
        let mut cache = ragen_policy::KvCache::new(inference.n_layers());
        rayon::scope(|_| inference.last_logits_cached(tokens, &mut cache).into_data());
        b * longest
    });
    let never = StopRule::never();
    let mut stream = 0;
    let mut sample_for = |new_tokens: usize| {
        let prompts: Vec<&[u32]> = config.prompts.iter().map(Vec::as_slice).collect();
        let mut rngs: Vec<SeedRng> = (0..b)
            .map(|_| {
                stream += 1;
                SeedRng::stream(7, stream)
            })
            .collect();
        let out = sample_batch(&inference, &prompts, &never, Sampling::from(1.0), new_tokens, &mut rngs, &inner_device);
        out.iter().map(|s| s.tokens.len()).sum::<usize>()
    };
    let sample = rate(config.min_time, || sample_for(config.new_tokens));
    // A call for one token is the prefill and the first draw: the rest of a
    // full call's time is generation.
    let first = rate(config.min_time, || sample_for(1));
    let per_call = (b * config.new_tokens) as f64 / sample - b as f64 / first;
    let generation = (b * (config.new_tokens - 1)) as f64 / per_call;
    let vocab = model.vocab_size() as u64;
    let mut rng = SeedRng::new(3);
    let train_ids: Vec<i64> = (0..config.train_rows * config.train_len).map(|_| (rng.next_u64() % vocab) as i64).collect();
    let (r, l) = (config.train_rows, config.train_len);
    let train = rate(config.min_time, || ragen_policy::next_token_pass(model, &train_ids, [r, l], device));
    LlmBenchReport {
        batch: b,
        prompt_tokens: longest,
        prefill_tokens_per_s: prefill,
        new_tokens: config.new_tokens,
        sample_tokens_per_s: sample,
        generation_tokens_per_s: generation,
        quantized_weight_bytes: model.quantized_bytes(),
        train_rows: config.train_rows,
        train_len: config.train_len,
        trains: match (model.has_adapters(), model.base_is_quantized_only()) {
            (false, _) => "full",
            (true, false) => "lora-f32-base",
            (true, true) => "lora-quantized-base",
        },
        train_tokens_per_s: train,
        peak_rss_mib: peak_rss_mib().unwrap_or(f64::NAN),
    }
}

/// `VmHWM` from `/proc/self/status`, in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

impl LlmBenchReport {
    pub fn to_text(&self) -> String {
        format!(
            "pretrained model: batch {}, prompts of {} tokens, {} new tokens each, training {} x {} tokens\n\
             weights read when decoding    {}\n\
             prefill                       {:>10.0} tokens/s\n\
             sample, KV cache, batched     {:>10.0} tokens/s (prefill included)\n\
             generation                    {:>10.0} tokens/s (prefill taken out)\n\
             train (forward + backward)    {:>10.0} tokens/s ({})\n\
             peak resident memory          {:>10.0} MiB\n",
            self.batch,
            self.prompt_tokens,
            self.new_tokens,
            self.train_rows,
            self.train_len,
            match self.quantized_weight_bytes {
                Some(bytes) => format!("quantized, {:.0} MiB", bytes as f64 / (1 << 20) as f64),
                None => "f32".to_string(),
            },
            self.prefill_tokens_per_s,
            self.sample_tokens_per_s,
            self.generation_tokens_per_s,
            self.train_tokens_per_s,
            match self.trains {
                "full" => "every weight",
                "lora-f32-base" => "LoRA on the f32 base",
                _ => "LoRA on the quantized base",
            },
            self.peak_rss_mib,
        )
    }
}
