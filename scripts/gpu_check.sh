#!/usr/bin/env bash
# The prepared GPU check of issue 13 (a thin wrapper around scripts/gpu_check.py).
#
# It builds a real-size Qwen2.5-VL-3B (3,754,622,976 parameters) with random bf16 weights from its published
# architecture (nothing is downloaded), runs a few GRPO steps of task=vqa_grounding through torchrun for every
# (rollout engine hf|vllm) x (trainer.strategy ddp|fsdp2) on all visible GPUs, and prints one summary table:
# step time, completion tokens/s, peak memory (torch allocator and nvidia-smi) and `mmrl plan`'s prediction.
# What cannot run (no GPU, no vLLM, out of time, a failure) is a table row saying why.
#
# It must finish in under 8 minutes: everything shares one budget (--budget-s, default 450 s).
#
# Run it from any directory, with the project's environment active (the python on PATH is used):
#   . .venv/bin/activate
#   bash scripts/gpu_check.sh                 # on a machine with GPUs (add --nproc N, --engines hf, ...)
#   bash scripts/gpu_check.sh --cpu-smoke     # tiny offline VLM, 1 step, on CPU: the test of the script
#   bash scripts/gpu_check.sh --help          # every option; train overrides go after the options
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
exec "$PYTHON" scripts/gpu_check.py "$@"
