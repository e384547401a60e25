#!/usr/bin/env bash
# Every accelerator check in one command, within a 10-minute budget: train_step MFU of a
# ~1B dense model, the tests marked cuda / npu / multi_device, four short training runs on
# one device (0.18B planned vs measured memory, GRPO with a reference, PPO, tiny_deepseek),
# reshard --measure swap bandwidth, rollout weight hand-over; one JSON file. On an H100 the
# budget covers the first three groups but not all four runs: give the rest a second call
# (--only "run ").
#
#   bash scripts/accelerator_checks.sh [--out accelerator_checks.json] [--only NAME]
#       [--device cuda|npu|cpu] [--budget 540]
#
# Python: $PYTHON, else .venv/bin/python, else python3. It must already have torch for this
# machine's accelerator: this script installs nothing. Checks whose packages (ray, vllm,
# megatron-core, transformers, pytest) are missing are skipped and say so. Without an
# accelerator every check is skipped and the exit status is 0.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-}
if [[ -z $python ]]; then
    if [[ -x .venv/bin/python ]]; then
        python=.venv/bin/python
    elif command -v python3 >/dev/null; then
        python=python3
    else
        echo "accelerator_checks: no Python found; set PYTHON=/path/to/python" >&2
        exit 2
    fi
fi
exec "$python" scripts/accelerator_checks.py "$@"
