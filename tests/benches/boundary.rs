//! What crossing the sandbox boundary costs per call, against the same env
//! compiled natively, measured in one run.
//!
//! Three numbers per plugin:
//! * native: ns per call (reset or step) of the env compiled natively;
//! * sandboxed: ns per call of the same env through wasmtime;
//! * empty call: ns of a call that does no work (`render` of an env that was
//!   never reset returns ""). This fixed entry/exit cost is all that a
//!   batched `step-many` call could save per step; lifting each result
//!   (observation string, metrics list) is paid per env either way.
//!
//! Run with `make bench-boundary`. Timings are medians of 7 rounds; read the
//! ratios, not the absolute numbers, on a shared machine.

use ragen_env_sdk::{CheckedEnv, Environment, SeedRng};
use ragen_runtime::Plugin;
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Play episodes of at most 20 steps with seeded random actions; returns
/// (calls made, seconds). `reset` and `step` are the two calls under test.
fn episodes(calls: usize, num_actions: usize, mut reset: impl FnMut(u64), mut step: impl FnMut(u32) -> bool) -> (usize, f64) {
    let mut rng = SeedRng::new(1);
    let (mut made, mut seed) = (0, 0);
    let start = Instant::now();
    while made < calls {
        reset(seed);
        seed += 1;
        made += 1;
        for _ in 0..20 {
            made += 1;
            if step(rng.below(num_actions) as u32) {
                break;
            }
        }
    }
    (made, start.elapsed().as_secs_f64())
}

fn measure<E: Environment>(file: &str, calls: usize) {
    let plugin = Plugin::from_file(ragen_test_fixtures::plugin(file)).expect("a loadable plugin");
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&[]).unwrap().unwrap();
    let idle = inst.create(&[]).unwrap().unwrap();
    let mut native = CheckedEnv::<E>::create(&[]).unwrap();
    let num_actions = native.spec().action_space.as_names().len();

    let (mut nat, mut sandboxed, mut empty) = (vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        // Both closures drive the same env; RefCell lets them share it.
        let native_cell = std::cell::RefCell::new(&mut native);
        let (n, t) = episodes(
            calls,
            num_actions,
            |s| drop(black_box(native_cell.borrow_mut().reset(s).unwrap())),
            |a| black_box(native_cell.borrow_mut().step(a).unwrap()).done,
        );
        nat.push(t * 1e9 / n as f64);

        let inst_cell = std::cell::RefCell::new(&mut inst);
        let (n, t) = episodes(
            calls,
            num_actions,
            |s| drop(black_box(inst_cell.borrow_mut().reset(env, s).unwrap().unwrap())),
            |a| black_box(inst_cell.borrow_mut().step(env, a).unwrap().unwrap()).done,
        );
        sandboxed.push(t * 1e9 / n as f64);

        let start = Instant::now();
        for _ in 0..calls {
            black_box(inst.render(idle).unwrap());
        }
        empty.push(start.elapsed().as_secs_f64() * 1e9 / calls as f64);
    }
    let (nat, sandboxed, empty) = (median(nat), median(sandboxed), median(empty));
    println!(
        "{file:<11} native {nat:8.0} ns/call   sandboxed {sandboxed:8.0} ns/call ({:4.1}x native)   empty call {empty:5.0} ns = {:4.1}% of a sandboxed call",
        sandboxed / nat,
        100.0 * empty / sandboxed
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    println!("boundary cost per call (median of {ROUNDS} rounds)");
    measure::<ragen_env_bandit::Bandit>("bandit", 200_000);
    measure::<ragen_env_sokoban::Sokoban>("sokoban", 200_000);
    measure::<ragen_env_frozenlake::FrozenLake>("frozenlake", 200_000);
}
