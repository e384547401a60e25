"""Whole runs of the tiny recipe with context parallelism: iteration 0 of a CP layout
equals the same recipe with the CP ranks as data-parallel ranks (the same rollouts, the
same global batch, the same loss normalisation), on the shared Ray cluster.

Marked ``long`` (a few whole runs; ``pytest -m long``). The dry-run's dp 1 / cp 2 for this
recipe is checked in tests/foundation/test_planner.py.
"""

from __future__ import annotations

import pytest

from tests.trainers.test_pipeline import trained_records

pytestmark = [pytest.mark.ray, pytest.mark.long, pytest.mark.usefixtures("ray_cluster")]

#: pg_loss and grad_norm: within 1e-4 relative or 1e-6 absolute (float32 sums in another
#: order: a CP rank reduces its shard's share, a DP rank its rows').
REL, ABS = 1e-4, 1e-6


def first_iteration(tmp_path, name: str, *overrides: str) -> dict:
    records = trained_records(tmp_path / name, "grpo", "iterations=1", *overrides)
    return {key: records[0][key] for key in ("pg_loss", "grad_norm", "reward_mean")}


def assert_same_step(cp_run: dict, dp_run: dict) -> None:
    assert cp_run["reward_mean"] == dp_run["reward_mean"]  # the same rollouts
    for key in ("pg_loss", "grad_norm"):
        assert cp_run[key] == pytest.approx(dp_run[key], rel=REL, abs=ABS), key


def test_tp1_cp2_iteration_0_equals_two_data_parallel_ranks(tmp_path):
    cp_run = first_iteration(tmp_path, "cp2", "actor.parallel.tp=1", "actor.parallel.cp=2")
    dp_run = first_iteration(tmp_path, "dp2", "actor.parallel.tp=1")
    print("tp1 cp2:", cp_run, "| tp1 dp2:", dp_run)
    assert_same_step(cp_run, dp_run)


def test_tp2_cp2_on_four_devices_equals_tp2_with_two_data_parallel_ranks(tmp_path):
    """2 kv heads over tp 2 leave one per TP rank: cp 2 runs the K / V all-gather."""
    four = "resources.devices_per_node=4"
    cp_run = first_iteration(tmp_path, "cp2", four, "actor.parallel.tp=2", "actor.parallel.cp=2")
    dp_run = first_iteration(tmp_path, "dp2", four, "actor.parallel.tp=2")
    print("tp2 cp2:", cp_run, "| tp2 dp2:", dp_run)
    assert_same_step(cp_run, dp_run)
