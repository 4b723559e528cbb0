"""ragen-rs environment plugins as Gymnasium environments.

A plugin is one WebAssembly component (a ``.wasm`` file) that runs sandboxed:
no files, no network, a time and memory budget per call. ``make`` gives a
batched :class:`VectorEnv` over many envs of one plugin, stepped by worker
threads in Rust with the GIL released; :class:`Env` is one env.

Observations are text. Actions are ``Discrete(n)`` ids into the plugin's
action names, or text for a plugin whose action is free text (Countdown).

Example::

    import ragen_envs
    envs = ragen_envs.make("target/plugins/sokoban.wasm", num_envs=8)
    observations, infos = envs.reset(seed=0)
    observations, rewards, terminated, truncated, infos = envs.step(envs.action_space.sample())
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from ._core import EnvFailureError, Pool
from ._core import Rollouts as _Rollouts
from ._core import validate as _validate

__all__ = ["Env", "EnvFailureError", "Rollouts", "VectorEnv", "make", "TextSpace", "validate"]

#: The largest observation the sandbox lets through (64 KiB).
MAX_OBSERVATION_CHARS = 64 << 10


class TextSpace(spaces.Text):
    """Any string up to ``max_length`` characters.

    Gymnasium's ``Text`` only contains strings over its sampling charset;
    a plugin's observations may use any character (``√``, newlines), so
    membership here checks the type and length only. ``sample()`` still
    draws from the charset.
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def _settings(config: dict) -> list:
    return [(str(k), _value(v)) for k, v in config.items()]


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _action_space(spec: dict) -> gym.Space:
    text = spec["text_action"]
    if text is not None:
        return TextSpace(max_length=text["max_bytes"], min_length=0)
    return spaces.Discrete(len(spec["actions"]))


def _seeds(rng: np.random.Generator, n: int) -> list:
    return [int(s) for s in rng.integers(0, 2**63, size=n, dtype=np.int64)]


class VectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of one plugin, reset and stepped as one batch.

    Autoreset is Gymnasium's next-step mode: the step after an episode
    ends resets that env (reward 0, not terminated) and ignores its action.
    ``terminated`` is the plugin's ``done``; ``truncated`` is always False
    (the contract does not tell the two apart; a plugin ends episodes at its
    own ``max_steps``). ``infos`` holds, per env: ``success``,
    ``action_is_valid``, ``action_is_effective``, every metric the plugin
    names, ``autoreset`` and ``autoreset_seed`` (whether this step reset the
    env, and the new episode's seed), and ``failure`` (the message of a failed call, else None); a
    failed env ends its episode and does not raise.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, path: Union[str, os.PathLike], num_envs: int = 1, threads: Optional[int] = None,
                 envs_per_instance: int = 64, autoreset: bool = True, **config: Any):
        threads = threads or os.cpu_count() or 1
        self._pool = Pool(os.fspath(path), num_envs, threads, envs_per_instance, autoreset, _settings(config))
        self.spec_dict = self._pool.spec()
        self.num_envs = num_envs
        self.single_observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.single_action_space = _action_space(self.spec_dict)
        self.observation_space = spaces.Tuple([self.single_observation_space] * num_envs)
        if isinstance(self.single_action_space, spaces.Discrete):
            self.action_space = spaces.MultiDiscrete([self.single_action_space.n] * num_envs)
        else:
            self.action_space = spaces.Tuple([self.single_action_space] * num_envs)
        self._ids = list(range(num_envs))
        self._seed_rng = np.random.default_rng()

    def reset(self, *, seed: Optional[Union[int, Sequence[int]]] = None, options: Optional[dict] = None):
        """Reset every env. ``seed``: an int (env ``i`` gets ``seed + i``),
        a list (one per env), or None (seeds drawn from this vector env's
        generator, itself seeded by the last int seed)."""
        if seed is None:
            seeds = _seeds(self._seed_rng, self.num_envs)
        elif isinstance(seed, (int, np.integer)):
            self._seed_rng = np.random.default_rng(int(seed))
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: {len(seeds)} seeds for {self.num_envs} envs")
        observations, failures = self._pool.reset(self._ids, seeds)
        return tuple(observations), {"seed": np.array(seeds, dtype=np.uint64), "failure": np.array(failures, dtype=object)}

    def step(self, actions):
        """Step every env: ``actions`` holds one id (or one str) per env."""
        if len(actions) != self.num_envs:
            raise ValueError(f"step: {len(actions)} actions for {self.num_envs} envs")
        if isinstance(actions, np.ndarray) and actions.dtype.kind in "iu":
            if actions.min(initial=0) < 0:
                raise ValueError("step: action ids must be non-negative")
            b = self._pool.step_ids(actions.astype("<u4").tobytes())
        else:
            b = self._pool.step(self._ids, actions.tolist() if isinstance(actions, np.ndarray) else actions)
        flags = lambda name: np.frombuffer(b[name], dtype=np.bool_)  # noqa: E731
        failure = np.full(self.num_envs, None, dtype=object)
        for i, message in b["failures"]:
            failure[i] = message
        infos = {
            "success": flags("success"),
            "action_is_valid": flags("action_is_valid"),
            "action_is_effective": flags("action_is_effective"),
            "autoreset": flags("autoreset"),
            "autoreset_seed": np.frombuffer(b["autoreset_seed"], dtype="<u8"),
            "failure": failure,
        }
        names = self.spec_dict["metrics"]
        metrics = np.frombuffer(b["metrics"], dtype="<f8").reshape(self.num_envs, len(names))
        for j, name in enumerate(names):
            infos[name] = metrics[:, j]
        terminated = flags("dones")
        rewards = np.frombuffer(b["rewards"], dtype="<f8")
        return tuple(b["observations"]), rewards, terminated, np.zeros_like(terminated), infos

    def close_extras(self, **kwargs: Any) -> None:
        self._pool = None


class Env(gym.Env):
    """One env of a plugin, as a ``gymnasium.Env``.

    A failed call (a plugin fault, invalid output, an env error) raises
    :class:`EnvFailureError`, whose message names the plugin, the env and
    the seed. ``spec_dict`` is what the plugin says about itself:
    instructions, legend, action names (or the text action's form), limits
    and metric names.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, path: Union[str, os.PathLike], render_mode: Optional[str] = None, **config: Any):
        self._pool = Pool(os.fspath(path), 1, 1, 1, False, _settings(config))
        self.spec_dict = self._pool.spec()
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.action_space = _action_space(self.spec_dict)
        self.render_mode = render_mode
        self._last = ""

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        """Start an episode; with ``seed=None`` the seed is drawn from
        ``self.np_random`` (Gymnasium's rule)."""
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**63)) if seed is None else int(seed)
        (observation,), (failure,) = self._pool.reset([0], [episode_seed])
        if failure is not None:
            raise EnvFailureError(failure)
        self._last = observation
        return observation, {"seed": episode_seed}

    def step(self, action):
        if isinstance(action, np.integer):
            action = int(action)
        b = self._pool.step([0], [action])
        if b["failures"]:
            raise EnvFailureError(b["failures"][0][1])
        self._last = b["observations"][0]
        info = {
            "success": bool(b["success"][0]),
            "action_is_valid": bool(b["action_is_valid"][0]),
            "action_is_effective": bool(b["action_is_effective"][0]),
        }
        info.update(zip(self.spec_dict["metrics"], np.frombuffer(b["metrics"], dtype="<f8").tolist()))
        reward = float(np.frombuffer(b["rewards"], dtype="<f8")[0])
        return self._last, reward, bool(b["dones"][0]), False, info

    def render(self):
        """The current state as text (``render_mode="ansi"``)."""
        return self._last


def make(path: Union[str, os.PathLike], num_envs: int = 1, threads: Optional[int] = None, envs_per_instance: int = 64,
         autoreset: bool = True, **config: Any) -> VectorEnv:
    """A :class:`VectorEnv` of ``num_envs`` envs of the plugin at ``path``.

    ``threads``: worker threads (default: every core). ``envs_per_instance``:
    envs sharing one sandboxed instance. ``config``: the plugin's settings
    (``ragen-host inspect PATH`` lists them), e.g. ``dim_x=8``.
    """
    return VectorEnv(path, num_envs=num_envs, threads=threads, envs_per_instance=envs_per_instance, autoreset=autoreset, **config)


def validate(path: Union[str, os.PathLike], seeds: int = 16, budget: float = 30.0, **config: Any) -> dict:
    """Run the conformance suite on the plugin at ``path``: what
    ``ragen-host validate`` runs before a plugin is shared.

    Returns a dict: ``file``; ``passed`` (no check failed); ``checks``, one
    dict per check in the order run (``name``, ``status``: ``"pass"``,
    ``"warn"`` or ``"fail"``, and ``message``: what passed, or what to
    fix); and ``problems``, what the spec checker found in the plugin's
    info and spec (``severity``: ``"error"``, which the host refuses to
    load, or ``"warning"``, which it loads but the suite fails; ``rule``, a
    stable name such as ``"duplicate-action-name"``; ``message``).

    ``seeds``: seeds played by the determinism and value checks.
    ``budget``: seconds the checks may take once the plugin has compiled.
    ``config``: the plugin's settings, e.g. ``dim_x=8``.
    """
    return _validate(os.fspath(path), _settings(config), int(seeds), float(budget))


class Rollouts:
    """RAGEN's agent loop over one plugin: prompts rendered from the plugin,
    replies parsed as the reference parses them, actions executed in a
    batched pool; ``group_size`` envs per group share a seed.

    ``run(policy, group_seeds)`` returns one JSON line per trajectory, the
    format ``ragen-host eval --trajectories`` writes (full text, turns,
    rewards, failures). ``policy`` is ``"random"`` or a callable that takes a
    list of contexts (dicts: ``env``, the env's index in this call and the
    same on every turn; ``messages`` as ``(role, text)`` pairs; ``prefill``,
    ``observation``, ``actions``, ``max_actions``) and returns one
    reply per context: the text after the pre-fill, e.g.
    ``"Push it.</think><answer>Right</answer>"``.

    ``config``: a TOML file with ``[rollout]``, ``[prompt]``, ``[env]`` and
    ``[sandbox]`` (what ``ragen-host eval --config`` reads); ``**config``
    settings win over its ``[env]``.
    """

    def __init__(self, path: Union[str, os.PathLike], env_groups: int = 8, group_size: int = 16,
                 threads: Optional[int] = None, config: Optional[Union[str, os.PathLike]] = None, **settings: Any):
        text = None if config is None else open(config, encoding="utf-8").read()
        self.group_size = group_size
        self._core = _Rollouts(os.fspath(path), env_groups, group_size, threads or os.cpu_count() or 1, text, _settings(settings))

    def run(self, policy: Any, group_seeds: Sequence[int], first_group: int = 0) -> list:
        """Trajectories of ``group_seeds`` (at most ``env_groups``), as JSON
        lines, groups numbered from ``first_group``."""
        return self._core.run(policy, [int(s) for s in group_seeds], first_group)
