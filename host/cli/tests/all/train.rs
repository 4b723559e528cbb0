//! `ragen-host train`: a short Bandit run leaves its config, metrics and
//! checkpoint; a resumed run continues it exactly; `eval --checkpoint`
//! reads it back; a schedule sets each step's learning rate and the best
//! validated checkpoint is kept apart; SIGTERM stops a run with a
//! checkpoint; a critic of its own is checkpointed and resumed with it;
//! dynamic sampling refills a batch.

use crate::common::{plugin, ragen_host, scratch, text, without_timings};
use std::path::Path;

pub const SMALL: &str = r#"
steps = 6
val_episodes = 16
test_freq = 3
save_freq = 2
[rollout]
env_groups = 4
group_size = 8
enable_think = false
[prompt]
system = ""
intro = "{actions}\n"
legend = ""
turn = "{state}\n"
format_answer = ""
[model]
d_model = 32
n_layers = 1
n_heads = 2
max_seq_len = 256
[ppo]
lr = 0.003
"#;

#[test]
fn a_run_with_a_critic_of_its_own_checkpoints_it_and_resumes_exactly() {
    let dir = scratch("train-critic");
    let config = dir.join("critic.toml");
    std::fs::write(&config, format!("{SMALL}[critic]\nd_model = 16\nlr = 0.001\n")).unwrap();
    let bandit = plugin("bandit");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
    let train = |out: &Path, steps: &str| {
        let args = ["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--steps", steps, "--out"];
        let out = ragen_host(&[&args[..], &[out.to_str().unwrap()]].concat());
        assert!(out.status.success(), "{}", text(&out));
    };
    train(&a, "4");
    train(&b, "3"); // its last step validates, as the third of four does at test_freq 3
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.join("checkpoint/critic.bin").exists() && b.join("checkpoint/critic-optimizer.bin").exists(), "the critic is saved");
    let metrics = std::fs::read_to_string(a.join("metrics.jsonl")).unwrap();
    assert_eq!(without_timings(&std::fs::read_to_string(b.join("metrics.jsonl")).unwrap()), without_timings(&metrics), "resumed exactly");
    let critic_norms: Vec<f64> =
        metrics.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["critic_grad_norm"].as_f64().unwrap()).collect();
    assert!(critic_norms.iter().all(|&n| n > 0.0), "the critic's gradient norm is logged every step: {critic_norms:?}");
    let written = std::fs::read_to_string(a.join("config.toml")).unwrap();
    assert!(written.contains("[critic]") && written.contains("d_model = 16"), "{written}");
}

#[test]
fn a_run_leaves_metrics_and_a_checkpoint_and_resumes_exactly() {
    let dir = scratch("train");
    let config = dir.join("small.toml");
    std::fs::write(&config, SMALL).unwrap();
    let bandit = plugin("bandit");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);

    // Vanilla StarPO, so the checkpoint must also carry the KL's frozen
    // reference model for the resumed run to match.
    let out = ragen_host(&[
        "train",
        "--env",
        bandit.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--algo",
        "starpo",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics_a = std::fs::read_to_string(a.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics_a.lines().count(), 6);
    let first: serde_json::Value = serde_json::from_str(metrics_a.lines().next().unwrap()).unwrap();
    for key in [
        "success",
        "return_mean",
        "reward_std_before_filter",
        "reward_std_after_filter",
        "entropy",
        "grad_norm",
        "clip_fraction",
        "approx_kl",
        "response_tokens",
        "valid_action_ratio",
    ] {
        assert!(first[key].is_number(), "metrics.jsonl lacks `{key}`: {first}");
    }
    assert!(metrics_a.lines().filter(|l| l.contains("val_success")).count() >= 2, "validation every test_freq steps");
    assert!(a.join("config.toml").exists() && a.join("checkpoint/state.json").exists());
    let png = std::fs::read(a.join("dashboard.png")).expect("a dashboard is drawn");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "dashboard.png is a real picture");

    // Three steps, then resume to six: the same metrics as one straight run.
    let out = ragen_host(&[
        "train",
        "--env",
        bandit.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--algo",
        "starpo",
        "--steps",
        "3",
        "--out",
        b.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "6"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.join("checkpoint/reference.bin").exists(), "the KL's reference is saved");
    assert_eq!(
        without_timings(&std::fs::read_to_string(b.join("metrics.jsonl")).unwrap()),
        without_timings(&metrics_a),
        "a resumed run continues exactly"
    );
    assert!(
        metrics_a.lines().skip(1).any(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kl_to_reference"].as_f64().unwrap() > 0.0)
    );

    let out = ragen_host(&["eval", "--env", bandit.to_str().unwrap(), "--checkpoint", a.to_str().unwrap(), "--episodes", "32", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policy"], "burn-transformer");
    assert!(v["success_rate"].as_f64().unwrap() >= 0.0);

    // --temperature reaches a trained checkpoint: at 0 the policy's own
    // seed no longer matters, at 5 it does; --top-p is refused there.
    let returns = |t: &str, seed: &str| {
        let out = ragen_host(&[
            "eval",
            "--env",
            bandit.to_str().unwrap(),
            "--checkpoint",
            a.to_str().unwrap(),
            "--episodes",
            "32",
            "--json",
            "--temperature",
            t,
            "--seed",
            seed,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["return_mean"].as_f64().unwrap()
    };
    assert_eq!(returns("0", "1"), returns("0", "2"), "greedy");
    assert_ne!(returns("5", "1"), returns("5", "2"), "sampled");
    let out = ragen_host(&["eval", "--env", bandit.to_str().unwrap(), "--checkpoint", a.to_str().unwrap(), "--top-p", "0.9"]);
    assert!(!out.status.success() && text(&out).contains("--top-p and --top-k apply to --model"), "{}", text(&out));
}

/// DAPO's dynamic sampling on FrozenLake with an untrained policy: most
/// groups of a lake all fail (no spread, nothing to learn), so a step plays
/// further batches of new lakes until its four groups have some spread.
#[test]
fn dynamic_sampling_refills_the_batch_with_groups_that_have_spread() {
    let dir = scratch("train-dynamic");
    let config = dir.join("dynamic.toml");
    let dynamic = SMALL.replace("steps = 6", "steps = 3").replace("test_freq = 3", "test_freq = 10").replace(
        "lr = 0.003",
        "lr = 0.003\nrollout_filter_ratio = 1.0\ndynamic_sampling = true\nmax_num_gen_batches = 8\n[env]\nis_slippery = false",
    );
    std::fs::write(&config, dynamic).unwrap();
    let lake = plugin("frozenlake");
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let out = ragen_host(&["train", "--env", lake.to_str().unwrap(), "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let played: Vec<u64> = metrics.iter().map(|m| m["groups_played"].as_u64().unwrap()).collect();
    assert!(played.iter().all(|&p| p % 4 == 0 && (4..=32).contains(&p)), "whole batches of 4 groups, at most 8: {played:?}");
    assert!(played.iter().any(|&p| p > 4), "an untrained policy fails whole groups, which are played again: {played:?}");
    for m in &metrics {
        let (played, kept) = (m["groups_played"].as_u64().unwrap(), m["groups_kept"].as_u64().unwrap());
        assert!(played == 32 || kept == 4, "a batch is refilled to its four groups unless the batches run out: {m}");
        assert!(kept == 0 || m["reward_std_after_filter"].as_f64().unwrap() > 0.0, "only groups with spread are kept: {m}");
        assert_eq!(m["episodes"].as_u64().unwrap(), played * 8, "every episode played counts in the step's figures: {m}");
    }
}

#[test]
fn the_schedule_sets_each_steps_rate_and_the_best_validated_checkpoint_is_kept() {
    let dir = scratch("train-best");
    let config = dir.join("best.toml");
    let scheduled = SMALL
        .replace("steps = 6", "steps = 5")
        .replace("test_freq = 3", "test_freq = 1")
        .replace("lr = 0.003", "lr = 0.003\nlr_scheduler_type = \"cosine\"\nlr_warmup_steps = 2\nmin_lr_ratio = 0.1");
    std::fs::write(&config, scheduled).unwrap();
    let bandit = plugin("bandit");
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let out =
        ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();

    // Warm-up 0.0015, 0.003; then cosine over steps 2..=4 to 0.0003.
    let lr: Vec<f64> = metrics.iter().map(|m| m["lr"].as_f64().unwrap()).collect();
    let expected = [0.0015, 0.003, 0.003, 0.0003 + 0.0027 * 0.5, 0.0003];
    for (got, want) in lr.iter().zip(expected) {
        assert!((got - want).abs() < 1e-9, "lr per step {lr:?}, expected {expected:?}");
    }

    // checkpoint-best/ holds the first step with the highest validation success.
    let val: Vec<f64> = metrics.iter().map(|m| m["val_success"].as_f64().expect("validated every step")).collect();
    let best = val.iter().cloned().fold(f64::MIN, f64::max);
    let best_step = val.iter().position(|&v| v == best).unwrap() as u64 + 1;
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("checkpoint-best/state.json")).unwrap()).unwrap();
    assert_eq!((state["step"].as_u64().unwrap(), state["val_success"].as_f64().unwrap()), (best_step, best), "{val:?}");

    // eval reads the best by default and says so; a checkpoint folder picks
    // one. On the validation seeds (from 1,000,000, not the eval seeds from
    // 123), with the run's sampling seed, eval replays validation exactly:
    // the success that chose the checkpoint was measured there.
    let eval = |path: &std::path::Path| {
        let out = ragen_host(&[
            "eval",
            "--env",
            bandit.to_str().unwrap(),
            "--checkpoint",
            path.to_str().unwrap(),
            "--episodes",
            "16",
            "--seed-start",
            "1000000",
            "--seed",
            "0",
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let v = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
        (v["checkpoint"].as_str().unwrap().to_string(), v["success_rate"].as_f64().unwrap())
    };
    let (read, success) = eval(&run);
    assert!(read.contains("checkpoint-best") && read.contains(&format!("after step {best_step}")), "{read}");
    assert_eq!(success, best, "validation of the best checkpoint replayed on the validation seeds");
    let (read, success) = eval(&run.join("checkpoint"));
    assert!(read.contains("checkpoint`") && read.contains("after step 5"), "{read}");
    assert_eq!(success, val[4], "the last step's validation replayed on the validation seeds");
}

#[test]
fn train_explains_bad_input() {
    let bandit = plugin("bandit");
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--backend", "cuda", "--out", "/nonexistent/x"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("backend `cuda`"), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", "/nonexistent/run"]);
    assert!(text(&out).contains("--resume needs a run directory"), "{}", text(&out));
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--algo", "ppo2"]);
    assert!(text(&out).contains("use starpo-s, starpo or grpo"), "{}", text(&out));
}

#[test]
fn compare_draws_runs_side_by_side_and_names_a_bad_directory() {
    let dir = scratch("compare");
    let config = dir.join("small.toml");
    std::fs::write(&config, SMALL.replace("steps = 6", "steps = 2")).unwrap();
    let bandit = plugin("bandit");
    let mut runs = vec![];
    for algo in ["starpo", "starpo-s"] {
        let run = dir.join(algo);
        let _ = std::fs::remove_dir_all(&run);
        let out = ragen_host(&[
            "train",
            "--env",
            bandit.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--algo",
            algo,
            "--out",
            run.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        runs.push(run.to_str().unwrap().to_string());
    }
    let png = dir.join("compare.png");
    let _ = std::fs::remove_file(&png);
    let out = ragen_host(&["compare", &runs[0], &runs[1], "--out", png.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000);

    let out = ragen_host(&["compare", dir.to_str().unwrap(), "--out", png.to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("no metrics.jsonl"), "{}", text(&out));
}

#[test]
fn sigterm_stops_a_run_after_its_step_with_a_checkpoint() {
    // A stop from a scheduler or `timeout` (SIGTERM) must not lose the run:
    // like Ctrl-C, it finishes the step in hand and writes a checkpoint,
    // although no periodic checkpoint is due. `timeout` signals the process
    // and then its process group, so the stop arrives twice at once: that
    // is still one stop, not a second Ctrl-C that aborts.
    use std::os::unix::process::CommandExt;
    let dir = scratch("train-sigterm");
    let config = dir.join("long.toml");
    std::fs::write(&config, SMALL.replace("steps = 6", "steps = 100000").replace("save_freq = 2", "save_freq = 100000")).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let bandit = plugin("bandit");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ragen-host"))
        .args(["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()])
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = || std::fs::read_to_string(run.join("metrics.jsonl")).map(|m| m.lines().count()).unwrap_or(0);
    let started = std::time::Instant::now();
    while lines() < 3 {
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "the run wrote no 3 steps in 2 minutes");
        assert!(child.try_wait().unwrap().is_none(), "the run ended on its own");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for target in [child.id().to_string(), format!("-{}", child.id())] {
        let kill = std::process::Command::new("kill").args(["-TERM", "--", &target]).status().unwrap();
        assert!(kill.success());
    }
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("the run did not stop within a minute of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("second stop signal"), "{}", text(&out));
    assert!(text(&out).contains("--resume"), "says how to continue: {}", text(&out));
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("checkpoint/state.json")).unwrap()).unwrap();
    assert_eq!(state["step"].as_u64().unwrap() as usize, lines(), "the checkpoint holds every step metrics.jsonl reports");
}

#[test]
fn sigkill_at_any_moment_of_a_save_leaves_a_checkpoint_that_loads() {
    // A run saving after every step is killed (SIGKILL: no handler runs)
    // at a different moment each round, then resumed from whatever it
    // left: a checkpoint always loads, in eval and in resume, whichever
    // point of a save the kill hit. A killed run's lock goes with it.
    let dir = scratch("train-sigkill");
    let config = dir.join("saving.toml");
    let saving = SMALL
        .replace("steps = 6", "steps = 100000")
        .replace("save_freq = 2", "save_freq = 1")
        .replace("test_freq = 3", "test_freq = 100000");
    std::fs::write(&config, saving).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let bandit = plugin("bandit");
    let bandit = bandit.to_str().unwrap();
    let lines = || std::fs::read_to_string(run.join("metrics.jsonl")).map(|m| m.lines().count()).unwrap_or(0);
    for round in 0..30u64 {
        let mut args = vec!["train", "--env", bandit];
        let run_arg = run.to_str().unwrap();
        if round == 0 {
            args.extend(["--config", config.to_str().unwrap(), "--out", run_arg]);
        } else {
            args.extend(["--resume", run_arg, "--steps", "100000"]);
        }
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ragen-host"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Two new steps in (a step's line is written before its save, so
        // the first new step's save is done), then a moment that differs
        // by round: the kill lands in a step, in a save, or between.
        let before = lines();
        let started = std::time::Instant::now();
        while lines() < before + 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(120), "round {round}: no step in 2 minutes");
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("round {round}: the run ended ({status}):\n{err}");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(round * 7 % 40));
        child.kill().unwrap();
        child.wait().unwrap();
        let out = ragen_host(&["eval", "--env", bandit, "--checkpoint", run_arg, "--episodes", "2"]);
        assert!(out.status.success(), "round {round}: the checkpoint left by the kill does not load:\n{}", text(&out));
    }
    assert!(lines() >= 30, "every round added steps");
}

#[test]
fn a_save_the_disk_refuses_fails_clearly_and_keeps_the_previous_checkpoint() {
    // The disk runs out under a resumed run: a file-size limit (`ulimit
    // -f`, with SIGXFSZ ignored so that writes fail with EFBIG instead of
    // killing the process) refuses the 190 KB model file of the next save,
    // as a full disk refuses it with ENOSPC. The run must stop with an
    // error that says what could not be written, and the checkpoint before
    // it must still load, at the step it had.
    let dir = scratch("train-full-disk");
    let config = dir.join("small.toml");
    std::fs::write(&config, SMALL.replace("steps = 6", "steps = 2")).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let bandit = plugin("bandit");
    let bandit = bandit.to_str().unwrap();
    let out = ragen_host(&["train", "--env", bandit, "--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let step = || -> u64 {
        let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("checkpoint/state.json")).unwrap()).unwrap();
        state["step"].as_u64().unwrap()
    };
    assert_eq!(step(), 2);
    let host = env!("CARGO_BIN_EXE_ragen-host");
    let resume = format!("trap '' XFSZ; ulimit -f 100; exec '{host}' train --env '{bandit}' --resume '{}' --steps 4", run.display());
    let out = std::process::Command::new("bash").args(["-c", &resume]).output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "the run must fail, not die or go on:\n{all}");
    assert!(all.contains("cannot write the model") && all.contains("File too large"), "says what could not be written, and why:\n{all}");
    assert_eq!(step(), 2, "the previous checkpoint is the one left");
    let out = ragen_host(&["eval", "--env", bandit, "--checkpoint", run.to_str().unwrap(), "--episodes", "2"]);
    assert!(out.status.success(), "the previous checkpoint still loads:\n{}", text(&out));
}

#[test]
fn every_example_config_is_a_valid_training_config() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let config = ragen_learner::TrainConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            config.resolve().unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            if path.file_name().unwrap().to_string_lossy().starts_with("smollm2-") {
                assert!(config.model_path.is_some() && config.lora.rank > 0, "{} trains SmolLM2 with LoRA", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} example configs found in {}", dir.display());
}

#[test]
fn a_warm_start_imitates_the_oracle_and_rl_starts_exactly_where_it_ended() {
    let dir = scratch("train-warm");
    let config = dir.join("warm.toml");
    std::fs::write(&config, format!("{SMALL}[warm_start]\nsteps = 3\nepisodes = 8\nlr = 0.01\n")).unwrap();
    let bandit = plugin("bandit");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
    let train = |out: &Path, steps: &str| {
        let args = ["train", "--env", bandit.to_str().unwrap(), "--config", config.to_str().unwrap(), "--steps", steps, "--out"];
        let out = ragen_host(&[&args[..], &[out.to_str().unwrap()]].concat());
        assert!(out.status.success(), "{}", text(&out));
        text(&out)
    };
    // Three warm-start steps, then three of RL.
    let said = train(&a, "3");
    assert!(said.contains("3 warm-start steps on demonstrations (oracle)"), "{said}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(a.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 6);
    for (i, m) in lines.iter().enumerate() {
        assert_eq!(m["warm_start"].as_bool().unwrap_or(false), i < 3, "step {i}: {m}");
    }
    // The oracle's demonstrations all succeed, and imitating them lowers
    // their surprise; the warm start's last step is validated.
    assert!(lines[..3].iter().all(|m| m["success"] == 1.0 && m["groups_kept"] == 8), "{lines:?}");
    let loss = |i: usize| lines[i]["policy_loss"].as_f64().unwrap();
    assert!(loss(2) < loss(0), "imitation lowers the loss: {} then {}", loss(0), loss(2));
    assert!(lines[2]["val_success"].is_number(), "{}", lines[2]);

    // The warm start alone, then RL resumed from its checkpoint: exactly
    // the run that went straight on.
    train(&b, "0");
    let out = ragen_host(&["train", "--env", bandit.to_str().unwrap(), "--resume", b.to_str().unwrap(), "--steps", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let straight = without_timings(&std::fs::read_to_string(a.join("metrics.jsonl")).unwrap());
    assert_eq!(without_timings(&std::fs::read_to_string(b.join("metrics.jsonl")).unwrap()), straight, "RL starts from the warm start");
    let written = std::fs::read_to_string(a.join("config.toml")).unwrap();
    assert!(written.contains("[warm_start]") && written.contains("steps = 3"), "{written}");
}

#[test]
fn a_warm_start_from_a_file_replays_its_replies_through_this_env() {
    let dir = scratch("train-warm-file");
    let bandit = plugin("bandit");
    let demos = dir.join("demos.jsonl");
    // The oracle's play, recorded by eval under the run's own prompts.
    let config = dir.join("run.toml");
    std::fs::write(&config, SMALL).unwrap();
    let args = ["eval", "--env", bandit.to_str().unwrap(), "--policy", "oracle", "--episodes", "16", "--config"];
    let out = ragen_host(&[&args[..], &[config.to_str().unwrap(), "--trajectories", demos.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let warm = dir.join("warm.toml");
    std::fs::write(&warm, format!("{SMALL}[warm_start]\nsteps = 2\nepisodes = 8\ndemonstrations = \"{}\"\n", demos.display())).unwrap();
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    let args = ["train", "--env", bandit.to_str().unwrap(), "--config", warm.to_str().unwrap(), "--steps", "0", "--out"];
    let out = ragen_host(&[&args[..], &[run.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|m| m["warm_start"] == true && m["success"] == 1.0 && m["groups_kept"] == 8), "{lines:?}");

    // A file that is not there is named, with what to use instead.
    std::fs::write(&warm, format!("{SMALL}[warm_start]\nsteps = 2\ndemonstrations = \"/no/such/demos.jsonl\"\n")).unwrap();
    let args = ["train", "--env", bandit.to_str().unwrap(), "--config", warm.to_str().unwrap(), "--out"];
    let out = ragen_host(&[&args[..], &[dir.join("bad").to_str().unwrap()]].concat());
    assert!(!out.status.success());
    assert!(text(&out).contains("/no/such/demos.jsonl") && text(&out).contains("\"oracle\""), "{}", text(&out));
}

/// A checkpoint is bytes on a disk that can fill, a copy that can be cut
/// short, a file someone edited: each damage is refused with an error that
/// names the file, never a panic, and resuming never starts from half a
/// checkpoint.
#[test]
fn a_damaged_checkpoint_is_refused_naming_the_file() {
    let dir = scratch("damaged-checkpoint");
    let config = dir.join("small.toml");
    std::fs::write(&config, SMALL.replace("steps = 6", "steps = 2")).unwrap();
    let bandit = plugin("bandit");
    let bandit = bandit.to_str().unwrap();
    let good = dir.join("good");
    let _ = std::fs::remove_dir_all(&good);
    let out = ragen_host(&["train", "--env", bandit, "--config", config.to_str().unwrap(), "--out", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));

    type Damage = fn(&Path);
    let cut_half: Damage = |f| {
        let bytes = std::fs::read(f).unwrap();
        std::fs::write(f, &bytes[..bytes.len() / 2]).unwrap();
    };
    let empty: Damage = |f| std::fs::write(f, b"").unwrap();
    let scrambled: Damage = |f| {
        let mut bytes = std::fs::read(f).unwrap();
        for b in bytes.iter_mut().take(64) {
            *b = 0xff;
        }
        std::fs::write(f, bytes).unwrap();
    };
    let not_json: Damage = |f| std::fs::write(f, b"{\"step\": ").unwrap();
    let cases: [(&str, Damage, &str); 5] = [
        ("model.bin", cut_half, "model.bin"),
        ("model.bin", empty, "model.bin"),
        ("model.bin", scrambled, "model.bin"),
        ("state.json", not_json, "state.json"),
        ("optimizer.bin", cut_half, "optimizer.bin"),
    ];
    for (k, (file, damage, named)) in cases.into_iter().enumerate() {
        let run = dir.join(format!("damaged-{k}"));
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(run.join("checkpoint")).unwrap();
        for name in ["config.toml", "metrics.jsonl"] {
            std::fs::copy(good.join(name), run.join(name)).unwrap();
        }
        for entry in std::fs::read_dir(good.join("checkpoint")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), run.join("checkpoint").join(entry.file_name())).unwrap();
        }
        damage(&run.join("checkpoint").join(file));
        // eval reads the weights (and state.json); resuming reads everything.
        let args: Vec<String> = if file == "optimizer.bin" {
            ["train", "--env", bandit, "--resume", run.to_str().unwrap(), "--steps", "3"].map(String::from).to_vec()
        } else {
            ["eval", "--env", bandit, "--checkpoint", run.join("checkpoint").to_str().unwrap(), "--episodes", "4"]
                .map(String::from)
                .to_vec()
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ragen_host(&args);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{file} damaged ({k}): `{}` should be refused:\n{all}", args[0]);
        assert!(all.contains(named) && !all.contains("panicked"), "{file} damaged ({k}): the error names the file:\n{all}");
    }
}
