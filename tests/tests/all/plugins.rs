//! The shipped plugins, loaded from `target/plugins/` (built by `make
//! plugins`) into the sandbox, must behave exactly like the same envs
//! compiled natively, and must not import any capability that could make
//! them nondeterministic.

use ragen_env_sdk::{CheckedEnv, Environment, SeedRng};
use ragen_runtime::{ErrorKind, Plugin, PluginInstance};

use crate::common::{example, plugin};

fn load(name: &str) -> Plugin {
    Plugin::from_file(plugin(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn pairs(settings: &[(&str, &str)]) -> Vec<(String, String)> {
    settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Imports that would let a plugin see the outside world or vary between
/// runs. A plugin may import WASI's stdio/exit plumbing (the Rust standard
/// library links it for panics); the host's WASI grants nothing anyway, but
/// the shipped Rust plugins should not even ask.
const FORBIDDEN: [&str; 5] = ["wasi:clocks", "wasi:random", "wasi:filesystem", "wasi:sockets", "wasi:http"];

#[test]
fn shipped_plugins_are_components_that_speak_the_contract() {
    let shipped =
        [("bandit", "bandit", false), ("sokoban", "sokoban", true), ("frozenlake", "frozenlake", true), ("countdown", "countdown", false)];
    for (file, name, multi_turn) in shipped {
        let plugin = load(file);
        assert_eq!(plugin.contract_version().to_string(), "0.2.0");
        assert!(plugin.has_batch(), "{file}: the SDK exports the batched calls");
        for import in plugin.imports() {
            assert!(!FORBIDDEN.iter().any(|f| import.starts_with(f)), "{file} imports {import}");
        }
        let mut inst = plugin.instantiate().unwrap();
        let info = inst.info().unwrap();
        assert_eq!(info.name, name);
        assert_eq!(info.multi_turn, multi_turn);
        assert!(!info.config_keys.is_empty() && !info.description.is_empty());
        let env = inst.create(&[]).unwrap().unwrap();
        let spec = inst.spec(env).unwrap();
        assert!(!spec.instructions.is_empty());
        assert_eq!(spec.action_names().is_empty(), spec.takes_text(), "{file}: names, or text");
    }
}

/// Play `episodes` seeds with pseudo-random actions in the sandbox and
/// natively; every observation, reward, flag and error must agree.
fn same_as_native<E: Environment>(file: &str, settings: &[(&str, &str)], episodes: u64) {
    let plugin = load(file);
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&pairs(settings)).unwrap().unwrap();
    let mut native = CheckedEnv::<E>::with(settings).unwrap();
    let num_actions = native.spec().action_space.as_names().len();
    let spec = inst.spec(env).unwrap();
    assert_eq!(spec.action_names(), native.spec().action_space.as_names());
    assert_eq!(spec.metrics, native.spec().metrics);
    let mut actions = SeedRng::new(99);
    for seed in 0..episodes {
        assert_eq!(inst.reset(env, seed).unwrap().unwrap(), native.reset(seed).unwrap(), "{file} seed {seed}");
        for t in 0..12 {
            let action = actions.below(num_actions) as u32;
            let wasm = inst.step(env, action).unwrap();
            match (wasm, native.step(action)) {
                (Ok(w), Ok(n)) => {
                    assert_eq!(w.observation, n.observation, "{file} seed {seed} step {t}");
                    assert_eq!(w.reward.to_bits(), n.reward.to_bits(), "{file} seed {seed} step {t}");
                    assert_eq!((w.done, w.info.success), (n.done, n.info.success));
                    assert_eq!((w.info.action_is_valid, w.info.action_is_effective), (n.info.action_is_valid, n.info.action_is_effective));
                    assert_eq!(w.info.metrics, n.info.metrics);
                }
                (Err(w), Err(n)) => {
                    assert_eq!(w.message, n.message);
                    break;
                }
                (w, n) => panic!("{file} seed {seed} step {t}: sandbox {w:?} vs native {n:?}"),
            }
        }
        assert_eq!(inst.render(env).unwrap(), native.render());
    }
}

#[test]
fn bandit_in_the_sandbox_matches_native() {
    same_as_native::<ragen_env_bandit::Bandit>("bandit", &[], 300);
    same_as_native::<ragen_env_bandit::Bandit>("bandit", &[("lo_arm_name", "Trader"), ("hi_arm_name", "Librarian")], 50);
}

#[test]
fn sokoban_in_the_sandbox_matches_native() {
    same_as_native::<ragen_env_sokoban::Sokoban>("sokoban", &[], 200);
    same_as_native::<ragen_env_sokoban::Sokoban>(
        "sokoban",
        &[("dim_x", "8"), ("dim_y", "8"), ("num_boxes", "2"), ("search_depth", "10")],
        50,
    );
    same_as_native::<ragen_env_sokoban::Sokoban>("sokoban", &[("symbols", "W.GBCA@"), ("max_steps", "5")], 30);
}

#[test]
fn frozenlake_in_the_sandbox_matches_native() {
    same_as_native::<ragen_env_frozenlake::FrozenLake>("frozenlake", &[], 300);
    same_as_native::<ragen_env_frozenlake::FrozenLake>("frozenlake", &[("size", "6"), ("success_rate", "0.8")], 50);
}

#[test]
fn errors_cross_the_boundary_as_results() {
    let plugin = load("sokoban");
    let mut inst: PluginInstance = plugin.instantiate().unwrap();
    let unknown = inst.create(&pairs(&[("room_size", "6")])).unwrap().unwrap_err();
    assert_eq!(unknown.kind, ErrorKind::UnknownKey);
    assert!(unknown.message.contains("`room_size`"), "{}", unknown.message);
    let too_many = inst.create(&pairs(&[("dim_x", "5"), ("dim_y", "5"), ("num_boxes", "8")])).unwrap().unwrap_err();
    assert_eq!(too_many.kind, ErrorKind::BadValue);
    assert!(too_many.message.contains("`num_boxes`"));

    let env = inst.create(&[]).unwrap().unwrap();
    assert_eq!(inst.step(env, 0).unwrap().unwrap_err().kind, ErrorKind::NotStarted);
    inst.reset(env, 1).unwrap().unwrap();
    assert_eq!(inst.step(env, 4).unwrap().unwrap_err().kind, ErrorKind::BadAction);
    // The instance is still healthy after every error.
    assert!(inst.step(env, 0).unwrap().is_ok());
}

#[test]
fn many_envs_in_one_instance_are_independent() {
    let plugin = load("sokoban");
    let mut inst = plugin.instantiate().unwrap();
    let n = 256;
    let envs: Vec<_> = (0..n).map(|_| inst.create(&[]).unwrap().unwrap()).collect();
    let mut natives: Vec<CheckedEnv<ragen_env_sokoban::Sokoban>> = (0..n).map(|_| CheckedEnv::with(&[]).unwrap()).collect();
    for (i, env) in envs.iter().enumerate() {
        assert_eq!(inst.reset(*env, 1000 + i as u64).unwrap().unwrap(), natives[i].reset(1000 + i as u64).unwrap());
    }
    // Interleave: step every env once per round, in a shuffled order.
    let mut rng = SeedRng::new(5);
    for _round in 0..5 {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for i in order {
            let action = rng.below(4) as u32;
            let w = inst.step(envs[i], action).unwrap();
            let nat = natives[i].step(action);
            assert_eq!(w.map(|o| o.observation).map_err(|e| e.message), nat.map(|o| o.observation).map_err(|e| e.message));
        }
    }
    for env in envs {
        inst.drop_env(env).unwrap();
    }
}

#[test]
fn the_authoring_example_builds_and_plays() {
    let path = example("corridor");
    let plugin = Plugin::from_file(&path).unwrap_or_else(|e| panic!("{}: {e:#} (run `make plugins`)", path.display()));
    let mut inst = plugin.instantiate().unwrap();
    assert_eq!(inst.info().unwrap().name, "corridor");
    let env = inst.create(&pairs(&[("length", "4")])).unwrap().unwrap();
    let start = inst.reset(env, 3).unwrap().unwrap();
    assert_eq!(start.len(), 4);
    assert!(start.ends_with('E'));
    // Walking right always reaches the exit.
    let mut last = None;
    for _ in 0..4 {
        let out = inst.step(env, 1).unwrap().unwrap();
        let done = out.done;
        last = Some(out);
        if done {
            break;
        }
    }
    let last = last.unwrap();
    assert!(last.info.success && last.reward == 1.0 && last.observation == "___P");
    let bad = inst.create(&pairs(&[("length", "1")])).unwrap().unwrap_err();
    assert!(bad.message.contains("`length`"), "{}", bad.message);
}
