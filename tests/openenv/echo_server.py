"""Serve openenv-core's own example environment (the echo env that
`openenv init` writes from the template shipped in the openenv-core wheel)
on loopback, for the tests that train and evaluate on a server no one here
wrote (host/cli/tests/all/remote.rs).

The template is instantiated as `openenv init` does it (its placeholders
replaced by the env's name) into a scratch directory; the only change is
the number of concurrent WebSocket sessions, which the template sets to 1.

Usage: echo_server.py PORT [MAX_SESSIONS]   (prints "ready" when listening)
"""

import pathlib
import shutil
import sys
import tempfile

import openenv.cli as cli


def instantiate(dest: pathlib.Path, sessions: int) -> None:
    template = pathlib.Path(cli.__file__).parent / "templates" / "openenv_env"
    names = {
        "__ENV_CLASS_NAME__": "Echo",
        "__ENV_TITLE_NAME__": "Echo",
        "__ENV_NAME__": "echo_env",
    }
    for src in template.rglob("*"):
        if "__pycache__" in src.parts or src.is_dir():
            continue
        rel = str(src.relative_to(template))
        text = src.read_text()
        for old, new in names.items():
            rel = rel.replace(old, new)
            text = text.replace(old, new)
        text = text.replace("max_concurrent_envs=1,", f"max_concurrent_envs={sessions},")
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def main() -> None:
    port = int(sys.argv[1])
    sessions = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="openenv-echo-"))
    try:
        instantiate(scratch, sessions)
        sys.path.insert(0, str(scratch))
        import uvicorn
        from server.app import app

        print("ready", flush=True)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=1 << 20)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
