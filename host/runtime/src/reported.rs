//! Bounds on what a plugin reports about itself. A plugin is a stranger's
//! code: every count it declares is something a consumer may allocate by
//! (a sampler's action table, a prompt, a tokenizer's vocabulary), and every
//! limit is a loop bound. [`PluginInstance::info`](crate::PluginInstance::info)
//! and [`spec`](crate::PluginInstance::spec) refuse an answer outside these
//! bounds, so no consumer has to check again.

use crate::{ActionSpace, EnvSpec, PluginInfo};

/// The largest self-description the host accepts. The defaults are far
/// above what any text environment needs and far below what would hurt.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportLimits {
    /// Bytes of any one name, version, description, action name, legend
    /// entry, metric name or config key field.
    pub max_text_bytes: usize,
    /// Bytes of the instructions.
    pub max_instructions_bytes: usize,
    /// Actions in the action list (at least one is required).
    pub max_actions: usize,
    /// Config keys, legend entries and metrics, each.
    pub max_entries: usize,
    /// Largest `max-bytes` of a text action space.
    pub max_text_action_bytes: u32,
    /// Highest accepted `max-turns`.
    pub max_turns: u32,
    /// Highest accepted `max-actions-per-turn`.
    pub max_actions_per_turn: u32,
    /// Highest accepted `max-actions-per-episode` and `max-steps`.
    pub max_actions_per_episode: u32,
    /// Largest reward magnitude of one step: beyond it, sums over a batch
    /// stop being meaningful (1e308 is finite; two of them are not).
    pub max_abs_reward: f64,
}

impl Default for ReportLimits {
    fn default() -> Self {
        Self {
            max_text_bytes: 1 << 10,
            max_instructions_bytes: 16 << 10,
            max_actions: 256,
            max_entries: 64,
            max_text_action_bytes: 64 << 10,
            max_turns: 1_000,
            max_actions_per_turn: 64,
            max_actions_per_episode: 100_000,
            max_abs_reward: 1e9,
        }
    }
}

impl ReportLimits {
    fn text(&self, what: &str, s: &str) -> Result<(), String> {
        if s.len() > self.max_text_bytes {
            return Err(format!("{what} is {} bytes long, over the limit of {} bytes", s.len(), self.max_text_bytes));
        }
        Ok(())
    }

    fn entries(&self, what: &str, n: usize) -> Result<(), String> {
        if n > self.max_entries {
            return Err(format!("{n} {what}, over the limit of {}", self.max_entries));
        }
        Ok(())
    }

    /// `info()`'s answer within bounds, or what is wrong with it.
    pub fn check_info(&self, info: &PluginInfo) -> Result<(), String> {
        if info.name.trim().is_empty() {
            return Err("the plugin's name is empty".into());
        }
        self.text("the name", &info.name)?;
        self.text("the version", &info.version)?;
        self.text("the description", &info.description)?;
        self.entries("config keys", info.config_keys.len())?;
        for k in &info.config_keys {
            self.text("a config key's name", &k.name)?;
            self.text(&format!("config key `{}`'s default", k.name), &k.default_value)?;
            self.text(&format!("config key `{}`'s description", k.name), &k.description)?;
        }
        Ok(())
    }

    fn check_names(&self, names: &[String]) -> Result<(), String> {
        if names.is_empty() {
            return Err("the action list is empty; an environment needs at least one action".into());
        }
        if names.len() > self.max_actions {
            return Err(format!("{} actions, over the limit of {}", names.len(), self.max_actions));
        }
        for (i, a) in names.iter().enumerate() {
            if a.trim().is_empty() {
                return Err(format!("action #{i} has an empty name"));
            }
            self.text(&format!("action #{i}'s name"), a)?;
            if names[..i].contains(a) {
                return Err(format!("action `{a}` is listed twice; action names must be unique"));
            }
        }
        Ok(())
    }

    /// `spec()`'s answer within bounds, or what is wrong with it.
    pub fn check_spec(&self, spec: &EnvSpec) -> Result<(), String> {
        if spec.instructions.len() > self.max_instructions_bytes {
            return Err(format!(
                "the instructions are {} bytes long, over the limit of {} bytes",
                spec.instructions.len(),
                self.max_instructions_bytes
            ));
        }
        match &spec.action_space {
            ActionSpace::Names(names) => self.check_names(names)?,
            ActionSpace::Text(text) => {
                if text.max_bytes == 0 || text.max_bytes > self.max_text_action_bytes {
                    return Err(format!(
                        "the text action space's max-bytes is {}; it must be between 1 and {}",
                        text.max_bytes, self.max_text_action_bytes
                    ));
                }
                self.text("the text action space's form", &text.form)?;
            }
        }
        self.entries("legend entries", spec.legend.len())?;
        for l in &spec.legend {
            self.text("a legend symbol", &l.symbol)?;
            self.text(&format!("legend symbol `{}`'s meaning", l.symbol), &l.meaning)?;
        }
        self.entries("metrics", spec.metrics.len())?;
        for m in &spec.metrics {
            self.text("a metric's name", m)?;
        }
        let l = &spec.limits;
        let ranges = [
            ("max-turns", l.max_turns, self.max_turns),
            ("max-actions-per-turn", l.max_actions_per_turn, self.max_actions_per_turn),
            ("max-actions-per-episode", l.max_actions_per_episode, self.max_actions_per_episode),
            ("max-steps", l.max_steps, self.max_actions_per_episode),
        ];
        for (name, value, max) in ranges {
            if value == 0 || value > max {
                return Err(format!("limits.{name} is {value}; it must be between 1 and {max}"));
            }
        }
        Ok(())
    }
}
