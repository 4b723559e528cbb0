//! The sandbox's WASI grants nothing: a plugin that reaches for files, the
//! network, the environment or the clock finds nothing there, its WASI
//! randomness is the same in every instance, and sleeping traps at once
//! instead of holding the worker thread.

use crate::common::faulty;
use ragen_runtime::{FaultKind, SandboxLimits};

#[test]
fn a_plugin_reaching_outside_finds_nothing_and_cannot_sleep() {
    let plugin = faulty("reach-outside", SandboxLimits::default());
    let probe = |seed| {
        let mut inst = plugin.instantiate().unwrap();
        let env = inst.create(&[]).unwrap().unwrap();
        let seen = inst.reset(env, seed).unwrap().unwrap();
        (inst, env, seen)
    };
    let (mut inst, env, seen) = probe(3);
    let fields: std::collections::HashMap<&str, &str> = seen.split_whitespace().filter_map(|f| f.split_once(':')).collect();
    assert_eq!(fields["files"], "false", "{seen}");
    assert_eq!(fields["net"], "false", "{seen}");
    assert_eq!(fields["env"], "0", "{seen}");
    assert_eq!(fields["time"], "0", "the wall clock stands at the epoch: {seen}");
    // Same WASI randomness in a second instance: runs replay.
    let (_, _, again) = probe(7);
    assert_eq!(seen, again);

    // Sleeping would block the host thread where the time budget cannot
    // reach it; it must be a fault that says what happened.
    let fault = inst.step(env, 0).unwrap_err();
    assert_eq!(fault.kind, FaultKind::Trap, "{fault}");
    assert!(fault.message.contains("tried to sleep"), "{fault}");
}

#[test]
fn an_import_the_host_does_not_link_traps_only_if_called() {
    // The JS corridor built with fetch() kept: it imports wasi:http, which
    // the sandbox does not provide. It must load and play all the same.
    let path = crate::common::test_plugin("corridor-js-with-http");
    let plugin = ragen_runtime::Plugin::from_file(&path).unwrap();
    assert!(plugin.imports().iter().any(|i| i.starts_with("wasi:http/")), "{:?}", plugin.imports());
    let mut inst = plugin.instantiate().unwrap();
    let env = inst.create(&[]).unwrap().unwrap();
    assert_eq!(inst.reset(env, 2).unwrap().unwrap(), "__P_E");
    let out = inst.step(env, 1).unwrap().unwrap();
    assert_eq!(out.observation, "___PE");
}
