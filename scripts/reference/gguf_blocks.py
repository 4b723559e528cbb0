"""Write gguf_blocks.json: random GGUF quantisation blocks and what the
`gguf` Python package (llama.cpp's own reader) dequantises them to.

ragen-llm's dequantisers are checked against it (host/llm/tests/all/gguf.rs), so
the test needs no Python. Not part of CI. To re-make the fixture:

    python3 -m venv target/ref-venv
    target/ref-venv/bin/pip install gguf numpy
    target/ref-venv/bin/python scripts/reference/gguf_blocks.py
"""
import importlib.metadata
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(7)


def f16(x):
    return np.array([x], dtype=np.float16).tobytes()


def block(kind):
    """One block of `kind` with random payload and plausible scales."""
    if kind == T.Q8_0:
        return f16(rng.uniform(0.001, 0.05)) + rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
    if kind == T.Q4_0:
        return f16(rng.uniform(0.001, 0.05)) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    if kind == T.Q4_1:
        return f16(rng.uniform(0.001, 0.05)) + f16(rng.uniform(-0.3, 0.0)) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    if kind == T.Q4_K:
        return (f16(rng.uniform(0.0005, 0.005)) + f16(rng.uniform(0.0005, 0.005))
                + rng.integers(0, 256, 12 + 128, dtype=np.uint8).tobytes())
    if kind == T.Q6_K:
        return rng.integers(0, 256, 128 + 64 + 16, dtype=np.uint8).tobytes() + f16(rng.uniform(0.0005, 0.005))
    if kind == T.F16:
        return np.asarray(rng.normal(size=32), dtype=np.float16).tobytes()
    if kind == T.BF16:
        return (np.asarray(rng.normal(size=32), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raise ValueError(kind)


cases = []
for kind in [T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K, T.F16, T.BF16]:
    data = b"".join(block(kind) for _ in range(2))
    values = dequantize(np.frombuffer(data, dtype=np.uint8), kind).astype(np.float32).ravel()
    cases.append({"type": kind.name, "hex": data.hex(), "values": [float(v) for v in values]})

out = pathlib.Path(__file__).with_name("gguf_blocks.json")
out.write_text(json.dumps({"gguf_version": importlib.metadata.version("gguf"), "cases": cases}))
print(f"wrote {out}: {[(c['type'], len(c['values'])) for c in cases]}")
