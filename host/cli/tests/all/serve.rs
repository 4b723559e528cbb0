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
struct Served {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Served {
    fn start(name: &str, plugin: &Path, args: &[&str]) -> Self {
        let log = scratch("serve").join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
            .args(["serve", plugin.to_str().unwrap(), "--port", "0"])
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

/// The virtualenv with openenv-core's client (`make openenv-client`).
fn openenv_python() -> PathBuf {
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
