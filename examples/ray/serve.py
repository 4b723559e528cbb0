"""Env servers on a Ray cluster: N `ragen-host serve` processes, each held
by a Ray actor (spread over the nodes), and the `--env` list that
`ragen-host train` takes to play on all of them.

    # on this machine (a local Ray instance):
    python examples/ray/serve.py target/plugins/sokoban.wasm --servers 2
    # prints the list, e.g. ws://127.0.0.1:41234,ws://127.0.0.1:38211, and serves until Ctrl-C;
    # in another shell:
    ragen-host train --env "ws://127.0.0.1:41234,ws://127.0.0.1:38211" --out runs/ray
    # on a cluster: `ray start --head` on one node, `ray start --address HEAD:6379`
    # on the others, the binary and the .wasm at the same paths on every node, then
    python examples/ray/serve.py /shared/sokoban.wasm --address auto --servers 8 --host 0.0.0.0

Each server holds its own pool; the run spreads its envs over them (env i
on server i % n). A server that dies fails only its envs' episodes; the
actor restarts it (Ray's max_restarts) on another free port, so pass
`--port` to keep the address stable across restarts.
"""

import argparse
import os
import shutil
import subprocess
import time

import ray


@ray.remote(max_restarts=3)
class ServeActor:
    """One `ragen-host serve` process on this actor's node."""

    def __init__(self, binary, plugin, host, port, args):
        self.proc = subprocess.Popen(
            [binary, "serve", plugin, "--host", host, "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        prefix = "listening on http://"
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"`{binary} serve {plugin}` did not start: {line!r}")
        bound = line[len(prefix):]
        port = bound.rsplit(":", 1)[1]
        # Where other nodes reach it: this node's address unless bound to one.
        reach = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host
        self.url = f"ws://{reach}:{port}"

    def address(self):
        return self.url

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=30)


def find_binary(binary=None):
    """`--binary`, else $RAGEN_HOST, else ragen-host on PATH, else the debug build."""
    for candidate in (binary, os.environ.get("RAGEN_HOST"), shutil.which("ragen-host"), "target/debug/ragen-host"):
        if candidate and os.path.exists(candidate):
            return os.path.abspath(candidate)
    raise FileNotFoundError("no ragen-host binary: build it (cargo build) or pass --binary PATH")


def start(plugin, servers=2, binary=None, host="127.0.0.1", port=0, args=()):
    """`servers` serve actors spread over the cluster; returns the actors and
    the `--env` value that names them all."""
    binary = find_binary(binary)
    actors = [
        ServeActor.options(scheduling_strategy="SPREAD").remote(binary, os.path.abspath(plugin), host, port, list(args))
        for _ in range(servers)
    ]
    urls = ray.get([a.address.remote() for a in actors])
    return actors, ",".join(urls)


def stop(actors):
    ray.get([a.stop.remote() for a in actors])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plugin", help="the .wasm file, at the same path on every node")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--address", default=None, help="a Ray cluster's address (`auto`); default: a local Ray instance")
    p.add_argument("--host", default="127.0.0.1", help="where each server listens (0.0.0.0 on a cluster)")
    p.add_argument("--port", type=int, default=0, help="each server's port (default: any free one)")
    p.add_argument("--binary", default=None, help="the ragen-host binary (default: $RAGEN_HOST, PATH, target/debug)")
    p.add_argument("serve_args", nargs="*", help="more `ragen-host serve` options, after --")
    a = p.parse_args()
    ray.init(address=a.address, include_dashboard=False, configure_logging=False)
    actors, env = start(a.plugin, a.servers, a.binary, a.host, a.port, a.serve_args)
    print(env, flush=True)
    try:
        while all(ray.get([x.alive.remote() for x in actors])):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop(actors)


if __name__ == "__main__":
    main()
