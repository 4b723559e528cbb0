//! `ragen-host`: the ragen-rs command line.

mod backend;
mod bench;
mod chat;
mod dashboard;
mod eval;
mod inspect;
mod oci;
mod play;
mod serve;
mod shipped;
mod solver;
mod term;
mod train;
mod validate;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use oci::PluginSource;
use ragen_oci::PluginRef;
use ragen_runtime::SandboxLimits;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "ragen-host",
    version,
    about = "Run and check ragen-rs environment plugins (WebAssembly components).",
    long_about = "Run and check ragen-rs environment plugins.\n\n\
        A plugin is one .wasm component implementing wit/env.wit; it describes itself, so the \
        file is all you need. `make plugins` builds the shipped ones into target/plugins/. \
        Wherever a plugin is named, oci://registry/namespace/name:tag (or @sha256:…) works too: \
        it is pulled from that registry and checked against its digest (see `push`, `pull`).\n\n\
        Examples:\n  \
        ragen-host inspect target/plugins/sokoban.wasm --set dim_x=8\n  \
        ragen-host validate my-env.wasm\n  \
        ragen-host play target/plugins/frozenlake.wasm --seed 3\n  \
        ragen-host bench target/plugins/sokoban.wasm --envs 1024 --json\n  \
        ragen-host eval --env target/plugins/sokoban.wasm --policy random --json\n  \
        ragen-host train --env target/plugins/bandit.wasm --steps 20 --out runs/bandit\n  \
        ragen-host push target/plugins/sokoban.wasm ghcr.io/you/sokoban:0.2\n  \
        ragen-host train --env oci://ghcr.io/you/sokoban:0.2 --out runs/sokoban\n  \
        ragen-host eval --env target/plugins/bandit.wasm --checkpoint runs/bandit\n  \
        ragen-host chat --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf \"Say hello.\"\n  \
        ragen-host eval --env target/plugins/bandit.wasm --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Compile plugins afresh instead of reusing compiled code from the
    /// cache ($RAGEN_CACHE_DIR, else ~/.cache/ragen-rs/compiled; the
    /// environment variable RAGEN_NO_CACHE=1 does the same). The cache
    /// holds only this program's own compiler output, keyed by the
    /// plugin's bytes, the wasmtime version and its settings.
    #[arg(long, global = true)]
    no_cache: bool,
    /// Reach an `oci://` registry on this machine (localhost or
    /// 127.0.0.0/8) over plain HTTP instead of HTTPS, e.g. a test registry
    /// started with `docker-registry serve`. Refused for any other host.
    #[arg(long, global = true)]
    plain_http: bool,
}

/// What `validate` checks with, and `push` before it publishes.
#[derive(Args)]
struct ValidateArgs {
    /// Seeds to play in the determinism and value checks.
    #[arg(long, default_value_t = 16)]
    seeds: u64,
    /// Time budget for one call into the plugin.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    call_timeout_ms: u64,
    /// Memory cap per plugin instance.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    memory_mib: usize,
    /// Wall-clock budget of the checks (after the component compiled): a
    /// verdict comes within it (plus one call's timeout) on any plugin;
    /// checks it leaves no time for fail, saying so.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    budget: f64,
    #[command(flatten)]
    settings: Settings,
}

impl ValidateArgs {
    fn options(&self) -> Result<validate::Options> {
        if !self.budget.is_finite() || self.budget <= 0.0 {
            bail!("--budget {}: use a positive number of seconds", self.budget);
        }
        let limits = SandboxLimits {
            call_timeout: Duration::from_millis(self.call_timeout_ms),
            memory_bytes: self.memory_mib << 20,
            ..SandboxLimits::default()
        };
        Ok(validate::Options {
            settings: self.settings.parse()?,
            seeds: self.seeds.max(2),
            limits,
            budget: Duration::from_secs_f64(self.budget),
        })
    }
}

/// Settings passed to the plugin's `create`.
#[derive(Args, Clone)]
struct Settings {
    /// A config key for the env (repeatable), e.g. --set dim_x=8; `inspect`
    /// lists the keys a plugin accepts.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
}

impl Settings {
    /// Parse `KEY=VALUE` pairs; the value may contain `=`.
    fn parse(&self) -> Result<Vec<(String, String)>> {
        self.settings
            .iter()
            .map(|s| match s.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
                _ => bail!("--set `{s}`: expected KEY=VALUE, e.g. --set dim_x=8"),
            })
            .collect()
    }
}

#[derive(Subcommand)]
enum Command {
    /// Show what a plugin says about itself: name, version, actions, symbol
    /// legend, config keys and defaults, limits, the contract version it was
    /// built against, its size, and the imports it declares (none grants anything).
    Inspect {
        /// The plugin: a .wasm file (e.g. target/plugins/sokoban.wasm) or
        /// oci://registry/namespace/name:tag (or @sha256:…).
        file: PluginSource,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: Settings,
    },
    /// Check a plugin before sharing it: complete metadata, same seed → same
    /// episode, different seeds → different states, errors (not traps) for
    /// bad config and bad actions, the episode rules, finite rewards, and
    /// speed. Exits 0 only when every check passes; each failure says what
    /// to fix.
    Validate {
        /// The plugin: a .wasm file or oci://registry/namespace/name:tag.
        file: PluginSource,
        #[command(flatten)]
        checks: ValidateArgs,
    },
    /// Play a plugin yourself: type action names (case-insensitive; several
    /// separated by `||`, as the agent does), see the state, reward and info
    /// after each. `reset [N]` starts over, `quit` leaves.
    Play {
        /// The plugin: a .wasm file or oci://registry/namespace/name:tag.
        file: PluginSource,
        /// Seed of the first episode.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        settings: Settings,
    },
    /// Measure resets/s and steps/s through the sandbox with a batched pool,
    /// and the same env compiled natively in the same run (for the shipped
    /// plugins), with memory per env and instantiation time.
    Bench {
        /// The plugin: a .wasm file or oci://registry/namespace/name:tag.
        file: PluginSource,
        /// Envs in the pool.
        #[arg(long, default_value_t = 1024)]
        envs: usize,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Seconds of measurement, split between resets and steps (per side).
        #[arg(long, default_value_t = 4.0)]
        seconds: f64,
        /// Envs sharing one plugin instance.
        #[arg(long, default_value_t = 64)]
        envs_per_instance: usize,
        /// One call per env even when the plugin exports the contract's
        /// batched calls (to measure what batching buys).
        #[arg(long)]
        single_calls: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Measure the policy instead of the plugin: training tokens/s
        /// (forward + backward) and sampling tokens/s with and without the
        /// KV cache and batching, for the model and first prompt that
        /// `--config` (a training config) gives on this plugin.
        #[arg(long)]
        policy: bool,
        /// With --policy: the training config (default: the default config).
        #[arg(long, requires = "policy")]
        config: Option<PathBuf>,
        /// With --policy: measure a pretrained model instead (a GGUF file or
        /// a Hugging Face directory): prefill, batched KV-cache sampling
        /// (64 new tokens a reply) and training (4 x 512 tokens) tokens/s,
        /// and peak resident memory.
        #[arg(long, value_name = "PATH", requires = "policy")]
        model: Option<PathBuf>,
        /// With --policy: sequences per pass.
        #[arg(long, default_value_t = 32, requires = "policy")]
        batch: usize,
        /// With --policy: the tensor backend (`flex`, or `wgpu`/`cuda`/
        /// `libtorch` when built with those cargo features).
        #[arg(long, value_enum, default_value = "flex")]
        backend: backend::BackendChoice,
        #[command(flatten)]
        settings: Settings,
    },
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
    Train {
        /// The environment plugin: a .wasm file or
        /// oci://registry/namespace/name:tag (or @sha256:…); the run's
        /// config.toml records the digest. With --resume it defaults to the
        /// run's own plugin, pinned by that digest.
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
        backend: backend::BackendChoice,
        /// Continue the run in this directory from its checkpoint.
        #[arg(long, value_name = "DIR")]
        resume: Option<PathBuf>,
        /// starpo-s (default), starpo or grpo; each key stays overridable in [ppo].
        #[arg(long, value_parser = parse_algo)]
        algo: Option<ragen_learner::Algo>,
        /// Train this pretrained model (a .gguf file or a Hugging Face
        /// directory; overrides the config's model_path).
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        #[command(flatten)]
        settings: Settings,
    },
    /// Draw several training runs side by side in one PNG (success,
    /// validation success, in-group reward std, entropy, gradient norm,
    /// reward), e.g. StarPO against StarPO-S on the same env and seed:
    /// `ragen-host compare runs/starpo runs/starpo-s --out compare.png`.
    Compare {
        /// Run directories (each with metrics.jsonl).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// The PNG to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Load a pretrained model (a GGUF file or a Hugging Face directory)
    /// and print its reply to one prompt, rendered with the model's chat
    /// template: a check that a model loads and talks. Example:
    /// `ragen-host chat --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf "What is 2+2?"`.
    Chat {
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
    },
    /// Serve a plugin to trainers elsewhere, speaking OpenEnv's protocol:
    /// one episode per WebSocket session at /ws (JSON frames reset, step,
    /// state, close), stateless HTTP /reset and /step, /schema, /metadata,
    /// /health and Prometheus /metrics. Sessions are envs of one pool; a
    /// plugin fault fails only its session's episode. Example: `ragen-host
    /// serve target/plugins/sokoban.wasm --port 8000`, then from Python
    /// (openenv-core): `GenericEnvClient(base_url="http://127.0.0.1:8000")`.
    /// See docs/serve.md.
    Serve(serve::ServeArgs),
    /// Play a policy on fixed seeds (default: 256 seeds from 123, one
    /// episode each, as the reference evaluates) and report success, return,
    /// valid- and effective-action ratios, and the optimal policy's success
    /// on the same seeds where a solver exists (Sokoban: BFS; FrozenLake:
    /// value iteration; Bandit: always the better arm).
    Eval(EvalArgs),
    /// Publish a plugin to an OCI registry, in the WebAssembly ecosystem's
    /// layout (wkg, wasm-pkg-tools and oras read it), after `validate`
    /// passes (--force skips it). The manifest carries the plugin's name,
    /// version, description and contract version; the same file always
    /// gets the same digest. Prints the reference pinned by digest.
    /// Credentials: RAGEN_REGISTRY_USERNAME and RAGEN_REGISTRY_PASSWORD,
    /// else `docker login`'s. Example: `ragen-host push
    /// target/plugins/sokoban.wasm ghcr.io/you/sokoban:0.2`.
    Push {
        /// The .wasm plugin.
        file: PathBuf,
        /// registry[:port]/namespace/name:tag (oci:// optional).
        #[arg(value_parser = parse_plugin_ref, value_name = "REF")]
        reference: PluginRef,
        /// Push even when validation fails.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        checks: ValidateArgs,
    },
    /// Fetch a plugin from an OCI registry, check it against its digest,
    /// and write it to a file. Prints the reference pinned by digest, which
    /// `--env oci://…` then runs on any machine. Example: `ragen-host pull
    /// ghcr.io/you/sokoban:0.2 -o sokoban.wasm`.
    Pull {
        /// registry[:port]/namespace/name:tag or …@sha256:… (oci:// optional).
        #[arg(value_parser = parse_plugin_ref, value_name = "REF")]
        reference: PluginRef,
        /// Where to write the plugin [default: NAME.wasm here].
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
}

fn parse_plugin_ref(s: &str) -> Result<PluginRef, String> {
    PluginRef::parse(s).map_err(|e| format!("{e:#}"))
}

/// `eval`'s arguments.
#[derive(Args)]
struct EvalArgs {
    /// The environment plugin: a .wasm file or
    /// oci://registry/namespace/name:tag (or @sha256:…). With
    /// --checkpoint it defaults to the plugin the run trained on (pinned
    /// by its digest when it came from a registry).
    #[arg(long, required_unless_present = "checkpoint")]
    env: Option<PluginSource>,
    /// `random` (uniform well-formed answers; envs with action names
    /// only), `sokoban-solver` (replays BFS solutions) or
    /// `countdown-solver` (an expression found by exact search); ignored
    /// with --checkpoint.
    #[arg(long, default_value = "random")]
    policy: String,
    /// Evaluate the policy trained in this run directory (at its
    /// validation temperature unless --temperature is given): its
    /// checkpoint-best/ (the best validation success) when it has one, else
    /// its latest checkpoint/. Name a checkpoint folder inside the run to
    /// pick one.
    #[arg(long, value_name = "DIR", conflicts_with = "model")]
    checkpoint: Option<PathBuf>,
    /// Evaluate a pretrained model: a GGUF file or a Hugging Face
    /// directory (`make model` fetches SmolLM2-135M-Instruct into
    /// target/models/). Its replies are free text, parsed as the
    /// reference parses them.
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    #[command(flatten)]
    generation: Generation,
    /// Turn thinking off: the reply is pre-filled with `<answer>` and
    /// the prompt asks for the answer only.
    #[arg(long)]
    no_think: bool,
    #[arg(long, default_value_t = 256)]
    episodes: usize,
    /// The first evaluation seed.
    #[arg(long, default_value_t = ragen_agent::EVAL_SEED_START)]
    seed_start: u64,
    /// Seed of the policy's own randomness.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A TOML file with [rollout], [prompt] and [env] sections (a training
    /// config works too: its other sections are ignored here).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Write every trajectory (full text, tokens, rewards) as JSON lines.
    #[arg(long, value_name = "FILE.jsonl")]
    trajectories: Option<PathBuf>,
    /// Worker threads for the env pool (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    settings: Settings,
}

/// How a pretrained model writes its replies.
#[derive(Args, Clone)]
struct Generation {
    /// The backend a pretrained model runs on: `flex` (CPU), or `wgpu`/
    /// `cuda`/`libtorch` when built with those cargo features.
    #[arg(long, value_enum, default_value = "flex")]
    backend: backend::BackendChoice,
    /// Sampling temperature [default: 0.5, the reference's evaluation
    /// value; with `eval --config`, its `[sampling] val_temperature`; with
    /// `eval --checkpoint`, the run's].
    #[arg(long)]
    temperature: Option<f32>,
    /// Draw among the most likely tokens whose probability adds up to this.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Draw among this many most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// The longest reply, in tokens [default: 400, the reference's; with
    /// `eval --config`, its `[sampling] max_new_tokens`].
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Replies sampled together [default: 16; with `eval --config`, its
    /// `[sampling] batch`].
    #[arg(long)]
    batch: Option<usize>,
}

impl Generation {
    /// The sampling the flags give, with a training config's `[sampling]`
    /// (when one is given) in place of the built-in defaults: an eval under
    /// a preset samples as that preset's validation does.
    fn sampling(&self, config: Option<&ragen_learner::SamplingSection>) -> Result<ragen_llm::LlmSampling> {
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
    fn checkpoint_temperature(&self) -> Result<Option<f32>> {
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

fn parse_algo(s: &str) -> Result<ragen_learner::Algo, String> {
    match s {
        "starpo-s" => Ok(ragen_learner::Algo::StarpoS),
        "starpo" => Ok(ragen_learner::Algo::Starpo),
        "grpo" => Ok(ragen_learner::Algo::Grpo),
        other => Err(format!("`{other}`: use starpo-s, starpo or grpo")),
    }
}

fn default_threads(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1)
}

/// Print `report` as one pretty JSON object (`--json`) or as its text.
fn print_report<T: serde::Serialize>(report: &T, json: bool, text: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report).context("cannot write JSON")?);
    } else {
        print!("{}", term::escape(&text(report)));
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    if cli.no_cache {
        ragen_runtime::CompileCache::set_process_default(ragen_runtime::CompileCache::Off);
    }
    let plain_http = cli.plain_http;
    match cli.command {
        Command::Inspect { file, json, settings } => {
            print_report(&inspect::inspect(&file.local(plain_http)?, &settings.parse()?)?, json, inspect::Report::to_text)?;
        }
        Command::Validate { file, checks } => {
            let report = validate::run_with_spinner(&file.local(plain_http)?, &checks.options()?);
            print!("{}", term::escape(&validate::to_text(&report)));
            if !report.passed() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Push { file, reference, force, checks } => {
            oci::push(oci::PushOptions { file, reference, force, plain_http, validate: checks.options()? })?
        }
        Command::Pull { reference, out } => oci::pull(&reference, out.as_deref(), plain_http)?,
        Command::Play { file, seed, settings } => {
            let stdin = std::io::stdin();
            let mut out = term::Escaping(std::io::stdout());
            play::play(&file.local(plain_http)?, seed, &settings.parse()?, &mut stdin.lock(), &mut out)?;
        }
        Command::Bench { file, policy: true, model: Some(model), batch, seconds, json, backend, .. } => {
            if batch == 0 || !seconds.is_finite() || seconds <= 0.0 {
                bail!("--batch and --seconds must be positive (and --seconds finite)");
            }
            let file = file.local(plain_http)?;
            let report = backend::with_backend!(backend, B, device => bench::llm::<B>(&file, &model, batch, seconds, device)?);
            print_report(&report, json, ragen_llm::LlmBenchReport::to_text)?;
        }
        Command::Bench { file, policy: true, config, batch, seconds, json, backend, .. } => {
            if batch == 0 || !seconds.is_finite() || seconds <= 0.0 {
                bail!("--batch and --seconds must be positive (and --seconds finite)");
            }
            let file = file.local(plain_http)?;
            let report =
                backend::with_backend!(backend, B, device => bench::policy::<B>(&file, config.as_deref(), batch, seconds, device)?);
            print_report(&report, json, ragen_policy::PolicyBenchReport::to_text)?;
        }
        Command::Bench { file, envs, threads, seconds, envs_per_instance, single_calls, json, settings, .. } => {
            if envs == 0 || !seconds.is_finite() || seconds <= 0.0 {
                bail!("--envs and --seconds must be positive (and --seconds finite)");
            }
            let threads = default_threads(threads);
            let batched = !single_calls;
            let opts = bench::Options { envs, threads, seconds, envs_per_instance, batched, settings: settings.parse()? };
            let report = bench::bench(&file.local(plain_http)?, &opts)?;
            print_report(&report, json, bench::Report::to_text)?;
            if report.failures > 0 {
                eprintln!(
                    "error: {} env calls failed during the bench, so its rates are not the plugin's; \
                     `ragen-host validate {}` says why",
                    report.failures, file
                );
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Serve(args) => serve::run(args, plain_http)?,
        Command::Compare { runs, out } => {
            dashboard::compare_runs(&runs, &out)?;
            eprintln!("wrote {}", out.display());
        }
        Command::Train { env, config, steps, seed, out, backend, resume, algo, model, settings } => {
            let settings = settings.parse()?;
            train::run(train::Options { env, config, steps, seed, out, backend, resume, algo, model, settings, plain_http })?;
        }
        Command::Chat { model, prompt, system, raw, seed, generation } => {
            let g = generation.sampling(None)?;
            let opts = chat::Options { model, prompt, system, raw, max_new_tokens: g.max_new_tokens, sampling: g.sampling, seed };
            backend::with_backend!(inference generation.backend, B, device => chat::chat::<B>(opts, device)?);
        }
        Command::Eval(args) => eval_command(args, plain_http)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `eval`: the agent config from --config or the checkpoint's run, then
/// the evaluation.
fn eval_command(a: EvalArgs, plain_http: bool) -> Result<()> {
    let run = match &a.checkpoint {
        Some(path) => Some(ragen_learner::TrainConfig::load(&ragen_learner::find_checkpoint(path)?.0.config())?),
        None => None,
    };
    let (mut config, sampling) = match (&a.config, &run) {
        // A training config is a superset: its [rollout], [prompt], [env]
        // and a pretrained model's [sampling] apply.
        (Some(path), _) => {
            let c = ragen_learner::TrainConfig::load(path)?;
            (c.agent, Some(c.sampling))
        }
        // A trained policy is evaluated under the prompts and settings it trained with.
        (None, Some(run)) => (run.agent.clone(), None),
        (None, None) => (ragen_agent::AgentConfig::default(), None),
    };
    let env = match (a.env, &run) {
        (Some(env), _) => env,
        (None, Some(run)) => oci::PluginSource::of_run(&run.plugin)?,
        (None, None) => bail!("name the plugin with --env (a .wasm file or oci://…)"),
    };
    if a.no_think {
        config.rollout.enable_think = false;
    }
    let model = match a.model {
        Some(path) => Some(eval::ModelOptions { path, backend: a.generation.backend, sampling: a.generation.sampling(sampling.as_ref())? }),
        None => None,
    };
    let temperature = match &a.checkpoint {
        Some(_) => a.generation.checkpoint_temperature()?,
        None => None,
    };
    let opts = eval::Options {
        env: env.local(plain_http)?,
        policy: a.policy,
        checkpoint: a.checkpoint,
        temperature,
        model,
        episodes: a.episodes,
        seed_start: a.seed_start,
        seed: a.seed,
        config,
        settings: a.settings.parse()?,
        threads: default_threads(a.threads),
        trajectories: a.trajectories,
    };
    print_report(&eval::eval(opts)?, a.json, eval::Report::to_text)
}

/// mimalloc instead of the system allocator: training allocates and frees
/// tensors of tens of megabytes every pass, which glibc's malloc hands back
/// to the kernel each time, so every pass paid again in page faults and
/// zeroed pages (a fifth of the learner's time, measured). mimalloc keeps
/// freed memory for reuse; see [`keep_freed_memory`] for how long.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The environment variable that sets how long mimalloc keeps freed memory
/// before handing it back to the kernel, in milliseconds (-1: never).
const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// Restarts this process with mimalloc told to keep freed memory
/// (`MIMALLOC_PURGE_DELAY=-1`), unless the variable is already set.
///
/// Why: with mimalloc's default (purge after a second), a training pass
/// still met fresh pages for most of its tensors: 25,000 page faults in
/// `bench --policy`, and the kernel zeroing them took a sixth of the
/// pass. Never purging cut that to 1,200 faults and made training 4%
/// faster on one thread and 7% on two. The process's peak memory is the
/// same; it just keeps it until it exits. mimalloc reads its options only
/// when the process loads, and setting one later is an `unsafe` foreign
/// call, which this workspace forbids, so the option goes in through the
/// environment of an `exec` of the same program with the same arguments.
/// If that `exec` fails, the run goes on with the default.
#[cfg(unix)]
fn keep_freed_memory() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(PURGE_DELAY).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    // `exec` returns only on failure.
    let _failed = std::process::Command::new(&exe).arg0(arg0).args(args).env(PURGE_DELAY, "-1").exec();
}

/// Elsewhere the run keeps mimalloc's default.
#[cfg(not(unix))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", term::escape(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
