//! `ragen-host train`: StarPO-S (or StarPO, GRPO) on a plugin, with a live
//! progress bar, metrics.jsonl, config.toml and checkpoints in the run
//! directory.

use crate::args::Settings;
use crate::oci::PluginSource;
use crate::output::errln;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use ragen_learner::{Algo, PluginRecord, StepMetrics, TrainConfig, read_metrics, train};
use ragen_runtime::{EnvProvider, LocalPlugin, Plugin};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Train a policy on a plugin with StarPO-S (default), StarPO (adds a KL
/// term to the frozen initial policy) or GRPO: a transformer from
/// scratch, or with `--model` a pretrained LLM (LoRA when `[lora]` has
/// a rank; see examples/configs/smollm2-*.toml). The run
/// directory gets config.toml (the resolved config), metrics.jsonl (one
/// line per step: success, reward, reward std before/after the variance
/// filter, entropy, gradient norm, clip fraction, approx KL, KL to the
/// reference, reply length, valid actions, timings, validation success
/// every test_freq steps), dashboard.png and a checkpoint every save_freq
/// steps and on Ctrl-C or SIGTERM. `--resume DIR` continues a run exactly.
/// Example: `ragen-host train --env target/plugins/bandit.wasm --steps 20
/// --out runs/bandit`; with an LLM: `ragen-host train --env
/// target/plugins/bandit.wasm --config examples/configs/smollm2-bandit.toml
/// --out runs/smollm2-bandit`.
#[derive(clap::Args)]
pub struct TrainCommand {
    /// The environment: a plugin's .wasm file,
    /// oci://registry/namespace/name:tag (or @sha256:…; the run's
    /// config.toml records the digest), or an OpenEnv server's
    /// ws://host:port (several joined by commas share the episodes; the
    /// run records what they serve; docs/remote.md). With --resume it
    /// defaults to the run's own, a registry's plugin pinned by its digest.
    #[arg(long, required_unless_present = "resume")]
    env: Option<PluginSource>,
    /// A TOML file: algo, seed, steps, test_freq, save_freq, val_episodes,
    /// and [rollout], [prompt], [env], [model], [sampling], [ppo] sections.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Training steps (overrides the config).
    #[arg(long)]
    steps: Option<u64>,
    #[arg(long)]
    seed: Option<u64>,
    /// The run directory.
    #[arg(long, default_value = "runs/latest")]
    out: PathBuf,
    /// The tensor backend: `flex` (CPU, always built), `wgpu`, `cuda` or
    /// `libtorch` (cargo features of ragen-host).
    #[arg(long, value_enum, default_value = "flex")]
    backend: crate::backend::BackendChoice,
    /// Continue the run in this directory from its checkpoint.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// starpo-s (default), starpo or grpo; each key stays overridable in [ppo].
    #[arg(long, value_parser = parse_algo)]
    algo: Option<Algo>,
    /// Train this pretrained model (a .gguf file or a Hugging Face
    /// directory; overrides the config's model_path).
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

impl TrainCommand {
    pub fn execute(self, access: &crate::oci::Access) -> Result<ExitCode> {
        let Self { env, config, steps, seed, out, backend, resume, algo, model, settings } = self;
        let settings = settings.parse()?;
        run(Options { env, config, steps, seed, out, backend, resume, algo, model, settings, access: access.clone() })?;
        Ok(ExitCode::SUCCESS)
    }
}

fn parse_algo(s: &str) -> Result<Algo, String> {
    match s {
        "starpo-s" => Ok(Algo::StarpoS),
        "starpo" => Ok(Algo::Starpo),
        "grpo" => Ok(Algo::Grpo),
        other => Err(format!("`{other}`: use starpo-s, starpo or grpo")),
    }
}

pub struct Options {
    /// Required for a new run; a resumed one defaults to its own.
    pub env: Option<PluginSource>,
    pub config: Option<PathBuf>,
    pub steps: Option<u64>,
    pub seed: Option<u64>,
    pub out: PathBuf,
    pub backend: crate::backend::BackendChoice,
    pub resume: Option<PathBuf>,
    pub algo: Option<Algo>,
    pub model: Option<PathBuf>,
    pub settings: Vec<(String, String)>,
    pub access: crate::oci::Access,
}

pub fn run(opts: Options) -> Result<()> {
    if !opts.backend.built() {
        return Err(opts.backend.missing());
    }
    let (mut config, out, resume) = resolve(&opts)?;
    let (source, plugin) = env_for_run(&opts, &mut config, resume)?;
    let stop = stop_on_ctrl_c()?;
    let policy = match &config.model_path {
        Some(m) if config.lora.is_on() => format!("`{}` with LoRA rank {}", m.display(), config.lora.rank),
        Some(m) => format!("`{}` in full", m.display()),
        None => "a transformer from scratch".to_string(),
    };
    let warm = match &config.warm_start {
        w if w.is_off() => String::new(),
        w => format!("{} warm-start steps on demonstrations ({}), then ", w.steps, w.demonstrations),
    };
    errln!("training {policy} on `{source}`: {warm}{:?} for {} steps, into {}", config.algo, config.steps, out.display());
    let mut progress = Progress::new(&config, &out)?;
    let history = crate::backend::with_backend!(opts.backend, B, device => train::<B>(
        plugin, &config, &out, resume, device, &stop, |m| progress.on_step(m)
    )?);
    progress.bar.finish();
    // The last steps, when the run stopped between validations.
    if let Err(e) = crate::dashboard::write(&progress.dashboard, &progress.seen) {
        errln!("warning: no dashboard: {e:#}");
    }
    let last_val = history.iter().rev().find_map(|m| m.val_success);
    errln!(
        "done: {} steps; last validation success {}; in {}: metrics.jsonl, dashboard.png, checkpoint/",
        history.len(),
        last_val.map(|v| format!("{:.1}%", 100.0 * v)).unwrap_or_else(|| "n/a".into()),
        out.display()
    );
    if stop.load(Ordering::SeqCst) {
        errln!("stopped early; continue with: ragen-host train --resume {}", out.display());
    }
    Ok(())
}

/// The config (the run's own on `--resume`, else `--config` or the
/// default) with the command line's overrides, the run directory, and
/// whether it resumes.
fn resolve(opts: &Options) -> Result<(TrainConfig, PathBuf, bool)> {
    let (mut config, out, resume) = match &opts.resume {
        Some(dir) => (TrainConfig::load(&dir.join("config.toml")).context("--resume needs a run directory")?, dir.clone(), true),
        None => (opts.config.as_deref().map(TrainConfig::load).transpose()?.unwrap_or_default(), opts.out.clone(), false),
    };
    if let Some(steps) = opts.steps {
        config.steps = steps;
    }
    if let Some(seed) = opts.seed {
        if resume && seed != config.seed {
            bail!("--seed {seed} differs from the run's seed {}; a resumed run keeps its seed", config.seed);
        }
        config.seed = seed;
    }
    if let Some(algo) = opts.algo {
        config.algo = algo;
    }
    if let Some(model) = &opts.model {
        if resume && config.model_path.as_ref() != Some(model) {
            bail!("--model {} differs from the run's model_path; a resumed run keeps its model", model.display());
        }
        config.model_path = Some(model.clone());
    }
    for (k, v) in &opts.settings {
        config.agent.env.insert(k.clone(), toml::Value::String(v.clone()));
    }
    Ok((config, out, resume))
}

/// The envs to train on, recorded in the config's `[plugin]`: a plugin
/// (its bytes read once, hashed and loaded) or a server. A resumed run
/// takes its own plugin: pinned by its digest when it came from a registry
/// (saying so when the tag has moved since), else its file (warning when
/// the file's bytes changed), or its server (warning when it serves
/// another env now).
fn env_for_run(opts: &Options, config: &mut TrainConfig, resume: bool) -> Result<(PluginSource, Arc<dyn EnvProvider>)> {
    let recorded = config.plugin.clone();
    let source = match &opts.env {
        Some(s) => s.clone(),
        None => PluginSource::recorded(&recorded)?,
    };
    if let PluginSource::Remote(address) = &source {
        let remote = ragen_remote::Remote::connect(address)?;
        let (info, _) = remote.describe(&[])?;
        let served = format!("{} {}", info.name, info.version);
        if resume && let Some(was) = recorded.served.as_ref().filter(|w| **w != served) {
            errln!("warning: `{source}` serves {served} now, not {was} as when this run started");
        }
        config.plugin = PluginRecord { source: Some(source.to_string()), served: Some(served), ..PluginRecord::default() };
        return Ok((source, remote));
    }
    let fetch = match (&source, &recorded.digest) {
        (PluginSource::Oci(r), Some(run_digest)) if resume => pinned_for_resume(r, run_digest, &opts.access)?,
        _ => source.clone(),
    };
    let fetched = fetch.fetch(&opts.access)?;
    let bytes = std::fs::read(&fetched.path).with_context(|| format!("cannot read plugin `{}`", fetched.path.display()))?;
    let wasm_digest = ragen_oci::sha256_digest(&bytes).to_string();
    if resume && let Some(was) = recorded.wasm_digest.as_ref().filter(|w| **w != wasm_digest) {
        errln!(
            "warning: `{source}` is not the plugin this run started on (its .wasm was {was}, now {wasm_digest}); \
             the resumed run will not replay what an uninterrupted one would"
        );
    }
    config.plugin = PluginRecord {
        source: Some(source.to_string()),
        digest: fetched.pulled.as_ref().map(|p| p.manifest_digest.to_string()),
        wasm_digest: Some(wasm_digest),
        signed_by: fetched.pulled.as_ref().and_then(|p| p.signed_by.as_ref()).map(|s| s.key.clone()),
        served: None,
    };
    let plugin = Plugin::from_bytes(&bytes, &source.to_string(), config.agent.sandbox.limits()?)?;
    Ok((source, LocalPlugin::provider(plugin)))
}

/// The plugin a resumed run trained on (`run_digest`), given the reference
/// it now names: a tag that moved is reported and the run's digest kept; a
/// different pinned digest is refused.
fn pinned_for_resume(r: &ragen_oci::PluginRef, run_digest: &str, access: &crate::oci::Access) -> Result<PluginSource> {
    let run_digest = ragen_oci::Digest::parse(run_digest).context("the run's [plugin] digest")?;
    match r.digest() {
        Some(d) if d != run_digest => bail!(
            "{r} is not the plugin this run trained on ({run_digest}); a resumed run keeps its plugin: \
             start a new run (--out) to train on this one"
        ),
        Some(_) => {}
        None => match crate::oci::registry(access).and_then(|reg| reg.digest_of(r)) {
            Ok(now) if now != run_digest => errln!(
                "warning: {r} now points to {now}, not to {run_digest} that this run trained on; \
                 resuming on {run_digest}. Start a new run (--out) to train on the new plugin"
            ),
            Ok(_) => {}
            Err(e) => errln!("warning: cannot check whether {r} moved ({e:#}); resuming on the run's {run_digest}"),
        },
    }
    Ok(PluginSource::Oci(r.pinned(&run_digest)))
}

/// The flag the first Ctrl-C (or SIGTERM, or SIGHUP: a scheduler's or
/// `timeout`'s stop) raises: the run stops after the current step, with a
/// checkpoint. A second one exits at once, unless it comes within
/// [`SAME_STOP`] of the first: `timeout` and some schedulers signal the
/// process and then its whole process group, so one stop arrives twice.
fn stop_on_ctrl_c() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut first: Option<std::time::Instant> = None;
    ctrlc::set_handler(move || match first {
        Some(at) if at.elapsed() >= SAME_STOP => {
            errln!("\nsecond stop signal: stopping now without a final checkpoint");
            std::process::exit(130);
        }
        Some(_) => {}
        None => {
            first = Some(std::time::Instant::now());
            flag.store(true, Ordering::SeqCst);
            errln!("\nstop signal (Ctrl-C or SIGTERM): finishing this step, then writing a checkpoint (Ctrl-C again to abort)");
        }
    })
    .context("cannot install the Ctrl-C and SIGTERM handler")?;
    Ok(stop)
}

/// Signals this close together are one stop delivered twice, not a person
/// pressing Ctrl-C again.
const SAME_STOP: std::time::Duration = std::time::Duration::from_millis(500);

/// The progress bar, its warnings, and the dashboard redrawn on validation
/// steps.
struct Progress {
    bar: ProgressBar,
    steps: u64,
    dashboard: PathBuf,
    dashboard_warned: bool,
    /// Every step so far, a resumed run's earlier ones included, so the
    /// dashboard shows the whole run.
    seen: Vec<StepMetrics>,
}

impl Progress {
    fn new(config: &TrainConfig, out: &std::path::Path) -> Result<Self> {
        let bar = ProgressBar::new(config.total_steps());
        bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} steps {elapsed_precise} | {msg}").expect("a valid template"));
        let metrics = out.join("metrics.jsonl");
        let seen = if metrics.exists() { read_metrics(&metrics)? } else { Vec::new() };
        Ok(Self { bar, steps: config.total_steps(), dashboard: out.join("dashboard.png"), dashboard_warned: false, seen })
    }

    /// A line above the bar. `println` would drop it when stderr is not a
    /// terminal (a log file, CI), where the bar is hidden.
    fn warn(&self, line: String) {
        self.bar.suspend(|| errln!("{line}"));
    }

    fn on_step(&mut self, m: &StepMetrics) {
        self.seen.retain(|old| old.step < m.step);
        self.seen.push(m.clone());
        // Redraw on validation steps (and the last): cheap next to a step.
        if (m.val_success.is_some() || m.step + 1 == self.steps)
            && let Err(e) = crate::dashboard::write(&self.dashboard, &self.seen)
            && !self.dashboard_warned
        {
            self.warn(format!("warning: no dashboard: {e:#}"));
            self.dashboard_warned = true;
        }
        self.bar.set_position(m.step + 1);
        let val = m.val_success.map(|v| format!(" val {:.1}%", 100.0 * v)).unwrap_or_default();
        let failed = if m.failed_episodes > 0 { format!(" failed {}", m.failed_episodes) } else { String::new() };
        let recovered: usize = self.seen.iter().map(|m| m.env_recoveries).sum();
        let failed = if recovered > 0 { format!("{failed} recovered {recovered}") } else { failed };
        let phase = if m.warm_start { format!("warm start: loss {:.3} ", m.policy_loss) } else { String::new() };
        self.bar.set_message(format!(
            "{phase}success {:.1}% reward {:.2} std {:.2} entropy {:.2}{val}{failed}",
            100.0 * m.success,
            m.return_mean,
            m.reward_std_before_filter,
            m.entropy
        ));
        if let Some(alarm) = &m.collapse_alarm {
            self.warn(format!("warning at step {}: {alarm}", m.step));
        }
        // Said when it starts, not on every step it lasts.
        let before = self.seen.iter().rev().nth(1);
        if let Some(why) = &m.template_collapse
            && before.is_none_or(|b| b.template_collapse.is_none())
        {
            self.warn(format!("warning at step {}: {why}", m.step));
        }
        if let Some(first) = &m.first_failure {
            self.warn(format!(
                "warning at step {}: {} of {} episodes failed; the first: {}",
                m.step,
                m.failed_episodes,
                m.episodes,
                crate::term::escape(first)
            ));
        }
        if let Some(recovered) = &m.recovered {
            self.warn(format!("warning at step {}: the env pool recovered from plugin faults: {}", m.step, crate::term::escape(recovered)));
        }
        if let Some(skipped) = &m.skipped {
            self.warn(format!("warning at step {}: update skipped: {}", m.step, crate::term::escape(skipped)));
        }
    }
}
