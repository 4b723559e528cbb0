//! Sessions: each holds one env of the pool (a slot) and the state of the
//! episode it is playing.
//!
//! The pool is created once with one env per allowed session; opening a
//! session takes a free slot and closing it (dropping its [`Slot`]) gives
//! the slot back. A session sends one request at a time, so an env never
//! has two calls in flight.

use crate::metrics::Metrics;
use crate::protocol::{ErrorCode, ProtocolError, ResetArgs};
use crate::stepper::{CallError, Stepper, Work};
use ragen_runtime::{Action, PoolStep};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The free env slots of the pool.
pub struct Slots {
    free: Mutex<Vec<usize>>,
    capacity: usize,
}

impl Slots {
    pub fn new(capacity: usize) -> Arc<Self> {
        // Reversed, so that slots are handed out from 0 up.
        Arc::new(Self { free: Mutex::new((0..capacity).rev().collect()), capacity })
    }

    /// A free slot, or `None` at capacity.
    pub fn take(self: &Arc<Self>) -> Option<Slot> {
        let id = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        Some(Slot { id, slots: self.clone() })
    }

    /// `n` free slots, or `None` (taking none) when fewer are free.
    pub fn take_many(self: &Arc<Self>, n: usize) -> Option<Vec<Slot>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        Some(free.drain(at..).rev().map(|id| Slot { id, slots: self.clone() }).collect())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots in use now.
    pub fn in_use(&self) -> usize {
        self.capacity - self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One env of the pool, held by one session; returned when dropped.
pub struct Slot {
    id: usize,
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.free.lock().unwrap_or_else(|e| e.into_inner()).push(self.id);
    }
}

/// Server-wide counters for what a client leaves out: the next seed and
/// the next episode id.
pub struct Counters {
    seed: AtomicU64,
    episode: AtomicU64,
}

impl Counters {
    pub fn new(seed_start: u64) -> Self {
        Self { seed: AtomicU64::new(seed_start), episode: AtomicU64::new(0) }
    }
}

/// The episode a session is playing.
#[derive(Clone, Debug, Default)]
struct Episode {
    id: Option<String>,
    seed: Option<u64>,
    steps: u64,
    done: bool,
    success: bool,
    total_reward: f64,
    /// Why it ended early, when an env failure ended it.
    failure: Option<String>,
}

/// One call of a batched frame.
pub enum EnvRequest {
    Reset(ResetArgs),
    Step(Action),
}

/// A session: a slot and its episode.
pub struct Session {
    slot: Slot,
    episode: Episode,
}

/// What sessions share: the stepping thread, the slots, the counters and
/// the metrics.
pub struct Envs {
    pub stepper: Stepper,
    pub slots: Arc<Slots>,
    pub counters: Counters,
    pub metrics: Arc<Metrics>,
}

impl Session {
    pub fn new(slot: Slot) -> Self {
        Self { slot, episode: Episode::default() }
    }

    /// Start a new episode.
    pub async fn reset(&mut self, envs: &Envs, args: ResetArgs) -> Result<PoolStep, ProtocolError> {
        let work = self.start_reset(envs, args);
        let result = envs.stepper.call(self.slot.id, work).await;
        self.finish_reset(envs, result)
    }

    /// Take one action in the current episode.
    pub async fn step(&mut self, envs: &Envs, action: Action) -> Result<PoolStep, ProtocolError> {
        let work = self.start_step(action)?;
        let start = Instant::now();
        let result = envs.stepper.call(self.slot.id, work).await;
        self.finish_step(envs, result, start)
    }

    /// A batched session's calls: all handed to the stepping thread at
    /// once and answered together (one wake-up of this task, not one
    /// future per env), each answer booked as [`reset`](Self::reset) and
    /// [`step`](Self::step) book theirs.
    pub async fn call_many(envs: &Envs, calls: Vec<(&mut Session, EnvRequest)>) -> Vec<Result<PoolStep, ProtocolError>> {
        let mut out: Vec<Option<Result<PoolStep, ProtocolError>>> = Vec::with_capacity(calls.len());
        let mut jobs = Vec::new();
        let mut pending = Vec::new();
        for (pos, (session, request)) in calls.into_iter().enumerate() {
            let work = match request {
                EnvRequest::Reset(args) => Ok(session.start_reset(envs, args)),
                EnvRequest::Step(action) => session.start_step(action),
            };
            match work {
                Ok(work) => {
                    let reset = matches!(work, Work::Reset(_));
                    jobs.push((session.slot.id, work));
                    pending.push((pos, session, reset));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let start = Instant::now();
        let results = envs.stepper.call_many(jobs).await;
        for ((pos, session, reset), result) in pending.into_iter().zip(results) {
            out[pos] = Some(match reset {
                true => session.finish_reset(envs, result),
                false => session.finish_step(envs, result, start),
            });
        }
        out.into_iter().map(|o| o.expect("every call answered")).collect()
    }

    fn start_reset(&mut self, envs: &Envs, args: ResetArgs) -> Work {
        let seed = args.seed.unwrap_or_else(|| envs.counters.seed.fetch_add(1, Ordering::Relaxed));
        let id = args.episode_id.unwrap_or_else(|| format!("episode-{}", envs.counters.episode.fetch_add(1, Ordering::Relaxed)));
        self.episode = Episode { id: Some(id), seed: Some(seed), ..Episode::default() };
        envs.metrics.resets.inc();
        Work::Reset(seed)
    }

    fn finish_reset(&mut self, envs: &Envs, result: Result<PoolStep, CallError>) -> Result<PoolStep, ProtocolError> {
        result.map_err(|e| self.fail(envs, e))
    }

    /// The step's work, or why the episode cannot take it.
    fn start_step(&self, action: Action) -> Result<Work, ProtocolError> {
        let ep = &self.episode;
        if ep.seed.is_none() {
            return Err(ProtocolError::new(ErrorCode::ExecutionError, "no episode yet: send reset first"));
        }
        if let Some(failure) = &ep.failure {
            return Err(ProtocolError::new(ErrorCode::ExecutionError, format!("the episode ended with an error ({failure}); send reset")));
        }
        if ep.done {
            return Err(ProtocolError::new(ErrorCode::ExecutionError, "the episode is over: send reset to start another"));
        }
        Ok(Work::Step(action))
    }

    fn finish_step(&mut self, envs: &Envs, result: Result<PoolStep, CallError>, start: Instant) -> Result<PoolStep, ProtocolError> {
        envs.metrics.steps.inc();
        envs.metrics.step_latency.observe(start.elapsed().as_secs_f64());
        match result {
            Ok(step) => {
                let ep = &mut self.episode;
                ep.steps += 1;
                ep.done = step.done;
                ep.success |= step.info.success;
                ep.total_reward += step.reward;
                Ok(step)
            }
            Err(e) => Err(self.fail(envs, e)),
        }
    }

    /// The episode so far, as `state` answers it.
    pub fn state(&self) -> Value {
        let ep = &self.episode;
        json!({
            "episode_id": ep.id,
            "step_count": ep.steps,
            "seed": ep.seed,
            "done": ep.done || ep.failure.is_some(),
            "success": ep.success,
            "total_reward": ep.total_reward,
            "error": ep.failure,
        })
    }

    /// End the episode with the failure, and say so in the error.
    fn fail(&mut self, envs: &Envs, error: CallError) -> ProtocolError {
        let message = match error {
            CallError::Env(failure) => {
                envs.metrics.fault(&failure.kind_name());
                let message = failure.to_string();
                self.episode.failure = Some(failure.kind_name());
                format!("{message}; the episode is over, send reset to start another")
            }
            CallError::Pool(message) => {
                envs.metrics.fault("server");
                self.episode.failure = Some("server error".into());
                format!("server error: {message}")
            }
        };
        ProtocolError::new(ErrorCode::ExecutionError, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_when_a_session_ends() {
        let slots = Slots::new(2);
        let a = slots.take().unwrap();
        let b = slots.take().unwrap();
        assert_eq!((a.id, b.id), (0, 1));
        assert!(slots.take().is_none(), "two slots, both taken");
        assert_eq!(slots.in_use(), 2);
        drop(a);
        assert_eq!(slots.take().map(|s| s.id), Some(0));
    }
}
