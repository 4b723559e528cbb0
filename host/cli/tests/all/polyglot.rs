//! The plugins written in Python (guess-number) and JavaScript (2048), and
//! the guide's minimal examples in all three languages, go through the same
//! commands as the Rust ones: `validate`, `play`, `bench`, `train`.

use crate::common::{example, plugin, ragen_host, scratch, text};

#[test]
fn the_python_and_javascript_plugins_and_every_guide_example_pass_validate() {
    let files =
        [("plugin", "guess-number"), ("plugin", "2048"), ("example", "corridor"), ("example", "corridor-py"), ("example", "corridor-js")];
    for (kind, name) in files {
        let file = if kind == "plugin" { plugin(name) } else { example(name) };
        // A JavaScript runtime is slow to instantiate and CI's cores are
        // shared: this test is about correctness, so it allows more time.
        let out = ragen_host(&["validate", file.to_str().unwrap(), "--budget", "180"]);
        let report = text(&out);
        assert!(out.status.success(), "{name}:\n{report}");
        assert!(report.contains("PASS: all 11 checks passed"), "{name}:\n{report}");
    }
}

fn play(file: &std::path::Path, args: &[&str], keys: &str) -> String {
    let args: Vec<&str> = std::iter::once(file.to_str().unwrap()).chain(args.iter().copied()).collect();
    let (ok, screen) = crate::common::play(&args, keys);
    assert!(ok, "{screen}");
    screen
}

#[test]
fn a_person_plays_guess_number() {
    let file = plugin("guess-number");
    // Try every number, each in a fresh episode of the same seed: exactly
    // one is the secret, and every other answer points towards it.
    let keys: String = (1..=16).map(|g| format!("{g}\nreset 7\n")).collect();
    let screen = play(&file, &["--seed", "7"], &format!("{keys}quit\n"));
    assert!(screen.contains("The secret is between 1 and 16."), "{screen}");
    let secret: Vec<u32> = (1..=16).filter(|g| screen.contains(&format!("You guessed {g}: correct."))).collect();
    assert_eq!(secret.len(), 1, "{screen}");
    for g in 1..=16 {
        let expect = match g.cmp(&secret[0]) {
            std::cmp::Ordering::Less => "higher",
            std::cmp::Ordering::Greater => "lower",
            std::cmp::Ordering::Equal => "correct",
        };
        assert!(screen.contains(&format!("You guessed {g}: {expect}.")), "guess {g}:\n{screen}");
    }
    assert!(screen.contains("success true"), "{screen}");
}

#[test]
fn a_person_plays_2048() {
    let file = plugin("2048");
    let screen = play(&file, &["--seed", "3", "--set", "size=4"], "left || up\ndiagonal\nright\nquit\n");
    assert!(screen.contains("Actions: Up, Down, Left, Right"), "{screen}");
    assert!(screen.contains("unknown action `diagonal`"), "{screen}");
    // A 4x4 board: four rows of four cells.
    assert!(
        screen.lines().any(|l| l.split_whitespace().count() == 4 && l.split_whitespace().all(|c| c == "." || c.parse::<u32>().is_ok())),
        "{screen}"
    );
}

#[test]
fn bench_reports_the_cost_of_a_language_runtime() {
    let file = plugin("guess-number");
    let out = ragen_host(&["bench", file.to_str().unwrap(), "--envs", "64", "--seconds", "0.4", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["sandboxed"]["steps_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["failures"], 0, "{report}");
    // CPython's heap snapshot is megabytes; a Rust plugin's is kilobytes.
    assert!(report["linear_memory_bytes_per_instance"].as_f64().unwrap() > (1 << 20) as f64, "{report}");
    assert!(report["component_bytes"].as_u64().unwrap() > 1 << 20, "{report}");
}

const TINY: &str = r#"
steps = 2
test_freq = 2
val_episodes = 8
[rollout]
env_groups = 2
group_size = 4
enable_think = false
[model]
d_model = 32
n_layers = 1
n_heads = 2
max_seq_len = 768
"#;

#[test]
fn train_runs_on_the_python_and_javascript_plugins() {
    let dir = scratch("polyglot-train");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    for name in ["guess-number", "2048"] {
        let file = plugin(name);
        let out_dir = dir.join(name);
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = ragen_host(&[
            "train",
            "--env",
            file.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
        assert_eq!(metrics.lines().count(), 2, "{name}: {metrics}");
        for line in metrics.lines() {
            let m: serde_json::Value = serde_json::from_str(line).unwrap();
            let entropy = m["entropy"].as_f64().unwrap();
            assert!(entropy.is_finite() && entropy > 0.0, "{name}: {line}");
            assert!(m["valid_action_ratio"].as_f64().unwrap() > 0.0, "{name}: {line}");
        }
    }
}
