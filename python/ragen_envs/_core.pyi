"""The native core of ragen_envs (Rust, PyO3): an EnvPool as a Python object."""

from typing import Literal, Optional, Sequence, TypedDict, Union

class EnvFailureError(RuntimeError):
    """A plugin call failed for one env; the message names the plugin, env and seed."""

class Batch(TypedDict):
    """One step of the batch; numbers and flags are little-endian buffers
    (read them with numpy.frombuffer)."""

    observations: list[str]
    rewards: bytes  # f64 per env
    dones: bytes  # one byte (0/1) per env
    success: bytes
    action_is_valid: bytes
    action_is_effective: bytes
    autoreset: bytes
    autoreset_seed: bytes  # u64 per env, 0 when the step did not reset
    metrics: bytes  # f64 per env per metric, env-major
    failures: list[tuple[int, str]]  # (env, message) for each failed call

class Pool:
    """Many envs of one plugin, stepped in batches across worker threads."""

    def __init__(self, path: str, num_envs: int, threads: int, envs_per_instance: int, autoreset: bool,
                 settings: Sequence[tuple[str, str]]) -> None: ...
    def __len__(self) -> int: ...
    def spec(self) -> dict:
        """name, version, description, multi_turn, instructions, legend, actions, text_action, limits, metrics."""
    def reset(self, ids: Sequence[int], seeds: Sequence[int]) -> tuple[list[str], list[Optional[str]]]:
        """Reset env ids[i] with seeds[i]: (observations, failure messages or None)."""
    def step(self, ids: Sequence[int], actions: Sequence[Union[int, str]]) -> Batch:
        """Step env ids[i] with actions[i] (an id, or text)."""
    def step_ids(self, actions: bytes) -> Batch:
        """Step every env with action ids given as a little-endian u32 buffer."""

class Rollouts:
    """The agent loop over one plugin's envs, with a Python policy."""

    def __init__(self, path: str, env_groups: int, group_size: int, threads: int, config: Optional[str],
                 settings: Sequence[tuple[str, str]]) -> None: ...
    def run(self, policy: object, group_seeds: Sequence[int], first_group: int = 0) -> list[str]:
        """Trajectories as JSON lines; policy is "random" or a callable (list of contexts -> list of replies)."""

class Check(TypedDict):
    """One check of the conformance suite."""

    name: str  # load, metadata, determinism, seeds differ, finite, bad config, bad action, episode rules, batch, speed
    status: Literal["pass", "warn", "fail"]
    message: str  # what passed, or what to fix

class Problem(TypedDict):
    """What the spec checker found in the plugin's info or spec."""

    severity: Literal["error", "warning"]  # an error keeps the host from loading the plugin
    rule: str  # a stable name, e.g. "duplicate-action-name"
    message: str

class Report(TypedDict):
    """The conformance suite's report."""

    file: str
    passed: bool  # no check failed
    checks: list[Check]
    problems: list[Problem]

def validate(path: str, settings: Sequence[tuple[str, str]], seeds: int, budget_seconds: float) -> Report:
    """Run the conformance suite (what `ragen-host validate` runs) on the plugin at path."""
