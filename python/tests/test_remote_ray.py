"""`examples/ray/serve.py`: a local Ray instance runs two `ragen-host serve`
actors, and `ragen-host train --env ws://a,ws://b` trains on both; eval
over both servers and over one, timed in the same run."""

import importlib.util
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ragen_host():
    path = Path(os.environ.get("RAGEN_HOST", ROOT / "target" / "debug" / "ragen-host"))
    if not path.exists():
        pytest.fail(f"{path} is missing: build it with `cargo build` (make test does), or set RAGEN_HOST")
    return str(path)


def load_example():
    spec = importlib.util.spec_from_file_location("ray_serve", ROOT / "examples" / "ray" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMALL = """steps = 2
val_episodes = 4
test_freq = 1
[rollout]
env_groups = 2
group_size = 4
[model]
d_model = 16
n_layers = 1
n_heads = 2
"""


def test_train_uses_two_serve_actors_on_ray(plugin, tmp_path):
    import ray  # target/pyenv has it (python/requirements-dev.txt)

    example = load_example()
    binary = ragen_host()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        actors, env = example.start(plugin("sokoban"), servers=2, binary=binary)
        urls = env.split(",")
        assert len(urls) == 2 and len(set(urls)) == 2 and all(u.startswith("ws://127.0.0.1:") for u in urls), env

        config = tmp_path / "c.toml"
        config.write_text(SMALL)
        run = tmp_path / "run"
        out = subprocess.run([binary, "train", "--env", env, "--config", str(config), "--out", str(run)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [s["failed_episodes"] for s in steps] == [0, 0]
        assert f'source = "{env}"' in (run / "config.toml").read_text()

        # Both servers played: every actor's server saw sessions.
        for url in urls:
            health = urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10).read().decode()
            opened = [line for line in health.splitlines() if line.startswith("ragen_serve_sessions_opened_total")]
            assert opened and float(opened[0].split()[-1]) > 0, health[:500]

        # Two servers against one, the same episodes (timed, not asserted):
        # env steps per second of the whole eval, prompts and parsing included.
        def steps_per_sec(env_list):
            clock = time.perf_counter()
            out = subprocess.run(
                [binary, "eval", "--env", env_list, "--policy", "random", "--episodes", "1024", "--json"], capture_output=True, text=True
            )
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            return report, report["actions_mean"] * 1024 / (time.perf_counter() - clock)

        both, rate_both = steps_per_sec(env)
        one, rate_one = steps_per_sec(urls[0])
        assert both["success_rate"] == one["success_rate"] and both["failures"] == 0
        print(f"eval of 1,024 random episodes: two servers on Ray {rate_both:.0f} steps/s, one server {rate_one:.0f} steps/s")
        example.stop(actors)
    finally:
        ray.shutdown()
