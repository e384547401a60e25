"""Disaggregated placement: starting the rollout workers and handing them weights.

The model roles train on ``world - rollout.devices`` devices (trainers/driver/setup.py);
the rollout workers (mindrl/workers/rollout_worker.py) take the other ``rollout.devices``,
one bundle each of the run's device placement group.
Actor rank 0 hosts a transfer group with them; :func:`push_weights` runs the hand-over:
every actor rank gathers the generation tensors, rank 0 broadcasts them, every rollout
worker loads them and from then on stamps its samples with their version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray

from mindrl.config.layout import ROLLOUT_WORKER
from mindrl.workers.context import stage_context
from mindrl.workers.group import WorkerGroup, wait_all
from mindrl.workers.placement import DevicePlacement
from mindrl.workers.rollout_worker import RolloutWorker
from trainers.driver.state import RunState


def start_rollout_workers(
    run: RunState, device_name: str, placement: DevicePlacement
) -> WorkerGroup:
    """Start the plan's rollout workers, each on a device of its own (not waited on)."""
    context = stage_context(run.plan, "actor", run.config, run.algorithm, only=("rollout",))
    return placement.start(ROLLOUT_WORKER, ray.remote(RolloutWorker), (context, device_name))


def connect_rollout_workers(run: RunState) -> None:
    """The transfer group (actor rank 0 + every rollout worker) and the first weights:
    version ``run.start_iteration``, the updates the actor's weights already include."""
    timeout = run.plan.stage_deadline_s
    actor, rollout = run.groups["actor"], run.groups[ROLLOUT_WORKER]
    receivers = rollout.size
    (port,) = actor.call(
        "open_weight_transfer", receivers, stage="start-up", timeout_s=timeout, ranks=[0]
    )
    manifest = actor.call("weight_manifest", stage="start-up", timeout_s=timeout)[0]
    address = run.rendezvous["actor"][0]
    refs = [actor.workers[0].join_weight_transfer.remote(receivers)]
    refs += [w.setup.remote(run.dock_handle, address, port, manifest) for w in rollout.workers]
    wait_all(refs, ["actor[0]", *rollout.names()], "start-up", timeout)
    run.gen_dp_ranks = list(range(receivers))
    push_weights(run, run.start_iteration)


def push_weights(run: RunState, version: int) -> dict[str, float]:
    """Hand the actor's current weights (``version`` updates) to every rollout worker."""
    return start_push(run, version).wait(run.plan.stage_deadline_s)


@dataclass
class WeightPush:
    """A hand-over started and not waited for: the actor's sends and the workers'
    receives (continuous generation overlaps it with scoring and decoding)."""

    version: int
    refs: list[Any]
    names: list[str]
    started: float = field(default_factory=time.perf_counter)

    def wait(self, timeout_s: float) -> dict[str, float]:
        """Its report once every side finished: the slowest side's seconds and the bytes."""
        results = wait_all(self.refs, self.names, "weight transfer", timeout_s)
        report = {"busy_s": max(r["busy_s"] for r in results)}
        return report | {"handover_bytes": results[0]["handover_bytes"]}  # actor rank 0's


def start_push(run: RunState, version: int) -> WeightPush:
    """Start handing the actor's current weights (``version`` updates) to every rollout
    worker; the actor's next call waits for its sends (a Ray actor runs one call at a
    time)."""
    actor, rollout = run.groups["actor"], run.groups[ROLLOUT_WORKER]
    sends = [w.send_weights.remote() for w in actor.workers]
    receives = [w.receive_weights.remote(version) for w in rollout.workers]
    return WeightPush(version, sends + receives, [*actor.names(), *rollout.names()])
