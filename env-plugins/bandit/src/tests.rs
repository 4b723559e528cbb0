use super::*;
use ragen_env_sdk::{CheckedEnv, ErrorKind};

fn bandit(settings: &[(&str, &str)]) -> CheckedEnv<Bandit> {
    CheckedEnv::with(settings).unwrap()
}

#[test]
fn high_arm_pays_one_a_quarter_of_the_time() {
    let mut env = bandit(&[]);
    let n = 20_000;
    let mut hits = 0;
    for seed in 0..n {
        env.reset(seed).unwrap();
        let r = env.step(1).unwrap().reward;
        assert!(r == 0.0 || r == 1.0, "high arm paid {r}");
        hits += (r == 1.0) as u32;
    }
    let freq = hits as f64 / n as f64;
    // 0.25 ± 4.5 standard errors (sd = sqrt(.25*.75/20000) ≈ 0.0031).
    assert!((freq - 0.25).abs() < 0.014, "high-arm hit rate {freq}");
}

#[test]
fn low_arm_always_pays_its_score_and_reports_it() {
    let mut env = bandit(&[]);
    for seed in 0..100 {
        env.reset(seed).unwrap();
        let out = env.step(0).unwrap();
        assert_eq!(out.reward, 0.1);
        assert_eq!(out.observation, "Phoenix: 0.1 points");
        assert!(out.done && !out.info.success && out.info.action_is_valid);
    }
}

#[test]
fn success_means_the_higher_mean_arm() {
    let mut env = bandit(&[]);
    env.reset(3).unwrap();
    assert!(env.step(1).unwrap().info.success, "Dragon (mean 0.25) beats Phoenix (0.1)");
    // Make the low-risk arm the better one: success follows the means, not the names.
    let mut env = bandit(&[("lo_arm_score", "0.5")]);
    env.reset(3).unwrap();
    assert!(env.step(0).unwrap().info.success);
}

#[test]
fn arm_order_shuffles_about_half_the_time() {
    let mut env = bandit(&[]);
    let n = 4_000;
    let mut low_first = 0;
    for seed in 0..n {
        let obs = env.reset(seed).unwrap();
        if obs.starts_with("Machines: Phoenix") {
            low_first += 1;
        } else {
            assert!(obs.starts_with("Machines: Dragon"), "{obs}");
        }
    }
    let freq = low_first as f64 / n as f64;
    assert!((freq - 0.5).abs() < 0.04, "low arm shown first {freq} of the time");
}

#[test]
fn same_seed_same_episode() {
    let mut a = bandit(&[]);
    let mut b = bandit(&[]);
    for seed in 0..200 {
        assert_eq!(a.reset(seed).unwrap(), b.reset(seed).unwrap());
        assert_eq!(a.step(1).unwrap(), b.step(1).unwrap());
    }
}

#[test]
fn arm_names_are_configuration() {
    let env = bandit(&[("lo_arm_name", "Trader"), ("hi_arm_name", "Librarian")]);
    let spec = env.spec();
    assert_eq!(spec.action_space.as_names(), ["Trader", "Librarian"]);
    assert!(spec.instructions.contains("Trader") && spec.instructions.contains("Librarian"));
    assert_eq!(spec.limits.max_actions_per_episode, 1);
}

#[test]
fn one_action_ends_the_episode() {
    let mut env = bandit(&[]);
    env.reset(1).unwrap();
    assert!(env.step(0).unwrap().done);
    assert_eq!(env.step(0).unwrap_err().kind, ErrorKind::EpisodeOver);
}

#[test]
fn bad_config_names_the_key() {
    for (settings, key) in [
        (vec![("hi_arm_name", "phoenix")], "hi_arm_name"),
        (vec![("hi_arm_hiscore_prob", "1.5")], "hi_arm_hiscore_prob"),
        (vec![("lo_arm_score", "high")], "lo_arm_score"),
        (vec![("lo_arm_name", "  ")], "lo_arm_name"),
    ] {
        let err = CheckedEnv::<Bandit>::with(&settings).unwrap_err();
        assert_eq!(err.kind, ErrorKind::BadValue);
        assert!(err.message.contains(key), "{}", err.message);
    }
    let err = CheckedEnv::<Bandit>::with(&[("arms", "3")]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::UnknownKey);
    assert!(err.message.contains("`arms`"));
}

#[test]
fn action_out_of_range_is_an_error() {
    let mut env = bandit(&[]);
    env.reset(0).unwrap();
    assert_eq!(env.step(2).unwrap_err().kind, ErrorKind::BadAction);
}
