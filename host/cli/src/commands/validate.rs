//! `ragen-host validate`: the conformance run a plugin author uses before
//! sharing a plugin. Each check runs in a fresh instance, so one fault does
//! not hide the others; each failure says what to fix.

use ragen_env_sdk::SeedRng;
use ragen_runtime::{Action, ActionSpace, ErrorKind, Fault, FaultKind, Plugin, PluginInstance, SandboxLimits, StepResult};
use std::collections::HashSet;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Below these a plugin is too slow to train on.
const MIN_RESETS_PER_SEC: f64 = 10.0;
const MIN_STEPS_PER_SEC: f64 = 100.0;

pub struct Options {
    pub settings: Vec<(String, String)>,
    pub seeds: u64,
    pub limits: SandboxLimits,
    /// Wall-clock budget of the whole run. Checks stop calling the plugin
    /// once it is spent (a call already under way ends within its own
    /// `call_timeout`), and those not run fail saying so.
    pub budget: Duration,
}

pub struct Check {
    pub name: &'static str,
    pub result: Result<String, String>,
}

pub struct Report {
    pub file: String,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.result.is_ok())
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("validate {}\n", self.file);
        for c in &self.checks {
            let _ = match &c.result {
                Ok(detail) => writeln!(s, "  ok    {:<13} {detail}", c.name),
                Err(problem) => writeln!(s, "  FAIL  {:<13} {problem}", c.name),
            };
        }
        let failed = self.checks.iter().filter(|c| c.result.is_err()).count();
        let _ = if failed == 0 {
            writeln!(s, "PASS: all {} checks passed", self.checks.len())
        } else {
            writeln!(s, "FAIL: {failed} of {} checks failed", self.checks.len())
        };
        s
    }
}

/// An action as a report shows it: an id, or text cut to 20 characters.
fn short(action: &Action) -> String {
    match action {
        Action::Id(id) => format!("id {id}"),
        Action::Text(t) if t.chars().count() > 20 => format!("text of {} bytes", t.len()),
        Action::Text(t) => format!("text {t:?}"),
    }
}

/// What to do about a fault, for the plugin author.
fn fix_for(fault: &Fault) -> &'static str {
    match fault.kind {
        FaultKind::Timeout => "fix: a call must return promptly; look for an endless loop (or raise --call-timeout-ms if it is only slow)",
        FaultKind::MemoryCap => "fix: memory grows without bound; look for a leak or unbounded buffer (or raise --memory-mib)",
        FaultKind::Trap if fault.message.contains("overflowed its stack") => "fix: bound the recursion, or turn it into a loop",
        FaultKind::Trap => "fix: the plugin panicked or hit `unreachable`; return an env-error result instead of trapping",
        FaultKind::Contract => "fix: keep the plugin's self-description within the host's limits (see `ReportLimits`)",
    }
}

fn faulted(context: &str, fault: &Fault) -> String {
    format!("{context}: {} ({})", fault.message, fix_for(fault))
}

/// One played step, kept to compare runs.
#[derive(PartialEq)]
struct Record {
    observation: String,
    reward_bits: u64,
    done: bool,
    flags: (bool, bool, bool),
}

impl From<&StepResult> for Record {
    fn from(r: &StepResult) -> Self {
        Record {
            observation: r.observation.clone(),
            reward_bits: r.reward.to_bits(),
            done: r.done,
            flags: (r.info.success, r.info.action_is_valid, r.info.action_is_effective),
        }
    }
}

struct Validator<'a> {
    plugin: &'a Plugin,
    opts: &'a Options,
    /// When [`Options::budget`] runs out.
    deadline: Instant,
    /// The env's action space, as its spec declares it.
    space: ActionSpace,
    num_metrics: usize,
    max_steps: u32,
}

/// Characters random text actions are drawn from: what an expression or an
/// answer is made of, plus the answer format's reserved marks and
/// multi-byte characters, which a text env must take without trapping.
const TEXT_ALPHABET: &[char] =
    &['0', '1', '2', '3', '7', '9', '+', '-', '*', '/', '(', ')', ' ', '.', '=', 'x', 'A', '<', '|', '\n', 'é', '√'];

impl Validator<'_> {
    /// A pseudo-random action: an id, or text of up to 24 bytes.
    fn random_action(&self, rng: &mut SeedRng) -> Action {
        match &self.space {
            ActionSpace::Names(names) => Action::Id(rng.below(names.len()) as u32),
            ActionSpace::Text(t) => {
                let mut text = String::new();
                let len = rng.below(25);
                while text.len() < len {
                    let c = TEXT_ALPHABET[rng.below(TEXT_ALPHABET.len())];
                    if text.len() + c.len_utf8() > t.max_bytes as usize {
                        break;
                    }
                    text.push(c);
                }
                Action::Text(text)
            }
        }
    }

    /// Actions outside the space, each of which must be a bad-action error.
    fn bad_actions(&self) -> Vec<Action> {
        match &self.space {
            ActionSpace::Names(names) => vec![Action::Id(names.len() as u32), Action::Id(u32::MAX), Action::Text("0".into())],
            ActionSpace::Text(t) => vec![Action::Text("1".repeat(t.max_bytes as usize + 1)), Action::Id(0)],
        }
    }

    /// A valid action, for the rules checks.
    fn any_action(&self) -> Action {
        self.random_action(&mut SeedRng::new(0))
    }
    /// `Err` once the run's budget is spent: every loop that calls the
    /// plugin asks before each call.
    fn in_budget(&self) -> Result<(), String> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        Err(format!(
            "the validate budget of {} s ran out: the plugin is slow (time its reset and step), or give it longer with --budget SECONDS",
            self.opts.budget.as_secs_f64()
        ))
    }

    fn fresh(&self) -> Result<PluginInstance, String> {
        self.plugin.instantiate().map_err(|e| format!("cannot instantiate: {e:#}"))
    }

    /// A fresh instance with one env created from the settings.
    fn env(&self) -> Result<(PluginInstance, ragen_runtime::EnvHandle), String> {
        let mut inst = self.fresh()?;
        let env = inst
            .create(&self.opts.settings)
            .map_err(|f| faulted("create", &f))?
            .map_err(|e| format!("create with the given settings failed: {}", e.message))?;
        Ok((inst, env))
    }

    /// Play one episode from `seed` with actions drawn from the seed.
    fn episode(
        &self,
        inst: &mut PluginInstance,
        env: ragen_runtime::EnvHandle,
        seed: u64,
    ) -> Result<(String, Vec<Record>, Vec<f64>), String> {
        self.episode_with(inst, env, seed, seed ^ 0x5eed)
    }

    /// One episode of `seed` with pseudo-random actions drawn from `action_seed`.
    fn episode_with(
        &self,
        inst: &mut PluginInstance,
        env: ragen_runtime::EnvHandle,
        seed: u64,
        action_seed: u64,
    ) -> Result<(String, Vec<Record>, Vec<f64>), String> {
        self.in_budget()?;
        let first = inst
            .reset(env, seed)
            .map_err(|f| faulted(&format!("reset(seed {seed})"), &f))?
            .map_err(|e| format!("reset(seed {seed}) failed: {}", e.message))?;
        let mut actions = SeedRng::new(action_seed);
        let (mut records, mut numbers) = (Vec::new(), Vec::new());
        for t in 0..self.max_steps.min(200) {
            self.in_budget()?;
            let a = self.random_action(&mut actions);
            let r = inst
                .step(env, a.clone())
                .map_err(|f| faulted(&format!("step {t} of seed {seed}"), &f))?
                .map_err(|e| format!("step {t} of seed {seed} (action {a}) failed: {}", e.message))?;
            numbers.push(r.reward);
            if r.info.metrics.len() != self.num_metrics {
                return Err(format!(
                    "step {t} of seed {seed} reported {} metric values but the spec names {} (fix: report one value per name in spec.metrics)",
                    r.info.metrics.len(),
                    self.num_metrics
                ));
            }
            numbers.extend(r.info.metrics.iter().copied());
            records.push(Record::from(&r));
            if r.done {
                break;
            }
        }
        Ok((first, records, numbers))
    }

    fn metadata(&self, inst: &mut PluginInstance) -> Result<String, String> {
        let info = inst.info().map_err(|f| faulted("info", &f))?;
        let mut problems = Vec::new();
        for (field, value) in [("name", &info.name), ("version", &info.version), ("description", &info.description)] {
            if value.trim().is_empty() {
                problems.push(format!("info.{field} is empty"));
            }
        }
        let mut keys = HashSet::new();
        for k in &info.config_keys {
            if !keys.insert(k.name.clone()) {
                problems.push(format!("config key `{}` is declared twice", k.name));
            }
        }
        let env = inst
            .create(&self.opts.settings)
            .map_err(|f| faulted("create", &f))?
            .map_err(|e| format!("create with the given settings failed: {}", e.message))?;
        let spec = inst.spec(env).map_err(|f| faulted("spec", &f))?;
        if spec.instructions.trim().is_empty() {
            problems.push("spec.instructions is empty: the agent would not know the task".into());
        }
        if let ActionSpace::Names(names) = &spec.action_space
            && names.is_empty()
        {
            problems.push("spec.action-space lists no names".into());
        }
        if let ActionSpace::Text(t) = &spec.action_space
            && t.form.trim().is_empty()
        {
            problems.push("spec.action-space.text has an empty form: the prompt would not say what to answer".into());
        }
        let mut names = HashSet::new();
        for a in spec.action_names() {
            if a.trim().is_empty() || a.contains("||") || a.contains('<') {
                problems.push(format!("action name `{a}` is empty or contains `||` or `<`, which the answer format reserves"));
            }
            if !names.insert(a.to_lowercase()) {
                problems.push(format!("action `{a}` appears twice (names match case-insensitively)"));
            }
        }
        let mut metric_names = HashSet::new();
        for m in &spec.metrics {
            if m.trim().is_empty() || !metric_names.insert(m.clone()) {
                problems.push(format!("metric name `{m}` is empty or declared twice"));
            }
        }
        for l in &spec.legend {
            if l.symbol.is_empty() || l.meaning.trim().is_empty() {
                problems.push(format!("legend entry `{}` = `{}` has an empty part", l.symbol, l.meaning));
            }
        }
        // Text a person's terminal will show: no control characters.
        let texts = [("the name", &info.name), ("the description", &info.description), ("the instructions", &spec.instructions)];
        let listed =
            spec.action_names().iter().map(|a| ("an action name", a)).chain(spec.legend.iter().map(|l| ("a legend symbol", &l.symbol)));
        for (what, text) in texts.into_iter().chain(listed) {
            if text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
                problems
                    .push(format!("{what} (`{}`) contains control characters, which a terminal would act on", crate::term::escape(text)));
            }
        }
        let lim = &spec.limits;
        if lim.max_actions_per_episode == 0 || lim.max_actions_per_turn == 0 || lim.max_turns == 0 || lim.max_steps == 0 {
            problems.push("every limit must be at least 1".into());
        }
        if !problems.is_empty() {
            return Err(format!("{} (fix the plugin's info/spec)", problems.join("; ")));
        }
        let actions = match &spec.action_space {
            ActionSpace::Names(names) => format!("{} actions", names.len()),
            ActionSpace::Text(t) => format!("text actions of up to {} bytes", t.max_bytes),
        };
        Ok(format!(
            "{} {}, {actions}, {} legend entries, {} config keys",
            info.name,
            info.version,
            spec.legend.len(),
            info.config_keys.len()
        ))
    }

    fn determinism(&self) -> Result<String, String> {
        let (mut a, ea) = self.env()?;
        let (mut b, eb) = self.env()?;
        let mut steps = 0;
        for seed in 0..self.opts.seeds {
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
        Ok(format!("{} seeds replayed identically in two instances ({steps} steps); no state kept across resets", self.opts.seeds))
    }

    /// Two fresh instances see the same calls in the same order, so state
    /// kept across resets (a counter, a cache) passes the replay above. Here
    /// one instance resets seed 0, then other seeds, then seed 0 again, and
    /// a second env of the same instance resets seed 0 too: all three first
    /// states must agree.
    fn no_hidden_state(&self) -> Result<(), String> {
        let (mut inst, env) = self.env()?;
        let reset = |inst: &mut PluginInstance, env, seed| -> Result<String, String> {
            inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset(seed {seed}) failed: {}", e.message))
        };
        let first = reset(&mut inst, env, 0)?;
        for other in 1..4 {
            reset(&mut inst, env, other)?;
        }
        let again = reset(&mut inst, env, 0)?;
        let twin =
            inst.create(&self.opts.settings).map_err(|f| faulted("create", &f))?.map_err(|e| format!("create failed: {}", e.message))?;
        let beside = reset(&mut inst, twin, 0)?;
        if again != first || beside != first {
            return Err("seed 0 started in another state when reset again after other seeds, or in a second env of the same instance \
                 (fix: keep no state across resets or between envs; derive everything from the seed)"
                .into());
        }
        Ok(())
    }

    /// Different seeds must give different episodes. Not necessarily
    /// different first observations: a game with hidden state (a secret
    /// number) shows every seed the same start, and differs only once the
    /// agent acts. So each seed plays the same actions and whole episodes
    /// are compared.
    fn seeds_differ(&self) -> Result<String, String> {
        let (mut inst, env) = self.env()?;
        let (mut starts, mut episodes) = (HashSet::new(), HashSet::new());
        for seed in 0..self.opts.seeds {
            let (first, records, _) = self.episode_with(&mut inst, env, seed, 0x5eed)?;
            let replay: Vec<(String, u64)> = records.iter().map(|r| (r.observation.clone(), r.reward_bits)).collect();
            starts.insert(first.clone());
            episodes.insert((first, replay));
        }
        if episodes.len() < 2 {
            return Err(format!(
                "all {} seeds played the same episode under the same actions (fix: derive the initial state, or the hidden state, from the seed)",
                self.opts.seeds
            ));
        }
        Ok(format!("{} distinct episodes ({} distinct initial states) from {} seeds", episodes.len(), starts.len(), self.opts.seeds))
    }

    fn finite(&self) -> Result<String, String> {
        let (mut inst, env) = self.env()?;
        let mut count = 0;
        let cap = self.plugin.limits().max_observation_bytes;
        for seed in 0..self.opts.seeds {
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
        Ok(format!("{count} rewards and metrics, all finite; observations within {cap} bytes"))
    }

    fn bad_config(&self) -> Result<String, String> {
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
        Ok(format!("unknown key rejected; {rejected} malformed values rejected without trapping"))
    }

    fn bad_action(&self) -> Result<String, String> {
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
        Ok(format!("{} rejected with bad-action", shown.join(", ")))
    }

    fn episode_rules(&self) -> Result<String, String> {
        let (mut inst, env) = self.env()?;
        match inst.step(env, self.any_action()).map_err(|f| faulted("step before reset", &f))? {
            Err(e) if e.kind == ErrorKind::NotStarted => {}
            other => return Err(format!("step before reset gave {other:?}; it should be a not-started error")),
        }
        // Play until done, then step once more.
        for seed in 0..self.opts.seeds {
            inst.reset(env, seed).map_err(|f| faulted("reset", &f))?.map_err(|e| format!("reset failed: {}", e.message))?;
            let mut rng = SeedRng::new(seed);
            for t in 0..self.max_steps.saturating_add(1) {
                self.in_budget()?;
                let r = inst.step(env, self.random_action(&mut rng)).map_err(|f| faulted("step", &f))?;
                match r {
                    Ok(r) if r.done => {
                        return match inst.step(env, self.any_action()).map_err(|f| faulted("step after done", &f))? {
                            Err(e) if e.kind == ErrorKind::EpisodeOver => {
                                inst.reset(env, seed)
                                    .map_err(|f| faulted("reset after done", &f))?
                                    .map_err(|e| format!("reset after done failed: {}", e.message))?;
                                Ok("step before reset is not-started; step after done is episode-over; reset starts over".into())
                            }
                            other => Err(format!("step after done gave {other:?}; it should be an episode-over error")),
                        };
                    }
                    Ok(_) => {}
                    Err(e) => return Err(format!("step {t} of seed {seed} failed: {}", e.message)),
                }
            }
        }
        Err(format!("no episode ended within max_steps ({}) steps (fix: end episodes at max_steps)", self.max_steps))
    }

    /// The batched calls, when exported, against single calls: 4 envs in
    /// two instances play the same seeds and actions for 30 rounds, one
    /// instance call by call, the other through `reset-many`/`step-many`
    /// (an env whose episode ended is reset in the next round's batch).
    fn batch(&self) -> Result<String, String> {
        if !self.plugin.has_batch() {
            return Ok("not exported; the host makes one call per env (export `batch` to cross the sandbox once per batch)".into());
        }
        const ENVS: usize = 4;
        let (mut single, mut batched) = (self.fresh()?, self.fresh()?);
        let create = |inst: &mut PluginInstance| -> Result<Vec<ragen_runtime::EnvHandle>, String> {
            (0..ENVS)
                .map(|_| {
                    inst.create(&self.opts.settings)
                        .map_err(|f| faulted("create", &f))?
                        .map_err(|e| format!("create failed: {}", e.message))
                })
                .collect()
        };
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
        Ok(format!("reset-many and step-many match single calls ({compared} steps over {ENVS} envs)"))
    }

    /// Resets/s, then steps/s with the resets between episodes timed too:
    /// each half stops at 500 ms of wall clock (or the run's budget).
    fn speed(&self) -> Result<String, String> {
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
        Ok(line)
    }
}

/// [`validate`] with a spinner naming the check under way.
pub fn run_with_spinner(file: &Path, opts: &Options) -> Report {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    let started = Instant::now();
    let budget = opts.budget.as_secs_f64();
    let report = validate(file, opts, &mut |check| {
        spinner.set_message(format!("validate: {check} ({:.0} s of {budget:.0} s)", started.elapsed().as_secs_f64()))
    });
    spinner.finish_and_clear();
    report
}

/// Run every check on `file`, telling `progress` which one is starting.
pub fn validate(file: &Path, opts: &Options, progress: &mut dyn FnMut(&str)) -> Report {
    let name = file.display().to_string();
    let mut checks = Vec::new();
    let plugin = match Plugin::from_file_with(file, opts.limits.clone()) {
        Ok(p) => p,
        Err(e) => {
            checks.push(Check { name: "load", result: Err(format!("{e:#}")) });
            return Report { file: name, checks };
        }
    };
    checks.push(Check {
        name: "load",
        result: Ok(format!("component, ragen:env@{}, {} bytes", plugin.contract_version(), plugin.size_bytes())),
    });
    // The budget covers the checks, not compiling the component (seconds
    // for a language runtime, reported by `load`'s line and by bench).
    let deadline = Instant::now() + opts.budget;
    let space = ActionSpace::Names(vec![]);
    let mut v = Validator { plugin: &plugin, opts, deadline, space, num_metrics: 0, max_steps: 0 };
    progress("metadata");
    let meta = v.fresh().and_then(|mut inst| {
        let r = v.metadata(&mut inst)?;
        let env = inst.create(&opts.settings).map_err(|f| faulted("create", &f))?.map_err(|e| e.message)?;
        let spec = inst.spec(env).map_err(|f| faulted("spec", &f))?;
        Ok((r, spec.action_space, spec.metrics.len(), spec.limits.max_steps))
    });
    match meta {
        Ok((detail, space, metrics, max_steps)) if space != ActionSpace::Names(vec![]) => {
            (v.space, v.num_metrics, v.max_steps) = (space, metrics, max_steps.max(1));
            checks.push(Check { name: "metadata", result: Ok(detail) });
        }
        Ok((detail, ..)) | Err(detail) => {
            checks.push(Check { name: "metadata", result: Err(detail) });
            return Report { file: name, checks };
        }
    }
    type Run<'v> = fn(&Validator<'v>) -> Result<String, String>;
    let runs: [(&'static str, Run); 8] = [
        ("determinism", Validator::determinism),
        ("seeds differ", Validator::seeds_differ),
        ("finite", Validator::finite),
        ("bad config", Validator::bad_config),
        ("bad action", Validator::bad_action),
        ("episode rules", Validator::episode_rules),
        ("batch", Validator::batch),
        ("speed", Validator::speed),
    ];
    for (name, run) in runs {
        progress(name);
        let result = match v.in_budget() {
            Ok(()) => run(&v),
            Err(why) => Err(format!("not run: {why}")),
        };
        checks.push(Check { name, result });
    }
    Report { file: name, checks }
}

/// Check a plugin before sharing it: complete metadata, same seed → same
/// episode, different seeds → different states, errors (not traps) for
/// bad config and bad actions, the episode rules, finite rewards, and
/// speed. Exits 0 only when every check passes; each failure says what
/// to fix.
#[derive(clap::Args)]
pub struct ValidateCommand {
    /// The plugin: a .wasm file or oci://registry/namespace/name:tag.
    file: crate::oci::PluginSource,
    #[command(flatten)]
    checks: ValidateArgs,
}

impl ValidateCommand {
    pub fn execute(self, plain_http: bool) -> anyhow::Result<std::process::ExitCode> {
        let report = run_with_spinner(&self.file.local(plain_http)?, &self.checks.options()?);
        crate::output::print(&crate::term::escape(&report.to_text()))?;
        Ok(if report.passed() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE })
    }
}

/// What `validate` checks with, and `push` before it publishes.
#[derive(clap::Args)]
pub struct ValidateArgs {
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
    settings: crate::args::Settings,
}

impl ValidateArgs {
    /// The checks' options, or an error naming the flag to fix.
    pub fn options(&self) -> anyhow::Result<Options> {
        if !self.budget.is_finite() || self.budget <= 0.0 {
            anyhow::bail!("--budget {}: use a positive number of seconds", self.budget);
        }
        let limits = ragen_runtime::SandboxLimits {
            call_timeout: std::time::Duration::from_millis(self.call_timeout_ms),
            memory_bytes: self.memory_mib << 20,
            ..ragen_runtime::SandboxLimits::default()
        };
        Ok(Options {
            settings: self.settings.parse()?,
            seeds: self.seeds.max(2),
            limits,
            budget: std::time::Duration::from_secs_f64(self.budget),
        })
    }
}
