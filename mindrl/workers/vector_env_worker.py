"""The environment worker of an embodied run's hybrid and disaggregated placements: a
process for one actor rank that steps the rank's sub-simulators (mindrl/envs/stages.py)
while the rank generates (docs/architecture.md §15).

The actor rank starts its own worker (one CPU slot), so the worker shares the rank's
fate: it dies with the rank and a restarted rank starts a new one. Under ``hybrid`` it
sits on the rank's node (node affinity; the run counts its slot, trainers/driver/setup.py
``cpu_slots``); under ``disaggregated`` in the rank's bundle of the environment-worker
group the driver reserved for the run (:func:`reserve_env_workers`: one CPU bundle per
actor rank, spread over the nodes, so simulation can live on CPU nodes of its own). Ray
runs an actor's calls one at a time in the order they were sent, so the stages' chunk
steps run in the order the rollout submits them.

With ``env.device: accelerator`` the worker holds a device too (:func:`env_worker_options`):
under ``hybrid`` a share of its rank's, in the rank's own bundle of the run's placement
group (the layout counts it among the device's processes, so Ray gives both the same
device and sets the same visible device), under ``disaggregated`` one of its own in its
bundle of the environment-worker group. The env class is then built with
``device=<the worker's torch device>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from backends.device import Device, get_device
from mindrl.envs.embodied import EnvConfigError
from mindrl.envs.stages import (
    EnvDescription,
    LocalStages,
    SimulatorStages,
    StageLayout,
    build_stages,
    timed_call,
)
from mindrl.workers.group import on_bundle, wait_for_placement

#: The name of a disaggregated run's environment-worker placement group (Ray scopes it
#: to the run's namespace, so runs sharing a cluster do not meet).
ENV_WORKER_GROUP = "mindrl-env-workers"


class VectorEnvWorker:
    """Holds one rank's stages, built by the rank's arguments (:func:`build_stages`)."""

    def __init__(
        self,
        path: str,
        layout: StageLayout,
        options: dict[str, Any],
        device_layer: str | None = None,
    ) -> None:
        self.stages: LocalStages | None = None
        self.problem = ""  # the one line a refused class or keyword gave
        if device_layer is not None:  # the device Ray made visible to this worker
            options = {**options, "device": str(get_device(device_layer).device(0))}
        try:
            self.stages = build_stages(path, layout, **options)
        except EnvConfigError as exc:
            self.problem = str(exc)

    def describe(self) -> EnvDescription | str:
        """The stages' description, or the one line building them failed with."""
        return self.stages.description if self.stages else self.problem

    def where(self) -> tuple[str, str | None]:
        """This worker's node and placement group (hex ids; None: not in one)."""
        context = ray.get_runtime_context()
        group = context.get_placement_group_id()
        return context.get_node_id(), group

    def call(self, stage: int, method: str, *args: Any) -> tuple[Any, float]:
        """``method(*args)`` on stage ``stage``'s environment, and the seconds it took."""
        return timed_call(self.stages.envs[stage], method, *args)

    def close(self) -> None:
        if self.stages:
            self.stages.close()


@dataclass
class RemoteCall:
    """A stage call running on the worker; its seconds go to the stages' account."""

    ref: Any
    stage: int
    owner: RemoteStages

    def result(self) -> Any:
        value, seconds = ray.get(self.ref)
        self.owner.add_env_seconds(self.stage, seconds)
        return value


class RemoteStages(SimulatorStages):
    """A rank's stages stepped by its :class:`VectorEnvWorker` (hybrid placement)."""

    def __init__(self, worker: Any, layout: StageLayout, chunk_size: int, horizon: int) -> None:
        self.worker = worker
        description = ray.get(worker.describe.remote())
        if isinstance(description, str):
            ray.kill(worker)
            raise EnvConfigError(description)
        super().__init__(layout, description, chunk_size, horizon)

    def _submit(self, stage: int, method: str, *args: Any) -> RemoteCall:
        return RemoteCall(self.worker.call.remote(stage, method, *args), stage, self)

    def close(self) -> None:
        ray.get(self.worker.close.remote())
        ray.kill(self.worker)


def reserve_env_workers(
    count: int, timeout_s: float, device: Device | None = None
) -> PlacementGroup:
    """The placement group of a disaggregated run's ``count`` environment workers (one
    bundle of one CPU each, with one ``device`` each where given, spread over the
    nodes), granted or refused in one line."""
    bundle = device.ray_bundle() if device is not None else {"CPU": 1.0}
    group = placement_group([bundle] * count, strategy="SPREAD", name=ENV_WORKER_GROUP)
    wait_for_placement(
        group,
        timeout_s,
        f"the cluster cannot place {count} environment workers of {bundle} each "
        f"(env.placement=disaggregated) within {timeout_s:.0f} s; check `ray status` for "
        "free resources, or step the simulators beside the actor (env.placement=hybrid)",
    )
    return group


@dataclass(frozen=True)
class EnvWorkerPlace:
    """Where an actor rank's environment worker goes.

    Attributes:
        bundle: its bundle: of the run's environment-worker group (disaggregated), of
            the rank's own placement group (hybrid on the rank's device), or None: on the
            rank's node, one CPU slot (hybrid on the host).
        device: the device layer whose device it holds, or None (CPU slots).
        share: its share of that device (1 for one of its own).
        cpus: the CPU slots it reserves beside the device share.
        beside_rank: ``bundle`` is of the rank's own placement group (sharing its device).
    """

    bundle: int | None = None
    device: Device | None = None
    share: float = 1.0
    cpus: float = 1.0
    beside_rank: bool = False


def env_worker_options(place: EnvWorkerPlace) -> dict[str, Any]:
    """Ray actor options that put an environment worker at ``place`` (called in the
    actor rank's process: "the rank's own placement group" is the one it runs in)."""
    if place.bundle is None:
        node = ray.get_runtime_context().get_node_id()
        return {"num_cpus": 1, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, False)}
    if place.device is None:
        resources: dict[str, Any] = {"num_cpus": 1}
    else:
        resources = place.device.ray_actor_options(place.cpus, place.share)
    group = (
        ray.util.get_current_placement_group()
        if place.beside_rank
        else get_placement_group(ENV_WORKER_GROUP)
    )
    return on_bundle(group, place.bundle, resources)


def start_remote_stages(
    path: str,
    layout: StageLayout,
    *,
    chunk_size: int,
    horizon: int,
    place: EnvWorkerPlace = EnvWorkerPlace(),
    **options: Any,
) -> RemoteStages:
    """An environment worker holding ``layout``'s stages (built there: a class or
    keyword it refuses fails here, at start-up, in its one line) at ``place``."""
    layer = place.device.name if place.device is not None else None
    worker = (
        ray.remote(VectorEnvWorker)
        .options(**env_worker_options(place))
        .remote(path, layout, {"chunk_size": chunk_size, "horizon": horizon, **options}, layer)
    )
    return RemoteStages(worker, layout, chunk_size, horizon)
