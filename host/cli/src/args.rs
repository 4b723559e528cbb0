//! Arguments several commands share: a plugin's settings (`--set`), how a
//! pretrained model writes its replies (`chat` and `eval`), the worker
//! threads' default and registry references (`push` and `pull`).

use anyhow::{Result, bail};
use clap::Args;
use ragen_oci::PluginRef;

/// Settings passed to the plugin's `create`.
#[derive(Args, Clone)]
pub struct Settings {
    /// A config key for the env (repeatable), e.g. --set dim_x=8; `inspect`
    /// lists the keys a plugin accepts.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
}

impl Settings {
    /// Parse `KEY=VALUE` pairs; the value may contain `=`.
    pub fn parse(&self) -> Result<Vec<(String, String)>> {
        self.settings
            .iter()
            .map(|s| match s.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
                _ => bail!("--set `{s}`: expected KEY=VALUE, e.g. --set dim_x=8"),
            })
            .collect()
    }
}

/// How a pretrained model writes its replies.
#[derive(Args, Clone)]
pub struct Generation {
    /// The backend a pretrained model runs on: `flex` (CPU), or `wgpu`/
    /// `cuda`/`libtorch` when built with those cargo features.
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: crate::backend::BackendChoice,
    /// Sampling temperature [default: 0.5, the reference's evaluation
    /// value; with `eval --config`, its `[sampling] val_temperature`; with
    /// `eval --checkpoint`, the run's].
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Draw among the most likely tokens whose probability adds up to this.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Draw among this many most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// The longest reply, in tokens [default: 400, the reference's; with
    /// `eval --config`, its `[sampling] max_new_tokens`].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Replies sampled together [default: 16; with `eval --config`, its
    /// `[sampling] batch`].
    #[arg(long)]
    pub batch: Option<usize>,
}

impl Generation {
    /// The sampling the flags give, with a training config's `[sampling]`
    /// (when one is given) in place of the built-in defaults: an eval under
    /// a preset samples as that preset's validation does.
    pub fn sampling(&self, config: Option<&ragen_learner::SamplingSection>) -> Result<ragen_llm::LlmSampling> {
        let temperature = self.temperature.unwrap_or(config.map_or(0.5, |c| c.val_temperature as f32));
        let max_new_tokens = self.max_new_tokens.unwrap_or(config.map_or(400, |c| c.max_new_tokens));
        let batch = self.batch.unwrap_or(config.map_or(16, |c| c.batch));
        let temperature = valid_temperature(temperature)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p {}: use a number in (0, 1]", self.top_p);
        }
        if max_new_tokens == 0 || batch == 0 {
            bail!("max_new_tokens and batch must be at least 1 (--max-new-tokens, --batch or the config's [sampling])");
        }
        let sampling = ragen_policy::Sampling { temperature, top_k: self.top_k, top_p: self.top_p };
        Ok(ragen_llm::LlmSampling { sampling, max_new_tokens, batch })
    }

    /// The temperature a trained checkpoint samples at: --temperature when
    /// given (`None`: the run's validation temperature). Its policy draws
    /// from the whole distribution, so --top-p and --top-k are refused
    /// rather than silently ignored.
    pub fn checkpoint_temperature(&self) -> Result<Option<f32>> {
        if self.top_p != 1.0 || self.top_k != 0 {
            bail!("--top-p and --top-k apply to --model; a trained --checkpoint samples at --temperature only");
        }
        self.temperature.map(valid_temperature).transpose()
    }
}

/// `temperature` when it is one a sampler can use: 0 (greedy) or positive.
fn valid_temperature(temperature: f32) -> Result<f32> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        bail!("temperature {temperature}: use 0 (greedy) or a positive number");
    }
    Ok(temperature)
}

/// `--threads`, or every core when it is not given.
pub fn default_threads(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1)
}

/// A registry reference as `push` and `pull` take it.
pub fn parse_plugin_ref(s: &str) -> Result<PluginRef, String> {
    PluginRef::parse(s).map_err(|e| format!("{e:#}"))
}
