#!/usr/bin/env bash
# One command for a GPU machine: builds a random ~365M-parameter Qwen2-architecture model
# locally, then measures hf generation at 1 and 32 sessions, checks ES perturb / restore /
# update exactness (against a CPU reference) and speed (a perturbation and an update of 30
# seeds in copies of the fp32 master; es.noise_kernel names the kernel that drew the noise:
# the fused Triton one with philox-v2 on CUDA, docs/es.md "Noise kernels"), the vllm
# worker extension on the device, a few asynchronous updates on a task that needs no
# container, and the vLLM engine if vLLM imports. Prints one table;
# with OUT set, also writes it as $OUT/gpu_check.json. No network; needs torch and
# transformers only (the simulator's policy file is loaded without its package's deps).
# About 6 minutes on one H200 (367 s measured, docs/gpu.md); a hard
# stop at 470 s (the table is still printed).
# Extra arguments go to benchmarks/gpu_check.py (--small: tiny model, runs on CPU);
# PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The project need not be installed there: this checkout goes first on the import path.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
args=()
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--json "$OUT/gpu_check.json")
fi
# SIGINT at 470 s: the script stops the running section and still prints the table.
exec timeout --signal=INT --kill-after=10 470 "${PYTHON:-python3}" benchmarks/gpu_check.py \
  ${args[@]+"${args[@]}"} "$@"
