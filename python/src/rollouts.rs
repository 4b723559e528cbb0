//! `ragen_envs._core.Rollouts`: the agent loop (`RolloutRunner`) with a
//! Python policy, writing the trajectories `ragen-host eval --trajectories`
//! writes. This is what a Python trainer, or a Ray actor, calls to get
//! grouped multi-turn rollouts with RAGEN's prompts and parsing.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use ragen_agent::policies::RandomPolicy;
use ragen_agent::{AgentConfig, ByteTokenizer, Context, Policy, Response, Role, RolloutConfig, RolloutRunner, Tokenizer, write_jsonl};
use ragen_runtime::Plugin;

/// The agent loop over one plugin's envs: `env_groups` groups of
/// `group_size` envs, each group reset from one seed.
#[pyclass(frozen, module = "ragen_envs._core")]
pub struct Rollouts {
    runner: RolloutRunner,
    group_size: usize,
}

/// A Python callable as a [`Policy`]: it receives the contexts of one turn
/// as dicts and returns one reply (the text after the pre-fill) for each.
/// `env` in a context is the env's index in the call (group-major), the
/// same on every turn.
struct PyPolicy(Py<PyAny>);

fn role(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

impl PyPolicy {
    fn contexts<'py>(py: Python<'py>, contexts: &[Context<'_>]) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for c in contexts {
            let d = PyDict::new(py);
            let messages: Vec<(&str, &str)> = c.messages.iter().map(|m| (role(m.role), m.text)).collect();
            d.set_item("env", c.env)?;
            d.set_item("messages", messages)?;
            d.set_item("prefill", c.prefill)?;
            d.set_item("observation", c.observation)?;
            d.set_item("actions", c.actions)?;
            d.set_item("max_actions", c.max_actions)?;
            list.append(d)?;
        }
        Ok(list)
    }
}

impl Policy for PyPolicy {
    fn name(&self) -> &str {
        "python"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> anyhow::Result<Vec<Response>> {
        let texts: Vec<String> = Python::attach(|py| {
            let list = Self::contexts(py, contexts)?;
            self.0.bind(py).call1((list,))?.extract::<Vec<String>>()
        })
        .map_err(|e| anyhow::anyhow!("the Python policy failed: {e}"))?;
        Ok(texts
            .into_iter()
            .map(|text| {
                let tokens = ByteTokenizer.encode(&text);
                Response { logprobs: vec![0.0; tokens.len()], text, tokens }
            })
            .collect())
    }
}

#[pymethods]
impl Rollouts {
    /// `config`: the text of an agent config (TOML with `[rollout]`,
    /// `[prompt]`, `[env]`, `[sandbox]`), or None for the defaults;
    /// `settings` win over its `[env]`.
    #[new]
    #[pyo3(signature = (path, env_groups, group_size, threads, config, settings))]
    fn new(
        py: Python<'_>,
        path: &str,
        env_groups: usize,
        group_size: usize,
        threads: usize,
        config: Option<&str>,
        settings: Vec<(String, String)>,
    ) -> PyResult<Self> {
        let config: AgentConfig = match config {
            Some(text) => toml::from_str(text).map_err(|e| PyValueError::new_err(format!("the agent config is not valid: {e}")))?,
            None => AgentConfig::default(),
        };
        let settings = config.env_settings(&settings);
        let rollout = RolloutConfig { env_groups, group_size, ..config.rollout.clone() };
        py.detach(|| {
            let plugin = ragen_runtime::LocalPlugin::provider(Plugin::from_file_with(path, config.sandbox.limits()?)?);
            RolloutRunner::new(plugin, &settings, rollout, config.prompt.clone(), threads.max(1))
        })
        .map(|runner| Rollouts { runner, group_size })
        .map_err(|e| PyValueError::new_err(format!("{e:#}")))
    }

    /// Play one episode per env for each of `group_seeds` (at most
    /// `env_groups`) and return the trajectories as JSON lines, group by
    /// group, numbered from `first_group`. `policy` is `"random"` (each
    /// group's replies drawn from its own seed, so a group's trajectories do
    /// not depend on which other groups share the call) or a callable.
    #[pyo3(signature = (policy, group_seeds, first_group = 0))]
    fn run(&self, py: Python<'_>, policy: Py<PyAny>, group_seeds: Vec<u64>, first_group: usize) -> PyResult<Vec<String>> {
        let random = policy.bind(py).extract::<String>().ok();
        let trajectories = match random.as_deref() {
            Some("random") => py.detach(|| {
                let mut all = Vec::new();
                for &seed in &group_seeds {
                    all.extend(self.runner.run(&mut RandomPolicy::new(seed ^ 0x7a9d_0c1e), &[seed])?);
                }
                anyhow::Ok(all)
            }),
            Some(other) => return Err(PyValueError::new_err(format!("unknown policy `{other}`; pass \"random\" or a callable"))),
            None => {
                let mut p = PyPolicy(policy);
                py.detach(|| self.runner.run(&mut p, &group_seeds))
            }
        }
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        let mut lines = Vec::with_capacity(trajectories.len());
        for (i, mut t) in trajectories.into_iter().enumerate() {
            t.group = first_group + i / self.group_size;
            t.env = first_group * self.group_size + i;
            let mut buf = Vec::new();
            write_jsonl(&mut buf, std::slice::from_ref(&t)).map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
            lines.push(String::from_utf8(buf).expect("JSON is UTF-8").trim_end().to_string());
        }
        Ok(lines)
    }
}
