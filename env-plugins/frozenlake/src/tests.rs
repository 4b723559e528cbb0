use super::*;
use lake::Lake;
use ragen_env_sdk::{CheckedEnv, ErrorKind};
use values::value_iteration;

const LEFT: u32 = 0;
const DOWN: u32 = 1;
const RIGHT: u32 = 2;
const UP: u32 = 3;

fn env(settings: &[(&str, &str)]) -> CheckedEnv<FrozenLake> {
    CheckedEnv::with(settings).unwrap()
}

#[test]
fn every_generated_map_has_a_reachable_goal() {
    let e = env(&[]);
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..2000 {
        let lake = e.inner().initial_lake(seed).unwrap();
        assert!(lake.goal_reachable(), "seed {seed}");
        assert_ne!(lake.start(), lake.goal());
        distinct.insert(format!("{lake:?}"));
    }
    assert!(distinct.len() > 1900, "only {} distinct maps", distinct.len());
    // Low p needs many redraws but still only yields reachable maps.
    let sparse = env(&[("p", "0.4"), ("size", "6")]);
    for seed in 0..200 {
        assert!(sparse.inner().initial_lake(seed).unwrap().goal_reachable());
    }
}

#[test]
fn same_seed_same_map_and_same_slips() {
    let (mut a, mut b) = (env(&[]), env(&[]));
    for seed in 0..100 {
        assert_eq!(a.reset(seed).unwrap(), b.reset(seed).unwrap());
        for action in [RIGHT, DOWN, LEFT, UP, RIGHT] {
            let (x, y) = (a.step(action), b.step(action));
            assert_eq!(x, y);
            if x.map(|o| o.done).unwrap_or(true) {
                break;
            }
        }
    }
}

/// An open 5x5 lake with the start in the middle: every move from the start
/// lands on frozen ice, so the direction taken can be read off the position.
const OPEN: &str = "FFFFF/FFFFF/FFSFF/FFFFF/GFFFF";

fn direction_frequencies(settings: &[(&str, &str)], n: u64) -> [f64; 3] {
    let mut e = env(settings);
    let mut counts = [0u32; 3]; // up (intended), left, right
    for seed in 0..n {
        e.reset(seed).unwrap();
        let out = e.step(UP).unwrap();
        let player = e.inner().player();
        let idx = match player {
            7 => 0,
            11 => 1,
            13 => 2,
            other => panic!("Up from 12 landed on {other}"),
        };
        assert_eq!(out.info.metrics[0], (idx != 0) as u8 as f64, "slipped metric");
        counts[idx] += 1;
    }
    counts.map(|c| c as f64 / n as f64)
}

#[test]
fn slipping_takes_each_direction_a_third_of_the_time() {
    let freq = direction_frequencies(&[("map", OPEN)], 30_000);
    // sd of a 1/3 frequency over 30k draws ≈ 0.0027; allow ~4.5 sd.
    for f in freq {
        assert!((f - 1.0 / 3.0).abs() < 0.012, "{freq:?}");
    }
}

#[test]
fn slipping_follows_a_configured_success_rate() {
    let freq = direction_frequencies(&[("map", OPEN), ("success_rate", "0.8")], 30_000);
    assert!((freq[0] - 0.8).abs() < 0.011, "{freq:?}");
    assert!((freq[1] - 0.1).abs() < 0.008 && (freq[2] - 0.1).abs() < 0.008, "{freq:?}");
    let still = direction_frequencies(&[("map", OPEN), ("is_slippery", "false")], 500);
    assert_eq!(still, [1.0, 0.0, 0.0]);
}

#[test]
fn moving_off_the_map_stays_put() {
    let mut e = env(&[("map", "SF/FG"), ("is_slippery", "false")]);
    assert_eq!(e.reset(0).unwrap(), "P_\n_G");
    let out = e.step(UP).unwrap();
    assert_eq!(out.observation, "P_\n_G");
    assert!(!out.info.action_is_effective && !out.done && out.reward == 0.0);
    assert!(!e.step(LEFT).unwrap().info.action_is_effective);
}

#[test]
fn goal_pays_one_and_ends_with_success() {
    let mut e = env(&[("map", "SF/FG"), ("is_slippery", "false")]);
    e.reset(0).unwrap();
    let out = e.step(RIGHT).unwrap();
    assert!(out.reward == 0.0 && !out.done && out.info.action_is_effective);
    let win = e.step(DOWN).unwrap();
    assert_eq!(win.observation, "__\n_√");
    assert!(win.reward == 1.0 && win.done && win.info.success);
    assert_eq!(e.step(DOWN).unwrap_err().kind, ErrorKind::EpisodeOver);
}

#[test]
fn a_hole_ends_the_episode_without_reward() {
    let mut e = env(&[("map", "SH/FG"), ("is_slippery", "false")]);
    e.reset(0).unwrap();
    let out = e.step(RIGHT).unwrap();
    assert_eq!(out.observation, "_X\n_G");
    assert!(out.done && !out.info.success && out.reward == 0.0);
}

#[test]
fn max_steps_ends_the_episode() {
    let mut e = env(&[("map", "SF/FG"), ("is_slippery", "false"), ("max_steps", "2")]);
    e.reset(0).unwrap();
    assert!(!e.step(UP).unwrap().done);
    let last = e.step(UP).unwrap();
    assert!(last.done && !last.info.success);
}

#[test]
fn value_iteration_matches_known_values_and_simulation() {
    // gymnasium's classic 4x4 map: optimal success with 1/3 slips and no
    // step limit is 0.8235 (a published figure for this map).
    let classic = Lake::parse("SFFF/FHFH/FFFH/HFFG").unwrap();
    let slip = Slip { success_rate: 1.0 / 3.0 };
    let v = value_iteration(&classic, slip, 5_000);
    assert!((v.value[0] - 0.8235).abs() < 1e-3, "{}", v.value[0]);
    // Without slipping the goal is certain within 6 moves, and impossible in 5.
    let sure = Slip { success_rate: 1.0 };
    assert!((value_iteration(&classic, sure, 6).value[0] - 1.0).abs() < 1e-12);
    assert_eq!(value_iteration(&classic, sure, 5).value[0], 0.0);

    // Playing the policy in the env reaches the goal as often as VI predicts.
    let mut e = env(&[("map", "SFFF/FHFH/FFFH/HFFG"), ("max_steps", "5000")]);
    let n = 4000;
    let mut wins = 0;
    for seed in 0..n {
        e.reset(seed).unwrap();
        loop {
            let out = e.step(v.policy[e.inner().player()] as u32).unwrap();
            if out.done {
                wins += out.info.success as u32;
                break;
            }
        }
    }
    let rate = wins as f64 / n as f64;
    // sd ≈ sqrt(.82 * .18 / 4000) ≈ 0.006
    assert!((rate - v.value[0]).abs() < 0.03, "simulated {rate}, value {}", v.value[0]);
}

#[test]
fn a_fixed_map_is_played_on_every_reset() {
    let mut e = env(&[("map", "SFF\nFHF\nFFG")]);
    assert_eq!(e.reset(1).unwrap(), "P__\n_O_\n__G");
    assert_eq!(e.reset(2).unwrap(), "P__\n_O_\n__G");
}

#[test]
fn bad_config_names_the_key() {
    for (settings, kind, key) in [
        (vec![("size", "0")], ErrorKind::BadValue, "size"),
        (vec![("size", "big")], ErrorKind::BadValue, "size"),
        (vec![("p", "0")], ErrorKind::BadValue, "p"),
        (vec![("p", "1.2")], ErrorKind::BadValue, "p"),
        (vec![("success_rate", "-1")], ErrorKind::BadValue, "success_rate"),
        (vec![("is_slippery", "sometimes")], ErrorKind::BadValue, "is_slippery"),
        (vec![("map", "SFG/FFF")], ErrorKind::BadValue, "map"),
        (vec![("map", "SF/FF")], ErrorKind::BadValue, "map"),
        (vec![("map", "SF/FG"), ("size", "4")], ErrorKind::BadValue, "size"),
        (vec![("slippery", "true")], ErrorKind::UnknownKey, "slippery"),
    ] {
        let err = CheckedEnv::<FrozenLake>::with(&settings).unwrap_err();
        assert_eq!(err.kind, kind, "{settings:?}: {}", err.message);
        assert!(err.message.contains(&format!("`{key}`")), "{settings:?}: {}", err.message);
    }
}

#[test]
fn actions_and_legend_match_the_reference() {
    let spec = env(&[]).spec();
    assert_eq!(spec.action_space.as_names(), ["Left", "Down", "Right", "Up"]);
    let symbols: String = spec.legend.iter().map(|l| l.symbol.as_str()).collect();
    assert_eq!(symbols, "P_OGX√");
}

#[test]
fn without_slips_the_oracle_plans_a_path_to_the_goal() {
    let mut e = env(&[("map", "SFF/HHF/GFF"), ("is_slippery", "false")]);
    assert_eq!(e.best_actions(5).unwrap_err().kind, ErrorKind::NotStarted);
    e.reset(0).unwrap();
    // Around the holes: right, right, down, down, then left to the goal.
    let plan = e.best_actions(10).unwrap();
    assert_eq!(plan.len(), 6, "{plan:?}");
    let mut last = None;
    for action in plan {
        last = Some(e.step(action).unwrap());
    }
    assert!(last.unwrap().info.success);
    assert_eq!(e.best_actions(5).unwrap_err().kind, ErrorKind::EpisodeOver);
}

#[test]
fn on_a_slippery_lake_the_oracle_gives_one_move() {
    let mut e = env(&[]);
    e.reset(3).unwrap();
    assert_eq!(e.best_actions(5).unwrap().len(), 1);
    assert_eq!(e.best_actions(5).unwrap(), e.best_actions(5).unwrap(), "asking does not change the state");
}
