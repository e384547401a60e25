"""Imports flow trainers -> mindrl -> backends; only backends/ names a device
(docs/architecture.md §2)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"backends": ("mindrl", "trainers"), "mindrl": ("trainers",), "trainers": ()}
DEVICE_NAME = re.compile(
    r"torch\.cuda|torch_npu|[\"'](nccl|hccl)[\"']|CUDA_VISIBLE_DEVICES|ASCEND_RT_VISIBLE_DEVICES"
    r"|[\"'](GPU|NPU)[\"']"
)


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_only_flow_downwards(package):
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in python_files(package)
        for line, module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert violations == []


#: What ``mindrl/config`` may import of ``mindrl``: itself and the sinks' settings below it.
#: The algorithms, workers and plan import the config; it reads an algorithm through the
#: protocol it declares (``mindrl.config.compat.AlgorithmTraits``).
CONFIG_READS = ("mindrl.config", "mindrl.metrics")


def test_the_config_imports_no_part_of_mindrl_above_it():
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "mindrl" / "config").rglob("*.py"))
        for line, module in imported_modules(path)
        if module.startswith("mindrl") and not module.startswith(CONFIG_READS)
    ]
    assert violations == []


@pytest.mark.parametrize("package", ["mindrl", "trainers", "benchmarks"])
def test_only_backends_names_a_device(package):
    violations = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in python_files(package)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DEVICE_NAME.search(line) and not line.lstrip().startswith("#")
    ]
    assert violations == []


def test_import_mindrl_needs_only_torch_ray_and_tensordict():
    blocked = ["megatron", "transformers", "vllm", "yaml_never_mind"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "import mindrl, backends\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
