#!/usr/bin/env bash
# The GPU check (`make gpu-check`): train SmolLM2-135M-Instruct with LoRA
# on SimpleSokoban with Burn's CUDA backend for a fixed number of steps,
# then print step time, tokens/s and success. Needs an NVIDIA GPU and its
# driver; the model (`make model`) and the plugins (`make plugins`) must be
# built. The default six steps are sized for a short GPU session (step
# times on an H200: docs/results.md#simplesokoban-and-frozenlake-with-the-pretrained-model-on-an-h200).
#
#   scripts/gpu-check.sh                      build ragen-host --features cuda, then train
#   RAGEN_HOST=/path/ragen-host scripts/gpu-check.sh
#                                             use a binary built elsewhere (a GPU
#                                             machine without a Rust toolchain)
#
# Settings (environment variables):
#   STEPS       training steps (default 6)
#   TIME_LIMIT  stop the run after this many seconds, as Ctrl-C does (it
#               checkpoints first); 0 = no limit (default 0)
#   ENV_PLUGIN  the plugin (default target/plugins/sokoban.wasm)
#   CONFIG      the preset (default examples/configs/smollm2-sokoban.toml)
#   OUT         the run directory (default target/gpu-check)
#
# Building with --features cuda needs no CUDA toolkit: the driver and NVRTC
# are loaded when the program starts. Without nvcc at build time, set
# CUDARC_CUDA_VERSION to the machine's CUDA version (13000 for 13.0), or
# the newest one cudarc knows is assumed.
set -euo pipefail

STEPS=${STEPS:-6}
TIME_LIMIT=${TIME_LIMIT:-0}
ENV_PLUGIN=${ENV_PLUGIN:-target/plugins/sokoban.wasm}
CONFIG=${CONFIG:-examples/configs/smollm2-sokoban.toml}
OUT=${OUT:-target/gpu-check}

fail() { echo "gpu-check: error: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 ||
  fail "no NVIDIA GPU found (nvidia-smi -L failed); this check needs one and its driver"
[ -f "$ENV_PLUGIN" ] || fail "$ENV_PLUGIN is missing; build the plugins with: make plugins"
model=$(sed -n 's/^model_path *= *"\(.*\)"/\1/p' "$CONFIG")
[ -e "$model" ] || fail "$model (the model of $CONFIG) is missing; fetch it with: make model"

if [ -z "${RAGEN_HOST:-}" ]; then
  cargo build -p ragen-host --features cuda
  RAGEN_HOST=${CARGO_TARGET_DIR:-target}/debug/ragen-host
fi
[ -x "$RAGEN_HOST" ] || fail "$RAGEN_HOST is not an executable ragen-host"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rm -rf "$OUT"
limit=()
[ "$TIME_LIMIT" != 0 ] && limit=(timeout --foreground -s INT "$TIME_LIMIT")
start=$(date +%s)
status=0
"${limit[@]}" "$RAGEN_HOST" train --env "$ENV_PLUGIN" --config "$CONFIG" --backend cuda \
  --steps "$STEPS" --out "$OUT" || status=$?
# 124 is timeout's own status once it has sent SIGINT: the run stopped on
# purpose and checkpointed.
[ "$status" = 0 ] || [ "$status" = 124 ] || fail "training failed (exit status $status)"
echo "gpu-check: $(($(date +%s) - start)) s in all, kernel compilation included"

python3 - "$OUT/metrics.jsonl" <<'EOF'
import json, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
if not rows:
    sys.exit("gpu-check: error: no training step finished")
print(f"{'step':>4} {'rollout s':>9} {'update s':>9} {'train tok/s':>11} {'success':>8} {'valid':>6} {'format':>7} {'val':>6}")
for r in rows:
    tps = r["update_tokens"] / max(r["update_seconds"], 1e-9)
    val = f"{r['val_success']:.1%}" if "val_success" in r else ""
    print(f"{r['step']:>4} {r['rollout_seconds']:>9.1f} {r['update_seconds']:>9.1f} {tps:>11.0f} "
          f"{r['success']:>8.1%} {r['valid_action_ratio']:>6.1%} {r['format_valid_ratio']:>7.1%} {val:>6}")
# The first step also compiles every kernel; the others show the steady state.
steady = rows[1:] or rows
step = sum(r["rollout_seconds"] + r["update_seconds"] for r in steady) / len(steady)
tps = sum(r["update_tokens"] for r in steady) / sum(r["update_seconds"] for r in steady)
print(f"gpu-check: {len(rows)} steps; steady step {step:.1f} s, training {tps:.0f} tokens/s, "
      f"success {rows[-1]['success']:.1%} at the last step")
EOF
