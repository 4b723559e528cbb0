"""Guess the number: find a secret number from "higher" / "lower" feedback.

A ragen-rs environment plugin written in Python and packaged as a
WebAssembly component with componentize-py (see `Makefile` at the repository
root and `examples/README.md`). It tests what the grid games do not: keeping
an interval in mind across turns and halving it. A binary search always wins
within the default budget; guessing at random rarely does.

componentize-py looks for a module named after the exported interface
(`environment`) holding a class per exported item: `Environment` for the
interface's functions, `Env` for its resource and `Batch` for the optional
batched calls.
"""

import random

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.exports import environment
from wit_world.imports.types import (
    ActionSpace_Names,
    Action_Id,
    ConfigKey,
    EnvError,
    EnvSpec,
    ErrorKind,
    LegendEntry,
    Limits,
    PluginInfo,
    StepInfo,
    StepResult,
)

VERSION = "0.2.0"

# name -> (default, description). Every key `create` accepts.
CONFIG_KEYS = {
    "low": (1, "smallest possible secret (0..=999)"),
    "high": (16, "largest possible secret; high - low + 1 numbers are the actions (at most 64)"),
    "max_guesses": (5, "guesses before the episode ends unsolved (1..=64)"),
}

INSTRUCTIONS = (
    "You are playing Guess the Number. A secret whole number has been chosen "
    "between the two bounds shown. Each turn, guess one number. After a wrong "
    "guess you are told whether the secret is higher or lower than your guess. "
    "Find the secret before your guesses run out."
)


def fail(kind: ErrorKind, message: str) -> Err:
    return Err(EnvError(kind=kind, message=message))


def parse_int(config: dict, name: str, lo: int, hi: int) -> int:
    raw = config.get(name, str(CONFIG_KEYS[name][0]))
    try:
        value = int(raw)
    except ValueError:
        raise fail(ErrorKind.BAD_VALUE, f"`{name}` must be a whole number, got `{raw}`")
    if not lo <= value <= hi:
        raise fail(ErrorKind.BAD_VALUE, f"`{name}` must be in {lo}..={hi}, got {value}")
    return value


class Environment(exports.Environment):
    def info(self) -> PluginInfo:
        return PluginInfo(
            name="guess-number",
            version=VERSION,
            description="Guess a secret number from higher/lower feedback (written in Python).",
            multi_turn=True,
            config_keys=[ConfigKey(name=k, default_value=str(d), description=text) for k, (d, text) in CONFIG_KEYS.items()],
        )


class Env(environment.Env):
    @classmethod
    def create(cls, config):
        settings = dict(config)
        for name in settings:
            if name not in CONFIG_KEYS:
                known = ", ".join(CONFIG_KEYS)
                raise fail(ErrorKind.UNKNOWN_KEY, f"unknown key `{name}`; this env accepts: {known}")
        low = parse_int(settings, "low", 0, 999)
        high = parse_int(settings, "high", low + 1, low + 63)
        max_guesses = parse_int(settings, "max_guesses", 1, 64)
        return cls(low, high, max_guesses)

    def __init__(self, low: int, high: int, max_guesses: int):
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.secret = None  # None until the first reset
        self.history = []  # (guess, "higher" | "lower" | "correct")
        self.done = False

    def spec(self) -> EnvSpec:
        n = self.max_guesses
        return EnvSpec(
            instructions=INSTRUCTIONS,
            legend=[
                LegendEntry(symbol="higher", meaning="the secret is larger than that guess"),
                LegendEntry(symbol="lower", meaning="the secret is smaller than that guess"),
            ],
            action_space=ActionSpace_Names([str(v) for v in range(self.low, self.high + 1)]),
            limits=Limits(max_actions_per_episode=n, max_actions_per_turn=1, max_turns=n, max_steps=n),
            metrics=["guesses", "candidates_left"],
        )

    def reset(self, seed: int) -> str:
        # random.Random(int) seeds Mersenne Twister the same way on every
        # platform and Python version: the same seed gives the same secret.
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.history = []
        self.done = False
        return self.render()

    def step(self, action) -> StepResult:
        if self.secret is None:
            raise fail(ErrorKind.NOT_STARTED, "step before the first reset; call reset(seed) first")
        if self.done:
            raise fail(ErrorKind.EPISODE_OVER, "the episode is over; call reset(seed) to start a new one")
        if not isinstance(action, Action_Id) or not 0 <= action.value <= self.high - self.low:
            raise fail(ErrorKind.BAD_ACTION, f"action {action} is not an id in 0..={self.high - self.low}")
        guess = self.low + action.value
        lo, hi = self.candidates()
        # A guess outside what the feedback still allows teaches nothing.
        effective = lo <= guess <= hi
        if guess == self.secret:
            verdict = "correct"
        elif guess < self.secret:
            verdict = "higher"
        else:
            verdict = "lower"
        self.history.append((guess, verdict))
        success = verdict == "correct"
        self.done = success or len(self.history) >= self.max_guesses
        lo, hi = self.candidates()
        return StepResult(
            observation=self.render(),
            reward=1.0 if success else 0.0,
            done=self.done,
            info=StepInfo(
                success=success,
                action_is_valid=True,
                action_is_effective=effective,
                metrics=[float(len(self.history)), float(hi - lo + 1)],
            ),
        )

    def candidates(self):
        """The bounds the feedback so far still allows."""
        lo, hi = self.low, self.high
        for guess, verdict in self.history:
            if verdict == "higher":
                lo = max(lo, guess + 1)
            elif verdict == "lower":
                hi = min(hi, guess - 1)
            else:
                lo = hi = guess
        return lo, hi

    def render(self) -> str:
        lines = [f"The secret is between {self.low} and {self.high}."]
        for guess, verdict in self.history:
            lines.append(f"You guessed {guess}: {verdict}.")
        if not self.done:
            lines.append(f"Guesses left: {self.max_guesses - len(self.history)}.")
        return "\n".join(lines)


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
