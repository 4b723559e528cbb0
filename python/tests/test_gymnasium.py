"""ragen_envs against Gymnasium's own checker and against itself: the batched
vector env gives exactly what single envs give on the same seeds and actions,
and faults are reported, not crashes."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import ragen_envs

SHIPPED = ["bandit", "sokoban", "frozenlake", "guess-number", "2048", "countdown"]


@pytest.mark.parametrize("name", SHIPPED)
def test_gymnasium_check_env_passes(plugin, name):
    env = ragen_envs.Env(plugin(name), render_mode="ansi")
    check_env(env, skip_render_check=False)


def test_spec_describes_the_plugin(plugin):
    env = ragen_envs.Env(plugin("sokoban"), dim_x=7)
    s = env.spec_dict
    assert s["name"] == "sokoban" and s["actions"] == ["Up", "Down", "Left", "Right"]
    assert ("#", "wall") in [tuple(e) for e in s["legend"]]
    assert s["limits"]["max_turns"] == 5 and s["metrics"] == ["boxes_on_target"]
    obs, _ = env.reset(seed=3)
    assert all(len(row) == 7 for row in obs.split("\n")), "dim_x=7 reached the plugin"
    countdown = ragen_envs.Env(plugin("countdown"))
    assert countdown.spec_dict["text_action"]["max_bytes"] == 256
    assert isinstance(countdown.action_space, ragen_envs.TextSpace)


@pytest.mark.parametrize("name", ["sokoban", "frozenlake", "2048"])
def test_the_vector_env_steps_exactly_as_single_envs(plugin, name):
    n, steps = 16, 40
    path = plugin(name)
    vec = ragen_envs.make(path, num_envs=n, threads=2, envs_per_instance=4)
    vec.action_space.seed(5)
    actions = [vec.action_space.sample() for _ in range(steps)]
    seeds = list(range(100, 100 + n))
    envs = [ragen_envs.Env(path) for _ in range(n)]
    obs, info = vec.reset(seed=100)
    assert list(info["seed"]) == seeds
    assert list(obs) == [e.reset(seed=s)[0] for e, s in zip(envs, seeds)]
    done = [False] * n
    for t, a in enumerate(actions):
        obs, rewards, terminated, truncated, infos = vec.step(a)
        assert not truncated.any()
        for i in range(n):
            if done[i]:
                # Next-step autoreset: this step reset env i with a new seed.
                assert infos["autoreset"][i] and rewards[i] == 0.0 and not terminated[i]
                seed = int(infos["autoreset_seed"][i])
                assert obs[i] == envs[i].reset(seed=seed)[0], f"env {i} step {t}"
                done[i] = False
                continue
            assert not infos["autoreset"][i]
            o, r, term, _, info = envs[i].step(int(a[i]))
            assert (obs[i], rewards[i], terminated[i]) == (o, r, term), f"env {i} step {t}"
            assert infos["success"][i] == info["success"]
            done[i] = term
    vec.close()


def test_a_fault_is_reported_per_env_and_raised_by_a_single_env(test_plugin):
    # trap-in-reset traps on seeds 3 mod 4.
    vec = ragen_envs.make(test_plugin("trap-in-reset"), num_envs=4, threads=1)
    _, info = vec.reset(seed=0)
    failures = list(info["failure"])
    assert failures[:3] == [None, None, None]
    assert "trap" in failures[3] and "env 3" in failures[3] and "seed 3" in failures[3], failures[3]
    _, _, terminated, _, infos = vec.step(np.zeros(4, dtype=np.int64))
    assert not terminated[:3].any()
    env = ragen_envs.Env(test_plugin("trap-in-reset"))
    with pytest.raises(ragen_envs.EnvFailureError, match="seed 7"):
        env.reset(seed=7)
    env.reset(seed=8)  # the env goes on after a fault


def test_bad_input_is_a_python_error_that_names_it(plugin):
    with pytest.raises(ValueError, match="no_such_key"):
        ragen_envs.make(plugin("sokoban"), num_envs=2, no_such_key=1)
    with pytest.raises(ValueError, match="cannot read plugin"):
        ragen_envs.make("no/such/plugin.wasm")
    vec = ragen_envs.make(plugin("bandit"), num_envs=2)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="2 envs"):
        vec.step([0])
    with pytest.raises(TypeError, match="an action is an int"):
        vec.step([0.5, 1.5])


def test_the_vector_env_reports_exactly_what_the_rust_pool_returns(plugin):
    """VectorEnv against the native core it wraps (`_core.Pool`, the Rust
    EnvPool with no Gymnasium layer): the same seeds and actions give the same
    observations, rewards, flags, metrics and autoreset seeds."""
    from ragen_envs._core import Pool

    n, path = 12, plugin("sokoban")
    vec = ragen_envs.make(path, num_envs=n, threads=2, envs_per_instance=4)
    pool = Pool(path, n, 2, 4, True, [])
    ids = list(range(n))
    obs, _ = vec.reset(seed=40)
    assert list(obs) == pool.reset(ids, [40 + i for i in ids])[0]
    rng = np.random.default_rng(1)
    for t in range(60):
        actions = rng.integers(0, 4, size=n)
        obs, rewards, terminated, _, infos = vec.step(actions)
        raw = pool.step(ids, actions.tolist())
        assert list(obs) == raw["observations"], t
        assert rewards.tolist() == np.frombuffer(raw["rewards"], dtype="<f8").tolist(), t
        assert terminated.tolist() == [bool(x) for x in raw["dones"]], t
        assert infos["autoreset_seed"].tolist() == np.frombuffer(raw["autoreset_seed"], dtype="<u8").tolist(), t
        # NaN (no measurement) on autoreset steps, in both.
        np.testing.assert_array_equal(infos["boxes_on_target"], np.frombuffer(raw["metrics"], dtype="<f8"), err_msg=str(t))
        assert np.isnan(infos["boxes_on_target"][infos["autoreset"]]).all()
