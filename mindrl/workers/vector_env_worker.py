"""The environment worker of an embodied run's hybrid placement: a process beside an
actor rank that steps the rank's sub-simulators (mindrl/envs/stages.py) while the rank
generates (docs/architecture.md §15).

The actor rank starts its own worker on its own node (node affinity, one CPU slot: the
run reserves it, trainers/driver/setup.py ``cpu_slots``), so the worker shares the
rank's fate: it dies with the rank and a restarted rank starts a new one. Ray runs an
actor's calls one at a time in the order they were sent, so the stages' chunk steps run
in the order the rollout submits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from mindrl.envs.embodied import EnvConfigError
from mindrl.envs.stages import (
    EnvDescription,
    LocalStages,
    SimulatorStages,
    StageLayout,
    build_stages,
    timed_call,
)


class VectorEnvWorker:
    """Holds one rank's stages, built by the rank's arguments (:func:`build_stages`)."""

    def __init__(self, path: str, layout: StageLayout, options: dict[str, Any]) -> None:
        self.stages: LocalStages | None = None
        self.problem = ""  # the one line a refused class or keyword gave
        try:
            self.stages = build_stages(path, layout, **options)
        except EnvConfigError as exc:
            self.problem = str(exc)

    def describe(self) -> EnvDescription | str:
        """The stages' description, or the one line building them failed with."""
        return self.stages.description if self.stages else self.problem

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


def start_remote_stages(
    path: str, layout: StageLayout, *, chunk_size: int, horizon: int, **options: Any
) -> RemoteStages:
    """An environment worker on this process's node holding ``layout``'s stages (built
    there: a class or keyword it refuses fails here, at start-up, in its one line)."""
    node = ray.get_runtime_context().get_node_id()
    worker = (
        ray.remote(VectorEnvWorker)
        .options(
            num_cpus=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(path, layout, {"chunk_size": chunk_size, "horizon": horizon, **options})
    )
    return RemoteStages(worker, layout, chunk_size, horizon)
