#!/usr/bin/env bash
# The prepared GPU check of issue 13 (a thin wrapper around scripts/gpu_check.py).
#
# It builds two real-size models with random weights from their published architectures (nothing is downloaded):
# a Qwen2.5-VL-3B (3,754,622,976 parameters, bf16) and a LeRobot-format π0 (SigLIP So400m + Gemma 2B + the 300M
# action expert, 3,238,046,480 parameters; bf16 on disk, trained in float32). The VLM runs a few GRPO steps of
# task=vqa_grounding through torchrun for every (rollout engine hf|vllm) x (trainer.strategy ddp|fsdp2) on all visible
# GPUs, plus one asynchronous sub-run (hf/ddp with trainer.rollout=async algo.max_staleness=1
# algo.truncated_is=true: its row also checks async/staleness_max <= 1 in metrics.jsonl; --no-async leaves it out);
# π0 a few GRPO steps of task=vla_reach (model=pi0 model.path=<the folder> model.chunk=50, one process; FSDP2
# over the GPUs when there are several). It prints one summary table: step time, completion tokens/s (VLM; the π0
# rows give env actions/s in their notes), peak memory (torch allocator and nvidia-smi) and `mmrl plan`'s prediction.
# What cannot run (no GPU, no vLLM, out of time, a failure) is a table row saying why.
#
# It must finish in under 8 minutes: everything shares one budget (--budget-s, default 450 s); each sub-run has its
# own timeout (--sub-timeout-s 170, π0's --vla-timeout-s 150). If time runs out, what ran first is kept: the VLM's
# model and hf/ddp row, then π0's model and row, then the other VLM rows. --only vla (or vlm) runs one part alone.
#
# Run it from any directory, with the project's environment active (the python on PATH is used):
#   . .venv/bin/activate
#   bash scripts/gpu_check.sh                 # on a machine with GPUs (add --nproc N, --engines hf, ...)
#   bash scripts/gpu_check.sh --only vla      # only the flow-VLA (π0) part: a short device session
#   bash scripts/gpu_check.sh --cpu-smoke     # tiny VLM and tiny π0, 1 step each, on CPU: the test of the script
#   bash scripts/gpu_check.sh --help          # every option; VLM train overrides go after the options
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
exec "$PYTHON" scripts/gpu_check.py "$@"
