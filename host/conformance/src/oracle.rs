//! The `oracle` check: a plugin that exports the contract's optional
//! oracle must answer within the rules (at least one action, no more than
//! asked, each inside the action space, the state unchanged) and must win:
//! played on the validation seeds within the env's recommended action
//! budget, it succeeds at least as often as random play on the same seeds.
//! An oracle that claims the best action but loses to chance is reported
//! as lying.

use crate::Outcome;
use crate::validator::{Validator, faulted, short};
use ragen_rng::SeedRng;
use ragen_runtime::{Action, ActionSpace, EnvHandle, PluginInstance};

/// Who picks the actions of an episode the check plays.
#[derive(Clone, Copy)]
enum Player {
    Oracle,
    /// Random actions drawn from this seed.
    Random(u64),
}

impl Validator<'_> {
    pub(crate) fn oracle(&self) -> Result<Outcome, String> {
        match self.plugin.has_oracle() {
            Err(e) => return Err(format!("has-oracle: {e:#}")),
            Ok(false) => return Ok(Outcome::Pass("none exported (optional: an env's own best play, see wit/README.md)".into())),
            Ok(true) => {}
        }
        let (mut inst, env) = self.env()?;
        let (mut oracle_wins, mut random_wins) = (0u64, 0u64);
        for seed in 0..self.seeds {
            oracle_wins += self.play(&mut inst, env, seed, Player::Oracle)? as u64;
            random_wins += self.play(&mut inst, env, seed, Player::Random(seed ^ 0x0dd))? as u64;
        }
        let budget = self.budget();
        let (n, tally) = (self.seeds, format!("{oracle_wins} of {} seeds, random play {random_wins}", self.seeds));
        if oracle_wins < random_wins {
            return Err(format!(
                "the oracle lies: playing its best actions it succeeded on {tally}, within {budget} actions an episode \
                 (fix: best-actions must return the moves that win, not merely legal ones)"
            ));
        }
        if oracle_wins == 0 {
            return Ok(Outcome::Warn(format!(
                "neither the oracle nor random play succeeded on {n} seeds within {budget} actions an episode, so the check \
                 cannot tell whether the oracle is right (try other --set values or more --seeds)"
            )));
        }
        Ok(Outcome::Pass(format!("succeeds on {tally}, within {budget} actions an episode; answers within the rules")))
    }

    /// Actions an episode may take: the spec's recommendation, within the
    /// env's own step limit.
    fn budget(&self) -> u32 {
        self.max_actions_per_episode.min(self.max_steps).min(200)
    }

    /// Play one episode from `seed` and say whether it succeeded.
    fn play(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64, player: Player) -> Result<bool, String> {
        self.reset(inst, env, seed)?;
        let mut rng = SeedRng::new(match player {
            Player::Random(s) => s,
            Player::Oracle => 0,
        });
        let mut taken = 0;
        while taken < self.budget() {
            self.in_budget()?;
            let wanted = self.max_actions_per_turn.min(self.budget() - taken);
            let plan = match player {
                Player::Oracle => self.best_actions(inst, env, seed, taken, wanted)?,
                Player::Random(_) => vec![self.random_action(&mut rng)],
            };
            for action in plan {
                let r = inst
                    .step(env, action.clone())
                    .map_err(|f| faulted(&format!("step {taken} of seed {seed}"), &f))?
                    .map_err(|e| format!("step {taken} of seed {seed} ({}) failed: {}", short(&action), e.message))?;
                taken += 1;
                if r.done {
                    return Ok(r.info.success);
                }
            }
        }
        Ok(false)
    }

    /// The oracle's answer for the state after `taken` actions of `seed`,
    /// checked against the contract: within the rules and pure.
    fn best_actions(&self, inst: &mut PluginInstance, env: EnvHandle, seed: u64, taken: u32, wanted: u32) -> Result<Vec<Action>, String> {
        let at = format!("best-actions after {taken} actions of seed {seed}");
        let ask = |inst: &mut PluginInstance| -> Result<Vec<Action>, String> {
            inst.best_actions(env, wanted)
                .expect("has-oracle said the plugin exports it")
                .map_err(|f| faulted(&at, &f))?
                .map_err(|e| format!("{at} failed: {}", e.message))
        };
        let before = inst.render(env).map_err(|f| faulted("render", &f))?;
        let plan = ask(inst)?;
        let again = ask(inst)?;
        let after = inst.render(env).map_err(|f| faulted("render", &f))?;
        if before != after || plan != again {
            return Err(format!("{at}: asking twice changed the state or the answer (fix: best-actions must not change the env)"));
        }
        if plan.is_empty() || plan.len() > wanted as usize {
            return Err(format!("{at}: {} actions for a request of at most {wanted} (fix: return 1 to max-actions)", plan.len()));
        }
        if let Some(bad) = plan.iter().find(|a| !self.allows(a)) {
            return Err(format!("{at}: {} is outside the action space (fix: return actions the spec declares)", short(bad)));
        }
        Ok(plan)
    }

    /// Whether `action` is of the kind and size the action space declares.
    fn allows(&self, action: &Action) -> bool {
        match (action, &self.space) {
            (Action::Id(id), ActionSpace::Names(names)) => (*id as usize) < names.len(),
            (Action::Text(text), ActionSpace::Text(t)) => text.len() <= t.max_bytes as usize,
            _ => false,
        }
    }
}
