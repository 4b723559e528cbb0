"""Drive `ragen-host serve` with OpenEnv's own Python client (openenv-core).

Run by host/cli/tests/all/serve.rs against a Sokoban server:

    target/openenv-venv/bin/python tests/openenv/client.py --url http://127.0.0.1:PORT

It plays one episode prefix with `GenericEnvClient` (sync and async), runs
OpenEnv's own conformance checks (`validate_running_environment`, what
`openenv validate --url` runs), and prints one JSON object for the Rust
test to compare against the plugin run in-process.
"""

import argparse
import asyncio
import json

from openenv.cli._validation import validate_running_environment
from openenv.core import GenericEnvClient

ACTIONS = ["Up", "Left", "Down", "Right", "Up"]


def play_sync(url: str, seed: int) -> dict:
    with GenericEnvClient(base_url=url).sync() as env:
        first = env.reset(seed=seed, episode_id="openenv-sync")
        steps = []
        for name in ACTIONS:
            r = env.step({"action": name})
            steps.append({"text": r.observation["text"], "reward": r.reward, "done": r.done})
            if r.done:
                break
        state = env.state()
        try:
            env.step({"action": "Jump"})
            bad = None
        except RuntimeError as e:  # the client's form of an error frame
            bad = str(e)
    return {"first": first.observation["text"], "first_reward": first.reward, "steps": steps, "state": state, "bad_action": bad}


async def play_async(url: str, seed: int) -> dict:
    async with GenericEnvClient(base_url=url) as env:
        first = await env.reset(seed=seed)
        r = await env.step({"action": ACTIONS[0]})
        return {"first": first.observation["text"], "step": r.observation["text"], "reward": r.reward}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    report = validate_running_environment(args.url)
    out = {
        "actions": ACTIONS,
        "sync": play_sync(args.url, args.seed),
        "async": asyncio.run(play_async(args.url, args.seed)),
        "validate": {"passed": report.get("passed"), "summary": report.get("summary"), "criteria": report.get("criteria")},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
