//! ragen-remote: environments on a server, played through the same batched
//! API as a plugin's pool ([`ragen_runtime::Envs`]).
//!
//! `--env ws://host:port` works wherever a plugin file does (`inspect`,
//! `play`, `eval`, `train`). The server is any OpenEnv server: one
//! WebSocket session per env, `reset` and `step` frames as openenv-core
//! 0.3 sends them. With ragen-host's own server the env is the plugin
//! itself (its `/ragen/spec` gives the legend, limits and metric names); with
//! anyone else's, the spec is read from `/schema` and `/metadata` (see
//! the `schema` module for the rules, and [`RemoteOptions`] for what the
//! address's query sets).
//!
//! **Nothing waits for ever, nothing is lost silently.** Every call has a
//! deadline. An env whose server is unreachable, closes its session or
//! misses the deadline fails its episode as [`FailureKind::Lost`]; the
//! other envs go on, and the env connects again at its next reset, so a
//! server that comes back is used again. Several servers joined by commas
//! share the envs (env `i` on server `i % n`).
//!
//! # Examples
//!
//! ```no_run
//! use ragen_remote::Remote;
//! use ragen_runtime::{Action, PoolConfig};
//! let remote = Remote::connect(&"ws://127.0.0.1:8000".parse()?)?;
//! let envs = remote.open(&PoolConfig::new(2))?;
//! let first = envs.reset(&[0, 1], &[7, 8])?;
//! let steps = envs.step(&[0, 1], &[Action::Id(0), Action::Id(1)])?;
//! # Ok::<(), anyhow::Error>(())
//! ```

mod address;
mod schema;
mod session;

pub use address::{Endpoint, OPTIONS, RemoteAddress, RemoteOptions, SCHEMES, is_remote};
pub use schema::Dialect;

use anyhow::{Context, Result, bail};
use ragen_runtime::{
    Action, ActionSpace, EnvFailure, EnvProvider, EnvSpec, Envs, ErrorKind, FailureKind, PluginInfo, PoolConfig, PoolStats, PoolStep,
    ReportLimits,
};
use serde_json::{Value, json};
use session::{CallError, Link, Session};
use std::sync::{Arc, Mutex};
use tokio::runtime::Runtime;

/// The environment variable holding the servers' bearer token, when they
/// want one (`ragen-host serve --token-file`).
pub const TOKEN_VAR: &str = "RAGEN_REMOTE_TOKEN";

/// A remote env source: the servers, and what they said about their env.
pub struct Remote {
    address: RemoteAddress,
    info: PluginInfo,
    spec: EnvSpec,
    dialect: Dialect,
}

impl Remote {
    /// Ask each server what it serves; they must all serve the same env.
    /// Fails with what to check when a server cannot be reached, is not an
    /// OpenEnv server, or has no usable action.
    pub fn connect(address: &RemoteAddress) -> Result<Arc<dyn EnvProvider>> {
        Ok(Arc::new(Self::describe_servers(address)?))
    }

    fn describe_servers(address: &RemoteAddress) -> Result<Self> {
        let runtime = runtime()?;
        let client = reqwest::Client::builder().timeout(address.options.timeout).build().context("cannot build an HTTP client")?;
        let token = token();
        let mut first: Option<(Self, Value)> = None;
        for endpoint in &address.endpoints {
            let (info, spec, dialect) = runtime.block_on(describe(&client, endpoint, &address.options, token.as_deref()))?;
            let limits = ReportLimits::default();
            limits.check_info(&info).map_err(|e| anyhow::anyhow!("{}: the server's env description is refused: {e}", endpoint.http))?;
            limits.check_spec(&spec).map_err(|e| anyhow::anyhow!("{}: the server's env spec is refused: {e}", endpoint.http))?;
            let seen = ragen_runtime::describe_json(&info, &spec);
            match &first {
                None => first = Some((Self { address: address.clone(), info, spec, dialect }, seen)),
                Some((f, fseen)) if *fseen != seen || f.dialect != dialect => bail!(
                    "{} and {} serve different envs ({} {} and {} {}): give one run servers of one env",
                    address.endpoints[0].http,
                    endpoint.http,
                    f.info.name,
                    f.info.version,
                    info.name,
                    info.version
                ),
                Some(_) => {}
            }
        }
        Ok(first.expect("an address names at least one server").0)
    }
}

impl EnvProvider for Remote {
    fn label(&self) -> String {
        self.address.to_string()
    }

    fn describe(&self, settings: &[(String, String)]) -> Result<(PluginInfo, EnvSpec)> {
        if let Some((k, _)) = settings.first() {
            bail!(
                "`{k}` is set for a remote env, whose settings are the server's: pass `--set {k}=…` to `ragen-host serve` \
                 (or configure the OpenEnv server), and leave [env] settings out of this run"
            );
        }
        Ok((self.info.clone(), self.spec.clone()))
    }

    fn has_oracle(&self) -> Result<bool> {
        Ok(false)
    }

    fn open(&self, config: &PoolConfig) -> Result<Box<dyn Envs>> {
        self.describe(&config.settings)?;
        if config.num_envs == 0 {
            bail!("a pool needs at least one env");
        }
        let names = match &self.spec.action_space {
            ActionSpace::Names(names) => names.clone(),
            ActionSpace::Text(_) => Vec::new(),
        };
        let field = match &self.dialect {
            Dialect::Ragen => "action".to_string(),
            Dialect::OpenEnv { field } => field.clone(),
        };
        Ok(Box::new(RemoteEnvs {
            runtime: runtime()?,
            address: self.address.clone(),
            dialect: self.dialect.clone(),
            metrics: self.spec.metrics.clone(),
            names,
            field,
            token: token(),
            envs: Mutex::new((0..config.num_envs).map(|_| RemoteEnv { session: Session::new(), seed: None }).collect()),
        }))
    }
}

fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the remote envs' I/O runtime")
}

fn token() -> Option<String> {
    std::env::var(TOKEN_VAR).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// One server's env: `/ragen/spec` when it has one, else OpenEnv's routes.
async fn describe(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    options: &RemoteOptions,
    token: Option<&str>,
) -> Result<(PluginInfo, EnvSpec, Dialect)> {
    if let Some(ours) = get_json(client, endpoint, "ragen/spec", token, false).await? {
        let (info, spec) = schema::ragen_spec(&ours, options).with_context(|| endpoint.route("ragen/spec").to_string())?;
        return Ok((info, spec, Dialect::Ragen));
    }
    let schema = get_json(client, endpoint, "schema", token, true).await?.expect("required");
    let metadata = get_json(client, endpoint, "metadata", token, false).await?.unwrap_or(Value::Null);
    schema::openenv_spec(&schema, &metadata, options).with_context(|| format!("{}", endpoint.http))
}

/// `GET route` as JSON; `None` for a 404 unless `required`.
async fn get_json(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    route: &str,
    token: Option<&str>,
    required: bool,
) -> Result<Option<Value>> {
    let url = endpoint.route(route);
    let mut request = client.get(url.clone());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.with_context(|| format!("cannot reach {url}: is the server running, and is this its address?"))?;
    let status = response.status();
    if status.as_u16() == 404 && !required {
        return Ok(None);
    }
    let body = response.text().await.with_context(|| format!("{url}: the answer broke off"))?;
    if status.as_u16() == 401 || status.as_u16() == 403 {
        bail!("{url} answered HTTP {status}: set {TOKEN_VAR} to the server's bearer token");
    }
    if !status.is_success() {
        bail!("{url} answered HTTP {status}: is it an OpenEnv server (openenv-core 0.3)? {}", body.chars().take(200).collect::<String>());
    }
    let value = serde_json::from_str(&body)
        .with_context(|| format!("{url} answered with something other than JSON: is it an OpenEnv server (openenv-core 0.3)?"))?;
    Ok(Some(value))
}

/// One remote env: its session and the seed of its episode.
struct RemoteEnv {
    session: Session,
    seed: Option<u64>,
}

/// A batch of remote envs (see the crate docs). Each call sends every
/// env's frame at once and waits for every answer, each under its deadline.
pub struct RemoteEnvs {
    runtime: Runtime,
    address: RemoteAddress,
    dialect: Dialect,
    metrics: Vec<String>,
    /// The action names, to send an id as its name.
    names: Vec<String>,
    /// The action model's one field.
    field: String,
    token: Option<String>,
    envs: Mutex<Vec<RemoteEnv>>,
}

/// One call of a batch: the env, its frame, and whether a closed session
/// may be opened for it (resets only).
struct Call {
    env: usize,
    frame: Value,
    seed: Option<u64>,
}

impl RemoteEnvs {
    /// Run `calls` at once; each env's answer `data` (or why not), in order.
    fn batch(&self, calls: Vec<Call>, reset: bool) -> Result<Vec<Result<Value, EnvFailure>>> {
        let mut envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
        let mut by_env: Vec<Option<(usize, Value)>> = (0..envs.len()).map(|_| None).collect();
        for (pos, call) in calls.into_iter().enumerate() {
            let slot =
                by_env.get_mut(call.env).with_context(|| format!("env id {} is out of range; there are {} envs", call.env, envs.len()))?;
            if slot.is_some() {
                bail!("env {} is named twice in one call", call.env);
            }
            if reset {
                envs[call.env].seed = call.seed;
            }
            *slot = Some((pos, call.frame));
        }
        let n = self.address.endpoints.len();
        let expected = "observation";
        let token = self.token.as_deref();
        let futures = envs.iter_mut().zip(by_env).enumerate().filter_map(|(id, (env, call))| {
            let (pos, frame) = call?;
            let link = Link { endpoint: &self.address.endpoints[id % n], options: &self.address.options, token };
            Some(async move {
                let answer = env.session.call(&link, frame, expected, reset).await;
                (pos, id, env.seed, answer)
            })
        });
        let mut answers = self.runtime.block_on(futures_util::future::join_all(futures));
        answers.sort_by_key(|a| a.0);
        Ok(answers.into_iter().map(|(_, id, seed, answer)| answer.map_err(|e| self.failure(id, seed, e))).collect())
    }

    fn failure(&self, env: usize, seed: Option<u64>, error: CallError) -> EnvFailure {
        let (kind, message) = match error {
            CallError::Lost(m) => (FailureKind::Lost, m),
            CallError::Invalid(m) => (FailureKind::InvalidOutput, m),
            CallError::Refused { code, message } => {
                let kind = if code == "VALIDATION_ERROR" { ErrorKind::BadAction } else { ErrorKind::Failed };
                (FailureKind::Env(kind), format!("{code}: {message}"))
            }
        };
        let endpoint = &self.address.endpoints[env % self.address.endpoints.len()];
        EnvFailure { plugin: endpoint.ws.to_string(), env, seed, kind, message }
    }

    fn step_of(&self, env: usize, seed: Option<u64>, data: Value) -> Result<PoolStep, EnvFailure> {
        let step = schema::step_of(&data, &self.dialect, &self.metrics).map_err(|m| self.failure(env, seed, CallError::Invalid(m)))?;
        let max = ReportLimits::default().max_abs_reward;
        if step.reward.abs() > max {
            let why = format!("the reward {} is beyond ±{max}", step.reward);
            return Err(self.failure(env, seed, CallError::Invalid(why)));
        }
        Ok(step)
    }

    fn seeds(&self) -> Vec<Option<u64>> {
        self.envs.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|e| e.seed).collect()
    }
}

impl Envs for RemoteEnvs {
    fn num_envs(&self) -> usize {
        self.envs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn reset(&self, env_ids: &[usize], seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>> {
        if env_ids.len() != seeds.len() {
            bail!("reset: {} env ids but {} seeds", env_ids.len(), seeds.len());
        }
        let calls = env_ids
            .iter()
            .zip(seeds)
            .map(|(&env, &seed)| Call { env, frame: json!({"type": "reset", "data": {"seed": seed}}), seed: Some(seed) })
            .collect();
        let answers = self.batch(calls, true)?;
        Ok(answers
            .into_iter()
            .zip(env_ids.iter().zip(seeds))
            .map(|(a, (&env, &seed))| a.and_then(|data| self.step_of(env, Some(seed), data)).map(|s| s.observation))
            .collect())
    }

    fn step(&self, env_ids: &[usize], actions: &[Action]) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        if env_ids.len() != actions.len() {
            bail!("step: {} env ids but {} actions", env_ids.len(), actions.len());
        }
        let mut calls = Vec::with_capacity(env_ids.len());
        for (&env, action) in env_ids.iter().zip(actions) {
            let value = match action {
                Action::Id(id) => {
                    let name = self
                        .names
                        .get(*id as usize)
                        .with_context(|| format!("action id {id}: the env has {} actions", self.names.len()))?;
                    Value::String(name.clone())
                }
                Action::Text(text) => Value::String(text.clone()),
            };
            calls.push(Call { env, frame: json!({"type": "step", "data": {self.field.as_str(): value}}), seed: None });
        }
        let answers = self.batch(calls, false)?;
        let seeds = self.seeds();
        Ok(answers.into_iter().zip(env_ids).map(|(a, &env)| a.and_then(|data| self.step_of(env, seeds[env], data))).collect())
    }

    fn oracle(&self, env_ids: &[usize], _max_actions: &[u32]) -> Result<Vec<Result<Vec<Action>, EnvFailure>>> {
        let seeds = self.seeds();
        Ok(env_ids
            .iter()
            .map(|&env| {
                let message = "a remote env has no oracle: play it with a policy, or run the plugin locally for --policy oracle".into();
                Err(EnvFailure {
                    plugin: self.address.to_string(),
                    env,
                    seed: seeds.get(env).copied().flatten(),
                    kind: FailureKind::Env(ErrorKind::Failed),
                    message,
                })
            })
            .collect())
    }

    fn stats(&self) -> Result<PoolStats> {
        let envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(PoolStats { envs: envs.len(), instances: envs.iter().filter(|e| e.session.is_open()).count(), ..PoolStats::default() })
    }
}

impl Drop for RemoteEnvs {
    fn drop(&mut self) {
        let envs = self.envs.get_mut().unwrap_or_else(|e| e.into_inner());
        let closing = envs.iter_mut().map(|e| e.session.close());
        self.runtime.block_on(futures_util::future::join_all(closing));
    }
}
