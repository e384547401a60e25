"""scripts/accelerator_checks.py reads a training run's figures from its folder: here from
the session's real CPU run of tiny GRPO with a reference (two iterations), the shape of its
GRPO check, whose own config is checked to load."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mindrl.config import load_config
from trainers.registry import get_algorithm

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray]


def accelerator_checks():
    spec = importlib.util.spec_from_file_location(
        "accelerator_checks", ROOT / "scripts" / "accelerator_checks.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_grpo_checks_figures_come_from_a_cpu_runs_folder(sync_run):
    checks = accelerator_checks()
    spec = next(s for s in checks.RUNS if s.name == "run grpo tiny kl 0.001")
    load_config(ROOT / spec.config, list(spec.overrides), algorithm=get_algorithm("grpo"))
    figures = checks.run_figures(sync_run)
    assert figures["iterations"] == 2
    assert figures["iteration_time_s"] > 0 and figures["first_iteration_s"] > 0
    assert 0 <= figures["reward_mean_last"] <= 1
    assert 0 <= figures["rollout_logprob_diff"] < 1e-3  # the engine got the trained weights
    assert figures["rollout_logprob_diff_max"] >= figures["rollout_logprob_diff"]
    memory = figures["memory"]
    assert memory["tolerance"] == 0.15
    for stage in ("rollout", "update"):
        row = memory[stage]
        assert row["measured_as"] == "host RSS" and row["within_tolerance"] is None
        assert row["planned_gib"] > 0 and row["measured_gib"] > 0
        assert row["ratio"] == pytest.approx(row["measured_gib"] / row["planned_gib"], rel=0.01)
