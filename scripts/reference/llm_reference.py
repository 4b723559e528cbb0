#!/usr/bin/env python3
"""Independent PyTorch / Hugging Face `transformers` reference for SmolLM2-135M-Instruct (GGUF).

What it does
------------
Loads ``target/models/SmolLM2-135M-Instruct.Q4_1.gguf`` with ``transformers`` (which
dequantises every tensor to float32 with the ``gguf`` package and un-permutes the
llama.cpp q/k rows), builds the tokenizer from the GGUF metadata, and writes the
small JSON fixture ``scripts/reference/smollm2_reference.json`` that the Rust tests
compare against (the Rust test needs no PyTorch; it only reads the JSON):

* model file name and SHA-256, library versions;
* two chat conversations: rendered chat template text and its token ids;
* the case-1 prompt with the ``<think>`` pre-fill, the float32 logits at its last
  position (scale, argmax, top-64, every 97th vocabulary id);
* 32 greedily decoded tokens (no EOS stopping);
* ~25 tokenizer round-trip cases;
* special-token ids/strings and the GGUF chat template;
* a cross-check: a from-scratch torch forward pass straight from the GGUF tensors
  *as stored* (llama.cpp layout: permuted q/k rows, interleaved-pair RoPE), compared
  with the transformers logits.

Tokenizer note: the GGUF says ``tokenizer.ggml.pre = "smollm"``. llama.cpp (and the
original Hugging Face ``tokenizer.json`` of SmolLM2: ``Digits(individual_digits=True)``
followed by ``ByteLevel``) first isolates every digit, then applies the GPT-2 split
regex. transformers' GGUF tokenizer builder does not know "smollm" and falls back
to plain GPT-2 ``ByteLevel`` splitting. This script therefore patches the backend
pre-tokenizer to ``Sequence([Digits(individual_digits=True), ByteLevel(...)])`` and
records, per tokenizer case, whether the unpatched transformers tokenizer would have
disagreed (``"unpatched_ids"`` is present only when it does).

This script is NOT part of CI. It is run by hand when the fixture needs regenerating.

Setup (exact commands, from the repository root; only PyPI is needed, no HF hub):

    python3 -m venv target/ref-venv
    target/ref-venv/bin/pip install gguf numpy torch transformers accelerate
    HF_HUB_OFFLINE=1 target/ref-venv/bin/python scripts/reference/llm_reference.py

(``accelerate`` is required by transformers to load a GGUF file. The default Linux
``torch`` wheel pulls CUDA packages; a CPU-only build works just as well.)
Versions used for the checked-in fixture are recorded in its ``"versions"`` field.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "target" / "models"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = Path(__file__).resolve().parent / "smollm2_reference.json"

SYSTEM = (
    "You're a helpful assistant. You are a good game player. "
    "You are aiming to get high reward in the game."
)
RULES = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "The meaning of each symbol in the state is:\n"
    "#: wall, _: empty, O: target, \u221a: box on target, X: box, P: player, S: player on target\n"
    "Your available actions are:\n"
    "Up, Down, Left, Right\n"
    'You can make up to 5 actions, separated by the action separator " || "\n'
)
FORMAT = (
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
    "with no extra text. Strictly follow this format."
)
GRID1 = "######\n#__###\n#_PX_#\n#__O_#\n######"
GRID2 = "######\n#__###\n#__PX#\n#__O_#\n######"
USER1 = f"{RULES}\nTurn 1:\nState:\n{GRID1}\nYou have 10 actions left. {FORMAT}"
ASSISTANT1 = "<think>The box is right of me.</think><answer>Right</answer>"
USER2 = f"Reward:\n0.0\nTurn 2:\nState:\n{GRID2}\nYou have 9 actions left. {FORMAT}"

CONVERSATIONS = [
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER1},
    ],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER1},
        {"role": "assistant", "content": ASSISTANT1},
        {"role": "user", "content": USER2},
    ],
]
PREFILL = "<think>"

TOKENIZER_CASES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345 678",
    "a  1",
    "Turn  12:\n  3 boxes,\t45%",
    "a  b\n\n\tc",
    "   leading and trailing   ",
    "\u221a \u00e9 \u4e2d\u6587 \U0001f642",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>assistant\n<think>",
    "<|endoftext|>",
    "<think> x </think> <answer>Up || Left</answer>",
    "<answer>Down || Down || Right</answer>",
    " Up",
    "Up",
    "",
    'fn main() { println!("hi"); }',
    "don't won't it's we're I'll they've",
    "Reward:\n0.0\nTurn 2:\n",
    GRID1,
    GRID2,
    "#######\n#_O_X_#\n#__P__#\n#_\u221a___#\n#######",
    "#####\n#S_X#\n#_O_#\n#####\n",
    "\n\n\n",
    "caf\u00e9 na\u00efve \u00fcber \u00c5ngstr\u00f6m",
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r5(x: float) -> float:
    return round(float(x), 5)


def patch_smollm_pretokenizer(tok) -> None:
    """Make the GGUF-built tokenizer split like llama.cpp's "smollm" / upstream tokenizer.json."""
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


# --------------------------------------------------------------------------------------
# Cross-check: forward pass written from scratch on the GGUF tensors as stored.
# --------------------------------------------------------------------------------------
def gguf_forward_last_logits(path: Path, ids: list[int]) -> tuple[torch.Tensor, dict]:
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(str(path))

    def kv(key):
        f = reader.fields[key]
        return f.parts[f.data[0]][0].item()

    n_layer = int(kv("llama.block_count"))
    n_head = int(kv("llama.attention.head_count"))
    n_kv = int(kv("llama.attention.head_count_kv"))
    dim = int(kv("llama.embedding_length"))
    eps = float(kv("llama.attention.layer_norm_rms_epsilon"))
    base = float(kv("llama.rope.freq_base"))
    hd = dim // n_head
    w = {}
    for t in reader.tensors:
        a = dequantize(t.data, t.tensor_type)
        # ggml shape is [ne0 (inner), ne1 (outer)]; row-major (outer, inner) here.
        w[t.name] = torch.from_numpy(np.array(a, dtype=np.float32, copy=True)).reshape(
            [int(d) for d in reversed(t.shape.tolist())]
        ).squeeze()

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    T = len(ids)
    pos = torch.arange(T, dtype=torch.float32)
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)  # (hd/2,)
    ang = pos[:, None] * inv[None, :]  # (T, hd/2)
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rope_interleaved(x):  # x: (T, H, hd); rotate pairs (2i, 2i+1) — llama.cpp "norm" RoPE
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    emb = w["token_embd.weight"]  # (vocab, dim)
    x = emb[torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "attn_q.weight"].T).view(T, n_head, hd)
        k = (h @ w[p + "attn_k.weight"].T).view(T, n_kv, hd)
        v = (h @ w[p + "attn_v.weight"].T).view(T, n_kv, hd)
        q, k = rope_interleaved(q), rope_interleaved(k)
        rep = n_head // n_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = torch.einsum("thd,shd->hts", q, k) / hd**0.5 + mask
        att = att.softmax(-1)
        o = torch.einsum("hts,shd->thd", att, v).reshape(T, dim)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        g = torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T)
        u = h @ w[p + "ffn_up.weight"].T
        x = x + (g * u) @ w[p + "ffn_down.weight"].T
    x = rms(x, w["output_norm.weight"])
    head = w.get("output.weight", emb)
    logits = x[-1] @ head.T
    info = {"n_layer": n_layer, "n_head": n_head, "n_kv_head": n_kv, "dim": dim, "rms_eps": eps, "rope_base": base}
    return logits, info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-crosscheck", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    gguf_path = args.model_dir / MODEL_FILE
    if not gguf_path.exists():
        print(f"missing {gguf_path}", file=sys.stderr)
        return 1

    tok = AutoTokenizer.from_pretrained(str(args.model_dir), gguf_file=MODEL_FILE)
    unpatched = AutoTokenizer.from_pretrained(str(args.model_dir), gguf_file=MODEL_FILE)
    patch_smollm_pretokenizer(tok)

    model = AutoModelForCausalLM.from_pretrained(
        str(args.model_dir), gguf_file=MODEL_FILE, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    out: dict = {
        "model_file": MODEL_FILE,
        "model_sha256": sha256(gguf_path),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": importlib.metadata.version("gguf"),
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
        },
        "settings": {
            "dtype": "float32",
            "attn_implementation": "eager",
            "threads": args.threads,
            "tokenizer_pre_tokenizer": "Digits(individual_digits=True) + ByteLevel(add_prefix_space=False)",
            "note": "logits from transformers LlamaForCausalLM on weights dequantised by the gguf package",
        },
    }

    # ---- conversations ----------------------------------------------------------------
    convs = []
    for msgs in CONVERSATIONS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        entry = {"messages": msgs, "text": text, "input_ids": ids}
        u_ids = unpatched(text, add_special_tokens=False).input_ids
        if u_ids != ids:
            entry["unpatched_input_ids"] = u_ids
        convs.append(entry)
    out["conversations"] = convs

    # ---- prompt with pre-fill -----------------------------------------------------------
    text1 = convs[0]["text"]
    prompt_ids = tok(text1 + PREFILL, add_special_tokens=False).input_ids
    prefill_ids = tok(PREFILL, add_special_tokens=False).input_ids
    out["prompt"] = {
        "conversation": 0,
        "prefill": PREFILL,
        "prefill_ids": prefill_ids,
        "prompt_ids": prompt_ids,
        "prompt_ids_equals_input_ids_plus_prefill_ids": prompt_ids == convs[0]["input_ids"] + prefill_ids,
        "n_tokens": len(prompt_ids),
    }

    # ---- last-position logits ---------------------------------------------------------------
    input_t = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=input_t).logits[0, -1].float()
    vocab = logits.shape[0]
    top_v, top_i = torch.topk(logits, 64)
    out["last_logits"] = {
        "vocab_size": vocab,
        "scale": r5(logits.abs().max()),
        "argmax": int(logits.argmax()),
        "argmax_text": tok.decode([int(logits.argmax())], skip_special_tokens=False),
        "mean": r5(logits.mean()),
        "std": r5(logits.std()),
        "top": [[int(i), r5(v)] for i, v in zip(top_i.tolist(), top_v.tolist())],
        "sampled_stride": 97,
        "sampled": [[i, r5(logits[i])] for i in range(0, vocab, 97)],
    }

    # ---- greedy decoding -------------------------------------------------------------------------
    gen_cfg = transformers.GenerationConfig(
        do_sample=False,
        max_new_tokens=32,
        min_new_tokens=32,
        eos_token_id=None,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    with torch.no_grad():
        gen = model.generate(
            input_ids=input_t, attention_mask=torch.ones_like(input_t), generation_config=gen_cfg
        )
    new_ids = gen[0, len(prompt_ids):].tolist()
    # Independent check: greedy without KV cache (full forward each step).
    seq = list(prompt_ids)
    margins = []  # top-1 minus top-2 logit at each step: how robust each greedy choice is
    with torch.no_grad():
        for _ in range(32):
            step = model(input_ids=torch.tensor([seq])).logits[0, -1]
            t2 = torch.topk(step, 2)
            margins.append(r5(t2.values[0] - t2.values[1]))
            seq.append(int(t2.indices[0]))
    nocache_ids = seq[len(prompt_ids):]
    eos = tok.eos_token_id
    out["greedy"] = {
        "max_new_tokens": 32,
        "eos_stopping": False,
        "ids": new_ids,
        "text": tok.decode(new_ids, skip_special_tokens=False),
        "first_eos_index": new_ids.index(eos) if eos in new_ids else None,
        "matches_no_cache_argmax_loop": nocache_ids == new_ids,
        "top1_minus_top2": margins,
    }

    # ---- tokenizer cases ---------------------------------------------------------------------------------
    cases = []
    for s in TOKENIZER_CASES:
        ids = tok(s, add_special_tokens=False).input_ids
        c = {
            "text": s,
            "ids": ids,
            "tokens": tok.convert_ids_to_tokens(ids),
            "decoded": tok.decode(ids, skip_special_tokens=False),
        }
        u = unpatched(s, add_special_tokens=False).input_ids
        if u != ids:
            c["unpatched_ids"] = u
        cases.append(c)
    out["tokenizer_cases"] = cases

    # ---- special tokens ---------------------------------------------------------------------------------------
    out["special"] = {
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "unk_token": tok.unk_token,
        "unk_token_id": tok.unk_token_id,
        "vocab_size": len(tok),
        "tokenizer_adds_bos": tok("x").input_ids != tok("x", add_special_tokens=False).input_ids,
        "chat_template": tok.chat_template,
    }

    # ---- cross-check --------------------------------------------------------------------------------------------
    if not args.no_crosscheck:
        with torch.no_grad():
            ref, info = gguf_forward_last_logits(gguf_path, prompt_ids)
        diff = (ref - logits).abs()
        out["crosscheck"] = {
            "what": "from-scratch forward on GGUF tensors as stored (permuted q/k, interleaved-pair RoPE) vs transformers",
            "hparams": info,
            "max_abs_diff": float(f"{diff.max().item():.3e}"),
            "argmax": int(ref.argmax()),
        }

    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, ensure_ascii=False, indent=1)
    args.out.write_text(text + "\n", encoding="utf-8")

    # ---- summary --------------------------------------------------------------------------------------------------------
    print(f"wrote {args.out} ({len(text.encode()) / 1024:.1f} KiB)")
    print("versions:", out["versions"])
    print("conversation token counts:", [len(c["input_ids"]) for c in convs])
    print("prompt tokens:", len(prompt_ids), "prefill ids:", prefill_ids)
    ll = out["last_logits"]
    print(f"last logits: scale={ll['scale']} argmax={ll['argmax']} ({ll['argmax_text']!r})")
    print("greedy:", repr(out["greedy"]["text"]), "| no-cache loop agrees:", out["greedy"]["matches_no_cache_argmax_loop"])
    print("greedy smallest top1-top2 margin:", min(margins), "at step", margins.index(min(margins)))
    diffs = [c["text"] for c in cases if "unpatched_ids" in c]
    print("tokenizer cases:", len(cases), "| unpatched GGUF tokenizer differs on:", diffs)
    if "crosscheck" in out:
        print("crosscheck max |diff|:", out["crosscheck"]["max_abs_diff"], "argmax:", out["crosscheck"]["argmax"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
