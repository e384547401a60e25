"""A rank's environments as k sub-simulators (pipeline stages), stepped in its own
process or by an environment worker beside it (docs/architecture.md §15).

RLinf-VLA's hybrid placement splits each simulator into ``k`` sub-simulators
(``pipeline_stage_num``) so the policy generates one sub-batch's chunk while the
simulator steps another's. Here stage ``s`` of a rank's ``n`` environments is the
vector environment of its environments ``s * n / k .. (s + 1) * n / k - 1`` (global
numbers from the rank's ``first_env_id``); every draw of an environment is a function of
its global number (mindrl/envs/embodied.py), so the stages step exactly the trajectories
of one whole simulator.

:class:`SimulatorStages` hands out each stage's calls as :class:`Pending` results: the
rollout submits stage ``s``'s chunk and generates for stage ``s + 1`` before it waits.
Stepped in place (:class:`LocalStages`, the collocated placement) a call has finished
when it returns, so nothing overlaps; an environment worker (mindrl/workers/
vector_env_worker.py) steps a stage while the rank generates. The whole-rank methods
(``reset``, ``chunk_step``, ``expert_actions``) call every stage and join their rows, for
what needs all environments at once (behaviour cloning, the start-up checks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mindrl.envs.embodied import (
    ActionSpec,
    ChunkResult,
    EnvConfigError,
    Observations,
    ObservationSpec,
    VectorEnv,
    make_vector_env,
)


@dataclass(frozen=True)
class StageLayout:
    """How a rank's ``num_envs`` environments (global numbers from ``first_env_id``)
    split into ``count`` stages of ``num_envs / count`` each."""

    num_envs: int
    first_env_id: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or self.num_envs % self.count:
            raise EnvConfigError(
                f"env.pipeline_stages={self.count} does not divide a rank's {self.num_envs} "
                "environments; pick a divisor of env.num_envs / the actor's data-parallel size"
            )

    @property
    def per_stage(self) -> int:
        return self.num_envs // self.count

    def rows(self, stage: int) -> slice:
        """The rank's rows (environments) stage ``stage`` holds."""
        return slice(stage * self.per_stage, (stage + 1) * self.per_stage)

    def first_env_id_of(self, stage: int) -> int:
        return self.first_env_id + stage * self.per_stage


@dataclass(frozen=True)
class EnvDescription:
    """What the start-up checks read of a rank's environment: its class's name, specs,
    and whether it has a scripted expert."""

    name: str
    observation_spec: ObservationSpec
    action_spec: ActionSpec
    has_expert: bool

    @staticmethod
    def of(env: VectorEnv) -> EnvDescription:
        has_expert = type(env).expert_actions is not VectorEnv.expert_actions
        return EnvDescription(type(env).__name__, env.observation_spec, env.action_spec, has_expert)


class Pending(Protocol):
    """A stage call's result, waited on by :meth:`result`."""

    def result(self) -> Any: ...


@dataclass
class Ready:
    """A call that has already finished (a stage stepped in place)."""

    value: Any

    def result(self) -> Any:
        return self.value


class SimulatorStages:
    """A rank's environments as ``layout.count`` stages (module docstring); a subclass
    says where a stage's calls run (:meth:`_submit`)."""

    def __init__(
        self, layout: StageLayout, description: EnvDescription, chunk_size: int, horizon: int
    ) -> None:
        self.layout, self.description = layout, description
        self.chunk_size, self.horizon = chunk_size, horizon
        self._env_s = [0.0] * layout.count  # each stage's calls' seconds, where they ran

    def add_env_seconds(self, stage: int, seconds: float) -> None:
        self._env_s[stage] += seconds

    def take_env_seconds(self) -> list[float]:
        """Each stage's environment seconds since the last take."""
        taken, self._env_s = self._env_s, [0.0] * self.layout.count
        return taken

    # ---- one stage ------------------------------------------------------------------------
    def _submit(self, stage: int, method: str, *args: Any) -> Pending:
        """Start ``method(*args)`` on stage ``stage``'s environment."""
        raise NotImplementedError

    def submit_reset(
        self,
        stage: int,
        env_ids: np.ndarray | None = None,
        reset_state_ids: np.ndarray | None = None,
    ) -> Pending:
        """Stage ``stage``'s :meth:`VectorEnv.reset` (``env_ids`` its own rows)."""
        return self._submit(stage, "reset", env_ids, reset_state_ids)

    def submit_step(self, stage: int, actions: np.ndarray) -> Pending:
        """Stage ``stage``'s :meth:`VectorEnv.chunk_step` with its rows of the actions."""
        return self._submit(stage, "chunk_step", actions)

    # ---- the whole rank -------------------------------------------------------------------
    @property
    def num_envs(self) -> int:
        return self.layout.num_envs

    @property
    def first_env_id(self) -> int:
        return self.layout.first_env_id

    @property
    def count(self) -> int:
        return self.layout.count

    def reset(
        self, env_ids: np.ndarray | None = None, reset_state_ids: np.ndarray | None = None
    ) -> Observations:
        """:meth:`VectorEnv.reset` over the rank's rows: each stage resets its share."""
        rows = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, np.int64)
        pending = []
        for stage in range(self.count):
            span = self.layout.rows(stage)
            mine = (rows >= span.start) & (rows < span.stop)
            if not mine.any():
                continue
            states = None if reset_state_ids is None else np.asarray(reset_state_ids)[mine]
            pending.append(self.submit_reset(stage, rows[mine] - span.start, states))
        return join_observations([p.result() for p in pending], rows_order(rows, self.layout))

    def chunk_step(self, actions: np.ndarray) -> ChunkResult:
        """:meth:`VectorEnv.chunk_step` over the rank's rows, every stage at once."""
        pending = [
            self.submit_step(stage, actions[self.layout.rows(stage)]) for stage in range(self.count)
        ]
        return join_results([p.result() for p in pending])

    def expert_actions(self) -> np.ndarray:
        """:meth:`VectorEnv.expert_actions` over the rank's rows (a class without an
        expert is refused at start-up, ``check_fits``)."""
        pending = [self._submit(stage, "expert_actions") for stage in range(self.count)]
        return np.concatenate([p.result() for p in pending])

    def close(self) -> None:
        """Release the stages' environments."""


class LocalStages(SimulatorStages):
    """Stages stepped in this process, one call after another (collocated)."""

    def __init__(self, envs: list[VectorEnv], layout: StageLayout) -> None:
        super().__init__(layout, EnvDescription.of(envs[0]), envs[0].chunk_size, envs[0].horizon)
        self.envs = envs

    def _submit(self, stage: int, method: str, *args: Any) -> Pending:
        value, seconds = timed_call(self.envs[stage], method, *args)
        self.add_env_seconds(stage, seconds)
        return Ready(value)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def build_stages(
    path: str,
    layout: StageLayout,
    *,
    chunk_size: int,
    horizon: int,
    auto_reset: bool,
    seed: int,
    kwargs: dict[str, Any] | None = None,
    device: str | None = None,
) -> LocalStages:
    """The vector environments of ``layout``'s stages, built in this process (on
    ``device``, where given: ``env.device: accelerator``)."""
    envs = [
        make_vector_env(
            path,
            num_envs=layout.per_stage,
            chunk_size=chunk_size,
            horizon=horizon,
            auto_reset=auto_reset,
            seed=seed,
            first_env_id=layout.first_env_id_of(stage),
            kwargs=kwargs,
            device=device,
        )
        for stage in range(layout.count)
    ]
    return LocalStages(envs, layout)


def timed_call(env: VectorEnv, method: str, *args: Any) -> tuple[Any, float]:
    """``env.method(*args)`` and the seconds it took."""
    start = time.perf_counter()
    value = getattr(env, method)(*args)
    return value, time.perf_counter() - start


def rows_order(rows: np.ndarray, layout: StageLayout) -> np.ndarray:
    """Where each of ``rows`` lands when the stages' answers are joined stage by stage:
    the permutation back to the order of ``rows``."""
    stage_of = rows // layout.per_stage
    return np.argsort(np.argsort(stage_of, kind="stable"), kind="stable")


def join_observations(parts: list[Observations], order: np.ndarray | None = None) -> Observations:
    """The stages' observations as one batch, stage by stage, then in ``order``'s rows
    (``order[i]``: the joined row that is the caller's row ``i``)."""
    images = np.concatenate([p.images for p in parts])
    states = np.concatenate([p.states for p in parts])
    instructions = [text for p in parts for text in p.instructions]
    ids = None
    if all(p.instruction_ids is not None for p in parts):
        ids = np.concatenate([p.instruction_ids for p in parts])
    if order is not None:
        images, states = images[order], states[order]
        instructions = [instructions[i] for i in order]
        ids = None if ids is None else ids[order]
    return Observations(images, states, instructions, ids)


def join_results(parts: list[ChunkResult]) -> ChunkResult:
    """The stages' chunk results as one batch, stage by stage (info's arrays joined; its
    ``final_observations`` too)."""
    observations = join_observations([p[0] for p in parts])
    rewards, terminations, truncations = (np.concatenate([p[i] for p in parts]) for i in (1, 2, 3))
    info: dict[str, Any] = {}
    for key, value in parts[0][4].items():
        values = [p[4][key] for p in parts]
        if isinstance(value, Observations):
            info[key] = join_observations(values)
        elif isinstance(value, np.ndarray):
            info[key] = np.concatenate(values)
        else:
            info[key] = values
    return observations, rewards, terminations, truncations, info
