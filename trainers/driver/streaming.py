"""Streaming within an iteration (``dock.pipeline: stream``, docs/pipeline.md).

In sync mode every stage waits for the whole batch of the stage before it. Here the
driver starts generation on the actor ranks without waiting for it and keeps one chunked
claim open per streaming stage (:meth:`RunPlan.streaming_stages`): the stage's TD
controller answers as soon as a chunk of samples has its fields, the chunk goes to the
stage's workers, and the next claim is opened once they are done with it (it then takes
every sample ready meanwhile rather than a few per chunk, each chunk paying a fetch, a
put and a report), until the stage has taken the whole batch. One ``ray.wait`` over the
generation calls, the open claims and the chunks in flight drives it all; nothing else
runs on the driver.

The samples are the same as in sync mode: generation gets the same calls, and every
scoring stage scores a sample the same way whichever chunk it arrives in.

Busy time and overlap: a chunk's busy time is its slowest rank's ``busy_s`` (as the
sync ledger books a stage); the chunk is taken to have run during the ``busy_s`` before
the driver saw it finish, and the part of that interval before generation ended is its
overlap -- seconds of stage work taken off the iteration's critical path. Timestamps are
the driver's own clock, so they hold across nodes.

The stage calls, a stage's stream of claims and the chunks with its workers are written
here once, for this scheduler and for continuous generation's
(trainers/driver/continuous.py), which streams its scoring stages across iterations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from mindrl.dock import group_slots
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
    #: claimed parts (one per data-parallel rank) -> each called worker's rank and its
    #: arguments (a worker with nothing to score is not called)
    args: Callable[[list[np.ndarray]], dict[int, tuple]]
    #: the warehouse beside each part's worker (None: no preference)
    part_warehouses: list[int | None] | None = None
    #: the workers' method that scores a part
    method: str = "score"
    #: claims take whole groups, dealt whole over the workers (StagePlan.whole_groups)
    whole_groups: bool = False


def stage_call(run: RunState, stage: StagePlan) -> StageCall:
    """The call of a scoring stage (``reward``, ``ref_logp``, ``old_logp``, ``values``)."""
    if stage.role == "reward" and stage.whole_groups:
        return whole_groups_call(run, stage.name, list(stage.reads), "score")
    if stage.role == "reward":
        group = run.groups["reward"]
        return StageCall(
            stage.name, group, list(stage.reads), group.size,
            lambda parts: {rank: (part,) for rank, part in enumerate(parts)},
            run.part_warehouses("reward", range(group.size)),
        )  # fmt: skip
    return StageCall(
        stage.name,
        run.groups[stage.role],
        list(stage.reads),
        run.dp_size(stage.role),
        lambda parts: dict(enumerate((p, stage.name) for p in run.per_worker(stage.role, parts))),
        run.part_warehouses(stage.role),
    )


def reward_with_advantages_call(run: RunState) -> StageCall:
    """The ``reward`` stage with a group-local estimator's ``advantage`` stage in the same
    call on whole groups (RewardWorker.score_with_advantages: one fetch and one put for
    both)."""
    reads = list(run.plan.stage("reward").reads)
    return whole_groups_call(run, "reward", reads, "score_with_advantages")


def whole_groups_call(run: RunState, stage: str, reads: list[str], method: str) -> StageCall:
    """A reward-worker stage on whole groups: the claim takes them as one part, dealt over
    the reward workers by :func:`groups_over_workers` (scoring is the costly half, so every
    worker beside a warehouse takes a share of its groups)."""
    group = run.groups["reward"]
    beside = run.part_warehouses("reward", range(group.size)) or [None] * group.size

    def args(parts: list[np.ndarray]) -> dict[int, tuple]:
        claimed = parts[0]
        owners = run.dock.owner(claimed)
        dealt = groups_over_workers(claimed, run.dock.handle.group_size, owners, beside)
        return {rank: (indexes,) for rank, indexes in dealt.items()}

    return StageCall(stage, group, reads, 1, args, method=method, whole_groups=True)


def groups_over_workers(
    indexes: np.ndarray, group_size: int, owners: np.ndarray, beside: list[int | None]
) -> dict[int, np.ndarray]:
    """Rank -> whole groups of ``indexes``: each warehouse's groups (``owners``: each
    index's warehouse) dealt in turn over the ranks beside it (``beside``: each rank's
    warehouse), or over every rank where none is. Ranks with nothing are left out."""
    ranks_at: dict[int | None, list[int]] = {}
    for rank, warehouse in enumerate(beside):
        ranks_at.setdefault(warehouse, []).append(rank)
    everyone = list(range(len(beside)))
    dealt: dict[int, list[int]] = {}
    turns: dict[int, int] = {}
    groups = group_slots(indexes, group_size)
    for group in dict.fromkeys(groups.tolist()):
        members = indexes[groups == group]
        warehouse = int(owners[groups == group][0])
        candidates = ranks_at.get(warehouse, everyone)
        turn = turns.get(warehouse, 0)
        turns[warehouse] = turn + 1
        dealt.setdefault(candidates[turn % len(candidates)], []).extend(members.tolist())
    return {rank: np.array(members, dtype=np.int64) for rank, members in sorted(dealt.items())}


def advantage_parts(run: RunState, claimed: np.ndarray) -> dict[int, np.ndarray]:
    """Reward rank -> the whole groups of ``claimed`` it computes advantages for. A
    group-local estimator (``plan.group_local_advantages``) runs on the first reward
    worker beside each warehouse, on the groups that warehouse stores (a group is stored
    whole in one), so no response crosses to another node for it; groups with no reward
    worker beside them, and every group of an estimator that needs the whole batch, go
    to reward rank 0."""
    beside = run.part_warehouses("reward", range(run.groups["reward"].size))
    if not run.plan.group_local_advantages or beside is None or len(set(beside)) < 2:
        return {0: claimed}
    rank_of: dict[int | None, int] = {}
    for rank, warehouse in enumerate(beside):
        rank_of.setdefault(warehouse, rank)
    ranks = np.array([rank_of.get(int(w), 0) for w in run.dock.owner(claimed)])
    return {int(r): claimed[ranks == r] for r in np.unique(ranks)}


@dataclass
class StageStream:
    """A streamed stage: its call, its open claim, and what its scored chunks did."""

    call: StageCall
    claim: PendingClaim | None = None
    chunks: int = 0
    busy_s: float = 0.0
    dock_s: float = 0.0
    results: list[dict[str, Any]] = field(default_factory=list)

    def take_claim(self) -> list[np.ndarray]:
        """The answered claim's parts, one per data-parallel rank; the claim is closed."""
        parts, self.claim = self.claim.result(), None
        return parts


@dataclass
class StreamedStage(StageStream):
    """A stage streamed through one sync batch: how much of it is claimed, when it
    scored its last chunk and how much of its work overlapped generation."""

    total: int = 0
    claimed: int = 0
    overlap_s: float = 0.0
    finished_at: float = 0.0


def answered_stream(streams: Iterable[StageStream], ref: Any) -> StageStream:
    """The stream whose open claim ``ref`` is."""
    return next(s for s in streams if s.claim is not None and s.claim.ref is ref)


@dataclass
class Chunk:
    """Claimed samples of a streamed stage being scored by its workers, one call each."""

    stream: StageStream
    indexes: np.ndarray
    waiting: dict[Any, str]  # ref of a worker's call -> the worker's name
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        """The slowest worker's busy time: what the chunk took (as sync books a stage)."""
        return max(r.get("busy_s", 0.0) for r in self.results)


class ChunksInFlight:
    """The streamed stages' chunks with their workers, by the refs of the workers' calls;
    a finished chunk is booked on its stream (busy and dock time, reports)."""

    def __init__(self) -> None:
        self.by_ref: dict[Any, Chunk] = {}

    def send(self, stream: StageStream, parts: list[np.ndarray]) -> None:
        """``parts`` (one per data-parallel rank) to ``stream``'s workers."""
        call = stream.call
        chunk = Chunk(stream, np.concatenate(parts), {})
        args = call.args(parts)
        sent = call.group.submit_each(call.method, list(args.values()), ranks=list(args))
        names = [call.group.names()[rank] for rank in args]
        for ref, name in zip(sent, names, strict=True):
            chunk.waiting[ref] = name
            self.by_ref[ref] = chunk
        stream.chunks += 1

    def part_done(self, ref: Any) -> Chunk | None:
        """A worker answered ``ref`` (raised if it failed); the chunk once all have."""
        chunk = self.by_ref.pop(ref)
        stream = chunk.stream
        chunk.results.append(checked_get(ref, chunk.waiting.pop(ref), stream.call.stage))
        if chunk.waiting:
            return None
        stream.busy_s += chunk.busy_s
        stream.dock_s += max(r.get("dock_s", 0.0) for r in chunk.results)
        stream.results += chunk.results
        return chunk

    def of(self, stream: StageStream) -> bool:
        """Whether a chunk of ``stream`` is with its workers."""
        return any(chunk.stream is stream for chunk in self.by_ref.values())

    def refs(self) -> list[Any]:
        return list(self.by_ref)

    def workers(self) -> set[str]:
        """The workers a chunk still waits on."""
        return {name for chunk in self.by_ref.values() for name in chunk.waiting.values()}

    def __contains__(self, ref: Any) -> bool:
        return ref in self.by_ref

    def __bool__(self) -> bool:
        return bool(self.by_ref)


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
        stages = {c.stage: StreamedStage(c, total=n_samples) for c in self.calls}
        for stage in stages.values():
            self._open_claim(stage, deadline)
        chunks = ChunksInFlight()
        generation_end: float | None = None
        while generating or chunks or any(s.claim for s in stages.values()):
            for ref in self._finished(generating, chunks, stages, deadline):
                if ref in generating:
                    checked_get(ref, generating.pop(ref), "rollout")
                    if not generating:
                        generation_end = time.perf_counter()
                elif ref in chunks:
                    chunk = chunks.part_done(ref)
                    if chunk is not None:
                        self._chunk_done(chunk, start, generation_end)
                        self._open_claim(chunk.stream, deadline)
                else:
                    stage = answered_stream(stages.values(), ref)
                    parts = stage.take_claim()
                    stage.claimed += sum(len(p) for p in parts)
                    chunks.send(stage, parts)
            if on_poll is not None:
                on_poll()
        generated = [ray.get(ref) for ref in generation_refs]
        return StreamOutcome(generated, generation_end or time.perf_counter(), stages)

    def _finished(
        self,
        generating: dict[Any, str],
        chunks: ChunksInFlight,
        stages: dict[str, StreamedStage],
        deadline: float,
    ) -> list[Any]:
        """Every ref finished now, generation first (its end times the overlap); waits up
        to a poll interval for the first."""
        claims = [s.claim.ref for s in stages.values() if s.claim is not None]
        refs = [*generating, *chunks.refs(), *claims]
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            waiting = sorted({*generating.values(), *chunks.workers()})
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
                whole_groups=call.whole_groups,
                dp_parts=call.dp_parts,
                timeout_s=max(deadline - time.perf_counter(), 1.0),
                step=self._step(call),
                part_warehouses=call.part_warehouses,
            )
            if left
            else None
        )

    def _step(self, call: StageCall) -> int:
        """A chunk's size divides evenly over the stage's DP ranks (and into whole groups
        where the stage takes them)."""
        group = self.run.dock.handle.group_size if call.whole_groups else 1
        return int(np.lcm(call.dp_parts, group))

    @staticmethod
    def _chunk_done(chunk: Chunk, start: float, generation_end: float | None) -> None:
        """The chunk ran during the ``busy_s`` before the driver saw it finish: the part
        of that before generation ended is its overlap."""
        now = time.perf_counter()
        stage = chunk.stream
        stage.overlap_s += overlap(now - chunk.busy_s, now, start, generation_end or now)
        stage.finished_at = now


def overlap(begin: float, end: float, window_begin: float, window_end: float) -> float:
    """Seconds of ``[begin, end]`` inside ``[window_begin, window_end]``."""
    return max(0.0, min(end, window_end) - max(begin, window_begin))
