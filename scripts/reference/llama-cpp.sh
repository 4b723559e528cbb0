#!/usr/bin/env bash
# llama.cpp, the speed anchor for `ragen-host bench --policy --model`:
# builds `llama-bench` and `llama-batched-bench` from the llama.cpp that the
# `llama-cpp-python` sdist on PyPI vendors, with cmake from PyPI, under
# target/llama-cpp/, then (with `run`) measures prefill and generation
# tokens/s on the default model, alternating with our own bench at the same
# shapes so both see the same machine. Not part of CI.
#
#   scripts/reference/llama-cpp.sh build            # once, about 5 minutes on 2 cores
#   scripts/reference/llama-cpp.sh run [ROUNDS]     # default 2 rounds of each, 8 minutes a round
#
# `run` needs the host binary (cargo build -p ragen-host), `make model` and
# `make plugins`. Shapes: the model's Q4_1 GGUF, 2 threads, prompt 277
# tokens (SimpleSokoban's first prompt through the chat template), reply 64
# tokens, batches 1, 8 and 64; every row its own prompt (no prompt sharing).
#
# The build is not native: -DGGML_NATIVE=OFF, with each instruction set
# named on or off as /proc/cpuinfo reports it. A native build can die with
# an illegal instruction on a VM whose CPU reports more than the hypervisor
# lets it run; naming sets the CPU lacks (AVX-512 on an AVX2-only machine)
# dies the same way.
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${LLAMA_CPP_DIR:-$ROOT/target/llama-cpp}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
HOST=${RAGEN_HOST:-$TARGET_DIR/debug/ragen-host}
MODEL=$ROOT/target/models/SmolLM2-135M-Instruct.Q4_1.gguf
PLUGIN=$ROOT/target/plugins/sokoban.wasm
THREADS=2
PROMPT=277
REPLY=64

build() {
  mkdir -p "$WORK"
  if [ ! -x "$WORK/venv/bin/cmake" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q cmake==3.31.6
  fi
  if [ ! -d "$WORK/src" ]; then
    # The sdist holds llama.cpp under vendor/; pip fetches it (and checks
    # its hash against the index) without building it.
    rm -rf "$WORK/sdist"
    "$WORK/venv/bin/pip" download -q --no-deps --no-binary llama-cpp-python -d "$WORK/sdist" "llama-cpp-python==$VERSION"
    tar -xzf "$WORK"/sdist/llama_cpp_python-$VERSION.tar.gz -C "$WORK/sdist"
    mv "$WORK/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp" "$WORK/src"
    rm -rf "$WORK/sdist"
  fi
  # Each instruction set named on or off by what the CPU reports.
  local flags=() cpu
  cpu=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
    avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    case "$cpu" in *" ${pair%%:*} "*) flags+=("-DGGML_${pair#*:}=ON") ;; *) flags+=("-DGGML_${pair#*:}=OFF") ;; esac
  done
  echo "instruction sets: ${flags[*]}"
  "$WORK/venv/bin/cmake" -S "$WORK/src" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${flags[@]}" \
    -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  "$WORK/venv/bin/cmake" --build "$WORK/build" -j "$(nproc)" --target llama-bench llama-batched-bench
  echo "built $WORK/build/bin/llama-bench and llama-batched-bench (llama.cpp from llama-cpp-python $VERSION)"
}

# One llama-batched-bench pass: S_PP and S_TG tokens/s per batch.
llama() {
  "$WORK/build/bin/llama-batched-bench" -m "$MODEL" -t "$THREADS" -c $((64 * (PROMPT + REPLY) + 64)) -b 2048 -ub 512 \
    -npp "$PROMPT" -ntg "$REPLY" -npl 1,8,64 2>/dev/null |
    awk -F'|' '/^\|[ ]+[0-9]/ { gsub(/ /, ""); printf "llama.cpp batch %s: prefill %s tok/s, generation %s tok/s\n", $4, $7, $9 }'
}

# One of our bench passes per batch, at the same shapes.
ours() {
  for b in 1 8 64; do
    "$HOST" bench --policy --model "$MODEL" --batch "$b" --threads "$THREADS" --json "$PLUGIN" 2>/dev/null |
      python3 -c "import json, sys; r = json.load(sys.stdin); print(f\"ours batch {r['batch']}: prefill {r['prefill_tokens_per_s']:.0f} tok/s, generation {r['generation_tokens_per_s']:.0f} tok/s (prompt {r['prompt_tokens']})\")"
  done
}

run() {
  [ -x "$WORK/build/bin/llama-batched-bench" ] || { echo "error: llama.cpp is not built: run $0 build" >&2; exit 1; }
  [ -x "$HOST" ] || { echo "error: $HOST is missing: run cargo build -p ragen-host (or set RAGEN_HOST)" >&2; exit 1; }
  [ -f "$MODEL" ] || { echo "error: $MODEL is missing: run make model" >&2; exit 1; }
  [ -f "$PLUGIN" ] || { echo "error: $PLUGIN is missing: run make plugins" >&2; exit 1; }
  for round in $(seq "${1:-2}"); do
    echo "round $round"
    llama
    ours
  done
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 build | run [ROUNDS]" >&2; exit 2 ;;
esac
