//! The one thread that drives the pool: sessions hand it resets and steps,
//! it gathers whatever is waiting into one batch and makes one pool call
//! for the resets and one for the steps.
//!
//! Why a thread and a batch: the pool steps many envs per call across its
//! worker threads, and with a thousand sessions a thousand steps arrive
//! within a millisecond of each other. Gathering them costs nothing when
//! one request is waiting (it goes alone, at once) and turns a burst into
//! one crossing per plugin instance. The async runtime only waits for the
//! reply, so plugin code never runs on it.

use crate::metrics::Metrics;
use ragen_runtime::{Action, EnvFailure, EnvPool, PoolStep, StepInfo};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use tokio::sync::oneshot;

/// What a session asks of its env.
#[derive(Clone, Debug)]
pub enum Work {
    Reset(u64),
    Step(Action),
}

/// Why a call has no result.
#[derive(Clone, Debug)]
pub enum CallError {
    /// The env failed (a fault, invalid output, an env error); its episode is over.
    Env(EnvFailure),
    /// The pool itself is gone (a worker thread died); the server cannot go on.
    Pool(String),
}

type Reply = Result<PoolStep, CallError>;

/// One env's work, and where its answer goes: alone, or as item `usize`
/// of a batch's answer.
struct Job {
    slot: usize,
    work: Work,
    reply: ReplyTo,
}

enum ReplyTo {
    One(oneshot::Sender<Reply>),
    Many(Arc<ManyReplies>, usize),
}

/// A batch's answers, sent back in one message when the last one is in:
/// the answers so far, how many are still due, and where they all go.
type ManyReplies = std::sync::Mutex<(Vec<Option<Reply>>, usize, Option<oneshot::Sender<Vec<Reply>>>)>;

impl ReplyTo {
    fn send(self, reply: Reply) {
        match self {
            // A session that went away meanwhile no longer wants its reply.
            Self::One(tx) => {
                let _ = tx.send(reply);
            }
            Self::Many(many, i) => {
                let mut many = many.lock().unwrap_or_else(|e| e.into_inner());
                let (answers, due, done) = &mut *many;
                answers[i] = Some(reply);
                *due -= 1;
                if *due == 0
                    && let Some(tx) = done.take()
                {
                    let _ = tx.send(answers.iter_mut().map(|a| a.take().expect("every item answered")).collect());
                }
            }
        }
    }
}

/// A handle to the stepping thread; cheap to share.
#[derive(Clone)]
pub struct Stepper {
    jobs: Sender<Job>,
}

impl Stepper {
    /// Start the thread that owns `pool`. It ends when every handle is dropped.
    pub fn start(pool: EnvPool, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel();
        std::thread::Builder::new().name("ragen-serve-stepper".into()).spawn(move || run(pool, rx, &metrics))?;
        Ok(Self { jobs })
    }

    /// Run `work` on the env in `slot` and wait for it. A reset's result is
    /// its first observation with reward 0 and `done` false.
    pub async fn call(&self, slot: usize, work: Work) -> Reply {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { slot, work, reply: ReplyTo::One(reply) })
            .map_err(|_| CallError::Pool("the stepping thread has stopped".into()))?;
        answer.await.map_err(|_| CallError::Pool("the stepping thread dropped a call".into()))?
    }

    /// Run every `(slot, work)` and wait for all of them; the answers in
    /// order.
    pub async fn call_many(&self, calls: Vec<(usize, Work)>) -> Vec<Reply> {
        let n = calls.len();
        if n == 0 {
            return Vec::new();
        }
        let (tx, rx) = oneshot::channel();
        let many = Arc::new(std::sync::Mutex::new(((0..n).map(|_| None).collect(), n, Some(tx))));
        for (i, (slot, work)) in calls.into_iter().enumerate() {
            if self.jobs.send(Job { slot, work, reply: ReplyTo::Many(many.clone(), i) }).is_err() {
                return (0..n).map(|_| Err(CallError::Pool("the stepping thread has stopped".into()))).collect();
            }
        }
        drop(many);
        rx.await.unwrap_or_else(|_| (0..n).map(|_| Err(CallError::Pool("the stepping thread dropped a call".into()))).collect())
    }
}

/// Most calls gathered into one batch: enough to fill every instance of a
/// large pool, few enough that the first in line does not wait long.
const MAX_BATCH: usize = 4096;

/// How often the pool's recovery counts are read when no call failed (a
/// batch that ran out of time recovers without failing any env).
const RECOVERY_POLL: std::time::Duration = std::time::Duration::from_secs(1);

fn run(pool: EnvPool, rx: Receiver<Job>, metrics: &Metrics) {
    let mut recovered = ragen_runtime::Recoveries::default();
    let mut polled = std::time::Instant::now();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        metrics.batch_size.observe(batch.len() as f64);
        let (resets, steps): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|j| matches!(j.work, Work::Reset(_)));
        let mut answers = Vec::with_capacity(2);
        if !resets.is_empty() {
            let ids: Vec<usize> = resets.iter().map(|j| j.slot).collect();
            let seeds: Vec<u64> = resets.iter().map(|j| if let Work::Reset(s) = j.work { s } else { unreachable!() }).collect();
            let results = pool.reset(&ids, &seeds).map(|r| r.into_iter().map(|o| o.map(first_step)).collect());
            answers.push((resets, results));
        }
        if !steps.is_empty() {
            let ids: Vec<usize> = steps.iter().map(|j| j.slot).collect();
            let actions: Vec<Action> = steps.iter().map(|j| if let Work::Step(a) = &j.work { a.clone() } else { unreachable!() }).collect();
            answers.push((steps, pool.step(&ids, &actions)));
        }
        // Recoveries into /metrics, before the answers go out (so a client
        // that saw a fault finds it counted): after a failure (faults are
        // what the pool recovers from), and at least once a second.
        let failed = answers.iter().any(|(_, r)| r.as_ref().map_or(true, |r| r.iter().any(Result::is_err)));
        if (failed || polled.elapsed() >= RECOVERY_POLL)
            && let Ok(stats) = pool.stats()
        {
            metrics.recovered(&stats.recoveries, &recovered);
            recovered = stats.recoveries;
            polled = std::time::Instant::now();
        }
        for (jobs, results) in answers {
            answer(jobs, results);
        }
    }
}

fn first_step(observation: String) -> PoolStep {
    let info = StepInfo { success: false, action_is_valid: true, action_is_effective: false, metrics: vec![] };
    PoolStep { observation, reward: 0.0, done: false, info, autoreset: None }
}

fn answer(jobs: Vec<Job>, results: anyhow::Result<Vec<Result<PoolStep, EnvFailure>>>) {
    match results {
        Ok(results) => {
            for (job, result) in jobs.into_iter().zip(results) {
                job.reply.send(result.map_err(CallError::Env));
            }
        }
        Err(e) => {
            let message = format!("{e:#}");
            for job in jobs {
                job.reply.send(Err(CallError::Pool(message.clone())));
            }
        }
    }
}
