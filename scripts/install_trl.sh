#!/usr/bin/env bash
# Install TRL into the project's .venv for benchmarks/e2e.py (mindrl GRPO vs TRL's
# GRPOTrainer). Optional: nothing in mindrl or its tests imports TRL.
#
#   bash scripts/install_trl.sh && .venv/bin/python benchmarks/e2e.py --models tiny
#
# Why trl==1.16.0: the newest release; it resolves against the pins of
# constraints/cpu.txt (transformers 5.23.0, torch 2.13.0 CPU, Python 3.11) without
# moving either, and its GRPOTrainer runs on CPU with transformers 5.23 (checked by the
# import and the benchmark's tiny run). It brings datasets (+ pandas, dill, xxhash,
# multiprocess); accelerate is already a mindrl extra. No CUDA wheel is pulled: the
# constraints keep torch on the CPU build, and the check below fails if one appears.
set -euo pipefail
cd "$(dirname "$0")/.."

TRL_VERSION=${TRL_VERSION:-1.16.0}
venv=${MINDRL_VENV:-.venv}
[ -x "$venv/bin/python" ] || { echo "install_trl: no $venv; run bash scripts/setup.sh first" >&2; exit 2; }

echo "install_trl: installing trl==$TRL_VERSION into $venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -c constraints/cpu.txt "trl==$TRL_VERSION"

# Fail here, not in the benchmark, if the install moved torch to a CUDA build.
if "$venv/bin/python" -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
  echo "install_trl: CUDA packages (nvidia-*) appeared in $venv; see pip list" >&2
  exit 1
fi
"$venv/bin/python" - <<'PY'
import megatron.core, torch, transformers, trl
print(f"install_trl: ok: trl {trl.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
