//! `--env ws://…`: envs on a server, played and trained on as a plugin is.
//! openenv-core's own example env (the echo env its `openenv init`
//! template writes, from the PyPI wheel) is inspected, stepped, evaluated
//! and trained on; ragen-host's own server plays exactly as the plugin
//! does in process; two servers share a run, and one killed mid-run fails
//! only its episodes until it is back; bad servers get errors that say
//! what to check. Loopback only.

use crate::common::{plugin, ragen_host, scratch, text};
use crate::serve::{Served, openenv_python};
use ragen_llm::Architecture;
use ragen_remote::Remote;
use ragen_runtime::{Action, FailureKind, PoolConfig};
use ragen_test_fixtures::tiny_llm::Tiny;
use safetensors::Dtype;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// openenv-core's echo env under uvicorn, on a free loopback port.
struct Echo {
    child: Child,
    port: u16,
}

impl Echo {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/openenv/echo_server.py");
        // uvicorn logs each session a client closes as an exception: kept out of the test's output.
        let log = std::fs::File::create(scratch("remote-echo-log").join("echo.log")).unwrap();
        let mut child =
            Command::new(openenv_python()).args([script, &port.to_string(), "64"]).stdout(Stdio::piped()).stderr(log).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the echo server did not start");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "the echo server is not listening on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// A pretrained-format model that answers in whole words (LoRA, one step
/// of two groups).
const ECHO_TRAIN: &str = r#"
steps = 2
val_episodes = 4
test_freq = 1
[lora]
rank = 4
[rollout]
env_groups = 2
group_size = 4
enable_think = false
max_turn = 2
[sampling]
max_new_tokens = 2
"#;

#[test]
fn an_openenv_server_no_one_here_wrote_is_stepped_evaluated_and_trained_on() {
    let echo = Echo::start();
    // What its /schema and /metadata say, as a spec.
    let v = json(&ragen_host(&["inspect", &echo.url(), "--json"]));
    assert_eq!(
        (v["name"].as_str(), v["env"]["text_action"]["form"].as_str()),
        (Some("EchoEnvironment"), Some("Message to echo back")),
        "{v}"
    );

    // Its own answers, through the batched API: the echo and its reward
    // (0.1 per character, as the template's env computes it).
    let remote = Remote::connect(&echo.url().parse().unwrap()).unwrap();
    let envs = remote.open(&PoolConfig::new(3)).unwrap();
    let first = envs.reset(&[0, 1, 2], &[1, 2, 3]).unwrap();
    assert!(first.iter().all(|o| o.as_ref().unwrap() == "echoed_message: Echo environment ready!\nmessage_length: 0"), "{first:?}");
    let actions = [Action::Text("hello".into()), Action::Text("hi".into()), Action::Text(String::new())];
    let steps = envs.step(&[2, 0, 1], &actions).unwrap();
    let got: Vec<(String, f64)> = steps.into_iter().map(|s| s.map(|s| (s.observation, s.reward)).unwrap()).collect();
    assert_eq!(got[0], ("echoed_message: hello\nmessage_length: 5".to_string(), 0.5));
    assert_eq!(got[1].0, "echoed_message: hi\nmessage_length: 2");
    assert!((got[1].1 - 0.2).abs() < 1e-12 && got[2].1 == 0.0, "{got:?}");
    drop(envs);

    // Two training steps of a pretrained model on it, recorded as its server.
    let dir = scratch("remote-echo");
    let model = dir.join("tiny-llama");
    let _ = std::fs::remove_dir_all(&model);
    Tiny::with_words(Architecture::Llama, &["hello</answer>", "hi</answer>"]).write_hf(&model, Dtype::F32);
    let config = dir.join("echo.toml");
    std::fs::write(&config, ECHO_TRAIN).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let args = ["train", "--env", &echo.url(), "--model", model.to_str().unwrap(), "--config", config.to_str().unwrap()];
    let out = ragen_host(&[&args[..], &["--out", run.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{metrics}");
    for step in &lines {
        assert_eq!((step["episodes"].as_u64(), step["failed_episodes"].as_u64()), (Some(8), Some(0)), "{step}");
    }
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        recorded.contains(&format!("source = \"{}\"", echo.url())) && recorded.contains("served = \"EchoEnvironment 1.0.0\""),
        "{recorded}"
    );

    // eval plays the checkpoint on it; every episode ends without a failure.
    let v = json(&ragen_host(&["eval", "--env", &echo.url(), "--checkpoint", run.to_str().unwrap(), "--episodes", "4", "--json"]));
    assert_eq!((v["episodes"].as_u64(), v["failures"].as_u64(), v["optimal_success"].is_null()), (Some(4), Some(0), true), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn our_server_over_ws_plays_exactly_as_the_plugin_does_here_and_trains() {
    let sokoban = plugin("sokoban");
    let served = Served::start("remote-sokoban", &sokoban, &[]);
    let url = format!("ws://{}", served.addr);
    let eval = |env: &str| {
        let v = json(&ragen_host(&["eval", "--env", env, "--policy", "random", "--episodes", "24", "--json"]));
        (v["plugin"].clone(), v["success_rate"].clone(), v["return_mean"].clone(), v["actions_mean"].clone(), v["failures"].clone())
    };
    assert_eq!(eval(&url), eval(sokoban.to_str().unwrap()), "the same seeds, policy and limits give the same episodes");

    let dir = scratch("remote-sokoban-train");
    let config = dir.join("c.toml");
    std::fs::write(&config, "steps = 2\nval_episodes = 4\ntest_freq = 1\n[rollout]\nenv_groups = 2\ngroup_size = 4\n[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\n").unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let out = ragen_host(&["train", "--env", &url, "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");
    assert!(std::fs::read_to_string(run.join("config.toml")).unwrap().contains("served = \"sokoban 0.1.0\""));
    // Settings belong to the server, and inspect says where to set them.
    let out = ragen_host(&["inspect", &url]);
    assert!(out.status.success() && text(&out).contains("the server's: set with `ragen-host serve --set KEY=VALUE`"), "{}", text(&out));
    let out = ragen_host(&["eval", "--env", &url, "--policy", "random", "--set", "dim_x=7"]);
    assert!(!out.status.success() && text(&out).contains("pass `--set dim_x=…` to `ragen-host serve`"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_servers_share_the_envs_and_a_killed_one_fails_only_its_episodes_until_it_is_back() {
    let sokoban = plugin("sokoban");
    let a = Served::start("remote-a", &sokoban, &[]);
    let mut b = Served::start("remote-b", &sokoban, &[]);
    let b_port = b.addr.port();
    let address = format!("ws://{}?timeout=5,ws://{}", a.addr, b.addr);
    let remote = Remote::connect(&address.parse().unwrap()).unwrap();
    let envs = remote.open(&PoolConfig::new(6)).unwrap();
    let ids: Vec<usize> = (0..6).collect();
    assert!(envs.reset(&ids, &[5; 6]).unwrap().iter().all(Result::is_ok));

    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let clock = Instant::now();
    let steps = envs.step(&ids, &vec![Action::Id(3); 6]).unwrap();
    assert!(clock.elapsed() < Duration::from_secs(5), "a dead server is noticed at once, not at the deadline");
    for (i, s) in steps.iter().enumerate() {
        match (i % 2, s) {
            (0, Ok(_)) => {}
            (1, Err(f)) => assert!(f.kind == FailureKind::Lost && f.seed == Some(5) && f.message.contains(&b_port.to_string()), "{f}"),
            _ => panic!("env {i}: {s:?}"),
        }
    }
    // While it is down, its envs' resets fail fast; the others play on.
    let resets = envs.reset(&ids, &[6; 6]).unwrap();
    assert_eq!(resets.iter().map(Result::is_ok).collect::<Vec<_>>(), [true, false, true, false, true, false]);

    // Back on its port, it is used again.
    let _b = Served::start_on("remote-b2", &sokoban, b_port, &[]);
    let resets = envs.reset(&ids, &[7; 6]).unwrap();
    assert!(resets.iter().all(Result::is_ok), "{resets:?}");
    drop(a);
}

/// A training run over two servers, one killed mid-run and restarted: the
/// run goes on, counts the lost episodes, uses the server again once it is
/// back, and finishes.
#[test]
fn a_run_over_two_servers_outlives_one_of_them() {
    let sokoban = plugin("sokoban");
    let a = Served::start("run-a", &sokoban, &[]);
    let mut b = Served::start("run-b", &sokoban, &[]);
    let b_port = b.addr.port();
    let dir = scratch("remote-two-servers");
    let config = dir.join("c.toml");
    std::fs::write(&config, "steps = 40\nval_episodes = 2\ntest_freq = 100\n[rollout]\nenv_groups = 2\ngroup_size = 4\n[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\n").unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let env = format!("ws://{}?timeout=10,ws://{}", a.addr, b.addr);
    let mut train = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
        .args(["train", "--env", &env, "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("train.log")).unwrap())
        .spawn()
        .unwrap();
    let steps = || -> Vec<Value> {
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let wait_for = |what: &str, done: &dyn Fn(&[Value]) -> bool| {
        let started = Instant::now();
        while !done(&steps()) {
            assert!(started.elapsed() < Duration::from_secs(120), "waited 2 minutes for {what}: {:?}", steps());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("a first step", &|s| !s.is_empty());
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    wait_for("a step that lost episodes", &|s| s.iter().any(|m| m["failed_episodes"].as_u64() > Some(0)));
    let _b = Served::start_on("run-b2", &sokoban, b_port, &[]);
    let back = steps().len();
    wait_for("the run to end", &|s| s.len() == 40);
    assert!(train.wait().unwrap().success(), "{}", std::fs::read_to_string(dir.join("train.log")).unwrap());
    let all = steps();
    let lost = all.iter().find(|m| m["failed_episodes"].as_u64() > Some(0)).unwrap();
    let failed = lost["failed_episodes"].as_u64().unwrap();
    assert!((1..=4).contains(&failed), "at most the 4 envs on the dead server fail: {lost}");
    assert!(back + 1 < all.len(), "the run ended before the server was back; give it more steps");
    assert!(all[back + 1..].iter().all(|m| m["failed_episodes"].as_u64() == Some(0)), "the server is used again once back: {all:?}");
    let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
    assert!(log.contains("episodes failed") && log.contains("lost"), "the loss is reported: {log}");
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An HTTP server that answers every request with `answer(path)`.
fn fake_server(answer: fn(&str) -> (u16, String)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, body) = answer(&path);
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn bad_servers_get_errors_that_say_what_to_check() {
    let err = |env: String| {
        let out = ragen_host(&["eval", "--env", &env, "--policy", "random", "--episodes", "2"]);
        assert!(!out.status.success());
        text(&out)
    };
    // Nothing listening.
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    assert!(err(format!("ws://127.0.0.1:{free}")).contains("is the server running"));
    // A web server that is not OpenEnv.
    let port = fake_server(|_| (404, "{\"detail\": \"Not Found\"}".into()));
    assert!(err(format!("ws://127.0.0.1:{port}")).contains("is it an OpenEnv server"));
    // An OpenEnv-shaped server whose action has no usable field.
    let port = fake_server(|path| match path {
        "/schema" => (200, r#"{"action": {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}}"#.into()),
        _ => (404, "{}".into()),
    });
    let e = err(format!("ws://127.0.0.1:{port}"));
    assert!(e.contains("2 fields (x, y)") && e.contains("one field"), "{e}");
    // An unknown option in the address.
    assert!(err("ws://127.0.0.1:1?turns=3".into()).contains("unknown option `turns`"));

    // A server with a token, and a frame over the client's limit.
    let dir = scratch("remote-token");
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let served = Served::start("remote-token", &plugin("sokoban"), &["--token-file", token.to_str().unwrap()]);
    let out = ragen_host(&["inspect", &format!("ws://{}", served.addr)]);
    assert!(!out.status.success() && text(&out).contains("RAGEN_REMOTE_TOKEN"), "{}", text(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_ragen-host"))
        .args(["eval", "--env", &format!("ws://{}?max_frame_bytes=64", served.addr), "--policy", "random", "--episodes", "2", "--json"])
        .env("RAGEN_REMOTE_TOKEN", "s3cret")
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["failures"].as_u64(), Some(2), "{v}");
    let failed = &v["failed"][0];
    assert!(failed["kind"] == "lost" && failed["message"].as_str().unwrap().contains("too long"), "{failed}");
    let _ = std::fs::remove_dir_all(&dir);
}
