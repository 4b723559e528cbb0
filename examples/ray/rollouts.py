"""Grouped RAGEN rollouts of one plugin, spread over Ray actors.

Each actor holds a `ragen_envs.Rollouts` (the agent loop over a batched,
sandboxed pool); the driver hands out group seeds in chunks, collects the
trajectories in seed order and writes them as the JSON lines `ragen-host
eval --trajectories` writes.

    # on this machine (a local Ray instance):
    python examples/ray/rollouts.py target/plugins/sokoban.wasm --groups 64 --group-size 8 --actors 2 --out rollouts.jsonl
    # on a cluster: `ray start --head` on one node, `ray start --address HEAD:6379`
    # on the others, copy the .wasm to the same path on every node, then
    python examples/ray/rollouts.py /shared/sokoban.wasm --address auto --actors 16 ...

`policy` is "random" here; a trainer passes a callable that calls its
inference server (one batch of contexts in, one reply per context out).
"""

import argparse
import time

import ray

import ragen_envs


@ray.remote
class RolloutActor:
    """One plugin's agent loop in one Ray worker process."""

    def __init__(self, plugin, groups, group_size, threads, config=None):
        self.rollouts = ragen_envs.Rollouts(plugin, env_groups=groups, group_size=group_size, threads=threads, config=config)

    def run(self, policy, group_seeds, first_group):
        return self.rollouts.run(policy, group_seeds, first_group)


def start(plugin, actors=2, groups_per_call=8, group_size=8, threads=1, config=None):
    """`actors` rollout actors; keep them for the whole run (each holds its
    plugin's compiled code and envs)."""
    return [RolloutActor.remote(plugin, groups_per_call, group_size, threads, config) for _ in range(actors)]


def collect(actors, group_seeds, groups_per_call=8, policy="random"):
    """Every group's trajectories (JSON lines), in the order of `group_seeds`,
    chunks of `groups_per_call` groups handed out round-robin."""
    chunks = [(i, group_seeds[i:i + groups_per_call]) for i in range(0, len(group_seeds), groups_per_call)]
    futures = [actors[k % len(actors)].run.remote(policy, seeds, first) for k, (first, seeds) in enumerate(chunks)]
    return [line for lines in ray.get(futures) for line in lines]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plugin", help="the .wasm file (the same path on every node)")
    p.add_argument("--groups", type=int, default=64, help="groups (prompts) in all")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-call", type=int, default=8, help="groups one actor plays in one call")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="pool threads per actor")
    p.add_argument("--seed-start", type=int, default=123, help="the first group's seed (eval's seeds by default)")
    p.add_argument("--config", help="an agent config TOML ([rollout], [prompt], [env], [sandbox])")
    p.add_argument("--address", default=None, help="a Ray cluster (`auto`, or HEAD:6379); default: a local instance")
    p.add_argument("--out", default="rollouts.jsonl")
    a = p.parse_args()

    ray.init(address=a.address, include_dashboard=False, log_to_driver=False)
    seeds = list(range(a.seed_start, a.seed_start + a.groups))
    started = time.perf_counter()
    actors = start(a.plugin, a.actors, a.groups_per_call, a.group_size, a.threads, a.config)
    lines = collect(actors, seeds, a.groups_per_call)
    seconds = time.perf_counter() - started
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} trajectories from {a.actors} actors in {seconds:.1f} s -> {a.out}")


if __name__ == "__main__":
    main()
