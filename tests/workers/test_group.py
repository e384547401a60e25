from __future__ import annotations

import os
import time

import pytest

from backends.device import get_device
from mindrl.workers.group import StageTimeoutError, WorkerDiedError, WorkerGroup

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def echo_worker(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def __init__(self, rank: int, size: int, tag: str) -> None:
            self.rank, self.size, self.tag = rank, size, tag

        def whoami(self) -> tuple[int, int, str]:
            return self.rank, self.size, self.tag

        def die(self) -> None:
            os._exit(1)

        def sleep(self, seconds: float) -> None:
            time.sleep(seconds)

    return Echo


def test_calls_reach_every_worker_in_rank_order(echo_worker):
    group = WorkerGroup("echo", echo_worker, 2, get_device("cpu"), args=("t",))
    try:
        assert group.call("whoami", stage="probe", timeout_s=60) == [(0, 2, "t"), (1, 2, "t")]
        assert group.call("whoami", stage="probe", timeout_s=60, ranks=[1]) == [(1, 2, "t")]
    finally:
        group.shutdown()


def test_a_dead_worker_is_named_with_its_stage_within_seconds(echo_worker):
    group = WorkerGroup("actor", echo_worker, 2, get_device("cpu"), args=("t",))
    try:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker actor\[1\] died during stage 'update'"):
            group.call("die", stage="update", timeout_s=60, ranks=[1])
        assert time.monotonic() - start < 30
    finally:
        group.shutdown()


def test_a_stage_past_its_deadline_fails_instead_of_hanging(echo_worker):
    group = WorkerGroup("rollout", echo_worker, 1, get_device("cpu"), args=("t",))
    try:
        with pytest.raises(
            StageTimeoutError, match=r"stage 'generate' timed out after 1 s waiting on rollout\[0\]"
        ):
            group.call("sleep", 30, stage="generate", timeout_s=1)
    finally:
        group.shutdown()


def test_an_unplaceable_group_fails_with_advice(echo_worker):
    with pytest.raises(StageTimeoutError, match="cannot place 99 workers"):
        WorkerGroup("huge", echo_worker, 99, get_device("cpu"), ready_timeout_s=2)
