//! Hostile plugins (tests/faulty-plugin, one misbehaviour per build) through
//! every command they affect: no panic or abort (exit code 1, never 101),
//! bounded time, a message naming the problem, and nothing raw on the
//! terminal.

use crate::common::{faulty, ragen_host, scratch, text};
use std::process::Output;
use std::time::{Duration, Instant};

/// `ragen-host ARGS`, which must finish within `limit` without panicking.
fn run(args: &[&str], limit: Duration) -> (Output, String) {
    let started = Instant::now();
    let out = ragen_host(args);
    let all = text(&out);
    assert!(started.elapsed() < limit, "`{}` took {:?}:\n{all}", args.join(" "), started.elapsed());
    // (A plugin's own panic is quoted in messages; the host's is on `main`.)
    assert!(!all.contains("thread 'main' panicked"), "`{}` panicked:\n{all}", args.join(" "));
    assert_ne!(out.status.code(), Some(101), "`{}` panicked:\n{all}", args.join(" "));
    (out, all)
}

/// The command fails (exit 1) and says `expect`.
fn refused(args: &[&str], expect: &str) {
    let (out, all) = run(args, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "`{}` should fail:\n{all}", args.join(" "));
    assert!(all.contains(expect), "`{}`: expected `{expect}` in:\n{all}", args.join(" "));
}

#[test]
fn extreme_self_descriptions_are_refused_by_every_command() {
    let cases = [
        ("empty-actions", "the action list is empty"),
        ("huge-limits", "limits.max-turns is 4294967295; it must be between 1 and 1000"),
        ("metadata-bomb", "over the limit of 16384 bytes"),
    ];
    for (fault, expect) in cases {
        let file = faulty(fault);
        let file = file.to_str().unwrap();
        refused(&["inspect", file], expect);
        refused(&["validate", file], expect);
        refused(&["bench", file, "--envs", "8", "--seconds", "0.2"], expect);
        refused(&["eval", "--env", file, "--policy", "random", "--episodes", "8"], expect);
        refused(&["play", file], expect);
    }
}

/// No ESC (or other control byte but newline and tab) reaches the terminal.
fn no_raw_controls(what: &str, all: &str) {
    let bad: Vec<char> = all.chars().filter(|&c| c.is_control() && c != '\n' && c != '\t').collect();
    assert!(bad.is_empty(), "{what}: control characters {bad:?} reached the terminal:\n{all}");
}

#[test]
fn control_sequences_from_a_plugin_never_reach_the_terminal() {
    let file = faulty("escape-codes");
    let file = file.to_str().unwrap();
    for args in [
        vec!["inspect", file],
        vec!["validate", file],
        vec!["eval", "--env", file, "--policy", "random", "--episodes", "4"],
        vec!["bench", file, "--envs", "8", "--seconds", "0.2"],
    ] {
        let (_, all) = run(&args, Duration::from_secs(60));
        no_raw_controls(args[0], &all);
        // bench shows no plugin text but its name; the others show the escapes.
        assert!(args[0] == "bench" || all.contains("\\u{1b}"), "{}: the escape is shown, not dropped:\n{all}", args[0]);
    }
    let (ok, shown) = crate::common::play(&[file], "inc\nstay\x1b[31m\nquit\n");
    assert!(ok, "{shown}");
    no_raw_controls("play", &shown);
    // JSON stays JSON: serde's own escapes.
    let (out, _) = run(&["inspect", file, "--json"], Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.to_string().contains("\\u001b"), "{v}");
}

#[test]
fn direction_controls_from_a_plugin_are_shown_not_obeyed() {
    // The configurable plugin appends `text` to its instructions, action
    // names and observations: here a right-to-left override, an isolate
    // pair and a zero-width space.
    let file = faulty("configurable");
    let file = file.to_str().unwrap();
    let text = "text=|\u{202e}evil\u{2066}x\u{2069}\u{200b}|";
    let hidden = |c: char| matches!(c, '\u{202e}' | '\u{2066}' | '\u{2069}' | '\u{200b}');
    let (ok, shown) = crate::common::play(&[file, "--set", text], "A0\nquit\n");
    assert!(ok, "{shown}");
    let (_, eval) = run(&["eval", "--env", file, "--policy", "random", "--episodes", "2", "--set", text], Duration::from_secs(60));
    for (what, all) in [("play", &shown), ("eval", &eval)] {
        assert!(!all.chars().any(hidden), "{what}: a direction control reached the terminal:\n{all}");
        assert!(all.contains("count: ") && all.contains("|\\u{202e}evil\\u{2066}x\\u{2069}\\u{200b}|"), "{what}: shown as escapes:\n{all}");
    }
    // JSON keeps the text exact.
    let (out, _) = run(&["inspect", file, "--set", text, "--json"], Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.to_string().contains("|\u{202e}evil\u{2066}x\u{2069}\u{200b}|"), "{v}");
}

#[test]
fn absurd_rewards_fail_their_episode_and_summaries_stay_finite() {
    let file = faulty("huge-reward");
    let (out, all) =
        run(&["eval", "--env", file.to_str().unwrap(), "--policy", "random", "--episodes", "16", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{all}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["return_mean"].is_f64(), "the return is a number, not null: {v}");
    // Seeds 3 mod 4 strike: 4 of 16 from seed 123 (123, 127, 131, 135).
    assert_eq!(v["failures"], 4, "{v}");
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 4);
    for f in failed {
        assert_eq!(f["kind"], "invalid output", "{f}");
        assert!(f["message"].as_str().unwrap().contains("beyond the limit"), "{f}");
        assert_eq!(f["seed"].as_u64().unwrap() % 4, 3, "{f}");
    }
}

const TINY: &str = r#"
seed = 0
steps = 3
val_episodes = 4
[rollout]
env_groups = 2
group_size = 4
enable_think = false
[model]
d_model = 16
n_layers = 1
n_heads = 2
max_seq_len = 128
"#;

/// `train` on `fault` with `top` (top-level keys) and [`TINY`]; the output
/// and the run directory.
fn train(fault: &str, top: &str) -> (Output, String, std::path::PathBuf) {
    let dir = scratch(&format!("hostile-train-{fault}"));
    let _ = std::fs::remove_dir_all(dir.join("run"));
    std::fs::write(dir.join("tiny.toml"), format!("{top}\n{TINY}")).unwrap();
    let file = faulty(fault);
    let (out, all) = run(
        &[
            "train",
            "--env",
            file.to_str().unwrap(),
            "--config",
            dir.join("tiny.toml").to_str().unwrap(),
            "--out",
            dir.join("run").to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    (out, all, dir.join("run"))
}

#[test]
fn train_stops_when_most_episodes_fail_and_says_why() {
    let (out, all, run_dir) = train("fail-every-reset", "");
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("8 of 8 episodes failed at step 0"), "{all}");
    assert!(all.contains("deliberate failure of every reset"), "the first failure is quoted:\n{all}");
    assert!(all.contains("ragen-host validate"), "{all}");
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let m: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!((m["failed_episodes"].as_u64(), m["episodes"].as_u64()), (Some(8), Some(8)), "{m}");
    assert!(run_dir.join("checkpoint/state.json").exists(), "the run stopped with a checkpoint");
}

#[test]
fn some_failing_episodes_are_counted_and_shown_but_do_not_stop_training() {
    // trap-in-reset: seeds 3 mod 4 trap, and a group's members share a
    // seed, so groups fail whole. The run's seed is fixed: which groups
    // strike is too.
    let (out, all, run_dir) = train("trap-in-reset", "max_failed_share = 1.0");
    assert!(out.status.success(), "{all}");
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let failed: Vec<u64> =
        metrics.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["failed_episodes"].as_u64().unwrap()).collect();
    assert_eq!(failed.len(), 3, "{metrics}");
    assert!(failed.iter().all(|f| f % 4 == 0), "whole groups of 4 fail: {failed:?}");
    assert!(failed.iter().sum::<u64>() > 0, "seed 0 strikes at least one group in 3 steps: {failed:?}");
    assert!(all.contains("episodes failed; the first:") && all.contains("deliberate trap in reset"), "{all}");
    // The traps inside batched resets were recovered from, and that is
    // said: per step in metrics.jsonl, and on the terminal.
    let recovered: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m["env_recoveries"].as_u64() > Some(0))
        .collect();
    assert!(!recovered.is_empty(), "{metrics}");
    assert!(recovered.iter().all(|m| m["recovered"].as_str().unwrap().contains(" rebuilt, ")), "{metrics}");
    assert!(all.contains("the env pool recovered from plugin faults:") && all.contains("a batched reset-many faulted (trap"), "{all}");
}

#[test]
fn recovery_from_a_fault_in_a_batched_call_is_reported_by_eval() {
    // trap-in-reset traps on seeds 3 mod 4, inside the batched reset of
    // the instance that holds those envs.
    let file = faulty("trap-in-reset");
    let file = file.to_str().unwrap();
    let (out, all) = run(&["eval", "--env", file, "--policy", "random", "--episodes", "8", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{all}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["recoveries"];
    assert!(r["batch_faults"].as_u64() >= Some(1) && r["rebuilt_instances"].as_u64() >= Some(2), "{v}");
    assert!(r["first"].as_str().unwrap().contains("deliberate trap in reset"), "{v}");
    let (_, text) = run(&["eval", "--env", file, "--policy", "random", "--episodes", "8"], Duration::from_secs(60));
    assert!(text.contains("  recovered    ") && text.contains(" rebuilt, "), "{text}");
    // A healthy plugin recovers nothing, and says nothing of it.
    let bandit = crate::common::plugin("bandit");
    let (out, all) = run(&["eval", "--env", bandit.to_str().unwrap(), "--policy", "random", "--episodes", "8"], Duration::from_secs(60));
    assert!(out.status.success() && !all.contains("recovered"), "{all}");
}

#[test]
fn state_hidden_across_resets_is_caught_in_training() {
    // Members of a group share a seed; those whose first state differs from
    // their group's first member fail, and with a low threshold the run stops.
    let (out, all, _) = train("hidden-state", "max_failed_share = 0.25");
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("reset gave a different first state than env"), "{all}");
    assert!(all.contains("over max_failed_share = 0.25"), "{all}");
}

#[test]
fn validate_catches_hidden_state_and_control_characters() {
    let file = faulty("hidden-state");
    refused(&["validate", file.to_str().unwrap()], "seed 0 started in another state when reset again");
    let file = faulty("escape-codes");
    refused(&["validate", file.to_str().unwrap()], "contains control characters, which a terminal would act on");
}

#[test]
fn validate_reaches_its_verdict_within_its_budget_on_a_slow_plugin() {
    let file = faulty("slow-reset");
    let started = Instant::now();
    refused(&["validate", file.to_str().unwrap(), "--budget", "4"], "the validate budget of 4 s ran out");
    // The budget, one call's timeout (2 s) and loading, with room to spare.
    assert!(started.elapsed() < Duration::from_secs(15), "validate took {:?}", started.elapsed());
}

#[test]
fn observations_far_over_the_cap_fail_fast_everywhere() {
    let file = faulty("huge-observation");
    let file = file.to_str().unwrap();
    refused(&["validate", file], "exceeds the cap of 65536 bytes");
    // bench says why, not only how often: the count by kind and the first failure.
    refused(&["bench", file, "--envs", "8", "--seconds", "0.2"], "env calls failed during the bench (");
    refused(&["bench", file, "--envs", "8", "--seconds", "0.2"], "invalid output; the first: plugin `");
    let (out, all) = run(&["bench", file, "--envs", "8", "--seconds", "0.2", "--json"], Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {all}"));
    assert_eq!(v["failure_kinds"]["invalid output"], v["failures"], "{v}");
    assert!(v["first_failure"].as_str().unwrap().contains("exceeds the cap"), "{v}");
    let (out, all) = run(&["eval", "--env", file, "--policy", "random", "--episodes", "4", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{all}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failures"], 4, "{v}");
    assert!(v["failed"][0]["message"].as_str().unwrap().contains("exceeds the cap"), "{v}");
}

#[test]
fn a_stack_overflow_is_named_as_such() {
    let file = faulty("stack-overflow");
    let file = file.to_str().unwrap();
    refused(&["validate", file], "the plugin overflowed its stack");
    refused(&["bench", file, "--envs", "8", "--seconds", "0.2"], "the plugin overflowed its stack");
    // The overflow inside batched steps was recovered from, and bench says so.
    refused(&["bench", file, "--envs", "8", "--seconds", "0.2"], "a batched step-many faulted (trap");
    let (out, _) = run(&["bench", file, "--envs", "8", "--seconds", "0.2", "--json"], Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["recoveries"]["batch_faults"].as_u64() >= Some(1) && v["recoveries"]["replayed_episodes"].as_u64() >= Some(1), "{v}");
    let (out, all) = run(&["eval", "--env", file, "--policy", "random", "--episodes", "8", "--json"], Duration::from_secs(60));
    assert!(out.status.success(), "{all}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = v["failed"].as_array().unwrap();
    assert!(!failed.is_empty(), "{v}");
    assert!(failed.iter().all(|f| f["message"].as_str().unwrap().contains("overflowed its stack")), "{v}");
}
