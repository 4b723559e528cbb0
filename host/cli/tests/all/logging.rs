//! Log lines and closed pipes: a library's warning reaches the person
//! running `train` (and `RAGEN_LOG` filters it), and neither a closed
//! stdout (`ragen-host … | head -1`) nor a closed stderr makes the binary
//! panic or hang.

use crate::common::{plugin, scratch, text};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a command may take to notice that its reader went away.
const DEADLINE: Duration = Duration::from_secs(60);

fn ragen_host() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ragen-host"));
    command.env_remove("RAGEN_LOG");
    command
}

/// A compile-cache directory the runtime cannot use (it lies under a
/// file), so loading a plugin logs the runtime's `tracing` warning.
fn unusable_cache(name: &str) -> PathBuf {
    let blocker = scratch(name).join("not-a-directory");
    std::fs::write(&blocker, "").unwrap();
    blocker.join("compiled")
}

/// Point `command` at `cache`, whatever the environment running the tests says.
fn with_cache<'c>(command: &'c mut Command, cache: &Path) -> &'c mut Command {
    command.env_remove("RAGEN_NO_CACHE").env("RAGEN_CACHE_DIR", cache)
}

/// The write end of a pipe whose read end is already closed: every write
/// to it fails, as to a stream whose reader went away.
fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

/// The child's exit status, killing it (and failing) past [`DEADLINE`].
fn exit_within_deadline(child: &mut Child, what: &str) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > DEADLINE {
            child.kill().unwrap();
            panic!("{what} did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `train --steps 1` on Bandit with the training tests' small config.
fn train_one_step(name: &str) -> Command {
    let dir = scratch(name);
    let config = dir.join("small.toml");
    std::fs::write(&config, crate::train::SMALL).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let bandit = plugin("bandit");
    let mut command = ragen_host();
    command.args(["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--steps", "1", "--out"]).arg(run);
    command.stdin(Stdio::null());
    command
}

#[test]
fn train_shows_a_library_warning() {
    let cache = unusable_cache("logging-train-cache");
    let out = with_cache(&mut train_one_step("logging-train"), &cache).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: compiling plugins without a cache: cannot use"),
        "the runtime's warning reaches train's stderr: {stderr}"
    );
}

#[test]
fn ragen_log_filters_library_lines() {
    let cache = unusable_cache("logging-filter-cache");
    let inspect = |filter: Option<&str>| {
        let mut command = ragen_host();
        command.args(["inspect", plugin("bandit").to_str().unwrap(), "--json"]).stdin(Stdio::null());
        if let Some(filter) = filter {
            command.env("RAGEN_LOG", filter);
        }
        let out = with_cache(&mut command, &cache).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(inspect(None).contains("compiling plugins without a cache"), "warnings show by default");
    assert!(!inspect(Some("error")).contains("compiling plugins without a cache"), "RAGEN_LOG=error hides warnings");
}

/// `ragen-host play … | head -1`: the reader takes one line and goes away
/// while `play` still has far more to write than a pipe holds.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let mut child = ragen_host()
        .args(["play", plugin("frozenlake").to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Each reset shows a whole board: megabytes in all, against a pipe's 64 KiB.
    let typist = std::thread::spawn(move || {
        for _ in 0..20_000 {
            if stdin.write_all(b"reset\n").is_err() {
                break;
            }
        }
    });
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(!first.is_empty(), "play wrote nothing");
    // The reader is dropped: stdout is closed from here on.
    let status = exit_within_deadline(&mut child, "play with its stdout closed");
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    typist.join().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.success(), "a closed stdout ends play quietly: {status}, {stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

/// A report for a reader that went away is dropped; the exit code still
/// says how the command went.
#[test]
fn a_report_to_a_closed_stdout_keeps_the_exit_code() {
    let mut child =
        ragen_host().args(["inspect", plugin("bandit").to_str().unwrap()]).stdin(Stdio::null()).stdout(closed_pipe()).spawn().unwrap();
    let status = exit_within_deadline(&mut child, "inspect with its stdout closed");
    assert!(status.success(), "{status}");
}

#[test]
fn a_closed_stderr_neither_panics_nor_hangs() {
    // An error for nobody to read: still exit code 1, not a panic's 101.
    let missing = scratch("logging-stderr").join("missing.wasm");
    let mut child = ragen_host()
        .args(["inspect", missing.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(closed_pipe())
        .spawn()
        .unwrap();
    assert_eq!(exit_within_deadline(&mut child, "a failing inspect").code(), Some(1));

    // A library's warning for nobody to read: the report still comes.
    let cache = unusable_cache("logging-stderr-cache");
    let out = with_cache(ragen_host().args(["inspect", plugin("bandit").to_str().unwrap(), "--json"]), &cache)
        .stdin(Stdio::null())
        .stderr(closed_pipe())
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["name"], "bandit");

    // A training run's progress lines and a warning, all for nobody.
    let mut train = train_one_step("logging-stderr-train");
    let mut child = with_cache(&mut train, &cache).stdout(Stdio::null()).stderr(closed_pipe()).spawn().unwrap();
    let status = exit_within_deadline(&mut child, "train with its stderr closed");
    assert!(status.success(), "{status}");
}
