//! Plugins written in Python and JavaScript, run in the same sandbox as the
//! Rust ones: the guide's three corridors play identically, guess-number's
//! feedback is sound enough for bisection to always win, and 2048 keeps the
//! game's rules.

use crate::common::{loaded_example, shipped};
use ragen_env_sdk::SeedRng;
use ragen_runtime::{EnvHandle, PluginInstance, StepResult};

fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Everything a step reports, comparable across plugins.
fn view(r: Result<StepResult, ragen_runtime::EnvError>) -> Result<(String, u64, bool, bool, bool, bool), ragen_runtime::ErrorKind> {
    r.map(|s| (s.observation, s.reward.to_bits(), s.done, s.info.success, s.info.action_is_valid, s.info.action_is_effective))
        .map_err(|e| e.kind)
}

#[test]
fn the_rust_python_and_javascript_corridors_play_identically() {
    let rust = loaded_example("corridor");
    let twins: Vec<_> = ["corridor-py", "corridor-js"].into_iter().map(|n| (n, loaded_example(n))).collect();
    let mut reference = rust.instantiate().unwrap();
    for (name, plugin) in &twins {
        let mut twin = plugin.instantiate().unwrap();
        assert_eq!(twin.info().unwrap().config_keys.len(), 1, "{name}");
        for length in ["2", "5", "9"] {
            let a = reference.create(&pairs(&[("length", length)])).unwrap().unwrap();
            let b = twin.create(&pairs(&[("length", length)])).unwrap().unwrap();
            assert_eq!(reference.spec(a).unwrap().action_space, twin.spec(b).unwrap().action_space, "{name}");
            // Before reset, both refuse to step with the same kind of error.
            assert_eq!(view(reference.step(a, 1).unwrap()), view(twin.step(b, 1).unwrap()), "{name}: step before reset");
            for seed in 0..12u64 {
                assert_eq!(reference.reset(a, seed).unwrap().unwrap(), twin.reset(b, seed).unwrap().unwrap(), "{name} seed {seed}");
                let mut actions = SeedRng::new(seed);
                // Past the end of the episode too: both must say episode-over.
                for t in 0..25 {
                    let action = if t == 3 { 7 } else { actions.below(2) as u32 };
                    let (x, y) = (view(reference.step(a, action).unwrap()), view(twin.step(b, action).unwrap()));
                    assert_eq!(x, y, "{name}, length {length}, seed {seed}, step {t}, action {action}");
                }
            }
        }
    }
    // The same config errors, by kind.
    for bad in [&[("length", "1")][..], &[("width", "3")][..], &[("length", "x")][..]] {
        let want = reference.create(&pairs(bad)).unwrap().err().map(|e| e.kind);
        for (name, plugin) in &twins {
            let got = plugin.instantiate().unwrap().create(&pairs(bad)).unwrap().err().map(|e| e.kind);
            assert_eq!(got, want, "{name}: {bad:?}");
        }
    }
}

/// Play guess-number by bisection; returns (won, guesses, secret).
fn bisect(inst: &mut PluginInstance, env: EnvHandle, seed: u64) -> (bool, usize, u32) {
    inst.reset(env, seed).unwrap().unwrap();
    let (mut lo, mut hi) = (1u32, 16u32);
    for n in 1.. {
        let guess = (lo + hi) / 2;
        let out = inst.step(env, guess - 1).unwrap().unwrap();
        let last = out.observation.lines().find(|l| l.starts_with(&format!("You guessed {guess}:"))).unwrap().to_string();
        if last.ends_with("correct.") {
            assert!(out.info.success && out.done && out.reward == 1.0);
            return (true, n, guess);
        }
        if last.ends_with("higher.") {
            lo = guess + 1;
        } else {
            assert!(last.ends_with("lower."), "{last}");
            hi = guess - 1;
        }
        // The env's own count of numbers the feedback still allows.
        assert_eq!(out.info.metrics, vec![n as f64, (hi - lo + 1) as f64]);
        assert!(out.reward == 0.0 && !out.info.success);
        if out.done {
            return (false, n, 0);
        }
    }
    unreachable!()
}

#[test]
fn bisection_always_wins_guess_number_and_random_guessing_does_not() {
    let plugin = shipped("guess-number");
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&[]).unwrap().unwrap();
    let spec = inst.spec(env).unwrap();
    assert_eq!(spec.action_names(), (1..=16).map(|v| v.to_string()).collect::<Vec<_>>());
    assert_eq!((spec.limits.max_turns, spec.limits.max_actions_per_turn), (5, 1));
    let mut secrets = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let (won, guesses, secret) = bisect(&mut inst, env, seed);
        assert!(won && guesses <= 5, "seed {seed}: bisection lost");
        secrets.insert(secret);
    }
    assert_eq!(secrets.len(), 16, "every number is some seed's secret");

    // Uniformly random guesses win about 5/16 of the time.
    let mut rng = SeedRng::new(9);
    let mut wins = 0;
    for seed in 0..200 {
        inst.reset(env, seed).unwrap().unwrap();
        loop {
            let out = inst.step(env, rng.below(16) as u32).unwrap().unwrap();
            if out.done {
                wins += out.info.success as usize;
                break;
            }
        }
    }
    assert!((30..=100).contains(&wins), "random guessing won {wins} of 200");

    let bad = plugin.instantiate().unwrap().create(&pairs(&[("high", "0")])).unwrap().unwrap_err();
    assert!(bad.message.contains("`high`"), "{}", bad.message);
}

fn board(observation: &str) -> Vec<u32> {
    observation.split_whitespace().map(|c| if c == "." { 0 } else { c.parse().unwrap() }).collect()
}

#[test]
fn game_2048_keeps_the_rules() {
    let plugin = shipped("2048");
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&pairs(&[("size", "4"), ("target", "64"), ("max_moves", "200")])).unwrap().unwrap();
    let (mut successes, mut effective, mut idle) = (0, 0, 0);
    for seed in 0..20u64 {
        let start = board(&inst.reset(env, seed).unwrap().unwrap());
        assert_eq!(start.len(), 16);
        assert_eq!(start.iter().filter(|&&v| v != 0).count(), 2, "two tiles to start");
        let mut before = start;
        let mut score = 0.0;
        let mut rng = SeedRng::new(seed);
        loop {
            let out = inst.step(env, rng.below(4) as u32).unwrap().unwrap();
            let after = board(&out.observation);
            let [max_tile, new_score, empty] = out.info.metrics[..] else { panic!("three metrics") };
            let merged = new_score - score;
            score = new_score;
            let (sum_before, sum_after): (u32, u32) = (before.iter().sum(), after.iter().sum());
            if out.info.action_is_effective {
                // Merging keeps the sum; the new tile adds a 2 or a 4.
                assert!([2, 4].contains(&(sum_after - sum_before)), "seed {seed}: {before:?} -> {after:?}");
                effective += 1;
            } else {
                assert_eq!(before, after, "a move that changes nothing leaves the board alone");
                assert_eq!(merged, 0.0);
                idle += 1;
            }
            assert_eq!(max_tile, *after.iter().max().unwrap() as f64);
            assert_eq!(empty, after.iter().filter(|&&v| v == 0).count() as f64);
            assert!(after.iter().all(|&v| v == 0 || v.is_power_of_two()));
            assert_eq!(out.info.success, max_tile >= 64.0);
            assert_eq!(out.reward, merged / 64.0 + if out.info.success { 1.0 } else { 0.0 });
            before = after;
            if out.done {
                successes += out.info.success as usize;
                break;
            }
        }
    }
    assert!(effective > 100 && idle > 0, "{effective} effective and {idle} idle moves");
    // Random play on a 4x4 board reaches 64 now and then, not always.
    assert!(successes < 20, "{successes} of 20");
}
