"""Streaming within an iteration (``dock.pipeline: stream``, docs/pipeline.md).

In sync mode every stage waits for the whole batch of the stage before it. Here the
driver starts generation on the actor ranks without waiting for it and keeps one chunked
claim open per streaming stage (:meth:`RunPlan.streaming_stages`): the stage's TD
controller answers as soon as a chunk of samples has its fields, the chunk goes to the
stage's workers, and the next claim is opened, until the stage has taken the whole
batch. One ``ray.wait`` over the generation calls, the open claims and the chunks in
flight drives it all; nothing else runs on the driver.

The samples are the same as in sync mode: generation gets the same calls, and every
scoring stage scores a sample the same way whichever chunk it arrives in.

Busy time and overlap: a chunk's busy time is its slowest rank's ``busy_s`` (as the
sync ledger books a stage); the chunk is taken to have run during the ``busy_s`` before
the driver saw it finish, and the part of that interval before generation ended is its
overlap -- seconds of stage work taken off the iteration's critical path. Timestamps are
the driver's own clock, so they hold across nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from mindrl.dock.client import PendingClaim
from mindrl.run_plan import StagePlan
from mindrl.workers.group import POLL_S, StageTimeoutError, WorkerGroup, checked_get
from trainers.driver.state import RunState


@dataclass(frozen=True)
class StageCall:
    """How the driver hands a scoring stage's claimed samples to its workers."""

    stage: str
    group: WorkerGroup
    fields: list[str]
    dp_parts: int
    #: claimed parts (one per data-parallel rank) -> each worker's ``score`` arguments
    args: Callable[[list[np.ndarray]], list[tuple]]
    #: the warehouse beside each part's worker (None: no preference)
    part_warehouses: list[int | None] | None = None
    #: the workers' method that scores a part
    method: str = "score"


def stage_call(run: RunState, stage: StagePlan) -> StageCall:
    """The call of a scoring stage (``reward``, ``ref_logp``, ``old_logp``, ``values``),
    or of a group-local ``advantage`` stage streamed beside them."""
    if stage.role == "reward":
        group = run.groups["reward"]
        return StageCall(
            stage.name, group, list(stage.reads), group.size, lambda parts: [(p,) for p in parts],
            run.part_warehouses("reward", range(group.size)),
            "advantages" if stage.name == "advantage" else "score",
        )  # fmt: skip
    return StageCall(
        stage.name,
        run.groups[stage.role],
        list(stage.reads),
        run.dp_size(stage.role),
        lambda parts: [(p, stage.name) for p in run.per_worker(stage.role, parts)],
        run.part_warehouses(stage.role),
    )


@dataclass
class StreamedStage:
    """One streaming stage's progress through a batch and its accounting."""

    call: StageCall
    total: int
    claimed: int = 0
    claim: PendingClaim | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    busy_s: float = 0.0
    dock_s: float = 0.0
    overlap_s: float = 0.0
    finished_at: float = 0.0


@dataclass
class _Chunk:
    stage: StreamedStage
    waiting: dict[Any, str]  # ref -> worker name
    results: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StreamOutcome:
    """What one streamed batch produced: generation reports and each stage's."""

    generated: list[dict[str, Any]]
    generation_end: float  # time.perf_counter() when the last generation call returned
    stages: dict[str, StreamedStage]


class StreamScheduler:
    """Runs generation and the streaming stages of one batch together (module docstring).

    Args:
        run: the started run.
        stages: the stages to stream, in plan order.
        timeout_s: deadline of each stage, as in sync mode; the whole batch gets one per
            stage it holds.
    """

    def __init__(self, run: RunState, stages: tuple[str, ...], timeout_s: float) -> None:
        self.run = run
        self.calls = [stage_call(run, run.plan.stage(name)) for name in stages]
        self.timeout_s = timeout_s

    def run_batch(
        self,
        generate_args: list[tuple],
        n_samples: int,
        on_poll: Callable[[], None] | None = None,
    ) -> StreamOutcome:
        """Generate ``n_samples`` (``generate_args``: each actor rank's arguments) while
        the streaming stages claim and score them in chunks."""
        start = time.perf_counter()
        deadline = start + self.timeout_s * (1 + len(self.calls))
        actor = self.run.groups["actor"]
        generating = dict(
            zip(actor.submit_each("generate", generate_args), actor.names(), strict=True)
        )
        generation_refs = list(generating)
        stages = {c.stage: StreamedStage(c, n_samples) for c in self.calls}
        for stage in stages.values():
            self._open_claim(stage, deadline)
        chunks: dict[Any, _Chunk] = {}
        generation_end: float | None = None
        while generating or chunks or any(s.claim for s in stages.values()):
            for ref in self._finished(generating, chunks, stages, deadline):
                if ref in generating:
                    checked_get(ref, generating.pop(ref), "rollout")
                    if not generating:
                        generation_end = time.perf_counter()
                elif ref in chunks:
                    self._chunk_part_done(ref, chunks, start, generation_end)
                else:
                    self._claim_answered(ref, stages, chunks, deadline)
            if on_poll is not None:
                on_poll()
        generated = [ray.get(ref) for ref in generation_refs]
        return StreamOutcome(generated, generation_end or time.perf_counter(), stages)

    def _finished(
        self,
        generating: dict[Any, str],
        chunks: dict[Any, _Chunk],
        stages: dict[str, StreamedStage],
        deadline: float,
    ) -> list[Any]:
        """Every ref finished now, generation first (its end times the overlap); waits up
        to a poll interval for the first."""
        claims = [s.claim.ref for s in stages.values() if s.claim is not None]
        refs = [*generating, *chunks, *claims]
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            waiting = sorted(
                {*generating.values(), *(n for c in chunks.values() for n in c.waiting.values())}
            )
            raise StageTimeoutError(
                f"streamed stages {['rollout', *stages]} timed out waiting on "
                f"{', '.join(waiting) or 'the dock'}"
            )
        done, _ = ray.wait(refs, num_returns=1, timeout=min(POLL_S, remaining))
        if done:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return sorted(done, key=lambda ref: ref not in generating)

    def _open_claim(self, stage: StreamedStage, deadline: float) -> None:
        left = stage.total - stage.claimed
        call = stage.call
        stage.claim = (
            self.run.dock.claim_async(
                call.stage,
                call.fields,
                left,
                dp_parts=call.dp_parts,
                timeout_s=max(deadline - time.perf_counter(), 1.0),
                step=call.dp_parts,  # every chunk splits evenly over the stage's DP ranks
                part_warehouses=call.part_warehouses,
            )
            if left
            else None
        )

    def _claim_answered(
        self,
        ref: Any,
        stages: dict[str, StreamedStage],
        chunks: dict[Any, _Chunk],
        deadline: float,
    ) -> None:
        stage = next(s for s in stages.values() if s.claim is not None and s.claim.ref is ref)
        parts = stage.claim.result()
        stage.claimed += sum(len(p) for p in parts)
        stage.chunks += 1
        call = stage.call
        chunk = _Chunk(stage, {})
        for sent, name in zip(
            call.group.submit_each(call.method, call.args(parts)), call.group.names(), strict=True
        ):
            chunk.waiting[sent] = name
            chunks[sent] = chunk
        self._open_claim(stage, deadline)

    def _chunk_part_done(
        self, ref: Any, chunks: dict[Any, _Chunk], start: float, generation_end: float | None
    ) -> None:
        chunk = chunks.pop(ref)
        stage = chunk.stage
        chunk.results.append(checked_get(ref, chunk.waiting.pop(ref), stage.call.stage))
        if chunk.waiting:
            return
        now = time.perf_counter()
        busy = max(r.get("busy_s", 0.0) for r in chunk.results)
        stage.results += chunk.results
        stage.busy_s += busy
        stage.dock_s += max(r.get("dock_s", 0.0) for r in chunk.results)
        stage.overlap_s += overlap(now - busy, now, start, generation_end or now)
        stage.finished_at = now


def overlap(begin: float, end: float, window_begin: float, window_end: float) -> float:
    """Seconds of ``[begin, end]`` inside ``[window_begin, window_end]``."""
    return max(0.0, min(end, window_end) - max(begin, window_begin))
