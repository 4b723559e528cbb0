//! The contract's episode rules, enforced once for every Rust environment.

use crate::{Action, ActionKind, ActionSpace, Config, EnvError, EnvSpec, Environment, ErrorKind, Oracle, StepOutcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Created, never reset.
    NotStarted,
    Running,
    /// The last step returned `done`.
    Over,
}

/// An [`Environment`] behind the WIT contract's rules: configuration checked
/// against the declared keys, `step` refused before `reset` and after `done`,
/// actions checked against the action space.
///
/// The component export uses this, and so should native callers (tests, the
/// host's native baseline), so both see exactly what the host sees.
#[derive(Debug)]
pub struct CheckedEnv<E> {
    env: E,
    space: ActionSpace,
    phase: Phase,
}

impl<E: Environment> CheckedEnv<E> {
    /// Create from key/value settings, as the WIT `create` does.
    pub fn create(settings: &[(String, String)]) -> Result<Self, EnvError> {
        let config = Config::resolve(&E::info().config_keys, settings)?;
        let env = E::new(&config)?;
        let space = env.spec().action_space;
        if !E::Action::serves(&space) {
            return Err(EnvError::failed(format!(
                "the env's spec declares {} but its `type Action` is `{}`; use `u32` for names and `String` for text",
                match space {
                    ActionSpace::Names(_) => "action names",
                    ActionSpace::Text { .. } => "text actions",
                },
                std::any::type_name::<E::Action>()
            )));
        }
        Ok(Self { env, space, phase: Phase::NotStarted })
    }

    /// Create from `(key, value)` string pairs; a convenience for tests.
    pub fn with(settings: &[(&str, &str)]) -> Result<Self, EnvError> {
        let owned: Vec<(String, String)> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self::create(&owned)
    }

    pub fn spec(&self) -> EnvSpec {
        self.env.spec()
    }

    pub fn reset(&mut self, seed: u64) -> Result<String, EnvError> {
        // A failed reset leaves no episode to step.
        self.phase = Phase::NotStarted;
        let obs = self.env.reset(seed)?;
        self.phase = Phase::Running;
        Ok(obs)
    }

    /// Take one action: an id (`env.step(2)`) or text (`env.step("1+2")`).
    pub fn step(&mut self, action: impl Into<Action>) -> Result<StepOutcome, EnvError> {
        match self.phase {
            Phase::NotStarted => {
                return Err(EnvError::new(ErrorKind::NotStarted, "step called before reset; call reset(seed) first"));
            }
            Phase::Over => {
                return Err(EnvError::new(
                    ErrorKind::EpisodeOver,
                    "step called after the episode ended (done); call reset(seed) to start a new one",
                ));
            }
            Phase::Running => {}
        }
        let action = E::Action::accept(action.into(), &self.space)?;
        let outcome = self.env.step(action);
        if outcome.done {
            self.phase = Phase::Over;
        }
        Ok(outcome)
    }

    pub fn render(&self) -> String {
        self.env.render()
    }

    /// Refuse `call` outside a running episode, as the contract says.
    fn running(&self, call: &str) -> Result<(), EnvError> {
        match self.phase {
            Phase::NotStarted => Err(EnvError::new(ErrorKind::NotStarted, format!("{call} called before reset; call reset(seed) first"))),
            Phase::Over => Err(EnvError::new(
                ErrorKind::EpisodeOver,
                format!("{call} called after the episode ended (done); call reset(seed) to start a new one"),
            )),
            Phase::Running => Ok(()),
        }
    }

    /// The oracle's next actions, as the WIT `best-actions` gives them: at
    /// least one and at most `max_actions` (the env's plan is cut, an empty
    /// plan is a `failed` error), only while an episode runs.
    pub fn best_actions(&self, max_actions: u32) -> Result<Vec<Action>, EnvError>
    where
        E: Oracle,
    {
        self.running("best-actions")?;
        let mut plan = self.env.best_actions(max_actions.max(1));
        plan.truncate(max_actions.max(1) as usize);
        if plan.is_empty() {
            return Err(EnvError::failed("the oracle gave no action for a running episode; it must give at least one"));
        }
        Ok(plan.into_iter().map(ActionKind::into_action).collect())
    }

    /// The environment itself, for white-box tests and solvers.
    pub fn inner(&self) -> &E {
        &self.env
    }
}
