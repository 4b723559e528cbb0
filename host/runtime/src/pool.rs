//! `EnvPool`: many envs of one plugin, stepped in batches across worker
//! threads, EnvPool-style: `reset(ids, seeds)` and `step(ids, actions)`
//! with results in the caller's order.
//!
//! Layout: env `g` lives on worker `g % threads`, in that worker's instance
//! `(g / threads) / envs_per_instance`. Each worker thread owns its
//! instances outright (a wasmtime `Store` is single-threaded), so a batch
//! costs one message to and from each worker and no locks.
//!
//! Why plain threads and not tokio: stepping is CPU-bound and never waits on
//! I/O, so a scheduler would only add overhead; the rollout pipeline can
//! still drive a pool from async code with `spawn_blocking`.
//!
//! **Autoreset (next-step, as Gymnasium's default).** With `autoreset` on, a
//! `step` on an env whose episode has ended (done, or failed) does not step:
//! it resets the env and returns the new first observation with reward 0,
//! `done` false and `autoreset` set to the new seed; the action is ignored.
//! The new seed is [`next_seed`] of the previous one, so the schedule is
//! deterministic. With `autoreset` off, such a step is an `EpisodeOver`
//! failure and the caller resets explicitly.
//!
//! **Failures.** Every env gets a result for every call: `Ok` or an
//! [`EnvFailure`] naming the plugin, the env and the seed. A fault (trap,
//! timeout, memory cap) fails that env's episode and replaces its instance;
//! the other envs in that instance are restored by replay and keep going.
//! Invalid output (a NaN reward, an oversized observation) fails the
//! episode but keeps the instance.
//!
//! **Batched calls.** When the plugin exports the contract's `batch`
//! interface, each instance's share of a call crosses the sandbox once for
//! its resets and once for its steps instead of once per env; faults still
//! stay with the env that caused them (see the `shard` module).

use crate::bindings::ragen::env::types::{Action, ErrorKind, StepInfo};
use crate::plugin::Plugin;
use crate::sandbox::FaultKind;
use crate::shard::Shard;
use anyhow::{Context, Result, bail};
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

pub use crate::shard::next_seed;

/// How to lay out a pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub num_envs: usize,
    /// Worker threads; default: the machine's available parallelism.
    pub threads: usize,
    /// Envs per plugin instance. More share one instance's memory (less
    /// resident memory); fewer mean less replay when an instance faults.
    pub envs_per_instance: usize,
    /// Settings every env is created with.
    pub settings: Vec<(String, String)>,
    pub autoreset: bool,
    /// Use the plugin's batched calls when it exports them (one crossing
    /// of the sandbox per instance per call instead of one per env). Off
    /// gives exactly the same results, one call per env.
    pub batched: bool,
}

impl PoolConfig {
    pub fn new(num_envs: usize) -> Self {
        Self {
            num_envs,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            envs_per_instance: 64,
            settings: Vec::new(),
            autoreset: true,
            batched: true,
        }
    }
}

/// The outcome of one env's `step` (or of an autoreset in its place).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStep {
    pub observation: String,
    pub reward: f64,
    pub done: bool,
    pub info: StepInfo,
    /// `Some(seed)` when this call reset the env instead of stepping it.
    pub autoreset: Option<u64>,
}

impl PoolStep {
    pub(crate) fn from_result(r: crate::StepResult) -> Self {
        Self { observation: r.observation, reward: r.reward, done: r.done, info: r.info, autoreset: None }
    }

    pub(crate) fn autoreset(observation: String, seed: u64) -> Self {
        let info = StepInfo { success: false, action_is_valid: true, action_is_effective: false, metrics: vec![] };
        Self { observation, reward: 0.0, done: false, info, autoreset: Some(seed) }
    }
}

/// What went wrong with one env.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The instance trapped, timed out or hit its memory cap; it was replaced.
    Fault(FaultKind),
    /// The plugin returned something the contract forbids (NaN reward,
    /// observation over the cap).
    InvalidOutput,
    /// The plugin (or the pool, for the episode rules) reported an error.
    Env(ErrorKind),
    /// A remote env's server could not be reached, closed the connection,
    /// or did not answer within its deadline: the episode is lost, and the
    /// env reconnects at its next reset.
    Lost,
}

/// One env's failed call. The episode it belonged to is over.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvFailure {
    /// The plugin's file (or label).
    pub plugin: String,
    pub env: usize,
    /// The seed of the failed episode, when there was one.
    pub seed: Option<u64>,
    pub kind: FailureKind,
    pub message: String,
}

impl fmt::Display for EnvFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin `{}`, env {}", self.plugin, self.env)?;
        if let Some(seed) = self.seed {
            write!(f, ", seed {seed}")?;
        }
        write!(f, ": {}: {}", self.kind_name(), self.message)
    }
}

impl EnvFailure {
    /// The kind as one word or two for reports: `trap`, `timeout`,
    /// `memory-cap`, `contract`, `invalid output`, `lost` (a remote env's
    /// server), or the env error's kind.
    pub fn kind_name(&self) -> String {
        match self.kind {
            FailureKind::Fault(k) => k.as_str().to_string(),
            FailureKind::InvalidOutput => "invalid output".into(),
            FailureKind::Env(k) => format!("{k:?}"),
            FailureKind::Lost => "lost".into(),
        }
    }
}

impl std::error::Error for EnvFailure {}

/// What the pool did to keep going after a plugin's faults, since it
/// started. Recovery is exact (replays land in the same states, a faulted
/// batch is run again call by call), so results stay right; but each one
/// costs time, and a plugin that needs them should be seen, not hidden:
/// `bench`, `eval` and `train` report these.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Recoveries {
    /// Instances replaced after a fault.
    pub rebuilt_instances: usize,
    /// Batched calls that faulted (a trap, a timeout, a short result) and
    /// were run again one call per env.
    pub batch_faults: usize,
    /// Instances whose batching was turned off because a batch ran out of
    /// time or returned a result count other than its envs' (the plugin's
    /// batched calls are broken): from then on they make one call per env.
    pub batching_off: usize,
    /// Running episodes of other envs replayed into a new instance.
    pub replayed_episodes: usize,
    /// The first recovery's cause, quoted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

impl Recoveries {
    /// Whether anything was recovered.
    pub fn any(&self) -> bool {
        self.rebuilt_instances + self.batch_faults + self.batching_off > 0
    }

    /// Add `other`'s counts; the first cause stays the earliest seen.
    pub fn add(&mut self, other: &Recoveries) {
        self.rebuilt_instances += other.rebuilt_instances;
        self.batch_faults += other.batch_faults;
        self.batching_off += other.batching_off;
        self.replayed_episodes += other.replayed_episodes;
        if self.first.is_none() {
            self.first.clone_from(&other.first);
        }
    }

    /// What changed since `earlier` (counts only; the first cause is this one's).
    pub fn since(&self, earlier: &Recoveries) -> Recoveries {
        Recoveries {
            rebuilt_instances: self.rebuilt_instances - earlier.rebuilt_instances,
            batch_faults: self.batch_faults - earlier.batch_faults,
            batching_off: self.batching_off - earlier.batching_off,
            replayed_episodes: self.replayed_episodes - earlier.replayed_episodes,
            first: self.first.clone(),
        }
    }
}

impl fmt::Display for Recoveries {
    /// `2 instances rebuilt, 1 batched call run again call by call, 14
    /// episodes replayed; batching turned off on 1 instance; the
    /// first: ...`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.any() {
            return write!(f, "none");
        }
        let count = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        write!(
            f,
            "{} rebuilt, {} again call by call, {} replayed",
            count(self.rebuilt_instances, "instance", "instances"),
            count(self.batch_faults, "batched call run", "batched calls run"),
            count(self.replayed_episodes, "episode", "episodes"),
        )?;
        if self.batching_off > 0 {
            write!(f, "; batching turned off on {}", count(self.batching_off, "instance", "instances"))?;
        }
        if let Some(first) = &self.first {
            write!(f, "; the first: {first}")?;
        }
        Ok(())
    }
}

/// Pool-wide counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub envs: usize,
    pub instances: usize,
    /// What the pool did to recover from faults since it started.
    pub recoveries: Recoveries,
    /// Linear memory held by all instances, in bytes.
    pub memory_bytes: usize,
    /// Instances whose envs are reset and stepped through the plugin's
    /// batched calls (the rest make one call per env).
    pub batched_instances: usize,
}

pub(crate) enum Call {
    Reset(u64),
    Step(Action),
}

/// Each item's position in the caller's batch and its answer.
type Reply<T> = Vec<(usize, Result<T, EnvFailure>)>;

enum Job {
    /// (position in the caller's batch, worker-local env index, call)
    Run(Vec<(usize, usize, Call)>, Sender<Reply<PoolStep>>),
    /// (position, worker-local env index, most actions wanted)
    Oracle(Vec<(usize, usize, u32)>, Sender<Reply<Vec<Action>>>),
    Stats(Sender<PoolStats>),
}

struct Worker {
    jobs: Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

/// A batch of envs from one plugin. See the module docs for the semantics.
///
/// # Examples
///
/// Eight Bandit envs on two threads, reset and stepped in one call each.
/// A failed env is an `Err` in its own slot; the others go on.
///
/// ```
/// use ragen_runtime::{EnvPool, Plugin, PoolConfig};
/// use std::sync::Arc;
///
/// # let path = ragen_test_fixtures::plugin("bandit"); // `make plugins`
/// let plugin = Arc::new(Plugin::from_file(&path)?);
/// let pool = EnvPool::new(plugin, &PoolConfig { threads: 2, ..PoolConfig::new(8) })?;
/// let seeds: Vec<u64> = (0..8).collect();
/// for first in pool.reset_all(&seeds)? {
///     assert!(!first?.is_empty());
/// }
/// // Bandit is one pull: every env's episode ends at its first step.
/// for step in pool.step_all(&[0; 8])? {
///     assert!(step?.done);
/// }
/// # Ok::<(), anyhow::Error>(())
/// ```
pub struct EnvPool {
    workers: Vec<Worker>,
    num_envs: usize,
}

impl EnvPool {
    /// Create `config.num_envs` envs across `config.threads` workers. Fails if
    /// the plugin rejects the settings or cannot be instantiated.
    pub fn new(plugin: Arc<Plugin>, config: &PoolConfig) -> Result<Self> {
        if config.num_envs == 0 {
            bail!("a pool needs at least one env");
        }
        let threads = config.threads.clamp(1, config.num_envs);
        let per_instance = config.envs_per_instance.max(1);
        let settings = Arc::new(config.settings.clone());
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let mut workers = Vec::with_capacity(threads);
        for w in 0..threads {
            let ids: Vec<usize> = (w..config.num_envs).step_by(threads).collect();
            let (tx, rx) = mpsc::channel();
            let (plugin, settings, ready) = (plugin.clone(), settings.clone(), ready_tx.clone());
            let (autoreset, batched) = (config.autoreset, config.batched);
            let thread = std::thread::Builder::new()
                .name(format!("ragen-pool-{w}"))
                .spawn(move || {
                    let shards: Result<Vec<Shard>> =
                        ids.chunks(per_instance).map(|chunk| Shard::new(plugin.clone(), settings.clone(), chunk, batched)).collect();
                    match shards {
                        Ok(shards) => {
                            let _ = ready.send(Ok(()));
                            run_worker(shards, per_instance, autoreset, rx);
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                        }
                    }
                })
                .context("cannot spawn a pool worker thread")?;
            workers.push(Worker { jobs: tx, thread: Some(thread) });
        }
        drop(ready_tx);
        let pool = Self { workers, num_envs: config.num_envs };
        for _ in 0..threads {
            ready_rx.recv().context("a pool worker died while starting")??;
        }
        Ok(pool)
    }

    pub fn num_envs(&self) -> usize {
        self.num_envs
    }

    /// Reset `env_ids[i]` with `seeds[i]`; returns each first observation, in
    /// the order given.
    pub fn reset(&self, env_ids: &[usize], seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>> {
        if env_ids.len() != seeds.len() {
            bail!("reset: {} env ids but {} seeds", env_ids.len(), seeds.len());
        }
        let calls = env_ids.iter().zip(seeds).map(|(&id, &seed)| (id, Call::Reset(seed))).collect();
        Ok(self.run(calls)?.into_iter().map(|r| r.map(|s| s.observation)).collect())
    }

    /// Step `env_ids[i]` with `actions[i]`, in the order given. Actions are
    /// ids (`u32`) or [`Action`]s (ids or text).
    pub fn step<A: Clone + Into<Action>>(&self, env_ids: &[usize], actions: &[A]) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        if env_ids.len() != actions.len() {
            bail!("step: {} env ids but {} actions", env_ids.len(), actions.len());
        }
        let calls = env_ids.iter().zip(actions).map(|(&id, a)| (id, Call::Step(a.clone().into()))).collect();
        self.run(calls)
    }

    /// Reset every env; env `i` gets `seeds[i]`.
    pub fn reset_all(&self, seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>> {
        let ids: Vec<usize> = (0..self.num_envs).collect();
        self.reset(&ids, seeds)
    }

    /// Step every env; env `i` takes `actions[i]`.
    pub fn step_all<A: Clone + Into<Action>>(&self, actions: &[A]) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        let ids: Vec<usize> = (0..self.num_envs).collect();
        self.step(&ids, actions)
    }

    pub fn stats(&self) -> Result<PoolStats> {
        let mut total = PoolStats::default();
        for w in &self.workers {
            let (tx, rx) = mpsc::channel();
            w.jobs.send(Job::Stats(tx)).ok().context("a pool worker has died")?;
            let s = rx.recv().context("a pool worker has died")?;
            total.envs += s.envs;
            total.instances += s.instances;
            total.recoveries.add(&s.recoveries);
            total.memory_bytes += s.memory_bytes;
            total.batched_instances += s.batched_instances;
        }
        Ok(total)
    }

    /// The oracle's next actions for `env_ids[i]`, at most `max_actions[i]`
    /// of them, in the order given: the env's own best play (the contract's
    /// optional `oracle`; see [`Plugin::has_oracle`]). The state does not
    /// change. An answer the action space does not allow (an empty plan, an
    /// id past the names, text over the limit, more actions than asked)
    /// fails the episode as invalid output; a plugin without an oracle
    /// fails it as a `failed` env error.
    pub fn oracle(&self, env_ids: &[usize], max_actions: &[u32]) -> Result<Vec<Result<Vec<Action>, EnvFailure>>> {
        if env_ids.len() != max_actions.len() {
            bail!("oracle: {} env ids but {} action counts", env_ids.len(), max_actions.len());
        }
        self.scatter(env_ids.iter().copied().zip(max_actions.iter().copied()).collect(), Job::Oracle)
    }

    fn run(&self, calls: Vec<(usize, Call)>) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        self.scatter(calls, Job::Run)
    }

    /// Send each call to the worker that owns its env, as one job per
    /// worker, and gather the answers in the caller's order.
    fn scatter<C, T>(
        &self,
        calls: Vec<(usize, C)>,
        job: impl Fn(Vec<(usize, usize, C)>, Sender<Reply<T>>) -> Job,
    ) -> Result<Vec<Result<T, EnvFailure>>> {
        let threads = self.workers.len();
        let n = calls.len();
        let mut per_worker: Vec<Vec<(usize, usize, C)>> = (0..threads).map(|_| Vec::new()).collect();
        for (pos, (id, call)) in calls.into_iter().enumerate() {
            if id >= self.num_envs {
                bail!("env id {id} is out of range; the pool has {} envs", self.num_envs);
            }
            per_worker[id % threads].push((pos, id / threads, call));
        }
        let (tx, rx): (Sender<Reply<T>>, Receiver<Reply<T>>) = mpsc::channel();
        let mut pending = 0;
        for (w, batch) in per_worker.into_iter().enumerate() {
            if !batch.is_empty() {
                self.workers[w].jobs.send(job(batch, tx.clone())).ok().context("a pool worker has died")?;
                pending += 1;
            }
        }
        drop(tx);
        let mut out: Vec<Option<Result<T, EnvFailure>>> = (0..n).map(|_| None).collect();
        for _ in 0..pending {
            for (pos, r) in rx.recv().context("a pool worker died mid-batch")? {
                out[pos] = Some(r);
            }
        }
        Ok(out.into_iter().map(|r| r.expect("every call gets a reply")).collect())
    }
}

fn run_worker(mut shards: Vec<Shard>, per_instance: usize, autoreset: bool, jobs: Receiver<Job>) {
    let envs: usize = shards.iter().map(|s| s.len()).sum();
    for job in jobs {
        match job {
            Job::Run(calls, reply) => {
                // Group by instance, so each can batch its envs' calls.
                let mut per_shard: Vec<Vec<(usize, usize, Call)>> = (0..shards.len()).map(|_| Vec::new()).collect();
                let n = calls.len();
                for (pos, local, call) in calls {
                    per_shard[local / per_instance].push((pos, local % per_instance, call));
                }
                let mut results = Vec::with_capacity(n);
                for (shard, calls) in shards.iter_mut().zip(per_shard) {
                    if !calls.is_empty() {
                        results.extend(shard.run(calls, autoreset));
                    }
                }
                let _ = reply.send(results);
            }
            Job::Oracle(calls, reply) => {
                let answers = calls
                    .into_iter()
                    .map(|(pos, local, max_actions)| (pos, shards[local / per_instance].oracle(local % per_instance, max_actions)))
                    .collect();
                let _ = reply.send(answers);
            }
            Job::Stats(reply) => {
                let _ = reply.send(PoolStats {
                    envs,
                    instances: shards.len(),
                    recoveries: shards.iter().fold(Recoveries::default(), |mut all, s| {
                        all.add(&s.recoveries);
                        all
                    }),
                    memory_bytes: shards.iter().map(|s| s.memory_bytes()).sum(),
                    batched_instances: shards.iter().filter(|s| s.batched()).count(),
                });
            }
        }
    }
}

impl Drop for EnvPool {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Closing the channel ends the worker's loop.
            let (dead, _) = mpsc::channel();
            drop(std::mem::replace(&mut w.jobs, dead));
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}
