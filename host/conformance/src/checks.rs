//! The checks that play the plugin, in the order they run after
//! `metadata`. Each starts from a fresh instance and says what to fix.

use crate::Outcome;
use crate::validator::{Validator, faulted, short};
use ragen_rng::SeedRng;
use ragen_runtime::{Action, EnvHandle, ErrorKind, PluginInstance};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Below these a plugin is too slow to train on.
const MIN_RESETS_PER_SEC: f64 = 10.0;
const MIN_STEPS_PER_SEC: f64 = 100.0;

/// One check: its name in the report, and how it runs.
pub(crate) type Run<'v> = (&'static str, fn(&Validator<'v>) -> Result<Outcome, String>);

/// The checks after `metadata`, in order.
pub(crate) fn runs<'v>() -> [Run<'v>; 9] {
    [
        ("determinism", Validator::determinism),
        ("seeds differ", Validator::seeds_differ),
        ("finite", Validator::finite),
        ("bad config", Validator::bad_config),
        ("bad action", Validator::bad_action),
        ("episode rules", Validator::episode_rules),
        ("batch", Validator::batch),
        ("oracle", Validator::oracle),
        ("speed", Validator::speed),
    ]
}

impl Validator<'_> {
    fn determinism(&self) -> Result<Outcome, String> {
        let (mut a, ea) = self.env()?;
        let (mut b, eb) = self.env()?;
        let mut steps = 0;
        for seed in 0..self.seeds {
            let (first_a, run_a, _) = self.episode(&mut a, ea, seed)?;
            let (first_b, run_b, _) = self.episode(&mut b, eb, seed)?;
            if first_a != first_b {
                return Err(format!("seed {seed}: two resets gave different states (fix: draw randomness only from the seed)"));
            }
            if let Some(t) = run_a.iter().zip(&run_b).position(|(x, y)| x != y).or((run_a.len() != run_b.len()).then_some(0)) {
                return Err(format!(
                    "seed {seed}, step {t}: two runs with the same actions differ (fix: draw randomness only from the seed)"
                ));
            }
            steps += run_a.len();
        }
        self.no_hidden_state()?;
        Ok(Outcome::Pass(format!(
            "{} seeds replayed identically in two instances ({steps} steps); no state kept across resets",
            self.seeds
        )))
    }

    /// Two fresh instances see the same calls in the same order, so state
    /// kept across resets (a counter, a cache) passes the replay above. Here
    /// one instance resets seed 0, then other seeds, then seed 0 again, and
    /// a second env of the same instance resets seed 0 too: all three first
    /// states must agree.
    fn no_hidden_state(&self) -> Result<(), String> {
        let (mut inst, env) = self.env()?;
        let first = self.reset(&mut inst, env, 0)?;
        for other in 1..4 {
            self.reset(&mut inst, env, other)?;
        }
        let again = self.reset(&mut inst, env, 0)?;
        let twin = self.create(&mut inst)?;
        let beside = self.reset(&mut inst, twin, 0)?;
        if again != first || beside != first {
            return Err("seed 0 started in another state when reset again after other seeds, or in a second env of the same instance \
                 (fix: keep no state across resets or between envs; derive everything from the seed)"
                .into());
        }
        Ok(())
    }

    /// Different seeds must give different episodes. Not necessarily
    /// different first observations: a game with hidden state (a secret
    /// number) may show the same start, and differs only once the
    /// agent acts. So each seed plays the same actions and whole episodes
    /// are compared.
    fn seeds_differ(&self) -> Result<Outcome, String> {
        let (mut inst, env) = self.env()?;
        let (mut starts, mut episodes) = (HashSet::new(), HashSet::new());
        for seed in 0..self.seeds {
            let (first, records, _) = self.episode_with(&mut inst, env, seed, 0x5eed)?;
            let replay: Vec<(String, u64)> = records.iter().map(|r| (r.observation.clone(), r.reward_bits)).collect();
            starts.insert(first.clone());
            episodes.insert((first, replay));
        }
        if episodes.len() < 2 {
            return Err(format!(
                "all {} seeds played the same episode under the same actions (fix: derive the initial state, or the hidden state, from the seed)",
                self.seeds
            ));
        }
        Ok(Outcome::Pass(format!(
            "{} distinct episodes ({} distinct initial states) from {} seeds",
            episodes.len(),
            starts.len(),
            self.seeds
        )))
    }

    fn finite(&self) -> Result<Outcome, String> {
        let (mut inst, env) = self.env()?;
        let mut count = 0;
        let cap = self.plugin.limits().max_observation_bytes;
        for seed in 0..self.seeds {
            let (first, records, numbers) = self.episode(&mut inst, env, seed)?;
            if let Some(x) = numbers.iter().find(|x| !x.is_finite()) {
                return Err(format!("seed {seed}: a reward or metric is {x} (fix: rewards and metrics must be finite numbers)"));
            }
            let max = self.plugin.limits().report.max_abs_reward;
            if let Some(x) = numbers.iter().find(|x| x.abs() > max) {
                return Err(format!(
                    "seed {seed}: a reward or metric is {x:e}, an absurd magnitude (over ±{max:e}; sums of such overflow): scale it down"
                ));
            }
            if let Some(big) = std::iter::once(&first).chain(records.iter().map(|r| &r.observation)).find(|o| o.len() > cap) {
                return Err(format!("seed {seed}: an observation of {} bytes exceeds the cap of {cap} bytes", big.len()));
            }
            count += numbers.len();
        }
        Ok(Outcome::Pass(format!("{count} rewards and metrics, all finite; observations within {cap} bytes")))
    }

    fn bad_config(&self) -> Result<Outcome, String> {
        let mut inst = self.fresh()?;
        let info = inst.info().map_err(|f| faulted("info", &f))?;
        let unknown = [("ragen-validate-unknown-key".to_string(), "1".to_string())];
        match inst.create(&unknown).map_err(|f| faulted("create with an unknown key", &f))? {
            Err(e) if e.kind == ErrorKind::UnknownKey => {}
            Err(e) => return Err(format!("an unknown key gave a {:?} error; it should be unknown-key ({})", e.kind, e.message)),
            Ok(_) => return Err("an unknown config key was accepted (fix: reject keys you do not declare)".into()),
        }
        let mut rejected = 0;
        for key in &info.config_keys {
            for garbage in ["", "-1", "NaN", "not a value \u{1}"] {
                let settings = [(key.name.clone(), garbage.to_string())];
                match inst.create(&settings) {
                    Err(f) => return Err(faulted(&format!("create with {}={garbage:?}", key.name), &f)),
                    Ok(Err(_)) => rejected += 1,
                    Ok(Ok(env)) => inst.drop_env(env).map_err(|f| faulted("drop", &f))?,
                }
            }
        }
        Ok(Outcome::Pass(format!("unknown key rejected; {rejected} malformed values rejected without trapping")))
    }

    fn bad_action(&self) -> Result<Outcome, String> {
        let (mut inst, env) = self.env()?;
        let bad = self.bad_actions();
        let shown: Vec<String> = bad.iter().map(short).collect();
        for (action, shown) in bad.into_iter().zip(&shown) {
            // Each try on a fresh episode: an env that wrongly accepts one
            // must not make the next look like a step after the end.
            inst.reset(env, 0).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset(0) failed: {}", e.message))?;
            match inst.step(env, action).map_err(|f| faulted(&format!("step with action {shown}"), &f))? {
                Err(e) if e.kind == ErrorKind::BadAction => {}
                Err(e) => return Err(format!("action {shown} gave a {:?} error; it should be bad-action", e.kind)),
                Ok(_) => return Err(format!("action {shown} (outside the action space) was accepted (fix: return a bad-action error)")),
            }
        }
        Ok(Outcome::Pass(format!("{} rejected with bad-action", shown.join(", "))))
    }

    fn episode_rules(&self) -> Result<Outcome, String> {
        let (mut inst, env) = self.env()?;
        match inst.step(env, self.any_action()).map_err(|f| faulted("step before reset", &f))? {
            Err(e) if e.kind == ErrorKind::NotStarted => {}
            other => return Err(format!("step before reset gave {other:?}; it should be a not-started error")),
        }
        // Play until done, then step once more.
        for seed in 0..self.seeds {
            inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset failed: {}", e.message))?;
            let mut rng = SeedRng::new(seed);
            for t in 0..self.max_steps.saturating_add(1) {
                self.in_budget()?;
                let r = inst.step(env, self.random_action(&mut rng)).map_err(|f| faulted("step", &f))?;
                match r {
                    Ok(r) if r.done => return self.after_done(&mut inst, env, seed),
                    Ok(_) => {}
                    Err(e) => return Err(format!("step {t} of seed {seed} failed: {}", e.message)),
                }
            }
        }
        Err(format!("no episode ended within max_steps ({}) steps (fix: end episodes at max_steps)", self.max_steps))
    }

    /// An episode of `seed` has just ended: a step now is an episode-over
    /// error, and a reset starts over.
    fn after_done(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64) -> Result<Outcome, String> {
        match inst.step(env, self.any_action()).map_err(|f| faulted("step after done", &f))? {
            Err(e) if e.kind == ErrorKind::EpisodeOver => {
                inst.reset(env, seed)
                    .map_err(|f| faulted("reset after done", &f))?
                    .map_err(|e| format!("reset after done failed: {}", e.message))?;
                Ok(Outcome::Pass("step before reset is not-started; step after done is episode-over; reset starts over".into()))
            }
            other => Err(format!("step after done gave {other:?}; it should be an episode-over error")),
        }
    }

    /// The batched calls, when exported, against single calls: 4 envs in
    /// two instances play the same seeds and actions for 30 rounds, one
    /// instance call by call, the other through `reset-many`/`step-many`
    /// (an env whose episode ended is reset in the next round's batch).
    /// A plugin without them passes with a warning: the host then crosses
    /// the sandbox once per env, which is correct but slower.
    fn batch(&self) -> Result<Outcome, String> {
        if !self.plugin.has_batch() {
            return Ok(Outcome::Warn(
                "not exported; the host makes one call per env (export `batch` to cross the sandbox once per batch)".into(),
            ));
        }
        const ENVS: usize = 4;
        let (mut single, mut batched) = (self.fresh()?, self.fresh()?);
        let create = |inst: &mut PluginInstance| -> Result<Vec<EnvHandle>, String> { (0..ENVS).map(|_| self.create(inst)).collect() };
        let (a, b) = (create(&mut single)?, create(&mut batched)?);
        let mut rng = SeedRng::new(0xba7c);
        let mut seeds: Vec<u64> = (0..ENVS as u64).collect();
        let mut to_reset = [true; ENVS];
        let mut compared = 0;
        for round in 0..30 {
            self.in_budget()?;
            let ids: Vec<usize> = (0..ENVS).filter(|&i| to_reset[i]).collect();
            if !ids.is_empty() {
                let want: Vec<_> =
                    ids.iter().map(|&i| single.reset(a[i], seeds[i]).map_err(|f| faulted("reset", &f))).collect::<Result<_, _>>()?;
                let handles: Vec<_> = ids.iter().map(|&i| b[i]).collect();
                let picked: Vec<u64> = ids.iter().map(|&i| seeds[i]).collect();
                let got = batched.reset_many(&handles, &picked).expect("has_batch").map_err(|f| faulted("reset-many", &f))?;
                if got != want {
                    return Err(format!(
                        "round {round}: reset-many gave {got:?}, single resets gave {want:?} (fix: make each item exactly its single call)"
                    ));
                }
                for &i in &ids {
                    (to_reset[i], seeds[i]) = (false, seeds[i] + ENVS as u64);
                }
            }
            let actions: Vec<Action> = (0..ENVS).map(|_| self.random_action(&mut rng)).collect();
            let want: Vec<_> =
                (0..ENVS).map(|i| single.step(a[i], actions[i].clone()).map_err(|f| faulted("step", &f))).collect::<Result<_, _>>()?;
            let got = batched.step_many(&b, &actions).expect("has_batch").map_err(|f| faulted("step-many", &f))?;
            if got != want {
                return Err(format!(
                    "round {round}: step-many gave {got:?}, single steps gave {want:?} (fix: make each item exactly its single call)"
                ));
            }
            for (i, r) in want.iter().enumerate() {
                to_reset[i] = r.as_ref().map_or(true, |r| r.done);
            }
            compared += ENVS;
        }
        Ok(Outcome::Pass(format!("reset-many and step-many match single calls ({compared} steps over {ENVS} envs)")))
    }

    /// Resets/s, then steps/s with the resets between episodes timed too:
    /// each half stops at 500 ms of wall clock (or the run's budget).
    fn speed(&self) -> Result<Outcome, String> {
        let (mut inst, env) = self.env()?;
        let budget = Duration::from_millis(500);
        let started = Instant::now();
        let mut resets = 0u64;
        while started.elapsed() < budget || resets == 0 {
            self.in_budget()?;
            inst.reset(env, resets).map_err(|f| faulted("timing resets", &f))?.map_err(|e| format!("reset failed: {}", e.message))?;
            resets += 1;
        }
        let resets_per_sec = resets as f64 / started.elapsed().as_secs_f64();
        let mut rng = SeedRng::new(7);
        let (mut steps, mut seed) = (0u64, 0u64);
        let mut step_time = Duration::ZERO;
        inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset failed: {}", e.message))?;
        let started = Instant::now();
        while started.elapsed() < budget || steps == 0 {
            self.in_budget()?;
            let t = Instant::now();
            let action = self.random_action(&mut rng);
            let r = inst.step(env, action).map_err(|f| faulted("timing steps", &f))?;
            step_time += t.elapsed();
            steps += 1;
            if r.map(|r| r.done).unwrap_or(true) {
                seed += 1;
                inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset failed: {}", e.message))?;
            }
        }
        let steps_per_sec = steps as f64 / step_time.as_secs_f64();
        let line = format!("{resets_per_sec:.0} resets/s, {steps_per_sec:.0} steps/s (one instance, one thread)");
        if resets_per_sec < MIN_RESETS_PER_SEC || steps_per_sec < MIN_STEPS_PER_SEC {
            return Err(format!("{line}: too slow to train on (needs {MIN_RESETS_PER_SEC} resets/s and {MIN_STEPS_PER_SEC} steps/s)"));
        }
        Ok(Outcome::Pass(line))
    }
}
