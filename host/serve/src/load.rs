//! A WebSocket client of the server, and the load test built on it: many
//! sessions at once, each playing a fixed schedule of seeds and actions,
//! and the same schedule replayed in-process on an [`EnvPool`] to check
//! that every session saw exactly what the plugin does without a server.
//!
//! Used by the benchmark (`cargo bench -p ragen-serve --bench load`) and
//! by the tests, at different sizes.

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use ragen_runtime::{Action, EnvPool, Plugin, PoolConfig, PoolStep};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// One session over `/ws`, speaking the frames of [`crate::protocol`].
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    /// Open a session; `token` is sent as a bearer token.
    pub async fn connect(addr: SocketAddr, token: Option<&str>) -> Result<Self> {
        let mut request = format!("ws://{addr}/ws").into_client_request()?;
        if let Some(token) = token {
            request.headers_mut().insert(AUTHORIZATION, format!("Bearer {token}").parse()?);
        }
        let (ws, _) =
            tokio_tungstenite::connect_async(request).await.with_context(|| format!("cannot open a session at ws://{addr}/ws"))?;
        Ok(Self { ws })
    }

    /// Send one frame and return the reply frame. An error frame is a
    /// reply too (`{"type": "error", …}`); a closed socket is an `Err`.
    pub async fn call(&mut self, frame: &Value) -> Result<Value> {
        self.ws.send(Message::Text(frame.to_string().into())).await.context("cannot send")?;
        match self.next_frame().await? {
            Ok(reply) => Ok(reply),
            Err(close) => bail!("the server closed the session: {}", describe_close(close.as_ref())),
        }
    }

    /// The next frame: a JSON reply, or the close frame the session ended with.
    pub async fn next_frame(&mut self) -> Result<Result<Value, Option<CloseFrame>>> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(text))) => return Ok(Ok(serde_json::from_str(&text).context("a reply is not JSON")?)),
                Some(Ok(Message::Close(frame))) => return Ok(Err(frame)),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e).context("the session broke"),
                None => return Ok(Err(None)),
            }
        }
    }

    pub async fn reset(&mut self, seed: u64) -> Result<Value> {
        self.call(&json!({"type": "reset", "data": {"seed": seed}})).await
    }

    pub async fn step(&mut self, action: Value) -> Result<Value> {
        self.call(&json!({"type": "step", "data": {"action": action}})).await
    }

    /// Send a raw text frame (for testing the server's refusals).
    pub async fn send_text(&mut self, text: String) -> Result<()> {
        self.ws.send(Message::Text(text.into())).await.context("cannot send")
    }

    /// Say goodbye as OpenEnv's client does, and wait for the close.
    pub async fn close(mut self) -> Result<()> {
        self.ws.send(Message::Text(json!({"type": "close"}).to_string().into())).await?;
        while let Some(Ok(m)) = self.ws.next().await {
            if m.is_close() {
                break;
            }
        }
        Ok(())
    }
}

/// One HTTP/1.1 request on its own connection, for the tests and the
/// bench: (status, body). Deliberately minimal (no chunked bodies, no
/// keep-alive): the server answers every route with a length.
pub async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.with_context(|| format!("cannot connect to {addr}"))?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request += &format!("{k}: {v}\r\n");
    }
    request += "\r\n";
    request += body;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).with_context(|| format!("not an HTTP response: {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// Wait until `/metrics` has a line starting with `line` (e.g.
/// `ragen_serve_resets_total 3`), for up to `limit`.
pub async fn wait_for_metric(addr: SocketAddr, line: &str, limit: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let (_, metrics) = http(addr, "GET", "/metrics", &[], "").await?;
        if metrics.lines().any(|l| l.starts_with(line)) {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("no `{line}` in /metrics within {limit:?}: {metrics}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Shutdown with calls in flight, as the in-process and the binary tests
/// both check it: open `sessions` sessions, send each a reset of `seed`,
/// wait until the server has counted them all (a frame it has not read is
/// not in flight), call `stop`, and return what each session got next: its
/// reply, then the close code that ended it (`None`: no close frame).
pub async fn resets_in_flight_then(addr: SocketAddr, sessions: usize, seed: u64, stop: impl FnOnce()) -> Result<Vec<(Value, Option<u16>)>> {
    let mut clients = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        clients.push(Client::connect(addr, None).await?);
    }
    for c in &mut clients {
        c.send_text(json!({"type": "reset", "data": {"seed": seed}}).to_string()).await?;
    }
    wait_for_metric(addr, &format!("ragen_serve_resets_total {sessions}"), Duration::from_secs(10)).await?;
    stop();
    let mut outcomes = Vec::with_capacity(sessions);
    for c in &mut clients {
        let reply = match c.next_frame().await? {
            Ok(reply) => reply,
            Err(close) => bail!("the in-flight reset got no answer: the session closed ({})", describe_close(close.as_ref())),
        };
        let closed = match c.next_frame().await? {
            Err(close) => close.map(|f| u16::from(f.code)),
            Ok(frame) => bail!("after the reply, a frame instead of the close: {frame}"),
        };
        outcomes.push((reply, closed));
    }
    Ok(outcomes)
}

fn describe_close(frame: Option<&CloseFrame>) -> String {
    match frame {
        Some(f) => format!("code {}, {}", u16::from(f.code), f.reason),
        None => "without a close frame".into(),
    }
}

/// What each session plays: session `s`'s `k`-th episode has seed
/// `seed_start + k * sessions + s`, and its `t`-th step takes a fixed
/// pseudo-random action id. An episode that ends (or fails) is followed by
/// a reset to the next.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub sessions: usize,
    /// Steps per session.
    pub steps: usize,
    pub seed_start: u64,
    /// Action ids are drawn from `0..num_actions`.
    pub num_actions: u32,
}

impl Schedule {
    pub fn seed(&self, session: usize, episode: usize) -> u64 {
        self.seed_start + (episode * self.sessions + session) as u64
    }

    pub fn action(&self, session: usize, step: usize) -> u32 {
        // SplitMix64's finaliser: well spread, and the same everywhere.
        let mut z = ((session as u64) << 32 ^ step as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % u64::from(self.num_actions.max(1))) as u32
    }
}

/// What one call returned, as both sides can tell it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A reset's first observation.
    Reset {
        seed: u64,
        text: String,
    },
    Step {
        action: u32,
        text: String,
        reward: f64,
        done: bool,
        success: bool,
    },
    /// The call failed (the env's episode is over).
    Failed {
        seed: u64,
    },
}

/// One session's calls, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub events: Vec<Event>,
}

impl Trace {
    pub fn failures(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Failed { .. })).count()
    }

    pub fn steps(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Step { .. })).count()
    }
}

/// The outcome of [`run`].
#[derive(Debug)]
pub struct LoadReport {
    /// Each session's trace, or why the session broke off.
    pub traces: Vec<Result<Trace, String>>,
    /// Round trips of every step, as the clients measured them.
    pub step_latencies: Vec<Duration>,
    pub elapsed: Duration,
}

impl LoadReport {
    /// The `p`-th percentile (0-100) of step round trips.
    pub fn latency(&self, p: f64) -> Duration {
        let mut l = self.step_latencies.clone();
        l.sort_unstable();
        l.get(((l.len().saturating_sub(1)) as f64 * p / 100.0).round() as usize).copied().unwrap_or_default()
    }

    pub fn steps_per_sec(&self) -> f64 {
        self.step_latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Play `schedule` against the server at `addr`, every session at once.
pub async fn run(addr: SocketAddr, schedule: Schedule, token: Option<String>) -> LoadReport {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..schedule.sessions {
        let token = token.clone();
        tasks.spawn(async move { (s, play(addr, schedule, s, token.as_deref()).await) });
    }
    let mut traces: Vec<Result<Trace, String>> = vec![Err("did not run".into()); schedule.sessions];
    let mut step_latencies = Vec::with_capacity(schedule.sessions * schedule.steps);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((s, Ok((trace, latencies)))) => {
                traces[s] = Ok(trace);
                step_latencies.extend(latencies);
            }
            Ok((s, Err(e))) => traces[s] = Err(format!("{e:#}")),
            Err(e) => tracing::error!("a load session panicked: {e}"),
        }
    }
    LoadReport { traces, step_latencies, elapsed: start.elapsed() }
}

async fn play(addr: SocketAddr, schedule: Schedule, s: usize, token: Option<&str>) -> Result<(Trace, Vec<Duration>)> {
    let mut client = Client::connect(addr, token).await?;
    let mut trace = Trace::default();
    let mut latencies = Vec::with_capacity(schedule.steps);
    let (mut episode, mut live) = (0, false);
    for t in 0..schedule.steps {
        if !live {
            let seed = schedule.seed(s, episode);
            episode += 1;
            let reply = client.reset(seed).await?;
            live = reply["type"] == "observation";
            trace.events.push(if live { Event::Reset { seed, text: text_of(&reply) } } else { Event::Failed { seed } });
            if !live {
                continue;
            }
        }
        let action = schedule.action(s, t);
        let sent = Instant::now();
        let reply = client.step(json!(action)).await?;
        latencies.push(sent.elapsed());
        if reply["type"] == "observation" {
            let data = &reply["data"];
            let done = data["done"].as_bool().context("a step reply without `done`")?;
            let reward = data["reward"].as_f64().context("a step reply without `reward`")?;
            let success = data["observation"]["success"].as_bool().unwrap_or(false);
            trace.events.push(Event::Step { action, text: text_of(&reply), reward, done, success });
            live = !done;
        } else {
            trace.events.push(Event::Failed { seed: schedule.seed(s, episode - 1) });
            live = false;
        }
    }
    client.close().await?;
    Ok((trace, latencies))
}

fn text_of(reply: &Value) -> String {
    reply["data"]["observation"]["text"].as_str().unwrap_or_default().to_string()
}

/// The same schedule, in-process: one pool, every session's call of a
/// round in one batch. What each session of [`run`] must have seen.
pub fn replay(plugin: Arc<Plugin>, settings: &[(String, String)], schedule: Schedule) -> Result<Vec<Trace>> {
    let n = schedule.sessions;
    let config = PoolConfig { settings: settings.to_vec(), autoreset: false, ..PoolConfig::new(n) };
    let pool = EnvPool::new(plugin, &config)?;
    let mut traces = vec![Trace::default(); n];
    let (mut episode, mut live) = (vec![0usize; n], vec![false; n]);
    for t in 0..schedule.steps {
        let ids: Vec<usize> = (0..n).filter(|&s| !live[s]).collect();
        let seeds: Vec<u64> = ids.iter().map(|&s| schedule.seed(s, episode[s])).collect();
        for ((&s, &seed), first) in ids.iter().zip(&seeds).zip(pool.reset(&ids, &seeds)?) {
            episode[s] += 1;
            live[s] = first.is_ok();
            traces[s].events.push(match first {
                Ok(text) => Event::Reset { seed, text },
                Err(_) => Event::Failed { seed },
            });
        }
        let ids: Vec<usize> = (0..n).filter(|&s| live[s]).collect();
        let actions: Vec<Action> = ids.iter().map(|&s| Action::Id(schedule.action(s, t))).collect();
        for ((&s, action), result) in ids.iter().zip(&actions).zip(pool.step(&ids, &actions)?) {
            let Action::Id(action) = *action else { unreachable!() };
            traces[s].events.push(match result {
                Ok(PoolStep { observation, reward, done, info, .. }) => {
                    live[s] = !done;
                    Event::Step { action, text: observation, reward, done, success: info.success }
                }
                Err(_) => {
                    live[s] = false;
                    Event::Failed { seed: schedule.seed(s, episode[s] - 1) }
                }
            });
        }
    }
    Ok(traces)
}
