//! `ragen-host bench`: throughput through the sandbox and the same env
//! compiled natively, measured in the same run, plus memory per env.

use crate::args::{Settings, default_threads};
use crate::backend;
use crate::oci::PluginSource;
use crate::output::{errln, print_report};
use crate::shipped::Twin;
use anyhow::{Context, Result, anyhow, bail};
use ragen_env_sdk::{CheckedEnv, Environment, SeedRng};
use ragen_runtime::{Action, EnvFailure, EnvPool, Envs, Plugin, PoolConfig};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Measure resets/s and steps/s through the sandbox with a batched pool,
/// and the same env compiled natively in the same run (for the shipped
/// plugins), with memory per env and instantiation time.
#[derive(clap::Args)]
pub struct BenchCommand {
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
    /// Also serve the plugin on loopback (as `ragen-host serve` does, in
    /// this process) and measure its envs over WebSocket as `--env ws://`
    /// plays them: all envs in one batched session, and one session per
    /// env as OpenEnv's clients play; each against the pool in this run.
    #[arg(long, conflicts_with = "policy")]
    over_websocket: bool,
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
    /// (64 new tokens a reply, with and without the prefill's time) and
    /// training (4 x 512 tokens) tokens/s, and peak resident memory.
    #[arg(long, value_name = "PATH", requires = "policy")]
    model: Option<PathBuf>,
    /// With --model: decode with the `f32` weights even where the file
    /// stores them quantized (the reference path, to compare against).
    #[arg(long, requires = "model")]
    f32_weights: bool,
    /// With --model: train LoRA adapters of this rank (alpha = rank) on
    /// every linear layer instead of the whole model.
    #[arg(long, value_name = "RANK", requires = "model")]
    lora: Option<usize>,
    /// With --lora: keep the frozen base only as the file stores it
    /// (QLoRA, `[lora] quantized_base = true`), not also in `f32`.
    #[arg(long, requires = "lora", conflicts_with = "f32_weights")]
    quantized_base: bool,
    /// With --policy: sequences per pass.
    #[arg(long, default_value_t = 32, requires = "policy")]
    batch: usize,
    /// With --policy: the tensor backend (`flex`, or `wgpu`/`cuda`/
    /// `libtorch` when built with those cargo features).
    #[arg(long, value_enum, default_value = "flex")]
    backend: backend::BackendChoice,
    #[command(flatten)]
    settings: Settings,
}

impl BenchCommand {
    /// What `--model` decodes and trains on.
    fn weights(&self) -> Weights {
        let rank = self.lora.unwrap_or(0);
        let lora = ragen_llm::LoraConfig { quantized_base: self.quantized_base, ..ragen_llm::LoraConfig::new(rank, rank as f64) };
        Weights { f32: self.f32_weights, lora }
    }

    /// The plugin's rates, or with --policy the policy's (a pretrained
    /// model's with --model). Exits 1 when env calls failed during the
    /// bench: its rates are then not the plugin's.
    pub fn execute(self, access: &crate::oci::Access) -> Result<ExitCode> {
        if !self.policy {
            return self.plugin_rates(access);
        }
        if self.batch == 0 || !self.seconds.is_finite() || self.seconds <= 0.0 {
            bail!("--batch and --seconds must be positive (and --seconds finite)");
        }
        let file = self.file.local(access)?;
        let (batch, seconds) = (self.batch, self.seconds);
        match &self.model {
            Some(model) => {
                let report =
                    backend::with_backend!(self.backend, B, device => llm::<B>(&file, model, batch, seconds, self.weights(), device)?);
                print_report(&report, self.json, ragen_llm::LlmBenchReport::to_text)?;
            }
            None => {
                let config = self.config.as_deref();
                let report = backend::with_backend!(self.backend, B, device => policy::<B>(&file, config, batch, seconds, device)?);
                print_report(&report, self.json, ragen_policy::PolicyBenchReport::to_text)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Without --policy: the plugin through the sandbox, and natively.
    fn plugin_rates(self, access: &crate::oci::Access) -> Result<ExitCode> {
        if self.envs == 0 || !self.seconds.is_finite() || self.seconds <= 0.0 {
            bail!("--envs and --seconds must be positive (and --seconds finite)");
        }
        let threads = default_threads(self.threads);
        let batched = !self.single_calls;
        let (envs, seconds, envs_per_instance) = (self.envs, self.seconds, self.envs_per_instance);
        let over_websocket = self.over_websocket;
        let opts = Options { envs, threads, seconds, envs_per_instance, batched, settings: self.settings.parse()?, over_websocket };
        let report = bench(&self.file.local(access)?, &opts)?;
        print_report(&report, self.json, Report::to_text)?;
        if report.failures > 0 {
            errln!(
                "error: {} env calls failed during the bench ({}), so its rates are not the plugin's; \
                 `ragen-host validate {}` checks the plugin call by call",
                report.failures,
                crate::term::escape(&report.failure_summary()),
                self.file
            );
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    }
}

pub struct Options {
    pub envs: usize,
    pub threads: usize,
    pub seconds: f64,
    pub envs_per_instance: usize,
    /// Use the plugin's batched calls when it has them.
    pub batched: bool,
    pub settings: Vec<(String, String)>,
    /// Measure the envs over WebSocket on loopback too.
    pub over_websocket: bool,
}

#[derive(Serialize, Clone, Copy)]
pub struct Rates {
    pub resets_per_sec: f64,
    /// Env steps per second of stepping; the autoresets that keep episodes
    /// going are part of the time, the same way natively and sandboxed.
    pub steps_per_sec: f64,
}

#[derive(Serialize)]
pub struct Report {
    pub plugin: String,
    pub name: String,
    pub envs: usize,
    pub threads: usize,
    pub instances: usize,
    pub envs_per_instance: usize,
    /// Whether the pool crossed the sandbox once per instance per call
    /// (the plugin's batched calls) rather than once per env.
    pub batched: bool,
    pub sandboxed: Rates,
    /// The same env compiled natively (for the plugins ragen-rs ships).
    pub native: Option<Rates>,
    /// Sandboxed rate / native rate.
    pub ratio: Option<Rates>,
    /// Size of the component file, in bytes.
    pub component_bytes: usize,
    /// Time to read, check and compile the component, in milliseconds: paid
    /// once per process (`train`, `eval`, `play`...), not per env.
    pub load_ms: f64,
    /// Whether the compiled code came from the compile cache (then
    /// `load_ms` is a cached load; `--no-cache` measures compilation).
    pub load_from_cache: bool,
    /// Mean time to create one plugin instance, in milliseconds.
    pub instantiate_ms: f64,
    /// Linear memory of one instance running one env, in bytes: mostly the
    /// language runtime's own heap (CPython, a JS engine; about 1 MiB of
    /// stack and data for Rust).
    pub linear_memory_bytes_per_instance: f64,
    /// Growth of this process's resident memory per instance running one
    /// env, in bytes: the pages that instance really touched.
    pub resident_bytes_per_instance: f64,
    /// Growth of this process's resident memory per env, in bytes.
    pub resident_bytes_per_env: f64,
    /// Linear memory of all instances per env, in bytes.
    pub linear_memory_bytes_per_env: f64,
    /// Failed env calls during the run (0 for a healthy plugin).
    pub failures: usize,
    /// Those failures counted by kind (`trap`, `timeout`, `invalid output`, ...).
    pub failure_kinds: BTreeMap<String, usize>,
    /// The first failure, quoted whole: which env, which seed, and why.
    pub first_failure: Option<String>,
    /// What the pool did to recover from those faults: rebuilt instances,
    /// batched calls run again call by call, batching turned off. Each
    /// costs time: the sandboxed rates include it.
    pub recoveries: ragen_runtime::Recoveries,
    /// With --over-websocket: the same envs served on loopback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_websocket: Option<OverWebsocket>,
}

/// The plugin's envs served on loopback by `ragen-serve` in this process
/// and played through `ragen-remote`, as `--env ws://` plays them.
#[derive(Serialize)]
pub struct OverWebsocket {
    /// All envs in one session (`/ragen/batch`): what `--env ws://` uses
    /// with ragen-host's server.
    pub batched_session: Rates,
    /// One session per env (`/ws`), as OpenEnv's clients play.
    pub session_per_env: Rates,
    /// `batched_session` / the pool in this process (`sandboxed`).
    pub batched_ratio: Rates,
    /// `session_per_env` / the pool in this process.
    pub per_env_ratio: Rates,
    /// Failed env calls over the network (0 on a healthy loopback).
    pub failures: usize,
}

/// Failed env calls as a bench meets them: a count per kind and the first
/// one's message, so a failing bench says why, not only how often.
#[derive(Default)]
struct Failures {
    by_kind: BTreeMap<String, usize>,
    first: Option<String>,
}

impl Failures {
    /// Count the failures among one call's results.
    fn count<T>(&mut self, results: &[Result<T, EnvFailure>]) {
        for failure in results.iter().filter_map(|r| r.as_ref().err()) {
            *self.by_kind.entry(failure.kind_name()).or_default() += 1;
            self.first.get_or_insert_with(|| failure.to_string());
        }
    }

    fn total(&self) -> usize {
        self.by_kind.values().sum()
    }
}

impl Report {
    /// `12 trap, 3 timeout; the first: plugin `x`, env 3, seed 7: trap: ...`
    fn failure_summary(&self) -> String {
        let kinds: Vec<String> = self.failure_kinds.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        let first = self.first_failure.as_deref().map(|f| format!("; the first: {f}")).unwrap_or_default();
        format!("{}{first}", kinds.join(", "))
    }
}

fn resident_bytes() -> usize {
    // /proc/self/statm: size resident shared ... in pages.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|r| r.parse::<usize>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Call `batch` repeatedly for `budget`; returns items per second.
fn rate(budget: Duration, mut batch: impl FnMut(u64) -> Result<usize>) -> Result<f64> {
    let started = Instant::now();
    let (mut items, mut round) = (0usize, 0u64);
    while started.elapsed() < budget || round == 0 {
        items += batch(round)?;
        round += 1;
    }
    Ok(items as f64 / started.elapsed().as_secs_f64())
}

pub fn bench(file: &Path, opts: &Options) -> Result<Report> {
    let t = Instant::now();
    let plugin = Arc::new(Plugin::from_file(file)?);
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let info = plugin.instantiate()?.info()?;
    let half = Duration::from_secs_f64(opts.seconds / 2.0);
    let probe = probe_instances(&plugin, opts, &info.name)?;
    let pool = pool_rates(&plugin, opts, probe.num_actions, half)?;
    let over_websocket =
        if opts.over_websocket { Some(websocket_rates(&plugin, opts, probe.num_actions, half, &pool.rates)?) } else { None };
    let native = match probe.twin {
        Some(twin) => Some(twin.bench_native(opts, probe.num_actions, half)?),
        None => None,
    };
    let ratio = native.map(|nat| Rates {
        resets_per_sec: pool.rates.resets_per_sec / nat.resets_per_sec,
        steps_per_sec: pool.rates.steps_per_sec / nat.steps_per_sec,
    });
    Ok(Report {
        plugin: file.display().to_string(),
        name: info.name,
        envs: opts.envs,
        threads: opts.threads,
        instances: pool.stats.instances,
        envs_per_instance: opts.envs_per_instance,
        batched: opts.batched && plugin.has_batch(),
        sandboxed: pool.rates,
        native,
        ratio,
        component_bytes: plugin.size_bytes(),
        load_ms,
        load_from_cache: plugin.from_cache(),
        instantiate_ms: probe.instantiate_ms,
        linear_memory_bytes_per_instance: probe.linear_memory_bytes_per_instance,
        resident_bytes_per_instance: probe.resident_bytes_per_instance,
        resident_bytes_per_env: pool.resident_bytes_per_env,
        linear_memory_bytes_per_env: pool.stats.memory_bytes as f64 / opts.envs as f64,
        failures: pool.failures.total(),
        failure_kinds: pool.failures.by_kind,
        first_failure: pool.failures.first,
        recoveries: pool.recoveries,
        over_websocket,
    })
}

/// What holding instances costs, and what the first one says of its env.
struct InstanceProbe {
    instantiate_ms: f64,
    resident_bytes_per_instance: f64,
    linear_memory_bytes_per_instance: f64,
    num_actions: usize,
    twin: Option<Twin>,
}

/// Instances held at once, each running one episode: what an instance
/// costs once its runtime has woken (memory images are copy-on-write, so
/// an untouched instance costs next to nothing). Only `instantiate` is
/// timed.
fn probe_instances(plugin: &Plugin, opts: &Options, name: &str) -> Result<InstanceProbe> {
    let probes = 16;
    let before = resident_bytes();
    let mut held = Vec::with_capacity(probes);
    let mut instantiating = Duration::ZERO;
    for seed in 0..probes as u64 {
        let t = Instant::now();
        let mut inst = plugin.instantiate()?;
        instantiating += t.elapsed();
        let env = inst.create(&opts.settings)?.map_err(|e| anyhow!("the plugin rejected the settings: {}", e.message))?;
        inst.reset(env, seed)?.map_err(|e| anyhow!("reset failed: {}", e.message))?;
        held.push((inst, env));
    }
    let resident_bytes_per_instance = resident_bytes().saturating_sub(before) as f64 / probes as f64;
    let linear_memory_bytes_per_instance = held.iter().map(|(i, _)| i.memory_bytes() as f64).sum::<f64>() / probes as f64;
    let (inst, env) = &mut held[0];
    let spec = inst.spec(*env)?;
    if spec.takes_text() {
        bail!(
            "bench steps envs with random action ids, and this env's action is free text; time it with `ragen-host validate` (its speed line), or eval a policy on it"
        );
    }
    let num_actions = spec.action_names().len();
    let twin = Twin::find(name, inst, *env, &opts.settings)?;
    Ok(InstanceProbe {
        instantiate_ms: instantiating.as_secs_f64() * 1e3 / probes as f64,
        resident_bytes_per_instance,
        linear_memory_bytes_per_instance,
        num_actions,
        twin,
    })
}

/// The sandboxed side: a pool of `opts.envs` envs reset, then stepped with
/// random actions, each for `budget`.
struct PoolRates {
    rates: Rates,
    stats: ragen_runtime::PoolStats,
    resident_bytes_per_env: f64,
    failures: Failures,
    recoveries: ragen_runtime::Recoveries,
}

fn pool_rates(plugin: &Arc<Plugin>, opts: &Options, num_actions: usize, budget: Duration) -> Result<PoolRates> {
    let before = resident_bytes();
    let config = PoolConfig {
        threads: opts.threads,
        envs_per_instance: opts.envs_per_instance,
        settings: opts.settings.clone(),
        batched: opts.batched,
        ..PoolConfig::new(opts.envs)
    };
    let pool = EnvPool::new(plugin.clone(), &config)?;
    let stats = pool.stats()?;
    let mut failures = Failures::default();
    let mut resident_bytes_per_env = 0.0;
    let rates = rates_of(&pool, true, num_actions, budget, &mut failures, || {
        // Resident memory once every env holds a running episode.
        resident_bytes_per_env = resident_bytes().saturating_sub(before) as f64 / opts.envs as f64;
    })?;
    let recoveries = pool.stats()?.recoveries;
    Ok(PoolRates { rates, stats, resident_bytes_per_env, failures, recoveries })
}

/// Resets of every env, then random steps, each for `budget`; `between`
/// runs once the resets are done. Episodes that end are started again by
/// the pool's autoreset, or, for envs without one (`autoreset` false: a
/// server's), by a reset at the start of the next round, counted with the
/// steps as the pool's autoreset steps are.
fn rates_of(
    envs: &dyn Envs,
    autoreset: bool,
    num_actions: usize,
    budget: Duration,
    failures: &mut Failures,
    between: impl FnOnce(),
) -> Result<Rates> {
    let n = envs.num_envs();
    let ids: Vec<usize> = (0..n).collect();
    let resets = rate(budget, |round| {
        let seeds: Vec<u64> = (0..n as u64).map(|i| round * n as u64 + i).collect();
        failures.count(&envs.reset(&ids, &seeds)?);
        Ok(n)
    })?;
    between();
    let mut rng = SeedRng::new(1);
    let mut over = vec![false; n];
    let steps = rate(budget, |round| {
        let ended: Vec<usize> = (0..n).filter(|&i| over[i]).collect();
        if !ended.is_empty() {
            let seeds: Vec<u64> = ended.iter().map(|&i| (round + 1_000_003) * n as u64 + i as u64).collect();
            failures.count(&envs.reset(&ended, &seeds)?);
        }
        let actions: Vec<Action> = (0..n).map(|_| Action::Id(rng.below(num_actions) as u32)).collect();
        let results = envs.step(&ids, &actions)?;
        if !autoreset {
            over = results.iter().map(|r| r.as_ref().is_ok_and(|s| s.done)).collect();
        }
        failures.count(&results);
        Ok(n)
    })?;
    Ok(Rates { resets_per_sec: resets, steps_per_sec: steps })
}

/// The plugin served on loopback in this process, played over WebSocket
/// with one batched session and with a session per env (see
/// [`OverWebsocket`]).
fn websocket_rates(plugin: &Arc<Plugin>, opts: &Options, num_actions: usize, budget: Duration, pool: &Rates) -> Result<OverWebsocket> {
    let config = ragen_serve::ServeConfig {
        max_sessions: 2 * opts.envs,
        threads: opts.threads,
        envs_per_instance: opts.envs_per_instance,
        settings: opts.settings.clone(),
        ..ragen_serve::ServeConfig::default()
    };
    let server = ragen_serve::Server::new(plugin.clone(), config)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the server's async runtime")?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).context("cannot listen on loopback")?;
    let address: ragen_remote::RemoteAddress = format!("ws://{}", listener.local_addr()?).parse()?;
    let stop = server.shutdown_token();
    let serving = runtime.spawn(server.serve(listener));
    let remote = ragen_remote::Remote::connect(&address)?;
    let mut failures = Failures::default();
    let mut measure = |batched: bool| -> Result<Rates> {
        let envs = remote.open(&PoolConfig { batched, settings: opts.settings.clone(), ..PoolConfig::new(opts.envs) })?;
        // Sessions open before the clock starts.
        let ids: Vec<usize> = (0..opts.envs).collect();
        envs.reset(&ids, &vec![0; opts.envs])?;
        rates_of(envs.as_ref(), false, num_actions, budget, &mut failures, || {})
    };
    let batched_session = measure(true)?;
    let session_per_env = measure(false)?;
    stop.cancel();
    runtime.block_on(serving).context("the bench's server task")??;
    let ratio =
        |r: &Rates| Rates { resets_per_sec: r.resets_per_sec / pool.resets_per_sec, steps_per_sec: r.steps_per_sec / pool.steps_per_sec };
    Ok(OverWebsocket {
        batched_ratio: ratio(&batched_session),
        per_env_ratio: ratio(&session_per_env),
        batched_session,
        session_per_env,
        failures: failures.total(),
    })
}

/// The same workload on the env compiled natively: `opts.envs` envs split
/// over `opts.threads` threads, next-step autoreset as in the pool.
pub(crate) fn native<E: Environment>(opts: &Options, num_actions: usize, budget: Duration) -> Result<Rates> {
    let per_thread = opts.envs.div_ceil(opts.threads.max(1));
    let run = |reset_phase: bool| -> Result<f64> {
        let totals: Vec<Result<(usize, f64)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..opts.threads.max(1))
                .map(|t| {
                    s.spawn(move || -> Result<(usize, f64)> {
                        let count = per_thread.min(opts.envs.saturating_sub(t * per_thread));
                        let mut envs: Vec<CheckedEnv<E>> =
                            (0..count).map(|_| CheckedEnv::create(&opts.settings)).collect::<Result<_, _>>().map_err(|e| anyhow!("{e}"))?;
                        let mut done = vec![false; count];
                        let mut rng = SeedRng::new(t as u64);
                        for (i, env) in envs.iter_mut().enumerate() {
                            env.reset(i as u64).map_err(|e| anyhow!("{e}"))?;
                        }
                        let started = Instant::now();
                        let (mut items, mut round) = (0usize, 1u64);
                        while started.elapsed() < budget {
                            for (i, env) in envs.iter_mut().enumerate() {
                                if reset_phase || done[i] {
                                    env.reset(round * 1_000_003 + i as u64).map_err(|e| anyhow!("{e}"))?;
                                    done[i] = false;
                                } else {
                                    done[i] = env.step(rng.below(num_actions) as u32).map_err(|e| anyhow!("{e}"))?.done;
                                }
                            }
                            items += count;
                            round += 1;
                        }
                        Ok((items, started.elapsed().as_secs_f64()))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow!("a native bench thread panicked"))?).collect()
        });
        let mut rate = 0.0;
        for r in totals {
            let (items, secs) = r.context("native baseline")?;
            rate += items as f64 / secs;
        }
        Ok(rate)
    };
    Ok(Rates { resets_per_sec: run(true)?, steps_per_sec: run(false)? })
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "bench {} ({}): {} envs, {} threads, {} instances of up to {} envs\n",
            self.plugin, self.name, self.envs, self.threads, self.instances, self.envs_per_instance
        );
        let calls = if self.batched { "batched calls" } else { "one call per env" };
        s.insert_str(s.len() - 1, &format!(", {calls}"));
        let line = |what: &str, r: &Rates| format!("  {what:<10} {:>12.0} resets/s {:>12.0} steps/s\n", r.resets_per_sec, r.steps_per_sec);
        s += &line("sandboxed", &self.sandboxed);
        match (&self.native, &self.ratio) {
            (Some(n), Some(r)) => {
                s += &line("native", n);
                s += &format!("  {:<10} {:>12.2} x        {:>12.2} x  (sandboxed / native)\n", "ratio", r.resets_per_sec, r.steps_per_sec);
            }
            _ => s += "  native     (no native build of this plugin to compare with)\n",
        }
        s += &format!(
            "  memory     {:.1} KiB resident per env, {:.1} KiB of linear memory per env\n",
            self.resident_bytes_per_env / 1024.0,
            self.linear_memory_bytes_per_env / 1024.0,
        );
        s += &format!(
            "  instance   {:.2} ms to instantiate; with one env: {:.1} MiB of linear memory, {:.2} MiB resident\n",
            self.instantiate_ms,
            self.linear_memory_bytes_per_instance / (1 << 20) as f64,
            self.resident_bytes_per_instance / (1 << 20) as f64,
        );
        s += &format!(
            "  load       {:.0} ms to read and {} the {:.1} MiB component (once per process)\n",
            self.load_ms,
            if self.load_from_cache { "fetch from the compile cache" } else { "compile" },
            self.component_bytes as f64 / (1 << 20) as f64
        );
        if self.failures > 0 {
            s += &format!("  failures   {} env calls failed during the run: {}\n", self.failures, self.failure_summary());
        }
        if self.recoveries.any() {
            s += &format!("  recovered  {}\n", self.recoveries);
        }
        if let Some(w) = &self.over_websocket {
            s += "  over WebSocket on loopback (served in this process):\n";
            for (what, r, ratio) in [("batched", &w.batched_session, &w.batched_ratio), ("per env", &w.session_per_env, &w.per_env_ratio)] {
                s += &format!(
                    "  {what:<10} {:>12.0} resets/s {:>12.0} steps/s   {:.2} x / {:.2} x the pool\n",
                    r.resets_per_sec, r.steps_per_sec, ratio.resets_per_sec, ratio.steps_per_sec
                );
            }
            if w.failures > 0 {
                s += &format!("  {} env calls failed over the network\n", w.failures);
            }
        }
        s
    }
}

/// `bench --policy`: the policy a training config builds for this plugin,
/// on the first prompts of seeds 123 onwards, on backend `B`.
pub fn policy<B: ragen_ops::TrainBackend>(
    file: &Path,
    config: Option<&Path>,
    batch: usize,
    seconds: f64,
    device: B::Device,
) -> Result<ragen_policy::PolicyBenchReport> {
    use ragen_agent::{Context as Ctx, Message, PromptBuilder, Role};
    let config = config.map(ragen_learner::TrainConfig::load).transpose()?.unwrap_or_default();
    let plugin = Plugin::from_file(file)?;
    let settings = config.agent.env_settings(&[]);
    let mut inst = plugin.instantiate()?;
    let env = inst.create(&settings)?.map_err(|e| anyhow!("the plugin rejected the settings: {}", e.message))?;
    let spec = inst.spec(env)?;
    let rollout = &config.agent.rollout;
    let limits = rollout.limits(&spec);
    let prompts = PromptBuilder::new(config.agent.prompt.clone(), &spec, rollout.enable_think, limits.max_actions_per_turn);
    let (learner, tokenizer) = ragen_learner::build_learner::<B>(&config, &spec, device.clone())?;
    let sampling = ragen_policy::SamplingConfig { temperature: 1.0, think_budget: config.sampling.think_budget };
    let policy = ragen_policy::BurnPolicy::new(
        learner.policy_model(),
        tokenizer,
        rollout.enable_think,
        limits.max_actions_per_turn,
        sampling,
        0,
        device.clone(),
    );
    // One first turn per seed: rows share the system prompt and the
    // instructions and differ in the state, as a training batch's groups do.
    let system = prompts.system();
    let mut rows = Vec::with_capacity(batch);
    for seed in (0..batch as u64).map(|i| ragen_agent::EVAL_SEED_START + i) {
        let observation = inst.reset(env, seed)?.map_err(|e| anyhow!("reset failed: {}", e.message))?;
        let user = prompts.first_user(&observation, limits.max_actions_per_traj);
        let context = Ctx {
            env: 0,
            messages: vec![Message { role: Role::System, text: &system }, Message { role: Role::User, text: &user }],
            prefill: prompts.prefill(),
            observation: &observation,
            actions: spec.action_names(),
            max_actions: limits.max_actions_per_turn,
            oracle: None,
        };
        rows.push(policy.prompt_tokens(&context));
    }
    let bench = ragen_policy::PolicyBenchConfig { prompts: rows, min_time: Duration::from_secs_f64(seconds / 4.0) };
    Ok(ragen_policy::bench_policy(learner.model(), policy.grammar(), &bench, &device))
}

/// The weights `bench --policy --model` decodes and trains on.
pub struct Weights {
    /// The `f32` weights only, even where the file stores them quantized.
    pub f32: bool,
    /// Adapters to train instead of the whole model (when on).
    pub lora: ragen_llm::LoraConfig,
}

/// `bench --policy --model`: a pretrained model on `batch` first-turn
/// prompts of the plugin (as the chat template renders them), `new_tokens`
/// sampled per reply, and training passes of 4 sequences of 512 tokens (the
/// shapes `scripts/reference/llm_bench.py` measures PyTorch on).
pub fn llm<B: ragen_ops::TrainBackend>(
    file: &Path,
    model: &Path,
    batch: usize,
    seconds: f64,
    weights: Weights,
    device: B::Device,
) -> Result<ragen_llm::LlmBenchReport> {
    use ragen_agent::{Context as Ctx, Message, PromptBuilder, Role};
    let mut pretrained =
        crate::term::with_spinner(&format!("loading {}", model.display()), || ragen_llm::Pretrained::<B>::load(model, &device))?;
    if weights.f32 {
        pretrained.model = pretrained.model.without_quantized();
    }
    if weights.lora.is_on() {
        pretrained.model = pretrained.model.with_lora(&weights.lora);
    }
    errln!("{}", super::chat::describe(&pretrained));
    let config = ragen_agent::AgentConfig::default();
    let plugin = Plugin::from_file(file)?;
    let settings = config.env_settings(&[]);
    let mut inst = plugin.instantiate()?;
    let env = inst.create(&settings)?.map_err(|e| anyhow!("the plugin rejected the settings: {}", e.message))?;
    let spec = inst.spec(env)?;
    let rollout = &config.rollout;
    let limits = rollout.limits(&spec);
    let prompts = PromptBuilder::new(config.prompt.clone(), &spec, rollout.enable_think, limits.max_actions_per_turn);
    let policy = ragen_llm::LlmPolicy::new(pretrained, ragen_llm::LlmSampling::default(), 0);
    let system = prompts.system();
    let mut rows = Vec::with_capacity(batch);
    for seed in (0..batch as u64).map(|i| ragen_agent::EVAL_SEED_START + i) {
        let observation = inst.reset(env, seed)?.map_err(|e| anyhow!("reset failed: {}", e.message))?;
        let user = prompts.first_user(&observation, limits.max_actions_per_traj);
        let context = Ctx {
            env: 0,
            messages: vec![Message { role: Role::System, text: &system }, Message { role: Role::User, text: &user }],
            prefill: prompts.prefill(),
            observation: &observation,
            actions: spec.action_names(),
            max_actions: limits.max_actions_per_turn,
            oracle: None,
        };
        rows.push(policy.prompt_tokens(&context)?);
    }
    let bench = ragen_llm::LlmBenchConfig {
        prompts: rows,
        new_tokens: 64,
        train_rows: 4,
        train_len: 512,
        min_time: Duration::from_secs_f64(seconds / 3.0),
    };
    Ok(ragen_llm::bench_llm(&policy.pretrained.model, &bench, &device))
}
