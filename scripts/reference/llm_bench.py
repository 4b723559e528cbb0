#!/usr/bin/env python3
"""CPU throughput baseline for SmolLM2-135M-Instruct in PyTorch / `transformers` (float32).

Loads ``target/models/SmolLM2-135M-Instruct.Q4_1.gguf`` with transformers (weights
dequantised to float32, so this measures a dense fp32 model, default SDPA attention)
and measures:

  (a) prefill tokens/s: the case-1 chat prompt + "<think>" pre-fill (same ids as
      ``llm_reference.py``), batched to 8 identical rows, one forward pass that
      computes the last position's logits only (``logits_to_keep=1``, as
      ``generate`` does and as ragen-llm's sampler does);
  (b) batched KV-cache sampling tokens/s: 8 rows, 64 new tokens, temperature 1.0
      (``model.generate(do_sample=True)``, no EOS stopping); counts new tokens only,
      the timed region includes the prefill of the prompt;
  (c) training forward+backward tokens/s: batch 4 x 512 random ids, cross-entropy on
      the logits (next-token shift), ``loss.backward()``, no optimizer;
  (d) peak resident memory of the process (``resource.getrusage`` ru_maxrss).

Prints one JSON line. Not part of CI. Setup: see the docstring of ``llm_reference.py``
(same venv). Example:

    HF_HUB_OFFLINE=1 target/ref-venv/bin/python scripts/reference/llm_bench.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_reference import (  # noqa: E402
    CONVERSATIONS,
    MODEL_DIR,
    MODEL_FILE,
    PREFILL,
    patch_smollm_pretokenizer,
)


def timed(fn, repeats: int) -> tuple[float, object]:
    """Best wall time over `repeats` runs (after one warm-up call)."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's default)")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats after one warm-up (best is reported)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tok = AutoTokenizer.from_pretrained(str(args.model_dir), gguf_file=MODEL_FILE)
    patch_smollm_pretokenizer(tok)
    model = AutoModelForCausalLM.from_pretrained(str(args.model_dir), gguf_file=MODEL_FILE, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size

    text = tok.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text + PREFILL, add_special_tokens=False).input_ids
    plen = len(prompt_ids)
    res: dict = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "attn_implementation": model.config._attn_implementation,
        "prompt_tokens": plen,
    }

    # (a) prefill
    batch = torch.tensor([prompt_ids] * 8, dtype=torch.long)

    def prefill():
        with torch.no_grad():
            return model(input_ids=batch, use_cache=False, logits_to_keep=1).logits

    t, _ = timed(prefill, args.repeats)
    res["prefill"] = {"rows": 8, "tokens": 8 * plen, "seconds": round(t, 4), "tokens_per_s": round(8 * plen / t, 1)}

    # (b) batched KV-cache sampling
    gen_cfg = transformers.GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=64,
        min_new_tokens=64,
        eos_token_id=None,
        pad_token_id=tok.pad_token_id,
    )

    def sample():
        with torch.no_grad():
            return model.generate(input_ids=batch, attention_mask=torch.ones_like(batch), generation_config=gen_cfg)

    t, out = timed(sample, args.repeats)
    new = out.shape[1] - plen
    res["sampling"] = {
        "rows": 8,
        "new_tokens_per_row": int(new),
        "seconds_incl_prefill": round(t, 4),
        "tokens_per_s": round(8 * new / t, 1),
        "decode_only_tokens_per_s_est": round(8 * new / max(t - res["prefill"]["seconds"], 1e-9), 1),
    }

    # (c) training forward + backward
    model.train()
    ids = torch.randint(0, vocab, (4, 512), generator=torch.Generator().manual_seed(args.seed))

    def train_step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        return float(loss.detach())

    t, loss = timed(train_step, args.repeats)
    res["train_fwd_bwd"] = {
        "batch": 4,
        "seq": 512,
        "seconds": round(t, 4),
        "tokens_per_s": round(4 * 512 / t, 1),
        "loss": round(loss, 4),
    }

    # (d) peak RSS (Linux reports KiB)
    res["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
