"""The agent loop from Python (`ragen_envs.Rollouts`), alone and spread over
a local Ray cluster: the same groups give the same trajectories."""

import importlib.util
import json
from pathlib import Path

import pytest

import ragen_envs

ROOT = Path(__file__).resolve().parents[2]


def test_rollouts_write_evals_trajectories_with_a_python_policy(plugin):
    r = ragen_envs.Rollouts(plugin("sokoban"), env_groups=2, group_size=3, threads=1)
    seen = []

    def policy(contexts):
        seen.extend(contexts)
        return ["Pushing.</think><answer>Right || Down</answer>" for _ in contexts]

    lines = r.run(policy, [123, 124], first_group=5)
    ts = [json.loads(line) for line in lines]
    assert len(ts) == 6 and [t["group"] for t in ts] == [5, 5, 5, 6, 6, 6] and [t["env"] for t in ts] == list(range(15, 21))
    assert [t["seed"] for t in ts] == [123] * 3 + [124] * 3
    c = seen[0]
    assert [x["env"] for x in seen[:6]] == list(range(6)), "turn 1: every env, in order"
    assert c["prefill"] == "<think>" and c["actions"] == ["Up", "Down", "Left", "Right"]
    assert c["messages"][0][0] == "system" and "Turn 1:" in c["messages"][-1][1]
    assert ts[0]["turns"][0]["executed"][:2] == ["Right", "Down"], ts[0]["turns"][0]
    with pytest.raises(RuntimeError, match="the Python policy failed"):
        r.run(lambda contexts: [1, 2], [1])


def test_a_random_groups_trajectories_do_not_depend_on_its_batch(plugin):
    r = ragen_envs.Rollouts(plugin("frozenlake"), env_groups=4, group_size=2, threads=1)
    together = r.run("random", [10, 11, 12, 13])
    apart = r.run("random", [10, 11], 0) + r.run("random", [12, 13], 2)
    assert together == apart


def load_example():
    spec = importlib.util.spec_from_file_location("ray_rollouts", ROOT / "examples" / "ray" / "rollouts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rollouts_over_two_ray_actors_equal_one_process(plugin):
    import ray  # target/pyenv has it (python/requirements-dev.txt)

    example = load_example()
    path = plugin("sokoban")
    seeds = list(range(123, 139))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        actors = example.start(path, actors=2, groups_per_call=4, group_size=4)
        spread = example.collect(actors, seeds, groups_per_call=4)
    finally:
        ray.shutdown()
    alone = ragen_envs.Rollouts(path, env_groups=16, group_size=4, threads=1).run("random", seeds)
    assert len(spread) == 64, "every trajectory arrived"
    assert spread == alone, "each equals the same seed run in one process"
