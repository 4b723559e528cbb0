#!/usr/bin/env python3
"""The PyTorch twin of ``ragen-host bench --policy``'s training measurement.

Builds the project's default from-scratch policy model in PyTorch, layer for
layer as ``host/policy/src/model.rs`` defines it (token and learned position
embeddings; pre-norm blocks of LayerNorm, one qkv Linear, causal attention,
an output projection, LayerNorm, Linear up ``mlp_ratio`` x, exact (erf) GELU,
Linear down; a final LayerNorm, the language-model head and a one-output
value head; every Linear with a bias), and times what the Rust bench times:
a forward pass over ``batch`` sequences of ``len`` tokens, the loss
``cross_entropy(logits[:, :-1], tokens[:, 1:]) + values.mean()`` (the
next-token log-probabilities at every position, which the Rust bench takes
through the learner's scoring node), and ``loss.backward()``, without an
optimizer step. Attention is ``F.scaled_dot_product_attention``
with ``is_causal=True``, what a PyTorch user would write.

The shapes default to what ``ragen-host bench --policy
target/plugins/sokoban.wasm --json`` reports for the default config (batch
32, prompts of 268 tokens plus 28 reply tokens); pass ``--vocab`` from its
``vocab`` field. It prints one JSON line per thread count: train tokens/s.

Not part of CI. Setup (a CPU wheel is enough):

    python3 -m venv target/ref-venv
    target/ref-venv/bin/pip install torch
    target/ref-venv/bin/python scripts/reference/policy_bench.py --threads 1 2

Then compare with ``ragen-host bench --policy target/plugins/sokoban.wasm``
(run one after the other, on an otherwise idle machine; ``--threads`` on our
side is the pool's, the learner uses every core: compare with the twin's
highest thread count, and with 1 thread under ``taskset -c 0``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp_norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, mlp_ratio * d)
        self.down = nn.Linear(mlp_ratio * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, k = self.heads, d // self.heads
        q, key, v = self.qkv(self.attn_norm(x)).split(d, dim=2)
        q, key, v = (z.reshape(b, t, h, k).transpose(1, 2) for z in (q, key, v))  # [b, h, t, k]
        attended = F.scaled_dot_product_attention(q, key, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class PolicyModel(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, mlp_ratio: int, max_len: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d)
        self.position_embedding = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, mlp_ratio) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)
        self.value_head = nn.Linear(d, 1)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = tokens.shape
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(t).expand(b, t))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.lm_head(x), self.value_head(x).squeeze(-1)  # [b, t, v], [b, t]


def train_rate(model: PolicyModel, tokens: torch.Tensor, min_time: float) -> float:
    def once() -> int:
        logits, values = model(tokens)
        vocab = logits.shape[-1]
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss = nll + values.mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return tokens.numel()

    once()  # warm-up, as the Rust bench does
    start, done, runs = time.perf_counter(), 0, 0
    while runs < 2 or time.perf_counter() - start < min_time:
        done += once()
        runs += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=452)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp-ratio", type=int, default=4)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--len", type=int, default=296)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = p.parse_args()
    torch.manual_seed(0)
    model = PolicyModel(a.vocab, a.d_model, a.layers, a.heads, a.mlp_ratio, a.max_seq_len)
    tokens = torch.randint(0, a.vocab, (a.batch, a.len))
    for threads in a.threads:
        torch.set_num_threads(threads)
        rate = train_rate(model, tokens, a.seconds)
        print(json.dumps({"torch": torch.__version__, "threads": threads, "batch": a.batch, "len": a.len,
                          "vocab": a.vocab, "train_tokens_per_s": round(rate)}))


if __name__ == "__main__":
    main()
