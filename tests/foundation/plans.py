"""Run plans of the tiny recipe built without Ray, and the CLI's ``--dry-run --json``, for
the placement and offload tests."""

from __future__ import annotations

import json
import subprocess
import sys

from mindrl.config import MindRLConfig, load_config
from mindrl.run_plan import RunPlan, build_run_plan
from trainers.registry import get_algorithm

TINY = "configs/tiny.yaml"
#: The tiny recipe disaggregated: one training device and one rollout device (TP 1).
DISAGGREGATED = (
    "rollout.placement=disaggregated",
    "rollout.devices=1",
    "actor.parallel.tp=1",
    "reference.parallel.tp=1",
    "critic.parallel.tp=1",
)


def config_and_plan(trainer: str, *overrides: str) -> tuple[MindRLConfig, RunPlan]:
    """The tiny recipe with ``overrides`` for ``trainer``, and its run plan."""
    algorithm = get_algorithm(trainer)
    config = load_config(TINY, list(overrides), algorithm)
    return config, build_run_plan(algorithm, config)


def dry_run(trainer: str, config: str, *overrides: str) -> dict:
    """The plan ``mindrl-train --dry-run --json`` prints (the CLI in a child process)."""
    args = ["--trainer", trainer, "--config", config, "--dry-run", "--json", *overrides]
    out = subprocess.run(
        [sys.executable, "-m", "trainers.driver.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
