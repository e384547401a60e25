"""TD controller: per-stage metadata, never payloads.

:class:`ControllerState` is the plain logic (testable without Ray): per sample index it
knows which fields are ready, in which warehouse the sample lives, its length, and
whether this stage has consumed it. :class:`TDControllers` is the thin async Ray actor
around the states of the stages whose controllers sit on one node: it lets each stage
wait, with a deadline, until enough of its samples are ready. :class:`StageController`
is one stage's controller as the clients and warehouses call it.

Why one process per node and not per stage: each stage keeps its own state and its own
wait condition (a put wakes only the stages that track its fields; a claim waits only on
its own stage), so what the stages share is a process and its event loop. A process per
stage cost a Ray worker's start-up each (about a CPU-second: five processes on one node
for a GRPO run with a reference) and bought no parallelism the metadata needs: a call
is a few array operations. Controllers of stages on other nodes stay on those nodes
(the paper places each beside its stage's workers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import ray

from mindrl.dock.errors import DockError
from mindrl.dock.schema import TOKEN_FIELDS


class ControllerState:
    """Readiness and consumption bookkeeping of one stage over ``n_samples`` indexes,
    and the weights version that generated each sample (-1: not told).

    Args:
        stage: the stage's name, used in every error.
        n_samples: sample indexes per iteration.
        group_size: samples per group; group id = index // group_size unless
            ``group_ids`` gives each index its group explicitly.
        fields: every field name of the dock schema.
        group_ids: optional ``[n_samples]`` explicit group id per index.
    """

    def __init__(
        self,
        stage: str,
        n_samples: int,
        group_size: int,
        fields: list[str],
        group_ids: np.ndarray | None = None,
    ) -> None:
        self.stage = stage
        self.n_samples = n_samples
        self.group_size = group_size
        self.fields = list(fields)
        ids = np.arange(n_samples) // group_size if group_ids is None else np.asarray(group_ids)
        if ids.shape != (n_samples,):
            raise DockError(f"group_ids needs one id per sample ({n_samples}), got {ids.shape}")
        # Dense group numbers and each group's first index, so groups keep index order.
        _, self.group_of = np.unique(ids, return_inverse=True)
        self.group_sizes = np.bincount(self.group_of)
        self.uniform_groups = group_ids is None
        self.clear()

    def clear(self) -> None:
        """Forget readiness, consumption and locations (between iterations)."""
        self.ready = {f: np.zeros(self.n_samples, dtype=bool) for f in self.fields}
        self.consumed = np.zeros(self.n_samples, dtype=bool)
        self.held = np.zeros(self.n_samples, dtype=bool)
        self.warehouse = np.full(self.n_samples, -1, dtype=np.int32)
        self.length = np.zeros(self.n_samples, dtype=np.int64)
        # Each token field's tokens per sample: a response put again (partial rollout)
        # replaces its own count, never the prompt's.
        self.tokens = {name: np.zeros(self.n_samples, dtype=np.int64) for name in TOKEN_FIELDS}
        self.version = np.full(self.n_samples, -1, dtype=np.int64)
        self.metadata_bytes = 0

    def on_put(
        self,
        indexes: np.ndarray,
        fields: list[str],
        warehouse: int,
        lengths: np.ndarray,
        version: int | None = None,
    ) -> None:
        """Record that ``fields`` of ``indexes`` are now stored in ``warehouse`` (generated
        by weights ``version``, when the put says)."""
        for name in fields:
            if name in self.ready:
                self.ready[name][indexes] = True
        self.warehouse[indexes] = warehouse
        self.length[indexes] = np.maximum(self.length[indexes], lengths)
        carried = [name for name in TOKEN_FIELDS if name in fields]
        for name in carried:  # a put's lengths are its token fields' sum (WarehouseStore)
            self.tokens[name][indexes] = lengths if name == carried[0] else 0
        self.metadata_bytes += indexes.nbytes + lengths.nbytes + 8 * len(fields) + 4
        if version is not None:
            self.version[indexes] = version
            self.metadata_bytes += 8

    def available(self, fields: list[str], whole_groups: bool = False) -> np.ndarray:
        """Mask of unconsumed, unheld indexes whose ``fields`` are all ready (whole groups
        only when asked: a group counts once every member is available)."""
        mask = ~self.consumed & ~self.held & self._stored(fields)
        if whole_groups:
            full = np.bincount(self.group_of[mask], minlength=len(self.group_sizes))
            mask = (full == self.group_sizes)[self.group_of]
        return mask

    def claimable(self, fields: list[str], whole_groups: bool) -> int:
        """How many samples a claim could take now."""
        return int(self.available(fields, whole_groups).sum())

    def chunk_size(self, fields: list[str], whole_groups: bool, step: int, most: int) -> int:
        """The largest multiple of ``step`` (at most ``most``) a chunked claim could take
        now; 0 while fewer than ``step`` samples are ready."""
        return min(self.claimable(fields, whole_groups), most) // step * step

    def claim(
        self,
        fields: list[str],
        batch_size: int,
        whole_groups: bool,
        prefer_warehouse: int | None = None,
    ) -> np.ndarray:
        """Take up to ``batch_size`` ready indexes (whole groups if asked), mark consumed.

        Indexes stored in ``prefer_warehouse`` come first so workers read locally; within
        that order, indexes ascend and a group's members stay together.
        """
        if whole_groups and self.uniform_groups and batch_size % self.group_size:
            raise DockError(
                f"stage '{self.stage}' asked for {batch_size} samples in whole groups of "
                f"{self.group_size}: use a multiple of {self.group_size}"
            )
        candidates = np.flatnonzero(self.available(fields, whole_groups))
        groups = self.group_of[candidates]
        group_first = np.full(len(self.group_sizes), self.n_samples)
        np.minimum.at(group_first, groups, candidates)
        # A group is remote if any member is, so locality never splits a group apart.
        group_remote = np.zeros(len(self.group_sizes), dtype=bool)
        if prefer_warehouse is not None:
            np.logical_or.at(group_remote, groups, self.warehouse[candidates] != prefer_warehouse)
        # Sort key: local groups first, then by group (its first index), then by index.
        order = np.lexsort((candidates, group_first[groups], group_remote[groups]))
        candidates = candidates[order]
        taken = candidates[:batch_size]
        if whole_groups and len(taken) < len(candidates):
            taken = self._drop_split_group(taken, candidates[len(taken)])
        self.consumed[taken] = True
        self.metadata_bytes += taken.nbytes + 8 * len(fields) + 16
        return taken

    def recycle(self, indexes: np.ndarray) -> None:
        """Forget ``indexes`` (ready fields, consumption, location) so they can take new
        samples this iteration, e.g. the groups DAPO's dynamic sampling dropped."""
        indexes = np.asarray(indexes, dtype=np.int64)
        for ready in self.ready.values():
            ready[indexes] = False
        self.consumed[indexes] = False
        self.held[indexes] = False
        self.warehouse[indexes] = -1
        self.length[indexes] = 0
        for tokens in self.tokens.values():
            tokens[indexes] = 0
        self.version[indexes] = -1

    def hold(self, indexes: np.ndarray, held: bool) -> None:
        """Keep ``indexes`` out of every claim (``held``) or let claims take them again;
        their payloads, readiness and consumption stay as they are. Partial rollout holds
        the finished groups that wait for a later update, so a claim of the batch's size
        takes exactly the groups chosen to train now."""
        self.held[np.asarray(indexes, dtype=np.int64)] = held

    def load(self, indexes: np.ndarray) -> np.ndarray:
        """What each of ``indexes`` weighs on the rank that trains it: its tokens (prompt
        + response) where a token field was put, else its longest field."""
        tokens = sum(counts[indexes] for counts in self.tokens.values())
        return np.where(tokens > 0, tokens, self.length[indexes])

    def ready_count(self, fields: list[str]) -> int:
        """Samples whose ``fields`` are all stored, consumed or not (progress reports)."""
        return int(self._stored(fields).sum())

    def _stored(self, fields: list[str]) -> np.ndarray:
        """Mask of indexes whose ``fields`` are all stored."""
        self._check_fields(fields)
        mask = np.ones(self.n_samples, dtype=bool)
        for name in fields:
            mask &= self.ready[name]
        return mask

    def _drop_split_group(self, taken: np.ndarray, next_index: int) -> np.ndarray:
        """Cut a claim back so the group straddling the cut is left whole for later."""
        straddling = self.group_of[next_index]
        return taken[self.group_of[taken] != straddling]

    def _check_fields(self, fields: list[str]) -> None:
        unknown = [f for f in fields if f not in self.ready]
        if unknown:
            raise DockError(
                f"stage '{self.stage}' asked for unknown field(s) {unknown}; known: {self.fields}"
            )


def starved(stage: str, timeout_s: float, need: int, have: int, fields: list[str]) -> DockError:
    """The error of a stage that waited past its deadline."""
    return DockError(
        f"stage '{stage}' waited {timeout_s:g} s for {need} samples with fields {fields}: "
        f"{need - have} missing ({have} ready); did an upstream stage put them?"
    )


def balance_by_length(
    indexes: np.ndarray,
    lengths: np.ndarray,
    parts: int,
    warehouses: np.ndarray | None = None,
    part_warehouses: Sequence[int | None] | None = None,
) -> list[np.ndarray]:
    """Split ``indexes`` into ``parts`` of equal count with similar total length (a
    claim passes each sample's tokens, :meth:`ControllerState.load`).

    Greedy (longest processing time first under a count limit): longest first, each to
    the part with the smallest load that still has room. Equal counts keep every
    data-parallel rank at the same number of mini-batches, so of optimizer steps; the
    ranks' tokens, which their forward and backward time follows, balance.
    With ``part_warehouses`` (the warehouse beside each part's worker) and ``warehouses``
    (where each index is stored), a sample goes to a part beside its warehouse while one
    has room, and only the rest to any part: each worker then reads what is stored on its
    own node, and only what its node's share cannot cover crosses the network.
    """
    if len(indexes) % parts:
        raise DockError(
            f"cannot split {len(indexes)} samples evenly over {parts} data-parallel ranks"
        )
    room = len(indexes) // parts
    loads, members = np.zeros(parts), [[] for _ in range(parts)]

    def place(i: int, candidates: list[int]) -> None:
        target = min(candidates, key=lambda p: loads[p])
        members[target].append(indexes[i])
        loads[target] += lengths[i]

    order = np.argsort(-lengths, kind="stable")
    local = part_warehouses is not None and len(set(part_warehouses)) > 1
    rest = []
    for i in order:
        if local:
            beside = [
                p for p in range(parts)
                if part_warehouses[p] == warehouses[i] and len(members[p]) < room
            ]  # fmt: skip
            if not beside:
                rest.append(i)
                continue
            place(i, beside)
        else:
            place(i, [p for p in range(parts) if len(members[p]) < room])
    for i in rest:
        place(i, [p for p in range(parts) if len(members[p]) < room])
    return [np.sort(np.array(m, dtype=np.int64)) for m in members]


async def wait_and_claim(
    state: ControllerState,
    changed: asyncio.Condition,
    request: tuple[list[str], int, bool, int | None],
    timeout_s: float,
    dp_parts: int,
    step: int | None = None,
    part_warehouses: Sequence[int | None] | None = None,
) -> list[np.ndarray]:
    """Wait on ``changed`` until ``state`` can serve ``request``, then claim and split.

    ``request`` is ``(fields, batch_size, whole_groups, prefer_warehouse)``. With ``step``
    the claim is a chunk (streaming): it waits for ``step`` ready samples only and takes
    the largest multiple of ``step`` ready now, up to ``batch_size``. ``part_warehouses``:
    the warehouse beside each part's worker, so each part is what its node stores while
    it can be (:func:`balance_by_length`).
    """
    fields, batch_size, whole_groups, prefer = request
    if step is not None and (step < 1 or step % dp_parts):
        raise DockError(
            f"stage '{state.stage}': a chunk step of {step} must be a positive multiple "
            f"of the {dp_parts} data-parallel parts it is split into"
        )
    need = batch_size if step is None else min(step, batch_size)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with changed:
        while state.claimable(fields, whole_groups) < need:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                have = state.claimable(fields, whole_groups)
                raise starved(state.stage, timeout_s, need, have, fields) from None
        size = (
            batch_size if step is None else state.chunk_size(fields, whole_groups, step, batch_size)
        )
        taken = state.claim(fields, size, whole_groups, prefer)
    if dp_parts == 1:
        return [taken]
    if part_warehouses is not None and len(part_warehouses) != dp_parts:
        raise DockError(
            f"stage '{state.stage}': {len(part_warehouses)} part warehouses for {dp_parts} parts"
        )
    return balance_by_length(
        taken, state.load(taken), dp_parts, state.warehouse[taken], part_warehouses
    )


@ray.remote(num_cpus=0)
class TDControllers:
    """Ray actor around the :class:`ControllerState` of each of its stages; a ``claim``
    waits with a deadline. Every call names its stage first, as the centralized buffer's
    do; ``clear`` forgets every stage's samples.

    Args:
        stages: stage -> the fields it tracks (a put of none of them is not announced).
        n_samples, group_size, group_ids: as :class:`ControllerState`'s.
    """

    def __init__(
        self,
        stages: dict[str, list[str]],
        n_samples: int,
        group_size: int,
        group_ids: np.ndarray | None = None,
    ) -> None:
        self.states = {
            stage: ControllerState(stage, n_samples, group_size, fields, group_ids)
            for stage, fields in stages.items()
        }
        self.changed = {stage: asyncio.Condition() for stage in stages}

    async def on_put(
        self,
        stage: str,
        indexes: np.ndarray,
        fields: list[str],
        warehouse: int,
        lengths: np.ndarray,
        version: int | None = None,
    ) -> None:
        self.states[stage].on_put(indexes, fields, warehouse, lengths, version)
        async with self.changed[stage]:
            self.changed[stage].notify_all()

    async def claim(
        self,
        stage: str,
        fields: list[str],
        batch_size: int,
        whole_groups: bool,
        prefer_warehouse: int | None,
        timeout_s: float,
        dp_parts: int = 1,
        step: int | None = None,
        part_warehouses: list[int | None] | None = None,
    ) -> list[np.ndarray]:
        """Wait until ``batch_size`` samples are ready (or the deadline), then take them;
        with ``step``, a chunk: whatever multiple of ``step`` is ready (see wait_and_claim)."""
        request = (fields, batch_size, whole_groups, prefer_warehouse)
        return await wait_and_claim(
            self.states[stage], self.changed[stage], request, timeout_s, dp_parts, step,
            part_warehouses,
        )  # fmt: skip

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def locations(self, stage: str, indexes: np.ndarray) -> np.ndarray:
        return self.states[stage].warehouse[indexes]

    def versions(self, stage: str, indexes: np.ndarray) -> np.ndarray:
        return self.states[stage].version[indexes]

    def clear(self) -> None:
        for state in self.states.values():
            state.clear()

    def recycle(self, stage: str, indexes: np.ndarray) -> None:
        self.states[stage].recycle(indexes)

    async def hold(self, stage: str, indexes: np.ndarray, held: bool) -> None:
        self.states[stage].hold(indexes, held)
        async with self.changed[stage]:  # a released sample may complete a waiting claim
            self.changed[stage].notify_all()

    def ready_count(self, stage: str, fields: list[str]) -> int:
        return self.states[stage].ready_count(fields)

    def metadata_bytes(self, stage: str) -> int:
        return self.states[stage].metadata_bytes


class StageController:
    """One stage's TD controller: its node's :class:`TDControllers` actor with the stage
    filled in, called as an actor handle is (``controller.claim.remote(fields, ...)``).
    Pickles with the actor handle, so clients and warehouses anywhere can call it."""

    def __init__(self, actor: ray.actor.ActorHandle, stage: str) -> None:
        self.actor, self.stage = actor, stage

    def __getattr__(self, method: str) -> _StageCall:
        if method.startswith("_"):  # pickle's and copy's probes are not actor methods
            raise AttributeError(method)
        return _StageCall(getattr(self.actor, method), self.stage)


class _StageCall:
    """``actor.method`` with the stage as its first argument."""

    def __init__(self, method: ray.actor.ActorMethod, stage: str) -> None:
        self.method, self.stage = method, stage

    def remote(self, *args: object, **kwargs: object) -> ray.ObjectRef:
        return self.method.remote(self.stage, *args, **kwargs)
