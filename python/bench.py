"""Steps/s of ragen_envs against the Rust pool and against Gymnasium's
SyncVectorEnv, in one run (not part of CI; `make python` first; `-P` keeps
the source tree, which lacks the built core, off `sys.path`).

    target/pyenv/bin/python -P python/bench.py target/plugins/sokoban.wasm --envs 1024 --threads 2

The Rust pool's rate comes from `ragen-host bench` (sandboxed steps/s, the
same pool without Python) run by this script; then the same workload through
`ragen_envs.make` (one batched call per step, GIL released) and through
`gymnasium.vector.SyncVectorEnv` of single `ragen_envs.Env`s (one call per env
per step, what batching in Rust replaces).
"""

import argparse
import json
import subprocess
import time

import gymnasium as gym
import numpy as np

import ragen_envs


def rate(step, seconds):
    """Env steps per second of `step()` (which returns how many it took)."""
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += step()
    return done / (time.perf_counter() - started)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plugin")
    p.add_argument("--envs", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--host", default="/tmp/ragen-rs-ci-target/debug/ragen-host", help="the ragen-host binary")
    a = p.parse_args()

    out = subprocess.run([a.host, "bench", a.plugin, "--envs", str(a.envs), "--threads", str(a.threads), "--seconds", str(2 * a.seconds), "--json"],
                         check=True, capture_output=True, text=True)
    rust = json.loads(out.stdout)["sandboxed"]["steps_per_sec"]

    vec = ragen_envs.make(a.plugin, num_envs=a.envs, threads=a.threads)
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    n_actions = vec.single_action_space.n
    python = rate(lambda: len(vec.step(rng.integers(0, n_actions, size=a.envs))[1]), a.seconds)
    vec.close()

    sync = gym.vector.SyncVectorEnv([lambda: ragen_envs.Env(a.plugin) for _ in range(a.envs)])
    sync.reset(seed=0)
    sync_rate = rate(lambda: len(sync.step(rng.integers(0, n_actions, size=a.envs))[1]), a.seconds)
    sync.close()

    print(f"{a.plugin}: {a.envs} envs, {a.threads} threads")
    print(f"  Rust pool (ragen-host bench)   {rust:12.0f} steps/s")
    print(f"  ragen_envs.make (VectorEnv)    {python:12.0f} steps/s  ({python / rust:.2f}x the Rust pool)")
    print(f"  SyncVectorEnv of ragen_envs.Env {sync_rate:11.0f} steps/s  (VectorEnv is {python / sync_rate:.1f}x this)")


if __name__ == "__main__":
    main()
