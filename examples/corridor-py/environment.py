"""Corridor, in Python: walk right to the exit before the steps run out.

The same game as examples/corridor (Rust) and examples/corridor-js, step for
step. componentize-py wants a module named after the exported interface,
`environment`, with a class `Environment` (the interface's functions) and a
class `Env` (its resource). It also exports the contract's optional `batch`
interface (class `Batch`: many envs in one call), built with
`-w env-plugin-batched`; drop that class and build with `-w env-plugin` to
ship single calls only. Build: see examples/README.md.
"""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.exports import environment
from wit_world.imports.types import (
    ActionSpace_Names, Action_Id, ConfigKey, EnvError, EnvSpec, ErrorKind, LegendEntry, Limits, PluginInfo, StepInfo,
    StepResult,
)


class Environment(exports.Environment):
    def info(self) -> PluginInfo:
        return PluginInfo(
            name="corridor",
            version="0.1.0",
            description="Walk right along a corridor to reach the exit.",
            multi_turn=True,
            config_keys=[ConfigKey(name="length", default_value="5", description="cells in the corridor (2..=50)")],
        )


class Env(environment.Env):
    @classmethod
    def create(cls, config):
        length = 5
        for key, value in config:
            if key != "length":
                raise Err(EnvError(kind=ErrorKind.UNKNOWN_KEY, message=f"unknown key `{key}`; this env accepts: length"))
            if not value.isdigit() or not 2 <= int(value) <= 50:
                raise Err(EnvError(kind=ErrorKind.BAD_VALUE, message=f"`length` must be in 2..=50, got `{value}`"))
            length = int(value)
        return cls(length)

    def __init__(self, length: int):
        self.length, self.player, self.steps, self.started, self.done = length, 0, 0, False, False

    def spec(self) -> EnvSpec:
        return EnvSpec(
            instructions="You are in a corridor. Reach the exit E.",
            legend=[LegendEntry("P", "you"), LegendEntry("_", "floor"), LegendEntry("E", "exit")],
            action_space=ActionSpace_Names(["Left", "Right"]),
            limits=Limits(max_actions_per_episode=20, max_actions_per_turn=5, max_turns=5, max_steps=20),
            metrics=[],
        )

    def reset(self, seed: int) -> str:
        # Start somewhere left of the exit, chosen by the seed.
        self.player, self.steps, self.started, self.done = seed % (self.length - 1), 0, True, False
        return self.render()

    def step(self, action) -> StepResult:
        # The Rust kit checks these rules for every env; here we do.
        if not self.started:
            raise Err(EnvError(kind=ErrorKind.NOT_STARTED, message="step before reset; call reset(seed) first"))
        if self.done:
            raise Err(EnvError(kind=ErrorKind.EPISODE_OVER, message="the episode is over; call reset(seed)"))
        # An action is a variant: `Action_Id(n)` for a names space.
        if not isinstance(action, Action_Id) or action.value > 1:
            raise Err(EnvError(kind=ErrorKind.BAD_ACTION, message=f"action {action} is not an id in 0..=1"))
        before = self.player
        self.player = max(self.player - 1, 0) if action.value == 0 else min(self.player + 1, self.length - 1)
        self.steps += 1
        success = self.player == self.length - 1
        self.done = success or self.steps >= 20
        return StepResult(
            observation=self.render(),
            reward=1.0 if success else 0.0,
            done=self.done,
            info=StepInfo(success=success, action_is_valid=True, action_is_effective=self.player != before, metrics=[]),
        )

    def render(self) -> str:
        return "".join("P" if i == self.player else "E" if i == self.length - 1 else "_" for i in range(self.length))


def attempt(call, arg):
    """One item of a batch: the call's value, or the error it raised."""
    try:
        return Ok(call(arg))
    except Err as e:
        return e


class Batch(exports.Batch):
    """Many envs of this instance in one call; each item exactly as its single call."""

    def reset_many(self, envs, seeds):
        return [attempt(env.reset, seed) for env, seed in zip(envs, seeds)]

    def step_many(self, envs, actions):
        return [attempt(env.step, action) for env, action in zip(envs, actions)]
