//! The agent's run configuration as a TOML file: `[rollout]` (RAGEN's key
//! names), `[prompt]` (the templates) and `[env]` (the plugin's settings).

use crate::prompt::PromptTemplates;
use crate::rollout::RolloutConfig;
use anyhow::{Context, Result};
use ragen_runtime::SandboxLimits;
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
    /// The sandbox every instance of the plugin runs in.
    pub sandbox: SandboxSection,
}

/// `[sandbox]`: the limits of [`SandboxLimits`], in a config file's units.
/// The defaults are the runtime's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSection {
    /// Wall-clock budget of one call into the plugin, in milliseconds.
    pub call_timeout_ms: u64,
    /// Most linear memory one plugin instance may grow to, in MiB.
    pub memory_mib: usize,
    /// Largest observation accepted, in KiB; a longer one fails its episode.
    pub max_observation_kib: usize,
}

impl Default for SandboxSection {
    fn default() -> Self {
        let d = SandboxLimits::default();
        Self {
            call_timeout_ms: d.call_timeout.as_millis() as u64,
            memory_mib: d.memory_bytes >> 20,
            max_observation_kib: d.max_observation_bytes >> 10,
        }
    }
}

impl SandboxSection {
    /// The limits, refusing a zero (nothing could run under it).
    pub fn limits(&self) -> Result<SandboxLimits> {
        if self.call_timeout_ms == 0 || self.memory_mib == 0 || self.max_observation_kib == 0 {
            anyhow::bail!(
                "[sandbox] call_timeout_ms, memory_mib and max_observation_kib must be positive (defaults: {:?})",
                SandboxSection::default()
            );
        }
        Ok(SandboxLimits {
            call_timeout: std::time::Duration::from_millis(self.call_timeout_ms),
            memory_bytes: self.memory_mib << 20,
            max_observation_bytes: self.max_observation_kib << 10,
            ..SandboxLimits::default()
        })
    }
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
    fn sandbox_limits_come_from_the_config() {
        let c: AgentConfig = toml::from_str("[sandbox]\ncall_timeout_ms = 500\nmemory_mib = 64\n").unwrap();
        let l = c.sandbox.limits().unwrap();
        assert_eq!((l.call_timeout.as_millis(), l.memory_bytes), (500, 64 << 20));
        assert_eq!(l.max_observation_bytes, SandboxLimits::default().max_observation_bytes);
        let zero: AgentConfig = toml::from_str("[sandbox]\nmemory_mib = 0\n").unwrap();
        assert!(zero.sandbox.limits().unwrap_err().to_string().contains("memory_mib"));
        assert!(toml::from_str::<AgentConfig>("[sandbox]\nmemory = 1\n").unwrap_err().to_string().contains("memory"));
    }

    #[test]
    fn a_config_file_sets_rollout_prompt_and_env() {
        let c: AgentConfig = toml::from_str(
            "[rollout]\ngroup_size = 4\nmax_turn = 3\n[prompt]\nsystem = \"Be brief.\"\n[env]\ndim_x = 8\nsymbols = \"W.GBCA@\"\n",
        )
        .unwrap();
        assert_eq!((c.rollout.group_size, c.rollout.max_turn, c.rollout.env_groups), (4, Some(3), 8));
        assert_eq!(c.prompt.system, "Be brief.");
        assert_eq!(c.sandbox.limits().unwrap(), SandboxLimits::default(), "no [sandbox]: the runtime's limits");
        let s = c.env_settings(&[("dim_x".into(), "7".into())]);
        assert_eq!(s, [("symbols".to_string(), "W.GBCA@".to_string()), ("dim_x".to_string(), "7".to_string())]);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = toml::from_str::<AgentConfig>("[rollout]\ngroup_sise = 4\n").unwrap_err().to_string();
        assert!(e.contains("group_sise"), "{e}");
    }
}
