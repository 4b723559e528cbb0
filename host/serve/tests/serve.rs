//! The server in-process on loopback: OpenEnv's frames, a small load test
//! checked against in-process replay, faults under load, and every limit
//! (session cap, oversized requests, idle reaping, the bearer token, and a
//! graceful shutdown with calls in flight).

use ragen_runtime::{Plugin, SandboxLimits};
use ragen_serve::{CancellationToken, ServeConfig, Server};
use ragen_test_fixtures::serve_load::{self as load, Client, Schedule};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
    serving: JoinHandle<anyhow::Result<()>>,
    plugin: Arc<Plugin>,
}

impl Running {
    async fn start(path: &Path, limits: SandboxLimits, config: ServeConfig) -> Self {
        let plugin = Arc::new(Plugin::from_file_with(path, limits).unwrap());
        let server = Server::new(plugin.clone(), config).unwrap();
        let stop = server.shutdown_token();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        Self { addr, stop, serving: tokio::spawn(server.serve(listener)), plugin }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.serving).await.expect("shutdown within 30 s").unwrap().unwrap();
    }
}

fn config(max_sessions: usize) -> ServeConfig {
    ServeConfig { max_sessions, threads: 2, ..ServeConfig::default() }
}

async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    load::http(addr, method, path, headers, body).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_speaks_openenv_frames() {
    let server = Running::start(&ragen_test_fixtures::plugin("sokoban"), SandboxLimits::default(), config(4)).await;
    let mut c = Client::connect(server.addr, None).await.unwrap();
    let first = c.call(&json!({"type": "reset", "data": {"seed": 42, "episode_id": "ep-1"}})).await.unwrap();
    assert_eq!(first["type"], "observation", "{first}");
    assert_eq!(first["data"]["reward"], Value::Null, "a reset has no reward, as OpenEnv's");
    assert_eq!(first["data"]["done"], false);
    assert!(first["data"]["observation"]["text"].as_str().unwrap().contains('#'), "{first}");
    let step = c.step(json!("up")).await.unwrap();
    assert_eq!(step["type"], "observation", "{step}");
    assert!(step["data"]["reward"].is_f64(), "{step}");
    assert!(step["data"]["observation"]["metrics"].is_object(), "{step}");
    let state = c.call(&json!({"type": "state"})).await.unwrap();
    assert_eq!(state["type"], "state");
    assert_eq!(state["data"]["episode_id"], "ep-1");
    assert_eq!(state["data"]["step_count"], 1);
    assert_eq!(state["data"]["seed"], 42);

    // Mistakes get error frames and the session goes on.
    let unknown = c.step(json!("Jump")).await.unwrap();
    assert_eq!(unknown["data"]["code"], "VALIDATION_ERROR");
    assert!(unknown["data"]["message"].as_str().unwrap().contains("this env's actions: Up, Down, Left, Right"), "{unknown}");
    c.send_text("not json{".into()).await.unwrap();
    assert_eq!(c.next_frame().await.unwrap().unwrap()["data"]["code"], "INVALID_JSON");
    let other = c.call(&json!({"type": "frobnicate"})).await.unwrap();
    assert_eq!(other["data"]["code"], "UNKNOWN_TYPE");
    assert_eq!(c.step(json!(1)).await.unwrap()["type"], "observation", "the session survives its mistakes");

    // The same seed and actions over HTTP's stateless /step give the same first step.
    let (status, body) = http(server.addr, "POST", "/step", &[], r#"{"action": {"action": "Up"}, "seed": 42}"#).await;
    assert_eq!(status, 200, "{body}");
    let http_step: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(http_step, step["data"], "HTTP /step = the first step of a WebSocket episode on the same seed");
    let (status, body) = http(server.addr, "GET", "/schema", &[], "").await;
    assert_eq!(status, 200);
    let schema: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(schema["action"]["properties"]["action"]["anyOf"][0]["enum"], json!(["Up", "Down", "Left", "Right"]));
    let (status, body) = http(server.addr, "GET", "/metadata", &[], "").await;
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()["name"].clone()), (200, json!("sokoban")));
    c.close().await.unwrap();
    server.stop().await;
}

/// The load test of `benches/load.rs`, small: every response arrives and
/// each session's trajectory equals the same schedule run in-process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_see_what_the_plugin_does_in_process() {
    let schedule = Schedule { sessions: 64, steps: 30, seed_start: 0, num_actions: 4 };
    let server = Running::start(&ragen_test_fixtures::plugin("sokoban"), SandboxLimits::default(), config(64)).await;
    let report = load::run(server.addr, schedule, None).await;
    let plugin = server.plugin.clone();
    server.stop().await;
    let expected = load::replay(plugin, &[], schedule).unwrap();
    assert_eq!(report.step_latencies.len(), 64 * 30, "every step answered");
    for (s, (got, want)) in report.traces.iter().zip(&expected).enumerate() {
        let got = got.as_ref().unwrap_or_else(|e| panic!("session {s} broke off: {e}"));
        assert_eq!(got, want, "session {s}");
    }
    assert!(
        expected.iter().any(|t| t.events.iter().filter(|e| matches!(e, load::Event::Reset { .. })).count() > 1),
        "some episodes ended and were reset"
    );
}

/// Faulty plugins under load: the sessions whose seeds fault (3 mod 4) get
/// error frames, the others complete, and every trajectory is what the
/// plugin gives in-process, where the same faults happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_stay_in_their_sessions_under_load() {
    // Roomy enough that a loaded CI machine never times out an honest call.
    let limits = SandboxLimits { call_timeout: Duration::from_millis(500), memory_bytes: 64 << 20, ..SandboxLimits::default() };
    for fault in ["loop-in-step", "trap-in-reset", "grow-memory", "stack-overflow"] {
        let path = ragen_test_fixtures::test_plugin(fault);
        let schedule = Schedule { sessions: 16, steps: 6, seed_start: 0, num_actions: 2 };
        let server = Running::start(&path, limits.clone(), ServeConfig { envs_per_instance: 4, ..config(16) }).await;
        let report = load::run(server.addr, schedule, None).await;
        let (status, metrics) = http(server.addr, "GET", "/metrics", &[], "").await;
        server.stop().await;
        assert_eq!(status, 200);
        let plugin = Arc::new(Plugin::from_file_with(&path, limits.clone()).unwrap());
        let expected = load::replay(plugin, &[], schedule).unwrap();
        let mut failed_sessions = 0;
        for (s, (got, want)) in report.traces.iter().zip(&expected).enumerate() {
            let got = got.as_ref().unwrap_or_else(|e| panic!("{fault}: session {s} broke off: {e}"));
            assert_eq!(got, want, "{fault}: session {s}");
            if got.failures() > 0 {
                failed_sessions += 1;
                assert_eq!(s % 4, 3, "{fault}: only seeds 3 mod 4 fault, session {s} failed");
            } else {
                assert_eq!(got.steps(), 6, "{fault}: session {s} completed every step");
            }
        }
        assert_eq!(failed_sessions, 4, "{fault}: the four sessions with faulting seeds got errors");
        assert!(metrics.contains("ragen_serve_faults_total{kind="), "{fault}: faults are counted: {metrics}");
        assert!(metrics.contains("ragen_serve_recoveries_total{kind=\"rebuilt_instances\"}"), "{fault}: recoveries are counted: {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cap_answers_503_and_frees_on_close() {
    let server = Running::start(&ragen_test_fixtures::plugin("bandit"), SandboxLimits::default(), config(2)).await;
    let a = Client::connect(server.addr, None).await.unwrap();
    let _b = Client::connect(server.addr, None).await.unwrap();
    let third = Client::connect(server.addr, None).await.err().expect("a third session is refused");
    let text = format!("{third:#}");
    assert!(text.contains("503"), "{text}");
    let (status, body) = http(server.addr, "POST", "/reset", &[], "{}").await;
    assert_eq!(status, 503);
    assert!(body.contains("server at capacity: 2/2 sessions") && body.contains("--max-sessions"), "{body}");
    a.close().await.unwrap();
    load::wait_for_metric(server.addr, "ragen_serve_sessions_active 1", Duration::from_secs(10)).await.unwrap();
    let mut again = Client::connect(server.addr, None).await.expect("a closed session frees its slot");
    assert_eq!(again.reset(1).await.unwrap()["type"], "observation");
    let (_, metrics) = http(server.addr, "GET", "/metrics", &[], "").await;
    assert!(metrics.contains("ragen_serve_rejected_total{reason=\"capacity\"} 2"), "{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused() {
    let cfg = ServeConfig { max_request_bytes: 1024, ..config(2) };
    let server = Running::start(&ragen_test_fixtures::plugin("bandit"), SandboxLimits::default(), cfg).await;
    let big = format!(r#"{{"seed": 1, "episode_id": "{}"}}"#, "x".repeat(2000));
    let (status, body) = http(server.addr, "POST", "/reset", &[], &big).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("--max-request-bytes"), "{body}");
    let mut c = Client::connect(server.addr, None).await.unwrap();
    c.send_text(json!({"type": "reset", "data": {"episode_id": "x".repeat(2000)}}).to_string()).await.unwrap();
    match c.next_frame().await {
        Ok(Err(Some(close))) => assert_eq!(u16::from(close.code), 1009, "{close:?}"),
        other => panic!("an oversized message closes the session with 1009, got {other:?}"),
    }
    server.stop().await;
}

/// An observation over the sandbox's cap fails the session's episode with
/// an error naming the sizes; the session and the server go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_observations_fail_only_the_episode() {
    let limits = SandboxLimits { max_observation_bytes: 4096, ..SandboxLimits::default() };
    let server = Running::start(&ragen_test_fixtures::test_plugin("huge-observation"), limits, config(2)).await;
    let mut c = Client::connect(server.addr, None).await.unwrap();
    let reply = c.reset(0).await.unwrap();
    assert_eq!(reply["data"]["code"], "EXECUTION_ERROR", "{reply}");
    let message = reply["data"]["message"].as_str().unwrap();
    assert!(message.contains("exceeds the cap of 4096 bytes") && message.contains("send reset"), "{message}");
    let state = c.call(&json!({"type": "state"})).await.unwrap();
    assert_eq!(state["data"]["done"], true, "{state}");
    assert_eq!(c.step(json!(0)).await.unwrap()["data"]["code"], "EXECUTION_ERROR", "no step in a failed episode");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_reaped() {
    let cfg = ServeConfig { idle_timeout: Duration::from_secs(1), ..config(2) };
    let server = Running::start(&ragen_test_fixtures::plugin("bandit"), SandboxLimits::default(), cfg).await;
    let mut c = Client::connect(server.addr, None).await.unwrap();
    assert_eq!(c.reset(1).await.unwrap()["type"], "observation");
    let frame = tokio::time::timeout(Duration::from_secs(5), c.next_frame()).await.expect("reaped within 5 s").unwrap();
    match frame {
        Err(Some(close)) => assert!(close.reason.contains("idle"), "{close:?}"),
        other => panic!("an idle session is closed with a reason, got {other:?}"),
    }
    let (_, health) = http(server.addr, "GET", "/health", &[], "").await;
    assert_eq!(serde_json::from_str::<Value>(&health).unwrap()["sessions"], 0, "the reaped session's slot is free: {health}");
    let (_, metrics) = http(server.addr, "GET", "/metrics", &[], "").await;
    assert!(metrics.contains("ragen_serve_sessions_reaped_total 1"), "{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_is_checked_on_every_request() {
    let cfg = ServeConfig { token: Some("s3cret".into()), ..config(2) };
    let server = Running::start(&ragen_test_fixtures::plugin("bandit"), SandboxLimits::default(), cfg).await;
    for path in ["/health", "/schema", "/metrics"] {
        let (status, body) = http(server.addr, "GET", path, &[], "").await;
        assert_eq!(status, 401, "{path} without a token: {body}");
        assert!(body.contains("missing bearer token"), "{body}");
        let (status, body) = http(server.addr, "GET", path, &[("authorization", "Bearer guess")], "").await;
        assert_eq!(status, 401, "{path} with a wrong token");
        assert!(body.contains("wrong bearer token"), "{body}");
        let (status, _) = http(server.addr, "GET", path, &[("authorization", "Bearer s3cret")], "").await;
        assert_eq!(status, 200, "{path} with the token");
    }
    let refused = Client::connect(server.addr, None).await.err().expect("a session without the token is refused");
    assert!(format!("{refused:#}").contains("401"), "{refused:#}");
    let mut c = Client::connect(server.addr, Some("s3cret")).await.unwrap();
    assert_eq!(c.reset(0).await.unwrap()["type"], "observation");
    server.stop().await;
}

/// Shutdown while resets are in flight (each takes a few hundred ms in
/// `slow-reset`): they finish and are answered, then the sessions are
/// closed with 1001 and new work is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_calls_finish() {
    let server = Running::start(&ragen_test_fixtures::test_plugin("slow-reset"), SandboxLimits::default(), config(4)).await;
    let stop = server.stop.clone();
    for (reply, closed) in load::resets_in_flight_then(server.addr, 3, 5, move || stop.cancel()).await.unwrap() {
        assert_eq!(reply["type"], "observation", "the in-flight reset is answered: {reply}");
        assert_eq!(closed, Some(1001), "then the session closes with 1001");
    }
    assert!(Client::connect(server.addr, None).await.is_err(), "no new sessions after shutdown");
    tokio::time::timeout(Duration::from_secs(30), server.serving).await.unwrap().unwrap().unwrap();
}
