"""The Python corridor (examples/corridor-py) whose batched calls break the
contract: given more than one env, `reset-many` and `step-many` return one
result fewer. For tests only: the host must recover (run the batch again
call by call) and say so. Built by `make python-plugins`.
"""

from environment import Env, Environment, attempt  # noqa: F401 (the exports componentize-py looks for)
from wit_world import exports


def short(results):
    """All but the last result, when there are several."""
    return results[:-1] if len(results) > 1 else results


class Batch(exports.Batch):
    def reset_many(self, envs, seeds):
        return short([attempt(env.reset, seed) for env, seed in zip(envs, seeds)])

    def step_many(self, envs, actions):
        return short([attempt(env.step, action) for env, action in zip(envs, actions)])
