"""Multi-turn GRPO in TRL on a ragen plugin, through TRL's `rollout_func`.

TRL hands each step's prompts to `rollout_func`; here every prompt is a seed,
and `ragen_envs.Rollouts` (RAGEN's agent loop: prompts from the plugin,
replies parsed as the reference parses them, format penalties) plays one
episode per prompt. Its policy callable generates every turn with the model
TRL is training. Each episode goes back to TRL as one sequence: the first
turn's prompt, then every reply followed by the environment's next message,
with `env_mask` marking which tokens the model wrote (only those are
trained) and the episode's reward for the reward function.

Not part of CI (it needs PyTorch). On a CPU, one step with SmolLM2-135M on
Bandit takes a minute or two:

    python3 -m venv target/ref-venv
    target/ref-venv/bin/pip install torch transformers trl gguf accelerate datasets
    make python && target/ref-venv/bin/pip install target/wheels/ragen_envs-*.whl
    make model
    HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 target/ref-venv/bin/python examples/trl/grpo_rollouts.py \\
        --plugin target/plugins/bandit.wasm --steps 1

Checked with trl 1.16.0, transformers 5.25.0, torch 2.15.0 (docs/python.md).
"""

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

import ragen_envs

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def generate(model, tokenizer, texts, max_new_tokens, temperature):
    """Sample one reply per prompt text: (new token ids, their log-probs) each."""
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
            return_dict_in_generate=True, output_scores=True, pad_token_id=tokenizer.pad_token_id,
        )
    new = out.sequences[:, batch["input_ids"].shape[1]:]
    # log-probs of the sampled tokens under the (temperature-scaled) distribution
    logprobs = torch.stack(out.scores, dim=1).log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    replies = []
    for ids, lps in zip(new.tolist(), logprobs.tolist()):
        if tokenizer.eos_token_id in ids:  # keep the end-of-turn token, drop the padding after it
            ids, lps = ids[: ids.index(tokenizer.eos_token_id) + 1], lps[: ids.index(tokenizer.eos_token_id) + 1]
        replies.append((ids, lps))
    return replies


def make_rollout_func(plugin, max_new_tokens, temperature):
    def rollout_func(prompts, trainer):
        model, tokenizer = trainer.model, trainer.processing_class
        seeds = [int(p) for p in prompts]
        rollouts = ragen_envs.Rollouts(plugin, env_groups=len(seeds), group_size=1, threads=1)
        turns = {}  # env -> [(prompt text, prompt ids, reply ids, reply log-probs)]

        def policy(contexts):
            texts = [
                tokenizer.apply_chat_template([{"role": r, "content": t} for r, t in c["messages"]],
                                              tokenize=False, add_generation_prompt=True) + c["prefill"]
                for c in contexts
            ]
            replies = generate(model, tokenizer, texts, max_new_tokens, temperature)
            out = []
            for c, text, (ids, lps) in zip(contexts, texts, replies):
                prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                turns.setdefault(c["env"], []).append((text, prompt_ids, ids, lps))
                out.append(tokenizer.decode(ids, skip_special_tokens=True))
            return out

        episodes = [json.loads(line) for line in rollouts.run(policy, seeds)]
        prompt_ids, completion_ids, logprobs, env_mask, rewards = [], [], [], [], []
        for env, episode in enumerate(episodes):
            history = turns[env]
            ids, lps, mask = [], [], []
            for k, (text, _, reply_ids, reply_lps) in enumerate(history):
                ids += reply_ids
                lps += reply_lps
                mask += [1] * len(reply_ids)
                if k + 1 < len(history):
                    # The environment's answer: what the next turn's prompt adds
                    # after this turn's prompt and reply (the chat template's
                    # end of turn, the reward, the next state).
                    seen = text + tokenizer.decode(reply_ids, skip_special_tokens=True)
                    following = history[k + 1][0]
                    if not following.startswith(seen):
                        break  # a context window cut the history: train on the turns so far
                    env_ids = tokenizer(following[len(seen):], add_special_tokens=False)["input_ids"]
                    if reply_ids[-1:] == [tokenizer.eos_token_id] and env_ids[:1] == reply_ids[-1:]:
                        env_ids = env_ids[1:]  # the reply already closed its turn
                    ids += env_ids
                    lps += [0.0] * len(env_ids)
                    mask += [0] * len(env_ids)
            prompt_ids.append(history[0][1])
            completion_ids.append(ids)
            logprobs.append(lps)
            env_mask.append(mask)
            rewards.append(episode["reward"])
        print(f"rollout: {len(episodes)} episodes, turns {[len(turns[e]) for e in range(len(episodes))]}, "
              f"model tokens {sum(map(sum, env_mask))}, environment tokens {sum(len(m) - sum(m) for m in env_mask)}, "
              f"success {sum(e['success'] for e in episodes)}/{len(episodes)}")
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "env_mask": env_mask, "env_reward": rewards}

    return rollout_func


def env_reward(completions, env_reward, **kwargs):
    """The episode's return from the plugin (with RAGEN's format penalties)."""
    return env_reward


def load(model_dir, cache):
    """SmolLM2 from `make model`'s GGUF, dequantised to float32. Saved once as
    a plain Hugging Face directory: the Trainer refuses to fine-tune a model
    loaded from GGUF (it counts as quantised)."""
    if not (cache / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=MODEL_FILE)
        gguf = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=MODEL_FILE, dtype=torch.float32)
        config = gguf.config
        del config.quantization_config  # the weights are float32 now
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf.state_dict())
        model.save_pretrained(cache)
        tokenizer.save_pretrained(cache)
    tokenizer = AutoTokenizer.from_pretrained(cache)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer, AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugin", default=str(ROOT / "target/plugins/bandit.wasm"))
    ap.add_argument("--model-dir", default=str(ROOT / "target/models"))
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--group-size", type=int, default=4, help="episodes per seed (GRPO's group)")
    ap.add_argument("--groups", type=int, default=2, help="seeds per step")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=str(ROOT / "target/trl-grpo"))
    args = ap.parse_args()

    tokenizer, model = load(Path(args.model_dir), Path(args.out) / "base")
    # One row per seed; TRL repeats each `group_size` times, so the episodes
    # of one seed form a GRPO group.
    seeds = Dataset.from_dict({"prompt": [str(s) for s in range(1000, 1000 + args.groups * args.steps)]})
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, learning_rate=1e-5, use_cpu=True,
        per_device_train_batch_size=args.groups * args.group_size, num_generations=args.group_size,
        max_completion_length=1024, logging_steps=1, report_to=[], save_strategy="no", beta=0.0,
        temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[env_reward], args=config, train_dataset=seeds,
        rollout_func=make_rollout_func(args.plugin, args.max_new_tokens, config.temperature),
    )
    trainer.train()
    for entry in trainer.state.log_history:
        print({k: v for k, v in entry.items() if k in ("step", "loss", "reward", "reward_std", "completions/mean_length")})


if __name__ == "__main__":
    main()
