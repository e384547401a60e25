"""``dock.pipeline: stream`` on the shared Ray cluster: the samples, advantages and metrics
of a sync run, with each stage's busy time and the overlap it gained.

One sync run (tests/trainers/conftest.py, shared with the partial-rollout tests) and one
stream run (fixtures, so each test holds a single run's start-up within the suite's
per-test timeout).
"""

from __future__ import annotations

import pytest

from mindrl import run_plan
from mindrl.metrics import measured
from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import trained_records

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def outcomes(record: dict) -> dict:
    """What the samples and their advantages decide: every number but timings/memory."""
    return measured.outcomes(record)


def run_records(run_dir, *overrides: str) -> list[dict]:
    return trained_records(run_dir, "grpo", *WITH_REFERENCE, *overrides)


@pytest.fixture(scope="module")
def stream_records(ray_cluster, tmp_path_factory) -> list[dict]:
    with pytest.MonkeyPatch.context() as patch:
        # The reference role as if on devices of its own: its chunked path streams too.
        patch.setattr(run_plan, "ROLES_OFF_GENERATION_DEVICES", {"reward", "reference"})
        return run_records(tmp_path_factory.mktemp("stream"), "dock.pipeline=stream")


def check_busy(record: dict) -> None:
    busy = record["busy"]
    assert {"rollout", "reward", "ref_logp", "advantage", "update"} <= set(busy)
    assert all(seconds > 0 for seconds in busy.values())
    assert busy["rollout"] <= record["iteration_time_s"]


def test_sync_reports_every_stages_busy_time_and_no_overlap(sync_records):
    assert len(sync_records) == 2
    for record in sync_records:
        check_busy(record)
        assert record["overlap"] == {"total": 0.0}


def test_streaming_trains_on_the_samples_and_advantages_of_sync_and_reports_overlap(
    sync_records, stream_records
):
    assert len(stream_records) == len(sync_records)
    for s, t in zip(sync_records, stream_records, strict=True):
        # Same responses, rewards, reference log-probs and advantages -> same losses and
        # KL; reward_mean only differs in the float32 order of the per-chunk sums.
        assert outcomes(t) == pytest.approx(outcomes(s), rel=1e-5, abs=1e-7)
        assert t["pg_loss"] == s["pg_loss"]  # same samples and advantages, bit for bit
        check_busy(t)
        assert set(t["overlap"]) == {"reward", "ref_logp", "total"}
        assert t["overlap"]["total"] == pytest.approx(
            t["overlap"]["reward"] + t["overlap"]["ref_logp"]
        )
        for stage in ("reward", "ref_logp"):
            # Overlap is stage work that ran during generation: never more than either.
            assert 0.0 <= t["overlap"][stage] <= t["busy"][stage] + 1e-6
            assert t["overlap"][stage] <= t["time"]["rollout"] + 1e-6
