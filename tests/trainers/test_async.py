"""Disaggregated placement with bounded staleness (issue 15) on the shared Ray cluster:
one rollout worker beside one trainer rank, the next batch generating while this one
trains, and what the update stage's TD controller says about the samples it trained on.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.trainers.test_pipeline import trained_records
from trainers.driver.async_iteration import DisaggregatedRunner, StalenessBoundError

#: tiny with one device generating and one training (TP 1: one device per role).
DISAGGREGATED = (
    "rollout.placement=disaggregated",
    "rollout.devices=1",
    "actor.parallel.tp=1",
    "reference.parallel.tp=1",
    "critic.parallel.tp=1",
)


@pytest.fixture(scope="module")
def stale_records(ray_cluster, tmp_path_factory) -> list[dict]:
    run_dir = tmp_path_factory.mktemp("stale")
    return trained_records(
        run_dir, "grpo", *DISAGGREGATED, "rollout.max_staleness=1", "iterations=4"
    )


@pytest.mark.ray
def test_no_trained_sample_was_more_updates_old_than_the_bound(stale_records):
    # staleness_* are read back from the update stage's TD controller: the weights version
    # each sample was put with, against the updates the trained weights include.
    assert [r["staleness_max"] for r in stale_records] == [0, 1, 1, 1]
    assert [r["staleness_mean"] for r in stale_records] == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.ray
def test_the_rollout_worker_generated_with_exactly_the_trainers_weights(stale_records):
    first, *lagged = stale_records
    # Iteration 0 trains on samples of the very weights it starts from: the hand-over over
    # the transfer group is exact, and the importance weights are all 1.
    assert first["rollout_logprob_diff"] < 1e-5
    assert first["is_weight_mean"] == pytest.approx(1.0)
    # Later batches came from the weights one update back: they differ, and are corrected.
    assert all(r["rollout_logprob_diff"] > 1e-3 for r in lagged)
    assert all(r["is_weight_mean"] != 1.0 for r in lagged)


@pytest.mark.ray
def test_the_next_batch_generated_while_this_one_trained(stale_records):
    assert stale_records[0]["overlap"]["rollout"] < 0.05  # nothing ran before it
    assert all(r["overlap"]["rollout"] > 0 for r in stale_records[1:])
    assert all("weight_transfer" in r["time"] for r in stale_records[1:])


def runner_with_versions(versions: list[int], max_staleness: int) -> DisaggregatedRunner:
    """The runner's bound check alone, over a dock whose update controller knows these."""
    runner = DisaggregatedRunner.__new__(DisaggregatedRunner)
    dock = SimpleNamespace(versions=lambda stage, indexes: np.asarray(versions)[indexes])
    runner.run, runner.max_staleness = SimpleNamespace(dock=dock), max_staleness
    return runner


def test_a_sample_past_the_bound_or_without_a_version_stops_the_update():
    indexes = np.arange(4)
    ok = runner_with_versions([5, 5, 4, 4], max_staleness=1)._staleness(indexes, 5)
    assert ok == {"staleness_max": 1, "staleness_mean": 0.5}
    with pytest.raises(StalenessBoundError, match=r"versions \[3, 5\].*max_staleness=1"):
        runner_with_versions([5, 5, 3, 3], max_staleness=1)._staleness(indexes, 5)
    with pytest.raises(StalenessBoundError, match="-1: none recorded"):
        runner_with_versions([5, -1, 5, 5], max_staleness=1)._staleness(indexes, 5)
