#!/usr/bin/env python3
"""Can the from-scratch policy model represent a near-optimal FrozenLake policy?

PPO with the FrozenLake recipe (``examples/configs/frozenlake.toml``) leaves
the default policy model (2 layers, d_model 64, 4 heads, mlp_ratio 4,
learned positions) short of the optimum's success within ten actions on the
slippery 4x4 lake (docs/results.md#training-runs). This script separates
the model from the RL: it trains the same architecture by behaviour cloning, on the action
of the best stationary policy, and measures exactly what the learned policy
achieves.

Data. Maps are drawn as ``frozenlake_discount.py`` draws them (the plugin's
generator: 4x4, p = 0.8, start and goal random distinct cells, goal
reachable). For each map and each cell the player can stand on (every
non-terminal cell) the label is the action of the stationary policy greedy
in the gamma = 0.95 discounted values (reward 1 at the goal, holes and goal
terminal): ``discounted_policy`` there. With ``--labels horizon`` it is
instead the finite-horizon optimum's action with ``--budget`` actions left.

Input. Each example is the token sequence the Rust policy reads with that
recipe (``max_context_window = 1``, so the task sits in the system message;
``enable_think = false``, so the reply is pre-filled with ``<answer>``)::

    <|system|>\\n  Left, Down, Right, Up\\n            (intro "{actions}\\n")
    <|user|>\\n    [0.0\\n\\n]  P__G\\n_O__\\n____\\n__O_\\n  (turn "{state}\\n")
    <|assistant|>\\n  <answer>

and the target is the reply's first token, the action name (each action name
is one token). The ``0.0\\n\\n`` (reward template "{reward}\\n", then a blank
line) starts every user message after the first turn; the first turn's
message, with the player on the start cell, has none. Both forms are
trained on: the first-turn form at the start cell, the later form at every
cell. The vocabulary and ids are ``PluginTokenizer::with_text`` of
``host/policy/src/tokenizer.rs`` ported to Python (role headers, tags,
action names, ``√``, then the words of the plugin's instructions, legend and
the prompt templates; greedy longest match over bytes), so the sequences are
token for token what the Rust policy reads. Differences from the Rust
policy: the model is the PyTorch twin of ``policy_bench.py`` (PyTorch's
default initialisation, not Burn's); the loss is the cross-entropy of the
action token over the full vocabulary (``--loss actions``: over the four
action tokens only, as the learner's grammar-masked log-probabilities); and
the plugin text (instructions, legend, actions) is copied here from
``env-plugins/frozenlake/src/lib.rs``, not read from the plugin.

Evaluation. On fresh maps (``--eval-seed``) it computes, per map and
exactly (dynamic programming over cell and actions left, no sampling), the
success within ``--budget`` actions from the start of: the finite-horizon
optimum, the gamma-discounted greedy stationary policy (and the label
policy, if different), and the learned policy taking the argmax of the four
action logits or sampling from their softmax at temperature 0.5 and 1.0 (as
the Rust sampler does under the answer grammar, which allows only the four
action tokens there; the first turn reads the first-turn prompt, later turns
the later one). It prints the means in percent, the label accuracy on the
held-out states (strict, and counting any action tied with the best as
right), and the softmax mass the model puts outside the action tokens.

Not part of CI. Setup and run (a CPU wheel is enough):

    python3 -m venv target/ref-venv
    target/ref-venv/bin/pip install torch numpy
    target/ref-venv/bin/python scripts/reference/frozenlake_imitate.py --train-maps 5000

What it found, for 1,000 to 20,000 training maps (the architecture can
represent a near-optimal policy), is in
docs/notebook.md#frozenlake-the-model-can-represent-a-near-optimal-policy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frozenlake_discount import budget_success, discounted_policy, generate, transitions  # noqa: E402
from policy_bench import PolicyModel  # noqa: E402

# What the plugin says about itself (env-plugins/frozenlake/src/lib.rs).
INSTRUCTIONS = (
    "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal. "
    "The ice is slippery: you may move in a direction you did not intend. "
    "The answer should be a sequence of actions, like <answer>Left || Up</answer>"
)
LEGEND = [("P", "player"), ("_", "frozen"), ("O", "hole"), ("G", "goal"), ("X", "player in hole"), ("√", "player on goal")]
ACTIONS = ["Left", "Down", "Right", "Up"]  # action id order = frozenlake_discount's LEFT, DOWN, RIGHT, UP

# The prompt templates in PromptTemplates::texts() order: the recipe's
# (system, intro, legend, turn, reward), the rest host/agent/src/prompt.rs's defaults.
TEMPLATES = [
    "",  # system
    "{actions}\n",  # intro
    "{instructions}\n{legend}Your answer is {form}.\n",  # intro_text
    "",  # legend
    "{state}\n",  # turn
    "{reward}\n",  # reward
    "",  # no_effect
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra text. "
    "Strictly follow this format.",  # format_think
    "Always output: <answer> [your answer] </answer> with no extra text. Strictly follow this format.",  # format_answer
]
ROLE_HEADERS = {"system": "<|system|>\n", "user": "<|user|>\n", "assistant": "<|assistant|>\n"}
TAGS = ["<think>", "</think>", "<answer>", "</answer>", " || "]
PREFILL = "<answer>"
# The reward template filled with a non-final turn's reward (Python-style 0.0), then format!("{feedback}\n{turn}").
LATER_TURN_PREFIX = "0.0\n\n"


def words_of(text: bytes) -> list[bytes]:
    """tokenizer.rs's words_of: runs of letters, digits, `_` and `'` of two
    bytes or more, with the space before them; `{placeholders}` skipped."""
    def is_word(b: int) -> bool:
        return chr(b).isascii() and (chr(b).isalnum() or b in b"_'")

    out, i = [], 0
    while i < len(text):
        if not is_word(text[i]):
            i += 1
            continue
        start = i
        while i < len(text) and is_word(text[i]):
            i += 1
        placeholder = start > 0 and text[start - 1] == ord("{") and text[i:i + 1] == b"}"
        if i - start >= 2 and not placeholder:
            out.append(text[start - 1 if start > 0 and text[start - 1] == ord(" ") else start:i])
    return out


class PluginTokenizer:
    """host/policy/src/tokenizer.rs's PluginTokenizer::with_text: ids 0..256
    are bytes, then the multi-byte tokens in the Rust order; encoding takes
    the longest token matching at each position (the first added among
    equally long ones), else one byte."""

    BYTES = 256

    def __init__(self, instructions: str, legend: list[tuple[str, str]], actions: list[str], texts: list[str]) -> None:
        self.words: list[bytes] = []
        for header in ROLE_HEADERS.values():
            self._add(header.encode())
        for tag in TAGS:
            self._add(tag.encode())
        self.action_ids = [self._add(a.encode()) for a in actions]
        for symbol, _ in legend:
            if len(symbol.encode()) > 1:
                self._add(symbol.encode())
        for text in [instructions] + [meaning for _, meaning in legend] + texts:
            for word in words_of(text.encode()):
                self._add(word)
                if word.startswith(b" "):
                    self._add(word[1:])
        order = sorted(range(len(self.words)), key=lambda i: -len(self.words[i]))  # stable, as sort_by_key
        self.by_first_byte: dict[int, list[int]] = {}
        for i in order:
            self.by_first_byte.setdefault(self.words[i][0], []).append(i)

    def _add(self, word: bytes) -> int:
        if word not in self.words:
            self.words.append(word)
        return self.BYTES + self.words.index(word)

    @property
    def vocab_size(self) -> int:
        return self.BYTES + len(self.words)

    def id(self, word: str) -> int:
        return self.BYTES + self.words.index(word.encode())

    def encode(self, text: str) -> list[int]:
        data, out, at = text.encode(), [], 0
        while at < len(data):
            match = next((i for i in self.by_first_byte.get(data[at], []) if data.startswith(self.words[i], at)), None)
            if match is None:
                out.append(data[at])
                at += 1
            else:
                out.append(self.BYTES + match)
                at += len(self.words[match])
        return out

    def decode(self, ids: list[int]) -> str:
        return b"".join(bytes([i]) if i < self.BYTES else self.words[i - self.BYTES] for i in ids).decode()


def recipe_tokenizer() -> PluginTokenizer:
    return PluginTokenizer(INSTRUCTIONS, LEGEND, ACTIONS, TEMPLATES)


def render(tiles: list[str], size: int, player: int) -> str:
    """The plugin's render(): one symbol per cell, rows joined by newlines."""
    symbols = {("F", False): "_", ("H", False): "O", ("G", False): "G", ("F", True): "P", ("H", True): "X", ("G", True): "√"}
    cells = [symbols[(tile, cell == player)] for cell, tile in enumerate(tiles)]
    return "\n".join("".join(cells[r * size:(r + 1) * size]) for r in range(size))


def prompt_ids(tok: PluginTokenizer, state: str, first_turn: bool) -> list[int]:
    """What BurnPolicy::prompt_tokens builds with a one-turn window: system
    message (the task), the current user message, the assistant header and
    the pre-fill."""
    system = "{actions}\n".replace("{actions}", ", ".join(ACTIONS))
    user = ("" if first_turn else LATER_TURN_PREFIX) + "{state}\n".replace("{state}", state)
    return (tok.encode(ROLE_HEADERS["system"]) + tok.encode(system) + tok.encode(ROLE_HEADERS["user"]) + tok.encode(user)
            + tok.encode(ROLE_HEADERS["assistant"]) + tok.encode(PREFILL))


class Lake:
    """One generated map with what the script needs to know about it."""

    def __init__(self, tiles: list[str], start: int, size: int) -> None:
        self.tiles, self.start, self.size = tiles, start, size
        self.terminal = np.array([t in "HG" for t in tiles])
        self.goal_reward = np.array([1.0 if t == "G" else 0.0 for t in tiles])
        self.cells = [c for c in range(len(tiles)) if not self.terminal[c]]


def draw_lakes(count: int, seed: int, size: int, p: float) -> list[Lake]:
    rng = random.Random(seed)
    return [Lake(*generate(rng, size, p), size) for _ in range(count)]


def horizon_q(P: np.ndarray, lake: Lake, actions_left: int) -> np.ndarray:
    """q[cell, action]: success within `actions_left` actions, this action first, the optimum after."""
    after = budget_success(P, lake.terminal, lake.goal_reward, None, actions_left - 1)
    return (P * np.where(lake.terminal, lake.goal_reward, after)[None, None, :]).sum(2)


def discounted_q(P: np.ndarray, lake: Lake, gamma: float, iterations: int = 200) -> np.ndarray:
    """discounted_policy's iteration, returning q[cell, action] (its argmax is discounted_policy)."""
    value = np.zeros(len(lake.terminal))
    for _ in range(iterations):
        q = (P * (lake.goal_reward + np.where(lake.terminal, 0.0, gamma * value))[None, None, :]).sum(2)
        value = q.max(1)
    return q


def labels_for(P: np.ndarray, lake: Lake, kind: str, gamma: float, budget: int) -> np.ndarray:
    """The action to imitate in each cell."""
    if kind == "discounted":
        return discounted_policy(P, lake.terminal, lake.goal_reward, gamma, 200)
    return horizon_q(P, lake, budget).argmax(1)


class Examples:
    """Right-padded prompts (first-turn prompt at the start cell, later-turn
    prompt at every standable cell), the index of each one's last token,
    its label (action id) and where it came from."""

    def __init__(self, tok: PluginTokenizer, lakes: list[Lake], labels: list[np.ndarray]) -> None:
        rows, meta = [], []
        for m, (lake, label) in enumerate(zip(lakes, labels)):
            rows.append(prompt_ids(tok, render(lake.tiles, lake.size, lake.start), first_turn=True))
            meta.append((m, lake.start, 1, label[lake.start]))
            for cell in lake.cells:
                rows.append(prompt_ids(tok, render(lake.tiles, lake.size, cell), first_turn=False))
                meta.append((m, cell, 0, label[cell]))
        width = max(map(len, rows))
        self.tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        self.last = torch.tensor([len(r) - 1 for r in rows])
        self.lake, self.cell, self.first, self.label = (torch.tensor(col) for col in zip(*meta))
        self.keys = [tuple(r) for r in rows]
        self.unseen = torch.ones(len(rows), dtype=torch.bool)  # set by mark_seen

    def mark_seen(self, training: "Examples") -> float:
        """Flag the prompts that also occur in `training`; returns their share."""
        seen = set(training.keys)
        self.unseen = torch.tensor([k not in seen for k in self.keys])
        return 1 - float(self.unseen.double().mean())

    def __len__(self) -> int:
        return len(self.label)


def last_logits(model: PolicyModel, tokens: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The next-token logits after each prompt's last token: [n, vocab].
    PolicyModel.forward, with the language-model head applied at that
    position only (causal attention: the padding after it changes nothing)."""
    tokens = tokens[:, :int(last.max()) + 1]
    b, t = tokens.shape
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(t).expand(b, t))
    for block in model.blocks:
        x = block(x)
    return model.lm_head(model.norm(x[torch.arange(b), last]))


def loss_of(logits: torch.Tensor, targets: torch.Tensor, action_ids: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "actions":
        return F.cross_entropy(logits[:, action_ids], targets)
    return F.cross_entropy(logits, action_ids[targets])


def learning_rate(step: int, steps: int, lr: float, min_ratio: float) -> float:
    """Cosine decay from lr to lr * min_ratio, as the recipe's scheduler."""
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * step / max(1, steps))))


def train(model: PolicyModel, data: Examples, action_ids: torch.Tensor, args: argparse.Namespace,
          on_eval=None) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    order, at = torch.randperm(len(data), generator=gen), 0
    start, seen_loss, seen_right, seen = time.perf_counter(), 0.0, 0, 0
    for step in range(args.steps):
        if at + args.batch > len(order):
            order, at = torch.randperm(len(data), generator=gen), 0
        idx = order[at:at + args.batch]
        at += args.batch
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.min_lr_ratio)
        logits = last_logits(model, data.tokens[idx], data.last[idx])
        loss = loss_of(logits, data.label[idx], action_ids, args.loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        seen_loss += loss.item() * len(idx)
        seen_right += int((logits[:, action_ids].argmax(1) == data.label[idx]).sum())
        seen += len(idx)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            print(f"step {step + 1:6d}  epoch {(step + 1) * args.batch / len(data):6.2f}  loss {seen_loss / seen:.4f}  "
                  f"train acc {seen_right / seen:.3f}  {time.perf_counter() - start:6.0f}s", flush=True)
            seen_loss, seen_right, seen = 0.0, 0, 0
        if on_eval and args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            on_eval(step + 1)


@torch.no_grad()
def predict(model: PolicyModel, data: Examples, action_ids: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """The four action logits [n, 4] and the softmax mass outside them [n]."""
    model.eval()
    acts, outside = [], []
    for s in range(0, len(data), chunk):
        logits = last_logits(model, data.tokens[s:s + chunk], data.last[s:s + chunk])
        acts.append(logits[:, action_ids])
        outside.append(1 - logits.softmax(1)[:, action_ids].sum(1))
    model.train()
    return torch.cat(acts), torch.cat(outside)


def policy_success(P: np.ndarray, lake: Lake, first: np.ndarray, later: np.ndarray, budget: int) -> float:
    """Exact success within `budget` actions from the start, acting by the
    distribution `first` [4] on the first action and `later[cell]` [cells, 4] after."""
    value = np.zeros(len(lake.terminal))
    for _ in range(budget):
        q = (P * np.where(lake.terminal, lake.goal_reward, value)[None, None, :]).sum(2)
        value = (later * q).sum(1)
    return float(first @ q[lake.start])


def action_distributions(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """Greedy (temperature 0, first of a tie) or softmax(logits / T) over the four actions."""
    if temperature == 0:
        return F.one_hot(logits.argmax(1), 4).double().numpy()
    return (logits / temperature).softmax(1).double().numpy()


def evaluate(P: np.ndarray, lakes: list[Lake], data: Examples, logits: torch.Tensor, args: argparse.Namespace) -> dict:
    """Mean exact success of the learned policy at each temperature over `lakes`."""
    by_temp = {}
    for temperature in args.temperatures:
        probs = action_distributions(logits, temperature)
        later = np.zeros((len(lakes), args.size * args.size, 4))
        first = np.zeros((len(lakes), 4))
        is_first = data.first.numpy() == 1
        lake, cell = data.lake.numpy(), data.cell.numpy()
        later[lake[~is_first], cell[~is_first]] = probs[~is_first]
        first[lake[is_first]] = probs[is_first]
        by_temp[temperature] = float(np.mean([policy_success(P, lake, first[m], later[m], args.budget)
                                              for m, lake in enumerate(lakes)]))
    return by_temp


def reference_success(P: np.ndarray, lakes: list[Lake], labels: list[np.ndarray], args: argparse.Namespace) -> dict:
    """Mean success within the budget of the optimum, the discounted greedy policy and the label policy."""
    out = {"optimal": 0.0, f"gamma {args.gamma}": 0.0, "labels": 0.0}
    for lake, label in zip(lakes, labels):
        out["optimal"] += budget_success(P, lake.terminal, lake.goal_reward, None, args.budget)[lake.start]
        stationary = discounted_policy(P, lake.terminal, lake.goal_reward, args.gamma, 200)
        out[f"gamma {args.gamma}"] += budget_success(P, lake.terminal, lake.goal_reward, stationary, args.budget)[lake.start]
        out["labels"] += budget_success(P, lake.terminal, lake.goal_reward, label, args.budget)[lake.start]
    return {k: v / len(lakes) for k, v in out.items()}


def label_accuracy(data: Examples, logits: torch.Tensor, qs: list[np.ndarray]) -> tuple[float, float, float]:
    """Strict accuracy against the labels, the same on the prompts not seen
    in training, and the share of argmax actions that are among the best
    (within 1e-9) by the labels' q-values `qs`."""
    chosen = logits.argmax(1)
    right = (chosen == data.label).double()
    strict, unseen = float(right.mean()), float(right[data.unseen].mean())
    best = [bool(qs[m][c, a] >= qs[m][c].max() - 1e-9) for m, c, a in zip(data.lake.tolist(), data.cell.tolist(), chosen.tolist())]
    return strict, unseen, float(np.mean(best))


def report(tag: str, P: np.ndarray, lakes: list[Lake], data: Examples, qs: list[np.ndarray], model: PolicyModel,
           action_ids: torch.Tensor, refs: dict, args: argparse.Namespace) -> dict:
    logits, outside = predict(model, data, action_ids)
    success = evaluate(P, lakes, data, logits, args)
    strict, unseen, tied = label_accuracy(data, logits, qs)
    names = {0: "greedy"}
    learned = "  ".join(f"{names.get(t, f'T={t}')} {100 * s:.1f}%" for t, s in success.items())
    print(f"[{tag}] held-out label acc {100 * strict:.1f}% (unseen in training {100 * unseen:.1f}%, "
          f"any best action {100 * tied:.1f}%)  "
          f"mass outside actions {100 * float(outside.mean()):.2f}%  success: {learned}", flush=True)
    return {"label_acc": strict, "unseen_label_acc": unseen, "best_action_acc": tied, "outside_mass": float(outside.mean()),
            "success": {names.get(t, f"T={t}"): s for t, s in success.items()}, "reference": refs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--d-model", type=int, default=64, help="model width")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--mlp-ratio", type=int, default=4, help="MLP hidden width as a multiple of d_model")
    p.add_argument("--max-seq-len", type=int, default=2048, help="rows of the position embedding (the Rust default)")
    p.add_argument("--train-maps", type=int, default=5000, help="maps to draw training states from")
    p.add_argument("--eval-maps", type=int, default=2000, help="held-out maps to evaluate on")
    p.add_argument("--seed", type=int, default=0, help="seed of the training maps, the model and the batches")
    p.add_argument("--eval-seed", type=int, default=1, help="seed of the held-out maps")
    p.add_argument("--labels", choices=["discounted", "horizon"], default="discounted",
                   help="imitate the gamma-discounted greedy policy, or the finite-horizon optimum's first action")
    p.add_argument("--gamma", type=float, default=0.95, help="discount of the stationary policy")
    p.add_argument("--budget", type=int, default=10, help="actions per episode")
    p.add_argument("--size", type=int, default=4, help="side of the map")
    p.add_argument("--p", type=float, default=0.8, help="probability that a tile is frozen")
    p.add_argument("--loss", choices=["full", "actions"], default="full",
                   help="cross-entropy over the full vocabulary, or over the four action tokens only")
    p.add_argument("--steps", type=int, default=2500, help="optimizer steps")
    p.add_argument("--batch", type=int, default=256, help="examples per step")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decay to lr times this")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (the learner's)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm clip (the learner's)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="sampling temperatures to evaluate; 0 = greedy")
    p.add_argument("--log-every", type=int, default=250, help="steps between progress lines")
    p.add_argument("--eval-every", type=int, default=0, help="steps between held-out evaluations (0: only at the end)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = recipe_tokenizer()
    action_ids = torch.tensor(tok.action_ids)
    P = transitions(args.size)

    t0 = time.perf_counter()
    train_lakes = draw_lakes(args.train_maps, args.seed, args.size, args.p)
    train_data = Examples(tok, train_lakes, [labels_for(P, lake, args.labels, args.gamma, args.budget) for lake in train_lakes])
    eval_lakes = draw_lakes(args.eval_maps, args.eval_seed, args.size, args.p)
    eval_labels = [labels_for(P, lake, args.labels, args.gamma, args.budget) for lake in eval_lakes]
    eval_data = Examples(tok, eval_lakes, eval_labels)
    eval_q = [discounted_q(P, lake, args.gamma) if args.labels == "discounted" else horizon_q(P, lake, args.budget)
              for lake in eval_lakes]
    refs = reference_success(P, eval_lakes, eval_labels, args)
    overlap = eval_data.mark_seen(train_data)
    print(f"vocab {tok.vocab_size}, prompt lengths {sorted(set((train_data.last + 1).tolist()))}; "
          f"{len(train_data)} training states from {args.train_maps} maps, {len(eval_data)} held-out states from "
          f"{args.eval_maps} maps ({100 * overlap:.1f}% of them also in training); data in {time.perf_counter() - t0:.0f}s")
    print(f"example: {tok.decode(eval_data.tokens[1, :eval_data.last[1] + 1].tolist())!r} -> {ACTIONS[eval_data.label[1]]}")
    print("held-out success within {} actions: ".format(args.budget)
          + "  ".join(f"{k} {100 * v:.1f}%" for k, v in refs.items()), flush=True)

    model = PolicyModel(tok.vocab_size, args.d_model, args.layers, args.heads, args.mlp_ratio, args.max_seq_len)
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"{sum(x.numel() for x in model.parameters())} parameters", flush=True)
    train(model, train_data, action_ids, args,
          on_eval=lambda step: report(f"step {step}", P, eval_lakes, eval_data, eval_q, model, action_ids, refs, args))
    result = report("final", P, eval_lakes, eval_data, eval_q, model, action_ids, refs, args)
    print(json.dumps({"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "train_maps": args.train_maps,
                      "steps": args.steps, "labels": args.labels, "loss": args.loss, "overlap": overlap, **result}))


if __name__ == "__main__":
    main()
