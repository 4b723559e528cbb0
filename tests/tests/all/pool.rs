//! The batched pool: many envs across threads, results in the caller's
//! order, next-step autoreset, and faults contained to the env that caused
//! them.

use ragen_env_sdk::{CheckedEnv, Environment, SeedRng};
use ragen_env_sokoban::Sokoban;
use ragen_runtime::{Action, ActionSpace, EnvPool, FailureKind, FaultKind, Plugin, PoolConfig, SandboxLimits, next_seed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{faulty, loaded_example, shipped};

fn config(num_envs: usize, threads: usize, per_instance: usize) -> PoolConfig {
    PoolConfig { threads, envs_per_instance: per_instance, ..PoolConfig::new(num_envs) }
}

/// The pool's results for every env and step, against the same envs stepped
/// one by one natively, with next-step autoreset emulated by hand.
fn check_against_native<E: Environment>(pool: &EnvPool, natives: &mut [CheckedEnv<E>], seeds: &[u64], rounds: usize) {
    let n = natives.len();
    let first = pool.reset_all(seeds).unwrap();
    let mut episode_seed = seeds.to_vec();
    let mut over = vec![false; n];
    for i in 0..n {
        assert_eq!(first[i].as_ref().unwrap(), &natives[i].reset(seeds[i]).unwrap(), "env {i}");
    }
    let num_actions = natives[0].spec().action_space.as_names().len();
    let mut rng = SeedRng::new(42);
    for round in 0..rounds {
        let actions: Vec<u32> = (0..n).map(|_| rng.below(num_actions) as u32).collect();
        let results = pool.step_all(&actions).unwrap();
        for i in 0..n {
            let got = results[i].as_ref().unwrap_or_else(|f| panic!("round {round}: {f}"));
            if over[i] {
                let seed = next_seed(episode_seed[i]);
                assert_eq!(got.autoreset, Some(seed), "env {i} round {round}");
                assert_eq!(got.observation, natives[i].reset(seed).unwrap());
                (episode_seed[i], over[i]) = (seed, false);
                continue;
            }
            let want = natives[i].step(actions[i]).unwrap();
            assert_eq!(got.autoreset, None);
            assert_eq!(got.observation, want.observation, "env {i} round {round}");
            assert_eq!(got.reward.to_bits(), want.reward.to_bits());
            assert_eq!(
                (got.done, got.info.success, got.info.action_is_effective),
                (want.done, want.info.success, want.info.action_is_effective)
            );
            over[i] = want.done;
        }
    }
}

#[test]
fn ten_thousand_sokoban_envs_match_stepping_one_by_one() {
    let n = 10_000;
    let pool = EnvPool::new(shipped("sokoban"), &config(n, 2, 64)).unwrap();
    let stats = pool.stats().unwrap();
    assert_eq!(stats.envs, n);
    assert_eq!(stats.instances, 2 * 5000usize.div_ceil(64));
    let mut natives: Vec<CheckedEnv<Sokoban>> = (0..n).map(|_| CheckedEnv::with(&[]).unwrap()).collect();
    let seeds: Vec<u64> = (0..n as u64).map(|s| s * 7 + 3).collect();
    check_against_native(&pool, &mut natives, &seeds, 4);
}

#[test]
fn bandit_autoresets_on_the_next_step() {
    // Every Bandit episode is one step, so every other step is an autoreset.
    let pool = EnvPool::new(shipped("bandit"), &config(40, 3, 8)).unwrap();
    let mut natives: Vec<CheckedEnv<ragen_env_bandit::Bandit>> = (0..40).map(|_| CheckedEnv::with(&[]).unwrap()).collect();
    let seeds: Vec<u64> = (100..140).collect();
    check_against_native(&pool, &mut natives, &seeds, 6);
}

#[test]
fn without_autoreset_a_finished_env_must_be_reset() {
    let cfg = PoolConfig { autoreset: false, ..config(4, 2, 2) };
    let pool = EnvPool::new(shipped("bandit"), &cfg).unwrap();
    pool.reset_all(&[1, 2, 3, 4]).unwrap();
    assert!(pool.step_all(&[0, 1, 0, 1]).unwrap().iter().all(|r| r.as_ref().unwrap().done));
    for r in pool.step_all(&[0, 1, 0, 1]).unwrap() {
        let f = r.unwrap_err();
        assert_eq!(f.kind, FailureKind::Env(ragen_runtime::ErrorKind::EpisodeOver), "{f}");
    }
    // Stepping a never-reset env is reported, not hidden.
    let fresh = EnvPool::new(shipped("bandit"), &config(2, 1, 2)).unwrap();
    let f = fresh.step(&[1], &[0]).unwrap().remove(0).unwrap_err();
    assert_eq!(f.kind, FailureKind::Env(ragen_runtime::ErrorKind::NotStarted));
}

#[test]
fn results_come_back_in_the_callers_order() {
    let pool = EnvPool::new(shipped("sokoban"), &config(50, 3, 4)).unwrap();
    let ids: Vec<usize> = vec![49, 3, 17, 0, 33, 21];
    let seeds: Vec<u64> = ids.iter().map(|&i| 1000 + i as u64).collect();
    let obs = pool.reset(&ids, &seeds).unwrap();
    for (k, &seed) in seeds.iter().enumerate() {
        let mut native = CheckedEnv::<Sokoban>::with(&[]).unwrap();
        assert_eq!(obs[k].as_ref().unwrap(), &native.reset(seed).unwrap());
    }
    assert!(pool.reset(&[50], &[1]).is_err(), "an id past the end is the caller's error");
    assert!(pool.step(&[1, 2], &[0]).is_err(), "ids and actions must pair up");
}

/// 16 envs in ONE instance; seeds 0..16, so envs 3, 7, 11, 15 hit the fault.
/// The faulting envs are reported with their seed; every other env matches
/// the same env compiled natively (without the fault) step for step.
fn contained(fault: &str, limits: SandboxLimits, expect: FailureKind, in_reset: bool) {
    let pool = EnvPool::new(faulty(fault, limits), &config(16, 1, 16)).unwrap();
    let seeds: Vec<u64> = (0..16).collect();
    let strikes = |i: usize| i % 4 == 3;
    let mut natives: Vec<CheckedEnv<ragen_test_faulty::Faulty>> = (0..16).map(|_| CheckedEnv::with(&[]).unwrap()).collect();
    let started = Instant::now();
    let resets = pool.reset_all(&seeds).unwrap();
    for (i, r) in resets.iter().enumerate() {
        match r {
            Err(f) => {
                assert!(in_reset && strikes(i), "env {i}: {f}");
                assert_eq!((f.env, f.seed, f.kind), (i, Some(i as u64), expect), "{f}");
                assert!(f.plugin.ends_with(&format!("{fault}.wasm")));
            }
            Ok(obs) => {
                assert!(!(in_reset && strikes(i)), "env {i} should have faulted in reset");
                assert_eq!(obs, &natives[i].reset(i as u64).unwrap());
            }
        }
    }
    for round in 0..3 {
        let results = pool.step_all(&[0; 16]).unwrap();
        for (i, r) in results.iter().enumerate() {
            if strikes(i) {
                if round == 0 && !in_reset {
                    let f = r.as_ref().unwrap_err();
                    assert_eq!((f.env, f.seed, f.kind), (i, Some(i as u64), expect), "{f}");
                }
                continue;
            }
            let want = natives[i].step(0).unwrap();
            assert_eq!(r.as_ref().unwrap().observation, want.observation, "env {i} round {round}");
        }
    }
    let stats = pool.stats().unwrap();
    if !matches!(expect, FailureKind::InvalidOutput) {
        assert!(stats.recoveries.rebuilt_instances >= 1, "the broken instance was replaced");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "fault handling took {:?}", started.elapsed());
}

fn quick() -> SandboxLimits {
    SandboxLimits { call_timeout: Duration::from_millis(100), memory_bytes: 32 << 20, ..SandboxLimits::default() }
}

#[test]
fn an_endless_loop_times_out_and_only_its_env_fails() {
    contained("loop-in-step", quick(), FailureKind::Fault(FaultKind::Timeout), false);
}

#[test]
fn runaway_memory_hits_the_cap_and_only_its_env_fails() {
    // A time budget far above what filling 32 MiB takes: on a loaded
    // machine 100 ms can run out first, and this test is about memory.
    let limits = SandboxLimits { call_timeout: Duration::from_secs(10), ..quick() };
    contained("grow-memory", limits, FailureKind::Fault(FaultKind::MemoryCap), false);
}

#[test]
fn a_trap_in_reset_fails_only_its_env() {
    contained("trap-in-reset", quick(), FailureKind::Fault(FaultKind::Trap), true);
}

#[test]
fn a_nan_reward_is_invalid_output() {
    contained("nan-reward", quick(), FailureKind::InvalidOutput, false);
}

#[test]
fn a_failure_says_which_plugin_env_and_seed() {
    let pool = EnvPool::new(faulty("nan-reward", quick()), &config(4, 1, 4)).unwrap();
    pool.reset_all(&[0, 1, 2, 3]).unwrap();
    let f = pool.step_all(&[0; 4]).unwrap().remove(3).unwrap_err();
    let text = f.to_string();
    assert!(text.contains("nan-reward.wasm") && text.contains("env 3") && text.contains("seed 3") && text.contains("NaN"), "{text}");
}

#[test]
fn a_failed_episode_says_why_when_stepped_again() {
    // trap-in-reset traps on seeds 3 mod 4; without autoreset, stepping
    // that env afterwards must say what went wrong, not only "ended".
    let pool =
        EnvPool::new(faulty("trap-in-reset", SandboxLimits::default()), &PoolConfig { autoreset: false, ..config(4, 1, 4) }).unwrap();
    let first = pool.reset_all(&[0, 1, 2, 3]).unwrap();
    assert!(first[3].is_err() && first[..3].iter().all(Result::is_ok));
    let again = pool.step(&[3], &[0]).unwrap().remove(0).unwrap_err();
    assert!(again.message.contains("the episode failed earlier ("), "{again}");
    assert!(again.message.contains(&first[3].as_ref().unwrap_err().message), "the reason is kept: {again}");
}

/// Random actions for `space`: ids, or short texts that are sometimes a
/// valid Countdown answer shape and sometimes not.
fn random_actions(space: &ActionSpace, n: usize, rng: &mut SeedRng) -> Vec<Action> {
    const TEXTS: [&str; 6] = ["1 + 2", "(3 * 4) - 5", "", "12 / 0", "x", "7 7 7"];
    (0..n)
        .map(|_| match space {
            ActionSpace::Names(names) => Action::Id(rng.below(names.len()) as u32),
            ActionSpace::Text(_) => Action::Text(TEXTS[rng.below(TEXTS.len())].to_string()),
        })
        .collect()
}

/// The same seeds and actions through a pool that uses the plugin's
/// batched calls and one that makes one call per env: every reset, step
/// and autoreset must come out identical.
fn batched_equals_single(plugin: Arc<Plugin>, label: &str) {
    assert!(plugin.has_batch(), "{label} should export the batched calls");
    let n = 24;
    let space = {
        let mut inst = plugin.instantiate().unwrap();
        let env = inst.create(&[]).unwrap().unwrap();
        inst.spec(env).unwrap().action_space
    };
    // Three instances of 8 envs per thread, so batches span instances.
    let layout = |batched| PoolConfig { batched, ..config(n, 2, 4) };
    let (batched, single) = (EnvPool::new(plugin.clone(), &layout(true)).unwrap(), EnvPool::new(plugin, &layout(false)).unwrap());
    let seeds: Vec<u64> = (100..100 + n as u64).collect();
    assert_eq!(batched.reset_all(&seeds).unwrap(), single.reset_all(&seeds).unwrap(), "{label}: resets");
    let mut rng = SeedRng::new(9);
    for round in 0..40 {
        let actions = random_actions(&space, n, &mut rng);
        let (got, want) = (batched.step_all(&actions).unwrap(), single.step_all(&actions).unwrap());
        assert_eq!(got, want, "{label}: round {round}");
        // Now and then an explicit reset of some envs mid-episode.
        if round % 7 == 3 {
            let ids: Vec<usize> = (0..n).step_by(3).collect();
            let seeds: Vec<u64> = ids.iter().map(|&i| 1000 + round * 31 + i as u64).collect();
            assert_eq!(batched.reset(&ids, &seeds).unwrap(), single.reset(&ids, &seeds).unwrap(), "{label}: round {round} resets");
        }
    }
}

#[test]
fn batched_calls_give_exactly_what_single_calls_give_for_every_shipped_plugin() {
    for name in ["bandit", "sokoban", "frozenlake", "countdown", "guess-number", "2048"] {
        batched_equals_single(shipped(name), name);
    }
    for name in ["corridor", "corridor-py", "corridor-js"] {
        batched_equals_single(loaded_example(name), name);
    }
}

#[test]
fn a_plugin_without_batched_calls_runs_one_call_per_env() {
    // Built with the plain `env-plugin` world: no `batch` export.
    let plugin = faulty("corridor-js-with-http", SandboxLimits::default());
    assert!(!plugin.has_batch());
    let pool = EnvPool::new(plugin, &config(8, 2, 4)).unwrap();
    assert!(pool.reset_all(&(0..8).collect::<Vec<u64>>()).unwrap().iter().all(Result::is_ok));
    assert!(pool.step_all(&[1u32; 8]).unwrap().iter().all(Result::is_ok));
}

#[test]
fn a_batch_that_runs_out_of_time_turns_batching_off_for_its_instance() {
    // loop-in-step hangs on seeds 3 mod 4: with 16 envs in one instance the
    // hang is inside a step-many, which gets one call's budget. The batch
    // is retried one call at a time (only the hanging envs fail, as
    // `an_endless_loop_times_out_and_only_its_env_fails` checks), and that
    // instance makes single calls from then on.
    let pool = EnvPool::new(faulty("loop-in-step", quick()), &config(16, 1, 16)).unwrap();
    assert_eq!(pool.stats().unwrap().batched_instances, 1);
    pool.reset_all(&(0..16).collect::<Vec<u64>>()).unwrap();
    let out = pool.step_all(&[0u32; 16]).unwrap();
    for (i, r) in out.iter().enumerate() {
        assert_eq!(r.as_ref().err().map(|f| f.kind), (i % 4 == 3).then_some(FailureKind::Fault(FaultKind::Timeout)), "env {i}");
    }
    let stats = pool.stats().unwrap();
    assert_eq!(stats.batched_instances, 0);
    // Every recovery is counted: the batch's rebuild replays all 16
    // running episodes; then each of the 4 hanging envs, alone, faults and
    // its rebuild replays the episodes still running (15, 14, 13, 12).
    let r = &stats.recoveries;
    assert_eq!((r.batch_faults, r.batching_off, r.rebuilt_instances, r.replayed_episodes), (1, 1, 5, 16 + 15 + 14 + 13 + 12), "{r}");
    let first = r.first.as_deref().unwrap();
    assert!(first.contains("a batched step-many faulted (timeout"), "{first}");
    assert!(
        r.to_string().contains(
            "5 instances rebuilt, 1 batched call run again call by call, 70 episodes replayed; batching turned off on 1 instance"
        ),
        "{r}"
    );
}

#[test]
fn a_short_batched_result_is_run_again_call_by_call_and_counted() {
    // Its reset-many and step-many return one result fewer than they were
    // given envs: a broken contract, not a fault of one env. Every env
    // still gets its own call's result, and the recovery is counted.
    let plugin = faulty("corridor-py-short-batch", SandboxLimits::default());
    assert!(plugin.has_batch());
    let (short, single) = (
        EnvPool::new(plugin.clone(), &config(8, 1, 8)).unwrap(),
        EnvPool::new(plugin, &PoolConfig { batched: false, ..config(8, 1, 8) }).unwrap(),
    );
    let seeds: Vec<u64> = (0..8).collect();
    assert_eq!(short.reset_all(&seeds).unwrap(), single.reset_all(&seeds).unwrap());
    for round in 0..3 {
        assert_eq!(short.step_all(&[1u32; 8]).unwrap(), single.step_all(&[1u32; 8]).unwrap(), "round {round}");
    }
    // The first reset-many turns batching off for the instance (its
    // batched calls would break on every batch): one rebuild, with no
    // running episode to replay, and single calls from then on.
    let stats = short.stats().unwrap();
    let r = &stats.recoveries;
    assert_eq!((r.batch_faults, r.batching_off, r.rebuilt_instances, r.replayed_episodes), (1, 1, 1, 0), "{r}");
    assert_eq!(stats.batched_instances, 0);
    assert!(r.first.as_deref().unwrap().contains("reset-many faulted (contract: reset-many: returned 7 results for 8 envs)"), "{r}");
    assert_eq!(single.stats().unwrap().recoveries, ragen_runtime::Recoveries::default());
}

#[test]
fn a_trap_inside_a_batch_keeps_batching_on() {
    // A trap names no env either, but it is the env's bug, not slowness:
    // the retry isolates it and the instance goes on batching.
    let pool = EnvPool::new(faulty("trap-in-reset", quick()), &config(16, 1, 16)).unwrap();
    let out = pool.reset_all(&(0..16).collect::<Vec<u64>>()).unwrap();
    assert!(out.iter().enumerate().all(|(i, r)| r.is_err() == (i % 4 == 3)), "{out:?}");
    let stats = pool.stats().unwrap();
    assert_eq!(stats.batched_instances, 1);
    // The batch's rebuild has no running episode to replay; the 4 trapping
    // resets, alone, each rebuild and replay those started before them
    // (3, 6, 9, 12).
    let r = &stats.recoveries;
    assert_eq!((r.batch_faults, r.batching_off, r.rebuilt_instances, r.replayed_episodes), (1, 0, 5, 3 + 6 + 9 + 12), "{r}");
    assert!(r.first.as_deref().unwrap().contains("a batched reset-many faulted (trap"), "{r}");
    // A healthy pool recovers nothing.
    let healthy = EnvPool::new(shipped("bandit"), &config(8, 1, 8)).unwrap();
    healthy.reset_all(&(0..8).collect::<Vec<u64>>()).unwrap();
    assert_eq!(healthy.stats().unwrap().recoveries, ragen_runtime::Recoveries::default());
}

/// The oracle through the pool: the native env's answer, the episode rules
/// enforced, the state untouched by asking, and a plugin without one
/// refused per env.
#[test]
fn the_pool_asks_each_envs_oracle() {
    let plugin = shipped("sokoban");
    assert!(plugin.has_oracle().unwrap());
    let pool = EnvPool::new(plugin, &PoolConfig { autoreset: false, ..config(4, 2, 2) }).unwrap();
    let ids: Vec<usize> = (0..4).collect();
    let early = pool.oracle(&ids, &[5; 4]).unwrap();
    assert!(early.iter().all(|r| matches!(r, Err(f) if f.kind == FailureKind::Env(ragen_runtime::ErrorKind::NotStarted))), "{early:?}");
    let seeds = [3, 4, 5, 6];
    pool.reset_all(&seeds).unwrap();
    let plans = pool.oracle(&ids, &[5, 5, 1, 2]).unwrap();
    for (i, plan) in plans.into_iter().enumerate() {
        let plan = plan.unwrap();
        let mut native = CheckedEnv::<Sokoban>::with(&[]).unwrap();
        native.reset(seeds[i]).unwrap();
        let expected = native.best_actions([5, 5, 1, 2][i]).unwrap();
        let as_wire = |a: &ragen_env_sdk::Action| match a {
            ragen_env_sdk::Action::Id(id) => Action::Id(*id),
            ragen_env_sdk::Action::Text(t) => Action::Text(t.clone()),
        };
        assert_eq!(plan, expected.iter().map(as_wire).collect::<Vec<_>>(), "env {i}");
        // Asking changed nothing: the first move plays as it would have.
        let step = pool.step(&[i], &[plan[0].clone()]).unwrap().remove(0).unwrap();
        assert_eq!(step.observation, native.step(expected[0].clone()).unwrap().observation, "env {i}");
    }

    let corridor = loaded_example("corridor");
    assert!(!corridor.has_oracle().unwrap(), "the corridor example exports no oracle");
}
