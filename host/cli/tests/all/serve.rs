//! `ragen-host serve` as a process: OpenEnv's own Python client
//! (openenv-core from PyPI) plays Sokoban on it and its conformance checks
//! pass, and SIGTERM with sessions in flight lets their calls finish.

use crate::common::{faulty, plugin, scratch};
use ragen_runtime::Plugin;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process on a free port; its log goes to `log`.
pub(crate) struct Served {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    log: PathBuf,
}

impl Served {
    pub(crate) fn start(name: &str, plugin: &Path, args: &[&str]) -> Self {
        Self::start_on(name, plugin, 0, args)
    }

    /// On `port` (0: any free one).
    pub(crate) fn start_on(name: &str, plugin: &Path, port: u16, args: &[&str]) -> Self {
        let log = scratch("serve").join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
            .args(["serve", plugin.to_str().unwrap(), "--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| {
                panic!("serve did not say where it listens: {line:?}; log: {}", std::fs::read_to_string(&log).unwrap_or_default())
            })
            .parse()
            .unwrap();
        Self { child, addr, log }
    }

    fn terminate(&self) {
        assert!(Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success());
    }

    /// Wait for the process to exit; whether it exited 0, and its log.
    fn wait(mut self, limit: Duration) -> (bool, String) {
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if started.elapsed() > limit {
                self.child.kill().unwrap();
                panic!("serve did not exit within {limit:?}: {}", std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (self.child.wait().unwrap().success(), std::fs::read_to_string(&self.log).unwrap())
    }
}

/// A test that fails midway leaves no server behind.
impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The virtualenv with openenv-core's client (`make openenv-client`).
pub(crate) fn openenv_python() -> PathBuf {
    crate::common::venv_python("openenv", "openenv-client")
}

#[test]
fn openenv_python_client_plays_sokoban_and_its_checks_pass() {
    let python = openenv_python();
    let sokoban = plugin("sokoban");
    let served = Served::start("openenv", &sokoban, &["--max-sessions", "8"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/openenv/client.py");
    let out = Command::new(&python).arg(&script).args(["--url", &format!("http://{}", served.addr)]).output().unwrap();
    served.terminate();
    let (clean, log) = served.wait(Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the OpenEnv client failed: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
    assert!(clean, "serve exits 0 on SIGTERM: {log}");
    let got: Value = serde_json::from_str(stdout.trim()).unwrap();

    // OpenEnv's conformance checks (`openenv validate --url`).
    assert_eq!(got["validate"]["passed"], true, "openenv validate: {:#}", got["validate"]);

    // What the client saw is what the plugin does in-process.
    let plugin = Plugin::from_file(&sokoban).unwrap();
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&[]).unwrap().unwrap();
    let names = inst.spec(env).unwrap().action_names().to_vec();
    let first = inst.reset(env, 42).unwrap().unwrap();
    let sync = &got["sync"];
    assert_eq!(sync["first"], first, "the first observation of seed 42");
    assert_eq!(sync["first_reward"], Value::Null);
    assert_eq!(got["async"]["first"], first, "the async client too");
    let steps = sync["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    for (i, step) in steps.iter().enumerate() {
        let name = got["actions"][i].as_str().unwrap();
        let id = names.iter().position(|n| n == name).unwrap() as u32;
        let want = inst.step(env, id).unwrap().unwrap();
        assert_eq!(step, &json!({"text": want.observation, "reward": want.reward, "done": want.done}), "step {i} ({name})");
    }
    assert_eq!(sync["state"]["episode_id"], "openenv-sync");
    assert_eq!(sync["state"]["step_count"], steps.len());
    assert_eq!(sync["state"]["seed"], 42);
    let bad = sync["bad_action"].as_str().unwrap_or_default();
    assert!(bad.contains("unknown action `Jump`") && bad.contains("VALIDATION_ERROR"), "the client raised: {bad:?}");
}

/// SIGTERM while resets are in flight (each takes a few hundred ms in
/// `slow-reset`): each is answered, then its session closes with 1001, and
/// the process exits 0.
#[test]
fn sigterm_lets_in_flight_calls_finish() {
    let served = Served::start("sigterm", &faulty("slow-reset"), &["--max-sessions", "4", "--threads", "2"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcomes =
        runtime.block_on(ragen_test_fixtures::serve_load::resets_in_flight_then(served.addr, 3, 1, || served.terminate())).unwrap();
    for (reply, closed) in outcomes {
        assert_eq!(reply["type"], "observation", "the in-flight reset is answered: {reply}");
        assert_eq!(closed, Some(1001), "then the session closes with 1001");
    }
    let (clean, log) = served.wait(Duration::from_secs(30));
    assert!(clean, "serve exits 0 after SIGTERM: {log}");
    assert!(log.contains("stopping"), "the log says it is stopping: {log}");
}

/// A server whose log reader went away (`| head`, a collector that died)
/// still stops on SIGTERM: a failed log write must not kill the task that
/// stops it.
#[test]
fn sigterm_stops_the_server_after_its_log_reader_is_gone() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
        .args(["serve", plugin("bandit").to_str().unwrap(), "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line:?}");
    drop(child.stderr.take());
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("serve did not stop within 20 s of SIGTERM once its log pipe was closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's resident memory (VmRSS) and its peak so far (VmHWM), in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The soft limit on open files, from /proc/self/limits.
fn open_files_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap_or(u64::MAX)
}

/// A healthy session playing Sokoban until `stop`, a call every 2 ms (a
/// trainer's pace, not a flood): every call's latency, and how many calls
/// failed.
async fn play_until(addr: SocketAddr, session: u64, stop: flag::Stop) -> (Vec<Duration>, usize) {
    let mut client = ragen_test_fixtures::serve_load::Client::connect(addr, None).await.unwrap();
    let (mut latencies, mut failures) = (Vec::new(), 0);
    let mut episode = 0;
    while !stop.is_set() {
        let start = Instant::now();
        let first = tokio::time::timeout(Duration::from_secs(10), client.reset(session * 1000 + episode)).await;
        latencies.push(start.elapsed());
        failures += usize::from(!matches!(&first, Ok(Ok(f)) if f["type"] == "observation"));
        episode += 1;
        for t in 0..8u64 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let start = Instant::now();
            let step = tokio::time::timeout(Duration::from_secs(10), client.step(json!((session + t) % 4))).await;
            latencies.push(start.elapsed());
            match step {
                Ok(Ok(reply)) if reply["type"] == "observation" => {
                    if reply["data"]["done"] == true {
                        break;
                    }
                }
                _ => failures += 1,
            }
        }
    }
    client.close().await.unwrap();
    (latencies, failures)
}

/// A flag the healthy sessions poll.
mod flag {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    #[derive(Clone, Default)]
    pub struct Stop(Arc<AtomicBool>);
    impl Stop {
        pub fn set(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
        pub fn is_set(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }
}

/// Serve under abuse, as a process on loopback: 10,000 connections that
/// say nothing, 200 slowloris clients that never finish their headers, and
/// 30 WebSocket sessions that send garbage, oversized frames or nothing,
/// while 4 healthy sessions play Sokoban. The healthy sessions are
/// answered throughout; the server closes every abusive connection and
/// session by its deadlines (the default `--header-timeout` of 10 s, `--idle-timeout 4`),
/// frees every slot, and its memory stays within 32 KiB per connection.
/// The figures are printed (`--nocapture`) and recorded in docs/serve.md.
#[test]
fn serve_under_abuse_answers_healthy_sessions_and_frees_every_slot() {
    const SILENT: usize = 10_000;
    const SLOWLORIS: usize = 200;
    const BAD_SESSIONS: usize = 30;
    const HEALTHY: u64 = 4;
    let needed = (SILENT + SLOWLORIS + BAD_SESSIONS + 256) as u64;
    assert!(
        open_files_limit() >= needed,
        "this test opens {needed} sockets in the test and as many in the server; raise the open-files limit (`ulimit -n {needed}`)"
    );
    // The default header deadline (10 s): all the silent connections are
    // open at once before the first is closed.
    let args = ["--max-sessions", "64", "--idle-timeout", "4", "--threads", "2"];
    let served = Served::start("abuse", &plugin("sokoban"), &args);
    let pid = served.child.id();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime.block_on(async {
        use ragen_test_fixtures::serve_load::{abuse, http};
        let addr = served.addr;
        let stop = flag::Stop::default();
        let healthy: Vec<_> = (0..HEALTHY).map(|s| tokio::spawn(play_until(addr, s, stop.clone()))).collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss_before, _) = memory_kib(pid);

        let abuse_start = Instant::now();
        let silent = abuse::silent(addr, SILENT).await.unwrap();
        let connect_seconds = abuse_start.elapsed().as_secs_f64();
        let slowloris = tokio::spawn(abuse::slowloris(addr, SLOWLORIS, Duration::from_millis(500), Duration::from_secs(30)));
        let idle_sessions = abuse::bad_sessions(addr, BAD_SESSIONS, 64 * 1024).await.unwrap();
        let (_, metrics) = http(addr, "GET", "/metrics", &[], "").await.unwrap();
        let open_during = metric(&metrics, "ragen_serve_connections_open");
        let timed_out_during = metric(&metrics, "ragen_serve_rejected_total{reason=\"header_timeout\"}");
        let (_, peak_during) = memory_kib(pid);

        let silent_closed = abuse::closed_within(silent, Duration::from_secs(30)).await;
        let slowloris_closed = slowloris.await.unwrap().unwrap();
        let idle_count = idle_sessions.len();
        let sessions_closed = abuse::sessions_closed_within(idle_sessions, Duration::from_secs(20)).await;
        let abuse_seconds = abuse_start.elapsed().as_secs_f64();

        stop.set();
        let mut latencies = Vec::new();
        let mut failures = 0;
        for h in healthy {
            let (l, f) = h.await.unwrap();
            latencies.extend(l);
            failures += f;
        }
        let (_, health) = http(addr, "GET", "/health", &[], "").await.unwrap();
        // The /metrics request that reads it is the one connection left,
        // once the server has seen the others' ends.
        let settle = Instant::now();
        let metrics = loop {
            let (_, metrics) = http(addr, "GET", "/metrics", &[], "").await.unwrap();
            if metric(&metrics, "ragen_serve_connections_open") == 1.0 || settle.elapsed() > Duration::from_secs(5) {
                break metrics;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (rss_after, peak) = memory_kib(pid);
        latencies.sort();
        let quantile = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
        json!({
            "rss_before_kib": rss_before, "peak_kib": peak.max(peak_during), "rss_after_kib": rss_after,
            "connections_open_during": open_during, "header_timeouts_during": timed_out_during,
            "silent_closed": silent_closed, "slowloris_closed": slowloris_closed.iter().filter(|c| c.is_some()).count(),
            "slowloris_slowest_close_s": slowloris_closed.iter().flatten().max().map(|d| d.as_secs_f64()),
            "idle_sessions": idle_count, "idle_sessions_closed": sessions_closed,
            "healthy_calls": latencies.len(), "healthy_failures": failures,
            "healthy_p50_ms": quantile(0.5).as_secs_f64() * 1e3, "healthy_p99_ms": quantile(0.99).as_secs_f64() * 1e3,
            "healthy_max_ms": quantile(1.0).as_secs_f64() * 1e3,
            "abuse_seconds": abuse_seconds, "connect_seconds": connect_seconds,
            "health": serde_json::from_str::<Value>(&health).unwrap(),
            "connections_open_after": metric(&metrics, "ragen_serve_connections_open"),
            "header_timeouts": metric(&metrics, "ragen_serve_rejected_total{reason=\"header_timeout\"}"),
        })
    });
    served.terminate();
    let (clean, log) = served.wait(Duration::from_secs(30));
    println!("serve under abuse: {report:#}");
    assert!(clean, "serve exits 0 after the abuse: {log}");
    assert_eq!(report["healthy_failures"], 0, "every healthy call is answered: {report:#}");
    assert!(report["healthy_calls"].as_u64().unwrap() > 100, "the healthy sessions kept playing: {report:#}");
    // Each silent connection was held until its deadline: open when the
    // abuse peaked, or already closed by it (on a loaded machine, opening
    // 10,000 can take longer than the deadline).
    let held = report["connections_open_during"].as_f64().unwrap() + report["header_timeouts_during"].as_f64().unwrap();
    assert!(held >= SILENT as f64, "the server held the silent connections: {report:#}");
    assert_eq!(report["silent_closed"], SILENT, "every silent connection is closed by the header deadline: {report:#}");
    assert_eq!(report["slowloris_closed"], SLOWLORIS, "every slowloris client is closed: {report:#}");
    assert_eq!(report["idle_sessions_closed"], report["idle_sessions"], "every idle session is reaped: {report:#}");
    assert_eq!(report["health"]["sessions"], 0, "every session slot is free: {report:#}");
    assert_eq!(report["connections_open_after"], 1.0, "every connection slot is free: {report:#}");
    assert!(report["header_timeouts"].as_f64().unwrap() >= (SILENT + SLOWLORIS) as f64, "{report:#}");
    let grown = report["peak_kib"].as_u64().unwrap().saturating_sub(report["rss_before_kib"].as_u64().unwrap());
    let bound = 32 * (SILENT + SLOWLORIS + BAD_SESSIONS) as u64;
    assert!(grown < bound, "the abuse grew the server by {grown} KiB, over the bound of {bound} KiB (32 KiB a connection): {report:#}");
}

/// A sample's value in Prometheus text (`NAME VALUE`, labels included in
/// `name`). A labelled sample not yet counted is absent: 0.
fn metric(text: &str, name: &str) -> f64 {
    let value = text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')));
    match value {
        Some(v) => v.trim().parse().unwrap(),
        None if name.contains('{') => 0.0,
        None => panic!("no `{name}` in /metrics: {text}"),
    }
}
