//! The agent's run configuration as a TOML file: `[rollout]` (RAGEN's key
//! names), `[prompt]` (the templates) and `[env]` (the plugin's settings).

use crate::prompt::PromptTemplates;
use crate::rollout::RolloutConfig;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub rollout: RolloutConfig,
    pub prompt: PromptTemplates,
    /// Plugin settings, e.g. `dim_x = 8`; any TOML scalar.
    pub env: BTreeMap<String, toml::Value>,
}

impl AgentConfig {
    /// Read a config file; errors name the file and the bad key.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config `{}`", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config `{}` is not valid", path.display()))
    }

    /// The env settings as the plugin takes them, `overrides` (e.g. from
    /// `--set`) winning over the file.
    pub fn env_settings(&self, overrides: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == *k))
            .map(|(k, v)| {
                (
                    k.clone(),
                    match v {
                        toml::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                )
            })
            .collect();
        out.extend(overrides.iter().cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_sets_rollout_prompt_and_env() {
        let c: AgentConfig = toml::from_str(
            "[rollout]\ngroup_size = 4\nmax_turn = 3\n[prompt]\nsystem = \"Be brief.\"\n[env]\ndim_x = 8\nsymbols = \"W.GBCA@\"\n",
        )
        .unwrap();
        assert_eq!((c.rollout.group_size, c.rollout.max_turn, c.rollout.env_groups), (4, Some(3), 8));
        assert_eq!(c.prompt.system, "Be brief.");
        let s = c.env_settings(&[("dim_x".into(), "7".into())]);
        assert_eq!(s, [("symbols".to_string(), "W.GBCA@".to_string()), ("dim_x".to_string(), "7".to_string())]);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = toml::from_str::<AgentConfig>("[rollout]\ngroup_sise = 4\n").unwrap_err().to_string();
        assert!(e.contains("group_sise"), "{e}");
    }
}
