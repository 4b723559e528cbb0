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
        Ok(Box::new(RemoteEnvs::new(self, config.num_envs, config.batched)?))
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

/// How one server's envs travel.
enum Channel {
    /// One session per env, as any OpenEnv server takes them (`/ws`).
    PerEnv(Vec<Session>),
    /// A few sessions sharing them, one frame per session per call
    /// (ragen-host's `/ragen/batch`): member `m` is env `m / k` of lane
    /// `m % k`. Two lanes let the server read one frame while it steps
    /// the other's envs.
    Batched(Vec<Lane>),
}

/// One batched session and its route (`/ragen/batch?envs=N`).
struct Lane {
    session: Session,
    url: url::Url,
}

/// Batched sessions per server (see [`Channel::Batched`]).
const LANES: usize = 2;

/// One server's share of the envs: env `i` of the batch is member
/// `i / n` of server `i % n`.
struct Server {
    endpoint: usize,
    channel: Channel,
}

/// The mutable part of a batch: each server's sessions, and each env's
/// episode seed.
struct State {
    servers: Vec<Server>,
    seeds: Vec<Option<u64>>,
}

/// A batch of remote envs (see the crate docs). Each call sends every
/// env's frame at once (one frame per server with ragen-host's server) and
/// waits for every answer, each under its deadline.
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
    num_envs: usize,
    state: Mutex<State>,
}

/// One env's call: its seed or its action, as the batched frames carry
/// them (`per_env` wraps them in OpenEnv's request models).
struct Call {
    env: usize,
    item: Value,
}

impl RemoteEnvs {
    fn new(remote: &Remote, num_envs: usize, batched: bool) -> Result<Self> {
        let n = remote.address.endpoints.len();
        let servers = (0..n.min(num_envs))
            .map(|endpoint| {
                let members = (endpoint..num_envs).step_by(n).count();
                let channel = match (batched, &remote.dialect) {
                    (true, Dialect::Ragen) => {
                        let k = LANES.min(members);
                        let lane = |l: usize| Lane {
                            session: Session::new(),
                            url: remote.address.endpoints[endpoint].batch((l..members).step_by(k).count()),
                        };
                        Channel::Batched((0..k).map(lane).collect())
                    }
                    _ => Channel::PerEnv((0..members).map(|_| Session::new()).collect()),
                };
                Server { endpoint, channel }
            })
            .collect();
        let names = match &remote.spec.action_space {
            ActionSpace::Names(names) => names.clone(),
            ActionSpace::Text(_) => Vec::new(),
        };
        let field = match &remote.dialect {
            Dialect::Ragen => "action".to_string(),
            Dialect::OpenEnv { field } => field.clone(),
        };
        Ok(Self {
            runtime: runtime()?,
            address: remote.address.clone(),
            dialect: remote.dialect.clone(),
            metrics: remote.spec.metrics.clone(),
            names,
            field,
            token: token(),
            num_envs,
            state: Mutex::new(State { servers, seeds: vec![None; num_envs] }),
        })
    }

    /// Run `calls` of `kind` (`reset` or `step`) at once; each env's answer
    /// `data` (or why not), in the order given.
    fn batch(&self, kind: &str, calls: Vec<Call>) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.address.endpoints.len();
        let mut per_server: Vec<Vec<(usize, usize, Value)>> = (0..state.servers.len()).map(|_| Vec::new()).collect();
        let mut seen = vec![false; self.num_envs];
        for (pos, call) in calls.into_iter().enumerate() {
            if call.env >= self.num_envs {
                bail!("env id {} is out of range; there are {} envs", call.env, self.num_envs);
            }
            if std::mem::replace(&mut seen[call.env], true) {
                bail!("env {} is named twice in one call", call.env);
            }
            if kind == "reset" {
                state.seeds[call.env] = call.item.as_u64();
            }
            per_server[call.env % n].push((pos, call.env / n, call.item));
        }
        let reset = kind == "reset";
        let State { servers, seeds } = &mut *state;
        let how = How {
            kind,
            field: &self.field,
            reset,
            options: &self.address.options,
            token: self.token.as_deref(),
            dialect: &self.dialect,
            metrics: &self.metrics,
        };
        let futures = servers.iter_mut().zip(per_server).filter(|(_, calls)| !calls.is_empty()).map(|(server, calls)| {
            let endpoint = &self.address.endpoints[server.endpoint];
            let how = &how;
            async move {
                let answers = match &mut server.channel {
                    Channel::PerEnv(sessions) => per_env(sessions, endpoint, calls, how).await,
                    Channel::Batched(lanes) => batched(lanes, calls, how).await,
                };
                answers.into_iter().map(|(pos, member, answer)| (pos, member * n + server.endpoint, answer)).collect::<Vec<_>>()
            }
        });
        let mut answers: Vec<_> = self.runtime.block_on(futures_util::future::join_all(futures)).into_iter().flatten().collect();
        answers.sort_by_key(|a| a.0);
        let max = ReportLimits::default().max_abs_reward;
        Ok(answers
            .into_iter()
            .map(|(_, env, answer)| {
                let step = answer.and_then(|s| match s.reward.abs() > max {
                    true => Err(CallError::Invalid(format!("the reward {} is beyond ±{max}", s.reward))),
                    false => Ok(s),
                });
                step.map_err(|e| self.failure(env, seeds[env], e))
            })
            .collect())
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

    fn seeds(&self) -> Vec<Option<u64>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).seeds.clone()
    }
}

/// What every call of a batch shares.
struct How<'a> {
    kind: &'a str,
    /// The action model's one field, over `/ws`.
    field: &'a str,
    reset: bool,
    options: &'a RemoteOptions,
    token: Option<&'a str>,
    dialect: &'a Dialect,
    metrics: &'a [String],
}

/// A server's envs answer, each `(position in the call, member)`.
type Answers = Vec<(usize, usize, Result<PoolStep, CallError>)>;

/// One server's share of a call over a session per env: every env's frame
/// at once.
async fn per_env(sessions: &mut [Session], endpoint: &Endpoint, calls: Vec<(usize, usize, Value)>, how: &How<'_>) -> Answers {
    let link = Link { url: &endpoint.ws, options: how.options, token: how.token };
    let link = &link;
    let mut by_member: Vec<Option<(usize, Value)>> = (0..sessions.len()).map(|_| None).collect();
    for (pos, member, item) in calls {
        by_member[member] = Some((pos, item));
    }
    let each = sessions.iter_mut().zip(by_member).enumerate().filter_map(|(member, (session, call))| {
        let (pos, item) = call?;
        // `/ws` takes OpenEnv's request models: `{"seed": …}`, `{FIELD: action}`.
        let data = if how.reset { json!({"seed": item}) } else { json!({how.field: item}) };
        let frame = json!({"type": how.kind, "data": data});
        Some(async move {
            let answer = session.call(link, frame, "observation", how.reset).await;
            (pos, member, answer.and_then(|data| schema::step_of(&data, how.dialect, how.metrics).map_err(CallError::Invalid)))
        })
    });
    futures_util::future::join_all(each).await
}

/// One server's share of a call over its batched sessions: one frame per
/// lane, all lanes at once.
async fn batched(lanes: &mut [Lane], calls: Vec<(usize, usize, Value)>, how: &How<'_>) -> Answers {
    let k = lanes.len();
    let mut per_lane: Vec<Vec<(usize, usize, Value)>> = (0..k).map(|_| Vec::new()).collect();
    for (pos, member, item) in calls {
        per_lane[member % k].push((pos, member, item));
    }
    let each = lanes.iter_mut().zip(per_lane).filter(|(_, calls)| !calls.is_empty()).map(|(lane, calls)| async move {
        let link = Link { url: &lane.url, options: how.options, token: how.token };
        let locals: Vec<usize> = calls.iter().map(|(_, m, _)| m / k).collect();
        let key = if how.reset { "seeds" } else { "actions" };
        let (placed, items): (Vec<(usize, usize)>, Vec<Value>) = calls.into_iter().map(|(p, m, item)| ((p, m), item)).unzip();
        let frame = json!({"type": how.kind, "data": {"envs": locals, key: items}});
        let count = placed.len();
        match lane.session.call_with(&link, frame, how.reset, |text| schema::batch_answer(text, count, how.metrics)).await {
            Ok(each) => placed.into_iter().zip(each).map(|((pos, member), a)| (pos, member, a)).collect::<Vec<_>>(),
            Err(e) => placed.into_iter().map(|(pos, member)| (pos, member, Err(e.clone()))).collect(),
        }
    });
    futures_util::future::join_all(each).await.into_iter().flatten().collect()
}

impl Envs for RemoteEnvs {
    fn num_envs(&self) -> usize {
        self.num_envs
    }

    fn reset(&self, env_ids: &[usize], seeds: &[u64]) -> Result<Vec<Result<String, EnvFailure>>> {
        if env_ids.len() != seeds.len() {
            bail!("reset: {} env ids but {} seeds", env_ids.len(), seeds.len());
        }
        let calls = env_ids.iter().zip(seeds).map(|(&env, &seed)| Call { env, item: json!(seed) }).collect();
        Ok(self.batch("reset", calls)?.into_iter().map(|a| a.map(|s| s.observation)).collect())
    }

    fn step(&self, env_ids: &[usize], actions: &[Action]) -> Result<Vec<Result<PoolStep, EnvFailure>>> {
        if env_ids.len() != actions.len() {
            bail!("step: {} env ids but {} actions", env_ids.len(), actions.len());
        }
        let mut calls = Vec::with_capacity(env_ids.len());
        for (&env, action) in env_ids.iter().zip(actions) {
            let item = match action {
                Action::Id(id) => {
                    let name = self
                        .names
                        .get(*id as usize)
                        .with_context(|| format!("action id {id}: the env has {} actions", self.names.len()))?;
                    Value::String(name.clone())
                }
                Action::Text(text) => Value::String(text.clone()),
            };
            calls.push(Call { env, item });
        }
        self.batch("step", calls)
    }

    fn oracle(&self, env_ids: &[usize], _max_actions: &[u32]) -> Result<Vec<Result<Vec<Action>, EnvFailure>>> {
        let seeds = self.seeds();
        Ok(env_ids
            .iter()
            .map(|&env| {
                let message = "a remote env has no oracle: play it with a policy, or run the plugin locally for --policy oracle".into();
                let seed = seeds.get(env).copied().flatten();
                Err(EnvFailure { plugin: self.address.to_string(), env, seed, kind: FailureKind::Env(ErrorKind::Failed), message })
            })
            .collect())
    }

    fn stats(&self) -> Result<PoolStats> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let open = |s: &Server| match &s.channel {
            Channel::PerEnv(sessions) => sessions.iter().filter(|s| s.is_open()).count(),
            Channel::Batched(lanes) => lanes.iter().filter(|l| l.session.is_open()).count(),
        };
        Ok(PoolStats { envs: self.num_envs, instances: state.servers.iter().map(open).sum(), ..PoolStats::default() })
    }
}

impl Drop for RemoteEnvs {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let sessions = state.servers.iter_mut().flat_map(|s| match &mut s.channel {
            Channel::PerEnv(sessions) => sessions.iter_mut().collect::<Vec<_>>(),
            Channel::Batched(lanes) => lanes.iter_mut().map(|l| &mut l.session).collect(),
        });
        let closing: Vec<_> = sessions.map(|s| s.close()).collect();
        self.runtime.block_on(futures_util::future::join_all(closing));
    }
}
