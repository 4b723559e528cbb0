use super::*;
use expr::{evaluate, numbers_in, score};
use ragen_env_sdk::{CheckedEnv, ErrorKind};

#[test]
fn numbers_are_found_as_the_reference_regex_finds_them() {
    assert_eq!(numbers_in("(3 + 5) * 2"), [3, 5, 2]);
    assert_eq!(numbers_in("3.5 - x12y"), [3, 5, 12]);
    assert_eq!(numbers_in("no digits"), Vec::<u64>::new());
}

#[test]
fn evaluation_follows_python() {
    let cases: &[(&str, Option<f64>)] = &[
        ("(3 + 5) * 2", Some(16.0)),
        ("7 / 2", Some(3.5)),
        ("7 // 2", Some(3.0)),
        ("-7 // 2", Some(-4.0)),
        ("2 ** 3 ** 2", Some(512.0)),
        ("-2 ** 2", Some(-4.0)),
        ("--3", Some(3.0)),
        ("1.5 * 2", Some(3.0)),
        ("7.", Some(7.0)),
        ("00", Some(0.0)),
        ("07", None), // Python 3: leading zeros are a syntax error
        ("1 / 0", None),
        ("1 / (2 - 2)", None),
        ("(1 + 2", None),
        ("1 + 2)", None),
        ("1 2", None),
        ("", None),
        ("3 x 5", None),
        ("1..2", None),
        ("()", None),
    ];
    for &(text, want) in cases {
        assert_eq!(evaluate(text), want, "{text:?}");
    }
}

#[test]
fn the_score_is_the_references_compute_score() {
    let (nums, target) = ([3, 5, 2], 16);
    assert_eq!(score("(3 + 5) * 2", &nums, target, 0.1), 1.0);
    assert_eq!(score("2 * (5 + 3)", &nums, target, 0.1), 1.0, "any order of the numbers");
    assert_eq!(score("3 + 5 + 2", &nums, target, 0.1), 0.1, "right numbers, wrong value");
    assert_eq!(score("3 x 5 x 2", &nums, target, 0.1), 0.1, "right numbers, does not evaluate");
    assert_eq!(score("(3 + 5) * 2 = 16", &nums, target, 0.1), 0.0, "16 is a number the puzzle lacks");
    assert_eq!(score("8 * 2", &nums, target, 0.1), 0.0, "wrong numbers");
    assert_eq!(score("(3 + 5) * 2 * 2", &nums, target, 0.1), 0.0, "a number used twice");
    assert_eq!(score("", &nums, target, 0.1), 0.0);
}

#[test]
fn every_puzzle_is_solvable_and_in_range() {
    let env = CheckedEnv::<Countdown>::create(&[]).unwrap();
    for seed in 0..300 {
        let p = env.inner().puzzle(seed);
        assert!((3..=4).contains(&p.numbers.len()), "{p:?}");
        assert!(p.numbers.iter().all(|n| (1..=99).contains(n)) && (1..=100).contains(&p.target), "{p:?}");
        let answer = solver::solve(&p.numbers, p.target).unwrap_or_else(|| panic!("seed {seed}: {p:?} has no solution"));
        assert_eq!(score(&answer, &p.numbers, p.target, 0.1), 1.0, "seed {seed}: {answer}");
    }
}

#[test]
fn the_same_seed_gives_the_same_puzzle_and_seeds_differ() {
    let mut a = CheckedEnv::<Countdown>::create(&[]).unwrap();
    let mut b = CheckedEnv::<Countdown>::create(&[]).unwrap();
    assert_eq!(a.reset(7).unwrap(), b.reset(7).unwrap());
    let distinct: std::collections::HashSet<String> = (0..50).map(|s| a.reset(s).unwrap()).collect();
    assert!(distinct.len() > 45, "{} distinct puzzles in 50 seeds", distinct.len());
    assert!(a.reset(3).unwrap().starts_with("Target: "));
}

#[test]
fn one_text_step_ends_the_episode_with_the_score() {
    let mut env = CheckedEnv::<Countdown>::create(&[]).unwrap();
    env.reset(11).unwrap();
    let p = env.inner().current().clone();
    let answer = solver::solve(&p.numbers, p.target).unwrap();
    let out = env.step(answer.as_str()).unwrap();
    assert_eq!((out.reward, out.done, out.info.success, out.info.action_is_valid), (1.0, true, true, true));
    assert_eq!(env.step("1").unwrap_err().kind, ErrorKind::EpisodeOver);
    env.reset(11).unwrap();
    let out = env.step("1 + 1").unwrap();
    assert_eq!((out.reward, out.info.success, out.info.action_is_valid), (0.0, false, false));
}

#[test]
fn actions_outside_the_text_space_are_bad_actions() {
    let mut env = CheckedEnv::<Countdown>::create(&[]).unwrap();
    env.reset(0).unwrap();
    let long = "1".repeat(MAX_ANSWER_BYTES as usize + 1);
    assert_eq!(env.step(long).unwrap_err().kind, ErrorKind::BadAction);
    assert_eq!(env.step(0).unwrap_err().kind, ErrorKind::BadAction);
    // Neither ended the episode.
    assert!(env.step("1").is_ok());
}

#[test]
fn config_is_checked() {
    assert!(CheckedEnv::<Countdown>::with(&[("operators", "+-*/")]).is_ok());
    let e = CheckedEnv::<Countdown>::with(&[("operators", "^")]).unwrap_err();
    assert!(e.message.starts_with("config key `operators`"), "{}", e.message);
    let e = CheckedEnv::<Countdown>::with(&[("min_numbers", "5"), ("max_numbers", "4")]).unwrap_err();
    assert!(e.message.contains("max_numbers"), "{}", e.message);
}

#[test]
fn wider_operators_still_give_solvable_puzzles() {
    let env = CheckedEnv::<Countdown>::with(&[("operators", "+-*/")]).unwrap();
    for seed in 0..100 {
        let p = env.inner().puzzle(seed);
        assert!(solver::solve(&p.numbers, p.target).is_some(), "{p:?}");
    }
}
