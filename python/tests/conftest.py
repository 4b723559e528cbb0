"""Where the tests find the built plugins: `make test` sets RAGEN_PLUGIN_DIR and
friends; a missing plugin fails and says how to build it."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _find(var: str, default: str, name: str) -> str:
    path = Path(os.environ.get(var, ROOT / default)) / f"{name}.wasm"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make plugins test-plugins` (or `make test`, which builds everything)")
    return str(path)


@pytest.fixture
def plugin():
    return lambda name: _find("RAGEN_PLUGIN_DIR", "target/plugins", name)


@pytest.fixture
def test_plugin():
    return lambda name: _find("RAGEN_TEST_PLUGIN_DIR", "target/test-plugins", name)
