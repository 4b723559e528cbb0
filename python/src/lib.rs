//! `ragen_envs._core`: an [`EnvPool`] as a Python object. The Gymnasium
//! classes (`ragen_envs.VectorEnv`, `ragen_envs.Env`) are plain Python on
//! top of this, in `ragen_envs/__init__.py`: the batch crosses from Python
//! to Rust once per call, and the GIL is released while the pool works.
//! `validate` runs the conformance suite (`ragen-conformance`, what
//! `ragen-host validate` runs) and returns its report as dicts.
//!
//! This crate does not take the workspace's `forbid(unsafe_code)` lint:
//! PyO3's macros expand to unsafe code.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use ragen_runtime::{Action, ActionSpace, EnvFailure, EnvPool, EnvSpec, Plugin, PluginInfo, PoolConfig, PoolStep, StepInfo};
use std::sync::Arc;
use std::time::Duration;

mod rollouts;

pyo3::create_exception!(
    _core,
    EnvFailureError,
    PyRuntimeError,
    "A plugin call failed for one env: a fault (trap, timeout, memory cap), invalid output or an env error. The message names the plugin, the env and the seed."
);

/// Many envs of one plugin, stepped in batches across worker threads.
#[pyclass(frozen, module = "ragen_envs._core")]
struct Pool {
    pool: EnvPool,
    info: PluginInfo,
    spec: EnvSpec,
}

/// One step's results for the whole batch. Numbers and flags travel as
/// raw little-endian buffers (`numpy.frombuffer` reads them without a
/// Python object per env); only the observations are one `str` each.
#[derive(IntoPyObject)]
struct Batch {
    observations: Vec<String>,
    /// f64 per env.
    rewards: Vec<u8>,
    /// One byte (0 or 1) per env, for each of these.
    dones: Vec<u8>,
    success: Vec<u8>,
    action_is_valid: Vec<u8>,
    action_is_effective: Vec<u8>,
    autoreset: Vec<u8>,
    /// u64 per env: the autoreset's seed, 0 when the step did not reset.
    autoreset_seed: Vec<u8>,
    /// f64 per env per metric, env-major (NaN for a failed env).
    metrics: Vec<u8>,
    /// `(env, message)` for each env whose call failed.
    failures: Vec<(usize, String)>,
}

impl Batch {
    fn from_results(results: Vec<Result<PoolStep, EnvFailure>>, num_metrics: usize) -> Self {
        let n = results.len();
        let mut b = Batch {
            observations: Vec::with_capacity(n),
            rewards: Vec::with_capacity(8 * n),
            dones: Vec::with_capacity(n),
            success: Vec::with_capacity(n),
            action_is_valid: Vec::with_capacity(n),
            action_is_effective: Vec::with_capacity(n),
            autoreset: Vec::with_capacity(n),
            autoreset_seed: Vec::with_capacity(8 * n),
            metrics: Vec::with_capacity(8 * n * num_metrics),
            failures: Vec::new(),
        };
        for (i, r) in results.into_iter().enumerate() {
            let step = match r {
                Ok(step) => step,
                // A failed env ends its episode with no reward; the next
                // step (with autoreset) starts a new one.
                Err(f) => {
                    b.failures.push((i, f.to_string()));
                    failed_step()
                }
            };
            b.observations.push(step.observation);
            b.rewards.extend_from_slice(&step.reward.to_le_bytes());
            b.dones.push(step.done as u8);
            b.success.push(step.info.success as u8);
            b.action_is_valid.push(step.info.action_is_valid as u8);
            b.action_is_effective.push(step.info.action_is_effective as u8);
            b.autoreset.push(step.autoreset.is_some() as u8);
            b.autoreset_seed.extend_from_slice(&step.autoreset.unwrap_or(0).to_le_bytes());
            for k in 0..num_metrics {
                b.metrics.extend_from_slice(&step.info.metrics.get(k).copied().unwrap_or(f64::NAN).to_le_bytes());
            }
        }
        b
    }
}

/// What a failed env reports in its slot of a batch.
fn failed_step() -> PoolStep {
    let info = StepInfo { success: false, action_is_valid: false, action_is_effective: false, metrics: vec![] };
    PoolStep { observation: String::new(), reward: 0.0, done: true, info, autoreset: None }
}

/// An action from Python: an int (an action id) or a str (a text action).
fn action(value: &Bound<'_, PyAny>) -> PyResult<Action> {
    if let Ok(id) = value.extract::<u32>() {
        return Ok(Action::Id(id));
    }
    if let Ok(text) = value.extract::<String>() {
        return Ok(Action::Text(text));
    }
    Err(PyTypeError::new_err(format!("an action is an int (an action id) or a str (a text action), not {}", value.get_type().name()?)))
}

fn runtime_error(e: anyhow::Error) -> PyErr {
    PyRuntimeError::new_err(format!("{e:#}"))
}

#[pymethods]
impl Pool {
    /// Load the plugin at `path` and create `num_envs` envs with `settings`
    /// (`{key: value}`, values as strings).
    #[new]
    #[pyo3(signature = (path, num_envs, threads, envs_per_instance, autoreset, settings))]
    fn new(
        py: Python<'_>,
        path: &str,
        num_envs: usize,
        threads: usize,
        envs_per_instance: usize,
        autoreset: bool,
        settings: Vec<(String, String)>,
    ) -> PyResult<Self> {
        if num_envs == 0 {
            return Err(PyValueError::new_err("num_envs must be at least 1"));
        }
        py.detach(|| {
            let plugin = Arc::new(Plugin::from_file(path)?);
            let (info, spec) = plugin.describe(&settings)?;
            let config = PoolConfig { threads: threads.max(1), envs_per_instance, settings, autoreset, ..PoolConfig::new(num_envs) };
            let pool = EnvPool::new(plugin, &config)?;
            Ok(Pool { pool, info, spec })
        })
        .map_err(|e: anyhow::Error| PyValueError::new_err(format!("{e:#}")))
    }

    /// How many envs the pool holds.
    fn __len__(&self) -> usize {
        self.pool.num_envs()
    }

    /// What the plugin says about itself and this configuration.
    fn spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", &self.info.name)?;
        d.set_item("version", &self.info.version)?;
        d.set_item("description", &self.info.description)?;
        d.set_item("multi_turn", self.info.multi_turn)?;
        d.set_item("instructions", &self.spec.instructions)?;
        let legend: Vec<(String, String)> = self.spec.legend.iter().map(|l| (l.symbol.clone(), l.meaning.clone())).collect();
        d.set_item("legend", legend)?;
        match &self.spec.action_space {
            ActionSpace::Names(names) => {
                d.set_item("actions", names)?;
                d.set_item("text_action", py.None())?;
            }
            ActionSpace::Text(t) => {
                d.set_item("actions", PyList::empty(py))?;
                let text = PyDict::new(py);
                text.set_item("max_bytes", t.max_bytes)?;
                text.set_item("form", &t.form)?;
                d.set_item("text_action", text)?;
            }
        }
        let l = &self.spec.limits;
        let limits = PyDict::new(py);
        limits.set_item("max_actions_per_episode", l.max_actions_per_episode)?;
        limits.set_item("max_actions_per_turn", l.max_actions_per_turn)?;
        limits.set_item("max_turns", l.max_turns)?;
        limits.set_item("max_steps", l.max_steps)?;
        d.set_item("limits", limits)?;
        d.set_item("metrics", &self.spec.metrics)?;
        Ok(d)
    }

    /// Reset env `ids[i]` with `seeds[i]`: `(observations, failures)`, a
    /// failure being the message or None.
    fn reset(&self, py: Python<'_>, ids: Vec<usize>, seeds: Vec<u64>) -> PyResult<(Vec<String>, Vec<Option<String>>)> {
        let results = py.detach(|| self.pool.reset(&ids, &seeds)).map_err(runtime_error)?;
        Ok(results
            .into_iter()
            .map(|r| match r {
                Ok(obs) => (obs, None),
                Err(f) => (String::new(), Some(f.to_string())),
            })
            .unzip())
    }

    /// Step env `ids[i]` with `actions[i]` (ints or strs); the results as
    /// parallel lists (see `Batch` in ragen_envs/_core.pyi).
    fn step(&self, py: Python<'_>, ids: Vec<usize>, actions: &Bound<'_, PyAny>) -> PyResult<Batch> {
        let actions: Vec<Action> = actions.try_iter()?.map(|a| action(&a?)).collect::<PyResult<_>>()?;
        let results = py.detach(|| self.pool.step(&ids, &actions)).map_err(runtime_error)?;
        Ok(Batch::from_results(results, self.spec.metrics.len()))
    }

    /// Step every env with action ids given as a little-endian u32 buffer
    /// (`numpy.ndarray.astype("<u4").tobytes()`): the fast path for
    /// discrete actions, with no Python object per env on the way in.
    fn step_ids(&self, py: Python<'_>, actions: &[u8]) -> PyResult<Batch> {
        let n = self.pool.num_envs();
        if actions.len() != 4 * n {
            return Err(PyValueError::new_err(format!("step_ids: {} bytes of u32 action ids for {n} envs", actions.len())));
        }
        let ids: Vec<u32> = actions.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let results = py.detach(|| self.pool.step_all(&ids)).map_err(runtime_error)?;
        Ok(Batch::from_results(results, self.spec.metrics.len()))
    }
}

/// Run the conformance suite on the plugin at `path`: `{"file", "passed",
/// "checks": [{"name", "status", "message"}], "problems": [{"severity",
/// "rule", "message"}]}` (see `Report` in ragen_envs/_core.pyi). The GIL is
/// released while the suite plays the plugin.
#[pyfunction]
#[pyo3(signature = (path, settings, seeds, budget_seconds))]
fn validate<'py>(
    py: Python<'py>,
    path: &str,
    settings: Vec<(String, String)>,
    seeds: u64,
    budget_seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    if !budget_seconds.is_finite() || budget_seconds <= 0.0 {
        return Err(PyValueError::new_err(format!("budget {budget_seconds}: use a positive number of seconds")));
    }
    let opts = ragen_conformance::Options { settings, seeds, budget: Duration::from_secs_f64(budget_seconds), ..Default::default() };
    let report = py.detach(|| ragen_conformance::validate(std::path::Path::new(path), &opts, &mut |_| {}));
    let checks = PyList::empty(py);
    for c in &report.checks {
        let d = PyDict::new(py);
        d.set_item("name", c.name)?;
        d.set_item("status", c.status.as_str())?;
        d.set_item("message", &c.message)?;
        checks.append(d)?;
    }
    let problems = PyList::empty(py);
    for p in &report.problems {
        let d = PyDict::new(py);
        d.set_item("severity", p.severity.as_str())?;
        d.set_item("rule", p.rule)?;
        d.set_item("message", &p.message)?;
        problems.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("file", &report.file)?;
    d.set_item("passed", report.passed())?;
    d.set_item("checks", checks)?;
    d.set_item("problems", problems)?;
    Ok(d)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Pool>()?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_class::<rollouts::Rollouts>()?;
    m.add("EnvFailureError", m.py().get_type::<EnvFailureError>())?;
    Ok(())
}
